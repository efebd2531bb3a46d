"""HDF5's filters decoded exactly as HDF5 decodes them, or left to h5py.

The fletcher32 checksum against HDF5's algorithm and the checksums it wrote; then every form this
package does not decode (a filter, an option, a library missing, an edge chunk stored unfiltered)
read correctly through h5py.
"""

from __future__ import annotations

import os
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._storage.hdf5 import codecs as h5codecs
from arrayfeed._storage.hdf5 import compressors as h5compressors
from arrayfeed._storage.hdf5.codecs import ChunkDecoder, StageError, fletcher32, pipeline
from arrayfeed._storage.hdf5.source import H5Source

from . import _h5files
from ._h5files import (
    HAVE_IMAGECODECS,
    _assert_same,
    _check_reads,
    _flip,
    _reference,
    _source,
    _values,
    _write,
)

# hdf5plugin's filters, registered for this module.
plugins = _h5files.plugins


# -- fletcher32 ---------------------------------------------------------------------------------
def _fletcher32_reference(data: bytes) -> int:
    """A line-by-line port of HDF5's H5_checksum_fletcher32 (blocks of 360 words, 32-bit sums)."""
    length, sum1, sum2, i = len(data) // 2, 0, 0, 0
    while length:
        block = min(length, 360)
        length -= block
        for _ in range(block):
            sum1 = (sum1 + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
            sum2 = (sum2 + sum1) & 0xFFFFFFFF
            i += 2
        sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
        sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    if len(data) % 2:
        sum1 += data[i] << 8
        sum2 += sum1
        sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
        sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
    sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    return (sum2 << 16) | sum1


@pytest.mark.parametrize(
    "n", [0, 1, 2, 3, 719, 720, 721, 1000, 131069, 131070, 131071, 131072, 200_001]
)
@pytest.mark.parametrize("fill", ["noise", "ones", "high"])
def test_fletcher32_matches_hdf5s_algorithm(n: int, fill: str) -> None:
    rng = np.random.default_rng(n)
    data = {
        "noise": rng.integers(0, 256, n, dtype=np.uint8),
        "ones": np.full(n, 0xFF, dtype=np.uint8),  # sums that fold to exactly 0xFFFF
        "high": rng.integers(250, 256, n, dtype=np.uint8),
    }[fill].tobytes()
    assert fletcher32(data) == _fletcher32_reference(data)
    assert h5codecs.fletcher32_numpy(data) == _fletcher32_reference(data)  # without imagecodecs


@pytest.mark.parametrize(
    ("dtype", "chunks"), [("uint8", (7, 3)), ("bool", (3, 1)), ("float64", (16, 5))]
)
def test_fletcher32_matches_every_checksum_hdf5_wrote(
    tmp_path: Path, dtype: str, chunks: tuple[int, int]
) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values(dtype, (50, 5)), chunks, {"fletcher32": True})
    with h5py.File(path, "r") as f:
        d = f["x"]
        for i in range(d.id.get_num_chunks()):
            _mask, raw = d.id.read_direct_chunk(d.id.get_chunk_info(i).chunk_offset)
            assert int.from_bytes(raw[-4:], "little") == fletcher32(raw[:-4])


# -- falling back to h5py -----------------------------------------------------------------------
def _fallback_cases(plugins: Any = None) -> dict[str, Callable[[Path], str]]:
    def scaleoffset(path: Path) -> str:
        values = np.random.default_rng(0).integers(-1000, 1000, (40, 5)).astype(np.int16)
        _write(path, values, (8, 5), {"scaleoffset": 0})
        return "scaleoffset"

    def big_endian(path: Path) -> str:
        _write(path, _values("int32", (40, 5)).astype(">i4"), (8, 5), {"compression": "gzip"})
        return "byte order"

    def compound(path: Path) -> str:
        a = np.zeros(40, dtype=[("a", "<i4"), ("b", "<f8")])
        a["a"], a["b"] = np.arange(40), np.linspace(0, 1, 40)
        _write(path, a, (8,), {"compression": "gzip"})
        return "plain number type"

    def fill_never(path: Path) -> str:
        _write(path, _values("int16", (40, 5)), (8, 5), {}, fill_time="never")
        return "fill time"

    def blosc_snappy(path: Path) -> str:
        if plugins is None:
            pytest.skip("hdf5plugin is not installed")
        import numcodecs.blosc

        if "snappy" in numcodecs.blosc.list_compressors():
            pytest.skip("this numcodecs decodes snappy")
        _write(path, _values("float32", (40, 5)), (8, 5), dict(plugins.Blosc(cname="snappy")))
        return "snappy"

    return {
        "scaleoffset": scaleoffset,
        "big-endian": big_endian,
        "compound": compound,
        "fill-never": fill_never,
        "blosc-snappy": blosc_snappy,
    }


