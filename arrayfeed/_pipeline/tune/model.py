"""How many groups are read at once, and by how many loaders: a small model of the read path.

Each :class:`Window` the tuner measures gives what the consumer took (``X`` groups/s) and the
share of its time it waited (``w``), how long a group took to read, and the cores the readers,
the busiest loader and the consumer used. The setting follows from six formulas over them,
stated in ``docs/explanation/tuning.md`` (numbered as there); :class:`~.report.Tuning` reports
their inputs:

1. Little's law: ``ceil(rate x L0 x (1 + MARGIN))`` groups in flight deliver ``rate``; ``L0``:
   the seconds a group held a reader with the fewest in flight (:meth:`Model._occupancy`).
2. A consumer that does not wait (``w < WAITED``) sets the rate: its own, ``X / (1 - w)``.
3. A consumer that waits: in flight doubles while the rate may still grow ``MARGIN``, as the
   slowest saturation Little's law allows (reads queueing for a storage) extrapolates from the
   last doubling; a gain within the windows' noise of that is measured again (``REPEATS``).
   Then the fewest measured within ``MARGIN`` of the ceiling (:meth:`Model._decide`).
4. Budgets: the cores less the consumer's, over the cores a read in flight uses; the groups
   the read-ahead memory holds; ``threads`` per reader.
5. Reads that queue in a loader with threads off the cores: twice the loaders are tried if the
   budgets allow ``GAIN`` x the rate, kept if they deliver it over ``TRIAL_WINDOWS`` windows.
6. The last ``WATCH`` windows merged moving ``DRIFT`` x (or three times their noise) from those
   before at the setting, or a consumer that starts or stops waiting: measured again.

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
GROWTH = 1.25  # reads queue where a read takes this x a read alone's latency
GAIN, TRIAL_WINDOWS, PROPORTIONAL = 1.15, 3, 0.75
DRIFT = 1.5
NOISE, PRIOR = 0.1, 2  # a window's noise (log rate), before it is measured; as windows
REPEATS = 4  # windows measured again at most, to tell a doubling that pays
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
        self._count: dict[int, int] = {}  # windows merged in each of ``_at``
        self._spread = 0.0  # squared log-rate differences between windows of one setting
        self._pairs = 0
        self._last: Window | None = None  # the last setting of the growth (below the current)
        self._repeats = 0  # windows measured again for the decision under way
        self._upper: Window | None = None  # its more in flight
        self._back: tuple[int, int, float, Window, int, Bound, dict[str, float]] | None = None
        self._trial: list[Window] = []
        self._tried: set[int] = set()  # loader counts that did not pay
        self._kept = max(1, processes)  # loaders a trial kept (or the first)
        self._reference: Window | None = None  # what the settled setting delivered
        self._references = 0  # windows merged in it
        self._recent: deque[Window] = deque(maxlen=WATCH)
        self._previous: Window | None = None  # the last window watched

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
        if w.groups <= 0:  # (nothing taken: no rate to go by)
            return
        self.windows, self.last = self.windows + 1, w
        if self.phase != "warm-up":  # (caches warm, threads start: not counted)
            if self._floor is None or w.in_flight < self._floor[0]:
                self._floor, self._alone = (w.in_flight, self._occupancy(w)), w.latency
            elif w.in_flight == self._floor[0]:
                self._floor = (w.in_flight, min(self._floor[1], self._occupancy(w)))
                self._alone = min(self._alone, w.latency)
            if self.phase in ("grow", "trial"):
                n, seen = w.in_flight, self._at.get(w.in_flight)
                if seen is not None and seen.processes != w.processes:  # (another setting)
                    seen, self._count[n] = None, 0
                self._at[n] = self._merge(seen, w, self._count.get(n, 0))
                self._count[n] = self._count.get(n, 0) + 1
        {"warm-up": self._warm, "settled": self._watch, "trial": self._judge}.get(
            self.phase, self._decide
        )(w)
        self.history.append((self.threads, self.processes))

    def _warm(self, w: Window) -> None:
        self.phase = "grow"

    def _merge(self, seen: Window | None, w: Window, k: int) -> Window:
        """``w`` merged into ``seen`` (``k`` windows of the same setting): their noise."""
        if seen is None:
            return w
        self._spread += math.log(w.rate / seen.rate) ** 2 * k / (k + 1)
        self._pairs += 1
        return seen.merged(w)

    def noise(self) -> float:
        """The standard deviation of a window's log rate at one setting: from the windows
        measured twice, NOISE before any (weighted as PRIOR of them)."""
        return math.sqrt((PRIOR * NOISE**2 + self._spread) / (PRIOR + self._pairs))

    def _decide(self, w: Window) -> None:
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
        last = self._last  # the doubling under way: from ``last`` to ``w`` (merged each)
        if self._repeats and self._upper is not None:  # one of the two measured again
            w = self._upper
        w = self._at.get(w.in_flight, w)
        self.threads, self.processes = w.threads, w.processes  # (``last`` may be measured now)
        last = self._at.get(last.in_flight, last) if last is not None else None
        most, bound = self.budgets(w)
        # Reads that saturate something queue: their latency grows (Little's law). A rate
        # that did not grow while they did not queue is noise: more in flight are tried.
        queued = w.latency <= 0 or w.latency >= GROWTH * self._alone  # (0: not measured)
        saturated, grown = False, 0.0
        if last is not None and queued and w.in_flight > last.in_flight:
            # A doubling pays while the rate may still grow MARGIN: a rate that saturates as
            # slowly as reads queueing for a storage gives ``1 / rate = L0 / n + 1 / C``, so
            # a step of ``k`` times the reads that gained ``g`` leaves ``1 / (1 - (g - 1) /
            # (k - 1))`` to come. Within the windows' noise of that, both are measured again.
            step = w.in_flight / last.in_flight - 1
            grown = (w.rate / last.rate - 1) / step
            gain = math.log(w.rate / last.rate / (1 + step * MARGIN / (1 + MARGIN)))
            counts = self._count.get(last.in_flight, 1), self._count.get(w.in_flight, 1)
            se = self.noise() * math.hypot(*(c**-0.5 for c in counts))
            if abs(gain) < se and self._repeats < REPEATS:
                again = last if counts[0] <= counts[1] else w
                self._upper, self._repeats = w, self._repeats + 1
                self.threads, self.processes = again.threads, again.processes
                return None
            saturated = gain < 0
            grown = grown if math.log(w.rate / last.rate) > se else 0.0  # (beyond the noise)
        self._last, self._repeats = w, 0
        grew = last is None or w.in_flight > last.in_flight  # (else a cap held them)
        if not saturated and most > w.in_flight and grew:
            return self._double(w, most)
        best = max(self._at.values(), key=lambda m: m.rate, default=w)
        fewest = w.processes
        # The fewest within MARGIN of the most the rate may reach (a budget cut the growth
        # short, or the storage saturated)
        ceiling = max(best.rate, w.rate / (1 - grown)) if saturated and grown > 0 else best.rate
        most, bound = min(most, self.reaching(ceiling)), Bound.LATENCY if saturated else bound
        if fewest:  # the loaders a trial kept, or more where their threads cannot hold ``most``
            fewest = max(self._kept, -(-most // self.limits.threads))
        self.inputs = self._inputs(best, best.rate, most)
        if self.queued_in_loader(w):  # (the window with the most threads waiting)
            rate = best.rate  # (what the reads delivered at best: more loaders must beat it)
            if self._loaders_pay(w, rate):
                return self._try_loaders(w, rate, most, bound, fewest)
            bound = Bound.INTERPRETER
        self.processes = fewest  # (loaders a doubling added that did not pay go)
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

    def _try_loaders(
        self, w: Window, rate: float, in_flight: int, bound: Bound, fewest: int
    ) -> None:
        """Twice the loaders, each with the in flight one had (``in_flight`` in all); else
        ``in_flight`` over ``fewest`` loaders. Reads that queue deliver less than Little's law
        over a read alone says, so the in flight a loader measured, not that, is what each new
        one gets."""
        self._back = (self.threads, fewest, rate, w, in_flight, bound, self.inputs)
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
        self.phase, self._last, self._kept = "grow", last, self.processes
        self._at = {last.in_flight: last}  # (measured with fewer loaders before)
        self._count = {last.in_flight: TRIAL_WINDOWS}
        scaled = rate >= before * PROPORTIONAL * self.processes / processes
        if scaled and self._loaders_pay(last, rate):  # interpreters still bind
            return self._try_loaders(last, rate, last.in_flight, bound, self.processes)
        self._double(last, self.budgets(last)[0])

    def _watch(self, w: Window) -> None:
        """The last WATCH windows, merged, against those before them at the setting."""
        if self._previous is not None:  # (successive windows: a lasting change counts once)
            self._spread += math.log(w.rate / self._previous.rate) ** 2 / 2
            self._pairs += 1
        self._previous = w
        if self._reference is None or self._references < WATCH:
            self._reference = w if self._reference is None else self._reference.merged(w)
            self._references += 1
            return
        if len(self._recent) == WATCH:
            self._reference = self._reference.merged(self._recent[0])
            self._references += 1
        self._recent.append(w)
        ref = self._reference
        if len(self._recent) < WATCH:
            return
        now = self._recent[0].merged(*list(self._recent)[1:])
        # (DRIFT, or three standard deviations of the windows' noise, merged, if more)
        se = self.noise() * math.sqrt(1 / WATCH + 1 / self._references)
        moved = abs(math.log(now.rate / ref.rate)) > max(math.log(DRIFT), 3 * se)
        waits = (
            now.wait_share >= 2 * WAITED if ref.wait_share < WAITED else now.wait_share < WAITED / 2
        )
        if moved or waits:  # something changed: measure again, a read alone first
            self.phase, self.bound, self.threads = "grow", Bound.MEASURING, 1
            self._floor, self._last, self._tried = None, None, set()
            self._repeats, self._at, self._count = 0, {}, {}

    def _move(self, in_flight: int) -> None:
        self.threads = max(1, min(self.limits.threads, -(-in_flight // max(1, self.processes))))

    def _settle(self, bound: Bound, w: Window) -> None:
        # What the setting delivers is measured at the setting: ``w`` if it did not move, else
        # the next window (a move from the best measured to fewer would read as a drift).
        same = (w.threads, w.processes) == (self.threads, self.processes)
        self.phase, self.bound, self._reference = "settled", bound, w if same else None
        self._references, self._recent = int(same), deque(maxlen=WATCH)
        self.settled_after, self._repeats, self._upper, self._previous = self.windows, 0, None, None

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
