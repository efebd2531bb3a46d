"""Block reads: whole chunk-aligned blocks, each read once, shared safely between threads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf
import zarr

import arrayfeed as af
from arrayfeed._pipeline.api.resume import feeds_of
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.plan.shuffles import BlockOrder
from arrayfeed._pipeline.read import blocks
from arrayfeed._pipeline.read.blocks import WindowCache


class CountingChunked:
    """A chunked source that counts the storage reads it serves."""

    def __init__(self, array: np.ndarray, chunk_rows: int) -> None:
        self.array, self._chunk_rows = array, chunk_rows
        self.reads: list[tuple[int, int]] = []
        self.threads: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:  # type: ignore[type-arg]
        return self.array.dtype

    @property
    def chunk_rows(self) -> int:
        return self._chunk_rows

    def __len__(self) -> int:
        return len(self.array)

    def read(self, indices: np.ndarray) -> np.ndarray:
        assert (np.diff(indices) == 1).all(), "block reads are whole contiguous blocks"
        with self._lock:
            self.reads.append((int(indices[0]), int(indices[-1]) + 1))
            self.threads.append((threading.current_thread().name, int(indices[0])))
        return self.array[indices]


def order(n: int, block: int, window: int, epoch: int = 0, seed: int = 0) -> BlockOrder:
    plan = Plan(
        n_rows=n, batch_size=4, shuffle="block", block_rows=block, window_blocks=window, seed=seed
    )
    return plan.block_order(epoch)


@pytest.mark.parametrize("n, block, window", [(100, 10, 2), (103, 10, 3), (7, 10, 2), (64, 8, 8)])
def test_any_rows_in_any_order_come_from_whole_blocks_read_once(
    n: int, block: int, window: int
) -> None:
    a = np.arange(n * 3).reshape(n, 3)
    src = CountingChunked(a, block)
    cache = WindowCache(src, order(n, block, window), capacity=100)
    rng = np.random.default_rng(0)
    for size in [1, 5, 17, n, 3 * n]:
        idx = rng.integers(0, n, size=size).astype(np.int64)  # unsorted, with duplicates
        out = np.full((size, 3), -1)
        cache.gather_into(idx, out)
        np.testing.assert_array_equal(out, a[idx])
        np.testing.assert_array_equal(cache.read(np.sort(idx)), a[np.sort(idx)])
    blocks = -(-n // block)
    assert len(src.reads) == len(set(src.reads)) == cache.loads == blocks
    assert sorted(src.reads) == [(lo, min(lo + block, n)) for lo in range(0, n, block)]


def test_a_gather_across_windows_keeps_the_request_order() -> None:
    n = 200
    a = np.arange(n)
    plan = Plan(n_rows=n, batch_size=16, shuffle="block", block_rows=10, window_blocks=3, seed=3)
    cache = WindowCache(CountingChunked(a, 10), plan.block_order(1), capacity=2)
    idx = plan.indices(1, 0, plan.steps)  # the whole epoch: every window, in plan order
    out = np.empty(len(idx), dtype=a.dtype)
    cache.gather_into(idx, out)
    np.testing.assert_array_equal(out, idx)


@pytest.mark.parametrize("located", [1, 4])
def test_where_blocks_sit_is_remembered_for_at_most_a_bounded_number_of_blocks(
    located: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blocks, "LOCATED", located)
    n = 300
    a = np.arange(n)
    plan = Plan(n_rows=n, batch_size=8, shuffle="block", block_rows=5, window_blocks=3, seed=5)
    cache = WindowCache(CountingChunked(a, 5), plan.block_order(0), capacity=100)
    rng = np.random.default_rng(1)
    for step in range(plan.steps):
        idx = plan.indices(0, step, step + 1)
        out = np.empty(len(idx), dtype=a.dtype)
        cache.gather_into(idx, out)
        np.testing.assert_array_equal(out, idx)
        # At most `located` blocks are kept beyond those of the last request.
        assert len(cache._located) <= located + len(np.unique(idx // 5))
        shuffled = rng.permutation(idx)  # the same blocks again, in another order
        cache.gather_into(shuffled, out)
        np.testing.assert_array_equal(out, shuffled)
    assert cache.loads == n // 5


def test_a_request_reads_each_of_its_windows_once_even_beyond_the_capacity() -> None:
    # Unsorted rows alternate between three windows, two fit in the cache: a window evicted
    # between two stretches of the request must not be read again for the second.
    n = 60
    a = np.arange(n * 2).reshape(n, 2)
    src = CountingChunked(a, 10)
    cache = WindowCache(src, order(n, 10, 2), capacity=2)
    idx = np.random.default_rng(0).integers(0, n, size=1000).astype(np.int64)
    out = np.empty((len(idx), 2), dtype=a.dtype)
    cache.gather_into(idx, out)
    np.testing.assert_array_equal(out, a[idx])
    assert sorted(src.reads) == [(lo, lo + 10) for lo in range(0, n, 10)]


def test_a_full_cache_evicts_its_earliest_window() -> None:
    src = CountingChunked(np.arange(50), 10)
    o = order(50, 10, 1)  # one block per window
    block_of = {int(o.locate(np.array([b]))[0][0]): b for b in range(5)}
    cache = WindowCache(src, o, capacity=2)
    for w in [0, 1, 2, 1, 3, 2, 0]:
        cache.read(np.array([block_of[w] * 10], dtype=np.int64))
    # Windows come in increasing order; one read ahead (2 while 1 is in use) is never evicted
    # for an older one: 2 evicts 0, 3 evicts 1, and only a return to 0 reads it again.
    assert [lo // 10 for lo, _ in src.reads] == [block_of[w] for w in [0, 1, 2, 3, 0]]


@pytest.fixture
def one_epoch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads counted per epoch: no epoch's first windows read ahead while the one before ends
    (test_reading_ahead_reads_every_block_once_per_epoch counts those too)."""
    monkeypatch.setattr("arrayfeed._pipeline.read.readers.FOLLOW_SECONDS", 0.0)


