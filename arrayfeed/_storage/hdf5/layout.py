"""What reading a chunked HDF5 dataset's raw chunks needs, asked of h5py once.

:meth:`ChunkLayout.of` describes a dataset whose raw chunks :mod:`.rawchunks` can decode exactly
as HDF5 does, or says why not (a string), and the caller reads through h5py instead;
:func:`chunk_index` lists where every chunk lies in the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from .codecs import FILTER_NAMES, pipeline

__all__ = ["ChunkLayout", "Filters", "chunk_index"]

Filters = tuple[tuple[int, tuple[int, ...], str], ...]


def _filters(dataset: h5py.Dataset) -> Filters:
    """``(id, parameters, name)`` of every filter of ``dataset``, in the order they apply."""
    plist = dataset.id.get_create_plist()
    found = []
    for i in range(plist.get_nfilters()):
        code, _flags, values, label = plist.get_filter(i)
        name = FILTER_NAMES.get(code) or label.decode(errors="replace") or f"filter {code}"
        found.append((int(code), tuple(int(v) for v in values), name))
    return tuple(found)


def _native_type(dataset: h5py.Dataset, dtype: np.dtype[Any]) -> bool:
    """Whether the stored type is the native in-memory layout of ``dtype`` (so raw bytes are the
    values, as h5py would return them without conversion)."""
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        return False
    if dtype.kind not in "biufc" or not dtype.isnative:
        return False
    try:
        return bool(dataset.id.get_type().equal(h5py.h5t.py_create(dtype)))
    except (TypeError, ValueError):  # pragma: no cover - a type h5py cannot describe
        return False


@dataclass(frozen=True)
class ChunkLayout:
    """What reading a chunked dataset's raw chunks needs, all picklable (no handles): the
    per-process state is a :class:`ChunkFile` from :meth:`open`."""

    filename: str
    key: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype[Any]
    fill: Any
    filters: Filters

    @classmethod
    def of(cls, dataset: h5py.Dataset) -> ChunkLayout | str:
        """The layout of ``dataset`` if its raw chunks can be decoded here, else why not."""
        file = dataset.file
        if dataset.chunks is None or dataset.is_virtual:
            return "the dataset is not chunked"
        if not hasattr(os, "pread") or not hasattr(os, "preadv"):  # pragma: no cover - Windows
            return "this platform has no os.pread and os.preadv"
        if file.driver != "sec2":
            return f"the file is opened with HDF5's '{file.driver}' driver, not a plain local file"
        if file.mode != "r" or file.swmr_mode:
            return "the file is open for writing or through SWMR, so chunks may move"
        shape = tuple(int(n) for n in dataset.shape)
        if not shape or 0 in shape:
            return "the dataset is empty"
        dtype = np.dtype(dataset.dtype)
        if not _native_type(dataset, dtype):
            return f"its type ({dtype}) is not a plain number type in this machine's byte order"
        plist = dataset.id.get_create_plist()
        if plist.get_fill_time() == h5py.h5d.FILL_TIME_NEVER:
            return "its fill time is 'never', so chunks never written hold undefined values"
        filters = _filters(dataset)
        stages = pipeline(filters, dtype.itemsize)
        if isinstance(stages, str):
            return stages
        return cls(
            filename=str(file.filename),
            key=str(dataset.name),
            shape=shape,
            chunks=tuple(int(c) for c in dataset.chunks),
            dtype=dtype,
            fill=dataset.fillvalue,
            filters=filters,
        )


def chunk_index(
    dataset: h5py.Dataset, shape: tuple[int, ...], chunks: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte offset (-1: never written), stored size and filter mask of every chunk, as arrays
    shaped like the chunk grid; from h5py, once."""
    grid = tuple(-(-n // c) for n, c in zip(shape, chunks, strict=True))
    offsets = np.full(grid, -1, dtype=np.int64)
    sizes = np.zeros(grid, dtype=np.int64)
    masks = np.zeros(grid, dtype=np.uint32)

    def add(info: Any) -> None:
        coords = tuple(int(o) // c for o, c in zip(info.chunk_offset, chunks, strict=True))
        if all(i < g for i, g in zip(coords, grid, strict=True)):  # not beyond a shrunk shape
            offsets[coords], sizes[coords] = int(info.byte_offset), int(info.size)
            masks[coords] = int(info.filter_mask)

    if hasattr(dataset.id, "chunk_iter"):  # HDF5 >= 1.12.3: one pass
        dataset.id.chunk_iter(add)
    else:  # pragma: no cover - older HDF5
        for i in range(dataset.id.get_num_chunks()):
            add(dataset.id.get_chunk_info(i))
    return offsets, sizes, masks
