"""What a cache directory holds and did, for every process that used it: :class:`CacheReport`."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..._errors import ConfigError
from .cachespec import cache_spec

__all__ = ["CacheReport", "cache_bytes_on_disk", "cache_report"]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass(frozen=True, kw_only=True)
class CacheReport:
    """What the cache of objects fetched from object storage holds, and what every process that
    used it did there since it was made (see :func:`arrayfeed.cache_report`).

    Attributes:
        directory: The cache directory.
        limit: The most bytes it may hold (as given to, or computed by, this process).
        bytes_held: Bytes of objects it holds (reserved for downloads under way included).
        objects: Objects it holds.
        hits: Objects read from it, each checked (size, CRC-32C, version).
        misses: Objects downloaded from object storage because it had no good copy.
        bytes_fetched: Bytes those downloads brought.
        waits: Hits on objects another process was downloading, waited for rather than fetched
            again (counted in ``hits`` too).
        corrupt_dropped: Copies that failed their check (truncated, altered or deleted by
            something else), dropped and fetched again.
        stale_dropped: Copies of an older version of their object (its ETag, size or
            modification time changed), dropped and fetched again.
        evicted: Objects removed, least recently used first, to make room under the limit.
        skipped: Objects fetched but not kept: larger than the limit, no room left beside
            downloads under way, or a failed write (a full disk).
    """

    directory: str
    limit: int
    bytes_held: int
    objects: int
    hits: int
    misses: int
    bytes_fetched: int
    waits: int
    corrupt_dropped: int
    stale_dropped: int
    evicted: int
    skipped: int

    def since(self, earlier: CacheReport) -> CacheReport:
        """What happened between ``earlier`` (a report of the same cache) and this one: the
        counts' differences, with what is held now."""
        counts = {
            f.name: getattr(self, f.name) - getattr(earlier, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("directory", "limit", "bytes_held", "objects")
        }
        return dataclasses.replace(self, **counts)

    def __str__(self) -> str:
        line = (
            f"cache {self.directory}: {_size(self.bytes_held)} of {_size(self.limit)} held in "
            f"{self.objects:,} objects; {self.hits:,} hits, {self.misses:,} misses "
            f"({_size(self.bytes_fetched)} fetched)"
        )
        extra = [
            f"{n:,} {what}"
            for n, what in (
                (self.waits, "waited for"),
                (self.corrupt_dropped, "corrupt copies dropped"),
                (self.stale_dropped, "stale copies dropped"),
                (self.evicted, "evicted"),
                (self.skipped, "not kept"),
            )
            if n
        ]
        return line + (f"; {', '.join(extra)}" if extra else "") + "."


def cache_report(
    cache: str | os.PathLike[str] | bool = True, cache_limit: int | None = None
) -> CacheReport:
    """What the cache directory ``cache`` (True: the default one) holds, and what every process
    that used it did there (hits, misses, bytes fetched, copies dropped …). The counts of the
    processes still running are those they wrote, at most half a second old; this process's
    own are written first. ``cache_limit`` as given to the reads (None: the default).

    >>> import tempfile, arrayfeed as af
    >>> report = af.cache_report(tempfile.mkdtemp(), cache_limit=1 << 30)
    >>> report.hits, report.bytes_held
    (0, 0)
    """
    from .cache import open_cache

    spec = cache_spec(cache, cache_limit)
    if spec is None:
        raise ConfigError(f"`cache` ({cache!r}) names no cache; pass True or its directory.")
    disk = open_cache(spec.directory)
    disk.flush()
    totals: dict[str, Any] = disk.index.totals()
    return CacheReport(
        directory=spec.directory,
        limit=spec.limit,
        bytes_held=totals.pop("held"),
        **{f.name: totals[f.name] for f in dataclasses.fields(CacheReport) if f.name in totals},
    )


def cache_bytes_on_disk(directory: str | os.PathLike[str]) -> int:
    """The bytes of every object file under the cache ``directory``, written or being written
    (what the limit bounds). Counted while the index's write lock is held: a walk of the
    folders is not instant, and a file evicted from a folder already counted and one written to
    a folder not counted yet would otherwise both count. (Files being written then are those
    whose bytes are reserved.)"""
    import sqlite3

    index = os.path.join(directory, "index.sqlite")
    with contextlib.closing(sqlite3.connect(index, timeout=60, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        try:
            total = 0
            for part in ("objects", "tmp"):
                for root, _, names in os.walk(os.path.join(directory, part)):
                    for name in names:
                        with contextlib.suppress(FileNotFoundError):  # (removed by something else)
                            total += os.stat(os.path.join(root, name)).st_size
            return total
        finally:
            db.execute("ROLLBACK")
