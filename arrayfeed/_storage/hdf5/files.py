"""HDF5 files: how arrayfeed recognises, opens and checks one, whatever it then reads.

- **Recognising.** A file whose name does not say HDF5 (:data:`.backend.SUFFIXES`) is HDF5 when
  it carries the signature (:func:`is_hdf5`).
- **Opening.** A file another process holds open for writing is refused with
  :class:`~arrayfeed.SourceUnavailableError`; a writer in SWMR mode is read through SWMR
  (:func:`open_h5_file`). A file that is not HDF5 is named, a netCDF3 one with the fix
  (:func:`open_readable`).
- **Filters.** A dataset compressed with a filter that this HDF5 build cannot decode is refused
  when its source is created, naming the filter (:func:`check_filters`; h5py itself fails only at
  the first read).
- **Changes** under a source (:func:`h5_fingerprint`), the datasets that hold data
  (:func:`data_names`) and the **record** of ``convert`` (:func:`read_record`).
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from ..._errors import CorruptDataError, SourceUnavailableError
from ..fingerprint import Fingerprint
from ..record import MARKER, ConversionRecord, parse_record
from .cf import is_dimension_placeholder, netcdf3_error
from .codecs import FILTER_NAMES

__all__ = [
    "check_filters",
    "data_names",
    "h5_fingerprint",
    "is_hdf5",
    "open_h5_file",
    "open_readable",
    "read_record",
]


def is_hdf5(path: str | os.PathLike[str]) -> bool:
    """True if the file at ``path`` carries the HDF5 signature."""
    return bool(h5py.is_hdf5(path))


def open_h5_file(path: str, *, swmr: bool = False) -> h5py.File:
    """Open an HDF5 file read-only, through SWMR if a SWMR writer has it open.

    A file that another process holds open for writing without SWMR raises
    :class:`SourceUnavailableError`: HDF5 locks it, and reading it anyway (file locking off) could
    give inconsistent data.
    """
    if swmr:
        return h5py.File(path, "r", swmr=True)
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        message = str(exc)
        if "already open for write" in message:
            try:
                return h5py.File(path, "r", swmr=True)
            except OSError:
                pass
            raise SourceUnavailableError(
                f"HDF5 file '{path}' is open for writing in another process, or a writer that "
                "crashed left it marked open. Wait until the writer closes it (a writer can also "
                "use SWMR mode, which arrayfeed reads); if no process writes it, clear the mark "
                f"with `h5clear -s '{path}'`."
            ) from None
        if "unable to lock file" in message or isinstance(exc, BlockingIOError):
            raise SourceUnavailableError(
                f"HDF5 file '{path}' is locked by another process that has it open for writing. "
                "Wait until the writer closes it, or have the writer use SWMR mode "
                "(`h5py.File(..., libver='latest')` and `f.swmr_mode = True`), which arrayfeed "
                "reads. Do not turn file locking off: a file read while it is written can give "
                "wrong data."
            ) from None
        raise


def open_readable(path: str | os.PathLike[str]) -> h5py.File:
    """:func:`open_h5_file`, with a file that is not HDF5 named: a netCDF3 file with the fix,
    anything else as a :class:`~arrayfeed.CorruptDataError`."""
    try:
        return open_h5_file(os.fspath(path))
    except SourceUnavailableError:
        raise
    except OSError as exc:
        raise netcdf3_error(Path(path)) or CorruptDataError(
            f"cannot open HDF5 file '{path}' for reading ({exc})."
        ) from None


def data_names(group: h5py.Group) -> list[str]:
    """Paths of the datasets in ``group`` that hold data, in visiting order (netCDF4's dimension
    placeholders left out)."""
    names: list[str] = []
    group.visititems(
        lambda name, obj: (
            names.append(name)
            if isinstance(obj, h5py.Dataset) and not is_dimension_placeholder(obj.attrs)
            else None
        )
    )
    return names


def check_filters(dataset: h5py.Dataset, name: str) -> None:
    """Raise :class:`SourceUnavailableError` if a filter of ``dataset`` cannot be decoded here."""
    try:
        plist = dataset.id.get_create_plist()
        filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
    except (OSError, ValueError, RuntimeError):  # pragma: no cover - h5py without filter access
        return
    for code, _flags, _values, stored_name in filters:
        if h5py.h5z.filter_avail(code):
            continue
        label = stored_name.decode(errors="replace") if stored_name else ""
        label = label or FILTER_NAMES.get(code, "unregistered")
        raise SourceUnavailableError(
            f"HDF5 dataset '{name}' is compressed with filter {code} ({label}), which this HDF5 "
            "installation cannot decode. Install the filter plugin (e.g. `pip install "
            "hdf5plugin` and `import hdf5plugin` before opening the file, or set "
            "HDF5_PLUGIN_PATH), or rewrite the dataset with gzip or lzf."
        )


def h5_fingerprint(dataset: h5py.Dataset) -> Fingerprint | None:
    """The fingerprint of the file ``dataset`` is read from (its open descriptor if possible)."""
    file = dataset.file
    if file.driver == "core":
        return None  # an in-memory file: nothing on disk can change under it
    path = str(file.filename)
    mutable = bool(file.swmr_mode) or file.mode != "r"
    try:
        fd = int(file.id.get_vfd_handle())
    except (OSError, ValueError, TypeError, RuntimeError):
        return Fingerprint.of(path, mutable=mutable)
    return Fingerprint.of_fd(fd, path, mutable=mutable)


def read_record(store: str | os.PathLike[str] | h5py.Group) -> ConversionRecord | None:
    """The conversion record on the root of an HDF5 file (a path or an open group), if any."""
    if isinstance(store, h5py.Group):
        return parse_record(store.file.attrs.get(MARKER))
    with h5py.File(store, "r") as f:
        return parse_record(f.attrs.get(MARKER))
