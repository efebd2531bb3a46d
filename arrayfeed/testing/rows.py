"""Arrays for the conformance tests, and the bit-for-bit comparison they use."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from .._dtypes import native_dtype

__all__ = ["assert_same_rows", "garbage", "indices", "sample_data"]

Indices = npt.NDArray[np.int64]

#: Byte that output buffers are filled with before a read, so rows left unwritten show.
_GARBAGE = 0xA5


def sample_data(
    dtype: npt.DTypeLike, row_shape: tuple[int, ...] = (), *, n_rows: int = 300, seed: int = 0
) -> np.ndarray:
    """A C-contiguous array of ``n_rows`` rows of ``row_shape`` in ``dtype``, from random bits.

    Integers take every bit pattern; floating-point (and complex) data also holds ``-0.0``,
    infinities and NaNs with payloads, which a backend must return unchanged; booleans are 0 or 1.
    """
    dtype = np.dtype(dtype)
    shape = (n_rows, *row_shape)
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind not in "iufc":
        raise TypeError(f"`dtype` must be a bool, integer, float or complex dtype (got {dtype}).")
    raw = rng.integers(0, 256, size=math.prod(shape) * dtype.itemsize, dtype=np.uint8)
    data = raw.view(dtype).reshape(shape)
    if dtype.kind in "fc" and data.size:
        # Complex data: the same special values in its real and imaginary parts.
        part = np.dtype(f"{dtype.byteorder}f{dtype.itemsize // 2}") if dtype.kind == "c" else dtype
        flat = data.reshape(-1).view(part)
        specials = np.array([-0.0, np.inf, -np.inf, np.nan, -np.nan, np.nan], dtype=part)
        specials.view(f"{part.byteorder}u{part.itemsize}")[-1] |= 1  # a NaN with a payload
        at = rng.choice(flat.size, size=min(flat.size, len(specials)), replace=False)
        flat[at] = specials[: len(at)]
    return np.ascontiguousarray(data)


def assert_same_rows(actual: np.ndarray, expected: np.ndarray, what: str = "rows") -> None:
    """Raise ``AssertionError`` unless ``actual`` holds exactly the bits of ``expected``: same
    shape, same dtype byte order aside, same bytes (NaN payloads and ``-0.0`` included)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape}, expected {expected.shape}")
    if native_dtype(actual.dtype) != native_dtype(expected.dtype):
        raise AssertionError(f"{what}: dtype {actual.dtype}, expected {expected.dtype}")
    if not actual.size:
        return
    # Native byte order, C order, then the bytes of each row side by side.
    a = np.atleast_1d(np.ascontiguousarray(actual, dtype=native_dtype(actual.dtype)))
    e = np.atleast_1d(np.ascontiguousarray(expected, dtype=native_dtype(expected.dtype)))
    a_bytes = a.reshape(-1).view(np.uint8).reshape(len(a), -1)
    e_bytes = e.reshape(-1).view(np.uint8).reshape(len(e), -1)
    differ = np.flatnonzero((a_bytes != e_bytes).any(axis=1))
    if len(differ):
        # With its bytes: NaNs differ in their bits only, which repr does not show.
        row = int(differ[0])
        k = int(np.flatnonzero(a_bytes[row] != e_bytes[row])[0]) // a.itemsize
        where = tuple(int(i) for i in np.unravel_index(k, a.shape[1:])) if a.ndim > 1 else ()
        size = slice(k * a.itemsize, (k + 1) * a.itemsize)
        raise AssertionError(
            f"{what}: {len(differ)} of {len(a)} rows differ; in row {row}, element {where} is "
            f"{a[row].reshape(-1)[k]!r} (bytes {a_bytes[row, size].tobytes().hex()}), expected "
            f"{e[row].reshape(-1)[k]!r} (bytes {e_bytes[row, size].tobytes().hex()})"
        )


def indices(values: Any) -> Indices:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def garbage(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """A C-contiguous native-order array of ``shape`` filled with a recognisable byte."""
    out = np.empty(shape, dtype=native_dtype(dtype))
    out.reshape(-1).view(np.uint8)[...] = _GARBAGE
    return out
