"""How many loader processes read a feed, tuned once its threads have settled.

A loader reads with its own interpreter: a second one pays when the first is held back by its
interpreter's lock (a ``map_batch`` looping in Python, a storage client signing and parsing
requests) and a core is left for it; not when the first waits (on storage, or on the consumer:
another would wait beside it, and more threads do that for less), nor when its threads keep
every core busy. :class:`LoaderCount` judges that from the CPU time the loaders reading used
(``cpu``) over each window the tuner measures, and keeps the count that delivered the most,
one more at a time (:data:`PROCESS_LADDER`), each measured twice once it reads (a new one
imports the package and opens the dataset, and its first group opens the storage's
connections), the larger counting, as the threads' best is (a first window that pays
decides: so would the larger of two). The next count is started
(:attr:`LoaderCount.spare`), and opens the dataset, as soon as the threads' climb is over and it
may be tried, so that its start passes while fewer threads are measured. Pure logic, as
:mod:`.tuningladder`, which drives it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "PROCESS_BUSY",
    "PROCESS_BUSY_WAITING",
    "PROCESS_LADDER",
    "PROCESS_ROOM",
    "LoaderCount",
]

#: Loader process counts tried, in order (those up to a feed's most), once the threads are tuned.
PROCESS_LADDER = (1, 2, 3, 4, 6, 8, 12, 16)
#: More loader processes are tried only when those reading used at least this share of a core
#: each while the chosen setting was measured, and left :data:`PROCESS_ROOM` of the cores
#: unused: a loader that waits (on object storage, say) gains nothing from a second
#: interpreter, nor one whose threads keep every core busy (decoding gzip on each); one bound by
#: its interpreter's lock (a ``map_batch`` looping in Python, request signing) gains with the
#: cores left (2 cores: a ``map_batch`` looping in Python used 1.5 in one loader, and two read
#: 1.2-1.7x as much).
PROCESS_BUSY = 0.7
#: ... or this share, when their threads wait (see :meth:`LoaderCount.why_not_more`).
PROCESS_BUSY_WAITING = 0.4
PROCESS_ROOM = 0.4


class LoaderCount:
    """The loader processes of a feed (``processes``, 0: none, the training process reads),
    tried up to ``most``; ``budget``: groups in flight in all of them together (more loaders
    read fewer groups each: the memory read ahead stays that of one); ``cores``: those they
    may use; ``cpu``: the CPU seconds the loaders reading have used so far (None: unknown);
    ``gain``: how much more one more loader must deliver to be kept (the tuner's step)."""

    def __init__(
        self,
        processes: int,
        most: int,
        budget: int,
        cores: float | None = None,
        cpu: Callable[[], float] | None = None,
        gain: float = 1.05,
    ) -> None:
        most = max(processes, most)
        self.ladder = sorted(
            {p for p in PROCESS_LADDER if processes <= p <= most} | {processes, most}
        )
        self.budget, self.cores, self.cpu, self.gain = budget, cores, cpu, gain
        self.at = self.best = 0
        self.best_rate = 0.0  # what the best count delivered
        self.first: float | None = None  # the first of the two measurements of a count tried
        self.rates: dict[int, float] = {}  # rows/s by count tried
        self.starting = False  # loaders starting: nothing is counted until they read
        #: Share of a core each loader used, by (count, threads each): in the window that
        #: delivered the most at that setting, that window's rate, and the least share of any
        #: window at it (see :meth:`closed`).
        self.busy: dict[tuple[int, int], tuple[float, float, float]] = {}
        self._mark: tuple[float, float] | None = None  # (clock, cpu) at the window's opening
        #: Loaders worth starting before they are tried (0: none): the count to be tried next,
        #: once the threads' climb is over and one more may pay (see :meth:`want_spare`).
        self.spare = 0

    @property
    def count(self) -> int:
        return self.ladder[self.at]

    @property
    def base(self) -> int:
        """The loader count a setting's threads are for: the first (see :meth:`threads`)."""
        return max(1, self.ladder[0])

    def threads(self, setting: int) -> int:
        """Threads of each loader for a ``setting``: the setting's threads (those of
        :attr:`base` loaders) shared among the loaders there are, and fewer where every
        loader's would not fit (a count tried with as many threads each as one had is a
        setting as many times higher: see :mod:`.tuningladder`)."""
        share = -(-setting * self.base // max(1, self.count))
        return max(1, min(share, self.budget // max(1, self.count) - 1))

    # -- how busy the loaders were --------------------------------------------------------------
    def opened(self, now: float) -> None:
        """A window opens at ``now``."""
        self._mark = None if self.cpu is None else (now, self.cpu())

    def closed(self, now: float, threads: int, rate: float) -> None:
        """The window opened last closes at ``now``, read with ``threads`` in each loader, having
        delivered ``rate``. When the windows of one setting disagree, one more loader is tried
        (two windows, and let go if it does not pay): whether the loaders were held back is
        judged from the window that delivered the most, as the setting's rate is (one that lands
        low, the storage slower for a moment, finds them waiting more: Zarr on S3 read 48 % of a
        core in one, and no second loader was tried, which reads 1.3-1.6x as much there);
        whether a core is left, from the window that used the least (a ``map_batch`` looping
        in Python used 1.5-1.6 of 2 cores from one window to the next, and two loaders read
        1.1-1.3x as much as one)."""
        if self.cpu is not None and self._mark is not None:
            began, used = self._mark
            share = (self.cpu() - used) / max(now - began, 1e-9) / max(1, self.count)
            key = (self.count, threads)
            best, best_rate, least = self.busy.get(key, (share, rate, share))
            if rate >= best_rate:
                best, best_rate = share, rate
            self.busy[key] = (best, best_rate, min(least, share))

    def why_not_more(self, threads: int, waiting: bool = False) -> str | None:
        """Why one more loader would not pay after a window read with ``threads`` (None: it
        may): there is none more to try (one per usable core at most), its groups would not
        fit, or those reading were not busy, or left no core for it (an unknown share tries).
        ``waiting``: the threads wait (many more than the cores delivered much more than the
        cores' worth did, :meth:`~.tuningladder.Ladder._threads_wait`), and more threads no
        longer paid; the loaders are busy from :data:`PROCESS_BUSY_WAITING` of a core on:
        each request's Python runs in turns of one interpreter's lock, which many threads
        hand to one another (Zarr on S3, 2 cores: one loader of 12-64 threads used 48-88 % of
        a core from one window to the next, and two loaders read 1.3-1.6x as much)."""
        if self.at + 1 >= len(self.ladder):
            return "as many as there are cores for"
        if self.budget // self.ladder[self.at + 1] - 1 < 1:
            return "the groups of more would not fit in the memory read ahead"
        if (self.count, threads) not in self.busy:
            return None
        share, _, least = self.busy[self.count, threads]
        if share < (PROCESS_BUSY_WAITING if waiting else PROCESS_BUSY):
            return f"each used {share:.0%} of a core: more would wait beside them"
        used = least * max(1, self.count)
        if self.cores is not None and used + PROCESS_ROOM > self.cores:
            return f"they used {used:.1f} of the {self.cores:g} cores: none is left for more"
        return None

    def threads_to_fill(self, setting: int, threads: int) -> float | None:
        """The setting at which the readers would use the cores there are, but
        :data:`PROCESS_ROOM` (the consumer's), were their CPU to grow with their threads: the
        window measured at ``setting`` (``threads`` in each loader) used ``used`` cores, so
        ``setting * (cores - PROCESS_ROOM) / used`` (None: unknown). Reads that wait use
        little of a core per thread, and many more threads fit; reads that keep the cores
        busy, none (2 threads, 2 cores: a ``map_batch`` waiting 20 ms per batch used 0.16 of a
        core, Zarr on S3 0.34, a dask array computing its chunks 0.26; ``.npy`` 1.85)."""
        busy = self.busy.get((self.count, threads))
        if self.cores is None or busy is None:
            return None
        used = busy[0] * max(1, self.count)
        return setting * max(0.0, self.cores - PROCESS_ROOM) / max(used, 1e-3)

    # -- the ladder -------------------------------------------------------------------------------
    def want_spare(self, threads: int, waiting: bool = False) -> None:
        """The threads' climb is over at ``threads`` each: the next count is worth starting now
        if it may be tried (a new loader is a new interpreter importing the package and opening
        the dataset, 0.2-0.5 s of a core; started now, that passes while fewer threads are
        measured, not while the count is)."""
        more = self.why_not_more(threads, waiting) is None
        self.spare = self.ladder[self.at + 1] if more else 0

    def begin(self, rate: float) -> None:
        """Try one more loader, the threads having settled at ``rate`` with those there are."""
        self.best, self.best_rate = self.at, rate
        self.rates[self.count] = rate
        self.add()

    def add(self) -> None:
        """The next count up: nothing is counted until its loaders read (:attr:`starting`)."""
        self.at, self.first, self.starting = self.at + 1, None, True

    def measured(self, rate: float, threads: int, waiting: bool = False) -> str | None:
        """A window of the count tried delivered ``rate``: None while it goes on (measured
        again, or one more loader tried), else why it ends (back to the best, then);
        ``waiting``: see :meth:`why_not_more`."""
        judged = self.judged(rate)
        if judged is None:
            return None
        rate, count = judged, self.count
        self.rates[count] = rate
        if rate <= self.best_rate * self.gain:
            self.at = self.best
            return f"{count} loader processes did not deliver more"
        self.best, self.best_rate = self.at, rate
        why_not = self.why_not_more(threads, waiting)
        if why_not is None:
            self.add()
            return None
        return f"{count} loader processes: {why_not}"

    def judged(self, rate: float) -> float | None:
        """A window of a trial (a count, or more threads each) delivered ``rate``: None while
        it is measured again, else what it delivered, the larger of its two windows (one that
        pays :attr:`gain` over the best decides at once: so would the larger of two)."""
        if self.first is None and rate <= self.best_rate * self.gain:
            self.first = rate
            return None
        rate, self.first = max(rate, self.first or 0.0), None
        return rate

    def back(self) -> None:
        """Back to the best count (a tuner that holds while one is tried)."""
        self.at, self.starting, self.first = self.best, False, None
