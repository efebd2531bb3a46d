"""The copy at the heart of ``convert``: inputs in, one store out, a slab of rows at a time.

A :class:`Copy` runs once its inputs are open and consistent. It moves *slabs* (whole chunks of
rows, about :data:`~.layout.SLAB_BYTES` over all arrays), so memory stays bounded whatever the
size of the inputs. With a shuffle, inputs that are slow to gather from at random are first
staged into plain files in the workspace and memory-mapped. Every slab's rows feed a running
CRC-32 per array, which goes into the record and is checked again by :mod:`.verify`.

A sparse CSR matrix is copied as CSR (unless ``densify``): AnnData's ``csr_matrix`` group, with
every stored entry kept (columns sorted within each row) and its ``indptr`` planned up front from
the input's, so each slab's entries land at known offsets; ``data`` and ``indices`` are written
in whole chunks (a slab's last, partial chunk waits for the next slab).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .._errors import ConfigError, CorruptDataError
from .._pipeline.plan.permutation import derive_key, permute
from .._storage import (
    ConversionRecord,
    Format,
    GatherInto,
    RemotePath,
    Source,
    SparseLayout,
    SparseRows,
    Writer,
    as_source,
    create_writer,
    csr_source,
    ragged_arange,
)
from .._version import __version__
from .atomic import Interrupts, Workspace
from .inputs import Parts, read_run
from .layout import CHUNK_TARGET_BYTES, choose_chunk_rows, element_runs, slab_rows
from .progress import Progress

__all__ = ["TEST_HOOK_ENV", "Checksums", "Copy", "write_rows"]

#: **Test hook**, not for users: seconds to sleep after each one-chunk slab, for tests to interrupt.
TEST_HOOK_ENV = "ARRAYFEED_TEST_HOOK_SLOW_WRITE"

#: Most rows moved at a time, whatever their size (bounds the index arrays of a shuffle).
_MAX_SLAB_ROWS = 1 << 20


def le_bytes(rows: np.ndarray) -> memoryview:
    """The bytes of ``rows``, C-contiguous and little-endian (what the checksums cover)."""
    if sys.byteorder == "big" and rows.dtype.itemsize > 1:
        rows = rows.astype(rows.dtype.newbyteorder("<"))
    return np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data


class Checksums:
    """Running CRC-32 of each array's rows, computed on a helper thread while rows are written.

    ``zlib.crc32`` releases the GIL, so checksums overlap with reading and writing. At most one
    earlier slab per array waits for its checksum, which bounds the memory held.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.values = dict.fromkeys(names, 0)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrayfeed-crc")
        self._pending: deque[Future[None]] = deque()

    def add(self, name: str, rows: np.ndarray) -> None:
        """Fold ``rows`` (not to be modified until :meth:`result`) into the checksum of ``name``."""
        while len(self._pending) >= len(self.values):
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._update, name, rows))

    def _update(self, name: str, rows: np.ndarray) -> None:
        self.values[name] = zlib.crc32(le_bytes(rows), self.values[name])

    def result(self) -> dict[str, int]:
        while self._pending:
            self._pending.popleft().result()
        return dict(self.values)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def write_rows(writer: Writer, name: str, start: int, rows: np.ndarray) -> None:
    """Write ``rows`` of array ``name`` at row ``start`` (one place, so tests can fail it)."""
    writer.write(name, start, rows)


class Distributor(Protocol):
    """Runs a copy's slabs somewhere else (other processes or machines)."""

    def write(
        self, copy: Copy, target: Path | RemotePath, *, finish: bool = True
    ) -> ConversionRecord:
        """Write every slab into a new store at ``target``; the record, as :meth:`Copy.write`."""
        ...

    def checksums(self, copy: Copy, target: Path | RemotePath) -> dict[str, int]:
        """The CRC-32 of each array of the store at ``target``, read back slab by slab."""
        ...


