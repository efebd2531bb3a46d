"""``inspect``: how arrays are stored, whether that suits shuffled batch reads, and how to fix it.

Of every array of a file or store, or of the one a path names (``file.h5:key``). Reads metadata
only (headers, chunk listings), never the data.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._storage import ArrayLayout, ConversionRecord, cache_spec, describe
from .layout import assess, format_bytes
from .specs import locate, pick

__all__ = ["InspectReport", "inspect"]

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")
#: Compressions that store data as it is: HDF5's byte-shuffle filter alone compresses nothing.
_UNCOMPRESSED = frozenset({"none", "shuffle"})


@dataclass(frozen=True, kw_only=True)
class InspectReport:
    """What :func:`inspect` found; ``str(report)`` is the text ``arrayfeed inspect`` prints.

    Attributes:
        path: The file or store inspected (a URL stays a string).
        key: The one array inspected, when ``path`` named one (``file.h5:key``); else None.
        format: ``"HDF5"``, ``"Zarr v3"``, ``"Zarr v2"``, ``".npy"`` or ``".npz"``.
        arrays: Layout of every array, in storage order.
        problems: Why the layout does not suit shuffled batch reads (empty when it does).
        notes: Harmless remarks.
        fixes: ``arrayfeed convert`` commands that would lay the data out well.
        record: What arrayfeed recorded when it wrote the store, if it did.
    """

    path: Path | str
    format: str
    arrays: tuple[ArrayLayout, ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    fixes: tuple[str, ...]
    record: ConversionRecord | None = None
    key: str | None = None

    @property
    def suited(self) -> bool:
        """The layout suits shuffled batch reads."""
        return not self.problems

    def __str__(self) -> str:
        stored = [a.stored_bytes for a in self.arrays if a.stored_bytes is not None]
        count = f"{len(self.arrays)} array{'s' if len(self.arrays) != 1 else ''}"
        where = self.path if self.key is None else f"{self.path}:{self.key}"
        head = f"{where}: {self.format}, {count}"
        if stored:
            head += f", {format_bytes(sum(stored))} stored"
        if self.record is not None:
            rec = self.record
            rows = "contiguous" if rec.chunk_rows is None else f"chunks of {rec.chunk_rows} rows"
            codec = "no compression" if rec.compression == "none" else rec.compression
            shuffled = (
                "" if rec.shuffle_seed is None else f", shuffled with seed {rec.shuffle_seed}"
            )
            head += f" (written by arrayfeed {rec.version}: {rows}, {codec}{shuffled})"
            if not rec.complete:
                head += (
                    "\nUNFINISHED: `arrayfeed convert` has not finished writing this store (or was "
                    "interrupted); readers refuse it. Run the conversion again."
                )
        lines = [head]
        table = [("array", "shape", "dtype", "chunks", "compression", "size", "stored")]
        for a in self.arrays:
            table.append(
                (
                    a.name or "(array)",
                    str(a.shape),
                    _kind(a),
                    ("contiguous" if a.chunks is None else str(a.chunks))
                    + (" (data)" if a.nnz is not None else ""),
                    a.compression,
                    format_bytes(a.nbytes),
                    "?" if a.stored_bytes is None else format_bytes(a.stored_bytes),
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            lines.append(
                "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            )
        if self.suited:
            lines.append("Layout: suited to shuffled batch reads.")
        else:
            lines.append("Layout: NOT suited to shuffled batch reads:")
            lines.extend(f"  - {p}" for p in self.problems)
        if self.notes:
            lines.append("Notes:")
            lines.extend(f"  - {n}" for n in self.notes)
        if self.fixes:
            lines.append("Fix: convert it with")
            lines.extend(f"  {cmd}" for cmd in self.fixes)
        return "\n".join(lines)


def inspect(
    path: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache: str | os.PathLike[str] | bool | None = None,
    cache_limit: int | None = None,
) -> InspectReport:
    """Describe how the arrays in ``path`` are stored and whether that suits shuffled batch reads.

    Reads metadata only. Understands HDF5 files, Zarr stores (groups or lone arrays, v2 or v3),
    ``.npy`` and ``.npz`` files. When the layout does not suit shuffled batch reads, the report
    holds the ``arrayfeed convert`` command that fixes it.

    Args:
        path: The file or store, or its URL (``s3://bucket/train.zarr`` …). It may name one
            array inside, as everywhere else (``"file.h5:group/x"``, ``"store.zarr:x"``,
            ``"data.h5ad:obsm/X_pca"``): the report is then that array's alone, judged as read
            on its own, with the fix that converts it alone (a path that exists as written, a
            file named with a ``:``, is taken whole).
        storage_options: For a URL: options of its fsspec filesystem (credentials,
            ``endpoint_url`` …; see :func:`arrayfeed.open_array`).
        cache, cache_limit: For a URL: the local cache its objects are read through (see
            :func:`arrayfeed.open_array`); an HDF5 file's metadata is then read once.

    Returns:
        An :class:`InspectReport`; print it for the text ``arrayfeed inspect`` shows.

    Raises:
        SourceNotFoundError: Nothing is at ``path``, it is not a format arrayfeed reads, or
            the array it names is not there (the message lists those that are).

    >>> import numpy as np, tempfile, os, h5py, arrayfeed as af
    >>> path = os.path.join(tempfile.mkdtemp(), "data.h5")
    >>> with h5py.File(path, "w") as f:
    ...     _ = f.create_dataset("x", data=np.zeros((10_000, 64), np.float32), chunks=(10, 64))
    >>> report = af.inspect(path)
    >>> report.suited
    False
    >>> report.fixes[0].split(" -o ")[0].endswith("data.h5:x")
    True
    >>> [a.name for a in af.inspect(path + ":x").arrays]
    ['x']
    """
    p, key = locate(path)
    info = describe(p, storage_options, cache_spec(cache, cache_limit))
    layouts = list(info.arrays)
    if key is not None:
        key = pick(p, key, [a.name for a in layouts])
        layouts = [a for a in layouts if a.name == key]
    problems, notes = assess(layouts)
    fixes = _fixes(p, info.convert_suffix, layouts, info.specs) if problems else []
    return InspectReport(
        path=p,
        key=key,
        format=info.format,
        arrays=tuple(layouts),
        problems=tuple(problems),
        notes=tuple(notes),
        fixes=tuple(fixes),
        record=info.record,
    )


def _kind(a: ArrayLayout) -> str:
    """The dtype column: the dtype, and what the array encodes (sparse, categorical)."""
    if a.unreadable is not None:
        return "unreadable"
    if a.encoding in ("csr_matrix", "csc_matrix"):
        return f"{a.dtype} {a.encoding[:3].upper()}, {a.nnz or 0:,} nonzeros"
    if a.encoding == "categorical":
        count = "?" if a.categories is None else f"{a.categories:,}"
        return f"{a.dtype} codes, {count} categories"
    return str(a.dtype)


def _cli_name(name: str, fallback: str) -> str:
    parts = [_NAME_BAD.sub("_", part) for part in (name or fallback).split("/") if part]
    parts = [
        part if part[0].isalnum() and not part.startswith("__") else f"a{part}" for part in parts
    ]
    return "/".join(parts) or "x"


def _fixes(
    path: Path | str, ext: str, layouts: Sequence[ArrayLayout], specs: Mapping[str, str]
) -> list[str]:
    """One ``arrayfeed convert`` command per group of arrays of the same length."""
    groups: dict[int, list[ArrayLayout]] = {}
    for a in layouts:
        if a.encoding == "csc_matrix":
            continue  # to be rewritten as CSR first (see the problems)
        # A CSR matrix is copied as CSR (never its parts as rows).
        dense = bool(a.shape) and a.dtype.kind in "biufc" and a.dtype.fields is None
        if a.encoding == "csr_matrix" or dense:
            groups.setdefault(a.shape[0], []).append(a)
    commands = []
    for i, (_, group) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
        suffix = ".arrayfeed" if i == 0 else f".arrayfeed-{i + 1}"
        if isinstance(path, str):  # a URL: never through Path, which would make 's3:/'
            name = posixpath.basename(path.rstrip("/"))
            stem = posixpath.splitext(name)[0]
            output: Path | str = path.rstrip("/")[: -len(name)] + stem + suffix + ext
        else:
            stem = path.name[: -len(path.suffix)] if path.suffix else path.name
            output = path.with_name(stem + suffix + ext)
        words = ["arrayfeed", "convert"]
        words += [f"{_cli_name(a.name, stem)}={specs[a.name]}" for a in group]
        words += ["-o", str(output)]
        if any(a.compression not in _UNCOMPRESSED for a in group):
            words += ["--compression", "lzf"]
        commands.append(" ".join(shlex.quote(w) for w in words))
    return commands
