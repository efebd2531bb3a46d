"""The rest of an epoch, re-dealt over another number of workers (an elastic resume).

Pure NumPy: no I/O, no TensorFlow, no global random state. An epoch planned for ``N`` workers is
a pure function of its arguments (:mod:`.plan`), so what a job took of it before it stopped, and
what is left, is index arithmetic: nothing is read or replayed.

Terms:

- **Segment** (:class:`Segment`): one sharding that took part of an epoch: ``workers`` workers,
  ``batch_size`` rows per batch, each took ``steps`` batches. The first segment began the epoch;
  each later one took batches of the rest the segments before it left.
- **Base positions**: the epoch as its first segment planned it, one sequence: worker ``k``'s
  position ``p`` is base position ``k * used + p``, where ``used`` is the positions each worker's
  batches take (its rows per epoch, less the short last batch with ``drop_remainder``). Rows
  that this leaves out are left out of the epoch, as an uninterrupted epoch leaves them out.
- **Rest**: the base positions no segment took, an increasing list of intervals; each interval
  lies inside one base worker's positions, so it is read through that worker's own shuffle
  order (a permutation, storage order, or the windows of its block order).
- **Deal**: ``M`` workers with batch ``b`` share a rest of ``R`` positions: each takes ``quota``
  consecutive positions of it (worker ``m`` those from ``m * quota``), at most ``R // M``, as many
  as make its batches end as an epoch of that sharding ends (the same short last batch, or
  whole batches with ``drop_remainder``). So the rest is the *last* ``ceil(quota / b)`` steps of
  that sharding's epoch: the rest of epoch ``e`` is steps ``[first_step, steps)`` of ``e``, and
  every count a reader asks of a plan (steps, batch rows, groups) stays what it is. Fewer than
  ``M * b`` positions of the rest are left out (``R % M``, and less than a batch per worker).
  Worker ``m`` of ``M`` workers with the batch of the segment before takes back exactly what that
  segment's worker ``m`` had left, in the same order: resuming on the same sharding is the
  uninterrupted stream.

Work is O(segments x workers) for the rest, and a block order's windows for :class:`RestOrder`;
memory never grows with the rows.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .shard import Shard, shard_bounds
from .shuffles import BlockOrder, Span

if TYPE_CHECKING:
    from .shuffles import Shuffle

__all__ = [
    "Rest",
    "RestOrder",
    "Segment",
    "deal",
    "epoch_steps",
    "first_step",
    "quota",
    "remaining",
    "used_positions",
]

Int64s = npt.NDArray[np.int64]
Interval = tuple[int, int]


def epoch_steps(rows: int, batch_size: int, drop_remainder: bool) -> int:
    """Batches of an epoch of ``rows`` rows per worker.

    >>> epoch_steps(10, 4, False), epoch_steps(10, 4, True)
    (3, 2)
    """
    full, rest = divmod(rows, batch_size)
    return full + (1 if rest and not drop_remainder else 0)


def used_positions(rows: int, batch_size: int, drop_remainder: bool) -> int:
    """Positions of an epoch of ``rows`` rows per worker that its batches take."""
    return rows - rows % batch_size if drop_remainder else rows


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One sharding that took part of an epoch: ``workers`` workers with batches of
    ``batch_size`` rows, each of which took ``steps`` batches (of the epoch, for the first
    segment; of the rest it was dealt, for a later one). ``block_rows`` and ``window_blocks``:
    the block layout of a ``"block"`` shuffle (the first segment's orders the epoch)."""

    workers: int
    batch_size: int
    drop_remainder: bool = False
    steps: int = 0
    block_rows: int = 1
    window_blocks: int = 1


