"""The most bytes a cache directory held on disk while a block ran: what its limit bounds.

Used as a context manager, :class:`DiskPeak` samples the object files under a cache directory
(``cache=``) in a thread of its own until the block ends; ``peak`` is the most seen. Each sample
is taken while the cache's index is locked against writes (see
``arrayfeed._storage.cache_bytes_on_disk``), so that no eviction and no new object
happens during it. The tests and ``benchmarks/bench_cache.py`` hold the limit against it::

    with DiskPeak(directory) as disk:
        ...                          # processes reading through the cache
    assert disk.peak <= limit
"""

from __future__ import annotations

import os
import threading

from .._storage import cache_bytes_on_disk

__all__ = ["DiskPeak"]


class DiskPeak:
    """Samples the bytes under the cache ``directory`` every ``seconds`` while in use."""

    def __init__(self, directory: str | os.PathLike[str], seconds: float = 0.005) -> None:
        self.directory, self.seconds = directory, seconds
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="arrayfeed-diskpeak")

    def _watch(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, cache_bytes_on_disk(self.directory))
            self._done.wait(self.seconds)

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, cache_bytes_on_disk(self.directory))
