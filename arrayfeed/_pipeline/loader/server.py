"""The loader process: reads groups for the feeds of one training process, into shared memory.

Started by :class:`~.client.LoaderProcess` as a new interpreter (``python -c``, never a fork: the
training process may hold TensorFlow's threads and locks, and a script's ``__main__`` is never
run again here). It serves every feed the training process registers, each with its own reader
threads, exactly as that process would read them itself (:class:`~..readers.EpochPass`); only the
memory differs: each group is written into the slot the training process names.

It runs at a lower scheduling priority than the training process, and dies with it: ``PR_SET_PDEATHSIG`` on Linux, and everywhere a closed
control socket (the training process's end goes with it) or a parent pid that changed. It
ignores SIGINT: Ctrl-C is the training process's to handle, and ends this process by closing
the sockets.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._storage import forget_filesystems
from .slots import Area, mapped
from .wire import (
    AddSlots,
    Channel,
    EndEpoch,
    EpochEnded,
    Failed,
    Hello,
    Loaded,
    PrepareFeed,
    Raised,
    Read,
    Registered,
    RegisterFeed,
    StartEpoch,
)

__all__ = ["main"]

#: Seconds between checks that the training process is still there.
PARENT_CHECK_SECONDS = 1.0
#: How much lower than the training process a loader is scheduled (``nice``).
NICE = 10


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # a libc without prctl: the socket still tells
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_DEATHSIG


class _Pass:
    """The loader's side of one pass over an epoch: its reads and when they are all done."""

    def __init__(self, reading: Any) -> None:
        self.reading = reading
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.running = 0
        self.ended = False


class FeedServer:
    """Serves one feed over its own channel: slots, passes and their reads."""

    def __init__(
        self, feed_id: int, feed: Any, channel: Channel, gone: Callable[[int], None]
    ) -> None:
        self.feed_id, self.feed, self.channel, self._gone = feed_id, feed, channel, gone
        self.slots: dict[int, npt.NDArray[np.uint8]] = {}
        self.passes: dict[int, _Pass] = {}
        self.thread = threading.Thread(
            target=self._serve, name=f"arrayfeed-loader-{feed_id}", daemon=True
        )

    def _serve(self) -> None:
        try:
            while True:
                message, fds = self.channel.recv()
                self._handle(message, fds)
        except (EOFError, OSError):
            pass  # the training process dropped the feed or is gone
        finally:
            for token in list(self.passes):
                self._end(token, notify=False)
            self.slots.clear()
            self.channel.close()
            self._gone(self.feed_id)

    def _handle(self, message: Any, fds: list[int]) -> None:
        if isinstance(message, Read):
            self._read(message)
        elif isinstance(message, StartEpoch):
            self._start(message)
        elif isinstance(message, EndEpoch):
            self._end(message.token, notify=True)
        elif isinstance(message, AddSlots):
            for i, fd in enumerate(fds):
                self.slots[message.first + i] = mapped(fd, message.size)
                os.close(fd)
            for slot in message.retire:
                self.slots.pop(slot, None)

    def _start(self, message: StartEpoch) -> None:
        from ..read.readers import EpochPass

        state = _Pass(None)
        try:
            state.reading = EpochPass(
                self.feed, message.epoch, message.start_step, ramp=message.ramp
            )
        except BaseException as exc:  # every read of the pass reports it
            state.error = exc
        self.passes[message.token] = state

    def _read(self, message: Read) -> None:
        state = self.passes.get(message.token)
        if state is None or state.error is not None or state.reading is None:
            error = state.error if state is not None else None
            self._raised(message, error or RuntimeError("arrayfeed: a read of an ended pass"))
            return
        area = Area(self.slots[message.slot])
        with state.lock:
            state.running += 1
        try:
            state.reading.threads = message.threads
            state.reading.stride = message.loaders
            future = state.reading.submit(message.first, message.stop, area)
        except BaseException as exc:
            self._done(message, state, area, None, exc)
            return
        future.add_done_callback(lambda f: self._finished(message, state, area, f))

    def _finished(self, message: Read, state: _Pass, area: Area, future: Future[Any]) -> None:
        if future.cancelled():
            self._done(message, state, area, None, None)
            return
        self._done(message, state, area, future, future.exception())

    def _done(
        self,
        message: Read,
        state: _Pass,
        area: Area,
        future: Future[Any] | None,
        error: BaseException | None,
    ) -> None:
        try:
            if error is not None:
                self._raised(message, error)
            elif future is not None:
                seconds = getattr(future, "seconds", 0.0)  # (see ReaderThreads)
                reply = Loaded(
                    message.token,
                    message.first,
                    message.slot,
                    area.descriptors,
                    seconds,
                    time.process_time(),
                )
                with contextlib.suppress(OSError):
                    self.channel.send(reply)
        finally:
            with state.lock:
                state.running -= 1
                last = state.ended and state.running == 0
            if last:
                self._send_ended(message.token)

    def _raised(self, message: Read, error: BaseException) -> None:
        trace = "".join(traceback.format_exception(error))
        failed = Failed.of(error, trace)
        with contextlib.suppress(OSError):
            self.channel.send(Raised(message.token, message.first, message.slot, failed))

    def _end(self, token: int, *, notify: bool) -> None:
        state = self.passes.pop(token, None)
        if state is None:
            if notify:
                self._send_ended(token)
            return

        def close() -> None:
            if state.reading is not None:
                state.reading.close()  # cancels what did not start, waits for the rest
            with state.lock:
                state.ended = True
                last = state.running == 0
            if last and notify:
                self._send_ended(token)

        threading.Thread(target=close, name="arrayfeed-loader-end", daemon=True).start()

    def _send_ended(self, token: int) -> None:
        with contextlib.suppress(OSError):
            self.channel.send(EpochEnded(token))


