"""Reader threads whose number may change: in order, never more at once than the limit, and a
worker that finishes a task takes the next itself (no thread switch per group)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from arrayfeed._pipeline.read.readers import ReaderThreads


class Recorder:
    """Tasks that note when they start, how many run at once, and in which thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.threads: list[str] = []
        self.running = 0
        self.most = 0

    def task(self, i: int, seconds: float) -> int:
        with self.lock:
            self.started.append(i)
            self.threads.append(threading.current_thread().name)
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(seconds)
        with self.lock:
            self.running -= 1
        return i * i


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_tasks_start_in_order_and_at_most_limit_at_once(limit: int) -> None:
    rec, pool = Recorder(), ReaderThreads(limit, most=8)
    futures = [pool.submit(rec.task, i, 0.01) for i in range(24)]
    assert [f.result(timeout=10) for f in futures] == [i * i for i in range(24)]
    pool.shutdown()
    assert rec.started == list(range(24))
    assert rec.most == limit


def test_one_at_a_time_runs_in_one_thread() -> None:
    """A worker that ends a task takes the next one itself: with a limit of one, every task of
    a pass runs in the same thread, however many threads the pool may start."""
    rec, pool = Recorder(), ReaderThreads(1, most=8)
    futures = [pool.submit(rec.task, i, 0.002) for i in range(20)]
    for f in futures:
        f.result(timeout=10)
    pool.shutdown()
    assert len(set(rec.threads)) == 1


def test_limit_changed_while_running() -> None:
    """Random limits while tasks run: starts stay in order, and no more run at once than the
    highest limit set; raising the limit starts more at once."""
    rng = random.Random(3)
    rec, pool = Recorder(), ReaderThreads(1, most=6)
    futures = []
    highest = 1
    for i in range(120):
        if i % 7 == 0:
            pool.limit = rng.choice([1, 2, 3, 4, 6])
            highest = max(highest, pool.limit)
        futures.append(pool.submit(rec.task, i, rng.random() * 0.004))
    pool.limit = 6
    for f in futures:
        f.result(timeout=20)
    assert rec.started == list(range(120))
    assert 1 < rec.most <= highest
    rec.most = 0
    futures = [pool.submit(rec.task, i, 0.02) for i in range(12)]
    for f in futures:
        f.result(timeout=10)
    assert rec.most == 6
    pool.limit = 2
    rec.most = 0
    futures = [pool.submit(rec.task, i, 0.01) for i in range(12)]
    for f in futures:
        f.result(timeout=10)
    pool.shutdown()
    assert rec.most == 2


def test_errors_reach_the_future_and_shutdown_cancels_what_waits() -> None:
    pool = ReaderThreads(1, most=2, name="test-readers")
    release = threading.Event()

    def boom() -> None:
        raise ValueError("bad group")

    first = pool.submit(release.wait, 10)
    failing = pool.submit(boom)
    waiting = [pool.submit(time.sleep, 0) for _ in range(5)]
    threading.Timer(0.1, release.set).start()
    assert first.result(timeout=10) is True
    with pytest.raises(ValueError, match="bad group"):
        failing.result(timeout=10)
    blocked = pool.submit(release.wait, 10)  # runs: released already
    blocked.result(timeout=10)
    gate = threading.Event()
    running = pool.submit(gate.wait, 10)
    queued = [pool.submit(time.sleep, 0) for _ in range(3)]
    time.sleep(0.05)
    threading.Timer(0.2, gate.set).start()
    pool.shutdown()  # waits for the running one, cancels the queued
    assert running.result() is True
    assert all(f.cancelled() for f in queued)
    assert all(f.done() for f in waiting)
    assert not [t for t in threading.enumerate() if t.name.startswith("test-readers")]
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(time.sleep, 0)


def test_parked_threads_end_when_idle_and_start_again() -> None:
    """Parked threads finish what was submitted, then end (a pass read ahead after the last
    epoch leaves no threads behind); a later submit starts them again, in order."""
    rec, pool = Recorder(), ReaderThreads(2, most=4, name="test-readers-park")
    futures = [pool.submit(rec.task, i, 0.02) for i in range(6)]
    pool.park()
    assert [f.result(timeout=10) for f in futures] == [i * i for i in range(6)]
    deadline = time.monotonic() + 10
    while pool.alive and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.alive == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("test-readers-park")]
    more = [pool.submit(rec.task, i, 0.01) for i in range(6, 10)]
    assert [f.result(timeout=10) for f in more] == [i * i for i in range(6, 10)]
    assert pool.alive > 0  # not parked any more: idle threads wait for work
    pool.shutdown()
    assert rec.started == list(range(10)) and rec.most == 2
    assert pool.alive == 0


def test_parked_threads_above_a_lowered_limit_end_too() -> None:
    """Idle threads left from a higher limit wait while tasks are queued beyond the lowered
    one; parked, they end once the last task is taken (each thread that ends wakes the next)."""
    rec, pool = Recorder(), ReaderThreads(4, most=4, name="test-readers-lowered")
    first = [pool.submit(rec.task, i, 0.01) for i in range(4)]  # four threads started
    for f in first:
        f.result(timeout=10)
    assert pool.alive == 4
    pool.limit = 1
    more = [pool.submit(rec.task, i, 0.02) for i in range(4, 7)]
    pool.park()
    assert [f.result(timeout=10) for f in more] == [i * i for i in range(4, 7)]
    deadline = time.monotonic() + 10
    while pool.alive and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool.alive == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("test-readers-lowered")]
