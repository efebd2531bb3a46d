"""``sparse=True``: batches of sparse leaves as their nonzeros instead of dense rows.

No TensorFlow here. A leaf read from sparse storage (a :class:`~arrayfeed._storage.SparseRows`
source: an AnnData CSR group, a ``scipy.sparse`` CSR matrix) yields dense rows by default. With
``sparse=True`` the feed is a :class:`SparseFeed`: the same plan, so the same rows in every batch,
but each sparse leaf's batch is a :class:`SparseBatch` (canonical CSR: rows sorted, columns sorted
within a row, no repeated entries), never densified. The tf.data glue turns it into a
``tf.SparseTensor`` of ``dense_shape`` ``(batch rows, n_cols)``; :class:`arrayfeed.Batches` into a
``scipy.sparse.csr_array``. Other leaves are read as before.

The nonzeros of one batch differ in number from the next, so batches are not stacked: every
generator element is one batch (they are still read a group at a time).
"""

from __future__ import annotations

import importlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._dtypes import native_dtype
from ..._errors import ConfigError
from ..._storage import Source, SparseRows, ragged_arange, row_bytes
from ..._validate import flag
from ..plan.indexblocks import EpochIndices
from .feed import GROUP_BYTES, Feed
from .mapbatch import LeafSpec
from .rows import Allocator, read_rows
from .structure import Treedef, flatten

__all__ = [
    "SparseBatch",
    "SparseFeed",
    "SparseLeafSpec",
    "check_sparse",
    "is_batch_leaf",
    "to_scipy",
]

Indices = npt.NDArray[np.int64]

#: Most batches a :class:`SparseFeed` reads at once (a group), whatever their size.
SPARSE_GROUP_STEPS = 32


@dataclass(frozen=True)
class SparseBatch:
    """One batch of a sparse leaf, in canonical CSR form.

    Attributes:
        indptr: ``rows + 1`` offsets (``int64``) into ``cols`` and ``values``.
        cols: The column of each value (``int64``), increasing within a row.
        values: The stored values, in the leaf's dtype.
        n_cols: Columns of the matrix.

    >>> b = SparseBatch(np.array([0, 1, 3]), np.array([2, 0, 1]), np.array([1.0, 2.0, 3.0]), 4)
    >>> b.shape, b.coo_indices().tolist()
    ((2, 4), [[0, 2], [1, 0], [1, 1]])
    >>> b.toarray().tolist()
    [[0.0, 0.0, 1.0, 0.0], [2.0, 3.0, 0.0, 0.0]]
    """

    indptr: Indices
    cols: Indices
    values: np.ndarray
    n_cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.indptr) - 1, self.n_cols

    def dense_shape(self) -> Indices:
        """:attr:`shape` as an ``int64`` array (``tf.SparseTensor.dense_shape``)."""
        return np.asarray(self.shape, dtype=np.int64)

    def row_ids(self) -> Indices:
        """The row of each value."""
        return np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))

    def coo_indices(self) -> Indices:
        """``(nnz, 2)`` ``[row, col]`` pairs in row-major order (``tf.SparseTensor.indices``)."""
        return np.stack([self.row_ids(), self.cols], axis=1)

    def toarray(self) -> np.ndarray:
        """The batch as dense rows."""
        out = np.zeros(self.shape, dtype=self.values.dtype)
        out[self.row_ids(), self.cols] = self.values
        return out

    def to_scipy(self) -> Any:
        """The batch as a ``scipy.sparse.csr_array`` (over these arrays, without a copy)."""
        sparse = importlib.import_module("scipy.sparse")  # optional: `batches` needs it
        return sparse.csr_array((self.values, self.cols, self.indptr), shape=self.shape)


@dataclass(frozen=True)
class SparseLeafSpec(LeafSpec):
    """The spec of a leaf yielded as :class:`SparseBatch` (``row_shape`` is ``(n_cols,)``)."""


def is_batch_leaf(obj: Any) -> bool:
    """What a feed yields as one leaf: an array or a :class:`SparseBatch`."""
    return isinstance(obj, (np.ndarray, SparseBatch))


def to_scipy(treedef: Treedef, element: Any) -> Any:
    """``element`` with each :class:`SparseBatch` as a ``scipy.sparse.csr_array``."""
    leaves, _ = flatten(element, is_batch_leaf)
    return treedef.unflatten(
        [leaf.to_scipy() if isinstance(leaf, SparseBatch) else leaf for leaf in leaves]
    )


def check_sparse(sparse: Any, sources: Sequence[Source], map_batch: Any, caller: str) -> bool:
    """Whether the feed yields sparse batches (``sparse=True``), refusing what cannot: no sparse
    leaf, a ``map_batch`` (it takes NumPy arrays), or ``batches`` without scipy."""
    if not flag(sparse, "sparse"):
        return False
    if not any(isinstance(s, SparseRows) for s in sources):
        raise ConfigError(
            "`sparse=True` yields the sparse leaves of a batch as sparse tensors, but no leaf is "
            "sparse (an AnnData CSR group such as `open_array('data.h5ad', 'X')`, or a "
            "scipy.sparse CSR matrix); drop `sparse`."
        )
    if map_batch is not None:
        raise ConfigError(
            "`sparse=True` and `map_batch` cannot be combined: `map_batch` receives NumPy "
            "arrays. Drop `sparse` (sparse leaves then arrive dense) or `map_batch`."
        )
    if caller == "batches":
        try:
            importlib.import_module("scipy.sparse")
        except ImportError:
            raise ConfigError(
                "`batches(..., sparse=True)` yields scipy.sparse.csr_array batches, and scipy is "
                "not installed; `pip install scipy`, or drop `sparse` for dense rows."
            ) from None
    return True


