"""``distribute``: one call from arrays to a ``tf.distribute.DistributedDataset``.

It is ``strategy.distribute_datasets_from_function`` with a dataset function that calls
:func:`from_arrays` with ``shard=input_context`` and the per-replica batch size, the route where
sizes mean what they say under every strategy (see the README, "Distributed training").
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from ..._errors import ConfigError
from ..._validate import integer
from .dataset import from_arrays
from .options import check_forwarded
from .resume import Distributed, feeds_of, register_distributed

__all__ = ["distribute", "distributed_steps"]

_STEPS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def distribute(
    strategy: tf.distribute.Strategy,
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    global_batch_size: int,
    repeat: bool = False,
    **from_arrays_kwargs: Any,
) -> Any:
    """Batches of ``global_batch_size`` rows per step, split over all replicas of ``strategy``.

    Every input pipeline (one per worker) reads its own shard (``shard=input_context``), batched at
    ``global_batch_size // strategy.num_replicas_in_sync`` rows per replica; each step takes one
    such batch for every replica, so one step consumes ``global_batch_size`` rows over the whole
    job. Every worker runs the same number of steps per epoch (:func:`distributed_steps`), so the
    all-reduce at the end of an epoch never waits for a worker that has run out.

    Args:
        strategy: A ``tf.distribute`` strategy (``MirroredStrategy``,
            ``MultiWorkerMirroredStrategy``, ``OneDeviceStrategy``, the default strategy ...).
        x: As for :func:`from_arrays`.
        y: As for :func:`from_arrays`.
        sample_weight: As for :func:`from_arrays`.
        global_batch_size: Rows per step over all replicas of all workers; must be a multiple of
            ``strategy.num_replicas_in_sync``.
        repeat: Repeat forever, one arrayfeed epoch after the other (each freshly shuffled), for
            ``model.fit(..., steps_per_epoch=distributed_steps(dataset))`` in tf-keras, which
            does not start a new iterator per epoch on a distributed dataset. Needs every epoch to
            end on a step boundary (see Raises).
        **from_arrays_kwargs: Any other option of :func:`from_arrays` (``shuffle``, ``seed``,
            ``drop_remainder``, ``map_batch``, ``num_threads``, ``resume`` …, see
            :class:`~arrayfeed._pipeline.api.options.FeedArgs`); not ``batch_size`` or ``shard``,
            which this function sets.

    Returns:
        A ``tf.distribute.DistributedDataset``; each iteration over it (``for batch in ds``) is the
        next epoch. Its elements are ``PerReplica`` values for ``strategy.run``.

    Raises:
        ConfigError: ``global_batch_size`` is not a positive int or not a multiple of
            ``strategy.num_replicas_in_sync``; ``batch_size`` or ``shard`` was given; or
            ``repeat=True`` and a worker's batches per epoch are not a multiple of its replicas.
        TypeError: A keyword that is no option of :func:`from_arrays`.

    >>> import numpy as np, tensorflow as tf
    >>> ds = distribute(tf.distribute.get_strategy(), np.arange(10.0), global_batch_size=4,
    ...                 shuffle=False)
    >>> [batch.numpy().tolist() for batch in ds]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    >>> distributed_steps(ds)
    3
    """
    global_batch = integer(global_batch_size, "global_batch_size", low=1)
    for name in ("batch_size", "shard"):
        if name in from_arrays_kwargs:
            raise ConfigError(
                f"`{name}` is set by arrayfeed.distribute (from `global_batch_size` and the "
                f"strategy's input context); drop it, or call from_arrays yourself."
            )
    check_forwarded(from_arrays_kwargs, "from_arrays")
    _check_per_replica(global_batch, int(strategy.num_replicas_in_sync))
    pipelines = _Pipelines((x, y, sample_weight), global_batch, repeat, from_arrays_kwargs)
    dataset = strategy.distribute_datasets_from_function(pipelines)
    if pipelines.steps:  # the strategy builds this worker's datasets eagerly
        _STEPS[dataset] = pipelines.steps[0]
        register_distributed(dataset, pipelines.parts[0])
    return dataset


def _check_per_replica(global_batch: int, replicas: int) -> None:
    """Refuse a global batch that the replicas cannot share equally."""
    if global_batch % replicas:
        lower = global_batch - global_batch % replicas
        raise ConfigError(
            f"`global_batch_size` ({global_batch}) must be a multiple of the "
            f"{replicas} replicas in sync (strategy.num_replicas_in_sync); use "
            f"{lower or replicas} or {lower + replicas}."
        )


@dataclass
class _Pipelines:
    """The dataset function :func:`distribute` gives the strategy: the dataset of each input
    pipeline, and the steps per epoch and the feed of each built (only this worker's, in this
    process)."""

    arrays: tuple[Any, Any, Any]
    global_batch: int
    repeat: bool
    options: dict[str, Any]
    steps: list[int] = field(default_factory=list)
    parts: list[Distributed] = field(default_factory=list)

    def __call__(self, ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = from_arrays(
            *self.arrays,
            batch_size=ctx.get_per_replica_batch_size(self.global_batch),
            shard=ctx,
            **self.options,
        )
        local_replicas = max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines)
        batches = len(ds)
        if self.repeat and batches % local_replicas:
            raise ConfigError(
                f"`repeat=True` needs each epoch to end on a step boundary, but this worker has "
                f"{batches} batches per epoch for {local_replicas} local replicas; change "
                "`global_batch_size` or the number of rows, or set `repeat=False`."
            )
        self.steps.append(math.ceil(batches / local_replicas))
        (feed,) = feeds_of(ds)
        self.parts.append(Distributed(feed, feed.next_position, local_replicas))
        return ds.repeat() if self.repeat else ds


def distributed_steps(dataset: Any) -> int:
    """Steps per epoch on this worker (the same on every worker) of a :func:`distribute` dataset.

    Each step takes one batch for every local replica: this is ``len(from_arrays(...))`` of a
    worker divided by its local replicas, rounded up.

    Raises:
        ConfigError: ``dataset`` was not made by :func:`distribute` in this process.
    """
    try:
        return _STEPS[dataset]
    except (KeyError, TypeError):
        raise ConfigError(
            f"`dataset` ({type(dataset).__name__}) was not made by arrayfeed.distribute; for a "
            "from_arrays dataset use len(dataset)."
        ) from None
