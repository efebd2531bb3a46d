"""Array sources: what arrayfeed reads rows from.

A :class:`Source` is a structural protocol (``shape``, ``dtype``, ``__len__`` and a batched
``read``). The core hands ``read`` 1-D ``int64`` indices that are sorted, unique and in bounds,
and restores the order it wanted afterwards, so a backend never sees unsorted indices (h5py
requires increasing ones). Backends that can gather rows in any order straight into a caller's
buffer (in-memory arrays, memory maps) also implement :class:`GatherInto`, which the reader
probes with ``isinstance`` and uses to skip the sort and the extra copy.

Files are opened lazily, once per process: a source pickles its *path*, never a file handle,
so it survives ``spawn`` and ``fork`` into worker processes.
"""

from __future__ import annotations

import os
import threading
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import h5py
import numpy as np
import numpy.typing as npt
import zarr

from .._errors import (
    ArrayfeedError,
    CorruptDataError,
    DtypeError,
    ShapeError,
    SourceNotFoundError,
    SourceUnavailableError,
)
from .integrity import (
    Fingerprint,
    check_h5_filters,
    h5_fingerprint,
    memmap_fingerprint,
    open_h5_file,
    strict_zarr_array,
    zarr_fingerprint,
    zarr_marked_complete,
    zarr_read_error,
)
from .zarrchunks import ChunkReader

__all__ = [
    "ArraySource",
    "Chunked",
    "GatherInto",
    "H5ContiguousSource",
    "H5Source",
    "NpySource",
    "ReadRangeInto",
    "Source",
    "ZarrSource",
    "as_source",
    "check_feedable",
    "chunked_rows",
    "h5_source",
    "is_array_like",
    "open_array",
    "row_bytes",
]

Indices = npt.NDArray[np.int64]

#: dtypes TensorFlow represents natively (byte order aside: non-native orders are converted).
_FEEDABLE_KINDS = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}

_HDF5_SUFFIXES = {".h5", ".hdf5", ".he5", ".hdf"}

#: Rows at least this large are copied with pread rather than through the memory map.
_PREAD_ROW_BYTES = 4096
#: Serialises opening the per-process file descriptor of mapped sources.
_FD_LOCK = threading.Lock()

#: Indices per h5py point-selection call (see H5Source.read).
_H5_PIECE = 256