def _set_environ(environ: dict[str, str]) -> bool:
    """Take the training process's environment ``environ`` (as it is when a feed is built);
    whether it changed this process's."""
    if not environ or environ == dict(os.environ):
        return False
    os.environ.clear()
    os.environ.update(environ)
    forget_filesystems()  # made with the credentials and endpoints of the old one
    return True


def _load(blob: bytes) -> Any:
    """The feed pickled as ``blob``, unpickled (opening its sources), or the :class:`Failed` that
    says why it could not be."""
    try:
        return pickle.loads(blob)
    except BaseException as exc:
        return Failed.of(exc, "".join(traceback.format_exception(exc)))


def main() -> None:
    """Entry point of a loader process: ``python -c '...; main()' FD``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    # Below the training process: where cores are few, the training loop gets one when it wants
    # it (docs/performance.md, "Beside the training loop").
    with contextlib.suppress(OSError):
        os.nice(NICE)
    control = Channel(socket.socket(fileno=int(sys.argv[1])))
    hello, _ = control.recv()
    assert isinstance(hello, Hello)
    sys.path[:] = hello.sys_path
    if os.getppid() != hello.parent:  # the parent died before PR_SET_PDEATHSIG took hold
        os._exit(0)
    feeds: dict[int, FeedServer] = {}
    prepared: tuple[int, bytes, Any] | None = None  # (feed id, its bytes, what they gave)

    def gone(feed_id: int) -> None:
        feeds.pop(feed_id, None)

    while True:
        try:
            if not control.ready(PARENT_CHECK_SECONDS):
                if os.getppid() != hello.parent:
                    break
                continue
            message, fds = control.recv()
        except (EOFError, OSError):
            break
        if isinstance(message, PrepareFeed):
            _set_environ(message.environ)
            prepared = (message.feed_id, message.feed, _load(message.feed))
        elif isinstance(message, RegisterFeed):
            channel = Channel(socket.socket(fileno=fds[0]))
            changed = _set_environ(message.environ)
            # The feed unpickled while this loader waited to be tried, if it is this one.
            ready, prepared = prepared, None
            if ready is None or changed or ready[:2] != (message.feed_id, message.feed):
                ready = (message.feed_id, message.feed, _load(message.feed))
            feed = ready[2]
            if isinstance(feed, Failed):
                with contextlib.suppress(OSError):
                    channel.send(Registered(message.feed_id, feed))
                channel.close()
                continue
            server = FeedServer(message.feed_id, feed, channel, gone)
            feeds[message.feed_id] = server
            with contextlib.suppress(OSError):  # a feed dropped at once: its thread sees EOF
                channel.send(Registered(message.feed_id))
            server.thread.start()
    os._exit(0)  # reader threads may still be in native code: do not wait for them
