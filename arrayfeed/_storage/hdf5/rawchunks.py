"""Raw chunks of a chunked HDF5 dataset: where each lies, its bytes, decoded outside h5py's lock.

h5py runs every HDF5 call under one global lock, decompression included, so reader threads take
turns and chunked HDF5 never uses a second core (docs/performance.md, "Raw HDF5 chunks"). Where a
dataset allows it, :class:`RawChunks` asks h5py once per process where every chunk lies (byte
offset, stored size, which filters were skipped), then reads chunks with ``os.pread`` on a
descriptor of its own and decodes them in the calling thread with the decoders of :mod:`.codecs`,
none of which holds the GIL or h5py's lock while it works.

The values are those h5py returns, bit for bit: chunks never written read as the fill value, a
fletcher32 checksum is verified as HDF5 verifies it, and a chunk that fails to decode raises
:class:`~arrayfeed.CorruptDataError` naming the file, the dataset, the chunk and the filter.
:meth:`.layout.ChunkLayout.of` says why not (a string) for anything it does not reproduce
exactly, and the caller reads through h5py: filters such as szip, scaleoffset or nbit, unknown
filter options, non-native byte order, compound or string types, drivers other than a plain local
file, a file open for writing or through SWMR, and a fill time of "never". Rows are read from
these chunks by :class:`.chunks.ChunkFile`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Self

import h5py
import numpy as np

from ..._errors import CorruptDataError
from ..._forks import renew_after_fork
from .. import workbuffers
from .codecs import ChecksumError, ChunkDecoder, Stage, StageError, Undecodable, pipeline
from .layout import ChunkLayout, chunk_index

__all__ = ["Coords", "RawChunks"]

#: h5py's own lock around every call into HDF5. `read_direct_chunk` did not take it until h5py's
#: pull request 2764 (December 2025): called while another thread was in HDF5, it failed ("no VOL
#: object wrap context") or crashed. It is taken here for that call.
_H5PY_LOCK: Any = getattr(getattr(h5py, "_objects", None), "phil", None) or contextlib.nullcontext()

_BYTE = np.dtype(np.uint8)  # compared by identity on the hot path

#: A chunk's coordinates in the chunk grid (chunk units, not elements).
Coords = tuple[int, ...]


class RawChunks:
    """The chunks of one chunked dataset, read with ``os.pread`` and decoded in the calling
    thread, one at a time or a run at a time.

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
        # [offset, size, filter mask] of every chunk, by its index in the flattened grid.
        self._table = np.stack([a.reshape(-1).astype(np.int64) for a in index], axis=1)
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
        # Whether the chunks at each of those coordinates reach past the dataset's edge.
        self._rest_edge = [
            any(r.stop - r.start < k for r, k in zip(region, self.chunks[1:], strict=True))
            for _, region in self._rest
        ]
        self._decoders: dict[int, ChunkDecoder] = {}  # by filter mask

    @classmethod
    def open(cls, layout: ChunkLayout, dataset: h5py.Dataset) -> Self | str:
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
        in work buffers (:mod:`..workbuffers`) that are lent to other reads afterwards."""
        offset = int(self.offsets[coords])
        if offset < 0:  # never written: the fill value, as HDF5 reads it
            yield self._fill_chunk()[tuple(slice(0, r.stop - r.start) for r in region)]
            return
        size, mask = int(self.sizes[coords]), int(self.masks[coords])
        # Lent: the stored bytes when they are large, and a buffer for the decoded chunk when
        # the stage that yields it can write into one.
        stored = workbuffers.work.take(size) if size >= workbuffers.MIN_BYTES else None
        decoded = workbuffers.lend(self.nbytes) if self._decoder(mask).writes_into else None
        try:
            data = self._pread(coords, size, offset, stored)
            values, ours = self._decode(coords, data, mask, region, decoded)
            if ours:
                with self._lock:
                    self.decoded += 1
            yield values
        finally:
            workbuffers.give(stored, decoded)

    def _decoder(self, mask: int) -> ChunkDecoder:
        """The decoder of chunks stored with filter mask ``mask``."""
        decoder = self._decoders.get(mask)
        if decoder is None:
            decoder = self._decoders[mask] = ChunkDecoder(self.stages, mask, self.nbytes)
        return decoder

    def _decode(
        self,
        coords: Coords | int,
        data: Any,
        mask: int,
        region: tuple[slice, ...],
        out: Any,
        edge: bool | None = None,
    ) -> tuple[np.ndarray, bool]:
        """The part in ``region`` of chunk ``coords`` (or index ``coords`` of the flattened
        chunk grid), decoded from its stored bytes ``data``, and whether it was decoded here
        (False: read through h5py). The decoded chunk may be written into ``out`` (a
        C-contiguous array of at least :attr:`nbytes` bytes, or None). ``edge``: whether
        ``region`` is less than the whole chunk (None: work it out)."""
        if edge is None:
            edge = any(r.stop - r.start < k for r, k in zip(region, self.chunks, strict=True))
        if edge and mask & self._skip_all != self._skip_all and len(data) == self.nbytes:
            # An edge chunk stored at exactly its raw size may have been written unfiltered
            # (H5Pset_chunk_opts' "don't filter partial edge chunks", which h5py cannot show):
            # let HDF5, which knows, read it.
            return self._via_hdf5(coords, region), False
        decoder = self._decoder(mask)
        flat = out is None or (out.dtype is _BYTE and out.ndim == 1 and len(out) == self.nbytes)
        if decoder.writes_into and not flat:
            out = out.reshape(-1).view(np.uint8)[: self.nbytes]
        try:
            raw = decoder(data, out)
        except Undecodable:
            return self._via_hdf5(coords, region), False
        except StageError as exc:
            raise self._corrupt(coords, _stage_problem(exc)) from exc.error
        values = np.frombuffer(raw, dtype=self.dtype).reshape(self.chunks)
        if edge:
            values = values[tuple(slice(0, r.stop - r.start) for r in region)]
        return values, True

    def _pread(self, coords: Coords, size: int, offset: int, into: Any = None) -> Any:
        """``size`` bytes at ``offset``: read into the first ``size`` bytes of ``into``
        (C-contiguous) and returned as a memoryview of them (codecs read an ndarray as an array
        of its dtype, a memoryview as bytes), or as ``bytes`` without ``into``."""
        if into is None:
            data = os.pread(self.fd, size, offset)
            if len(data) != size:
                raise self._cut_short(coords, len(data), size, offset)
            return data
        return self._pread_run(coords, [(offset, size)], into)

    def _pread_run(self, first: Coords | int, stored: Sequence[Any], into: Any) -> memoryview:
        """The stored bytes of chunks ``stored`` (``(offset, size, ...)`` each, one after
        another in the file) from chunk ``first`` on (or from index ``first`` of the flattened
        chunk grid), read with one call into ``into`` as for :meth:`_pread`."""
        at = stored[0][0]
        total = stored[-1][0] + stored[-1][1] - at
        data: memoryview = into.reshape(-1).view(np.uint8)[:total].data
        got = os.preadv(self.fd, [data], at)
        while 0 < got < total:  # a call moves at most ~2 GiB on Linux
            more = os.preadv(self.fd, [data[got:]], at + got)
            if not more:
                break
            got += more
        if got != total:  # name the chunk the file's end cuts
            x = next(x for x, (o, n, *_) in enumerate(stored) if o + n > at + got)
            coords = self._coords(first + x) if isinstance(first, int) else first
            offset, size = stored[x][:2]
            raise self._cut_short(coords, max(0, at + got - offset), size, offset)
        return data

    def _cut_short(self, coords: Coords, got: int, size: int, offset: int) -> CorruptDataError:
        return CorruptDataError(
            f"chunk {coords} of HDF5 dataset '{self.name}' is cut short: {got} of {size} "
            f"bytes at byte {offset}; the file was truncated. Restore it from a backup or "
            "re-create it."
        )

    def _fill_chunk(self) -> np.ndarray:
        if self._fill is None:
            fill = np.full(self.chunks, self.layout.fill, dtype=self.dtype)
            fill.flags.writeable = False
            self._fill = fill
        return self._fill

    def _via_hdf5(self, coords: Coords | int, region: tuple[slice, ...]) -> np.ndarray:
        """The part in ``region`` of chunk ``coords`` (or its index in the flattened grid), as
        h5py reads it; a failure (a filter that fails on damaged bytes) names the chunk."""
        with self._lock:
            self.via_hdf5 += 1
        try:
            return np.asarray(self.dataset[region])
        except OSError as exc:
            raise self._corrupt(coords, f"cannot be read by HDF5 ({exc})") from exc

    def _corrupt(self, coords: Coords | int, problem: str) -> CorruptDataError:
        """The error for chunk ``coords`` (or its index in the flattened grid): ``problem``."""
        if isinstance(coords, int):
            coords = self._coords(coords)
        start = tuple(c * k for c, k in zip(coords, self.chunks, strict=True))
        where = f"chunk {coords} (elements from {start}) of HDF5 dataset '{self.name}'"
        return CorruptDataError(
            f"{where} {problem}; the file is corrupted. Restore it from a backup or re-create it."
        )

    def _coords(self, g: int) -> Coords:
        """The coordinates of chunk ``g`` of the flattened chunk grid."""
        c, j = divmod(g, len(self._rest))
        return (c, *self._rest[j][0])


def _stage_problem(exc: StageError) -> str:
    """What is wrong with a chunk whose decoding failed with ``exc``."""
    if isinstance(exc.error, ChecksumError):
        return f"fails its fletcher32 checksum ({exc.error})"
    if exc.stage is None:
        return f"has the wrong size ({exc.error})"
    return f"cannot be decoded by its {exc.stage.name} filter ({exc.error})"
