"""Damaged HDF5 chunks: a flipped byte, a chunk that does not decode, a file cut short, each a
:class:`~arrayfeed.CorruptDataError` naming the file, the dataset and the chunk.
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

from . import _h5files
from ._h5files import (
    FILTERS,
    HAVE_IMAGECODECS,
    _assert_same,
    _chunk_at,
    _flip,
    _patch,
    _reference_rows,
    _source,
    _values,
    _write,
)

# hdf5plugin's filters, registered for this module.
plugins = _h5files.plugins


# -- corruption ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options", [{"fletcher32": True}, {"fletcher32": True, "compression": "gzip", "shuffle": True}]
)
@pytest.mark.parametrize("where", ["data", "checksum"])
def test_flipped_byte_in_a_fletcher32_chunk_names_the_chunk(
    tmp_path: Path, options: dict[str, Any], where: str
) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("int16", (40, 6, 5)), (10, 3, 5), options)
    offset, size = _chunk_at(path, (20, 3, 0))  # chunk (2, 1, 0)
    _flip(path, offset + (size // 2 if where == "data" else size - 2))
    with h5py.File(path, "r") as f, pytest.raises(OSError):  # HDF5 agrees the chunk is bad
        f["x"][20:30, 3:6]
    src = _source(path)
    assert src.read_path == "chunks"
    with pytest.raises(af.CorruptDataError) as info:
        src.read(np.array([0, 25], dtype=np.int64))
    message = str(info.value)
    assert "chunk (2, 1, 0)" in message and "fletcher32" in message
    assert f"{path}:/x" in message
    # Read as a run of the row chunk's two chunks (stored one after another: one read), the
    # damaged one, second of the run, is named.
    with pytest.raises(af.CorruptDataError, match=r"chunk \(2, 1, 0\).*fletcher32"):
        src.read_run(20, 30)
    # The other chunks still read.
    _assert_same(src.read_run(0, 20), _reference_rows(path, 0, 20))


@pytest.mark.parametrize(
    ("name", "label", "where"),
    [
        ("shuffle+gzip", "gzip", "head"),
        ("shuffle+gzip", "gzip", "middle"),  # zlib streams end in an Adler-32 checksum
        ("lzf", "lzf", "head"),
        ("zstd", "zstd", "head"),
        ("lz4", "lz4", "head"),
        ("bitshuffle-lz4", "bitshuffle", "head"),
    ],
)
def test_damaged_compressed_chunk_raises_corrupt_data_error(
    tmp_path: Path, plugins: Any, name: str, label: str, where: str
) -> None:
    options, needs_imagecodecs = FILTERS[name]
    if needs_imagecodecs and not HAVE_IMAGECODECS:
        pytest.skip("decoding needs imagecodecs")
    path = tmp_path / "a.h5"
    values = np.zeros((40, 64), dtype=np.int32)
    values[:] = np.arange(64)  # compresses: every chunk is stored compressed
    _write(path, values, (10, 64), options(plugins))
    offset, size = _chunk_at(path, (10, 0))  # chunk (1, 0)
    # LZF, LZ4 and zstd as HDF5 writes them carry no checksum: a damaged literal byte decodes
    # to a wrong value that neither h5py nor arrayfeed can notice (write fletcher32 for that).
    # Damage to their headers and control bytes is detected.
    at = offset if where == "head" else offset + size // 3
    _patch(path, at, b"\xff" * 16)
    src = _source(path)
    with pytest.raises(af.CorruptDataError) as info:
        src.read_run(0, 40)
    message = str(info.value)
    assert "chunk (1, 0)" in message and label in message and f"{path}:/x" in message


@pytest.mark.parametrize("compression", [None, "gzip"])  # read straight into place, decoded
@pytest.mark.parametrize(("chunks", "cut"), [((10, 8), (3, 0)), ((10, 2), (3, 2))])
def test_chunk_cut_short_by_a_truncated_file(
    tmp_path: Path, compression: str | None, chunks: tuple[int, int], cut: tuple[int, int]
) -> None:
    """The file ends inside chunk ``cut``; with column chunks, that chunk is the third of the
    four its row chunk stores one after another, read with one call: the error names it."""
    path = tmp_path / "a.h5"
    _write(path, _values("float64", (40, 8)), chunks, {"compression": compression})
    src = _source(path)
    assert src.chunk_reader() is not None  # index taken while the file was whole
    offset, _ = _chunk_at(path, (cut[0] * chunks[0], cut[1] * chunks[1]))
    os.truncate(path, offset + 3)
    for start, stop in [(30, 40), (np.int64(30), np.int64(40))]:  # NumPy integers too
        with pytest.raises(
            af.CorruptDataError, match=re.escape(f"chunk {cut}") + ".*cut short: 3 of"
        ):
            src.read_run(start, stop)  # type: ignore[arg-type]
    _assert_same(src.read_run(0, 30), _reference_rows(path, 0, 30))  # the rest still reads
