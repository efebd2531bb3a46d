"""Reading rows of several sources into aligned buffers that nobody else holds.

Every call returns memory that nobody else holds: the buffers are allocated here (or recycled by a
:class:`BufferPool` once nothing references them any more), filled, and handed over. ``tf.data``
may wrap a yielded buffer without copying it and use (or even write into) it later, so arrayfeed
never yields a view of a caller's array and never touches a buffer that anything still references.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..._dtypes import native_dtype
from ..._forks import renew_after_fork
from ..._storage import GatherInto, Source

__all__ = ["ALIGNMENT", "Allocator", "BufferPool", "aligned_empty", "read_rows"]

#: Byte alignment of fresh buffers; TensorFlow copies less aligned ones.
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """A new uninitialised C-contiguous array whose data starts on an ``ALIGNMENT``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(math.prod(shape)) * dtype.itemsize
    return _aligned_view(np.empty(nbytes + ALIGNMENT, dtype=np.uint8), shape, dtype)


class Allocator(Protocol):
    """Where :func:`read_rows` gets its output arrays: a :class:`BufferPool`, or a loader's
    slot of shared memory (:mod:`.loader.slots`)."""

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray: ...


class BufferPool:
    """Recycles large output buffers once nothing references them any more.

    A fresh multi-megabyte buffer costs a page fault per page on its first write (glibc maps large
    allocations anew each time; docs/performance.md, "Recycling output buffers"). A buffer is handed out again only when the pool's own reference is the last one: every
    array viewing it (and so every TensorFlow tensor that wraps one without copying, which holds
    a reference to the array until the tensor is freed) keeps it out of reuse. At most
    ``capacity`` buffers and ``max_bytes`` bytes are kept (for the pool's lifetime, which is its
    dataset's); beyond that, new buffers are simply not tracked.
    """

    def __init__(self, capacity: int, max_bytes: int = 256 << 20) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self.fresh = 0
        self.reused = 0
        # The reference count of a buffer that only the pool holds, counted the way _free counts
        # it (it differs between Python versions), so reuse never depends on a constant.
        probe = [np.empty(1, dtype=np.uint8)]
        self._free_count = self._count(probe, 0)

    @staticmethod
    def _count(buffers: list[np.ndarray], i: int) -> int:
        raw = buffers[i]
        return sys.getrefcount(raw)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """An uninitialised aligned array, like :func:`aligned_empty`, possibly recycled."""
        dtype = np.dtype(dtype)
        nbytes = int(math.prod(shape)) * dtype.itemsize + ALIGNMENT
        with self._lock:  # the view is made under the lock: no other thread sees `raw` as free
            i = self._free(nbytes)
            if i is None:
                raw = np.empty(nbytes, dtype=np.uint8)
                self.fresh += 1
                kept = sum(b.nbytes for b in self._buffers)
                if len(self._buffers) < self.capacity and kept + nbytes <= self.max_bytes:
                    self._buffers.append(raw)
            else:
                raw = self._buffers[i]
                self.reused += 1
            return _aligned_view(raw, shape, dtype)

    def clear(self) -> None:
        """Forget every buffer (those still in use live on with their users)."""
        with self._lock:
            self._buffers.clear()

    def _free(self, nbytes: int) -> int | None:
        for i in range(len(self._buffers)):
            if (
                self._buffers[i].nbytes == nbytes
                and self._count(self._buffers, i) == self._free_count
            ):
                return i
        return None


def _aligned_view(raw: np.ndarray, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    nbytes = int(math.prod(shape)) * dtype.itemsize
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


class _SortedRequest:
    """Sorted, de-duplicated form of a request, computed once and shared by every source."""

    def __init__(self, indices: npt.NDArray[np.int64]) -> None:
        order = np.argsort(indices, kind="stable")
        ordered = indices[order]
        keep = np.ones(len(ordered), dtype=bool)
        keep[1:] = ordered[1:] != ordered[:-1]
        self.unique = ordered[keep]
        # ``inverse[i]`` is where ``indices[i]`` sits in ``unique``.
        self.inverse = np.empty(len(indices), dtype=np.int64)
        self.inverse[order] = np.cumsum(keep) - 1


def read_rows(
    sources: Sequence[Source],
    indices: npt.NDArray[np.int64],
    lead_shape: tuple[int, ...] | None = None,
    pool: Allocator | None = None,
) -> list[np.ndarray]:
    """Rows ``indices`` (any order, duplicates allowed) of every source, in that order.

    Each result is an aligned array that nobody else holds (new, or recycled by ``pool``), of
    shape ``lead_shape + row_shape`` (``lead_shape`` defaults to ``(len(indices),)`` and must
    hold ``len(indices)`` elements).
    """
    lead = (len(indices),) if lead_shape is None else lead_shape
    request: _SortedRequest | None = None
    results = []
    for source in sources:
        shape, dtype = lead + tuple(source.shape[1:]), native_dtype(source.dtype)
        out = pool.empty(shape, dtype) if pool is not None else aligned_empty(shape, dtype)
        flat = out.reshape((len(indices), *out.shape[len(lead) :]))
        if isinstance(source, GatherInto):
            source.gather_into(indices, flat)
        else:
            if request is None:
                request = _SortedRequest(indices)
            data = source.read(request.unique)
            np.take(data, request.inverse, axis=0, out=flat, mode="clip")  # unbuffered out
        results.append(out)
    return results
