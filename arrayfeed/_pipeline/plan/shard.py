"""Which part of the data this input worker reads, and how to learn it from the environment.

Pure Python: no TensorFlow. :meth:`Shard.from_env` is a pure function of a mapping of
environment variables, so every form and every error is tested with a table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._errors import ConfigError
from ..._validate import integer

__all__ = [
    "ENV_RANK_PAIRS",
    "ENV_VARIABLES",
    "SLURM_STEP",
    "SLURM_STEP_TASKS",
    "TORCH_RANK_PAIR",
    "Shard",
    "shard_bounds",
]

#: ``(launcher, rank variable, size variable)`` that :meth:`Shard.from_env` reads, and TF_CONFIG.
ENV_RANK_PAIRS: tuple[tuple[str, str, str], ...] = (
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI (MPICH, Intel MPI)", "PMI_RANK", "PMI_SIZE"),
    ("Horovod", "HOROVOD_RANK", "HOROVOD_SIZE"),
)

#: ``(launcher, rank variable, size variable)`` of one *process* of a PyTorch distributed job:
#: ``torchrun`` sets them (so do Accelerate, Lightning and DeepSpeed launchers), and
#: ``torch.distributed`` takes the process's rank from them. A job step that starts ``torchrun``
#: (``srun`` with one task per node, say) has one Slurm task per node but several processes per
#: task, so when this pair is set it names the worker and the launcher pairs above are not read.
TORCH_RANK_PAIR: tuple[str, str, str] = ("torchrun (torch.distributed)", "RANK", "WORLD_SIZE")

#: A Slurm job step (``srun``) sets one of these: in a batch script outside a step,
#: ``SLURM_PROCID`` and ``SLURM_NTASKS`` describe the allocation, not the processes running.
SLURM_STEP = ("SLURM_STEP_ID", "SLURM_STEPID")
#: The tasks of the job step (``srun -n`` may ask for fewer than the allocation has).
SLURM_STEP_TASKS = "SLURM_STEP_NUM_TASKS"

#: Every environment variable :meth:`Shard.from_env` reads.
ENV_VARIABLES: tuple[str, ...] = (
    "TF_CONFIG",
    *(name for _, rank, size in (*ENV_RANK_PAIRS, TORCH_RANK_PAIR) for name in (rank, size)),
    *SLURM_STEP,
    SLURM_STEP_TASKS,
)

_FIX = "pass `shard=arrayfeed.Shard(count, index)` (or `shard=None`) to from_arrays explicitly"


@dataclass(frozen=True)
class Shard:
    """Input worker ``index`` of ``count``: it reads the ``index``-th contiguous range of rows.

    >>> Shard(4, 1)
    Shard(count=4, index=1)
    >>> Shard.from_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"})
    Shard(count=4, index=1)
    >>> Shard.from_env({})
    Shard(count=1, index=0)
    """

    count: int
    index: int
    #: Where :meth:`from_env` found it (the variables read), else None.
    source: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        count = integer(self.count, "Shard.count", low=1)
        index = integer(self.index, "Shard.index", low=0, high=count)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "index", index)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Shard:
        """This process's shard, from the variables a cluster launcher sets (``os.environ``).

        Sources, each read when set:

        - ``TF_CONFIG`` (JSON, as for ``tf.distribute.MultiWorkerMirroredStrategy``): the training
          tasks are the ``chief`` and ``worker`` jobs of ``cluster``; their count is the number
          of workers and the index follows TensorFlow's own order (``chief`` 0 is index 0, then
          ``worker`` ``i`` is index ``i + len(chief)``), the same as the
          ``tf.distribute.InputContext.input_pipeline_id`` the strategy gives. An ``evaluator``
          task evaluates alone and reads everything: ``Shard(1, 0)``. A ``ps`` task, or any task
          of a cluster with ``ps`` jobs (parameter-server training, where the chief coordinates
          and reads no data), is an error: there, build datasets in the strategy's
          ``dataset_fn(input_context)`` and pass ``shard=input_context``. An empty ``TF_CONFIG``,
          or one with neither ``cluster`` nor ``task``, is ignored.
        - Slurm: ``SLURM_PROCID`` / ``SLURM_NTASKS`` (``SLURM_STEP_NUM_TASKS`` when set), inside
          a job step only (``srun`` sets ``SLURM_STEP_ID``): in a batch script outside ``srun``
          they describe the allocation, not the processes running, and are not read (one
          process reads everything).
        - MPI / Horovod: ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE`` (Open MPI),
          ``PMI_RANK`` / ``PMI_SIZE`` (MPICH, Intel MPI), ``HOROVOD_RANK`` / ``HOROVOD_SIZE``.
        - PyTorch: ``RANK`` / ``WORLD_SIZE``, as ``torchrun`` sets them for each process. They
          describe the process itself, so when both are set the Slurm, MPI and Horovod variables
          are not read: ``srun`` starting one ``torchrun`` per node sets ``SLURM_PROCID`` to the
          node's task, while each of its processes is a worker of its own. One of the two alone
          is ignored (``RANK`` is a common name).

        Nothing set: ``Shard(1, 0)``. The shard found says where in :attr:`source`. Several sources set: they must name the same shard (``srun``
        with PMI sets both ``SLURM_*`` and ``PMI_*``, for example; ``TF_CONFIG`` and
        ``RANK`` / ``WORLD_SIZE`` likewise).

        Args:
            environ: The variables to read; ``os.environ`` when None.

        Raises:
            ConfigError: (a ``ValueError``) malformed ``TF_CONFIG``, a ``ps`` task, a rank set
                without its size (or the reverse), a value that is not a non-negative integer, a
                size of 0, an index out of range, or sources that disagree. The message names the
                variables read and what was wrong; the fix is an explicit ``shard=``.

        >>> Shard.from_env({"TF_CONFIG": '{"cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"]},'
        ...                              ' "task": {"type": "worker", "index": 1}}'})
        Shard(count=3, index=2)
        """
        env = os.environ if environ is None else environ
        found: list[tuple[str, Shard]] = []
        tf_config = _from_tf_config(env)
        if tf_config is not None:
            found.append(tf_config)
        # `RANK` alone is too common a name to mean torchrun: the pair counts only when whole.
        _, rank_var, size_var = TORCH_RANK_PAIR
        torch = (
            _from_rank_pair(env, *TORCH_RANK_PAIR) if rank_var in env and size_var in env else None
        )
        if torch is not None:
            found.append(torch)
        else:
            for launcher, rank_var, size_var in ENV_RANK_PAIRS:
                if rank_var.startswith("SLURM_"):
                    if not any(step in env for step in SLURM_STEP):
                        continue  # a batch script outside a job step: the allocation's
                    if SLURM_STEP_TASKS in env:
                        size_var = SLURM_STEP_TASKS
                pair = _from_rank_pair(env, launcher, rank_var, size_var)
                if pair is not None:
                    found.append(pair)
        if not found:
            return cls(1, 0)
        shards = {shard for _, shard in found}
        if len(shards) > 1:
            listing = "; ".join(f"{what} -> worker {s.index} of {s.count}" for what, s in found)
            raise ConfigError(
                f"the environment names different workers for this process: {listing}. "
                f"Unset the variables that do not describe this job, or {_FIX}."
            )
        shard = found[0][1]
        return cls(shard.count, shard.index, source="; ".join(what for what, _ in found))


def _from_rank_pair(
    env: Mapping[str, str], launcher: str, rank_var: str, size_var: str
) -> tuple[str, Shard] | None:
    rank_text, size_text = env.get(rank_var), env.get(size_var)
    if rank_text is None and size_text is None:
        return None
    if rank_text is None or size_text is None:
        present, missing = (rank_var, size_var) if size_text is None else (size_var, rank_var)
        raise ConfigError(
            f"{launcher}: `{present}` is set ({env[present]!r}) but `{missing}` is not; both are "
            f"needed to know this worker's shard. Set both, unset `{present}`, or {_FIX}."
        )
    what = f"{rank_var}={rank_text!r}, {size_var}={size_text!r}"
    rank = _non_negative_int(rank_text)
    size = _non_negative_int(size_text)
    if rank is None or size is None:
        bad = rank_var if rank is None else size_var
        raise ConfigError(
            f"{launcher}: read {what}; `{bad}` must be a non-negative integer. "
            f"Fix the variable or {_FIX}."
        )
    if size < 1:
        raise ConfigError(
            f"{launcher}: read {what}; `{size_var}` must be at least 1. {_fix_cap()}."
        )
    if rank >= size:
        raise ConfigError(
            f"{launcher}: read {what}; `{rank_var}` must be in [0, {size}). {_fix_cap()}."
        )
    return what, Shard(size, rank)


def _non_negative_int(text: str) -> int | None:
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit():
        return None
    return int(stripped)


def _fix_cap() -> str:
    return _FIX[0].upper() + _FIX[1:]


def _tf_error(text: str, problem: str) -> ConfigError:
    shown = text if len(text) <= 200 else text[:197] + "..."
    return ConfigError(f"TF_CONFIG={shown!r}: {problem}. Fix TF_CONFIG or {_FIX}.")


def _from_tf_config(env: Mapping[str, str]) -> tuple[str, Shard] | None:
    text = env.get("TF_CONFIG")
    if text is None or not text.strip():
        return None
    try:
        config: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _tf_error(text, f"not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise _tf_error(text, f"must be a JSON object, got a {type(config).__name__}")
    cluster: Any = config.get("cluster") or {}
    task: Any = config.get("task") or {}
    if not cluster and not task:
        return None
    if not isinstance(cluster, dict) or not cluster:
        raise _tf_error(
            text, '"cluster" must be a non-empty object mapping job names to address lists'
        )
    if not isinstance(task, dict) or not task:
        raise _tf_error(
            text, '"task" must be an object {"type": ..., "index": ...} naming this task'
        )
    sizes: dict[str, int] = {}
    for job, addresses in cluster.items():
        if not isinstance(addresses, list):
            raise _tf_error(text, f'cluster job "{job}" must be a list of addresses')
        sizes[job] = len(addresses)
    task_type, index = task.get("type"), task.get("index", 0)
    if not isinstance(task_type, str):
        raise _tf_error(text, f'"task"."type" must be a string (got {task_type!r})')
    if isinstance(index, bool) or not isinstance(index, int):
        raise _tf_error(text, f'"task"."index" must be an integer (got {index!r})')
    if task_type not in sizes:
        raise _tf_error(
            text, f'task type "{task_type}" is not a job of "cluster" ({", ".join(sizes)})'
        )
    if not 0 <= index < sizes[task_type]:
        raise _tf_error(
            text,
            f'"task"."index" {index} is out of range for the {sizes[task_type]} '
            f'"{task_type}" tasks',
        )
    what = f"TF_CONFIG task {task_type}:{index}"
    if task_type == "ps" or sizes.get("ps"):
        raise _tf_error(
            text,
            'a cluster with "ps" tasks is parameter-server training, where the chief coordinates '
            "and reads no data; build the dataset in the strategy's dataset_fn(input_context) and "
            "pass `shard=input_context`",
        )
    if task_type == "evaluator":
        return what, Shard(1, 0)
    if task_type not in ("chief", "worker"):
        raise _tf_error(
            text, f'unknown task type "{task_type}"; expected "chief", "worker" or "evaluator"'
        )
    chiefs, workers = sizes.get("chief", 0), sizes.get("worker", 0)
    position = index if task_type == "chief" else chiefs + index
    return what, Shard(chiefs + workers, position)


def shard_bounds(n_rows: int, shard: Shard) -> tuple[int, int]:
    """``(start, stop)`` of shard ``shard.index`` when ``n_rows`` rows are split ``shard.count`` ways.

    >>> [shard_bounds(10, Shard(3, k)) for k in range(3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    return (n_rows * shard.index) // shard.count, (n_rows * (shard.index + 1)) // shard.count
