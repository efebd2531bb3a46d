"""The record a conversion stores with its data: one on-disk contract for every format.

Every store ``arrayfeed convert`` writes carries a :class:`ConversionRecord` as JSON under the
attribute :data:`MARKER` (``"arrayfeed"``) of its root (HDF5: a JSON string on the root group;
Zarr: a JSON object in the root group's attributes). Its ``complete`` field is the completeness
marker: a Zarr array, or a group above it, whose ``"arrayfeed"`` attribute holds
``{"complete": true}`` was written with every chunk stored, so a missing chunk there is
corruption, not fill values (:func:`marked_complete`). Each format's subpackage reads and writes
the attribute; this module alone defines what it holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import CorruptDataError

__all__ = [
    "MARKER",
    "RECORD_FORMAT",
    "SPARSE_COMPONENTS",
    "ConversionRecord",
    "marked_complete",
    "marker_state",
    "parse_record",
]

#: Name of the attribute that holds the :class:`ConversionRecord` of a converted store.
MARKER = "arrayfeed"
#: Version of the record's JSON layout.
RECORD_FORMAT = 1
#: The arrays of a sparse matrix stored as CSR, each with its own checksum.
SPARSE_COMPONENTS = ("data", "indices", "indptr")


@dataclass(frozen=True, kw_only=True)
class ConversionRecord:
    """What :func:`convert` wrote, stored with the data; read back by :func:`written_by_arrayfeed`.

    Attributes:
        version: arrayfeed version that wrote the store.
        complete: Every row and (Zarr) every chunk was written and verified.
        rows: Rows of every array.
        chunk_rows: Rows per chunk of every array; None when the arrays are contiguous (HDF5).
        compression: ``"none"``, ``"lzf"`` or ``"gzip"`` (the Zarr codecs are named in
            :func:`convert`).
        shuffle_seed: Seed of the shared row permutation, or None when rows kept their order.
        checksums: Per array, ``zlib.crc32`` of its rows in order, C-contiguous, little-endian.
            A sparse matrix has one per component: ``NAME/data``, ``NAME/indices``,
            ``NAME/indptr``.
        sparse: Per sparse matrix stored as CSR (AnnData's ``csr_matrix`` group), its
            ``(columns, stored entries)``; it has :attr:`rows` rows, like every array.
    """

    version: str
    complete: bool
    rows: int
    chunk_rows: int | None
    compression: str
    shuffle_seed: int | None
    checksums: Mapping[str, int] = field(default_factory=dict)
    sparse: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def arrays(self) -> tuple[str, ...]:
        """The names of the arrays and sparse matrices written, sorted."""
        parts = {f"{name}/{part}" for name in self.sparse for part in SPARSE_COMPONENTS}
        return tuple(sorted({n for n in self.checksums if n not in parts} | set(self.sparse)))

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-compatible values (what is stored)."""
        extra: dict[str, Any] = {}
        if self.sparse:  # absent otherwise: a dense store's record is what it always was
            extra["sparse"] = {
                name: {"columns": cols, "nnz": nnz} for name, (cols, nnz) in self.sparse.items()
            }
        return {
            "format": RECORD_FORMAT,
            "version": self.version,
            "complete": self.complete,
            "rows": self.rows,
            "chunk_rows": self.chunk_rows,
            "compression": self.compression,
            "shuffle_seed": self.shuffle_seed,
            "checksum": "crc32",
            "checksums": dict(self.checksums),
            **extra,
        }

    @classmethod
    def from_json(cls, data: Any) -> ConversionRecord:
        """Parse what :meth:`to_json` stored; raise :class:`CorruptDataError` if malformed."""
        try:
            if isinstance(data, (str, bytes)):
                data = json.loads(data)
            if data.get("format") != RECORD_FORMAT:
                raise ValueError(f"unknown record format {data.get('format')!r}")
            return cls(
                version=str(data["version"]),
                complete=bool(data["complete"]),
                rows=int(data["rows"]),
                chunk_rows=None if data["chunk_rows"] is None else int(data["chunk_rows"]),
                compression=str(data["compression"]),
                shuffle_seed=None if data["shuffle_seed"] is None else int(data["shuffle_seed"]),
                checksums={str(k): int(v) for k, v in data["checksums"].items()},
                sparse={
                    str(k): (int(v["columns"]), int(v["nnz"]))
                    for k, v in data.get("sparse", {}).items()
                },
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(
                f"the {MARKER!r} attribute is not a record written by arrayfeed ({exc}); the store "
                "was changed by another program, convert it again."
            ) from None


def parse_record(raw: Any) -> ConversionRecord | None:
    """The record stored as ``raw`` (JSON text, bytes or an object), or None when absent."""
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode()
    return ConversionRecord.from_json(raw)


def marked_complete(attrs: Mapping[str, Any]) -> bool:
    """True if ``attrs`` carry the completeness marker ``{"arrayfeed": {"complete": true}}``."""
    return marker_state(attrs) is True


def marker_state(attrs: Mapping[str, Any]) -> bool | None:
    """True: ``attrs`` carry a record marked complete; False: a record of a conversion that has
    not finished (``convert`` to object storage writes it first and the complete one last, as
    there is no rename there); None: no record."""
    marker = attrs.get(MARKER)
    if not isinstance(marker, Mapping) or not isinstance(marker.get("complete"), bool):
        return None
    return bool(marker["complete"])
