"""The tuner's windows: what it measures while reading, fed to its model (a clock of our own).

The model itself is tested on simulated machines (tests/test_tune_model.py); here, that a
window holds what the setting delivered: the groups the consumer took and its waits, the
latency readers report, the CPU of each reader and of the consumer; pauses between passes,
groups read ahead during them, groups asked for before a move, and loaders starting are left
out; and the report says what was decided, with its numbers.
"""

from __future__ import annotations

import math

import pytest

from arrayfeed._pipeline.tune.report import Bound, Tuning
from arrayfeed._pipeline.tune.tuning import Tuner
from arrayfeed._pipeline.tune.windows import CARRIED_PAUSE, WINDOW_PASSES, WINDOW_SECONDS, Window


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 0.0

    def __call__(self) -> float:
        return self.now

    def process(self) -> float:
        return self.cpu


def _tuner(clock: Clock, **kwargs: object) -> Tuner:
    kwargs.setdefault("cores", 4.0)
    return Tuner(1, 16, clock=clock, process_cpu=clock.process, group_rows=100, **kwargs)  # type: ignore[arg-type]


def _deliver(tuner: Tuner, clock: Clock, groups: int, every: float, **kwargs: float) -> None:
    for _ in range(groups):
        clock.now += every
        tuner.delivered(100, **kwargs)


def _windows(tuner: Tuner) -> list[Window]:
    seen = []
    observe = tuner.model.observe

    def spy(w: Window) -> None:
        seen.append(w)
        observe(w)

    tuner.model.observe = spy  # type: ignore[method-assign]
    return seen


def test_a_window_holds_what_the_consumer_took_and_the_reads_took() -> None:
    clock = Clock()
    tuner = _tuner(clock)
    seen = _windows(tuner)
    tuner.pass_started()
    _deliver(tuner, clock, 1, 0.01)  # opens the window
    _deliver(tuner, clock, 40, 0.01, waited=0.004, seconds=0.02)
    (w,) = seen
    assert (w.threads, w.processes, w.groups, w.rows) == (1, 0, 30, 3000)
    assert w.seconds == pytest.approx(0.30)
    assert w.waited == pytest.approx(30 * 0.004)
    assert w.latency == pytest.approx(0.02)
    assert w.rate == pytest.approx(100) and w.wait_share == pytest.approx(0.4)


def test_a_pause_between_passes_is_not_counted() -> None:
    clock = Clock()
    tuner = _tuner(clock)
    seen = _windows(tuner)
    tuner.pass_started()
    _deliver(tuner, clock, 11, 0.01)
    clock.now += 5.0  # the consumer busy elsewhere (validation, say)
    tuner.pass_started()
    _deliver(tuner, clock, 25, 0.01)
    tuner.pass_started()  # a window with a pass start in it ends with that pass
    assert seen and (seen[0].groups, seen[0].seconds) == (35, pytest.approx(0.35))


def test_groups_read_ahead_during_a_pause_are_not_counted() -> None:
    clock = Clock()
    tuner = _tuner(clock)
    seen = _windows(tuner)
    tuner.pass_started()
    _deliver(tuner, clock, 11, 0.01)
    clock.now += 10 * CARRIED_PAUSE
    tuner.pass_started(carried=5)
    _deliver(tuner, clock, 5, 0.0)  # read while nothing was measured: come at once
    _deliver(tuner, clock, 30, 0.01)
    tuner.pass_started()
    assert seen[0].groups == 40 and seen[0].rate == pytest.approx(100)


