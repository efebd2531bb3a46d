"""Zarr chunk files read into reused work buffers, or straight into the output: short reads
continued, a file grown or cut while read, damage named."""

from __future__ import annotations

import os
import stat
import types
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import (
    BytesCodec,
)

import arrayfeed as af
from arrayfeed._storage import workbuffers
from arrayfeed._storage.zarr import codecs as zarrcodecs
from arrayfeed._storage.zarr.chunks import ChunkReader
from arrayfeed._storage.zarr.source import ZarrSource

from ._zarrfiles import COMPRESSORS, _array


class _CountingBuffers(workbuffers.WorkBuffers):
    def __init__(self) -> None:
        super().__init__()
        self.fresh = 0

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            before = len(self._free)
        buffer = super().take(nbytes)
        with self._lock:
            self.fresh += len(self._free) == before  # nothing was taken from the kept ones
        return buffer


@pytest.mark.parametrize("compressor", ["none", "crc32c", "blosc+crc32c", "zstd", "zstd+crc32c"])
def test_chunk_reads_reuse_their_work_buffers(
    tmp_path: Path, compressor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh chunk-sized buffer per read page-faults every byte once TensorFlow has lowered
    glibc's mmap threshold: after a first pass, reads take no new buffer."""
    buffers = _CountingBuffers()
    monkeypatch.setattr(workbuffers, "work", buffers)
    # chunks of 128 KiB: smaller ones are allocated per read (workbuffers.MIN_BYTES)
    data = np.random.default_rng(0).integers(0, 50, (300, 1024), dtype=np.int32)
    z = _array(tmp_path / "a.zarr", data, (32, 1024), compressors=COMPRESSORS[compressor])
    reader = ChunkReader.of(z, "a", strict=True)
    assert reader is not None
    rows = np.arange(300, dtype=np.int64)
    np.testing.assert_array_equal(reader.read(rows), data)
    first = buffers.fresh
    for _ in range(3):
        np.testing.assert_array_equal(reader.read(rows), data)
    assert 0 < first <= 4 and buffers.fresh == first  # raw and decoded; sizes vary at first


@pytest.mark.parametrize("compressor", ["blosc+crc32c", "zstd"])
def test_a_chunk_that_decodes_short_is_refused_never_mixed_with_an_earlier_one(
    tmp_path: Path, compressor: str
) -> None:
    """Chunks decode into reused buffers only when their frame declares exactly a chunk's size:
    a valid frame of fewer bytes is named as corrupt, not filled up from the chunk before."""
    data = np.arange(40 * 2048, dtype=np.int64).reshape(40, 2048)  # 160 KiB chunks
    _array(tmp_path / "a.zarr", data, (10, 2048), compressors=COMPRESSORS[compressor])
    short = np.arange(5 * 2048, dtype=np.int64).tobytes()
    codec = numcodecs.Blosc(cname="lz4") if compressor.startswith("blosc") else numcodecs.Zstd()
    encoded = codec.encode(short)
    if compressor.endswith("crc32c"):
        encoded += bytes(numcodecs.CRC32C().encode(encoded))[-4:]  # a valid checksum of it
    (tmp_path / "a.zarr" / "c" / "1" / "0").write_bytes(encoded)
    reader = ChunkReader.of(zarr.open_array(tmp_path / "a.zarr", mode="r"), "a", strict=True)
    assert reader is not None
    np.testing.assert_array_equal(reader.read(np.arange(10, dtype=np.int64)), data[:10])
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 0\).*decoded to 81920 bytes"):
        reader.read(np.arange(10, 20, dtype=np.int64))


def test_declared_frame_sizes() -> None:
    rng = np.random.default_rng(0)
    for n in [0, 1, 255, 256, 257, 65535, 65791, 65792, 1 << 20, (5 << 20) + 3]:
        raw = rng.integers(0, 4, n, dtype=np.uint8).tobytes()
        for level in (0, 1, 9):
            assert zarrcodecs._zstd_nbytes(numcodecs.Zstd(level=level).encode(raw)) == n
        assert zarrcodecs._blosc_nbytes(numcodecs.Blosc().encode(raw)) == n
    # A frame that declares no size (streamed): descriptor 0, a window byte, then blocks.
    assert zarrcodecs._zstd_nbytes(b"\x28\xb5\x2f\xfd\x00\x48" + bytes(8)) == -1
    assert zarrcodecs._zstd_nbytes(b"not zstd at all") == -1
    assert zarrcodecs._blosc_nbytes(b"short") == -1


def test_the_kept_buffers_follow_the_chunk_sizes_read_now() -> None:
    """A pool filled by one array's chunk size makes room for another's (oldest out), so a
    second array read later still reuses its buffers."""
    pool = workbuffers.WorkBuffers(keep=4)
    big = [pool.take(640 << 10) for _ in range(4)]
    pool.give(*big)
    small = pool.take(160 << 10)
    assert small.nbytes == 160 << 10  # none of the kept fits: a new one
    pool.give(small)
    for _ in range(5):
        again = pool.take(160 << 10)
        assert again is small
        pool.give(again)
    assert len(pool._free) == 4 and pool._kept == 3 * (640 << 10) + (160 << 10)
    pool.give(np.empty(pool.max_bytes + 1, np.uint8))  # larger than the whole pool: not kept
    assert pool._kept == 3 * (640 << 10) + (160 << 10)


