"""Index planning: which rows form each batch of each epoch on this worker.

Pure NumPy: no I/O, no TensorFlow, no global random state. Every quantity is a function of
``(n_rows, shard, batch_size, drop_remainder, shuffle, seed)`` and the epoch, so any batch of any
epoch can be computed directly (resuming costs O(1)), and memory is O(batch) for any number of rows.

Layout of one epoch on worker ``k`` of ``K``:

1. **Shard** (before shuffling): rows ``[start_k, stop_k)``, the ``k``-th of ``K`` contiguous,
   disjoint ranges that cover all rows; range lengths differ by at most one.
2. **Equal length**: every worker uses ``rows_per_epoch = n_rows // K`` rows of its range per
   epoch, so every worker runs the same number of steps. A worker whose range is one row longer
   leaves one row out of each epoch: with shuffling a different row every epoch, without it the
   last row of its range. At most ``K - 1`` rows of ``n_rows`` are left out per epoch in all.
3. **Order**: positions ``0 .. rows_per_epoch-1`` map to rows of the range through a permutation of
   the whole range keyed by ``(seed, epoch, k)`` (``shuffle="full"``), the identity
   (``"none"``), or a chunk-aware order (``"block"``, below).
4. **Batches**: step ``s`` takes positions ``[s * batch_size, (s + 1) * batch_size)``; the last batch
   is shorter unless ``drop_remainder``, which leaves out the last ``rows_per_epoch % batch_size``
   positions of the epoch (different rows each epoch when shuffling). Inside a batch, rows come in
   storage order: which rows form a batch is random, their order inside it is not (a loss, a
   batch norm or in-batch negatives do not depend on it), and sorted reads are sequential.

Block order (``shuffle="block"``), for storage that reads whole chunks: the range is cut at the
multiples of ``block_rows`` (the storage's chunk grid, so only the first and last block can be
partial); the blocks are put in a random order, consecutive runs of ``window_blocks`` blocks form
windows, and the rows inside each window are permuted. Every row still comes exactly once per
epoch, and a reader that holds about one window of blocks reads every block from storage once.
Mixing is local: a batch draws its rows from the ``window_blocks`` blocks of one window (two at a
window boundary), and a row moves at most about a window away from its block's new place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .._errors import ConfigError
from .._validate import integer
from .permutation import derive_key, invert, permute
from .shard import Shard

__all__ = [
    "BLOCK_BYTES",
    "MIN_BLOCK_BYTES",
    "WINDOW_BYTES",
    "Plan",
    "ShuffleMode",
    "block_layout",
    "check_position",
    "shard_bounds",
    "shuffle_mode",
]

#: Bytes per block for ``shuffle="block"`` when no source is chunked (locality only).
BLOCK_BYTES = 1 << 20
#: Target bytes per window of blocks: larger mixes better, and a reader holds about two windows.
WINDOW_BYTES = 32 << 20
#: Smallest block: whole chunks adding up to at least this, so that small chunks are not read
#: one storage call each (each call costs ~0.1-1 ms in h5py / Zarr whatever its size).
MIN_BLOCK_BYTES = 4 << 20

ShuffleMode = Literal["none", "full", "block"]
_MODES: dict[str, ShuffleMode] = {"none": "none", "full": "full", "block": "block"}


def shuffle_mode(shuffle: object) -> ShuffleMode:
    """The shuffle mode named by a ``shuffle`` argument.

    ``True`` or ``"full"``: a full permutation; ``False`` or ``"none"``: storage order;
    ``"block"``: the chunk-aware block order.

    >>> shuffle_mode(True), shuffle_mode("none"), shuffle_mode("block")
    ('full', 'none', 'block')
    """
    if isinstance(shuffle, (bool, np.bool_)):
        return "full" if shuffle else "none"
    if isinstance(shuffle, str) and shuffle in _MODES:
        return _MODES[shuffle]
    raise ConfigError(
        f"`shuffle` must be True (or 'full'), False (or 'none') or 'block' (got {shuffle!r})."
    )


def shard_bounds(n_rows: int, shard: Shard) -> tuple[int, int]:
    """``(start, stop)`` of shard ``shard.index`` when ``n_rows`` rows are split ``shard.count`` ways.

    >>> [shard_bounds(10, Shard(3, k)) for k in range(3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    return (n_rows * shard.index) // shard.count, (n_rows * (shard.index + 1)) // shard.count


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


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The batches of every epoch for one worker. See the module docstring for the layout."""

    n_rows: int
    batch_size: int
    shard: Shard = Shard(1, 0)  # noqa: RUF009  (frozen, so sharing the default is safe)
    drop_remainder: bool = False
    shuffle: ShuffleMode = "full"
    seed: int = 0
    block_rows: int = 1
    window_blocks: int = 1

    def __post_init__(self) -> None:
        for name in ("batch_size", "block_rows", "window_blocks"):
            object.__setattr__(self, name, integer(getattr(self, name), name, low=1))
        object.__setattr__(self, "seed", integer(self.seed, "seed", low=0))
        if self.n_rows < 1:
            raise ConfigError(f"there must be at least one row (got {self.n_rows}).")
        object.__setattr__(self, "shuffle", shuffle_mode(self.shuffle))
        if self.rows_per_epoch == 0:
            raise ConfigError(
                f"there are more workers ({self.shard.count}) than rows ({self.n_rows}); "
                "use fewer workers or more data."
            )
        if self.steps == 0:
            raise ConfigError(
                f"`batch_size` ({self.batch_size}) is larger than shard {self.shard.index} of "
                f"{self.shard.count}, which has {self.rows_per_epoch} rows per epoch, and "
                "`drop_remainder=True` leaves no batch; lower `batch_size`, use fewer workers "
                "or set `drop_remainder=False`."
            )

    @property
    def bounds(self) -> tuple[int, int]:
        """``(start, stop)`` of this worker's contiguous row range."""
        return shard_bounds(self.n_rows, self.shard)

    @property
    def rows_per_epoch(self) -> int:
        """Rows every worker uses per epoch (before `drop_remainder`)."""
        return self.n_rows // self.shard.count

    @property
    def steps(self) -> int:
        """Batches per epoch; the same on every worker."""
        full, rest = divmod(self.rows_per_epoch, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def batch_rows(self, step: int) -> int:
        """Number of rows in batch ``step``."""
        self._check_step(step)
        return min(self.batch_size, self.rows_per_epoch - step * self.batch_size)

    def index_count(self, start_step: int, stop_step: int) -> int:
        """Number of row indices of steps ``[start_step, stop_step)``: the length of
        :meth:`indices` (and of the ``out`` it takes)."""
        return min(stop_step * self.batch_size, self.rows_per_epoch) - start_step * self.batch_size

    def indices(
        self,
        epoch: int,
        start_step: int,
        stop_step: int | None = None,
        out: npt.NDArray[np.int64] | None = None,
    ) -> npt.NDArray[np.int64]:
        """Row indices of steps ``[start_step, stop_step)`` of ``epoch``, concatenated, as int64.

        ``out``: a C-contiguous int64 array of :meth:`index_count` elements to compute them in
        (returned); by default a new array. A reader that reuses one computes a group's indices
        without allocating (see :mod:`.permutation` for why that matters beside TensorFlow).
        """
        stop_step = start_step + 1 if stop_step is None else stop_step
        self._check_step(start_step)
        if not start_step < stop_step <= self.steps:
            raise ValueError(
                f"steps must satisfy {start_step} < stop_step <= {self.steps} (got {stop_step})."
            )
        count = self.index_count(start_step, stop_step)
        if out is None:
            rows = np.empty(count, dtype=np.int64)
        elif out.shape != (count,) or out.dtype != np.int64 or not out.flags.c_contiguous:
            raise ValueError(
                f"`out` must be a C-contiguous int64 array of shape ({count},) "
                f"(got {out.dtype} {out.shape})."
            )
        else:
            rows = out
        start, stop = self.bounds
        first = start_step * self.batch_size
        if self.shuffle == "none":
            _arange_into(rows, first + start)
            return rows
        _arange_into(rows, first)  # the epoch positions, mapped to rows in place
        if self.shuffle == "full":
            key = derive_key(self.seed, epoch, self.shard.index, self.shard.count)
            np.add(permute(rows, stop - start, key, out=rows), start, out=rows)
        else:
            self.block_order(epoch).rows(rows, out=rows)
        # Storage order within each batch: the permutation decides which rows form a batch; the
        # order inside a batch carries no randomness a loss can use, and sorted reads are
        # sequential (one copy, and up to 4x faster for large rows).
        full = (len(rows) // self.batch_size) * self.batch_size
        rows[:full].reshape(-1, self.batch_size).sort(axis=1)
        rows[full:].sort()
        return rows

    def block_order(self, epoch: int) -> BlockOrder:
        """The block order of ``epoch`` (``shuffle="block"``): where every block and row goes."""
        return BlockOrder(self, epoch)

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.steps:
            raise ValueError(f"`step` must be in [0, {self.steps}) (got {step}).")


class BlockOrder:
    """The block order of one epoch on one worker (see the module docstring). O(window) memory.

    Blocks are numbered from 0 (the block holding the range's first row); ``slot`` is a block's
    place in the permuted order, and window ``w`` holds the blocks at slots
    ``[w * width, (w + 1) * width)``. A window's rows, laid out block after block in slot order,
    are its *packed* layout: the layout that :meth:`rows` permutes and that a reader holding a
    window in one buffer indexes.
    """

    def __init__(self, plan: Plan, epoch: int) -> None:
        self.start, self.stop = plan.bounds
        self.size, self.width = plan.block_rows, plan.window_blocks
        self.first = self.start // self.size  # index of the first block in the whole array
        self.count = (self.stop - 1) // self.size - self.first + 1
        keys = (plan.seed, epoch, plan.shard.index, plan.shard.count)
        self.block_key = derive_key(*keys, 1)
        self.window_key = derive_key(*keys, 2)
        # Rows missing from the partial head and tail blocks, and where those blocks landed.
        self.head_short = self.start - self.first * self.size
        self.tail_short = (self.first + self.count) * self.size - self.stop
        head_tail = invert(np.array([0, self.count - 1]), self.count, self.block_key)
        self.head_slot, self.tail_slot = int(head_tail[0]), int(head_tail[1])

    def rows_before_slot(self, slot: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Rows in the blocks at slots ``< slot`` of the permuted order."""
        slot = np.minimum(slot, self.count)
        rows: npt.NDArray[np.int64] = (
            slot * self.size
            - self.head_short * (self.head_slot < slot)
            - self.tail_short * (self.tail_slot < slot)
        )
        return rows

    def block_bounds(
        self, blocks: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Storage row ranges ``[lo, hi)`` of ``blocks`` (numbered from 0)."""
        lo = np.maximum((self.first + blocks) * self.size, self.start)
        hi = np.minimum((self.first + blocks + 1) * self.size, self.stop)
        return lo, hi

    @property
    def windows(self) -> int:
        """Number of windows."""
        return -(-self.count // self.width)

    def window_at(self, position: int) -> int:
        """The window holding epoch position ``position``."""
        window = position // (self.width * self.size)  # a lower bound
        while int(self.rows_before_slot(np.array((window + 1) * self.width))) <= position:
            window += 1
        return window

    def window_blocks(self, window: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Storage row ranges ``[lo, hi)`` of the blocks of ``window``, in slot (packed) order."""
        slots = np.arange(
            window * self.width, min((window + 1) * self.width, self.count), dtype=np.int64
        )
        return self.block_bounds(permute(slots, self.count, self.block_key))

    def locate(
        self, blocks: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(window, shift)`` of each of ``blocks`` (numbered from 0): row ``r`` of block ``b`` is
        at ``r + shift`` in the packed layout of ``window``."""
        slots = invert(blocks, self.count, self.block_key)
        window = slots // self.width
        lo, _ = self.block_bounds(blocks)
        shift = self.rows_before_slot(slots) - self.rows_before_slot(window * self.width) - lo
        return window, shift

    def rows(
        self, positions: npt.NDArray[np.int64], out: npt.NDArray[np.int64] | None = None
    ) -> npt.NDArray[np.int64]:
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


def _arange_into(out: npt.NDArray[np.int64], first: int) -> None:
    """``out[:] = range(first, first + len(out))`` without a temporary the size of ``out``."""
    for i in range(0, len(out), len(_RAMP)):
        piece = out[i : i + len(_RAMP)]
        np.add(_RAMP[: len(piece)], first + i, out=piece)


def check_position(
    steps: int, epoch: Any, step: Any, names: tuple[str, str] = ("epoch", "step")
) -> tuple[int, int]:
    """Validate a position ``(epoch, step)`` in a stream of epochs of ``steps`` batches each."""
    epoch, step = (integer(v, n, low=0) for n, v in zip(names, (epoch, step), strict=True))
    if step >= steps:
        raise ConfigError(
            f"`{names[1]}` ({step}) must be less than the {steps} steps (batches) of an epoch on "
            f"this worker; to start after the last step of epoch {epoch}, use "
            f"`{names[0]}={epoch + 1}, {names[1]}=0`."
        )
    return epoch, step
