"""Shuffle modes: in which order an epoch's positions visit a worker's rows.

Pure NumPy: no I/O, no TensorFlow, no global random state. Each mode is a class, and a
:class:`~.plan.Plan` holds one: the plan cuts an epoch into batches, the mode decides which rows
the positions of the epoch stand for. The rest of the package asks the mode what it needs to
know (is the order random? does chunked storage get read through windows of blocks?) and never
compares its name; the public ``shuffle=`` argument is parsed in :func:`shuffle_mode` alone.

- :class:`StorageOrder` (``shuffle=False`` or ``"none"``): positions are rows, in storage order.
- :class:`FullShuffle` (``True`` or ``"full"``): a permutation of the worker's whole range keyed
  by ``(seed, epoch, shard)``, fresh every epoch (:mod:`.permutation`).
- :class:`BlockShuffle` (``"block"``): a chunk-aware order for storage that reads whole chunks.
  The range is cut at the multiples of ``block_rows`` (the storage's chunk grid, so only the
  first and last block can be partial); the blocks are put in a random order, consecutive runs
  of ``window_blocks`` blocks form windows, and the rows inside each window are permuted
  (:class:`BlockOrder`). Every row still comes exactly once per epoch, and a reader that holds
  about one window of blocks reads every block from storage once. Mixing is local: a batch
  draws its rows from the ``window_blocks`` blocks of one window (two at a window boundary), and
  a row moves at most about a window away from its block's new place.

A new mode is a subclass of :class:`Shuffle` added to :data:`SHUFFLES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from ..._errors import ConfigError
from .permutation import derive_key, invert, permute

__all__ = [
    "BLOCK",
    "BLOCK_BYTES",
    "FULL",
    "MIN_BLOCK_BYTES",
    "SHUFFLES",
    "STORAGE_ORDER",
    "WINDOW_BYTES",
    "BlockOrder",
    "BlockShuffle",
    "FullShuffle",
    "Shuffle",
    "Span",
    "StorageOrder",
    "WindowOrder",
    "block_layout",
    "shuffle_mode",
]

Int64s = npt.NDArray[np.int64]

#: Bytes per block for ``shuffle="block"`` when no source is chunked (locality only).
BLOCK_BYTES = 1 << 20
#: Target bytes per window of blocks: larger mixes better, and a reader holds about two windows.
WINDOW_BYTES = 32 << 20
#: Smallest block: whole chunks adding up to at least this, so that small chunks are not read
#: one storage call each (a call's fixed cost in h5py or Zarr is paid whatever its size;
#: docs/performance.md, "Blocks of whole chunks").
MIN_BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class Span:
    """What a shuffle mode needs to know of a worker's plan (:class:`~.plan.Plan` has one): its
    row range ``[start, stop)``, the seed, the shard it is (``index`` of ``count``), and the
    blocks and windows of a block shuffle."""

    start: int
    stop: int
    seed: int = 0
    index: int = 0
    count: int = 1
    block_rows: int = 1
    window_blocks: int = 1


class Shuffle(ABC):
    """A shuffle mode: which rows an epoch's positions stand for, per plan and epoch.

    A mode holds no state of its own (its parameters are the plan's), so modes of one class
    compare equal and pickle by reference.
    """

    #: What ``shuffle=`` calls it, and what reprs, messages and :func:`arrayfeed.bench` print.
    name: ClassVar[str]
    #: The ``bool`` of ``shuffle=`` that also means this mode, if any.
    flag: ClassVar[bool | None] = None
    #: The order is drawn from the seed: only the same seed gives the same stream again, and
    #: the plan sorts each batch's rows into storage order.
    random: ClassVar[bool] = True
    #: Chunked storage is read through a cache of whole windows of blocks
    #: (:class:`~.blocks.WindowCache`) that holds the blocks the groups in flight draw from.
    reads_windows: ClassVar[bool] = False

    @abstractmethod
    def fill(self, span: Span, epoch: int, first: int, out: Int64s) -> None:
        """Write into ``out`` the rows of positions ``[first, first + len(out))`` of ``epoch``
        ``span``'s worker (positions within an epoch, rows within the whole array)."""

    def layout(self, chunk_rows: list[int], row_bytes: int) -> tuple[int, int]:
        """``(block_rows, window_blocks)`` a plan in this mode gets for sources whose chunks
        hold ``chunk_rows`` rows (chunked ones only) and whose rows are ``row_bytes`` bytes."""
        return 1, 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass(frozen=True, repr=False)
class StorageOrder(Shuffle):
    """No shuffling: position ``p`` is row ``start + p`` of the worker's range."""

    name: ClassVar[str] = "none"
    flag: ClassVar[bool | None] = False
    random: ClassVar[bool] = False

    def fill(self, span: Span, epoch: int, first: int, out: Int64s) -> None:
        _arange_into(out, first + span.start)


@dataclass(frozen=True, repr=False)
class FullShuffle(Shuffle):
    """A fresh permutation of the worker's whole range every epoch, keyed by
    ``(seed, epoch, shard)``."""

    name: ClassVar[str] = "full"
    flag: ClassVar[bool | None] = True

    def fill(self, span: Span, epoch: int, first: int, out: Int64s) -> None:
        start, stop = span.start, span.stop
        _arange_into(out, first)  # the epoch positions, mapped to rows in place
        key = derive_key(span.seed, epoch, span.index, span.count)
        np.add(permute(out, stop - start, key, out=out), start, out=out)


@dataclass(frozen=True, repr=False)
class BlockShuffle(Shuffle):
    """Chunk-aligned blocks in a random order, rows permuted within windows of blocks
    (see the module docstring and :class:`BlockOrder`)."""

    name: ClassVar[str] = "block"
    reads_windows: ClassVar[bool] = True

    def fill(self, span: Span, epoch: int, first: int, out: Int64s) -> None:
        _arange_into(out, first)  # the epoch positions, mapped to rows in place
        BlockOrder(span, epoch).rows(out, out=out)

    def layout(self, chunk_rows: list[int], row_bytes: int) -> tuple[int, int]:
        return block_layout(chunk_rows, row_bytes)


STORAGE_ORDER, FULL, BLOCK = StorageOrder(), FullShuffle(), BlockShuffle()
#: Every mode, in the order the message refusing any other ``shuffle=`` names them.
SHUFFLES: tuple[Shuffle, ...] = (FULL, STORAGE_ORDER, BLOCK)


def shuffle_mode(shuffle: object) -> Shuffle:
    """The shuffle mode a ``shuffle`` argument names (a mode passes through).

    ``True`` or ``"full"``: a full permutation; ``False`` or ``"none"``: storage order;
    ``"block"``: the chunk-aware block order.

    >>> [shuffle_mode(s).name for s in (True, "none", "block")]
    ['full', 'none', 'block']
    """
    if isinstance(shuffle, Shuffle):
        return shuffle
    for mode in SHUFFLES:
        if isinstance(shuffle, (bool, np.bool_)):
            if mode.flag is not None and mode.flag == bool(shuffle):
                return mode
        elif isinstance(shuffle, str) and shuffle == mode.name:
            return mode
    spellings = [repr(m.name) if m.flag is None else f"{m.flag} (or {m.name!r})" for m in SHUFFLES]
    raise ConfigError(
        f"`shuffle` must be {', '.join(spellings[:-1])} or {spellings[-1]} (got {shuffle!r})."
    )


def block_layout(chunk_rows: list[int], row_bytes: int) -> tuple[int, int]:
    """``(block_rows, window_blocks)`` for ``shuffle="block"``.

    Blocks are whole chunks of the source with the largest chunks (``chunk_rows``), as many as
    make at least ``MIN_BLOCK_BYTES``; with no chunked source, blocks of about ``BLOCK_BYTES``.
    A window holds about ``WINDOW_BYTES``, and at least two blocks.

    >>> block_layout([15625, 4096], row_bytes=132)
    (46875, 5)
    >>> block_layout([16], row_bytes=12292)
    (352, 7)
    >>> block_layout([], row_bytes=12292)
    (85, 32)
    """
    row_bytes = max(1, row_bytes)
    if chunk_rows:
        chunk = max(chunk_rows)
        block_rows = chunk * max(1, -(-MIN_BLOCK_BYTES // (chunk * row_bytes)))
    else:
        block_rows = max(1, BLOCK_BYTES // row_bytes)
    return block_rows, max(2, WINDOW_BYTES // (block_rows * row_bytes))


class WindowOrder(Protocol):
    """What a reader holding whole windows of blocks asks of an epoch's order
    (:class:`~.blocks.WindowCache`): a :class:`BlockOrder`, or the windows of a resumed
    epoch's rest (:class:`~.elastic.RestOrder`)."""

    #: Subtracted from what :meth:`blocks_of` gives before :meth:`locate`.
    first: int

    @property
    def windows(self) -> int: ...

    def blocks_of(self, rows: Int64s) -> Int64s:
        """The block number of each of ``rows`` (equal for the rows of one block)."""
        ...

    def window_at(self, position: int) -> int:
        """The window holding epoch position ``position``."""
        ...

    def window_blocks(self, window: int) -> tuple[Int64s, Int64s]:
        """Storage row ranges ``[lo, hi)`` of the blocks of ``window``, in packed order."""
        ...

    def locate(self, blocks: Int64s) -> tuple[Int64s, Int64s]:
        """``(window, shift)`` of each of ``blocks``: row ``r`` is at ``r + shift`` in the packed
        layout of ``window``."""
        ...


class BlockOrder:
    """The block order of one epoch on one worker (see the module docstring). O(window) memory.

    Blocks are numbered from 0 (the block holding the range's first row); ``slot`` is a block's
    place in the permuted order, and window ``w`` holds the blocks at slots
    ``[w * width, (w + 1) * width)``. A window's rows, laid out block after block in slot order,
    are its *packed* layout: the layout that :meth:`rows` permutes and that a reader holding a
    window in one buffer indexes.
    """

    def __init__(self, span: Span, epoch: int) -> None:
        self.start, self.stop = span.start, span.stop
        self.size, self.width = span.block_rows, span.window_blocks
        self.first = self.start // self.size  # index of the first block in the whole array
        self.count = (self.stop - 1) // self.size - self.first + 1
        keys = (span.seed, epoch, span.index, span.count)
        self.block_key = derive_key(*keys, 1)
        self.window_key = derive_key(*keys, 2)
        # Rows missing from the partial head and tail blocks, and where those blocks landed.
        self.head_short = self.start - self.first * self.size
        self.tail_short = (self.first + self.count) * self.size - self.stop
        head_tail = invert(np.array([0, self.count - 1]), self.count, self.block_key)
        self.head_slot, self.tail_slot = int(head_tail[0]), int(head_tail[1])

    def rows_before_slot(self, slot: Int64s) -> Int64s:
        """Rows in the blocks at slots ``< slot`` of the permuted order."""
        slot = np.minimum(slot, self.count)
        rows: Int64s = (
            slot * self.size
            - self.head_short * (self.head_slot < slot)
            - self.tail_short * (self.tail_slot < slot)
        )
        return rows

    def block_bounds(self, blocks: Int64s) -> tuple[Int64s, Int64s]:
        """Storage row ranges ``[lo, hi)`` of ``blocks`` (numbered from 0)."""
        lo = np.maximum((self.first + blocks) * self.size, self.start)
        hi = np.minimum((self.first + blocks + 1) * self.size, self.stop)
        return lo, hi

    @property
    def windows(self) -> int:
        """Number of windows."""
        return -(-self.count // self.width)

    def blocks_of(self, rows: Int64s) -> Int64s:
        """The storage block of each of ``rows``."""
        blocks: Int64s = rows // self.size
        return blocks

    def window_at(self, position: int) -> int:
        """The window holding epoch position ``position``."""
        window = position // (self.width * self.size)  # a lower bound
        while int(self.rows_before_slot(np.array((window + 1) * self.width))) <= position:
            window += 1
        return window

    def window_blocks(self, window: int) -> tuple[Int64s, Int64s]:
        """Storage row ranges ``[lo, hi)`` of the blocks of ``window``, in slot (packed) order."""
        slots = np.arange(
            window * self.width, min((window + 1) * self.width, self.count), dtype=np.int64
        )
        return self.block_bounds(permute(slots, self.count, self.block_key))

    def locate(self, blocks: Int64s) -> tuple[Int64s, Int64s]:
        """``(window, shift)`` of each of ``blocks`` (numbered from 0): row ``r`` of block ``b`` is
        at ``r + shift`` in the packed layout of ``window``."""
        slots = invert(blocks, self.count, self.block_key)
        window = slots // self.width
        lo, _ = self.block_bounds(blocks)
        shift = self.rows_before_slot(slots) - self.rows_before_slot(window * self.width) - lo
        return window, shift

    def rows(self, positions: Int64s, out: Int64s | None = None) -> Int64s:
        """Row indices of ``positions`` of this epoch (fastest for an ascending range), in
        ``out`` (returned; it may be ``positions`` itself) or a new array."""
        if out is None:
            out = np.empty_like(positions)
        if not len(positions):
            return out
        if len(positions) > 1 and not (positions[1:] >= positions[:-1]).all():
            order = np.argsort(positions, kind="stable")
            out[order] = self.rows(positions[order])
            return out
        # Windows in which the first and last positions fall, and the first row of each window
        # between them: positions are ascending, so each window's are one slice.
        lo_pos, hi_pos = int(positions[0]), int(positions[-1])
        per_window = self.width * self.size  # the rows of any window but the short ones
        first_w = self.window_at(lo_pos)
        # Only the windows holding the two partial blocks are short, so the range spans fewer
        # than (its length // per_window) + 4 windows.
        spanned = min(self.windows - first_w, (hi_pos - lo_pos) // per_window + 4)
        window_ids = np.arange(first_w, first_w + spanned + 1, dtype=np.int64)
        starts = self.rows_before_slot(window_ids * self.width)
        cuts = np.searchsorted(positions, starts).tolist()
        for i in range(len(starts) - 1):
            a, b = cuts[i], cuts[i + 1]
            if a == b:
                continue
            w, first_row = first_w + i, int(starts[i])
            window_rows = int(starts[i + 1]) - first_row
            # Positions in the window, then their permuted places, in place in `out` (a slice
            # is read before it is written, so `out` may be `positions`).
            q = np.subtract(positions[a:b], first_row, out=out[a:b])
            permute(q, window_rows, derive_key(self.window_key, w), out=q)
            lo, hi = self.window_blocks(w)
            ends = np.cumsum(hi - lo)
            q += (lo - ends + (hi - lo))[np.searchsorted(ends, q, side="right")]
        return out


#: 0, 1, 2 … for filling index arrays a piece at a time (np.arange has no `out`).
_RAMP = np.arange(1 << 14, dtype=np.int64)
_RAMP.setflags(write=False)


def _arange_into(out: Int64s, first: int) -> None:
    """``out[:] = range(first, first + len(out))`` without a temporary the size of ``out``."""
    for i in range(0, len(out), len(_RAMP)):
        piece = out[i : i + len(_RAMP)]
        np.add(_RAMP[: len(piece)], first + i, out=piece)
