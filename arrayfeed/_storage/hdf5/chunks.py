"""Rows of a chunked HDF5 dataset read from its raw chunks: batches of rows, and blocks.

:class:`ChunkFile` reads rows through :class:`.rawchunks.RawChunks`. Block reads ask for runs of
a row chunk's chunks at once (:meth:`ChunkFile.read_pieces_into`), so the Python work per chunk,
which holds the GIL, stays small: chunks stored one after another are read with one ``pread``
(straight into the output when they are whole rows stored as they are), and chunks that split
rows (a table's columns, an image's tiles and channels, as h5py's ``chunks=True`` cuts them) are
decoded side by side a box of the chunk grid at a time and copied out together
(:mod:`.chunkboxes`): a few copies per box, not one per chunk.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import workbuffers
from .chunkboxes import ChunkBoxes
from .rawchunks import RawChunks

__all__ = ["RUN_BYTES", "STAGE_BYTES", "ChunkFile"]

#: Most bytes of chunks that split rows decoded side by side before they are copied out.
STAGE_BYTES = 4 << 20
#: Most stored bytes read with one call (chunks stored one after another).
RUN_BYTES = 4 << 20

#: ``[offset, size, filter mask]`` of each chunk a read touches, in the chunk grid's C order.
Table = list[list[int]]


class ChunkFile(RawChunks):
    """Rows of one chunked dataset, read from raw chunks decoded in the calling thread."""

    @functools.cached_property
    def _whole_rows(self) -> bool:
        """Whether chunks hold whole rows: a whole chunk is one contiguous stretch of the output."""
        return self.chunks[1:] == self.shape[1:]

    @functools.cached_property
    def _boxes(self) -> ChunkBoxes | None:
        """For chunks that split rows: those of a row chunk decoded side by side a box at a time
        (at most a few MiB, to stay in the CPU's caches) and copied out together."""
        if len(self._rest) == 1:
            return None
        return ChunkBoxes(self.shape, self.chunks, STAGE_BYTES // self.nbytes)

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

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` (shape ``(stop - start, *shape[1:])``)."""
        self.read_pieces_into(start, stop, 0, self.range_pieces(start, stop), out)

    def range_pieces(self, start: int, stop: int) -> int:
        """Chunks that rows ``[start, stop)`` touch: each is one piece of reading them, in the
        chunk grid's C order (row chunk by row chunk)."""
        rows = self.chunks[0]
        return ((stop - 1) // rows - start // rows + 1) * len(self._rest)

    def read_pieces_into(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray
    ) -> None:
        """Read and decode pieces ``[first, last)`` (chunks, see :meth:`range_pieces`) of rows
        ``[start, stop)`` into their parts of ``out``, which holds those rows.

        The hot path of block reads, so the work per chunk that holds the GIL is kept small:
        chunks stored one after another are read with one ``preadv`` (straight into ``out`` when
        they are whole rows stored unfiltered), and chunks that split rows are decoded side by
        side a box of the chunk grid at a time and copied out with a few copies per box
        (:class:`.chunkboxes.ChunkBoxes`), each giving the GIL away once, not once per chunk.
        """
        start, stop, first, last = int(start), int(stop), int(first), int(last)
        rows, per_row = self.chunks[0], len(self._rest)
        origin = start // rows * per_row  # piece 0's index in the flattened chunk grid
        boxes = self._boxes
        if boxes is None:
            self._read_chunks(start, stop, origin + first, origin + last, out, None)
            return
        piece = first
        while piece < last:  # a row chunk's chunks side by side, a box of a few MiB at a time
            across = piece % per_row  # the piece's place among its row chunk's chunks
            box = boxes.box(across, min(per_row, across + last - piece))
            if box.size == 1:
                self._read_chunks(start, stop, origin + piece, origin + piece + 1, out, None)
            else:
                self._read_box(start, stop, origin + piece, box, out)
            piece += box.size

    def _read_box(self, start: int, stop: int, chunk: int, box: Any, out: np.ndarray) -> None:
        """The chunks of ``box``, from chunk ``chunk`` of the flattened grid on, decoded side by
        side into a lent buffer and copied out into their rows of ``out`` together."""
        staged = workbuffers.lend(box.size * self.nbytes)
        try:
            slots = staged[: box.size * self.nbytes].view(self.dtype)
            slots = slots.reshape(box.size, *self.chunks)
            self._read_chunks(start, stop, chunk, chunk + box.size, out, slots)
            rows, row_chunk = self.chunks[0], chunk // len(self._rest)
            lo, hi = max(start, row_chunk * rows), min(stop, (row_chunk + 1) * rows)
            local = slice(lo - row_chunk * rows, hi - row_chunk * rows)
            boxes = self._boxes
            assert boxes is not None  # a box is of chunks that split rows
            boxes.copy_out(box, slots, local, out[lo - start : hi - start])
        finally:
            workbuffers.give(staged)

    def _read_chunks(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray, slots: Any
    ) -> None:
        """Chunks ``first .. last - 1`` (indices into the flattened chunk grid) of the read of
        rows ``[start, stop)``: each decoded into its slot of ``slots`` (an array of chunks) when
        given, else into its part of ``out``. Chunks stored one after another are read as one
        run; a run stored as it is goes straight where it belongs."""
        table = self._table[first:last].tolist()  # [offset, size, filter mask] of each chunk
        # Chunks of whole rows all inside [start, stop) are decoded straight into `out`.
        into_out = self._whole_rows and slots is None and out.flags.c_contiguous
        read = _BlockRead(start, stop, first, out, slots, into_out)
        try:
            at = 0
            while at < len(table):
                end, as_stored = self._run(table, at)
                span = read.span(at, end, self.chunks[0]) if as_stored else None
                if span is not None:
                    self._pread_run(first + at, table[at:end], span)
                    read.decoded += end - at
                else:
                    self._decode_run(read, table, at, end)
                at = end
        finally:
            workbuffers.give(read.scratch)
            if read.decoded:
                with self._lock:
                    self.decoded += read.decoded

    def _run(self, table: Table, at: int) -> tuple[int, bool]:
        """Where the run of chunks from ``table[at]`` on ends: those stored one after another,
        at most :data:`RUN_BYTES` together (a chunk never written is a run of its own); and
        whether each is stored as it is (every filter skipped, its raw size)."""
        offset, size, mask = table[at]
        if offset < 0:
            return at + 1, False
        skipped, nbytes, count = self._skip_all, self.nbytes, len(table)
        as_stored = mask & skipped == skipped and size == nbytes
        end, stored_end = at + 1, offset + size
        while end < count:
            next_offset, size, mask = table[end]
            if next_offset != stored_end or stored_end + size - offset > RUN_BYTES:
                break
            end, stored_end = end + 1, stored_end + size
            as_stored = as_stored and mask & skipped == skipped and size == nbytes
        return end, as_stored

    def _decode_run(self, read: _BlockRead, table: Table, at: int, end: int) -> None:
        """Chunks ``table[at:end]`` (one run), read with one call into a lent buffer, each decoded
        into its slot or its place in the output (a chunk never written: the fill value)."""
        offset = table[at][0]
        stored = data = None
        if offset >= 0:
            stored = workbuffers.lend(table[end - 1][0] + table[end - 1][1] - offset)
            data = self._pread_run(read.first + at, table[at:end], stored)
        rows, per_row, nbytes = self.chunks[0], len(self._rest), self.nbytes
        rest, rest_edge, slots, out = self._rest, self._rest_edge, read.slots, read.out
        first, start, stop, into_out = read.first, read.start, read.stop, read.into_out
        scratch, decoded = read.scratch, 0
        row_chunk, row_region, dest, local, row_edge, whole = read.row
        try:
            for x in range(at, end):
                c, across = divmod(first + x, per_row)
                if c != row_chunk:  # the part of row chunk c read, worked out once
                    row_chunk, row_region = c, self._rows_region(c)
                    lo, hi = max(start, c * rows), min(stop, (c + 1) * rows)
                    dest, local = slice(lo - start, hi - start), slice(lo - c * rows, hi - c * rows)
                    row_edge, whole = row_region.stop - row_region.start < rows, hi - lo == rows
                region = rest[across][1]
                into = None  # where the chunk is decoded in place (None: copied out)
                if slots is not None:
                    into = slots[x]
                elif into_out and whole:
                    into = out[dest]
                at_offset, size, mask = table[x]
                if data is None:  # never written: the fill value, as HDF5 reads it
                    sized = tuple(slice(0, r.stop - r.start) for r in (row_region, *region))
                    values = self._fill_chunk()[sized]
                else:
                    target = into
                    if into is None and self._decoder(mask).writes_into:
                        scratch = workbuffers.lend(nbytes) if scratch is None else scratch
                        target = scratch[:nbytes]
                    piece = data[at_offset - offset : at_offset - offset + size]
                    edge = row_edge or rest_edge[across]
                    values, ours = self._decode(
                        first + x, piece, mask, (row_region, *region), target, edge
                    )
                    decoded += ours
                if into is None:
                    out[(dest, *region)] = values[local]
                elif not np.may_share_memory(values, into):
                    into[tuple(slice(0, length) for length in values.shape)] = values
        finally:
            read.row = (row_chunk, row_region, dest, local, row_edge, whole)
            read.scratch, read.decoded = scratch, read.decoded + decoded
            workbuffers.give(stored)

    def _rows_region(self, c: int) -> slice:
        rows = self.chunks[0]
        return slice(c * rows, min((c + 1) * rows, self.shape[0]))


class _BlockRead:
    """Where one call of :meth:`ChunkFile._read_chunks` puts its chunks, and what it holds."""

    __slots__ = ("decoded", "first", "into_out", "out", "row", "scratch", "slots", "start", "stop")

    def __init__(
        self, start: int, stop: int, first: int, out: np.ndarray, slots: Any, into_out: bool
    ) -> None:
        self.start, self.stop = start, stop  # the rows read
        self.first = first  # the first chunk's index in the flattened chunk grid
        self.out, self.slots, self.into_out = out, slots, into_out
        self.scratch: np.ndarray | None = None  # a lent buffer a chunk is decoded into
        self.decoded = 0  # chunks decoded (or read as stored)
        # The row chunk read last: its index, region, rows in `out` and in the chunk, whether it
        # reaches past the dataset's end, whether the read covers it whole.
        self.row: tuple[Any, ...] = (-1, None, None, None, False, False)

    def span(self, at: int, end: int, rows: int) -> np.ndarray | None:
        """Where chunks ``at .. end - 1`` of the read go as they are stored: their slots, or
        their rows of the output when they are whole rows all inside it; None: elsewhere."""
        if self.slots is not None:
            return self.slots[at:end]  # type: ignore[no-any-return]
        first_row, end_row = (self.first + at) * rows, (self.first + end) * rows
        if self.into_out and first_row >= self.start and end_row <= self.stop:
            return self.out[first_row - self.start : end_row - self.start]
        return None
