"""What the rest of arrayfeed knows about storage: capability protocols and layout facts.

A :class:`Source` is a structural protocol (``shape``, ``dtype``, ``__len__`` and a batched
``read``). The core hands ``read`` 1-D ``int64`` indices that are sorted, unique and in bounds,
and restores the order it wanted afterwards, so a backend never sees unsorted indices (h5py
requires increasing ones). Optional capabilities are small extra protocols that the core probes
with ``isinstance`` and falls back from:

- :class:`GatherInto`: gather rows in any order straight into a caller's buffer (in-memory
  arrays, memory maps), which skips the sort and the extra copy;
- :class:`ReadRangeInto`: read a run of rows straight into a buffer (window reads);
- :class:`ReadPiecesInto`: split such a read into independent pieces (the chunks it touches)
  that several threads read at once;
- :class:`RunReader`: return a run of rows, a view where the backend allows (conversion);
- :class:`Chunked`: reads cost whole chunks of ``chunk_rows`` rows (``shuffle="block"``), and
  :class:`Encoded`: whether each chunk is decoded (compressed) to be read;
- :class:`Verifiable`: ``verify()`` raises if the stored data changed since opening;
- :class:`Closeable`: ``close()`` releases the files a source opened itself;
- :class:`Prefetch`: start fetching ranges of rows before they are read (object storage);
- :class:`SparseRows`: rows stored sparse (CSR), also readable as their nonzeros;
- :class:`Categorical`: integer codes of a categorical column, with its labels.

Nothing outside :mod:`arrayfeed._storage` names a concrete source class: a new backend that
implements these protocols gets every fast path.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .record import SPARSE_COMPONENTS, ConversionRecord

__all__ = [
    "GZIP_LEVEL",
    "ArrayLayout",
    "Categorical",
    "Chunked",
    "Closeable",
    "Encoded",
    "GatherInto",
    "Indices",
    "Prefetch",
    "ReadPiecesInto",
    "ReadRangeInto",
    "RunReader",
    "Source",
    "SparseLayout",
    "SparseRows",
    "StoreInfo",
    "StoredArrays",
    "Verifiable",
    "Writer",
    "chunked_rows",
    "row_bytes",
    "row_nbytes",
    "run_bounds",
    "verify_sources",
]

Indices = npt.NDArray[np.int64]

#: gzip level of the stores arrayfeed writes (HDF5 deflate, Zarr gzip).
GZIP_LEVEL = 4


@runtime_checkable
class Source(Protocol):
    """Rows of an array, read a batch at a time.

    ``read`` receives sorted, unique, in-bounds ``int64`` indices and returns a new array of
    shape ``(len(indices), *shape[1:])``.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def __len__(self) -> int: ...

    def read(self, indices: Indices) -> np.ndarray: ...


@runtime_checkable
class GatherInto(Protocol):
    """Optional capability: gather rows in any order (duplicates allowed) into ``out``.
    ``indices`` may be read-only (the feed shares an epoch's indices between its groups)."""

    def gather_into(self, indices: Indices, out: np.ndarray) -> None: ...


@runtime_checkable
class ReadRangeInto(Protocol):
    """Optional capability: read rows ``[start, stop)`` into ``out`` (C-contiguous, native byte
    order), without an intermediate array."""

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None: ...


@runtime_checkable
class ReadPiecesInto(Protocol):
    """Optional capability: a read of rows ``[start, stop)`` splits into ``range_pieces`` pieces
    that can be read independently, by different threads at once, each filling its part of
    ``out`` (the buffer of the whole range; C-contiguous, native byte order). Storage that
    decodes chunks splits a range into the chunks it touches, so one large block is decoded on
    every core instead of one. ``read_pieces_into`` reads a run of consecutive pieces
    ``[first, last)`` in one call, so that what they share (a file read, a copy) is done once."""

    def range_pieces(self, start: int, stop: int) -> int: ...

    def read_pieces_into(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray
    ) -> None: ...


@runtime_checkable
class RunReader(Protocol):
    """Optional capability: rows ``[start, stop)``, possibly a read-only view of storage (cheapest
    when runs come in increasing order)."""

    def read_run(self, start: int, stop: int) -> np.ndarray: ...


@runtime_checkable
class Chunked(Protocol):
    """Optional capability: storage read in chunks of ``chunk_rows`` rows along axis 0.

    Reading any row of a chunk costs about as much as reading the whole chunk, so
    ``shuffle="block"`` reads whole chunk-aligned blocks of such sources. ``chunk_rows`` is in
    ``[1, len(source)]`` (a chunk longer than the array counts as the whole array), or None: not
    chunked.
    """

    @property
    def chunk_rows(self) -> int | None: ...


@runtime_checkable
class Encoded(Protocol):
    """Optional capability of a :class:`Chunked` source: ``encoded`` is True when each chunk is
    decoded to be read (compressed or filtered; a checksum alone does not count), so a read of a
    few rows costs a whole decode per chunk it touches."""

    @property
    def encoded(self) -> bool: ...


