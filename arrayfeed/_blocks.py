"""Reading rows through whole, chunk-aligned blocks, each read from storage about once per epoch.

With ``shuffle="block"`` the batches of a window take their rows, in random order, from the same
few blocks. Compressed chunked storage decodes a whole chunk to return any row of it, so reading
row by row would decode every chunk many times. A :class:`BlockCache` wraps one source for one
epoch: it reads whole blocks (``block_rows`` rows, aligned to multiples of ``block_rows``), keeps
the most recently used ones up to a capacity, and serves rows from them. Reader threads that need
a block another thread is already reading wait for that read instead of repeating it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from ._sources import Source

__all__ = ["BlockCache"]


class BlockCache:
    """A read-through cache of whole blocks of ``source`` (see the module docstring).

    ``read`` has the signature of :meth:`Source.read`, so the reader uses a cache where it
    would use the source.
    """

    def __init__(self, source: Source, block_rows: int, capacity: int) -> None:
        self.source = source
        self.block_rows = block_rows
        self.capacity = max(1, capacity)
        self._blocks: OrderedDict[int, Future[np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0  # blocks read from storage, for tests and benchmarks

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.source.dtype

    def __len__(self) -> int:
        return len(self.source)

    def read(self, indices: npt.NDArray[np.int64]) -> np.ndarray:
        """Rows ``indices`` (sorted, unique), served from whole blocks."""
        out = np.empty((len(indices), *self.source.shape[1:]), dtype=self.source.dtype)
        block_of = indices // self.block_rows
        cuts = np.flatnonzero(np.diff(block_of)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [len(indices)]))
        for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
            block = int(block_of[lo])
            data = self._block(block)
            out[lo:hi] = data[indices[lo:hi] - block * self.block_rows]
        return out

    def _block(self, block: int) -> np.ndarray:
        with self._lock:
            future = self._blocks.get(block)
            if future is not None:
                self._blocks.move_to_end(block)
                owner = False
            else:
                future = Future()
                self._blocks[block] = future
                owner = True
                while len(self._blocks) > self.capacity:
                    self._blocks.popitem(last=False)
        if owner:
            try:
                lo = block * self.block_rows
                hi = min(lo + self.block_rows, len(self.source))
                future.set_result(self.source.read(np.arange(lo, hi, dtype=np.int64)))
                with self._lock:
                    self.loads += 1
            except BaseException as exc:
                with self._lock:
                    if self._blocks.get(block) is future:  # not a newer load of the same block
                        del self._blocks[block]
                future.set_exception(exc)
                raise
        return future.result()
