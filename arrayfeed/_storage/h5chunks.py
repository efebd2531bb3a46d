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

Block reads ask for runs of a row chunk's chunks at once (:meth:`ChunkFile.read_pieces_into`), so
the Python work per chunk, which holds the GIL, stays small: chunks stored one after another are
read with one ``pread``, and chunks that split only axis 1 (a table's columns, as h5py's
``chunks=True`` cuts a 2-D dataset) are decoded side by side and copied out with one copy.

The values are those h5py returns, bit for bit: chunks never written read as the fill value, a
fletcher32 checksum is verified as HDF5 verifies it, and a chunk that fails to decode raises
:class:`~arrayfeed.CorruptDataError` naming the file, the dataset, the chunk and the filter.
:meth:`.h5layout.ChunkLayout.of` says why not (a string) for anything it does not reproduce
exactly, and the caller reads through h5py: filters such as szip, scaleoffset or nbit, unknown
filter options, non-native byte order, compound or string types, drivers other than a plain local
file, a file open for writing or through SWMR, and a fill time of "never".
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from .._errors import CorruptDataError
from .._forks import renew_after_fork
from . import workbuffers
from .h5codecs import ChecksumError, Stage, StageError, Undecodable, decode_chunk, pipeline
from .h5layout import ChunkLayout, chunk_index

__all__ = ["ChunkFile"]

#: h5py's own lock around every call into HDF5. `read_direct_chunk` did not take it until h5py's
#: pull request 2764 (December 2025): called while another thread was in HDF5, it failed ("no VOL
#: object wrap context") or crashed. It is taken here for that call.
_H5PY_LOCK: Any = getattr(getattr(h5py, "_objects", None), "phil", None) or contextlib.nullcontext()

#: Most bytes of chunks that split only axis 1 decoded side by side before they are copied out.
STAGE_BYTES = 2 << 20