@pytest.mark.parametrize("case", list(_fallback_cases()))
def test_what_is_not_decoded_here_reads_correctly_through_h5py(
    tmp_path: Path, plugins: Any, case: str
) -> None:
    path = tmp_path / "a.h5"
    why = _fallback_cases(plugins)[case](path)
    src = _source(path)
    assert src.read_path.startswith("h5py: ") and why in src.read_path
    assert src.chunk_reader() is None
    ref = _reference(path)
    np.testing.assert_array_equal(
        src.read(np.array([0, 9, 10, 39], dtype=np.int64)), ref[[0, 9, 10, 39]]
    )
    out = np.empty((30, *ref.shape[1:]), dtype=ref.dtype)
    src.read_range_into(5, 35, out)
    np.testing.assert_array_equal(out, ref[5:35])


def test_file_the_caller_opened_writable_reads_through_h5py(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("int16", (40, 5)), (8, 5), {"compression": "gzip"})
    with h5py.File(path, "r+") as f:
        src = H5Source(f["x"])
        assert "open for writing" in src.read_path
        f["x"][3] = 7  # may sit in HDF5's caches, not on disk yet: raw chunks would miss it
        assert (src.read(np.array([3], dtype=np.int64)) == 7).all()
        # HDF5 shares one open file within a process: a read-only copy is writable here too.
        assert "open for writing" in pickle.loads(pickle.dumps(src)).read_path
    # A copy made once the writer closed (as in another process) opens the file read-only.
    clone = pickle.loads(pickle.dumps(src))
    assert clone.read_path == "chunks"
    assert (clone.read(np.array([3], dtype=np.int64)) == 7).all()


def test_in_memory_file_reads_through_h5py(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w", driver="core", backing_store=False) as f:
        f.create_dataset("x", data=np.arange(40), chunks=(8,), compression="gzip")
        src = H5Source(f["x"])
        assert "driver" in src.read_path
        np.testing.assert_array_equal(src.read_run(0, 40), np.arange(40))


def test_without_imagecodecs_lzf_reads_through_h5py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h5compressors, "imagecodecs_module", lambda: None)
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 5)), (8, 5), {"compression": "lzf"})
    src = _source(path)
    assert "imagecodecs>=2025.8.2" in src.read_path
    np.testing.assert_array_equal(src.read_run(0, 40), _reference(path))
    assert isinstance(pipeline([(32000, (4, 261, 160), "lzf")], 4), str)
    # gzip is decoded here either way: by zlib without imagecodecs (libdeflate with it).
    gzipped = tmp_path / "b.h5"
    _write(gzipped, _values("float32", (40, 5)), (8, 2), {"compression": "gzip", "shuffle": True})
    src = _source(gzipped)
    assert src.read_path == "chunks"
    _check_reads(src, _reference(gzipped), 8)
    stages = pipeline([(1, (4,), "gzip")], 4)
    assert not isinstance(stages, str) and stages[0].into is None


@pytest.mark.parametrize("library", ["libdeflate", "zlib"])
@pytest.mark.parametrize("into", [False, True])
def test_deflate_streams_decode_as_hdf5_inflates_them(
    monkeypatch: pytest.MonkeyPatch, library: str, into: bool
) -> None:
    """Either library: bytes after the zlib stream are ignored (HDF5 inflates to the stream's
    end); a stream that holds fewer bytes than the chunk, one that holds more, and a damaged
    one are each a failed stage, never a chunk padded with stale bytes."""
    if library == "libdeflate" and not HAVE_IMAGECODECS:
        pytest.skip("libdeflate comes with imagecodecs")
    if library == "zlib":
        monkeypatch.setattr(h5compressors, "imagecodecs_module", lambda: None)
    stages = pipeline([(1, (6,), "gzip")], 1)
    assert not isinstance(stages, str)
    assert (stages[0].into is not None) == (library == "libdeflate")
    assert (stages[0].decode is h5compressors._inflate) == (library == "zlib")
    raw = np.random.default_rng(3).integers(0, 4, 5000, dtype=np.uint8).tobytes()
    decoder = ChunkDecoder(stages, 0, len(raw))

    def decode(data: bytes) -> bytes:
        out = np.full(len(raw), 0xAB, dtype=np.uint8) if into else None
        return bytes(decoder(data, out))

    assert decode(zlib.compress(raw)) == raw
    assert decode(zlib.compress(raw) + b"after the stream") == raw
    for bad in (zlib.compress(raw[:-7]), zlib.compress(raw + b"more"), zlib.compress(raw)[:-9]):
        with pytest.raises(StageError):
            decode(bad)


