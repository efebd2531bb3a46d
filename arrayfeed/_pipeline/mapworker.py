"""A ``map_processes`` worker process: what it runs, and what crosses its pipe.

No TensorFlow. :class:`~.procmap.ProcessMap` (the parent's side) starts each worker with
:func:`serve`, sends it the shared-memory file's descriptor and then one :class:`Task` per group:
where the group's batches lie in the file and where their results go. The worker maps each batch
through the feed's :class:`~.mapbatch.Contract` (the check reader threads make) and answers
with a :class:`~.mapbatch.Reply`. Every message is a small frozen dataclass; arrays never cross
the pipe, only :data:`Descriptor` s of them in the shared file.
"""

from __future__ import annotations

import math
import mmap
import os
import pickle
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import MapBatchError
from .mapbatch import Contract, Mapped, Raised, Refused, Reply
from .structure import Treedef

__all__ = ["Descriptor", "Job", "LoadFailed", "Ready", "Task", "serve", "view"]

#: Seconds an idle worker waits for work before it checks that its parent is still alive.
PARENT_CHECK_SECONDS = 1.0

Descriptor = tuple[int, tuple[int, ...], str]  # an array in the file: offset, shape, dtype.str


def view(buf: npt.NDArray[np.uint8], desc: Descriptor) -> np.ndarray:
    """The array ``desc`` describes in ``buf`` (the shared file)."""
    offset, shape, dtype = desc[0], desc[1], np.dtype(desc[2])
    nbytes = math.prod(shape) * dtype.itemsize
    return buf[offset : offset + nbytes].view(dtype).reshape(shape)


@dataclass(frozen=True)
class Job:
    """What a worker runs (pickled for ``spawn``/``forkserver``; functions by reference): the
    ``map_batch``, the structure of the batches it takes, and the contract its results keep."""

    map_batch: Callable[[Any], Any]
    in_treedef: Treedef
    contract: Contract


@dataclass(frozen=True)
class Task:
    """One group to map: its batches (``inputs``) and where their results go (``outputs``), one
    array per leaf; ``steps`` batches of ``rows`` rows, stacked on a leading axis or not."""

    inputs: tuple[Descriptor, ...]
    outputs: tuple[Descriptor, ...]
    steps: int
    rows: int
    stacked: bool


@dataclass(frozen=True)
class Ready:
    """The worker mapped the shared file and loaded its job."""

    pid: int


@dataclass(frozen=True)
class LoadFailed:
    """The worker could not load its job (unpickling ``map_batch`` failed): its traceback."""

    traceback: str


def serve(conn: Connection, job: Job | bytes, size: int) -> None:
    """A worker's life: map the shared file, load the job, then run tasks until told to stop
    (``None``), until the pipe closes, or until its parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    parent = os.getppid()
    fd = reduction.recv_handle(conn)
    buf = np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)
    os.close(fd)
    try:
        loaded = pickle.loads(job) if isinstance(job, bytes) else job
    except Exception:
        conn.send(LoadFailed(traceback.format_exc()))
        return
    conn.send(Ready(os.getpid()))
    while os.getppid() == parent:
        try:
            task = conn.recv() if conn.poll(PARENT_CHECK_SECONDS) else ()
        except (EOFError, OSError):
            return
        if task is None:
            return
        if not isinstance(task, Task):  # no work yet: check on the parent again
            continue
        try:
            reply = _run(loaded, buf, task)
        except Exception as exc:  # e.g. a result that cannot be written where it goes
            reply = Raised.of(exc)
        conn.send(reply)


def _run(job: Job, buf: npt.NDArray[np.uint8], task: Task) -> Reply:
    """Map one group in place, batch by batch, and say how it went."""
    ins = [view(buf, d) for d in task.inputs]
    outs = [view(buf, d) for d in task.outputs]
    for i in range(task.steps):
        batch = job.in_treedef.unflatten([a[i] for a in ins] if task.stacked else ins)
        try:
            result = job.map_batch(batch)
        except Exception as exc:
            return Raised.of(exc)
        try:
            arrays = job.contract.check(result, task.rows)
        except MapBatchError as exc:
            return Refused(str(exc))
        for a, t in zip(arrays, [o[i] for o in outs] if task.stacked else outs, strict=True):
            t[...] = a
    return Mapped()
