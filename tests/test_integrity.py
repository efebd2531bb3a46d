"""File fingerprints in isolation: a file replaced, truncated or changed under any source.

Each family's own checks (HDF5 filters and read errors, Zarr's strict stores and completeness
marker) are in its test module; end-to-end behaviour (through ``from_arrays``) is in
``test_torture.py``.
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
from arrayfeed._storage.hdf5.files import h5_fingerprint
from arrayfeed._storage.npy.files import NpySource
from arrayfeed._storage.npy.memory import ArraySource


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