@runtime_checkable
class Verifiable(Protocol):
    """Optional capability: ``verify()`` raises if the stored data changed since opening."""

    def verify(self) -> None: ...


@runtime_checkable
class Closeable(Protocol):
    """Optional capability: ``close()`` releases the files the source opened itself (never a
    handle the caller passed in). The source may reopen them if read again."""

    def close(self) -> None: ...


@runtime_checkable
class Prefetch(Protocol):
    """Optional capability: start fetching rows ``[starts[i], stops[i])`` now (returns at once),
    so that their reads soon after find them arrived: a whole window of blocks is requested
    from object storage together, many requests in flight."""

    def prefetch(self, starts: Sequence[int], stops: Sequence[int]) -> None: ...


@runtime_checkable
class SparseRows(Protocol):
    """Optional capability: rows stored as a CSR matrix (``shape`` is ``(rows, n_cols)``).

    ``read`` still returns dense rows; ``read_csr`` returns the nonzeros of sorted, unique rows
    instead: ``(indptr, cols, values)`` of a canonical CSR batch (``indptr`` ``int64`` of
    ``len(indices) + 1`` entries from 0, ``cols`` ``int64`` sorted within each row, no duplicates,
    ``values`` in the native byte order of ``dtype``).
    """

    @property
    def nnz(self) -> int: ...

    @property
    def components(self) -> tuple[Source, Source, Source]:
        """The sources of ``data``, ``indices`` and ``indptr``, as stored."""
        ...

    def read_csr(self, indices: Indices) -> tuple[Indices, Indices, np.ndarray]: ...

    def row_lengths(self) -> Indices:
        """Stored entries of every row (``int64``, one per row), from ``indptr``."""
        ...

    def read_stored(self, indices: Indices) -> tuple[Indices, Indices, np.ndarray]:
        """The stored entries of sorted, unique rows ``indices``, as a copy keeps them:
        ``(lengths, cols, values)``, the rows' entries one row after another, columns sorted
        within each row, and repeated entries kept (``lengths`` equal :meth:`row_lengths`)."""
        ...


@runtime_checkable
class Categorical(Protocol):
    """Optional capability: the rows are integer codes of a categorical column (AnnData, pandas);
    ``categories[code]`` is the label of a code, and ``-1`` marks a missing value."""

    @property
    def categories(self) -> tuple[str, ...]: ...


def chunked_rows(source: Source) -> int | None:
    """Rows per chunk of a source whose reads cost whole chunks, else None (sources that gather
    rows in any order cheaply, and unchunked storage)."""
    if isinstance(source, Chunked) and not isinstance(source, GatherInto):
        return source.chunk_rows or None
    return None


def row_bytes(sources: Iterable[Source]) -> int:
    """Bytes of one row of every source together."""
    return sum(row_nbytes(s.shape, s.dtype) for s in sources)


def row_nbytes(shape: Sequence[int], dtype: np.dtype[Any] | str) -> int:
    """Bytes of one row (everything but the first axis) of an array of ``shape`` and ``dtype``."""
    return math.prod(int(n) for n in shape[1:]) * np.dtype(dtype).itemsize


def run_bounds(indices: Indices) -> tuple[int, int] | None:
    """``(start, stop)`` if sorted unique ``indices`` form one contiguous run, else None."""
    if len(indices) and int(indices[-1]) - int(indices[0]) + 1 == len(indices):
        return int(indices[0]), int(indices[-1]) + 1
    return None


def verify_sources(sources: Iterable[Any]) -> None:
    """Run ``verify()`` on every source that has it (the feed calls this at each epoch start)."""
    for source in sources:
        if isinstance(source, Verifiable):
            source.verify()


