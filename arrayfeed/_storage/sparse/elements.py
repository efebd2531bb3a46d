"""AnnData's encoded elements as facts for ``inspect`` and ``convert`` (metadata only).

:func:`elements` lists the sparse matrices and categoricals of a file or store;
:func:`annotate` turns their component arrays, which a plain listing shows, into one entry per
element (:class:`~..layout.ArrayLayout` with ``encoding``); :func:`component_of` and
:func:`node_component_of` name the matrix a ``data``/``indices``/``indptr`` array belongs to, so
that ``convert`` refuses to copy one as rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import zarr

from ..hdf5.files import is_hdf5
from ..layout import ArrayLayout, StoreInfo
from ..remote.paths import RemotePath
from .encoding import COMPONENTS, matrix_shape, sparse_format, text

__all__ = ["Element", "annotate", "component_of", "elements", "node_component_of"]


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
                found.append(Element(name, f"{fmt}_matrix", parts, matrix_shape(node.attrs)))
            elif text(node.attrs.get("encoding-type")) == "categorical":
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
        if isinstance(node, zarr.Group):
            fmt = sparse_format(attrs)
            if fmt is not None:
                parts = tuple(f"{name}/{c}" for c in COMPONENTS if c in node)
                found.append(Element(name, f"{fmt}_matrix", parts, matrix_shape(attrs)))
            elif text(attrs.get("encoding-type")) == "categorical":
                labels = node.get("categories")
                n = int(labels.shape[0]) if isinstance(labels, zarr.Array) else None
                found.append(
                    Element(name, "categorical", (f"{name}/codes", f"{name}/categories"), None, n)
                )
        elif text(attrs.get("categories")):
            parent = name.rpartition("/")[0]
            labels = root.get(f"{parent}/{text(attrs.get('categories'))}".strip("/"))
            if isinstance(labels, zarr.Array):
                found.append(Element(name, "categorical", (name,), None, int(labels.shape[0])))
    return found


def elements(path: str | os.PathLike[str] | RemotePath) -> list[Element]:
    """The encoded elements of a local HDF5 file or Zarr store (metadata only); none for a URL."""
    if isinstance(path, RemotePath):
        return []
    p = Path(path)
    with contextlib.suppress(Exception):
        if p.is_dir():
            root = zarr.open(store=str(p), mode="r")
            return _zarr_elements(root) if isinstance(root, zarr.Group) else []
        if is_hdf5(p):
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


def component_of(
    path: str | os.PathLike[str] | RemotePath, key: str | None
) -> tuple[str, str] | None:
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
    if isinstance(array, zarr.Array):
        group, _, part = str(array.path).strip("/").rpartition("/")
        if part not in COMPONENTS:
            return None
        try:
            parent = zarr.open_group(store=array.store, path=group, mode="r")
        except Exception:  # no group metadata above it (an array store of its own)
            return None
        return (group, part) if sparse_format(parent.attrs) is not None else None
    return None
