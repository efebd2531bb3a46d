"""Torture suite: bad, odd and damaged inputs give exactly-correct values or a named error.

Never silently wrong data: every case below either checks every value bit for bit against the
rows each batch claims to hold, or checks that a named arrayfeed error (naming the file, array,
chunk, filter or argument) is raised, at ``from_arrays`` or during iteration.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import tensorflow as tf
import zarr

import arrayfeed as af
from arrayfeed._pipeline.plan.plan import Plan, shard_bounds
from arrayfeed._storage.zarr.source import ZarrSource

from .conftest import subprocess_env

Write = Callable[[str, str, np.ndarray], object]
N = 41  # prime: batches never divide evenly


# -- helpers ------------------------------------------------------------------------------------
def _bytes_of(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` in native byte order and C layout (for bit-exact comparisons)."""
    a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("=")))
    return a.reshape(len(a), -1).view(np.uint8)


def _assert_feeds_exactly(leaf: object, expected: np.ndarray, **kwargs: Any) -> None:
    """Every row exactly once per epoch, each batch bit-identical to the rows it claims."""
    n = len(expected)
    ds = af.from_arrays(leaf, np.arange(n), batch_size=7, seed=3, **kwargs)
    native = expected.dtype.newbyteorder("=")
    assert ds.element_spec[0].dtype == tf.as_dtype(native)
    for _ in range(2):  # two epochs, two permutations
        seen = []
        for xb, yb in ds:
            ids, x = yb.numpy(), xb.numpy()
            assert x.dtype == native
            np.testing.assert_array_equal(_bytes_of(x), _bytes_of(expected[ids]))
            seen.append(ids)
        assert sorted(np.concatenate(seen).tolist()) == list(range(n))


def _iteration_error(ds: tf.data.Dataset, epochs: int = 1) -> str:
    """The message of the error raised while iterating ``ds`` (TensorFlow wraps it)."""
    with pytest.raises(tf.errors.OpError) as info:
        for _ in range(epochs):
            for _ in ds:
                pass
    return str(info.value.message)


def _rows(n: int = N, dtype: str = "float64") -> np.ndarray:
    rng = np.random.default_rng(n)
    return (rng.standard_normal((n, 3)) * 100).astype(dtype)


# -- memory layouts -----------------------------------------------------------------------------
def _fortran_ndarray(tmp: Path) -> tuple[object, np.ndarray]:
    a = np.asfortranarray(_rows())
    assert a.flags.f_contiguous and not a.flags.c_contiguous
    return a, a


def _fortran_npy_path(tmp: Path) -> tuple[object, np.ndarray]:
    a = np.asfortranarray(_rows(dtype="int32"))
    np.save(tmp / "f.npy", a)
    return str(tmp / "f.npy"), a


def _fortran_memmap(tmp: Path) -> tuple[object, np.ndarray]:
    a = np.asfortranarray(_rows(dtype="float32"))
    np.save(tmp / "f.npy", a)
    mm = np.load(tmp / "f.npy", mmap_mode="r")
    assert mm.flags.f_contiguous
    return mm, a


def _strided_columns(tmp: Path) -> tuple[object, np.ndarray]:
    wide = np.arange(N * 6, dtype=np.int64).reshape(N, 6)
    return wide[:, ::2], wide[:, ::2].copy()


def _strided_rows(tmp: Path) -> tuple[object, np.ndarray]:
    tall = _rows(3 * N)
    return tall[::3], tall[::3].copy()


def _strided_memmap_rows(tmp: Path) -> tuple[object, np.ndarray]:
    tall = _rows(3 * N, "float32")
    np.save(tmp / "t.npy", tall)
    return np.load(tmp / "t.npy", mmap_mode="r")[1::3], tall[1::3].copy()


def _reversed_rows(tmp: Path) -> tuple[object, np.ndarray]:
    a = _rows()
    return a[::-1], a[::-1].copy()


