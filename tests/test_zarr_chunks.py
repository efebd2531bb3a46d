"""Zarr chunks read in the calling thread: the same rows as Zarr, or Zarr's own reads."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import (
    BytesCodec,
    Crc32cCodec,
    TransposeCodec,
    ZstdCodec,
)

import arrayfeed as af
from arrayfeed._storage.zarr import codecs as zarrcodecs
from arrayfeed._storage.zarr.chunks import ChunkReader
from arrayfeed._storage.zarr.source import ZarrSource

from ._feeds import piece_runs
from ._zarrfiles import COMPRESSORS, _array, _requests


@pytest.mark.parametrize("compressor", sorted(COMPRESSORS))
@pytest.mark.parametrize(
    "dtype, endian", [("<f4", "little"), (">i2", "big"), ("<i2", "big"), ("u1", None), ("?", None)]
)
@pytest.mark.parametrize("chunks", [(4, 5, 3), (7, 2, 2), (64, 5, 3)])
def test_reads_the_same_rows_as_zarr(
    tmp_path: Path, compressor: str, dtype: str, endian: str | None, chunks: tuple[int, ...]
) -> None:
    n = 29
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((n, 5, 3)) * 100).astype(dtype)
    serializer = BytesCodec(endian=endian) if endian else BytesCodec()
    z = _array(
        tmp_path / "a.zarr",
        data,
        chunks,
        compressors=COMPRESSORS[compressor],
        serializer=serializer,
    )
    reader = ChunkReader.of(z, "a", strict=False)
    assert reader is not None
    for idx in _requests(n):
        got = reader.read(idx)
        assert got.dtype == data.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, data[idx])
        np.testing.assert_array_equal(got, z.oindex[idx] if len(idx) else data[:0])


V2_COMPRESSORS: dict[str, Any] = {
    "none": None,
    "zstd": numcodecs.Zstd(),
    "blosc": numcodecs.Blosc(),
    "gzip": numcodecs.GZip(),
    "lz4": numcodecs.LZ4(),
}


@pytest.mark.parametrize("compressor", sorted(V2_COMPRESSORS))
@pytest.mark.parametrize("dtype", ["<f4", ">i2", "u1", "?", "<c8"])
@pytest.mark.parametrize("separator", [".", "/"])
def test_reads_the_same_rows_as_zarr_from_format_2(
    tmp_path: Path, compressor: str, dtype: str, separator: str
) -> None:
    n = 23
    data = (np.random.default_rng(1).standard_normal((n, 5, 3)) * 50).astype(dtype)
    z = _array(
        tmp_path / "a.zarr",
        data,
        (4, 2, 3),
        zarr_format=2,
        compressors=V2_COMPRESSORS[compressor],
        chunk_key_encoding={"name": "v2", "separator": separator},
    )
    reader = ChunkReader.of(z, "a", strict=False)
    assert reader is not None
    for idx in _requests(n):
        np.testing.assert_array_equal(reader.read(idx), data[idx])
    missing = tmp_path / "a.zarr" / ("2.1.0" if separator == "." else "2/1/0")
    missing.unlink()  # rows 8-11, columns 2-3
    expected = z[...]  # Zarr's own fill
    np.testing.assert_array_equal(reader.read(np.arange(n, dtype=np.int64)), expected)
    strict = ChunkReader.of(z, "a", strict=True)
    assert strict is not None
    with pytest.raises(af.CorruptDataError, match=r"chunk \(2, 1, 0\) .* is missing"):
        strict.read(np.array([9], dtype=np.int64))


def test_a_zarr_source_on_a_local_store_reads_in_the_calling_thread(tmp_path: Path) -> None:
    data = np.arange(60, dtype=np.int32).reshape(20, 3)
    source = ZarrSource(_array(tmp_path / "a.zarr", data, (6, 3)))
    assert source.chunk_reader is not None
    threads = []
    opened = source.chunk_reader._copy_chunk

    def record(coords: tuple[int, ...], *args: Any) -> None:
        threads.append(threading.current_thread())
        opened(coords, *args)

    source.chunk_reader._copy_chunk = record  # type: ignore[method-assign]
    np.testing.assert_array_equal(
        source.read(np.array([0, 7, 19], dtype=np.int64)), data[[0, 7, 19]]
    )
    assert threads == [threading.current_thread()] * 3


def test_missing_chunks_read_as_the_fill_value_unless_strict(tmp_path: Path) -> None:
    data = np.arange(40, dtype=np.float64).reshape(20, 2)
    z = _array(tmp_path / "a.zarr", data, (5, 2), fill_value=-1.5)
    shutil.rmtree(tmp_path / "a.zarr" / "c" / "1")  # rows 5-9
    expected = data.copy()
    expected[5:10] = -1.5
    reader = ChunkReader.of(z, "a", strict=False)
    assert reader is not None
    np.testing.assert_array_equal(reader.read(np.arange(20, dtype=np.int64)), expected)
    np.testing.assert_array_equal(z[...], expected)  # what Zarr itself returns
    strict = ChunkReader.of(z, "a", strict=True)
    assert strict is not None
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 0\) \(key 'c/1/0'\) .* missing"):
        strict.read(np.array([7], dtype=np.int64))
    np.testing.assert_array_equal(strict.read(np.array([0, 19], dtype=np.int64)), data[[0, 19]])


@pytest.mark.parametrize(
    ("compressor", "columns"),
    [("crc32c", 1023), ("none", 1024), ("crc32c", 5)],  # a directory's 4,096 bytes: a chunk's
)
def test_a_directory_at_a_chunks_key_is_no_chunk_as_zarr_reads_it(
    tmp_path: Path, compressor: str, columns: int
) -> None:
    """Zarr reads a directory where a chunk file would be as a missing chunk: the fill value,
    or (strict) the missing-chunk error; never a read error naming no chunk, even when the
    directory's size is a stored chunk's."""
    data = np.arange(8 * columns, dtype=np.float32).reshape(8, columns)
    z = _array(tmp_path / "a.zarr", data, (1, columns), compressors=COMPRESSORS[compressor])
    chunk = tmp_path / "a.zarr" / "c" / "3" / "0"
    chunk.unlink()
    chunk.mkdir()
    expected = np.asarray(z[...])
    assert (expected[3] == 0).all()  # what Zarr itself returns: the fill value
    for strict in (False, True):
        source = ZarrSource(z, strict=strict)
        out = np.full_like(data, -1)
        if strict:
            with pytest.raises(af.CorruptDataError, match=r"chunk \(3, 0\) .* is missing"):
                source.read_pieces_into(0, 8, 3, 4, out)
            continue
        source.read_pieces_into(0, 8, 0, source.range_pieces(0, 8), out)
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(source.read(np.arange(8, dtype=np.int64)), expected)


@pytest.mark.parametrize("compressor", ["none", "crc32c", "zstd"])
def test_a_file_where_a_chunks_directory_would_be_is_no_chunk(
    tmp_path: Path, compressor: str
) -> None:
    """A file in place of the directory a chunk's key runs through: no chunk there, as Zarr
    reads it (the fill value; strict: the missing-chunk error naming it)."""
    data = np.arange(12, dtype=np.int32).reshape(4, 3)
    z = _array(tmp_path / "a.zarr", data, (2, 3), compressors=COMPRESSORS[compressor], fill_value=9)
    shutil.rmtree(tmp_path / "a.zarr" / "c" / "1")
    (tmp_path / "a.zarr" / "c" / "1").write_bytes(b"x")
    expected = np.asarray(z[...])
    assert (expected[2:] == 9).all()  # what Zarr itself returns
    out = np.zeros((4, 3), np.int32)
    ZarrSource(z, strict=False).read_pieces_into(0, 4, 0, 2, out)
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 0\) .* is missing"):
        ZarrSource(z, strict=True).read_pieces_into(0, 4, 1, 2, out)


@pytest.mark.parametrize("compressor", ["crc32c", "zstd"])
def test_whole_chunks_into_an_output_of_another_dtype_are_converted(
    tmp_path: Path, compressor: str
) -> None:
    """Reading or decoding straight into the output is for an output of the stored dtype;
    another dtype of the same size (float32 for int32) is converted, like a partial chunk,
    never filled with the stored bytes."""
    data = np.arange(60, dtype=np.int32).reshape(20, 3)
    z = _array(tmp_path / "a.zarr", data, (10, 3), compressors=COMPRESSORS[compressor])
    source = ZarrSource(z)
    reader = source.chunk_reader
    assert reader is not None
    out = np.zeros((20, 3), np.float32)
    source.read_pieces_into(0, 20, 0, 2, out)
    np.testing.assert_array_equal(out, data.astype(np.float32))
    assert reader.direct == 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "checksum"])
def test_a_damaged_chunk_is_a_corrupt_data_error_naming_it(tmp_path: Path, damage: str) -> None:
    data = np.arange(4000, dtype=np.int64).reshape(1000, 4)
    compressors = [ZstdCodec(), Crc32cCodec()] if damage == "checksum" else [ZstdCodec()]
    z = _array(tmp_path / "a.zarr", data, (100, 4), compressors=compressors)
    chunk = tmp_path / "a.zarr" / "c" / "3" / "0"
    raw = bytearray(chunk.read_bytes())
    if damage == "garbage":
        raw[:] = b"\x00" * len(raw)
    elif damage == "truncated":
        raw = raw[: len(raw) // 2]
    else:
        raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    source = ZarrSource(z)
    assert source.chunk_reader is not None
    with pytest.raises(af.CorruptDataError, match=r"chunk \(3, 0\) \(key 'c/3/0'\)"):
        source.read(np.arange(250, 350, dtype=np.int64))
    np.testing.assert_array_equal(source.read(np.arange(0, 300, dtype=np.int64)), data[:300])


@pytest.mark.parametrize("checksum", ["crc32c package", "numcodecs"])
def test_crc32c_chunks_are_checked_by_either_checksum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checksum: str
) -> None:
    """What `convert` writes (uncompressed + crc32c): read as Zarr reads it, and one flipped
    byte found, whether the checksum runs outside the GIL (the `crc32c` package, which the
    test extra installs) or in numcodecs."""
    if checksum == "numcodecs":
        monkeypatch.setattr(zarrcodecs, "crc32c_checksum", numcodecs.CRC32C.checksum)
    else:
        assert zarrcodecs.crc32c_checksum is not numcodecs.CRC32C.checksum
    data = np.random.default_rng(1).integers(0, 1 << 40, (1000, 40), dtype=np.int64)
    z = _array(tmp_path / "a.zarr", data, (100, 40), compressors=[Crc32cCodec()])
    source = ZarrSource(z)
    assert source.chunk_reader is not None
    np.testing.assert_array_equal(source.read(np.arange(1000, dtype=np.int64)), data)
    for position in (0, 100 * 40 * 8 - 1, 100 * 40 * 8):  # first and last byte, the checksum
        chunk = tmp_path / "a.zarr" / "c" / "4" / "0"
        intact = chunk.read_bytes()
        raw = bytearray(intact)
        raw[position] ^= 0x01
        chunk.write_bytes(bytes(raw))
        with pytest.raises(af.CorruptDataError, match=r"chunk \(4, 0\).*crc32c"):
            source.read(np.arange(450, 460, dtype=np.int64))
        chunk.write_bytes(intact)


class _OldCrc32c:
    """crc32c before 2.5: no `gil_release_mode`."""

    @staticmethod
    def crc32c(data: Any, value: int = 0) -> int:
        return 0


class _NoImplementation:
    """crc32c >= 2.7 with CRC32C_SW_MODE=none on a CPU without the instruction."""

    @staticmethod
    def crc32c(data: Any, value: int = 0, gil_release_mode: int = -1) -> int:
        raise RuntimeError("crc32c: no hardware or software implementation")


@pytest.mark.parametrize("package", [_OldCrc32c, _NoImplementation, None])
def test_an_unusable_crc32c_package_falls_back_to_numcodecs(
    monkeypatch: pytest.MonkeyPatch, package: Any
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "crc32c", package)
    assert zarrcodecs._crc32c_checksum() is numcodecs.CRC32C.checksum


def test_uncommon_layouts_are_read_through_zarr(tmp_path: Path) -> None:
    data = np.arange(96, dtype=np.float32).reshape(24, 4)
    others = {
        "sharded": _array(tmp_path / "s.zarr", data, (4, 4), shards=(8, 4)),
        "transposed": _array(
            tmp_path / "t.zarr", data, (4, 4), filters=[TransposeCodec(order=(1, 0))]
        ),
        "format 2 in F order": _array(tmp_path / "f.zarr", data, (4, 4), zarr_format=2, order="F"),
        "format 2 with filters": _array(
            tmp_path / "d.zarr", data, (4, 4), zarr_format=2, filters=[numcodecs.Delta("<f4")]
        ),
        "no fill value": _array(tmp_path / "n.zarr", data, (4, 4), zarr_format=2, fill_value=None),
        "in memory": zarr.create_array(
            zarr.storage.MemoryStore(), shape=data.shape, dtype=data.dtype, chunks=(4, 4)
        ),
    }
    others["in memory"][...] = data
    for name, z in others.items():
        assert ChunkReader.of(z, name, strict=False) is None, name
        source = ZarrSource(z)
        idx = np.array([0, 5, 6, 23], dtype=np.int64)
        np.testing.assert_array_equal(source.read(idx), data[idx])


def test_block_shuffle_over_local_zarr_returns_every_row_once(tmp_path: Path) -> None:
    n = 3001
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 3, 2)
    zx = _array(tmp_path / "x.zarr", x, (64, 2, 2), compressors=[ZstdCodec()])
    zy = _array(tmp_path / "y.zarr", np.arange(n), (64,))
    ds = af.from_arrays(zx, zy, batch_size=50, shuffle="block", seed=2)
    seen = []
    for xb, yb in ds:
        np.testing.assert_array_equal(xb.numpy(), x[yb.numpy()])
        seen.append(yb.numpy())
    assert sorted(np.concatenate(seen).tolist()) == list(range(n))


@pytest.mark.parametrize("compressor", ["none", "zstd+crc32c"])
@pytest.mark.parametrize("chunks", [(4, 5, 3), (7, 2, 2), (64, 2, 1)])
def test_a_range_read_piece_by_piece_equals_zarr(
    tmp_path: Path, compressor: str, chunks: tuple[int, ...]
) -> None:
    """Pieces are the chunks a range touches (chunks splitting the last axes too); read in any
    order, each fills exactly its part of the range."""
    data = np.random.default_rng(3).standard_normal((50, 5, 3)).astype(">f4")
    array = _array(tmp_path / "a.zarr", data, chunks, compressors=COMPRESSORS[compressor])
    source = ZarrSource(array)
    assert source.chunk_reader is not None
    grid = -(-5 // chunks[1]) * -(-3 // chunks[2])
    for start, stop in [(0, 50), (3, 11), (5, 6), (49, 50), (13, 42)]:
        pieces = source.range_pieces(start, stop)
        assert pieces == ((stop - 1) // chunks[0] - start // chunks[0] + 1) * grid
        for runs in piece_runs(pieces, np.random.default_rng(start)):
            out = np.full((stop - start, 5, 3), np.nan, dtype="=f4")
            for first, last in runs:
                source.read_pieces_into(start, stop, first, last, out)
            np.testing.assert_array_equal(out, np.asarray(array[start:stop]))


def test_a_damaged_chunk_read_as_a_piece_is_named(tmp_path: Path) -> None:
    data = np.arange(40 * 4, dtype=np.int32).reshape(40, 4)
    array = _array(tmp_path / "a.zarr", data, (10, 2), compressors=COMPRESSORS["zstd"])
    key = array.metadata.encode_chunk_key((1, 1))
    (tmp_path / "a.zarr" / key).write_bytes(b"not zstd")
    source = ZarrSource(array)
    out = np.empty((40, 4), np.int32)
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 1\)"):
        for piece in range(source.range_pieces(0, 40)):
            source.read_pieces_into(0, 40, piece, piece + 1, out)


def test_a_window_of_few_large_blocks_is_read_piece_by_piece_on_every_thread(
    tmp_path: Path,
) -> None:
    """Two blocks per window, each many chunks: threads share the chunks, not only the blocks."""
    from arrayfeed._pipeline.plan.plan import Plan
    from arrayfeed._pipeline.read.blocks import WindowCache

    data = np.random.default_rng(5).integers(0, 255, size=(64, 8, 6), dtype=np.uint8)
    array = _array(tmp_path / "a.zarr", data, (16, 2, 3), compressors=COMPRESSORS["zstd"])
    source = ZarrSource(array)
    plan = Plan(n_rows=64, batch_size=8, shuffle="block", block_rows=16, window_blocks=2, seed=1)
    cache = WindowCache(source, plan.block_order(0), capacity=2)
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def read(step: int) -> None:
        try:
            barrier.wait()
            rows = plan.indices(0, step)
            out = np.empty((len(rows), 8, 6), np.uint8)
            cache.gather_into(rows, out)
            np.testing.assert_array_equal(out, data[rows])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(s,)) for s in (0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    order = plan.block_order(0)
    chunks_per_block = 4 * 2  # rows 16 = one chunk row; 8x6 rows split into 4 x 2 chunks
    assert cache.loads == 2  # the two blocks of window 0, each read once
    assert cache.piece_loads == 2 * chunks_per_block
    assert order.windows == 2
    for step in range(plan.steps):
        rows = plan.indices(0, step)
        out = np.empty((len(rows), 8, 6), np.uint8)
        cache.gather_into(rows, out)
        np.testing.assert_array_equal(out, data[rows])