class SparseFeed(Feed):
    """A :class:`Feed` that yields each sparse leaf's batch as a :class:`SparseBatch`, one batch
    per element (see the module docstring).

    Batches are still read a group at a time, one ``read_csr`` per group and sparse leaf: on
    chunked storage a shuffled read decodes most chunks it touches whatever its size, so a read
    of 256 rows costs about what one of a few thousand does. Groups are sized on the bytes the
    batches hold (stored values, not dense rows), up to :data:`SPARSE_GROUP_STEPS` batches.
    """

    def __init__(self, sources: Sequence[Source], *args: Any, **kwargs: Any) -> None:
        super().__init__(sources, *args, **kwargs)
        self.sparse_leaves = tuple(isinstance(s, SparseRows) for s in self.sources)
        self.specs = [
            SparseLeafSpec(spec.row_shape, spec.dtype) if sparse else spec
            for spec, sparse in zip(self.specs, self.sparse_leaves, strict=True)
        ]
        row = 0.0
        for source, sparse in zip(self.sources, self.sparse_leaves, strict=True):
            if isinstance(source, SparseRows) and sparse:
                per_row = source.nnz / max(1, len(source))
                row += per_row * (np.dtype(source.dtype).itemsize + 8)  # values and columns
            else:
                row += row_bytes([source])
        batch_bytes = max(1, int(row * self.plan.batch_size))
        self.group_steps = int(max(1, min(SPARSE_GROUP_STEPS, GROUP_BYTES // batch_bytes)))
        self.pool = self._new_pool()  # sized on these groups
        self._window_pool = self._new_window_pool()

    @property
    def stacked(self) -> bool:
        """Never: a group's batches are yielded one by one (their nonzeros differ in number)."""
        return False

    def epoch(self, epoch: int, start_step: int = 0) -> Generator[Any, None, None]:
        """The batches of ``epoch`` from ``start_step`` on, one element each."""
        groups = super().epoch(epoch, start_step)
        try:
            for group in groups:
                yield from group
        finally:
            groups.close()

    def readers(self, epoch: int) -> list[Source]:
        """As :meth:`Feed.readers`, but sparse leaves are read from their source, by rows."""
        readers = super().readers(epoch)
        return [
            source if sparse else reader
            for reader, source, sparse in zip(
                readers, self.sources, self.sparse_leaves, strict=True
            )
        ]

    def read_group(
        self,
        epoch: int,
        first: int,
        stop: int,
        readers: Sequence[Source] | None = None,
        blocks: EpochIndices | None = None,
        out: Allocator | None = None,
    ) -> list[Any]:
        """Steps ``[first, stop)`` of ``epoch`` as a list of elements: dense leaves as arrays,
        sparse leaves as :class:`SparseBatch`."""
        readers = list(readers or self.readers(epoch))
        plan = self.plan
        rows = plan.batch_rows(first)
        steps = stop - first
        indices = self.group_indices(epoch, first, stop, blocks)
        dense = [r for r, sparse in zip(readers, self.sparse_leaves, strict=True) if not sparse]
        arrays = read_rows(dense, indices, lead_shape=(steps, rows), pool=self.pool)
        columns: list[list[Any]] = []
        for reader, sparse in zip(readers, self.sparse_leaves, strict=True):
            if sparse:
                columns.append(_sparse_batches(reader, indices, steps))
            else:
                columns.append(list(arrays.pop(0)))
        return [self.treedef.unflatten([c[i] for c in columns]) for i in range(steps)]


def _sparse_batches(source: Source, indices: Indices, steps: int) -> list[SparseBatch]:
    """Rows ``indices`` (any order, repeats allowed) of a sparse source, as ``steps`` batches of
    equal size, from one ``read_csr`` of the rows they hold."""
    assert isinstance(source, SparseRows)
    n_cols = int(source.shape[1])
    dtype = native_dtype(source.dtype)
    unique = np.unique(indices)
    indptr, cols, values = source.read_csr(unique)
    where = np.searchsorted(unique, indices)
    lengths = np.diff(indptr)[where]
    starts = indptr[:-1][where]
    rows = len(indices) // steps
    batches = []
    for b in range(steps):
        part = slice(b * rows, (b + 1) * rows)
        ends = np.cumsum(lengths[part])
        picked = ragged_arange(starts[part], lengths[part])
        batch_indptr = np.concatenate(([0], ends)).astype(np.int64)
        batches.append(
            SparseBatch(batch_indptr, cols[picked], np.asarray(values[picked], dtype), n_cols)
        )
    return batches
