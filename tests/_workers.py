"""Functions run in child processes by ``test_lifecycle.py`` (no TensorFlow: children start fast)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import arrayfeed
from arrayfeed._pipeline.read.feed import Feed


def read_in_child(feed: Feed, epoch: int, indices: np.ndarray) -> dict[str, Any]:
    """Read epoch ``epoch`` through a pickled feed, and ``indices`` from each of its sources."""
    inherited = [getattr(s, "_dataset", "n/a") for s in feed.sources]
    feed.seek(epoch)
    groups = list(feed())
    direct = [s.read(indices) for s in feed.sources]
    return {
        "module": arrayfeed.__file__,
        "pid": os.getpid(),
        "groups": groups,
        "direct": direct,
        "h5_handles_inherited": [h for h in inherited if h != "n/a"],
        "h5_reopened_here": [s._pid == os.getpid() for s in feed.sources if hasattr(s, "_dataset")],
    }


def read_after_fork(source: Any, indices: np.ndarray) -> dict[str, Any]:
    """Read from an H5Source whose handle was opened by the parent before the fork."""
    inherited = source._dataset
    rows = source.read(indices)
    return {
        "rows": rows,
        "reopened": source._dataset is not inherited and source._pid == os.getpid(),
    }


#: Set by the parent before it forks: what a forked child iterates as inherited, not pickled.
INHERITED: list[Any] = []


def iterate_inherited() -> list[list[list[int]]]:
    """One epoch of each inherited ``Batches``: the row ids (``y``) of every batch."""
    return [[np.asarray(batch[1]).tolist() for batch in b] for b in INHERITED]
