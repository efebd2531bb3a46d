"""Reading rows of a Zarr array chunk by chunk, in the calling thread.

zarr-python 3 runs every read on its own event loop thread and hands file reads and decoding to
further threads. Each hand-over needs the GIL, and while a training loop holds it each one can
wait a whole switch interval (docs/performance.md, "Zarr reads in the calling thread"). For the
common case, an unsharded array in a local directory (Zarr v3 with a ``bytes`` serializer and
standard compressors, or Zarr v2 in C order without filters), :class:`ChunkReader` reads chunk
files and decodes them in the reader thread (``numcodecs`` releases the GIL while it
decompresses), with the semantics of Zarr's own reads: missing chunks are the fill value, or an
error when the store is strict.

Local chunk files are read into reused work buffers (:mod:`..workbuffers` says why), the CRC-32C
of a chunk is checked where it lies, and Blosc and Zstandard chunks decode into a reused buffer
when their frame declares exactly a chunk's size. Chunks of whole rows stored as they are (no
compressor, a trailing CRC-32C at most: what ``arrayfeed convert`` writes by default) that a
block read covers whole are read straight into its output, with no copy.

Arrays on object storage (Zarr's ``FsspecStore``: ``s3://`` …) are read the same way, except
that chunk objects come from a :class:`~..remote.fetcher.Fetcher`: every chunk a read touches (a
whole window of blocks, with :meth:`ChunkReader.prefetch`) is requested at once, many requests in
flight on the filesystem's event loop (or through the local cache, :mod:`..remote.cache`), and
each is decoded in the reader thread that needs it.
:meth:`ChunkReader.of` returns None for anything else, and the caller reads through Zarr.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from zarr.storage import FsspecStore, LocalStore

from ..._errors import CorruptDataError
from .. import workbuffers
from ..remote.cache import versions_under
from ..remote.cachespec import CacheSpec
from ..remote.fetcher import Fetcher, sync_filesystem
from . import codecs
from .codecs import CodecDecoder, Decoder, crc32c_end, decoder
from .errors import corrupt_chunk_error, missing_chunk_error
from .nodes import unwrap_store

__all__ = ["ChunkReader"]


def _read_rest(fd: int, data: bytes) -> bytes:
    """``data``, the first bytes of the file ``fd``, and the rest of it to its end (a read may
    return less than asked: network file systems, signals)."""
    parts = [data]
    while part := os.pread(fd, 1 << 20, sum(map(len, parts))):
        parts.append(part)
    return b"".join(parts)


def _preadv_all(fd: int, buffers: list[memoryview]) -> int:
    """Fill ``buffers`` from the start of file ``fd`` on, one after another, continuing reads
    that return less than asked; the bytes read (fewer only at the file's end)."""
    total, got = sum(b.nbytes for b in buffers), 0
    while got < total:
        rest, skip = [], got  # the buffers from byte `got` on
        for b in buffers:
            if skip < b.nbytes:
                rest.append(b[skip:])
            skip = max(0, skip - b.nbytes)
        n = os.preadv(fd, rest, got)
        if not n:
            break
        got += n
    return got


def _v3_layout(
    array: zarr.Array[Any], dtype: np.dtype[Any]
) -> tuple[np.dtype[Any], list[Decoder]] | None:
    """Stored dtype and decoders (in decoding order) of a Zarr v3 array, if this module can run
    them: a ``bytes`` serializer, no array-to-array codecs, known compressors."""
    meta: Any = array.metadata  # ArrayV3Metadata
    codecs: list[dict[str, Any]] = [dict(codec.to_dict()) for codec in meta.codecs]
    if not codecs or codecs[0].get("name") != "bytes":
        return None  # array-to-array codecs (transpose) or another serializer
    endian = (codecs[0].get("configuration") or {}).get("endian")
    if dtype.itemsize > 1:
        dtype = dtype.newbyteorder("<" if endian in (None, "little") else ">")
    decoders = [decoder(spec) for spec in codecs[1:]]
    if any(d is None for d in decoders):
        return None
    return dtype, [d for d in reversed(decoders) if d is not None]


def _v2_layout(array: zarr.Array[Any]) -> tuple[np.dtype[Any], list[Decoder]] | None:
    """Stored dtype and decoder of a Zarr v2 array in C order without filters: its compressor
    is a ``numcodecs`` codec already."""
    meta: Any = array.metadata  # ArrayV2Metadata
    if meta.filters or meta.order != "C":
        return None
    stored = np.dtype(meta.dtype.to_native_dtype())  # the byte order written in .zarray
    return stored, [CodecDecoder(meta.compressor)] if meta.compressor is not None else []


class ChunkReader:
    """Rows of one unsharded Zarr array, local or remote, decoded in the calling thread.

    Local chunks are files under ``root``; remote ones are objects of ``fetcher``.
    """

    def __init__(
        self,
        root: Path | None,
        shape: tuple[int, ...],
        chunks: tuple[int, ...],
        dtype: np.dtype[Any],
        fill_value: Any,
        decoders: Sequence[Decoder],
        key: Callable[[tuple[int, ...]], str],
        name: str,
        strict: bool,
        fetcher: Fetcher | None = None,
    ) -> None:
        self.root, self.shape, self.chunks, self.dtype = root, shape, chunks, dtype
        self.fetcher = fetcher
        self.fill_value, self.decoders, self.key = fill_value, list(decoders), key
        self.name, self.strict = name, strict
        self._chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * dtype.itemsize
        # Whether a decoded chunk goes into a lent buffer: the decoder that yields it can write
        # into one, and the chunk is large enough to be worth it.
        final = self.decoders[-1] if self.decoders else None
        self._lend_decoded = (
            isinstance(final, CodecDecoder)
            and final.declared is not None
            and self._chunk_bytes >= workbuffers.MIN_BYTES
        )
        # Chunks read straight into the output (no copy) when a block read covers them whole:
        # local files of whole rows stored as they are (a trailing CRC-32C at most), in the
        # output's byte order.
        self._direct = (
            root is not None
            and fetcher is None
            and tuple(chunks[1:]) == tuple(shape[1:])
            and dtype.isnative
            and all(d is crc32c_end for d in self.decoders)
            and len(self.decoders) <= 1
        )
        self._tail = 4 * len(self.decoders)  # the CRC-32C's bytes after the chunk's
        # Chunks of whole rows that a block read covers whole are decoded straight into the
        # output where the decoder that yields them can write into a buffer (Blosc, Zstandard
        # frames that declare their size), in the output's byte order: no copy.
        self._into_out = (
            tuple(chunks[1:]) == tuple(shape[1:])
            and dtype.isnative
            and isinstance(final, CodecDecoder)
            and final.declared is not None
        )
        # Chunks read or decoded straight into an output (for tests and benchmarks; counted
        # without a lock, so exact when one thread reads).
        self.direct = 0
        # Chunk coordinates along every axis but the first, the region of a row each covers, and
        # the part of the chunk that lies inside the array.
        grid = [range(-(-n // c)) for n, c in zip(shape[1:], chunks[1:], strict=True)]
        self._rest: list[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]] = []
        for rest in itertools.product(*grid):
            region = tuple(
                slice(i * size, min((i + 1) * size, n))
                for i, size, n in zip(rest, chunks[1:], shape[1:], strict=True)
            )
            self._rest.append((rest, region, tuple(slice(0, r.stop - r.start) for r in region)))

    @classmethod
    def of(
        cls, array: zarr.Array[Any], name: str, strict: bool, cache: CacheSpec | None = None
    ) -> ChunkReader | None:
        """A reader for ``array``, or None when its storage or codecs need Zarr's own reads.
        Chunks on object storage go through ``cache`` when given, checked against their
        versions as one listing of the array's objects says now."""
        store = unwrap_store(array.store)
        if not isinstance(store, (LocalStore, FsspecStore)) or array.shards is not None:
            return None
        if not array.shape:
            return None
        dtype = np.dtype(array.dtype)
        if dtype.hasobject or dtype.kind in "USVMm" or array.fill_value is None:
            return None
        layout = _v3_layout(array, dtype) if array.metadata.zarr_format == 3 else _v2_layout(array)
        if layout is None:
            return None
        stored, decoders = layout
        root, fetcher = None, None
        if isinstance(store, LocalStore):
            root = Path(store.root) / str(array.path)
        else:
            where = "/".join(p for p in (store.path.rstrip("/"), str(array.path)) if p)
            protocol = (
                store.fs.protocol if isinstance(store.fs.protocol, str) else store.fs.protocol[0]
            )
            url = where if "://" in where else f"{protocol}://{where}"
            fs = sync_filesystem(store.fs)
            versions = versions_under(fs, where) if cache is not None else None
            fetcher = Fetcher(fs, where, url, cache=cache, versions=versions)
        return cls(
            root=root,
            shape=tuple(int(n) for n in array.shape),
            chunks=tuple(int(c) for c in array.chunks),
            dtype=stored,
            fill_value=array.fill_value,
            decoders=decoders,
            key=array.metadata.encode_chunk_key,
            name=name,
            strict=strict,
            fetcher=fetcher,
        )

    def _keys(self, start: int, stop: int) -> Iterator[str]:
        rows = self.chunks[0]
        for c in range(start // rows, (stop - 1) // rows + 1):
            for rest, _, _ in self._rest:
                yield self.key((c, *rest))

    def prefetch(self, starts: Sequence[int], stops: Sequence[int]) -> None:
        """Start fetching the chunks of rows ``[starts[i], stops[i])`` (remote arrays only)."""
        if self.fetcher is not None:
            self.fetcher.fetch(
                key for a, b in zip(starts, stops, strict=True) if a < b for key in self._keys(a, b)
            )

    def read(self, indices: npt.NDArray[np.int64], out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``indices`` (sorted, unique), in ``out`` if given, else in a new array."""
        if out is None:
            out = np.empty((len(indices), *self.shape[1:]), dtype=self.dtype.newbyteorder("="))
        if not len(indices):
            return out
        rows_per_chunk = self.chunks[0]
        row_chunk = indices // rows_per_chunk
        starts = np.concatenate(([0], np.flatnonzero(np.diff(row_chunk)) + 1, [len(indices)]))
        if self.fetcher is not None:  # every chunk in flight at once
            self.fetcher.fetch(
                self.key((c, *rest))
                for c in row_chunk[starts[:-1]].tolist()
                for rest, _, _ in self._rest
            )
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
            c = int(row_chunk[a])
            local = indices[a:b] - c * rows_per_chunk
            rows: slice | npt.NDArray[np.int64] = (
                slice(int(local[0]), int(local[-1]) + 1)
                if int(local[-1]) - int(local[0]) + 1 == len(local)
                else local
            )
            for rest, region, inner in self._rest:
                self._copy_chunk((c, *rest), (rows, *inner), out, (slice(a, b), *region))
        return out

    def range_pieces(self, start: int, stop: int) -> int:
        """Chunks that rows ``[start, stop)`` touch: each is one piece of reading them."""
        rows = self.chunks[0]
        return ((stop - 1) // rows - start // rows + 1) * len(self._rest)

    def read_pieces_into(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray
    ) -> None:
        """Read and decode pieces ``[first, last)`` (chunks, see :meth:`range_pieces`) of rows
        ``[start, stop)`` into their parts of ``out``, which holds those rows."""
        rows, per_row = self.chunks[0], len(self._rest)
        if self.fetcher is not None:  # the whole range in flight, not just these pieces
            self.fetcher.fetch(self._keys(start, stop))
        whole_chunks = (
            (self._direct or self._into_out) and out.flags.c_contiguous and out.dtype == self.dtype
        )
        for piece in range(first, last):
            c = start // rows + piece // per_row
            rest, region, inner = self._rest[piece % per_row]
            lo, hi = max(start, c * rows), min(stop, (c + 1) * rows)
            into = out[lo - start : hi - start] if whole_chunks and hi - lo == rows else None
            if into is not None and self._direct and self._read_into((c, *rest), into):
                continue
            self._copy_chunk(
                (c, *rest),
                (slice(lo - c * rows, hi - c * rows), *inner),
                out,
                (slice(lo - start, hi - start), *region),
                into if self._into_out else None,
            )

    def _copy_chunk(
        self,
        coords: tuple[int, ...],
        part: tuple[Any, ...],
        out: np.ndarray,
        at: tuple[Any, ...],
        into: np.ndarray | None = None,
    ) -> None:
        """``out[at] = chunk[part]`` for the chunk at ``coords``; its work buffers go back
        after the copy. ``into``: ``out[at]`` itself when it is the whole chunk, C-contiguous,
        for the last decoder to write the chunk into (then nothing is copied)."""
        key = self.key(coords)
        data: Any
        raw = decoded = None
        if self.fetcher is not None:
            data, raw = self.fetcher.get_lent(key)
        else:
            assert self.root is not None
            data, raw = self._read_file(os.path.join(self.root, key))
        try:
            if data is None:
                if self.strict:
                    raise missing_chunk_error(self.name, key)
                out[at] = self.fill_value
                return
            try:
                # The last decoder, which yields the chunk, may write it into a work buffer of
                # exactly its size (the one taken can be larger); earlier ones never do, so no
                # decoder reads from the buffer it writes.
                target = None
                if into is not None:
                    target = into.reshape(-1).view(np.uint8)
                elif self._lend_decoded:
                    decoded = workbuffers.work.take(self._chunk_bytes)
                    target = decoded[: self._chunk_bytes]
                last = len(self.decoders) - 1
                for i, decode in enumerate(self.decoders):
                    data = decode(data, target if i == last else None)
                view = memoryview(data).cast("B")
                if view.nbytes != self._chunk_bytes:
                    raise ValueError(
                        f"decoded to {view.nbytes} bytes, expected {self._chunk_bytes}"
                    )
                chunk = np.frombuffer(view, dtype=self.dtype).reshape(self.chunks)
            except CorruptDataError:
                raise
            except Exception as exc:
                raise corrupt_chunk_error(self.name, coords, key, exc) from exc
            if into is not None and chunk.ctypes.data == into.ctypes.data:
                self.direct += 1  # decoded where it belongs
                return
            out[at] = chunk[part]
        finally:
            workbuffers.work.give(raw, decoded)

    def _read_into(self, coords: tuple[int, ...], dest: np.ndarray) -> bool:
        """Read chunk ``coords`` (whole rows, stored as they are) straight into ``dest``
        (C-contiguous, its size), checking its CRC-32C; False, with ``dest`` in any state,
        when its file is missing or not a stored chunk's size (the copying path then reads it
        and names what is wrong). Such a chunk's size is fixed, so its file is read to that
        size, not on to its end."""
        assert self.root is not None
        key = self.key(coords)
        try:
            fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):  # no chunk there, as Zarr reads it
            return False
        try:
            st = os.fstat(fd)
            if st.st_size != self._chunk_bytes + self._tail or not stat.S_ISREG(st.st_mode):
                return False
            size = st.st_size
            body = dest.reshape(-1).view(np.uint8)
            tail = bytearray(self._tail)
            if _preadv_all(fd, [body.data, memoryview(tail)] if tail else [body.data]) != size:
                return False  # cut short while read
        finally:
            os.close(fd)
        if tail:
            try:
                codecs.check_crc32c(body.view(), bytes(tail))
            except RuntimeError as exc:
                raise corrupt_chunk_error(self.name, coords, key, exc) from exc
        self.direct += 1
        return True

    @staticmethod
    def _read_file(path: str) -> tuple[memoryview | None, np.ndarray | None]:
        """The bytes of the file at ``path`` (None if there is none), and the work buffer that
        holds them."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):  # no chunk there, as Zarr reads it
            return None, None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a directory at a chunk's key: no chunk, as Zarr
                return None, None
            size = st.st_size
            if size < workbuffers.MIN_BYTES:
                # One `pread` of a byte more than the file holds, not a file object (half the GIL
                # time per chunk): a file that grew is read to its end.
                data = os.pread(fd, size + 1, 0)
                return memoryview(data if len(data) == size else _read_rest(fd, data)), None
            # At least one byte more than the file holds: a file that grew is seen.
            raw = workbuffers.work.take(size + 1)
            view = raw.data  # the buffer itself, for os.preadv
            got = _preadv_all(fd, [view[: size + 1]])
            if got <= size:
                return view[:got], raw
            workbuffers.work.give(raw)  # it grew while read: read it whole, as it is now
            return memoryview(_read_rest(fd, b"")), None
        finally:
            os.close(fd)