# -- layout facts (for inspect, bench and conversion) ------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ArrayLayout:
    """How one stored array is laid out.

    Attributes:
        name: Path of the array inside its file or store (``""`` for a lone array).
        shape: Shape; axis 0 is the batch axis.
        dtype: NumPy dtype (a dtype name is converted).
        chunks: Chunk shape, or None when the array is contiguous.
        compression: Codecs or filters in human form (``"none"`` when uncompressed).
        stored_bytes: Bytes on disk, when known.
        loads_whole: The array cannot be read lazily (a ``.npz`` member).
        missing_chunks: Chunks not stored (Zarr: they read as the fill value), when known.
        strict: The store was written complete by arrayfeed, so a missing chunk is corruption.
        encoding: What the array encodes beyond its values: ``"csr_matrix"`` (a sparse matrix
            stored as ``data``/``indices``/``indptr``: ``shape`` and ``dtype`` are those of its
            dense rows, ``chunks`` those of ``data``), ``"categorical"`` (integer codes of
            labels), or None for a plain array.
        nnz: Stored nonzeros of a sparse matrix.
        categories: Number of labels of a categorical.
        unreadable: Why the array cannot be read here (a dtype NumPy has no equivalent for, a
            filter whose plugin is not installed), or None.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunks: tuple[int, ...] | None
    compression: str = "none"
    stored_bytes: int | None = None
    loads_whole: bool = False
    missing_chunks: int | None = None
    strict: bool = False
    encoding: str | None = None
    nnz: int | None = None
    categories: int | None = None
    unreadable: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        if self.chunks is not None:
            object.__setattr__(self, "chunks", tuple(int(n) for n in self.chunks))

    @property
    def nbytes(self) -> int:
        """Bytes of the array once read (uncompressed)."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return row_nbytes(self.shape, self.dtype)

    @property
    def chunk_rows(self) -> int | None:
        """Rows per chunk when chunks hold whole rows, else None."""
        if self.encoding == "csr_matrix":
            return None  # chunks of `data` hold nonzeros, not rows
        if self.chunks is None or not self.shape or tuple(self.chunks[1:]) != self.shape[1:]:
            return None
        return min(self.chunks[0], self.shape[0])

    @property
    def chunk_bytes(self) -> int | None:
        if self.chunks is None:
            return None
        if self.encoding == "csr_matrix":  # a chunk of `data`
            return min(self.chunks[0], max(1, self.nnz or 0)) * self.dtype.itemsize
        clipped = [min(c, s) for c, s in zip(self.chunks, self.shape, strict=True)]
        return math.prod(clipped) * self.dtype.itemsize


@dataclass(frozen=True, kw_only=True)
class StoreInfo:
    """What a file or store holds, from its metadata only (see :func:`arrayfeed._storage.describe`).

    Attributes:
        format: ``"HDF5"``, ``"Zarr v3"``, ``"Zarr v2"``, ``".npy"`` or ``".npz"``.
        arrays: Layout of every array, in storage order.
        specs: Array name -> the input spec that reads it (``file.h5:key``).
        record: What arrayfeed recorded when it wrote the store, if it did.
        convert_suffix: The output suffix a conversion of this store would get.
    """

    format: str
    arrays: tuple[ArrayLayout, ...]
    specs: Mapping[str, str]
    record: ConversionRecord | None = None
    convert_suffix: str = ".h5"


# -- conversion output --------------------------------------------------------------------------
class Writer(Protocol):
    """A store being written by a conversion, one array per name, rows in runs."""

    def write(self, name: str, start: int, rows: np.ndarray) -> None: ...

    def finish(self, record: ConversionRecord) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class SparseLayout:
    """A CSR matrix as a conversion writes it: AnnData's ``csr_matrix`` group (``data``,
    ``indices`` and ``indptr`` arrays, attributes ``encoding-type``, ``encoding-version`` and
    ``shape``), which arrayfeed, anndata and scanpy read.

    Attributes:
        n_rows, n_cols: The matrix's shape.
        nnz: Stored entries (the length of ``data`` and ``indices``).
        dtypes: Of ``data``, ``indices`` and ``indptr`` (:data:`~.record.SPARSE_COMPONENTS`).
        chunk: Entries per chunk of ``data`` and ``indices``; None: as the dense arrays are
            (contiguous in HDF5, one chunk in Zarr).
        indptr_chunk: Entries per chunk of ``indptr``; None likewise.
    """

    n_rows: int
    n_cols: int
    nnz: int
    dtypes: tuple[np.dtype[Any], np.dtype[Any], np.dtype[Any]]
    chunk: int | None
    indptr_chunk: int | None

    @property
    def attrs(self) -> dict[str, Any]:
        """The group's attributes (as AnnData writes them)."""
        return {
            "encoding-type": "csr_matrix",
            "encoding-version": "0.1.0",
            "shape": [self.n_rows, self.n_cols],
        }

    def arrays(self) -> dict[str, tuple[int, np.dtype[Any], int | None]]:
        """Component name -> ``(length, dtype, entries per chunk)``."""
        lengths = (self.nnz, self.nnz, self.n_rows + 1)
        chunks = (self.chunk, self.chunk, self.indptr_chunk)
        return {
            part: (n, dtype, chunk)
            for part, n, dtype, chunk in zip(
                SPARSE_COMPONENTS, lengths, self.dtypes, chunks, strict=True
            )
        }


@dataclass(frozen=True, kw_only=True)
class StoredArrays:
    """A written store opened again to check it.

    Attributes:
        arrays: Name -> an array-like with ``shape``, ``dtype`` and slicing along axis 0.
        record: The record stored with the data, if any.
        missing_chunks: Name -> chunks not stored (0 for formats that store every chunk).
        total_chunks: Name -> chunks the array has.
        group_attrs: Group name -> its attributes (the groups asked for).
    """

    arrays: Mapping[str, Any]
    record: ConversionRecord | None
    missing_chunks: Mapping[str, int] = field(default_factory=dict)
    total_chunks: Mapping[str, int] = field(default_factory=dict)
    group_attrs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
