"""Integrity checks: faults in stored data become named errors, never silently wrong batches.

- **Changed files.** A file-backed source takes a :class:`Fingerprint` (device, inode, size,
  modification time) of its file when it is opened, and the feed checks every fingerprint at the
  start of every epoch: a file replaced or truncated between epochs raises
  :class:`~arrayfeed.CorruptDataError` naming it, instead of feeding a mix of old and new rows (or
  touching a truncated memory map, which kills the process with ``SIGBUS``).
- **HDF5 filters.** A dataset compressed with a filter that this HDF5 build cannot decode is
  refused when its source is created, naming the filter (h5py itself fails only at the first read).
- **HDF5 locks.** A file that another process holds open for writing is refused with
  :class:`~arrayfeed.SourceUnavailableError`; a writer in SWMR mode is read through SWMR.
- **Zarr chunks.** A chunk that cannot be decoded is named (array, chunk coordinates, key). Zarr
  reads a missing chunk as the fill value, which is right for stores that omit chunks equal to it;
  arrayfeed keeps those semantics for foreign stores, but a store marked complete (the attribute
  ``{"arrayfeed": {"complete": true}}`` on the array or a parent group, which ``arrayfeed convert``
  writes) or an array opened with ``strict=True`` raises for a missing chunk.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import h5py
import numpy as np
import numpy.typing as npt
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from .._errors import ArrayfeedError, CorruptDataError, SourceUnavailableError

__all__ = [
    "Fingerprint",
    "StrictStore",
    "Verifiable",
    "check_h5_filters",
    "corrupt_chunk_error",
    "h5_fingerprint",
    "memmap_fingerprint",
    "missing_chunk_error",
    "open_h5_file",
    "strict_zarr_array",
    "unwrap_store",
    "verify_sources",
    "zarr_fingerprint",
    "zarr_marked_complete",
    "zarr_read_error",
]


# -- changed files ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """Identity and state of a file when it was opened, cheap to compare again (one ``stat``).

    ``mutable`` files may legitimately change in place (an HDF5 file appended to by a SWMR writer,
    or one the caller opened writable): for them only a replacement by another file counts.
    """

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    mutable: bool = False

    @classmethod
    def of(cls, path: str | os.PathLike[str], *, mutable: bool = False) -> Fingerprint | None:
        """The fingerprint of the file at ``path`` now, or None if it cannot be examined."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls._from_stat(os.fspath(path), st, mutable)

    @classmethod
    def of_fd(cls, fd: int, path: str, *, mutable: bool = False) -> Fingerprint | None:
        """The fingerprint of the file open as ``fd`` (the file actually read, not the path)."""
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return cls._from_stat(path, st, mutable)

    @classmethod
    def _from_stat(cls, path: str, st: os.stat_result, mutable: bool) -> Fingerprint:
        return cls(
            path=path,
            device=st.st_dev,
            inode=st.st_ino,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            mutable=mutable,
        )

    def changes(self) -> list[str]:
        """How the file at ``path`` differs from the fingerprint (empty if it does not)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return ["it no longer exists"]
        except OSError as exc:
            return [f"it cannot be examined ({exc})"]
        found = []
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            found.append("it was replaced by another file")
        if not self.mutable:
            if st.st_size != self.size:
                found.append(f"its size went from {self.size} to {st.st_size} bytes")
            elif st.st_mtime_ns != self.mtime_ns:
                found.append("it was modified")
        return found

    def check(self, name: str) -> None:
        """Raise :class:`CorruptDataError` naming the file if it changed."""
        found = self.changes()
        if found:
            label = f"'{self.path}'" if name == self.path else f"'{self.path}' (source `{name}`)"
            raise CorruptDataError(
                f"{label} changed since arrayfeed opened it: {'; '.join(found)}. A dataset never "
                "reads a file that changed under it; to use the new data, call from_arrays again "
                "(resuming with `start_epoch` / `start_step` if needed)."
            )


@runtime_checkable
class Verifiable(Protocol):
    """Optional source capability: ``verify()`` raises if the stored data changed since opening."""

    def verify(self) -> None: ...


def verify_sources(sources: Iterable[Any]) -> None:
    """Run ``verify()`` on every source that has it (the feed calls this at each epoch start)."""
    for source in sources:
        if isinstance(source, Verifiable):
            source.verify()


def memmap_fingerprint(array: np.ndarray) -> Fingerprint | None:
    """The fingerprint of the file behind an ``np.memmap`` (None for other arrays)."""
    filename = getattr(array, "filename", None)
    if not isinstance(array, np.memmap) or not filename:
        return None
    return Fingerprint.of(filename)


# -- HDF5 ---------------------------------------------------------------------------------------
#: Registered HDF5 filter ids (https://github.com/HDFGroup/hdf5_plugins) -> usual names.
H5_FILTER_NAMES = {
    1: "deflate (gzip)",
    2: "shuffle",
    3: "fletcher32",
    4: "szip",
    5: "nbit",
    6: "scaleoffset",
    305: "lzo",
    307: "bzip2",
    32000: "lzf",
    32001: "blosc",
    32004: "lz4",
    32008: "bitshuffle",
    32013: "zfp",
    32014: "fpzip",
    32015: "zstd",
    32017: "sz",
    32018: "fcidecomp",
    32024: "sz3",
    32026: "blosc2",
}


def check_h5_filters(dataset: h5py.Dataset, name: str) -> None:
    """Raise :class:`SourceUnavailableError` if a filter of ``dataset`` cannot be decoded here."""
    try:
        plist = dataset.id.get_create_plist()
        filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
    except (OSError, ValueError, RuntimeError):  # pragma: no cover - h5py without filter access
        return
    for code, _flags, _values, stored_name in filters:
        if h5py.h5z.filter_avail(code):
            continue
        label = stored_name.decode(errors="replace") if stored_name else ""
        label = label or H5_FILTER_NAMES.get(code, "unregistered")
        raise SourceUnavailableError(
            f"HDF5 dataset '{name}' is compressed with filter {code} ({label}), which this HDF5 "
            "installation cannot decode. Install the filter plugin (e.g. `pip install "
            "hdf5plugin` and `import hdf5plugin` before opening the file, or set "
            "HDF5_PLUGIN_PATH), or rewrite the dataset with gzip or lzf."
        )


def open_h5_file(path: str, *, swmr: bool = False) -> h5py.File:
    """Open an HDF5 file read-only, through SWMR if a SWMR writer has it open.

    A file that another process holds open for writing without SWMR raises
    :class:`SourceUnavailableError`: HDF5 locks it, and reading it anyway (file locking off) could
    give inconsistent data.
    """
    if swmr:
        return h5py.File(path, "r", swmr=True)
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        message = str(exc)
        if "already open for write" in message:
            try:
                return h5py.File(path, "r", swmr=True)
            except OSError:
                pass
            raise SourceUnavailableError(
                f"HDF5 file '{path}' is open for writing in another process, or a writer that "
                "crashed left it marked open. Wait until the writer closes it (a writer can also "
                "use SWMR mode, which arrayfeed reads); if no process writes it, clear the mark "
                f"with `h5clear -s '{path}'`."
            ) from None
        if "unable to lock file" in message or isinstance(exc, BlockingIOError):
            raise SourceUnavailableError(
                f"HDF5 file '{path}' is locked by another process that has it open for writing. "
                "Wait until the writer closes it, or have the writer use SWMR mode "
                "(`h5py.File(..., libver='latest')` and `f.swmr_mode = True`), which arrayfeed "
                "reads. Do not turn file locking off: a file read while it is written can give "
                "wrong data."
            ) from None
        raise


def h5_fingerprint(dataset: h5py.Dataset) -> Fingerprint | None:
    """The fingerprint of the file ``dataset`` is read from (its open descriptor if possible)."""
    file = dataset.file
    if file.driver == "core":
        return None  # an in-memory file: nothing on disk can change under it
    path = str(file.filename)
    mutable = bool(file.swmr_mode) or file.mode != "r"
    try:
        fd = int(file.id.get_vfd_handle())
    except (OSError, ValueError, TypeError, RuntimeError):
        return Fingerprint.of(path, mutable=mutable)
    return Fingerprint.of_fd(fd, path, mutable=mutable)


# -- Zarr ---------------------------------------------------------------------------------------
_ZARR_METADATA = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


def _marked(attrs: Mapping[str, Any]) -> bool:
    marker = attrs.get("arrayfeed")
    return isinstance(marker, Mapping) and marker.get("complete") is True


def zarr_marked_complete(array: zarr.Array[Any]) -> bool:
    """True if ``array`` or a group above it carries ``{"arrayfeed": {"complete": true}}``.

    Groups above it inside its store are opened through the store; for a local store opened at
    the array itself (``zarr.open_array("store.zarr/x")``), the group metadata files in the
    directories above are read as well.
    """
    if _marked(array.attrs):
        return True
    parts = [p for p in str(array.path).split("/") if p]
    for depth in range(len(parts) - 1, -1, -1):
        try:
            group = zarr.open_group(store=array.store, path="/".join(parts[:depth]), mode="r")
        except Exception:  # no group metadata at this level (e.g. an implicit group)
            continue
        if _marked(group.attrs):
            return True
    store = unwrap_store(array.store)
    if isinstance(store, LocalStore):
        for directory in Path(store.root).resolve().parents:
            attrs = _local_group_attrs(directory)
            if attrs is None:
                break  # not a group: the enclosing store ends here
            if _marked(attrs):
                return True
    return False


def _local_group_attrs(directory: Path) -> dict[str, Any] | None:
    """Attributes of the Zarr group whose directory is ``directory``, or None if it is not one."""
    try:
        if (directory / "zarr.json").is_file():
            meta = json.loads((directory / "zarr.json").read_text())
            return dict(meta.get("attributes", {})) if meta.get("node_type") == "group" else None
        if (directory / ".zgroup").is_file():
            zattrs = directory / ".zattrs"
            return dict(json.loads(zattrs.read_text())) if zattrs.is_file() else {}
    except (OSError, ValueError):
        return None
    return None


def unwrap_store(store: Store) -> Store:
    """The store under any wrapper stores."""
    while isinstance(store, WrapperStore):
        store = store._store
    return store


def _chunk_coords(key: str) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", key))


def missing_chunk_error(name: str, key: str) -> CorruptDataError:
    """The error for chunk ``key`` missing from Zarr array ``name`` of a strict store."""
    return CorruptDataError(
        f"chunk {_chunk_coords(key)} (key '{key}') of Zarr array '{name}' is missing. The store "
        "is marked complete by arrayfeed (or was opened with strict=True), so a missing chunk is "
        "lost data, not fill values; restore the store from a backup or re-create it (e.g. with "
        "`arrayfeed convert`)."
    )


def corrupt_chunk_error(
    name: str, coords: tuple[int, ...], key: str, error: Exception
) -> CorruptDataError:
    """The error for chunk ``coords`` (``key``) of Zarr array ``name`` that cannot be read."""
    return CorruptDataError(
        f"chunk {coords} (key '{key}') of Zarr array '{name}' cannot be read "
        f"({type(error).__name__}: {error}); the store is corrupted. Restore it from a "
        "backup or re-create it (e.g. with `arrayfeed convert`)."
    )


class StrictStore(WrapperStore[Store]):
    """A store wrapper that raises for a missing chunk instead of returning nothing.

    Zarr turns "no such key" into fill values; through this wrapper a missing chunk of the array at
    ``prefix`` raises :class:`CorruptDataError` naming it. Metadata keys keep their usual meaning.
    """

    def __init__(self, store: Store, *, array_name: str = "", prefix: str = "") -> None:
        super().__init__(store)
        self.array_name = array_name
        self.prefix = prefix.strip("/")

    def _with_store(self, store: Store) -> StrictStore:
        return type(self)(store, array_name=self.array_name, prefix=self.prefix)

    def _missing(self, key: str) -> CorruptDataError | None:
        if key.rsplit("/", 1)[-1] in _ZARR_METADATA:
            return None
        relative = key[len(self.prefix) + 1 :] if self.prefix else key
        return missing_chunk_error(self.array_name, relative)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        buffer = await super().get(key, prototype, byte_range)
        if buffer is None and (error := self._missing(key)) is not None:
            raise error
        return buffer

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        key_ranges = list(key_ranges)
        buffers = await super().get_partial_values(prototype, key_ranges)
        for (key, _), buffer in zip(key_ranges, buffers, strict=True):
            if buffer is None and (error := self._missing(key)) is not None:
                raise error
        return buffers

    def __repr__(self) -> str:
        return f"StrictStore({self._store!r}, array_name={self.array_name!r})"


def strict_zarr_array(array: zarr.Array[Any], name: str) -> zarr.Array[Any]:
    """``array`` reopened through a :class:`StrictStore` (missing chunks raise)."""
    store = array.store
    if isinstance(store, StrictStore):
        return array
    strict = StrictStore(store, array_name=name, prefix=str(array.path))
    return zarr.open_array(
        store=strict, path=str(array.path), mode="r", zarr_format=array.metadata.zarr_format
    )


def zarr_fingerprint(array: zarr.Array[Any]) -> Fingerprint | None:
    """The fingerprint of the metadata file of an array in a local (directory) store."""
    store = unwrap_store(array.store)
    if not isinstance(store, LocalStore):
        return None
    metadata = "zarr.json" if array.metadata.zarr_format == 3 else ".zarray"
    return Fingerprint.of(os.path.join(store.root, str(array.path), metadata))


def zarr_read_error(
    array: zarr.Array[Any], name: str, indices: npt.NDArray[np.int64], error: Exception
) -> CorruptDataError:
    """A :class:`CorruptDataError` naming the chunk behind a failed read of rows ``indices``.

    Re-reads the chunks those rows touch one at a time (the slow path, taken only after a failure)
    and names the first that fails.
    """
    shape = tuple(int(n) for n in array.shape)
    grid: Sequence[int] = array.shards or array.chunks
    blocks = [range(-(-n // c)) for n, c in zip(shape[1:], grid[1:], strict=True)]
    for row_block in np.unique(np.asarray(indices) // grid[0]):
        for rest in itertools.product(*blocks):
            coords = (int(row_block), *rest)
            selection = tuple(
                slice(i * c, min((i + 1) * c, n))
                for i, c, n in zip(coords, grid, shape, strict=True)
            )
            try:
                array[selection]
            except ArrayfeedError as exc:
                return exc if isinstance(exc, CorruptDataError) else CorruptDataError(str(exc))
            except Exception as exc:
                return corrupt_chunk_error(name, coords, array.metadata.encode_chunk_key(coords), exc)
    return CorruptDataError(
        f"reading rows of Zarr array '{name}' failed ({type(error).__name__}: {error}), although "
        "each chunk they touch reads on its own; check the store and its storage."
    )
