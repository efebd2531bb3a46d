"""What AnnData's attributes say a group or array encodes (``encoding-type``, ``shape`` …).

Read by both the openers (:mod:`.anndata`) and the facts for inspect and convert
(:mod:`.elements`), without the ``anndata`` package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..record import SPARSE_COMPONENTS

__all__ = ["COMPONENTS", "category_labels", "matrix_shape", "sparse_format", "text"]

#: The arrays of a compressed sparse matrix group.
COMPONENTS = SPARSE_COMPONENTS


def text(value: Any) -> str | None:
    """An attribute's value as ``str`` (HDF5 stores bytes or 0-d arrays), or None."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (str, np.str_)):
        return str(value)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "SUO":
        return text(value[()])
    return None


def sparse_format(attrs: Mapping[str, Any]) -> str | None:
    """``"csr"`` or ``"csc"`` for a group AnnData wrote as a sparse matrix, else None."""
    encoding = text(attrs.get("encoding-type"))
    if encoding in ("csr_matrix", "csc_matrix"):
        return encoding[:3]
    legacy = text(attrs.get("h5sparse_format"))
    return legacy if legacy in ("csr", "csc") else None


def matrix_shape(attrs: Mapping[str, Any]) -> tuple[int, int] | None:
    """The ``(rows, columns)`` a sparse matrix group records, or None."""
    shape = attrs.get("shape", attrs.get("h5sparse_shape"))
    try:
        n_rows, n_cols = (int(n) for n in np.asarray(shape).reshape(-1))
    except (TypeError, ValueError):
        return None
    return n_rows, n_cols


def category_labels(values: Any) -> tuple[str, ...]:
    """Category labels as ``str`` (HDF5 returns bytes; numeric categories are formatted)."""
    items = np.asarray(values).reshape(-1).tolist()
    return tuple(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in items)
