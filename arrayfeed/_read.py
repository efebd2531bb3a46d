"""Reading rows of several sources into fresh, aligned buffers.

Every call returns memory that nobody else holds: the buffers are allocated here, filled, and
handed over. ``tf.data`` may wrap a yielded buffer without copying it and use (or even write into)
it later, so arrayfeed never yields a view of a caller's array and never reuses a buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._sources import GatherInto, Source

__all__ = ["ALIGNMENT", "aligned_empty", "native_dtype", "read_rows"]

#: Byte alignment of fresh buffers; TensorFlow copies less aligned ones.
ALIGNMENT = 64


def native_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """``dtype`` in the machine's byte order (what TensorFlow needs)."""
    return np.dtype(dtype).newbyteorder("=")


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """A new uninitialised C-contiguous array whose data starts on an ``ALIGNMENT``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


class _SortedRequest:
    """Sorted, de-duplicated form of a request, computed once and shared by every source."""

    def __init__(self, indices: npt.NDArray[np.int64]) -> None:
        order = np.argsort(indices, kind="stable")
        ordered = indices[order]
        keep = np.ones(len(ordered), dtype=bool)
        keep[1:] = ordered[1:] != ordered[:-1]
        self.unique = ordered[keep]
        # ``inverse[i]`` is where ``indices[i]`` sits in ``unique``.
        self.inverse = np.empty(len(indices), dtype=np.int64)
        self.inverse[order] = np.cumsum(keep) - 1


def read_rows(
    sources: Sequence[Source],
    indices: npt.NDArray[np.int64],
    lead_shape: tuple[int, ...] | None = None,
) -> list[np.ndarray]:
    """Rows ``indices`` (any order, duplicates allowed) of every source, in that order.

    Each result is a fresh aligned array of shape ``lead_shape + row_shape`` (``lead_shape``
    defaults to ``(len(indices),)`` and must hold ``len(indices)`` elements).
    """
    lead = (len(indices),) if lead_shape is None else lead_shape
    request: _SortedRequest | None = None
    results = []
    for source in sources:
        out = aligned_empty(lead + tuple(source.shape[1:]), native_dtype(source.dtype))
        flat = out.reshape((len(indices), *out.shape[len(lead) :]))
        if isinstance(source, GatherInto):
            source.gather_into(indices, flat)
        else:
            if request is None:
                request = _SortedRequest(indices)
            data = source.read(request.unique)
            np.take(data, request.inverse, axis=0, out=flat)
        results.append(out)
    return results