def test_short_reads_of_a_chunk_file_are_continued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read may return fewer bytes than asked (network file systems, signals): the rest of
    the file is read, not taken for a cut chunk."""
    data = np.random.default_rng(0).integers(0, 4, (8, 200_000), dtype=np.int16)  # 3.2 MB chunk
    z = _array(tmp_path / "a.zarr", data, (8, 200_000), compressors=COMPRESSORS["zstd+crc32c"])
    preadv = os.preadv

    def at_most_a_mebibyte(fd: int, buffers: list[Any], offset: int) -> int:
        return preadv(fd, [memoryview(buffers[0])[: 1 << 20]], offset)

    monkeypatch.setattr(os, "preadv", at_most_a_mebibyte)
    reader = ChunkReader.of(z, "a", strict=True)
    assert reader is not None
    np.testing.assert_array_equal(reader.read(np.arange(8, dtype=np.int64)), data)


@pytest.mark.parametrize("columns", [1_000, 200_000], ids=["small file", "large file"])
def test_a_chunk_file_read_short_or_grown_since_its_size_was_taken_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    """Small chunk files (under 128 KiB) are read with one ``pread``, large ones into a work
    buffer; either way a short read is continued and a file longer than its size said (it grew
    after ``fstat``) is read to its end, never cut."""
    data = np.random.default_rng(0).integers(0, 4, (8, columns), dtype=np.int16)
    z = _array(tmp_path / "a.zarr", data, (8, columns), compressors=COMPRESSORS["zstd+crc32c"])
    size = (tmp_path / "a.zarr" / "c" / "0" / "0").stat().st_size
    assert (size < workbuffers.MIN_BYTES) == (columns == 1_000)
    pread, preadv, fstat = os.pread, os.preadv, os.fstat
    monkeypatch.setattr(os, "pread", lambda fd, n, at: pread(fd, min(n, 100), at))
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, at: preadv(fd, [bufs[0][:100]], at))
    reader = ChunkReader.of(z, "a", strict=True)
    assert reader is not None
    np.testing.assert_array_equal(reader.read(np.arange(8, dtype=np.int64)), data)
    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "preadv", preadv)
    shrunk = types.SimpleNamespace(st_size=size - 7, st_mode=stat.S_IFREG | 0o644)
    monkeypatch.setattr(os, "fstat", lambda fd: shrunk if fstat(fd).st_size == size else fstat(fd))
    np.testing.assert_array_equal(reader.read(np.arange(8, dtype=np.int64)), data)


def test_a_cut_blosc_chunk_is_named_as_corrupt(tmp_path: Path) -> None:
    """Blosc trusts the stored size in its own header, so a cut chunk would decode to garbage
    (bytes of an earlier chunk, in a reused buffer): the header is checked against the file."""
    data = np.random.default_rng(1).integers(0, 1000, (20, 40_000), dtype=np.int32)
    _array(tmp_path / "a.zarr", data, (10, 40_000), compressors=COMPRESSORS["blosc"])
    chunk = tmp_path / "a.zarr" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-5000])
    reader = ChunkReader.of(zarr.open_array(tmp_path / "a.zarr", mode="r"), "a", strict=True)
    assert reader is not None
    np.testing.assert_array_equal(reader.read(np.arange(10, dtype=np.int64)), data[:10])
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 0\).*Blosc frame says"):
        reader.read(np.arange(10, 20, dtype=np.int64))


@pytest.mark.parametrize("checksum", ["crc32c package", "numcodecs"])
@pytest.mark.parametrize("compressor", ["none", "crc32c", "zstd", "blosc+crc32c"])
def test_whole_chunks_go_straight_into_the_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compressor: str, checksum: str
) -> None:
    """Chunks of whole rows that a block read covers whole: read into the output when stored
    as they are (what `convert` writes: no copying path at all), decoded into it when
    compressed (Blosc, Zstandard); chunks it covers in part, the short last chunk and chunks
    never written are copied; the values are Zarr's either way."""
    if checksum == "numcodecs":
        monkeypatch.setattr(zarrcodecs, "crc32c_checksum", numcodecs.CRC32C.checksum)
    data = np.random.default_rng(5).integers(0, 1 << 30, (95, 6, 2), dtype=np.int32)
    array = _array(tmp_path / "a.zarr", data, (10, 6, 2), compressors=COMPRESSORS[compressor])
    (tmp_path / "a.zarr" / "c" / "3" / "0" / "0").unlink()  # never written: the fill value
    want = np.asarray(array[...])
    source = ZarrSource(array)
    reader = source.chunk_reader
    assert reader is not None
    stored_as_is = compressor in ("none", "crc32c")
    assert (reader._direct, reader._into_out) == (stored_as_is, not stored_as_is)
    copies: list[tuple[int, ...]] = []
    copy_chunk = reader._copy_chunk
    monkeypatch.setattr(
        reader, "_copy_chunk", lambda coords, *a: copies.append(coords) or copy_chunk(coords, *a)
    )
    for start, stop, direct, copied in [
        (0, 95, 8, [(3, 0, 0), (9, 0, 0)]),  # chunk 3 missing, chunk 9 is 5 rows of 10
        (5, 41, 2, [(0, 0, 0), (3, 0, 0), (4, 0, 0)]),
        (20, 30, 1, []),
    ]:
        reader.direct, copies[:] = 0, []
        out = np.full((stop - start, 6, 2), -1, dtype=np.int32)
        for piece in range(source.range_pieces(start, stop)):
            source.read_pieces_into(start, stop, piece, piece + 1, out)
        np.testing.assert_array_equal(out, want[start:stop])
        assert reader.direct == direct
        if stored_as_is:
            assert copies == copied
    reader.direct = 0
    out = np.full((20, 6, 2), -1, dtype=np.int32)[::2]  # not contiguous: copied
    source.read_pieces_into(0, 10, 0, 1, out)
    np.testing.assert_array_equal(out, want[:10])
    assert reader.direct == 0