def quota(rest_rows: int, n_rows: int, workers: int, batch_size: int, drop: bool) -> int:
    """Positions each of ``workers`` workers takes of a rest of ``rest_rows`` positions (see the
    module docstring): at most ``rest_rows // workers``, ending as an epoch of that sharding
    ends.

    >>> quota(25, 100, 2, 4, False)  # epochs of 50 rows end with a batch of 2: 2 + 2 * 4
    10
    >>> quota(25, 100, 2, 4, True)
    12
    """
    each = rest_rows // workers
    if drop:
        return each - each % batch_size
    rows = n_rows // workers
    last = rows - (epoch_steps(rows, batch_size, False) - 1) * batch_size
    return 0 if each < last else each - (each - last) % batch_size


def _cut(pieces: Sequence[Interval], lo: int, hi: int) -> list[Interval]:
    """Positions ``[lo, hi)`` of the sequence ``pieces`` stands for, as intervals."""
    out, at = [], 0
    for a, b in pieces:
        start, stop = max(lo, at), min(hi, at + b - a)
        if start < stop:
            out.append((a + start - at, a + stop - at))
        at += b - a
        if at >= hi:
            break
    return out


def _check(segment: Segment, n_rows: int, most_steps: int, which: str) -> None:
    if not 0 <= segment.steps <= most_steps:
        raise ValueError(
            f"{which} took {segment.steps} steps, but it had {most_steps} "
            f"({segment.workers} workers, batches of {segment.batch_size} of {n_rows} rows)."
        )


def _check_sharding(segment: Segment, n_rows: int) -> None:
    if segment.workers < 1 or segment.batch_size < 1 or n_rows // segment.workers < 1:
        raise ValueError(f"{segment} cannot shard {n_rows} rows.")


def remaining(n_rows: int, segments: Sequence[Segment]) -> list[Interval]:
    """Base positions that no worker of ``segments`` (the first began the epoch) took, as
    increasing intervals, each inside one base worker's positions.

    >>> remaining(20, [Segment(workers=2, batch_size=3, steps=2)])  # 10 positions each
    [(6, 10), (16, 20)]
    >>> remaining(20, [Segment(workers=2, batch_size=3, steps=2), Segment(workers=1,
    ...           batch_size=2, steps=1)])  # one worker took 2 of those 8
    [(8, 10), (16, 20)]
    """
    return list(_remaining(n_rows, tuple(segments)))


