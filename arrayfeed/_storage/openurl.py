"""Arrays behind URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://`` …): the URL side of
:mod:`.open`.

- Zarr stores (``.zarr``, or any prefix holding Zarr metadata) open through Zarr's
  ``FsspecStore`` and are read by :class:`~.zarrchunks.ChunkReader` with many chunks in flight.
- HDF5 files (read-only) open through ``h5py`` on an fsspec file object: ranged requests of
  :data:`H5_BLOCK_BYTES`, the most recent :data:`H5_BLOCKS` kept. Reads go through h5py under
  one lock (the file object has one position), so they do not overlap.
- ``.npy`` files are read with ranged requests, one per run of rows, all in flight at once.

Every source here pickles as its :class:`~.remote.RemotePath` (URL and storage options) and the
key, and opens the data again in the process that unpickles it.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from .._errors import ArrayfeedError, ConfigError, CorruptDataError, SourceNotFoundError
from .._forks import renew_after_fork
from . import anndata, h5describe, hdf5, npy, zarr
from .base import ArrayLayout, Indices, Source, StoreInfo
from .record import ConversionRecord
from .remote import RemotePath, remote_error

__all__ = [
    "RemoteH5Source",
    "RemoteNpySource",
    "array_keys_url",
    "as_remote",
    "describe_url",
    "open_url",
    "record_url",
    "split_url",
]

#: Bytes per ranged request of an HDF5 file, and how many such blocks each source keeps.
H5_BLOCK_BYTES = 1 << 20
H5_BLOCKS = 64

_SUFFIXES = r"npy|npz|h5|hdf5|he5|hdf|h5ad|nc|nc4|zarr"
_URL_SPEC = re.compile(
    rf"^(?P<path>[A-Za-z][\w+.\-]*://.+?\.(?:{_SUFFIXES}))(?::(?P<key>.*))?$", re.I
)
_ZARR_METADATA = ("zarr.json", ".zgroup", ".zarray")


def as_remote(
    path: str | os.PathLike[str] | RemotePath, storage_options: Mapping[str, Any] | None
) -> RemotePath:
    """``path`` with ``storage_options`` (a :class:`RemotePath` keeps its own unless given)."""
    if isinstance(path, RemotePath):
        return path if storage_options is None else RemotePath(path.url, storage_options)
    return RemotePath(os.fspath(path), storage_options or {})


def split_url(spec: str) -> tuple[str, str | None]:
    """Split ``URL[:key]``; a ``:`` in the host part (a port) is not a key.

    >>> split_url("s3://bkt/train.zarr:images")
    ('s3://bkt/train.zarr', 'images')
    >>> split_url("http://host:8000/data/x")
    ('http://host:8000/data/x', None)
    >>> split_url("s3://bkt/data:x")
    ('s3://bkt/data', 'x')
    """
    match = _URL_SPEC.match(spec)
    if match is not None:
        return match["path"], match["key"] or None
    protocol, rest = spec.split("://", 1)
    host, slash, path = rest.partition("/")
    if ":" in path:
        path, _, key = path.rpartition(":")
        return f"{protocol}://{host}{slash}{path}", key or None
    return spec, None


def _kind(location: RemotePath) -> str:
    """``"npy"``, ``"npz"``, ``"hdf5"`` or ``"zarr"`` (from the suffix, else by looking)."""
    suffix = location.suffix.lower()
    if suffix in (".npy", ".npz"):
        return suffix[1:]
    if suffix == ".zarr":
        return "zarr"
    if suffix in hdf5.SUFFIXES:
        return "hdf5"
    fs, path = location.filesystem()
    try:
        for name in _ZARR_METADATA:
            if fs.exists(f"{path.rstrip('/')}/{name}"):
                return "zarr"
        with fs.open(path, "rb") as f:
            if f.read(8) == b"\x89HDF\r\n\x1a\n":
                return "hdf5"
    except FileNotFoundError:
        if location.bucket_exists() is False:
            raise remote_error(FileNotFoundError("bucket does not exist"), location.url) from None
        raise SourceNotFoundError(f"nothing at '{location}'; check the URL.") from None
    except Exception as exc:
        raise remote_error(exc, location.url) from None
    raise SourceNotFoundError(
        f"'{location}' is not a Zarr store, HDF5 file or .npy file, which is what arrayfeed reads "
        "from URLs; convert it with `arrayfeed convert`."
    )


def open_url(
    location: RemotePath, key: str | None, *, strict: bool | None, field: str | None
) -> Source:
    """The array at ``location`` (a URL, possibly ``URL:key``): see :func:`.open.open_array`."""
    if key is None:
        url, key = split_url(location.url)
        location = RemotePath(url, location.storage_options)
    if key is not None and "#" in key and field is None:
        key, _, field = key.rpartition("#")
    kind = _kind(location)
    if field is not None and kind != "hdf5":
        raise ConfigError(
            f"`field` ({field!r}) names a field of an HDF5 compound dataset, but '{location}' is "
            "not an HDF5 file; drop `field`."
        )
    if kind == "zarr":  # AnnData's encoded elements (a CSR group …) first, as locally
        encoded = anndata.open_zarr_element(location, key, strict)
        return encoded or zarr.open_zarr(location, key, strict)
    if kind == "hdf5":
        return RemoteH5Source.open(location, key, field)
    if kind == "npy":
        if key is not None:
            raise SourceNotFoundError(
                f"'{location}' is a .npy file, which holds one array; drop `key` ({key!r})."
            )
        return RemoteNpySource(location)
    raise SourceNotFoundError(
        f"'{location}' is a .npz archive, which arrayfeed does not read from URLs; download it, "
        "or convert it to a Zarr store with `arrayfeed convert`."
    )


def array_keys_url(location: RemotePath) -> list[str] | None:
    """Every array in the HDF5 file or Zarr group at ``location``; None for a single array."""
    kind = _kind(location)
    if kind in ("npy", "npz"):
        return None
    if kind == "hdf5":
        with _h5_file(location) as f:
            names: list[str] = []
            f.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) else None)
            return names
    return zarr.array_names(location)


def describe_url(location: RemotePath) -> StoreInfo:
    """What the store or file at ``location`` holds, from metadata only."""
    kind = _kind(location)
    if kind == "zarr":
        return zarr.describe(location)
    if kind == "hdf5":
        with _h5_file(location) as f:
            return h5describe.describe(location, f)
    if kind == "npy":
        source = RemoteNpySource(location)
        layout = ArrayLayout(name="", shape=source.shape, dtype=source.dtype, chunks=None)
        return StoreInfo(format=".npy", arrays=(layout,), specs={"": location.url})
    raise SourceNotFoundError(f"'{location}' is a .npz archive, which arrayfeed cannot inspect.")


def record_url(location: RemotePath) -> ConversionRecord | None:
    """The conversion record of the store at ``location``, or None."""
    kind = _kind(location)
    if kind == "zarr":
        return zarr.read_record(location)
    if kind == "hdf5":
        with _h5_file(location) as f:
            return hdf5.read_record(f)
    return None


class _H5File:
    """An HDF5 file read through an fsspec file object (closed with the ``h5py.File``)."""

    def __init__(self, location: RemotePath) -> None:
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


def _h5_file(location: RemotePath) -> _H5File:
    return _H5File(location)


class RemoteH5Source:
    """One dataset of an HDF5 file behind a URL, read through h5py (read-only)."""

    def __init__(self, location: RemotePath, key: str, field: str | None = None) -> None:
        self.location, self.key, self.field = location, key, field
        self.name = f"{location.url}:{key}" + (f"#{field}" if field else "")
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._opened: tuple[int, _H5File, Any] | None = None
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
        hdf5.check_filters(dataset, self.name)

    @classmethod
    def open(cls, location: RemotePath, key: str | None, field: str | None) -> RemoteH5Source:
        if key is None:
            with _h5_file(location) as f:
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
            handle = _H5File(self.location)
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


class RemoteNpySource:
    """A ``.npy`` file behind a URL: one ranged request per run of rows, all in flight."""

    def __init__(self, location: RemotePath) -> None:
        self.location = location
        self.name = location.url
        fs, path = location.filesystem()
        try:
            with fs.open(path, "rb", block_size=1 << 16) as f:
                self._shape, self._dtype, fortran = npy.read_npy_header(f)
                self._offset = int(f.tell())
        except (ValueError, SyntaxError) as exc:
            raise CorruptDataError(f"'{location}' is not a readable .npy file ({exc}).") from None
        except Exception as exc:
            raise remote_error(exc, location.url) from None
        if fortran and len(self._shape) > 1:
            raise ConfigError(
                f"'{location}' is stored in Fortran order, so its rows are not contiguous; save "
                "it in C order (np.ascontiguousarray) or convert it."
            )
        self._row = int(np.prod(self._shape[1:], dtype=np.int64)) * self._dtype.itemsize

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 0

    def read(self, indices: Indices) -> np.ndarray:
        out = np.empty((len(indices), *self._shape[1:]), self._dtype)
        if not len(indices):
            return out
        cuts = np.flatnonzero(np.diff(indices) != 1) + 1
        firsts = np.concatenate(([0], cuts))
        lasts = np.concatenate((cuts, [len(indices)]))
        starts: npt.NDArray[np.int64] = self._offset + indices[firsts] * self._row
        ends = starts + (lasts - firsts) * self._row
        fs, path = self.location.filesystem()
        try:
            pieces = fs.cat_ranges([path] * len(starts), starts.tolist(), ends.tolist())
        except Exception as exc:
            raise remote_error(exc, self.location.url) from exc
        flat = out.reshape(len(indices), -1).view(np.uint8)
        for a, b, piece in zip(firsts.tolist(), lasts.tolist(), pieces, strict=True):
            if isinstance(piece, Exception):
                raise remote_error(piece, self.location.url)
            if len(piece) != (b - a) * self._row:
                raise CorruptDataError(f"'{self.location}' is truncated; re-create it.")
            flat[a:b] = np.frombuffer(piece, np.uint8).reshape(b - a, -1)
        return out

    def read_run(self, start: int, stop: int) -> np.ndarray:
        return self.read(np.arange(start, stop, dtype=np.int64))

    def __repr__(self) -> str:
        return f"RemoteNpySource({self.name!r}, shape={self.shape}, dtype={self.dtype})"
