"""The ladder's decisions, told each window's rate directly (no clock, no windows): where it
goes, where it stays, and the threads each of the loaders it keeps."""

from __future__ import annotations

from collections.abc import Callable

from arrayfeed._pipeline.loadercount import LoaderCount
from arrayfeed._pipeline.tuningladder import GAIN, LADDER, Ladder


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


def test_loaders_whose_threads_wait_are_tried_with_as_many_each_as_one_had() -> None:
    """Each loader's interpreter caps it at 20 reads' worth: one settles at 24 threads, more
    than the cores, so they wait; two are tried with 24 each (not 12: they would wait as
    much), and read twice as much; 31 each (as many as fit) do not pay more."""
    ladder = new_ladder(processes=1, most=2)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 20) * loaders, 40)
    assert (ladder.processes, ladder.threads) == (2, 24), ladder.history
    assert ladder.history[-3:] == [24, 31, 24], ladder.history
    assert ladder._why.endswith(
        "as many as there are cores for; 31 threads each did not deliver more)"
    )
    assert ladder.loaders.rates == {1: 20_000, 2: 40_000}


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
    ladder = new_ladder(processes=1, most=2)
    feed(ladder, lambda threads, loaders: 1e3 * min(threads, 20), 40)
    assert (ladder.processes, ladder.threads) == (1, 24), ladder.history
    assert "threads each" not in ladder._why and "2 loader processes did not" in ladder._why
    assert ladder.history[-2:] == [24, 24], ladder.history  # 24 each in two, then 24 in one