def _unaligned(tmp: Path) -> tuple[object, np.ndarray]:
    a = _rows(dtype="float32")
    raw = np.zeros(a.nbytes + 1, np.uint8)
    view = np.frombuffer(raw.data, dtype=np.float32, offset=1, count=a.size).reshape(a.shape)
    raw[1:] = a.view(np.uint8).reshape(-1)
    assert not view.flags.aligned
    return view, a


def _broadcast_rows(tmp: Path) -> tuple[object, np.ndarray]:
    row = np.array([1.5, -2.5, 3.25])
    b = np.broadcast_to(row, (N, 3))  # zero stride on the row axis, read-only
    return b, np.array(b)


def _read_only(tmp: Path) -> tuple[object, np.ndarray]:
    a = _rows()
    a.flags.writeable = False
    return a, a.copy()


def _big_endian_ndarray(tmp: Path) -> tuple[object, np.ndarray]:
    a = _rows().astype(">f8")
    return a, a


def _big_endian_npy(tmp: Path) -> tuple[object, np.ndarray]:
    a = (_rows() * 1000).astype(">i4")
    np.save(tmp / "be.npy", a)
    return str(tmp / "be.npy"), a


def _big_endian_hdf5(tmp: Path) -> tuple[object, np.ndarray]:
    a = _rows().astype(">f4")
    with h5py.File(tmp / "be.h5", "w") as f:
        f.create_dataset("x", data=a, chunks=(5, 3))
    return af.open_array(tmp / "be.h5", "x"), a


def _big_endian_zarr(tmp: Path) -> tuple[object, np.ndarray]:
    a = (_rows() * 10).astype(">i2")
    z = zarr.create_array(tmp / "be.zarr", shape=a.shape, dtype=a.dtype, chunks=(6, 3))
    z[...] = a
    return zarr.open_array(tmp / "be.zarr", mode="r"), a