@runtime_checkable
class Source(Protocol):
    """Rows of an array, read a batch at a time.

    ``read`` receives sorted, unique, in-bounds ``int64`` indices and returns a new array of
    shape ``(len(indices), *shape[1:])``.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def __len__(self) -> int: ...

    def read(self, indices: Indices) -> np.ndarray: ...


@runtime_checkable
class GatherInto(Protocol):
    """Optional capability: gather rows in any order (duplicates allowed) into ``out``."""

    def gather_into(self, indices: Indices, out: np.ndarray) -> None: ...


@runtime_checkable
class ReadRangeInto(Protocol):
    """Optional capability: read rows ``[start, stop)`` into ``out`` (C-contiguous, native byte
    order), without an intermediate array."""

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None: ...


@runtime_checkable
class Chunked(Protocol):
    """Optional capability: storage read in chunks of ``chunk_rows`` rows along axis 0.

    Reading any row of a chunk costs about as much as reading the whole chunk, so
    ``shuffle="block"`` reads whole chunk-aligned blocks of such sources. None: not chunked.
    """

    @property
    def chunk_rows(self) -> int | None: ...


def chunked_rows(source: Source) -> int | None:
    """Rows per chunk of a source whose reads cost whole chunks, else None (sources that gather
    rows in any order cheaply, and unchunked storage)."""
    if isinstance(source, Chunked) and not isinstance(source, GatherInto):
        return source.chunk_rows or None
    return None


def row_bytes(sources: Iterable[Source]) -> int:
    """Bytes of one row of every source together."""
    return sum(int(np.prod(s.shape[1:], dtype=np.int64)) * s.dtype.itemsize for s in sources)


def _run_bounds(indices: Indices) -> tuple[int, int] | None:
    """``(start, stop)`` if sorted unique ``indices`` form one contiguous run, else None."""
    if len(indices) and int(indices[-1]) - int(indices[0]) + 1 == len(indices):
        return int(indices[0]), int(indices[-1]) + 1
    return None


class ArraySource:
    """An in-memory ``np.ndarray`` or an ``np.memmap``."""

    def __init__(self, array: np.ndarray, name: str = "array") -> None:
        self._array = array
        self.name = name
        self.fingerprint = memmap_fingerprint(array)

    @property
    def array(self) -> np.ndarray:
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.array.dtype

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def read(self, indices: Indices) -> np.ndarray:
        run = _run_bounds(indices)
        if run is not None:
            return np.array(self.array[run[0] : run[1]])
        return np.take(self.array, indices, axis=0)

    def gather_into(self, indices: Indices, out: np.ndarray) -> None:
        # mode="clip": indices are in bounds (the plan checks them), and only then does NumPy
        # write straight into `out` instead of through a temporary copy.
        np.take(self.array, indices, axis=0, out=out, mode="clip")

    def verify(self) -> None:
        """Raise :class:`CorruptDataError` if the file behind a memory map changed since opening."""
        if self.fingerprint is not None:
            self.fingerprint.check(self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class _MappedSource(ArraySource):
    """Rows stored contiguously at a byte offset of a file: memory-mapped read-only, lazily,
    once per process. Pickles the path and layout, never the mapping."""

    def __init__(
        self, path: Path, shape: tuple[int, ...], dtype: np.dtype[Any], offset: int, fortran: bool
    ) -> None:
        self.path = path
        self._shape, self._dtype, self._offset, self._fortran = shape, dtype, offset, fortran
        self.fingerprint = Fingerprint.of(path)
        self._array: np.ndarray | None = None  # type: ignore[assignment]
        self._pid = -1
        self._fd: int | None = None
        self._fd_pid = -1

    @property
    def array(self) -> np.ndarray:
        if self._array is None or self._pid != os.getpid():
            self._array = np.memmap(
                self.path,
                dtype=self._dtype,
                mode="r",
                offset=self._offset,
                shape=self._shape,
                order="F" if self._fortran else "C",
            )
            self._pid = os.getpid()
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 0

    def gather_into(self, indices: Indices, out: np.ndarray) -> None:
        row_bytes = self._dtype.itemsize * int(np.prod(self._shape[1:], dtype=np.int64))
        direct = (
            row_bytes >= _PREAD_ROW_BYTES
            and not self._fortran
            and self._dtype.isnative
            and out.dtype == self._dtype
            and out.flags.c_contiguous
            and out.shape == (len(indices), *self._shape[1:])
        )
        if not direct:
            np.take(self.array, indices, axis=0, out=out, mode="clip")
            return
        # Large rows: copy them from the page cache with pread, one call per run of consecutive
        # rows, instead of through the memory map. Measured on 12 KiB rows: 212-221 k rows/s with
        # two threads against 172-176 k through the map, and steadier, because the map's pages
        # are faulted in again whenever the kernel unmaps them. A file that ends early is an
        # error naming it, where the map would end the process with SIGBUS.
        if not len(indices):
            return
        fd = self._file()
        view = memoryview(out.reshape(-1).view(np.uint8).data)
        cuts = np.flatnonzero(np.diff(indices) != 1) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(indices)], strict=True):
            start, end = lo * row_bytes, hi * row_bytes
            offset = self._offset + int(indices[lo]) * row_bytes
            while start < end:  # preadv returns at most ~2 GiB per call on Linux
                got = os.preadv(fd, [view[start:end]], offset)
                if got == 0:
                    raise CorruptDataError(
                        f"'{self.path}' ended at byte {offset}, inside the rows being read: the "
                        "file was truncated while being read; re-create it."
                    )
                start, offset = start + got, offset + got

    def _file(self) -> int:
        with _FD_LOCK:
            if self._fd is None or self._fd_pid != os.getpid():
                self._fd, self._fd_pid = os.open(self.path, os.O_RDONLY), os.getpid()
            return self._fd

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and self._fd_pid == os.getpid():
            os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_array"], state["_pid"] = None, -1
        state["_fd"], state["_fd_pid"] = None, -1
        return state


class NpySource(_MappedSource):
    """A ``.npy`` file, memory-mapped read-only and opened lazily once per process.

    The header is parsed (and the file size checked) when the source is created, so a
    truncated or corrupted file fails at once, naming the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        fingerprint = Fingerprint.of(Path(path))  # before the header, so later changes show
        shape, dtype, fortran, offset = _read_npy_header(Path(path))
        super().__init__(Path(path), shape, dtype, offset, fortran)
        self.name = str(self.path)
        self.fingerprint = fingerprint


