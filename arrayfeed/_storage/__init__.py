"""The storage layer: every file format arrayfeed reads or writes, behind one set of functions.

One subpackage per format family, each registering one backend (:mod:`.registry`):

- :mod:`.npy`: ``.npy``/``.npz`` files, arrays in memory and memory maps;
- :mod:`.hdf5`: HDF5 files (``.h5``, ``.h5ad``, netCDF4 …) through h5py, with raw chunks decoded
  outside h5py's lock, and the HDF5 writer of ``convert``;
- :mod:`.zarr`: Zarr stores (v3 and v2), read chunk by chunk, and the Zarr writer of ``convert``;
- :mod:`.sparse`: CSR matrices read by rows (``scipy.sparse``, AnnData's encoded elements);
- :mod:`.lazy`: dask arrays and xarray DataArrays, read batch by batch.

Beside them, what they share: :mod:`.remote` (object storage through fsspec: URLs, named errors,
concurrent fetches; not a format), :mod:`.base` (the ``Source`` protocol and its optional
capabilities), :mod:`.layout` (layout facts, the ``Writer`` protocol), :mod:`.record` (the record
stored with converted data), :mod:`.fingerprint` (files changed under a source),
:mod:`.workbuffers` and :mod:`.frames` (reused buffers and Blosc headers of the chunk readers),
:mod:`.registry` (the backends), :mod:`.specs` (``path:key`` specs) and :mod:`.open` (the entry
points: loops over the registry).

Code outside this package imports only what this module exports, and never names a concrete
source class: ``h5py`` and ``zarr`` are imported nowhere else. Importing it imports neither: each
backend imports its library when first used (see :mod:`.registry`), and the names below that live
in a module that needs one (the Zarr writer's) are looked up when first asked for.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .base import (
    Categorical,
    Chunked,
    Closeable,
    Encoded,
    GatherInto,
    Indices,
    KeptLocally,
    Portability,
    Portable,
    Prefetch,
    ReadPiecesInto,
    ReadRangeInto,
    RunReader,
    Source,
    SparseRows,
    Verifiable,
    chunked_rows,
    kept_locally,
    portability,
    row_bytes,
    row_nbytes,
    run_bounds,
    verify_sources,
)
from .layout import ArrayLayout, SparseLayout, StoredArrays, StoreInfo, Writer
from .open import (
    Format,
    array_keys,
    as_source,
    as_source_for_copy,
    create_writer,
    describe,
    is_array_like,
    is_store_dir,
    open_array,
    open_for_copy,
    open_region_writer,
    open_source,
    open_written,
    written_by_arrayfeed,
)
from .record import MARKER, SPARSE_COMPONENTS, ConversionRecord
from .registry import Backend, Location, OpenOptions, PluginWarning, loaded, register
from .remote.cachereport import CacheReport, cache_bytes_on_disk, cache_report
from .remote.cachespec import CacheSpec, cache_spec
from .remote.errors import remote_error
from .remote.glob import expand_url
from .remote.paths import RemotePath, forget_filesystems, is_url
from .sparse.csr import csr_source
from .sparse.rows import ragged_arange
from .specs import split_spec

if TYPE_CHECKING:
    from .zarr.write import DestinationState, destination_state, mark_complete, remove_store

#: Names exported from modules that import a format's library, imported when first asked for.
_LAZY = {
    name: ".zarr.write"
    for name in ("DestinationState", "destination_state", "mark_complete", "remove_store")
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = [
    "MARKER",
    "SPARSE_COMPONENTS",
    "ArrayLayout",
    "CacheReport",
    "CacheSpec",
    "Backend",
    "Categorical",
    "Chunked",
    "Closeable",
    "ConversionRecord",
    "DestinationState",
    "Encoded",
    "Format",
    "GatherInto",
    "KeptLocally",
    "Indices",
    "Location",
    "OpenOptions",
    "PluginWarning",
    "Portability",
    "Portable",
    "Prefetch",
    "ReadPiecesInto",
    "ReadRangeInto",
    "RemotePath",
    "RunReader",
    "Source",
    "SparseLayout",
    "SparseRows",
    "StoreInfo",
    "StoredArrays",
    "Verifiable",
    "Writer",
    "array_keys",
    "as_source",
    "as_source_for_copy",
    "cache_bytes_on_disk",
    "cache_report",
    "cache_spec",
    "chunked_rows",
    "create_writer",
    "csr_source",
    "describe",
    "destination_state",
    "expand_url",
    "is_array_like",
    "is_store_dir",
    "forget_filesystems",
    "is_url",
    "kept_locally",
    "loaded",
    "mark_complete",
    "open_array",
    "open_for_copy",
    "open_region_writer",
    "open_source",
    "open_written",
    "portability",
    "remote_error",
    "remove_store",
    "ragged_arange",
    "register",
    "row_bytes",
    "row_nbytes",
    "run_bounds",
    "split_spec",
    "verify_sources",
    "written_by_arrayfeed",
]
