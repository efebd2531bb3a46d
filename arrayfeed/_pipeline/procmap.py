"""Worker processes for ``map_batch``: the opt-in ``map_processes=N`` of the entry points.

No TensorFlow. A :class:`ProcessMap` belongs to one feed. A reader thread reads a group of
batches straight into a slot of one shared-memory file and queues its descriptor (offsets,
shapes, dtypes) on a worker's pipe; the worker (:mod:`.mapworker`) maps each batch and writes
the results into an output area of the file. The thread returns views of that area (reused once
nothing references them, like a :class:`~.read.BufferPool` buffer), or copies when every area is
taken. No array is pickled. A group is one task and the feed yields groups in order, so the
stream is the one reader threads give: each batch once, in order, bit for bit.

The file is a ``memfd`` on Linux: no name, nothing in ``/dev/shm``, freed with the last process
mapping it, even after ``kill -9`` (elsewhere a POSIX segment unlinked at once). It is sized from
the feed's probe of ``map_batch``; a result unlike the probe's is refused in the worker by the
check reader threads make (:mod:`.mapbatch`), with their message. Workers start with the feed's
first epoch (multiprocessing's start method; ``spawn`` pickles ``map_batch``) and stop when the
feed is collected (its dataset or :class:`Batches` deleted), at exit, or when their parent dies.
They ignore SIGINT: Ctrl-C stops the parent, whose epoch then waits only for the groups being
mapped.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import multiprocessing
import os
import pickle
import queue
import sys
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from multiprocessing import reduction
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import ConfigError, MapBatchError
from .._storage import Source
from .._validate import optional_integer
from .mapbatch import Mapped, Reply
from .mapworker import Descriptor, Job, LoadFailed, Task, serve, view
from .read import ALIGNMENT, Allocator, read_rows

__all__ = ["ProcessMap", "check_map_processes", "start_method"]

#: Seconds :meth:`ProcessMap.close` gives a worker to stop by itself before terminating it.
STOP_SECONDS = 2.0
#: Tasks a worker is sent ahead: the next group waits in its pipe while it maps one, so it
#: never waits for the parent's threads to be scheduled (on a busy machine, a large loss).
QUEUED = 2

RowSpec = tuple[tuple[int, ...], np.dtype[Any]]  # per-row shape and dtype of a leaf


def start_method() -> str:
    """The start method workers get: the one multiprocessing is set to, else the platform's
    default (asked without fixing it, so a later ``set_start_method`` still works)."""
    chosen = multiprocessing.get_start_method(allow_none=True)
    return chosen or multiprocessing.get_all_start_methods()[0]


def check_map_processes(value: Any, map_batch: Any) -> int:
    """``map_processes`` as an int (0: map in reader threads), or :class:`ConfigError`."""
    processes = optional_integer(value, "map_processes", low=0) or 0
    if not processes:
        return 0
    if map_batch is None:
        raise ConfigError(
            f"`map_processes` ({processes}) runs `map_batch` in worker processes, but `map_batch` "
            "is None; pass a `map_batch`, or leave `map_processes` out."
        )
    if os.name != "posix":
        raise ConfigError(f"`map_processes` needs Linux or macOS (got {processes} on {os.name}).")
    method = start_method()
    if method != "fork":
        try:
            pickle.dumps(map_batch)
        except Exception as exc:
            raise ConfigError(
                f"`map_batch` cannot be pickled ({type(exc).__name__}: {exc}), and `map_processes` "
                f"sends it to worker processes started with {method!r}; define it with `def` at "
                "the top level of an importable module (not a lambda or a nested function), or "
                "start workers with `multiprocessing.set_start_method('fork')`."
            ) from None
    return processes


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _area_bytes(specs: Sequence[RowSpec], rows: int) -> int:
    """Bytes of an area holding ``rows`` rows of every leaf, each leaf aligned."""
    sizes = (rows * math.prod(shape) * dtype.itemsize for shape, dtype in specs)
    return sum(_align(n) for n in sizes) + ALIGNMENT


class _Area:
    """Hands out aligned arrays from ``[start, start + size)`` of the shared file, one after
    the other (an :class:`Allocator` for :func:`read_rows`), and remembers where they lie."""

    def __init__(self, buf: npt.NDArray[np.uint8], start: int, size: int) -> None:
        self._buf, self._next, self._end = buf, start, start + size
        self.descriptors: list[Descriptor] = []

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        dtype = np.dtype(dtype)
        desc = (self._next, tuple(shape), dtype.str)
        self._next = _align(self._next + math.prod(shape) * dtype.itemsize)
        if self._next > self._end:
            raise RuntimeError(f"arrayfeed: a group does not fit its shared-memory slot ({desc})")
        self.descriptors.append(desc)
        return view(self._buf, desc)


def _shared_file(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory that no file name refers to."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("arrayfeed-map", os.MFD_CLOEXEC)
    else:  # macOS: a POSIX segment, unlinked at once
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=size)
        fd = os.dup(segment._fd)  # type: ignore[attr-defined]
        segment.close()
        segment.unlink()
    os.ftruncate(fd, size)
    return fd


# -- the parent's side -----------------------------------------------------------------------------
class _Worker:
    """One worker process, the parent's end of its pipe, and the tasks sent and not answered
    (it answers in order: whoever reads an answer hands it to the oldest task)."""

    def __init__(self, ctx: Any, job: Job | bytes, size: int) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=serve, args=(child, job, size), name="arrayfeed-map", daemon=True
        )
        self.process.start()
        self.pid: int = self.process.pid
        child.close()
        self._sending, self._reading = threading.Lock(), threading.Lock()
        # One thread at a time reaps: two reaping at once race in waitpid, and the loser saw no
        # exit code at all.
        self._reaping = threading.Lock()
        self._pending: deque[Future[Reply]] = deque()

    def run(self, task: Task) -> Reply:
        """Send ``task`` (behind those already sent) and wait for its answer."""
        mine: Future[Reply] = Future()
        try:
            with self._sending:
                self._pending.append(mine)
                self.conn.send(task)
            while not mine.done():
                with self._reading:
                    if not mine.done():
                        answer = self.conn.recv()
                        self._pending.popleft().set_result(answer)
        except (EOFError, OSError):
            with self._reaping:
                self.process.join(5 * STOP_SECONDS)  # its pipe closed: it is exiting
                code = self.process.exitcode
            died = MapBatchError(
                f"a `map_batch` worker process (pid {self.pid}) exited with code "
                f"{'unknown (still exiting)' if code is None else code} while mapping a batch "
                "(killed for memory? a crash in "
                "native code?); a new worker takes its place for the next batch."
            )
            with self._sending:
                while self._pending:
                    self._pending.popleft().set_exception(died)
        return mine.result()

    def handshake(self, fd: int, method: str) -> None:
        """Send the shared file; wait until the job is loaded."""
        try:
            reduction.send_handle(self.conn, fd, self.pid)
            reply = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(STOP_SECONDS)
            raise MapBatchError(
                f"a `map_batch` worker process ({method!r}) exited with code "
                f"{self.process.exitcode} before it started (its error is on stderr); with "
                "'spawn' or 'forkserver', guard the script's top level with "
                "`if __name__ == '__main__':`."
            ) from None
        if isinstance(reply, LoadFailed):
            raise MapBatchError(
                f"`map_batch` could not be loaded in a worker process (start method {method!r}); "
                "define it in a module the workers can import (not in `__main__` of a notebook "
                f"or an interactive session), or use the 'fork' start method. Its error:\n{reply.traceback}"
            )

    def stop(self) -> None:
        """Wait for the process to end (terminate it, then kill it, if it will not); release it."""
        for hurry in (None, self.process.terminate, self.process.kill):
            if hurry is not None and self.process.is_alive():
                hurry()
            self.process.join(STOP_SECONDS)
        self.conn.close()  # (not the Process: a thread may still ask it for its exit code)


#: Every ProcessMap with workers, so that a forked child drops what it inherited.
_LIVE: weakref.WeakSet[ProcessMap] = weakref.WeakSet()


class ProcessMap:
    """``processes`` workers and their shared file: ``slots`` slots (a group read, and room for
    its results) and ``lends`` output areas, each for ``group_rows`` rows of ``in_specs`` /
    ``out_specs`` (per-row shape and dtype of each leaf read / returned by ``map_batch``).
    Workers start at :meth:`start` (idempotent) and stop at :meth:`close`."""

    def __init__(
        self,
        job: Job,
        processes: int,
        *,
        in_specs: Sequence[RowSpec],
        out_specs: Sequence[RowSpec],
        group_rows: int,
        slots: int,
        lends: int,
    ) -> None:
        self.job, self.processes, self.slots, self.lends = job, processes, slots, lends
        self.out_specs = list(out_specs)
        self.in_bytes = _area_bytes(in_specs, group_rows)
        self.out_bytes = _area_bytes(out_specs, group_rows)
        self.slot_bytes = self.in_bytes + self.out_bytes
        self.size = slots * self.slot_bytes + lends * self.out_bytes
        self._lock, self._method = threading.Lock(), ""
        self._pid: int | None = None  # the process the workers belong to
        self._workers: list[_Worker] = []
        self._idle: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._fd = -1
        self._mmap: mmap.mmap | None = None
        self._buf: npt.NDArray[np.uint8] | None = None
        self._outs: list[npt.NDArray[np.uint8]] = []  # one array per area: views count on it
        self._free_count = 0
        self.lent = self.copied = 0  # groups returned as views of an area, and as copies

    def start(self) -> None:
        """Start the workers, unless this process already has them."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._release(stop=False)  # a fork's inheritance, if any: not its workers
            method = self._method = start_method()
            try:
                self._fd = _shared_file(self.size)
                self._mmap = mmap.mmap(self._fd, self.size)
                self._buf = np.frombuffer(self._mmap, dtype=np.uint8)
                first = self.slots * self.slot_bytes
                self._outs = [
                    np.frombuffer(self._mmap, np.uint8, self.out_bytes, first + i * self.out_bytes)
                    for i in range(self.lends)
                ]
                self._free_count = sys.getrefcount(self._outs[0]) if self._outs else 0
                for _ in range(self.processes):  # start them all, then wait for each
                    self._workers.append(self._new_worker())
                for worker in self._workers:
                    worker.handshake(self._fd, method)
            except BaseException:
                self._release(stop=True)
                raise
            self._pid = os.getpid()
            self._idle, self._free = queue.SimpleQueue(), queue.SimpleQueue()
            for turn in list(range(self.processes)) * QUEUED:
                self._idle.put(turn)
            for slot in range(self.slots):
                self._free.put(slot)
            _LIVE.add(self)

    def close(self) -> None:
        """Stop the workers, release the shared file (arrays returned stay valid)."""
        with self._lock:
            self._release(stop=self._pid == os.getpid())

    def _release(self, *, stop: bool) -> None:
        workers, self._workers = self._workers, []
        if stop:
            for worker in workers:
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
            for worker in workers:
                worker.stop()
        else:  # inherited by a fork: close our copies, leave the processes to their parent
            for worker in workers:
                worker.conn.close()
        self._buf, self._outs = None, []
        if self._mmap is not None:
            with contextlib.suppress(BufferError):  # arrays view it: unmapped when they go
                self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._pid = None
        _LIVE.discard(self)

    def _lend(self) -> tuple[int, np.ndarray] | None:
        """A free output area: its index and a view that keeps it taken until dropped."""
        with self._lock:
            for i in range(self.lends):
                if sys.getrefcount(self._outs[i]) == self._free_count:
                    return i, self._outs[i][:0]
        return None

    def map_group(
        self,
        sources: Sequence[Source],
        indices: npt.NDArray[np.int64],
        lead: tuple[int, ...],
        pool: Allocator,
    ) -> list[np.ndarray]:
        """Read ``indices`` of ``sources`` as one group of shape ``lead`` (``(steps, rows)``
        stacked, ``(rows,)`` not), map it in a worker, and return its leaves: views of an output
        area, or (none free) copies in ``pool``'s buffers. A ``map_batch`` that raised or broke
        its contract raises the :class:`MapBatchError` a reader thread would."""
        self.start()
        slot = self._free.get()
        try:
            assert self._buf is not None
            start = slot * self.slot_bytes
            reads = _Area(self._buf, start, self.in_bytes)
            read_rows(sources, indices, lead_shape=lead, pool=reads)
            lent = self._lend()
            out_start = start + self.in_bytes
            if lent is not None:
                out_start = self.slots * self.slot_bytes + lent[0] * self.out_bytes
            results = _Area(self._buf, out_start, self.out_bytes)
            for shape, dtype in self.out_specs:
                results.empty((*lead, *shape), dtype)
            stacked = len(lead) == 2
            reply = self._call(
                Task(
                    tuple(reads.descriptors),
                    tuple(results.descriptors),
                    steps=lead[0] if stacked else 1,
                    rows=lead[-1],
                    stacked=stacked,
                )
            )
            if not isinstance(reply, Mapped):
                raise reply.error()
            if lent is not None:
                self.lent += 1
                area = self._outs[lent[0]]
                return [view(area, (o - out_start, s, d)) for o, s, d in results.descriptors]
            self.copied += 1
            outs = []
            for desc in results.descriptors:
                result = view(self._buf, desc)
                out = pool.empty(result.shape, result.dtype)
                np.copyto(out, result)
                outs.append(out)
            return outs
        finally:
            self._free.put(slot)

    def _call(self, task: Task) -> Reply:
        """Run ``task`` on a worker with room in its queue (replacing it if found dead)."""
        turn = self._idle.get()  # a worker's index, QUEUED times in `_idle`
        try:
            worker = self._workers[turn]
            if not worker.process.is_alive():
                worker = self._replace(turn, worker)
            return worker.run(task)
        finally:
            self._idle.put(turn)

    def _new_worker(self) -> _Worker:
        job = self.job if self._method == "fork" else pickle.dumps(self.job)
        return _Worker(multiprocessing.get_context(self._method), job, self.size)

    def _replace(self, turn: int, dead: _Worker) -> _Worker:
        with self._lock:
            if self._workers[turn] is not dead:  # replaced by the other task of its queue
                return self._workers[turn]
            worker = self._new_worker()
            try:
                worker.handshake(self._fd, self._method)
            except BaseException:
                worker.stop()  # `dead` stays, to be replaced at the next try
                raise
            self._workers[turn] = worker
            dead.stop()
            return worker


def _drop_inherited() -> None:
    """In a forked child: close the inherited shared files and pipes (not the workers)."""
    for procmap in list(_LIVE):
        procmap._lock = threading.Lock()  # a parent's thread may have held it at the fork
        procmap._release(stop=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited)
