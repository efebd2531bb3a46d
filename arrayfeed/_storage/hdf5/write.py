"""Writing HDF5 for ``convert``: the writer, and the written file opened again to verify it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..layout import GZIP_LEVEL, SparseLayout, StoredArrays
from ..record import MARKER, ConversionRecord
from .files import read_record

__all__ = ["H5Writer", "open_written"]


class H5Writer:
    """Writes one dataset per name into a new HDF5 file, and each of ``sparse`` as AnnData's
    ``csr_matrix`` group (see :class:`~..layout.Writer`; its components are written as arrays
    named ``NAME/data``, ``NAME/indices``, ``NAME/indptr``)."""

    def __init__(
        self,
        path: Path,
        arrays: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]],
        chunk_rows: int | None,
        compression: str,
        sparse: Mapping[str, SparseLayout] | None = None,
    ) -> None:
        # No chunk cache: a conversion writes whole chunks, so caching gains nothing, and a write
        # that fails (a full disk, a file-size limit) must not leave dirty chunks that HDF5 tries
        # to flush again when the file is closed later (at exit that crashed the process).
        self.file = h5py.File(path, "w", rdcc_nbytes=0)
        self.compression = compression
        self.datasets: dict[str, h5py.Dataset] = {}
        for name, (shape, dtype) in arrays.items():
            self._create(self.file, name, shape, dtype, chunk_rows)
        for name, layout in (sparse or {}).items():
            group = self.file.create_group(name)
            for key, value in layout.attrs.items():
                group.attrs[key] = value
            for part, (length, dtype, chunk) in layout.arrays().items():
                self.datasets[f"{name}/{part}"] = self._create(
                    group, part, (length,), dtype, chunk if chunk_rows is not None else None
                )

    def _create(
        self,
        where: h5py.Group,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        chunk_rows: int | None,
    ) -> h5py.Dataset:
        options: dict[str, Any] = {}
        if chunk_rows is not None and shape[0] > 0:  # HDF5 has no chunks for an empty array
            options["chunks"] = (min(chunk_rows, shape[0]), *shape[1:])
            # A checksum per chunk: a flipped bit is a read error, never wrong values (LZF
            # has no checksum of its own). HDF5 needs chunks for it: contiguous data is
            # checked against the record's CRC-32 by `arrayfeed verify`.
            options["fletcher32"] = True
            if self.compression != "none":
                options["compression"] = self.compression
                if self.compression == "gzip":
                    options["compression_opts"] = GZIP_LEVEL
                options["shuffle"] = dtype.itemsize > 1
        dataset = where.create_dataset(name, shape=shape, dtype=dtype, track_times=False, **options)
        if where is self.file:
            self.datasets[name] = dataset
        return dataset

    def write(self, name: str, start: int, rows: np.ndarray) -> None:
        self.datasets[name][start : start + len(rows)] = rows

    def finish(self, record: ConversionRecord) -> None:
        self.file.attrs[MARKER] = json.dumps(record.to_json())
        self.file.flush()

    def close(self) -> None:
        """Close the file; after a failed write, every HDF5 object of it is closed regardless,
        so that nothing of the file outlives its workspace."""
        self.datasets.clear()
        try:
            self.file.close()
        except Exception:
            for ident in h5py.h5f.get_obj_ids(self.file.id):
                with contextlib.suppress(Exception):
                    while ident.valid:
                        ident._close()
            raise


@contextlib.contextmanager
def open_written(
    path: Path, names: list[str], groups: list[str] | None = None
) -> Iterator[StoredArrays]:
    """A converted HDF5 file opened again to check it (datasets ``names``, and the attributes
    of ``groups``)."""
    with h5py.File(path, "r") as f:
        yield StoredArrays(
            arrays={n: f[n] for n in names},
            record=read_record(f),
            group_attrs={g: dict(f[g].attrs) for g in groups or ()},
        )
