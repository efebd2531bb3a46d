"""Windows measured while reading: what the tuner's model is given (:class:`Meter`).

A window covers :data:`WINDOW_SECONDS` of delivery (and :data:`WINDOW_GROUPS` groups at least):
the groups the consumer took and how long it waited for them, how long each group took to
read (its reader says), the CPU each reader used (this process's reader threads, each loader:
each says), and this process's CPU, the consumer's less its own readers'. What a window holds
must be what the setting delivered: the groups asked for before a move (and those of a window
decoded ahead) are not counted, nor anything while loaders start; the time between passes (the
consumer elsewhere, tf.data between epochs) is left out, and groups read ahead during such a
pause are not counted either (but for a pass read ahead whole: reading keeps ahead); a window with a pass start in it ends with that pass (passes then
count whole), once it holds :data:`WINDOW_PASSES` of them (short passes read ahead whole), or
after twice its length. Each pass's data wait is kept too: the consumer's share of the pass
spent waiting.

Pure logic, starting no thread and doing no I/O; the clocks are given.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CARRIED_PAUSE", "WINDOW_GROUPS", "WINDOW_PASSES", "WINDOW_SECONDS", "Meter", "Window"]

WINDOW_SECONDS = 0.3
WINDOW_GROUPS = 2
WINDOW_PASSES = 3
#: Seconds between passes beyond which groups read ahead across them are not counted.
CARRIED_PAUSE = WINDOW_SECONDS / 10


@dataclass(frozen=True)
class Window:
    """One window at ``threads`` in each of ``processes`` loaders (0: this process reads):
    its seconds, the groups and rows the consumer took and the seconds it waited, the median
    read latency, and the CPU seconds of the readers, the busiest interpreter and the consumer,
    used over ``wall`` seconds: its seconds and the pauses left out of them (reads ahead use CPU
    in a pause too; 0: ``seconds``)."""

    threads: int
    processes: int
    seconds: float
    groups: int
    rows: int
    waited: float
    latency: float
    reader_cpu: float = 0.0
    interpreter_cpu: float = 0.0
    consumer_cpu: float = 0.0
    wall: float = 0.0

    @property
    def in_flight(self) -> int:
        return self.threads * max(1, self.processes)

    @property
    def rate(self) -> float:
        return self.groups / self.seconds

    @property
    def wait_share(self) -> float:
        return min(1.0, self.waited / self.seconds)

    @property
    def demand(self) -> float:  # what the consumer would take, never waiting
        return self.groups / max(self.seconds - self.waited, 1e-9)

    def cores(self, cpu: float) -> float:
        """Cores ``cpu`` seconds of the window kept busy."""
        return cpu / max(self.wall, self.seconds)

    def merged(self, *others: Window) -> Window:
        """This window and ``others`` (at the same setting) as one."""
        every = (self, *others)
        groups = sum(w.groups for w in every)
        return Window(
            threads=self.threads,
            processes=self.processes,
            seconds=sum(w.seconds for w in every),
            groups=groups,
            rows=sum(w.rows for w in every),
            waited=sum(w.waited for w in every),
            latency=sum(w.latency * w.groups for w in every) / max(1, groups),
            reader_cpu=sum(w.reader_cpu for w in every),
            interpreter_cpu=sum(w.interpreter_cpu for w in every),
            consumer_cpu=sum(w.consumer_cpu for w in every),
            wall=sum(max(w.wall, w.seconds) for w in every),
        )


class Meter:
    """Windows for ``observe`` (given each, it returns the groups in flight to leave out when
    the setting moved, and whether loaders now start), measured at ``setting()``."""

    def __init__(
        self,
        observe: Callable[[Window], tuple[int, bool]],
        setting: Callable[[], tuple[int, int]],
        clock: Callable[[], float],
        process_cpu: Callable[[], float],
        *,
        measure: bool = True,
    ) -> None:
        self._observe, self._setting, self._clock, self._process_cpu = (
            observe,
            setting,
            clock,
            process_cpu,
        )
        self.measure = measure  # (False: only the data wait of each pass)
        self.lock = threading.Lock()
        self.starting = False  # loaders starting: nothing is counted until they read
        self.first: float | None = None  # when the first group was delivered
        self.data_wait: float | None = None  # of the last pass that ended
        self._cpu: dict[int, float] = {}  # reader (0: this process; else a loader's pid) -> CPU
        self._cpu_at: dict[int, float] = {}  # ... when the window opened
        self._window: dict[str, float] | None = None
        self._latencies: list[float] = []
        self._skip = 0  # groups still to pass uncounted
        self._last: float | None = None  # when the latest group was delivered
        self._mark = 0.0  # the window's opening or last pass start: pauses are counted from it
        self._pass: tuple[float, float] | None = None  # (start, waited) of the pass under way

    def ready(self, in_flight: int) -> None:
        """The loaders asked for read; ``in_flight``: groups asked for before, not counted."""
        with self.lock:
            if self.starting:
                self.starting, self._skip, self._window = False, in_flight, None

    def read_cpu(self, seconds: float, reader: int = 0) -> None:
        """Reader ``reader`` used ``seconds`` more of CPU."""
        with self.lock:
            self._cpu[reader] = self._cpu.get(reader, 0.0) + seconds

    def pass_started(self, carried: int = 0, whole: bool = False) -> None:
        """A pass starts; ``carried`` of its groups were asked for while the one before ended
        (``whole``: all of them: a pass read ahead whole is counted, as the consumer takes it:
        reading keeps ahead of it)."""
        with self.lock:
            now = self._clock()
            self._pass = (now, 0.0)
            if not self.measure:
                return
            if self._window is not None and self._window["due"] and self._last is not None:
                self._close(self._last)
            pause = self._pause(now, self._last)
            skip = carried and pause > CARRIED_PAUSE and not whole
            self._skip = carried if skip else min(self._skip, carried)
            if self._window is not None:
                self._window["start"] += pause
                self._window["starts"] += 1
            self._mark = now

    def pass_ended(self) -> None:
        with self.lock:
            if self._pass is not None:
                began, waited = self._pass
                self.data_wait = min(1.0, waited / max(self._clock() - began, 1e-9))
                self._pass = None

    def delivered(self, rows: int, waited: float, seconds: float | None) -> None:
        with self.lock:
            now, before = self._clock(), self._last
            self._last, self.first = now, self.first or now
            if self._pass is not None:
                self._pass = (self._pass[0], self._pass[1] + waited)
            if not self.measure or self.starting:
                return
            w = self._window
            if self._skip:  # asked for at the setting before a move, or read during a pause
                self._skip -= 1
                if w is not None:
                    w["start"] += self._pause(now, before)
                return
            if w is None:  # a window starts at its first delivery
                return self._open(now)
            w["rows"], w["groups"], w["waited"] = (
                w["rows"] + rows,
                w["groups"] + 1,
                w["waited"] + waited,
            )
            if seconds is not None:
                self._latencies.append(seconds)
            lasted, starts = now - w["start"], w["starts"]
            if w["groups"] < WINDOW_GROUPS or (lasted < WINDOW_SECONDS and starts < WINDOW_PASSES):
                return
            if 0 < starts < WINDOW_PASSES and lasted < 2 * WINDOW_SECONDS:
                w["due"] = 1.0  # ends with the pass under way
                return
            self._close(now)

    def _pause(self, now: float, last: float | None) -> float:
        return 0.0 if last is None else max(0.0, now - max(last, self._mark))

    def _open(self, now: float) -> None:
        self._window = dict.fromkeys(("rows", "groups", "waited", "starts", "due"), 0.0)
        self._window.update(start=now, opened=now, cpu=self._process_cpu())
        self._cpu_at, self._latencies, self._mark = dict(self._cpu), [], now

    def _close(self, now: float) -> None:
        w, self._window = self._window, None
        assert w is not None
        used = {r: c - self._cpu_at.get(r, 0.0) for r, c in self._cpu.items()}
        readers = sum(used.values())
        consumer = max(0.0, self._process_cpu() - w["cpu"] - used.get(0, 0.0))
        threads, processes = self._setting()
        self._skip, self.starting = self._observe(
            Window(
                threads=threads,
                processes=processes,
                seconds=max(now - w["start"], 1e-9),
                groups=int(w["groups"]),
                rows=int(w["rows"]),
                waited=w["waited"],
                latency=statistics.median(self._latencies) if self._latencies else 0.0,
                reader_cpu=readers,
                # (reading here: the interpreter the consumer's)
                interpreter_cpu=max([c for r, c in used.items() if r] or [readers + consumer]),
                consumer_cpu=consumer,
                wall=now - w["opened"],
            )
        )
        if not self._skip and not self.starting:  # no move: the next window starts now
            self._open(now)
