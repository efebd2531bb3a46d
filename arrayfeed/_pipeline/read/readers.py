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
whatever the limit. Threads that :meth:`ReaderThreads.park` lets go end once no task is
left, and start again if more are submitted.

A pass over a short epoch may be followed by the next one while it ends (:meth:`EpochPass.follow`):
the next epoch's first groups are read in the same threads while the last of this one are
consumed, as tf.data's ``repeat().prefetch()`` reads across epochs, instead of every epoch
starting with nothing in flight (docs/performance.md, "Short epochs").
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from ..._forks import renew_after_fork
from ..._storage import Source
from ..plan.indexblocks import EpochIndices, groups
from ..plan.plan import Plan
from ..tune.tuning import Tuner
from .blocks import WindowCache
from .rows import Allocator

__all__ = [
    "FOLLOW_SECONDS",
    "EpochPass",
    "PassAhead",
    "PassFeed",
    "ReaderThreads",
    "read_pass",
    "reads_next",
]

#: A pass that has read for less than this many seconds when its last group is requested reads
#: the first groups of the next epoch too (as many as are in flight), while its own last groups
#: are taken: every pass starts with nothing in flight, and on short epochs (a few groups, each
#: one read long) waiting for the first group is a large share of each (docs/performance.md,
#: "Short epochs"). Beyond this, one group's read is a small share of the epoch, and the
#: groups read ahead would be memory held after the last epoch.
FOLLOW_SECONDS = 2.0


class ReaderThreads:
    """Runs submitted calls in order, at most :attr:`limit` at once, in up to ``most`` threads
    (started as needed); :attr:`limit` may change at any time (a lower one takes effect as
    running calls end)."""

    def __init__(
        self,
        limit: int,
        most: int,
        name: str = "arrayfeed-read",
        on_cpu: Callable[[float], None] | None = None,
    ) -> None:
        #: Told the CPU seconds each task used (the tuner measures the readers' CPU).
        self._on_cpu = on_cpu
        self._cond = threading.Condition()
        self._limit = max(1, limit)
        self._most = max(1, most)
        self._name = name
        self._tasks: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = deque()
        self._threads: list[threading.Thread] = []
        self._running = 0
        self._idle = 0
        self._closed = False
        self._parked = False

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
            self._parked = False
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
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def park(self) -> None:
        """Let the threads end once no task is left (what was submitted still runs, and a
        later :meth:`submit` starts threads again); they are not waited for."""
        with self._cond:
            self._parked = True
            self._cond.notify_all()

    @property
    def alive(self) -> int:
        """Threads started and not ended."""
        with self._cond:
            return len(self._threads)

    def start(self, count: int) -> None:
        """Start threads up to ``count`` (within ``most``) before they are needed."""
        with self._cond:
            while len(self._threads) < min(count, self._most) and not self._closed:
                self._start()

    def _start_if_needed(self) -> None:  # holding the lock
        runnable = min(len(self._tasks), self._limit - self._running)
        if runnable > self._idle and len(self._threads) < self._most:
            self._start()

    def _start(self) -> None:  # holding the lock
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
                cond.wait_for(
                    lambda: (
                        self._closed
                        or (self._parked and not self._tasks)
                        or (self._tasks and self._running < self._limit)
                    )
                )
                if not self._tasks:  # closed or parked, nothing left
                    self._idle -= 1
                    self._threads.remove(threading.current_thread())
                    cond.notify_all()  # idle threads above a lowered limit end too
                    return
                future, fn, args = self._tasks.popleft()
                self._idle -= 1
                self._running += 1
                if self._tasks and self._running < self._limit:  # another may start too
                    self._start_if_needed()
                    cond.notify()
            if future.set_running_or_notify_cancel():
                began, cpu = time.perf_counter(), time.thread_time()
                try:
                    result = fn(*args)
                except BaseException as exc:
                    future.set_exception(exc)
                else:  # how long it took, for the tuner (set before the result wakes a waiter)
                    future.seconds = time.perf_counter() - began  # type: ignore[attr-defined]
                    future.set_result(result)
                if self._on_cpu is not None:
                    self._on_cpu(time.thread_time() - cpu)
            del future, fn, args  # hold nothing between tasks
            with cond:  # then take the next task in this thread, if it may run
                self._running -= 1
                self._idle += 1


class PassFeed(Protocol):
    """What a pass reads of its feed (:class:`~.feed.Feed` is one): its plan and groups, the
    sources of an epoch, how to read a group, its tuner and the pass it read ahead."""

    plan: Plan
    group_steps: int
    tuner: Tuner
    ahead: PassAhead

    @property
    def pool_threads(self) -> int: ...

    @property
    def index_allocator(self) -> Callable[[int], np.ndarray]: ...

    @property
    def next_position(self) -> tuple[int, int]: ...

    def readers(self, epoch: int) -> list[Source]: ...

    def ramps(self) -> bool: ...

    def read_group(
        self,
        epoch: int,
        first: int,
        stop: int,
        readers: Sequence[Source] | None = None,
        blocks: EpochIndices | None = None,
        out: Allocator | None = None,
    ) -> Any: ...


