"""The storage layer's entry points: paths and objects in, sources and facts out.

Everything outside :mod:`arrayfeed._storage` reaches storage through these functions and the
capability protocols of :mod:`.base`; the format modules (:mod:`.npy`, :mod:`.hdf5`,
:mod:`.zarr`) are the only places that know a format.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import h5py as _h5py
import numpy as np
import zarr as _zarr

from .._errors import ConfigError, SourceNotFoundError
from . import h5write, hdf5, npy, zarr
from .base import Source, StoredArrays, StoreInfo, Writer
from .memory import ArraySource
from .record import ConversionRecord

__all__ = [
    "array_keys",
    "as_source",
    "create_writer",
    "describe",
    "is_array_like",
    "is_store_dir",
    "open_array",
    "open_for_copy",
    "open_written",
    "split_spec",
    "written_by_arrayfeed",
]

Format = Literal["hdf5", "zarr"]


_CONTAINER_RE = re.compile(
    r"^(?P<path>.+?\.(?:npy|npz|h5|hdf5|he5|hdf|h5ad|nc|nc4|zarr))(?::(?P<key>.*))?$", re.I
)


def split_spec(spec: str) -> tuple[str, str | None]:
    """Split an input spec ``path[:key]`` into its path and key (None when absent).

    >>> split_spec("data/train.h5:images")
    ('data/train.h5', 'images')
    >>> split_spec("x.npy")
    ('x.npy', None)
    >>> split_spec("shards/*.zarr:group/x")
    ('shards/*.zarr', 'group/x')
    """
    match = _CONTAINER_RE.match(spec)
    if match is not None:
        return match["path"], match["key"] or None
    if ":" in spec:
        path, _, key = spec.rpartition(":")
        return path, key or None
    return spec, None


def open_array(
    path: str | os.PathLike[str],
    key: str | None = None,
    *,
    strict: bool | None = None,
    field: str | None = None,
) -> Source:
    """Open an array on disk as a :class:`Source`, without reading its data.

    - ``.npy``: memory-mapped read-only (``key`` must be None).
    - ``.npz``: the array ``key`` (loaded into memory; ``.npz`` members cannot be memory-mapped).
    - HDF5 (``.h5``, ``.hdf5``, ``.h5ad``, ``.nc`` … or any file with the HDF5 signature): the
      dataset at ``key``; ``key`` may be omitted when the file holds exactly one dataset.
    - ``path`` may also name the key itself, as on the command line: ``"file.h5:images"``,
      ``"store.zarr:train/x"``.
    - ``field``: one field of an HDF5 compound (table) dataset, streamed without the others
      (also written ``"file.h5:table#name"``); a sub-array field adds its shape to the rows.
    - Zarr (a directory store): the array itself when ``key`` is None, or the array at ``key``
      inside a group. ``strict=True`` makes a missing chunk an error instead of fill values; the
      default (None) is strict for stores marked complete by arrayfeed (``arrayfeed convert``
      writes every chunk and marks the store) and follows Zarr's semantics for other stores.
      ``strict`` only concerns Zarr.

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(6).reshape(3, 2))
    >>> src = open_array(path)
    >>> src.shape, len(src)
    ((3, 2), 3)
    """
    p = Path(path)
    if not p.exists() and key is None and isinstance(path, str):
        # `file.h5:key`, the input spec of the command line, names the key in the path.
        spec_path, spec_key = split_spec(path)
        if spec_key is not None and Path(spec_path).exists():
            p, key = Path(spec_path), spec_key
    if not p.exists():
        raise SourceNotFoundError(f"nothing at '{p}'; check the path.")
    if key is not None and "#" in key and field is None:
        key, _, field = key.rpartition("#")
    suffix = p.suffix.lower()
    if field is not None and not (suffix in hdf5.SUFFIXES or hdf5.is_hdf5(p)):
        raise ConfigError(
            f"`field` ({field!r}) names a field of an HDF5 compound dataset, but '{p}' is not an "
            "HDF5 file; drop `field`."
        )
    if suffix == ".npy":
        if key is not None:
            raise SourceNotFoundError(
                f"'{p}' is a .npy file, which holds one array; drop `key` ({key!r})."
            )
        return npy.NpySource(p)
    if suffix == ".npz":
        return npy.open_npz(p, key)
    if p.is_dir():
        return zarr.open_zarr(p, key, strict)
    if suffix in hdf5.SUFFIXES or hdf5.is_hdf5(p):
        return hdf5.open_hdf5(p, key, field)
    raise SourceNotFoundError(
        f"'{p}' is not a .npy, .npz, HDF5 file or Zarr store; convert it with `arrayfeed convert`."
    )


def is_array_like(obj: Any) -> bool:
    """True for what arrayfeed accepts as one leaf of `x`, `y` or `sample_weight`."""
    if isinstance(obj, (np.ndarray, _h5py.Dataset, _zarr.Array, str, os.PathLike)):
        return True
    if isinstance(obj, (tuple, list, Mapping)):
        return False
    return isinstance(obj, Source) or hasattr(obj, "__array__")


def as_source(obj: Any, name: str) -> Source:
    """Wrap one array-like as a :class:`Source` (``name`` is used in messages)."""
    if isinstance(obj, np.ndarray):
        return ArraySource(obj, name=name)
    if isinstance(obj, (str, os.PathLike)):
        return open_array(obj)
    if isinstance(obj, _h5py.Dataset):
        return hdf5.h5_source(obj)
    if isinstance(obj, _zarr.Array):
        return zarr.ZarrSource(obj)
    if isinstance(obj, Source):
        return obj
    return ArraySource(np.asarray(obj), name=name)


def open_for_copy(path: Path, key: str | None) -> Source:
    """Like :func:`open_array`, but a ``.npz`` member is streamed rather than loaded whole."""
    if path.suffix.lower() == ".npz" and path.is_file():
        return npy.NpzMemberSource(path, key)
    return open_array(path, key)


def array_keys(path: str | os.PathLike[str]) -> list[str] | None:
    """Every array inside the HDF5 file or Zarr group at ``path``; None for a single array
    (``.npy``, a Zarr array store). ``.npz`` members need a key."""
    p = os.fspath(path)
    if p.lower().endswith((".npy", ".npz")):
        return None
    if hdf5.is_hdf5(p):
        return hdf5.dataset_names(p)
    return zarr.array_names(p)


def describe(path: str | os.PathLike[str]) -> StoreInfo:
    """What the file or store at ``path`` holds, from metadata only."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not os.path.lexists(p):
        raise SourceNotFoundError(f"nothing at '{p}'; check the path.")
    if p.is_dir():
        return zarr.describe(p)
    if p.suffix.lower() == ".npy":
        return npy.describe_npy(p)
    if p.suffix.lower() == ".npz":
        return npy.describe_npz(p)
    if hdf5.is_hdf5(p):
        return hdf5.describe(p)
    raise SourceNotFoundError(
        f"'{p}' is not an HDF5 file, Zarr store, .npy or .npz file, which is what arrayfeed "
        "can inspect."
    )


