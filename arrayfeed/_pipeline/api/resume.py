"""Resuming: the feeds behind a dataset, for the Keras integration.

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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..read.feed import Feed

__all__ = ["feeds_of", "live_feeds", "register"]

_FEEDS: weakref.WeakKeyDictionary[Any, Feed] = weakref.WeakKeyDictionary()


def register(dataset: Any, feed: Feed) -> None:
    """Remember that ``dataset`` is fed by ``feed``."""
    _FEEDS[dataset] = feed


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
