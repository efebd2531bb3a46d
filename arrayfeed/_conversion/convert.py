"""``convert``: copy arrays into one HDF5 file or Zarr v3 group laid out for shuffled batch reads.

The conversion streams: it moves whole chunks of rows at a time (about 64 MiB, see
:data:`arrayfeed._layout.BLOCK_TARGET_BYTES`), so inputs larger than memory convert in bounded
memory. It is atomic: everything is written inside a hidden workspace beside the output (see
:mod:`arrayfeed._atomic`), flushed, read back and checked against the shapes, dtypes and CRC-32
checksums of what was read from the inputs, and only then renamed onto the output path.

Every converted store carries a record (:class:`ConversionRecord`) under the attribute
``"arrayfeed"`` (Zarr: on the root group; HDF5: a JSON string on the root group), read back by
:func:`written_by_arrayfeed`. Zarr stores are written *complete* (every chunk stored, even one
equal to the fill value), so a missing chunk in a store that carries the record is corruption.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
import sys
import time
import zlib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
import zarr
from zarr.codecs import BloscCodec, GzipCodec

from .._errors import (
    ArrayfeedError,
    ConfigError,
    CorruptDataError,
    DestinationError,
    OutputExistsError,
    ShapeError,
    SourceNotFoundError,
)
from .._pipeline.permutation import derive_key, permute
from .._storage.sources import ArraySource
from .atomic import (
    Interrupts,
    Workspace,
    clean_stale,
    deferred_interrupts,
    fsync_dir,
    fsync_tree,
    publish,
)
from .inputs import InputLike, Parts, open_input
from .layout import (
    CHUNK_TARGET_BYTES,
    block_rows,
    choose_chunk_rows,
    format_bytes,
    normalize_compression,
)
from .progress import Progress

__all__ = ["MARKER", "TEST_HOOK_ENV", "ConversionRecord", "convert", "written_by_arrayfeed"]

#: Name of the attribute that holds the :class:`ConversionRecord` of a converted store.
MARKER = "arrayfeed"
#: Version of the record's JSON layout.
RECORD_FORMAT = 1
#: **Test hook**, not for users: seconds to sleep after each block, with blocks of one chunk, so
#: that tests can interrupt a conversion in the middle of writing.
TEST_HOOK_ENV = "ARRAYFEED_TEST_HOOK_SLOW_WRITE"

#: Most rows moved at a time, whatever their size (bounds the index arrays of a shuffle).
_MAX_BLOCK_ROWS = 1 << 20
_GZIP_LEVEL = 4
_NAME_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_ACCESS_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}

Format = Literal["hdf5", "zarr"]


@dataclass(frozen=True, kw_only=True)
class ConversionRecord:
    """What :func:`convert` wrote, stored with the data; read back by :func:`written_by_arrayfeed`.

    Attributes:
        version: arrayfeed version that wrote the store.
        complete: Every row and (Zarr) every chunk was written and verified.
        rows: Rows of every array.
        chunk_rows: Rows per chunk of every array; None when the arrays are contiguous (HDF5).
        compression: ``"none"``, ``"lzf"`` or ``"gzip"`` (the Zarr codecs are named in
            :func:`convert`).
        shuffle_seed: Seed of the shared row permutation, or None when rows kept their order.
        checksums: Per array, ``zlib.crc32`` of its rows in order, C-contiguous, little-endian.
    """

    version: str
    complete: bool
    rows: int
    chunk_rows: int | None
    compression: str
    shuffle_seed: int | None
    checksums: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-compatible values (what is stored)."""
        return {
            "format": RECORD_FORMAT,
            "version": self.version,
            "complete": self.complete,
            "rows": self.rows,
            "chunk_rows": self.chunk_rows,
            "compression": self.compression,
            "shuffle_seed": self.shuffle_seed,
            "checksum": "crc32",
            "checksums": dict(self.checksums),
        }

    @classmethod
    def from_json(cls, data: Any) -> ConversionRecord:
        """Parse what :meth:`to_json` stored; raise :class:`CorruptDataError` if malformed."""
        try:
            if isinstance(data, (str, bytes)):
                data = json.loads(data)
            if data.get("format") != RECORD_FORMAT:
                raise ValueError(f"unknown record format {data.get('format')!r}")
            return cls(
                version=str(data["version"]),
                complete=bool(data["complete"]),
                rows=int(data["rows"]),
                chunk_rows=None if data["chunk_rows"] is None else int(data["chunk_rows"]),
                compression=str(data["compression"]),
                shuffle_seed=None if data["shuffle_seed"] is None else int(data["shuffle_seed"]),
                checksums={str(k): int(v) for k, v in data["checksums"].items()},
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptDataError(
                f"the {MARKER!r} attribute is not a record written by arrayfeed ({exc}); the store "
                "was changed by another program, convert it again."
            ) from None


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

    def __post_init__(self) -> None:
        _ = self.format  # validates the suffix
        if self.chunk_rows is not None and (
            isinstance(self.chunk_rows, bool)
            or not isinstance(self.chunk_rows, int)
            or self.chunk_rows < 1
        ):
            raise ConfigError(
                f"`chunk_rows` must be a positive int or None (got {self.chunk_rows!r}); pass None "
                "to let arrayfeed choose (on the command line: leave out --chunk-rows)."
            )
        for name in ("overwrite", "shuffle"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"`{name}` must be True or False (got {getattr(self, name)!r}).")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ConfigError(f"`progress` must be True, False or None (got {self.progress!r}).")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise ConfigError(f"`seed` must be an int or None (got {self.seed!r}).")
            if not self.shuffle:
                raise ConfigError(
                    f"`seed` ({self.seed}) only applies with `shuffle=True` (command line: "
                    "--shuffle); add it, or drop the seed."
                )

    @property
    def format(self) -> Format:
        suffix = self.output.suffix.lower()
        if suffix in (".h5", ".hdf5"):
            return "hdf5"
        if suffix == ".zarr":
            return "zarr"
        raise ConfigError(
            f"`output` must end in .h5 or .hdf5 (HDF5) or .zarr (Zarr v3) (got '{self.output}'); "
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
            (Zarr v3 group, one array per name).
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
    options = _Options(
        output=Path(os.path.expanduser(os.fspath(output))),
        chunk_rows=chunk_rows,
        compression=normalize_compression(compression),
        overwrite=overwrite,
        shuffle=shuffle,
        seed=seed,
        progress=progress,
    )
    names = _check_names(inputs)
    _check_destination(options)
    clean_stale(options.output)
    workspace = Workspace(options.output)
    try:
        workspace.create()
    except OSError as exc:
        raise DestinationError(
            f"cannot write in '{options.output.parent}' ({exc.strerror or exc}); choose an "
            "`output` in a writable directory."
        ) from None
    opened: list[Parts] = []
    succeeded = False
    try:
        parts: dict[str, Parts] = {}
        for name in names:
            parts[name] = open_input(name, inputs[name])
            opened.append(parts[name])
        _check_lengths(parts)
        record = _Conversion(options, parts, workspace).run()
        succeeded = True
        return record
    finally:
        for p in opened:
            p.close()
        workspace.remove(settle=0.0 if succeeded else 0.05)


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


def _destination_error(exc: OSError, output: Path, total: int) -> OSError:
    text = str(exc)
    if exc.errno in _SPACE_ERRNOS or "No space left" in text or "errno = 28" in text:
        return DestinationError(
            f"no space left on the device of '{output.parent}' while writing `output` "
            f"({format_bytes(total)} before compression); nothing was written to '{output}'. "
            "Free some space or choose another `output`."
        )
    if exc.errno in _ACCESS_ERRNOS:
        return DestinationError(
            f"cannot write in '{output.parent}' ({exc.strerror}); nothing was written to "
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
        if options.format == "zarr" and not _is_zarr_dir(out):
            raise DestinationError(
                f"`output` '{out}' exists and is not a Zarr store, so arrayfeed will not replace "
                "it; remove it yourself or choose another path."
            )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(
            f"cannot write in '{parent}' (not writable by this user, or a read-only file "
            "system); choose an `output` in a writable directory."
        )


def _is_zarr_dir(path: Path) -> bool:
    if not path.is_dir():
        return False
    markers = ("zarr.json", ".zgroup", ".zarray")
    return any((path / m).exists() for m in markers) or not any(path.iterdir())


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


def _le_bytes(rows: np.ndarray) -> memoryview:
    if sys.byteorder == "big" and rows.dtype.itemsize > 1:
        rows = rows.astype(rows.dtype.newbyteorder("<"))
    return np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data


class _Checksums:
    """Running CRC-32 of each array's rows, computed on a helper thread while rows are written.

    ``zlib.crc32`` releases the GIL, so checksums overlap with reading and writing. At most one
    earlier block waits for its checksum, which bounds the memory held.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.values = dict.fromkeys(names, 0)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrayfeed-crc")
        self._pending: deque[Future[None]] = deque()

    def add(self, name: str, rows: np.ndarray) -> None:
        """Fold ``rows`` (not to be modified until :meth:`result`) into the checksum of ``name``."""
        while len(self._pending) >= len(self.values):
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._update, name, rows))

    def _update(self, name: str, rows: np.ndarray) -> None:
        self.values[name] = zlib.crc32(_le_bytes(rows), self.values[name])

    def result(self) -> dict[str, int]:
        while self._pending:
            self._pending.popleft().result()
        return dict(self.values)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class _H5Writer:
    def __init__(
        self, path: Path, parts: Mapping[str, Parts], chunk_rows: int | None, compression: str
    ) -> None:
        self.file = h5py.File(path, "w")
        self.datasets: dict[str, h5py.Dataset] = {}
        for name, p in parts.items():
            options: dict[str, Any] = {}
            if chunk_rows is not None:
                options["chunks"] = (chunk_rows, *p.row_shape)
            if compression != "none":
                options["compression"] = compression
                if compression == "gzip":
                    options["compression_opts"] = _GZIP_LEVEL
                options["shuffle"] = p.dtype.itemsize > 1
            self.datasets[name] = self.file.create_dataset(
                name, shape=p.shape, dtype=p.dtype, track_times=False, **options
            )

    def write(self, name: str, start: int, rows: np.ndarray) -> None:
        self.datasets[name][start : start + len(rows)] = rows

    def finish(self, record: ConversionRecord) -> None:
        self.file.attrs[MARKER] = json.dumps(record.to_json())
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _zarr_compressors(compression: str) -> Any:
    if compression == "lzf":
        return [BloscCodec(cname="lz4", clevel=5)]
    if compression == "gzip":
        return [GzipCodec(level=_GZIP_LEVEL)]
    return None


class _ZarrWriter:
    def __init__(
        self, path: Path, parts: Mapping[str, Parts], chunk_rows: int, compression: str
    ) -> None:
        self.group = zarr.open_group(str(path), mode="w", zarr_format=3)
        self.arrays: dict[str, Any] = {}
        for name, p in parts.items():
            self.arrays[name] = self.group.create_array(
                name,
                shape=p.shape,
                dtype=p.dtype,
                chunks=(chunk_rows, *p.row_shape),
                compressors=_zarr_compressors(compression),
                config={"write_empty_chunks": True},
            )

    def write(self, name: str, start: int, rows: np.ndarray) -> None:
        self.arrays[name][start : start + len(rows)] = rows

    def finish(self, record: ConversionRecord) -> None:
        self.group.attrs[MARKER] = record.to_json()

    def close(self) -> None:
        pass


_Writer = _H5Writer | _ZarrWriter


def _write_block(writer: _Writer, name: str, start: int, rows: np.ndarray) -> None:
    """Write ``rows`` of array ``name`` at row ``start`` (one place, so tests can fail it)."""
    writer.write(name, start, rows)


class _Conversion:
    """One run of :func:`convert` once its inputs are open and consistent."""

    def __init__(self, options: _Options, parts: dict[str, Parts], workspace: Workspace) -> None:
        self.options = options
        self.parts = parts
        self.workspace = workspace
        self.n_rows = next(iter(parts.values())).n_rows
        self.row_bytes = sum(p.row_bytes for p in parts.values())
        target = CHUNK_TARGET_BYTES[options.format]
        layout_rows = options.chunk_rows or choose_chunk_rows(
            self.row_bytes, self.n_rows, target_bytes=target
        )
        layout_rows = min(layout_rows, self.n_rows)
        contiguous = (
            options.format == "hdf5" and options.compression == "none" and not options.chunk_rows
        )
        self.chunk_rows: int | None = None if contiguous else layout_rows
        self.step = block_rows(layout_rows, self.row_bytes, self.n_rows)
        if self.step > _MAX_BLOCK_ROWS:
            self.step = max(layout_rows, _MAX_BLOCK_ROWS // layout_rows * layout_rows)
        self.pause = _test_hook_pause()
        if self.pause is not None:
            self.step = layout_rows
        self.seed = None
        if options.shuffle:
            self.seed = options.seed if options.seed is not None else secrets.randbits(63)

    def _blocks(self) -> list[tuple[int, int]]:
        return [(a, min(a + self.step, self.n_rows)) for a in range(0, self.n_rows, self.step)]

    def run(self) -> ConversionRecord:
        options = self.options
        target = self.workspace.member("out.h5" if options.format == "hdf5" else "out.zarr")
        with deferred_interrupts() as interrupts:
            if self.seed is not None:
                self._stage(interrupts)
            record = self._write(target, interrupts)
            self._verify(target, record, interrupts)
            with self._writing():
                fsync_tree(target)
                interrupts.shield()
                publish(target, options.output, overwrite=options.overwrite)
                fsync_dir(options.output.parent)
        return record

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        return _writing(self.options.output, self.n_rows * self.row_bytes)

    def _stage(self, interrupts: Interrupts) -> None:
        """Copy inputs that are slow to gather from at random into files in the workspace.

        The copies are written with ordinary writes (a write through a memory map would crash
        the process with SIGBUS on a full disk) and then memory-mapped read-only.
        """
        slow = {name: p for name, p in self.parts.items() if not p.gatherable}
        if not slow:
            return
        directory = self.workspace.member("stage")
        total = sum(p.n_rows * p.row_bytes for p in slow.values())
        with Progress(total, label="staging", enabled=self.options.progress) as bar:
            for i, (name, p) in enumerate(slow.items()):
                path = directory / f"{i}.bin"
                with self._writing():
                    directory.mkdir(exist_ok=True)
                    with open(path, "wb") as f:
                        for a, b in self._blocks():
                            rows = p.read_run(a, b)
                            with self._writing():
                                f.write(rows.data)
                            bar.update((b - a) * p.row_bytes)
                            interrupts.checkpoint()
                staged = np.memmap(path, dtype=p.dtype, mode="r", shape=p.shape)
                self.parts[name] = Parts(p.name, [ArraySource(staged, name=str(path))])
                p.close()

    def _write(self, target: Path, interrupts: Interrupts) -> ConversionRecord:
        options = self.options
        writer: _Writer
        with self._writing():
            if options.format == "hdf5":
                writer = _H5Writer(target, self.parts, self.chunk_rows, options.compression)
            else:
                layout_rows = self.chunk_rows or self.n_rows
                writer = _ZarrWriter(target, self.parts, layout_rows, options.compression)
        checksums = _Checksums(list(self.parts))
        key = derive_key(self.seed) if self.seed is not None else 0
        total = self.n_rows * self.row_bytes
        try:
            with Progress(total, label="writing", enabled=options.progress) as bar:
                for a, b in self._blocks():
                    order = None
                    if self.seed is not None:
                        order = permute(np.arange(a, b, dtype=np.int64), self.n_rows, key)
                    for name, p in self.parts.items():
                        rows = p.read_run(a, b) if order is None else p.gather(order)
                        checksums.add(name, rows)
                        with self._writing():
                            _write_block(writer, name, a, rows)
                    bar.update((b - a) * self.row_bytes)
                    interrupts.checkpoint()
                    if self.pause is not None:
                        time.sleep(self.pause)
                        interrupts.checkpoint()
            from .. import __version__

            record = ConversionRecord(
                version=__version__,
                complete=True,
                rows=self.n_rows,
                chunk_rows=self.chunk_rows,
                compression=options.compression,
                shuffle_seed=self.seed,
                checksums=checksums.result(),
            )
            with self._writing():
                writer.finish(record)
                writer.close()  # flushes
        except BaseException:
            with contextlib.suppress(Exception):
                writer.close()
            raise
        finally:
            checksums.close()
        return record

    def _verify(self, target: Path, record: ConversionRecord, interrupts: Interrupts) -> None:
        """Read the written copy back and check it against what was read from the inputs."""
        total = self.n_rows * self.row_bytes
        with Progress(total, label="verifying", enabled=self.options.progress) as bar:
            if self.options.format == "hdf5":
                with h5py.File(target, "r") as f:
                    stored = f.attrs.get(MARKER)
                    self._check_arrays({n: f[n] for n in self.parts}, record, bar, interrupts)
            else:
                group = zarr.open_group(str(target), mode="r")
                stored = group.attrs.get(MARKER)
                arrays: dict[str, Any] = {n: group[n] for n in self.parts}
                for name, array in arrays.items():
                    if array.nchunks_initialized != array.nchunks:
                        self._fail(
                            f"`{name}` has {array.nchunks_initialized} of {array.nchunks} chunks"
                        )
                self._check_arrays(arrays, record, bar, interrupts)
        if stored is None or ConversionRecord.from_json(stored) != record:
            self._fail("the stored record differs from what was written")

    def _check_arrays(
        self,
        arrays: Mapping[str, Any],
        record: ConversionRecord,
        bar: Progress,
        interrupts: Interrupts,
    ) -> None:
        for name, p in self.parts.items():
            array = arrays[name]
            if tuple(array.shape) != p.shape or np.dtype(array.dtype) != p.dtype:
                self._fail(
                    f"`{name}` reads back as {tuple(array.shape)} {np.dtype(array.dtype)}, "
                    f"not {p.shape} {p.dtype}"
                )
        running = _Checksums(list(self.parts))
        try:
            for a, b in self._blocks():
                for name in self.parts:
                    running.add(name, np.asarray(arrays[name][a:b]))
                bar.update((b - a) * self.row_bytes)
                interrupts.checkpoint()
            checksums = running.result()
        finally:
            running.close()
        for name, crc in checksums.items():
            if crc != record.checksums[name]:
                self._fail(
                    f"`{name}` reads back with CRC-32 {crc:08x}, not {record.checksums[name]:08x}"
                )

    def _fail(self, what: str) -> None:
        raise CorruptDataError(
            f"verifying the converted copy failed: {what}; nothing was written to "
            f"'{self.options.output}'. Check the disk and convert again."
        )


def _test_hook_pause() -> float | None:
    value = os.environ.get(TEST_HOOK_ENV)
    if not value:
        return None
    try:
        pause = float(value)
    except ValueError:
        raise ConfigError(
            f"{TEST_HOOK_ENV} (a test hook) must be a number of seconds (got {value!r}); unset it."
        ) from None
    return pause if math.isfinite(pause) and pause >= 0 else None


def written_by_arrayfeed(
    store: str | os.PathLike[str] | zarr.Group | h5py.Group,
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
    raw: Any = None
    if isinstance(store, h5py.Group):
        raw = store.file.attrs.get(MARKER)
    elif isinstance(store, zarr.Group):
        raw = store.attrs.get(MARKER)
    else:
        path = Path(os.fspath(store))
        if not os.path.lexists(path):
            raise SourceNotFoundError(f"nothing at '{path}'; check the path.")
        if path.is_dir():
            try:
                node = zarr.open(store=str(path), mode="r")
            except Exception:  # zarr raises several unrelated types for a non-store directory
                return None
            raw = node.attrs.get(MARKER) if isinstance(node, zarr.Group) else None
        elif h5py.is_hdf5(path):
            with h5py.File(path, "r") as f:
                raw = f.attrs.get(MARKER)
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode()
    return ConversionRecord.from_json(raw)
