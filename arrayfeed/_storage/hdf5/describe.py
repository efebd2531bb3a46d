"""Layout facts of HDF5 files for ``inspect`` and ``bench``: metadata only, never aborting.

Files written by other tools hold datasets this machine cannot read (a dtype NumPy has no
equivalent for, a filter whose plugin is not installed): each is listed with the reason instead
of failing the whole file. netCDF4's dimension placeholders (HDF5 dimension scales that only give
a dimension its length) are not arrays of data and are left out. A file that cannot be opened at
all is named as :func:`.files.open_readable` names it (netCDF3 with the fix, a file a writer
holds, anything else that is not HDF5).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from ..._errors import SourceUnavailableError
from ..layout import ArrayLayout, StoreInfo
from .cf import is_dimension_placeholder
from .codecs import FILTER_NAMES
from .files import check_filters, data_names, open_readable, read_record

__all__ = ["dataset_names", "describe", "describe_filters", "layout_of"]


def describe_filters(dataset: h5py.Dataset) -> str:
    """The filters of ``dataset`` in human form, e.g. ``"shuffle+gzip(4)"`` (``"none"``)."""
    plist = dataset.id.get_create_plist()
    names = []
    for i in range(plist.get_nfilters()):
        code, _flags, values, label = plist.get_filter(i)
        if code == 1:
            names.append(f"gzip({values[0] if len(values) else '?'})")
        elif code in FILTER_NAMES:
            names.append(FILTER_NAMES[code])
        else:
            text = label.decode(errors="replace") if isinstance(label, bytes) else str(label)
            names.append(f"{text or 'filter'} (#{code})")
    return "+".join(names) or "none"


def dataset_names(path: str | os.PathLike[str]) -> list[str]:
    """Paths of every dataset in the HDF5 file at ``path``, in visiting order (netCDF4
    dimension placeholders left out)."""
    with open_readable(path) as f:
        return data_names(f)


def layout_of(dataset: h5py.Dataset) -> ArrayLayout | None:
    """The layout of one dataset; None for a netCDF4 dimension placeholder. A dataset that
    cannot be read here has ``unreadable`` set to the reason."""
    name = dataset.name.lstrip("/")
    if is_dimension_placeholder(dataset.attrs):
        return None
    shape = tuple(dataset.shape or ())
    try:
        dtype = dataset.dtype
    except (TypeError, ValueError, OSError) as exc:  # "No NumPy equivalent for TypeTimeID" …
        return ArrayLayout(
            name=name, shape=shape, dtype=np.dtype("V1"), chunks=None, unreadable=str(exc)
        )
    compression, unreadable = "?", None
    try:
        compression = describe_filters(dataset)
        check_filters(dataset, name)
    except SourceUnavailableError as exc:
        unreadable = str(exc)
    except (OSError, ValueError, RuntimeError) as exc:
        unreadable = f"its filters cannot be read ({exc})"
    stored = None
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        stored = int(dataset.id.get_storage_size())
    return ArrayLayout(
        name=name,
        shape=shape,
        dtype=dtype,
        chunks=dataset.chunks,
        compression=compression,
        stored_bytes=stored,
        unreadable=unreadable,
    )


def describe(path: Path | Any, opened: h5py.File | None = None) -> StoreInfo:
    """Layout of every dataset in the HDF5 file at ``path`` (metadata only); ``opened``: the
    file already open (a URL's, which ``path`` then names)."""
    layouts: list[ArrayLayout] = []
    specs: dict[str, str] = {}
    with contextlib.nullcontext(opened) if opened is not None else open_readable(path) as f:
        record = read_record(f)
        datasets: list[h5py.Dataset] = []
        f.visititems(lambda _, obj: datasets.append(obj) if isinstance(obj, h5py.Dataset) else None)
        for ds in datasets:
            layout = layout_of(ds)
            if layout is not None:
                layouts.append(layout)
                specs[layout.name] = f"{path}:{layout.name}"
    suffix = path.suffix if path.suffix.lower() in (".h5", ".hdf5") else ".h5"
    return StoreInfo(
        format="HDF5", arrays=tuple(layouts), specs=specs, record=record, convert_suffix=suffix
    )
