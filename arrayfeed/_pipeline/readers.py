"""Reader threads whose number may change while they read (a first-in, first-out executor), and
one pass over an epoch read by them (:class:`EpochPass`).

An :class:`EpochPass` reads its groups in these threads, as many at once as the tuner says
(:mod:`.tuning`). ``concurrent.futures.ThreadPoolExecutor`` cannot change its number of
workers, and holding its extra workers back at a gate costs a thread switch per group: the
worker that finished a read goes to sleep and a waiting one must be woken and must win the GIL
back from the consumer (docs/performance.md, "Reader threads that change in number"). Here a
worker that finishes a task takes the next one itself while fewer than
:attr:`ReaderThreads.limit` run, the way a fixed executor's workers do; only a raised limit
wakes an idle one. Tasks start in the order they were submitted, so groups are read in order,
whatever the limit.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .blocks import WindowCache
from .indexblocks import EpochIndices

if TYPE_CHECKING:
    from .feed import Feed
    from .read import Allocator

__all__ = ["EpochPass", "ReaderThreads"]


class ReaderThreads:
    """Runs submitted calls in order, at most :attr:`limit` at once, in up to ``most`` threads
    (started as needed); :attr:`limit` may change at any time (a lower one takes effect as
    running calls end)."""

    def __init__(self, limit: int, most: int, name: str = "arrayfeed-read") -> None:
        self._cond = threading.Condition()
        self._limit = max(1, limit)
        self._most = max(1, most)
        self._name = name
        self._tasks: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._idle = 0
        self._closed = False

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        value = max(1, min(value, self._most))
        if value != self._limit:
            with self._cond:
                self._limit = value
                self._start_if_needed()
                self._cond.notify_all()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("arrayfeed: reader threads used after they were shut down")
            self._tasks.append((future, fn, args))
            self._start_if_needed()
            self._cond.notify()
        return future

    def shutdown(self) -> None:
        """Cancel what has not started; wait for what has; end the threads."""
        with self._cond:
            self._closed = True
            while self._tasks:
                self._tasks.popleft()[0].cancel()
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()

    def _start_if_needed(self) -> None:  # holding the lock
        runnable = min(len(self._tasks), self._limit - self._running)
        if runnable > self._idle and len(self._threads) < self._most:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            self._idle += 1  # counted idle until it takes a task
            thread.start()

    def _work(self) -> None:
        cond = self._cond
        while True:
            with cond:
                cond.wait_for(lambda: self._closed or (self._tasks and self._running < self._limit))
                if not self._tasks:  # closed, nothing left
                    self._idle -= 1
                    return
                future, fn, args = self._tasks.popleft()
                self._idle -= 1
                self._running += 1
                if self._tasks and self._running < self._limit:  # another may start too
                    self._start_if_needed()
                    cond.notify()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
            del future, fn, args  # hold nothing between tasks
            with cond:  # then take the next task in this thread, if it may run
                self._running -= 1
                self._idle += 1


class EpochPass:
    """One pass over ``epoch`` from ``start_step`` on: groups read by the feed's reader threads,
    each into memory of the caller's choice, with the feed's reading ahead (the next block of
    indices, the next window of a block shuffle). Groups are submitted in order."""

    def __init__(self, feed: Feed, epoch: int, start_step: int = 0) -> None:
        self.feed, self.epoch = feed, epoch
        self.readers = feed.readers(epoch)
        self.indices = EpochIndices(
            feed.plan, epoch, start_step, feed.group_steps, feed.index_buffer
        )
        self._caches = [r for r in self.readers if isinstance(r, WindowCache)]
        self._warmed: set[int] = set()
        # Threads are started as reads are submitted, up to the most the tuner may ask for.
        self._pool = ReaderThreads(feed.tuner.threads, feed.pool_threads)

    @property
    def threads(self) -> int:
        """How many of its tasks run at once (the tuner's setting; tasks beyond it wait)."""
        return self._pool.limit

    @threads.setter
    def threads(self, value: int) -> None:
        self._pool.limit = value

    def submit(self, first: int, stop: int, out: Allocator | None = None) -> Future[Any]:
        """Read steps ``[first, stop)`` into ``out`` (default: the feed's pool)."""
        feed = self.feed
        future = self._pool.submit(
            feed.read_group, self.epoch, first, stop, self.readers, self.indices, out
        )
        block = self.indices.block_of(first)
        if self.indices.starts[block] == first:  # compute the next block while this is read
            self._pool.submit(self.indices.prepare, block + 1)
        if self._caches:  # read the next window while groups are served from this one
            last = min(stop * feed.plan.batch_size, feed.plan.rows_per_epoch) - 1
            ahead = self._caches[0].order.window_at(last) + 1
            if ahead not in self._warmed:
                self._warmed.add(ahead)
                # With one thread, decoding the next window would hold back this one's groups:
                # it is only announced (object storage starts fetching it).
                read = self.threads > 1
                for cache in self._caches:
                    self._pool.submit(cache.prefetch_window, ahead, read)
        return future

    def close(self) -> None:
        """Drop what was not started; wait for what was."""
        self._pool.shutdown()