class Copy:
    """Copies opened, consistent inputs into a new store of ``fmt`` in ``workspace``.

    Args:
        fmt: ``"hdf5"`` or ``"zarr"``.
        parts: Array name -> its input.
        workspace: Where everything is written.
        chunk_rows: Rows per chunk asked for, or None to choose.
        compression: ``"none"``, ``"lzf"`` or ``"gzip"``.
        seed: Seed of the shared row order, or None to keep the order.
        progress: Progress bar setting (see :class:`~.progress.Progress`).
        writing: A context manager that turns the ``OSError`` of a write into what it means
            for the output (a full disk, a read-only directory).
        distribute: Writes (and reads back) the slabs elsewhere instead: a conversion on Dask
            (:mod:`.ondask`).
        densify: Write sparse matrices as dense arrays instead of CSR groups.
    """

    def __init__(
        self,
        fmt: Format,
        parts: dict[str, Parts],
        workspace: Workspace,
        *,
        chunk_rows: int | None,
        compression: str,
        seed: int | None,
        progress: bool | None,
        writing: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        distribute: Distributor | None = None,
        densify: bool = False,
    ) -> None:
        self.fmt, self.parts, self.workspace = fmt, parts, workspace
        self.writing = writing
        self.distribute = distribute
        self.compression, self.progress = compression, progress
        self.n_rows = next(iter(parts.values())).n_rows
        csr_names = [] if densify else [n for n, p in parts.items() if p.sparse]
        self.row_bytes = sum(
            _csr_row_bytes(p) if name in csr_names else p.row_bytes for name, p in parts.items()
        )
        layout_rows = chunk_rows or choose_chunk_rows(
            self.row_bytes, self.n_rows, target_bytes=CHUNK_TARGET_BYTES[fmt]
        )
        layout_rows = min(layout_rows, self.n_rows)
        contiguous = fmt == "hdf5" and compression == "none" and not chunk_rows
        self.chunk_rows: int | None = None if contiguous else layout_rows
        #: The sparse matrices copied as CSR, and how (the others are written dense).
        self.sparse = {
            name: _csr_layout(parts[name], self.chunk_rows, CHUNK_TARGET_BYTES[fmt])
            for name in csr_names
        }
        self._indptr: dict[str, np.ndarray] = {}  # planned in :meth:`write`
        self.slab = slab_rows(layout_rows, self.row_bytes, self.n_rows)
        if self.slab > _MAX_SLAB_ROWS:
            self.slab = max(layout_rows, _MAX_SLAB_ROWS // layout_rows * layout_rows)
        self.pause = _test_hook_pause()
        if self.pause is not None:
            self.slab = layout_rows
        self.seed = seed

    @classmethod
    def draw_seed(cls, seed: int | None) -> int:
        """``seed``, or a fresh random one when None."""
        return seed if seed is not None else secrets.randbits(63)

    @property
    def total_bytes(self) -> int:
        return self.n_rows * self.row_bytes

    def slabs(self) -> list[tuple[int, int]]:
        """``(start, stop)`` rows of each slab, in order."""
        return [(a, min(a + self.slab, self.n_rows)) for a in range(0, self.n_rows, self.slab)]

    def stage(self, interrupts: Interrupts) -> None:
        """Copy inputs that are slow to gather from at random into files in the workspace.

        The copies are written with ordinary writes (a write through a memory map would crash
        the process with SIGBUS on a full disk) and then memory-mapped read-only.
        """
        slow = {
            name: p
            for name, p in self.parts.items()
            if (_sparse_slow(p) if p.sparse else not p.gatherable)
        }
        if not slow:
            return
        directory = self.workspace.member("stage")
        with self.writing():
            directory.mkdir(exist_ok=True)
        total = sum(
            _csr_row_bytes(p) * p.n_rows if p.sparse else p.n_rows * p.row_bytes
            for p in slow.values()
        )
        with Progress(total, label="staging", enabled=self.progress) as bar:
            for i, (name, p) in enumerate(slow.items()):
                path = directory / f"{i}.bin"
                if p.sparse:  # its arrays as stored: a dense copy can be many times larger
                    self.parts[name] = self._stage_sparse(p, path, bar, interrupts)
                else:
                    self._stage_one(p, path, bar, interrupts)
                    staged = np.memmap(path, dtype=p.dtype, mode="r", shape=p.shape)
                    self.parts[name] = Parts(p.name, [as_source(staged, str(path))])
                p.close()

    def _stage_one(self, p: Parts, path: Path, bar: Progress, interrupts: Interrupts) -> None:
        with self.writing(), open(path, "wb") as f:
            for a, b in self.slabs():
                f.write(p.read_run(a, b).data)
                bar.update((b - a) * p.row_bytes)
                interrupts.checkpoint()

    def _stage_sparse(self, p: Parts, path: Path, bar: Progress, interrupts: Interrupts) -> Parts:
        """``p`` with every component array that does not gather cheaply copied to a file."""
        sources: list[Source] = []
        for i, source in enumerate(p.sources):
            assert isinstance(source, SparseRows)
            staged: list[Source] = []
            for j, part in enumerate(source.components):
                if isinstance(part, GatherInto):
                    staged.append(part)
                    continue
                file = path.with_name(f"{path.stem}-{i}-{j}.bin")
                dtype = np.dtype(part.dtype)
                with self.writing(), open(file, "wb") as f:
                    for a, b in element_runs(len(part), dtype.itemsize):
                        f.write(np.ascontiguousarray(read_run(part, a, b), dtype=dtype).data)
                        bar.update((b - a) * dtype.itemsize)
                        interrupts.checkpoint()
                mapped = np.memmap(file, dtype=dtype, mode="r", shape=(len(part),))
                staged.append(as_source(mapped, str(file)))
            n_rows, n_cols = source.shape[:2]
            data, indices, indptr = staged
            sources.append(csr_source(data, indices, indptr, (n_rows, n_cols), name=p.name))
        return Parts(p.name, sources)

    def write(
        self, target: Path | RemotePath, interrupts: Interrupts, *, finish: bool = True
    ) -> ConversionRecord:
        """Write every slab into a new store at ``target``; return its record, which is stored
        with the data unless ``finish`` is False (object storage stores it once verified)."""
        if self.distribute is not None:
            return self.distribute.write(self, target, finish=finish)
        arrays = {
            name: (p.shape, p.dtype) for name, p in self.parts.items() if name not in self.sparse
        }
        self._plan_sparse()
        with self.writing():
            writer = create_writer(
                self.fmt, target, arrays, self.chunk_rows, self.compression, self.sparse
            )
        checksums = Checksums(self.array_names)
        appenders = {
            f"{name}/{part}": _Appender(self, writer, f"{name}/{part}", chunk, checksums)
            for name, layout in self.sparse.items()
            for part, (_, _, chunk) in layout.arrays().items()
        }
        try:
            with Progress(self.total_bytes, label="writing", enabled=self.progress) as bar:
                for a, b in self.slabs():
                    self._write_slab(writer, checksums, a, b, appenders)
                    bar.update((b - a) * self.row_bytes)
                    interrupts.checkpoint()
                    if self.pause is not None:
                        time.sleep(self.pause)
                        interrupts.checkpoint()
                for appender in appenders.values():
                    appender.close()
            record = ConversionRecord(
                version=__version__,
                complete=True,
                rows=self.n_rows,
                chunk_rows=self.chunk_rows,
                compression=self.compression,
                shuffle_seed=self.seed,
                checksums=checksums.result(),
                sparse={name: (s.n_cols, s.nnz) for name, s in self.sparse.items()},
            )
            with self.writing():
                if finish:
                    writer.finish(record)
                writer.close()  # flushes
        except BaseException:
            with contextlib.suppress(Exception):
                writer.close()
            raise
        finally:
            checksums.close()
        return record

    @property
    def array_names(self) -> list[str]:
        """Every array written: one per dense name, three per sparse matrix."""
        return list(self.stored_arrays)

    @property
    def stored_arrays(self) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
        """Every array written, with its shape and dtype: one per dense name, and a sparse
        matrix's ``NAME/data``, ``NAME/indices`` and ``NAME/indptr``."""
        arrays: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
        for name, p in self.parts.items():
            if name not in self.sparse:
                arrays[name] = (p.shape, p.dtype)
                continue
            for part, (length, dtype, _) in self.sparse[name].arrays().items():
                arrays[f"{name}/{part}"] = ((length,), dtype)
        return arrays

    def _order(self, a: int, b: int) -> np.ndarray | None:
        """The input rows of output rows ``a:b`` (None: the same rows, in order)."""
        if self.seed is None:
            return None
        return permute(np.arange(a, b, dtype=np.int64), self.n_rows, derive_key(self.seed))

    def _plan_sparse(self) -> None:
        """Each sparse matrix's ``indptr`` in the output order, from the input's own."""
        for name in self.sparse:
            lengths = self.parts[name].row_lengths()
            order = self._order(0, self.n_rows)
            if order is not None:
                lengths = lengths[order]
            indptr = np.zeros(self.n_rows + 1, dtype=np.int64)
            np.cumsum(lengths, out=indptr[1:])
            self._indptr[name] = indptr

    def _write_slab(
        self,
        writer: Writer,
        checksums: Checksums,
        a: int,
        b: int,
        appenders: dict[str, _Appender],
    ) -> None:
        order = self._order(a, b)
        for name, p in self.parts.items():
            if name in self.sparse:
                self._write_csr(name, a, b, order, appenders)
                continue
            rows = p.read_run(a, b) if order is None else p.gather(order)
            checksums.add(name, rows)
            with self.writing():
                write_rows(writer, name, a, rows)

    def _write_csr(
        self, name: str, a: int, b: int, order: np.ndarray | None, appenders: dict[str, _Appender]
    ) -> None:
        """Append output rows ``a:b`` of sparse matrix ``name`` to its three arrays."""
        p, layout = self.parts[name], self.sparse[name]
        if order is None:
            lengths, cols, values = p.read_stored(np.arange(a, b, dtype=np.int64))
        else:
            ranked = np.argsort(order, kind="stable")  # storage order for the read
            lengths, cols, values = p.read_stored(order[ranked])
            at = np.empty_like(ranked)
            at[ranked] = np.arange(len(ranked))  # output row k is read row at[k]
            take = ragged_arange((np.cumsum(lengths) - lengths)[at], lengths[at])
            lengths, cols, values = lengths[at], cols[take], values[take]
        indptr = self._indptr[name]
        if not np.array_equal(lengths, np.diff(indptr[a : b + 1])):
            raise CorruptDataError(
                f"`{name}` (a sparse matrix) changed while it was being converted: rows "
                f"{a}-{b - 1} no longer hold the entries its `indptr` gave at the start; nothing "
                "was written. Convert it again once nothing else writes to it."
            )
        data_dtype, index_dtype, indptr_dtype = layout.dtypes
        appenders[f"{name}/data"].add(values.astype(data_dtype, copy=False))
        appenders[f"{name}/indices"].add(cols.astype(index_dtype))
        stop = b + 1 if b == self.n_rows else b  # the last slab also writes the final entry
        appenders[f"{name}/indptr"].add(indptr[a:stop].astype(indptr_dtype))


class _Appender:
    """Appends runs of elements to one 1-D array of a writer, in whole chunks of ``chunk``
    elements (the rest waits for the next run, or :meth:`close`), so that no chunk is written
    twice; ``chunk`` None writes each run at once (contiguous HDF5)."""

    def __init__(
        self, copy: Copy, writer: Writer, name: str, chunk: int | None, checksums: Checksums
    ) -> None:
        self.copy, self.writer, self.name, self.chunk = copy, writer, name, chunk
        self.checksums = checksums
        self.pending: list[np.ndarray] = []
        self.count = 0  # elements pending
        self.at = 0  # elements written

    def add(self, values: np.ndarray) -> None:
        self.checksums.add(self.name, values)
        self.pending.append(values)
        self.count += len(values)
        whole = self.count if self.chunk is None else self.count // self.chunk * self.chunk
        if whole:
            self._write(whole)

    def close(self) -> None:
        if self.count:
            self._write(self.count)

    def _write(self, n: int) -> None:
        run = self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)
        with self.copy.writing():
            write_rows(self.writer, self.name, self.at, run[:n])
        self.at += n
        self.count -= n
        self.pending = [run[n:]] if self.count else []


