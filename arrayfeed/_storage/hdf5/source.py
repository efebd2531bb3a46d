"""Sources over HDF5 datasets: memory-mapped when contiguous, raw chunks or h5py when chunked.

A contiguous, unfiltered dataset is memory-mapped at its byte offset (:class:`H5ContiguousSource`);
any other dataset is an :class:`H5Source`, reopened read-only by file name in any other process.
A chunked one is read as raw chunks decoded in the reader thread, outside h5py's global lock
(:mod:`.chunks`), when its filters, type and file allow (:mod:`.layout` says why not); else through
h5py. netCDF/CF-packed variables are decoded (:mod:`.cf`). :func:`h5_source` picks the source for
an ``h5py.Dataset``, :func:`open_hdf5` for a dataset of a file on disk.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..._errors import ArrayfeedError, CorruptDataError, SourceNotFoundError, SourceUnavailableError
from ..._forks import renew_after_fork
from ..base import REOPENS, Indices, Portability, Source, run_bounds
from ..npy.memory import MappedSource
from .cf import CFSource, cf_decoding
from .chunks import ChunkFile
from .files import check_filters, data_names, h5_fingerprint, open_h5_file, open_readable
from .layout import ChunkLayout

__all__ = ["H5ContiguousSource", "H5Source", "h5_source", "open_hdf5"]

#: Indices per h5py point-selection call (see H5Source.read).
_H5_PIECE = 256


class H5ContiguousSource(MappedSource):
    """A contiguous, unfiltered HDF5 dataset, memory-mapped at its byte offset in the file.

    Reads then cost what a ``.npy`` memmap costs, instead of going through h5py per row.
    :func:`h5_source` picks this class when the layout allows it.
    """

    def __init__(self, dataset: h5py.Dataset, offset: int) -> None:
        super().__init__(
            Path(dataset.file.filename),
            tuple(int(n) for n in dataset.shape),
            np.dtype(dataset.dtype),
            offset,
            fortran=False,
        )
        self.key = str(dataset.name)
        self.name = f"{self.path}:{self.key}"


class H5Source:
    """An ``h5py.Dataset``; reopened read-only by file name in any other process.

    ``field``: one field of a compound (table) dataset, read without the other fields; a
    sub-array field adds its shape to the rows (a field ``("pos", "f4", (3,))`` of a dataset of
    shape ``(N,)`` reads as ``(N, 3)`` of ``float32``).
    """

    def __init__(
        self, dataset: h5py.Dataset, *, owns_file: bool = False, field: str | None = None
    ) -> None:
        self._owns_file = owns_file
        self.filename = str(dataset.file.filename)
        self.key = str(dataset.name)
        self.field = field
        self.name = f"{self.filename}:{self.key}" + (f"#{field}" if field else "")
        self._shape = tuple(int(n) for n in dataset.shape)
        self._dtype: np.dtype[Any] = np.dtype(dataset.dtype)
        if field is not None:
            fields = self._dtype.fields or {}
            if field not in fields:
                raise SourceNotFoundError(
                    f"HDF5 dataset '{self.filename}:{self.key}' has no field {field!r}; its "
                    f"fields are {list(fields) or 'none (it is not a compound dataset)'}."
                )
            stored = np.dtype(fields[field][0])
            self._shape, self._dtype = (*self._shape, *stored.shape), stored.base
        self._dataset: h5py.Dataset | None = dataset
        self._pid = os.getpid()
        self._swmr = bool(dataset.file.swmr_mode)
        self._stays = _why_stays(dataset.file)
        check_filters(dataset, self.name)
        self.fingerprint = h5_fingerprint(dataset)
        # Raw-chunk reader of this process (see chunk_reader); None: not looked at yet.
        self._chunk_reader: ChunkFile | str | None = None
        self._reader_pid = -1
        self._reader_lock = threading.Lock()
        renew_after_fork(self, "_reader_lock")

    def portability(self) -> Portability:
        """Another process opens the file again by name, read-only; a file this process holds
        open for writing (HDF5 locks it), in memory or behind a Python file object stays."""
        return Portability("stays", self._stays) if self._stays else REOPENS

    @property
    def dataset(self) -> h5py.Dataset:
        if self._dataset is None or self._pid != os.getpid():
            self._dataset = open_h5_file(self.filename, swmr=self._swmr)[self.key]
            self._pid = os.getpid()
            self._owns_file = True
        return self._dataset

    def verify(self) -> None:
        """Raise :class:`CorruptDataError` if the file was replaced or changed since opening."""
        if self.fingerprint is not None:
            self.fingerprint.check(self.name)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 0

    def chunk_reader(self) -> ChunkFile | None:
        """This process's reader of raw chunks decoded outside h5py's lock, or None when the
        dataset is read through h5py (:attr:`read_path` says why). Looked at once per process:
        a copy in another process opens the file read-only and may qualify where a caller's
        writable handle did not."""
        if self.field is not None:
            return None  # compound types are read through h5py
        reader = self._chunk_reader
        if reader is None or self._reader_pid != os.getpid():
            with self._reader_lock:
                if self._chunk_reader is None or self._reader_pid != os.getpid():
                    dataset = self.dataset
                    layout = ChunkLayout.of(dataset)
                    opened = layout if isinstance(layout, str) else ChunkFile.open(layout, dataset)
                    self._chunk_reader, self._reader_pid = opened, os.getpid()
                reader = self._chunk_reader
        return reader if isinstance(reader, ChunkFile) else None

    @property
    def read_path(self) -> str:
        """How this process reads the dataset: ``"chunks"`` (raw chunks decoded in the reader
        threads), or ``"h5py: <why>"``."""
        if self.field is not None:
            return "h5py: a field of a compound dataset"
        reader = self.chunk_reader()
        return "chunks" if reader is not None else f"h5py: {self._chunk_reader}"

    def read(self, indices: Indices) -> np.ndarray:
        reader = self.chunk_reader()
        if reader is not None:
            return reader.read(indices)
        with self._h5py_errors(
            int(indices[0]) if len(indices) else 0, int(indices[-1]) if len(indices) else -1
        ):
            return self._read_h5py(indices)

    def _read_h5py(self, indices: Indices) -> np.ndarray:
        run = run_bounds(indices)
        if run is not None:
            return np.asarray(self._view[run[0] : run[1]])
        # h5py's point selection grows superlinearly with the number of indices, so read in
        # pieces (docs/performance.md, "h5py point selection").
        out = np.empty((len(indices), *self._shape[1:]), dtype=self._dtype)
        for lo in range(0, len(indices), _H5_PIECE):
            piece = indices[lo : lo + _H5_PIECE]
            run = run_bounds(piece)
            out[lo : lo + len(piece)] = (
                self._view[run[0] : run[1]] if run is not None else self._view[piece]
            )
        return out

    def read_run(self, start: int, stop: int) -> np.ndarray:
        reader = self.chunk_reader()
        if reader is not None:
            out = np.empty((stop - start, *self._shape[1:]), dtype=self._dtype)
            reader.read_range_into(start, stop, out)
            return out
        with self._h5py_errors(start, stop - 1):
            return np.asarray(self._view[start:stop])

    def read_range_into(self, start: int, stop: int, out: np.ndarray) -> None:
        reader = self.chunk_reader()
        if reader is not None:
            reader.read_range_into(start, stop, out)
            return
        with self._h5py_errors(start, stop - 1):
            if self.field is None:
                self.dataset.read_direct(out, np.s_[start:stop])
            else:
                out[...] = self._view[start:stop]

    @property
    def _view(self) -> Any:
        """What h5py reads rows from: the dataset, or only its field ``field``."""
        return self.dataset if self.field is None else self.dataset.fields(self.field)

    @contextlib.contextmanager
    def _h5py_errors(self, first: int, last: int) -> Iterator[None]:
        """An ``OSError`` of a read of rows ``first..last`` through h5py (a filter that fails, a
        truncated file) as a :class:`CorruptDataError` naming the file, the dataset and the
        chunks read."""
        try:
            yield
        except ArrayfeedError:
            raise
        except OSError as exc:
            chunks = self.chunk_rows
            where = f"rows {first}..{last}" if last >= first else "no rows"
            if chunks and last >= first:
                a, b = first // chunks, last // chunks
                where += f" (row chunks {a}..{b})" if b > a else f" (row chunk {a})"
            raise CorruptDataError(
                f"reading {where} of HDF5 dataset '{self.name}' failed ({exc}); the file is "
                "damaged or was truncated. Restore it from a backup or re-create it (e.g. with "
                "`arrayfeed convert`); `arrayfeed verify` checks a converted store."
            ) from exc

    def range_pieces(self, start: int, stop: int) -> int:
        """Chunks rows ``[start, stop)`` touch when read as raw chunks, else one piece."""
        reader = self.chunk_reader()
        return reader.range_pieces(start, stop) if reader is not None else 1

    def read_pieces_into(
        self, start: int, stop: int, first: int, last: int, out: np.ndarray
    ) -> None:
        """Pieces ``[first, last)`` of reading rows ``[start, stop)`` into ``out`` (see
        :meth:`range_pieces`)."""
        reader = self.chunk_reader()
        if reader is not None:
            reader.read_pieces_into(start, stop, first, last, out)
        else:
            self.read_range_into(start, stop, out)

    @property
    def chunk_rows(self) -> int | None:
        """Rows per chunk along axis 0 (at most the dataset's rows: a resizable dataset's chunks
        may hold more), or None for a contiguous dataset."""
        chunks = self.dataset.chunks
        return (min(int(chunks[0]), len(self)) or None) if chunks else None

    @property
    def encoded(self) -> bool:
        """Whether chunks pass through a filter other than the fletcher32 checksum."""
        plist = self.dataset.id.get_create_plist()
        codes = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        return any(code != h5py.h5z.FILTER_FLETCHER32 for code in codes)

    @property
    def chunks(self) -> tuple[int, ...] | None:
        """The chunk shape, or None for a contiguous dataset."""
        chunks = self.dataset.chunks
        return tuple(int(c) for c in chunks) if chunks else None

    def close(self) -> None:
        """Close the file, if this source opened it (a caller's own ``h5py.File`` stays open)."""
        # The chunk reader's descriptor closes when the last thread still reading drops it.
        self._chunk_reader, self._reader_pid = None, -1
        dataset, self._dataset = self._dataset, None
        if dataset is not None and (self._owns_file or self._pid != os.getpid()):
            with contextlib.suppress(Exception):  # closing is best effort
                dataset.file.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_dataset"], state["_pid"] = None, -1
        state["_owns_file"] = True  # a copy opens the file itself
        state["_chunk_reader"], state["_reader_pid"] = None, -1
        del state["_reader_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reader_lock = threading.Lock()
        renew_after_fork(self, "_reader_lock")

    def __repr__(self) -> str:
        return f"H5Source({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def _h5_byte_offset(dataset: h5py.Dataset) -> int | None:
    """Absolute byte offset of a memory-mappable dataset's data, or None if it is not one."""
    dtype = np.dtype(dataset.dtype)
    if dataset.chunks is not None or dataset.external or dtype.hasobject or dtype.fields:
        return None
    if dataset.file.driver not in ("sec2", "stdio", "direct") or dataset.file.mode != "r":
        return None
    if dataset.file.swmr_mode:
        return None  # a SWMR writer may still move or extend the data: read through HDF5
    offset = dataset.id.get_offset()
    nbytes = int(np.prod(dataset.shape, dtype=np.int64)) * dtype.itemsize
    if offset is None or dataset.id.get_storage_size() != nbytes:
        return None  # data never written (no storage allocated), or compact layout
    return int(offset)  # from the start of the file, user block included


def h5_source(
    dataset: h5py.Dataset,
    *,
    owns_file: bool = False,
    field: str | None = None,
    decode_cf: bool = True,
) -> Source:
    """The fastest source for an HDF5 dataset: memory-mapped when contiguous, else h5py reads;
    netCDF/CF-packed or masked variables decoded unless ``decode_cf`` is False (:mod:`.cf`)."""
    if not dataset.id.valid:
        raise SourceUnavailableError(
            "an h5py.Dataset whose file is closed was given; keep the h5py.File open while the "
            "dataset is built, or pass the path instead: `arrayfeed.open_array('file.h5', 'key')` "
            "(which reopens the file in every process)."
        )
    if field is not None:
        return H5Source(dataset, owns_file=owns_file, field=field)
    offset = _h5_byte_offset(dataset)
    source: Source = H5Source(dataset, owns_file=owns_file)
    if offset is not None:
        source = H5ContiguousSource(dataset, offset)
    decoding = cf_decoding(dataset.attrs, dataset.dtype, dataset.name) if decode_cf else None
    return source if decoding is None else CFSource(source, decoding)


def open_hdf5(
    path: Path, key: str | None, field: str | None = None, *, decode_cf: bool = True
) -> Source:
    """The dataset ``key`` of the HDF5 file at ``path`` (``key`` may be omitted when it holds one)."""
    f = open_readable(path)
    datasets = data_names(f)
    if key is None and len(datasets) == 1:
        key = datasets[0]
    node = f.get(key) if key is not None else None
    if not isinstance(node, h5py.Dataset):
        f.close()
        if key is None:
            raise SourceNotFoundError(
                f"'{path}' holds {len(datasets)} datasets and no `key` names one; its datasets "
                f"are {datasets}. Name one: `open_array('{path}', KEY)`, or '{path}:KEY' as a path."
            )
        raise SourceNotFoundError(
            f"'{path}' has no dataset {key!r}; its datasets are {datasets}. Pass one as `key`."
        )
    try:
        return h5_source(node, owns_file=True, field=field, decode_cf=decode_cf)
    except ArrayfeedError:
        f.close()
        raise


def _why_stays(file: h5py.File) -> str:
    """Why another process cannot open ``file`` again by name, or "" when it can."""
    if file.driver == "core":
        return "an HDF5 file held in memory (driver 'core')"
    if file.driver == "fileobj":
        return "an HDF5 file read through a Python file object"
    if file.mode != "r" and not file.swmr_mode:
        return (
            f"its HDF5 file '{file.filename}' is open for writing in this process, and HDF5 "
            "locks it against other readers; open it with h5py.File(path, 'r')"
        )
    return ""
