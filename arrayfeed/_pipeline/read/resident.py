"""Small chunked leaves held in memory: read whole once, then gathered like an array.

Labels and weights beside large features are usually stored the way the features are: in
chunks of the same rows (``arrayfeed convert`` writes them so, and so do most writers), which
makes each chunk of a label tiny (16 rows of int32: 64 bytes). Read chunk by chunk, every such
chunk costs what a large one does in Python: a claim, a ``pread``, its decoders, a copy, each
native call a GIL hand-off. Next to the features' reads that is a large share of all the calls
and of the GIL-held time (docs/performance.md, "Resident leaves").

So a chunked leaf of at most :data:`RESIDENT_BYTES` that is at most 1/:data:`RESIDENT_SHARE`
of the largest leaf (smallest first, up to :data:`RESIDENT_TOTAL` in all) has this worker's rows
read whole the first time a group needs them, by that reader thread (through its storage, so
chunk checksums are checked as always), and then gathered from memory with one ``take`` per
group. Only the worker's shard is read: another worker's rows are never fetched or decoded
here. A failed read is tried again by the next group. The feed still verifies the storage
itself at every epoch start, so a file changed since it was opened raises there as before. A
leaf that is the largest (or the only one) is never held: its reads are the chunked storage
path.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._dtypes import native_dtype
from ..._forks import renew_after_fork
from ..._storage import ReadRangeInto, Source, SparseRows, chunked_rows, row_bytes
from .rows import aligned_empty

__all__ = ["RESIDENT_BYTES", "RESIDENT_SHARE", "RESIDENT_TOTAL", "Resident", "resident_sources"]

#: Largest leaf (decoded bytes) held in memory.
RESIDENT_BYTES = 32 << 20
#: A held leaf is at most this fraction of the largest leaf (1 / RESIDENT_SHARE).
RESIDENT_SHARE = 8
#: Most bytes held in memory for all the leaves of a feed together.
RESIDENT_TOTAL = 64 << 20


class Resident:
    """A chunked source whose rows ``[start, stop)`` (the worker's shard; default: all) are read
    on first use and gathered from memory after that; other rows cannot be read through it."""

    def __init__(self, source: Source, start: int = 0, stop: int | None = None) -> None:
        self.source = source
        self.start, self.stop = start, len(source) if stop is None else stop
        self._array: np.ndarray | None = None
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return native_dtype(self.source.dtype)

    def __len__(self) -> int:
        return len(self.source)

    @property
    def loaded(self) -> bool:
        """Whether the rows are in memory (for tests and benchmarks)."""
        return self._array is not None

    def array(self) -> np.ndarray:
        """Every row, read from storage the first time."""
        array = self._array
        if array is None:
            with self._lock:  # other threads wait for this one read, not a read of their own
                if self._array is None:
                    self._array = self._read_all()
                array = self._array
        return array

    def _read_all(self) -> np.ndarray:
        start, stop = self.start, self.stop
        out = aligned_empty((stop - start, *self.shape[1:]), self.dtype)
        if isinstance(self.source, ReadRangeInto):
            self.source.read_range_into(start, stop, out)
        else:
            out[...] = self.source.read(np.arange(start, stop, dtype=np.int64))
        out.flags.writeable = False
        return out

    def _local(self, indices: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        if len(indices) and (int(indices.min()) < self.start or int(indices.max()) >= self.stop):
            raise IndexError(  # a plan bug: a worker reads its own rows only
                f"rows {indices} are not all in this worker's rows {self.start}..{self.stop - 1}"
            )
        return indices - self.start if self.start else indices

    def read(self, indices: npt.NDArray[np.int64]) -> np.ndarray:
        return np.take(self.array(), self._local(indices), axis=0)

    def gather_into(self, indices: npt.NDArray[np.int64], out: np.ndarray) -> None:
        local = self._local(indices)
        np.take(self.array(), local, axis=0, out=out, mode="clip")  # unbuffered

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy (another process) reads its own: rows and locks are not sent.
        return Resident, (self.source, self.start, self.stop)


def resident_sources(sources: Sequence[Source], bounds: tuple[int, int]) -> list[Source]:
    """``sources`` with each small chunked leaf (see the module docstring) wrapped in a
    :class:`Resident` of rows ``bounds`` (the worker's shard); a source given twice is held
    once."""
    start, stop = bounds
    sizes = [(stop - start) * row_bytes([s]) for s in sources]
    largest = max(sizes, default=0)
    held: dict[int, Resident] = {}
    total = 0
    for i in sorted(range(len(sources)), key=sizes.__getitem__):
        s, size = sources[i], sizes[i]
        # chunked_rows is None for sources that gather from memory or a map already.
        if id(s) in held or not chunked_rows(s) or isinstance(s, SparseRows):
            continue
        if size <= RESIDENT_BYTES and size * RESIDENT_SHARE <= largest:
            if total + size > RESIDENT_TOTAL:
                break
            held[id(s)] = Resident(s, start, stop)
            total += size
    return [held.get(id(s), s) for s in sources]
