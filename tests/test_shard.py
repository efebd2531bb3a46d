"""Shard validation and environment detection (`Shard.from_env`): tables of every form and error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from arrayfeed import ConfigError, Shard
from arrayfeed._pipeline.plan.shard import ENV_VARIABLES


def tf_config(cluster: Any, task_type: Any = "worker", index: Any = 0, **extra: Any) -> str:
    task: dict[str, Any] = {"type": task_type, "index": index}
    return json.dumps({"cluster": cluster, "task": task, **extra})


CHIEF_2W = {"chief": ["h:0"], "worker": ["h:1", "h:2"]}
WORKERS_3 = {"worker": ["h:1", "h:2", "h:3"]}

# ---------------------------------------------------------------------------------------------
# Shard itself


@pytest.mark.parametrize(
    ("count", "index", "match"),
    [
        (0, 0, "count` must be a positive int"),
        (2, 2, r"index` must be an int in \[0, 2\)"),
        (2, -1, r"index` must be an int in \[0, 2\)"),
        (2.0, 0, "count` must be a positive int"),
        (True, 0, "count` must be a positive int"),
        (2, "1", "index` must be an int"),
    ],
)
def test_shard_rejects(count: Any, index: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Shard(count, index)


def test_shard_is_frozen_and_hashable() -> None:
    shard = Shard(3, 1)
    assert {shard, Shard(3, 1)} == {shard}
    with pytest.raises(AttributeError):
        shard.index = 2  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# from_env: accepted forms

VALID: list[tuple[str, dict[str, str], Shard]] = [
    ("nothing set", {}, Shard(1, 0)),
    ("unrelated variables", {"PATH": "/bin", "SLURM_JOB_ID": "7"}, Shard(1, 0)),
    ("empty TF_CONFIG", {"TF_CONFIG": ""}, Shard(1, 0)),
    ("blank TF_CONFIG", {"TF_CONFIG": "  "}, Shard(1, 0)),
    ("TF_CONFIG {}", {"TF_CONFIG": "{}"}, Shard(1, 0)),
    ("TF_CONFIG empty cluster and task", {"TF_CONFIG": '{"cluster": {}, "task": {}}'}, Shard(1, 0)),
    ("TF chief with workers", {"TF_CONFIG": tf_config(CHIEF_2W, "chief", 0)}, Shard(3, 0)),
    ("TF worker 0 after chief", {"TF_CONFIG": tf_config(CHIEF_2W, "worker", 0)}, Shard(3, 1)),
    ("TF worker 1 after chief", {"TF_CONFIG": tf_config(CHIEF_2W, "worker", 1)}, Shard(3, 2)),
    ("TF workers only, 0", {"TF_CONFIG": tf_config(WORKERS_3, "worker", 0)}, Shard(3, 0)),
    ("TF workers only, 2", {"TF_CONFIG": tf_config(WORKERS_3, "worker", 2)}, Shard(3, 2)),
    ("TF single worker", {"TF_CONFIG": tf_config({"worker": ["h:1"]})}, Shard(1, 0)),
    ("TF chief alone", {"TF_CONFIG": tf_config({"chief": ["h:0"]}, "chief")}, Shard(1, 0)),
    (
        "TF task index defaults to 0",
        {"TF_CONFIG": json.dumps({"cluster": WORKERS_3, "task": {"type": "worker"}})},
        Shard(3, 0),
    ),
    (
        "TF evaluator reads everything",
        {"TF_CONFIG": tf_config({**CHIEF_2W, "evaluator": ["h:9"]}, "evaluator", 0)},
        Shard(1, 0),
    ),
    (
        "TF evaluator job not counted for workers",
        {"TF_CONFIG": tf_config({**CHIEF_2W, "evaluator": ["h:9"]}, "worker", 1)},
        Shard(3, 2),
    ),
    (
        "TF extra keys ignored",
        {"TF_CONFIG": tf_config(WORKERS_3, environment="cloud")},
        Shard(3, 0),
    ),
    ("Slurm", {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}, Shard(4, 3)),
    (
        "Slurm one task",
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"},
        Shard(1, 0),
    ),
    (
        "Slurm with spaces",
        {"SLURM_PROCID": " 1 ", "SLURM_NTASKS": "2\n", "SLURM_STEPID": "3"},
        Shard(2, 1),
    ),
    ("Open MPI", {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, Shard(2, 1)),
    ("PMI", {"PMI_RANK": "5", "PMI_SIZE": "8"}, Shard(8, 5)),
    ("Horovod", {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "16"}, Shard(16, 0)),
    (
        "srun with PMI: Slurm and PMI agree",
        {
            "SLURM_PROCID": "2",
            "SLURM_NTASKS": "4",
            "SLURM_STEP_ID": "0",
            "PMI_RANK": "2",
            "PMI_SIZE": "4",
        },
        Shard(4, 2),
    ),
    (
        "horovodrun over Open MPI: all agree",
        {
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "2",
            "HOROVOD_RANK": "1",
            "HOROVOD_SIZE": "2",
        },
        Shard(2, 1),
    ),
    ("torchrun", {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, Shard(8, 3)),
    ("RANK alone is not torchrun", {"RANK": "2"}, Shard(1, 0)),
    ("WORLD_SIZE alone is not torchrun", {"WORLD_SIZE": "4"}, Shard(1, 0)),
    (
        "RANK alone beside Slurm: Slurm's",
        {"RANK": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"},
        Shard(2, 1),
    ),
    (
        "torchrun started by srun, one task per node: the process's rank wins",
        {
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "2",
            "RANK": "5",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
        },
        Shard(8, 5),
    ),
    (
        "TF_CONFIG and torchrun agree",
        {"TF_CONFIG": tf_config(WORKERS_3, "worker", 2), "RANK": "2", "WORLD_SIZE": "3"},
        Shard(3, 2),
    ),
    (
        "TF_CONFIG and Slurm agree",
        {
            "TF_CONFIG": tf_config(CHIEF_2W, "worker", 1),
            "SLURM_PROCID": "2",
            "SLURM_NTASKS": "3",
            "SLURM_STEP_ID": "0",
        },
        Shard(3, 2),
    ),
]


@pytest.mark.parametrize(("env", "expected"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_from_env(env: dict[str, str], expected: Shard) -> None:
    assert Shard.from_env(env) == expected


def test_from_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    assert Shard.from_env() == Shard(1, 0)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "3")
    assert Shard.from_env() == Shard(3, 1)


def test_tf_config_index_matches_tensorflow() -> None:
    """Our TF_CONFIG numbering is TensorFlow's own worker numbering (input_pipeline_id)."""
    from tensorflow.python.distribute import multi_worker_util

    cluster = {"chief": ["h:0"], "worker": ["h:1", "h:2", "h:3"]}
    for task_type, index in [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)]:
        expected = multi_worker_util.id_in_cluster(cluster, task_type, index)
        count = multi_worker_util.worker_count(cluster, task_type)
        got = Shard.from_env({"TF_CONFIG": tf_config(cluster, task_type, index)})
        assert got == Shard(count, expected)


