"""Sparse matrices read by rows: ``scipy.sparse`` CSR matrices and AnnData's encoded elements.

- :mod:`.csr`: :class:`~.csr.CSRSource`, a CSR matrix whose ``data``, ``indices`` and ``indptr``
  are sources of their own, read by rows through ``indptr`` (dense rows, or the nonzeros);
- :mod:`.rows`: the pure NumPy behind it (ragged ranges, merged spans, scattering entries);
- :mod:`.encoding`: what AnnData's attributes say a group or array encodes;
- :mod:`.anndata`: AnnData's sparse matrices and categoricals in ``.h5ad`` files and Zarr stores
  opened as sources;
- :mod:`.elements`: the same elements as facts for ``inspect`` and ``convert``;
- :mod:`.backend`: the family's :class:`~.backend.SparseBackend`, registered here; it is asked
  before HDF5 and Zarr open a key as a plain array.
"""

from ..registry import register
from .backend import SparseBackend

register(SparseBackend())
