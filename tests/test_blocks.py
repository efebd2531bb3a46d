"""Block reads: whole chunk-aligned blocks, each read once, shared safely between threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed._blocks import BlockCache


class CountingChunked:
    """A chunked source that counts the storage reads it serves."""

    def __init__(self, array: np.ndarray, chunk_rows: int) -> None:
        self.array, self._chunk_rows = array, chunk_rows
        self.reads: list[tuple[int, int]] = []
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
        return self.array[indices]


def test_rows_come_from_whole_blocks_read_once() -> None:
    a = np.arange(100 * 3).reshape(100, 3)
    src = CountingChunked(a, 10)
    cache = BlockCache(src, block_rows=10, capacity=100)
    rng = np.random.default_rng(0)
    for _ in range(30):
        idx = np.sort(rng.choice(100, size=17, replace=False)).astype(np.int64)
        np.testing.assert_array_equal(cache.read(idx), a[idx])
    assert len(src.reads) == len(set(src.reads)) == cache.loads <= 10
    assert all(hi - lo == 10 for lo, hi in src.reads)


def test_capacity_evicts_least_recently_used() -> None:
    src = CountingChunked(np.arange(50), 10)
    cache = BlockCache(src, block_rows=10, capacity=2)
    for block in [0, 1, 0, 2, 0, 1]:
        cache.read(np.array([block * 10], dtype=np.int64))
    # 0 and 1 loaded; 0 kept hot; 2 evicts 1; 0 still there; 1 loaded again.
    assert [lo for lo, _ in src.reads] == [0, 10, 20, 10]


def test_threads_wait_for_a_block_in_flight_instead_of_reading_it_again() -> None:
    gate = threading.Event()
    src = CountingChunked(np.arange(40), 20)
    inner_read = src.read

    def slow_read(indices: np.ndarray) -> np.ndarray:
        gate.wait(5)
        return inner_read(indices)

    src.read = slow_read  # type: ignore[method-assign]
    cache = BlockCache(src, block_rows=20, capacity=4)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(cache.read, np.array([i], dtype=np.int64)) for i in range(8)]
        gate.set()
        assert [int(f.result()[0]) for f in futures] == list(range(8))
    assert src.reads == [(0, 20)]


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
    cache = BlockCache(src, block_rows=10, capacity=4)
    with pytest.raises(OSError, match="disk hiccup"):
        cache.read(np.array([3], dtype=np.int64))
    assert cache.read(np.array([3], dtype=np.int64)).tolist() == [3]


@pytest.mark.parametrize("count", [1, 3])
def test_block_shuffle_reads_every_block_once_per_epoch(
    count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("arrayfeed._plan.MIN_BLOCK_BYTES", 1)  # blocks of one chunk
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


def test_small_chunks_are_read_in_blocks_of_several_chunks() -> None:
    n = 2_000_000  # int64 rows in chunks of 1000 (8 KB): blocks of 525 chunks (>= 4 MiB)
    src = CountingChunked(np.arange(n), 1000)
    ds = af.from_arrays(src, batch_size=10_000, shuffle="block", seed=0)
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
