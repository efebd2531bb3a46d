"""HDF5 files for the tests of raw chunks: every filter, dtype and chunk layout h5py writes.

:func:`plugins` registers ``hdf5plugin``'s filters for a test module (bind it in the module:
``plugins = _h5files.plugins``); :data:`FILTERS`, :data:`DTYPES` and :data:`LAYOUTS` are the
cases; :func:`_check_reads` compares every way of reading rows with h5py's own reads, bit for bit.
"""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from arrayfeed._storage.hdf5.source import H5Source, open_hdf5

__all__ = [
    "DTYPES",
    "FILTERS",
    "HAVE_IMAGECODECS",
    "LAYOUTS",
    "Options",
    "_assert_same",
    "_check_reads",
    "_chunk_at",
    "_flip",
    "_patch",
    "_plain",
    "_plugin",
    "_reference",
    "_reference_rows",
    "_source",
    "_values",
    "_write",
    "plugins",
]

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


def _reference_rows(path: Path, start: int, stop: int) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return np.asarray(f["x"][start:stop])


# -- damage ------------------------------------------------------------------------------------
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
