"""NumPy files: ``.npy`` (memory-mapped) and ``.npz`` archives.

One header parser (:func:`read_npy_header`) serves ``.npy`` files and ``.npz`` members alike. A
``.npy`` file is memory-mapped read-only (:class:`NpySource`); a ``.npz`` member cannot be mapped:
:func:`open_npz` loads it whole, and :class:`NpzMemberSource` streams it (conversion).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from ..._errors import CorruptDataError, DtypeError, SourceNotFoundError
from ..base import REOPENS, Portability, Source
from ..fingerprint import Fingerprint
from ..layout import ArrayLayout, StoreInfo
from .memory import ArraySource, MappedSource

__all__ = [
    "NpySource",
    "NpzMemberSource",
    "describe_npy",
    "describe_npz",
    "open_npz",
    "read_npy_file",
    "read_npy_header",
]


def read_npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], np.dtype[Any], bool]:
    """``(shape, dtype, fortran_order)`` from the header of a ``.npy`` stream; ``f`` is left at
    the first byte of data. Raises what NumPy raises for a malformed header."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    return tuple(int(n) for n in shape), np.dtype(dtype), bool(fortran)


def read_npy_file(path: Path) -> tuple[tuple[int, ...], np.dtype[Any], bool, int]:
    """``(shape, dtype, fortran_order, data_offset)`` of a ``.npy`` file, its size checked."""
    if not path.is_file():
        raise SourceNotFoundError(f"no .npy file at '{path}'; check the path.")
    try:
        with open(path, "rb") as f:
            shape, dtype, fortran = read_npy_header(f)
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
    return shape, dtype, fortran, offset


class NpySource(MappedSource):
    """A ``.npy`` file, memory-mapped read-only and opened lazily once per process.

    The header is parsed (and the file size checked) when the source is created, so a
    truncated or corrupted file fails at once, naming the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        fingerprint = Fingerprint.of(Path(path))  # before the header, so later changes show
        shape, dtype, fortran, offset = read_npy_file(Path(path))
        super().__init__(Path(path), shape, dtype, offset, fortran)
        self.name = str(self.path)
        self.fingerprint = fingerprint


class NpzMemberSource:
    """One array of a ``.npz`` archive, read from the archive member as a stream of rows."""

    def __init__(self, path: Path, key: str | None) -> None:
        self.path = path
        try:
            with zipfile.ZipFile(path) as zf:
                members = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
                if key is None and len(members) == 1:
                    key = members[0]
                if key not in members:
                    raise SourceNotFoundError(
                        f"'{path}' has no array {key!r}; it holds {members}. Name one as "
                        f"'{path}:KEY'."
                    )
                with zf.open(f"{key}.npy") as f:
                    shape, dtype, fortran = read_npy_header(f)
                    self._offset = f.tell()
        except SourceNotFoundError:
            raise
        except (zipfile.BadZipFile, OSError, ValueError, KeyError) as exc:
            raise CorruptDataError(f"'{path}' is not a readable .npz file ({exc}).") from None
        if dtype.hasobject:
            raise DtypeError(
                f"'{path}:{key}' holds Python objects (dtype {dtype}), which cannot be streamed "
                "or fed to TensorFlow; save it with a numeric dtype."
            )
        self.key = str(key)
        self.name = f"{path}:{key}"
        self._shape = tuple(int(n) for n in shape)
        self._dtype = np.dtype(dtype)
        self._fortran = bool(fortran) and len(self._shape) > 1
        self._row_bytes = int(np.prod(self._shape[1:], dtype=np.int64)) * self._dtype.itemsize
        self._zip: zipfile.ZipFile | None = None
        self._file: Any = None
        self._whole: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 0

    def read_run(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop``; cheapest when runs come in increasing order."""
        if self._fortran:  # rows are not contiguous in a Fortran-order member: load it once
            if self._whole is None:
                with np.load(self.path, allow_pickle=False) as npz:
                    self._whole = np.ascontiguousarray(npz[self.key])
            return self._whole[start:stop]
        if self._file is None:
            self._zip = zipfile.ZipFile(self.path)
            self._file = self._zip.open(f"{self.key}.npy")
        nbytes = (stop - start) * self._row_bytes
        self._file.seek(self._offset + start * self._row_bytes)
        data = self._file.read(nbytes)
        if len(data) != nbytes:
            raise CorruptDataError(
                f"'{self.name}' is truncated: rows {start}:{stop} are beyond its data; "
                "re-create it."
            )
        return np.frombuffer(data, dtype=self._dtype).reshape((stop - start, *self._shape[1:]))

    def read(self, indices: npt.NDArray[np.int64]) -> np.ndarray:
        if not len(indices):
            return np.empty((0, *self._shape[1:]), self._dtype)
        first, last = int(indices[0]), int(indices[-1])
        rows = self.read_run(first, last + 1)
        if last - first + 1 == len(indices):
            return np.array(rows)
        return np.take(rows, indices - first, axis=0)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._zip is not None:
            self._zip.close()
        self._file = self._zip = self._whole = None

    def portability(self) -> Portability:
        return REOPENS

    def __getstate__(self) -> dict[str, Any]:
        # The path, not the open archive: a copy opens the member again when it reads.
        state = self.__dict__.copy()
        state["_zip"] = state["_file"] = state["_whole"] = None
        return state


def open_npz(path: Path, key: str | None) -> Source:
    """The array ``key`` of a ``.npz`` archive, loaded into memory (members cannot be mapped)."""
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


def describe_npy(path: Path) -> StoreInfo:
    """The one array of a ``.npy`` file, from its header."""
    source = NpySource(path)
    layout = ArrayLayout(
        name="",
        shape=source.shape,
        dtype=source.dtype,
        chunks=None,
        stored_bytes=path.stat().st_size,
    )
    return StoreInfo(format=".npy", arrays=(layout,), specs={"": str(path)})


def describe_npz(path: Path) -> StoreInfo:
    """The members of a ``.npz`` archive, from their headers."""
    layouts = []
    specs = {}
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
    except (zipfile.BadZipFile, OSError) as exc:
        raise SourceNotFoundError(f"'{path}' is not a readable .npz file ({exc}).") from None
    for key, info in infos.items():
        member = NpzMemberSource(path, key)
        layouts.append(
            ArrayLayout(
                name=key,
                shape=member.shape,
                dtype=member.dtype,
                chunks=None,
                compression="deflate" if info.compress_type == zipfile.ZIP_DEFLATED else "none",
                stored_bytes=info.compress_size,
                loads_whole=True,
            )
        )
        specs[key] = f"{path}:{key}"
    return StoreInfo(format=".npz", arrays=tuple(layouts), specs=specs)
