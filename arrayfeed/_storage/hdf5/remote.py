"""HDF5 files behind URLs, read-only, through h5py on an fsspec file object.

Ranged requests of :data:`H5_BLOCK_BYTES`, the most recent :data:`H5_BLOCKS` kept; with a cache
(``cache=``), blocks of the local cache's own size, kept there (:mod:`..remote.blocks`). Reads go
through h5py under one lock (the file object has one position), so they do not overlap. A
:class:`RemoteH5Source` pickles as its :class:`~..remote.paths.RemotePath` (URL, storage
options, cache) and key, and opens the file again in the process that unpickles it.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import h5py
import numpy as np

from ..._errors import ArrayfeedError, CorruptDataError, SourceNotFoundError
from ..._forks import renew_after_fork
from ..base import REOPENS, Indices, Portability
from ..remote.blocks import BlockFetcher, BlockFile, block_fetcher
from ..remote.errors import remote_error
from ..remote.paths import RemotePath
from .files import check_filters

__all__ = ["H5_BLOCKS", "H5_BLOCK_BYTES", "RemoteH5Source", "open_remote_h5"]

#: Bytes per ranged request of an HDF5 file, and how many such blocks each source keeps.
H5_BLOCK_BYTES = 1 << 20
H5_BLOCKS = 64


class _H5File:
    """An HDF5 file read through an fsspec file object (closed with the ``h5py.File``)."""

    def __init__(self, location: RemotePath, blocks: BlockFetcher | None = None) -> None:
        self.raw: Any
        if blocks is not None:
            self.raw = BlockFile(blocks)
        else:
            fs, path = location.filesystem()
            try:
                self.raw = fs.open(
                    path,
                    "rb",
                    block_size=H5_BLOCK_BYTES,
                    cache_type="blockcache",
                    cache_options={"maxblocks": H5_BLOCKS},
                )
            except Exception as exc:
                raise remote_error(exc, location.url) from None
        try:
            self.file = h5py.File(self.raw, "r")
        except OSError as exc:
            self.raw.close()
            raise CorruptDataError(f"cannot open HDF5 file '{location}' ({exc}).") from None

    def __enter__(self) -> h5py.File:
        return self.file

    def __exit__(self, *args: object) -> None:
        self.close()

    def close(self) -> None:
        self.file.close()
        self.raw.close()


def open_remote_h5(location: RemotePath) -> _H5File:
    """The HDF5 file at ``location``, opened (a context manager giving the ``h5py.File``)."""
    return _H5File(location, block_fetcher(location))


class RemoteH5Source:
    """One dataset of an HDF5 file behind a URL, read through h5py (read-only)."""

    def __init__(self, location: RemotePath, key: str, field: str | None = None) -> None:
        self.location, self.key, self.field = location, key, field
        self.name = f"{location.url}:{key}" + (f"#{field}" if field else "")
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._opened: tuple[int, _H5File, Any] | None = None
        # Through the cache, the file's version as the store reports it now travels with the
        # source: every process reads the blocks of the file this one opened.
        self._blocks = block_fetcher(location)
        dataset = self._dataset()
        shape, dtype = tuple(int(n) for n in dataset.shape), np.dtype(dataset.dtype)
        if field is not None:
            fields = dtype.fields or {}
            if field not in fields:
                raise SourceNotFoundError(f"HDF5 dataset '{self.name}' has no field {field!r}.")
            stored = np.dtype(fields[field][0])
            shape, dtype = (*shape, *stored.shape), np.dtype(stored.base)
        self._shape = shape
        self._dtype: np.dtype[Any] = dtype
        self._chunks = tuple(int(c) for c in dataset.chunks) if dataset.chunks else None
        check_filters(dataset, self.name)

    @classmethod
    def open(cls, location: RemotePath, key: str | None, field: str | None) -> RemoteH5Source:
        if key is None:
            with open_remote_h5(location) as f:
                names: list[str] = []
                f.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) else None)
            if len(names) != 1:
                raise SourceNotFoundError(
                    f"'{location}' holds {len(names)} datasets and no `key` names one; its "
                    f"datasets are {names}. Name one: '{location}:KEY'."
                )
            key = names[0]
        return cls(location, key, field)

    def _dataset(self) -> Any:
        opened = self._opened
        if opened is None or opened[0] != os.getpid():
            handle = _H5File(self.location, self._blocks)
            node = handle.file.get(self.key)
            if not isinstance(node, h5py.Dataset):
                handle.close()
                raise SourceNotFoundError(f"'{self.location}' has no dataset {self.key!r}.")
            opened = self._opened = (os.getpid(), handle, node)
        return opened[2]

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 0

    @property
    def chunk_rows(self) -> int | None:
        return min(self._chunks[0], len(self)) or None if self._chunks else None

    @property
    def chunks(self) -> tuple[int, ...] | None:
        return self._chunks

    def kept_locally(self) -> bool:
        """Whether the blocks read are kept in a local cache."""
        return self._blocks is not None and self._blocks.kept_locally

    def portability(self) -> Portability:
        return REOPENS  # the URL and storage options travel; the other process fetches

    def read(self, indices: Indices) -> np.ndarray:
        if not len(indices):
            return np.empty((0, *self._shape[1:]), self._dtype)
        out = np.empty((len(indices), *self._shape[1:]), self._dtype)
        # One slab per chunk touched (or per 256 rows of contiguous data), from its first to its
        # last row asked for: whole chunks are read from storage anyway.
        group = indices // (self._chunks[0] if self._chunks else 256)
        cuts = np.concatenate(([0], np.flatnonzero(np.diff(group)) + 1, [len(indices)])).tolist()
        with self._lock:
            try:
                view = self._dataset()
                view = view.fields(self.field) if self.field is not None else view
                for a, b in itertools.pairwise(cuts):
                    lo, hi = int(indices[a]), int(indices[b - 1]) + 1
                    slab = np.asarray(view[lo:hi])
                    out[a:b] = slab if hi - lo == b - a else slab[indices[a:b] - lo]
            except ArrayfeedError:
                raise
            except Exception as exc:
                raise remote_error(exc, self.location.url) from exc
        return out

    def read_run(self, start: int, stop: int) -> np.ndarray:
        return self.read(np.arange(start, stop, dtype=np.int64))

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, None
        if opened is not None and opened[0] == os.getpid():
            opened[1].close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        state["_opened"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")

    def __repr__(self) -> str:
        return f"RemoteH5Source({self.name!r}, shape={self.shape}, dtype={self.dtype})"