@functools.lru_cache(maxsize=16)
def _remaining(n_rows: int, segments: tuple[Segment, ...]) -> tuple[Interval, ...]:
    """:func:`remaining`, kept for the last few histories (a resume asks twice: its deal, and
    where its rest begins)."""
    base = segments[0]
    _check_sharding(base, n_rows)
    rows = n_rows // base.workers
    used = used_positions(rows, base.batch_size, base.drop_remainder)
    _check(base, n_rows, epoch_steps(rows, base.batch_size, base.drop_remainder), "the epoch")
    taken = min(base.steps * base.batch_size, used)
    rest = [(k * used + taken, (k + 1) * used) for k in range(base.workers) if taken < used]
    for i, seg in enumerate(segments[1:], 1):
        _check_sharding(seg, n_rows)
        each = quota(
            sum(b - a for a, b in rest), n_rows, seg.workers, seg.batch_size, seg.drop_remainder
        )
        _check(seg, n_rows, -(-each // seg.batch_size), f"resumed sharding {i}")
        taken = min(seg.steps * seg.batch_size, each)
        rest = [p for m in range(seg.workers) for p in _cut(rest, m * each + taken, (m + 1) * each)]
    return tuple(_joined(rest, used))


def _joined(pieces: list[Interval], used: int) -> list[Interval]:
    """``pieces`` with neighbours inside one base worker's positions joined."""
    out: list[Interval] = []
    for a, b in pieces:
        if out and out[-1][1] == a and a % used:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


@dataclass(frozen=True, kw_only=True)
class Rest:
    """This worker's part of the rest of ``epoch``: steps ``[first_step, ...)`` of its plan take
    the base positions ``pieces`` in order (see the module docstring)."""

    epoch: int
    #: The plan's step where the rest begins; its batch size.
    first_step: int
    batch_size: int
    n_rows: int
    seed: int
    #: The sharding that began the epoch (its ``steps`` included), and every one that took part.
    segments: tuple[Segment, ...]
    pieces: tuple[Interval, ...]
    #: Where each piece begins among the rest's positions.
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)
    #: Positions of the rest this worker takes.
    rows: int = field(init=False, repr=False, compare=False)
    #: Positions each base worker's batches take.
    used: int = field(init=False, repr=False, compare=False)
    #: The base workers' spans made so far (every fill asks for one: made once each).
    _spans: dict[int, Span] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lengths = [b - a for a, b in self.pieces]
        object.__setattr__(self, "starts", (0, *itertools.accumulate(lengths[:-1])))
        object.__setattr__(self, "rows", sum(lengths))
        base = self.base
        used = used_positions(self.n_rows // base.workers, base.batch_size, base.drop_remainder)
        object.__setattr__(self, "used", used)
        object.__setattr__(self, "_spans", {})

    @property
    def base(self) -> Segment:
        """The sharding that began the epoch."""
        return self.segments[0]

    @property
    def offset(self) -> int:
        """The plan position of the rest's first row."""
        return self.first_step * self.batch_size

    def span(self, worker: int) -> Span:
        """The span of base worker ``worker``, whose order its positions follow."""
        span = self._spans.get(worker)
        if span is None:
            base = self.base
            start, stop = shard_bounds(self.n_rows, Shard(base.workers, worker))
            layout = (base.block_rows, base.window_blocks)
            span = self._spans[worker] = Span(start, stop, self.seed, worker, base.workers, *layout)
        return span

    @property
    def bounds(self) -> tuple[int, int]:
        """Rows ``[start, stop)`` holding every row of the rest this worker takes."""
        used = self.used
        first, last = self.pieces[0][0] // used, (self.pieces[-1][1] - 1) // used
        return self.span(first).start, self.span(last).stop

    def fill(self, mode: Shuffle, first: int, out: Int64s) -> None:
        """Write into ``out`` the rows of plan positions ``[first, first + len(out))``."""
        q = first - self.offset
        if q < 0 or q + len(out) > self.rows:
            raise ValueError(
                f"positions [{first}, {first + len(out)}) are not in the rest of epoch "
                f"{self.epoch}, positions [{self.offset}, {self.offset + self.rows}): its steps "
                f"before {self.first_step} were taken by the workers before the resume."
            )
        i, piece, used = 0, bisect.bisect_right(self.starts, q) - 1, self.used
        while i < len(out):
            lo, hi = self.pieces[piece]
            at = lo + q + i - self.starts[piece]
            n = min(len(out) - i, hi - at)
            worker, position = divmod(at, used)
            mode.fill(self.span(worker), self.epoch, position, out[i : i + n])
            i, piece = i + n, piece + 1

    def order(self) -> RestOrder:
        """The windows this worker's rest reads (``shuffle="block"``)."""
        return RestOrder(self)


def first_step(n_rows: int, segments: Sequence[Segment], to: Segment) -> int:
    """The step where the rest of ``segments`` begins for the sharding ``to``: its steps per
    epoch less those the rest takes (all of them: nothing is left to take)."""
    rest = sum(b - a for a, b in remaining(n_rows, segments))
    each = quota(rest, n_rows, to.workers, to.batch_size, to.drop_remainder)
    steps = epoch_steps(n_rows // to.workers, to.batch_size, to.drop_remainder)
    return steps - -(-each // to.batch_size)


def deal(
    *, n_rows: int, seed: int, epoch: int, segments: Sequence[Segment], to: Segment, index: int
) -> Rest | None:
    """Worker ``index``'s part of the rest of ``epoch`` when the sharding ``to`` takes over from
    ``segments``; None when it takes nothing (the epoch is over)."""
    rest = remaining(n_rows, segments)
    each = quota(sum(b - a for a, b in rest), n_rows, to.workers, to.batch_size, to.drop_remainder)
    if each == 0:
        return None
    pieces = _cut(rest, index * each, (index + 1) * each)
    return Rest(
        epoch=epoch,
        first_step=first_step(n_rows, segments, to),
        batch_size=to.batch_size,
        n_rows=n_rows,
        seed=seed,
        segments=tuple(segments),
        pieces=tuple(pieces),
    )


class RestOrder:
    """The windows a worker's rest reads, for ``shuffle="block"``: whole windows of the block
    orders of the workers that began the epoch, in the order the rest reaches them, each window
    read whole (one partly taken before the resume too). Answers what a
    :class:`~.shuffles.BlockOrder` answers a reader (:class:`~.shuffles.WindowOrder`).

    A storage block cut by a base shard boundary is two blocks, one in each worker's order, so
    blocks are numbered per base worker: ``worker * stride + block``.
    """

    first = 0

    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        base = rest.base
        self.size = base.block_rows
        self._orders: dict[int, BlockOrder] = {}
        starts = [shard_bounds(rest.n_rows, Shard(base.workers, k))[0] for k in range(base.workers)]
        self._range_starts = np.array(starts, dtype=np.int64)
        self._first_blocks = self._range_starts // self.size
        self.stride = rest.n_rows // self.size + 2
        keys: list[tuple[int, int]] = []
        firsts: list[int] = []
        used = rest.used
        for (lo, hi), at in zip(rest.pieces, rest.starts, strict=True):
            worker, p_lo = divmod(lo, used)
            order = self._order(worker)
            for w in range(order.window_at(p_lo), order.window_at(hi - 1 - worker * used) + 1):
                if keys and keys[-1] == (worker, w):
                    continue  # a window that two pieces share is read once
                begins = int(order.rows_before_slot(np.array(w * order.width)))
                keys.append((worker, w))
                firsts.append(at + max(0, begins - p_lo))
        self._keys = keys
        self._firsts = np.array(firsts, dtype=np.int64)
        self._index = {key: j for j, key in enumerate(keys)}

    def _order(self, worker: int) -> BlockOrder:
        order = self._orders.get(worker)
        if order is None:
            order = self._orders[worker] = BlockOrder(self.rest.span(worker), self.rest.epoch)
        return order

    @property
    def windows(self) -> int:
        """Number of windows."""
        return len(self._keys)

    def blocks_of(self, rows: Int64s) -> Int64s:
        """The block number of each of ``rows``."""
        workers = np.searchsorted(self._range_starts, rows, side="right") - 1
        blocks: Int64s = workers * self.stride + rows // self.size - self._first_blocks[workers]
        return blocks

    def window_at(self, position: int) -> int:
        """The window holding plan position ``position`` (the first before the rest)."""
        q = position - self.rest.offset
        return max(0, int(np.searchsorted(self._firsts, q, side="right")) - 1)

    def window_blocks(self, window: int) -> tuple[Int64s, Int64s]:
        """Storage row ranges ``[lo, hi)`` of the blocks of ``window``, in packed order."""
        worker, w = self._keys[window]
        return self._order(worker).window_blocks(w)

    def locate(self, blocks: Int64s) -> tuple[Int64s, Int64s]:
        """``(window, shift)`` of each of ``blocks`` (numbered by :meth:`blocks_of`)."""
        workers, numbers = np.divmod(blocks, self.stride)
        window = np.empty_like(blocks)
        shift = np.empty_like(blocks)
        for worker in np.unique(workers).tolist():
            mine = workers == worker
            w, s = self._order(worker).locate(numbers[mine])
            try:
                window[mine] = [self._index[(worker, int(x))] for x in w.tolist()]
            except KeyError:  # never: a plan bug
                raise RuntimeError(
                    f"blocks {numbers[mine]} of worker {worker} are not in the rest"
                ) from None
            shift[mine] = s
        return window, shift
