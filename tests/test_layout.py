"""Chunk policy and layout verdict (pure functions)."""

from __future__ import annotations

import pytest

from arrayfeed._conversion.layout import (
    CHUNK_TARGET_BYTES,
    assess,
    choose_chunk_rows,
    format_bytes,
    normalize_compression,
    slab_rows,
)
from arrayfeed._errors import ConfigError
from arrayfeed._storage import ArrayLayout, row_nbytes

TARGET = CHUNK_TARGET_BYTES["hdf5"]


def test_targets() -> None:
    assert CHUNK_TARGET_BYTES == {"hdf5": 256 << 10, "zarr": 1 << 20}


@pytest.mark.parametrize(
    ("row_bytes", "n_rows", "expected"),
    [
        (4, 10**9, 1 << 16),  # 256 KiB of float32 scalars
        (3 * 1024, 10**6, 64),  # 192 KiB: the power of two below 85
        (TARGET, 100, 1),
        (TARGET + 1, 100, 1),  # a chunk never splits a row
        (50 << 20, 10, 1),
        (8, 1000, 1000),  # everything fits in one chunk
        (1, 1, 1),
    ],
)
def test_choose_chunk_rows(row_bytes: int, n_rows: int, expected: int) -> None:
    rows = choose_chunk_rows(row_bytes, n_rows, target_bytes=TARGET)
    assert rows == expected
    assert rows == n_rows or rows & (rows - 1) == 0  # a power of two unless it is all rows
    assert rows == 1 or rows * row_bytes <= TARGET


def test_choose_chunk_rows_rejects_nonpositive() -> None:
    with pytest.raises(ValueError):
        choose_chunk_rows(0, 10, target_bytes=TARGET)


@pytest.mark.parametrize(
    ("chunk_rows", "row_bytes", "n_rows", "target", "expected"),
    [
        (256, 1024, 10**6, 1 << 20, 1024),  # 4 chunks of 256 KiB
        (256, 1024, 300, 1 << 20, 300),  # capped by the rows there are
        (4, 1 << 20, 100, 1 << 20, 4),  # at least one chunk, even above the target
    ],
)
def test_block_rows(
    chunk_rows: int, row_bytes: int, n_rows: int, target: int, expected: int
) -> None:
    assert slab_rows(chunk_rows, row_bytes, n_rows, target_bytes=target) == expected


def test_row_nbytes_and_format_bytes() -> None:
    assert row_nbytes((10, 3, 4), "float64") == 96
    assert row_nbytes((10,), "int16") == 2
    assert format_bytes(12) == "12 B"
    assert format_bytes(3 << 30) == "3.0 GiB"


@pytest.mark.parametrize(("value", "expected"), [(None, "none"), ("none", "none"), ("LZF", "lzf")])
def test_normalize_compression(value: str | None, expected: str) -> None:
    assert normalize_compression(value) == expected


@pytest.mark.parametrize("value", ["zip", "blosc", 3])
def test_normalize_compression_rejects(value: object) -> None:
    with pytest.raises(ConfigError, match=r"`compression` must be one of none, lzf, gzip"):
        normalize_compression(value)  # type: ignore[arg-type]


def layout(
    name: str, shape: tuple[int, ...], chunks: tuple[int, ...] | None, **kw: object
) -> ArrayLayout:
    return ArrayLayout(
        name=name, shape=shape, dtype=str(kw.pop("dtype", "float32")), chunks=chunks, **kw
    )  # type: ignore[arg-type]


def test_contiguous_and_well_chunked_are_fine() -> None:
    assert assess([layout("x", (10**5, 64), None), layout("y", (10**5,), None, dtype="int64")]) == (
        [],
        [],
    )
    assert assess([layout("x", (10**5, 256), (1024, 256))]) == ([], [])


def test_tiny_chunks_are_judged_over_the_arrays_together() -> None:
    # 64 rows of 3 KiB images + their 8-byte labels: the labels' chunks alone are tiny, but a
    # chunk of rows across both arrays holds 192.5 KiB, which is what a batch read decodes.
    images = layout("images", (10**5, 32, 32, 3), (64, 32, 32, 3), dtype="uint8")
    labels = layout("labels", (10**5,), (64,), dtype="int64")
    assert assess([images, labels])[0] == []
    problems, _ = assess([labels])
    assert len(problems) == 1 and "`labels`: chunks of 64 rows hold 512 B" in problems[0]


def test_split_rows_huge_chunks_and_mismatched_rows_are_problems() -> None:
    problems, _ = assess([layout("x", (1000, 64, 64), (10, 64, 8))])
    assert any("split each row into 8 pieces" in p for p in problems)
    problems, _ = assess([layout("x", (10**6, 1024), (10**5, 1024))])
    assert any("huge" in p for p in problems)
    problems, _ = assess(
        [layout("x", (10**5, 256), (1024, 256)), layout("y", (10**5, 256), (4096, 256))]
    )
    assert any("different row blocks" in p for p in problems)


def test_whole_array_in_one_small_chunk_is_fine() -> None:
    assert assess([layout("y", (100,), (100,), dtype="int8")]) == ([], [])


def test_notes_and_missing_chunks() -> None:
    gz = layout("x", (10**5, 256), (1024, 256), compression="gzip(4)")
    assert assess([gz])[0] == [] and "gzip" in assess([gz])[1][0]
    lax = layout("x", (10**5, 256), (1024, 256), missing_chunks=3)
    assert assess([lax])[0] == [] and "fill value" in assess([lax])[1][0]
    strict = layout("x", (10**5, 256), (1024, 256), missing_chunks=3, strict=True)
    assert "corrupt" in assess([strict])[0][0]
    npz = layout("x", (100, 4), None, loads_whole=True)
    assert "memory-mapped" in assess([npz])[0][0]
    scalar = layout("s", (), None)
    assert assess([scalar])[0] == [] and "0-d" in assess([scalar])[1][0]


def test_doctests() -> None:
    import doctest

    from arrayfeed._conversion import layout as _layout

    assert doctest.testmod(_layout, optionflags=doctest.ELLIPSIS).failed == 0