def is_store_dir(path: Path) -> bool:
    """True for a directory that holds a Zarr store (or is empty)."""
    return zarr.is_zarr_dir(path)


def create_writer(
    fmt: Format,
    path: Path,
    arrays: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]],
    chunk_rows: int | None,
    compression: str,
) -> Writer:
    """A new store at ``path`` with one array of ``(shape, dtype)`` per name (``chunk_rows``
    None: contiguous in HDF5, one chunk of all rows in Zarr)."""
    if fmt == "hdf5":
        return h5write.H5Writer(path, arrays, chunk_rows, compression)
    if fmt == "zarr":
        rows = chunk_rows or max((shape[0] for shape, _ in arrays.values()), default=1)
        return zarr.ZarrWriter(path, arrays, rows, compression)
    raise ConfigError(f"unknown store format {fmt!r}; use 'hdf5' or 'zarr'.")


@contextlib.contextmanager
def open_written(fmt: Format, path: Path, names: list[str]) -> Iterator[StoredArrays]:
    """The store a :func:`create_writer` wrote at ``path``, opened again to check it."""
    opener = h5write.open_written if fmt == "hdf5" else zarr.open_written
    with opener(path, names) as stored:
        yield stored


def written_by_arrayfeed(
    store: str | os.PathLike[str] | Any,
) -> ConversionRecord | None:
    """The :class:`ConversionRecord` of a store :func:`convert` wrote, or None for any other store.

    A store with a record was written complete and verified: every Zarr chunk is stored, so a
    missing chunk (which Zarr would silently read as the fill value) means corruption, and each
    array's CRC-32 can be checked against ``checksums``.

    Args:
        store: Path of an HDF5 file or Zarr store, or an open ``zarr.Group`` / ``h5py`` file or
            group (the record is on the root).

    Raises:
        SourceNotFoundError: Nothing exists at the path.
        CorruptDataError: The record is malformed.

    >>> import numpy as np, tempfile, os, arrayfeed as af
    >>> out = os.path.join(tempfile.mkdtemp(), "data.zarr")
    >>> _ = af.convert({"x": np.zeros((10, 2))}, out, progress=False)
    >>> af.written_by_arrayfeed(out).complete
    True
    """
    if isinstance(store, _h5py.Group):
        return hdf5.read_record(store)
    if isinstance(store, _zarr.Group):
        return zarr.read_record(store)
    path = Path(os.fspath(store))
    if not os.path.lexists(path):
        raise SourceNotFoundError(f"nothing at '{path}'; check the path.")
    if path.is_dir():
        return zarr.read_record(path)
    if hdf5.is_hdf5(path):
        return hdf5.read_record(path)
    return None
