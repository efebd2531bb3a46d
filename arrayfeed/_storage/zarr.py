"""Zarr (v3 and v2) through zarr-python: every fact arrayfeed knows about Zarr lives here.

- **Source.** :class:`ZarrSource` reads a ``zarr.Array`` with orthogonal selection, or, for local
  unsharded arrays, chunk by chunk in the reader's own thread (:mod:`.zarrchunks`).
- **Missing chunks.** Zarr reads a missing chunk as the fill value, which is right for stores
  that omit chunks equal to it; arrayfeed keeps those semantics for foreign stores, but a store
  marked complete (the record's marker on the array or a parent group, which ``arrayfeed
  convert`` writes) or an array opened with ``strict=True`` raises for a missing chunk
  (:class:`StrictStore`). A chunk that cannot be decoded is named (array, chunk, key).
- **Changed files.** The array's metadata file is fingerprinted.
- **Unfinished conversions** (record ``complete: false``, see :mod:`.zarrwrite`) are refused.
- **Object storage.** URLs (:class:`~.remote.RemotePath`) open through Zarr's ``FsspecStore``
  and are read chunk by chunk too, many chunks in flight.
- **Layout facts** for ``inspect`` and ``bench`` (:func:`describe`, :func:`array_names`), and the
  **record** of ``convert`` (:func:`read_record`); the writer is in :mod:`.zarrwrite`.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from .._errors import ArrayfeedError, CorruptDataError, SourceNotFoundError
from .base import ArrayLayout, Indices, Source, StoreInfo, run_bounds
from .fingerprint import Fingerprint
from .record import MARKER, ConversionRecord, marker_state, parse_record
from .remote import RemotePath, remote_error, sync_filesystem
from .zarrchunks import (
    ChunkReader,
    codec_label,
    corrupt_chunk_error,
    describe_codecs,
    missing_chunk_error,
    unwrap_store,
)

__all__ = [
    "StrictStore",
    "ZarrSource",
    "array_names",
    "describe",
    "describe_codecs",
    "is_zarr_dir",
    "open_node",
    "open_zarr",
    "read_record",
    "strict_zarr_array",
    "unfinished_error",
    "zarr_fingerprint",
    "zarr_marked_complete",
    "zarr_marker",
    "zarr_read_error",
]


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
        marker = zarr_marker(array)
        if marker is False:
            raise unfinished_error(self.name)
        self.strict = bool(marker) if strict is None else bool(strict)
        self.fingerprint = zarr_fingerprint(array)
        self.array = strict_zarr_array(array, self.name) if self.strict else array
        # Unsharded arrays (local, or remote with many chunks in flight) are read chunk by chunk
        # in the reader's own thread.
        self.chunk_reader = ChunkReader.of(array, self.name, self.strict)

    def prefetch(self, starts: Sequence[int], stops: Sequence[int]) -> None:
        """Start fetching rows ``[starts[i], stops[i])`` from object storage (a window of
        blocks); nothing for local arrays."""
        if self.chunk_reader is not None:
            self.chunk_reader.prefetch(starts, stops)

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

    def read_run(self, start: int, stop: int) -> np.ndarray:
        return self._read(np.arange(start, stop, dtype=np.int64), None)

    def range_pieces(self, start: int, stop: int) -> int:
        """Chunks rows ``[start, stop)`` touch when read chunk by chunk, else one piece."""
        return self.chunk_reader.range_pieces(start, stop) if self.chunk_reader else 1

    def read_pieces_into(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray
    ) -> None:
        """Pieces ``[first, last)`` of reading rows ``[start, stop)`` into ``out`` (see
        :meth:`range_pieces`)."""
        if self.chunk_reader is None:
            self.read_range_into(start, stop, out)
            return
        try:
            self.chunk_reader.read_pieces_into(start, stop, first, last, out)
        except (ArrayfeedError, MemoryError):
            raise
        except Exception as exc:  # a store error: name the chunk
            indices = np.arange(start, stop, dtype=np.int64)
            raise zarr_read_error(self.array, self.name, indices, exc) from exc

    def _read(self, indices: Indices, out: np.ndarray | None) -> np.ndarray:
        try:
            if self.chunk_reader is not None:
                return self.chunk_reader.read(indices, out=out)
            run = run_bounds(indices)
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
        """Rows per stored object along axis 0: the shard when sharded, else the chunk (at most
        the array's rows: Zarr allows chunks longer than the array)."""
        shards = self.array.shards
        return min(int((shards or self.array.chunks)[0]), len(self)) or None

    @property
    def encoded(self) -> bool:
        """Whether chunks pass through a filter or a compressor other than a CRC-32C."""
        return any(
            codec_label(c) != "crc32c" for c in (*self.array.filters, *self.array.compressors)
        )

    @property
    def chunks(self) -> tuple[int, ...]:
        """The chunk shape (the inner chunks of a sharded array)."""
        return tuple(int(c) for c in self.array.chunks)

    def __repr__(self) -> str:
        return f"ZarrSource({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def open_node(path: str | os.PathLike[str] | RemotePath, mode: Any = "r") -> Any:
    """``zarr.open`` of a local path or a URL with its storage options."""
    if isinstance(path, RemotePath):
        path.filesystem()  # a named error when fsspec or the protocol's package is missing
        options = dict(path.storage_options)
        return zarr.open(store=path.url, mode=mode, storage_options=options)
    return zarr.open(store=str(path), mode=mode)


def _open_failed(path: Path | RemotePath, exc: Exception) -> Exception:
    if not isinstance(path, RemotePath):
        return SourceNotFoundError(f"'{path}' is not a Zarr store ({exc}).")
    if isinstance(exc, ArrayfeedError) or not isinstance(exc, FileNotFoundError):
        return remote_error(exc, path.url)
    if path.bucket_exists() is False:
        return remote_error(FileNotFoundError("The specified bucket does not exist"), path.url)
    return SourceNotFoundError(f"there is no Zarr store at '{path}' ({exc}); check the URL.")


def unfinished_error(name: str) -> CorruptDataError:
    """The error for reading a store whose conversion has not finished."""
    return CorruptDataError(
        f"Zarr array '{name}' is in a store that `arrayfeed convert` has not finished writing "
        "(its record says complete: false): the conversion is still running, or it failed or "
        "was interrupted, so chunks may be missing. Run the conversion again (it replaces the "
        "unfinished store), or wait for the running one."
    )


def open_zarr(path: Path | RemotePath, key: str | None, strict: bool | None = None) -> Source:
    """The Zarr array at ``path`` (an array store, or the array ``key`` of a group store)."""
    try:
        node = open_node(path)
    except Exception as exc:  # zarr raises several unrelated types for a non-store directory
        raise _open_failed(path, exc) from None
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


_ZARR_METADATA = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


def zarr_marked_complete(array: zarr.Array[Any]) -> bool:
    """True if ``array`` or a group above it carries ``{"arrayfeed": {"complete": true}}``."""
    return zarr_marker(array) is True


def zarr_marker(array: zarr.Array[Any]) -> bool | None:
    """The completeness marker nearest ``array`` (on it or a group above it): True for a store
    ``convert`` finished, False for one it has not, None for a store it did not write.

    Groups above it inside its store are opened through the store; for a store opened at the
    array itself (``zarr.open_array("store.zarr/x")``, local or on object storage), the group
    metadata in the directories above are read as well.
    """
    state = marker_state(array.attrs)
    if state is not None:
        return state
    parts = [p for p in str(array.path).split("/") if p]
    for depth in range(len(parts) - 1, -1, -1):
        try:
            group = zarr.open_group(store=array.store, path="/".join(parts[:depth]), mode="r")
        except Exception:  # no group metadata at this level (e.g. an implicit group)
            continue
        if (state := marker_state(group.attrs)) is not None:
            return state
    for attrs in _enclosing_groups(unwrap_store(array.store)):
        if (state := marker_state(attrs)) is not None:
            return state
    return None


def _enclosing_groups(store: Store) -> Iterator[dict[str, Any]]:
    """Attributes of the Zarr groups in the directories above the root of ``store``, nearest
    first, up to the first directory that is not a group."""
    if isinstance(store, LocalStore):
        read = _read_local
        parents = [str(d) for d in Path(store.root).resolve().parents]
    elif isinstance(store, FsspecStore):
        fs = sync_filesystem(store.fs)

        def read(path: str) -> bytes | None:
            try:
                return bytes(fs.cat_file(path))
            except Exception:  # missing, or not readable: not a group we can use
                return None

        path = store.path.rstrip("/")
        parents = []
        while "/" in path.split("://")[-1]:
            path = path.rsplit("/", 1)[0]
            parents.append(path)
    else:
        return
    for directory in parents:
        attrs = _group_attrs(directory, read)
        if attrs is None:
            return  # not a group: the enclosing store ends here
        yield attrs


def _read_local(path: str) -> bytes | None:
    return Path(path).read_bytes() if os.path.isfile(path) else None


def _group_attrs(directory: str, read: Any) -> dict[str, Any] | None:
    """Attributes of the Zarr group whose directory is ``directory``, or None if it is not one."""
    try:
        if (raw := read(f"{directory}/zarr.json")) is not None:
            meta = json.loads(raw)
            return dict(meta.get("attributes", {})) if meta.get("node_type") == "group" else None
        if read(f"{directory}/.zgroup") is not None:
            zattrs = read(f"{directory}/.zattrs")
            return dict(json.loads(zattrs)) if zattrs is not None else {}
    except (OSError, ValueError):
        return None
    return None


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
                return corrupt_chunk_error(
                    name, coords, array.metadata.encode_chunk_key(coords), exc
                )
    return CorruptDataError(
        f"reading rows of Zarr array '{name}' failed ({type(error).__name__}: {error}), although "
        "each chunk they touch reads on its own; check the store and its storage."
    )


def describe(path: Path | RemotePath) -> StoreInfo:
    """Layout of every array in the Zarr store at ``path`` (metadata only)."""
    try:
        node = open_node(path)
    except Exception as exc:  # zarr raises several unrelated types for a non-store directory
        if isinstance(path, RemotePath):
            raise _open_failed(path, exc) from None
        raise SourceNotFoundError(
            f"'{path}' is a directory but not a Zarr store ({exc})."
        ) from None
    record: ConversionRecord | None = None
    if isinstance(node, zarr.Group):
        record = parse_record(node.attrs.get(MARKER))
        arrays = sorted(
            (name, member)
            for name, member in node.members(max_depth=None)
            if isinstance(member, zarr.Array)
        )
        fmt = f"Zarr v{node.metadata.zarr_format}"
    else:
        arrays = [("", node)]
        fmt = f"Zarr v{node.metadata.zarr_format}"
    strict = record is not None and record.complete
    layouts = []
    specs = {}
    for name, array in arrays:
        layouts.append(
            ArrayLayout(
                name=name,
                shape=array.shape,
                dtype=np.dtype(array.dtype),
                chunks=array.chunks,
                compression=describe_codecs(array),
                stored_bytes=int(array.nbytes_stored()),
                missing_chunks=int(array.nchunks - array.nchunks_initialized),
                strict=strict,
            )
        )
        specs[name] = f"{path}:{name}" if name else str(path)
    return StoreInfo(
        format=fmt, arrays=tuple(layouts), specs=specs, record=record, convert_suffix=".zarr"
    )


def array_names(path: str | os.PathLike[str] | RemotePath) -> list[str] | None:
    """Paths of every array in the Zarr group at ``path``; None when ``path`` is a lone array."""
    try:
        node = open_node(path)
    except Exception as exc:
        if isinstance(path, RemotePath):
            raise _open_failed(path, exc) from None
        raise
    if not isinstance(node, zarr.Group):
        return None
    return [k for k, v in node.members(max_depth=None) if isinstance(v, zarr.Array)]


def is_zarr_dir(path: Path) -> bool:
    """True for a directory holding Zarr metadata, or an empty one."""
    if not path.is_dir():
        return False
    markers = ("zarr.json", ".zgroup", ".zarray")
    return any((path / m).exists() for m in markers) or not any(path.iterdir())


def read_record(
    store: str | os.PathLike[str] | RemotePath | zarr.Group,
) -> ConversionRecord | None:
    """The conversion record on a Zarr group (a path, URL or an open group), if any."""
    if isinstance(store, zarr.Group):
        return parse_record(store.attrs.get(MARKER))
    try:
        node = open_node(store)
    except Exception as exc:  # zarr raises several unrelated types for a non-store directory
        if isinstance(store, RemotePath):
            raise _open_failed(store, exc) from None
        return None
    return parse_record(node.attrs.get(MARKER)) if isinstance(node, zarr.Group) else None
