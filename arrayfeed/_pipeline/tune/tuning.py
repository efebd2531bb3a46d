"""Concurrency that tunes itself: the threads and loaders a feed reads with.

A :class:`Tuner` is what the reading side asks (:attr:`~Tuner.threads` and
:attr:`~Tuner.processes` before each request) and tells (each group delivered, the CPU each
reader used, passes starting and ending): its :class:`~.windows.Meter` measures windows, and
its :class:`~.model.Model` sets the threads and loaders from them. It only says how many;
groups are read in order whatever it says, so it changes how fast batches come, never which.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .model import Limits, Model
from .report import Bound, Tuning
from .windows import Meter, Window

__all__ = ["MAX_THREADS", "Tuner"]

#: Most reader threads of one reader (this process, or a loader): beyond, more loaders.
MAX_THREADS = 64


class Tuner:
    """Threads (``start``, at most ``cap`` each) and loaders (``processes``, at most
    ``most_processes``), tuned while reading unless ``fixed``; ``memory``: groups in flight the
    read-ahead holds in all; ``group_rows``: rows a group; ``ahead``: groups a pass may have
    prepared beyond those in flight (a window decoded ahead), not counted after a move."""

    def __init__(
        self,
        start: int,
        cap: int,
        *,
        fixed: bool = False,
        ahead: int = 0,
        processes: int = 0,
        most_processes: int | None = None,
        cores: float = 1.0,
        memory: int | None = None,
        group_rows: int = 1,
        clock: Callable[[], float] = time.perf_counter,
        process_cpu: Callable[[], float] = time.process_time,
    ) -> None:
        self.cap, self.fixed, self.ahead, self.group_rows = cap, fixed, ahead, group_rows
        memory = memory if memory is not None else (cap + 1) * max(1, processes)
        limits = Limits(cores, memory, cap, max(processes, most_processes or 0))
        self.model = Model(start, processes, limits)
        self.meter = Meter(self._observe, self._setting, clock, process_cpu, measure=not fixed)
        self._settled_at: float | None = None
        self._clock = clock
        self.rates: dict[int, float] = {}  # rows/s by groups in flight tried
        self.process_rates: dict[int, float] = {}  # ... and by loaders
        self.read_cpu, self.pass_ended = self.meter.read_cpu, self.meter.pass_ended

    @property
    def threads(self) -> int:
        return self.model.threads

    @property
    def processes(self) -> int:
        return self.model.processes

    @property
    def starting(self) -> bool:
        return self.meter.starting

    @starting.setter
    def starting(self, value: bool) -> None:
        self.meter.starting = value

    @property
    def history(self) -> list[tuple[int, int]]:
        """``(threads, processes)`` after each of the last windows measured."""
        return list(self.model.history)

    @property
    def spare(self) -> int:
        """Loaders worth starting before they are tried (0: none)."""
        may = self.model.may_try_loader()
        return min(self.model.limits.processes, 2 * self.processes) if may else 0

    def processes_ready(self, in_flight: int) -> None:
        self.meter.ready(in_flight)

    def pass_started(self, carried: int = 0, whole: bool = False) -> None:
        self.meter.pass_started(carried, whole)

    def delivered(self, rows: int, waited: float = 0.0, seconds: float | None = None) -> None:
        """A group of ``rows`` was handed over after ``waited`` s; it took ``seconds`` to read."""
        self.meter.delivered(rows, waited, seconds)

    def _setting(self) -> tuple[int, int]:
        return self.model.threads, self.model.processes

    def _observe(self, w: Window) -> tuple[int, bool]:
        model, here = self.model, (self.model.threads, self.model.processes)
        self.rates[w.in_flight] = w.rows / w.seconds
        if w.processes:
            self.process_rates[w.processes] = w.rows / w.seconds
        settled = model.phase == "settled"
        model.observe(w)
        if model.phase != "settled" or not settled:
            self._settled_at = self._clock() if model.phase == "settled" else None
        if (model.threads, model.processes) == here:
            return 0, False
        # What is in flight was asked for at the old setting (and a window decoded ahead).
        # Measuring waits for loaders added to read (``processes_ready``); fewer read at once.
        return (here[0] + 1) * max(1, here[1]) + self.ahead, model.processes > here[1]

    def report(self) -> Tuning:
        with self.meter.lock:
            model, inputs, first = self.model, self.model.inputs, self.meter.first
            settled = self.fixed or model.phase == "settled"
            after = None if self._settled_at is None or first is None else self._settled_at - first
            return Tuning(
                threads=self.threads,
                tuned=not self.fixed,
                settled=settled,
                processes=self.processes,
                bound=Bound.FIXED if self.fixed else (model.bound if settled else Bound.MEASURING),
                rate=inputs.get("rate", 0.0) * self.group_rows,
                latency=inputs.get("latency", 0.0),
                group_rows=self.group_rows,
                wait_share=inputs.get("wait_share", 0.0),
                in_flight=int(inputs.get("little", 0)),
                budget=int(inputs.get("budget", 0)),
                cores=model.limits.cores,
                reader_cores=inputs.get("reader_cores", 0.0),
                consumer_cores=inputs.get("consumer_cores", 0.0),
                interpreter_cores=inputs.get("interpreter_cores", 0.0),
                noise=model.noise(),
                data_wait=self.meter.data_wait,
                rates=dict(self.rates),
                process_rates=dict(self.process_rates),
                settled_after=None if self.fixed else after,
            )