LAYOUTS = {
    f.__name__[1:]: f
    for f in [
        _fortran_ndarray,
        _fortran_npy_path,
        _fortran_memmap,
        _strided_columns,
        _strided_rows,
        _strided_memmap_rows,
        _reversed_rows,
        _unaligned,
        _broadcast_rows,
        _read_only,
        _big_endian_ndarray,
        _big_endian_npy,
        _big_endian_hdf5,
        _big_endian_zarr,
    ]
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_and_byte_orders_feed_exact_rows(tmp_path: Path, layout: str) -> None:
    leaf, expected = LAYOUTS[layout](tmp_path)
    _assert_feeds_exactly(leaf, expected)


def test_callers_strided_and_big_endian_arrays_are_left_untouched() -> None:
    tall = _rows(3 * N).astype(">f8")
    before = tall.copy()
    _assert_feeds_exactly(tall[::3], before[::3], map_batch=lambda b: (b[0] * 1, b[1]))
    np.testing.assert_array_equal(tall, before)
    assert tall.dtype == np.dtype(">f8")


# -- dtypes on every backend --------------------------------------------------------------------
def _extremes(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(5)
    if dtype == "bool":
        return rng.random((N, 2)) < 0.5
    if dtype == "float16":
        a = (rng.standard_normal((N, 2)) * 1000).astype(np.float16)
        a[:4, 0] = [np.finfo(np.float16).max, np.finfo(np.float16).min, 6e-8, -0.0]
        return a
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(N, 2), dtype=dtype, endpoint=True)
    a[:2, 0] = [info.min, info.max]
    return a


@pytest.mark.parametrize("dtype", ["float16", "bool", "int64", "uint8"])
def test_dtypes_exact_on_every_backend(write: Write, backend: str, dtype: str) -> None:
    a = _extremes(dtype)
    _assert_feeds_exactly(write(backend, "a", a), a)


# -- NaN / Inf ----------------------------------------------------------------------------------
def _specials(dtype: str) -> np.ndarray:
    uint = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[dtype]
    info = np.finfo(dtype)
    a = np.tile(np.arange(N, dtype=dtype)[:, None], (1, 4))
    values = [np.nan, -np.nan, np.inf, -np.inf, -0.0, info.tiny / 4, info.max, info.min]
    a.reshape(-1)[: len(values)] = np.array(values, dtype=dtype)
    # A NaN with a payload: the quiet bit plus one low mantissa bit.
    bits = a.reshape(-1).view(uint)
    bits[len(values)] = bits[0] | uint(1)
    return a


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("backend_name", ["ndarray", "npy_path", "hdf5", "zarr"])
def test_nan_inf_and_signed_zero_pass_through_bit_exact(
    write: Write, backend_name: str, dtype: str
) -> None:
    a = _specials(dtype)
    assert np.isnan(a).sum() == 3 and np.isinf(a).sum() == 2
    _assert_feeds_exactly(write(backend_name, "s", a), a)


# -- dtypes refused -----------------------------------------------------------------------------
def _h5_leaf(tmp: Path, data: Any, dtype: Any = None) -> object:
    with h5py.File(tmp / "d.h5", "w") as f:
        f.create_dataset("x", data=data, dtype=dtype)
    return h5py.File(tmp / "d.h5", "r")["x"]


def _npy_path(tmp: Path, a: np.ndarray) -> str:
    np.save(tmp / "d.npy", a, allow_pickle=True)
    return str(tmp / "d.npy")


REFUSED: dict[str, tuple[Callable[[Path], object], str]] = {
    "object": (lambda t: np.array([{}, [], 1] * 3, dtype=object), "dtype object"),
    "structured": (
        lambda t: np.zeros(5, dtype=[("a", "f4"), ("b", "i8")]),
        "structured dtype.*pass each field as its own array",
    ),
    "unicode": (lambda t: np.array(["ab", "cd", "e"]), "dtype <U2.*encode it as numbers"),
    "bytes": (lambda t: np.array([b"ab", b"c"]), "dtype |S2.*encode it as numbers"),
    "datetime64": (lambda t: np.arange(3).astype("datetime64[s]"), "datetime64.*encode"),
    "timedelta64": (lambda t: np.arange(3).astype("timedelta64[ms]"), "timedelta64.*encode"),
    "void": (lambda t: np.zeros(3, dtype="V8"), "dtype |V8"),
    "longdouble": (lambda t: np.zeros(3, dtype=np.longdouble), "cannot represent"),
    "npy_of_objects": (
        lambda t: _npy_path(t, np.array([{}, 1, "a"], dtype=object)),
        "holds Python objects",
    ),
    "npy_structured": (
        lambda t: _npy_path(t, np.zeros(4, dtype=[("a", "f4"), ("b", "u1")])),
        "structured dtype",
    ),
    "hdf5_strings": (
        lambda t: _h5_leaf(t, ["ab", "cde"], h5py.string_dtype()),
        "dtype object",
    ),
    "hdf5_compound": (
        lambda t: _h5_leaf(t, np.zeros(4, dtype=[("a", "f4"), ("b", "i2")])),
        "structured dtype",
    ),
    "zarr_strings": (
        lambda t: zarr.create_array(t / "s.zarr", shape=(3,), dtype=str),
        "dtype",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unfeedable_dtypes_are_refused_at_from_arrays(tmp_path: Path, case: str) -> None:
    make, match = REFUSED[case]
    if case == "longdouble" and np.dtype(np.longdouble).itemsize == 8:
        pytest.skip("long double is float64 on this platform")
    with pytest.raises(af.DtypeError, match=match) as info:
        af.from_arrays({"feature": make(tmp_path)}, batch_size=2)
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    if case.startswith(("npy_", "hdf5_", "zarr_")):
        assert str(tmp_path) in message  # the file is named
    if case != "npy_of_objects":  # (refused while opening the file, before it is an argument)
        assert "`x['feature']`" in message  # the argument is named


# -- damaged .npy files -------------------------------------------------------------------------
def _damaged_npy(tmp: Path, damage: str) -> Path:
    path = tmp / f"{damage}.npy"
    np.save(path, np.arange(1000, dtype=np.float64).reshape(250, 4))
    data = bytearray(path.read_bytes())
    header_end = data.index(b"\n") + 1
    if damage == "truncated":
        data = data[: len(data) - 8 * 4 * 10 - 3]
    elif damage == "header_only":
        data = data[:header_end]
    elif damage == "garbled_header":
        start = data.index(b"{")
        data[start : start + 12] = b"#!garbage!#("
    elif damage == "shape_lies":
        data = data.replace(b"(250, 4)", b"(950, 4)")
    elif damage == "bad_magic":
        data[:6] = b"NOTNPY"
    elif damage == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    "damage", ["truncated", "header_only", "garbled_header", "shape_lies", "bad_magic", "empty"]
)
def test_damaged_npy_fails_at_from_arrays_naming_the_file(tmp_path: Path, damage: str) -> None:
    path = _damaged_npy(tmp_path, damage)
    for leaf in (str(path), path):
        with pytest.raises(af.CorruptDataError) as info:
            af.from_arrays({"image": leaf}, batch_size=8)
        assert f"'{path}'" in str(info.value)
        assert isinstance(info.value, OSError)
    with pytest.raises(af.CorruptDataError, match="re-create it"):
        af.open_array(path)


# -- HDF5: a filter that is not available -------------------------------------------------------
def _h5_with_unavailable_filter(path: Path) -> None:
    """A dataset whose chunks were compressed with blosc (32001), a filter h5py lacks here."""
    assert not h5py.h5z.filter_avail(32001)
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4, 2))
        dcpl.set_filter(32001, h5py.h5z.FLAG_OPTIONAL, (2, 2, 4, 16, 5, 1, 0))
        space = h5py.h5s.create_simple((8, 2))
        dsid = h5py.h5d.create(f.id, b"x", h5py.h5t.NATIVE_INT32, space, dcpl=dcpl)
        for row in (0, 4):  # as another machine with blosc wrote them: filter mask 0 = applied
            dsid.write_direct_chunk((row, 0), b"\x02\x01\x21\x04" + b"\x00" * 28, filter_mask=0)


