"""Verifying converted stores: before publishing a copy, and later, on demand.

:func:`verify_copy` runs inside ``convert``: the written store is opened again through the storage
layer, and every array is checked for its shape and dtype, (Zarr) for every chunk being stored,
and for the CRC-32 of its rows against the checksum taken from the inputs while writing. The
stored record must equal the one written.

:func:`verify` (``arrayfeed verify PATH``) re-reads a store that ``convert`` wrote, at any later
time, and checks every array (or the one ``PATH`` names, ``store.zarr:x``) against the record:
the CRC-32 of all its rows, and on the way every chunk's own checksum (HDF5 fletcher32, Zarr
crc32c). It is the only check of data stored contiguous (uncompressed HDF5), which has no
per-chunk checksum.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .._errors import CorruptDataError, SourceNotFoundError
from .._storage import (
    SPARSE_COMPONENTS,
    ConversionRecord,
    RemotePath,
    Source,
    SparseRows,
    cache_spec,
    open_array,
    open_written,
    row_bytes,
    written_by_arrayfeed,
)
from .atomic import Interrupts
from .copy import Checksums, Copy
from .inputs import read_run
from .layout import SLAB_BYTES, element_runs, format_bytes, slab_rows
from .progress import Progress
from .specs import locate, pick

__all__ = ["VerifyReport", "verify", "verify_copy"]


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """What :func:`verify` checked; ``str(report)`` is the verdict ``arrayfeed verify`` prints.

    Attributes:
        path: The store.
        arrays: Names of the arrays checked.
        rows: Rows of every array.
        nbytes: Bytes read (uncompressed).
        seconds: Time it took.
        key: The one array checked, when ``path`` named one (``store.zarr:x``); else None.
    """

    path: Path | str
    arrays: tuple[str, ...]
    rows: int
    nbytes: int
    seconds: float
    key: str | None = None

    def __str__(self) -> str:
        rate = format_bytes(self.nbytes / self.seconds) + "/s" if self.seconds > 0 else "-"
        where = self.path if self.key is None else f"{self.path}:{self.key}"
        return (
            f"{where}: OK, {len(self.arrays)} array{'s' if len(self.arrays) != 1 else ''} "
            f"of {self.rows:,} rows ({format_bytes(self.nbytes)}) match the checksums recorded "
            f"by arrayfeed convert ({self.seconds:.1f} s, {rate})."
        )


def verify(
    path: str | os.PathLike[str],
    *,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cache: str | os.PathLike[str] | bool | None = None,
    cache_limit: int | None = None,
) -> VerifyReport:
    """Re-read a store written by :func:`arrayfeed.convert` and check it against its record.

    Every array is read in full, in order: its rows must match the CRC-32 recorded when it was
    written, and each chunk must pass its own checksum on the way (HDF5 fletcher32, Zarr crc32c).

    Args:
        path: An HDF5 file or Zarr store written by ``arrayfeed convert``. It may name one
            array inside, as everywhere else (``"train.zarr:x"``): that array alone is read and
            checked against the record (a sparse matrix's name checks its ``data``, ``indices``
            and ``indptr``). A path that exists as written (a file named with a ``:``) is taken
            whole.
        progress: Draw a progress bar on stderr; None draws it only when stderr is a terminal.
        storage_options: For a URL (``s3://bucket/train.zarr``): options of its fsspec
            filesystem (see :func:`arrayfeed.open_array`).
        cache, cache_limit: For a URL: read its objects through this local cache (see
            :func:`arrayfeed.open_array`), which then holds them for training.

    Returns:
        A :class:`VerifyReport`; print it for the one-line verdict.

    Raises:
        CorruptDataError: A chunk fails its checksum, cannot be decoded or is missing, or an
            array's rows do not match the record, naming the array (and chunk).
        SourceNotFoundError: Nothing at ``path``, it was not written by ``arrayfeed convert``
            (there is no record to check against), or the array it names is not in the record
            (the message lists those that are).

    >>> import numpy as np, tempfile, os, arrayfeed as af
    >>> out = os.path.join(tempfile.mkdtemp(), "data.h5")
    >>> _ = af.convert({"x": np.arange(1000.0)}, out, compression="lzf", progress=False)
    >>> af.verify(out, progress=False).arrays
    ('x',)
    >>> af.verify(out + ":x", progress=False).key
    'x'
    """
    p, key = locate(path)
    spec = cache_spec(cache, cache_limit)
    opening = {
        "storage_options": storage_options,
        "cache": spec.directory if spec else None,
        "cache_limit": spec.limit if spec else None,
    }
    record = _record_of(p, storage_options)
    chosen = _Chosen.of(record, key, p)
    sources = _open_checked(p, chosen, record, opening)
    started = time.perf_counter()
    found, nbytes = _read_back(sources, chosen, record, progress)
    _compare(p, found, record)
    return VerifyReport(
        path=p,
        key=None if key is None else chosen.reported[0],
        arrays=chosen.reported,
        rows=record.rows,
        nbytes=nbytes,
        seconds=time.perf_counter() - started,
    )


def _record_of(p: Path | str, storage_options: Mapping[str, Any] | None) -> ConversionRecord:
    """The record ``convert`` stored with ``p``, which :func:`verify` checks against."""
    record = written_by_arrayfeed(p, storage_options=storage_options)
    if record is None:
        raise SourceNotFoundError(
            f"'{p}' was not written by `arrayfeed convert` (it has no conversion record), so "
            "there is nothing to verify it against; convert it to get checksums."
        )
    return record


def _compare(p: Path | str, found: Mapping[str, int], record: ConversionRecord) -> None:
    """Raise unless every CRC-32 ``found`` (by array) is the one ``record`` holds."""
    for name, crc in found.items():
        if crc != record.checksums[name]:
            raise CorruptDataError(
                f"`{name}` in '{p}' reads back with CRC-32 {crc:08x}, but it was written "
                f"with {record.checksums[name]:08x}: the store is corrupted (or was changed by "
                "another program). Restore it from a backup or convert it again."
            )


@dataclass(frozen=True)
class _Chosen:
    """The arrays :func:`verify` reads: every array of the record, or those of the one named."""

    #: Every array to read, sorted, with its length in the record.
    lengths: dict[str, int]
    #: Those of them that are arrays of rows; the others belong to sparse matrices.
    dense: tuple[str, ...]
    #: The sparse matrices named, checked whole before their arrays are read.
    matrices: tuple[str, ...]
    #: What the report names: arrays and sparse matrices, as the record lists them.
    reported: tuple[str, ...]

    @classmethod
    def of(cls, record: ConversionRecord, key: str | None, p: Path | str) -> _Chosen:
        """The arrays of ``record`` that ``key`` names (None: all of them) in the store ``p``."""
        lengths = dict.fromkeys(record.checksums, record.rows)
        matrix_of: dict[str, str] = {}
        for matrix, (_, nnz) in record.sparse.items():
            for part, length in zip(SPARSE_COMPONENTS, (nnz, nnz, record.rows + 1), strict=True):
                lengths[f"{matrix}/{part}"] = length
                matrix_of[f"{matrix}/{part}"] = matrix
        matrices, reported = tuple(record.sparse), record.arrays
        if key is not None:
            name = pick(p, key, {*lengths, *record.sparse}, listed=record.arrays)
            matrices = (name,) if name in record.sparse else ()
            lengths = {
                n: length
                for n, length in lengths.items()
                if n == name or matrix_of.get(n) in matrices
            }
            reported = (name,)
        dense = tuple(n for n in sorted(lengths) if n not in matrix_of)
        return cls(dict(sorted(lengths.items())), dense, matrices, reported)


def _open_checked(
    p: Path | str,
    chosen: _Chosen,
    record: ConversionRecord,
    opening: Mapping[str, Any],
) -> dict[str, Source]:
    """The arrays ``chosen`` names, opened (with the keyword arguments ``opening``), each of the
    length and every sparse matrix of the shape the record gives (the store was changed after
    it was written otherwise)."""
    sources = {name: open_array(p, name, **opening) for name in chosen.lengths}
    for matrix in chosen.matrices:
        _check_sparse(p, matrix, open_array(p, matrix, **opening), record)
    for name, source in sources.items():
        if len(source) != chosen.lengths[name]:
            raise CorruptDataError(
                f"`{name}` in '{p}' has {len(source)} rows, but the record says "
                f"{chosen.lengths[name]}; the store was changed after it was written. Convert it "
                "again."
            )
    return sources


def _read_back(
    sources: Mapping[str, Source],
    chosen: _Chosen,
    record: ConversionRecord,
    progress: bool | None,
) -> tuple[dict[str, int], int]:
    """The CRC-32 of every array of ``sources``, read in full, and the bytes read: arrays of
    rows side by side a slab at a time, then the arrays of sparse matrices, each on its own."""
    dense = {name: sources[name] for name in chosen.dense}
    bytes_per_row = row_bytes(dense.values())
    step = slab_rows(
        record.chunk_rows or 1, max(1, bytes_per_row), record.rows, target_bytes=SLAB_BYTES
    )
    total = record.rows * bytes_per_row + sum(
        chosen.lengths[n] * s.dtype.itemsize for n, s in sources.items() if n not in dense
    )
    checksums = Checksums(list(chosen.lengths))
    try:
        with Progress(total, label="verifying", enabled=progress) as bar:
            for a in range(0, record.rows, step):
                b = min(a + step, record.rows)
                for name, source in dense.items():
                    checksums.add(name, read_run(source, a, b))  # made contiguous there
                bar.update((b - a) * bytes_per_row)
            for name, source in sources.items():
                if name in dense:
                    continue
                for a, b in element_runs(chosen.lengths[name], source.dtype.itemsize):
                    checksums.add(name, read_run(source, a, b))
                    bar.update((b - a) * source.dtype.itemsize)
            return checksums.result(), total
    finally:
        checksums.close()


def _check_sparse(p: Path | str, name: str, source: Source, record: ConversionRecord) -> None:
    """Raise unless ``source`` (``name`` opened again) is the sparse matrix the record names."""
    n_cols, nnz = record.sparse[name]
    if (
        not isinstance(source, SparseRows)
        or tuple(source.shape) != (record.rows, n_cols)
        or source.nnz != nnz
    ):
        raise CorruptDataError(
            f"`{name}` in '{p}' does not read as the sparse matrix of {record.rows} x {n_cols} "
            f"with {nnz} entries that the record names; the store was changed after it was "
            "written. Convert it again."
        )


def verify_copy(
    copy: Copy,
    target: Path | RemotePath,
    record: ConversionRecord,
    output: Path | RemotePath,
    interrupts: Interrupts,
    *,
    check_record: bool = True,
) -> None:
    """Raise :class:`CorruptDataError` (naming ``output``) unless the store at ``target`` holds
    exactly what ``copy`` read from its inputs and ``record`` describes (``check_record``: and
    the stored record equals ``record``)."""

    def fail(what: str) -> NoReturn:
        raise CorruptDataError(
            f"verifying the converted copy failed: {what}; nothing was written to "
            f"'{output}'. Check the disk and convert again."
        )

    expected = copy.stored_arrays
    with (
        Progress(copy.total_bytes, label="verifying", enabled=copy.progress) as bar,
        open_written(copy.fmt, target, copy.array_names, list(copy.sparse)) as stored,
    ):
        for name, missing in stored.missing_chunks.items():
            if missing:
                total = stored.total_chunks[name]
                fail(f"`{name}` has {total - missing} of {total} chunks")
        for name, (shape, dtype) in expected.items():
            array = stored.arrays[name]
            if tuple(array.shape) != shape or np.dtype(array.dtype) != dtype:
                fail(
                    f"`{name}` reads back as {tuple(array.shape)} {np.dtype(array.dtype)}, "
                    f"not {shape} {dtype}"
                )
        for name, layout in copy.sparse.items():
            attrs = stored.group_attrs[name]
            if attrs.get("encoding-type") != "csr_matrix" or [
                int(n) for n in np.asarray(attrs.get("shape")).reshape(-1)
            ] != [layout.n_rows, layout.n_cols]:
                fail(f"the group `{name}` does not read back as a CSR matrix of its shape")
        if copy.distribute is not None:  # read back where it was written, in parallel
            checksums = copy.distribute.checksums(copy, target)
        else:
            checksums = _checksums(copy, stored.arrays, bar, interrupts)
        for name, crc in checksums.items():
            if crc != record.checksums[name]:
                fail(f"`{name}` reads back with CRC-32 {crc:08x}, not {record.checksums[name]:08x}")
        if check_record and stored.record != record:
            fail("the stored record differs from what was written")


def _checksums(
    copy: Copy, arrays: Mapping[str, Any], bar: Progress, interrupts: Interrupts
) -> dict[str, int]:
    running = Checksums(copy.array_names)
    dense = [name for name in copy.parts if name not in copy.sparse]
    dense_row_bytes = sum(copy.parts[name].row_bytes for name in dense)
    try:
        for a, b in copy.slabs():
            for name in dense:
                running.add(name, np.asarray(arrays[name][a:b]))
            bar.update((b - a) * dense_row_bytes)
            interrupts.checkpoint()
        for name, ((length, *_), dtype) in copy.stored_arrays.items():
            if name in dense:
                continue  # the arrays of sparse matrices, each at its own length
            for a, b in element_runs(length, dtype.itemsize):
                running.add(name, np.asarray(arrays[name][a:b]))
                bar.update((b - a) * dtype.itemsize)
                interrupts.checkpoint()
        return running.result()
    finally:
        running.close()
