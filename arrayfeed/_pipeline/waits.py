"""How long reads from a storage wait, timed when a feed is built (it sizes the groups).

Storage whose reads wait without using the CPU (object storage, a dask array computed elsewhere,
a service) gets groups of few batches, so that the reads in flight carry the rate (see
:data:`~.feed.GROUP_WAIT_SECONDS`); storage whose reads use the CPU keeps groups sized by bytes.
Telling them apart takes a batch read timed by the clock and by its thread's CPU time: a read
that waits is one whose time is mostly not its own CPU time.

A read also waits, in the same way, for the GIL while other threads of the process hold it, and
for a core while they use every one: right after another dataset's reading (its threads still
decode the groups they were asked for), one read of chunked gzip HDF5 timed alone looked like a
read that waits, and the groups came out 3 batches long instead of 496, at a third of the rate on
16 cores (docs/performance.md, "Groups of reads that wait"). So each read is timed with the CPU
time of the whole process too, and a wait that other threads' CPU time could explain is not
taken as the storage's own: the read is timed again, after a pause, until a read either uses the
CPU for most of its time (the storage does not wait) or waits while the other threads are idle.
Only when other threads keep working throughout is the least wait seen taken as it is: a storage
that waits but is sized by bytes reads a whole group chunk after chunk with no read beside it,
at the rate of one chunk at a time whatever the threads: the worse of the two mistakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

__all__ = ["PROBE_SECONDS", "PROBES", "Timing", "wait_per_batch"]

#: Reads timed while the other threads are idle: the least of their waits counts.
PROBES = 3
#: Seconds of reads timed again while other threads keep the process busy, before the least
#: wait seen is taken as it is.
PROBE_SECONDS = 1.0
#: A wait is the storage's own when other threads used less CPU than this share of it.
OTHERS_SHARE = 0.5


class Timing:
    """``read(indices)``, timed: ``took`` seconds by the clock, ``used`` of this thread's CPU
    time and ``others`` of the rest of the process's."""

    __slots__ = ("others", "took", "used")

    def __init__(self, read: Callable[[np.ndarray], object], indices: np.ndarray) -> None:
        began, mine, ours = time.perf_counter(), time.thread_time(), time.process_time()
        read(indices)
        self.took = time.perf_counter() - began
        self.used = time.thread_time() - mine
        self.others = max(0.0, time.process_time() - ours - self.used)

    @property
    def waited(self) -> float:
        """Seconds the read was not running on this thread's CPU."""
        return max(0.0, self.took - self.used)

    @property
    def mostly_cpu(self) -> bool:
        return self.waited <= self.used

    @property
    def alone(self) -> bool:
        """Whether other threads were idle enough for the wait to be the storage's own."""
        return self.others < OTHERS_SHARE * self.waited


def wait_per_batch(
    read: Callable[[np.ndarray], object],
    start: int,
    stop: int,
    rows: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Seconds ``read`` waits per ``rows`` rows of ``[start, stop)``, 0 when its reads are mostly
    CPU (see the module docstring). The first read (which opens indexes and connections) is not
    timed; the timed ones are spread over the range, so that a cache filled by one does not hide
    the wait of the next."""
    read(np.arange(start, start + rows, dtype=np.int64))
    span = max(0, stop - start - 2 * rows)  # where a timed read may begin, after the first
    after = rows if stop - start >= 2 * rows else 0
    waits: list[float] = []  # of reads while other threads were idle
    seen = float("inf")  # the least wait of any read
    deadline = clock() + PROBE_SECONDS
    tries = 0
    while len(waits) < PROBES:
        # Sixteen places over the range, the first three a third apart.
        first = start + after + span * (tries * 5 % 16) // 16
        tries += 1
        timing = Timing(read, np.arange(first, first + rows, dtype=np.int64))
        if timing.mostly_cpu:
            return 0.0
        seen = min(seen, timing.waited)
        if timing.alone:
            waits.append(timing.waited)
        elif clock() >= deadline:
            break
        else:  # other threads were busy: let them finish what they are doing
            sleep(min(0.05, max(timing.took, 0.005)))
    return min(waits) if waits else seen
