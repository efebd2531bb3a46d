"""Which dtypes arrayfeed feeds, and in which byte order: TensorFlow's dtype policy, in one place.

TensorFlow represents bool, (u)int8-64, float16/32/64 and complex64/128 natively, in the machine's
byte order. Everything else (objects, strings, structured and datetime dtypes) is refused with a
named error that says how to encode it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import DtypeError, ShapeError

__all__ = ["check_feedable", "native_dtype"]

#: dtypes TensorFlow represents natively (byte order aside: non-native orders are converted).
_FEEDABLE_KINDS = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}


def native_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """``dtype`` in the machine's byte order (what TensorFlow needs)."""
    return np.dtype(dtype).newbyteorder("=")


def check_feedable(source: Any, name: str) -> None:
    """Raise a named error if ``source`` cannot be fed to TensorFlow as batches of rows."""
    dtype = np.dtype(source.dtype)
    stored = getattr(source, "name", name)  # a file-backed source is named after its file
    label = f"`{name}`" if stored in (name, "array") else f"`{name}` ('{stored}')"
    if dtype.hasobject:
        raise DtypeError(
            f"{label} has dtype object, which TensorFlow cannot take; convert it to a numeric "
            "dtype (e.g. `np.asarray(a, dtype=np.float32)`)."
        )
    if dtype.fields is not None:
        raise DtypeError(
            f"{label} has a structured dtype {dtype}; pass each field as its own array: for an "
            "HDF5 table, `arrayfeed.open_array(path, key, field='name')` (or the path "
            "'file.h5:key#name') streams one field; in memory, `{'a': arr['a'], 'b': arr['b']}`."
        )
    if dtype.kind in "USM" or dtype.kind == "m":
        raise DtypeError(
            f"{label} has dtype {dtype}, which arrayfeed does not feed; encode it as numbers "
            "(e.g. token ids or integer timestamps) first."
        )
    if dtype.itemsize not in _FEEDABLE_KINDS.get(dtype.kind, ()):
        raise DtypeError(
            f"{label} has dtype {dtype}, which TensorFlow cannot represent; cast it to a supported "
            "dtype (bool, (u)int8-64, float16/32/64, complex64/128)."
        )
    if len(source.shape) == 0:
        raise ShapeError(
            f"{label} is 0-d (a scalar); arrayfeed needs arrays with a batch axis. Use shape (N, ...)."
        )
    if len(source) == 0:
        raise ShapeError(f"{label} is empty (shape {source.shape}); give it at least one row.")
    if 0 in tuple(source.shape[1:]):
        raise ShapeError(
            f"{label} has rows of shape {tuple(source.shape[1:])}, which hold no data; TensorFlow "
            "cannot feed zero-size batches (it crashes on them). Drop the array, or give its rows "
            "at least one element."
        )
