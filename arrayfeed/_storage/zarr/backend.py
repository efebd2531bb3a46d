"""The Zarr family's backend: stores in local directories and behind URLs, ``zarr`` arrays, and
the stores ``convert`` writes (locally, or on object storage)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zarr

from ..base import Source
from ..layout import SparseLayout, StoredArrays, StoreInfo, Writer
from ..record import ConversionRecord
from ..registry import Arrays, Backend, Location, OpenOptions
from ..remote.paths import RemotePath
from .describe import array_names, describe, read_record
from .nodes import METADATA, is_zarr_dir
from .source import ZarrSource, open_zarr
from .write import ZarrRegionWriter, ZarrWriter, open_written

__all__ = ["ZarrBackend"]


class ZarrBackend(Backend):
    """Zarr stores (v3 and v2): a local directory, or a URL ending in ``.zarr`` or holding Zarr
    metadata."""

    name = "zarr"
    label = "Zarr"
    order = 20  # before HDF5: a URL is looked at for Zarr metadata first
    suffixes = frozenset({".zarr"})
    writes = True

    def claims(self, location: Location) -> bool:
        if isinstance(location, RemotePath):
            return location.suffix.lower() in self.suffixes
        return location.is_dir()

    def detects(self, location: Location) -> bool:
        if not isinstance(location, RemotePath):
            return False  # a local store is a directory, claimed by its name
        fs, path = location.filesystem()
        return any(fs.exists(f"{path.rstrip('/')}/{name}") for name in METADATA)

    def recognises(self, obj: Any) -> bool:
        return isinstance(obj, zarr.Array)

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        return ZarrSource(obj) if isinstance(obj, zarr.Array) else None

    def open(self, location: Location, key: str | None, options: OpenOptions) -> Source:
        return open_zarr(location, key, options.strict)

    def array_keys(self, location: Location) -> list[str] | None:
        return array_names(location)

    def describe(self, location: Location) -> StoreInfo:
        return describe(location)

    def is_group(self, obj: Any) -> bool:
        return isinstance(obj, zarr.Group)

    def read_record(self, store: Location | Any) -> ConversionRecord | None:
        return read_record(store)

    def is_store_dir(self, path: Path) -> bool:
        return is_zarr_dir(path)

    def create_writer(
        self,
        path: Location,
        arrays: Arrays,
        chunk_rows: int | None,
        compression: str,
        sparse: Mapping[str, SparseLayout] | None,
    ) -> Writer:
        # Without `chunk_rows`, one chunk holds every row.
        rows = chunk_rows or max((shape[0] for shape, _ in arrays.values()), default=1)
        return ZarrWriter(path, arrays, rows, compression, sparse)

    def open_region_writer(self, path: Location) -> Writer:
        return ZarrRegionWriter(path)

    def open_written(
        self,
        path: Location,
        names: list[str],
        groups: list[str] | None,
        *,
        count_chunks: bool,
    ) -> contextlib.AbstractContextManager[StoredArrays]:
        return open_written(path, names, groups, count_chunks=count_chunks)