def test_edge_chunks_stored_at_raw_size_are_left_to_hdf5(tmp_path: Path) -> None:
    # HDF5 can write partial edge chunks unfiltered (H5Pset_chunk_opts), which h5py cannot show:
    # an edge chunk stored at exactly its raw size under a filter goes through HDF5, which knows.
    path = tmp_path / "a.h5"
    _write(path, _values("int16", (23, 7)), (4, 3), {"shuffle": True})
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None
    _check_reads(src, _reference(path), 4)
    assert reader.decoded > 0 and reader.via_hdf5 > 0


def test_a_damaged_edge_chunk_left_to_hdf5_is_named(tmp_path: Path) -> None:
    """An edge chunk stored at its raw size goes through HDF5; when its bytes are damaged, the
    filter's failure there is a CorruptDataError naming the chunk, as a failure here is, on
    every read path (the box path included: the chunks split rows)."""
    path = tmp_path / "a.h5"
    rng = np.random.default_rng(1)
    for _ in range(100):  # values whose filtered edge chunk happens to take its raw 21 bytes
        data = rng.integers(0, 4, (10, 3, 2)).astype("u1")
        options = {"compression": "lzf", "shuffle": True, "fletcher32": True}
        _write(path, data, (7, 3, 1), options)
        with h5py.File(path, "r") as f:
            info = f["x"].id.get_chunk_info(2)  # chunk (1, 0, 0): rows 7..9 of 7
        if info.size == 21 and info.filter_mask == 0:
            break
    else:
        pytest.fail("no edge chunk was stored at its raw size")
    _flip(path, info.byte_offset + 2)
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None and reader._boxes is not None
    out = np.empty_like(data)
    reads = [
        lambda: src.read_range_into(0, 10, out),
        lambda: src.read_pieces_into(0, 10, 0, src.range_pieces(0, 10), out),
        lambda: src.read(np.arange(10, dtype=np.int64)),
    ]
    for read in reads:
        with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 0, 0\).*cannot be read by"):
            read()
    _assert_same(src.read_run(0, 7), data[:7])


def _hdf5_library() -> Any:
    """The HDF5 library h5py loaded, through ctypes (None where it cannot be found)."""
    import ctypes
    import glob

    here = os.path.dirname(h5py.__file__)
    found = glob.glob(os.path.join(here, os.pardir, "h5py.libs", "libhdf5-*.so*"))
    return ctypes.CDLL(found[0]) if found else None


def test_edge_chunks_hdf5_wrote_unfiltered_read_correctly(tmp_path: Path) -> None:
    import ctypes

    lib = _hdf5_library()
    if lib is None:
        pytest.skip("h5py's HDF5 library is not where Linux wheels put it")
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((4, 3))
    dcpl.set_deflate(4)
    dont_filter_partial_chunks = 2  # H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS
    assert (
        lib.H5Pset_chunk_opts(ctypes.c_int64(dcpl.id), ctypes.c_uint(dont_filter_partial_chunks))
        >= 0
    )
    values = _values("int16", (23, 7))
    path = tmp_path / "a.h5"
    with h5py.File(path, "w", libver="latest") as f:
        space = h5py.h5s.create_simple(values.shape)
        h5py.Dataset(
            h5py.h5d.create(f.id, b"x", h5py.h5t.py_create(values.dtype), space, dcpl=dcpl)
        )[...] = values
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None
    _check_reads(src, _reference(path), 4)
    assert reader.decoded > 0 and reader.via_hdf5 > 0
