"""Concurrency that tunes itself: how many reader threads and loaders, found while reading.

No single number of reader threads suits every storage: memory-bound reads (``.npy``) peak at a few,
CPU-bound decoding (gzip) at one per core, and reads that wait (object storage, a ``map_batch``
that calls a service, a dask array computed chunk by chunk) at many. A :class:`Tuner` finds the
number while the data is read, the way ``tf.data.AUTOTUNE`` does for its own parallelism: it
measures what reaches the consumer (rows per second handed over, over windows of
:data:`WINDOW_SECONDS`) and climbs a ladder of settings with what it measured
(:mod:`.tuningladder` says where it goes after each window).

After a move, the groups asked for at the setting before (and those of a window decoded ahead,
``ahead``) are not counted, nor the time between passes; a window in which a pass starts ends
with that pass; and a tuner that has not settled holds its setting while passes are read ahead
whole faster than the consumer takes them (see :meth:`Tuner.pass_started`).

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
from .tuningladder import GAIN, Ladder
from .tuningreport import DOING, Tuning

__all__ = [
    "CARRIED_PAUSE",
    "WAITED_SHARE",
    "WHOLE_PASSES",
    "WINDOW_SECONDS",
    "WINDOW_SECONDS_MAX",
    "Tuner",
]

#: Seconds of delivery each measurement covers (and at least :data:`WINDOW_GROUPS` groups).
WINDOW_SECONDS = 0.3
WINDOW_GROUPS = 2
#: A window that holds a pass start ends with that pass (see :meth:`Tuner.pass_started`), or after
#: this many seconds when the pass goes on.
WINDOW_SECONDS_MAX = 0.6
#: Seconds between passes beyond which groups read ahead across them are not counted (see
#: :meth:`Tuner.pass_started`): a tenth of a window.
CARRIED_PAUSE = WINDOW_SECONDS / 10
#: Passes in a row asked for whole before they started, in which the consumer waited for less
#: than :data:`WAITED_SHARE` of its time (from the pass's start to the next one's), after which a
#: tuner that has not settled holds its setting (see :meth:`Tuner.pass_started`).
WHOLE_PASSES = 3
WAITED_SHARE = 0.1


class Tuner(Ladder):
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
        #: The loader processes (see :mod:`.loadercount`): groups in flight in all of them stay
        #: within what one may read ahead.
        most, budget = max(processes, most_processes or 0), (max(1, cap) + 1) * max(1, processes)
        super().__init__(start, cap, LoaderCount(processes, most, budget, cores, cpu, GAIN), fixed)
        self.ahead = ahead
        self._clock = clock
        self._lock = threading.Lock()
        self._whole = 0  # passes in a row asked for whole and taken with little waiting
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
        self._first: float | None = None  # when the first group was delivered
        self._last: float | None = None  # when the latest was

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
        move, those asked for before it. ``whole``: all of this pass's groups were among them.

        Short passes are read ahead whole (see :func:`~.readers.read_pass`); behind a consumer
        that pauses between them, as tf.data does between epochs, each pass's groups come at
        once and no window would ever close. After :data:`WHOLE_PASSES` such passes in a row,
        the consumer waiting for their groups less than :data:`WAITED_SHARE` of its time (from
        the pass's start to the next one's), a tuner that has not settled holds its setting:
        reading keeps ahead of the consumer, and more threads would gain it little. It measures
        from there as soon as a pass is not so (the consumer waited more, or part of the pass
        was asked for after it started)."""
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
                self._hold(self._whole)
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

    def _decide(self, rate: float) -> None:
        here, loaders = self.threads, self.processes
        self.decide(rate, self._wait_share >= WAITED_SHARE)
        if (self.threads, self.processes) != (here, loaders):
            # A new setting: the groups in flight were asked for before it.
            self._window_start = None
            self._skip = (here + 1) * max(1, loaders) + self.ahead

    def _reading_seconds(self) -> float | None:
        if self._first is None or self._last is None:
            return None
        return self._last - self._first
