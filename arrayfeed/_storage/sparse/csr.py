"""Sparse CSR matrices, read by rows through ``indptr``: dense rows out, never the whole matrix.

A CSR matrix of shape ``(n_rows, n_cols)`` is three 1-D arrays: ``indptr`` (``n_rows + 1``
offsets), ``indices`` (the column of each stored value) and ``data`` (the values); row ``i`` is
``data[indptr[i]:indptr[i + 1]]`` at columns ``indices[indptr[i]:indptr[i + 1]]``. A
:class:`CSRSource` reads such a matrix wherever arrayfeed reads arrays, since each component is a
:class:`~..base.Source` of its own (an HDF5 dataset, a Zarr array, a NumPy array): AnnData's
``csr_matrix`` groups (:mod:`.anndata`) and ``scipy.sparse`` CSR matrices (:func:`from_scipy`).

Reading a batch of sorted, unique rows takes a few whole-batch reads:

1. ``indptr`` at those rows and the next: gathered from memory or a memory map, or looked up in a
   copy of ``indptr`` read once per process when it is stored chunked (8 bytes per row; the
   alternative decodes most of its chunks for every shuffled batch);
2. the ranges ``[indptr[r], indptr[r + 1])`` of ``data`` and ``indices``: gathered in one call
   from memory or a memory map, else read as *spans*, ranges less than a chunk (at least
   :data:`MERGE_GAP_BYTES`) apart merged into one storage read (:func:`.rows.plan_spans`, pure);
3. the values scattered into a zeroed dense buffer (:func:`.rows.scatter`); entries repeated
   within a row are summed, as ``scipy.sparse`` does.

Dense rows have the dtype of ``data`` (in the native byte order). ``read_csr`` returns the batch's
nonzeros instead (``sparse=True``). Nothing ever reads more of ``data`` or ``indices`` than the
spans of the rows asked for.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..._dtypes import native_dtype
from ..._errors import CorruptDataError, StructureError
from ..._forks import renew_after_fork
from ..base import (
    Chunked,
    Closeable,
    Encoded,
    GatherInto,
    Indices,
    Portability,
    ReadRangeInto,
    RunReader,
    Source,
    portability,
    verify_sources,
)
from ..npy.memory import ArraySource
from .rows import canonical, plan_spans, ragged_arange, repeats, scatter

__all__ = [
    "GATHER_CHUNK_BYTES",
    "INDPTR_CACHE_BYTES",
    "MERGE_GAP_BYTES",
    "CSRGatherSource",
    "CSRSource",
    "csr_source",
    "from_scipy",
    "is_scipy_sparse",
    "refuse_csc",
]

#: Ranges of ``data``/``indices`` closer than this are read as one span (one storage call costs
#: about as much as reading this many bytes from the page cache).
MERGE_GAP_BYTES = 64 << 10
#: Largest chunks (bytes) of ``data``/``indices`` read by gathering each batch's rows (see
#: :func:`csr_source`).
GATHER_CHUNK_BYTES = 256 << 10
#: Largest ``indptr`` (bytes) kept in memory when it is stored chunked; above it, entries are
#: read per batch.
INDPTR_CACHE_BYTES = 256 << 20

_FIX_CSC = (
    "convert it to CSR first: `adata.X = adata.X.tocsr()` (or `layer.tocsr()`) and write it "
    "again, or `m.tocsr()` for a scipy matrix"
)


def _read_1d(source: Source, start: int, stop: int, out: np.ndarray) -> None:
    """Elements ``[start, stop)`` of a 1-D source into ``out``."""
    if isinstance(source, ReadRangeInto):
        source.read_range_into(start, stop, out)
    elif isinstance(source, RunReader):
        out[...] = source.read_run(start, stop)
    else:
        out[...] = source.read(np.arange(start, stop, dtype=np.int64))


class CSRSource:
    """Rows of a CSR matrix whose components are sources (see the module docstring).

    ``shape`` is the matrix's ``(n_rows, n_cols)`` and ``dtype`` that of ``data``: rows read
    dense. Prefer :func:`csr_source`, which picks :class:`CSRGatherSource` when every component
    gathers cheaply.
    """

    def __init__(
        self,
        data: Source,
        indices: Source,
        indptr: Source,
        shape: tuple[int, int],
        *,
        name: str = "matrix",
    ) -> None:
        self.data, self.indices, self.indptr = data, indices, indptr
        self.name = name
        self._shape = (int(shape[0]), int(shape[1]))
        self._dtype = native_dtype(data.dtype)
        self._cache: np.ndarray | None = None
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._check()
        ends = self._indptr_at(np.array([0, self._shape[0]], dtype=np.int64))
        self._nnz = int(ends[1])
        if int(ends[0]) < 0 or self._nnz > len(data) or self._nnz < int(ends[0]):
            self._corrupt(
                f"indptr runs from {int(ends[0])} to {self._nnz}, outside `data` "
                f"({len(data)} values)"
            )

    def _check(self) -> None:
        n_rows, n_cols = self._shape
        parts = {"data": self.data, "indices": self.indices, "indptr": self.indptr}
        for part, source in parts.items():
            if len(source.shape) != 1:
                self._corrupt(f"`{part}` has shape {tuple(source.shape)}, not one axis")
        for part in ("indices", "indptr"):
            if np.dtype(parts[part].dtype).kind not in "iu":
                self._corrupt(f"`{part}` has dtype {parts[part].dtype}, not integers")
        if len(self.indptr) != n_rows + 1:
            self._corrupt(
                f"`indptr` has {len(self.indptr)} entries, but a matrix of {n_rows} rows needs "
                f"{n_rows + 1}"
            )
        if len(self.indices) != len(self.data):
            self._corrupt(f"`indices` has {len(self.indices)} entries and `data` {len(self.data)}")
        if n_cols < 0 or n_rows < 0:
            self._corrupt(f"its shape {self._shape} is negative")

    def _corrupt(self, what: str) -> None:
        raise CorruptDataError(
            f"sparse CSR matrix '{self.name}' is inconsistent: {what}; the file is damaged or "
            "was not written as CSR. Write it again (e.g. with anndata or scipy)."
        )

    # -- the Source protocol -----------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def nnz(self) -> int:
        """Stored entries (``indptr[-1]``)."""
        return self._nnz

    def __len__(self) -> int:
        return self._shape[0]

    def read(self, indices: Indices) -> np.ndarray:
        out = np.empty((len(indices), self._shape[1]), dtype=self._dtype)
        rows, cols, values = self._entries(indices)
        scatter(out, rows, cols, values, repeats(rows, cols, self._shape[1]))
        return out

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        rows, cols, values = self._entries(np.arange(start, stop, dtype=np.int64))
        scatter(out, rows, cols, values, repeats(rows, cols, self._shape[1]))

    def read_run(self, start: int, stop: int) -> np.ndarray:
        return self.read(np.arange(start, stop, dtype=np.int64))

    def read_csr(self, indices: Indices) -> tuple[Indices, Indices, np.ndarray]:
        """The nonzeros of sorted, unique rows ``indices`` as a canonical CSR batch
        ``(indptr, cols, values)`` (see :class:`~..base.SparseRows`)."""
        rows, cols, values = self._entries(indices)
        return canonical(rows, cols, values, len(indices), self._shape[1])

    @property
    def components(self) -> tuple[Source, Source, Source]:
        """The sources of ``data``, ``indices`` and ``indptr``."""
        return self.data, self.indices, self.indptr

    def row_lengths(self) -> Indices:
        """Stored entries of every row (``int64``), from ``indptr`` read whole."""
        whole = self._whole_indptr()
        if whole is None:  # larger than the cache: read it here once, for this caller
            out = np.empty(len(self.indptr), dtype=native_dtype(self.indptr.dtype))
            _read_1d(self.indptr, 0, len(self.indptr), out)
            whole = out.astype(np.int64, copy=False)
        lengths = np.diff(whole)
        if len(lengths) and (int(whole[0]) < 0 or int(lengths.min()) < 0):
            self._corrupt("`indptr` decreases")
        return lengths

    def read_stored(self, indices: Indices) -> tuple[Indices, Indices, np.ndarray]:
        """The stored entries of sorted, unique rows ``indices``: ``(lengths, cols, values)``,
        columns sorted within each row, repeated entries kept (see :class:`~..base.SparseRows`)."""
        rows, cols, values = self._entries(indices)
        keys = rows * max(self._shape[1], 1) + cols
        if len(keys) > 1 and not bool(np.all(keys[1:] >= keys[:-1])):
            order = np.argsort(keys, kind="stable")  # repeated entries keep their order
            cols, values = cols[order], values[order]
        return np.bincount(rows, minlength=len(indices)).astype(np.int64), cols, values

    @property
    def chunk_rows(self) -> int | None:
        """Rows whose values fill about one chunk of ``data``, when ``data`` is chunked."""
        chunk = self.data.chunk_rows if isinstance(self.data, Chunked) else None
        if not chunk or not self._nnz or not len(self):
            return None
        per_row = self._nnz / len(self)
        return int(min(len(self), max(1, round(chunk / per_row))))

    # -- reading -----------------------------------------------------------------------------
    def _entries(self, indices: Indices) -> tuple[Indices, Indices, np.ndarray]:
        """``(row positions, columns, values)`` of the stored entries of sorted unique rows, in
        storage order (rows are positions in ``indices``)."""
        n = len(indices)
        if n == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, self._dtype)
        positions = np.union1d(indices, indices + 1)
        bounds = self._indptr_at(positions)
        where = np.searchsorted(positions, indices)
        starts, stops = bounds[where], bounds[where + 1]
        if (
            int(starts[0]) < 0
            or int(stops[-1]) > self._nnz
            or bool(np.any(stops < starts))
            or bool(np.any(starts[1:] < stops[:-1]))
        ):
            self._corrupt(f"`indptr` decreases or leaves `data` at rows {indices[:8].tolist()}…")
        lengths = stops - starts
        cols = self._ranges(self.indices, starts, stops, lengths).astype(np.int64, copy=False)
        values = self._ranges(self.data, starts, stops, lengths)
        if len(cols) and (int(cols.min()) < 0 or int(cols.max()) >= self._shape[1]):
            self._corrupt(f"a column index lies outside [0, {self._shape[1]})")
        rows = np.repeat(np.arange(n, dtype=np.int64), lengths)
        return rows, cols, values

    def _indptr_at(self, positions: Indices) -> Indices:
        """``indptr`` at sorted unique ``positions``, as ``int64``."""
        source = self.indptr
        if isinstance(source, GatherInto):
            out = np.empty(len(positions), dtype=native_dtype(source.dtype))
            source.gather_into(positions, out)
            return out.astype(np.int64, copy=False)
        whole = self._whole_indptr()
        if whole is not None:
            return whole[positions]
        return np.asarray(source.read(positions)).astype(np.int64, copy=False)

    def _whole_indptr(self) -> Indices | None:
        """This process's copy of a chunked ``indptr`` (read once), or None when too large."""
        cache = self._cache
        if cache is not None:
            return cache
        if len(self.indptr) * 8 > INDPTR_CACHE_BYTES:
            return None
        with self._lock:
            if self._cache is None:
                out = np.empty(len(self.indptr), dtype=native_dtype(self.indptr.dtype))
                _read_1d(self.indptr, 0, len(self.indptr), out)
                self._cache = out.astype(np.int64, copy=False)
            return self._cache

    def _ranges(
        self, source: Source, starts: Indices, stops: Indices, lengths: Indices
    ) -> np.ndarray:
        """The elements of ``source`` in every range ``[starts[i], stops[i])``, concatenated."""
        dtype = native_dtype(source.dtype)
        total = int(lengths.sum())
        if isinstance(source, GatherInto):
            out = np.empty(total, dtype=dtype)
            source.gather_into(ragged_arange(starts, lengths), out)
            return out
        chunk = source.chunk_rows if isinstance(source, Chunked) else None
        gap = max(MERGE_GAP_BYTES // dtype.itemsize, chunk or 0)
        span_starts, span_stops = plan_spans(starts, stops, gap)
        sizes = span_stops - span_starts
        buffer = np.empty(int(sizes.sum()), dtype=dtype)
        at = 0
        for a, b in zip(span_starts.tolist(), span_stops.tolist(), strict=True):
            _read_1d(source, a, b, buffer[at : at + b - a])
            at += b - a
        if len(buffer) == total:
            return buffer  # the spans are the ranges: nothing between them was read
        offsets = np.cumsum(sizes) - sizes
        span = np.searchsorted(span_starts, starts, side="right") - 1
        begin = offsets[np.maximum(span, 0)] + starts - span_starts[np.maximum(span, 0)]
        return buffer[ragged_arange(begin, lengths)]

    # -- lifecycle ---------------------------------------------------------------------------
    def verify(self) -> None:
        """Raise :class:`CorruptDataError` if a component's file changed since opening."""
        verify_sources([self.data, self.indices, self.indptr])

    def close(self) -> None:
        """Close the files the components opened."""
        for source in (self.data, self.indices, self.indptr):
            if isinstance(source, Closeable):
                source.close()
        self._cache = None

    def portability(self) -> Portability:
        return Portability.combined(portability(s) for s in (self.data, self.indices, self.indptr))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # a copy reads indptr again, in its own process
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, shape={self.shape}, dtype={self.dtype}, "
            f"nnz={self.nnz})"
        )


