"""Objects fetched many at once from object storage, retried, and kept for rows read again soon.

:class:`Fetcher` fetches whole objects (Zarr chunks) with many requests in flight on the
filesystem's own event loop, retries them with exponential backoff after transient failures (5xx,
429, timeouts, connection resets), and keeps them in a byte-bounded LRU so that rows read again
soon (a full shuffle touches every chunk many times per epoch) cost no new request: the page
cache that local files get from the operating system. Decoding stays with the caller, in its own
thread. :func:`sync_filesystem` gives the filesystem such fetches run on.

With a cache directory (:mod:`.cache`) and the objects' versions as the store listed them at
open, each object is fetched through it, in a thread of the fetcher's own: a checked copy from
local disk, or a download kept there for every process of the host. An object the listing did
not hold is missing (fill values for Zarr) without a request; one without a version (nothing
tells its changes apart) is fetched as without a cache.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .cache import open_cache
from .cachespec import CacheSpec
from .errors import missing_object, remote_error, transient
from .paths import whole_object

__all__ = ["ATTEMPTS", "BACKOFF", "CACHE_BYTES", "IN_FLIGHT", "Fetcher", "sync_filesystem"]

#: Requests one :class:`Fetcher` keeps in flight at most.
IN_FLIGHT = 64
#: Tries of one request before a transient failure becomes an error (the first included).
ATTEMPTS = 5
#: Seconds before the first retry; doubled for each further one, plus a random part of up to half.
BACKOFF = 0.1
#: Keys a :class:`Fetcher` remembers finding in the local cache (then forgets them all).
MAX_LOCAL_KEYS = 1 << 16
#: Bytes of fetched objects a :class:`Fetcher` keeps (``ARRAYFEED_REMOTE_CACHE_BYTES`` overrides).
CACHE_BYTES = 512 << 20


def sync_filesystem(fs: Any) -> Any:
    """A filesystem that runs coroutines on fsspec's own event loop, for ``fs`` as Zarr opens it
    (an asynchronous instance without a loop, or a wrapped synchronous one).

    S3 gets a larger connection pool (64; botocore's default is 10) unless one is configured.
    """
    if getattr(fs, "sync_fs", None) is not None:  # zarr's wrapper of a synchronous filesystem
        return fs.sync_fs
    if not getattr(fs, "async_impl", False) or not getattr(fs, "asynchronous", False):
        return fs
    options = {k: v for k, v in fs.storage_options.items() if k not in ("asynchronous", "loop")}
    if "s3" in _protocols(fs):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", IN_FLIGHT)
        options["config_kwargs"] = config
    return type(fs)(**options)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _delay(attempt: int) -> float:
    return float(BACKOFF * 2**attempt * (1 + 0.5 * random.random()))


def cache_bytes() -> int:
    value = os.environ.get("ARRAYFEED_REMOTE_CACHE_BYTES")
    try:
        return max(0, int(value)) if value else CACHE_BYTES
    except ValueError:
        return CACHE_BYTES


class _Deferred(Future[bytes | None]):
    """A fetch run by the first thread that asks for its result, in that thread."""

    def __init__(self, work: Callable[[], bytes | None]) -> None:
        super().__init__()
        self._work: Callable[[], bytes | None] | None = work
        self._claim = threading.Lock()

    def result(self, timeout: float | None = None) -> bytes | None:
        with self._claim:
            work, self._work = self._work, None
        if work is not None:
            try:
                self.set_result(work())
            except BaseException as exc:
                self.set_exception(exc)
        return super().result(timeout)


class Fetcher:
    """Objects under ``root`` of ``fs`` (keys relative to it), fetched many at once.

    :meth:`fetch` starts requests for keys nobody fetched yet and returns at once; :meth:`get`
    waits for one object: its bytes, or None when it does not exist. A failure is raised by
    :meth:`get` (and forgotten, so a later read asks again): a named error after
    :data:`ATTEMPTS` tries of a transient one. Fetched objects are kept, least recently used
    first out, up to ``cache_bytes``. Pickles as ``fs``, ``root``, ``url`` and the cache settings
    (the copy starts empty); a forked child starts empty too, with the filesystem made again (the parent's event
    loop thread does not exist there).
    """

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        *,
        in_flight: int = IN_FLIGHT,
        cache: CacheSpec | None = None,
        versions: Mapping[str, str | None] | None = None,
    ) -> None:
        self.fs, self.root, self.url, self.in_flight = fs, root.rstrip("/"), url, in_flight
        self.cache, self.versions = cache, versions
        self.cache_bytes = cache_bytes()
        self._whole = whole_object(fs)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._entries: OrderedDict[str, Future[bytes | None]] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._held = 0
        self._semaphore: asyncio.Semaphore | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._local: set[str] = set()  # keys found in the local cache (asked once, not per read)
        self.requests = 0  # objects requested (for tests and benchmarks)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in (
            "_lock",
            "_entries",
            "_sizes",
            "_held",
            "_semaphore",
            "_pool",
            "_local",
            "requests",
        ):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _forked(self) -> None:
        if self._pid != os.getpid():
            self.fs = pickle.loads(pickle.dumps(self.fs))  # fsspec makes it anew in this process
            self._reset()

    def fetch(self, keys: Iterable[str]) -> None:
        """Start fetching every key not fetched or in flight yet (nor in the local cache: read
        from there when asked for)."""
        self._forked()
        with self._lock:
            for key in keys:
                if key in self._entries:
                    self._entries.move_to_end(key)
                elif not self._on_disk(key):
                    self._entries[key] = self._start(key)
            self._evict()

    def get_lent(self, key: str) -> tuple[Any, np.ndarray | None]:
        """Like :meth:`get`, but a copy from the local cache comes in a work buffer lent to the
        caller (the second item), who gives it back (``workbuffers.give``) once it is used, and
        is not kept in memory here: the page cache keeps it, and a fresh buffer per object
        costs a page fault per page."""
        self._forked()
        version = self._version(key)
        if isinstance(version, str) and self.cache is not None and key not in self._entries:
            lent = open_cache(self.cache.directory).read_lent(self._name(key), version)
            if lent is not None:
                return lent
            self._local.discard(key)  # gone meanwhile (evicted, or dropped as corrupt)
        return self.get(key), None

    def _on_disk(self, key: str) -> bool:
        if key in self._local:
            return True
        version = self._version(key)
        if not isinstance(version, str) or self.cache is None:
            return False
        if not open_cache(self.cache.directory).has(self._name(key), version):
            return False
        if len(self._local) >= MAX_LOCAL_KEYS:
            self._local.clear()
        self._local.add(key)
        return True

    def get(self, key: str) -> bytes | None:
        """The bytes of ``key`` (None: no such object), once they arrived."""
        self._forked()
        with self._lock:
            future = self._entries.get(key)
            if future is None:
                future = self._entries[key] = self._start(key)
                self._evict()
            else:
                self._entries.move_to_end(key)
        try:
            return future.result()
        except BaseException:
            with self._lock:
                if self._entries.get(key) is future:
                    del self._entries[key]
            raise

    @property
    def kept_locally(self) -> bool:
        """Whether fetched objects go to a local cache (their versions are known)."""
        return self.cache is not None and self.versions is not None

    def _request(self, key: str) -> tuple[str, dict[str, Any]]:
        """The path of ``key`` and the keyword arguments of ``cat_file`` that fetch it."""
        return (f"{self.root}/{key}" if self.root else key), self._whole

    def _name(self, key: str) -> str:
        """What ``key`` is called in the cache: its URL (and range)."""
        return f"{self.url.rstrip('/')}/{key}"

    def _version(self, key: str) -> str | bool | None:
        """The version of ``key`` the cache checks copies against; None: fetched around the
        cache; False: missing, as the listing at open said."""
        if self.cache is None or self.versions is None:
            return None
        return self.versions.get(key, False)

    def _start(self, key: str) -> Future[bytes | None]:
        future: Future[bytes | None]
        version = self._version(key)
        if version is False:
            future = Future()
            future.set_result(None)
        elif isinstance(version, str) and self.cache is not None:
            if self._on_disk(key):
                # Read when asked for, in the thread that asks, as a local file is: no hand-off
                # to a thread of ours, none of them busy with what a reader thread can do.
                future = _Deferred(functools.partial(self._cached, key, version))
            else:
                future = self._threads(self.in_flight).submit(self._cached, key, version)
        elif self._async():
            self.requests += 1
            future = asyncio.run_coroutine_threadsafe(self._get_async(key), self.fs.loop)
        else:
            self.requests += 1
            future = self._threads(min(self.in_flight, 16)).submit(self._get_sync, key)
        future.add_done_callback(lambda f: self._landed(key, f))
        return future

    def _async(self) -> bool:
        loop = getattr(self.fs, "loop", None)
        return bool(getattr(self.fs, "async_impl", False)) and loop is not None

    def _threads(self, count: int) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(count, thread_name_prefix="arrayfeed-fetch")
        return self._pool

    def _cached(self, key: str, version: str) -> bytes | None:
        assert self.cache is not None
        return open_cache(self.cache.directory).get(
            self._name(key), version, self.cache.limit, lambda: self._download(key)
        )

    def _download(self, key: str) -> bytes | None:
        with self._lock:
            self.requests += 1
        if self._async():
            return asyncio.run_coroutine_threadsafe(self._get_async(key), self.fs.loop).result()
        return self._get_sync(key)

    def _landed(self, key: str, future: Future[bytes | None]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        size = len(future.result() or b"")
        with self._lock:
            if self._entries.get(key) is future and key not in self._sizes:
                self._sizes[key] = size
                self._held += size

    def _evict(self) -> None:
        if self._held <= self.cache_bytes:
            return
        for key in list(self._entries):
            if self._held <= self.cache_bytes:
                break
            size = self._sizes.pop(key, None)
            if size is not None:  # arrived: in flight ones stay
                del self._entries[key]
                self._held -= size

    async def _get_async(self, key: str) -> bytes | None:
        if self._semaphore is None:  # created on the loop that uses it
            self._semaphore = asyncio.Semaphore(self.in_flight)
        path, kwargs = self._request(key)
        for attempt in range(ATTEMPTS):
            try:
                async with self._semaphore:
                    data = await self.fs._cat_file(path, **kwargs)
                return data if isinstance(data, bytes) else bytes(data)
            except Exception as exc:
                if missing_object(exc):
                    return None
                if attempt + 1 == ATTEMPTS or not transient(exc):
                    raise remote_error(exc, self._name(key), attempts=attempt + 1) from exc
            await asyncio.sleep(_delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _get_sync(self, key: str) -> bytes | None:
        path, kwargs = self._request(key)
        for attempt in range(ATTEMPTS):
            try:
                data = self.fs.cat_file(path, **kwargs)
                return data if isinstance(data, bytes) else bytes(data)
            except Exception as exc:
                if missing_object(exc):
                    return None
                if attempt + 1 == ATTEMPTS or not transient(exc):
                    raise remote_error(exc, self._name(key), attempts=attempt + 1) from exc
            time.sleep(_delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover
