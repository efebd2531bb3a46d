"""The HDF5 family's backend: files (``.h5``, ``.h5ad``, netCDF4 …) on disk and behind URLs,
``h5py`` datasets, and the files ``convert`` writes."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py

from ..._errors import ConfigError
from ..base import Source
from ..layout import SparseLayout, StoredArrays, StoreInfo, Writer
from ..record import ConversionRecord
from ..registry import Arrays, Backend, Location, OpenOptions
from ..remote.paths import RemotePath
from .describe import dataset_names, describe
from .files import SIGNATURE, SUFFIXES, is_hdf5, read_record
from .remote import RemoteH5Source, open_remote_h5
from .source import h5_source, open_hdf5
from .write import H5Writer, open_written

__all__ = ["Hdf5Backend"]


class Hdf5Backend(Backend):
    """HDF5 files, local (read and written) or behind URLs (read-only)."""

    name = "hdf5"
    label = "HDF5"
    order = 30  # after Zarr: a URL is looked at for Zarr metadata first
    suffixes = SUFFIXES
    reads_fields = True
    writes = True

    def detects(self, location: Location) -> bool:
        if not isinstance(location, RemotePath):
            return is_hdf5(location)
        fs, path = location.filesystem()
        with fs.open(path, "rb") as f:
            return bool(f.read(len(SIGNATURE)) == SIGNATURE)

    def recognises(self, obj: Any) -> bool:
        return isinstance(obj, h5py.Dataset)

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        return h5_source(obj) if isinstance(obj, h5py.Dataset) else None

    def open(self, location: Location, key: str | None, options: OpenOptions) -> Source:
        if isinstance(location, RemotePath):
            return RemoteH5Source.open(location, key, options.field)
        return open_hdf5(location, key, options.field, decode_cf=options.decode_cf)

    def array_keys(self, location: Location) -> list[str] | None:
        if not isinstance(location, RemotePath):
            return dataset_names(location)
        with open_remote_h5(location) as f:
            names: list[str] = []
            f.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) else None)
            return names

    def describe(self, location: Location) -> StoreInfo:
        if not isinstance(location, RemotePath):
            return describe(location)
        with open_remote_h5(location) as f:
            return describe(location, f)

    def is_group(self, obj: Any) -> bool:
        return isinstance(obj, h5py.Group)

    def read_record(self, store: Location | Any) -> ConversionRecord | None:
        if isinstance(store, RemotePath):
            with open_remote_h5(store) as f:
                return read_record(f)
        if isinstance(store, Path) and not is_hdf5(store):
            return None  # named like HDF5, but not: no record
        return read_record(store)

    def create_writer(
        self,
        path: Location,
        arrays: Arrays,
        chunk_rows: int | None,
        compression: str,
        sparse: Mapping[str, SparseLayout] | None,
    ) -> Writer:
        if isinstance(path, RemotePath):
            raise ConfigError(
                f"`output` '{path}' is on object storage, where arrayfeed writes Zarr stores "
                "only (an HDF5 file cannot be written in place there); end it in .zarr."
            )
        return H5Writer(path, arrays, chunk_rows, compression, sparse)

    def open_written(
        self,
        path: Location,
        names: list[str],
        groups: list[str] | None,
        *,
        count_chunks: bool,
    ) -> contextlib.AbstractContextManager[StoredArrays]:
        assert isinstance(path, Path)
        return open_written(path, names, groups)