class CSRGatherSource(CSRSource):
    """A :class:`CSRSource` whose ``data`` and ``indices`` gather cheaply (memory, memory maps):
    it also gathers rows in any order straight into a caller's buffer."""

    def gather_into(self, indices: Indices, out: np.ndarray) -> None:
        order = np.argsort(indices, kind="stable")  # faster than np.unique for a batch
        ordered = indices[order]
        if len(ordered) < 2 or bool(np.all(ordered[1:] > ordered[:-1])):  # no repeats
            rows, cols, values = self._entries(ordered)
            summed = repeats(rows, cols, self._shape[1])
            scatter(out, order[rows], cols, values, summed)  # row k of `ordered` is out[order[k]]
            return
        unique, inverse = np.unique(indices, return_inverse=True)
        dense = self.read(unique)
        np.take(dense, inverse.reshape(-1), axis=0, out=out, mode="clip")


def csr_source(
    data: Source, indices: Source, indptr: Source, shape: tuple[int, int], *, name: str
) -> CSRSource:
    """The fastest :class:`CSRSource` for these components: one that gathers each batch's rows
    (:class:`CSRGatherSource`) when ``data`` and ``indices`` are in memory, memory-mapped, or
    stored uncompressed in chunks of at most :data:`GATHER_CHUNK_BYTES`; else one whose reads
    cost whole chunks (``shuffle="block"`` then reads chunk-aligned windows through the window
    cache). Small chunks stream faster gathered, large ones through windows
    (docs/performance.md, "Sparse rows gathered or read by windows").
    """
    if all(_gathers(part) for part in (data, indices)):
        return CSRGatherSource(data, indices, indptr, shape, name=name)
    return CSRSource(data, indices, indptr, shape, name=name)


