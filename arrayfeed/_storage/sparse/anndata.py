"""AnnData's encoded elements in HDF5 (``.h5ad``) and Zarr opened as sources: sparse matrices and
categoricals.

AnnData (and scanpy, which writes through it) records what a group or array encodes in its
``encoding-type`` / ``encoding-version`` attributes; arrayfeed reads those layouts directly,
without the ``anndata`` package:

- **Sparse matrices** (``X``, ``layers/NAME``, ``obsm/NAME``, ``raw/X``): a group with ``data``,
  ``indices`` and ``indptr`` and attributes ``encoding-type: csr_matrix`` and ``shape`` (files
  written before anndata 0.7: ``h5sparse_format: csr`` and ``h5sparse_shape``). Read by rows,
  dense, through :class:`~.csr.CSRSource`. A ``csc_matrix`` (stored by column) is refused
  with the fix: convert it to CSR.
- **Categoricals** (``obs/COLUMN``, ``var/COLUMN``): the integer codes, with the labels as the
  source's ``categories`` (a tuple of ``str``; code ``-1`` is a missing value). Three layouts:
  a group with ``encoding-type: categorical``, ``codes`` and ``categories`` (anndata 0.8 on);
  a dataset of codes whose ``categories`` attribute points at ``__categories/COLUMN`` (0.7: an
  object reference in HDF5, a path in Zarr); a field of the compound dataset ``obs`` whose
  labels are ``uns/COLUMN_categories`` (before 0.7, HDF5).
Anything else (dense ``X``, ``obsm/X_pca``) is a plain array, read as any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import zarr

from ..._errors import ArrayfeedError, CorruptDataError, SourceNotFoundError
from ..base import Closeable, Source
from ..hdf5.files import open_h5_file
from ..hdf5.source import h5_source
from ..remote.paths import RemotePath
from ..zarr.nodes import open_node
from ..zarr.source import ZarrSource
from .csr import CSRSource, csr_source, refuse_csc
from .encoding import COMPONENTS, category_labels, matrix_shape, sparse_format, text

__all__ = ["open_h5_element", "open_zarr_element"]


def _with_categories(source: Source, labels: tuple[str, ...]) -> Source:
    """``source`` (the codes, with every capability of its storage) carrying ``categories``."""
    source.categories = labels  # type: ignore[attr-defined]
    return source


def _sparse_error(path: Path | RemotePath, key: str, attrs: Mapping[str, Any]) -> ArrayfeedError:
    return refuse_csc(f"{path}:{key}", matrix_shape(attrs) or ())


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
    f = open_h5_file(str(path))
    try:
        node = f.get(name)
        if not isinstance(node, h5py.Dataset):
            raise SourceNotFoundError(f"'{path}' has no dataset {name!r}.")
        return h5_source(node, owns_file=True, field=field, decode_cf=False)
    except BaseException:
        f.close()
        raise


def open_h5_element(path: Path, key: str | None) -> Source | None:
    """The AnnData element ``key`` of the HDF5 file at ``path`` when it is encoded (a sparse
    matrix or a categorical), else None (a plain dataset, or not an AnnData layout)."""
    try:
        f = open_h5_file(str(path))
    except OSError:
        return None  # open_hdf5 reports it
    with f:
        if key is None:
            if text(f.attrs.get("encoding-type")) == "anndata":
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
            if text(node.attrs.get("encoding-type")) == "categorical":
                if not isinstance(node.get("codes"), h5py.Dataset) or "categories" not in node:
                    raise _missing(path, key, "a categorical")
                labels = category_labels(node["categories"][()])
                return _with_categories(_h5_dataset_source(path, f"{key}/codes"), labels)
            return None
        if isinstance(node, h5py.Dataset):
            ref = node.attrs.get("categories")
            if isinstance(ref, h5py.Reference) and ref:  # anndata 0.7
                return _with_categories(_h5_dataset_source(path, key), category_labels(f[ref][()]))
            return None
        return _h5_table_column(f, path, key)


def _h5_csr(path: Path, key: str, group: h5py.Group) -> CSRSource:
    shape = matrix_shape(group.attrs)
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
        return _with_categories(source, category_labels(labels[()]))
    return source


# -- Zarr ---------------------------------------------------------------------------------------
def open_zarr_element(
    path: Path | RemotePath, key: str | None, strict: bool | None = None
) -> Source | None:
    """As :func:`open_h5_element`, for an AnnData Zarr store (local or on object storage)."""
    try:
        root = open_node(path)
    except Exception:  # not a store: open_zarr reports it
        return None
    if not isinstance(root, zarr.Group):
        return None
    if key is None:
        if text(root.attrs.get("encoding-type")) == "anndata":
            raise _anndata_hint(path, _element_names(root))
        return None
    key = key.strip("/")
    try:
        node = root.get(key)
    except Exception:
        node = None
    if isinstance(node, zarr.Group):
        fmt = sparse_format(node.attrs)
        if fmt == "csc":
            raise _sparse_error(path, key, node.attrs)
        if fmt == "csr":
            shape = matrix_shape(node.attrs)
            parts = [a for a in (node.get(c) for c in COMPONENTS) if isinstance(a, zarr.Array)]
            if shape is None or len(parts) != len(COMPONENTS):
                raise _missing(path, key, "a sparse CSR matrix")
            data, indices, indptr = (
                ZarrSource(a, name=f"{path}:{key}/{c}", strict=strict)
                for a, c in zip(parts, COMPONENTS, strict=True)
            )
            return csr_source(data, indices, indptr, shape, name=f"{path}:{key}")
        if text(node.attrs.get("encoding-type")) == "categorical":
            codes, labels = node.get("codes"), node.get("categories")
            if not isinstance(codes, zarr.Array) or not isinstance(labels, zarr.Array):
                raise _missing(path, key, "a categorical")
            source = ZarrSource(codes, name=f"{path}:{key}/codes", strict=strict)
            return _with_categories(source, category_labels(labels[...]))
        return None
    if isinstance(node, zarr.Array):
        ref = text(node.attrs.get("categories"))
        if ref:  # anndata 0.7: a path relative to the column's group
            parent = key.rpartition("/")[0]
            labels = root.get(f"{parent}/{ref}".strip("/"))
            if isinstance(labels, zarr.Array):
                source = ZarrSource(node, name=f"{path}:{key}", strict=strict)
                return _with_categories(source, category_labels(labels[...]))
    return None