@pytest.mark.parametrize("threads, batch", [(2, 32), (4, 8), (3, 50)])
def test_reading_ahead_reads_every_block_once_per_epoch(
    threads: int, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.plan.shuffles.MIN_BLOCK_BYTES", 1)
    monkeypatch.setattr(
        "arrayfeed._pipeline.plan.shuffles.WINDOW_BYTES", 3 * 64 * 8
    )  # windows of three blocks
    monkeypatch.setattr(
        "arrayfeed._pipeline.read.feed.GROUP_BYTES", 2 * batch * 8
    )  # groups of two batches
    n = 64 * 40 + 17
    src = CountingChunked(np.arange(n), 64)
    blocks = -(-n // 64)
    # A short epoch reads the next one's first windows ahead (counted below): not here.
    with monkeypatch.context() as m:
        m.setattr("arrayfeed._pipeline.read.readers.FOLLOW_SECONDS", 0.0)
        ds = af.from_arrays(src, batch_size=batch, shuffle="block", seed=3, num_threads=threads)
        for _ in range(2):
            src.reads.clear()
            rows = np.concatenate([b.numpy() for b in ds])
            assert sorted(rows.tolist()) == list(range(n))
            assert len(src.reads) == len(set(src.reads)) == blocks
    # With it: every block once per epoch, and some once more, read ahead for the third.
    ds = af.from_arrays(src, batch_size=batch, shuffle="block", seed=3, num_threads=threads)
    src.reads.clear()  # (the first batch, timed when the dataset was built)
    for _ in range(2):
        rows = np.concatenate([b.numpy() for b in ds])
        assert sorted(rows.tolist()) == list(range(n))
    held = feeds_of(ds)[0].ahead.held
    assert held is not None and held.epoch == 2
    held.close()  # (its reads done)
    counts = Counter(src.reads)
    assert len(counts) == blocks and set(counts.values()) <= {2, 3}
    ahead = sum(c == 3 for c in counts.values())
    assert 0 < ahead <= feeds_of(ds)[0]._cache_windows * 3  # windows of three blocks


class Fetching(CountingChunked):
    """Storage that fetches ahead (object storage): records the blocks it is told of."""

    def __init__(self, array: np.ndarray, chunk_rows: int) -> None:
        super().__init__(array, chunk_rows)
        self.fetches: list[int] = []

    def prefetch(self, starts: list[int], stops: list[int]) -> None:
        with self._lock:
            self.fetches.extend(starts)


@pytest.mark.parametrize("prefetching", [False, True])
def test_one_thread_serves_a_window_before_reading_the_next(
    prefetching: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one reader thread, the groups of a window come before the next window is read: its
    read-ahead would only hold them back (the one thread would decode the whole next window
    before it served the current window's second group)."""
    # blocks of one chunk, windows of three blocks, groups of two batches
    monkeypatch.setattr("arrayfeed._pipeline.plan.shuffles.MIN_BLOCK_BYTES", 1)
    monkeypatch.setattr("arrayfeed._pipeline.plan.shuffles.WINDOW_BYTES", 3 * 64 * 8)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 2 * 8 * 8)
    n = 64 * 12
    src = (Fetching if prefetching else CountingChunked)(np.arange(n), 64)
    b = af.batches(src, batch_size=8, shuffle="block", seed=3, num_threads=1, shard=None)
    src.reads.clear()  # the first batch, timed when the dataset was built
    order = b._feed.plan.block_order(0)
    window_of = {
        int(lo): w for w in range(order.windows) for lo in order.window_blocks(w)[0].tolist()
    }
    needs, read, fetched = [], [], []  # per batch: its rows' windows; windows read, fetched
    for batch in b:
        needs.append({window_of[int(row) // 64 * 64] for row in batch})
        read.append({window_of[lo] for lo, _ in src.reads})
        fetched.append({window_of[lo] for lo in getattr(src, "fetches", [])})
    assert len(needs) == n // 8 and len(src.reads) == 12
    ahead = 5  # the rest of this group and the two groups read ahead
    for i, done in enumerate(read):
        allowed = set().union(*needs[: i + 1 + ahead])
        assert done <= allowed, f"batch {i}: windows {sorted(done - allowed)} read ahead"
    if prefetching:  # object storage is still told of the next window early, to fetch it
        assert any(f - set().union(*needs[: i + 1 + ahead]) for i, f in enumerate(fetched))
        assert fetched[-1] == set(range(order.windows))


def test_threads_share_a_window_and_wait_for_blocks_in_flight() -> None:
    second_read = threading.Event()
    calls = []
    src = CountingChunked(np.arange(40), 10)
    inner_read = src.read

    def slow_read(indices: np.ndarray) -> np.ndarray:
        calls.append(indices[0])
        if len(calls) == 1:
            second_read.wait(5)  # hold the first block until another thread reads another one
        else:
            second_read.set()
        return inner_read(indices)

    src.read = slow_read  # type: ignore[method-assign]
    cache = WindowCache(src, order(40, 10, 4), capacity=4)  # one window of four blocks
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(cache.read, np.array([i], dtype=np.int64)) for i in range(0, 40, 5)]
        assert [int(f.result()[0]) for f in futures] == list(range(0, 40, 5))
    assert second_read.is_set()  # a second thread read a block while the first was reading
    assert sorted(src.reads) == [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert len({name for name, _ in src.threads}) > 1


def test_a_window_is_served_only_once_every_block_of_it_is_read() -> None:
    # One thread holds block 0 of a two-block window; a second reads block 1 and waits for
    # block 0. A third thread asking then must wait too, not take the window as read.
    entered, release = threading.Event(), threading.Event()
    src = CountingChunked(np.arange(20), 10)
    inner_read = src.read

    def hold_block_0(indices: np.ndarray) -> np.ndarray:
        if int(indices[0]) == 0:
            entered.set()
            release.wait(5)
        return inner_read(indices)

    src.read = hold_block_0  # type: ignore[method-assign]
    cache = WindowCache(src, order(20, 10, 2), capacity=4)  # one window of both blocks
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(cache.read, np.array([3], dtype=np.int64))
        assert entered.wait(5)
        second = pool.submit(cache.read, np.array([15], dtype=np.int64))
        deadline = time.monotonic() + 5
        while (10, 20) not in src.reads and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the second thread has read block 1 and waits for block 0
        third = pool.submit(cache.read, np.array([4, 16], dtype=np.int64))
        time.sleep(0.2)
        assert not (second.done() or third.done()), "served before block 0 was read"
        release.set()
        assert [first.result().tolist(), second.result().tolist()] == [[3], [15]]
        assert third.result().tolist() == [4, 16]
    assert sorted(src.reads) == [(0, 10), (10, 20)]


def test_a_failed_read_is_raised_and_not_cached() -> None:
    src = CountingChunked(np.arange(20), 10)
    calls = {"n": 0}
    inner_read = src.read

    def flaky(indices: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk hiccup")
        return inner_read(indices)

    src.read = flaky  # type: ignore[method-assign]
    cache = WindowCache(src, order(20, 10, 2), capacity=4)
    with pytest.raises(OSError, match="disk hiccup"):
        cache.read(np.array([3], dtype=np.int64))
    assert cache.read(np.array([3, 15], dtype=np.int64)).tolist() == [3, 15]
    assert cache.loads == 2


def test_a_thread_waiting_on_a_failed_read_reads_the_block_itself() -> None:
    failed = threading.Event()
    src = CountingChunked(np.arange(20), 10)
    inner_read = src.read

    def fail_first_read_of_block_0(indices: np.ndarray) -> np.ndarray:
        if int(indices[0]) == 0 and not failed.is_set():
            time.sleep(0.2)  # the other thread is waiting for this read meanwhile
            failed.set()
            raise OSError("disk hiccup")
        return inner_read(indices)

    src.read = fail_first_read_of_block_0  # type: ignore[method-assign]
    cache = WindowCache(src, order(20, 10, 2), capacity=4)  # one window of both blocks
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.read, np.array([3], dtype=np.int64))
        time.sleep(0.05)
        second = pool.submit(cache.read, np.array([3, 15], dtype=np.int64))
        with pytest.raises(OSError, match="disk hiccup"):
            first.result()
        assert second.result().tolist() == [3, 15]  # its own read of block 0, not the error
    assert sorted(src.reads) == [(0, 10), (10, 20)]


@pytest.mark.parametrize("count", [1, 3])
def test_block_shuffle_reads_every_block_once_per_epoch(
    count: int, monkeypatch: pytest.MonkeyPatch, one_epoch_at_a_time: None
) -> None:
    monkeypatch.setattr(
        "arrayfeed._pipeline.plan.shuffles.MIN_BLOCK_BYTES", 1
    )  # blocks of one chunk
    n, chunk = 1003, 50
    data = np.arange(n)
    per_worker = []
    for k in range(count):
        src = CountingChunked(data, chunk)
        ds = af.from_arrays(src, batch_size=16, shuffle="block", seed=4, shard=af.Shard(count, k))
        for epoch in range(2):
            src.reads.clear()
            rows = np.concatenate([b.numpy() for b in ds])
            start, stop = (n * k) // count, (n * (k + 1)) // count
            assert len(np.unique(rows)) == len(rows) == n // count
            assert ((rows >= start) & (rows < stop)).all()
            blocks_in_shard = (stop - 1) // chunk - start // chunk + 1
            assert len(src.reads) == len(set(src.reads)) == blocks_in_shard, epoch
            if epoch == 0:
                per_worker.append(rows)
    assert len(np.unique(np.concatenate(per_worker))) == count * (n // count)


def test_small_chunks_are_read_in_blocks_of_several_chunks(one_epoch_at_a_time: None) -> None:
    n = 2_000_000  # int64 rows in chunks of 1000 (8 KB): blocks of 525 chunks (>= 4 MiB)
    src = CountingChunked(np.arange(n), 1000)
    ds = af.from_arrays(src, batch_size=10_000, shuffle="block", seed=0)
    src.reads.clear()  # the first batch, timed when the dataset was built
    rows = np.concatenate([b.numpy() for b in ds])
    assert np.array_equal(np.sort(rows), np.arange(n))
    assert sorted(src.reads) == [(lo, min(lo + 525_000, n)) for lo in range(0, n, 525_000)]


def test_block_shuffle_on_real_chunked_files_stays_aligned(tmp_path: Path) -> None:
    n = 2000
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(64, 2), compression="lzf")  # splits the last axis
    z = zarr.create_array(tmp_path / "y.zarr", shape=(n,), dtype="int64", chunks=(100,))
    z[...] = np.arange(n)
    np.save(tmp_path / "w.npy", np.arange(n) * 0.5)
    h5 = h5py.File(tmp_path / "c.h5", "r")
    ds = af.from_arrays(
        h5["x"],
        zarr.open_array(tmp_path / "y.zarr", mode="r"),
        str(tmp_path / "w.npy"),
        batch_size=32,
        shuffle="block",
        seed=1,
    )
    orders = []
    for _ in range(2):
        ids = []
        for xb, yb, wb in ds:
            y = yb.numpy()
            np.testing.assert_array_equal(xb.numpy(), x[y])
            np.testing.assert_array_equal(wb.numpy(), y * 0.5)
            ids.append(y)
        order = np.concatenate(ids)
        assert sorted(order.tolist()) == list(range(n))
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[0], np.arange(n))


class RangeReading(CountingChunked):
    """A chunked source that reads whole ranges straight into the caller's buffer."""

    def __init__(self, array: np.ndarray, chunk_rows: int) -> None:
        super().__init__(array, chunk_rows)
        self.ranges: list[tuple[int, int]] = []

    def read(self, indices: np.ndarray) -> np.ndarray:
        raise AssertionError("whole blocks are read with read_range_into")

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        self.ranges.append((start, stop))
        out[...] = self.array[start:stop]


def test_blocks_are_read_straight_into_the_window_buffer() -> None:
    a = np.arange(120).reshape(60, 2)
    src = RangeReading(a, 10)
    cache = WindowCache(src, order(60, 10, 3), capacity=4)
    idx = np.random.default_rng(1).permutation(60).astype(np.int64)
    out = np.empty((60, 2), dtype=a.dtype)
    cache.gather_into(idx, out)
    np.testing.assert_array_equal(out, a[idx])
    assert sorted(src.ranges) == [(lo, lo + 10) for lo in range(0, 60, 10)]


@pytest.mark.parametrize("store", ["hdf5", "zarr", "zarr sharded"])
def test_block_shuffle_of_big_endian_chunked_storage_is_exact(tmp_path: Path, store: str) -> None:
    n = 1500
    x = (np.arange(n * 6, dtype=">f8") * 1.5).reshape(n, 2, 3)
    if store == "hdf5":
        with h5py.File(tmp_path / "x.h5", "w") as f:
            f.create_dataset("x", data=x, chunks=(32, 1, 3), compression="lzf")
        leaf: object = h5py.File(tmp_path / "x.h5", "r")["x"]
    else:
        shards = {"shards": (64, 2, 3)} if store == "zarr sharded" else {}
        z = zarr.create_array(
            tmp_path / "x.zarr",
            shape=x.shape,
            dtype=x.dtype,
            chunks=(32, 1, 3),
            serializer=zarr.codecs.BytesCodec(endian="big"),
            **shards,  # type: ignore[arg-type]
        )
        z[...] = x
        leaf = zarr.open_array(tmp_path / "x.zarr", mode="r")
    ds = af.from_arrays(leaf, np.arange(n), batch_size=64, shuffle="block", seed=5)
    seen = []
    for xb, yb in ds:
        assert xb.dtype == tf.float64
        np.testing.assert_array_equal(xb.numpy(), x[yb.numpy()])
        seen.append(yb.numpy())
    assert sorted(np.concatenate(seen).tolist()) == list(range(n))
