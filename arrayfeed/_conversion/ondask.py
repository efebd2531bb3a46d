"""``convert`` on a Dask cluster: workers write disjoint, chunk-aligned row ranges of one store.

The store is created here first (every array, its chunking and codecs, the record marked
incomplete), so workers only open it and write their slabs: a slab is a whole number of chunks
(:func:`~.layout.slab_rows`), so no two workers ever write the same chunk, and the bytes are
those a single-process conversion writes. Each task returns the CRC-32 of the rows it copied
(per array); the record's CRC-32 of each whole array is joined from them in row order
(:func:`~.crc.crc32_join`). Verification (reading everything back against those checksums) and
marking the store complete happen here, once, as in a local conversion.

Only Zarr output: an HDF5 file cannot be written by several processes at once (without MPI).
Workers must see the output path (a shared file system or object storage) and the inputs (paths
they can open, or in-memory arrays, which are sent to them once).
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import ConfigError
from .._storage import (
    ConversionRecord,
    RemotePath,
    create_writer,
    open_region_writer,
    open_written,
)
from .._version import __version__
from .copy import Copy, le_bytes
from .crc import crc32_join
from .inputs import Parts

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["DaskCopy", "check_dask_conversion", "client_for"]

#: Slabs per task: a slab is already much work, and more tasks balance the workers better.
_SLABS_PER_TASK = 1


def client_for(scheduler: Any) -> Any:
    """A ``dask.distributed.Client`` for ``scheduler`` (a Client, or a scheduler address)."""
    try:
        distributed = importlib.import_module("dask.distributed")
    except ImportError:
        raise ConfigError(
            "`scheduler` asks for a conversion on Dask, but dask.distributed is not installed; "
            'install it with `pip install "arrayfeed[dask]"`.'
        ) from None
    if isinstance(scheduler, distributed.Client):
        return scheduler
    if isinstance(scheduler, str) and scheduler:
        try:  # not made the default: dask computations elsewhere keep their own scheduler
            return distributed.Client(scheduler, timeout="20s", set_as_default=False)
        except OSError as exc:
            raise ConfigError(
                f"cannot reach the Dask scheduler at {scheduler!r} ({exc}); check the address "
                "(e.g. 'tcp://host:8786') and that the scheduler is running."
            ) from None
    raise ConfigError(
        f"`scheduler` must be a dask.distributed.Client or a scheduler address such as "
        f"'tcp://host:8786' (got {type(scheduler).__name__})."
    )


def check_dask_conversion(fmt: str, *, shuffle: bool) -> None:
    """Refuse what a conversion on Dask cannot do (before anything is written)."""
    if fmt != "zarr":
        raise ConfigError(
            "a conversion on Dask writes Zarr only (several processes cannot write one HDF5 "
            "file); end `output` in .zarr, or convert without `scheduler`."
        )
    if shuffle:
        raise ConfigError(
            "`shuffle=True` is not supported on Dask yet; convert without `scheduler`, or "
            "without `shuffle` (block shuffle reads a converted store well: shuffle='block')."
        )


class DaskCopy:
    """Writes and reads back a copy's slabs on the workers of a ``dask.distributed.Client``
    (a :class:`~.copy.Distributor`)."""

    def __init__(self, scheduler: Any) -> None:
        self.client = client_for(scheduler)
        self._owned = self.client is not scheduler  # made here from an address

    def close(self) -> None:
        """Disconnect the client made from a scheduler address (never a Client passed in)."""
        if self._owned:
            self.client.close()

    def _tasks(self, copy: Copy) -> list[list[tuple[int, int]]]:
        slabs = copy.slabs()
        return [slabs[i : i + _SLABS_PER_TASK] for i in range(0, len(slabs), _SLABS_PER_TASK)]

    def write(
        self, copy: Copy, target: Path | RemotePath, *, finish: bool = True
    ) -> ConversionRecord:
        """Write every slab of ``copy`` into a new store at ``target`` from the workers; return
        the record (stored with the data unless ``finish`` is False)."""
        arrays = {name: (p.shape, p.dtype) for name, p in copy.parts.items()}
        with copy.writing():
            writer = create_writer(copy.fmt, target, arrays, copy.chunk_rows, copy.compression)
            writer.close()  # created, marked incomplete: the workers fill it
        # In a list: scattered as a dict, its keys would name cluster data every conversion shares.
        [parts] = self.client.scatter([copy.parts], broadcast=True, hash=False)
        futures = self.client.map(
            _write_task, self._tasks(copy), parts=parts, target=target, pure=False
        )
        record = ConversionRecord(
            version=__version__,
            complete=True,
            rows=copy.n_rows,
            chunk_rows=copy.chunk_rows,
            compression=copy.compression,
            shuffle_seed=None,
            checksums=_joined(self.client.gather(futures), list(copy.parts)),
        )
        if finish:
            with copy.writing():
                writer = open_region_writer(target)
                writer.finish(record)
                writer.close()
        return record

    def checksums(self, copy: Copy, target: Path | RemotePath) -> dict[str, int]:
        """The store at ``target`` read back on the workers: each array's CRC-32."""
        futures = self.client.map(
            _crc_task, self._tasks(copy), target=target, names=list(copy.parts), pure=False
        )
        return _joined(self.client.gather(futures), list(copy.parts))


def _joined(results: list[dict[str, tuple[int, int]]], names: list[str]) -> dict[str, int]:
    """Per array, the CRC-32 of all rows from the ``(crc, bytes)`` of consecutive tasks."""
    return {name: crc32_join(result[name] for result in results) for name in names}


def _write_task(
    slabs: Sequence[tuple[int, int]], *, parts: dict[str, Parts], target: Path | RemotePath
) -> dict[str, tuple[int, int]]:
    """On a worker: copy ``slabs`` of every array; ``(CRC-32, bytes)`` of the rows, per array."""
    writer = open_region_writer(target)
    crcs = dict.fromkeys(parts, (0, 0))
    try:
        for a, b in slabs:
            for name, p in parts.items():
                rows = np.ascontiguousarray(p.read_run(a, b))
                crcs[name] = _crc(crcs[name], rows)
                writer.write(name, a, rows)
    finally:
        writer.close()
    return crcs


def _crc_task(
    slabs: Sequence[tuple[int, int]], *, target: Path | RemotePath, names: list[str]
) -> dict[str, tuple[int, int]]:
    """On a worker: ``(CRC-32, bytes)`` of ``slabs`` of every array as stored at ``target``."""
    crcs = dict.fromkeys(names, (0, 0))
    with open_written("zarr", target, names, count_chunks=False) as stored:
        for a, b in slabs:
            for name in names:
                crcs[name] = _crc(crcs[name], np.asarray(stored.arrays[name][a:b]))
    return crcs


def _crc(running: tuple[int, int], rows: np.ndarray) -> tuple[int, int]:
    data = le_bytes(rows)
    return zlib.crc32(data, running[0]), running[1] + data.nbytes
