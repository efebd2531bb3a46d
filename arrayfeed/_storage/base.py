"""What a source can do: the ``Source`` protocol and the optional capabilities the core probes.

A :class:`Source` is a structural protocol (``shape``, ``dtype``, ``__len__`` and a batched
``read``). The core hands ``read`` 1-D ``int64`` indices that are sorted, unique and in bounds,
and restores the order it wanted afterwards, so a backend never sees unsorted indices (h5py
requires increasing ones). Optional capabilities are small extra protocols that the core probes
with ``isinstance`` and falls back from:

- :class:`GatherInto`: gather rows in any order straight into a caller's buffer (in-memory
  arrays, memory maps), which skips the sort and the extra copy;
- :class:`ReadRangeInto`: read a run of rows straight into a buffer (window reads);
- :class:`ReadPiecesInto`: split such a read into independent pieces (the chunks it touches)
  that several threads read at once;
- :class:`RunReader`: return a run of rows, a view where the backend allows (conversion);
- :class:`Chunked`: reads cost whole chunks of ``chunk_rows`` rows (``shuffle="block"``), and
  :class:`Encoded`: whether each chunk is decoded (compressed) to be read;
- :class:`Verifiable`: ``verify()`` raises if the stored data changed since opening;
- :class:`Closeable`: ``close()`` releases the files a source opened itself;
- :class:`Prefetch`: start fetching ranges of rows before they are read (object storage);
- :class:`KeptLocally`: what reads fetch from far away is kept on local disk, so that they
  wait the first time only (object storage through ``cache=``; :func:`kept_locally`);
- :class:`SparseRows`: rows stored sparse (CSR), also readable as their nonzeros;
- :class:`Categorical`: integer codes of a categorical column, with its labels;
- :class:`Portable`: how a source reaches another process (a loader): opened again from its
  file or URL, copied with its data, or not at all (:func:`portability`).

Nothing outside :mod:`arrayfeed._storage` names a concrete source class: a new backend that
implements these protocols gets every fast path. What a store holds (layout facts) and how one is
written are in :mod:`.layout`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = [
    "Categorical",
    "Chunked",
    "Closeable",
    "Encoded",
    "GatherInto",
    "Indices",
    "KeptLocally",
    "Portability",
    "Portable",
    "Prefetch",
    "ReadPiecesInto",
    "ReadRangeInto",
    "RunReader",
    "Source",
    "SparseRows",
    "Verifiable",
    "chunked_rows",
    "kept_locally",
    "portability",
    "row_bytes",
    "row_nbytes",
    "run_bounds",
    "verify_sources",
]

Indices = npt.NDArray[np.int64]


@runtime_checkable
class Source(Protocol):
    """Rows of an array, read a batch at a time.

    ``read`` receives sorted, unique, in-bounds ``int64`` indices and returns a new array of
    shape ``(len(indices), *shape[1:])``.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def __len__(self) -> int: ...

    def read(self, indices: Indices) -> np.ndarray: ...


@runtime_checkable
class GatherInto(Protocol):
    """Optional capability: gather rows in any order (duplicates allowed) into ``out``.
    ``indices`` may be read-only (the feed shares an epoch's indices between its groups)."""

    def gather_into(self, indices: Indices, out: np.ndarray) -> None: ...


@runtime_checkable
class ReadRangeInto(Protocol):
    """Optional capability: read rows ``[start, stop)`` into ``out`` (C-contiguous, native byte
    order), without an intermediate array."""

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None: ...


@runtime_checkable
class ReadPiecesInto(Protocol):
    """Optional capability: a read of rows ``[start, stop)`` splits into ``range_pieces`` pieces
    that can be read independently, by different threads at once, each filling its part of
    ``out`` (the buffer of the whole range; C-contiguous, native byte order). Storage that
    decodes chunks splits a range into the chunks it touches, so one large block is decoded on
    every core instead of one. ``read_pieces_into`` reads a run of consecutive pieces
    ``[first, last)`` in one call, so that what they share (a file read, a copy) is done once."""

    def range_pieces(self, start: int, stop: int) -> int: ...

    def read_pieces_into(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray
    ) -> None: ...


@runtime_checkable
class RunReader(Protocol):
    """Optional capability: rows ``[start, stop)``, possibly a read-only view of storage (cheapest
    when runs come in increasing order)."""

    def read_run(self, start: int, stop: int) -> np.ndarray: ...


@runtime_checkable
class Chunked(Protocol):
    """Optional capability: storage read in chunks of ``chunk_rows`` rows along axis 0.

    Reading any row of a chunk costs about as much as reading the whole chunk, so
    ``shuffle="block"`` reads whole chunk-aligned blocks of such sources. ``chunk_rows`` is in
    ``[1, len(source)]`` (a chunk longer than the array counts as the whole array), or None: not
    chunked.
    """

    @property
    def chunk_rows(self) -> int | None: ...


@runtime_checkable
class Encoded(Protocol):
    """Optional capability of a :class:`Chunked` source: ``encoded`` is True when each chunk is
    decoded to be read (compressed or filtered; a checksum alone does not count), so a read of a
    few rows costs a whole decode per chunk it touches."""

    @property
    def encoded(self) -> bool: ...


@runtime_checkable
class Verifiable(Protocol):
    """Optional capability: ``verify()`` raises if the stored data changed since opening."""

    def verify(self) -> None: ...


