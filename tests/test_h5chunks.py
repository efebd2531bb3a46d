"""Raw HDF5 chunks decoded outside h5py: every value bit for bit what h5py reads, or an error.

Each case writes a real file with h5py (and hdf5plugin for the plugin filters), reads it back
through :class:`~arrayfeed._storage.hdf5.H5Source` on the raw-chunk path, and compares the bytes
with h5py's own ``dset[...]``.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import pickle
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.feed import Feed
from arrayfeed._pipeline.plan import Plan
from arrayfeed._pipeline.structure import flatten
from arrayfeed._storage import as_source, workbuffers
from arrayfeed._storage.hdf5 import chunks as h5chunks
from arrayfeed._storage.hdf5 import codecs as h5codecs
from arrayfeed._storage.hdf5 import compressors as h5compressors
from arrayfeed._storage.hdf5 import rawchunks
from arrayfeed._storage.hdf5.chunkboxes import ChunkBoxes
from arrayfeed._storage.hdf5.chunks import ChunkFile
from arrayfeed._storage.hdf5.codecs import ChunkDecoder, Stage, StageError, fletcher32, pipeline
from arrayfeed._storage.hdf5.source import H5Source, open_hdf5

from ._feeds import piece_runs

HAVE_IMAGECODECS = importlib.util.find_spec("imagecodecs") is not None


@pytest.fixture(scope="module")
def plugins() -> Iterator[Any]:
    """``hdf5plugin`` (to write blosc, zstd, lz4 and bitshuffle files; None when it is not
    installed), its filters registered with HDF5 for this module only: other tests check what
    happens when a filter is missing."""
    before = {i: h5py.h5z.filter_avail(i) for i in [*range(32000, 32100), 307]}
    try:
        import hdf5plugin  # registers its filters when first imported
    except ImportError:  # pragma: no cover - the test extra installs it
        yield None
        return
    hdf5plugin.register()
    yield hdf5plugin
    gc.collect()  # sources the tests left open keep their files, and filters, in use
    for i in hdf5plugin.FILTERS.values():
        if not before.get(i, True):
            h5py.h5z.unregister_filter(i)


#: ``options(hdf5plugin)``: keyword arguments of ``create_dataset``.
Options = Callable[[Any], dict[str, Any]]


def _plugin(make: Callable[[Any], Any], **extra: Any) -> Options:
    def options(plugins: Any) -> dict[str, Any]:
        if plugins is None:
            pytest.skip("hdf5plugin is not installed")
        return {**make(plugins), **extra}

    return options


def _plain(**kwargs: Any) -> Options:
    return lambda _plugins: dict(kwargs)


#: name -> (create_dataset options, whether decoding needs imagecodecs)
FILTERS: dict[str, tuple[Options, bool]] = {
    "none": (_plain(), False),
    "gzip1": (_plain(compression="gzip", compression_opts=1), False),
    "gzip9": (_plain(compression="gzip", compression_opts=9), False),
    "shuffle": (_plain(shuffle=True), False),
    "shuffle+gzip": (_plain(compression="gzip", shuffle=True), False),
    "lzf": (_plain(compression="lzf"), True),
    "shuffle+lzf": (_plain(compression="lzf", shuffle=True), True),
    "fletcher32": (_plain(fletcher32=True), False),
    "shuffle+gzip+fletcher32": (_plain(compression="gzip", shuffle=True, fletcher32=True), False),
    "lzf+fletcher32": (_plain(compression="lzf", fletcher32=True), True),
    "blosc-lz4": (_plugin(lambda p: p.Blosc(cname="lz4", shuffle=p.Blosc.SHUFFLE)), False),
    "blosc-zstd-bitshuffle": (
        _plugin(lambda p: p.Blosc(cname="zstd", shuffle=p.Blosc.BITSHUFFLE)),
        False,
    ),
    "blosc-zlib-noshuffle": (
        _plugin(lambda p: p.Blosc(cname="zlib", shuffle=p.Blosc.NOSHUFFLE)),
        False,
    ),
    "zstd": (_plugin(lambda p: p.Zstd(clevel=5)), False),
    "zstd+fletcher32": (_plugin(lambda p: p.Zstd(), fletcher32=True), False),
    "lz4": (_plugin(lambda p: p.LZ4()), True),
    "lz4-small-blocks": (_plugin(lambda p: p.LZ4(nbytes=48)), True),
    "bitshuffle": (_plugin(lambda p: p.Bitshuffle(cname="none")), True),
    "bitshuffle-lz4": (_plugin(lambda p: p.Bitshuffle(cname="lz4")), True),
    "bitshuffle-lz4-16": (_plugin(lambda p: p.Bitshuffle(nelems=16, cname="lz4")), True),
    "bitshuffle-zstd": (_plugin(lambda p: p.Bitshuffle(cname="zstd")), True),
}

DTYPES = ["uint8", "int16", "float32", "float64", "complex64", "bool"]

#: name -> (shape, chunks)
LAYOUTS = {
    "whole-rows": ((50, 4, 3), (8, 4, 3)),
    "split-last-axes": ((40, 6, 5), (10, 3, 2)),
    "partial-everywhere": ((23, 7, 5), (4, 3, 4)),
    "one-axis": ((101,), (16,)),
    # chunks of 128 KiB and more, decoded in lent work buffers (workbuffers.MIN_BYTES), with
    # partial edge chunks along every axis
    "large-chunks": ((37, 64, 130), (16, 64, 128)),
    # chunks that split axis 1 alone (a table's columns): decoded side by side, copied out once;
    # the last column chunk reaches past the dataset's last column
    "columns": ((45, 13), (8, 3)),
    "columns-trailing-axes": ((30, 10, 4), (7, 4, 4)),
}


def _values(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Rows of noise (which compressors may store as they are) after rows of repeats (which
    they compress), with NaN, infinities and -0.0 among floats."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        v = rng.random(n) < 0.3
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        v = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
    else:
        real = rng.standard_normal(n) * 1e3
        v = (real + 1j * rng.standard_normal(n)).astype(dt) if dt.kind == "c" else real.astype(dt)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0], dtype=dt)
        at = np.arange(0, n, max(1, n // 9))
        v[at] = specials[np.arange(len(at)) % 4]
    v = v.reshape(shape)
    v[: shape[0] // 2] = v[0]
    return v


def _write(
    path: Path, values: np.ndarray, chunks: tuple[int, ...], options: dict[str, Any], **extra: Any
) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=values, chunks=chunks, **options, **extra)


def _reference(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return np.asarray(f["x"][...])


def _source(path: Path) -> H5Source:
    src = open_hdf5(path, "x")
    assert isinstance(src, H5Source)
    return src


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()  # bit for bit: NaN payloads and -0.0 included


def _check_reads(src: H5Source, ref: np.ndarray, chunk_rows: int, seed: int = 1) -> None:
    n = len(ref)
    rng = np.random.default_rng(seed)
    for start, stop in [(0, n), (0, 1), (n - 1, n), (3, n - 2), (chunk_rows - 1, chunk_rows + 1)]:
        out = np.empty((stop - start, *ref.shape[1:]), dtype=ref.dtype)
        src.read_range_into(start, stop, out)
        _assert_same(out, ref[start:stop])
    _assert_same(src.read_run(2, n - 1), ref[2 : n - 1])
    for size in (1, n // 3, n):
        idx = np.sort(rng.choice(n, size, replace=False)).astype(np.int64)
        _assert_same(src.read(idx), ref[idx])
    _assert_same(src.read(np.array([], dtype=np.int64)), ref[:0])


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(FILTERS))
def test_values_equal_h5py_bit_for_bit(
    tmp_path: Path, plugins: Any, name: str, dtype: str, layout: str
) -> None:
    options, needs_imagecodecs = FILTERS[name]
    shape, chunks = LAYOUTS[layout]
    path = tmp_path / "a.h5"
    _write(path, _values(dtype, shape), chunks, options(plugins))
    ref = _reference(path)
    src = _source(path)
    direct = HAVE_IMAGECODECS or not needs_imagecodecs
    assert src.read_path == "chunks" if direct else src.read_path.startswith("h5py: decoding")
    _check_reads(src, ref, chunks[0])
    reader = src.chunk_reader()
    assert (reader is not None and reader.decoded > 0) == direct  # the decoders did the work


@pytest.mark.parametrize("chunks", [(8, 3, 2), (8, 2, 5)])  # the second splits axis 1 alone
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "name", ["none", "shuffle+gzip+fletcher32", "lzf", "zstd", "bitshuffle-lz4"]
)
def test_chunks_never_written_read_as_the_fill_value(
    tmp_path: Path, plugins: Any, name: str, dtype: str, chunks: tuple[int, ...]
) -> None:
    options, _ = FILTERS[name]
    shape = (40, 6, 5)
    values = _values(dtype, shape)
    fill = {"b": True, "c": 1.5 - 2j, "f": -2.5}.get(np.dtype(dtype).kind, 7)
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x", shape=shape, dtype=dtype, chunks=chunks, fillvalue=fill, **options(plugins)
        )
        d[:9] = values[:9]
        d[25:30, 2:4] = values[25:30, 2:4]
        stored = d.id.get_num_chunks()
    assert stored < np.prod([-(-s // c) for s, c in zip(shape, chunks, strict=True)])
    ref = _reference(path)
    src = _source(path)
    _check_reads(src, ref, chunks[0])
    assert np.array_equal(
        src.read(np.array([39], dtype=np.int64))[0, 0, 0], np.asarray(fill, dtype)
    )


def test_a_dataset_never_written_reads_as_its_fill_value(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(30, 4), dtype="f4", chunks=(7, 4), fillvalue=3.25)
    src = _source(path)
    _assert_same(src.read_run(0, 30), np.full((30, 4), 3.25, dtype="f4"))
    reader = src.chunk_reader()
    assert reader is not None and reader.decoded == 0


@pytest.mark.parametrize("chunks", [(8, 32), (8, 4)])  # whole rows; columns
def test_filter_mask_chunks_stored_uncompressed_are_read_as_they_are(
    tmp_path: Path, chunks: tuple[int, int]
) -> None:
    # lzf gives up on noise and HDF5 stores the chunk raw, marking the filter skipped.
    shape = (64, 32)
    values = _values("float64", shape)
    path = tmp_path / "a.h5"
    _write(path, values, chunks, {"compression": "lzf", "fletcher32": True})
    src = _source(path)
    reader = src.chunk_reader()
    if reader is None:
        pytest.skip(src.read_path)
    assert (reader.masks & 1).any() and not (reader.masks & 1).all()
    _check_reads(src, _reference(path), chunks[0])


def test_each_chunk_a_read_touches_is_decoded_once(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("int16", (40, 6, 5)), (10, 3, 2), {"compression": "gzip"})
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None
    # Rows from row chunks 0 and 2; each row chunk has 2 x 3 chunks along the other axes.
    src.read(np.array([1, 2, 5, 9, 20, 27, 29], dtype=np.int64))
    assert reader.decoded == 2 * 6


def test_file_with_a_user_block(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    values = _values("float32", (30, 5))
    with h5py.File(path, "w", userblock_size=4096) as f:
        f.create_dataset("x", data=values, chunks=(4, 5), compression="gzip", fletcher32=True)
    src = _source(path)
    assert src.read_path == "chunks"
    _check_reads(src, _reference(path), 4)


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


# -- corruption ---------------------------------------------------------------------------------
def _chunk_at(path: Path, coords: tuple[int, ...]) -> tuple[int, int]:
    """Byte offset and stored size of the chunk at element ``coords``."""
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info_by_coord(coords)
        return int(info.byte_offset), int(info.size)


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x40]))


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


def _reference_rows(path: Path, start: int, stop: int) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return np.asarray(f["x"][start:stop])


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
    assert "arrayfeed[hdf5-codecs]" in src.read_path
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


# -- processes and threads ----------------------------------------------------------------------
def test_pickled_source_carries_no_reader_and_opens_its_own(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 5)), (8, 5), {"compression": "gzip"})
    src = _source(path)
    first = src.chunk_reader()
    assert first is not None
    state = src.__getstate__()
    assert state["_chunk_reader"] is None and "_reader_lock" not in state
    assert not any(isinstance(v, ChunkFile) for v in state.values())
    clone = pickle.loads(pickle.dumps(src))
    second = clone.chunk_reader()
    assert second is not None and second is not first and second.fd != first.fd
    _assert_same(clone.read_run(0, 40), _reference(path))
    src.close()
    _assert_same(src.read_run(0, 40), _reference(path))  # reopens after close


def test_reads_run_while_another_thread_holds_h5pys_lock(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("float64", (40, 6)), (8, 3), {"compression": "gzip", "shuffle": True})
    src = _source(path)
    assert src.chunk_reader() is not None  # the index comes from h5py, once, beforehand
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with h5py._objects.phil:  # the lock every h5py call takes
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    result: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: result.append(src.read_run(0, 40)))
    reader.start()
    reader.join(30)  # a deadlock guard, not a timing check
    finished = not reader.is_alive()
    release.set()
    holder.join()
    reader.join()
    assert finished, "the read waited for h5py's lock"
    _assert_same(result[0], _reference(path))


def test_two_threads_decode_at_the_same_time(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    _write(path, _values("float32", (40, 6)), (10, 6), {"compression": "gzip"})
    src = _source(path)
    reader = src.chunk_reader()
    assert reader is not None
    both_inside = threading.Barrier(2, timeout=30)

    def meet(stage: Stage) -> Stage:
        def decode(data: Any, size: int | None) -> Any:
            both_inside.wait()  # breaks (and the read fails) unless the other thread is decoding
            return stage.decode(data, size)

        return Stage(stage.code, stage.name, decode, stage.grows)

    reader.stages = tuple(meet(s) for s in reader.stages)
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def read(start: int) -> None:
        try:
            results[start] = src.read_run(start, start + 10)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(s,)) for s in (0, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ref = _reference(path)
    _assert_same(results[0], ref[0:10])
    _assert_same(results[20], ref[20:30])


@pytest.mark.parametrize("threads", [1, 2])
def test_block_shuffled_feed_reads_every_row_once(tmp_path: Path, threads: int) -> None:
    path = tmp_path / "a.h5"
    n = 300
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "x", data=_values("uint8", (n, 4, 4, 3)), chunks=(16, 2, 4, 1), compression="lzf"
        )
        f.create_dataset("y", data=np.arange(n, dtype=np.int32), chunks=(32,), compression="gzip")
    sources = [open_hdf5(path, "x"), open_hdf5(path, "y")]
    _, treedef = flatten((0, 0), lambda v: isinstance(v, int))
    plan = Plan(n_rows=n, batch_size=16, shuffle="block", block_rows=32, window_blocks=3, seed=3)
    feed = Feed(sources, treedef, plan, num_threads=threads)
    xs, ys = [], []
    for x, y in feed.epoch(0):
        xs.append(x.reshape(-1, 4, 4, 3))
        ys.append(y.reshape(-1))
    order = np.concatenate(ys)
    assert sorted(order.tolist()) == list(range(n))
    _assert_same(np.concatenate(xs), _reference_rows(path, 0, n)[order])
    for s in sources:
        assert isinstance(s, H5Source)
        reader = s.chunk_reader()
        assert (reader is not None and reader.decoded > 0) or not HAVE_IMAGECODECS


@pytest.mark.parametrize("compression", [None, "gzip", "lzf"])
@pytest.mark.parametrize("chunks", [(7, 5, 3), (4, 2, 2), (16, 5, 1), (6, 2, 3)])
def test_a_range_read_piece_by_piece_equals_h5py(
    tmp_path: Path, compression: str | None, chunks: tuple[int, ...]
) -> None:
    """Pieces are the chunks a range touches; read one by one or in runs, in any order (as
    window-cache threads do), they fill exactly the range, bit for bit as h5py reads it."""
    data = np.random.default_rng(4).standard_normal((50, 5, 3)).astype(np.float32)
    with h5py.File(tmp_path / "p.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=chunks, compression=compression, fletcher32=True)
    source = af.open_array(tmp_path / "p.h5", "x")
    assert source.read_path == "chunks"  # type: ignore[attr-defined]
    grid = -(-5 // chunks[1]) * -(-3 // chunks[2])
    for start, stop in [(0, 50), (3, 11), (5, 6), (49, 50), (13, 42)]:
        pieces = source.range_pieces(start, stop)  # type: ignore[attr-defined]
        assert pieces == ((stop - 1) // chunks[0] - start // chunks[0] + 1) * grid
        for runs in piece_runs(pieces, np.random.default_rng(start)):
            out = np.full((stop - start, 5, 3), np.nan, dtype=np.float32)
            for first, last in runs:
                source.read_pieces_into(start, stop, first, last, out)  # type: ignore[attr-defined]
            np.testing.assert_array_equal(out.view(np.uint32), data[start:stop].view(np.uint32))


@pytest.mark.parametrize("name", ["none", "lzf+fletcher32", "shuffle+gzip", "shuffle+lzf"])
def test_large_chunks_reuse_their_work_buffers(
    tmp_path: Path, plugins: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 128 KiB and more are read and decoded into lent buffers, not fresh ones (a fresh
    one page-faults every byte once TensorFlow has lowered glibc's mmap threshold)."""
    options, needs_imagecodecs = FILTERS[name]
    if needs_imagecodecs and not HAVE_IMAGECODECS:
        pytest.skip("lzf is decoded here only with imagecodecs")
    fresh = []

    class Counting(workbuffers.WorkBuffers):
        def take(self, nbytes: int) -> np.ndarray:
            with self._lock:
                kept = {id(b) for b in self._free}
            buffer = super().take(nbytes)
            fresh.append(id(buffer) not in kept)
            return buffer

    monkeypatch.setattr(workbuffers, "work", Counting())
    shape, chunks = LAYOUTS["large-chunks"]
    path = tmp_path / "a.h5"
    _write(path, _values("float32", shape), chunks, options(plugins))
    ref, src = _reference(path), _source(path)
    passes = []
    for _ in range(3):
        out = np.empty_like(ref)
        src.read_range_into(0, len(ref), out)
        _assert_same(out, ref)
        passes.append(sum(fresh))
    assert passes[0] > 0 and passes == [passes[0]] * 3  # later passes: kept buffers only
    assert len(fresh) >= 3 * 3  # buffers are taken every pass: one or more per row of chunks


