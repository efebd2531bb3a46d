"""Reading rows into fresh, aligned, caller-independent buffers."""

from __future__ import annotations

import numpy as np

from arrayfeed._pipeline.read.rows import ALIGNMENT, aligned_empty, read_rows
from arrayfeed._storage.npy.memory import ArraySource


class SortedOnly:
    """A source without gather_into that checks what the core hands it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.calls = array, []  # type: ignore[var-annotated]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:  # type: ignore[type-arg]
        return self.array.dtype

    def __len__(self) -> int:
        return len(self.array)

    def read(self, indices: np.ndarray) -> np.ndarray:
        assert indices.dtype == np.int64 and indices.ndim == 1
        assert (np.diff(indices) > 0).all(), "indices must be sorted and unique"
        self.calls.append(indices.copy())
        return self.array[indices]


def test_order_restored_and_duplicates_served_from_one_read() -> None:
    a = np.arange(40.0).reshape(20, 2)
    src = SortedOnly(a)
    idx = np.array([17, 2, 9, 2, 0, 17], dtype=np.int64)
    (out,) = read_rows([src], idx)
    np.testing.assert_array_equal(out, a[idx])
    assert len(src.calls) == 1 and src.calls[0].tolist() == [0, 2, 9, 17]


def test_lead_shape_stacks_batches() -> None:
    a = np.arange(12)
    (out,) = read_rows(
        [ArraySource(a)], np.arange(12, dtype=np.int64)[::-1].copy(), lead_shape=(3, 4)
    )
    assert out.shape == (3, 4)
    assert out.tolist() == [[11, 10, 9, 8], [7, 6, 5, 4], [3, 2, 1, 0]]


def test_buffers_are_fresh_aligned_and_native() -> None:
    a = np.arange(30, dtype=">i4").reshape(10, 3)
    src = ArraySource(a)
    idx = np.arange(10, dtype=np.int64)
    first, second = read_rows([src], idx)[0], read_rows([src], idx)[0]
    assert first.ctypes.data % ALIGNMENT == 0 and first.dtype == np.dtype("=i4")
    assert not np.shares_memory(first, a) and not np.shares_memory(first, second)
    first[...] = -1
    np.testing.assert_array_equal(second, a)
    np.testing.assert_array_equal(a, np.arange(30).reshape(10, 3))


def test_aligned_empty() -> None:
    for shape in [(0,), (3,), (5, 7, 3)]:
        for dtype in [np.uint8, np.float64, np.complex128]:
            b = aligned_empty(shape, np.dtype(dtype))
            assert b.shape == shape and b.dtype == dtype and b.flags.c_contiguous
            assert b.size == 0 or b.ctypes.data % ALIGNMENT == 0


def test_pool_recycles_only_buffers_nothing_references() -> None:
    from arrayfeed._pipeline.read.rows import BufferPool

    pool = BufferPool(capacity=4)
    a = pool.empty((1000,), np.dtype(np.float64))
    a[...] = 1.0
    b = pool.empty((1000,), np.dtype(np.float64))  # `a` is still referenced: a new buffer
    assert not np.shares_memory(a, b) and pool.fresh == 2
    view = a[10:20]
    del a
    c = pool.empty((1000,), np.dtype(np.float64))  # a view keeps a's memory out of reuse
    assert not np.shares_memory(c, view) and pool.reused == 0
    del view, c
    d = pool.empty((1000,), np.dtype(np.float64))
    assert pool.reused == 1 and d.ctypes.data % ALIGNMENT == 0
    e = pool.empty((10,), np.dtype(np.float64))  # another size: never a recycled bigger buffer
    assert e.nbytes == 80 and pool.fresh == 4


def test_pool_capacity_bounds_what_it_keeps() -> None:
    from arrayfeed._pipeline.read.rows import BufferPool

    pool = BufferPool(capacity=2)
    held = [pool.empty((100,), np.dtype(np.uint8)) for _ in range(5)]
    assert pool.fresh == 5 and len(pool._buffers) == 2
    del held


def test_pool_byte_cap() -> None:
    from arrayfeed._pipeline.read.rows import BufferPool

    pool = BufferPool(capacity=100, max_bytes=10_000)
    held = [pool.empty((4000,), np.dtype(np.uint8)) for _ in range(5)]
    assert sum(b.nbytes for b in pool._buffers) <= 10_000 and len(pool._buffers) == 2
    del held
