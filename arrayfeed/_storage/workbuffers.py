"""Byte buffers for reading and decoding chunks, reused from one read to the next.

A fresh buffer of a chunk's size is not free: once a ``from_generator`` iterator exists, glibc
maps every allocation of 128 KiB or more anew and unmaps it when it is freed, so a reader that
allocated per chunk page-faulted every byte it decoded (docs/performance.md, "Work buffers").
Readers take buffers here and give them back once the chunk is copied out.
"""

from __future__ import annotations

import threading

import numpy as np

from .._forks import renew_after_fork

__all__ = ["MIN_BYTES", "WorkBuffers", "give", "lend", "work"]

#: Smaller buffers are allocated per read: glibc serves them from its heap even at the mmap
#: threshold TensorFlow sets, and lending them cost more than it saved.
MIN_BYTES = 128 << 10


class WorkBuffers:
    """Byte buffers lent to one chunk read at a time and kept for the next (by all threads: reader
    threads end with every epoch). At most ``keep`` buffers and ``max_bytes`` are kept."""

    def __init__(self, keep: int = 32, max_bytes: int = 128 << 20) -> None:
        self._free: list[np.ndarray] = []
        self._kept = 0  # bytes in _free
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self.keep, self.max_bytes = keep, max_bytes

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer of at least ``nbytes`` (at most about twice that): the one given back last
        that fits, whose bytes are the likeliest to be in the CPU's caches still."""
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                if nbytes <= self._free[i].nbytes <= 2 * nbytes + 4096:
                    self._kept -= self._free[i].nbytes
                    return self._free.pop(i)
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, *buffers: np.ndarray | None) -> None:
        """Keep ``buffers`` for the next reads; when that is too many, the oldest kept go (so the
        buffers follow the chunk sizes being read now, not those read first)."""
        with self._lock:
            for buffer in (b for b in buffers if b is not None):
                if buffer.nbytes > self.max_bytes:
                    continue
                while self._free and (
                    len(self._free) >= self.keep or self._kept + buffer.nbytes > self.max_bytes
                ):
                    self._kept -= self._free.pop(0).nbytes
                self._free.append(buffer)
                self._kept += buffer.nbytes


#: The buffers every chunk reader shares.
work = WorkBuffers()


def lend(nbytes: int) -> np.ndarray:
    """A byte buffer of at least ``nbytes``: lent by :data:`work` when large, else new."""
    if nbytes >= MIN_BYTES:
        return work.take(nbytes)
    return np.empty(nbytes, dtype=np.uint8)


def give(*buffers: np.ndarray | None) -> None:
    """Give back the buffers :func:`lend` lent (the small ones it allocated are dropped)."""
    lent = [b for b in buffers if b is not None and b.nbytes >= MIN_BYTES]
    if lent:
        work.give(*lent)