def test_groups_asked_for_before_a_move_are_not_counted() -> None:
    clock = Clock()
    tuner = _tuner(clock, ahead=3)
    seen = _windows(tuner)
    tuner.pass_started()
    _deliver(tuner, clock, 1, 0.01)
    _deliver(tuner, clock, 30, 0.01, waited=0.01)  # the warm-up window
    _deliver(tuner, clock, 30, 0.01, waited=0.01)  # waits: twice the threads
    assert len(seen) == 2 and tuner.threads == 2
    _deliver(tuner, clock, (1 + 1) + 3, 0.001)  # asked for at the setting before, and ahead
    _deliver(tuner, clock, 1, 0.005)  # opens the next window
    _deliver(tuner, clock, 61, 0.005, waited=0.005)
    assert seen[2].threads == 2 and seen[2].rate == pytest.approx(200)


def test_nothing_is_counted_while_loaders_start() -> None:
    clock = Clock()
    tuner = _tuner(clock, processes=1, most_processes=2)
    tuner.starting = True
    seen = _windows(tuner)
    _deliver(tuner, clock, 100, 0.01)
    assert not seen
    tuner.processes_ready(in_flight=2)
    _deliver(tuner, clock, 2 + 1 + 30, 0.01)
    assert len(seen) == 1 and seen[0].groups == 30


def test_measuring_goes_on_when_the_model_takes_loaders_away() -> None:
    """Loaders added are waited for (they start); fewer loaders read at once, from the next
    window on: nothing tells the tuner they are ready, so measuring must not wait for it."""
    clock = Clock()
    tuner = _tuner(clock, processes=2, most_processes=2)
    seen = _windows(tuner)
    observe = tuner.model.observe

    def fewer(w: Window) -> None:
        observe(w)
        tuner.model.processes = 1

    tuner.model.observe = fewer  # type: ignore[method-assign]
    tuner.pass_started()
    _deliver(tuner, clock, 31, 0.01, waited=0.01)  # the warm-up window: one loader left
    assert len(seen) == 1 and tuner.processes == 1 and not tuner.starting
    _deliver(tuner, clock, 2 * 3 + 1 + 30, 0.01, waited=0.01)
    assert len(seen) == 2  # measured on, without a processes_ready


def test_the_cpu_of_each_reader_and_of_the_consumer() -> None:
    """Loaders say what they used; the busiest is the interpreter that may bind; the consumer
    is this process, less its own reader threads."""
    clock = Clock()
    tuner = _tuner(clock, processes=2, most_processes=4)
    seen = _windows(tuner)
    _deliver(tuner, clock, 1, 0.01)
    for _ in range(30):
        clock.now += 0.01
        clock.cpu += 0.004  # the training process: consumer and client
        tuner.read_cpu(0.006, reader=11)
        tuner.read_cpu(0.002, reader=12)
        tuner.delivered(100)
    (w,) = seen
    assert w.reader_cpu == pytest.approx(0.24)
    assert w.interpreter_cpu == pytest.approx(0.18)
    assert w.consumer_cpu == pytest.approx(0.12)


def test_reading_here_shares_its_interpreter_with_the_consumer() -> None:
    clock = Clock()
    tuner = _tuner(clock)
    seen = _windows(tuner)
    _deliver(tuner, clock, 1, 0.01)
    for _ in range(30):
        clock.now += 0.01
        clock.cpu += 0.01  # reader threads and consumer alike
        tuner.read_cpu(0.006)
        tuner.delivered(100)
    (w,) = seen
    assert w.reader_cpu == pytest.approx(0.18) and w.consumer_cpu == pytest.approx(0.12)
    assert w.interpreter_cpu == pytest.approx(0.30)


def test_cores_count_the_cpu_of_a_pause_over_the_pause() -> None:
    """The time between passes is left out of a window's rate, but not out of its cores: reads
    ahead use CPU then too, and a core is busy at most all of the time (a window of reads that
    keep one core busy, with a pause as long as the window, shows one core, not two)."""
    clock = Clock()
    tuner = _tuner(clock)
    seen = _windows(tuner)
    tuner.pass_started()
    _deliver(tuner, clock, 1, 0.01)
    for i in range(40):
        if i == 20:  # the consumer elsewhere; the readers read on
            tuner.read_cpu(0.2)
            clock.now += 0.2
            clock.cpu += 0.2
            tuner.pass_started()
        clock.now += 0.01
        clock.cpu += 0.01
        tuner.read_cpu(0.01)
        tuner.delivered(100)
    tuner.pass_started()  # (a window with a pass start in it ends with that pass)
    (w,) = seen
    assert w.seconds == pytest.approx(0.4) and w.rate == pytest.approx(100)
    assert w.cores(w.reader_cpu) == pytest.approx(1.0)
    merged = w.merged(w)
    assert merged.cores(merged.reader_cpu) == pytest.approx(1.0)


