"""Lazy arrays: ``dask.array.Array`` and ``xarray.DataArray`` read batch by batch.

``np.asarray`` on such an array computes (or loads) the whole of it, which for the arrays people
keep lazy does not fit in memory. These sources compute only the rows of each batch (dask reads
the chunks those rows touch; in ``shuffle="block"`` a block is a run of whole chunks), so memory
stays bounded by the batch or window.

dask runs each read with its synchronous scheduler in the calling reader thread: arrayfeed's
reader threads are the parallelism, and dask's own thread pool inside each of them would only
multiply threads. Neither dask nor xarray is imported here: an object is recognised by the
module of its type.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base import Indices, Portability

__all__ = ["DaskSource", "XarraySource", "is_dask", "is_xarray", "lazy_source"]


def _module(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def is_dask(obj: Any) -> bool:
    """True for a dask array."""
    return _module(obj) == "dask" and hasattr(obj, "chunks") and hasattr(obj, "compute")


def is_xarray(obj: Any) -> bool:
    """True for an xarray ``DataArray``."""
    return _module(obj) == "xarray" and hasattr(obj, "isel") and hasattr(obj, "dims")


def lazy_source(obj: Any, name: str) -> DaskSource | XarraySource | None:
    """A source for a dask array or an xarray ``DataArray`` (lazy or not), else None."""
    if is_dask(obj):
        return DaskSource(obj, name)
    if is_xarray(obj):
        return XarraySource(obj, name)
    return None


class _Lazy:
    """What both lazy sources share: the array and its facts."""

    def __init__(self, array: Any, name: str) -> None:
        self.array = array
        self.name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(self.array.dtype)
        return dtype

    def __len__(self) -> int:
        return self.shape[0]

    def portability(self) -> Portability:
        kind = "a dask array" if isinstance(self, DaskSource) else "an xarray DataArray"
        return Portability("stays", f"{kind}, computed in the process that holds it")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, shape={self.shape}, dtype={self.dtype})"


class DaskSource(_Lazy):
    """Rows of a ``dask.array.Array``, computed a batch (or a block) at a time."""

    def read(self, indices: Indices) -> np.ndarray:
        return np.asarray(self.array[indices].compute(scheduler="synchronous"))

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        out[...] = self.array[start:stop].compute(scheduler="synchronous")

    @property
    def chunk_rows(self) -> int | None:
        """Rows per chunk when every chunk but the last has the same number; else None."""
        rows = [int(n) for n in self.array.chunks[0]]
        if len(rows) > 1 and len(set(rows[:-1])) == 1 and rows[-1] <= rows[0]:
            return rows[0] if rows[0] < len(self) else None
        return None


class XarraySource(_Lazy):
    """Rows of an ``xarray.DataArray`` along its first dimension, selected with ``isel`` (which
    reads only those rows of a lazily loaded file, and computes only them when dask-backed)."""

    def __init__(self, array: Any, name: str) -> None:
        super().__init__(array, name)
        self._dim = array.dims[0] if array.dims else None
        data = getattr(array, "data", None) if _is_dask_backed(array) else None
        self._dask = DaskSource(data, name) if data is not None else None

    def read(self, indices: Indices) -> np.ndarray:
        if self._dask is not None:
            return self._dask.read(indices)
        return np.asarray(self.array.isel({self._dim: indices}).values)

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._dask is not None:
            self._dask.read_range_into(start, stop, out)
        else:
            out[...] = self.array.isel({self._dim: slice(start, stop)}).values

    @property
    def chunk_rows(self) -> int | None:
        return None if self._dask is None else self._dask.chunk_rows


def _is_dask_backed(array: Any) -> bool:
    chunks = getattr(array, "chunks", None)  # xarray: None unless dask-backed
    return chunks is not None
