"""Zarr stores and groups opened through zarr-python, locally or on object storage.

:func:`open_node` opens whatever is at a path or URL (an array or a group); a failed open on
object storage ends the requests zarr-python left running (:mod:`..remote.tasks`).
:func:`is_zarr_dir` recognises a store directory by its metadata files (:data:`METADATA`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import zarr
from zarr.abc.store import Store
from zarr.core.sync import sync
from zarr.storage import WrapperStore

from ..remote.paths import RemotePath
from ..remote.tasks import ending

__all__ = ["METADATA", "array_paths", "is_zarr_dir", "open_node", "unwrap_store"]

#: The metadata files of a Zarr node: one of them makes a directory (or prefix) a store.
METADATA = ("zarr.json", ".zgroup", ".zarray")


def open_node(path: str | os.PathLike[str] | RemotePath, mode: Any = "r") -> Any:
    """``zarr.open`` of a local path or a URL with its storage options."""
    if isinstance(path, RemotePath):
        path.filesystem()  # a named error when fsspec or the protocol's package is missing
        options = path.options(writing=mode != "r")
        with on_object_storage():
            return zarr.open(store=path.url, mode=mode, storage_options=options)
    return zarr.open(store=str(path), mode=mode)


def on_object_storage() -> contextlib.AbstractContextManager[None]:
    """Around a call to zarr-python on object storage: if it fails, the requests it left
    running on zarr's event loop are ended, not abandoned (:mod:`..remote.tasks`)."""
    return ending(sync)


def is_zarr_dir(path: Path) -> bool:
    """True for a directory holding Zarr metadata, or an empty one."""
    if not path.is_dir():
        return False
    return any((path / m).exists() for m in METADATA) or not any(path.iterdir())


def array_paths(node: Any) -> list[str]:
    """Paths of every array in the group ``node``, sorted (none for an array)."""
    if not isinstance(node, zarr.Group):
        return []
    return sorted(
        name for name, _ in node.members(max_depth=None) if isinstance(node[name], zarr.Array)
    )


def unwrap_store(store: Store) -> Store:
    """The store under any wrapper stores."""
    while isinstance(store, WrapperStore):
        store = store._store
    return store
