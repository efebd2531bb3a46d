"""Where a tuner goes after each window it measured: the ladder of reader threads, then loaders.

A :class:`Ladder` is given the rate of each window (rows per second handed to the consumer, as
:class:`~.tuning.Tuner`, which is one, measures it) and moves through the settings:

1. measure the rate at the starting setting, after a first window that is not counted (the
   first reads of a dataset warm caches and start threads);
2. step up: first as far as the readers' CPU says more would fit, if the consumer waited for
   them (:meth:`~.loadercount.LoaderCount.threads_to_fill`: reads that wait use little CPU),
   then while each step up delivers :data:`GAIN` times more than the best so far
   (two rungs at a time after a step that delivered :data:`LEAP` times more, four after one whose
   rate grew nearly as the threads did, by :data:`PROPORTIONAL` of their growth: reads that
   wait; and, when a leap went too far, the rungs it skipped, halving the span between the best
   and the rung too far); a step that does not is given one more chance, the step after it (rates
   that rise slowly, as reads that wait meet the CPU, gain little per step but much over two);
3. then measure the best again and go down from it, measuring each setting below again, while
   each still delivers :data:`TIE` of what the best delivers (a tie goes to fewer threads:
   when the consumer sets the pace, more threads only take cores from it). The best measured
   again cancels a rate that rose on its own while climbing (caches and read-ahead filling in
   the first seconds: each step up looked better than it was); what it delivers is the larger
   of its two measurements (one that lands low would let every setting below pass for a tie);
4. hold the chosen setting; tune again, from it, only when the rate moves away from the one it
   was chosen at by more than :data:`DRIFT` for :data:`DRIFT_WINDOWS` windows in a row.

Loader processes (read by loaders, their number not given) are tuned once the threads have
settled, one more at a time while those reading are busy and a core is left (:mod:`.loadercount`).
A count tried reads with the threads there were: shared among the loaders when they were no
more than the cores (they used the CPU: what more interpreters deliver more is theirs), as many
in each as one had when they were more (most of them waited: halved, they would wait as much,
in more interpreters). Threads that wait are tried in more loaders as soon as the climb is over,
with twice as many each as one had, before the way down (3.), which follows only if no more
loaders are kept
(:meth:`Ladder._loaders_first`); the next loader is started while the climb goes on. It counts
from when it reads (:meth:`~.tuning.Tuner.processes_ready`),
measured twice, the larger counting, and is kept, with its threads, when it delivers
:data:`GAIN` times the best so far; let go, the threads before come back. Once the count is
chosen, each of the loaders kept is tried with twice its threads (after a count that shared
them: as many as one had), again while that pays (:meth:`Ladder._each`).

Pure logic, as :mod:`.tuning`: it is told the rates and says the settings.
"""

from __future__ import annotations

from .loadercount import LoaderCount

__all__ = [
    "DRIFT",
    "DRIFT_WINDOWS",
    "GAIN",
    "LADDER",
    "LEAP",
    "PROPORTIONAL",
    "TIE",
    "WAIT",
    "Ladder",
]

#: Settings tried, in order (those up to a feed's cap).
LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: A step up is kept when it delivers this many times the best rate so far. Small: rates that
#: rise a few per cent per rung add up over many rungs (object storage: docs/explanation/tuning.md),
#: and a tie taken on the way up is undone on the way down (:data:`TIE`).
GAIN = 1.05
#: A step up that delivers this many times the best rate so far is followed by a leap of two
#: rungs (about twice the threads): a long ladder climbed a rung at a time takes many windows.
LEAP = 1.3
#: ... of four rungs when its rate grew by at least this share of what the threads grew: reads
#: that wait (object storage, a service, dask chunks computed one by one) grow so up to tens.
PROPORTIONAL = 0.8
#: Threads beyond the cores that deliver this many times what the cores' worth did mostly wait
#: (see :meth:`Ladder._threads_wait`).
WAIT = 2.0
#: A step down is kept when it still delivers this share of the best rate so far.
TIE = 0.95
#: A held setting is tuned again when the rate leaves ``[rate * (1 - DRIFT), rate / (1 - DRIFT)]``
#: of the rate it was chosen at, for :data:`DRIFT_WINDOWS` windows in a row.
DRIFT = 0.5
DRIFT_WINDOWS = 3