@pytest.mark.parametrize("compressor", ["crc32c", "zstd"])
def test_whole_chunks_of_another_byte_order_are_copied(tmp_path: Path, compressor: str) -> None:
    """Chunks stored big-endian are swapped into the output's native order by the copy: never
    read or decoded straight into it."""
    data = np.random.default_rng(8).standard_normal((30, 4))
    array = _array(
        tmp_path / "a.zarr",
        data,
        (10, 4),
        compressors=COMPRESSORS[compressor],
        serializer=BytesCodec(endian="big"),
    )
    raw = (tmp_path / "a.zarr" / "c" / "1" / "0").read_bytes()
    if compressor == "crc32c":  # stored as is: the file holds the big-endian values
        assert raw[:-4] == data[10:20].astype(">f8").tobytes()
    source = ZarrSource(array)
    reader = source.chunk_reader
    assert reader is not None and not reader._direct and not reader._into_out
    out = np.empty((30, 4), dtype="=f8")
    source.read_pieces_into(0, 30, 0, 3, out)
    np.testing.assert_array_equal(out, data)
    assert reader.direct == 0


@pytest.mark.parametrize("damage", ["flip", "short", "long"])
def test_a_damaged_chunk_read_straight_into_the_output_is_named(
    tmp_path: Path, damage: str
) -> None:
    """A flipped byte fails the checksum; a file cut short or grown is not a stored chunk's
    size and goes the copying way, which names it; the chunks around it read correctly."""
    data = np.random.default_rng(6).integers(0, 1 << 30, (40, 8), dtype=np.int64)
    array = _array(tmp_path / "a.zarr", data, (10, 8), compressors=COMPRESSORS["crc32c"])
    chunk = tmp_path / "a.zarr" / "c" / "2" / "0"
    raw = bytearray(chunk.read_bytes())
    if damage == "flip":
        raw[37] ^= 0x10
    elif damage == "short":
        raw = raw[:-9]
    else:
        raw += b"\x00" * 8
    chunk.write_bytes(bytes(raw))
    source = ZarrSource(array)
    out = np.empty((40, 8), np.int64)
    with pytest.raises(af.CorruptDataError, match=r"chunk \(2, 0\) \(key 'c/2/0'\)"):
        source.read_pieces_into(0, 40, 2, 3, out)
    source.read_pieces_into(0, 40, 0, 2, out)
    source.read_pieces_into(0, 40, 3, 4, out)
    np.testing.assert_array_equal(out[:20], data[:20])
    np.testing.assert_array_equal(out[30:], data[30:])


def test_a_chunk_read_straight_into_the_output_continues_short_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read may return fewer bytes than asked (network file systems, signals): the read into
    the output and its checksum's bytes go on from where it stopped."""
    data = np.random.default_rng(7).integers(0, 1 << 30, (20, 301), dtype=np.int64)
    array = _array(tmp_path / "a.zarr", data, (10, 301), compressors=COMPRESSORS["crc32c"])
    preadv, calls = os.preadv, []

    def at_most_999_bytes(fd: int, buffers: list[Any], offset: int) -> int:
        calls.append(offset)
        return preadv(fd, [memoryview(buffers[0])[:999]], offset)

    monkeypatch.setattr(os, "preadv", at_most_999_bytes)
    source = ZarrSource(array)
    reader = source.chunk_reader
    assert reader is not None
    out = np.empty((20, 301), np.int64)
    source.read_pieces_into(0, 20, 0, 2, out)
    np.testing.assert_array_equal(out, data)
    assert reader.direct == 2 and len(calls) == 2 * (-(-(10 * 301 * 8) // 999) + 1)
