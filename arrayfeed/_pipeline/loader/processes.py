"""Loader processes: started as new interpreters, shared by the feeds of this process.

:class:`LoaderProcess` is one loader (:mod:`.server`), started with ``python -c`` (never a fork:
this process may hold TensorFlow's threads and locks, and a script's ``__main__`` is never run
again there); :func:`loaders` keeps this process's, started when a feed first needs them, and
stops each :data:`LINGER_SECONDS` after the last feed it served is gone.

Every loader is started by one thread that lives as long as the process (:func:`start_process`):
a loader asks Linux to kill it when its parent dies (``PR_SET_PDEATHSIG``), and for Linux the
parent is the *thread* that forked it. Started from whichever thread first needed one (a
dataset read in a thread of its own), a loader would die when that thread ended, under every
other dataset it serves.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ..._forks import renew_after_fork
from .wire import Channel, Hello, PrepareFeed, RegisterFeed

__all__ = ["LINGER_SECONDS", "STOP_SECONDS", "LoaderProcess", "loaders", "start_process"]

#: Seconds a loader gets to exit by itself before it is terminated.
STOP_SECONDS = 2.0
#: Seconds a loader serving no feed any more waits for a new one before it stops (a script
#: that builds datasets one after the other starts one loader, not one per dataset).
LINGER_SECONDS = 2.0

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])
_START = (
    f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
    "from arrayfeed._pipeline.loader.server import main; main()"
)


class _Starter:
    """The thread that starts every loader of this process (see the module docstring): it lives
    until the process exits, taking calls from a queue; a forked child makes its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def run(self, call: Callable[[], Any]) -> Any:
        """``call()``, run in the starter thread; its result, or its exception raised here."""
        with self._lock:
            if self._thread is None or self._pid != os.getpid():
                self._calls, self._pid = queue.SimpleQueue(), os.getpid()
                self._thread = threading.Thread(
                    target=self._serve,
                    args=(self._calls,),
                    name="arrayfeed-loader-start",
                    daemon=True,
                )
                self._thread.start()
            calls = self._calls
        if threading.current_thread() is self._thread:
            return call()
        done: Future[Any] = Future()
        calls.put((call, done))
        return done.result()

    @staticmethod
    def _serve(calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
        while True:
            call, done = calls.get()
            try:
                done.set_result(call())
            except BaseException as exc:
                done.set_exception(exc)
            del call, done


_STARTER = _Starter()


def start_process(args: list[str], pass_fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
    """``args`` started as a process by the thread that lives as long as this process (its
    parent, for ``PR_SET_PDEATHSIG``), with the descriptors ``pass_fds``."""
    return _STARTER.run(  # type: ignore[no-any-return]
        lambda: subprocess.Popen(args, pass_fds=pass_fds, stdin=subprocess.DEVNULL)
    )


#: Descriptors this process may open that starting a loader raises its soft limit to, within
#: the hard limit: each dataset read through loaders holds a few (its slots, its links), and
#: the usual soft limit of 1,024 ran out at about 100 datasets.
DESCRIPTORS = 1 << 16


def _raise_descriptor_limit() -> None:
    """Raise this process's soft limit on open descriptors to :data:`DESCRIPTORS` (within the
    hard limit), if it is lower."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, DESCRIPTORS)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


class LoaderProcess:
    """One loader process and the control socket that registers feeds with it."""

    def __init__(self) -> None:
        _raise_descriptor_limit()
        parent, child = socket.socketpair()
        try:
            self.popen = start_process(
                [sys.executable, "-c", _START, str(child.fileno())], (child.fileno(),)
            )
        finally:
            child.close()
        self.pid = self.popen.pid
        self.control = Channel(parent)
        self.control.send(Hello(list(sys.path), os.getpid()))

    def register(self, feed_id: int, blob: bytes) -> Channel:
        """A channel of its own for the feed ``feed_id`` (pickled as ``blob``)."""
        mine, theirs = socket.socketpair()
        try:
            self.control.send(RegisterFeed(feed_id, blob, dict(os.environ)), [theirs.fileno()])
        finally:
            theirs.close()
        return Channel(mine)

    def prepare(self, feed_id: int, blob: bytes) -> None:
        """Have it unpickle the feed ``feed_id`` now, which it may soon be asked to serve (see
        :class:`~.wire.PrepareFeed`)."""
        self.control.send(PrepareFeed(feed_id, blob, dict(os.environ)))

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_code(self, timeout: float = 5.0) -> int | None:
        """The exit code once the process has ended (None: still running after ``timeout``)."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Close its control socket (it exits), then make sure it has."""
        self.control.close()
        for hurry in (None, self.popen.terminate, self.popen.kill):
            if hurry is not None and self.popen.poll() is None:
                hurry()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(STOP_SECONDS)
                return


class _Loaders:
    """This process's loader processes: started when a feed first needs them, shared by its
    feeds, and stopped :data:`LINGER_SECONDS` after the last feed using them is gone."""

    def __init__(self) -> None:
        # A feed collected by the garbage collector (one in a reference cycle) is released by
        # its finalizer at any allocation, on whatever thread allocates: also the thread that
        # holds this lock (re-entrant, so it goes on), and the starter thread while another
        # holds it waiting for a loader to start. A release never waits for the lock: it is
        # queued, and applied by whoever holds the lock as it lets go (:meth:`_unlock`).
        self._lock = threading.RLock()
        renew_after_fork(self, "_lock")  # a fork while another thread takes loaders
        self._pending: deque[tuple[int, LoaderProcess | None]] = deque()
        self._processes: list[LoaderProcess] = []
        self._users: dict[int, set[int]] = {}  # pid -> feeds it serves
        self._timers: dict[int, threading.Timer] = {}
        self._pid = os.getpid()

    def take(self, count: int, feed_id: int) -> list[LoaderProcess]:
        """``count`` loaders for the feed ``feed_id``, started (or restarted) as needed."""
        self._lock.acquire()
        try:
            if self._pid != os.getpid():  # a fork's inheritance: its parent's loaders
                self._processes, self._users, self._timers = [], {}, {}
                self._pending.clear()
                self._pid = os.getpid()
            for process in [p for p in self._processes if not p.alive()]:
                self._forget(process)
                process.stop()
            while len(self._processes) < count:
                process = LoaderProcess()
                self._processes.append(process)
                self._users[process.pid] = set()
            taken = self._processes[:count]
            for process in taken:
                self._users[process.pid].add(feed_id)
                timer = self._timers.pop(process.pid, None)
                if timer is not None:
                    timer.cancel()
            return taken
        finally:
            self._unlock()

    def release(self, feed_id: int, only: LoaderProcess | None = None) -> None:
        """The feed ``feed_id`` is gone (or no longer read by the loader ``only``): loaders
        that serve no other feed stop soon. Never waits for another thread (see __init__)."""
        self._pending.append((feed_id, only))
        if self._lock.acquire(blocking=False):
            self._unlock()

    def _unlock(self) -> None:
        """Apply the releases queued, then let go of the lock; again if more were queued
        meanwhile and the lock is free (else its new holder applies them)."""
        while True:
            try:
                while self._pending:
                    self._release(*self._pending.popleft())
            finally:
                self._lock.release()
            if not self._pending or not self._lock.acquire(blocking=False):
                return

    def _release(self, feed_id: int, only: LoaderProcess | None) -> None:
        if self._pid == os.getpid():
            for process in self._processes if only is None else [only]:
                users = self._users.get(process.pid, set())
                users.discard(feed_id)
                if not users and process.pid not in self._timers:
                    timer = threading.Timer(LINGER_SECONDS, self._idle, (process,))
                    timer.daemon = True
                    self._timers[process.pid] = timer
                    timer.start()

    def _idle(self, process: LoaderProcess) -> None:
        self._lock.acquire()
        try:
            if self._timers.get(process.pid) is None or self._users.get(process.pid):
                return
            self._forget(process)
        finally:
            self._unlock()
        process.stop()

    def _forget(self, process: LoaderProcess) -> None:
        if process in self._processes:
            self._processes.remove(process)
        self._users.pop(process.pid, None)
        timer = self._timers.pop(process.pid, None)
        if timer is not None:
            timer.cancel()

    def stop(self) -> None:
        with self._lock:
            processes, self._processes = self._processes, []
            for timer in self._timers.values():
                timer.cancel()
            self._users, self._timers = {}, {}
            self._pending.clear()
            if self._pid != os.getpid():
                return
        for process in processes:
            process.stop()

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._processes if p.alive()]


_LOADERS = _Loaders()
atexit.register(_LOADERS.stop)


def loaders() -> _Loaders:
    """This process's loader processes."""
    return _LOADERS