class EpochPass:
    """One pass over ``epoch`` from ``start_step`` on: groups read by reader threads (its own, or
    those of the pass it follows), each into memory of the caller's choice, with the feed's
    reading ahead (the next block of indices, the next window of a block shuffle). Groups are
    submitted in order; :meth:`fill` submits them in turn into :attr:`pending`. With ``ramp``,
    its first group is split into smaller ones (:func:`~..plan.indexblocks.ramp_sizes`)."""

    def __init__(
        self,
        feed: PassFeed,
        epoch: int,
        start_step: int = 0,
        threads: ReaderThreads | None = None,
        ramp: bool = False,
    ) -> None:
        # Weakly: a pass read ahead is held by its feed (Feed.ahead), which must still be freed
        # when its dataset is dropped; while a pass is read, its reader holds the feed.
        self._feed = weakref.ref(feed)
        self.epoch, self.start_step, self.ramp = epoch, start_step, ramp
        self.readers = feed.readers(epoch)
        self.indices = EpochIndices(
            feed.plan, epoch, start_step, feed.group_steps, feed.index_allocator, ramp
        )
        self._caches = [r for r in self.readers if isinstance(r, WindowCache)]
        self._warmed: set[int] = set()
        #: Loaders reading this pass, each taking every ``stride``-th window of a block shuffle
        #: (see :meth:`~.loader.client.RemoteFeed._ask`): the next window this one reads is
        #: ``stride`` windows on.
        self.stride = 1
        #: ``(first, stop)`` of the groups :meth:`fill` has not submitted yet (none until
        #: :meth:`plan`), and ``(steps, future)`` of those submitted and not taken, in order.
        self.todo: deque[tuple[int, int]] = deque()
        self.pending: deque[tuple[int, Future[Any]]] = deque()
        self.pid = os.getpid()
        # Threads are started as reads are submitted, up to the most the tuner may ask for.
        if threads is None:
            tuner = feed.tuner
            threads = ReaderThreads(tuner.threads, feed.pool_threads, on_cpu=tuner.read_cpu)
        self._pool = threads

    @property
    def feed(self) -> PassFeed:
        """The feed this pass reads (held weakly: one that is gone is an error)."""
        feed = self._feed()
        if feed is None:
            raise RuntimeError("arrayfeed: a pass over a feed that is gone")
        return feed

    def plan(self) -> EpochPass:
        """Make :attr:`todo` every group of the pass (for :meth:`fill`); returns the pass."""
        feed = self.feed
        self.todo.extend(groups(feed.plan, self.start_step, feed.group_steps, self.ramp))
        return self

    @property
    def threads(self) -> int:
        """How many of its tasks run at once (the tuner's setting; tasks beyond it wait)."""
        return self._pool.limit

    @threads.setter
    def threads(self, value: int) -> None:
        self._pool.limit = value

    def fill(self, room: int, ahead: bool = True) -> None:
        """Submit the next groups, in order, while fewer than ``room`` are pending (``ahead``:
        with the work that prepares later groups, see :meth:`submit`)."""
        while self.todo and len(self.pending) < room:
            first, stop = self.todo.popleft()
            self.pending.append((stop - first, self.submit(first, stop, ahead=ahead)))

    def follow(self) -> EpochPass:
        """The pass over the next epoch from its start, read by these threads: its groups may
        be submitted while this pass's last groups are still being taken."""
        return EpochPass(self.feed, self.epoch + 1, 0, self._pool).plan()

    def submit(
        self, first: int, stop: int, out: Allocator | None = None, ahead: bool = True
    ) -> Future[Any]:
        """Read steps ``[first, stop)`` into ``out`` (default: the feed's pool); ``ahead``:
        also compute the next index block when this group begins one, and read the next window
        of a block shuffle (without: those are computed when their groups are read)."""
        feed = self.feed
        future = self._pool.submit(
            feed.read_group, self.epoch, first, stop, self.readers, self.indices, out
        )
        if not ahead:
            return future
        block = self.indices.block_of(first)
        if self.indices.starts[block] == first:  # compute the next block while this is read
            self._pool.submit(self.indices.prepare, block + 1)
        if self._caches:  # read the next window while groups are served from this one
            last = min(stop * feed.plan.batch_size, feed.plan.rows_per_epoch) - 1
            window = self._caches[0].order.window_at(last) + self.stride
            if window not in self._warmed:
                self._warmed.add(window)
                # With one thread, decoding the next window would hold back this one's groups:
                # it is only announced (object storage starts fetching it).
                read = self.threads > 1
                for cache in self._caches:
                    self._pool.submit(cache.prefetch_window, window, read)
        return future

    def start_threads(self) -> None:
        """Start the threads the tuner asks for now, before their reads are submitted."""
        self._pool.start(self.threads)

    def close(self) -> None:
        """Drop what was not started; wait for what was (of every pass these threads read)."""
        self._pool.shutdown()

    def park(self) -> None:
        """Let the threads end once what was submitted has been read (a following pass that
        submits more starts them again)."""
        self._pool.park()


