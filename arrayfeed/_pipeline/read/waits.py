"""How long reads from a storage wait, timed when a feed is built (it sizes the groups).

Storage whose reads wait without using the CPU (object storage, a dask array computed elsewhere,
a service) gets groups of few batches, so that the reads in flight carry the rate (see
:data:`~.feed.GROUP_WAIT_SECONDS`); storage whose reads use the CPU keeps groups sized by bytes.
Telling them apart takes a batch read timed by the clock and by its thread's CPU time: a read
that waits is one whose time is mostly not its own CPU time.

A read also waits, in the same way, for the GIL while other threads of the process hold it, and for
a core while other threads or processes use every one: right after another dataset's reading (its
threads still decode the groups they were asked for), one read of chunked gzip HDF5 timed alone
looked like a read that waits, and the groups came out a few batches long instead of a group's
bytes, too small to carry the rate (docs/performance.md, "Groups of reads that wait"). So each read
is timed with the time its thread spent ready to run but not running (waiting for a core, from
``/proc/thread-self/schedstat`` where Linux keeps it), which is not counted as a wait, and with the
CPU time of the rest of the process: a wait that the other threads' CPU time could explain (the GIL)
is not taken as the storage's own, and the read is timed again, elsewhere, after a pause, until a
read either uses the CPU for most of its time (the storage does not wait) or waits while the other
threads are idle. Only when they keep working throughout is the least wait seen taken as it is: a
storage that waits but is sized by bytes reads a whole group chunk after chunk with no read beside
it, at the rate of one chunk at a time whatever the threads: the worse of the two mistakes.

The reads timed are batches of the storage order (a chunk of a batch's rows is then read in one
request, as the reading will: a batch across two chunks waits for two requests, which halves
the groups that the wait sizes and so the reads in flight), far from each other and from the
first one (untimed: it opens indexes and connections), each at a place not read before: the
last whole batch first, then the middle, and so on, at most :data:`PLACES` of them. A chunk
cache (h5py's, object storage's) holding what an earlier read fetched would make a read of the
same chunk look like one that uses the CPU; a chunk larger than a sixteenth of the range still
can.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

__all__ = ["PLACES", "PROBE_SECONDS", "PROBES", "Timing", "places", "queued", "wait_per_batch"]

#: Reads timed while the other threads are idle: the least of their waits counts.
PROBES = 2
#: Seconds of reads timed again while other threads keep the process busy, before the least
#: wait seen is taken as it is.
PROBE_SECONDS = 1.0
#: A wait is the storage's own when other threads used less CPU than this share of it.
OTHERS_SHARE = 0.5
#: Places of the range that reads may be timed at (none is timed twice).
PLACES = 16

_SCHEDSTAT = "/proc/thread-self/schedstat"


def queued() -> float:
    """Seconds this thread has spent ready to run but not running (0 where not kept)."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Timing:
    """``read(indices)``, timed: ``took`` seconds by the clock, ``used`` of this thread's CPU
    time, ``queued`` waiting for a core, and ``others`` of the rest of the process's CPU time."""

    __slots__ = ("others", "queued", "took", "used")

    def __init__(self, read: Callable[[np.ndarray], object], indices: np.ndarray) -> None:
        ready = queued()
        began, mine, ours = time.perf_counter(), time.thread_time(), time.process_time()
        read(indices)
        self.took = time.perf_counter() - began
        self.used = time.thread_time() - mine
        self.others = max(0.0, time.process_time() - ours - self.used)
        self.queued = max(0.0, queued() - ready)

    @property
    def waited(self) -> float:
        """Seconds the read neither ran on this thread's CPU nor waited for a core."""
        return max(0.0, self.took - self.used - self.queued)

    @property
    def mostly_cpu(self) -> bool:
        return self.waited <= self.used

    @property
    def alone(self) -> bool:
        """Whether other threads were idle enough for the wait to be the storage's own."""
        return self.others < OTHERS_SHARE * self.waited


def places(start: int, stop: int, rows: int) -> list[int]:
    """First rows of the batches that may be timed in ``[start, stop)``, in order: batches of
    the storage order (reads of chunks of a batch's size are then one chunk each), away from the
    first batch (read untimed), the last whole one first, then halves, quarters... of the rest,
    none twice; the last rows alone when the range holds less than two batches."""
    batches = (stop - start) // rows
    if batches < 2:
        return [stop - rows]
    bits = PLACES.bit_length() - 1
    found: list[int] = []
    for k in range(PLACES):
        reversed_k = int(format(k, f"0{bits}b")[::-1], 2)  # 0, 8, 4, 12, 2, ... of 16
        place = start + rows * (1 + (batches - 2) * (PLACES - reversed_k) // PLACES)
        if place not in found:
            found.append(place)
    return found


def wait_per_batch(
    read: Callable[[np.ndarray], object],
    start: int,
    stop: int,
    rows: int,
    *,
    timer: Callable[[Callable[[np.ndarray], object], np.ndarray], Timing] = Timing,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Seconds ``read`` waits per ``rows`` rows of ``[start, stop)``, 0 when its reads are mostly
    CPU (see the module docstring)."""
    read(np.arange(start, start + rows, dtype=np.int64))
    waits: list[float] = []  # of reads while other threads were idle
    seen = float("inf")  # the least wait of any read timed
    deadline = clock() + PROBE_SECONDS
    for first in places(start, stop, rows):
        timing = timer(read, np.arange(first, first + rows, dtype=np.int64))
        if timing.mostly_cpu:
            return 0.0
        seen = min(seen, timing.waited)
        if timing.alone:
            waits.append(timing.waited)
            if len(waits) == PROBES:
                break
        elif clock() >= deadline:
            break
        else:  # other threads were busy: let them finish what they are doing
            sleep(min(0.05, max(timing.took, 0.005)))
    return min(waits) if waits else seen
