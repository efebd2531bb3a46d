"""Resuming: where a dataset's next pass starts, and the feed behind a dataset.

The plan is seekable, so starting at step ``S`` of epoch ``E`` costs O(1): nothing before it is
read or replayed. ``from_arrays(..., start_epoch=E, start_step=S)`` sets the first pass; the Keras
integration (:class:`arrayfeed.ResumeCallback`) moves a live dataset to Keras' epoch.

``from_arrays`` registers every dataset it returns together with its feed (weakly: the registry
never keeps a dataset alive). :func:`feeds_of` finds the feeds behind a dataset, also through the
tf.data transformations applied to it afterwards (``map``, ``prefetch``, ``with_options`` …), by
following each transformation's input datasets.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import ConfigError

if TYPE_CHECKING:
    from .feed import Feed

__all__ = ["check_position", "feeds_of", "register"]

_FEEDS: weakref.WeakKeyDictionary[Any, Feed] = weakref.WeakKeyDictionary()


def register(dataset: Any, feed: Feed) -> None:
    """Remember that ``dataset`` is fed by ``feed``."""
    _FEEDS[dataset] = feed


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


def check_position(
    steps: int, epoch: Any, step: Any, names: tuple[str, str] = ("epoch", "step")
) -> tuple[int, int]:
    """Validate a position ``(epoch, step)`` in a stream of epochs of ``steps`` batches each."""
    for name, value in zip(names, (epoch, step), strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ConfigError(f"`{name}` must be a non-negative int (got {value!r}).")
    if step >= steps:
        raise ConfigError(
            f"`{names[1]}` ({step}) must be less than the {steps} steps (batches) of an epoch on "
            f"this worker; to start after the last step of epoch {epoch}, use "
            f"`{names[0]}={epoch + 1}, {names[1]}=0`."
        )
    return int(epoch), int(step)