def test_short_passes_end_a_window_after_a_few() -> None:
    """Passes of one group, read ahead: a window ends with its passes, at the latest after
    :data:`WINDOW_PASSES` of them, however short."""
    clock = Clock()
    tuner = _tuner(clock)
    seen = _windows(tuner)
    tuner.pass_started()
    _deliver(tuner, clock, 3, 0.001)
    for _ in range(WINDOW_PASSES + 2):
        tuner.pass_started(carried=1, whole=True)
        _deliver(tuner, clock, 1, 0.001)
    assert seen and seen[0].seconds < WINDOW_SECONDS


def test_the_data_wait_of_a_pass() -> None:
    clock = Clock()
    tuner = _tuner(clock)
    assert tuner.report().data_wait is None
    tuner.pass_started()
    _deliver(tuner, clock, 10, 0.01, waited=0.0025)
    tuner.pass_ended()
    assert tuner.report().data_wait == pytest.approx(0.25)


def test_a_fixed_tuner_never_moves_and_says_so() -> None:
    clock = Clock()
    tuner = Tuner(3, 3, fixed=True, clock=clock, process_cpu=clock.process)
    tuner.pass_started()
    _deliver(tuner, clock, 200, 0.01, waited=0.01)
    report = tuner.report()
    assert (report.threads, report.tuned, report.settled, report.bound) == (
        3,
        False,
        True,
        Bound.FIXED,
    )
    assert str(report) == "threads 3: fixed"


def _read(tuner: Tuner, clock: Clock, windows: int, latency: float, consumer: float) -> None:
    """``windows`` windows of reads taking ``latency`` each, as many at once as the tuner
    says, taken by a consumer that spends ``consumer`` seconds on each group."""
    end = clock.now + 0.31 * windows
    while clock.now < end:
        every = max(latency / (tuner.threads * max(1, tuner.processes)), consumer)
        clock.now += every
        tuner.delivered(100, waited=every - consumer, seconds=latency)


def test_the_report_gives_the_setting_by_hand() -> None:
    """Reads of 30 ms the consumer waits for; then a consumer that spends 10 ms on each group:
    Little's law over the numbers the report gives is the groups in flight it chose."""
    clock = Clock()
    tuner = _tuner(clock)
    tuner.pass_started()
    _read(tuner, clock, 8, latency=0.03, consumer=0.0)
    assert tuner.threads == 16 and tuner.report().bound is Bound.MEMORY  # (16: its cap)
    _read(tuner, clock, 12, latency=0.03, consumer=0.01)  # (a change shows over 3 windows)
    report = tuner.report()
    assert report.settled and report.bound is Bound.CONSUMER, report
    rate = report.rate / report.group_rows  # groups per second
    assert report.in_flight == math.ceil(rate * report.latency * 1.1) == 4
    assert report.threads == min(report.in_flight, report.budget) == 4
    assert 0 < report.noise < 1  # (the windows' spread at one setting: formula 3's sigma)
    assert "bound by consumer: 10,000 rows/s x 30.0 ms a group of 100 rows -> 4" in str(report)


def test_a_report_is_data() -> None:
    report = Tuning(threads=2, tuned=True, settled=False, bound=Bound.MEASURING)
    assert str(report) == "threads 2: measuring (tuning has not settled yet)"
    assert isinstance(report.bound, Bound) and report.rates == {}
