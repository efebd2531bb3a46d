"""The index of a cache directory: which objects it holds, how to check them, when each was last
used and how many bytes they take, in one SQLite database every process using the directory
shares.

SQLite serialises writers across processes and rolls back the transaction of a writer killed at
any point, so the index never says more or less than was committed. Each write is one short
transaction (``BEGIN IMMEDIATE``) that waits on nothing else: no download, no claim.

One row per file under ``objects/``: the object's key (a hash of its URL and byte range, never
the URL itself, which may carry a signature), its version (a hash of what the store reported at
open: ETag, size, modification time), the file's size and CRC-32C, its last use, and whether it
is written yet. A row not yet ``ready`` reserves its bytes for a writer (host and pid) before the
file exists, so the bytes of all rows (``held``, kept in ``counters``) bound what is on disk,
whoever writes: a writer first makes room, least recently used objects first, then writes. A
reservation whose writer died (the pid is gone on this host, or it is older than
:data:`RESERVED_SECONDS`) is taken back, with whatever its writer left on disk.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from ..._errors import CacheError
from ..._forks import renew_after_fork

__all__ = ["COUNTERS", "HOST", "RESERVED_SECONDS", "Entry", "Index"]

#: Seconds a reservation stays another writer's, when its process cannot be seen to be dead (on
#: another host, or a pid taken again).
RESERVED_SECONDS = 3600.0
#: Seconds a write waits for another process's transaction before it fails.
BUSY_SECONDS = 60.0
#: This host, as reservations name their writers.
HOST = socket.gethostname()
#: What the index counts, for every process together (see :class:`~.cachereport.CacheReport`).
COUNTERS = (
    "hits",
    "misses",
    "bytes_fetched",
    "waits",
    "corrupt_dropped",
    "stale_dropped",
    "evicted",
    "skipped",
)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS entries (file TEXT PRIMARY KEY, key TEXT NOT NULL, "
    "version TEXT NOT NULL, size INTEGER NOT NULL, crc INTEGER NOT NULL, used REAL NOT NULL, "
    "ready INTEGER NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS entries_by_key ON entries (key, ready)",
    "CREATE INDEX IF NOT EXISTS entries_by_use ON entries (ready, used)",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


@dataclass(frozen=True)
class Entry:
    """An object the index says is in the cache."""

    file: str
    version: str
    size: int
    crc: int


def _alive(host: str, pid: int, since: float) -> bool:
    """Whether the writer ``pid`` on ``host``, which reserved at ``since``, may still write."""
    if time.time() - since > RESERVED_SECONDS:
        return False
    if host != HOST:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class Index:
    """The index at ``path``; ``remove(file)`` deletes what a row's writer may have left on disk
    (called inside the transaction that deletes the row, so that the disk never holds more than
    the rows say)."""

    def __init__(self, path: str, remove: Callable[[str], None]) -> None:
        self.path, self._remove = path, remove
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # SQLite's own files copy its mode
            os.close(fd)
            self._db = sqlite3.connect(
                path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer
            self._db.execute("PRAGMA synchronous=NORMAL")  # a cache: a power cut may lose the end
            with self._write() as db:
                for statement in _SCHEMA:
                    db.execute(statement)
                db.executemany(
                    "INSERT OR IGNORE INTO counters VALUES (?, 0)",
                    [(name,) for name in ("held", *COUNTERS)],
                )
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(
                f"the cache index '{path}' cannot be opened ({exc}); check that its directory is "
                "yours and writable, or delete the directory to start an empty cache."
            ) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def lookup(self, key: str) -> Entry | None:
        """The newest written copy of ``key``, if any."""
        with self._lock:
            row = self._db.execute(
                "SELECT file, version, size, crc FROM entries WHERE key = ? AND ready = 1 "
                "ORDER BY used DESC LIMIT 1",
                (key,),
            ).fetchone()
        return Entry(*row) if row is not None else None

    def holds(self, file: str) -> bool:
        """Whether the row of ``file`` is still there (not evicted, dropped or replaced)."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM entries WHERE file = ?", (file,)).fetchone()
        return row is not None

    def drop(self, file: str, counter: str | None = None) -> bool:
        """Delete ``file`` and its row (counted under ``counter``); False if it was gone."""
        with self._write() as db:
            if not self._delete(db, file):
                return False
            if counter is not None:
                self._add(db, {counter: 1})
        return True

    def reserve(self, key: str, version: str, size: int, crc: int, limit: int, file: str) -> bool:
        """Room for ``size`` more bytes, made by evicting least recently used objects, and a
        row for ``file`` holding it; False when there is none to be had: the object is larger than
        ``limit``, or reservations of writers at work hold the rest."""
        if size > limit:
            return False
        with self._write() as db:
            reserved = 0
            for name, nbytes, host, pid, since in db.execute(
                "SELECT file, size, host, pid, used FROM entries WHERE ready = 0"
            ).fetchall():
                if _alive(host, pid, since):
                    reserved += nbytes
                else:
                    self._delete(db, name)
            if reserved + size > limit:
                return False
            evicted = 0
            while self._held(db) + size > limit:
                victims = db.execute(
                    "SELECT file FROM entries WHERE ready = 1 ORDER BY used LIMIT 64"
                ).fetchall()
                if not victims:  # (the rows say otherwise: never so)
                    return False
                for (name,) in victims:
                    self._delete(db, name)
                    evicted += 1
                    if self._held(db) + size <= limit:
                        break
            db.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
                (file, key, version, size, crc, time.time(), HOST, os.getpid()),
            )
            self._add(db, {"held": size, "evicted": evicted})
        return True

    def publish(self, file: str, key: str, counts: Mapping[str, int]) -> None:
        """``file`` is written: readers may use it; older copies of ``key`` go; ``counts`` are
        added."""
        with self._write() as db:
            self._add(db, counts)
            db.execute("UPDATE entries SET ready = 1, used = ? WHERE file = ?", (time.time(), file))
            for (old,) in db.execute(
                "SELECT file FROM entries WHERE key = ? AND file != ? AND ready = 1", (key, file)
            ).fetchall():
                self._delete(db, old)

    def record(self, used: Mapping[str, float], counts: Mapping[str, int]) -> None:
        """When files were last used, and what happened since the last call, in one write."""
        if not used and not any(counts.values()):
            return
        with self._write() as db:
            db.executemany(
                "UPDATE entries SET used = max(used, ?) WHERE file = ?",
                [(when, file) for file, when in used.items()],
            )
            self._add(db, counts)

    def totals(self) -> dict[str, int]:
        """Every counter, and ``objects``: the files written."""
        with self._lock:
            found = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            (objects,) = self._db.execute("SELECT COUNT(*) FROM entries WHERE ready = 1").fetchone()
        return {**found, "objects": int(objects)}

    def reclaim(self) -> None:
        """Take back the reservations of writers that died (what they left on disk goes too)."""
        with self._write() as db:
            for name, host, pid, since in db.execute(
                "SELECT file, host, pid, used FROM entries WHERE ready = 0"
            ).fetchall():
                if not _alive(host, pid, since):
                    self._delete(db, name)

    # -- inside a transaction ----------------------------------------------------------------
    def _delete(self, db: sqlite3.Connection, file: str) -> bool:
        row = db.execute("SELECT size FROM entries WHERE file = ?", (file,)).fetchone()
        if row is None:
            return False
        db.execute("DELETE FROM entries WHERE file = ?", (file,))
        self._add(db, {"held": -int(row[0])})
        self._remove(file)
        return True

    @staticmethod
    def _held(db: sqlite3.Connection) -> int:
        return int(db.execute("SELECT value FROM counters WHERE name = 'held'").fetchone()[0])

    @staticmethod
    def _add(db: sqlite3.Connection, counts: Mapping[str, int]) -> None:
        db.executemany(
            "UPDATE counters SET value = value + ? WHERE name = ?",
            [(n, name) for name, n in counts.items() if n],
        )
