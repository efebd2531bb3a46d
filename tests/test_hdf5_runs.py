"""Runs of HDF5 chunks in block reads: chunks stored one after another read with one call, at most
``RUN_BYTES`` at a time, short reads continued, and chunks that split rows decoded a box at a time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._storage.hdf5 import chunks as h5chunks
from arrayfeed._storage.hdf5.chunkboxes import ChunkBoxes

from ._feeds import piece_runs
from ._h5files import (
    HAVE_IMAGECODECS,
    _assert_same,
    _check_reads,
    _chunk_at,
    _patch,
    _reference,
    _reference_rows,
    _source,
    _values,
    _write,
)


# -- runs of chunks -----------------------------------------------------------------------------
def _count_preadv(monkeypatch: pytest.MonkeyPatch, cap: int | None = None) -> list[int]:
    """The offsets of every ``os.preadv`` call from now on; each moves at most ``cap`` bytes
    (as Linux moves at most ~2 GiB), if given."""
    calls: list[int] = []
    real = os.preadv

    def preadv(fd: int, buffers: list[Any], at: int) -> int:
        calls.append(at)
        view = memoryview(buffers[0]).cast("B")
        return real(fd, [view[:cap] if cap else view], at)

    monkeypatch.setattr(os, "preadv", preadv)
    return calls


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize(("chunks", "reads"), [((10, 3), 4), ((10, 12), 1)])
def test_chunks_stored_in_order_are_read_with_one_call(
    tmp_path: Path,
    compression: str | None,
    chunks: tuple[int, int],
    reads: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """h5py stores a dataset written whole chunk after chunk, in grid order: a block read makes
    one ``preadv`` per row chunk of column chunks (decoded side by side), one for the whole
    range of whole-row chunks; not one per chunk (each call hands the GIL over and back)."""
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 12)), chunks, {"compression": compression})
    src = _source(path)
    assert src.chunk_reader() is not None
    calls = _count_preadv(monkeypatch)
    out = np.empty((40, 12), np.float32)
    src.read_pieces_into(0, 40, 0, src.range_pieces(0, 40), out)
    _assert_same(out, _reference(path))
    assert len(calls) == reads


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_one_read_moves_at_most_run_bytes(
    tmp_path: Path, compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks stored side by side are read a few MiB at a time (``RUN_BYTES``), not all at
    once: a read's buffer stays one the work buffers keep."""
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 12)), (10, 12), {"compression": compression})
    monkeypatch.setattr(h5chunks, "RUN_BYTES", 1000)  # about two chunks (480 bytes raw)
    src = _source(path)
    calls = _count_preadv(monkeypatch)
    _assert_same(src.read_run(0, 40), _reference(path))
    assert len(calls) == 2 if compression is None else 2 <= len(calls) <= 4


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize("chunks", [(10, 3), (10, 12), (10, 5)])
def test_short_reads_are_read_on(
    tmp_path: Path,
    compression: str | None,
    chunks: tuple[int, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call may move fewer bytes than asked (Linux moves at most ~2 GiB): the rest is read on,
    not taken for a truncated file."""
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 12)), chunks, {"compression": compression})
    src = _source(path)
    assert src.chunk_reader() is not None
    calls = _count_preadv(monkeypatch, cap=100)
    _check_reads(src, _reference(path), chunks[0])
    assert len(calls) > 40  # cut short again and again


@pytest.mark.parametrize("right_first", [False, True])
def test_raw_chunks_whose_wrong_sizes_add_up_are_named(tmp_path: Path, right_first: bool) -> None:
    """Chunks stored unfiltered side by side, 8 bytes too long and 8 too short (after one of
    the right size, or first): together the size of as many chunks, but each the wrong size."""
    path = tmp_path / "a.h5"
    a = np.arange(96, dtype="f4").reshape(8, 12)
    parts = [a[:, :4].tobytes() + b"\0" * 8, a[:, 4:8].tobytes()[:-8], a[:, 8:].tobytes()]
    if right_first:
        parts = parts[2:] + parts[:2]
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", shape=(8, 12), dtype="f4", chunks=(8, 4), compression="gzip")
        for j, part in enumerate(parts):
            d.id.write_direct_chunk((0, 4 * j), part, filter_mask=1)
    src = _source(path)
    assert src.read_path == "chunks"
    bad = f"(0, {int(right_first)})"
    with pytest.raises(af.CorruptDataError, match=re.escape(bad) + r".*wrong size \(136 bytes"):
        src.read_run(0, 8)


@pytest.mark.parametrize("compression", [None, "gzip", "lzf"])
def test_chunks_stored_out_of_order_read_correctly(
    tmp_path: Path, compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columns written last to first (their chunks lie in the file in reverse order) and a chunk
    rewritten larger (moved to the end of the file): each is read by itself."""
    if compression == "lzf" and not HAVE_IMAGECODECS:
        pytest.skip("lzf is decoded here only with imagecodecs")
    values = _values("int32", (40, 12))
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x", shape=values.shape, dtype="i4", chunks=(10, 3), compression=compression
        )
        for j in reversed(range(4)):
            d[:, 3 * j : 3 * j + 3] = values[:, 3 * j : 3 * j + 3]
        if compression is not None:
            d[10:20, 3:6] = 0  # compresses well: rewritten in place or moved
            d[10:20, 3:6] = np.random.default_rng(1).integers(-(2**31), 2**31 - 1, (10, 3))
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None
    assert (np.diff(reader.offsets, axis=1) < 0).any()  # stored out of order
    calls = _count_preadv(monkeypatch)
    ref = _reference(path)
    for runs in piece_runs(src.range_pieces(0, 40), np.random.default_rng(2)):
        out = np.empty_like(ref)
        for first, last in runs:
            src.read_pieces_into(0, 40, first, last, out)
        _assert_same(out, ref)
    assert len(calls) >= 3 * 16  # never one call for chunks that do not lie side by side


@pytest.mark.parametrize("stage_chunks", [1, 2, 3, 4])
@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize(
    ("shape", "chunks", "largest"),
    [
        ((33, 11), (8, 2), {1: 1, 2: 2, 3: 3, 4: 4}),  # columns: 6 per row chunk
        # Tiles x channels, 2 x 3 x 3 per row chunk: 4 chunks from a tile's first channel are
        # no box, its 3 channels are.
        ((33, 6, 5, 3), (8, 3, 2, 1), {1: 1, 2: 2, 3: 3, 4: 3}),
    ],
)
def test_chunks_splitting_rows_are_decoded_a_box_at_a_time(
    tmp_path: Path,
    compression: str | None,
    stage_chunks: int,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    largest: dict[int, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At most ``STAGE_BYTES`` of chunks that split rows are decoded side by side before they
    are copied out, a box of the chunk grid at a time (one at a time when one chunk is that
    large; whole channel triples when three or four fit)."""
    path = tmp_path / "a.h5"
    _write(path, _values("float64", shape), chunks, {"compression": compression})
    nbytes = int(np.prod(chunks)) * 8
    monkeypatch.setattr(h5chunks, "STAGE_BYTES", stage_chunks * nbytes + nbytes // 2)
    staged: list[int] = []
    copy_out = ChunkBoxes.copy_out
    monkeypatch.setattr(
        ChunkBoxes,
        "copy_out",
        lambda self, box, *a: staged.append(box.size) or copy_out(self, box, *a),
    )
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None and reader._boxes is not None
    assert reader._boxes.stage == stage_chunks
    _check_reads(src, _reference(path), 8)
    # Boxes of `stage_chunks` or fewer (one by one: copied out as each is decoded).
    assert (max(staged) if staged else 1) == largest[stage_chunks]


def test_a_damaged_column_chunk_read_in_a_run_is_named(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    values = np.zeros((40, 64), dtype=np.int32)
    values[:] = np.arange(64)  # compresses: every chunk is stored compressed
    _write(path, values, (10, 16), {"compression": "gzip"})
    offset, _size = _chunk_at(path, (10, 32))  # chunk (1, 2), third of its row chunk's four
    _patch(path, offset, b"\xff" * 16)
    src = _source(path)
    for start, stop in [(0, 40), (np.int64(0), np.int64(40))]:  # NumPy integers too
        with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 2\).*gzip"):
            src.read_run(start, stop)  # type: ignore[arg-type]
    _assert_same(src.read_run(20, 40), _reference_rows(path, 20, 40))