def test_hdf5_filter_not_available_fails_at_from_arrays_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "blosc.h5"
    _h5_with_unavailable_filter(path)
    with h5py.File(path, "r") as f, pytest.raises(OSError):
        f["x"][:]  # h5py itself fails only when reading
    match = r"filter 32001 \(blosc\), which this HDF5 installation cannot decode.*hdf5plugin"
    with pytest.raises(af.SourceUnavailableError, match=match) as info:
        af.from_arrays(str(path), batch_size=2)
    assert f"'{path}:/x'" in str(info.value) and isinstance(info.value, OSError)
    with h5py.File(path, "r") as f, pytest.raises(af.SourceUnavailableError, match=match):
        af.from_arrays({"meta": f["x"]}, batch_size=2)


def test_available_filters_are_accepted(tmp_path: Path) -> None:
    a = _rows(dtype="float32")
    with h5py.File(tmp_path / "ok.h5", "w") as f:
        f.create_dataset("x", data=a, chunks=(5, 3), compression="gzip", shuffle=True)
        f.create_dataset("y", data=a, chunks=(5, 3), compression="lzf", fletcher32=True)
    _assert_feeds_exactly(af.open_array(tmp_path / "ok.h5", "x"), a)
    _assert_feeds_exactly(af.open_array(tmp_path / "ok.h5", "y"), a)


# -- HDF5: a file held open by a writer ---------------------------------------------------------
WRITER = textwrap.dedent(
    """
    import sys, h5py
    f = h5py.File(sys.argv[1], "a", libver="latest")
    if sys.argv[2] == "swmr":
        f.swmr_mode = True
    print("ready", flush=True)
    sys.stdin.read()  # hold the file open until the test closes our stdin
    """
)


def _writer(path: Path, mode: str) -> Iterator[None]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_hdf5_locked_by_a_writer_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "busy.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f["x"] = _rows()
    for _ in _writer(path, "plain"):
        with pytest.raises(af.SourceUnavailableError, match="locked by another process") as info:
            af.from_arrays(str(path), batch_size=4)
        assert f"'{path}'" in str(info.value) and "SWMR" in str(info.value)
    _assert_feeds_exactly(af.open_array(path), _rows())  # the writer is gone: readable again


