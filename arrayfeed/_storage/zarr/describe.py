"""Layout facts of Zarr stores for ``inspect`` and ``bench``, and the record ``convert`` wrote:
metadata only, never a chunk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import zarr

from ..._errors import SourceNotFoundError
from ..layout import ArrayLayout, StoreInfo
from ..record import MARKER, ConversionRecord, parse_record
from ..remote.paths import RemotePath
from .codecs import describe_codecs
from .errors import open_failed
from .nodes import open_node

__all__ = ["array_names", "describe", "read_record"]


def describe(path: Path | RemotePath) -> StoreInfo:
    """Layout of every array in the Zarr store at ``path`` (metadata only)."""
    try:
        node = open_node(path)
    except Exception as exc:  # zarr raises several unrelated types for a non-store directory
        if isinstance(path, RemotePath):
            raise open_failed(path, exc) from None
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
            raise open_failed(path, exc) from None
        raise
    if not isinstance(node, zarr.Group):
        return None
    return [k for k, v in node.members(max_depth=None) if isinstance(v, zarr.Array)]


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
            raise open_failed(store, exc) from None
        return None
    return parse_record(node.attrs.get(MARKER)) if isinstance(node, zarr.Group) else None
