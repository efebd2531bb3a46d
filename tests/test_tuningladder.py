"""The ladder's decisions, told each window's rate directly (no clock, no windows): where it
goes, where it stays, and the threads each of the loaders it keeps."""

from __future__ import annotations

from collections.abc import Callable

from arrayfeed._pipeline.tune.loadercount import LoaderCount
from arrayfeed._pipeline.tune.tuningladder import GAIN, LADDER, Ladder


def new_ladder(start: int = 2, processes: int = 0, most: int = 0, cores: float = 2) -> Ladder:
    """A ladder up to 64 threads; with loaders whose CPU is not measured (more are tried)."""
    budget = 65 * max(1, processes)
    return Ladder(start, 64, LoaderCount(processes, most, budget, cores=cores, gain=GAIN), False)


def feed(ladder: Ladder, rate: Callable[[int, int], float], windows: int) -> None:
    """Tell ``ladder`` what ``windows`` windows in a row delivered: ``rate(threads, loaders)``."""
    for _ in range(windows):
        ladder.decide(rate(ladder.threads, max(1, ladder.processes)), waited=True)


def test_it_climbs_while_more_threads_pay_and_stays_there() -> None:
    ladder = new_ladder()
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 16), 30)
    assert ladder.threads == 16, ladder.history
    assert max(ladder.history) > 16  # more were tried, and let go
    moves = len(ladder.history)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 16), 30)
    assert len(ladder.history) == moves and ladder.threads == 16


def test_a_setting_is_chosen_from_the_ladder() -> None:
    ladder = new_ladder(start=3)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 40), 40)
    assert set(ladder.history) <= set(LADDER) and ladder.threads in (32, 48), ladder.history


def test_loaders_whose_threads_wait_are_tried_with_twice_as_many_each_as_one_had() -> None:
    """Each loader's interpreter caps it at 10 reads' worth: one climbs to 12 threads, which
    deliver five times what 2 (the cores) did, so they wait; two are tried with 24 each (not 6:
    they would wait as much; nor 12: the climb ended where one interpreter held it back)
    before any fewer threads, and read twice as much; 31 each do not pay more. The way down is
    not taken: each loader's threads were tried anew."""
    ladder = new_ladder(processes=1, most=2)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 10) * loaders, 40)
    assert (ladder.processes, ladder.threads) == (2, 24), ladder.history
    assert ladder.history == [2, 3, 12, 24, 16, 12, 24, 31, 24], ladder.history
    assert ladder._why.endswith(
        "(more loaders tried before fewer threads; 2 loader processes: as many as there are "
        "cores for; 31 threads each did not deliver more)"
    ), ladder._why
    assert ladder.loaders.rates == {1: 10_000, 2: 20_000}


def test_loaders_that_shared_the_threads_try_more_each_while_that_pays() -> None:
    """One loader settles at 4 threads, no more than the cores: two share them (2 each), and
    pay; then each is tried with the 4 one had, which pays, and with 8, which does not."""
    ladder = new_ladder(processes=1, most=2, cores=4)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 4) * loaders**2, 40)
    assert (ladder.processes, ladder.threads) == (2, 4), ladder.history
    assert ladder.history[-4:] == [4, 4, 8, 4], ladder.history  # (a count tried: no move)
    assert ladder._why.endswith(
        "4 threads each delivered 16,000; 8 threads each did not deliver more)"
    ), ladder._why


def test_a_loader_count_let_go_takes_back_the_threads_it_was_tried_with() -> None:
    """One loader climbs to 48 threads, whose reads wait: two are tried first, with 31 each
    (as many as fit), and do not pay; one loader then takes back its 48 and goes down from
    there, to the fewest that still deliver as much."""
    ladder = new_ladder(processes=1, most=2)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 20), 40)
    assert (ladder.processes, ladder.threads) == (1, 24), ladder.history
    assert "threads each" not in ladder._why and "2 loader processes did not" in ladder._why
    assert ladder.history[-7:] == [48, 31, 48, 32, 24, 16, 24], ladder.history
    assert ladder._why.endswith("(16 delivered less; 2 loader processes did not deliver more)")
    moves = len(ladder.history)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 20), 20)  # and stays there
    assert len(ladder.history) == moves and ladder.processes == 1


