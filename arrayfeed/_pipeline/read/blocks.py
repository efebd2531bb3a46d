"""Reading rows through whole windows of chunk-aligned blocks, each block read once per epoch.

With ``shuffle="block"`` the batches of a window take their rows, in random order, from the same
few blocks (see :class:`~.shuffles.BlockOrder`). Compressed chunked storage decodes a whole
chunk to return any row of it, so reading row by row would decode every chunk many times. A
:class:`WindowCache` wraps one source for one epoch: it reads a window's blocks whole, one storage
call per block, into one buffer laid out the way the plan permutes them (the window's *packed*
layout), keeps the most recently used windows up to a capacity, and serves any rows of a window
with one vectorised gather from that buffer.

Reader threads share the work: a thread that needs a window claims, one at a time, the pieces
nobody is reading yet and reads them, then waits for the pieces other threads are reading. A
piece is a whole block, or, for storage that splits a block's read into independent pieces
(:class:`~arrayfeed._storage.ReadPiecesInto`: the chunks a block touches), one of those: so a
window of two large blocks, each many chunks, is still decoded on every core. Every piece is read
by one thread, and a window is loaded by as many threads as need it at once. When another
thread's read fails, a waiting thread reads that piece again itself, so a group fails only on an
error of its own read.

Storage that fetches ahead (:class:`~arrayfeed._storage.Prefetch`: object storage) is asked for
all of a window's blocks when the window is first needed (or prefetched), so that their chunks
are in flight together rather than one claim at a time.

Windows are used in increasing order within an epoch, so when the cache is full the
lowest-numbered window goes (a window read ahead is never evicted for an older one).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._dtypes import native_dtype
from ..._forks import renew_after_fork
from ..._storage import Prefetch, ReadPiecesInto, ReadRangeInto, Source
from ..plan.shuffles import WindowOrder
from .rows import BufferPool

__all__ = ["LOCATED", "UNITS_PER_BLOCK", "WindowCache"]

#: Most claimable units a block's read is split into. A unit is a run of the block's pieces (its
#: chunks), so per-claim costs are paid once per run, not per chunk (docs/performance.md, "Units
#: per block"). Sixteen units per block keep 16 threads busy on a window of two blocks.
UNITS_PER_BLOCK = 16
#: Most blocks whose place in the packed layout a cache remembers (a few hundred kilobytes).
LOCATED = 4096


class _Window:
    """One window's buffer and the state of each unit of its blocks' reads.

    ``units[u]`` is ``(block, first, stop, pieces)``: pieces ``[first, stop)`` of the ``pieces``
    of the read of ``block``; ``loads[u]`` is None until a thread claims it.
    """

    def __init__(
        self,
        buffer: np.ndarray,
        lo: npt.NDArray[np.int64],
        hi: npt.NDArray[np.int64],
        pieces: list[int],
    ):
        self.buffer = buffer
        self.lo, self.hi = lo.tolist(), hi.tolist()
        self.at = np.concatenate(([0], np.cumsum(hi - lo))).tolist()  # packed start of each block
        self.units = []
        for b, n in enumerate(pieces):
            cuts = np.linspace(0, n, min(n, UNITS_PER_BLOCK) + 1).astype(int).tolist()
            self.units += [(b, p, q, n) for p, q in itertools.pairwise(cuts)]
        self.loads: list[_Load | None] = [None] * len(self.units)
        self.ready = False  # every unit read (then nothing is claimed or waited for again)


class _Load:
    """One unit's read, claimed by one thread and waited for by others: a lock held from the
    claim until the read ends (cheaper than a ``Future`` with the GIL held, and waiters need no
    result, only whether it failed)."""

    __slots__ = ("_reading", "failed")

    def __init__(self) -> None:
        self._reading = threading.Lock()
        self._reading.acquire()
        self.failed = False

    def finish(self, failed: bool = False) -> None:
        self.failed = failed
        self._reading.release()

    def succeeded(self) -> bool:
        """Wait for the read; whether it read its unit (a failed one is claimed again)."""
        with self._reading:
            pass
        return not self.failed


class WindowCache:
    """A read-through cache of whole windows of ``source`` for one epoch's ``order``.

    ``capacity`` is in windows. ``pool`` recycles window buffers across epochs (a fresh
    buffer costs a page fault per 4 KiB page on its first write).
    """

    def __init__(
        self, source: Source, order: WindowOrder, capacity: int, pool: BufferPool | None = None
    ) -> None:
        self.source = source
        self.order = order
        self.capacity = max(1, capacity)
        self.pool = pool
        # What the source can do, asked once: a runtime protocol check per piece is a large share
        # of a small chunk's read (docs/performance.md, "Capabilities asked once per cache").
        self._pieces = source if isinstance(source, ReadPiecesInto) else None
        self._range = source if isinstance(source, ReadRangeInto) else None
        self._fetcher = source if isinstance(source, Prefetch) else None
        self._windows: dict[int, _Window] = {}
        self._located: dict[int, tuple[int, int]] = {}  # see _locate
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self.loads = 0  # blocks read from storage, for tests and benchmarks
        self.piece_loads = 0  # pieces read (blocks, or the chunks of blocks read piece by piece)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.source.dtype

    def __len__(self) -> int:
        return len(self.source)

    def read(self, indices: npt.NDArray[np.int64]) -> np.ndarray:
        """Rows ``indices`` as a new array."""
        out = np.empty((len(indices), *self.source.shape[1:]), dtype=self.source.dtype)
        self.gather_into(indices, out)
        return out

    def gather_into(self, indices: npt.NDArray[np.int64], out: np.ndarray) -> None:
        """Write rows ``indices`` (any order; fastest when each batch is sorted) into ``out``.

        Called for every group, with the GIL held between its NumPy calls: each block's place in
        the packed layout is computed once per epoch (:meth:`_locate`), and the rest is a fixed
        number of NumPy calls per group plus one gather per window it draws from.
        """
        if not len(indices):
            return
        blocks = self.order.blocks_of(indices)
        # Runs of rows from one block: few, since every batch is in storage order.
        starts = np.concatenate(([0], np.flatnonzero(blocks[1:] != blocks[:-1]) + 1))
        run_blocks = blocks[starts]
        distinct = sorted(set(run_blocks.tolist()))
        places = np.array(self._locate(distinct), dtype=np.int64).reshape(-1, 2)
        run_window, run_shift = places[np.searchsorted(distinct, run_blocks)].T
        packed = indices + np.repeat(run_shift, np.diff(starts, append=len(indices)))
        # One gather per stretch of runs from the same window (one stretch unless the rows
        # cross a window boundary).
        first_runs = np.concatenate(([0], np.flatnonzero(run_window[1:] != run_window[:-1]) + 1))
        bounds = [*starts[first_runs].tolist(), len(indices)]
        windows = run_window[first_runs].tolist()
        # Every window once, held for the whole call: stretches may alternate between windows,
        # and one evicted between them would be read again.
        buffers = {w: self._window(w) for w in dict.fromkeys(windows)}
        for w, lo, hi in zip(windows, bounds[:-1], bounds[1:], strict=True):
            buffer = buffers[w]
            rows = packed[lo:hi]
            if int(rows.min()) < 0 or int(rows.max()) >= len(buffer):  # never: a plan bug
                raise RuntimeError(f"rows {indices[lo:hi]} are not all in window {w}")
            np.take(buffer, rows, axis=0, out=out[lo:hi], mode="clip")  # unbuffered

    def _locate(self, blocks: list[int]) -> list[tuple[int, int]]:
        """``(window, shift)`` of each of ``blocks`` (storage block numbers; see
        :meth:`BlockOrder.locate`), remembered for the epoch (at most :data:`LOCATED` blocks)."""
        located = self._located
        found = {b: located.get(b) for b in blocks}
        missing = [b for b, place in found.items() if place is None]
        if missing:
            window, shift = self.order.locate(np.array(missing, dtype=np.int64) - self.order.first)
            new = dict(zip(missing, zip(window.tolist(), shift.tolist(), strict=True), strict=True))
            found.update(new)
            if len(located) + len(new) > LOCATED:
                located.clear()
            located.update(new)
        return [found[b] for b in blocks]  # type: ignore[misc]  # none is None now

    def prefetch_window(self, window: int, read: bool = True) -> None:
        """Read the blocks of ``window`` nobody reads yet (ahead of the groups that need it); with
        ``read=False`` only start fetching them, for storage that fetches ahead."""
        if not 0 <= window < self.order.windows:
            return
        if read:
            self._window(window)
        elif self._fetcher is not None:
            with self._lock:
                if window not in self._windows:
                    self._add(window)

    def _window(self, w: int) -> np.ndarray:
        window = self._windows.get(w)
        if window is not None and window.ready:
            return window.buffer
        with self._lock:
            window = self._windows.get(w)
            if window is None:
                window = self._add(w)
        while True:
            while (i := self._claim(window)) is not None:
                self._load(window, i)
            with self._lock:
                loads = list(window.loads)
            if all(load is not None and load.succeeded() for load in loads):
                window.ready = True
                return window.buffer
            # A block is unclaimed again (another thread's read failed): go back and read it.

    def _add(self, w: int) -> _Window:
        """Create window ``w`` in the cache (under the lock), evicting the oldest beyond capacity."""
        window = self._new_window(w)
        self._windows[w] = window
        while len(self._windows) > self.capacity:
            del self._windows[min(self._windows)]
        return window

    def _new_window(self, w: int) -> _Window:
        lo, hi = self.order.window_blocks(w)
        if self._fetcher is not None:  # object storage: the whole window in flight
            self._fetcher.prefetch(lo.tolist(), hi.tolist())
        shape = (int((hi - lo).sum()), *self.source.shape[1:])
        dtype = native_dtype(self.source.dtype)
        buffer = self.pool.empty(shape, dtype) if self.pool is not None else np.empty(shape, dtype)
        if self._pieces is not None:
            pieces = [
                max(1, self._pieces.range_pieces(a, b))
                for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
            ]
        else:
            pieces = [1] * len(lo)
        return _Window(buffer, lo, hi, pieces)

    def _claim(self, window: _Window) -> int | None:
        """Mark the first piece of ``window`` nobody reads yet as ours; None when there is none."""
        with self._lock:
            for i, load in enumerate(window.loads):
                if load is None:
                    window.loads[i] = _Load()
                    return i
        return None

    def _load(self, window: _Window, u: int) -> None:
        load = window.loads[u]
        assert load is not None
        block, first, stop, pieces = window.units[u]
        lo, hi, at = window.lo[block], window.hi[block], window.at[block]
        try:
            if pieces > 1 and self._pieces is not None:
                self._pieces.read_pieces_into(lo, hi, first, stop, window.buffer[at : at + hi - lo])
            elif self._range is not None:
                self._range.read_range_into(lo, hi, window.buffer[at : at + hi - lo])
            else:
                window.buffer[at : at + hi - lo] = self.source.read(
                    np.arange(lo, hi, dtype=np.int64)
                )
        except BaseException:
            with self._lock:
                window.loads[u] = None  # the next reader of this window tries again
            load.finish(failed=True)
            raise
        with self._lock:
            self.loads += first == 0  # blocks read from storage
            self.piece_loads += stop - first
        load.finish()
