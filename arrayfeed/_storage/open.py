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

from .._errors import ConfigError, SourceNotFoundError, StructureError
from . import anndata, h5describe, h5write, hdf5, lazy, npy, openurl, sparse, zarr, zarrwrite
from .base import Source, SparseLayout, StoredArrays, StoreInfo, Writer
from .memory import ArraySource
from .record import ConversionRecord
from .remote import RemotePath, is_url

__all__ = [
    "array_keys",
    "as_source",
    "as_source_for_copy",
    "create_writer",
    "open_region_writer",
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
    >>> split_spec("s3://bucket/train.zarr:x")
    ('s3://bucket/train.zarr', 'x')
    """
    if is_url(spec):
        return openurl.split_url(spec)
    match = _CONTAINER_RE.match(spec)
    if match is not None:
        return match["path"], match["key"] or None
    if ":" in spec:
        path, _, key = spec.rpartition(":")
        return path, key or None
    return spec, None


def open_array(
    path: str | os.PathLike[str] | RemotePath,
    key: str | None = None,
    *,
    strict: bool | None = None,
    field: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    decode_cf: bool = True,
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

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.arange(6).reshape(3, 2))
    >>> src = open_array(path)
    >>> src.shape, len(src)
    ((3, 2), 3)
    """
    if sparse.is_scipy_sparse(path):
        return sparse.from_scipy(path, "matrix")
    if is_url(path):  # before Path(), which would make 's3://b' 's3:/b'
        remote = openurl.as_remote(path, storage_options)
        return openurl.open_url(remote, key, strict=strict, field=field)
    assert not isinstance(path, RemotePath)
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
    if key is None and field is None and (p.is_dir() or hdf5.is_hdf5(p)):
        if p.is_dir():  # an AnnData file raises here, naming its elements
            anndata.open_zarr_element(p, None, strict)
        else:
            anndata.open_h5_element(p, None)
        key = _whole_matrix_key(p)
    if p.is_dir():
        return anndata.open_zarr_element(p, key, strict) or zarr.open_zarr(p, key, strict)
    if suffix in hdf5.SUFFIXES or hdf5.is_hdf5(p):
        encoded = anndata.open_h5_element(p, key) if field is None else None
        return encoded or hdf5.open_hdf5(p, key, field, decode_cf=decode_cf)
    raise SourceNotFoundError(
        f"'{p}' is not a .npy, .npz, HDF5 file or Zarr store; convert it with `arrayfeed convert`."
    )


def _whole_matrix_key(path: Path) -> str | None:
    """The key to open in a file or store that holds sparse matrices when none is given: its
    one array or matrix (a matrix counts once, not as its three arrays). Raises, naming them,
    when there are several; None when it holds no sparse matrix (the format modules decide)."""
    matrices = [e for e in anndata.elements(path) if e.kind.endswith("_matrix")]
    if not matrices:
        return None
    parts = {part for e in matrices for part in e.parts}
    names = sorted(
        {n for n in array_keys(path) or [] if n not in parts} | {e.name for e in matrices}
    )
    if len(names) == 1:
        return names[0]
    raise SourceNotFoundError(
        f"'{path}' holds {len(names)} arrays and sparse matrices and no `key` names one: "
        f"{names}. Name one: `open_array('{path}', KEY)`, or '{path}:KEY' as a path."
    )


def is_array_like(obj: Any) -> bool:
    """True for what arrayfeed accepts as one leaf of `x`, `y` or `sample_weight`."""
    if isinstance(obj, (np.ndarray, _h5py.Dataset, _zarr.Array, str, os.PathLike, RemotePath)):
        return True
    if isinstance(obj, (tuple, list, Mapping)):
        return False
    return isinstance(obj, Source) or hasattr(obj, "__array__") or sparse.is_scipy_sparse(obj)


def as_source(obj: Any, name: str, *, storage_options: Mapping[str, Any] | None = None) -> Source:
    """Wrap one array-like as a :class:`Source` (``name`` is used in messages; a URL opens with
    ``storage_options``)."""
    if isinstance(obj, np.ndarray):
        return ArraySource(obj, name=name)
    if isinstance(obj, (str, os.PathLike, RemotePath)):
        return open_array(obj, storage_options=storage_options)
    if isinstance(obj, _h5py.Dataset):
        return hdf5.h5_source(obj)
    if isinstance(obj, _zarr.Array):
        return zarr.ZarrSource(obj)
    if isinstance(obj, Source):
        return obj
    if sparse.is_scipy_sparse(obj):
        return sparse.from_scipy(obj, name)
    # dask arrays and xarray DataArrays: read batch by batch, never computed whole
    return lazy.lazy_source(obj, name) or ArraySource(np.asarray(obj), name=name)


def open_for_copy(
    path: Path | str, key: str | None, storage_options: Mapping[str, Any] | None = None
) -> Source:
    """Like :func:`open_array`, but a ``.npz`` member is streamed rather than loaded whole, and
    a component array of a sparse matrix (``X/data``) is refused: copied as rows, it would
    scramble the matrix."""
    if is_url(path):
        return open_array(path, key, storage_options=storage_options)
    path = Path(path)
    if (part := anndata.component_of(path, key)) is not None:
        raise StructureError(
            f"'{path}:{key}' is the `{part[1]}` array of the sparse matrix '{part[0]}', not rows "
            f"of data; copying it alone scrambles the matrix. Name the matrix instead: "
            f"'{path}:{part[0]}' (copied as CSR; dense with `densify=True` / --densify)."
        )
    if path.suffix.lower() == ".npz" and path.is_file():
        return npy.NpzMemberSource(path, key)
    return open_array(path, key)


def as_source_for_copy(obj: Any, name: str) -> Source:
    """Like :func:`as_source`, but an ``h5py.Dataset`` or ``zarr.Array`` that is a component
    array of a sparse matrix (``f["X/data"]``) is refused, as :func:`open_for_copy` refuses it."""
    if (part := anndata.node_component_of(obj)) is not None:
        raise StructureError(
            f"`{name}` is the `{part[1]}` array of the sparse matrix '{part[0]}', not rows of "
            "data; copying it alone scrambles the matrix. Pass the matrix instead: its file and "
            f"key ('FILE:{part[0]}'; copied as CSR, dense with `densify=True` / --densify)."
        )
    return as_source(obj, name)


def array_keys(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> list[str] | None:
    """Every array inside the HDF5 file or Zarr group at ``path``; None for a single array
    (``.npy``, a Zarr array store). ``.npz`` members need a key."""
    if is_url(path):
        return openurl.array_keys_url(openurl.as_remote(path, storage_options))
    p = os.fspath(path)
    if p.lower().endswith((".npy", ".npz")):
        return None
    if hdf5.is_hdf5(p):
        return h5describe.dataset_names(p)
    return zarr.array_names(p)


def describe(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> StoreInfo:
    """What the file or store at ``path`` (or URL) holds, from metadata only."""
    if is_url(path):
        return openurl.describe_url(openurl.as_remote(path, storage_options))
    p = Path(os.path.expanduser(os.fspath(path)))
    if not os.path.lexists(p):
        raise SourceNotFoundError(f"nothing at '{p}'; check the path.")
    if p.is_dir():
        return anndata.annotate(p, zarr.describe(p))
    if p.suffix.lower() == ".npy":
        return npy.describe_npy(p)
    if p.suffix.lower() == ".npz":
        return npy.describe_npz(p)
    if hdf5.is_hdf5(p):
        return anndata.annotate(p, h5describe.describe(p))
    raise SourceNotFoundError(
        f"'{p}' is not an HDF5 file, Zarr store, .npy or .npz file, which is what arrayfeed "
        "can inspect."
    )


def is_store_dir(path: Path) -> bool:
    """True for a directory that holds a Zarr store (or is empty)."""
    return zarr.is_zarr_dir(path)


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
    if fmt == "hdf5":
        if isinstance(path, RemotePath):
            raise ConfigError(
                f"`output` '{path}' is on object storage, where arrayfeed writes Zarr stores "
                "only (an HDF5 file cannot be written in place there); end it in .zarr."
            )
        return h5write.H5Writer(path, arrays, chunk_rows, compression, sparse)
    if fmt == "zarr":
        rows = chunk_rows or max((shape[0] for shape, _ in arrays.values()), default=1)
        return zarrwrite.ZarrWriter(path, arrays, rows, compression, sparse)
    raise ConfigError(f"unknown store format {fmt!r}; use 'hdf5' or 'zarr'.")


def open_region_writer(path: Path | RemotePath) -> Writer:
    """The Zarr store :func:`create_writer` made at ``path``, opened again to write row runs of
    whole chunks into it (a worker of a distributed conversion)."""
    return zarrwrite.ZarrRegionWriter(path)


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
    if fmt == "hdf5":
        assert isinstance(path, Path)
        with h5write.open_written(path, names, groups) as stored:
            yield stored
    else:
        with zarrwrite.open_written(path, names, groups, count_chunks=count_chunks) as stored:
            yield stored


def written_by_arrayfeed(
    store: str | os.PathLike[str] | Any, *, storage_options: Mapping[str, Any] | None = None
) -> ConversionRecord | None:
    """The :class:`ConversionRecord` of a store :func:`convert` wrote, or None for any other store.

    A store with a record was written complete and verified: every Zarr chunk is stored, so a
    missing chunk (which Zarr would silently read as the fill value) means corruption, and each
    array's CRC-32 can be checked against ``checksums``.

    Args:
        store: Path or URL of an HDF5 file or Zarr store, or an open ``zarr.Group`` /
            ``h5py`` file or group (the record is on the root).
        storage_options: For a URL: options of its fsspec filesystem (see :func:`open_array`).

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
    if is_url(store):
        return openurl.record_url(openurl.as_remote(store, storage_options))
    path = Path(os.fspath(store))
    if not os.path.lexists(path):
        raise SourceNotFoundError(f"nothing at '{path}'; check the path.")
    if path.is_dir():
        return zarr.read_record(path)
    if hdf5.is_hdf5(path):
        return hdf5.read_record(path)
    return None
