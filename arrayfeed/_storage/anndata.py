"""AnnData's encoded elements in HDF5 (``.h5ad``) and Zarr: sparse matrices and categoricals.

AnnData (and scanpy, which writes through it) records what a group or array encodes in its
``encoding-type`` / ``encoding-version`` attributes; arrayfeed reads those layouts directly,
without the ``anndata`` package:

- **Sparse matrices** (``X``, ``layers/NAME``, ``obsm/NAME``, ``raw/X``): a group with ``data``,
  ``indices`` and ``indptr`` and attributes ``encoding-type: csr_matrix`` and ``shape`` (files
  written before anndata 0.7: ``h5sparse_format: csr`` and ``h5sparse_shape``). Read by rows,
  dense, through :class:`~.sparse.CSRSource`. A ``csc_matrix`` (stored by column) is refused
  with the fix: convert it to CSR.
- **Categoricals** (``obs/COLUMN``, ``var/COLUMN``): the integer codes, with the labels as the
  source's ``categories`` (a tuple of ``str``; code ``-1`` is a missing value). Three layouts:
  a group with ``encoding-type: categorical``, ``codes`` and ``categories`` (anndata 0.8 on);
  a dataset of codes whose ``categories`` attribute points at ``__categories/COLUMN`` (0.7: an
  object reference in HDF5, a path in Zarr); a field of the compound dataset ``obs`` whose
  labels are ``uns/COLUMN_categories`` (before 0.7, HDF5).
- **Facts for inspect**: :func:`annotate` turns the component arrays of these elements, which a
  plain listing shows, into one entry per element (:class:`~.base.ArrayLayout` with
  ``encoding``), and :func:`component_of` names the matrix a ``data``/``indices``/``indptr``
  array belongs to, so that ``convert`` refuses to copy one as rows.

Anything else (dense ``X``, ``obsm/X_pca``) is a plain array, read as any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import zarr as _zarr

from .._errors import ArrayfeedError, CorruptDataError, SourceNotFoundError
from . import hdf5, zarr
from .base import ArrayLayout, Closeable, Source, StoreInfo
from .record import SPARSE_COMPONENTS
from .remote import RemotePath
from .sparse import CSRSource, csr_source, refuse_csc

__all__ = [
    "COMPONENTS",
    "Element",
    "annotate",
    "component_of",
    "node_component_of",
    "open_h5_element",
    "open_zarr_element",
]

#: The arrays of a compressed sparse matrix group.
COMPONENTS = SPARSE_COMPONENTS


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (str, np.str_)):
        return str(value)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "SUO":
        return _text(value[()])
    return None


def sparse_format(attrs: Mapping[str, Any]) -> str | None:
    """``"csr"`` or ``"csc"`` for a group AnnData wrote as a sparse matrix, else None."""
    encoding = _text(attrs.get("encoding-type"))
    if encoding in ("csr_matrix", "csc_matrix"):
        return encoding[:3]
    legacy = _text(attrs.get("h5sparse_format"))
    return legacy if legacy in ("csr", "csc") else None


def _shape(attrs: Mapping[str, Any]) -> tuple[int, int] | None:
    shape = attrs.get("shape", attrs.get("h5sparse_shape"))
    try:
        n_rows, n_cols = (int(n) for n in np.asarray(shape).reshape(-1))
    except (TypeError, ValueError):
        return None
    return n_rows, n_cols


def _labels(values: Any) -> tuple[str, ...]:
    """Category labels as ``str`` (HDF5 returns bytes; numeric categories are formatted)."""
    items = np.asarray(values).reshape(-1).tolist()
    return tuple(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in items)


def _with_categories(source: Source, labels: tuple[str, ...]) -> Source:
    """``source`` (the codes, with every capability of its storage) carrying ``categories``."""
    source.categories = labels  # type: ignore[attr-defined]
    return source


def _sparse_error(path: Path | RemotePath, key: str, attrs: Mapping[str, Any]) -> ArrayfeedError:
    return refuse_csc(f"{path}:{key}", _shape(attrs) or ())


def _missing(path: Path | RemotePath, key: str, what: str) -> CorruptDataError:
    return CorruptDataError(
        f"'{path}:{key}' is {what}, but its parts are missing or not arrays; the file is "
        "damaged or not written by AnnData."
    )


def _element_names(root: Any) -> list[str]:
    """What ``open_array`` reads in an AnnData file: ``X``, layers, ``obsm`` and columns."""
    names = [top for top in ("X", "raw/X") if top in root]
    for group in ("layers", "obsm", "obs", "var"):
        node = root.get(group) if group in root else None
        keys = getattr(node, "keys", None)
        if callable(keys):
            names += [f"{group}/{k}" for k in sorted(keys()) if not str(k).startswith("_")]
        elif node is not None and getattr(node.dtype, "fields", None):
            names += [f"{group}/{k}" for k in node.dtype.fields if k != "index"]
    return names


def _anndata_hint(path: Path | RemotePath, names: list[str]) -> SourceNotFoundError:
    shown = ", ".join(repr(n) for n in names[:12]) + (" …" if len(names) > 12 else "")
    return SourceNotFoundError(
        f"'{path}' is an AnnData file and no `key` names one of its elements; pass one, e.g. "
        f"`open_array('{path}', 'X')` or '{path}:X' as a path. Its elements: {shown}."
    )


# -- HDF5 (.h5ad) -------------------------------------------------------------------------------
def _h5_dataset_source(path: Path, name: str, field: str | None = None) -> Source:
    """A source over dataset ``name`` with a file handle of its own (closing one component never
    closes another's), read as stored (no CF decoding: these are offsets, columns and codes)."""
    f = hdf5.open_h5_file(str(path))
    try:
        node = f.get(name)
        if not isinstance(node, h5py.Dataset):
            raise SourceNotFoundError(f"'{path}' has no dataset {name!r}.")
        return hdf5.h5_source(node, owns_file=True, field=field, decode_cf=False)
    except BaseException:
        f.close()
        raise


def open_h5_element(path: Path, key: str | None) -> Source | None:
    """The AnnData element ``key`` of the HDF5 file at ``path`` when it is encoded (a sparse
    matrix or a categorical), else None (a plain dataset, or not an AnnData layout)."""
    try:
        f = hdf5.open_h5_file(str(path))
    except OSError:
        return None  # open_hdf5 reports it
    with f:
        if key is None:
            if _text(f.attrs.get("encoding-type")) == "anndata":
                raise _anndata_hint(path, _element_names(f))
            return None
        key = key.strip("/")
        node = f.get(key) if key in f else None
        if isinstance(node, h5py.Group):
            fmt = sparse_format(node.attrs)
            if fmt == "csc":
                raise _sparse_error(path, key, node.attrs)
            if fmt == "csr":
                return _h5_csr(path, key, node)
            if _text(node.attrs.get("encoding-type")) == "categorical":
                if not isinstance(node.get("codes"), h5py.Dataset) or "categories" not in node:
                    raise _missing(path, key, "a categorical")
                labels = _labels(node["categories"][()])
                return _with_categories(_h5_dataset_source(path, f"{key}/codes"), labels)
            return None
        if isinstance(node, h5py.Dataset):
            ref = node.attrs.get("categories")
            if isinstance(ref, h5py.Reference) and ref:  # anndata 0.7
                return _with_categories(_h5_dataset_source(path, key), _labels(f[ref][()]))
            return None
        return _h5_table_column(f, path, key)


def _h5_csr(path: Path, key: str, group: h5py.Group) -> CSRSource:
    shape = _shape(group.attrs)
    if shape is None or not all(isinstance(group.get(c), h5py.Dataset) for c in COMPONENTS):
        raise _missing(path, key, "a sparse CSR matrix")
    opened: list[Source] = []
    try:
        for part in COMPONENTS:
            opened.append(_h5_dataset_source(path, f"{key}/{part}"))
        data, indices, indptr = opened
        return csr_source(data, indices, indptr, shape, name=f"{path}:{key}")
    except BaseException:
        for source in opened:
            if isinstance(source, Closeable):
                source.close()
        raise


def _h5_table_column(f: h5py.File, path: Path, key: str) -> Source | None:
    """A column of a compound ``obs``/``var`` dataset (anndata before 0.7), with the labels
    stored as ``uns/COLUMN_categories`` when it is a categorical."""
    table, _, column = key.rpartition("/")
    node = f.get(table) if table and table in f else None
    if not isinstance(node, h5py.Dataset) or column not in (node.dtype.fields or {}):
        return None
    source = _h5_dataset_source(path, table, field=column)
    labels = f.get(f"uns/{column}_categories")
    if isinstance(labels, h5py.Dataset):
        return _with_categories(source, _labels(labels[()]))
    return source


# -- Zarr ---------------------------------------------------------------------------------------
def open_zarr_element(
    path: Path | RemotePath, key: str | None, strict: bool | None = None
) -> Source | None:
    """As :func:`open_h5_element`, for an AnnData Zarr store (local or on object storage)."""
    try:
        root = zarr.open_node(path)
    except Exception:  # not a store: open_zarr reports it
        return None
    if not isinstance(root, _zarr.Group):
        return None
    if key is None:
        if _text(root.attrs.get("encoding-type")) == "anndata":
            raise _anndata_hint(path, _element_names(root))
        return None
    key = key.strip("/")
    try:
        node = root.get(key)
    except Exception:
        node = None
    if isinstance(node, _zarr.Group):
        fmt = sparse_format(node.attrs)
        if fmt == "csc":
            raise _sparse_error(path, key, node.attrs)
        if fmt == "csr":
            shape = _shape(node.attrs)
            parts = [a for a in (node.get(c) for c in COMPONENTS) if isinstance(a, _zarr.Array)]
            if shape is None or len(parts) != len(COMPONENTS):
                raise _missing(path, key, "a sparse CSR matrix")
            data, indices, indptr = (
                zarr.ZarrSource(a, name=f"{path}:{key}/{c}", strict=strict)
                for a, c in zip(parts, COMPONENTS, strict=True)
            )
            return csr_source(data, indices, indptr, shape, name=f"{path}:{key}")
        if _text(node.attrs.get("encoding-type")) == "categorical":
            codes, labels = node.get("codes"), node.get("categories")
            if not isinstance(codes, _zarr.Array) or not isinstance(labels, _zarr.Array):
                raise _missing(path, key, "a categorical")
            source = zarr.ZarrSource(codes, name=f"{path}:{key}/codes", strict=strict)
            return _with_categories(source, _labels(labels[...]))
        return None
    if isinstance(node, _zarr.Array):
        ref = _text(node.attrs.get("categories"))
        if ref:  # anndata 0.7: a path relative to the column's group
            parent = key.rpartition("/")[0]
            labels = root.get(f"{parent}/{ref}".strip("/"))
            if isinstance(labels, _zarr.Array):
                source = zarr.ZarrSource(node, name=f"{path}:{key}", strict=strict)
                return _with_categories(source, _labels(labels[...]))
    return None


# -- facts for inspect and convert --------------------------------------------------------------
@dataclass(frozen=True)
class Element:
    """An encoded element: ``kind`` is ``"csr_matrix"``, ``"csc_matrix"`` or ``"categorical"``;
    ``parts`` are the names of the arrays it is stored in (``codes`` first for a categorical)."""

    name: str
    kind: str
    parts: tuple[str, ...]
    shape: tuple[int, ...] | None = None
    categories: int | None = None


def _h5_elements(f: h5py.File) -> list[Element]:
    found: list[Element] = []

    def visit(name: str, node: Any) -> None:
        if isinstance(node, h5py.Group):
            fmt = sparse_format(node.attrs)
            if fmt is not None:
                parts = tuple(f"{name}/{c}" for c in COMPONENTS if c in node)
                found.append(Element(name, f"{fmt}_matrix", parts, _shape(node.attrs)))
            elif _text(node.attrs.get("encoding-type")) == "categorical":
                labels = node.get("categories")
                n = len(labels) if isinstance(labels, h5py.Dataset) and labels.shape else None
                found.append(
                    Element(name, "categorical", (f"{name}/codes", f"{name}/categories"), None, n)
                )
        elif isinstance(node, h5py.Dataset):
            ref = node.attrs.get("categories")
            if isinstance(ref, h5py.Reference) and ref:
                with contextlib.suppress(Exception):
                    labels = f[ref]
                    found.append(Element(name, "categorical", (name,), None, len(labels)))

    f.visititems(visit)
    return found


def _zarr_elements(root: Any) -> list[Element]:
    found: list[Element] = []
    for name, node in root.members(max_depth=None):
        attrs = node.attrs
        if isinstance(node, _zarr.Group):
            fmt = sparse_format(attrs)
            if fmt is not None:
                parts = tuple(f"{name}/{c}" for c in COMPONENTS if c in node)
                found.append(Element(name, f"{fmt}_matrix", parts, _shape(attrs)))
            elif _text(attrs.get("encoding-type")) == "categorical":
                labels = node.get("categories")
                n = int(labels.shape[0]) if isinstance(labels, _zarr.Array) else None
                found.append(
                    Element(name, "categorical", (f"{name}/codes", f"{name}/categories"), None, n)
                )
        elif _text(attrs.get("categories")):
            parent = name.rpartition("/")[0]
            labels = root.get(f"{parent}/{_text(attrs.get('categories'))}".strip("/"))
            if isinstance(labels, _zarr.Array):
                found.append(Element(name, "categorical", (name,), None, int(labels.shape[0])))
    return found


def elements(path: str | os.PathLike[str]) -> list[Element]:
    """The encoded elements of an HDF5 file or Zarr store (metadata only)."""
    p = Path(path)
    with contextlib.suppress(Exception):
        if p.is_dir():
            root = _zarr.open(store=str(p), mode="r")
            return _zarr_elements(root) if isinstance(root, _zarr.Group) else []
        if hdf5.is_hdf5(p):
            with h5py.File(p, "r") as f:
                return _h5_elements(f)
    return []


def annotate(path: str | os.PathLike[str], info: StoreInfo) -> StoreInfo:
    """``info`` with the component arrays of each encoded element replaced by one entry for
    the element, in the place of its first part."""
    found = elements(path)
    if not found:
        return info
    layouts = {a.name: a for a in info.arrays}
    replace: dict[str, ArrayLayout | None] = {}
    specs = dict(info.specs)
    for element in found:
        first = next((layouts[p] for p in element.parts if p in layouts), None)
        if first is None:
            continue
        merged = _merged(element, [layouts[p] for p in element.parts if p in layouts])
        for part in element.parts:
            replace[part] = None
            specs.pop(part, None)
        replace[first.name] = merged
        specs[element.name] = f"{path}:{element.name}"
    arrays = [replace.get(a.name, a) for a in info.arrays]
    return dataclasses.replace(info, arrays=tuple(a for a in arrays if a is not None), specs=specs)


def _merged(element: Element, parts: list[ArrayLayout]) -> ArrayLayout:
    stored = [a.stored_bytes for a in parts]
    total = sum(s for s in stored if s is not None) if any(s is not None for s in stored) else None
    main = parts[0]
    if element.kind == "categorical":
        return dataclasses.replace(
            main,
            name=element.name,
            stored_bytes=total,
            encoding="categorical",
            categories=element.categories,
        )
    by_name = {a.name.rpartition("/")[2]: a for a in parts}
    data = by_name.get("data", main)
    return dataclasses.replace(
        data,
        name=element.name,
        shape=element.shape or (0, 0),
        stored_bytes=total,
        encoding=element.kind,
        nnz=data.shape[0] if data.shape else 0,
        missing_chunks=sum(a.missing_chunks or 0 for a in parts) or data.missing_chunks,
    )


def component_of(path: str | os.PathLike[str], key: str | None) -> tuple[str, str] | None:
    """``(matrix, part)`` when ``key`` names the ``data``, ``indices`` or ``indptr`` array of a
    sparse matrix group, else None."""
    if key is None:
        return None
    key = key.strip("/")
    group, _, part = key.rpartition("/")
    if part not in COMPONENTS:
        return None
    for element in elements(path):
        if element.name == group and element.kind.endswith("_matrix"):
            return group, part
    return None


def node_component_of(array: Any) -> tuple[str, str] | None:
    """``(matrix, part)`` when ``array`` (an ``h5py.Dataset`` or ``zarr.Array`` a caller opened)
    is the ``data``, ``indices`` or ``indptr`` array of a sparse matrix group, else None."""
    if isinstance(array, h5py.Dataset):
        name = str(array.name or "").strip("/")
        group, _, part = name.rpartition("/")
        if part in COMPONENTS and sparse_format(array.parent.attrs) is not None:
            return group, part
        return None
    if isinstance(array, _zarr.Array):
        group, _, part = str(array.path).strip("/").rpartition("/")
        if part not in COMPONENTS:
            return None
        try:
            parent = _zarr.open_group(store=array.store, path=group, mode="r")
        except Exception:  # no group metadata above it (an array store of its own)
            return None
        return (group, part) if sparse_format(parent.attrs) is not None else None
    return None
