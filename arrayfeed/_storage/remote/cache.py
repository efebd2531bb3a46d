"""Objects fetched from object storage, kept on local disk for every process of the host.

``cache=`` a directory (or True: one under the user's cache directory) turns it on for a URL
(:mod:`.cachespec`: the directory and limit sources keep and pickle, so that loader processes,
restarted jobs and other ranks find the same objects). :func:`open_cache` gives this process's
:class:`DiskCache` of a directory; :class:`~.fetcher.Fetcher` goes through it.

What it guarantees, and how:

- **bounded**: the index (:mod:`.cacheindex`) reserves an object's bytes before its file is
  written, evicting least recently used objects first, so the files never exceed the limit,
  however many processes write;
- **shared**: a download is claimed (:mod:`.cacheclaims`); others wait for the object to
  appear rather than fetch it again, and fetch it themselves only after :data:`WAIT_SECONDS`;
- **atomic**: a file is written under ``tmp/`` and renamed into ``objects/`` before its row says
  it is there; what a killed writer leaves is taken back with its reservation;
- **checked on every hit**: the file's size and CRC-32C (computed on download, outside the GIL)
  against its row, and the object's version (ETag, size, modification time, as the store
  reported them when the source was opened) against the version it was fetched at. A copy that
  fails either is dropped, counted, and fetched again.

Nothing about credentials is written: rows hold hashes of URLs and versions; the directory and
its files are created for the user alone (0700, 0600). Why no library does this: see
``docs/explanation/design.md`` (diskcache, fsspec's caching filesystems and zarr's cache store
each miss a shared bound, a check on every hit, or waiting for another process's download).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Literal

import crc32c
import numpy as np

from ..._errors import CacheError
from ..._forks import renew_after_fork
from .. import workbuffers
from .cacheclaims import Claim, claim
from .cacheindex import Entry, Index

__all__ = [
    "WAIT_SECONDS",
    "DiskCache",
    "object_version",
    "open_cache",
    "version_at",
    "versions_under",
]

#: Seconds a process waits for an object another one is downloading before it fetches it itself.
WAIT_SECONDS = 120.0
#: Rows of the index a :class:`DiskCache` remembers (then it forgets them all).
MAX_KNOWN = 1 << 16
#: Seconds between writes of this process's hits and uses to the index.
FLUSH_SECONDS = 0.5


def _prepare(directory: str) -> None:
    """Make ``directory`` (for this user alone) and its parts, or say why it cannot be used."""
    try:
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)
        owner = os.stat(directory).st_uid
        for part in ("objects", "tmp", "claims"):
            os.makedirs(os.path.join(directory, part), mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CacheError(
            f"`cache` '{directory}' cannot be used ({exc}); give a directory on a local disk "
            "that you can write (cache=DIR, --cache DIR)."
        ) from None
    if hasattr(os, "getuid") and owner != os.getuid():
        raise CacheError(
            f"`cache` '{directory}' belongs to another user (uid {owner}); a cache is shared by "
            "the processes of one user only: give a directory of your own."
        )


def object_version(info: Mapping[str, Any]) -> str | None:
    """What tells a new version of an object from the old one, in a filesystem's ``info``:
    its ETag (or generation), size and modification time; None when it has neither a tag nor a
    time (then it is not cached: a change could not be seen).

    >>> object_version({"ETag": '"9b2c"', "size": 4, "LastModified": "2026-01-02"})
    '"9b2c"|4|2026-01-02'
    >>> object_version({"size": 4}) is None
    True
    """
    tag = next((info[k] for k in ("ETag", "etag", "md5Hash", "generation") if info.get(k)), None)
    when = next(
        (info[k] for k in ("LastModified", "last_modified", "mtime", "updated") if info.get(k)),
        None,
    )
    if tag is None and when is None:
        return None
    return f"{tag}|{info.get('size')}|{when}"


def versions_under(fs: Any, root: str) -> dict[str, str | None] | None:
    """Every object under ``root`` (keys relative to it) and its version, as one listing says
    now (not as the filesystem remembers an older one); None when ``root`` cannot be listed
    (plain HTTP): then nothing under it is cached."""
    with contextlib.suppress(Exception):
        fs.invalidate_cache(root)
    try:
        found = fs.find(root, detail=True)
    except Exception:
        return None
    prefix = root.rstrip("/") + "/"
    return {
        path[len(prefix) :]: object_version(info)
        for path, info in found.items()
        if path.startswith(prefix)
    }


def version_at(fs: Any, path: str) -> tuple[int, str | None]:
    """The size and version of the object at ``path``, as the store says now."""
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    info = fs.info(path)
    return int(info["size"]), object_version(info)


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def _read_into(f: Any, view: memoryview) -> int:
    """Fill ``view`` from the file ``f``, continuing short reads; the bytes read."""
    got = 0
    while got < len(view) and (n := f.readinto(view[got:])):
        got += n
    return got


def _checksum(data: Any) -> int:
    return int(crc32c.crc32c(data, gil_release_mode=1))


class DiskCache:
    """One cache directory as this process uses it (see :func:`open_cache`)."""

    def __init__(self, directory: str) -> None:
        _prepare(directory)
        self.directory, self.pid = directory, os.getpid()
        self._objects = os.path.join(directory, "objects")
        self._tmp = os.path.join(directory, "tmp")
        self._claims = os.path.join(directory, "claims")
        self.index = Index(os.path.join(directory, "index.sqlite"), self._remove)
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._counts: Counter[str] = Counter()
        self._used: dict[str, float] = {}
        self._timer: threading.Timer | None = None
        self._known: dict[str, Entry] = {}  # key -> its row, as last seen here
        with contextlib.suppress(sqlite3.Error):
            self.index.reclaim()
        atexit.register(self.flush)

    def _path(self, file: str) -> str:
        return os.path.join(self._objects, file[:2], file)

    def _remove(self, file: str) -> None:
        for path in (self._path(file), os.path.join(self._tmp, file)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def get(
        self, name: str, version: str, limit: int, download: Callable[[], bytes | None]
    ) -> bytes | None:
        """The object ``name`` (its URL and range) at ``version``: from the cache when a checked
        copy is there, else from ``download()`` (None: no such object), kept for the next
        reader. While another process downloads it, waits for its copy."""
        key, version = _digest(name, 40), _digest(version, 32)
        data = self.read(key, version)
        if data is not None:
            return data
        deadline, delay = time.monotonic() + WAIT_SECONDS, 0.001
        held = self._claim(key)
        while held is None and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
            data = self.read(key, version)
            if data is not None:
                self._count(waits=1)
                return data
            held = self._claim(key)
        if held is False:
            held = None
        try:
            if held is not None:  # written by the claim's holder just before it let go?
                data = self.read(key, version)
                if data is not None:
                    return data
            data = download()
            if data is not None:
                self.store(key, version, data, limit, misses=1, bytes_fetched=len(data))
            return data
        finally:
            if held is not None:
                held.release()

    def _claim(self, key: str) -> Claim | Literal[False] | None:
        """The claim on ``key``; None while another process holds it; False when claims
        cannot be made here (then the object is fetched without one)."""
        try:
            return claim(self._claims, key)
        except OSError:
            return False

    def has(self, name: str, version: str) -> bool:
        """Whether the index holds a copy of ``name`` at ``version`` (not checked yet)."""
        try:
            entry = self.index.lookup(_digest(name, 40))
        except sqlite3.Error:
            return False
        return entry is not None and entry.version == _digest(version, 32)

    def read(self, key: str, version: str) -> bytes | None:
        """The checked copy of ``key`` at ``version``, or None; a copy that fails its check is
        dropped and counted."""
        found = self._read(key, version, lend=False)
        return None if found is None else bytes(found[0])

    def read_lent(self, name: str, version: str) -> tuple[memoryview, np.ndarray] | None:
        """Like :meth:`read` for the object ``name``, in a work buffer lent to the caller, who
        gives it back (``workbuffers.give``) once it is used: memory never touched before
        costs a page fault per page, more than reading it from the page cache."""
        found = self._read(_digest(name, 40), _digest(version, 32), lend=True)
        if found is None or found[1] is None:
            return None
        return found[0], found[1]

    def _read(self, key: str, version: str, *, lend: bool) -> tuple[Any, np.ndarray | None] | None:
        try:
            # The row this process saw last, then the index's: a file name is never used again,
            # so a file that is still there is the one that row describes (or is caught by its
            # check), and a hit asks nothing of the index.
            for remembered in (True, False):
                entry = self._known.get(key) if remembered else self.index.lookup(key)
                if entry is None:
                    if remembered:
                        continue
                    return None
                if entry.version != version:
                    if remembered:
                        self._known.pop(key, None)
                        continue
                    self.index.drop(entry.file, "stale_dropped")
                    return None
                found = self._load(entry, lend)
                if found is not None:
                    break
                self._known.pop(key, None)
                if not remembered:
                    return None
            else:
                return None
        except (sqlite3.Error, OSError):  # a cache that fails is read around, never in the way
            return None
        if len(self._known) >= MAX_KNOWN:
            self._known.clear()
        self._known[key] = entry
        with self._lock:
            self._used[entry.file] = time.time()
            self._counts["hits"] += 1
            self._schedule()
        return found

    def _load(self, entry: Entry, lend: bool) -> tuple[Any, np.ndarray | None] | None:
        """The bytes of ``entry``'s file if they pass its check (in a lent buffer if ``lend``),
        else None, with the entry dropped and counted unless it was evicted meanwhile."""
        buffer = workbuffers.work.take(entry.size + 1) if lend else None
        gone = False
        try:
            with open(self._path(entry.file), "rb", buffering=0) as f:
                if buffer is not None:
                    data: Any = buffer.data[: _read_into(f, buffer.data[: entry.size + 1])]
                else:
                    data = f.readall()
            if len(data) == entry.size and _checksum(data) == entry.crc:
                return data, buffer
        except FileNotFoundError:  # evicted since the lookup, or deleted by another tool
            gone = True
        except BaseException:
            workbuffers.work.give(buffer)
            raise
        workbuffers.work.give(buffer)
        if not gone or self.index.holds(entry.file):
            self.index.drop(entry.file, "corrupt_dropped")
        return None

    def store(self, key: str, version: str, data: bytes, limit: int, **counts: int) -> None:
        """Keep ``data`` as ``key`` at ``version``, if room can be made for it; ``counts`` are
        written with it (a download's, which no process that ends abruptly may lose)."""
        file = key[:24] + secrets.token_hex(8)
        try:
            if not self.index.reserve(key, version, len(data), _checksum(data), limit, file):
                self.index.record({}, {**counts, "skipped": 1})
                return
        except sqlite3.Error:
            self._count(**counts, skipped=1)
            return
        tmp, final = os.path.join(self._tmp, file), self._path(file)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
            os.replace(tmp, final)
            self.index.publish(file, key, counts)
        except (OSError, sqlite3.Error):  # a full disk: the object is not kept, nothing breaks
            self._count(**counts)
            with contextlib.suppress(OSError, sqlite3.Error):
                self.index.drop(file, "skipped")

    def _count(self, **counts: int) -> None:
        with self._lock:
            self._counts.update(counts)
            self._schedule()

    def _schedule(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(FLUSH_SECONDS, self.flush)
            self._timer.daemon = True
            self._timer.start()

    def flush(self) -> None:
        """Write this process's hits, uses and counts to the index."""
        with self._lock:
            used, counts = self._used, dict(self._counts)
            self._used, self._timer = {}, None
            self._counts.clear()
        if os.getpid() != self.pid:
            return
        with contextlib.suppress(sqlite3.Error):
            self.index.record(used, counts)


_OPEN: dict[str, DiskCache] = {}
_OPEN_LOCK = threading.Lock()


def open_cache(directory: str) -> DiskCache:
    """This process's :class:`DiskCache` of ``directory`` (made on first use)."""
    with _OPEN_LOCK:
        cache = _OPEN.get(directory)
        if cache is None or cache.pid != os.getpid():
            cache = _OPEN[directory] = DiskCache(directory)
        return cache


def _forget() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()
    _OPEN.clear()  # the parent's connections are not used in a child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
