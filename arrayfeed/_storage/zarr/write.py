"""Writing Zarr v3 groups for ``convert``, on a local disk or on object storage.

A local store is written inside a hidden workspace and renamed into place once verified (see
``arrayfeed._conversion.atomic``). Object stores have no rename, so there the order of writes
makes the guarantee instead:

1. whatever is at the output (a store a conversion did not finish, or, with ``overwrite``, any
   Zarr store) is removed;
2. the root group is written first, carrying the conversion record with ``complete: false``
   (:func:`~..record.marker_state`): readers refuse such a store (``ZarrSource``);
3. the arrays and every chunk;
4. after the copy is read back and verified, the record with ``complete: true``
   (:func:`mark_complete`), the last object written.

So an interrupted conversion never looks complete, and the next run replaces it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec

from ..._version import __version__
from ..layout import GZIP_LEVEL, SparseLayout, StoredArrays
from ..record import MARKER, ConversionRecord, marker_state
from ..remote.errors import remote_error
from ..remote.paths import RemotePath
from .describe import read_record
from .nodes import METADATA, on_object_storage, open_node

__all__ = [
    "DestinationState",
    "ZarrRegionWriter",
    "ZarrWriter",
    "destination_state",
    "mark_complete",
    "open_written",
    "remove_store",
]

#: What is at the output of a conversion to object storage before it starts.
DestinationState = Literal["absent", "converted", "unfinished", "zarr", "other"]


def _zarr_compressors(compression: str) -> Any:
    if compression == "lzf":
        return [BloscCodec(cname="lz4", clevel=5)]
    if compression == "gzip":
        return [GzipCodec(level=GZIP_LEVEL)]
    return None


class ZarrWriter:
    """Writes one array per name into a new Zarr v3 group, every chunk stored, and each of
    ``sparse`` as AnnData's ``csr_matrix`` group (see :class:`~..layout.Writer`; its components are
    written as arrays named ``NAME/data``, ``NAME/indices``, ``NAME/indptr``). The group carries
    a record marked incomplete until :meth:`finish` (or :func:`mark_complete`) replaces it."""

    def __init__(
        self,
        path: Path | RemotePath,
        arrays: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]],
        chunk_rows: int,
        compression: str,
        sparse: Mapping[str, SparseLayout] | None = None,
    ) -> None:
        if isinstance(path, RemotePath):
            _remove(path)
            with on_object_storage():
                self.group = zarr.open_group(
                    store=path.url,
                    mode="w",
                    zarr_format=3,
                    storage_options=path.options(writing=True),
                )
        else:
            self.group = zarr.open_group(str(path), mode="w", zarr_format=3)
        unfinished = ConversionRecord(
            version=__version__,
            complete=False,
            rows=max(
                [shape[0] for shape, _ in arrays.values()]
                + [layout.n_rows for layout in (sparse or {}).values()],
                default=0,
            ),
            chunk_rows=chunk_rows,
            compression=compression,
            shuffle_seed=None,
        )
        self.group.attrs[MARKER] = unfinished.to_json()  # before any array
        self.compression = compression
        self.arrays: dict[str, Any] = {}
        for name, (shape, dtype) in arrays.items():
            self.arrays[name] = self._create(self.group, name, shape, dtype, chunk_rows)
        for name, layout in (sparse or {}).items():
            group = self.group.create_group(name, attributes=layout.attrs)
            for part, (length, dtype, chunk) in layout.arrays().items():
                self.arrays[f"{name}/{part}"] = self._create(
                    group, part, (length,), dtype, chunk or length
                )

    def _create(
        self,
        where: Any,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        chunk_rows: int,
    ) -> Any:
        return where.create_array(
            name,
            shape=shape,
            dtype=dtype,
            chunks=(max(1, chunk_rows), *shape[1:]),
            # A CRC-32C per chunk: a flipped bit is a read error, never wrong values.
            compressors=[*(_zarr_compressors(self.compression) or []), Crc32cCodec()],
            config={"write_empty_chunks": True},
        )

    def write(self, name: str, start: int, rows: np.ndarray) -> None:
        self.arrays[name][start : start + len(rows)] = rows

    def finish(self, record: ConversionRecord) -> None:
        self.group.attrs[MARKER] = record.to_json()

    def close(self) -> None:
        pass


class ZarrRegionWriter:
    """Writes rows into the arrays of a group a :class:`ZarrWriter` created: one worker of a
    distributed conversion. Its runs must be whole chunks (the last one may end the array), so
    that no two writers share a chunk."""

    def __init__(self, path: Path | RemotePath) -> None:
        if isinstance(path, RemotePath):
            with on_object_storage():
                self.group = zarr.open_group(
                    store=path.url, mode="r+", storage_options=path.options(writing=True)
                )
        else:
            self.group = zarr.open_group(str(path), mode="r+")
        self.arrays: dict[str, Any] = {}

    def write(self, name: str, start: int, rows: np.ndarray) -> None:
        if name not in self.arrays:
            self.arrays[name] = self.group[name]
        self.arrays[name][start : start + len(rows)] = rows

    def finish(self, record: ConversionRecord) -> None:
        self.group.attrs[MARKER] = record.to_json()

    def close(self) -> None:
        pass


@contextlib.contextmanager
def open_written(
    path: Path | RemotePath,
    names: list[str],
    groups: list[str] | None = None,
    *,
    count_chunks: bool = True,
) -> Iterator[StoredArrays]:
    """A converted Zarr group opened again to check it (arrays ``names``, and the attributes
    of ``groups``); ``count_chunks``: also count the stored chunks (lists every chunk key: once
    per conversion, not per slab)."""
    group = open_node(path)
    if not isinstance(group, zarr.Group):  # pragma: no cover - the writer made a group
        raise TypeError(f"'{path}' is not a Zarr group")
    arrays: dict[str, Any] = {n: group[n] for n in names}
    yield StoredArrays(
        arrays=arrays,
        record=read_record(group),
        missing_chunks={n: int(a.nchunks - a.nchunks_initialized) for n, a in arrays.items()}
        if count_chunks
        else {},
        total_chunks={n: int(a.nchunks) for n, a in arrays.items()},
        group_attrs={g: dict(group[g].attrs) for g in groups or ()},
    )


def destination_state(location: RemotePath) -> DestinationState:
    """What is at ``location`` (object storage) before a conversion writes a Zarr store there.

    Raises a named :class:`~arrayfeed.DestinationError` for a missing bucket, missing
    credentials or denied access.
    """
    fs, path = location.filesystem(writing=True)
    if location.bucket_exists() is False:
        raise remote_error(
            FileNotFoundError("The specified bucket does not exist"), location.url, writing=True
        )
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return "absent"
    except Exception as exc:
        raise remote_error(exc, location.url, writing=True) from None
    if info.get("type") != "directory":
        return "other"
    for metadata in METADATA:
        try:
            raw = fs.cat_file(f"{path.rstrip('/')}/{metadata}")
        except FileNotFoundError:
            continue
        except Exception as exc:
            raise remote_error(exc, location.url, writing=True) from None
        if metadata != "zarr.json":
            return "zarr"
        try:
            attrs = json.loads(raw).get("attributes") or {}
        except (ValueError, AttributeError):
            return "zarr"
        state = marker_state(attrs)
        return "zarr" if state is None else ("converted" if state else "unfinished")
    return "other"


def _remove(location: RemotePath) -> None:
    """Delete every object under ``location`` (nothing there is fine)."""
    fs, path = location.filesystem(writing=True)
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass
    except Exception as exc:
        raise remote_error(exc, location.url, writing=True) from None


def remove_store(location: RemotePath) -> None:
    """Best-effort removal of a store a failed conversion left on object storage (its record
    says it is unfinished, so readers refuse it even if this fails)."""
    with contextlib.suppress(Exception):
        _remove(location)


def mark_complete(location: RemotePath, record: ConversionRecord) -> None:
    """Write ``record`` (``complete: true``) on the group at ``location``: the last write of a
    conversion to object storage."""
    with on_object_storage():
        group = zarr.open_group(
            store=location.url, mode="r+", storage_options=location.options(writing=True)
        )
    group.attrs[MARKER] = record.to_json()
