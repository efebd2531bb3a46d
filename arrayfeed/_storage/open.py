"""The storage layer's entry points: paths, URLs and objects in, sources and facts out.

Everything outside :mod:`arrayfeed._storage` reaches storage through these functions and the
capability protocols of :mod:`.base`. Each is a loop over the format registry
(:func:`.registry.backends`): the backend that claims a location by its name, else the one that
detects it by what it holds, opens it, lists it, describes it or reads its record; the backends
that read elements encoded inside another family's files (AnnData's) are asked first. Formats are
named here only in the messages for a path that no backend knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError, SourceNotFoundError
from .base import Source
from .layout import SparseLayout, StoredArrays, StoreInfo, Writer
from .record import ConversionRecord
from .registry import Backend, Format, Location, OpenOptions, backends, writer_backend
from .remote.cachespec import CacheSpec, cache_spec
from .remote.errors import looking_at
from .remote.paths import RemotePath, as_remote, is_url
from .specs import split_spec, split_url

__all__ = [
    "Format",
    "array_keys",
    "as_source",
    "as_source_for_copy",
    "create_writer",
    "describe",
    "is_array_like",
    "is_store_dir",
    "open_array",
    "open_for_copy",
    "open_region_writer",
    "open_source",
    "open_written",
    "written_by_arrayfeed",
]

#: Anything a path may be given as.
PathLike = str | os.PathLike[str] | RemotePath


def open_array(
    path: PathLike,
    key: str | None = None,
    *,
    strict: bool | None = None,
    field: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    decode_cf: bool = True,
    cache: str | os.PathLike[str] | bool | None = None,
    cache_limit: int | None = None,
) -> Source:
    """Open an array on disk as a :class:`~arrayfeed.storage.Source`, without reading its data.

    - ``.npy``: memory-mapped read-only (``key`` must be None).
    - ``.npz``: the array ``key`` (loaded into memory; ``.npz`` members cannot be memory-mapped).
    - HDF5 (``.h5``, ``.hdf5``, ``.h5ad``, ``.nc`` … or any file with the HDF5 signature): the
      dataset at ``key``; ``key`` may be omitted when the file holds exactly one dataset.
    - ``path`` may also name the key itself, as on the command line: ``"file.h5:images"``,
      ``"store.zarr:train/x"``.
    - ``field``: one field of an HDF5 compound (table) dataset, streamed without the others
      (also written ``"file.h5:table#name"``); a sub-array field adds its shape to the rows.
    - AnnData (``.h5ad`` or Zarr): a sparse CSR group (``"X"``, ``"layers/counts"``) reads as
      dense rows of its ``data`` dtype, through ``indptr`` (never the whole matrix); a
      categorical (``"obs/cell_type"``) as its integer codes, with the labels as
      ``source.categories``. A ``scipy.sparse`` CSR matrix may be passed as ``path`` itself.
    - Zarr (a directory store): the array itself when ``key`` is None, or the array at ``key``
      inside a group. ``strict=True`` makes a missing chunk an error instead of fill values; the
      default (None) is strict for stores marked complete by arrayfeed (``arrayfeed convert``
      writes every chunk and marks the store) and follows Zarr's semantics for other stores.
      ``strict`` only concerns Zarr.
    - netCDF4 (``.nc``, HDF5 inside): variables packed or masked by CF attributes
      (``scale_factor``, ``add_offset``, ``_FillValue``, ``missing_value``, ``_Unsigned``) are
      decoded as xarray and netCDF4 decode them (floats; fill values become NaN) unless
      ``decode_cf=False``, which gives the stored values. netCDF3 files are refused with the fix.
    - A URL (``s3://bucket/train.zarr:x``, ``gs://``, ``az://``, ``https://`` or any fsspec
      protocol; needs ``pip install "arrayfeed[remote]"``): a Zarr store (read with many chunk
      requests in flight), an HDF5 file (read-only, through ranged requests) or a ``.npy`` file.
      ``storage_options`` go to the fsspec filesystem (``{"endpoint_url": ..., "key": ...,
      "secret": ...}`` for S3); credentials and endpoint may also come from the environment
      (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` …). The source
      pickles as the URL and options, so other processes open it again.
    - ``cache``: for a URL, a directory on local disk (or True: ``arrayfeed`` under the user's
      cache directory) where the objects read are kept, for every process of the host (loader
      processes, other datasets, other jobs and ranks), so that each is fetched once; at most
      ``cache_limit`` bytes (default: half the free disk there), least recently used out first.
      Every copy is checked when read (size, CRC-32C, and the object's ETag, size and
      modification time as the store reports them now, at open); a bad or stale one is fetched
      again. :func:`arrayfeed.cache_report` says what it holds and did. Off by default.

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(6).reshape(3, 2))
    >>> src = open_array(path)
    >>> src.shape, len(src)
    ((3, 2), 3)
    """
    options = OpenOptions(strict=strict, field=field, decode_cf=decode_cf)
    return _open(path, key, options, storage_options, cache_spec(cache, cache_limit))


def open_source(
    path: PathLike,
    key: str | None,
    storage_options: Mapping[str, Any] | None = None,
    cache: CacheSpec | None = None,
) -> Source:
    """:func:`open_array` with its default options, a URL read through ``cache`` (see
    :func:`~.remote.cachespec.cache_spec`) if given."""
    return _open(path, key, OpenOptions(), storage_options, cache)


def open_for_copy(
    path: Path | str, key: str | None, storage_options: Mapping[str, Any] | None = None
) -> Source:
    """Like :func:`open_array`, but a ``.npz`` member is streamed rather than loaded whole, and
    a component array of a sparse matrix (``X/data``) is refused: copied as rows, it would
    scramble the matrix."""
    location = path if is_url(path) else Path(path)  # a path, not a spec: no key split off
    return _open(location, key, OpenOptions(for_copy=True), storage_options)


def _open(
    path: PathLike,
    key: str | None,
    options: OpenOptions,
    storage_options: Mapping[str, Any] | None,
    cache: CacheSpec | None = None,
) -> Source:
    if not isinstance(path, (str, os.PathLike, RemotePath)):
        for backend in backends():  # an object standing for a file (a scipy.sparse matrix)
            if (source := backend.open_object(path)) is not None:
                return source
    location, key = _locate(path, key, storage_options, cache)
    if key is not None and "#" in key and options.field is None:
        key, _, field = key.rpartition("#")
        options = dataclasses.replace(options, field=field)
    family = _family(location)
    if options.field is not None and (family is None or not family.reads_fields):
        readers = " or ".join(b.label for b in backends() if b.reads_fields)
        raise ConfigError(
            f"`field` ({options.field!r}) names a field of an {readers} compound dataset, but "
            f"'{location}' is not an {readers} file; drop `field`."
        )
    if family is None:
        raise _unknown(location)
    for backend in backends():  # encoded elements before the plain arrays they are stored as
        if (source := backend.open_element(location, key, options, family)) is not None:
            return source
    return family.open(location, key, options)


def _locate(
    path: PathLike,
    key: str | None,
    storage_options: Mapping[str, Any] | None,
    cache: CacheSpec | None = None,
) -> tuple[Location, str | None]:
    """Where ``path`` is, and the key, which a spec ``path:key`` may name in the path."""
    if is_url(path):  # before Path(), which would make 's3://b' 's3:/b'
        location = as_remote(path, storage_options, cache)
        if key is None:
            url, key = split_url(location.url)
            location = dataclasses.replace(location, url=url)
        return location, key
    assert not isinstance(path, RemotePath)
    p = Path(path)
    if not p.exists() and key is None and isinstance(path, str):
        # `file.h5:key`, the input spec of the command line, names the key in the path.
        spec_path, spec_key = split_spec(path)
        if spec_key is not None and Path(spec_path).exists():
            p, key = Path(spec_path), spec_key
    if not p.exists():
        raise SourceNotFoundError(f"nothing at '{p}'; check the path.")
    return p, key


def _family(location: Location) -> Backend | None:
    """The backend of the format at ``location``: the first that claims it by its name, else
    the first that detects it by what it holds; None for a local file nobody knows. A URL
    nobody knows, or one that cannot be looked at, raises a named error."""
    known = backends()
    for backend in known:
        if backend.claims(location):
            return backend
    if not isinstance(location, RemotePath):
        return next((b for b in known if b.detects(location)), None)
    with looking_at(location):
        for backend in known:
            if backend.detects(location):
                return backend
    raise SourceNotFoundError(
        f"'{location}' is not a Zarr store, HDF5 file or .npy file, which is what arrayfeed reads "
        "from URLs; convert it with `arrayfeed convert`."
    )


def _unknown(location: Location) -> SourceNotFoundError:
    """The error for a local path no backend knows (the formats named are those users meet)."""
    if isinstance(location, Path) and not os.path.lexists(location):
        return SourceNotFoundError(f"nothing at '{location}'; check the path.")
    others = [b.label for b in backends() if not type(b).__module__.startswith(__package__)]
    installed = f" (or, from installed packages, {', '.join(others)})" if others else ""
    return SourceNotFoundError(
        f"'{location}' is not a .npy, .npz, HDF5 file or Zarr store{installed}; convert it with "
        "`arrayfeed convert`."
    )


def is_array_like(obj: Any) -> bool:
    """True for what arrayfeed accepts as one leaf of `x`, `y` or `sample_weight`."""
    if isinstance(obj, (str, os.PathLike, RemotePath)):
        return True
    if isinstance(obj, (tuple, list, Mapping)):
        return False
    # The backends first: the protocol check reads attributes (a closed h5py.Dataset raises).
    return any(b.recognises(obj) for b in backends()) or isinstance(obj, Source)


def as_source(
    obj: Any,
    name: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache: CacheSpec | None = None,
) -> Source:
    """Wrap one array-like as a :class:`Source` (``name`` is used in messages; a URL opens with
    ``storage_options``, through ``cache`` if given: see :func:`cache_spec`)."""
    return _as_source(obj, name, storage_options, for_copy=False, cache=cache)


def as_source_for_copy(obj: Any, name: str) -> Source:
    """Like :func:`as_source`, but an ``h5py.Dataset`` or ``zarr.Array`` that is a component
    array of a sparse matrix (``f["X/data"]``) is refused, as :func:`open_for_copy` refuses it."""
    return _as_source(obj, name, None, for_copy=True)


def _as_source(
    obj: Any,
    name: str,
    storage_options: Mapping[str, Any] | None,
    *,
    for_copy: bool,
    cache: CacheSpec | None = None,
) -> Source:
    if isinstance(obj, (str, os.PathLike, RemotePath)):
        return open_source(obj, None, storage_options, cache)
    known = backends()
    # The backends first: the protocol check reads attributes (a closed h5py.Dataset raises).
    for backend in known:
        if (source := backend.source_of(obj, name, for_copy=for_copy)) is not None:
            return source
    if isinstance(obj, Source):
        return obj
    for backend in known:  # anything else NumPy can make an array of
        if (source := backend.load(obj, name)) is not None:
            return source
    raise TypeError(f"`{name}` ({type(obj).__name__}) is not an array.")  # pragma: no cover


def array_keys(
    path: PathLike,
    storage_options: Mapping[str, Any] | None = None,
    cache: CacheSpec | None = None,
) -> list[str] | None:
    """Every array inside the HDF5 file or Zarr group at ``path``; None for a single array
    (``.npy``, a Zarr array store). ``.npz`` members need a key."""
    location = _where(path, storage_options, cache, must_exist=False)
    family = _family(location)
    if family is None:
        raise _unknown(location)
    return family.array_keys(location)


def describe(
    path: PathLike,
    storage_options: Mapping[str, Any] | None = None,
    cache: CacheSpec | None = None,
) -> StoreInfo:
    """What the file or store at ``path`` (or URL) holds, from metadata only (an HDF5 file's
    read through ``cache``, if given)."""
    location = _where(path, storage_options, cache)
    family = _family(location)
    if family is None:
        raise SourceNotFoundError(
            f"'{location}' is not an HDF5 file, Zarr store, .npy or .npz file, which is what "
            "arrayfeed can inspect."
        )
    info = family.describe(location)
    for backend in backends():
        info = backend.annotate(location, info, family)
    return info


def _where(
    path: PathLike,
    storage_options: Mapping[str, Any] | None,
    cache: CacheSpec | None = None,
    *,
    must_exist: bool = True,
) -> Location:
    """``path`` as a location (a local path expanded, and checked to exist)."""
    if is_url(path):
        return as_remote(path, storage_options, cache)
    assert not isinstance(path, RemotePath)
    location = Path(os.path.expanduser(os.fspath(path)))
    if must_exist and not os.path.lexists(location):
        raise SourceNotFoundError(f"nothing at '{location}'; check the path.")
    return location


def is_store_dir(path: Path) -> bool:
    """True for a directory that holds a store written as a directory (Zarr), or is empty."""
    return any(b.is_store_dir(path) for b in backends())


def create_writer(
    fmt: Format,
    path: Path | RemotePath,
    arrays: Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]],
    chunk_rows: int | None,
    compression: str,
    sparse: Mapping[str, SparseLayout] | None = None,
) -> Writer:
    """A new store at ``path`` with one array of ``(shape, dtype)`` per name (``chunk_rows``
    None: contiguous in HDF5, one chunk of all rows in Zarr), and a CSR group per name of
    ``sparse``. Object storage (a :class:`RemotePath`) takes Zarr only."""
    return writer_backend(fmt).create_writer(path, arrays, chunk_rows, compression, sparse)


def open_region_writer(path: Path | RemotePath, fmt: Format = "zarr") -> Writer:
    """The store :func:`create_writer` made at ``path``, opened again to write row runs of
    whole chunks into it (a worker of a distributed conversion)."""
    return writer_backend(fmt).open_region_writer(path)


@contextlib.contextmanager
def open_written(
    fmt: Format,
    path: Path | RemotePath,
    names: list[str],
    groups: list[str] | None = None,
    *,
    count_chunks: bool = True,
) -> Iterator[StoredArrays]:
    """The store a :func:`create_writer` wrote at ``path``, opened again to check it: arrays
    ``names`` and the attributes of ``groups`` (``count_chunks=False``: without
    ``missing_chunks``, which lists every Zarr chunk key)."""
    backend = writer_backend(fmt)
    with backend.open_written(path, names, groups, count_chunks=count_chunks) as stored:
        yield stored


def written_by_arrayfeed(
    store: str | os.PathLike[str] | Any, *, storage_options: Mapping[str, Any] | None = None
) -> ConversionRecord | None:
    """The :class:`~arrayfeed.storage.ConversionRecord` of a store :func:`~arrayfeed.convert`
    wrote, or None for any other store.

    A store with a record was written complete and verified: every Zarr chunk is stored, so a
    missing chunk (which Zarr would silently read as the fill value) means corruption, and each
    array's CRC-32 can be checked against ``checksums``.

    Args:
        store: Path or URL of an HDF5 file or Zarr store, or an open ``zarr.Group`` /
            ``h5py`` file or group (the record is on the root).
        storage_options: For a URL: options of its fsspec filesystem (see
            :func:`~arrayfeed.open_array`).

    Raises:
        SourceNotFoundError: Nothing exists at the path.
        CorruptDataError: The record is malformed.

    >>> import numpy as np, tempfile, os, arrayfeed as af
    >>> from arrayfeed.storage import written_by_arrayfeed
    >>> out = os.path.join(tempfile.mkdtemp(), "data.zarr")
    >>> _ = af.convert({"x": np.zeros((10, 2))}, out, progress=False)
    >>> written_by_arrayfeed(out).complete
    True
    """
    for backend in backends():
        if backend.is_group(store):
            return backend.read_record(store)
    if is_url(store):
        location: Location = as_remote(store, storage_options)
    else:
        location = Path(os.fspath(store))
        if not os.path.lexists(location):
            raise SourceNotFoundError(f"nothing at '{location}'; check the path.")
    family = _family(location)
    return family.read_record(location) if family is not None else None
