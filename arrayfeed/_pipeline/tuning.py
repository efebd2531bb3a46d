"""Concurrency that tunes itself: how many reader threads and loaders, found while reading.

No single number of reader threads suits every storage: memory-bound reads (``.npy``) peak at a few,
CPU-bound decoding (gzip) at one per core, and reads that wait (object storage, a ``map_batch``
that calls a service, a dask array computed chunk by chunk) at many. A :class:`Tuner` finds the
number while the data is read, the way ``tf.data.AUTOTUNE`` does for its own parallelism, by
climbing a ladder of settings and measuring what reaches the consumer:

1. measure the rate (rows per second handed to the consumer) at the starting setting, over a
   window of :data:`WINDOW_SECONDS`, after a first window that is not counted (the first reads
   of a dataset warm caches and start threads);
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
   of its two measurements (a window that lands low, one in ten on object storage, by 10-25 %,
   would let every setting below it pass for a tie, down to one that delivers much less);
4. hold the chosen setting; tune again, from it, only when the rate moves away from the one it
   was chosen at by more than :data:`DRIFT` for :data:`DRIFT_WINDOWS` windows in a row.

Loader processes (read by loaders, their number not given) are tuned once the threads have
settled, one more at a time while those reading are busy and a core is left (:mod:`.loadercount`);
one tried counts from when it reads (:meth:`Tuner.processes_ready`), measured twice, the larger
counting, and is kept when it delivers :data:`GAIN` times the best so far.

After a move, the groups asked for at the setting before (and those of a window decoded ahead,
``ahead``) are not counted; a window in which a pass starts ends with that pass (see
:meth:`Tuner.pass_started`), and the time between passes is not counted. Short passes are read ahead
whole (see :func:`~.readers.read_pass`); behind a consumer that pauses between them, as tf.data
does between epochs, each pass's groups come at once and no window would ever close. When
:data:`WHOLE_PASSES` passes in a row were each asked for whole before they started and the
consumer spent less than :data:`WAITED_SHARE` of its time (from the pass's start to the next
one's) waiting for their groups, a tuner that has not settled holds its setting: reading keeps
ahead of the consumer, and more threads would gain it little. It measures from there as soon as
a pass is not so (the consumer waited more, or part of the pass was asked for after it started).

The rate is measured where batches are consumed, so it counts everything in the way (reads,
decoding, ``map_batch``, the loader's hand-over, the consumer itself). A setting of ``n`` threads
means what ``num_threads=n`` means: ``n`` groups read at once and one more requested. A tuner
only says how many; groups are still read into their own buffers and taken in order, so tuning
changes how fast batches come, never which or in which order.

Pure logic, starting no thread and doing no I/O: the reading side (:meth:`~.feed.Feed.epoch`,
:meth:`~.loader.client.RemoteFeed.epoch`) asks :attr:`Tuner.threads` (and
:attr:`Tuner.processes`) before each request and reports each group it hands over with
:meth:`Tuner.delivered`; the readers' CPU time (the loaders', or that of the process reading)
comes from the ``cpu`` it is given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .loadercount import LoaderCount
from .tuningreport import DOING, Tuning

__all__ = [
    "CARRIED_PAUSE",
    "DRIFT",
    "GAIN",
    "LADDER",
    "LEAP",
    "PROPORTIONAL",
    "TIE",
    "WAITED_SHARE",
    "WHOLE_PASSES",
    "WINDOW_SECONDS",
    "WINDOW_SECONDS_MAX",
    "Tuner",
]

#: Settings tried, in order (those up to a feed's cap).
LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Seconds of delivery each measurement covers (and at least :data:`WINDOW_GROUPS` groups).
WINDOW_SECONDS = 0.3
WINDOW_GROUPS = 2
#: A window that holds a pass start ends with that pass (see :meth:`Tuner.pass_started`), or after
#: this many seconds when the pass goes on.
WINDOW_SECONDS_MAX = 0.6
#: Seconds between passes beyond which groups read ahead across them are not counted (see
#: :meth:`Tuner.pass_started`): a tenth of a window.
CARRIED_PAUSE = WINDOW_SECONDS / 10
#: A step up is kept when it delivers this many times the best rate so far. Small: rates that
#: rise a few per cent per rung over many rungs add up to much (Zarr on S3 on 2 cores: 4-11 % per
#: rung from 12 threads to 64, 1.35x in all), and a tie taken on the way up is undone on the way
#: down (:data:`TIE`).
GAIN = 1.05
#: A step up that delivers this many times the best rate so far is followed by a leap of two
#: rungs (about twice the threads): a long ladder climbed a rung at a time takes many windows.
LEAP = 1.3
#: ... of four rungs when its rate grew by at least this share of what the threads grew: reads
#: that wait (object storage, a service, dask chunks computed one by one) grow so up to tens.
PROPORTIONAL = 0.8
#: A step down is kept when it still delivers this share of the best rate so far.
TIE = 0.95
#: A held setting is tuned again when the rate leaves ``[rate * (1 - DRIFT), rate / (1 - DRIFT)]``
#: of the rate it was chosen at, for :data:`DRIFT_WINDOWS` windows in a row.
DRIFT = 0.5
DRIFT_WINDOWS = 3
#: Passes in a row asked for whole before they started, in which the consumer waited for less
#: than :data:`WAITED_SHARE` of its time (from the pass's start to the next one's), after which a
#: tuner that has not settled holds its setting (see the module docstring).
WHOLE_PASSES = 3
WAITED_SHARE = 0.1


class Tuner:
    """Reader threads, tuned online (see the module docstring); ``fixed`` holds them.
    ``ahead``: groups whose data the reading may have prepared beyond the groups in flight (the
    next window of a block shuffle, decoded ahead); after a move they are not counted either,
    as they came at the setting before it."""

    def __init__(
        self,
        start: int,
        cap: int,
        *,
        fixed: bool = False,
        ahead: int = 0,
        processes: int = 0,
        most_processes: int | None = None,
        cores: float | None = None,
        cpu: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.cap = max(1, cap)
        self.fixed = fixed
        self.ahead = ahead
        self.ladder = sorted(
            {s for s in LADDER if s <= self.cap} | {min(start, self.cap), self.cap}
        )
        #: The loader processes (see :mod:`.loadercount`): groups in flight in all of them stay
        #: within what one may read ahead.
        most, budget = max(processes, most_processes or 0), (self.cap + 1) * max(1, processes)
        self.loaders = LoaderCount(processes, most, budget, cores, cpu, GAIN)
        self._chosen: float | None = None  # the rate the held setting was chosen at
        self._thread_reason = ""
        self._clock = clock
        self._lock = threading.Lock()
        self._at = self.ladder.index(min(start, self.cap))
        self._rates: dict[int, float] = {}
        self._best = 0  # ladder position of the best setting so far
        self._phase = "settled" if fixed else "warm-up"
        self._down_from = start
        self._leap = 0  # rungs the last step up leapt (0: it was not a leap)
        # The rungs a leap that went too far skipped, halved at each: (best, too far).
        self._span: tuple[int, int] | None = None
        self._drifting = 0
        self._whole = 0  # passes in a row asked for whole and taken with little waiting
        self._held = False  # settled by :meth:`_hold`, not by measuring
        # The pass under way: when it started, whether it was asked for whole, seconds waited.
        self._pass: tuple[float, bool] | None = None
        self._waited = 0.0
        # The window being measured: since when (pauses between passes left out), since when by
        # the clock, rows and groups delivered in it, pass starts in it, and whether it has
        # lasted long enough and ends with the pass.
        self._window_start: float | None = None
        self._opened = 0.0
        self._mark = 0.0  # the window's opening or last pass start: pauses are counted from it
        self._rows = self._groups = self._starts = 0
        self._due, self._in_wait, self._wait_share = False, 0.0, 0.0  # the consumer's, waiting
        self._skip = 0  # groups still to pass uncounted after a move
        self._why = "fixed by num_threads" if fixed else "tuning"
        self._first: float | None = None  # when the first group was delivered
        self._last: float | None = None  # when the latest was
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

    def processes_ready(self, in_flight: int) -> None:
        """The loaders :attr:`processes` asked for are reading (started, or found unable to);
        ``in_flight``: groups asked for before, not counted."""
        with self._lock:
            if self.loaders.starting:
                self.loaders.starting, self._skip, self._window_start = False, in_flight, None

    def pass_started(self, carried: int = 0, whole: bool = False) -> None:
        """A pass starts (an epoch, or a validation run). The time since the last group (the
        consumer between passes, or paused) is not counted. A window that has lasted long
        enough, with a pass start in it, ends here: on short epochs windows hold whole passes,
        each with its start (no reads in flight yet, so its first group takes one read's time
        at any setting); ending them mid-pass gave each window a different share of starts,
        which hid what the settings delivered.

        ``carried``: groups of this pass already asked for, read ahead while the pass before
        ended (see :func:`~.readers.read_pass`). After a pause longer than :data:`CARRIED_PAUSE`
        they are not counted (read while nothing was measured, they come at once), nor, after a
        move, those asked for before it. ``whole``: all of this pass's groups were among them
        (see the module docstring and :meth:`delivered`)."""
        if self.fixed:
            return
        with self._lock:
            now = self._clock()
            if self._window_start is not None and self._due and self._last is not None:
                self._close(self._last)
            pause = self._since_last(now, self._last)
            # The groups of the pass before, asked for before a move, are done; those carried
            # into this one were asked for with them.
            self._skip = min(self._skip, carried)
            if carried and pause > CARRIED_PAUSE:
                self._skip = carried
            if self._pass is not None:  # the pass before: whole, and taken with little waiting?
                began, was_whole = self._pass
                # Of the consumer's time until this pass (a pause is its own: its time, as the
                # pass's, counts; through a loader each group costs ~0.3 ms of messages, which
                # the few milliseconds a short pass takes alone would make a share of 10-30 %).
                ahead = was_whole and self._waited <= WAITED_SHARE * (now - began)
                self._whole = self._whole + 1 if ahead else 0
            self._pass, self._waited = (now, carried > 0 and whole), 0.0
            held = self._whole >= WHOLE_PASSES and self._phase != "settled"
            if held:
                self._hold()
            retune = self._held and not self._whole and not held
            if retune:  # reading no longer keeps ahead: measure from here
                self._held, self._phase, self._settled_after = False, "measure", None
                self._rates.clear()
                self.loaders.busy.clear()
                self._why = "tuning again (passes are no longer read ahead whole unwaited for)"
            if self._window_start is None or held or retune:
                self._open(now)  # (what it holds may be from long ago)
            else:  # the pause since the last group, or pass start
                self._leave_out(pause)
            self._mark = now
            if self._phase != "warm-up":  # (the first window is not counted anyway)
                self._starts += 1

    def delivered(self, rows: int, waited: float = 0.0) -> None:
        """Count a group of ``rows`` handed to the consumer, which waited ``waited`` seconds
        for it; may change :attr:`threads`."""
        if self.fixed:
            return
        with self._lock:  # groups of concurrent passes may be delivered by several threads
            now, before = self._clock(), self._last
            self._waited += waited
            self._last = now
            if self._first is None:
                self._first = now
            if self.loaders.starting:  # read by the loaders before those starting: not counted
                return
            if self._skip:  # requested at the setting before a move, or read during a pause
                self._skip -= 1
                if self._window_start is not None:  # nor its time
                    self._leave_out(self._since_last(now, before))
                return
            if self._window_start is None:  # the window starts at its first delivery
                self._open(now)
                return
            self._rows += rows
            self._groups += 1
            self._in_wait += waited
            if self._groups < WINDOW_GROUPS or now - self._window_start < WINDOW_SECONDS:
                return
            if self._starts and now - self._opened < WINDOW_SECONDS_MAX:
                self._due = True  # to end with this pass (see pass_started)
                return
            self._close(now)

    def _since_last(self, now: float, last: float | None) -> float:
        """Seconds since ``last`` (a group delivered) or the window's opening or last pass
        start, whichever is later."""
        return 0.0 if last is None else max(0.0, now - max(last, self._mark))

    def _leave_out(self, seconds: float) -> None:
        """Leave ``seconds`` out of the open window (and of its cap)."""
        assert self._window_start is not None
        self._window_start += seconds
        self._opened += seconds

    def _open(self, now: float) -> None:
        self._window_start = self._opened = self._mark = now
        self._rows, self._groups, self._starts, self._due, self._in_wait = 0, 0, 0, False, 0.0
        self.loaders.opened(self._clock())

    def _close(self, now: float) -> None:
        assert self._window_start is not None
        rate = self._rows / max(now - self._window_start, 1e-9)
        self._wait_share = self._in_wait / max(now - self._window_start, 1e-9)
        self._window_start = None
        self.loaders.closed(self._clock(), self.threads, rate)
        self._decide(rate)
        if self._window_start is None and not self._skip:  # no move: the next window starts now
            self._open(now)

    def report(self) -> Tuning:
        with self._lock:
            settled = self._phase == "settled"
            return Tuning(
                threads=self.threads,
                tuned=not self.fixed,
                settled=settled,
                rates=dict(self._rates),
                why=self._why if settled else f"{self._why}: {DOING[self._phase]}",
                settled_after=self._settled_after,
                processes=self.processes,
                process_rates=dict(self.loaders.rates),
            )

    # -- the ladder ---------------------------------------------------------------------------------
    def _decide(self, rate: float) -> None:
        here, loaders = self.threads, self.processes
        if self._phase == "settled":
            self._watch(rate)
        elif self._phase == "warm-up":
            self._phase = "measure"
        elif self._phase == "processes":
            why = self.loaders.measured(rate, self.threads)
            if why is not None:
                self._loaders_settle(why)
        else:
            self._climb(rate, self.ladder[self._at])
        if (self.threads, self.processes) != (here, loaders):
            # A new setting: the groups in flight were asked for before it.
            self._window_start = None
            self._skip = (here + 1) * max(1, loaders) + self.ahead

    def _climb(self, rate: float, here: int) -> None:
        before = self._rates.get(here, 0.0)
        self._rates[here] = rate
        best = self._rates.get(self.ladder[self._best], 0.0)
        if self._phase == "measure":
            self._best, self._leap, self._span = self._at, 0, None
            fill = self.loaders.threads_to_fill(here, self.threads) or 0.0  # (docstring, 2.)
            fill *= self._wait_share >= WAITED_SHARE  # (not when the consumer sets the pace)
            self._step("up", 1 + sum(here < s < fill for s in self.ladder))
            self._leap = self._at - self._best if self._at > self._best + 1 else 0
        elif self._phase == "up":
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
                self._step("up", rungs)
                self._leap = max(0, self._at - self._best) if rungs > 1 else 0
            elif self._leap > 1 and self._at == self._best + self._leap:  # too far: halfway
                self._span, self._leap = (self._best, self._at), 0
                self._move((self._best + self._at) // 2)
            elif self._at == self._best + 1 and self._at + 1 < len(self.ladder):
                self._move(self._at + 1)  # one step further before giving up
            else:
                self._again()
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

    def _again(self) -> None:
        """The climb is over: measure the best again before going down from it (see the module
        docstring: a rate measured while climbing may have risen since for reasons of its
        own, and what fewer threads deliver is compared with what the best delivers now)."""
        if self._best == 0:
            self._settle(f"{self.ladder[1]} did not deliver more")
        elif self._at == self._best:  # measured just now
            self._step("down")
        else:
            self._phase = "again"
            self.loaders.want_spare(self.loaders.threads(self.ladder[self._best]))
            self._move(self._best)

    def _step(self, direction: str, rungs: int = 1) -> None:
        if direction == "down" and self._phase != "down":
            self._down_from = self.ladder[self._best]  # what fewer threads must still deliver
            self.loaders.want_spare(self.loaders.threads(self._down_from))  # the climb is over
        target = self._best + (rungs if direction == "up" else -1)
        if direction == "up" and target >= len(self.ladder) > self._best + 1:
            target = len(self.ladder) - 1  # a leap past the top: the top
        if not 0 <= target < len(self.ladder):
            if direction == "up":  # the top: down from there
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
        why_not = self.loaders.why_not_more(self.threads)
        self.loaders.spare = 0
        if why_not is None:  # one more loader next
            self.loaders.begin(rate)
            self._phase, self._settled_after = "processes", None
        elif len(self.process_ladder) > 1:
            loaders = self.processes
            self._why = (
                self._why[:-1] + f"; {loaders} loader process{'es' * (loaders > 1)}: {why_not})"
            )

    def _reading_seconds(self) -> float | None:
        if self._first is None or self._last is None:
            return None
        return self._last - self._first

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

    def _hold(self) -> None:
        """Hold the setting: reading keeps ahead of the consumer (see the module docstring)."""
        if self._phase == "processes":  # loaders starting or measured: back to those before
            self.loaders.back()
        self.loaders.spare = 0
        self._best, self._phase, self._drifting, self._held = self._at, "settled", 0, True
        self._chosen = self._rates.get(self.ladder[self._at])
        self._settled_after = self._reading_seconds()
        self._why = (
            f"held: the last {self._whole} passes were each read ahead whole, the consumer "
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
            self._step("up")
