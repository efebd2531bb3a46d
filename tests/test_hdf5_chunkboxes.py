"""Chunks of a row chunk staged side by side: boxes of the chunk grid, copied out exactly."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrayfeed._storage.hdf5 import chunkboxes
from arrayfeed._storage.hdf5.chunkboxes import ChunkBoxes


@st.composite
def layouts(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """A shape, chunks splitting at least one axis after the first, and a stage size."""
    d = draw(st.integers(1, 3))
    rest = tuple(draw(st.integers(1, 9)) for _ in range(d))
    inner = tuple(draw(st.integers(1, n)) for n in rest)
    rows = draw(st.integers(1, 4))
    shape = (draw(st.integers(rows, 3 * rows)), *rest)
    return shape, (rows, *inner), draw(st.integers(1, 40))


def _grid(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(-(-n // c) for n, c in zip(shape[1:], chunks[1:], strict=True))


def _is_box(run: range, grid: tuple[int, ...]) -> bool:
    coords = np.array(np.unravel_index(np.array(run), grid)).T
    lo, hi = coords.min(axis=0), coords.max(axis=0)
    return int(np.prod(hi - lo + 1)) == len(run)


@settings(max_examples=300, deadline=None)
@given(layouts(), st.data())
def test_boxes_tile_any_run_of_chunks_in_order(layout: Any, data: Any) -> None:
    """From any chunk to any later one, the boxes cover each chunk once, in the grid's C order,
    each a box of the grid of at most ``stage`` chunks (or a single chunk), the largest whole
    trailing sub-grids that fit."""
    shape, chunks, stage = layout
    boxes = ChunkBoxes(shape, chunks, stage)
    grid = _grid(shape, chunks)
    per_row = int(np.prod(grid))
    assert boxes.per_row == per_row
    first = data.draw(st.integers(0, per_row - 1))
    last = data.draw(st.integers(first + 1, per_row))
    p = first
    while p < last:
        box = boxes.box(p, last)
        assert box.first == p and 1 <= box.size <= max(1, min(stage, last - p))
        # The box's chunks, in C order of the box, are chunks p .. p + count - 1 of the grid.
        coords = [
            tuple(s + i for s, i in zip(box.start, at, strict=True))
            for at in itertools.product(*(range(e) for e in box.extent))
        ]
        assert len(coords) == box.size
        assert [int(np.ravel_multi_index(c, grid)) for c in coords] == list(range(p, p + box.size))
        # No run of more chunks from p that fits in the stage is a box.
        limit = min(stage, last - p)
        for k in range(box.size + 1, limit + 1):
            assert not _is_box(range(p, p + k), grid)
        p += box.size
    assert p == last


@settings(max_examples=300, deadline=None)
@given(layouts(), st.data())
def test_copy_out_places_every_chunk_as_a_copy_per_chunk_would(layout: Any, data: Any) -> None:
    """A box decoded side by side (edge chunks' values in their slots' low corners, the rest of
    those slots garbage) and copied out: the rows of every chunk land where they belong and
    nothing else in the output is touched."""
    shape, chunks, stage = layout
    boxes = ChunkBoxes(shape, chunks, stage)
    grid, inner, rows = _grid(shape, chunks), chunks[1:], chunks[0]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    values = rng.integers(0, 2**31, (rows, *shape[1:]), dtype=np.int64)  # one row chunk
    first = data.draw(st.integers(0, boxes.per_row - 1))
    box = boxes.box(first, boxes.per_row)
    staged = rng.integers(-(2**31), 0, (box.size, *chunks), dtype=np.int64)  # garbage
    touched = np.zeros((rows, *shape[1:]), dtype=bool)
    for x in range(box.size):
        coords = np.unravel_index(first + x, grid)
        region = tuple(
            slice(c * k, min((c + 1) * k, n))
            for c, k, n in zip(coords, inner, shape[1:], strict=True)
        )
        corner = tuple(slice(0, r.stop - r.start) for r in region)
        staged[(x, slice(None), *corner)] = values[(slice(None), *region)]
        touched[(slice(None), *region)] = True
    lo = data.draw(st.integers(0, rows - 1))
    hi = data.draw(st.integers(lo + 1, rows))
    out = np.full((rows + 2, *shape[1:]), -1, dtype=np.int64)
    boxes.copy_out(box, staged, slice(lo, hi), out[1 : 1 + hi - lo])
    want = np.full_like(out, -1)
    dest = want[1 : 1 + hi - lo]
    dest[touched[lo:hi]] = values[lo:hi][touched[lo:hi]]
    np.testing.assert_array_equal(out, want)


def test_an_image_row_chunk_is_a_few_boxes() -> None:
    """h5py's ``chunks=True`` for 60,000 rows of uint8[64, 64, 3] (3,750 x 4 x 8 x 1): 384 chunks
    per row chunk; with room for 17 of them (2 MiB) they go in boxes of whole channel triples
    along a row of tiles, copied out three copies (one per channel) per box."""
    boxes = ChunkBoxes((60_000, 64, 64, 3), (3750, 4, 8, 1), 17)
    counts, p = [], 0
    while p < boxes.per_row:
        box = boxes.box(p, boxes.per_row)
        counts.append(box.size)
        p += box.size
    assert boxes.per_row == 384 and boxes.tail == 2
    assert counts == [15, 9] * 16
    whole = ChunkBoxes((60_000, 64, 64, 3), (3750, 4, 8, 1), 384)
    assert whole.box(0, 384).size == 384 and whole.box(24, 384).size == 360


def test_planned_boxes_are_bounded(monkeypatch: Any) -> None:
    """A grid of very many chunks keeps at most ``PLANNED`` boxes, and the boxes planned after
    it starts again are the same."""
    monkeypatch.setattr(chunkboxes, "PLANNED", 5)
    boxes = ChunkBoxes((10, 40, 3), (2, 1, 1), 4)
    fresh = ChunkBoxes((10, 40, 3), (2, 1, 1), 4)
    for first in range(boxes.per_row):
        assert boxes.box(first, boxes.per_row) == fresh._plan(first, min(4, boxes.per_row - first))
        assert len(boxes._boxes) <= 5


@pytest.mark.parametrize("dtype", ["u1", "<f2", ">i4", "V3", "c16", "V12"])
def test_copy_out_moves_any_item_size_in_wide_words(dtype: str) -> None:
    """Channels one element wide after a run of 2 or 4 elements: the run is moved as words of
    up to 8 bytes whatever the item size (3 bytes: a run of 4 is 12 bytes, moved as 4-byte
    words), bit for bit."""
    shape, chunks = (9, 6, 8, 3), (4, 3, 4, 1)  # runs of 4 elements; 2 x 2 x 3 chunks per row
    boxes = ChunkBoxes(shape, chunks, 12)
    assert boxes.tail == 2
    rng = np.random.default_rng(0)
    item = np.dtype(dtype).itemsize
    values = np.frombuffer(rng.bytes(4 * 6 * 8 * 3 * item), dtype=dtype).reshape(4, 6, 8, 3)
    box = boxes.box(0, boxes.per_row)
    assert box.size == 12
    staged = np.empty((12, *chunks), dtype=dtype)
    for x in range(12):
        y, z, c = np.unravel_index(x, (2, 2, 3))
        staged[x] = values[:, 3 * y : 3 * y + 3, 4 * z : 4 * z + 4, c : c + 1]
    out = np.zeros((3, 6, 8, 3), dtype=dtype)
    boxes.copy_out(box, staged, slice(1, 4), out)
    assert out.tobytes() == values[1:4].tobytes()
