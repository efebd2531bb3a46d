"""Resuming: the feeds behind a dataset, for the Keras integration and :func:`arrayfeed.state`.

The plan is seekable (:func:`arrayfeed._pipeline.plan.plan.check_position`), so starting at step ``S``
of epoch ``E`` costs O(1). :class:`arrayfeed.ResumeCallback` moves a live dataset to Keras' epoch.

``from_arrays`` registers every dataset it returns together with its feed (weakly: the registry
never keeps a dataset alive). :func:`feeds_of` finds the feeds behind a dataset, also through the
tf.data transformations applied to it afterwards (``map``, ``prefetch``, ``with_options`` …), by
following each transformation's input datasets.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..read.feed import Feed

__all__ = [
    "Distributed",
    "distributed_of",
    "feeds_of",
    "live_feeds",
    "register",
    "register_distributed",
    "resumed_at",
]

_FEEDS: weakref.WeakKeyDictionary[Any, Feed] = weakref.WeakKeyDictionary()
#: Where the feeds of datasets built with ``resume=`` first started.
_RESUMED: weakref.WeakKeyDictionary[Feed, tuple[int, int]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Distributed:
    """This worker's part of a dataset of :func:`arrayfeed.distribute`: its feed, where that
    first started, and the batches (one per local replica) each step takes."""

    feed: Feed
    start: tuple[int, int]
    replicas: int


_DISTRIBUTED: weakref.WeakKeyDictionary[Any, Distributed] = weakref.WeakKeyDictionary()


def register(dataset: Any, feed: Feed, resumed: tuple[int, int] | None = None) -> None:
    """Remember that ``dataset`` is fed by ``feed`` (first started at ``resumed`` by
    ``resume=``, if it was)."""
    _FEEDS[dataset] = feed
    if resumed is not None:
        _RESUMED[feed] = resumed


def resumed_at(feed: Feed) -> tuple[int, int] | None:
    """Where ``feed`` first started, if it was built with ``resume=``."""
    return _RESUMED.get(feed)


def register_distributed(dataset: Any, part: Distributed) -> None:
    """Remember this worker's part of a dataset of :func:`arrayfeed.distribute`."""
    _DISTRIBUTED[dataset] = part


def distributed_of(dataset: Any) -> Distributed | None:
    """This worker's part of ``dataset``, a dataset of :func:`arrayfeed.distribute` (else None)."""
    try:
        return _DISTRIBUTED.get(dataset)
    except TypeError:  # not weak-referenceable or not hashable: not ours
        return None


def live_feeds() -> list[Feed]:
    """The feeds of every arrayfeed dataset still alive in this process."""
    return list(_FEEDS.values())


def feeds_of(dataset: Any) -> list[Feed]:
    """The feeds of the arrayfeed datasets ``dataset`` is, or was derived from (may be empty)."""
    found: list[Feed] = []
    seen: set[int] = set()
    todo = [dataset]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        try:
            feed = _FEEDS.get(node)
        except TypeError:  # not weak-referenceable or not hashable: not ours
            feed = None
        if feed is not None:
            if all(feed is not f for f in found):
                found.append(feed)
            continue
        inputs = getattr(node, "_inputs", None)  # tf.data: the datasets a transformation reads
        if callable(inputs):
            with contextlib.suppress(Exception):  # a dataset type that does not list its inputs
                todo.extend(inputs())
    return found