def _csr_row_bytes(p: Parts) -> int:
    """Bytes per row of a sparse matrix stored as CSR, on average (at least 1)."""
    per_entry = p.dtype.itemsize + _index_dtype(p.row_shape[0]).itemsize
    return max(1, -(-(p.nnz * per_entry + (p.n_rows + 1) * 8) // p.n_rows))


def _index_dtype(largest: int) -> np.dtype[Any]:
    """``int32`` when it holds ``largest``, else ``int64`` (what ``scipy.sparse`` chooses)."""
    return np.dtype(np.int32 if largest <= np.iinfo(np.int32).max else np.int64)


def _csr_layout(p: Parts, chunk_rows: int | None, target_bytes: int) -> SparseLayout:
    """How the sparse matrix ``p`` is stored: chunks of ``data`` and ``indices`` hold the
    entries of about ``chunk_rows`` rows (so ``shuffle="block"`` windows line up with the dense
    arrays' chunks), and ``indptr`` chunks about ``target_bytes``."""
    n_rows, nnz = p.n_rows, p.nnz
    chunk = indptr_chunk = None
    if chunk_rows is not None:
        chunk = min(max(1, nnz), chunk_rows * max(1, -(-nnz // n_rows)))
        indptr_chunk = min(n_rows + 1, max(chunk_rows, target_bytes // 8))
    return SparseLayout(
        n_rows=n_rows,
        n_cols=p.row_shape[0],
        nnz=nnz,
        dtypes=(p.dtype, _index_dtype(p.row_shape[0]), _index_dtype(nnz)),
        chunk=chunk,
        indptr_chunk=indptr_chunk,
    )


def _sparse_slow(p: Parts) -> bool:
    """Whether a component of the sparse matrix ``p`` is slow to read at random (a shuffle
    stages it)."""
    return any(
        not isinstance(part, GatherInto)
        for source in p.sources
        if isinstance(source, SparseRows)
        for part in source.components
    )


def _test_hook_pause() -> float | None:
    value = os.environ.get(TEST_HOOK_ENV)
    if not value:
        return None
    try:
        pause = float(value)
    except ValueError:
        raise ConfigError(
            f"{TEST_HOOK_ENV} (a test hook) must be a number of seconds (got {value!r}); unset it."
        ) from None
    return pause if math.isfinite(pause) and pause >= 0 else None
