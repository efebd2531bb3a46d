"""The tf.data glue: ``from_arrays`` builds the ``tf.data.Dataset``.

The only module that imports TensorFlow, and the one place where ``output_signature`` is built.
"""

from __future__ import annotations

import inspect
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeAlias

import tensorflow as tf

from .._dtypes import check_feedable
from .._errors import ConfigError, ShapeError, StructureError
from .._storage import Source, as_source, chunked_rows, is_array_like, row_bytes
from .._validate import flag, integer
from .feed import Feed
from .plan import Plan, block_layout, check_position, shuffle_mode
from .resume import register
from .shard import Shard
from .structure import Treedef, flatten

__all__ = ["from_arrays"]

ShardArg: TypeAlias = "Shard | tf.distribute.InputContext | Literal['auto'] | None"


def from_arrays(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    batch_size: int = 32,
    shuffle: bool | str = True,
    seed: int | None = None,
    shard: ShardArg = "auto",
    drop_remainder: bool = False,
    map_batch: Callable[[Any], Any] | None = None,
    num_threads: int | None = None,
    start_epoch: int = 0,
    start_step: int = 0,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of shuffled, sharded batches read from arrays on disk or in memory.

    Args:
        x: An array-like, or a tuple / list / dict (nesting allowed) of array-likes. Array-like:
            ``np.ndarray`` (including ``np.memmap``), ``h5py.Dataset``, ``zarr.Array``, a path to a
            ``.npy`` file (memory-mapped, never loaded whole) or what :func:`open_array` returns.
            All leaves of ``x``, ``y`` and ``sample_weight`` must have the same length (axis 0).
        y: Targets, the same kinds as ``x``; elements are ``(x, y)`` when given.
        sample_weight: Per-row weights; elements are ``(x, y, sample_weight)``. Needs ``y``.
        batch_size: Rows per batch on this worker. With ``shard=input_context`` in
            ``strategy.distribute_datasets_from_function``, give the per-replica size,
            ``input_context.get_per_replica_batch_size(global_batch_size)`` (or use
            :func:`arrayfeed.distribute`). ``strategy.experimental_distribute_dataset`` (which
            Keras ``fit`` uses) takes each worker's batch as the *global* batch and splits it
            over all replicas: a worker then runs ``num_workers * len(ds)`` steps per epoch.
            Keras ``fit`` still runs only ``len(ds)`` of them per epoch, which on several
            workers is ``1 / num_workers`` of the rows: there, use :func:`arrayfeed.distribute`.
        shuffle: ``True`` (a fresh permutation of this worker's rows every epoch), ``False``
            (storage order), or ``"block"``: a chunk-aware shuffle for chunked, compressed storage
            (HDF5, Zarr) — chunk-aligned blocks in a random order, rows shuffled within windows of
            blocks (about 32 MiB), so every block is read once per epoch. Each row still comes
            exactly once per epoch; mixing is local to a window.
        seed: Seed of the shuffle. The same seed gives the same stream of epochs in any process;
            ``None`` draws one at random.
        shard: ``"auto"`` (from the environment, see :meth:`Shard.from_env`: ``TF_CONFIG``, Slurm,
            MPI, Horovod; one worker when nothing is set), ``None`` (no sharding),
            :class:`Shard` ``(count, index)``, or a ``tf.distribute.InputContext``. Worker ``index``
            reads the ``index``-th contiguous range of rows, shuffled within; every worker runs the
            same number of steps (a worker with one row more leaves one row out per epoch).
        drop_remainder: Leave out the last, short batch of each epoch; the batch axis is then
            static.
        map_batch: A vectorized function called on each whole batch (NumPy arrays in the element's
            structure) returning a structure of arrays with the same batch size; the dataset's
            elements are what it returns. It runs in reader threads, possibly concurrently.
        num_threads: Reader threads (default: one per core, at most 8).
        start_epoch: Epoch of the first iteration (resuming); later iterations are the epochs
            after it. With the same ``seed``, the stream is exactly the one an uninterrupted run
            produces from that point on.
        start_step: Step (batch) of ``start_epoch`` where the first iteration starts, in
            ``[0, len(ds))``; reached in O(1), nothing before it is read. The first iteration then
            yields ``len(ds) - start_step`` batches and later ones ``len(ds)``. For Keras, use
            :class:`arrayfeed.ResumeCallback` instead.

    Returns:
        A dataset whose ``len()`` is the number of batches per epoch on this worker. Each new
        iteration (each Keras epoch) is the next epoch, shuffled from ``(seed, epoch)``.

    >>> import numpy as np
    >>> ds = from_arrays(np.arange(10.0), np.arange(10), batch_size=4, shuffle=False)
    >>> len(ds)
    3
    >>> [b[1].numpy().tolist() for b in ds]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """
    treedef, sources = _sources_of(x, y, sample_weight)
    resolved, ours = _resolve_shard(shard)
    mode = shuffle_mode(shuffle)
    block_rows, window_blocks = _block_layout(sources) if mode == "block" else (1, 1)
    plan = Plan(
        n_rows=len(sources[0]),
        batch_size=batch_size,
        shard=resolved,
        drop_remainder=bool(flag(drop_remainder, "drop_remainder")),
        shuffle=mode,
        seed=int.from_bytes(os.urandom(8), "little") if seed is None else seed,
        block_rows=block_rows,
        window_blocks=window_blocks,
    )
    if num_threads is not None:
        num_threads = integer(num_threads, "num_threads", low=1)
    if map_batch is not None:
        _check_map_batch(map_batch, y is not None)
    start = check_position(plan.steps, start_epoch, start_step, ("start_epoch", "start_step"))
    if seed is None and mode != "none" and start != (0, 0):
        raise ConfigError(
            f"resuming at `start_epoch={start[0]}, start_step={start[1]}` needs the seed of the "
            "run being resumed, but `seed` is None (a new random seed, so a different stream); "
            "pass the `seed` used before (and use a fixed seed from the first run on)."
        )
    feed = Feed(sources, treedef, plan, map_batch=map_batch, num_threads=num_threads)
    feed.seed_drawn = seed is None
    feed.seek(*start)
    ds = _dataset(feed, sharded_by_us=ours, first_pass_short=start[1] > 0)
    register(ds, feed)
    # The dataset object owns the feed: tf.data keeps the generator callable alive after the
    # dataset is gone, so that callable holds the feed only weakly (see _WeakFeed), and the feed's
    # files, buffers and threads go with the dataset and its iterators. Datasets derived by
    # tf.data transformations keep this one (and so the feed) alive through their inputs.
    ds._arrayfeed_feed = feed
    return ds


class _WeakFeed:
    """The generator callable handed to ``from_generator``: it holds the feed weakly.

    A running epoch (the generator ``feed()`` returns) holds the feed itself, so an iterator keeps
    its feed alive for as long as it runs, even after the dataset is deleted.
    """

    def __init__(self, feed: Feed) -> None:
        self._feed = weakref.ref(feed)

    def __call__(self) -> Iterator[Any]:
        feed = self._feed()
        if feed is None:
            raise RuntimeError(
                "the arrayfeed dataset this iterator belongs to was deleted before the iterator "
                "read anything; keep a reference to the dataset while iterating it."
            )
        return feed()


def _sources_of(x: Any, y: Any, sample_weight: Any) -> tuple[Treedef, list[Any]]:
    if x is None:
        raise StructureError("`x` is None; give at least one array as `x`.")
    if sample_weight is not None and y is None:
        raise StructureError("`sample_weight` needs `y`; pass targets as `y` too.")
    if y is None:
        element, root = x, "x"
    elif sample_weight is None:
        element, root = (x, y), "(x, y)"
    else:
        element, root = (x, y, sample_weight), "(x, y, sample_weight)"
    leaves, treedef = flatten(element, is_array_like, root)
    if treedef.kind == "leaf":
        names = ["x"]
    else:
        names = treedef.leaf_paths("")
        if y is not None:  # "[0]['image']" reads better as "x['image']"
            roots = ("x", "y", "sample_weight")
            names = [roots[int(n[1])] + n[3:] for n in names]
        else:
            names = ["x" + n for n in names]
    sources = []
    for name, leaf in zip(names, leaves, strict=True):
        source = as_source(leaf, name)
        check_feedable(source, name)
        sources.append(source)
    lengths = {len(s) for s in sources}
    if len(lengths) > 1:
        listing = ", ".join(f"{n}: {len(s)}" for n, s in zip(names, sources, strict=True))
        raise ShapeError(
            f"all arrays must have the same number of rows (axis 0), got {listing}; "
            "trim or align them before calling from_arrays."
        )
    return treedef, sources


def _check_map_batch(map_batch: Any, has_y: bool) -> None:
    """Refuse what cannot be a ``map_batch``: not callable, or needing more than one argument
    (the ``Dataset.map(lambda x, y: ...)`` habit; ``map_batch`` receives the element whole)."""
    if not callable(map_batch):
        raise ConfigError(f"`map_batch` must be callable (got {type(map_batch).__name__}).")
    try:
        parameters = inspect.signature(map_batch).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension without a signature: try it
        return
    required = [
        p
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        element = "the tuple `(x, y)` (or `(x, y, sample_weight)`)" if has_y else "`x`"
        names = ", ".join(p.name for p in required)
        raise ConfigError(
            f"`map_batch` takes {len(required)} arguments ({names}), but it is called with one: "
            f"the whole batch, {element}, in the element's structure. Take one argument and "
            "unpack it, e.g. `map_batch=lambda batch: (f(batch[0]), batch[1])`."
        )


def _resolve_shard(shard: ShardArg) -> tuple[Shard, bool]:
    """The shard this worker reads, and whether arrayfeed (not tf.data) does the sharding."""
    if shard is None:
        return Shard(1, 0), False
    if isinstance(shard, str) and shard == "auto":
        return Shard.from_env(), True
    if isinstance(shard, Shard):
        return shard, True
    if isinstance(shard, tf.distribute.InputContext):
        return Shard(shard.num_input_pipelines, shard.input_pipeline_id), True
    raise ConfigError(
        f"`shard` must be 'auto', None, arrayfeed.Shard(count, index) or a "
        f"tf.distribute.InputContext (got {shard!r})."
    )


def _block_layout(sources: list[Source]) -> tuple[int, int]:
    chunk_rows = [rows for rows in map(chunked_rows, sources) if rows]
    return block_layout(chunk_rows, row_bytes(sources))


def _dataset(feed: Feed, *, sharded_by_us: bool, first_pass_short: bool = False) -> tf.data.Dataset:
    plan = feed.plan
    rows = plan.batch_size if plan.drop_remainder else None
    group = (None,) if feed.stacked else ()
    signature = feed.treedef.unflatten(
        [
            tf.TensorSpec((*group, rows, *spec.row_shape), tf.as_dtype(spec.dtype))
            for spec in feed.specs
        ]
    )
    ds = tf.data.Dataset.from_generator(_WeakFeed(feed), output_signature=signature)
    if feed.stacked:
        ds = ds.unbatch()
    ds = ds.prefetch(2)
    if first_pass_short:
        ds = _up_to(ds, plan.steps)
    else:
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.steps))
    options = tf.data.Options()
    # Nothing in this pipeline is autotuned, and with autotuning on, deleting an iterator (the end
    # of every epoch in `fit`) can wait for the autotuner's next wake-up: measured 0.1-0.5 s per
    # epoch with TensorFlow 2.21. A pipeline that wants it sets `autotune.enabled` again.
    options.autotune.enabled = False
    if sharded_by_us:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _up_to(ds: tf.data.Dataset, steps: int) -> tf.data.Dataset:
    """``ds`` with cardinality ``steps``, where a pass may also end earlier (a resumed first epoch).

    ``assert_cardinality`` fails a shorter pass, and ``repeat().take()`` would run into the next
    epoch. Choosing always from ``ds`` next to an infinite placeholder that is never chosen makes
    the cardinality infinite without changing the elements (the choice stops when ``ds`` ends), so
    ``take(steps)`` gives a known length.
    """
    placeholder = tf.data.Dataset.from_tensors(
        tf.nest.map_structure(
            lambda spec: tf.zeros([0 if d is None else d for d in spec.shape], spec.dtype),
            ds.element_spec,
        )
    ).repeat()
    choice = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    chosen = tf.data.Dataset.choose_from_datasets(
        [ds, placeholder], choice, stop_on_empty_dataset=True
    )
    return chosen.take(steps)