def _gathers(part: Source) -> bool:
    """Whether reading any span of ``part`` costs about what it holds: in memory, mapped, or in
    small chunks that are not decoded. A compressed chunk costs a whole decode per batch that
    touches it, so ``shuffle="block"`` is faster through windows, which decode each chunk once
    per epoch (docs/performance.md, "Sparse rows gathered or read by windows")."""
    if isinstance(part, GatherInto):
        return True
    if isinstance(part, Encoded) and part.encoded:
        return False
    chunk = part.chunk_rows if isinstance(part, Chunked) else None
    return chunk is not None and chunk * np.dtype(part.dtype).itemsize <= GATHER_CHUNK_BYTES


def is_scipy_sparse(obj: Any) -> bool:
    """True for a ``scipy.sparse`` matrix or array (without importing scipy)."""
    return type(obj).__module__.startswith("scipy.sparse") and hasattr(obj, "format")


def from_scipy(matrix: Any, name: str) -> CSRSource:
    """A ``scipy.sparse`` CSR matrix or array as a source over its own arrays (no copy).

    Other formats are refused with the fix (``matrix.tocsr()``).
    """
    fmt = getattr(matrix, "format", None)
    kind = type(matrix).__name__
    if fmt != "csr" or len(matrix.shape) != 2:
        how = "convert it with `m.tocsr()` first"
        if fmt == "csc":
            how = f"it is stored by column (CSC); {how}"
        raise StructureError(
            f"`{name}` is a scipy.sparse {kind} ({fmt or 'unknown'} format, shape "
            f"{matrix.shape}); arrayfeed reads sparse matrices by rows, in CSR format: {how}."
        )
    return csr_source(
        ArraySource(np.asarray(matrix.data), name=f"{name}.data"),
        ArraySource(np.asarray(matrix.indices), name=f"{name}.indices"),
        ArraySource(np.asarray(matrix.indptr), name=f"{name}.indptr"),
        matrix.shape,
        name=name,
    )


def refuse_csc(name: str, shape: tuple[int, ...]) -> StructureError:
    """The error for a matrix stored by column (CSC), which has no cheap rows."""
    return StructureError(
        f"'{name}' is a sparse matrix of shape {tuple(shape)} stored by column (CSC), so each "
        f"of its rows is spread over the whole file; arrayfeed reads rows of CSR matrices: "
        f"{_FIX_CSC}."
    )