@pytest.mark.slow
def test_hdf5_with_a_swmr_writer_is_read_through_swmr(tmp_path: Path) -> None:
    path = tmp_path / "swmr.h5"
    a = _rows()
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("x", data=a, chunks=(8, 3), maxshape=(None, 3))
    for _ in _writer(path, "swmr"):
        source = af.open_array(path, "x")
        assert source.dataset.file.swmr_mode  # type: ignore[attr-defined]
        _assert_feeds_exactly(source, a)


# -- Zarr: lost and corrupted chunks ------------------------------------------------------------
def _zarr_store(
    root: Path, a: np.ndarray, *, marked: str | None, key: str = "x", write_empty: bool = True
) -> Path:
    group = zarr.open_group(root, mode="w")
    if marked == "group":
        group.attrs["arrayfeed"] = {"complete": True, "format": 1}
    z = group.create_array(
        key, shape=a.shape, dtype=a.dtype, chunks=(5, 3), config={"write_empty_chunks": write_empty}
    )
    z[...] = a
    if marked == "array":
        z.attrs["arrayfeed"] = {"complete": True}
    return root / key


def _ids(n: int = N) -> np.ndarray:
    return np.arange(n)


@pytest.mark.parametrize("marked", ["group", "array"])
@pytest.mark.parametrize("opened_by", ["open_array", "zarr.Array"])
def test_zarr_store_marked_complete_that_lost_a_chunk_names_it(
    tmp_path: Path, marked: str, opened_by: str
) -> None:
    a = _rows() + 1000  # no zeros: a fill value could never pass as data
    array_dir = _zarr_store(tmp_path / "s.zarr", a, marked=marked)
    (array_dir / "c" / "3" / "0").unlink()  # rows 15..19
    if opened_by == "open_array":
        leaf: Any = af.open_array(tmp_path / "s.zarr", "x")
    else:
        leaf = zarr.open_array(array_dir, mode="r")
    ds = af.from_arrays(leaf, _ids(), batch_size=4, seed=0)
    message = _iteration_error(ds)
    assert "chunk (3, 0) (key 'c/3/0') of Zarr array" in message and "is missing" in message
    source = leaf if isinstance(leaf, ZarrSource) else ZarrSource(leaf)
    assert source.strict
    with pytest.raises(af.CorruptDataError, match=r"chunk \(3, 0\)"):
        source.read(np.array([1, 16], dtype=np.int64))
    np.testing.assert_array_equal(source.read(np.arange(15, dtype=np.int64)), a[:15])


def test_zarr_marker_on_a_parent_group_covers_nested_arrays(tmp_path: Path) -> None:
    a = _rows()
    root = zarr.open_group(tmp_path / "n.zarr", mode="w")
    root.attrs["arrayfeed"] = {"complete": True}
    z = root.create_group("train").create_array(
        "x", shape=a.shape, dtype=a.dtype, chunks=(5, 3), config={"write_empty_chunks": True}
    )
    z[...] = a
    shutil.rmtree(tmp_path / "n.zarr" / "train" / "x" / "c" / "8")
    source = af.open_array(tmp_path / "n.zarr", "train/x")
    with pytest.raises(af.CorruptDataError, match=r"chunk \(8, 0\) \(key 'c/8/0'\)"):
        source.read(np.array([40], dtype=np.int64))


def test_foreign_zarr_missing_chunk_follows_zarr_unless_strict(tmp_path: Path) -> None:
    a = _rows()
    a[10:15] = 0  # an all-fill chunk, which Zarr legitimately does not store
    array_dir = _zarr_store(tmp_path / "f.zarr", a, marked=None, write_empty=False)
    assert not (array_dir / "c" / "2" / "0").exists()
    # Default: Zarr's semantics, the omitted chunk reads as its fill value — the right values.
    _assert_feeds_exactly(af.open_array(tmp_path / "f.zarr", "x"), a)
    _assert_feeds_exactly(zarr.open_array(array_dir, mode="r"), a)
    # strict=True: a missing chunk is an error, for stores known to be complete.
    strict = af.open_array(tmp_path / "f.zarr", "x", strict=True)
    message = _iteration_error(af.from_arrays(strict, _ids(), batch_size=4, seed=0))
    assert "chunk (2, 0) (key 'c/2/0') of Zarr array" in message
    assert str(tmp_path / "f.zarr") in message


