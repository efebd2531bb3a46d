"""Inputs of a conversion: what each name reads from, and reading them a run of rows at a time.

One name maps to one or more *parts* concatenated along axis 0. A part is an array-like (NumPy
array, ``np.memmap``, ``h5py.Dataset``, ``zarr.Array``, or what :func:`arrayfeed.open_array`
returns) or a path. A ``str`` is an *input spec*, the same syntax as on the command line:

- ``file.npy``; ``file.npz:key``; ``file.h5:key`` (or ``.hdf5``, or any HDF5 file); ``store.zarr``
  or ``store.zarr:key`` (the key may be omitted when the file or store holds exactly one array);
- a glob pattern (``*``, ``?``, ``[...]``, ``**``) in the path part, e.g. ``parts/*.npy`` or
  ``shards/*.h5:x``: every match, **sorted lexicographically** (zero-pad numbers:
  ``part-0010`` sorts after ``part-0009``, ``part-10`` before ``part-9``), concatenated in order.

A string that names an existing file as a whole is taken literally, so file names containing
``:`` or ``*`` still work; an ``os.PathLike`` (e.g. ``pathlib.Path``) is always literal
(:func:`.specs.locate`, which ``inspect`` and ``verify`` share).

A URL (``s3://bkt/train.zarr:x``, ``s3://bkt/parts/*.npy``, any fsspec protocol) reads from object
storage, with the ``storage_options`` given to :func:`open_input`; globs are expanded by the
filesystem.

``.npz`` members are streamed from the archive (never loaded whole), so every form converts in
bounded memory.
"""

from __future__ import annotations

import glob as globlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from .._dtypes import check_feedable, native_dtype
from .._errors import (
    ArrayfeedError,
    ConfigError,
    DtypeError,
    ShapeError,
    SourceNotFoundError,
    StructureError,
)
from .._storage import (
    Closeable,
    GatherInto,
    RunReader,
    Source,
    SparseRows,
    as_source_for_copy,
    expand_url,
    is_array_like,
    open_for_copy,
)
from .specs import locate

__all__ = ["InputLike", "Parts", "open_input", "read_run"]

#: An array-like (NumPy array, ``h5py.Dataset``, ``zarr.Array``, a Source), a path or a spec.
InputLike: TypeAlias = "np.ndarray | Source | str | os.PathLike[str] | Any"

_GLOB_RE = re.compile(r"[*?\[]")


