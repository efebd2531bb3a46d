"""The ``map_batch`` contract: what a ``map_batch`` returns, learned once and held on every batch.

No TensorFlow, no I/O. :func:`probe` calls ``map_batch`` once, on the first rows of the worker's
range, and learns its :class:`Contract`: the structure of what it returns and each leaf's per-row
shape and dtype (and how long a batch takes). Every later batch is held to that contract by
:meth:`Contract.check`, one message for each way a result can differ, so the dataset's
signature and the buffers sized from it stay true.

Reader threads call ``map_batch`` through :meth:`Contract.apply`, in this process or in a loader
process (:mod:`.loader`), whose errors come back here as the same exceptions, word for word.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._dtypes import native_dtype
from ..._errors import DtypeError, MapBatchError, StructureError
from .structure import Treedef, flatten
from .waits import queued

__all__ = ["Contract", "LeafSpec", "is_array", "probe"]

#: How the results of ``map_batch`` are named in messages (``map_batch(...)['image']``).
RESULT = "map_batch(...)"


@dataclass(frozen=True)
class LeafSpec:
    """Per-row shape and dtype of one leaf of the element."""

    row_shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize


def is_array(obj: Any) -> bool:
    """Whether ``obj`` is one array of a ``map_batch`` result (a leaf), not a structure."""
    return isinstance(obj, np.ndarray) or (
        hasattr(obj, "__array__") and not isinstance(obj, (tuple, list, dict))
    )


@dataclass(frozen=True)
class Contract:
    """What every result of a ``map_batch`` must be: the structure and leaf specs of its first."""

    treedef: Treedef
    specs: tuple[LeafSpec, ...]

    def apply(self, map_batch: Callable[[Any], Any], batch: Any, rows: int) -> list[np.ndarray]:
        """The arrays ``map_batch`` returns for ``batch`` (of ``rows`` rows), checked."""
        try:
            result = map_batch(batch)
        except Exception as exc:
            raise MapBatchError(f"`map_batch` raised {type(exc).__name__}: {exc}") from exc
        return self.check(result, rows)

    def check(self, result: Any, rows: int) -> list[np.ndarray]:
        """The arrays of a ``map_batch`` result, or :class:`MapBatchError` naming how it differs
        from what the probe returned."""
        arrays, treedef = _arrays(result)
        if treedef != self.treedef:
            raise MapBatchError(
                f"`map_batch` returned a structure {_describe(treedef)} but earlier returned "
                f"{_describe(self.treedef)}; it must return the same structure for every batch."
            )
        for i, (array, spec) in enumerate(zip(arrays, self.specs, strict=True)):
            if array.ndim == 0 or array.shape[0] != rows:
                raise _batch_size_changed(treedef.leaf_paths(RESULT)[i], array, rows)
            if (tuple(array.shape[1:]), native_dtype(array.dtype)) != (spec.row_shape, spec.dtype):
                raise MapBatchError(
                    f"`{treedef.leaf_paths(RESULT)[i]}` has rows of shape {array.shape[1:]} and "
                    f"dtype {array.dtype}, but earlier batches had {spec.row_shape} and "
                    f"{spec.dtype}; `map_batch` must return the same row shapes and dtypes for "
                    "every batch."
                )
        return arrays


def probe(
    map_batch: Callable[[Any], Any], batch: Any, rows: int, batch_size: int
) -> tuple[Contract, float]:
    """Call ``map_batch`` on ``batch`` (the first ``rows`` rows, in storage order) to learn its
    contract, and the seconds it takes per batch of ``batch_size`` rows: by the clock, less the
    time its thread waited for a core (other processes keeping every core busy are not the
    map's cost; a map that waits for a service still counts its wait)."""
    started, waited = time.perf_counter(), queued()
    try:
        result = map_batch(batch)
    except Exception as exc:
        raise MapBatchError(
            f"`map_batch` raised {type(exc).__name__} on a first batch of {rows} rows: {exc}"
        ) from exc
    took = max(0.0, time.perf_counter() - started - (queued() - waited))
    seconds = took * batch_size / max(1, rows)
    arrays, treedef = _arrays(result)
    specs = []
    for name, array in zip(treedef.leaf_paths(RESULT), arrays, strict=True):
        if array.ndim == 0 or array.shape[0] != rows:
            raise _batch_size_changed(name, array, rows)
        if array.dtype.hasobject or array.dtype.kind in "USVMm":
            raise DtypeError(f"`{name}` has dtype {array.dtype}, which TensorFlow cannot take.")
        if 0 in array.shape[1:]:
            raise MapBatchError(
                f"`{name}` has rows of shape {array.shape[1:]}, which hold no data; TensorFlow "
                "cannot feed zero-size batches. Return rows with at least one element."
            )
        specs.append(LeafSpec(tuple(array.shape[1:]), native_dtype(array.dtype)))
    return Contract(treedef, tuple(specs)), seconds


def _arrays(result: Any) -> tuple[list[np.ndarray], Treedef]:
    """The leaves of a ``map_batch`` result as arrays, and its structure."""
    try:
        leaves, treedef = flatten(result, is_array, RESULT)
    except StructureError as exc:
        raise MapBatchError(str(exc)) from None
    return [np.asarray(leaf) for leaf in leaves], treedef


def _batch_size_changed(name: str, array: np.ndarray, rows: int) -> MapBatchError:
    return MapBatchError(
        f"`{name}` has shape {array.shape}, but the batch has {rows} rows; `map_batch` "
        "must keep the batch size (axis 0) of every array it returns."
    )


def _describe(treedef: Treedef) -> str:
    return ", ".join(treedef.leaf_paths("out")) if treedef.kind != "leaf" else "a single array"
