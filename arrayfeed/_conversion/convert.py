"""``convert``: copy arrays into one HDF5 file or Zarr v3 group laid out for shuffled batch reads.

The conversion streams (:mod:`.copy`): it moves slabs of whole chunks of rows at a time (about
:data:`~.layout.SLAB_BYTES`), so inputs larger than memory convert in bounded memory. It is
atomic: everything is written inside a hidden workspace beside the output (see :mod:`.atomic`),
flushed, read back and checked against the shapes, dtypes and CRC-32 checksums of what was read
from the inputs (:mod:`.verify`), and only then renamed onto the output path.

Every converted store carries a :class:`~arrayfeed.storage.ConversionRecord`, read back by
:func:`arrayfeed.storage.written_by_arrayfeed`. Zarr stores are written *complete* (every chunk
stored, even one equal to the fill value), so a missing chunk in a store that carries the record
is corruption.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import (
    ArrayfeedError,
    ConfigError,
    DestinationError,
    OutputExistsError,
    ShapeError,
)
from .._storage import ConversionRecord, Format, RemotePath, is_store_dir, is_url
from .._validate import flag, optional_integer, seed
from .atomic import Workspace, clean_stale, deferred_interrupts, fsync_dir, fsync_tree, publish
from .copy import Copy
from .inputs import InputLike, Parts, open_input
from .layout import format_bytes, normalize_compression
from .ondask import DaskCopy, check_dask_conversion
from .tourl import check_url_destination, staging_workspace, url_writing, write_to_url
from .verify import verify_copy

__all__ = ["convert"]

_NAME_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_ACCESS_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}


@dataclass(frozen=True, kw_only=True)
class _Options:
    """The knobs of :func:`convert`, validated."""

    output: Path
    chunk_rows: int | None
    compression: str
    overwrite: bool
    shuffle: bool
    seed: int | None
    progress: bool | None
    densify: bool = False
    url: str | None = None  # an output on object storage

    def __post_init__(self) -> None:
        _ = self.format  # validates the suffix
        rows = optional_integer(
            self.chunk_rows,
            "chunk_rows",
            low=1,
            fix="pass None to let arrayfeed choose (on the command line: leave out --chunk-rows).",
        )
        object.__setattr__(self, "chunk_rows", rows)
        for name in ("overwrite", "shuffle", "densify"):
            object.__setattr__(self, name, flag(getattr(self, name), name))
        object.__setattr__(self, "progress", flag(self.progress, "progress", allow_none=True))
        object.__setattr__(self, "seed", seed(self.seed))
        if self.seed is not None and not self.shuffle:
            raise ConfigError(
                f"`seed` ({self.seed}) only applies with `shuffle=True` (command line: "
                "--shuffle); add it, or drop the seed."
            )

    @property
    def format(self) -> Format:
        suffix = (posixpath.splitext(self.url)[1] if self.url else self.output.suffix).lower()
        if suffix in (".h5", ".hdf5"):
            return "hdf5"
        if suffix == ".zarr":
            return "zarr"
        raise ConfigError(
            f"`output` must end in .h5 or .hdf5 (HDF5) or .zarr (Zarr v3) (got "
            f"'{self.url or self.output}'); "
            "rename it."
        )


def convert(
    inputs: Mapping[str, InputLike | Sequence[InputLike]],
    output: str | os.PathLike[str],
    *,
    chunk_rows: int | None = None,
    compression: str | None = None,
    overwrite: bool = False,
    shuffle: bool = False,
    seed: int | None = None,
    progress: bool | None = None,
    densify: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    scheduler: Any = None,
) -> ConversionRecord:
    """Copy arrays into one HDF5 file or Zarr v3 group laid out for fast shuffled batch reads.

    Args:
        inputs: Array name → what to read: an array-like (NumPy array, ``np.memmap``,
            ``h5py.Dataset``, ``zarr.Array``, :func:`open_array` result), a path, or an input
            spec string ``"file.npy"``, ``"file.npz:key"``, ``"file.h5:key"``,
            ``"store.zarr:key"``, where the path may be a glob (``"parts/*.npy"``: every match,
            sorted lexicographically). A list (or tuple) of these is concatenated along axis 0.
            Names are letters, digits, ``_``, ``-`` and ``.``, with ``/`` between groups. Every
            name must have the same number of rows; this is checked before anything is written.
        output: Path ending in ``.h5``/``.hdf5`` (HDF5 file, one dataset per name) or ``.zarr``
            (Zarr v3 group, one array per name), or a URL ending in ``.zarr``
            (``s3://bucket/train.zarr``; see ``storage_options``). Inputs may be URLs too
            (``"s3://bucket/raw.zarr:x"``, ``"s3://bucket/parts/*.npy"``).
        chunk_rows: Rows per chunk, the same for every array (a chunk never splits a row). None
            chooses the largest power of two whose chunks, summed over the arrays, hold at most
            256 KiB (HDF5) or 1 MiB (Zarr); uncompressed HDF5 is then written contiguous
            (unchunked) instead.
        compression: ``None``/``"none"``, ``"lzf"`` (fast) or ``"gzip"`` (small, slower to
            read). HDF5: no filter, the LZF filter, gzip level 4, with the byte-shuffle filter for
            multi-byte dtypes. Zarr: no compressor, Blosc-LZ4 (level 5, byte or bit shuffle)
            standing in for LZF, gzip level 4.
        overwrite: Replace an existing ``output`` (atomically) instead of refusing.
        shuffle: Store rows in one random order shared by all names (row ``i`` of every array
            still belongs together), so that reading runs of rows later is close to a full shuffle.
        seed: Seed of that order (needs ``shuffle=True``); None draws one, kept in the record.
        progress: Draw a progress bar on stderr; None draws it only when stderr is a terminal.
        densify: Sparse matrices (an AnnData CSR group such as ``"data.h5ad:X"``, a
            ``scipy.sparse`` CSR matrix) are copied as CSR: AnnData's ``csr_matrix`` group
            (``data``, ``indices``, ``indptr``; read back with ``open_array(output, name)``,
            anndata or scanpy), every stored entry kept, columns sorted within each row, rows
            shuffled with the rest. With ``densify=True`` they are written as dense arrays of
            their ``data`` dtype instead, read through ``indptr`` a slab of rows at a time (a
            dense copy is often many times larger). Their ``data``/``indices``/``indptr``
            arrays are always refused as inputs (copied alone, they scramble the matrix).
        storage_options: Options of the fsspec filesystem of URL inputs and of a URL ``output``
            (``s3://bucket/train.zarr``: credentials, ``endpoint_url`` …; the environment's
            ``AWS_*`` variables work too). On object storage, which has no rename, the store is
            written with a record marked incomplete (which readers refuse), verified, and
            marked complete last; a failed or interrupted run leaves no store that reads as
            complete, and running it again replaces it. ``overwrite`` there deletes the old
            store first. Only Zarr is written to object storage.
        scheduler: Convert on a Dask cluster: a ``dask.distributed.Client`` or a scheduler
            address (``"tcp://host:8786"``; needs ``pip install "arrayfeed[dask]"``). The
            output is created here; the workers write disjoint runs of whole chunks of it (they
            must reach the inputs and the output: a shared file system or object storage), and
            the copy is verified and marked complete here, byte for byte what one process
            writes. Zarr output only, without ``shuffle``; sparse matrices only with
            ``densify``.

    Returns:
        The :class:`ConversionRecord` stored with the data.

    Raises:
        ConfigError: A bad argument (unknown compression, bad name, output suffix …).
        SourceNotFoundError: An input file, key or glob match is missing.
        ShapeError, DtypeError: Inputs of different lengths, or that cannot be concatenated or fed.
        OutputExistsError: ``output`` exists and ``overwrite`` is False.
        DestinationError: The output directory is missing, not writable, or runs out of space.
        CorruptDataError: An input is unreadable, or the written copy failed verification.

    Nothing is ever left at ``output`` unless the conversion succeeded (an exception, Ctrl-C or a
    full disk leave it as it was, and remove the temporary workspace).

    >>> import numpy as np, tempfile, os, arrayfeed as af
    >>> out = os.path.join(tempfile.mkdtemp(), "train.h5")
    >>> x, y = np.ones((1000, 8), np.float32), np.arange(1000)
    >>> record = af.convert({"x": x, "y": y}, out, compression="lzf", progress=False)
    >>> record.rows, record.chunk_rows
    (1000, 1000)
    >>> af.open_array(out, "x").shape
    (1000, 8)
    """
    url = os.fspath(output) if is_url(output) else None
    options = _Options(
        output=Path(os.path.expanduser(os.fspath(output))) if url is None else Path(),
        url=url,
        chunk_rows=chunk_rows,
        compression=normalize_compression(compression),
        overwrite=overwrite,
        shuffle=shuffle,
        seed=seed,
        progress=progress,
        densify=densify,
    )
    names = _check_names(inputs)
    if scheduler is not None:  # refused before anything is written
        check_dask_conversion(options.format, shuffle=options.shuffle)
    remote = None if url is None else RemotePath(url, storage_options or {})
    workspace = _workspace(options, remote)
    distribute: DaskCopy | None = None
    parts: dict[str, Parts] = {}
    succeeded = False
    try:
        if scheduler is not None:
            distribute = DaskCopy(scheduler)  # connects: closed below if made here
        parts = _open_inputs(inputs, names, storage_options, distribute, options.densify)
        copy = _copy(options, parts, workspace, remote, distribute)
        record = _run(options, copy) if remote is None else write_to_url(remote, copy)
        succeeded = True
        return record
    finally:
        for p in parts.values():
            p.close()
        workspace.remove(settle=0.0 if succeeded else 0.05)
        if distribute is not None:
            distribute.close()


def _workspace(options: _Options, remote: RemotePath | None) -> Workspace:
    """Where the store is built before it is published, made once the destination is checked."""
    if remote is not None:
        check_url_destination(remote, options.format, options.overwrite)
        workspace = staging_workspace(remote)
    else:
        _check_destination(options)
        clean_stale(options.output)
        workspace = Workspace(options.output)
    try:
        workspace.create()
    except OSError as exc:
        raise DestinationError(
            f"cannot write in '{workspace.path.parent}' ({exc.strerror or exc}); choose an "
            "`output` in a writable directory."
        ) from None
    return workspace


def _open_inputs(
    inputs: Mapping[str, Any],
    names: Sequence[str],
    storage_options: Mapping[str, Any] | None,
    distribute: DaskCopy | None,
    densify: bool,
) -> dict[str, Parts]:
    """Every input opened (headers only) and checked against the others and (``distribute``)
    against what a conversion on Dask can copy; those opened are closed again when one fails."""
    parts: dict[str, Parts] = {}
    try:
        for name in names:
            parts[name] = open_input(name, inputs[name], storage_options)
            if distribute is not None:
                _check_sparse_on_dask(parts[name], densify)
        _check_lengths(parts)
    except BaseException:
        for opened in parts.values():
            opened.close()
        raise
    return parts


def _copy(
    options: _Options,
    parts: dict[str, Parts],
    workspace: Workspace,
    remote: RemotePath | None,
    distribute: DaskCopy | None,
) -> Copy:
    """The copy of the open ``parts`` into ``workspace``, with its write errors named for the
    output they were meant for."""
    total = next(iter(parts.values())).n_rows * sum(p.row_bytes for p in parts.values())

    def writing() -> contextlib.AbstractContextManager[None]:
        if remote is not None:
            return url_writing(remote)
        return _writing(options.output, total)

    return Copy(
        options.format,
        parts,
        workspace,
        chunk_rows=options.chunk_rows,
        compression=options.compression,
        seed=Copy.draw_seed(options.seed) if options.shuffle else None,
        progress=options.progress,
        writing=writing,
        distribute=distribute,
        densify=options.densify,
    )


def _run(options: _Options, copy: Copy) -> ConversionRecord:
    """Copy, verify and publish, once the inputs are open and consistent."""
    target = copy.workspace.member("out.h5" if options.format == "hdf5" else "out.zarr")
    with deferred_interrupts() as interrupts:
        if copy.seed is not None:
            copy.stage(interrupts)
        record = copy.write(target, interrupts)
        verify_copy(copy, target, record, options.output, interrupts)
        with copy.writing():
            fsync_tree(target)
            interrupts.shield()
            publish(target, options.output, overwrite=options.overwrite)
            fsync_dir(options.output.parent)
    return record


@contextlib.contextmanager
def _writing(output: Path, total: int) -> Iterator[None]:
    """Report the ``OSError`` of a write in the workspace as what it means for ``output``."""
    try:
        yield
    except ArrayfeedError:
        raise
    except FileExistsError:  # from the final rename: someone else created `output` meanwhile
        raise OutputExistsError(
            f"`output` '{output}' appeared while converting; nothing was replaced. Pass "
            "`overwrite=True` (command line: --overwrite) to replace it."
        ) from None
    except OSError as exc:
        error = _destination_error(exc, output, total)
        if error is exc:
            raise
        raise error from exc


def _errno(exc: OSError) -> int | None:
    """The errno of ``exc``; HDF5 (through h5py) only writes it into the message."""
    if exc.errno is not None:
        return exc.errno
    found = re.search(r"errno = (\d+)", str(exc))
    return int(found.group(1)) if found else None


def _destination_error(exc: OSError, output: Path, total: int) -> OSError:
    code = _errno(exc)
    if code in _SPACE_ERRNOS or "No space left" in str(exc):
        return DestinationError(
            f"no space left on the device of '{output.parent}' while writing `output` "
            f"({format_bytes(total)} before compression); nothing was written to '{output}'. "
            "Free some space or choose another `output`."
        )
    if code == errno.EFBIG:
        return DestinationError(
            f"`output` grew past the largest file allowed here (a file-size limit such as "
            f"`ulimit -f`, or the file system's own) while writing {format_bytes(total)} before "
            f"compression; nothing was written to '{output}'. Raise the limit, or choose an "
            "`output` on a file system that takes larger files (or a .zarr store, which writes "
            "one file per chunk)."
        )
    if code in _ACCESS_ERRNOS:
        return DestinationError(
            f"cannot write in '{output.parent}' ({os.strerror(code)}); nothing was written to "
            f"'{output}'. Choose an `output` in a writable directory."
        )
    return exc


def _check_names(inputs: Any) -> list[str]:
    if not isinstance(inputs, Mapping):
        raise ConfigError(
            f"`inputs` must be a dict of array names to arrays or paths (got a "
            f"{type(inputs).__name__}), e.g. {{'x': 'x.npy', 'y': 'y.npy'}}."
        )
    if not inputs:
        raise ConfigError("`inputs` is empty; give at least one name, e.g. {'x': 'x.npy'}.")
    names = list(inputs)
    for name in names:
        parts = name.split("/") if isinstance(name, str) else [None]
        if not all(isinstance(p, str) and _NAME_PART.match(p) for p in parts) or any(
            str(p).startswith("__") for p in parts
        ):
            raise ConfigError(
                f"`inputs` has the name {name!r}, which cannot name an array; use letters, "
                "digits, '_', '-' and '.' (not first, nor '__' first), with '/' between groups, "
                "e.g. 'x' or 'train/images'."
            )
    for name in names:
        for other in names:
            if other.startswith(name + "/"):
                raise ConfigError(
                    f"`inputs` names both {name!r} and {other!r}; an array cannot also be a group. "
                    "Rename one of them."
                )
    return names


def _check_destination(options: _Options) -> None:
    out = options.output
    parent = out.parent
    if not parent.is_dir():
        raise DestinationError(
            f"the directory of `output` ('{parent}') does not exist; create it first."
        )
    if os.path.lexists(out):
        if not options.overwrite:
            raise OutputExistsError(
                f"`output` '{out}' already exists; pass `overwrite=True` (command line: "
                "--overwrite) to replace it, or choose another path."
            )
        if options.format == "hdf5" and out.is_dir():
            raise DestinationError(
                f"`output` '{out}' is a directory, not an HDF5 file, so arrayfeed will not replace "
                "it; remove it yourself or choose another path."
            )
        if options.format == "zarr" and not is_store_dir(out):
            raise DestinationError(
                f"`output` '{out}' exists and is not a Zarr store, so arrayfeed will not replace "
                "it; remove it yourself or choose another path."
            )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(
            f"cannot write in '{parent}' (not writable by this user, or a read-only file "
            "system); choose an `output` in a writable directory."
        )


def _check_sparse_on_dask(part: Parts, densify: bool) -> None:
    """Refuse a sparse input copied as CSR on Dask: its entries do not split into whole chunks
    per slab, so the workers would share chunks."""
    if part.sparse and not densify:
        rows, cols = part.shape
        raise ConfigError(
            f"`{part.name}` is a sparse CSR matrix ({rows:,} x {cols:,}, {part.nnz:,} stored "
            "values), which a conversion on Dask cannot copy as CSR yet; convert it without "
            "`scheduler`, or pass `densify=True` (command line: --densify) to write it dense."
        )


def _check_lengths(parts: Mapping[str, Parts]) -> None:
    lengths = {name: p.n_rows for name, p in parts.items()}
    if len(set(lengths.values())) > 1:
        first, *rest = lengths.items()
        odd = next((n, r) for n, r in rest if r != first[1])
        listing = ", ".join(f"{n}: {r}" for n, r in lengths.items())
        raise ShapeError(
            f"`inputs[{odd[0]!r}]` has {odd[1]} rows but `inputs[{first[0]!r}]` has {first[1]} "
            f"({listing}); every array must have the same number of rows (axis 0)."
        )
