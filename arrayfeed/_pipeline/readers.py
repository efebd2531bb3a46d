"""Reader threads whose number may change while they read: a first-in, first-out executor.

An :class:`~.feed.EpochPass` reads its groups in these threads, as many at once as the tuner
says (:mod:`.tuning`). ``concurrent.futures.ThreadPoolExecutor`` cannot change its number of
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
from typing import Any

__all__ = ["ReaderThreads"]


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