def test_a_cut_blosc_chunk_is_named_as_corrupt(tmp_path: Path, plugins: Any) -> None:
    """Blosc trusts the stored size in its own header: a chunk cut short (written that way here)
    would decode to garbage, so the header is checked against the chunk's stored size."""
    if plugins is None:  # pragma: no cover - the test extra installs hdf5plugin
        pytest.skip("writing blosc needs hdf5plugin")
    options, _ = FILTERS["blosc-lz4"]
    path = tmp_path / "a.h5"
    values = _values("int32", (40, 5000))
    _write(path, values, (10, 5000), options(plugins))
    with h5py.File(path, "r+") as f:
        mask, raw = f["x"].id.read_direct_chunk((10, 0))
        f["x"].id.write_direct_chunk((10, 0), raw[:-500], filter_mask=mask)
    src = _source(path)
    assert src.read_path == "chunks"
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1, 0\).*Blosc frame says"):
        src.read(np.arange(10, 20, dtype=np.int64))
    _assert_same(src.read_run(20, 40), values[20:40])  # the other chunks still read


def test_reading_a_chunk_through_hdf5_holds_h5pys_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`read_direct_chunk` (the once-per-process check of chunk offsets) runs under h5py's own
    lock: h5py before its pull request 2764 did not take it, and another thread in HDF5 at the
    same time made it fail or crash."""
    assert rawchunks._H5PY_LOCK is h5py._objects.phil
    held = []

    class Recording:
        def __enter__(self) -> None:
            held.append(h5py._objects.phil.acquire())

        def __exit__(self, *exc: object) -> None:
            h5py._objects.phil.release()

    monkeypatch.setattr(rawchunks, "_H5PY_LOCK", Recording())
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=np.arange(1000), chunks=(100,), compression="gzip")
    with h5py.File(tmp_path / "a.h5", "r") as f:
        source = as_source(f["x"], "x")
        assert source.chunk_reader() is not None
        np.testing.assert_array_equal(source.read(np.arange(5, 500, 7)), np.arange(5, 500, 7))
    assert held == [True]


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
