"""For people adding a storage format: the interface every format of arrayfeed implements.

A training script needs nothing here (it opens arrays with :func:`arrayfeed.open_array` and feeds
them to :func:`arrayfeed.from_arrays` or :func:`arrayfeed.batches`). A format is two things:

- a :class:`Source`: rows of one array, read a batch at a time (``shape``, ``dtype``,
  ``__len__`` and ``read`` of sorted, unique ``int64`` indices), plus whichever optional
  capabilities it does well, probed with ``isinstance``: :class:`GatherInto`,
  :class:`ReadRangeInto`, :class:`ReadPiecesInto`, :class:`RunReader`, :class:`Chunked`,
  :class:`Encoded`, :class:`Verifiable`, :class:`Closeable`, :class:`Prefetch`,
  :class:`SparseRows`, :class:`Categorical`, and :class:`Portable` (how it reaches a loader
  process; a source without it is read in the process that opened it);
- a :class:`Backend`: how a file of the format is recognised (by name, by content, as an
  object) and opened as a source, listed and described (:class:`StoreInfo`, one
  :class:`ArrayLayout` per array), registered with :func:`register`.

arrayfeed's own formats are subpackages of ``arrayfeed._storage``; another package adds one
through the entry point group ``arrayfeed.backends``, registered with the same :class:`Backend`
(see "Contributing: where a format goes" in the design page); one that cannot be used gives a
:class:`PluginWarning`. ``arrayfeed.testing.SourceTests``
checks a source against the whole contract. Any object with the :class:`Source` protocol can
also be given to the entry points as it is:

>>> import numpy as np, arrayfeed as af
>>> from arrayfeed.storage import Source
>>> class Squares:
...     shape, dtype = (4,), np.dtype("int64")
...     def __len__(self) -> int:
...         return 4
...     def read(self, indices: np.ndarray) -> np.ndarray:
...         return indices * indices
>>> isinstance(Squares(), Source)
True
>>> next(iter(af.batches(Squares(), batch_size=4, shuffle=False)))
array([0, 1, 4, 9])

This module only names what :mod:`arrayfeed._storage` defines: one object, one public name.
"""

from ._storage import (
    ArrayLayout,
    Backend,
    Categorical,
    Chunked,
    Closeable,
    ConversionRecord,
    Encoded,
    GatherInto,
    Indices,
    Location,
    OpenOptions,
    PluginWarning,
    Portability,
    Portable,
    Prefetch,
    ReadPiecesInto,
    ReadRangeInto,
    RemotePath,
    RunReader,
    Source,
    SparseRows,
    StoreInfo,
    Verifiable,
    loaded,
    register,
    written_by_arrayfeed,
)

__all__ = [
    "ArrayLayout",
    "Backend",
    "Categorical",
    "Chunked",
    "Closeable",
    "ConversionRecord",
    "Encoded",
    "GatherInto",
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
    "SparseRows",
    "StoreInfo",
    "Verifiable",
    "loaded",
    "register",
    "written_by_arrayfeed",
]
