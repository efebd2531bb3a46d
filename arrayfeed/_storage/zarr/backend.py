"""The Zarr family's backend: stores in local directories and behind URLs, ``zarr`` arrays, and
the stores ``convert`` writes (locally, or on object storage).

Imports zarr and the family's modules only in the methods that use them (as every backend
does, see the registry): reading other formats never pays for zarr.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..base import Source
from ..layout import SparseLayout, StoredArrays, StoreInfo, Writer
from ..record import ConversionRecord
from ..registry import Arrays, Backend, Location, OpenOptions, loaded
from ..remote.paths import RemotePath

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
        from .nodes import METADATA

        fs, path = location.filesystem()
        return any(fs.exists(f"{path.rstrip('/')}/{name}") for name in METADATA)

    def recognises(self, obj: Any) -> bool:
        zarr = loaded("zarr")
        return zarr is not None and isinstance(obj, zarr.Array)

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        if not self.recognises(obj):
            return None
        from .source import ZarrSource

        return ZarrSource(obj)

    def open(self, location: Location, key: str | None, options: OpenOptions) -> Source:
        from .source import open_zarr

        return open_zarr(location, key, options.strict)

    def array_keys(self, location: Location) -> list[str] | None:
        from .describe import array_names

        return array_names(location)

    def describe(self, location: Location) -> StoreInfo:
        from .describe import describe

        return describe(location)

    def is_group(self, obj: Any) -> bool:
        zarr = loaded("zarr")
        return zarr is not None and isinstance(obj, zarr.Group)

    def read_record(self, store: Location | Any) -> ConversionRecord | None:
        from .describe import read_record

        return read_record(store)

    def is_store_dir(self, path: Path) -> bool:
        from .nodes import is_zarr_dir

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
        from .write import ZarrWriter

        return ZarrWriter(path, arrays, rows, compression, sparse)

    def open_region_writer(self, path: Location) -> Writer:
        from .write import ZarrRegionWriter

        return ZarrRegionWriter(path)

    def open_written(
        self,
        path: Location,
        names: list[str],
        groups: list[str] | None,
        *,
        count_chunks: bool,
    ) -> contextlib.AbstractContextManager[StoredArrays]:
        from .write import open_written

        return open_written(path, names, groups, count_chunks=count_chunks)
