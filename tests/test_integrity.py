"""Integrity checks in isolation: fingerprints, strict Zarr stores, HDF5 filters and markers.

End-to-end behaviour (through ``from_arrays``) is in ``test_torture.py``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed._storage import Verifiable, verify_sources
from arrayfeed._storage.fingerprint import Fingerprint, memmap_fingerprint
from arrayfeed._storage.hdf5.files import check_filters as check_h5_filters
from arrayfeed._storage.hdf5.files import h5_fingerprint
from arrayfeed._storage.hdf5.source import H5Source
from arrayfeed._storage.npy.files import NpySource
from arrayfeed._storage.npy.memory import ArraySource
from arrayfeed._storage.zarr.source import ZarrSource
from arrayfeed._storage.zarr.strict import StrictStore, zarr_marked_complete


def test_fingerprint_changes(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    fp = Fingerprint.of(path)
    assert fp is not None and fp.changes() == []
    fp.check("f")
    os.utime(path, ns=(0, fp.mtime_ns + 1000))
    assert fp.changes() == ["it was modified"]
    path.write_bytes(b"01234")
    assert fp.changes() == ["its size went from 10 to 5 bytes"]
    other = tmp_path / "g.bin"
    other.write_bytes(b"0123456789")
    os.replace(other, path)
    assert fp.changes()[0] == "it was replaced by another file"
    path.unlink()
    assert fp.changes() == ["it no longer exists"]
    with pytest.raises(af.CorruptDataError, match=r"'.*f\.bin' \(source `x`\) changed"):
        fp.check("x")
    assert Fingerprint.of(tmp_path / "missing") is None


def test_mutable_fingerprint_only_notices_replacement(tmp_path: Path) -> None:
    path = tmp_path / "grow.bin"
    path.write_bytes(b"abc")
    fp = Fingerprint.of(path, mutable=True)
    assert fp is not None
    path.write_bytes(b"abcdef")  # appended to in place: allowed
    assert fp.changes() == []
    other = tmp_path / "new.bin"
    other.write_bytes(b"abc")
    os.replace(other, path)
    assert fp.changes() == ["it was replaced by another file"]


def test_every_file_backed_source_is_verifiable(tmp_path: Path) -> None:
    a = np.arange(12.0).reshape(6, 2)
    np.save(tmp_path / "a.npy", a)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = a
    zarr.create_array(tmp_path / "a.zarr", shape=a.shape, dtype=a.dtype)[...] = a
    sources = [
        af.open_array(tmp_path / "a.npy"),
        af.open_array(tmp_path / "a.h5"),
        af.open_array(tmp_path / "a.zarr"),
        ArraySource(np.load(tmp_path / "a.npy", mmap_mode="r")),
    ]
    for source in sources:
        assert isinstance(source, Verifiable)
        assert source.fingerprint is not None  # type: ignore[attr-defined]
    verify_sources(sources)
    assert ArraySource(a).fingerprint is None and memmap_fingerprint(a) is None
    in_memory = h5py.File("mem.h5", "w", driver="core", backing_store=False)
    in_memory["x"] = a
    assert h5_fingerprint(in_memory["x"]) is None


def test_fingerprints_travel_with_pickled_sources(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(6.0))
    source = af.open_array(tmp_path / "a.npy")
    clone = pickle.loads(pickle.dumps(source))
    assert isinstance(clone, NpySource) and clone.fingerprint == source.fingerprint
    os.truncate(tmp_path / "a.npy", 100)
    with pytest.raises(af.CorruptDataError, match="its size went from 176 to 100 bytes"):
        clone.verify()


def test_h5_fingerprint_is_of_the_open_file_not_the_path(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(4)
    handle = h5py.File(tmp_path / "a.h5", "r")
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.arange(4) * 2
    os.replace(tmp_path / "b.h5", tmp_path / "a.h5")  # before the source is even created
    source = H5Source(handle["x"])
    with pytest.raises(af.CorruptDataError, match="replaced by another file"):
        source.verify()


def test_h5_filter_check_accepts_builtin_filters(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        d = f.create_dataset("x", data=np.arange(100), chunks=(10,), compression="gzip")
        check_h5_filters(d, "a.h5:/x")


def test_marker_detection(tmp_path: Path) -> None:
    root = zarr.open_group(tmp_path / "m.zarr", mode="w")
    plain = root.create_array("plain", shape=(4,), dtype="i4")
    assert not zarr_marked_complete(plain)
    plain.attrs["arrayfeed"] = {"complete": False}
    assert not zarr_marked_complete(plain)
    plain.attrs["arrayfeed"] = {"complete": True}
    assert zarr_marked_complete(plain)
    root.attrs["arrayfeed"] = {"complete": True}
    deep = root.create_group("a").create_group("b").create_array("x", shape=(4,), dtype="i4")
    assert zarr_marked_complete(deep)
    assert zarr_marked_complete(zarr.open_array(tmp_path / "m.zarr" / "a" / "b" / "x", mode="r"))
    lone = zarr.create_array(tmp_path / "lone.zarr", shape=(4,), dtype="i4")
    assert not zarr_marked_complete(lone)


def test_strict_zarr_source_pickles_and_stays_strict(tmp_path: Path) -> None:
    z = zarr.create_array(tmp_path / "s.zarr", shape=(10,), dtype="f8", chunks=(5,))
    z[...] = np.arange(10.0) + 1
    (tmp_path / "s.zarr" / "c" / "1").unlink()
    source = af.open_array(tmp_path / "s.zarr", strict=True)
    assert isinstance(source, ZarrSource) and isinstance(source.array.store, StrictStore)
    clone = pickle.loads(pickle.dumps(source))
    with pytest.raises(af.CorruptDataError, match=r"chunk \(1,\) \(key 'c/1'\)"):
        clone.read(np.array([7], dtype=np.int64))
    np.testing.assert_array_equal(clone.read(np.arange(5, dtype=np.int64)), np.arange(5.0) + 1)
    lenient = af.open_array(tmp_path / "s.zarr")
    np.testing.assert_array_equal(lenient.read(np.array([7], dtype=np.int64)), [0.0])


def test_an_hdf5_read_error_through_h5py_names_file_dataset_and_chunk(tmp_path: Path) -> None:
    """Datasets read through h5py (here: a writable handle, which the raw-chunk reader leaves
    to h5py) turn h5py's bare OSError into a CorruptDataError naming what failed."""
    path = tmp_path / "g.h5"
    data = np.random.default_rng(0).integers(0, 1000, (4000, 16)).astype(np.int32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(500, 16), compression="gzip")
    with h5py.File(path, "r") as f:
        info = f["x"].id.get_chunk_info(3)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 4)
        fh.write(b"\xff" * 64)
    f = h5py.File(path, "r+")
    try:
        source = H5Source(f["x"])
        assert source.read_path.startswith("h5py")
        with pytest.raises(
            af.CorruptDataError,
            match=r"rows 1500\.\.1999 \(row chunk 3\) of HDF5 dataset '.*g\.h5:/x'",
        ):
            source.read(np.arange(1500, 2000, dtype=np.int64))
        out = np.empty((1000, 16), np.int32)
        with pytest.raises(af.CorruptDataError, match=r"row chunks 2\.\.3"):
            source.read_range_into(1000, 2000, out)
        np.testing.assert_array_equal(source.read(np.arange(0, 500, dtype=np.int64)), data[:500])
    finally:
        f.close()