@runtime_checkable
class Closeable(Protocol):
    """Optional capability: ``close()`` releases the files the source opened itself (never a
    handle the caller passed in). The source may reopen them if read again."""

    def close(self) -> None: ...


@runtime_checkable
class Prefetch(Protocol):
    """Optional capability: start fetching rows ``[starts[i], stops[i])`` now (returns at once),
    so that their reads soon after find them arrived: a whole window of blocks is requested
    from object storage together, many requests in flight."""

    def prefetch(self, starts: Sequence[int], stops: Sequence[int]) -> None: ...


@runtime_checkable
class KeptLocally(Protocol):
    """Optional capability: whether what the source fetches from far away (object storage) is
    kept on local disk once fetched, so that a read that waits now will not wait the next time
    (reads are then planned as those of local files)."""

    def kept_locally(self) -> bool: ...


def kept_locally(source: Source) -> bool:
    """Whether the reads of ``source`` wait the first time only (see :class:`KeptLocally`)."""
    return isinstance(source, KeptLocally) and source.kept_locally()


@runtime_checkable
class SparseRows(Protocol):
    """Optional capability: rows stored as a CSR matrix (``shape`` is ``(rows, n_cols)``).

    ``read`` still returns dense rows; ``read_csr`` returns the nonzeros of sorted, unique rows
    instead: ``(indptr, cols, values)`` of a canonical CSR batch (``indptr`` ``int64`` of
    ``len(indices) + 1`` entries from 0, ``cols`` ``int64`` sorted within each row, no duplicates,
    ``values`` in the native byte order of ``dtype``).
    """

    @property
    def nnz(self) -> int: ...

    @property
    def components(self) -> tuple[Source, Source, Source]:
        """The sources of ``data``, ``indices`` and ``indptr``, as stored."""
        ...

    def read_csr(self, indices: Indices) -> tuple[Indices, Indices, np.ndarray]: ...

    def row_lengths(self) -> Indices:
        """Stored entries of every row (``int64``, one per row), from ``indptr``."""
        ...

    def read_stored(self, indices: Indices) -> tuple[Indices, Indices, np.ndarray]:
        """The stored entries of sorted, unique rows ``indices``, as a copy keeps them:
        ``(lengths, cols, values)``, the rows' entries one row after another, columns sorted
        within each row, and repeated entries kept (``lengths`` equal :meth:`row_lengths`)."""
        ...


@runtime_checkable
class Categorical(Protocol):
    """Optional capability: the rows are integer codes of a categorical column (AnnData, pandas);
    ``categories[code]`` is the label of a code, and ``-1`` marks a missing value."""

    @property
    def categories(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Portability:
    """How a source reaches another process: ``"reopen"`` (a pickled copy opens the same file or
    URL again: nothing but its name travels), ``"copy"`` (its ``nbytes`` of data travel with it),
    or ``"stays"`` (it cannot: ``why``, for messages)."""

    how: Literal["reopen", "copy", "stays"]
    why: str = ""
    nbytes: int = 0

    @classmethod
    def combined(cls, parts: Iterable[Portability]) -> Portability:
        """What a source made of ``parts`` (a CSR matrix's arrays) can do: the least of them."""
        parts = list(parts)
        stays = [p for p in parts if p.how == "stays"]
        if stays:
            return stays[0]
        nbytes = sum(p.nbytes for p in parts)
        return cls("copy" if nbytes else "reopen", nbytes=nbytes)


REOPENS = Portability("reopen")


@runtime_checkable
class Portable(Protocol):
    """Optional capability: how this source reaches another process (see :class:`Portability`).
    A source without it stays in the process that opened it."""

    def portability(self) -> Portability: ...


def portability(source: Source) -> Portability:
    """How ``source`` reaches another process (a loader)."""
    if isinstance(source, Portable):
        return source.portability()
    return Portability(
        "stays",
        f"a {type(source).__name__}, which does not say how it can be read elsewhere (a "
        "format's source says it with arrayfeed.storage.Portable)",
    )


def chunked_rows(source: Source) -> int | None:
    """Rows per chunk of a source whose reads cost whole chunks, else None (sources that gather
    rows in any order cheaply, and unchunked storage)."""
    if isinstance(source, Chunked) and not isinstance(source, GatherInto):
        return source.chunk_rows or None
    return None


def row_bytes(sources: Iterable[Source]) -> int:
    """Bytes of one row of every source together."""
    return sum(row_nbytes(s.shape, s.dtype) for s in sources)


def row_nbytes(shape: Sequence[int], dtype: np.dtype[Any] | str) -> int:
    """Bytes of one row (everything but the first axis) of an array of ``shape`` and ``dtype``."""
    return math.prod(int(n) for n in shape[1:]) * np.dtype(dtype).itemsize


def run_bounds(indices: Indices) -> tuple[int, int] | None:
    """``(start, stop)`` if sorted unique ``indices`` form one contiguous run, else None."""
    if len(indices) and int(indices[-1]) - int(indices[0]) + 1 == len(indices):
        return int(indices[0]), int(indices[-1]) + 1
    return None


def verify_sources(sources: Iterable[Any]) -> None:
    """Run ``verify()`` on every source that has it (the feed calls this at each epoch start)."""
    for source in sources:
        if isinstance(source, Verifiable):
            source.verify()
