"""The arguments of the entry points, defined once.

No TensorFlow. :class:`FeedArgs` lists every argument :func:`arrayfeed.from_arrays` and
:func:`arrayfeed.batches` take, with its type, its default and its documentation.
:func:`takes_feed_args` gives each entry point that signature and that documentation (what
``help``, ``inspect.signature``, IDEs and mypy see) and hands it a call's arguments as one
:class:`FeedArgs`; :func:`arrayfeed.distribute` checks the keywords it forwards against the same
fields (:func:`check_forwarded`). The values are checked in one place, one fixed order:
:func:`~.build.build_feed`.

A new option is one field of :class:`FeedArgs` and its entry in the ``Args`` of its docstring,
plus its use in :func:`~.build.build_feed`.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

from ..plan.shard import Shard


class InputContext(Protocol):
    """What a ``tf.distribute.InputContext`` tells (named structurally: the options take one
    without importing TensorFlow)."""

    num_input_pipelines: int
    input_pipeline_id: int


__all__ = ["FeedArgs", "check_forwarded", "takes_feed_args"]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, eq=False)
class FeedArgs:
    """The arguments of :func:`arrayfeed.from_arrays` and :func:`arrayfeed.batches` (and those
    :func:`arrayfeed.distribute` forwards), as one call gave them: not yet checked.

    Args:
        x: An array-like, or a tuple / list / dict (nesting allowed) of array-likes. Array-like:
            ``np.ndarray`` (including ``np.memmap``), ``h5py.Dataset``, ``zarr.Array``, a path to
            a ``.npy`` file (memory-mapped, never loaded whole), a ``scipy.sparse`` CSR matrix or
            what :func:`arrayfeed.open_array` returns (AnnData's sparse ``X`` and categoricals
            included). All leaves of ``x``, ``y`` and ``sample_weight`` must have the same length
            (axis 0).
        y: Targets, the same kinds as ``x``; batches are ``(x, y)`` when given.
        sample_weight: Per-row weights; batches are ``(x, y, sample_weight)``. Needs ``y``.
        batch_size: Rows per batch on this worker.
        shuffle: ``True`` (a fresh permutation of this worker's rows every epoch), ``False``
            (storage order), or ``"block"``: a chunk-aware shuffle for chunked, compressed storage
            (HDF5, Zarr) — chunk-aligned blocks in a random order, rows shuffled within windows of
            blocks (about 32 MiB), so every block is read once per epoch. Each row still comes
            exactly once per epoch; mixing is local to a window.
        seed: Seed of the shuffle. The same seed gives the same stream of epochs in any process;
            ``None`` draws one at random.
        shard: ``"auto"`` (from the environment, see :meth:`Shard.from_env`: ``TF_CONFIG``, Slurm,
            MPI, Horovod; one worker when nothing is set), ``None`` (no sharding),
            :class:`Shard` ``(count, index)`` (e.g. ``Shard(jax.process_count(),
            jax.process_index())``, or ``Shard(world_size, rank)`` under ``torchrun``), or, for
            :func:`arrayfeed.from_arrays`, a ``tf.distribute.InputContext``. Worker ``index``
            reads the ``index``-th contiguous range of rows, shuffled within; every worker runs
            the same number of steps (a worker with one row more leaves one row out per epoch).
        drop_remainder: Leave out the last, short batch of each epoch, so every batch has
            ``batch_size`` rows: the batch axis is then static (one shape: one compilation under
            ``jax.jit``).
        map_batch: A vectorized function called on each whole batch (NumPy arrays in the batch's
            structure) returning a structure of arrays with the same batch size; the batches are
            what it returns. It runs where the batches are read, possibly concurrently: in
            reader threads, or in loader processes (see ``processes``).
        num_threads: Reader threads, fixed: groups read at once (in each loader process, if
            any), one more requested ahead. By default they are tuned while reading: they start
            at one per core (at most 4, or 8 when ``map_batch`` runs in them) and move to the
            setting that delivers the most rows per second to the consumer, a tie going to
            fewer (see :func:`arrayfeed.tuning`). Given, it fixes the loaders too (one, by
            default). Either way the batches and their order are the same.
        start_epoch: Epoch of the first iteration (resuming); later iterations are the epochs
            after it. With the same ``seed``, the stream is exactly the one an uninterrupted run
            produces from that point on.
        start_step: Step (batch) of ``start_epoch`` where the first iteration starts, at least 0
            and less than the batches per epoch (the ``len()`` of what is returned); reached in
            O(1), nothing before it is read. The first iteration then yields the batches from
            there on, and later ones whole epochs. A saved :attr:`Batches.position` is passed
            back as ``(start_epoch, start_step)``; for Keras, use
            :class:`arrayfeed.ResumeCallback` instead.
        resume: A state saved from the same data (:meth:`Batches.state`,
            :func:`arrayfeed.state`): the first iteration starts at the batch after the last
            one the saved job took, on this job's workers. With the workers, batch size and
            ``drop_remainder`` of the saved job, that is the stream the saved job would have
            gone on with; with others (a job restarted on fewer or more workers), the rest of
            the saved epoch is dealt over this job's workers, every row the saved job had not
            taken once, and every worker the same steps (the rest is the last steps of the
            epoch; fewer than workers x ``batch_size`` rows of it are left out); later epochs
            are this job's own. ``seed=None`` takes the state's seed. A state of other data, seed
            or shuffle mode is a :class:`~arrayfeed.ResumeError`. Not with ``start_epoch`` /
            ``start_step``.
        sparse: Yield each sparse leaf (an AnnData CSR group, a ``scipy.sparse`` CSR matrix) as
            a sparse batch of shape ``(batch rows, n_cols)`` — a ``tf.SparseTensor`` from
            :func:`arrayfeed.from_arrays` (one batch per element), a ``scipy.sparse.csr_array``
            from :func:`arrayfeed.batches` (needs scipy) — built from the nonzeros of the batch's
            rows, never densified; other leaves are unchanged. Without it (the default), sparse
            leaves yield dense rows of their stored dtype. Batches hold the same rows either way.
            Needs a sparse leaf; not with ``map_batch``.
        storage_options: Options of the fsspec filesystem of leaves given as URLs
            (``"s3://bucket/train.zarr:x"``): credentials, ``endpoint_url`` … (the environment's
            ``AWS_*`` variables work too); see :func:`arrayfeed.open_array`.
        cache: For leaves given as URLs: a directory on local disk (``True``: ``arrayfeed``
            under the user's cache directory) where the objects read are kept for every process
            of the host (loader processes, other datasets, jobs and ranks) and checked on every
            read, so that each is fetched once, not every epoch; see
            :func:`arrayfeed.open_array` and :func:`arrayfeed.cache_report`.
        cache_limit: The most bytes ``cache`` holds, least recently used objects out first
            (default: half the free disk there).
        processes: Loader processes that read the batches beside this one (index planning,
            reads, decoding, checksums, ``map_batch``: everything), handing each group over in
            shared memory, so that this process (the training loop) only takes finished batches.
            ``None`` (the default): loaders when every leaf can be read from another process
            (paths, URLs, ``h5py`` / Zarr arrays of files opened read-only, ``np.load(...,
            mmap_mode="r")`` memory maps; in-memory arrays up to 64 MiB travel with them), the
            batches are dense, ``map_batch`` can be pickled and this process may use two cores
            or more — one, and more while the loaders reading are busy and one more delivers
            more rows per second (tuned while reading, up to one per usable core, unless
            ``num_threads`` is given); otherwise (and when every leaf is an array in memory)
            reader threads in this process. ``0``: reader threads in this
            process. ``N``: N loaders, the groups dealt out among them (for a ``map_batch`` that
            holds the GIL). The stream is the same, bit for bit, wherever it is read. Loaders
            start with the dataset (a new interpreter each, never a fork: ``map_batch`` and its
            closures travel by value), serve every dataset of this process, and stop with it; a
            loader that dies is a :class:`~arrayfeed.LoaderError` naming its exit code.
    """

    x: Any
    y: Any = None
    sample_weight: Any = None
    _: KW_ONLY
    batch_size: int = 32
    shuffle: bool | str = True
    seed: int | None = None
    shard: Shard | InputContext | Literal["auto"] | None = "auto"
    drop_remainder: bool = False
    map_batch: Callable[[Any], Any] | None = None
    num_threads: int | None = None
    start_epoch: int = 0
    start_step: int = 0
    resume: Mapping[str, Any] | None = None
    sparse: bool = False
    storage_options: Mapping[str, Any] | None = None
    cache: str | os.PathLike[str] | bool | None = None
    cache_limit: int | None = None
    processes: int | None = None

    @classmethod
    def options(cls) -> list[str]:
        """The names of the keyword-only arguments (everything but the arrays)."""
        return [f.name for f in fields(cls) if f.kw_only]


#: The line of an entry point's docstring that the ``Args`` of :class:`FeedArgs` replace.
ARGS_MARKER = "    Args: FeedArgs\n"


def _takes(template: Callable[P, FeedArgs]) -> Callable[[Callable[[FeedArgs], R]], Callable[P, R]]:
    def decorate(impl: Callable[[FeedArgs], R]) -> Callable[P, R]:
        name = impl.__name__
        returns = inspect.signature(impl).return_annotation
        signature = inspect.signature(template).replace(return_annotation=returns)

        @functools.wraps(impl)
        def entry(*args: P.args, **kwargs: P.kwargs) -> R:
            try:  # Python's own message, naming the entry point
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{name}() {exc}") from None
            return impl(template(*bound.args, **bound.kwargs))

        entry.__signature__ = signature  # type: ignore[attr-defined]
        entry.__doc__ = _with_args(impl.__doc__ or "", name)
        return entry

    return decorate


#: Gives the decorated ``impl(args: FeedArgs) -> R`` the signature of :class:`FeedArgs`, its
#: ``Args`` in place of the docstring's ``Args: FeedArgs`` line, and its name in messages.
takes_feed_args = _takes(FeedArgs)


def _with_args(doc: str, name: str) -> str:
    """``doc`` with :data:`ARGS_MARKER` replaced by the ``Args`` of :class:`FeedArgs`."""
    if ARGS_MARKER not in doc:
        raise AssertionError(f"the docstring of {name} has no line {ARGS_MARKER.strip()!r}")
    own = inspect.cleandoc(FeedArgs.__doc__ or "")
    section = own[own.index("Args:\n") :]
    return doc.replace(ARGS_MARKER, "".join(f"    {line}\n" for line in section.splitlines()))


def check_forwarded(kwargs: Iterable[str], target: str) -> None:
    """Refuse keywords forwarded to the entry point ``target`` that are not its options, with
    the message a call of ``target`` gives."""
    options = FeedArgs.options()
    for name in kwargs:
        if name not in options:
            raise TypeError(f"{target}() got an unexpected keyword argument {name!r}")
