"""What the training process and a loader process say to each other, and how it travels.

A :class:`Channel` is one end of a connected Unix stream socket. Each message is a small frozen
dataclass, pickled and sent with its length in front; descriptors (shared memory, the socket of
a feed) travel beside it as ``SCM_RIGHTS`` ancillary data. Arrays never travel: groups are
written into shared memory and only their :data:`Descriptor` s are sent.
"""

from __future__ import annotations

import array
import contextlib
import pickle
import select
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._errors import LoaderError

__all__ = [
    "MAX_FDS",
    "AddSlots",
    "Channel",
    "Descriptor",
    "EndEpoch",
    "EpochEnded",
    "Failed",
    "Hello",
    "Loaded",
    "Raised",
    "Read",
    "RegisterFeed",
    "Registered",
    "RemoteTraceback",
    "StartEpoch",
    "readable",
]


def readable(fds: Sequence[int], timeout: float | None) -> list[int]:
    """Those of ``fds`` that can be read now (waiting up to ``timeout`` seconds). ``poll``, not
    ``select``: a process reading many datasets has descriptors numbered beyond ``select``'s
    1,024."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    wait = None if timeout is None else max(0, int(timeout * 1000))
    return [fd for fd, _ in poller.poll(wait)]


#: An array in a slot: its byte offset, shape and ``dtype.str``.
Descriptor = tuple[int, tuple[int, ...], str]

_HEADER = struct.Struct("<QI")  # payload bytes, descriptors sent with it
#: Most descriptors sent with one message (what a receiver makes room for).
MAX_FDS = 64


# -- training process -> loader ------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    """First message to a new loader: the training process's import path (so that ``map_batch``
    and sources defined in its modules unpickle there) and its pid."""

    sys_path: list[str]
    parent: int


@dataclass(frozen=True)
class RegisterFeed:
    """A feed to serve (cloudpickled, reading in the loader's own threads); its socket comes as
    the one descriptor beside this message, and closing it ends the feed there. ``environ``: the
    training process's environment now (credentials set after the loader started)."""

    feed_id: int
    feed: bytes
    environ: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PrepareFeed:
    """A feed the loader may soon be asked to serve (it was started to be tried): unpickle it
    now, so that its imports and opened storage (for a store on S3, a client and its metadata
    requests) pass before it is tried. A :class:`RegisterFeed` of the same feed and bytes then
    takes it; one of another feed, or another prepared, drops it."""

    feed_id: int
    feed: bytes
    environ: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AddSlots:
    """Shared-memory slots ``first, first + 1, ...`` of ``size`` bytes each (their descriptors
    beside this message); ``retire`` lists slots to unmap."""

    first: int
    size: int
    retire: tuple[int, ...] = ()


@dataclass(frozen=True)
class StartEpoch:
    """Get ready to read groups of ``epoch`` from ``start_step`` on (``token`` names this pass;
    ``ramp``: its first group is split, see :func:`~..plan.indexblocks.ramp_sizes`)."""

    token: int
    epoch: int
    start_step: int
    ramp: bool = False


@dataclass(frozen=True)
class Read:
    """Read the group of steps ``[first, stop)`` of the pass ``token`` into ``slot``, with at
    most ``threads`` of the pass's reads running at once (the consumer's tuner says how many);
    ``loaders`` read the pass, taking the windows of a block shuffle in turn."""

    token: int
    first: int
    stop: int
    slot: int
    threads: int
    loaders: int = 1


@dataclass(frozen=True)
class EndEpoch:
    """The pass ``token`` is over (finished or abandoned): drop what is left of it."""

    token: int


# -- loader -> training process ------------------------------------------------------------------
@dataclass(frozen=True)
class Registered:
    """The feed was unpickled in the loader (or ``error`` says why it could not be)."""

    feed_id: int
    error: Failed | None = None


@dataclass(frozen=True)
class Loaded:
    """The group ``first`` of the pass ``token`` is in ``slot``: one descriptor per leaf; it
    took ``seconds`` to read, and the loader has used ``cpu`` seconds of CPU so far (what the
    tuner measures: :mod:`...tune.tuning`)."""

    token: int
    first: int
    slot: int
    arrays: list[Descriptor] = field(default_factory=list)
    seconds: float = 0.0
    cpu: float = 0.0


@dataclass(frozen=True)
class Failed:
    """An exception, pickled (None when it could not be), with its type, message and traceback."""

    exception: bytes | None
    kind: str
    message: str
    trace: str

    def raised_here(self) -> BaseException:
        """The exception to raise in the training process: the same class and message, with
        the loader's traceback as its cause (as text, when it could not be rebuilt)."""
        exc: BaseException | None = None
        if self.exception is not None:
            with contextlib.suppress(Exception):
                exc = pickle.loads(self.exception)
        if exc is None:
            exc = LoaderError(
                f"{self.kind}: {self.message} (raised in an arrayfeed loader process)"
            )
        exc.__cause__ = RemoteTraceback(self.trace)
        return exc

    @classmethod
    def of(cls, exc: BaseException, trace: str) -> Failed:
        pickled: bytes | None
        try:
            pickled = pickle.dumps(exc)
            pickle.loads(pickled)  # an exception class that cannot be rebuilt travels as text
        except Exception:
            pickled = None
        return cls(pickled, type(exc).__name__, str(exc), trace)


@dataclass(frozen=True)
class Raised:
    """Reading the group ``first`` of the pass ``token`` (into ``slot``) raised."""

    token: int
    first: int
    slot: int
    error: Failed


@dataclass(frozen=True)
class EpochEnded:
    """Every read of the pass ``token`` has finished or was dropped: their slots are free."""

    token: int


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a loader process (its ``__cause__`` here)."""

    def __init__(self, trace: str) -> None:
        super().__init__(trace)
        self.trace = trace

    def __str__(self) -> str:
        return f"\n(in the loader process)\n{self.trace.rstrip()}"


class Channel:
    """One end of a connected Unix stream socket carrying pickled messages and descriptors.

    Sending is thread-safe (one lock); receiving is done by one thread at a time (callers
    coordinate, see :class:`~.client.FeedLink`).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._sending = threading.Lock()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any, fds: Sequence[int] = ()) -> None:
        if len(fds) > MAX_FDS:
            raise ValueError(f"{len(fds)} descriptors with one message; at most {MAX_FDS}")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        head = _HEADER.pack(len(payload), len(fds))
        with self._sending:
            if fds:  # the descriptors ride with the header's bytes
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                sent = self.sock.sendmsg([head], ancillary)
                self.sock.sendall(head[sent:] + payload)
            else:
                self.sock.sendall(head + payload)

    def ready(self, timeout: float | None) -> bool:
        """Whether a message can be read now (waiting up to ``timeout`` seconds)."""
        return bool(readable([self.sock.fileno()], timeout))

    def recv(self) -> tuple[Any, list[int]]:
        """The next message and the descriptors sent with it; :class:`EOFError` when the other
        end is closed."""
        head, fds = self._exact_with_fds(_HEADER.size)
        size, count = _HEADER.unpack(head)
        if count != len(fds):
            raise EOFError(f"expected {count} descriptors with a message, got {len(fds)}")
        return pickle.loads(self._exact(size)), fds

    def _exact_with_fds(self, n: int) -> tuple[bytes, list[int]]:
        fds: list[int] = []
        space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        data, ancillary, _flags, _ = self.sock.recvmsg(n, space)
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(raw[: len(raw) - len(raw) % got.itemsize])
                fds.extend(got)
        if not data:
            raise EOFError("the other end closed the channel")
        return data + self._exact(n - len(data)), fds

    def _exact(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 22))
            if not chunk:
                raise EOFError("the other end closed the channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()
