"""A :class:`Feed` built as ``from_arrays`` builds it, for tests that look inside one; runs of
the pieces of a range read; small image files to read; a tuner that moves on every request."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from arrayfeed._pipeline.api.build import build_feed
from arrayfeed._pipeline.api.options import FeedArgs
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._pipeline.tune.tuning import Tuner


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
        FeedArgs(
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
            processes=0,  # read here, where the tests look inside the feed
            start_epoch=start_epoch,
            start_step=0,
        )
    ).feed


def piece_runs(pieces: int, rng: np.random.Generator) -> list[list[tuple[int, int]]]:
    """Ways to cut the pieces ``range(pieces)`` of a range read into runs ``(first, last)``, each
    way in a shuffled order (window-cache threads read runs in any order): one piece at a time,
    runs of random lengths, and all at once."""
    cuts = sorted({0, pieces, *rng.integers(1, max(2, pieces), size=3).tolist()})
    random_runs = [(a, b) for a, b in itertools.pairwise(cuts) if a < b]
    ways = [[(p, p + 1) for p in range(pieces)], random_runs, [(0, pieces)]]
    return [[way[i] for i in rng.permutation(len(way))] for way in ways]


def image_files(root: Path, rows: int, compression: str) -> dict[str, Any]:
    """``rows`` uint8 images (8 x 8 x 3) and int64 labels as ``.npy`` paths and as chunked HDF5
    (64 rows a chunk, ``compression``): ``{"npy": (x, y), "h5": ("d.h5:x", "d.h5:y"),
    "arrays": (x, y)}``."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (rows, 8, 8, 3), dtype=np.uint8)
    y = np.arange(rows, dtype=np.int64)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    with h5py.File(root / "d.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(64, 8, 8, 3), compression=compression)
        f.create_dataset("y", data=y, chunks=(64,), compression=compression)
    return {
        "npy": (str(root / "x.npy"), str(root / "y.npy")),
        "h5": (f"{root / 'd.h5'}:x", f"{root / 'd.h5'}:y"),
        "arrays": (x, y),
    }


class Chaos(Tuner):
    """A tuner that draws the groups to read at once at random on every request (1 to
    ``cap``), and the loader processes to read with (1 to ``processes``) every time they are
    asked for."""

    def __init__(self, cap: int, seed: int, processes: int = 0) -> None:
        self._rng = random.Random(seed)
        self.asked: set[int] = set()
        self.asked_processes: set[int] = set()
        self._most = processes
        super().__init__(1, cap, processes=min(1, processes), most_processes=processes)

    @property
    def threads(self) -> int:
        value = self._rng.randint(1, self.cap)
        self.asked.add(value)
        return value

    @property
    def processes(self) -> int:
        value = self._rng.randint(1, self._most) if self._most else 0
        self.asked_processes.add(value)
        return value


def force_retuning(b: Any, seed: int, processes: int = 0) -> Chaos:
    """Give the feed of ``b`` (an ``arrayfeed.Batches``) and its loaders a :class:`Chaos` tuner
    (one that also draws 1 to ``processes`` loader processes: the feed's must be read by one)."""
    feed = b._feed
    chaos = Chaos(max(8, feed.tuner.cap), seed, processes)
    feed.tuner = chaos
    if feed._remote is not None:
        feed._remote.tuner = chaos
    return chaos