def test_the_loader_to_try_is_started_while_threads_that_wait_still_climb() -> None:
    """Once the best so far has more threads than cores, the next loader is asked for as a
    spare while the climb goes on (a new interpreter takes 0.2-0.5 s of a core to start: it
    then passes before the count is tried, not while it is)."""
    ladder = new_ladder(processes=1, most=2)
    spares: list[tuple[str, int]] = []
    for _ in range(40):
        ladder.decide(1e3 * min(ladder.threads, 10) * max(1, ladder.processes), waited=True)
        spares.append((ladder._phase, ladder.loaders.spare))
    first = next(i for i, (_, spare) in enumerate(spares) if spare)
    assert spares[first] == ("up", 2), spares  # asked for during the climb
    assert ladder.processes == 2 and ladder.loaders.spare == 0  # taken, none left over


def test_threads_that_use_the_cores_go_down_before_more_loaders_are_tried() -> None:
    """A climb that leapt past the cores to its best (3 threads to 12: the reads cap at 4)
    has not shown that threads beyond the cores wait: the way down comes first, and the
    loaders tried share the 4 threads it found."""
    ladder = new_ladder(processes=1, most=2, cores=4)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 4) * loaders, 40)
    down = ladder.history.index(4)  # reached going down, before any second loader
    assert ladder.history[:down] == [2, 3, 12, 24, 16, 12, 8, 6], ladder.history
    assert "more loaders tried before fewer threads" not in ladder._why, ladder._why


def feed_busy(ladder: Ladder, rate: Callable[[int, int], float], windows: int, busy: float) -> None:
    """As :func:`feed`, each loader using ``busy`` of a core in every window."""
    clock = cpu = 0.0

    def used() -> float:
        return cpu

    ladder.loaders.cpu = used
    for _ in range(windows):
        loaders = max(1, ladder.processes)
        ladder.loaders.opened(clock)
        clock, cpu = clock + 1.0, cpu + busy * loaders
        delivered = rate(ladder.threads, loaders)
        ladder.loaders.closed(clock, ladder.threads, delivered)
        ladder.decide(delivered, waited=True)


def test_loaders_whose_threads_wait_are_busy_from_less_of_a_core() -> None:
    """Each loader using half a core: where many threads delivered five times what the cores'
    worth did (they wait, and hand one interpreter's lock around), a second loader is tried,
    and kept; where they delivered only 1.5 times as much (3 threads on 2 cores), the loader is
    not busy enough for one."""
    waiting = new_ladder(processes=1, most=2)
    feed_busy(waiting, lambda threads, loaders: 1e3 * min(threads, 10) * loaders, 40, 0.5)
    assert waiting.processes == 2 and "more loaders tried before fewer" in waiting._why
    using = new_ladder(processes=1, most=2)
    feed_busy(using, lambda threads, loaders: 1e3 * min(threads, 3) * loaders, 40, 0.5)
    assert using.processes == 1, using._why
    assert "each used 50% of a core: more would wait beside them" in using._why, using._why
    below = new_ladder(processes=1, most=2)  # waiting, but less busy still: storage sets the pace
    feed_busy(below, lambda threads, loaders: 1e3 * min(threads, 10) * loaders, 40, 0.3)
    assert below.processes == 1 and "each used 30% of a core" in below._why, below._why


def test_no_more_threads_are_tried_once_the_readers_use_the_cores() -> None:
    """Readers that keep both cores busy (chunked gzip), in a rate that rises 6 % a window on
    its own (caches filling): each step up seems to pay, but more threads would find no core
    to run on, so the climb ends at the first such step, and the way down keeps the fewest."""
    windows = iter(range(100))
    rising = new_ladder(processes=1, most=1)
    feed_busy(rising, lambda threads, loaders: 1e3 * 1.06 ** next(windows), 30, 1.9)
    assert max(rising.history) == 3, rising.history
    assert rising.threads <= 3 and rising._phase == "settled", rising.history
    idle = new_ladder(processes=1, most=1)  # the same rates, the readers using half a core
    windows = iter(range(100))
    feed_busy(idle, lambda threads, loaders: 1e3 * 1.06 ** next(windows), 30, 0.5)
    assert max(idle.history) > 3, idle.history
