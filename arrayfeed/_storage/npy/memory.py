"""In-memory arrays and memory-mapped files: sources that gather rows in any order cheaply.

:class:`ArraySource` wraps an ``np.ndarray`` or ``np.memmap``; :class:`MappedSource` maps rows
stored contiguously at a byte offset of a file (``.npy`` files, contiguous HDF5 datasets) lazily,
once per process, and pickles the path and layout, never the mapping.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..._errors import CorruptDataError
from ..._forks import renew_after_fork
from ..base import REOPENS, Indices, Portability, run_bounds
from ..fingerprint import Fingerprint, memmap_fingerprint

__all__ = ["ArraySource", "MappedSource"]

#: Serialises opening the per-process file descriptor of mapped sources.
_FD_LOCK = threading.Lock()
renew_after_fork(sys.modules[__name__], "_FD_LOCK")


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
        run = run_bounds(indices)
        if run is not None:
            return np.array(self.array[run[0] : run[1]])
        return np.take(self.array, indices, axis=0)

    def read_run(self, start: int, stop: int) -> np.ndarray:
        return self.array[start:stop]

    def gather_into(self, indices: Indices, out: np.ndarray) -> None:
        # mode="clip": indices are in bounds (the plan checks them), and only then does NumPy
        # write straight into `out` instead of through a temporary copy.
        np.take(self.array, indices, axis=0, out=out, mode="clip")

    def verify(self) -> None:
        """Raise :class:`CorruptDataError` if the file behind a memory map changed since opening."""
        if self.fingerprint is not None:
            self.fingerprint.check(self.name)

    def portability(self) -> Portability:
        """A memory map of a file that others see written (mode ``r``, ``r+``, ``w+``) opens the
        file again; any other array travels with its data."""
        if _mapped_region(self._array) is not None:
            return REOPENS
        return Portability("copy", nbytes=int(self._array.nbytes))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        region = _mapped_region(self._array)
        if region is not None:  # the file's name and where the rows lie, not the rows
            array = self._array
            state["_array"] = ("mapped", *region, array.shape, array.dtype.str)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        mapped = state.get("_array")
        if isinstance(mapped, tuple) and mapped and mapped[0] == "mapped":
            _, path, offset, shape, dtype = mapped
            state["_array"] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def _mapped_region(array: np.ndarray) -> tuple[str, int] | None:
    """``(file, byte offset)`` of the rows of ``array`` if it is a C-ordered ``np.memmap`` whose
    writes, if any, go to its file (not copy-on-write), else None."""
    if not isinstance(array, np.memmap) or array.mode not in ("r", "r+", "w+"):
        return None
    handle = getattr(array, "_mmap", None)
    if handle is None or not array.filename or not array.flags.c_contiguous:
        return None
    try:
        mapped = np.frombuffer(handle, dtype=np.uint8)
    except (ValueError, TypeError):  # a closed mapping
        return None
    start = mapped.ctypes.data + array.offset % mmap.ALLOCATIONGRANULARITY
    return str(array.filename), int(array.offset) + (array.ctypes.data - start)


class MappedSource(ArraySource):
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
        # One gather through the map per call, the GIL released for every row: one `preadv` per
        # run of rows convoys many short GIL hand-offs across threads (docs/performance.md,
        # "Memory-mapped gathers"). A file truncated under the map would end the process with
        # SIGBUS, so its size is checked first (one fstat): a file cut short is a named error.
        if len(indices):
            self._check_size(int(indices.max()))
        np.take(self.array, indices, axis=0, out=out, mode="clip")

    def _check_size(self, last_row: int) -> None:
        row_bytes = self._dtype.itemsize * int(np.prod(self._shape[1:], dtype=np.int64))
        end = self._offset + (last_row + 1) * row_bytes
        if self._fortran:
            end = self._offset + int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize
        size = os.fstat(self._file()).st_size
        if size < end:
            raise CorruptDataError(
                f"'{self.path}' ended at byte {size}, inside the rows being read: the file was "
                "truncated while being read; re-create it."
            )

    def _file(self) -> int:
        with _FD_LOCK:
            if self._fd is None or self._fd_pid != os.getpid():
                self._fd, self._fd_pid = os.open(self.path, os.O_RDONLY), os.getpid()
            return self._fd

    def close(self) -> None:
        """Close this process's file descriptor and mapping (both reopen when read again)."""
        with _FD_LOCK:
            fd, self._fd = self._fd, None
            if fd is not None and self._fd_pid == os.getpid():
                os.close(fd)
        self._array, self._pid = None, -1

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and self._fd_pid == os.getpid():
            os.close(fd)

    def portability(self) -> Portability:
        return REOPENS

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_array"], state["_pid"] = None, -1
        state["_fd"], state["_fd_pid"] = None, -1
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