def read_run(source: Source, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of ``source`` (a view where the backend allows)."""
    if isinstance(source, RunReader):
        return source.read_run(start, stop)
    return source.read(np.arange(start, stop, dtype=np.int64))


def _expand(
    spec: str, storage_options: Mapping[str, Any] | None = None
) -> list[tuple[Path | str, str | None]]:
    path, key = locate(spec)
    if isinstance(path, str):  # a URL: its filesystem expands the glob
        if not _GLOB_RE.search(path):
            return [(path, key)]
        matches = expand_url(path, storage_options or {})
        if not matches:
            raise SourceNotFoundError(f"no object matches the pattern '{path}'; check the pattern.")
        return [(m, key) for m in matches]
    if _GLOB_RE.search(str(path)) and not os.path.lexists(path):
        found = sorted(globlib.glob(str(path), recursive=True))
        if not found:
            raise SourceNotFoundError(f"no file matches the pattern '{path}'; check the pattern.")
        return [(Path(m), key) for m in found]
    return [(path, key)]


class Parts:
    """The input of one name: one or more sources concatenated along axis 0.

    All parts must share the dtype (byte order aside) and the row shape. Rows come out in the
    native byte order.
    """

    def __init__(
        self, name: str, sources: Sequence[Source], *, owned: Sequence[Source] = ()
    ) -> None:
        self.name = name
        self.sources = list(sources)
        self._owned = list(owned)
        first = self.sources[0]
        self.row_shape = tuple(int(n) for n in first.shape[1:]) if first.shape else ()
        self.dtype = native_dtype(first.dtype)
        for i, source in enumerate(self.sources):
            label = _label(name, i, len(self.sources), source)
            if len(source.shape) >= 1 and len(source) == 0 and len(self.sources) > 1:
                pass  # an empty part contributes no rows
            else:
                check_feedable(source, label)
            if tuple(source.shape[1:]) != self.row_shape:
                raise ShapeError(
                    f"`{label}` has rows of shape {tuple(source.shape[1:])} but `{name}[0]` has "
                    f"{self.row_shape}; only arrays with the same row shape can be concatenated."
                )
            if native_dtype(source.dtype) != self.dtype:
                raise DtypeError(
                    f"`{label}` has dtype {source.dtype} but `{name}[0]` has {first.dtype}; "
                    "cast the parts to one dtype before concatenating them."
                )
        kinds = {isinstance(source, SparseRows) for source in self.sources}
        if len(kinds) > 1:
            raise StructureError(
                f"`{name}` concatenates sparse matrices and dense arrays; give it parts of one "
                "kind (densify the sparse ones with `.toarray()`, or convert them separately)."
            )
        self.sparse = kinds == {True}
        self.lengths = [len(s) for s in self.sources]
        self.offsets = np.cumsum([0, *self.lengths]).astype(np.int64)
        self.n_rows = int(self.offsets[-1])
        if self.n_rows == 0:
            raise ShapeError(
                f"`{name}` has no rows (all its parts are empty); give it at least one row."
            )
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        if self.row_bytes == 0:
            raise ShapeError(
                f"`{name}` has rows of shape {self.row_shape}, which hold no data; drop it."
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n_rows, *self.row_shape)

    @property
    def gatherable(self) -> bool:
        """Every part gathers rows in any order cheaply (in memory or memory-mapped)."""
        return all(isinstance(s, GatherInto) for s in self.sources)

    def read_run(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the concatenation, C-contiguous, native byte order."""
        pieces = []
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        for p in range(first, len(self.sources)):
            lo, hi = int(self.offsets[p]), int(self.offsets[p + 1])
            if lo >= stop:
                break
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                pieces.append(read_run(self.sources[p], a - lo, b - lo))
        rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return np.ascontiguousarray(rows, dtype=self.dtype)

    def gather(self, indices: npt.NDArray[np.int64]) -> np.ndarray:
        """Rows ``indices`` (any order) of the concatenation; parts must be :attr:`gatherable`."""
        out = np.empty((len(indices), *self.row_shape), self.dtype)
        part = np.searchsorted(self.offsets, indices, side="right") - 1
        for p, source in enumerate(self.sources):
            mask = part == p
            if not mask.any():
                continue
            local = indices[mask] - self.offsets[p]
            if isinstance(source, GatherInto):
                rows = np.empty((len(local), *self.row_shape), source.dtype)
                source.gather_into(local, rows)
                out[mask] = rows
            else:
                order = np.argsort(local, kind="stable")
                rows = source.read(local[order])
                picked = np.empty_like(rows)
                picked[order] = rows
                out[mask] = picked
        return out

    # -- sparse matrices (:attr:`sparse`: every part is one) ----------------------------------
    @property
    def nnz(self) -> int:
        """Stored entries of the sparse matrix."""
        return sum(s.nnz for s in self.sources if isinstance(s, SparseRows))

    def row_lengths(self) -> npt.NDArray[np.int64]:
        """Stored entries of every row of the sparse matrix."""
        return np.concatenate([s.row_lengths() for s in self.sources if isinstance(s, SparseRows)])

    def read_stored(
        self, indices: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], np.ndarray]:
        """The stored entries of sorted, unique rows of the sparse matrix: ``(lengths, cols,
        values)`` (see :class:`~arrayfeed._storage.SparseRows`), values in the native order."""
        bounds = np.searchsorted(indices, self.offsets)
        pieces = []
        for p, source in enumerate(self.sources):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if lo < hi:
                assert isinstance(source, SparseRows)
                pieces.append(source.read_stored(indices[lo:hi] - self.offsets[p]))
        if not pieces:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, self.dtype)
        lengths, cols, values = (np.concatenate(column) for column in zip(*pieces, strict=True))
        return lengths, cols, values.astype(self.dtype, copy=False)

    def close(self) -> None:
        """Close the files this input opened itself (never a caller's own handles)."""
        for source in self._owned:
            _close(source)


def _close(source: Source) -> None:
    if isinstance(source, Closeable):
        source.close()


def _label(name: str, i: int, count: int, source: Source) -> str:
    """How messages name part ``i`` of ``count``: with its file, when it has one."""
    if count == 1:
        return name
    stored = getattr(source, "name", None)  # file-backed sources are named after their file
    if isinstance(stored, str) and stored not in (name, "array"):
        return f"{name}[{i}] ({stored})"
    return f"{name}[{i}]"


def open_input(name: str, value: Any, storage_options: Mapping[str, Any] | None = None) -> Parts:
    """Open the input named ``name`` (headers only; no rows are read); URLs open with
    ``storage_options``."""
    where = f"inputs[{name!r}]"
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError(f"`{where}` is an empty list; give it at least one array or path.")
    sources: list[Source] = []
    owned: list[Source] = []
    try:
        for item in items:
            if isinstance(item, str):
                for path, key in _expand(item, storage_options):
                    source = open_for_copy(path, key, storage_options)
                    sources.append(source)
                    owned.append(source)
            elif isinstance(item, os.PathLike):
                source = open_for_copy(Path(item), None)
                sources.append(source)
                owned.append(source)
            elif is_array_like(item):
                sources.append(as_source_for_copy(item, where))
            else:
                raise ConfigError(
                    f"`{where}` holds a value of type {type(item).__name__}, which is not an "
                    "array-like or a path; pass a NumPy array, h5py.Dataset, zarr.Array, path "
                    "or 'file:key' string (wrap a list of numbers in np.asarray)."
                )
        return Parts(where, sources, owned=owned)
    except ArrayfeedError as exc:
        for source in owned:
            _close(source)
        message = str(exc)
        if not message.startswith(f"`{where}"):
            message = f"`{where}`: {message}"
        raise type(exc)(message) from None
    except BaseException:
        for source in owned:
            _close(source)
        raise
