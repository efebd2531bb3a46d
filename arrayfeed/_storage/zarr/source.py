"""Sources over Zarr arrays (v3 and v2), local or on object storage.

:class:`ZarrSource` reads a ``zarr.Array`` chunk by chunk in the reader's own thread where
:class:`~.chunks.ChunkReader` can (unsharded arrays in a local directory or on object storage,
many chunks in flight there), else through zarr-python's orthogonal selection. A missing chunk of a
store marked complete is an error (:mod:`.strict`); a store whose conversion has not finished is
refused; a chunk that cannot be decoded is named (:mod:`.errors`); the array's metadata file is
fingerprinted, so a store replaced under the source is an error. :func:`open_zarr` opens the array
at a path or URL.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore

from ..._errors import ArrayfeedError, SourceNotFoundError
from ..base import REOPENS, Indices, Portability, Source, run_bounds
from ..fingerprint import Fingerprint
from ..remote.cachespec import CacheSpec
from ..remote.paths import RemotePath
from .chunks import ChunkReader
from .codecs import codec_label
from .errors import open_failed, unfinished_error, zarr_read_error
from .nodes import array_paths, open_node, unwrap_store
from .strict import strict_zarr_array, zarr_marker

__all__ = ["ZarrSource", "open_zarr", "zarr_fingerprint"]


class ZarrSource:
    """A ``zarr.Array`` (Zarr format 3 or 2), read with orthogonal selection.

    ``strict``: a missing chunk raises :class:`CorruptDataError` instead of reading as the fill
    value. None (the default) means strict exactly when the array or a parent group is marked
    complete by arrayfeed (``{"arrayfeed": {"complete": true}}``); foreign stores, which may
    legitimately omit chunks equal to the fill value, keep Zarr's semantics.
    """

    def __init__(
        self,
        array: zarr.Array[Any],
        name: str | None = None,
        *,
        strict: bool | None = None,
        cache: CacheSpec | None = None,
    ) -> None:
        self.name = name or f"{array.store}/{array.path}".rstrip("/")
        marker = zarr_marker(array)
        if marker is False:
            raise unfinished_error(self.name)
        self.strict = bool(marker) if strict is None else bool(strict)
        self.fingerprint = zarr_fingerprint(array)
        self.array = strict_zarr_array(array, self.name) if self.strict else array
        # Unsharded arrays (local, or remote with many chunks in flight, through `cache` if
        # given) are read chunk by chunk in the reader's own thread.
        self.chunk_reader = ChunkReader.of(array, self.name, self.strict, cache)

    def portability(self) -> Portability:
        """A store in files or on object storage is opened again; one in memory stays."""
        store = unwrap_store(self.array.store)
        if type(store).__name__ in ("LocalStore", "FsspecStore", "ZipStore", "ObjectStore"):
            return REOPENS
        return Portability("stays", f"a Zarr array in a {type(store).__name__}")

    def kept_locally(self) -> bool:
        """Whether chunks fetched from object storage are kept in a local cache."""
        reader = self.chunk_reader
        return reader is not None and reader.fetcher is not None and reader.fetcher.kept_locally

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


def open_zarr(path: Path | RemotePath, key: str | None, strict: bool | None = None) -> Source:
    """The Zarr array at ``path`` (an array store, or the array ``key`` of a group store)."""
    try:
        node = open_node(path)
    except Exception as exc:  # zarr raises several unrelated types for a non-store directory
        raise open_failed(path, exc) from None
    if key is not None:
        if not isinstance(node, zarr.Group) or not isinstance(node.get(key), zarr.Array):
            names = array_paths(node)
            raise SourceNotFoundError(
                f"'{path}' has no array {key!r}; its arrays are {names}. Pass one as `key`."
            )
        node = node[key]
    if isinstance(node, zarr.Group):
        names = array_paths(node)
        if len(names) != 1:
            raise SourceNotFoundError(
                f"'{path}' is a Zarr group with arrays {names}; pass one of them as `key`."
            )
        key = names[0]
        node = node[key]
    assert isinstance(node, zarr.Array)
    cache = path.cache if isinstance(path, RemotePath) else None
    return ZarrSource(node, name=f"{path}:{key}" if key else str(path), strict=strict, cache=cache)


def zarr_fingerprint(array: zarr.Array[Any]) -> Fingerprint | None:
    """The fingerprint of the metadata file of an array in a local (directory) store."""
    store = unwrap_store(array.store)
    if not isinstance(store, LocalStore):
        return None
    metadata = "zarr.json" if array.metadata.zarr_format == 3 else ".zarray"
    return Fingerprint.of(os.path.join(store.root, str(array.path), metadata))
