"""The tf.data glue: ``from_arrays`` builds the ``tf.data.Dataset``.

The arguments are checked and the feed is built by :mod:`.build` (shared with
:func:`arrayfeed.batches`); this module turns the feed into a dataset. With ``keras.py`` and
``distribute.py`` the only modules that import TensorFlow, and the one place where
``output_signature`` is built.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeAlias

import tensorflow as tf

from .build import build_feed
from .feed import Feed
from .keras import guard_build_peeks, serve_numpy_batches
from .resume import register
from .shard import Shard
from .sparse import SparseBatch, SparseFeed, SparseLeafSpec, is_batch_leaf
from .structure import flatten

__all__ = ["from_arrays"]

ShardArg: TypeAlias = "Shard | tf.distribute.InputContext | Literal['auto'] | None"
_SHARD_KINDS = "'auto', None, arrayfeed.Shard(count, index) or a tf.distribute.InputContext"


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
    map_processes: int | None = None,
    sparse: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of shuffled, sharded batches read from arrays on disk or in memory.

    Args:
        x: An array-like, or a tuple / list / dict (nesting allowed) of array-likes. Array-like:
            ``np.ndarray`` (including ``np.memmap``), ``h5py.Dataset``, ``zarr.Array``, a path to a
            ``.npy`` file (memory-mapped, never loaded whole), a ``scipy.sparse`` CSR matrix or
            what :func:`open_array` returns (AnnData's sparse ``X`` and categoricals included).
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
            elements are what it returns. It runs in reader threads, possibly concurrently (or see
            ``map_processes``).
        num_threads: Reader threads (default: one per core, at most 4, or at most 8 when
            ``map_batch`` runs in them; with ``map_processes=N``, at least 2N + 1).
        start_epoch: Epoch of the first iteration (resuming); later iterations are the epochs
            after it. With the same ``seed``, the stream is exactly the one an uninterrupted run
            produces from that point on.
        start_step: Step (batch) of ``start_epoch`` where the first iteration starts, in
            ``[0, len(ds))``; reached in O(1), nothing before it is read. The first iteration then
            yields ``len(ds) - start_step`` batches and later ones ``len(ds)``. For Keras, use
            :class:`arrayfeed.ResumeCallback` instead.
        map_processes: Run ``map_batch`` in this many worker processes instead of reader
            threads: for transforms that hold the GIL (a Python loop per row: crops, tokenising,
            decoding). ``None`` or 0: threads. The elements are the same, bit for bit. Batches go
            to the workers and back through shared memory; ``map_batch`` is still called once
            here first (to learn its output). Workers start with the first epoch, use
            multiprocessing's start method (under ``spawn``/``forkserver``, ``map_batch`` must
            be picklable: a module-level function) and stop when the dataset is deleted. An
            exception in a worker is raised here as :class:`MapBatchError` with its traceback.
        sparse: Yield each sparse leaf (an AnnData CSR group, a ``scipy.sparse`` CSR matrix) as
            a ``tf.SparseTensor`` of ``dense_shape`` ``(batch rows, n_cols)``, built from the
            nonzeros of the batch's rows, never densified; other leaves are unchanged. Without
            it (the default), sparse leaves yield dense rows of their stored dtype. Batches hold
            the same rows either way; each element is one batch. Needs a sparse leaf; not with
            ``map_batch``.
        storage_options: Options of the fsspec filesystem of leaves given as URLs
            (``"s3://bucket/train.zarr:x"``): credentials, ``endpoint_url`` … (the environment's
            ``AWS_*`` variables work too); see :func:`open_array`.

    Returns:
        A dataset whose ``len()`` is the number of batches per epoch on this worker. Each new
        iteration (each Keras epoch) is the next epoch, shuffled from ``(seed, epoch)``. Keras on
        the JAX and torch backends takes this dataset's batches as NumPy arrays directly, not
        through tf.data (the same batches; a derived dataset goes through tf.data).

    >>> import numpy as np
    >>> ds = from_arrays(np.arange(10.0), np.arange(10), batch_size=4, shuffle=False)
    >>> len(ds)
    3
    >>> [b[1].numpy().tolist() for b in ds]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """
    if isinstance(shard, tf.distribute.InputContext):  # recognising it needs TensorFlow
        shard = Shard(shard.num_input_pipelines, shard.input_pipeline_id)
    built = build_feed(
        x,
        y,
        sample_weight,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        shard=shard,
        drop_remainder=drop_remainder,
        map_batch=map_batch,
        num_threads=num_threads,
        start_epoch=start_epoch,
        start_step=start_step,
        map_processes=map_processes,
        sparse=sparse,
        shard_kinds=_SHARD_KINDS,
        storage_options=storage_options,
    )
    feed, start = built.feed, built.start
    ds = _dataset(feed, sharded_by_us=built.sharded_by_us, first_pass_short=start[1] > 0)
    register(ds, feed)
    guard_build_peeks()  # Keras' look at one batch before training must not use up an epoch
    serve_numpy_batches()  # Keras on JAX / torch: NumPy batches, not tf.data's eager iteration
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
        return _with_sparse_tensors(feed) if isinstance(feed, SparseFeed) else feed()


