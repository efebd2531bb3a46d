"""The tf.data glue: ``from_arrays`` builds the ``tf.data.Dataset``.

The arguments are those of :class:`~.options.FeedArgs`, checked and turned into a feed by
:mod:`.build` (shared with :func:`arrayfeed.batches`); this module turns the feed into a
dataset. With ``keras.py`` and ``distribute.py`` the only modules that import TensorFlow, and the
one place where ``output_signature`` is built.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import tensorflow as tf

from ..plan.shard import Shard
from ..read.feed import Feed
from ..read.sparse import SparseBatch, SparseFeed, SparseLeafSpec, is_batch_leaf
from ..read.structure import flatten
from .build import build_feed
from .keras import guard_build_peeks, serve_numpy_batches
from .options import FeedArgs, takes_feed_args
from .resume import register

__all__ = ["from_arrays"]

_SHARD_KINDS = "'auto', None, arrayfeed.Shard(count, index) or a tf.distribute.InputContext"


@takes_feed_args
def from_arrays(args: FeedArgs) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of shuffled, sharded batches read from arrays on disk or in memory.

    Under ``tf.distribute``: with ``shard=input_context`` in
    ``strategy.distribute_datasets_from_function``, give the per-replica ``batch_size``,
    ``input_context.get_per_replica_batch_size(global_batch_size)`` (or use
    :func:`arrayfeed.distribute`). ``strategy.experimental_distribute_dataset`` (which Keras
    ``fit`` uses) takes each worker's batch as the *global* batch and splits it over all
    replicas: a worker then runs ``num_workers * len(ds)`` steps per epoch. Keras ``fit`` still
    runs only ``len(ds)`` of them per epoch, which on several workers is ``1 / num_workers`` of
    the rows: there, use :func:`arrayfeed.distribute`.

    Args: FeedArgs

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
    shard = args.shard
    if isinstance(shard, tf.distribute.InputContext):  # recognising it needs TensorFlow
        args = replace(args, shard=Shard(shard.num_input_pipelines, shard.input_pipeline_id))
    built = build_feed(args, shard_kinds=_SHARD_KINDS)
    feed, start = built.feed, built.start
    ds = _dataset(feed, sharded_by_us=built.sharded_by_us, first_pass_short=start[1] > 0)
    register(ds, feed, start if built.resumed else None)
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
        # to another thread, and one hand-off per batch of small rows costs more than the batch
        # (docs/performance.md, "Prefetching groups, not batches"). A large batch is a slice
        # sharing its group's memory, where unbatch would copy it into fresh pages.
        if _batch_bytes(feed) >= SLICED_BATCH_BYTES:
            ds = ds.prefetch(1).flat_map(_slices(ds.element_spec))
        else:
            ds = ds.prefetch(1).unbatch()
    else:
        ds = ds.prefetch(2)
    if first_pass_short:
        ds = _up_to(ds, plan.steps)
    else:
        ds = ds.apply(tf.data.experimental.assert_cardinality(plan.steps))
    options = tf.data.Options()
    # Nothing here is autotuned, and with autotuning on, deleting an iterator (every epoch's end in
    # `fit`) waits for the autotuner's next wake-up (docs/performance.md, "tf.data autotuning
    # off"). A pipeline that wants it sets `autotune.enabled` again.
    options.autotune.enabled = False
    if sharded_by_us:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


#: Batches of at least this many bytes are split from their group as slices that share its
#: memory (a function call per batch), smaller ones copied out by ``unbatch`` (none per batch).
#: It is glibc's threshold for mapping an allocation fresh: smaller copies reuse heap memory,
#: larger ones would each fault in new pages (docs/performance.md, "Splitting groups").
SLICED_BATCH_BYTES = 128 << 10


def _slices(structure: Any) -> Callable[..., tf.data.Dataset]:
    """For ``flat_map``: the batches of a group whose elements have ``structure`` (the leaves
    stacked on a leading axis), each leaf ``leaf[i]``. A slice along the group axis of an aligned
    buffer is a view of it; TensorFlow copies only a slice it cannot align."""

    @tf.autograph.experimental.do_not_convert  # type: ignore[untyped-decorator]
    def split(*group: Any) -> tf.data.Dataset:
        leaves = tf.nest.flatten(group)
        steps = tf.shape(leaves[0], out_type=tf.int64)[0]

        @tf.autograph.experimental.do_not_convert  # type: ignore[untyped-decorator]
        def batch(i: tf.Tensor) -> Any:
            return tf.nest.pack_sequence_as(structure, [leaf[i] for leaf in leaves])

        return tf.data.Dataset.range(steps).map(batch)

    return split  # type: ignore[no-any-return]


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
