"""How many groups are read at once, and by how many loaders: a small model of the read path.

Each :class:`Window` the tuner measures gives what the consumer took (``X`` groups/s) and the
share of its time it waited (``w``), how long a group took to read, and the cores the readers,
the busiest loader and the consumer used. The setting follows from a few formulas over them,
stated in ``docs/explanation/tuning.md``; :class:`~.report.Tuning` reports their inputs:

1. Little's law: ``ceil(rate x L0 x (1 + MARGIN))`` groups in flight deliver ``rate``, where
   ``L0`` is the seconds a group held a reader with the fewest in flight (a read alone: one
   thread each): the read latency measured, or, where the consumer waited (the readers all
   busy), ``in_flight / rate`` over the window if longer (a source that computes part of a
   group outside its timed read, as a dask graph does, shows a shorter latency).
2. A consumer that does not wait (``w < WAITED``) sets the rate: its own, ``X / (1 - w)``.
3. A consumer that waits: in flight doubles while each doubling delivers ``GROWTH`` x more
   (a step a budget cut short, half its growth), or while reads do not queue (a read takes
   under ``GROWTH`` x a read alone's latency: a slower window is noise, by Little's law). A
   doubling that did not pay is checked against the setting before, measured again (A/B/A),
   each setting's windows merged; the best rate measured is the storage's, and the fewest in
   flight measured that came within ``MARGIN`` of it are kept. (Formula 1 would give fewer
   where reads queue: a storage or a CPU that saturates gradually delivers less than Little's
   law over a read alone predicts, so in flight measured, not extrapolated.)
4. Budgets: the cores less the consumer's, over the cores a read in flight uses; the groups
   the read-ahead memory holds; ``threads`` per reader.
5. Queued in a loader: reads that queue (``GROWTH`` x a read alone's latency) with threads off
   the cores bind on one interpreter's lock or on the storage, which the CPU a loader shows
   cannot tell apart (a lock handed over between many threads and an event loop binds well under
   a core): twice the loaders, each with the threads one had, are tried if the budgets allow
   ``GAIN`` x the rate (the cores less the consumer's at the CPU seconds a group took: a noisy
   window moves the cores used, not that), and kept if they deliver it over ``TRIAL_WINDOWS``
   windows (doubled again at once if they delivered ``PROPORTIONAL`` of their number's worth);
   once per loader count.
6. The rate of the last ``WATCH`` windows merged moving ``DRIFT`` x from that of the first
   ``WATCH`` at the setting settled on, or a consumer that starts or stops waiting: measured
   again from one thread each.

Pure logic: no clock, no threads, no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from .report import Bound
from .windows import Window

__all__ = ["Limits", "Model"]

MARGIN = 0.1  # reads do not all take as long
WAITED = 0.1  # the consumer waits when it waited this share of its time
GROWTH = 1.25
GAIN, TRIAL_WINDOWS, PROPORTIONAL = 1.15, 3, 0.75
DRIFT = 1.5
WATCH = 3  # windows merged on each side of a drift (noise averages out)


@dataclass(frozen=True)
class Limits:
    """Usable ``cores``; groups in flight the read-ahead ``memory`` holds in all; ``threads``
    per reader; ``processes``: the most loaders (0: none may be added)."""

    cores: float
    memory: int
    threads: int
    processes: int


class Model:
    """The setting of one feed, from the windows it is given (see the module docstring)."""

    def __init__(self, threads: int, processes: int, limits: Limits) -> None:
        self.threads, self.processes, self.limits = threads, processes, limits
        self.bound, self.phase = Bound.MEASURING, "warm-up"  # grow, lower, trial, settled
        self.windows = self.settled_after = 0
        self.inputs: dict[str, float] = {}  # of the last decision (see Tuning)
        self.last: Window | None = None
        self.history: deque[tuple[int, int]] = deque(maxlen=256)  # settings, for benchmarks
        self._floor: tuple[int, float] | None = None  # (fewest in flight, their occupancy)
        self._alone = 0.0  # the read latency measured there
        self._at: dict[int, Window] = {}  # in flight: its windows, merged (noise averages out)
        self._last: Window | None = None  # the last window of the growth
        # A window that did not pay, while the setting before is measured again.
        self._again: Window | None = None
        self._back: tuple[int, int, float, Window, int, Bound, dict[str, float]] | None = None
        self._trial: list[Window] = []
        self._tried: set[int] = set()  # loader counts that did not pay
        self._reference: Window | None = None  # what the settled setting delivered
        self._references = 0  # windows merged in it
        self._recent: deque[Window] = deque(maxlen=WATCH)

    def little(self, rate: float) -> int:
        latency = self._floor[1] if self._floor is not None else 0.0
        return max(1, math.ceil(rate * latency * (1 + MARGIN)))

    @staticmethod
    def _occupancy(w: Window) -> float:
        busy = w.wait_share >= WAITED and w.groups > 0  # (else readers idle between groups)
        return max(w.latency, w.in_flight / w.rate) if busy else w.latency

    def reaching(self, rate: float) -> int:
        """The fewest in flight measured that came within MARGIN of ``rate``."""
        near = [n for n, w in self._at.items() if w.rate * (1 + MARGIN) >= rate]
        return min(near) if near else self.little(rate)

    def budgets(self, w: Window) -> tuple[int, Bound]:
        loaders = max(1, self.processes)
        most = min(
            self.limits.memory - loaders, self.limits.threads * max(loaders, self.limits.processes)
        )
        per_read = w.cores(w.reader_cpu) / w.in_flight
        cores = math.ceil(max(self._cpu_budget(w), 1.0) / per_read) if per_read > 0 else most
        return (max(1, cores), Bound.CORES) if cores < most else (max(1, most), Bound.MEMORY)

    def _cpu_budget(self, w: Window) -> float:
        return self.limits.cores - w.cores(w.consumer_cpu)

    def queued_in_loader(self, w: Window) -> bool:
        """Formula 5's condition: reads queue in a loader with threads off the cores."""
        if not self.processes or self._floor is None:
            return False
        queued = max(w.latency, w.in_flight / w.rate)  # (Little's law over the whole window)
        waiting = w.threads - w.cores(w.interpreter_cpu)  # threads off the cores
        return queued >= GROWTH * self._floor[1] and waiting >= 0.5

    def _loaders_pay(self, w: Window, rate: float) -> bool:
        """Whether twice the loaders may deliver GAIN x ``rate``, within the CPU and memory."""
        count = min(self.limits.processes, 2 * self.processes)
        if count <= self.processes or count in self._tried:
            return False
        most = [rate * count / self.processes]
        if w.reader_cpu > 0:
            most.append(self._cpu_budget(w) * w.groups / w.reader_cpu)
        if self._floor is not None and self._floor[1] > 0:
            most.append((self.limits.memory - count) / self._floor[1])
        return min(most) >= GAIN * rate

    def may_try_loader(self) -> bool:  # worth starting one ahead (Tuner.spare)
        w = self.last
        return (
            self.phase == "grow"
            and w is not None
            and self.queued_in_loader(w)
            and (self._loaders_pay(w, w.rate))
        )

    def observe(self, w: Window) -> None:
        """Take a window measured at the current setting; may change the setting."""
        self.windows, self.last = self.windows + 1, w
        if self.phase != "warm-up":  # (caches warm, threads start: not counted)
            if self._floor is None or w.in_flight < self._floor[0]:
                self._floor, self._alone = (w.in_flight, self._occupancy(w)), w.latency
            elif w.in_flight == self._floor[0]:
                self._floor = (w.in_flight, min(self._floor[1], self._occupancy(w)))
                self._alone = min(self._alone, w.latency)
            if self.phase in ("grow", "trial"):
                seen = self._at.get(w.in_flight)
                self._at[w.in_flight] = w if seen is None else seen.merged(w)
        {"warm-up": self._warm, "settled": self._watch, "trial": self._judge}.get(
            self.phase, self._decide
        )(w)
        self.history.append((self.threads, self.processes))

    def _warm(self, w: Window) -> None:
        self.phase = "grow"

    def _decide(self, w: Window) -> None:
        again, self._again = self._again, None
        if self.phase == "lower":  # fewer for the consumer: kept unless it now waits
            if w.wait_share >= WAITED and self._back is not None:
                self._move(self._back[0] * max(1, self._back[1]))
            return self._settle(Bound.CONSUMER, w)
        if w.wait_share < WAITED:  # the consumer sets the pace
            need = min(self.little(w.demand), self.budgets(w)[0])
            self.inputs = self._inputs(w, w.demand, need)
            if need >= w.in_flight:
                return self._settle(Bound.CONSUMER, w)
            self._back = (self.threads, self.processes, 0.0, w, 0, Bound.CONSUMER, {})
            self.phase = "lower"
            return self._move(need)
        last = self._last
        if again is not None:  # the setting before, measured again: its windows and ``again``'s
            w, last = again, self._at.get(last.in_flight, last) if last is not None else None
        most, bound = self.budgets(w)
        pays = GROWTH if last is None else min(GROWTH, 1 + (w.in_flight / last.in_flight - 1) / 2)
        # Reads that saturate something queue: their latency grows (Little's law). A rate
        # that did not grow while they did not queue is noise: more in flight are tried.
        queued = w.latency <= 0 or w.latency >= GROWTH * self._alone  # (0: not measured)
        saturated = last is not None and w.rate < last.rate * pays and queued
        if saturated and again is None and last is not None:
            # One window of each can be noise: the setting before is measured again (A/B/A).
            self._again, self.threads, self.processes = w, last.threads, last.processes
            return None
        self._last = w
        if not saturated and most > w.in_flight:
            return self._double(w, most)
        best = max(self._at.values(), key=lambda m: m.rate, default=w)
        if saturated:
            most, bound = min(most, self.reaching(best.rate)), Bound.LATENCY
            if self.processes:  # a doubling that added loaders did not pay: they go
                most = min(most, self.limits.threads * self.processes)
        self.inputs = self._inputs(best, best.rate, most)
        if self.queued_in_loader(w):  # (the window with the most threads waiting)
            rate = best.rate  # (what the reads delivered at best: more loaders must beat it)
            if self._loaders_pay(w, rate):
                return self._try_loaders(w, rate, most, bound)
            bound = Bound.INTERPRETER
        self._move(most)
        self._settle(bound, w)

    def _double(self, w: Window, most: int) -> None:
        target = min(2 * w.in_flight, most)
        self.inputs = self._inputs(w, w.rate, target)
        self._fit(target)

    def _fit(self, in_flight: int) -> None:
        """``in_flight`` with the loaders whose threads can hold them."""
        if self.processes:  # readers of more threads than they may hold: more loaders
            self.processes = max(self.processes, -(-in_flight // self.limits.threads))
        self._move(in_flight)

    def _try_loaders(self, w: Window, rate: float, in_flight: int, bound: Bound) -> None:
        """Twice the loaders, each with the in flight one had (``in_flight`` in all); else
        ``in_flight``. Reads that queue deliver less than Little's law over a read alone says,
        so the in flight a loader measured, not that, is what each new one gets."""
        self._back = (self.threads, self.processes, rate, w, in_flight, bound, self.inputs)
        count = min(self.limits.processes, 2 * self.processes)
        target = min(in_flight * count // self.processes, self.budgets(w)[0])
        self.processes, self.phase, self._trial = count, "trial", []
        self._move(target)

    def _judge(self, w: Window) -> None:
        self._trial.append(w)
        if len(self._trial) < TRIAL_WINDOWS:
            return
        assert self._back is not None
        _, processes, before, window, in_flight, bound, inputs = self._back
        rate = statistics.mean(t.rate for t in self._trial)
        if rate < before * GAIN:  # back to the loaders there were
            self._tried.add(self.processes)
            self.processes, self.inputs = processes, inputs
            self._move(in_flight)
            return self._settle(bound, window)
        last = self._trial[0].merged(*self._trial[1:])
        self.phase, self._last = "grow", last
        self._at = {last.in_flight: last}  # (measured with fewer loaders before)
        scaled = rate >= before * PROPORTIONAL * self.processes / processes
        if scaled and self._loaders_pay(last, rate):  # interpreters still bind
            return self._try_loaders(last, rate, last.in_flight, bound)
        self._double(last, self.budgets(last)[0])

    def _watch(self, w: Window) -> None:
        ref = self._reference
        if ref is None or self._references < WATCH:
            self._reference = w if ref is None else ref.merged(w)
            self._references += 1
            return
        self._recent.append(w)
        if len(self._recent) < WATCH:
            return
        now = self._recent[0].merged(*list(self._recent)[1:])
        moved = not ref.rate / DRIFT <= now.rate <= ref.rate * DRIFT
        waits = (now.wait_share >= 2 * WAITED) != (ref.wait_share >= WAITED)
        if moved or waits:  # something changed: measure again, a read alone first
            self.phase, self.bound, self.threads = "grow", Bound.MEASURING, 1
            self._floor, self._last, self._tried = None, None, set()
            self._again, self._at = None, {}

    def _move(self, in_flight: int) -> None:
        self.threads = max(1, min(self.limits.threads, -(-in_flight // max(1, self.processes))))

    def _settle(self, bound: Bound, w: Window) -> None:
        # What the setting delivers is measured at the setting: ``w`` if it did not move, else
        # the next window (a move from the best measured to fewer would read as a drift).
        same = (w.threads, w.processes) == (self.threads, self.processes)
        self.phase, self.bound, self._reference = "settled", bound, w if same else None
        self._references, self._recent = int(same), deque(maxlen=WATCH)
        self.settled_after = self.windows

    def _inputs(self, w: Window, rate: float, little: int) -> dict[str, float]:
        latency = self._floor[1] if self._floor is not None else w.latency
        return {
            "rate": rate,
            "latency": latency,
            "wait_share": w.wait_share,
            "reader_cores": w.cores(w.reader_cpu),
            "consumer_cores": w.cores(w.consumer_cpu),
            "interpreter_cores": w.cores(w.interpreter_cpu),
            "little": little,
            "budget": self.budgets(w)[0],
        }
