"""The format registry: one :class:`Backend` per format family, asked in turn by :mod:`.open`.

Modelled on xarray's ``BackendEntrypoint``. Each format family is a subpackage of
``arrayfeed._storage`` whose ``__init__`` registers one backend (``register(NpyBackend())``); the
entry points of :mod:`.open` loop over :func:`backends` and never name a format. A backend says

- how it recognises a location (a local :class:`~pathlib.Path` or a
  :class:`~.remote.paths.RemotePath`): by its name (:meth:`Backend.claims`: a suffix, a
  directory), else by looking inside (:meth:`Backend.detects`: a signature, metadata), and an
  object (:meth:`Backend.recognises`: an ``h5py.Dataset``, a ``zarr.Array`` …);
- how it opens one (:meth:`Backend.open`, :meth:`Backend.source_of`), lists its arrays, describes
  their layout and reads the conversion record;
- for the formats ``convert`` writes, how it creates a writer and reopens what was written.

Backends are asked in :attr:`Backend.order`. It matters in three places: a backend that reads
elements encoded inside another family's files (AnnData's sparse matrices inside HDF5 and Zarr,
:meth:`Backend.open_element`) is asked before that family opens a plain array; Zarr looks at a URL
for its metadata before HDF5 reads its signature; and the NumPy backend, which loads any object
NumPy can make an array of, comes last.

Every subpackage is imported (and so registered) the first time :func:`backends` is called, so a
new format is one subpackage: its backend, registered in its ``__init__``. Another package adds a
format without touching arrayfeed, as xarray's ``xarray.backends`` do: an entry point of the group
``arrayfeed.backends`` (:data:`ENTRY_POINTS`) naming its :class:`Backend` subclass (or an
instance), registered in the same call, after the subpackages. A built-in name is not replaced,
and an entry point that fails to load gives a :class:`PluginWarning` naming it, never an error:
one broken package must not stop every other format from opening. A backend module
imports its format's library (h5py, zarr) and heavier modules only in the methods that use them
(and recognises an object of that library with :func:`loaded`), as xarray's entry points do:
opening a ``.npy`` file, or starting a loader process that reads one, imports neither.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import pkgutil
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from .._errors import ConfigError
from .base import Source
from .layout import SparseLayout, StoredArrays, StoreInfo, Writer
from .record import ConversionRecord
from .remote.paths import RemotePath

__all__ = [
    "ENTRY_POINTS",
    "Arrays",
    "Backend",
    "Format",
    "Location",
    "OpenOptions",
    "PluginWarning",
    "backends",
    "loaded",
    "register",
    "suffixes",
    "unregister",
    "writer_backend",
]

#: Where a store is: a local path or a URL with its storage options.
Location = Path | RemotePath

#: The formats ``convert`` writes (the names of the backends that write).
Format = Literal["hdf5", "zarr"]

#: Arrays a writer creates: name -> ``(shape, dtype)``.
Arrays = Mapping[str, tuple[tuple[int, ...], np.dtype[Any]]]

#: The entry point group through which another package adds a format.
ENTRY_POINTS = "arrayfeed.backends"


class PluginWarning(RuntimeWarning):
    """A backend another package declares in the entry point group ``arrayfeed.backends`` is
    not used (it failed to load, is not a :class:`Backend`, or takes a name already registered).
    The message names the entry point and the package; every other format still opens."""


@dataclass(frozen=True, kw_only=True)
class OpenOptions:
    """How :func:`~.open.open_array` was asked to open an array (see its arguments).

    Attributes:
        strict: A missing Zarr chunk is an error (None: when the store is marked complete).
        field: One field of a compound dataset.
        decode_cf: Decode netCDF/CF-packed values.
        for_copy: Opened to be copied by ``convert``: stream what would be loaded whole, and
            refuse what copied as rows would scramble (a component array of a sparse matrix).
    """

    strict: bool | None = None
    field: str | None = None
    decode_cf: bool = True
    for_copy: bool = False


class Backend:
    """One format family's entry points. Subclasses override what their format does; the
    defaults say "not mine" (False, None) or refuse."""

    #: The family's name (``"hdf5"``, ``"zarr"`` …); a writing format's name is a :data:`Format`.
    name: ClassVar[str]
    #: The family's name in messages (``"HDF5"``).
    label: ClassVar[str]
    #: Lower is asked first (see the module docstring).
    order: ClassVar[int]
    #: File name suffixes taken as this format without looking inside (lower case, with the dot);
    #: ``file.h5:key`` specs are recognised by them.
    suffixes: ClassVar[frozenset[str]] = frozenset()
    #: Reads one field of a compound dataset (``open_array(..., field=)``).
    reads_fields: ClassVar[bool] = False
    #: ``convert`` writes this format.
    writes: ClassVar[bool] = False

    # -- recognising -------------------------------------------------------------------------
    def claims(self, location: Location) -> bool:
        """Whether ``location`` is of this format by its name alone (by default: a file, or any
        URL, ending in one of :attr:`suffixes`)."""
        suffix = location.suffix.lower()
        if suffix not in self.suffixes:
            return False
        return isinstance(location, RemotePath) or not location.is_dir()

    def detects(self, location: Location) -> bool:
        """Whether ``location``, which no backend claims by name, is of this format by what it
        holds (a signature, metadata). May raise for a URL: the caller names the error."""
        return False

    def recognises(self, obj: Any) -> bool:
        """Whether ``obj`` is an array of this family (an ``h5py.Dataset`` …)."""
        return False

    # -- opening -----------------------------------------------------------------------------
    def open(self, location: Location, key: str | None, options: OpenOptions) -> Source:
        """The array ``key`` at ``location``, which this backend claims or detects."""
        raise NotImplementedError(f"the {self.label} backend opens no files")

    def open_element(
        self, location: Location, key: str | None, options: OpenOptions, container: Backend
    ) -> Source | None:
        """An element encoded inside a file of ``container``'s format (AnnData's sparse matrix
        in HDF5), asked before ``container`` opens ``key`` as a plain array; None: not one."""
        return None

    def open_object(self, obj: Any) -> Source | None:
        """``obj`` given to ``open_array`` in place of a path (a ``scipy.sparse`` matrix), or
        None."""
        return None

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        """``obj`` as a source (``name`` for messages), or None when it is not this family's."""
        return None

    def load(self, obj: Any, name: str) -> Source | None:
        """Any other object, which neither a backend nor the ``Source`` protocol takes, loaded
        as a source (NumPy: what ``np.asarray`` makes an array of); None: not by this backend."""
        return None

    # -- facts -------------------------------------------------------------------------------
    def array_keys(self, location: Location) -> list[str] | None:
        """Every array inside ``location``; None when it holds one array only."""
        return None

    def describe(self, location: Location) -> StoreInfo:
        """What ``location`` holds, from metadata only."""
        raise NotImplementedError(f"the {self.label} backend describes no files")

    def annotate(self, location: Location, info: StoreInfo, container: Backend) -> StoreInfo:
        """``info`` (what ``container`` described) with this backend's encoded elements shown
        as one entry each."""
        return info

    def is_group(self, obj: Any) -> bool:
        """Whether ``obj`` is an open file or group of this format (whose root holds a record)."""
        return False

    def read_record(self, store: Location | Any) -> ConversionRecord | None:
        """The conversion record at ``store`` (a location, or an open group), or None."""
        return None

    def is_store_dir(self, path: Path) -> bool:
        """Whether the directory ``path`` holds a store of this format (a converted output
        there may be replaced)."""
        return False

    # -- writing -----------------------------------------------------------------------------
    def create_writer(
        self,
        path: Location,
        arrays: Arrays,
        chunk_rows: int | None,
        compression: str,
        sparse: Mapping[str, SparseLayout] | None,
    ) -> Writer:
        """A new store at ``path`` (see :func:`~.open.create_writer`)."""
        raise ConfigError(f"arrayfeed does not write {self.label} stores.")

    def open_region_writer(self, path: Location) -> Writer:
        """The store :meth:`create_writer` made, opened to write whole chunks into it."""
        raise ConfigError(f"{self.label} stores cannot be written by several workers.")

    def open_written(
        self,
        path: Location,
        names: list[str],
        groups: list[str] | None,
        *,
        count_chunks: bool,
    ) -> contextlib.AbstractContextManager[StoredArrays]:
        """The store :meth:`create_writer` wrote, opened again to check it."""
        raise ConfigError(f"arrayfeed does not write {self.label} stores.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


_REGISTERED: dict[str, Backend] = {}
_ORDERED: list[tuple[Backend, ...]] = []  # the sorted registry, once every subpackage is imported
_LOCK = threading.Lock()
_PLUGINS_ASKED: list[bool] = []  # set once the entry points have been loaded (or are loading)
# Reentrant: a plugin's module may list the backends (or register one) while it is imported.
_PLUGINS_LOCK = threading.RLock()


def register(backend: Backend) -> None:
    """Add ``backend`` to the registry (a backend of the same name is replaced)."""
    with _LOCK:
        _REGISTERED[backend.name] = backend
        _ORDERED.clear()


def unregister(name: str) -> None:
    """Remove the backend ``name`` (tests register backends of their own)."""
    with _LOCK:
        _REGISTERED.pop(name, None)
        _ORDERED.clear()


def backends() -> tuple[Backend, ...]:
    """Every registered backend, in :attr:`Backend.order`; the first call imports every
    subpackage of the storage layer, each of which registers its format's backend."""
    ordered = _ORDERED[0] if _ORDERED else None
    if ordered is not None:
        return ordered
    for module in _subpackages():
        importlib.import_module(module)
    _load_plugins()
    with _LOCK:
        if not _ORDERED:
            _ORDERED.append(tuple(sorted(_REGISTERED.values(), key=lambda b: (b.order, b.name))))
        return _ORDERED[0]


def _load_plugins() -> None:
    """Register the backend of every entry point of :data:`ENTRY_POINTS`, once per process."""
    with _PLUGINS_LOCK:
        if _PLUGINS_ASKED:
            return  # loaded, or loading further up this thread's stack
        _PLUGINS_ASKED.append(True)
        entries = importlib.metadata.entry_points(group=ENTRY_POINTS)
        for entry in sorted(entries, key=lambda e: (e.name, e.value)):
            backend = _plugin_backend(entry)
            if backend is not None:
                _register_plugin(backend, entry)


def _plugin_backend(entry: importlib.metadata.EntryPoint) -> Backend | None:
    """The backend ``entry`` names, or None after a warning saying why it cannot be used."""
    try:
        named = entry.load()
        backend = named() if isinstance(named, type) and issubclass(named, Backend) else named
    except Exception as exc:  # whatever a foreign import raises: the other formats still open
        _warn(
            entry, f"failed to load ({type(exc).__name__}: {exc})", "Fix that error in the package"
        )
        return None
    if not isinstance(backend, Backend):
        _warn(
            entry,
            f"names {_kind(named)}, which is neither a subclass nor an instance of "
            "arrayfeed.storage.Backend",
            "Make the entry point name the package's Backend subclass",
        )
        return None
    wrong = [
        f"{attr}={getattr(backend, attr, None)!r}"
        for attr, kind in (("name", str), ("label", str), ("order", int))
        if not isinstance(getattr(backend, attr, None), kind)
    ]
    if wrong:
        _warn(
            entry,
            f"names {type(backend).__name__}, whose {', '.join(wrong)} is not what a Backend sets",
            "Set its class attributes `name` and `label` (str) and `order` (int)",
        )
        return None
    return backend


def _kind(obj: Any) -> str:
    return f"the class {obj.__qualname__}" if isinstance(obj, type) else f"a {type(obj).__name__}"


def _register_plugin(backend: Backend, entry: importlib.metadata.EntryPoint) -> None:
    with _LOCK:
        held = _REGISTERED.get(backend.name)
        if held is None or type(held) is type(backend):  # the plugin may register itself too
            _REGISTERED[backend.name] = backend
            _ORDERED.clear()
            return
    # Built-in formats (and backends registered earlier) keep their name: a package installed
    # for one project must not change how another's files open.
    _warn(
        entry,
        f"registers a backend named {backend.name!r}, which {held!r} already is; the entry "
        "point is not used",
        "Give the package's Backend another `name`",
    )


def _warn(entry: importlib.metadata.EntryPoint, what: str, fix: str) -> None:
    package = f" of the package {entry.dist.name}" if entry.dist is not None else ""
    warnings.warn(
        f"The storage backend entry point {entry.name!r} ({entry.value}){package} in the group "
        f"{ENTRY_POINTS!r} {what}; every other format still opens. {fix}, or uninstall the "
        "package if its format is not needed.",
        PluginWarning,
        stacklevel=1,  # raised wherever formats are first listed: no caller to point at
    )


def loaded(module: str) -> Any:
    """The module named ``module`` if something has imported it, else None. A backend recognises
    its library's objects with it: an ``h5py.Dataset`` cannot exist before h5py is imported, so
    asking whether an object is one need not import h5py."""
    return sys.modules.get(module)


def _subpackages() -> Iterator[str]:
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if info.ispkg:
            yield f"{package}.{info.name}"


def suffixes() -> frozenset[str]:
    """Every suffix a backend claims files by (``.h5``, ``.zarr`` …)."""
    return frozenset(s for backend in backends() for s in backend.suffixes)


def writer_backend(fmt: str) -> Backend:
    """The backend that writes the format ``fmt``; a named error for any other name."""
    writers = {b.name: b for b in backends() if b.writes}
    if fmt not in writers:
        names = " or ".join(repr(n) for n in sorted(writers))
        raise ConfigError(f"unknown store format {fmt!r}; use {names}.")
    return writers[fmt]
