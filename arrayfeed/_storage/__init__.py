"""The storage layer: every file format arrayfeed reads or writes, behind one set of functions.

- :mod:`.base`: the capability protocols (``Source``, ``GatherInto``, ``ReadRangeInto``,
  ``RunReader``, ``Chunked``, ``Encoded``, ``Verifiable``, ``Closeable``, ``SparseRows``, ``Categorical``,
  ``Writer``) and layout facts;
- one module per format, holding its sources, writer, integrity checks and layout facts:
  :mod:`.npy` (``.npy``/``.npz``), :mod:`.hdf5`, :mod:`.zarr` (with :mod:`.zarrchunks`);
  :mod:`.memory` for in-memory arrays and memory maps; :mod:`.sparse` for CSR matrices (read by
  rows through ``indptr``) and :mod:`.anndata` for AnnData's encoded elements (sparse groups,
  categoricals) in HDF5 and Zarr; :mod:`.cf` for netCDF/CF decoding, :mod:`.lazy` for dask
  arrays and xarray DataArrays, :mod:`.h5describe` for HDF5 layout facts;
- :mod:`.open`: paths and objects in, sources and facts out; :mod:`.openurl` the same for URLs
  (``s3://`` …) through fsspec (:mod:`.remote`: URLs, errors, concurrent fetching), and
  :mod:`.zarrwrite` the Zarr writer, on disk or on object storage;
- :mod:`.record`: the record (and completeness marker) stored with converted data;
  :mod:`.fingerprint`: files changed under a source.

Code outside this package imports only what this module exports, and never names a concrete
source class: ``h5py`` and ``zarr`` are imported nowhere else.
"""

from .base import (
    ArrayLayout,
    Categorical,
    Chunked,
    Closeable,
    Encoded,
    GatherInto,
    Prefetch,
    ReadPiecesInto,
    ReadRangeInto,
    RunReader,
    Source,
    SparseLayout,
    SparseRows,
    StoredArrays,
    StoreInfo,
    Verifiable,
    Writer,
    chunked_rows,
    row_bytes,
    row_nbytes,
    run_bounds,
    verify_sources,
)
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
    open_written,
    split_spec,
    written_by_arrayfeed,
)
from .record import MARKER, SPARSE_COMPONENTS, ConversionRecord
from .remote import RemotePath, expand_url, is_url, remote_error
from .sparse import csr_source, ragged_arange
from .zarrwrite import DestinationState, destination_state, mark_complete, remove_store

__all__ = [
    "MARKER",
    "SPARSE_COMPONENTS",
    "ArrayLayout",
    "Categorical",
    "Chunked",
    "Closeable",
    "ConversionRecord",
    "DestinationState",
    "Encoded",
    "Format",
    "GatherInto",
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
    "chunked_rows",
    "create_writer",
    "csr_source",
    "describe",
    "destination_state",
    "expand_url",
    "is_array_like",
    "is_store_dir",
    "is_url",
    "mark_complete",
    "open_array",
    "open_for_copy",
    "open_region_writer",
    "open_written",
    "remote_error",
    "remove_store",
    "ragged_arange",
    "row_bytes",
    "row_nbytes",
    "run_bounds",
    "split_spec",
    "verify_sources",
    "written_by_arrayfeed",
]