class H5ContiguousSource(_MappedSource):
    """A contiguous, unfiltered HDF5 dataset, memory-mapped at its byte offset in the file.

    Reads then cost what a ``.npy`` memmap costs, instead of going through h5py per row.
    :func:`h5_source` picks this class when the layout allows it.
    """

    def __init__(self, dataset: h5py.Dataset, offset: int) -> None:
        super().__init__(
            Path(dataset.file.filename),
            tuple(int(n) for n in dataset.shape),
            np.dtype(dataset.dtype),
            offset,
            fortran=False,
        )
        self.key = str(dataset.name)
        self.name = f"{self.path}:{self.key}"


def _h5_byte_offset(dataset: h5py.Dataset) -> int | None:
    """Absolute byte offset of a memory-mappable dataset's data, or None if it is not one."""
    dtype = np.dtype(dataset.dtype)
    if dataset.chunks is not None or dataset.external or dtype.hasobject or dtype.fields:
        return None
    if dataset.file.driver not in ("sec2", "stdio", "direct") or dataset.file.mode != "r":
        return None
    if dataset.file.swmr_mode:
        return None  # a SWMR writer may still move or extend the data: read through HDF5
    offset = dataset.id.get_offset()
    nbytes = int(np.prod(dataset.shape, dtype=np.int64)) * dtype.itemsize
    if offset is None or dataset.id.get_storage_size() != nbytes:
        return None  # data never written (no storage allocated), or compact layout
    return int(offset)  # from the start of the file, user block included


def h5_source(dataset: h5py.Dataset) -> Source:
    """The fastest source for an HDF5 dataset: memory-mapped when contiguous, else h5py reads."""
    offset = _h5_byte_offset(dataset)
    if offset is not None:
        return H5ContiguousSource(dataset, offset)
    return H5Source(dataset)


def _read_npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype[Any], bool, int]:
    if not path.is_file():
        raise SourceNotFoundError(f"no .npy file at '{path}'; check the path.")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as exc:
        raise CorruptDataError(
            f"'{path}' is not a readable .npy file ({exc}); re-create it with numpy.save."
        ) from None
    if dtype.hasobject:
        raise DtypeError(
            f"'{path}' holds Python objects (dtype {dtype}), which cannot be memory-mapped or fed "
            "to TensorFlow; save it with a numeric dtype."
        )
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = path.stat().st_size
    if actual < expected:
        raise CorruptDataError(
            f"'{path}' is truncated: its header promises shape {shape} of {dtype} "
            f"({expected} bytes with the header) but the file has {actual} bytes; re-create it."
        )
    return tuple(int(n) for n in shape), dtype, bool(fortran), offset