@pytest.mark.parametrize("damage", ["overwritten", "truncated", "emptied"])
@pytest.mark.parametrize("marked", ["group", None])
def test_corrupted_zarr_chunk_names_the_chunk(
    tmp_path: Path, damage: str, marked: str | None
) -> None:
    a = _rows()
    array_dir = _zarr_store(tmp_path / "c.zarr", a, marked=marked)
    chunk = array_dir / "c" / "5" / "0"
    data = bytearray(chunk.read_bytes())
    if damage == "overwritten":
        data[4:12] = b"\xde\xad\xbe\xef" * 2
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data = bytearray()
    chunk.write_bytes(bytes(data))
    source = af.open_array(tmp_path / "c.zarr", "x")
    message = _iteration_error(af.from_arrays(source, _ids(), batch_size=6, seed=1))
    assert "chunk (5, 0) (key 'c/5/0') of Zarr array" in message
    assert "cannot be read" in message and "CorruptDataError" in message
    with pytest.raises(af.CorruptDataError, match=r"chunk \(5, 0\)") as info:
        source.read(np.arange(20, 30, dtype=np.int64))
    assert str(tmp_path / "c.zarr") in str(info.value)


# -- files replaced or truncated between epochs -------------------------------------------------
def _replace_file(path: Path, a: np.ndarray, writer: Callable[[Path, np.ndarray], None]) -> None:
    tmp = path.with_name("new-" + path.name)
    writer(tmp, a)
    os.replace(tmp, path)


def _save_h5(path: Path, a: np.ndarray) -> None:
    with h5py.File(path, "w") as f:
        f["x"] = a


CHANGES: dict[str, tuple[Callable[[Path, np.ndarray], object], Callable[[Path], None], str]] = {
    "npy_truncated": (
        lambda t, a: (np.save(t / "a.npy", a), str(t / "a.npy"))[1],
        lambda t: os.truncate(t / "a.npy", 200),
        "its size went from",
    ),
    "npy_replaced_same_size": (
        lambda t, a: (np.save(t / "a.npy", a), str(t / "a.npy"))[1],
        lambda t: _replace_file(t / "a.npy", np.load(t / "a.npy")[::-1], np.save),
        "replaced by another file",
    ),
    "memmap_truncated": (
        lambda t, a: (np.save(t / "a.npy", a), np.load(t / "a.npy", mmap_mode="r"))[1],
        lambda t: os.truncate(t / "a.npy", 200),
        "its size went from",
    ),
    "npy_rewritten_in_place": (
        lambda t, a: (np.save(t / "a.npy", a), str(t / "a.npy"))[1],
        lambda t: _rewrite_in_place(t / "a.npy"),
        "it was modified",
    ),
    "hdf5_path_replaced": (
        lambda t, a: (_save_h5(t / "a.h5", a), str(t / "a.h5"))[1],
        lambda t: _replace_file(t / "a.h5", np.zeros((N, 3)), _save_h5),
        "replaced by another file",
    ),
    "h5py_dataset_replaced": (
        lambda t, a: (_save_h5(t / "a.h5", a), h5py.File(t / "a.h5", "r")["x"])[1],
        lambda t: _replace_file(t / "a.h5", np.zeros((N, 3)), _save_h5),
        "replaced by another file",
    ),
    "zarr_store_replaced": (
        lambda t, a: (_zarr_store(t / "z.zarr", a, marked=None), af.open_array(t / "z.zarr"))[1],
        lambda t: _replace_zarr(t / "z.zarr"),
        "replaced by another file",
    ),
}


def _rewrite_in_place(path: Path) -> None:
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(np.float64(12345.0).tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))


