"""The conformance suite of :mod:`arrayfeed.testing` itself, and the pipeline's own sources.

Every storage backend runs :class:`~arrayfeed.testing.SourceTests` in its family's test module
(``test_npy.py``, ``test_hdf5.py``, ``test_zarr.py``, ``test_sparse.py``, ``test_remote.py`` …):
each class there writes real files under ``tmp_path`` the way other tools write them and opens
them through the public entry points. Here: the sources the pipeline wraps around storage
(the window cache of ``shuffle="block"``, resident leaves), and the suite's own contract.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.read.blocks import WindowCache
from arrayfeed._pipeline.read.resident import Resident
from arrayfeed._storage import Source
from arrayfeed._storage.hdf5.source import H5Source
from arrayfeed.testing import SourceTests


# -- wrappers --------------------------------------------------------------------------------------
class TestWindowCache(SourceTests):
    """A chunked HDF5 source behind the window cache of ``shuffle="block"``."""

    picklable = False
    not_picklable_because = "a WindowCache serves one epoch in one process (it holds a lock)"

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        with h5py.File(tmp_path / "data.h5", "w") as f:
            f.create_dataset("x", data=data, chunks=(16, *data.shape[1:]), compression="gzip")
        inner = af.open_array(tmp_path / "data.h5")
        assert type(inner) is H5Source
        plan = Plan(
            n_rows=len(inner),
            batch_size=10,
            shuffle="block",
            seed=1,
            block_rows=16,
            window_blocks=2,
        )
        return WindowCache(inner, plan.block_order(0), capacity=1)


class TestResident(SourceTests):
    """A small chunked HDF5 leaf held in memory by the feed (read whole on first use)."""

    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        with h5py.File(tmp_path / "data.h5", "w") as f:
            f.create_dataset("x", data=data, chunks=(16, *data.shape[1:]), compression="gzip")
        inner = af.open_array(tmp_path / "data.h5")
        assert type(inner) is H5Source
        return Resident(inner)


def test_a_backend_must_implement_make_source() -> None:
    with pytest.raises(NotImplementedError, match="must implement `make_source`"):
        SourceTests().make_source(np.zeros(3), Path("."))