# ---------------------------------------------------------------------------------------------
# from_env: errors. Each row: the environment and fragments the message must contain.

ERRORS: list[tuple[str, dict[str, str], list[str]]] = [
    ("TF_CONFIG not JSON", {"TF_CONFIG": "{cluster: x}"}, ["TF_CONFIG=", "not valid JSON"]),
    ("TF_CONFIG truncated", {"TF_CONFIG": '{"cluster": {"worker": ["h:1"'}, ["not valid JSON"]),
    ("TF_CONFIG a list", {"TF_CONFIG": "[1, 2]"}, ["must be a JSON object", "list"]),
    (
        "TF_CONFIG task without cluster",
        {"TF_CONFIG": '{"task": {"type": "worker", "index": 0}}'},
        ['"cluster" must be a non-empty object'],
    ),
    (
        "TF_CONFIG cluster without task",
        {"TF_CONFIG": json.dumps({"cluster": WORKERS_3})},
        ['"task" must be an object'],
    ),
    (
        "TF_CONFIG cluster not an object",
        {"TF_CONFIG": '{"cluster": ["h:1"], "task": {"type": "worker", "index": 0}}'},
        ['"cluster" must be a non-empty object'],
    ),
    (
        "TF_CONFIG job not a list",
        {"TF_CONFIG": tf_config({"worker": "h:1,h:2"})},
        ['cluster job "worker" must be a list'],
    ),
    (
        "TF_CONFIG type missing",
        {"TF_CONFIG": tf_config(WORKERS_3, None)},
        ['"type" must be a string'],
    ),
    (
        "TF_CONFIG index a string",
        {"TF_CONFIG": tf_config(WORKERS_3, "worker", "1")},
        ['"index" must be an integer'],
    ),
    (
        "TF_CONFIG index a float",
        {"TF_CONFIG": tf_config(WORKERS_3, "worker", 1.0)},
        ['"index" must be an integer'],
    ),
    (
        "TF_CONFIG index a bool",
        {"TF_CONFIG": tf_config(WORKERS_3, "worker", True)},
        ['"index" must be an integer'],
    ),
    (
        "TF_CONFIG index out of range",
        {"TF_CONFIG": tf_config(WORKERS_3, "worker", 3)},
        ['"index" 3 is out of range for the 3 "worker" tasks'],
    ),
    (
        "TF_CONFIG negative index",
        {"TF_CONFIG": tf_config(WORKERS_3, "worker", -1)},
        ['"index" -1 is out of range'],
    ),
    (
        "TF_CONFIG type not in cluster",
        {"TF_CONFIG": tf_config(WORKERS_3, "chief", 0)},
        ['task type "chief" is not a job of "cluster" (worker)'],
    ),
    (
        "TF_CONFIG unknown type",
        {"TF_CONFIG": tf_config({"master": ["h:0"], "worker": ["h:1"]}, "master", 0)},
        ['unknown task type "master"'],
    ),
    (
        "TF_CONFIG ps task",
        {"TF_CONFIG": tf_config({**CHIEF_2W, "ps": ["h:5"]}, "ps", 0)},
        ['"ps" tasks is parameter-server training', "shard=input_context"],
    ),
    (
        "TF_CONFIG worker of a ps cluster",
        {"TF_CONFIG": tf_config({**CHIEF_2W, "ps": ["h:5"]}, "worker", 0)},
        ["parameter-server training"],
    ),
    (
        "Slurm rank without size",
        {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"},
        ["Slurm", "`SLURM_PROCID` is set ('0') but `SLURM_NTASKS` is not"],
    ),
    (
        "Slurm size without rank",
        {"SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"},
        ["`SLURM_NTASKS` is set ('4') but `SLURM_PROCID` is not"],
    ),
    ("Open MPI half", {"OMPI_COMM_WORLD_SIZE": "2"}, ["but `OMPI_COMM_WORLD_RANK` is not"]),
    ("PMI half", {"PMI_RANK": "1"}, ["but `PMI_SIZE` is not"]),
    ("Horovod half", {"HOROVOD_RANK": "1"}, ["but `HOROVOD_SIZE` is not"]),
    (
        "torchrun rank out of range",
        {"RANK": "4", "WORLD_SIZE": "4"},
        ["RANK='4', WORLD_SIZE='4'", "`RANK` must be in [0, 4)"],
    ),
    (
        "TF_CONFIG and torchrun disagree",
        {"TF_CONFIG": tf_config(WORKERS_3, "worker", 1), "RANK": "0", "WORLD_SIZE": "3"},
        ["TF_CONFIG task worker:1 -> worker 1 of 3", "RANK='0', WORLD_SIZE='3' -> worker 0 of 3"],
    ),
    (
        "rank not an integer",
        {"SLURM_PROCID": "one", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"},
        ["SLURM_PROCID='one', SLURM_NTASKS='4'", "`SLURM_PROCID` must be a non-negative integer"],
    ),
    (
        "size not an integer",
        {"PMI_RANK": "0", "PMI_SIZE": "2.0"},
        ["`PMI_SIZE` must be a non-negative integer"],
    ),
    (
        "empty rank",
        {"HOROVOD_RANK": "", "HOROVOD_SIZE": "2"},
        ["`HOROVOD_RANK` must be a non-negative"],
    ),
    (
        "negative rank",
        {"HOROVOD_RANK": "-1", "HOROVOD_SIZE": "2"},
        ["`HOROVOD_RANK` must be a non-negative"],
    ),
    (
        "size zero",
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "0", "SLURM_STEP_ID": "0"},
        ["`SLURM_NTASKS` must be at least 1"],
    ),
    (
        "rank out of range",
        {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"},
        [
            "OMPI_COMM_WORLD_RANK='2', OMPI_COMM_WORLD_SIZE='2'",
            r"`OMPI_COMM_WORLD_RANK` must be in [0, 2)",
        ],
    ),
    (
        "Slurm and MPI disagree on rank",
        {
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_STEP_ID": "0",
            "PMI_RANK": "1",
            "PMI_SIZE": "2",
        },
        [
            "different workers",
            "SLURM_PROCID='0', SLURM_NTASKS='2' -> worker 0 of 2",
            "PMI_RANK='1', PMI_SIZE='2' -> worker 1 of 2",
        ],
    ),
    (
        "TF_CONFIG and Slurm disagree on size",
        {
            "TF_CONFIG": tf_config(WORKERS_3, "worker", 1),
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "4",
            "SLURM_STEP_ID": "0",
        },
        ["TF_CONFIG task worker:1 -> worker 1 of 3", "SLURM_NTASKS='4' -> worker 1 of 4"],
    ),
    (
        "evaluator under a multi-task launcher",
        {
            "TF_CONFIG": tf_config({**WORKERS_3, "evaluator": ["h:9"]}, "evaluator", 0),
            "HOROVOD_RANK": "1",
            "HOROVOD_SIZE": "2",
        },
        [
            "TF_CONFIG task evaluator:0 -> worker 0 of 1",
            "HOROVOD_RANK='1', HOROVOD_SIZE='2' -> worker 1",
        ],
    ),
]


@pytest.mark.parametrize(("env", "fragments"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_from_env_errors(env: dict[str, str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Shard.from_env(env)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    assert "shard=" in message  # every message ends with the fix
    assert isinstance(info.value, ValueError)


def test_long_tf_config_is_shortened_in_message() -> None:
    text = json.dumps({"cluster": {"worker": [f"host{i}:1" for i in range(100)]}, "task": {}})
    with pytest.raises(ConfigError) as info:
        Shard.from_env({"TF_CONFIG": text})
    assert len(str(info.value)) < 600


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # sbatch --ntasks=4 running the script as one process: the allocation, not the readers.
        ({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, Shard(1, 0)),
        # srun -n 2 inside that allocation: the step's two tasks.
        (
            {
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "4",
                "SLURM_STEP_ID": "0",
                "SLURM_STEP_NUM_TASKS": "2",
            },
            Shard(2, 1),
        ),
    ],
    ids=["batch script outside a job step", "job step of fewer tasks"],
)
def test_slurm_counts_only_inside_a_job_step(env: dict[str, str], expected: Shard) -> None:
    assert Shard.from_env(env) == expected


def test_the_shard_found_says_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``shard="auto"`` logs what it found once, and ``Batches.shard`` says it."""
    import logging

    import numpy as np

    import arrayfeed as af

    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Shard.from_env().source == "SLURM_PROCID='1', SLURM_NTASKS='4'"
    monkeypatch.setattr("arrayfeed._pipeline.api.build._LOGGED", set())  # (logged once a process)
    with caplog.at_level(logging.INFO, logger="arrayfeed"):
        first = af.batches(np.arange(400), batch_size=10, seed=7)
        af.batches(np.arange(400), batch_size=10, seed=8)
    assert first.shard == Shard(4, 1) and first.shard.source == "SLURM_PROCID='1', SLURM_NTASKS='4'"
    assert len(first) == 10  # a quarter of the rows: this is worker 1 of 4
    said = [r.getMessage() for r in caplog.records if "shard='auto'" in r.getMessage()]
    assert said == [
        "shard='auto': this process reads worker 1 of 4's rows, from "
        "SLURM_PROCID='1', SLURM_NTASKS='4'"
    ]
    monkeypatch.delenv("SLURM_STEP_ID")
    alone = af.batches(np.arange(400), batch_size=10, seed=7)
    assert alone.shard == Shard(1, 0) and alone.shard.source is None and len(alone) == 40