def _replace_zarr(root: Path) -> None:
    _zarr_store(root.with_name("new.zarr"), np.zeros((N, 3)), marked=None)
    shutil.rmtree(root)
    os.rename(root.with_name("new.zarr"), root)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_source_changed_between_epochs_is_detected_at_the_next_epoch(
    tmp_path: Path, change: str
) -> None:
    make, mutate, match = CHANGES[change]
    a = _rows()
    ds = af.from_arrays(make(tmp_path, a), _ids(), batch_size=8, seed=2)
    for xb, yb in ds:  # the first epoch reads the original data, exactly
        np.testing.assert_array_equal(xb.numpy(), a[yb.numpy()])
    mutate(tmp_path)
    message = _iteration_error(ds)
    assert "CorruptDataError" in message and "changed since arrayfeed opened it" in message
    assert match in message and str(tmp_path) in message


def test_unchanged_sources_pass_the_epoch_check_every_epoch(tmp_path: Path) -> None:
    a = _rows()
    leaves = {
        name: make(tmp_path, a)
        for name, (make, _, _) in CHANGES.items()
        if name in ("npy_truncated", "hdf5_path_replaced", "zarr_store_replaced")
    }
    ds = af.from_arrays(leaves, _ids(), batch_size=8, seed=2)
    for _ in range(3):
        for xb, yb in ds:
            for leaf in xb.values():
                np.testing.assert_array_equal(leaf.numpy(), a[yb.numpy()])