#: A chunk's coordinates in the chunk grid (chunk units, not elements).
Coords = tuple[int, ...]


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
        self._index = index
        self._skip_all = (1 << len(self.stages)) - 1  # a chunk's mask when no filter applied
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
        # Chunks hold whole rows: a whole chunk is one contiguous stretch of the output.
        self._whole_rows = self.chunks[1:] == self.shape[1:]
        # Chunks split axis 1 alone: those of a row chunk are decoded side by side.
        self._columns = len(self._rest) > 1 and self.chunks[2:] == self.shape[2:]
        #: Most chunks decoded side by side at once (a few MiB, to stay in the CPU's caches).
        self._stage_chunks = max(1, STAGE_BYTES // self.nbytes)

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
            index = chunk_index(dataset, layout.shape, layout.chunks)
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
        offset = int(self.offsets[coords])
        if offset < 0:  # never written: the fill value, as HDF5 reads it
            yield self._fill_chunk()[tuple(slice(0, r.stop - r.start) for r in region)]
            return
        size, mask = int(self.sizes[coords]), int(self.masks[coords])
        # Lent: the stored bytes when they are large, and a buffer for the decoded chunk when
        # the stage that yields it can write into one.
        first = next((st for i, st in enumerate(self.stages) if not mask >> i & 1), None)
        stored = _lend(size)
        decoded = _lend(self.nbytes) if first is not None and first.into is not None else None
        try:
            data = self._pread(coords, size, offset, stored)
            values, ours = self._decode(coords, data, mask, region, decoded)
            if ours:
                with self._lock:
                    self.decoded += 1
            yield values
        finally:
            _give(stored, decoded)

    def _decode(
        self, coords: Coords, data: Any, mask: int, region: tuple[slice, ...], out: Any
    ) -> tuple[np.ndarray, bool]:
        """The part in ``region`` of chunk ``coords``, decoded from its stored bytes ``data``,
        and whether it was decoded here (False: read through h5py). The decoded chunk may be
        written into ``out`` (a C-contiguous array of at least :attr:`nbytes` bytes, or None)."""
        inside = tuple(slice(0, r.stop - r.start) for r in region)
        if (
            mask & self._skip_all != self._skip_all
            and len(data) == self.nbytes
            and any(r.stop - r.start < k for r, k in zip(region, self.chunks, strict=True))
        ):
            # An edge chunk stored at exactly its raw size may have been written unfiltered
            # (H5Pset_chunk_opts' "don't filter partial edge chunks", which h5py cannot show):
            # let HDF5, which knows, read it.
            return self._via_hdf5(region), False
        if out is not None:
            out = out.reshape(-1).view(np.uint8)[: self.nbytes]
        try:
            raw = decode_chunk(self.stages, data, mask, self.nbytes, out=out)
        except Undecodable:
            return self._via_hdf5(region), False
        except StageError as exc:
            raise self._corrupt(coords, exc) from exc.error
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.chunks)[inside], True

    def _pread(self, coords: Coords, size: int, offset: int, into: np.ndarray) -> memoryview:
        """``size`` bytes at ``offset`` read into the first ``size`` bytes of ``into``
        (C-contiguous), as a memoryview of them (codecs read an ndarray as an array of its
        dtype, a memoryview as bytes)."""
        return self._pread_run([coords], [size], [offset], into)

    def _pread_run(
        self, coords: Sequence[Coords], sizes: Sequence[int], offsets: Sequence[int], into: Any
    ) -> memoryview:
        """The stored bytes of chunks ``coords`` (one after another in the file), read with one
        call into ``into`` as for :meth:`_pread`; a file cut short names the chunk it cuts."""
        total = offsets[-1] + sizes[-1] - offsets[0]
        data: memoryview = into.reshape(-1).view(np.uint8)[:total].data
        got = os.preadv(self.fd, [data], offsets[0])
        if got != total:
            x = next(x for x in range(len(coords)) if offsets[x] + sizes[x] > offsets[0] + got)
            have = max(0, offsets[0] + got - offsets[x])
            raise CorruptDataError(
                f"chunk {coords[x]} of HDF5 dataset '{self.name}' is cut short: {have} of "
                f"{sizes[x]} bytes at byte {offsets[x]}; the file was truncated. Restore it "
                "from a backup or re-create it."
            )
        return data

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
    def _rows_region(self, c: int) -> slice:
        rows = self.chunks[0]
        return slice(c * rows, min((c + 1) * rows, self.shape[0]))

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` (shape ``(stop - start, *shape[1:])``)."""
        self.read_pieces_into(start, stop, 0, self.range_pieces(start, stop), out)

    def range_pieces(self, start: int, stop: int) -> int:
        """Chunks that rows ``[start, stop)`` touch: each is one piece of reading them, numbered
        row chunk by row chunk, in the order of :attr:`_rest` within each."""
        rows = self.chunks[0]
        return ((stop - 1) // rows - start // rows + 1) * len(self._rest)

    def read_pieces_into(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray
    ) -> None:
        """Read and decode pieces ``[first, last)`` (chunks, see :meth:`range_pieces`) of rows
        ``[start, stop)`` into their parts of ``out``, which holds those rows (C-contiguous).

        The hot path of block reads, so the work per chunk that holds the GIL is kept small:
        the chunks of a row chunk that lie one after another in the file are read with one
        ``pread``, and chunks that split only axis 1 (a table's columns, as h5py's
        ``chunks=True`` cuts a 2-D dataset) are decoded side by side and copied out with one
        copy, which writes each row's columns together rather than one column at a time.
        """
        rows, per_row = self.chunks[0], len(self._rest)
        p = first
        while p < last:
            c, j = divmod(p, per_row)
            c += start // rows
            k = min(per_row - j, last - p)
            if self._columns:
                k = min(k, self._stage_chunks)
            lo, hi = max(start, c * rows), min(stop, (c + 1) * rows)
            local = slice(lo - c * rows, hi - c * rows)
            self._read_run(c, j, k, local, out[lo - start : hi - start])
            p += k

    def _read_run(self, c: int, j: int, k: int, local: slice, dest: np.ndarray) -> None:
        """Chunks ``j .. j + k`` (in :attr:`_rest` order) of row chunk ``c``: their rows
        ``local`` into ``dest`` (the rows of ``out`` they fill)."""
        offsets, sizes, masks = (a[c].reshape(-1)[j : j + k].tolist() for a in self._index)
        rows_region = self._rows_region(c)
        whole = local.stop - local.start == self.chunks[0]
        # Where each chunk is decoded: side by side in `staged` (column chunks), straight into
        # `dest` (a whole chunk of whole rows), or in `scratch`, then copied out.
        staged = scratch = None
        if self._columns and k > 1:
            staged = _lend(k * self.nbytes)
            slots = staged[: k * self.nbytes].view(self.dtype)
            targets = list(slots.reshape(k, *self.chunks))
        elif self._whole_rows and whole and dest.flags.c_contiguous:
            targets = [dest]
        else:
            scratch = _lend(self.nbytes)
            targets = [None] * k
        decoded = 0
        try:
            i = 0
            while i < k:
                e = i + 1  # chunks i .. e - 1 lie one after another in the file
                while e < k and offsets[i] >= 0 and offsets[e] == offsets[e - 1] + sizes[e - 1]:
                    e += 1
                total = offsets[e - 1] + sizes[e - 1] - offsets[i]
                run = [(c, *self._rest[j + x][0]) for x in range(i, e)]
                if (
                    offsets[i] >= 0
                    and targets[i] is not None
                    and all(m & self._skip_all == self._skip_all for m in masks[i:e])
                    and total == (e - i) * self.nbytes
                ):  # no filter applied: the stored bytes are the values, read into place
                    span = (
                        slots[i * self.nbytes // self.dtype.itemsize :]
                        if staged is not None
                        else dest
                    )
                    self._pread_run(run, sizes[i:e], offsets[i:e], span)
                    decoded += e - i
                    i = e
                    continue
                stored = data = None
                if offsets[i] >= 0:
                    stored = _lend(total)
                    data = self._pread_run(run, sizes[i:e], offsets[i:e], stored)
                try:
                    for x in range(i, e):
                        region = self._rest[j + x][1]
                        chunk_region = (rows_region, *region)
                        if data is None:  # never written: the fill value, as HDF5 reads it
                            values = self._fill_chunk()[
                                tuple(slice(0, r.stop - r.start) for r in chunk_region)
                            ]
                        else:
                            at = offsets[x] - offsets[i]
                            values, ours = self._decode(
                                run[x - i],
                                data[at : at + sizes[x]],
                                masks[x],
                                chunk_region,
                                targets[x] if targets[x] is not None else scratch,
                            )
                            decoded += ours
                        target = targets[x]
                        if target is None:
                            dest[(slice(None), *region)] = values[local]
                        elif not np.may_share_memory(values, target):
                            target[tuple(slice(0, n) for n in values.shape)] = values
                finally:
                    _give(stored)
                i = e
            if staged is not None:
                self._columns_out(slots.reshape(k, *self.chunks), j, local, dest)
        finally:
            _give(staged, scratch)
            if decoded:
                with self._lock:
                    self.decoded += decoded

    def _columns_out(self, chunks: np.ndarray, j: int, local: slice, dest: np.ndarray) -> None:
        """Rows ``local`` of ``chunks`` (decoded side by side; chunks ``j ..`` along axis 1,
        which alone is split) into ``dest``: one copy for the chunks inside the dataset."""
        k, width = len(chunks), self.chunks[1]
        first = j * width
        inside = min(k, (self.shape[1] - first) // width)
        if inside:
            part = dest[:, first : first + inside * width]
            strides = (part.strides[0], width * part.strides[1], *part.strides[1:])
            split = np.lib.stride_tricks.as_strided(
                part, (len(part), inside, width, *part.shape[2:]), strides, writeable=True
            )
            split[...] = chunks[:inside, local].swapaxes(0, 1)
        if inside < k:  # the last chunk reaches past the dataset's last column
            edge = dest[:, first + inside * width :]
            edge[...] = chunks[inside, local, : edge.shape[1]]

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


def _lend(nbytes: int) -> np.ndarray:
    """A byte buffer of at least ``nbytes``: lent by :mod:`.workbuffers` when large."""
    if nbytes >= workbuffers.MIN_BYTES:
        return workbuffers.work.take(nbytes)
    return np.empty(nbytes, dtype=np.uint8)


def _give(*buffers: np.ndarray | None) -> None:
    """Give back the buffers :func:`_lend` lent (the small ones it allocated are dropped)."""
    workbuffers.work.give(
        *(b for b in buffers if b is not None and b.nbytes >= workbuffers.MIN_BYTES)
    )
