"""What a store holds and how arrayfeed writes one: layout facts, the writer and its output.

- :class:`ArrayLayout` and :class:`StoreInfo`: how each array of a file or store is laid out
  (shape, chunks, codecs, what is missing), from metadata only: what ``inspect`` and ``bench``
  print and what ``convert`` plans chunks from;
- :class:`Writer`: a store being written by a conversion, :class:`SparseLayout` the CSR group it
  writes for a sparse matrix, and :class:`StoredArrays` the written store opened again to check it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .base import row_nbytes
from .record import SPARSE_COMPONENTS, ConversionRecord

__all__ = [
    "GZIP_LEVEL",
    "ArrayLayout",
    "SparseLayout",
    "StoreInfo",
    "StoredArrays",
    "Writer",
]

#: gzip level of the stores arrayfeed writes (HDF5 deflate, Zarr gzip).
GZIP_LEVEL = 4


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