class H5Source:
    """An ``h5py.Dataset``; reopened read-only by file name in any other process."""

    def __init__(self, dataset: h5py.Dataset) -> None:
        self.filename = str(dataset.file.filename)
        self.key = str(dataset.name)
        self.name = f"{self.filename}:{self.key}"
        self._shape = tuple(int(n) for n in dataset.shape)
        self._dtype: np.dtype[Any] = np.dtype(dataset.dtype)
        self._dataset: h5py.Dataset | None = dataset
        self._pid = os.getpid()
        self._swmr = bool(dataset.file.swmr_mode)
        check_h5_filters(dataset, self.name)
        self.fingerprint = h5_fingerprint(dataset)

    @property
    def dataset(self) -> h5py.Dataset:
        if self._dataset is None or self._pid != os.getpid():
            self._dataset = open_h5_file(self.filename, swmr=self._swmr)[self.key]
            self._pid = os.getpid()
        return self._dataset

    def verify(self) -> None:
        """Raise :class:`CorruptDataError` if the file was replaced or changed since opening."""
        if self.fingerprint is not None:
            self.fingerprint.check(self.name)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 0

    def read(self, indices: Indices) -> np.ndarray:
        run = _run_bounds(indices)
        if run is not None:
            return np.asarray(self.dataset[run[0] : run[1]])
        # h5py's point selection grows superlinearly with the number of indices (measured: 8192
        # sorted indices in one call ~50x slower than in pieces of 256), so read in pieces.
        out = np.empty((len(indices), *self._shape[1:]), dtype=self._dtype)
        for lo in range(0, len(indices), _H5_PIECE):
            piece = indices[lo : lo + _H5_PIECE]
            run = _run_bounds(piece)
            out[lo : lo + len(piece)] = (
                self.dataset[run[0] : run[1]] if run is not None else self.dataset[piece]
            )
        return out

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        self.dataset.read_direct(out, np.s_[start:stop])

    @property
    def chunk_rows(self) -> int | None:
        """Rows per chunk along axis 0, or None for a contiguous dataset."""
        chunks = self.dataset.chunks
        return int(chunks[0]) if chunks else None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dataset"], state["_pid"] = None, -1
        return state

    def __repr__(self) -> str:
        return f"H5Source({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class ZarrSource:
    """A ``zarr.Array`` (Zarr format 3 or 2), read with orthogonal selection.

    ``strict``: a missing chunk raises :class:`CorruptDataError` instead of reading as the fill
    value. None (the default) means strict exactly when the array or a parent group is marked
    complete by arrayfeed (``{"arrayfeed": {"complete": true}}``); foreign stores, which may
    legitimately omit chunks equal to the fill value, keep Zarr's semantics.
    """

    def __init__(
        self, array: zarr.Array[Any], name: str | None = None, *, strict: bool | None = None
    ) -> None:
        self.name = name or f"{array.store}/{array.path}".rstrip("/")
        self.strict = zarr_marked_complete(array) if strict is None else bool(strict)
        self.fingerprint = zarr_fingerprint(array)
        self.array = strict_zarr_array(array, self.name) if self.strict else array
        # Local unsharded arrays are read chunk by chunk in the reader's own thread.
        self.chunk_reader = ChunkReader.of(array, self.name, self.strict)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(self.array.dtype)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def read(self, indices: Indices) -> np.ndarray:
        return self._read(indices, None)

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        self._read(np.arange(start, stop, dtype=np.int64), out)

    def _read(self, indices: Indices, out: np.ndarray | None) -> np.ndarray:
        try:
            if self.chunk_reader is not None:
                return self.chunk_reader.read(indices, out=out)
            run = _run_bounds(indices)
            if run is not None:
                data = np.asarray(self.array[run[0] : run[1]])
            else:
                data = np.asarray(self.array.oindex[indices])
        except (ArrayfeedError, MemoryError):
            raise
        except Exception as exc:  # a codec or store error: name the chunk
            raise zarr_read_error(self.array, self.name, indices, exc) from exc
        if out is None:
            return data
        out[...] = data
        return out

    def verify(self) -> None:
        """Raise :class:`CorruptDataError` if the array's metadata file changed since opening."""
        if self.fingerprint is not None:
            self.fingerprint.check(self.name)

    @property
    def chunk_rows(self) -> int | None:
        """Rows per stored object along axis 0: the shard when sharded, else the chunk."""
        shards = self.array.shards
        return int((shards or self.array.chunks)[0])

    def __repr__(self) -> str:
        return f"ZarrSource({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def open_array(
    path: str | os.PathLike[str], key: str | None = None, *, strict: bool | None = None
) -> Source:
    """Open an array on disk as a :class:`Source`, without reading its data.

    - ``.npy``: memory-mapped read-only (``key`` must be None).
    - ``.npz``: the array ``key`` (loaded into memory; ``.npz`` members cannot be memory-mapped).
    - HDF5 (``.h5``, ``.hdf5`` … or any file with the HDF5 signature): the dataset at ``key``;
      ``key`` may be omitted when the file holds exactly one dataset.
    - Zarr (a directory store): the array itself when ``key`` is None, or the array at ``key``
      inside a group. ``strict=True`` makes a missing chunk an error instead of fill values; the
      default (None) is strict for stores marked complete by arrayfeed (``arrayfeed convert``
      writes every chunk and marks the store) and follows Zarr's semantics for other stores.
      ``strict`` only concerns Zarr.

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(6).reshape(3, 2))
    >>> src = open_array(path)
    >>> src.shape, len(src)
    ((3, 2), 3)
    """
    p = Path(path)
    if not p.exists():
        raise SourceNotFoundError(f"nothing at '{p}'; check the path.")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        if key is not None:
            raise SourceNotFoundError(
                f"'{p}' is a .npy file, which holds one array; drop `key` ({key!r})."
            )
        return NpySource(p)
    if suffix == ".npz":
        return _open_npz(p, key)
    if p.is_dir():
        return _open_zarr(p, key, strict)
    if suffix in _HDF5_SUFFIXES or h5py.is_hdf5(p):
        return _open_hdf5(p, key)
    raise SourceNotFoundError(
        f"'{p}' is not a .npy, .npz, HDF5 file or Zarr store; convert it with `arrayfeed convert`."
    )


