"""One epoch's groups being read, and the next epoch's first groups read before it is asked for.

An epoch's groups are read ahead by a thread pool, ``depth`` groups in flight, and yielded in
order. Without more, every epoch ends with the pool draining (the last groups are read by fewer
and fewer threads while the others idle) and the next starts empty: measured on 2 cores, 2
threads, 12 KiB rows, an epoch of 60 k rows (12 groups) read 1.21 M rows/s and one of 150 k rows
1.39 M. With T threads and G groups per epoch that is about (T - 1) / 2G of every epoch.

So once an epoch has handed all its groups to the pool, the slots its last groups free are
filled with the first groups of the epoch that follows it (step 0 of ``epoch + 1``), in the
same pool, never more than ``depth`` groups in flight in all. The run is kept by the feed
(:attr:`Feed._ahead`) before the current epoch's last group is yielded, and the next
:meth:`Feed.epoch` takes it over when it asks for exactly that epoch from step 0 (after the
feed verified its sources, as at every epoch start); any other request, another process (a
fork: the pool's threads are not there) or the feed's end drops it, cancelling what has not
started. Reads of an epoch that is never asked for are wasted (at most ``depth`` groups), never
yielded.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .._storage import Source
from .blocks import WindowCache
from .indexblocks import EpochIndices

__all__ = ["EpochRun", "reads_ahead"]

_INDEX = np.dtype(np.int64)


class EpochRun:
    """Groups ``todo`` of ``epoch`` (from ``start``) of ``feed``, read by ``pool``: ``pending``
    are those submitted, in order."""

    def __init__(
        self,
        feed: Any,
        epoch: int,
        start: int,
        pool: ThreadPoolExecutor,
    ) -> None:
        self.epoch, self.start, self.pool = epoch, start, pool
        self.pid = os.getpid()
        self.todo = deque(feed.groups(start))
        self.pending: deque[Future[Any]] = deque()
        self.readers = feed.readers(epoch)
        # The feed keeps its next epoch's run, which must not keep the feed: nothing here holds
        # it but a weak reference, so a feed nobody uses is freed with its run and pool.
        self._feed = weakref.ref(feed)
        buffers = feed.pool
        self.indices = EpochIndices(
            feed.plan, epoch, start, feed.group_steps, lambda n: buffers.empty((n,), _INDEX)
        )
        self.caches = [r for r in self.readers if isinstance(r, WindowCache)]
        self._warmed: set[int] = set()
        self._batch_size, self._rows = feed.plan.batch_size, feed.plan.rows_per_epoch
        self._threads = feed.num_threads

    def submit(self) -> None:
        """Hand the next group to the pool; with it, the next index block when this group starts
        one, and the next window when this group is the first to need it."""
        feed = self._feed()
        assert feed is not None  # alive while one of its epochs runs
        first, stop = self.todo.popleft()
        self.pending.append(
            self.pool.submit(feed.read_group, self.epoch, first, stop, self.readers, self.indices)
        )
        indices = self.indices
        block = indices.block_of(first)
        if indices.starts[block] == first:  # compute the next block while this is read
            self.pool.submit(indices.prepare, block + 1)
        if self.caches:  # read the next window while groups are served from this one
            last = min(stop * self._batch_size, self._rows) - 1
            ahead = self.caches[0].order.window_at(last) + 1
            if ahead not in self._warmed:
                self._warmed.add(ahead)
                # One thread reads groups and windows in turn: decoding the next window here
                # would only hold back the groups of this one, so it is only announced (object
                # storage starts fetching it).
                read = self._threads > 1
                for cache in self.caches:
                    self.pool.submit(cache.prefetch_window, ahead, read)

    def matches(self, epoch: int, start: int) -> bool:
        """Whether this run reads ``epoch`` from step ``start``, in this process."""
        return (self.epoch, self.start) == (epoch, start) and self.pid == os.getpid()

    def cancel(self, wait: bool) -> None:
        """Cancel the groups not started; end the pool (waiting for the running ones if
        ``wait``). In another process (a fork) the pool's threads do not exist: nothing to do."""
        if self.pid != os.getpid():
            return
        for future in self.pending:
            future.cancel()
        self.pool.shutdown(wait=wait, cancel_futures=True)


def reads_ahead(sources: Sequence[Source]) -> bool:
    """Whether an epoch of ``sources`` may be read before it is asked for: only when every one is
    a file that may not change in place, whose change the next epoch start detects (a file
    changed after its groups were read ahead fails that epoch, as it would have). Never for arrays
    in memory (changed between epochs, new labels say, the next epoch must read them as they are
    then), object storage (a read nobody asks for is a billed request) or files open for writing
    or SWMR."""
    for source in sources:
        fingerprint = getattr(source, "fingerprint", None)
        if fingerprint is None or fingerprint.mutable:
            return False
    return True
