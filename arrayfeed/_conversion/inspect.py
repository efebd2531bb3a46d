"""``inspect``: how arrays are stored, whether that suits shuffled batch reads, and how to fix it.

Reads metadata only (headers, chunk listings), never the data.
"""

from __future__ import annotations

import os
import re
import shlex
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import zarr

from .._errors import SourceNotFoundError
from .._storage.sources import NpySource
from .convert import ConversionRecord, written_by_arrayfeed
from .inputs import NpzMemberSource
from .layout import ArrayLayout, assess, format_bytes

__all__ = ["InspectReport", "inspect"]

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")
_H5_FILTERS = {2: "shuffle", 3: "fletcher32", 4: "szip", 6: "scaleoffset", 32000: "lzf"}


@dataclass(frozen=True, kw_only=True)
class InspectReport:
    """What :func:`inspect` found; ``str(report)`` is the text ``arrayfeed inspect`` prints.

    Attributes:
        path: The file or store inspected.
        format: ``"HDF5"``, ``"Zarr v3"``, ``"Zarr v2"``, ``".npy"`` or ``".npz"``.
        arrays: Layout of every array, in storage order.
        problems: Why the layout does not suit shuffled batch reads (empty when it does).
        notes: Harmless remarks.
        fixes: ``arrayfeed convert`` commands that would lay the data out well.
        record: What arrayfeed recorded when it wrote the store, if it did.
    """

    path: Path
    format: str
    arrays: tuple[ArrayLayout, ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    fixes: tuple[str, ...]
    record: ConversionRecord | None = None

    @property
    def suited(self) -> bool:
        """The layout suits shuffled batch reads."""
        return not self.problems

    def __str__(self) -> str:
        stored = [a.stored_bytes for a in self.arrays if a.stored_bytes is not None]
        count = f"{len(self.arrays)} array{'s' if len(self.arrays) != 1 else ''}"
        head = f"{self.path}: {self.format}, {count}"
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
        lines = [head]
        table = [("array", "shape", "dtype", "chunks", "compression", "size", "stored")]
        for a in self.arrays:
            table.append(
                (
                    a.name or "(array)",
                    str(a.shape),
                    str(a.dtype),
                    "contiguous" if a.chunks is None else str(a.chunks),
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


def inspect(path: str | os.PathLike[str]) -> InspectReport:
    """Describe how the arrays in ``path`` are stored and whether that suits shuffled batch reads.

    Reads metadata only. Understands HDF5 files, Zarr stores (groups or lone arrays, v2 or v3),
    ``.npy`` and ``.npz`` files. When the layout does not suit shuffled batch reads, the report
    holds the ``arrayfeed convert`` command that fixes it.

    Args:
        path: The file or store.

    Returns:
        An :class:`InspectReport`; print it for the text ``arrayfeed inspect`` shows.

    Raises:
        SourceNotFoundError: Nothing is at ``path``, or it is not a format arrayfeed reads.

    >>> import numpy as np, tempfile, os, h5py, arrayfeed as af
    >>> path = os.path.join(tempfile.mkdtemp(), "data.h5")
    >>> with h5py.File(path, "w") as f:
    ...     _ = f.create_dataset("x", data=np.zeros((10_000, 64), np.float32), chunks=(10, 64))
    >>> report = af.inspect(path)
    >>> report.suited
    False
    >>> report.fixes[0].split(" -o ")[0].endswith("data.h5:x")
    True
    """
    p = Path(os.path.expanduser(os.fspath(path)))
    if not os.path.lexists(p):
        raise SourceNotFoundError(f"nothing at '{p}'; check the path.")
    record: ConversionRecord | None = None
    specs: dict[str, str] = {}
    if p.is_dir():
        fmt, layouts, record, specs = _zarr(p)
        ext = ".zarr"
    elif p.suffix.lower() == ".npy":
        source = NpySource(p)
        layouts = [
            ArrayLayout(
                name="",
                shape=source.shape,
                dtype=source.dtype,
                chunks=None,
                stored_bytes=p.stat().st_size,
            )
        ]
        fmt, ext, specs = ".npy", ".h5", {"": str(p)}
    elif p.suffix.lower() == ".npz":
        fmt, layouts, specs = ".npz", *_npz(p)
        ext = ".h5"
    elif h5py.is_hdf5(p):
        fmt, layouts, record, specs = _hdf5(p)
        ext = p.suffix if p.suffix.lower() in (".h5", ".hdf5") else ".h5"
    else:
        raise SourceNotFoundError(
            f"'{p}' is not an HDF5 file, Zarr store, .npy or .npz file, which is what arrayfeed "
            "can inspect."
        )
    problems, notes = assess(layouts)
    fixes = _fixes(p, ext, layouts, specs) if problems else []
    return InspectReport(
        path=p,
        format=fmt,
        arrays=tuple(layouts),
        problems=tuple(problems),
        notes=tuple(notes),
        fixes=tuple(fixes),
        record=record,
    )


def _hdf5(path: Path) -> tuple[str, list[ArrayLayout], ConversionRecord | None, dict[str, str]]:
    layouts: list[ArrayLayout] = []
    specs: dict[str, str] = {}
    with h5py.File(path, "r") as f:
        record = written_by_arrayfeed(f)
        datasets: list[h5py.Dataset] = []
        f.visititems(lambda _, obj: datasets.append(obj) if isinstance(obj, h5py.Dataset) else None)
        for ds in datasets:
            name = ds.name.lstrip("/")
            layouts.append(
                ArrayLayout(
                    name=name,
                    shape=ds.shape,
                    dtype=ds.dtype,
                    chunks=ds.chunks,
                    compression=_h5_filters(ds),
                    stored_bytes=int(ds.id.get_storage_size()),
                )
            )
            specs[name] = f"{path}:{name}"
    return "HDF5", layouts, record, specs


def _h5_filters(ds: h5py.Dataset) -> str:
    plist = ds.id.get_create_plist()
    names = []
    for i in range(plist.get_nfilters()):
        code, _flags, values, label = plist.get_filter(i)
        if code == 1:
            names.append(f"gzip({values[0] if len(values) else '?'})")
        elif code in _H5_FILTERS:
            names.append(_H5_FILTERS[code])
        else:
            text = label.decode(errors="replace") if isinstance(label, bytes) else str(label)
            names.append(f"{text or 'filter'} (#{code})")
    return "+".join(names) or "none"


def _zarr(path: Path) -> tuple[str, list[ArrayLayout], ConversionRecord | None, dict[str, str]]:
    try:
        node = zarr.open(store=str(path), mode="r")
    except Exception as exc:  # zarr raises several unrelated types for a non-store directory
        raise SourceNotFoundError(
            f"'{path}' is a directory but not a Zarr store ({exc})."
        ) from None
    record: ConversionRecord | None = None
    if isinstance(node, zarr.Group):
        record = written_by_arrayfeed(node)
        arrays = sorted(
            (name, member)
            for name, member in node.members(max_depth=None)
            if isinstance(member, zarr.Array)
        )
        fmt = f"Zarr v{node.metadata.zarr_format}"
    else:
        arrays = [("", node)]
        fmt = f"Zarr v{node.metadata.zarr_format}"
    strict = record is not None and record.complete
    layouts = []
    specs = {}
    for name, array in arrays:
        layouts.append(
            ArrayLayout(
                name=name,
                shape=array.shape,
                dtype=np.dtype(array.dtype),
                chunks=array.chunks,
                compression=_zarr_codecs(array),
                stored_bytes=int(array.nbytes_stored()),
                missing_chunks=int(array.nchunks - array.nchunks_initialized),
                strict=strict,
            )
        )
        specs[name] = f"{path}:{name}" if name else str(path)
    return fmt, layouts, record, specs


def _zarr_codecs(array: Any) -> str:
    names = []
    for codec in array.compressors:
        label = (
            getattr(codec, "codec_id", None) or type(codec).__name__.removesuffix("Codec").lower()
        )
        detail = [
            str(getattr(codec, attr))
            for attr in ("cname", "clevel", "level")
            if hasattr(codec, attr)
        ]
        detail = [d.rsplit(".", 1)[-1] for d in detail]
        names.append(f"{label}({','.join(detail)})" if detail else str(label))
    return "+".join(names) or "none"


def _npz(path: Path) -> tuple[list[ArrayLayout], dict[str, str]]:
    layouts = []
    specs = {}
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
    except (zipfile.BadZipFile, OSError) as exc:
        raise SourceNotFoundError(f"'{path}' is not a readable .npz file ({exc}).") from None
    for key, info in infos.items():
        member = NpzMemberSource(path, key)
        layouts.append(
            ArrayLayout(
                name=key,
                shape=member.shape,
                dtype=member.dtype,
                chunks=None,
                compression="deflate" if info.compress_type == zipfile.ZIP_DEFLATED else "none",
                stored_bytes=info.compress_size,
                loads_whole=True,
            )
        )
        specs[key] = f"{path}:{key}"
    return layouts, specs


def _cli_name(name: str, fallback: str) -> str:
    parts = [_NAME_BAD.sub("_", part) for part in (name or fallback).split("/") if part]
    parts = [
        part if part[0].isalnum() and not part.startswith("__") else f"a{part}" for part in parts
    ]
    return "/".join(parts) or "x"


def _fixes(
    path: Path, ext: str, layouts: Sequence[ArrayLayout], specs: dict[str, str]
) -> list[str]:
    """One ``arrayfeed convert`` command per group of arrays of the same length."""
    groups: dict[int, list[ArrayLayout]] = {}
    for a in layouts:
        if a.shape and a.dtype.kind in "biufc" and a.dtype.fields is None:
            groups.setdefault(a.shape[0], []).append(a)
    commands = []
    for i, (_, group) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
        suffix = ".arrayfeed" if i == 0 else f".arrayfeed-{i + 1}"
        stem = path.name[: -len(path.suffix)] if path.suffix else path.name
        output = path.with_name(stem + suffix + ext)
        words = ["arrayfeed", "convert"]
        words += [f"{_cli_name(a.name, stem)}={specs[a.name]}" for a in group]
        words += ["-o", str(output)]
        if any(a.compression not in ("none", "shuffle") for a in group):
            words += ["--compression", "lzf"]
        commands.append(" ".join(shlex.quote(w) for w in words))
    return commands
