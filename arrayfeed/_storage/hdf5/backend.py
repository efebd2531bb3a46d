"""The HDF5 family's backend: files (``.h5``, ``.h5ad``, netCDF4 …) on disk and behind URLs,
``h5py`` datasets, and the files ``convert`` writes.

Imported whenever the registry is (as every backend is), so it imports h5py and the family's
modules only in the methods that use them, as xarray's backend entry points do: reading a
``.npy`` file, or starting a loader process for one, never pays for h5py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..._errors import ConfigError
from ..base import Source
from ..layout import SparseLayout, StoredArrays, StoreInfo, Writer
from ..record import ConversionRecord
from ..registry import Arrays, Backend, Location, OpenOptions, loaded
from ..remote.paths import RemotePath

__all__ = ["SIGNATURE", "SUFFIXES", "Hdf5Backend"]

#: File name suffixes taken as HDF5 without looking inside.
SUFFIXES = frozenset({".h5", ".hdf5", ".he5", ".hdf", ".h5ad", ".nc", ".nc4"})
#: The first bytes of every HDF5 file (without a user block).
SIGNATURE = b"\x89HDF\r\n\x1a\n"


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
            from .files import is_hdf5

            return is_hdf5(location)
        fs, path = location.filesystem()
        with fs.open(path, "rb") as f:
            return bool(f.read(len(SIGNATURE)) == SIGNATURE)

    def recognises(self, obj: Any) -> bool:
        h5py = loaded("h5py")
        return h5py is not None and isinstance(obj, h5py.Dataset)

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        if not self.recognises(obj):
            return None
        from .source import h5_source

        return h5_source(obj)

    def open(self, location: Location, key: str | None, options: OpenOptions) -> Source:
        if isinstance(location, RemotePath):
            from .remote import RemoteH5Source

            return RemoteH5Source.open(location, key, options.field)
        from .source import open_hdf5

        return open_hdf5(location, key, options.field, decode_cf=options.decode_cf)

    def array_keys(self, location: Location) -> list[str] | None:
        import h5py

        if not isinstance(location, RemotePath):
            from .describe import dataset_names

            return dataset_names(location)
        from .remote import open_remote_h5

        with open_remote_h5(location) as f:
            names: list[str] = []
            f.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) else None)
            return names

    def describe(self, location: Location) -> StoreInfo:
        from .describe import describe

        if not isinstance(location, RemotePath):
            return describe(location)
        from .remote import open_remote_h5

        with open_remote_h5(location) as f:
            return describe(location, f)

    def is_group(self, obj: Any) -> bool:
        h5py = loaded("h5py")
        return h5py is not None and isinstance(obj, h5py.Group)

    def read_record(self, store: Location | Any) -> ConversionRecord | None:
        from .files import is_hdf5, read_record

        if isinstance(store, RemotePath):
            from .remote import open_remote_h5

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
        from .write import H5Writer

        return H5Writer(path, arrays, chunk_rows, compression, sparse)

    def open_written(
        self,
        path: Location,
        names: list[str],
        groups: list[str] | None,
        *,
        count_chunks: bool,
    ) -> contextlib.AbstractContextManager[StoredArrays]:
        from .write import open_written

        assert isinstance(path, Path)
        return open_written(path, names, groups)
