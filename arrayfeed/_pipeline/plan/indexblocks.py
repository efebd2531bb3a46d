"""Row indices of one epoch, computed a block of steps at a time and shared by the groups in it.

Pure planning: no I/O, no TensorFlow. Every NumPy call on more than a few hundred elements
releases the GIL, and a thread that gave it up waits for it behind any thread running Python (a
training loop) for up to the switch interval. Computing each group's indices on its own made that
wait the reader's largest cost beside a busy thread: beyond ``EXACT_MAX`` rows a shuffle runs
about 200 NumPy calls per pass of the permutation, each a possible wait (docs/performance.md,
"Index blocks beside a busy thread"). A block of up to :data:`BLOCK_POSITIONS` positions takes
about as many calls as one group did, so the waits per row fall by the ratio.

The first blocks of an epoch are one group, then two, four, ... up to the full size: the first
group does not wait for a large block. A pass that ramps (:func:`ramp_sizes`) splits its first
group into groups of one step, one, two, four, ..., and its first blocks are those groups: its
first batch waits for the indices of one batch, not of a whole group. Each block is computed
once, by the first reader that needs it (others wait for it), or ahead of need by
:meth:`EpochIndices.prepare`, into a buffer of the full block size (one size, so a recycling
pool reuses them); the arrays are read-only, and a block is forgotten once every one of its
steps has been handed out (the groups hold their own views).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from .permutation import CHUNK
from .plan import Plan

__all__ = ["BLOCK_POSITIONS", "EpochIndices", "groups", "ramp_sizes", "ramp_starts"]

#: Most positions whose indices are computed at once: one pass of the permutation's work buffers.
BLOCK_POSITIONS = CHUNK


def ramp_sizes(group_steps: int) -> list[int]:
    """Steps of the groups that the first group of a ramping pass is split into: each as many
    as all before it (one, one, two, four, ...), ``group_steps`` in all. A consumer that takes a
    batch while the next is read finds each ready as soon as the first is.

    >>> ramp_sizes(8), ramp_sizes(10), ramp_sizes(1)
    ([1, 1, 2, 4], [1, 1, 2, 4, 2], [1])
    """
    sizes, done = [], 0
    while done < group_steps:
        sizes.append(min(max(1, done), group_steps - done))
        done += sizes[-1]
    return sizes


def ramp_starts(start_step: int, group_steps: int, stop: int) -> list[int]:
    """First steps of the groups that :func:`ramp_sizes` splits the group of ``group_steps``
    steps from ``start_step`` into, those before ``stop``; the next group starts at
    ``start_step + group_steps``.

    >>> ramp_starts(0, 8, 100), ramp_starts(5, 8, 8)
    ([0, 1, 2, 4], [5, 6, 7])
    """
    starts, step = [], start_step
    for size in ramp_sizes(group_steps):
        if step >= stop:
            break
        starts.append(step)
        step += size
    return starts


def groups(plan: Plan, start_step: int, group_steps: int, ramp: bool) -> list[tuple[int, int]]:
    """``(first_step, stop_step)`` of each group of ``group_steps`` steps from ``start_step`` on;
    a short last batch is a group of its own. With ``ramp``, the first group is split by
    :func:`ramp_sizes`.

    >>> groups(Plan(n_rows=100, batch_size=8, seed=0), 0, 4, ramp=True)
    [(0, 1), (1, 2), (2, 4), (4, 8), (8, 12), (12, 13)]
    """
    full = plan.rows_per_epoch // plan.batch_size
    ramped = ramp_starts(start_step, group_steps, full) if ramp else []
    first = start_step + group_steps if ramp else start_step
    bounds = [(s, min(e, full)) for s, e in zip(ramped, [*ramped[1:], first], strict=False)]
    bounds += [(s, min(s + group_steps, full)) for s in range(first, full, group_steps)]
    if plan.steps > full and start_step <= full:
        bounds.append((full, full + 1))
    return bounds


class _Block:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.rows: npt.NDArray[np.int64] | None = None
        self.error: BaseException | None = None
        self.taken = 0  # steps handed out


class EpochIndices:
    """The indices of steps ``[start_step, plan.steps)`` of ``epoch``, in blocks that are whole
    groups of ``group_steps`` steps (groups start at ``start_step``; with ``ramp``, the first of
    them is split by :func:`ramp_sizes`). ``empty(n)``: where a block's ``n`` indices go (a
    recycling pool; by default a new array)."""

    def __init__(
        self,
        plan: Plan,
        epoch: int,
        start_step: int,
        group_steps: int,
        empty: Callable[[int], npt.NDArray[np.int64]] | None = None,
        ramp: bool = False,
    ) -> None:
        self.plan, self.epoch = plan, epoch
        self._empty = empty or (lambda n: np.empty(n, dtype=np.int64))
        most = max(1, BLOCK_POSITIONS // (group_steps * plan.batch_size)) * group_steps
        self._positions = most * plan.batch_size  # of every block's buffer
        starts = ramp_starts(start_step, group_steps, plan.steps) if ramp else []
        step, size = start_step + group_steps if ramp else start_step, group_steps
        while step < plan.steps:
            starts.append(step)
            step += size
            size = min(2 * size, most)
        #: First step of every block; a block ends where the next begins (the last at the end).
        self.starts = starts
        self._blocks: dict[int, _Block] = {}
        self._finished: set[int] = set()  # blocks whose every step was handed out
        self._lock = threading.Lock()

    def block_of(self, step: int) -> int:
        """The block holding ``step``."""
        return bisect.bisect_right(self.starts, step) - 1

    def span(self, block: int) -> tuple[int, int]:
        """Steps ``[first, stop)`` of ``block``."""
        last = block + 1 == len(self.starts)
        return self.starts[block], self.plan.steps if last else self.starts[block + 1]

    def get(self, first: int, stop: int) -> npt.NDArray[np.int64]:
        """Indices of steps ``[first, stop)`` (inside one block): a read-only view."""
        block = self.block_of(first)
        lo, hi = self.span(block)
        if not lo <= first < stop <= hi:
            raise ValueError(f"steps [{first}, {stop}) are not inside one block [{lo}, {hi}).")
        rows = self.compute(block)
        offset = (first - lo) * self.plan.batch_size
        with self._lock:
            entry = self._blocks.get(block)
            if entry is not None:
                entry.taken += stop - first
                if entry.taken >= hi - lo:  # every group of the block has its view
                    del self._blocks[block]
                    self._finished.add(block)
        return rows[offset : offset + self.plan.index_count(first, stop)]

    def prepare(self, block: int) -> None:
        """Compute ``block`` ahead of need, unless it is computed, being computed, finished, or
        past the last."""
        self.compute(block, ahead=True)

    def compute(self, block: int, ahead: bool = False) -> npt.NDArray[np.int64]:
        """The indices of ``block`` (of no block past the last, or, ``ahead``, of a finished
        block: an empty array), computed by this call unless another has done it or is doing
        it."""
        if block >= len(self.starts):
            return np.empty(0, dtype=np.int64)
        with self._lock:
            if ahead and block in self._finished:
                return np.empty(0, dtype=np.int64)
            entry = self._blocks.get(block)
            mine = entry is None
            if entry is None:
                entry = self._blocks[block] = _Block()
        if mine:
            try:
                first, stop = self.span(block)
                out = self._empty(self._positions)[: self.plan.index_count(first, stop)]
                rows = self.plan.indices(self.epoch, first, stop, out=out)
                entry.rows = rows[:]
                entry.rows.setflags(write=False)  # a view: the pool's buffer stays writable
            except BaseException as exc:  # every waiter raises it too
                entry.error = exc
                raise
            finally:
                entry.done.set()
        entry.done.wait()
        if entry.error is not None:
            raise entry.error
        assert entry.rows is not None
        return entry.rows
