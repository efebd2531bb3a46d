"""A :class:`Feed` built as ``from_arrays`` builds it, for tests that look inside one."""

from __future__ import annotations

from typing import Any

from arrayfeed._pipeline.build import build_feed
from arrayfeed._pipeline.feed import Feed


def h5_feed(
    datasets: tuple[Any, Any],
    *,
    batch_size: int,
    shuffle: Any,
    seed: int,
    threads: int,
    shard: Any = None,
    start_epoch: int = 0,
) -> Feed:
    """The feed of ``from_arrays(x, y, ...)`` over ``datasets`` (x, y), the last batch kept."""
    x, y = datasets
    return build_feed(
        x,
        y,
        None,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        shard=shard,
        drop_remainder=False,
        map_batch=None,
        num_threads=threads,
        start_epoch=start_epoch,
        start_step=0,
    ).feed