class Ladder:
    """The settings a tuner moves through, and where it goes next (see the module docstring):
    from ``start`` threads, up to ``cap``, with ``loaders`` (their count tuned once the threads
    have settled); ``fixed``: the start is held."""

    def __init__(self, start: int, cap: int, loaders: LoaderCount, fixed: bool) -> None:
        self.cap = max(1, cap)
        self.fixed = fixed
        self.ladder = sorted(
            {s for s in LADDER if s <= self.cap} | {min(start, self.cap), self.cap}
        )
        self.loaders = loaders
        self._at = self.ladder.index(min(start, self.cap))
        self._rates: dict[int, float] = {}
        self._best = 0  # ladder position of the best setting so far
        self._phase = "settled" if fixed else "warm-up"
        self._down_from = start
        self._leap = 0  # rungs the last step up leapt (0: it was not a leap)
        # The rungs a leap that went too far skipped, halved at each: (best, too far).
        self._span: tuple[int, int] | None = None
        self._chosen: float | None = None  # the rate the held setting was chosen at
        self._drifting = 0
        self._held = False  # settled by :meth:`_hold`, not by measuring
        self._why = "fixed by num_threads" if fixed else "tuning"
        self._thread_reason = ""
        self._why_each = ""  # see _each
        # Loaders tried before the way down (see _loaders_first), and why they were let go.
        self._down_after = False
        self._loaders_tried: str | None = None
        self._waiting = False  # the threads settled at wait (see _threads_wait)
        self._settled_after: float | None = None
        #: Settings in the order they were used (for tests and reports).
        self.history = [self.threads]

    @property
    def threads(self) -> int:
        """Groups to read at once now, in this process or in each loader (and one more to
        request ahead): the setting, or fewer where the groups of every loader would not fit."""
        return self.loaders.threads(self.ladder[self._at])

    @property
    def processes(self) -> int:
        """Loader processes to read with now (0: this process reads)."""
        return self.loaders.count

    @property
    def process_ladder(self) -> list[int]:
        """Loader process counts that may be tried."""
        return self.loaders.ladder

    def decide(self, rate: float, waited: bool) -> None:
        """A window delivered ``rate``; ``waited``: the consumer waited for its groups (a leap
        up by the readers' CPU only then: behind a consumer that sets the pace they use little
        CPU too, and more would not help)."""
        if self._phase == "settled":
            self._watch(rate)
        elif self._phase == "warm-up":
            self._phase = "measure"
        elif self._phase == "processes":
            kept = self.loaders.best_rate
            why = self.loaders.measured(rate, self.threads, self._waiting)
            if self.loaders.best_rate > kept:  # the count tried is kept, with its threads
                self._best = self._at
            elif why is not None and self._at != self._best:  # let go: the threads before
                self._move(self._best)
            if why is None:
                return
            down, self._down_after = self._down_after, False
            if down and self.processes == self.loaders.base:  # none more kept: the way down
                self._loaders_tried, self._phase = why, "again"  # (see _loaders_first)
            else:
                self._each(why)
        elif self._phase == "each":
            self._each(self._why_each, rate)
        else:
            self._climb(rate, self.ladder[self._at], waited)

    def _reading_seconds(self) -> float | None:
        """Seconds of reading until now (None: not known here; the tuner measures them)."""
        return None

    def _climb(self, rate: float, here: int, waited: bool) -> None:
        before = self._rates.get(here, 0.0)
        self._rates[here] = rate
        best = self._rates.get(self.ladder[self._best], 0.0)
        if self._phase == "measure":
            self._best, self._leap, self._span = self._at, 0, None
            self._down_after, self._loaders_tried = False, None
            fill = self.loaders.threads_to_fill(here, self.threads) or 0.0  # (docstring, 2.)
            fill *= waited  # (see decide)
            self._step("up", 1 + sum(here < s < fill for s in self.ladder))
            self._leap = self._at - self._best if self._at > self._best + 1 else 0
        elif self._phase == "up":
            full = self._full(here)
            if self._span is not None:  # a rung a leap skipped: halve the span it lies in
                low, high = self._span
                if rate > best * GAIN:
                    self._best = low = self._at
                else:
                    high = self._at
                self._span = (low, high) if high - low > 1 else None
                if self._span is None:  # the last of the climb
                    self._again()
                else:
                    self._move((low + high) // 2)
            elif rate > best * GAIN:
                rungs = 1
                if rate > best * LEAP:  # in proportion to the threads: a longer leap
                    more = here / self.ladder[self._best]
                    rungs = 4 if rate >= best * (1 + PROPORTIONAL * (more - 1)) else 2
                self._best = self._at
                if full:  # more threads would find no core to run on (see _full)
                    self._again()
                else:
                    self._step("up", rungs)
                    self._leap = max(0, self._at - self._best) if rungs > 1 else 0
            elif self._leap > 1 and self._at == self._best + self._leap:  # too far: halfway
                self._span, self._leap = (self._best, self._at), 0
                self._move((self._best + self._at) // 2)
            elif self._at == self._best + 1 and self._at + 1 < len(self.ladder) and not full:
                self._move(self._at + 1)  # one step further before giving up
            else:
                self._again()
            if self._phase == "up" and self._threads_wait():  # more loaders may be tried
                best = self.ladder[self._best]  # soon (see _loaders_first): start one now
                self.loaders.want_spare(self.loaders.threads(best), waiting=True)
        elif self._phase == "again":  # the reference of the way down, measured now
            self._rates[here] = max(rate, before)  # (see the module docstring, 3.)
            self._step("down")
        elif self._phase == "down":  # against a fixed reference, so that ties do not compound
            reference = self._rates[self._down_from]
            if rate >= reference * TIE:
                self._best = self._at
                if rate > reference:
                    self._down_from = here
                self._step("down")
            else:
                self._settle(f"{here} delivered less")

    def _full(self, here: int) -> bool:
        """Whether loaders reading used the cores there are, but the consumer's share, at
        ``here`` (:meth:`~.loadercount.LoaderCount.threads_to_fill`): more threads would find
        no core to run on, and a step up that seems to pay, or the one more step after one
        that does not, only measures a rate that rises on its own (chunked gzip, 2 cores: a
        climb to 16 threads on gains of 5 %, where 2 to 4 deliver the most). Not known when
        the training process reads: its CPU time is the consumer's too."""
        if self.loaders.count == 0:
            return False
        fill = self.loaders.threads_to_fill(here, self.threads)
        return fill is not None and fill <= here

    def _again(self) -> None:
        """The climb is over: measure the best again before going down from it (see the module
        docstring: a rate measured while climbing may have risen since for reasons of its
        own, and what fewer threads deliver is compared with what the best delivers now)."""
        if self._best == 0:
            self._settle(f"{self.ladder[1]} did not deliver more")
        elif self._loaders_first():
            self._down_after = True
            self._settle("more loaders tried before fewer threads")
        elif self._at == self._best:  # measured just now
            self._step("down")
        else:
            self._phase = "again"
            if self._loaders_tried is None:
                threads = self.loaders.threads(self.ladder[self._best])
                self.loaders.want_spare(threads, self._threads_wait())
            self._move(self._best)

    def _loaders_first(self) -> bool:
        """Whether the climb's best is to be read by more loaders before the way down: its
        threads wait (:meth:`_threads_wait`), so more loaders would read with as many each as
        one had (see :meth:`_settle`), and one more may pay. Fewer threads are then tried only
        if no more loaders are kept: with them, the way down would be windows spent on a
        setting about to change, and each loader's threads are tried anew (:meth:`_each`)."""
        threads = self.loaders.threads(self.ladder[self._best])
        return (
            self._loaders_tried is None
            and self._threads_wait()
            and self.loaders.why_not_more(threads, waiting=True) is None
        )

    def _threads_wait(self) -> bool:
        """Whether the best so far, more threads than the cores, delivered at least
        :data:`WAIT` times what the best setting of no more threads than the cores did: most of
        its threads wait (on storage, a service), and more of them in more loaders would too
        (a count is then tried with twice as many threads each as one had, or as many as fit:
        the climb ended where one interpreter's lock held it back, and as many in two gained
        too little to tell from the windows' noise where the climb stopped low).
        Less is not evidence enough: a climb can pass the cores on gains of 5 % that a rate
        rising on its own explains, which the way down then undoes (threads looping in Python
        under one loader's lock, 2 cores: 8 threads, where 2 deliver as much)."""
        cores, best = self.loaders.cores, self.ladder[self._best]
        if cores is None or best <= cores:
            return False
        within = [rate for setting, rate in self._rates.items() if setting <= cores]
        return bool(within) and self._rates[best] >= WAIT * max(within)

    def _step(self, direction: str, rungs: int = 1) -> None:
        if direction == "down" and self._phase != "down":
            self._down_from = self.ladder[self._best]  # what fewer threads must still deliver
            if self._loaders_tried is None:  # the climb is over
                threads = self.loaders.threads(self._down_from)
                self.loaders.want_spare(threads, self._threads_wait())
        target = self._best + (rungs if direction == "up" else -1)
        if direction == "up" and target >= len(self.ladder) > self._best + 1:
            target = len(self.ladder) - 1  # a leap past the top: the top
        if not 0 <= target < len(self.ladder):
            if direction == "up" and self._best:  # the top, measured just now: down from it
                self._again()
            elif direction == "up":
                self._step("down")
            else:
                self._settle("none fewer to try")
            return
        self._phase = direction
        self._move(target)

    def _move(self, at: int) -> None:
        self._at = at
        self.history.append(self.threads)

    def _settle(self, reason: str) -> None:
        moved = self._at != self._best
        self._at, self._phase, self._drifting = self._best, "settled", 0
        if moved:
            self.history.append(self.threads)
        rate = self._chosen = self._rates[self.ladder[self._at]]
        self._settled_after = self._reading_seconds()
        self._why = f"tuned: {rate:,.0f} rows/s, best of those tried ({reason})"
        self._thread_reason = reason
        self._waiting = self._threads_wait()
        why_not = self._loaders_tried or self.loaders.why_not_more(self.threads, self._waiting)
        self.loaders.spare = 0
        if self._loaders_tried is not None:  # tried before the way down, and let go
            self._why = self._why[:-1] + f"; {why_not})"
        elif why_not is None:  # one more loader next, with threads as one had when they wait
            self.loaders.begin(rate)
            self._phase, self._settled_after = "processes", None
            cores, times = self.loaders.cores, 4 if self._waiting else 2  # (see _threads_wait)
            if cores is not None and self.ladder[self._at] > cores and (up := self._up(times)):
                self._move(up)
        elif len(self.process_ladder) > 1:
            loaders = self.processes
            self._why = (
                self._why[:-1] + f"; {loaders} loader process{'es' * (loaders > 1)}: {why_not})"
            )

    def _each(self, why: str, rate: float | None = None) -> None:
        """The loader count is chosen (``why``): each of more than one kept is tried with
        twice its threads (after a count that shared them: as many as one had), then twice as
        many again while that pays (``rate``: a window of the trial), each measured twice, the
        larger counting, and kept when it delivers :data:`GAIN` times more."""
        loaders, threads = self.loaders, self.threads
        if rate is None:  # the count is chosen, or more threads each paid
            up = self._up(2 if self._phase == "each" else loaders.count // loaders.base)
            if up is None:
                return self._loaders_settle(why)
            self._phase, self._why_each = "each", why
            return self._move(up)
        rate = loaders.judged(rate)
        if rate is None:  # measured again
            return None
        if rate > loaders.best_rate * loaders.gain:
            loaders.best_rate = loaders.rates[loaders.count] = rate
            self._best = self._at
            return self._each(f"{why}; {threads} threads each delivered {rate:,.0f}")
        self._move(self._best)
        return self._loaders_settle(f"{why}; {threads} threads each did not deliver more")

    def _up(self, times: int) -> int | None:
        """The highest rung up to ``times`` the setting, if it gives each loader more threads."""
        each = self.ladder[self._at] * times
        ups = [a for a in range(self._at + 1, len(self.ladder)) if self.ladder[a] <= each]
        fits = ups and self.loaders.threads(self.ladder[ups[-1]]) > self.threads
        return ups[-1] if fits else None

    def _loaders_settle(self, reason: str) -> None:
        """The loaders tried are measured: settled at the best count (see :mod:`.loadercount`)."""
        self._phase, self._drifting = "settled", 0
        self._chosen = rate = self.loaders.best_rate
        self.loaders.spare = 0
        self._settled_after = self._reading_seconds()
        loaders = f" with {self.processes} loader processes" if self.processes > 1 else ""
        self._why = (
            f"tuned: {rate:,.0f} rows/s{loaders}, best of those tried "
            f"({self._thread_reason}; {reason})"
        )

    def _hold(self, passes: int) -> None:
        """Hold the setting: the last ``passes`` were read ahead of the consumer (see
        :meth:`~.tuning.Tuner.pass_started`)."""
        if self._phase in ("processes", "each"):  # a trial under way: back to what was kept
            self.loaders.back()
            self._at = self._best
        self.loaders.spare = 0
        self._best, self._phase, self._drifting, self._held = self._at, "settled", 0, True
        self._chosen = self._rates.get(self.ladder[self._at])
        self._settled_after = self._reading_seconds()
        self._why = (
            f"held: the last {passes} passes were each read ahead whole, the consumer "
            "waiting for them less than a tenth of its time: more threads would gain little"
        )

    def _watch(self, rate: float) -> None:
        chosen = self._chosen
        if chosen is None:  # held before it was measured: watch from this rate on
            self._rates[self.ladder[self._at]] = self._chosen = rate
            return
        if chosen * (1 - DRIFT) <= rate <= chosen / (1 - DRIFT):
            self._drifting = 0
            return
        self._drifting += 1
        if self._drifting >= DRIFT_WINDOWS:  # something changed: tune again from here
            self._rates.clear()
            self.loaders.rates.clear()
            self.loaders.busy.clear()
            self.loaders.spare = 0
            self._settled_after = None
            self._phase, self._drifting, self._held = "measure", 0, False
            self._why = f"tuning again (the rate moved from {chosen:,.0f} to {rate:,.0f} rows/s)"
            self._rates[self.ladder[self._at]] = rate
            self._best, self._leap, self._span = self._at, 0, None
            self._down_after, self._loaders_tried = False, None
            self._step("up")
