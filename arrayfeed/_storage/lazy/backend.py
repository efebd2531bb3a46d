"""The lazy family's backend: dask arrays and xarray DataArrays, read batch by batch."""

from __future__ import annotations

from typing import Any

from ..base import Source
from ..registry import Backend
from .sources import is_dask, is_xarray, lazy_source

__all__ = ["LazyBackend"]


class LazyBackend(Backend):
    """Objects only (no files): dask arrays and xarray ``DataArray`` objects."""

    name = "lazy"
    label = "lazy"
    order = 40  # before NumPy, which would compute the whole array

    def recognises(self, obj: Any) -> bool:
        return is_dask(obj) or is_xarray(obj)

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        return lazy_source(obj, name)
