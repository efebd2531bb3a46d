"""The format registry: one backend per format family, asked in order by the entry points.

A toy format (a text file of numbers, ``.rows``) registered here the way a format subpackage
registers its backend shows what a new format takes: the entry points open it, list it, describe
it and split its ``file.rows:key`` specs without a change, and it passes the conformance suite.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed._storage import as_source, describe, is_array_like, registry, split_spec
from arrayfeed._storage.npy.memory import ArraySource
from arrayfeed.storage import ArrayLayout, Backend, Location, OpenOptions, StoreInfo
from arrayfeed.testing import SourceTests

STORAGE = Path(registry.__file__).parent


class RowsBackend(Backend):
    """Text files of integers, one row per line (``np.savetxt``), read whole into memory."""

    name = "rows"
    label = "rows"
    order = 45
    suffixes = frozenset({".rows"})

    def open(self, location: Location, key: str | None, options: OpenOptions) -> Any:
        assert isinstance(location, Path)
        return ArraySource(np.loadtxt(location, ndmin=2, dtype=np.int64), name=str(location))

    def describe(self, location: Location) -> StoreInfo:
        source = self.open(location, None, OpenOptions())
        layout = ArrayLayout(name="", shape=source.shape, dtype=source.dtype, chunks=None)
        return StoreInfo(format="rows", arrays=(layout,), specs={"": str(location)})


@pytest.fixture
def rows_format() -> Iterator[None]:
    registry.register(RowsBackend())
    try:
        yield
    finally:
        registry.unregister("rows")


def test_every_format_subpackage_registers_one_backend_in_order() -> None:
    families = {
        info.name
        for info in pkgutil.iter_modules([str(STORAGE)])
        if info.ispkg and info.name != "remote"  # object storage, used by every format
    }
    names = [b.name for b in registry.backends()]
    assert sorted(names) == sorted(families)
    assert names == ["sparse", "zarr", "hdf5", "lazy", "npy"]
    for name in families:
        package = importlib.import_module(f"arrayfeed._storage.{name}")
        assert package.__doc__  # says what is in it


def test_a_new_format_is_one_backend(rows_format: None, tmp_path: Path) -> None:
    data = np.arange(12).reshape(4, 3)
    np.savetxt(tmp_path / "t.rows", data, fmt="%d")
    assert split_spec(f"{tmp_path}/t.rows:x") == (f"{tmp_path}/t.rows", "x")
    source = af.open_array(tmp_path / "t.rows")
    np.testing.assert_array_equal(source.read(np.arange(4, dtype=np.int64)), data)
    assert describe(tmp_path / "t.rows").format == "rows"
    batch = next(iter(af.batches(str(tmp_path / "t.rows"), batch_size=4, shuffle=False)))
    np.testing.assert_array_equal(batch, data)


def test_without_its_backend_the_format_is_unknown(tmp_path: Path) -> None:
    np.savetxt(tmp_path / "t.rows", np.zeros((2, 2)))
    with pytest.raises(af.SourceNotFoundError, match=r"is not a \.npy, \.npz, HDF5 file or Zarr"):
        af.open_array(tmp_path / "t.rows")


_IMPORTS_SCRIPT = """
import json, pickle, sys
import numpy as np
root = sys.argv[1]
np.save(f"{root}/x.npy", np.arange(60, dtype=np.float32).reshape(20, 3))
import arrayfeed as af
import arrayfeed._pipeline.loader.server  # what a loader process imports to start
seen = {"import": sorted(m for m in HEAVY if m in sys.modules)}
source = pickle.loads(pickle.dumps(af.open_array(f"{root}/x.npy")))  # as a loader receives it
rows = sum(len(b) for b in af.batches(f"{root}/x.npy", batch_size=8, seed=0, processes=0))
memmap = np.load(f"{root}/x.npy", mmap_mode="r")
rows += sum(len(y) for _, y in af.batches(memmap, np.arange(20), batch_size=8, processes=0))
seen["read"] = sorted(m for m in HEAVY if m in sys.modules)
seen["formats"] = [b.name for b in af._storage.registry.backends()]
import h5py, zarr
h5py.File(f"{root}/d.h5", "w")["x"] = np.zeros(3)
zarr.create_array(f"{root}/z.zarr", shape=(3,), dtype="i4")
seen["recognised"] = [
    type(af._storage.as_source(h5py.File(f"{root}/d.h5")["x"], "d")).__name__,
    type(af._storage.as_source(zarr.open_array(f"{root}/z.zarr"), "z")).__name__,
]
print(json.dumps({**seen, "rows": rows}))
"""


def test_reading_npy_imports_no_format_library(tmp_path: Path) -> None:
    """``import arrayfeed``, a loader's start and reading an ``.npy`` file (by name, or a memory
    map) import neither h5py, zarr nor fsspec (every backend is registered, each imports its
    library when first used); objects of those libraries are still recognised once their user
    imports them."""
    heavy = ("h5py", "zarr", "numcodecs", "fsspec", "scipy", "dask", "tensorflow")
    script = f"HEAVY = {heavy!r}\n" + textwrap.dedent(_IMPORTS_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {
        "import": [],
        "read": [],
        "formats": ["sparse", "zarr", "hdf5", "lazy", "npy"],
        "recognised": ["H5ContiguousSource", "ZarrSource"],
        "rows": 40,
    }


class TestRowsSource(SourceTests):
    """What a new format's test module holds: the conformance suite over its sources."""

    dtypes = ("int64",)
    row_shapes = ((3,),)

    @pytest.fixture(autouse=True)
    def _registered(self, rows_format: None) -> None:
        pass

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Any:
        np.savetxt(tmp_path / "t.rows", data, fmt="%d")
        return af.open_array(tmp_path / "t.rows")


def test_anndata_elements_come_before_the_arrays_they_are_stored_as(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "m.h5ad", "w") as f:
        group = f.create_group("X")
        group.attrs.update({"encoding-type": "csr_matrix", "shape": [3, 4]})
        group["data"] = np.array([1.0, 2.0])
        group["indices"] = np.array([0, 3], dtype=np.int32)
        group["indptr"] = np.array([0, 1, 1, 2], dtype=np.int64)
    dense = af.open_array(tmp_path / "m.h5ad", "X").read(np.arange(3, dtype=np.int64))
    np.testing.assert_array_equal(dense, [[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 2]])
    assert af.open_array(tmp_path / "m.h5ad", "X/data").shape == (2,)  # a plain array


def test_objects_go_to_their_family_and_anything_else_to_numpy(tmp_path: Path) -> None:
    z = zarr.create_array(tmp_path / "z.zarr", shape=(3,), dtype="i4")
    assert type(as_source(z, "z")).__name__ == "ZarrSource"
    assert type(as_source([1, 2, 3], "l")) is ArraySource
    assert is_array_like(z) and is_array_like(np.zeros(2)) and not is_array_like([1, 2])


def test_an_unknown_writer_format_is_named() -> None:
    with pytest.raises(af.ConfigError, match=r"unknown store format 'tiff'; use 'hdf5' or 'zarr'"):
        registry.writer_backend("tiff")
