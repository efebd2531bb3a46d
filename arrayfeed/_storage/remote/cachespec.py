"""Which cache a read goes through: ``cache=`` and ``cache_limit=`` as a :class:`CacheSpec`.

Light to import (the cache itself, :mod:`.cache`, is imported on first use): every
:class:`~.paths.RemotePath` may carry a spec, and sources pickle it, so that loader processes,
restarted jobs and other ranks use the same directory and limit.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from ..._errors import ConfigError
from ..._validate import optional_integer

__all__ = ["DEFAULT_SHARE", "CacheSpec", "cache_spec", "default_directory"]

#: The default limit: this share of the free disk where the cache is (what it holds counted as
#: free).
DEFAULT_SHARE = 0.5


@dataclass(frozen=True)
class CacheSpec:
    """Where fetched objects are kept, and the most bytes they may take there: what a source
    keeps and pickles (never an open handle, never credentials)."""

    directory: str
    limit: int


def default_directory() -> str:
    """``arrayfeed`` under the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``;
    ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows)."""
    if sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    elif os.name == "nt":  # pragma: no cover
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "arrayfeed")


def cache_spec(cache: Any, limit: Any = None) -> CacheSpec | None:
    """The cache that ``cache=`` and ``cache_limit=`` ask for (None: none), its directory made
    ready. ``limit`` None: :data:`DEFAULT_SHARE` of the free disk there.

    >>> import tempfile
    >>> spec = cache_spec(tempfile.mkdtemp(), 1 << 30)
    >>> spec.limit, cache_spec(False)
    (1073741824, None)
    """
    if isinstance(cache, CacheSpec) and limit is None:
        return cache
    if cache is None or cache is False:
        if limit is not None:
            raise ConfigError(
                f"`cache_limit` ({limit!r}) needs `cache`; pass cache=True (a directory under "
                "your cache directory) or cache=DIRECTORY (command line: --cache DIR)."
            )
        return None
    if isinstance(cache, CacheSpec):
        directory = cache.directory
    elif cache is True:
        directory = default_directory()
    elif isinstance(cache, (str, os.PathLike)):
        directory = os.path.abspath(os.path.expanduser(os.fspath(cache)))
    else:
        raise ConfigError(
            f"`cache` must be True, False, None or a directory (got {type(cache).__name__} "
            f"{cache!r}); pass cache=True or cache='/local/disk/arrayfeed-cache'."
        )
    from .cache import open_cache

    bound = optional_integer(
        limit, "cache_limit", low=1, fix="give bytes, e.g. cache_limit=50 * 2**30 (50 GiB)."
    )
    disk = open_cache(directory)
    if bound is None:
        stats = os.statvfs(directory)
        free = stats.f_bavail * stats.f_frsize + disk.index.totals()["held"]
        bound = max(1, int(DEFAULT_SHARE * free))
    return CacheSpec(directory, bound)
