"""Chunked HDF5 datasets read chunk by chunk, outside h5py's lock.

h5py runs every HDF5 call under one global lock, decompression included, so reader threads take
turns and chunked HDF5 never uses a second core (measured on a 16-core host: 8.0 k rows/s with one
reader thread, 8.1 k with 16). Where a dataset allows it, :class:`ChunkFile` asks h5py once per
process where every chunk lies (byte offset, stored size, which filters were skipped), then reads
chunks with ``os.pread`` on a descriptor of its own and decodes them in the calling thread with
the decoders of :mod:`.h5codecs`, none of which holds the GIL or h5py's lock while it works.
Measured on 2 cores (``benchmarks/bench_h5chunks.py``: 20,000 rows of uint8[64, 64, 3],
``chunks=True``, lzf, ``shuffle="block"``, one epoch through the feed): h5py's reads 12 k rows/s
with 1 or 2 reader threads; raw chunks 18-24 k with one thread and 42-45 k with two.

The values are those h5py returns, bit for bit: chunks never written read as the fill value, a
fletcher32 checksum is verified as HDF5 verifies it, and a chunk that fails to decode raises
:class:`~arrayfeed.CorruptDataError` naming the file, the dataset, the chunk and the filter.
:meth:`ChunkLayout.of` says why not (a string) for anything it does not reproduce exactly, and
the caller reads through h5py: filters such as szip, scaleoffset or nbit, unknown filter options,
non-native byte order, compound or string types, drivers other than a plain local file, a file
open for writing or through SWMR, and a fill time of "never".
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from .._errors import CorruptDataError
from .._forks import renew_after_fork
from . import workbuffers
from .h5codecs import (
    FILTER_NAMES,
    ChecksumError,
    Stage,
    StageError,
    Undecodable,
    decode_chunk,
    pipeline,
)

__all__ = ["ChunkFile", "ChunkLayout"]

#: h5py's own lock around every call into HDF5. `read_direct_chunk` did not take it until h5py's
#: pull request 2764 (December 2025): called while another thread was in HDF5, it failed ("no VOL
#: object wrap context") or crashed. It is taken here for that call.
_H5PY_LOCK: Any = getattr(getattr(h5py, "_objects", None), "phil", None) or contextlib.nullcontext()

Filters = tuple[tuple[int, tuple[int, ...], str], ...]
#: A chunk's coordinates in the chunk grid (chunk units, not elements).
Coords = tuple[int, ...]


def _filters(dataset: h5py.Dataset) -> Filters:
    """``(id, parameters, name)`` of every filter of ``dataset``, in the order they apply."""
    plist = dataset.id.get_create_plist()
    found = []
    for i in range(plist.get_nfilters()):
        code, _flags, values, label = plist.get_filter(i)
        name = FILTER_NAMES.get(code) or label.decode(errors="replace") or f"filter {code}"
        found.append((int(code), tuple(int(v) for v in values), name))
    return tuple(found)


def _native_type(dataset: h5py.Dataset, dtype: np.dtype[Any]) -> bool:
    """Whether the stored type is the native in-memory layout of ``dtype`` (so raw bytes are the
    values, as h5py would return them without conversion)."""
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        return False
    if dtype.kind not in "biufc" or not dtype.isnative:
        return False
    try:
        return bool(dataset.id.get_type().equal(h5py.h5t.py_create(dtype)))
    except (TypeError, ValueError):  # pragma: no cover - a type h5py cannot describe
        return False


@dataclass(frozen=True)
class ChunkLayout:
    """What reading a chunked dataset's raw chunks needs, all picklable (no handles): the
    per-process state is a :class:`ChunkFile` from :meth:`open`."""

    filename: str
    key: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype[Any]
    fill: Any
    filters: Filters

    @classmethod
    def of(cls, dataset: h5py.Dataset) -> ChunkLayout | str:
        """The layout of ``dataset`` if its raw chunks can be decoded here, else why not."""
        file = dataset.file
        if dataset.chunks is None or dataset.is_virtual:
            return "the dataset is not chunked"
        if not hasattr(os, "pread"):  # pragma: no cover - Windows
            return "this platform has no os.pread"
        if file.driver != "sec2":
            return f"the file is opened with HDF5's '{file.driver}' driver, not a plain local file"
        if file.mode != "r" or file.swmr_mode:
            return "the file is open for writing or through SWMR, so chunks may move"
        shape = tuple(int(n) for n in dataset.shape)
        if not shape or 0 in shape:
            return "the dataset is empty"
        dtype = np.dtype(dataset.dtype)
        if not _native_type(dataset, dtype):
            return f"its type ({dtype}) is not a plain number type in this machine's byte order"
        plist = dataset.id.get_create_plist()
        if plist.get_fill_time() == h5py.h5d.FILL_TIME_NEVER:
            return "its fill time is 'never', so chunks never written hold undefined values"
        filters = _filters(dataset)
        stages = pipeline(filters, dtype.itemsize)
        if isinstance(stages, str):
            return stages
        return cls(
            filename=str(file.filename),
            key=str(dataset.name),
            shape=shape,
            chunks=tuple(int(c) for c in dataset.chunks),
            dtype=dtype,
            fill=dataset.fillvalue,
            filters=filters,
        )

    def open(self, dataset: h5py.Dataset) -> ChunkFile | str:
        """This process's reader of the chunks of ``dataset`` (the dataset this layout came
        from, open here), or why its chunks cannot be read directly after all."""
        return ChunkFile.open(self, dataset)


class ChunkFile:
    """Rows of one chunked dataset, read with ``os.pread`` and decoded in the calling thread.

    One per dataset per process: it holds its own file descriptor (checked to be the file h5py
    has open) and the chunk index, taken from h5py once.
    """

    def __init__(
        self,
        layout: ChunkLayout,
        dataset: h5py.Dataset,
        fd: int,
        stages: Sequence[Stage],
        index: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> None:
        self.layout, self.dataset, self.fd, self.stages = layout, dataset, fd, tuple(stages)
        self.name = f"{layout.filename}:{layout.key}"
        self.shape, self.chunks, self.dtype = layout.shape, layout.chunks, layout.dtype
        self.offsets, self.sizes, self.masks = index
        self.nbytes = math.prod(self.chunks) * self.dtype.itemsize
        self.decoded = 0  # chunks decoded here (for tests and benchmarks)
        self.via_hdf5 = 0  # chunks read through h5py instead (a form not decoded here)
        self._fill: np.ndarray | None = None
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._closer = weakref.finalize(self, os.close, fd)
        # Chunk coordinates along every axis but the first, and the region of a row each covers.
        grid = [range(-(-n // c)) for n, c in zip(self.shape[1:], self.chunks[1:], strict=True)]
        self._rest: list[tuple[Coords, tuple[slice, ...]]] = []
        for rest in itertools.product(*grid):
            region = tuple(
                slice(i * size, min((i + 1) * size, n))
                for i, size, n in zip(rest, self.chunks[1:], self.shape[1:], strict=True)
            )
            self._rest.append((rest, region))
        # Chunks hold whole rows: a run of whole chunks is one contiguous stretch of the output.
        self._whole_rows = self.chunks[1:] == self.shape[1:]

    @classmethod
    def open(cls, layout: ChunkLayout, dataset: h5py.Dataset) -> ChunkFile | str:
        """A reader of ``dataset``'s chunks in this process, or why there is none."""
        stages = pipeline(layout.filters, layout.dtype.itemsize)
        if isinstance(stages, str):  # pragma: no cover - a codec library missing here only
            return stages
        fd = os.open(layout.filename, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            theirs = os.fstat(int(dataset.file.id.get_vfd_handle()))
            ours = os.fstat(fd)
            if (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino):
                os.close(fd)
                return "the file at its path is no longer the file h5py has open"
            index = _chunk_index(dataset, layout.shape, layout.chunks)
            reader = cls(layout, dataset, fd, stages, index)
        except BaseException:
            os.close(fd)
            raise
        if not reader._offsets_agree():
            reader.close()
            return "chunk byte offsets from HDF5 do not match the file's bytes"
        return reader

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        self._closer()

    # -- chunks ---------------------------------------------------------------------------------
    def _offsets_agree(self) -> bool:
        """Whether the first stored chunk's bytes at its offset are what HDF5 reads for it (a
        check, once per process, that offsets count from the start of the file)."""
        stored = np.flatnonzero(self.offsets.ravel() >= 0)
        if not len(stored):
            return True
        coords = tuple(int(c) for c in np.unravel_index(int(stored[0]), self.offsets.shape))
        start = tuple(c * n for c, n in zip(coords, self.chunks, strict=True))
        with _H5PY_LOCK:
            mask, data = self.dataset.id.read_direct_chunk(start)
        ours = os.pread(self.fd, int(self.sizes[coords]), int(self.offsets[coords]))
        return bool(ours == bytes(data) and int(mask) == int(self.masks[coords]))

    def _region(self, coords: Coords) -> tuple[slice, ...]:
        """The elements of chunk ``coords`` inside the dataset."""
        return tuple(
            slice(c * k, min((c + 1) * k, n))
            for c, k, n in zip(coords, self.chunks, self.shape, strict=True)
        )

    def chunk(self, coords: Coords) -> np.ndarray:
        """The part of chunk ``coords`` inside the dataset, decoded (may be read-only)."""
        with self._chunk(coords, self._region(coords)) as chunk:
            return chunk.copy()

    @contextlib.contextmanager
    def _chunk(self, coords: Coords, region: tuple[slice, ...]) -> Iterator[np.ndarray]:
        """The part of chunk ``coords`` in ``region``, decoded, while the block runs: it may lie
        in work buffers (:mod:`.workbuffers`) that are lent to other reads afterwards."""
        inside = tuple(slice(0, r.stop - r.start) for r in region)
        offset = int(self.offsets[coords])
        if offset < 0:  # never written: the fill value, as HDF5 reads it
            yield self._fill_chunk()[inside]
            return
        size, mask = int(self.sizes[coords]), int(self.masks[coords])
        applied = any(not mask >> i & 1 for i in range(len(self.stages)))
        if applied and size == self.nbytes and self._partial(region):
            # An edge chunk stored at exactly its raw size may have been written unfiltered
            # (H5Pset_chunk_opts' "don't filter partial edge chunks", which h5py cannot show):
            # let HDF5, which knows, read it.
            yield self._via_hdf5(region)
            return
        # Lent: the stored bytes when they are large, and a buffer for the decoded chunk when
        # the stage that yields it can write into one.
        first = next((st for i, st in enumerate(self.stages) if not mask >> i & 1), None)
        into = first is not None and first.into is not None
        stored = workbuffers.work.take(size) if size >= workbuffers.MIN_BYTES else None
        decoded = (
            workbuffers.work.take(self.nbytes)
            if into and self.nbytes >= workbuffers.MIN_BYTES
            else None
        )
        try:
            data: Any
            if stored is None:
                data = self._pread(coords, size, offset)
            else:
                self._pread(coords, size, offset, into=stored[:size])
                data = stored.data[:size]  # bytes to the codecs: imagecodecs reads arrays as arrays
            out = decoded[: self.nbytes] if decoded is not None else None
            try:
                raw = decode_chunk(self.stages, data, mask, self.nbytes, out=out)
            except Undecodable:
                raw = None
            except StageError as exc:
                raise self._corrupt(coords, exc) from exc.error
            if raw is None:
                yield self._via_hdf5(region)
                return
            with self._lock:
                self.decoded += 1
            yield np.frombuffer(raw, dtype=self.dtype).reshape(self.chunks)[inside]
        finally:
            workbuffers.work.give(stored, decoded)

    def _partial(self, region: tuple[slice, ...]) -> bool:
        return any(r.stop - r.start < k for r, k in zip(region, self.chunks, strict=True))

    def _pread(self, coords: Coords, size: int, offset: int, into: np.ndarray | None = None) -> Any:
        """``size`` bytes at ``offset``, in ``into`` (C-contiguous) if given."""
        if into is None:
            data: Any = os.pread(self.fd, size, offset)
            got = len(data)
        else:
            data = into
            got = os.preadv(self.fd, [into.reshape(-1).view(np.uint8).data], offset)
        if got != size:
            raise CorruptDataError(
                f"chunk {coords} of HDF5 dataset '{self.name}' is cut short: {got} of {size} "
                f"bytes at byte {offset}; the file was truncated. Restore it from a backup or "
                "re-create it."
            )
        return data

    def _whole_into(self, c: int, dest: np.ndarray) -> bool:
        """Read row chunk ``c`` (whole rows, all inside the dataset) straight into ``dest``
        when no filter applies to it; False when it needs decoding."""
        coords = (c, *[0] * (len(self.chunks) - 1))
        offset = int(self.offsets[coords])
        if offset < 0:
            dest[...] = self.layout.fill
            return True
        size, mask = int(self.sizes[coords]), int(self.masks[coords])
        if any(not mask >> i & 1 for i in range(len(self.stages))):
            return False
        if size != self.nbytes:
            error = StageError(None, ValueError(f"{size} bytes stored, expected {self.nbytes}"))
            raise self._corrupt(coords, error)
        self._pread(coords, size, offset, into=dest)
        with self._lock:
            self.decoded += 1
        return True

    def _fill_chunk(self) -> np.ndarray:
        if self._fill is None:
            fill = np.full(self.chunks, self.layout.fill, dtype=self.dtype)
            fill.flags.writeable = False
            self._fill = fill
        return self._fill

    def _via_hdf5(self, region: tuple[slice, ...]) -> np.ndarray:
        with self._lock:
            self.via_hdf5 += 1
        return np.asarray(self.dataset[region])

    def _corrupt(self, coords: Coords, exc: StageError) -> CorruptDataError:
        start = tuple(c * k for c, k in zip(coords, self.chunks, strict=True))
        where = f"chunk {coords} (elements from {start}) of HDF5 dataset '{self.name}'"
        if isinstance(exc.error, ChecksumError):
            problem = f"fails its fletcher32 checksum ({exc.error})"
        elif exc.stage is None:
            problem = f"has the wrong size ({exc.error})"
        else:
            problem = f"cannot be decoded by its {exc.stage.name} filter ({exc.error})"
        return CorruptDataError(
            f"{where} {problem}; the file is corrupted. Restore it from a backup or re-create it."
        )

    # -- rows -----------------------------------------------------------------------------------
    def _row_chunks(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """``(chunk, lo, hi)``: the row chunks that rows ``[start, stop)`` touch, and the rows
        of each."""
        rows = self.chunks[0]
        for c in range(start // rows, (stop - 1) // rows + 1):
            yield c, max(start, c * rows), min(stop, (c + 1) * rows)

    def _rows_region(self, c: int) -> slice:
        rows = self.chunks[0]
        return slice(c * rows, min((c + 1) * rows, self.shape[0]))

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` (shape ``(stop - start, *shape[1:])``)."""
        rows = self.chunks[0]
        direct = self._whole_rows and out.flags.c_contiguous and hasattr(os, "preadv")
        for c, lo, hi in self._row_chunks(start, stop):
            dest = out[lo - start : hi - start]
            if direct and hi - lo == rows and self._whole_into(c, dest):
                continue
            local = slice(lo - c * rows, hi - c * rows)
            row_region = self._rows_region(c)
            for rest, region in self._rest:
                with self._chunk((c, *rest), (row_region, *region)) as chunk:
                    dest[(slice(None), *region)] = chunk[local]

    def range_pieces(self, start: int, stop: int) -> int:
        """Chunks that rows ``[start, stop)`` touch: each is one piece of reading them."""
        rows = self.chunks[0]
        return ((stop - 1) // rows - start // rows + 1) * len(self._rest)

    def read_piece_into(self, start: int, stop: int, piece: int, out: np.ndarray) -> None:
        """Read and decode piece ``piece`` (one chunk) of rows ``[start, stop)`` into its part of
        ``out``, which holds those rows (see :meth:`range_pieces`)."""
        rows, per_row = self.chunks[0], len(self._rest)
        c = start // rows + piece // per_row
        lo, hi = max(start, c * rows), min(stop, (c + 1) * rows)
        dest = out[lo - start : hi - start]
        direct = self._whole_rows and out.flags.c_contiguous and hasattr(os, "preadv")
        if direct and hi - lo == rows and self._whole_into(c, dest):
            return
        rest, region = self._rest[piece % per_row]
        with self._chunk((c, *rest), (self._rows_region(c), *region)) as chunk:
            dest[(slice(None), *region)] = chunk[lo - c * rows : hi - c * rows]

    def read(self, indices: npt.NDArray[np.int64], out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``indices`` (sorted, unique), in ``out`` if given, else in a new array. Every
        chunk the rows touch is decoded once."""
        if out is None:
            out = np.empty((len(indices), *self.shape[1:]), dtype=self.dtype)
        if not len(indices):
            return out
        rows_per_chunk = self.chunks[0]
        row_chunk = indices // rows_per_chunk
        starts = np.concatenate(([0], np.flatnonzero(np.diff(row_chunk)) + 1, [len(indices)]))
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
            c = int(row_chunk[a])
            local = indices[a:b] - c * rows_per_chunk
            rows: slice | npt.NDArray[np.int64] = (
                slice(int(local[0]), int(local[-1]) + 1)
                if int(local[-1]) - int(local[0]) + 1 == len(local)
                else local
            )
            row_region = self._rows_region(c)
            for rest, region in self._rest:
                with self._chunk((c, *rest), (row_region, *region)) as chunk:
                    out[(slice(a, b), *region)] = chunk[rows]
        return out


def _chunk_index(
    dataset: h5py.Dataset, shape: tuple[int, ...], chunks: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte offset (-1: never written), stored size and filter mask of every chunk, as arrays
    shaped like the chunk grid; from h5py, once."""
    grid = tuple(-(-n // c) for n, c in zip(shape, chunks, strict=True))
    offsets = np.full(grid, -1, dtype=np.int64)
    sizes = np.zeros(grid, dtype=np.int64)
    masks = np.zeros(grid, dtype=np.uint32)

    def add(info: Any) -> None:
        coords = tuple(int(o) // c for o, c in zip(info.chunk_offset, chunks, strict=True))
        if all(i < g for i, g in zip(coords, grid, strict=True)):  # not beyond a shrunk shape
            offsets[coords], sizes[coords] = int(info.byte_offset), int(info.size)
            masks[coords] = int(info.filter_mask)

    if hasattr(dataset.id, "chunk_iter"):  # HDF5 >= 1.12.3: one pass
        dataset.id.chunk_iter(add)
    else:  # pragma: no cover - older HDF5
        for i in range(dataset.id.get_num_chunks()):
            add(dataset.id.get_chunk_info(i))
    return offsets, sizes, masks