def _open_npz(path: Path, key: str | None) -> Source:
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = list(npz.files)
            if key is None and len(names) == 1:
                key = names[0]
            array = npz[key] if key in names else None
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CorruptDataError(f"'{path}' is not a readable .npz file ({exc}).") from None
    if array is None:
        raise SourceNotFoundError(
            f"'{path}' has no array {key!r}; it holds {names}. Pass one as `key`."
        )
    return ArraySource(array, name=f"{path}:{key}")


def _open_hdf5(path: Path, key: str | None) -> Source:
    try:
        f = open_h5_file(str(path))
    except SourceUnavailableError:
        raise
    except OSError as exc:
        raise CorruptDataError(f"cannot open HDF5 file '{path}' for reading ({exc}).") from None
    datasets: list[str] = []
    f.visititems(lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None)
    if key is None and len(datasets) == 1:
        key = datasets[0]
    node = f.get(key) if key is not None else None
    if not isinstance(node, h5py.Dataset):
        f.close()
        raise SourceNotFoundError(
            f"'{path}' has no dataset {key!r}; its datasets are {datasets}. Pass one as `key`."
        )
    try:
        return h5_source(node)
    except ArrayfeedError:
        f.close()
        raise


def _open_zarr(path: Path, key: str | None, strict: bool | None = None) -> Source:
    try:
        node = zarr.open(store=str(path), mode="r")
    except Exception as exc:  # zarr raises several unrelated types for a non-store directory
        raise SourceNotFoundError(f"'{path}' is not a Zarr store ({exc}).") from None
    if key is not None:
        if not isinstance(node, zarr.Group) or not isinstance(node.get(key), zarr.Array):
            names = _zarr_arrays(node)
            raise SourceNotFoundError(
                f"'{path}' has no array {key!r}; its arrays are {names}. Pass one as `key`."
            )
        node = node[key]
    if isinstance(node, zarr.Group):
        names = _zarr_arrays(node)
        if len(names) != 1:
            raise SourceNotFoundError(
                f"'{path}' is a Zarr group with arrays {names}; pass one of them as `key`."
            )
        key = names[0]
        node = node[key]
    assert isinstance(node, zarr.Array)
    return ZarrSource(node, name=f"{path}:{key}" if key else str(path), strict=strict)


def _zarr_arrays(node: Any) -> list[str]:
    if not isinstance(node, zarr.Group):
        return []
    return sorted(
        name for name, _ in node.members(max_depth=None) if isinstance(node[name], zarr.Array)
    )


def is_array_like(obj: Any) -> bool:
    """True for what arrayfeed accepts as one leaf of `x`, `y` or `sample_weight`."""
    if isinstance(obj, (np.ndarray, h5py.Dataset, zarr.Array, str, os.PathLike)):
        return True
    if isinstance(obj, (tuple, list, Mapping)):
        return False
    return isinstance(obj, Source) or hasattr(obj, "__array__")


def as_source(obj: Any, name: str) -> Source:
    """Wrap one array-like as a :class:`Source` (``name`` is used in messages)."""
    if isinstance(obj, np.ndarray):
        return ArraySource(obj, name=name)
    if isinstance(obj, (str, os.PathLike)):
        return open_array(obj)
    if isinstance(obj, h5py.Dataset):
        return h5_source(obj)
    if isinstance(obj, zarr.Array):
        return ZarrSource(obj)
    if isinstance(obj, Source):
        return obj
    return ArraySource(np.asarray(obj), name=name)


def check_feedable(source: Source, name: str) -> None:
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
            f"{label} has a structured dtype {dtype}; pass each field as its own array, e.g. "
            "`{'a': arr['a'], 'b': arr['b']}`."
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