class PassAhead:
    """The pass over the next epoch that a short pass read ahead, kept for the call that takes
    that epoch, and how long the last pass took (a feed has one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._pass: EpochPass | None = None
        #: Seconds the last pass that ended took, from its start (None before one has).
        self.last_seconds: float | None = None

    @property
    def held(self) -> EpochPass | None:
        """The pass kept, if any."""
        return self._pass

    def keep(self, after: EpochPass) -> None:
        """Keep ``after`` (dropping one kept before: another iterator's, never taken)."""
        with self._lock:
            dropped, self._pass = self._pass, after
        if dropped is not None:
            dropped.close()

    def take(self, epoch: int, start_step: int) -> EpochPass | None:
        """The pass kept for ``epoch`` from ``start_step``, if that is the one kept; another is
        dropped (the feed was moved by ``seek``, or another iterator took that epoch)."""
        with self._lock:
            after, self._pass = self._pass, None
        if after is None or after.pid != os.getpid():  # a forked child has none of its threads
            return None
        if (after.epoch, after.start_step) == (epoch, start_step):
            return after
        after.close()
        return None

    def drop(self) -> None:
        """Drop the pass kept, if any."""
        self.take(-1, 0)  # (no pass is for epoch -1)

    def drop_unless(self, epoch: int, start_step: int) -> None:
        """Drop the pass kept unless it is for ``epoch`` from ``start_step``."""
        kept = self.take(epoch, start_step)
        if kept is not None:
            self.keep(kept)


def read_pass(feed: PassFeed, epoch: int, start_step: int = 0) -> Generator[Any, None, None]:
    """The groups of ``epoch`` from ``start_step`` on, read ahead by reader threads, in order,
    as many at once as the feed's tuner says and one more requested.

    A short pass (see :func:`reads_next`) whose feed takes the next epoch from its start next
    reads that epoch's first groups too, once its own are all submitted, within the same groups
    in flight; it ends holding them in ``feed.ahead`` (its threads end once they are read), and
    the pass over that epoch starts from them. A pass cut short drops them."""
    tuner, batch = feed.tuner, feed.plan.batch_size
    reading = feed.ahead.take(epoch, start_step)
    if reading is None:
        tuner.pass_started()
        reading = EpochPass(feed, epoch, start_step, ramp=feed.ramps()).plan()
    else:
        tuner.pass_started(carried=len(reading.pending), whole=not reading.todo)
    began, after, kept = time.perf_counter(), None, None
    follow = True  # until the next epoch is read ahead, or cannot be
    # A ramped pass (a start) reads its first group alone, nothing ahead of it: reads and
    # planning ahead would take the interpreter from it and from the consumer waiting for it.
    # The rest is asked for as soon as it is read, before it is handed over.
    # Its other threads start while it is read: a thread started when the rest is asked for
    # would take the interpreter from the consumer the first group is being handed to.
    alone = reading.ramp
    try:
        while reading.todo or reading.pending:
            reading.threads = threads = tuner.threads
            reading.fill(1 if alone else threads + 1, ahead=not alone)
            if alone:
                reading.start_threads()
            if follow and not reading.todo and reads_next(feed, epoch, began):
                try:
                    after = reading.follow()
                except Exception:  # planning the next epoch failed: its own pass will say why
                    after = None
                follow = False
            if after is not None:  # within the same groups in flight
                try:
                    after.fill(threads + 1 - len(reading.pending))
                except Exception:  # as above (what it submitted ends with the threads)
                    after = None
            steps, future = reading.pending.popleft()
            asked = time.perf_counter()
            group = future.result()
            if alone:
                reading.fill(threads + 1)
                alone = False
            seconds = getattr(future, "seconds", None)
            tuner.delivered(steps * batch, waited=time.perf_counter() - asked, seconds=seconds)
            yield group
        tuner.pass_ended()
        feed.ahead.last_seconds = time.perf_counter() - began
        kept, after = after, None
    finally:
        if kept is None:  # cut short, or nothing read ahead
            reading.close()  # (a pass read ahead shares the threads: it ends too)
    if kept is not None:
        reading.park()  # the threads end once the next epoch's first groups are read
        feed.ahead.keep(kept)


def reads_next(feed: PassFeed, epoch: int, began: float) -> bool:
    """Whether the pass over ``epoch`` that began at ``began`` reads the next one ahead: when
    the feed takes that epoch from its start next, and both this pass so far and the last one
    that ended took less than :data:`FOLLOW_SECONDS` (the first pass of a feed reads none
    ahead: an epoch of few large groups submits its last one at once, however long it takes)."""
    last = feed.ahead.last_seconds
    if last is None or last >= FOLLOW_SECONDS:
        return False
    short = time.perf_counter() - began < FOLLOW_SECONDS
    return short and feed.next_position == (epoch + 1, 0)