def _with_sparse_tensors(feed: Feed) -> Iterator[Any]:
    """The elements of ``feed()``, each :class:`SparseBatch` as a ``tf.SparseTensor`` value
    (the epoch is taken at the first request, as ``feed()`` takes it)."""
    _, _, elements = feed.take()
    try:
        for element in elements:
            leaves, _ = flatten(element, is_batch_leaf)
            yield feed.treedef.unflatten(
                [
                    tf.compat.v1.SparseTensorValue(
                        leaf.coo_indices(), leaf.values, leaf.dense_shape()
                    )
                    if isinstance(leaf, SparseBatch)
                    else leaf
                    for leaf in leaves
                ]
            )
    finally:
        elements.close()


def _dataset(feed: Feed, *, sharded_by_us: bool, first_pass_short: bool = False) -> tf.data.Dataset:
    plan = feed.plan
    rows = plan.batch_size if plan.drop_remainder else None
    group = (None,) if feed.stacked else ()
    signature = feed.treedef.unflatten(
        [
            tf.SparseTensorSpec((rows, *spec.row_shape), tf.as_dtype(spec.dtype))
            if isinstance(spec, SparseLeafSpec)
            else tf.TensorSpec((*group, rows, *spec.row_shape), tf.as_dtype(spec.dtype))
            for spec in feed.specs
        ]
    )
    ds = tf.data.Dataset.from_generator(_WeakFeed(feed), output_signature=signature)
    if feed.stacked:
        # Groups are prefetched, and split where they are consumed: a prefetch hands every element
        # to another thread, and one hand-off per batch of small rows cost more than the batch
        # (S rows through a plain loop, 2 cores: 0.72x the tf.data floor prefetching batches,
        # 0.85x prefetching groups). Large batches are prefetched after the split too, so that
        # copying each out of its group overlaps with the consumer.
        ds = ds.prefetch(1).unbatch()
        if _batch_bytes(feed) >= PREFETCH_BATCH_BYTES:
            ds = ds.prefetch(2)
    else:
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


#: Batches of at least this many bytes are prefetched one by one after a group is split.
PREFETCH_BATCH_BYTES = 1 << 20


def _batch_bytes(feed: Feed) -> int:
    """Bytes of one full batch of ``feed``'s dense leaves."""
    return sum(spec.row_bytes for spec in feed.specs) * feed.plan.batch_size


def _up_to(ds: tf.data.Dataset, steps: int) -> tf.data.Dataset:
    """``ds`` with cardinality ``steps``, where a pass may also end earlier (a resumed first epoch).

    ``assert_cardinality`` fails a shorter pass, and ``repeat().take()`` would run into the next
    epoch. Choosing always from ``ds`` next to an infinite placeholder that is never chosen makes
    the cardinality infinite without changing the elements (the choice stops when ``ds`` ends), so
    ``take(steps)`` gives a known length.
    """
    placeholder = tf.data.Dataset.from_tensors(
        tf.nest.map_structure(_empty_like, ds.element_spec)
    ).repeat()
    choice = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    chosen = tf.data.Dataset.choose_from_datasets(
        [ds, placeholder], choice, stop_on_empty_dataset=True
    )
    return chosen.take(steps)


def _empty_like(spec: Any) -> Any:
    """A value of ``spec`` (a dense or sparse tensor spec) with no data."""
    shape = [0 if d is None else d for d in spec.shape]
    if isinstance(spec, tf.SparseTensorSpec):
        return tf.sparse.SparseTensor(
            tf.zeros([0, len(shape)], tf.int64), tf.zeros([0], spec.dtype), shape
        )
    return tf.zeros(shape, spec.dtype)
