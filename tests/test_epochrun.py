"""The next epoch's first groups are read while an epoch ends (``arrayfeed/_pipeline/epochrun.py``):
the stream is the one without, each group is read once, and a read for a position nobody asks
for is dropped, never yielded."""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.feed import Feed
from arrayfeed._pipeline.plan import Plan
from arrayfeed._pipeline.structure import flatten
from arrayfeed._storage import as_source

from . import _workers
from ._feeds import h5_feed

N, BATCH = 2000, 32


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("epochrun") / "d.h5"
    with h5py.File(path, "w") as f:  # chunked and compressed: block mode reads windows
        f.create_dataset(
            "x", data=np.arange(N * 16).reshape(N, 16), chunks=(50, 16), compression="gzip"
        )
        f.create_dataset("y", data=np.arange(N), chunks=(50,), compression="gzip")
    return path


def _feed(path: Path, shuffle: Any, threads: int, start_epoch: int = 0) -> Feed:
    f = h5py.File(path, "r")  # open as long as the feed reads it
    feed = h5_feed(
        (f["x"], f["y"]),
        batch_size=BATCH,
        shuffle=shuffle,
        seed=3,
        threads=threads,
        start_epoch=start_epoch,
    )
    feed.group_steps = 4  # 16 groups an epoch
    return feed


def _rows(feed: Feed) -> np.ndarray:
    """The row ids (y) of the next epoch, in the order yielded; x checked against them."""
    ys = []
    for x, y in feed():
        x, y = x.reshape(-1, 16), y.reshape(-1)
        np.testing.assert_array_equal(x[:, 0], y * 16)
        ys.append(y.copy())
    return np.concatenate(ys)


@pytest.mark.parametrize("shuffle", [True, "block", False])
@pytest.mark.parametrize("threads", [1, 4])
def test_the_stream_is_the_one_of_epochs_read_alone(
    stored: Path, shuffle: Any, threads: int
) -> None:
    feed = _feed(stored, shuffle, threads)
    for epoch in range(4):
        got = _rows(feed)
        if epoch == 0:  # one pass reads nothing beyond itself
            assert feed._ahead is None
        else:
            assert feed._ahead is not None and feed._ahead.matches(epoch + 1, 0)
        alone = _rows(
            _feed(stored, shuffle, threads, start_epoch=epoch)
        )  # a new feed: no read ahead
        np.testing.assert_array_equal(got, alone)
        assert sorted(got.tolist()) == list(range(N))


def _recording(feed: Feed) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    read_group = feed.read_group

    def record(epoch: int, first: int, *args: Any) -> Any:
        calls.append((epoch, first))
        return read_group(epoch, first, *args)

    feed.read_group = record  # type: ignore[method-assign]
    return calls


def test_the_next_epoch_is_read_before_it_is_asked_for_and_once(stored: Path) -> None:
    feed = _feed(stored, True, 2)
    calls = _recording(feed)
    _rows(feed)
    assert not [first for epoch, first in calls if epoch == 1]  # one pass: nothing ahead
    _rows(feed)
    ahead = feed._ahead
    assert ahead is not None
    for future in ahead.pending:
        future.result(timeout=10)
    early = [first for epoch, first in calls if epoch == 2]
    assert early == [0, 4, 8][: len(early)] and 1 <= len(early) <= 3  # at most depth groups
    _rows(feed)
    firsts = [first for epoch, first in calls if epoch == 2]
    assert firsts == [first for first, _ in feed.groups()]  # each group of epoch 2 read once


def test_a_read_ahead_nobody_asks_for_is_dropped(stored: Path) -> None:
    feed = _feed(stored, True, 2)
    calls = _recording(feed)
    _rows(feed)
    _rows(feed)
    assert feed._ahead is not None and feed._ahead.matches(2, 0)
    feed.seek(5, 3)  # resume elsewhere: epoch 2's groups read so far are not used
    got = _rows(feed)
    alone = _feed(stored, True, 2, start_epoch=5)
    alone.seek(5, 3)
    np.testing.assert_array_equal(got, _rows(alone))
    assert next(first for epoch, first in calls if epoch == 5) == 3
    assert feed._ahead is not None and feed._ahead.matches(6, 0)


def test_a_failed_read_ahead_fails_the_epoch_it_belongs_to(stored: Path) -> None:
    feed = _feed(stored, True, 2)
    read_group = feed.read_group

    def fail_in_epoch_2(epoch: int, *args: Any) -> Any:
        if epoch == 2:
            raise OSError("disk gone")
        return read_group(epoch, *args)

    feed.read_group = fail_in_epoch_2  # type: ignore[method-assign]
    for _ in range(2):  # epochs 0 and 1 whole, and epoch 2 read ahead (and failed)
        assert sorted(_rows(feed).tolist()) == list(range(N))
    with pytest.raises(OSError, match="disk gone"):
        _rows(feed)
    feed.read_group = read_group  # type: ignore[method-assign]
    feed.seek(2)
    assert sorted(_rows(feed).tolist()) == list(range(N))  # read again, not the failed read


def test_threads_of_a_read_ahead_end_with_the_feed(stored: Path) -> None:
    feed = _feed(stored, "block", 4)
    _rows(feed)
    _rows(feed)
    assert feed._ahead is not None
    threads = list(feed._ahead.pool._threads)  # idle, kept for the next epoch
    assert threads and all(t.is_alive() for t in threads)
    del feed
    gc.collect()
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.slow
def test_a_forked_child_reads_its_next_epoch_itself(stored: Path) -> None:
    """A child forked after an epoch inherits the next epoch's read ahead, but not the pool's
    threads: it reads the epoch in its own."""
    feed = _feed(stored, True, 2)
    _rows(feed)
    _rows(feed)
    assert feed._ahead is not None and feed._ahead.matches(2, 0)
    _workers.INHERITED[:] = [feed]
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            child = pool.apply_async(_workers.next_epoch_of_inherited_feed).get(timeout=60)
    finally:
        _workers.INHERITED.clear()
    assert child == _rows(feed).tolist()  # the same epoch 2, read here from the read ahead


def test_arrays_in_memory_changed_between_epochs_are_read_as_changed(stored: Path) -> None:
    """Nothing is read ahead beside an array in memory: labels rewritten between epochs (new
    pseudo-labels, say) are what the next epoch yields, from its first batch."""
    labels = np.arange(N) * 10
    with h5py.File(stored, "r") as f:
        leaves, treedef = flatten((f["x"], labels), lambda v: not isinstance(v, tuple))
        sources = [as_source(leaf, name) for leaf, name in zip(leaves, "xy", strict=True)]
        feed = Feed(sources, treedef, Plan(n_rows=N, batch_size=BATCH, seed=3), num_threads=2)
        feed.group_steps = 4
        for epoch in range(3):
            for x, y in feed():
                x, y = x.reshape(-1, 16), y.reshape(-1)
                np.testing.assert_array_equal(y, x[:, 0] // 16 * 10 + epoch)
            assert feed._ahead is None
            labels += 1  # in place, between epochs


def test_a_file_changed_after_its_next_epoch_was_read_ahead_fails_that_epoch(
    tmp_path: Path,
) -> None:
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(N * 16).reshape(N, 16), chunks=(50, 16))
        f.create_dataset("y", data=np.arange(N), chunks=(50,))
    feed = _feed(path, True, 2)
    _rows(feed)
    _rows(feed)
    assert feed._ahead is not None and feed._ahead.matches(2, 0)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(af.CorruptDataError, match="changed since arrayfeed opened it"):
        _rows(feed)
