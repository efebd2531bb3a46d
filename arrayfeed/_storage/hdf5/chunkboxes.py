"""Chunks of one row chunk decoded side by side and copied out a box at a time.

A chunked array whose chunks split axes after the first (h5py's ``chunks=True`` cuts an image
dataset of ``uint8[64, 64, 3]`` into chunks of 4 x 8 x 1 elements per row: 384 chunks per row
chunk) is read, chunk by chunk, into rows. Copying each decoded chunk to its place costs one
NumPy call per chunk, and each such call on more than a few hundred elements gives the GIL away
and takes it back: beside a training loop that holds the GIL, every hand-off waits up to the
interpreter's switch interval. Chunks that lie next to each other in the chunk grid's C order
form a box of the grid when they start at a whole number of trailing sub-grids; decoded side by
side into one buffer they are copied out together: one copy per box, or, where trailing axes
have chunks one element wide (the channels above), one copy that moves each channel's chunks
together in wide words and then one long strided copy per channel. A single copy would move one
element at a time between chunks, and a copy per channel straight from the chunks moves short
runs with strides between them: both are slower than the two steps (docs/performance.md,
"Chunk boxes").

Pure NumPy, no I/O: :class:`ChunkBoxes` plans which chunks are staged together and copies a
staged box out; the storage readers decode into the buffer it describes.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from .. import workbuffers

__all__ = ["PLANNED", "Box", "ChunkBoxes"]

#: Most boxes a :class:`ChunkBoxes` keeps planned (a row chunk's reads start at the same few
#: chunks over and over; a grid of millions of chunks must not keep one box per chunk).
PLANNED = 4096


class Box(NamedTuple):
    """Chunks ``[first, first + size)`` of a row chunk (C order of its grid of chunks along
    every axis but the first): a box of that grid starting at ``start`` with ``extent`` chunks
    along each axis."""

    first: int
    size: int
    start: tuple[int, ...]
    extent: tuple[int, ...]


class ChunkBoxes:
    """Which chunks of a row chunk are staged side by side, and their copy out.

    ``shape`` and ``chunks``: the array's shape and its chunks' (first axis: rows). ``stage``:
    most chunks decoded side by side at once.
    """

    def __init__(self, shape: tuple[int, ...], chunks: tuple[int, ...], stage: int) -> None:
        self.shape, self.chunks, self.stage = tuple(shape), tuple(chunks), max(1, int(stage))
        rest, inner = self.shape[1:], self.chunks[1:]
        self.grid = tuple(-(-n // c) for n, c in zip(rest, inner, strict=True))
        # Chunks wholly inside the array along each axis (the last may reach past its edge).
        self.inside = tuple(n // c for n, c in zip(rest, inner, strict=True))
        # Chunks in the trailing sub-grid from each axis on: units[0] is a whole row chunk.
        self.units = tuple(math.prod(self.grid[m:]) for m in range(len(self.grid) + 1))
        # Axes from `tail` on have chunks one element wide: a copy loops over them in Python.
        tail = len(inner)
        while tail and inner[tail - 1] == 1:
            tail -= 1
        self.tail = tail
        self._boxes: dict[tuple[int, int], Box] = {}

    @property
    def per_row(self) -> int:
        """Chunks in a row chunk."""
        return self.units[0]

    def box(self, first: int, last: int) -> Box:
        """The box staged from chunk ``first`` of a row chunk, ending at ``last`` at most
        (``first < last <= per_row``): the largest whole trailing sub-grids that fit in the
        stage, as many as lie side by side along one axis (at least one chunk)."""
        key = (first, min(last - first, self.stage))
        box = self._boxes.get(key)
        if box is None:
            if len(self._boxes) >= PLANNED:  # a grid of very many chunks: start again
                self._boxes.clear()
            box = self._boxes[key] = self._plan(first, key[1])
        return box

    def _plan(self, first: int, limit: int) -> Box:
        units, d = self.units, len(self.grid)
        for m in range(1, d + 1):  # the largest unit first; units[d] = 1 always fits
            unit = units[m]
            if first % unit or unit > limit:
                continue
            room = (units[m - 1] - first % units[m - 1]) // unit  # to the end of axis m - 1
            count = min(limit // unit, room)
            start = tuple(int(i) for i in np.unravel_index(first, self.grid)) if d else ()
            extent = (1,) * (m - 1) + (count,) + self.grid[m:]
            return Box(first, count * unit, start, extent)
        return Box(first, 1, (), ())  # chunks of whole rows: no grid

    def _copy(self, into: np.ndarray, values: np.ndarray, whole: tuple[int, ...]) -> None:
        """``values`` into ``into`` (both ``(rows, chunks along axis 1, elements in a chunk along
        it, chunks along axis 2, ...)``; ``whole`` chunks along each axis)."""
        d, tail = len(whole), self.tail
        lead = 1 + 2 * tail
        if tail in (0, d):  # chunks' rows in one run each, or one element wide everywhere
            into[...] = values
            return
        # Chunks one element wide along the trailing axes (an image's channels): the chunks of
        # each channel are first moved together, in whole runs as wide words (one run is often
        # one word), then each channel is one long strided copy; straight from the chunks, a copy
        # per channel moves runs of a few elements with a stride between them, which is slower.
        squeeze = (slice(None),) * lead + (slice(None), 0) * (d - tail)
        front = np.moveaxis(values[squeeze], range(lead, lead + d - tail), range(d - tail))
        run = self.chunks[tail] * values.dtype.itemsize  # bytes of a chunk's innermost run
        word = next(w for w in (8, 4, 2, 1) if run % w == 0)
        buffer = workbuffers.lend(front.nbytes)
        try:
            planar = buffer[: front.nbytes].view(values.dtype).reshape(front.shape)
            # Through bytes: a dtype's view as a smaller one needs its size to divide the
            # dtype's, and the run (not the item) is what `word` divides.
            planar.view(np.uint8).view(f"u{word}")[...] = front.view(np.uint8).view(f"u{word}")
            for at in itertools.product(*(range(w) for w in whole[tail:])):
                pick = (slice(None),) * lead + tuple(
                    itertools.chain.from_iterable((i, 0) for i in at)
                )
                into[pick] = planar[at]
        finally:
            workbuffers.give(buffer)

    def copy_out(self, box: Box, staged: np.ndarray, local: slice, dest: np.ndarray) -> None:
        """Rows ``local`` of the chunks of ``box``, decoded side by side in ``staged`` (shape
        ``(box.size, *chunks)``; an edge chunk's values in its slot's low corner), into
        ``dest``: the rows of the output they go to, every element of each."""
        rows, inner, d = self.chunks[0], self.chunks[1:], len(self.grid)
        blocks = staged.reshape(*box.extent, rows, *inner)
        whole = tuple(
            max(0, min(e, n - s))
            for e, s, n in zip(box.extent, box.start, self.inside, strict=True)
        )
        if all(whole):
            part = dest[
                (
                    slice(None),
                    *(
                        slice(s * c, (s + w) * c)
                        for s, w, c in zip(box.start, whole, inner, strict=True)
                    ),
                )
            ]
            # `part` with each axis split into (chunk along it, element in the chunk).
            shape, strides = [len(part)], [part.strides[0]]
            for w, c, st in zip(whole, inner, part.strides[1:], strict=True):
                shape += [w, c]
                strides += [c * st, st]
            into = np.lib.stride_tricks.as_strided(part, shape, strides, writeable=True)
            order = (d, *itertools.chain.from_iterable((a, d + 1 + a) for a in range(d)))
            values = blocks[(*(slice(0, w) for w in whole), local)].transpose(order)
            self._copy(into, values, whole)
        if whole == box.extent:
            return
        for at in np.ndindex(*box.extent):  # chunks reaching past the array's edge
            if all(i < w for i, w in zip(at, whole, strict=True)):
                continue
            coords = [s + i for s, i in zip(box.start, at, strict=True)]
            region = tuple(
                slice(c * k, min((c + 1) * k, n))
                for c, k, n in zip(coords, inner, self.shape[1:], strict=True)
            )
            corner = tuple(slice(0, r.stop - r.start) for r in region)
            dest[(slice(None), *region)] = blocks[(*at, local, *corner)]
