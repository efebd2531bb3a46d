"""Lazy arrays: ``dask.array.Array`` and ``xarray.DataArray`` read batch by batch, never whole.

- :mod:`.sources`: :class:`~.sources.DaskSource` and :class:`~.sources.XarraySource` (neither
  dask nor xarray is imported: an object is recognised by the module of its type);
- :mod:`.backend`: the family's :class:`~.backend.LazyBackend`, registered here.
"""

from ..registry import register
from .backend import LazyBackend

register(LazyBackend())
