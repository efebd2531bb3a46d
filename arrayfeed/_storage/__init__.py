"""The storage layer: every file format arrayfeed reads or writes, behind one set of functions.

- :mod:`.base`: the capability protocols (``Source``, ``GatherInto``, ``ReadRangeInto``,
  ``RunReader``, ``Chunked``, ``Verifiable``, ``Closeable``, ``Writer``) and layout facts;
- one module per format, holding its sources, writer, integrity checks and layout facts:
  :mod:`.npy` (``.npy``/``.npz``), :mod:`.hdf5`, :mod:`.zarr` (with :mod:`.zarrchunks`);
  :mod:`.memory` for in-memory arrays and memory maps;
- :mod:`.open`: paths and objects in, sources and facts out;
- :mod:`.record`: the record (and completeness marker) stored with converted data;
  :mod:`.fingerprint`: files changed under a source.

Code outside this package imports only what this module exports, and never names a concrete
source class: ``h5py`` and ``zarr`` are imported nowhere else.
"""

from .base import (
    ArrayLayout,
    Chunked,
    Closeable,
    GatherInto,
    ReadPiecesInto,
    ReadRangeInto,
    RunReader,
    Source,
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
    create_writer,
    describe,
    is_array_like,
    is_store_dir,
    open_array,
    open_for_copy,
    open_written,
    split_spec,
    written_by_arrayfeed,
)
from .record import MARKER, ConversionRecord

__all__ = [
    "MARKER",
    "ArrayLayout",
    "Chunked",
    "Closeable",
    "ConversionRecord",
    "Format",
    "GatherInto",
    "ReadPiecesInto",
    "ReadRangeInto",
    "RunReader",
    "Source",
    "StoreInfo",
    "StoredArrays",
    "Verifiable",
    "Writer",
    "array_keys",
    "as_source",
    "chunked_rows",
    "create_writer",
    "describe",
    "is_array_like",
    "is_store_dir",
    "open_array",
    "open_for_copy",
    "open_written",
    "row_bytes",
    "row_nbytes",
    "run_bounds",
    "split_spec",
    "verify_sources",
    "written_by_arrayfeed",
]