# -- map_batch misbehaving ----------------------------------------------------------------------
def _flaky(after: int, bad: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A map_batch that behaves for ``after`` calls (the probe is call 1), then returns ``bad``."""
    calls = {"n": 0}
    lock = threading.Lock()

    def fn(batch: Any) -> Any:
        with lock:
            calls["n"] += 1
            n = calls["n"]
        return bad(batch) if n > after else batch

    return fn


def _boom(batch: Any) -> Any:
    raise KeyError("label 'cat' missing from the vocabulary")


MAP_FAULTS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "raises": (_boom, r"`map_batch` raised KeyError: \"label 'cat' missing from the vocabulary\""),
    "fewer_rows": (lambda b: (b[0][:2], b[1][:2]), r"has shape \(2, 3\), but the batch has 6 rows"),
    "other_dtype": (lambda b: (b[0].astype(np.float32), b[1]), "same row shapes and dtypes"),
    "other_row_shape": (lambda b: (b[0][:, :2], b[1]), "same row shapes and dtypes"),
    "other_structure": (lambda b: {"x": b[0], "y": b[1]}, "must return the same structure"),
    "fewer_leaves": (lambda b: b[0], "must return the same structure"),
    "not_an_array": (lambda b: (b[0], "label"), "map_batch"),
}


@pytest.mark.parametrize("fault", sorted(MAP_FAULTS))
def test_map_batch_that_goes_wrong_later_is_named_during_iteration(fault: str) -> None:
    bad, match = MAP_FAULTS[fault]
    ds = af.from_arrays(
        _rows(), _ids(), batch_size=6, seed=0, num_threads=1, map_batch=_flaky(3, bad)
    )
    message = _iteration_error(ds)
    assert "MapBatchError" in message
    assert re.search(match, message), message


@pytest.mark.parametrize("fault", ["raises", "fewer_rows", "not_an_array"])
def test_map_batch_that_goes_wrong_at_once_fails_from_arrays(fault: str) -> None:
    bad, match = MAP_FAULTS[fault]
    match = match.replace("KeyError:", "KeyError on a first batch of 6 rows:")
    with pytest.raises(af.MapBatchError, match=match):
        af.from_arrays(_rows(), _ids(), batch_size=6, seed=0, map_batch=bad)


# -- sizes: workers, threads, batches -----------------------------------------------------------
def test_more_workers_than_rows_is_refused() -> None:
    with pytest.raises(af.ConfigError, match=r"more workers \(5\) than rows \(3\)"):
        af.from_arrays(np.arange(3), batch_size=1, shard=af.Shard(5, 4))


def test_more_reader_threads_than_rows_and_batches() -> None:
    a = _rows(3)
    _assert_feeds_exactly(a, a, num_threads=16)
    ds = af.from_arrays(a, batch_size=1, shuffle=False, num_threads=16)
    assert np.array_equal(np.concatenate([b.numpy() for b in ds]), a)
    # The pass read the next epoch ahead (a short one): its threads end once that is read.
    deadline = time.monotonic() + 10
    while [t for t in threading.enumerate() if t.name.startswith("arrayfeed-read")]:
        assert time.monotonic() < deadline, "reader threads left running"
        time.sleep(0.005)


def test_one_row() -> None:
    a = _rows(1)
    for shuffle in (True, False):
        ds = af.from_arrays(a, batch_size=32, shuffle=shuffle, drop_remainder=False)
        assert len(ds) == 1 and np.array_equal(next(iter(ds)).numpy(), a)


def test_batch_larger_than_shard_with_drop_remainder_is_refused() -> None:
    match = (
        r"`batch_size` \(40\) is larger than shard 2 of 3, which has 34 rows per epoch, and "
        r"`drop_remainder=True` leaves no batch"
    )
    with pytest.raises(af.ConfigError, match=match):
        af.from_arrays(np.arange(103), batch_size=40, shard=af.Shard(3, 2), drop_remainder=True)
    ds = af.from_arrays(np.arange(103), batch_size=40, shard=af.Shard(3, 2), seed=0)
    (only,) = [b.numpy() for b in ds]  # without drop_remainder: one short batch
    assert sorted(only.tolist()) == sorted(set(only.tolist())) and len(only) == 34
    assert set(only.tolist()) <= set(range(*shard_bounds(103, af.Shard(3, 2))))


def test_batch_equal_to_rows_with_drop_remainder_is_one_batch() -> None:
    ds = af.from_arrays(np.arange(24), batch_size=24, drop_remainder=True, seed=1)
    (only,) = [b.numpy() for b in ds]
    assert sorted(only.tolist()) == list(range(24))


# -- row counts above 2**31 ---------------------------------------------------------------------
class RowIds:
    """A virtual source of ``n`` rows whose row ``i`` holds ``i`` (no storage at all)."""

    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n,)

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.int64)

    def __len__(self) -> int:
        return self.n

    def read(self, indices: np.ndarray) -> np.ndarray:
        assert indices.dtype == np.int64 and (indices >= 0).all() and (indices < self.n).all()
        return indices.copy()


@pytest.mark.parametrize("shuffle", [True, False])
def test_more_than_2_to_the_31_rows_end_to_end(shuffle: bool) -> None:
    n = 2**32 + 2**20 + 5
    shard = af.Shard(3, 2)
    probe = af.from_arrays(RowIds(n), batch_size=2**16, shard=shard, seed=8, shuffle=shuffle)
    steps = len(probe)
    ds = af.from_arrays(
        RowIds(n),
        batch_size=2**16,
        shard=shard,
        seed=8,
        shuffle=shuffle,
        start_epoch=2**40,
        start_step=steps - 2,
    )
    last_two = [b.numpy() for b in ds]
    plan = Plan(
        n_rows=n, batch_size=2**16, shard=shard, seed=8, shuffle="full" if shuffle else "none"
    )
    expected = plan.indices(2**40, steps - 2, steps)
    np.testing.assert_array_equal(np.concatenate(last_two), expected)
    start, stop = shard_bounds(n, shard)
    assert start > 2**31 and (expected >= start).all() and (expected < stop).all()
    assert len(np.unique(expected)) == len(expected)
    assert len(last_two[-1]) == plan.rows_per_epoch - (steps - 1) * 2**16


def test_planner_index_arithmetic_near_2_to_the_62() -> None:
    n = 2**62 - 7
    for count in (1, 3, 1024):
        k = count - 1
        plan = Plan(n_rows=n, batch_size=4096, shard=af.Shard(count, k), seed=123)
        start, stop = plan.bounds
        assert (start, stop) == (n * k // count, n * (k + 1) // count)  # exact, no float
        last = plan.steps - 1
        for step in (0, plan.steps // 2, last):
            idx = plan.indices(7, step)
            assert idx.dtype == np.int64 and len(np.unique(idx)) == len(idx)
            assert (idx >= start).all() and (idx < stop).all()
        assert len(plan.indices(7, last)) == plan.batch_rows(last)
