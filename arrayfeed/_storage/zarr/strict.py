"""Missing chunks: Zarr's fill values for foreign stores, an error for stores written complete.

Zarr reads a missing chunk as the fill value, which is right for stores that omit chunks equal to
it; arrayfeed keeps those semantics for foreign stores, but a store marked complete (the record's
marker on the array or a parent group, which ``arrayfeed convert`` writes: :func:`zarr_marker`) or
an array opened with ``strict=True`` is read through a :class:`StrictStore`, which raises for a
missing chunk.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from ..._errors import CorruptDataError
from ..record import marker_state
from ..remote.fetcher import sync_filesystem
from ..remote.paths import whole_object
from .errors import missing_chunk_error
from .nodes import METADATA, on_object_storage, unwrap_store

__all__ = ["StrictStore", "strict_zarr_array", "zarr_marked_complete", "zarr_marker"]

#: Keys of metadata, never chunks: a missing one keeps its usual meaning.
_METADATA_KEYS = frozenset({*METADATA, ".zattrs", ".zmetadata"})


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
    remote = isinstance(unwrap_store(array.store), FsspecStore)
    for depth in range(len(parts) - 1, -1, -1):
        try:
            with on_object_storage() if remote else contextlib.nullcontext():
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
        whole = whole_object(fs)

        def read(path: str) -> bytes | None:
            try:
                return bytes(fs.cat_file(path, **whole))
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
        if key.rsplit("/", 1)[-1] in _METADATA_KEYS:
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
