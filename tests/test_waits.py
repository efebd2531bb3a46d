"""Telling reads that wait from reads that use the CPU, when other threads of the process are
busy: a wait those threads explain is timed again elsewhere, time spent waiting for a core is
not a wait, and only a wait seen while the other threads were idle (or one that lasts while they
never are) sizes the groups as a waiting storage's. The loop is tested on scripted timings; the
timing itself and a real dataset built beside a busy thread on real reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import arrayfeed as af
from arrayfeed._pipeline.read import waits
from arrayfeed._pipeline.read.waits import Timing, places, wait_per_batch

ROWS = 10_000


def timing(took: float, used: float, others: float = 0.0, queued: float = 0.0) -> Timing:
    """A read's timing, as if measured."""
    t = Timing.__new__(Timing)
    t.took, t.used, t.others, t.queued = took, used, others, queued
    return t


class Script:
    """Timed reads that return the scripted timings in turn, on a clock of their own that each
    read and each pause moves on."""

    def __init__(self, *timings: Timing) -> None:
        self.timings = list(timings)
        self.now = 0.0
        self.timed: list[int] = []  # the first row of each read timed
        self.pauses: list[float] = []

    def timer(self, read: Callable[[np.ndarray], object], indices: np.ndarray) -> Timing:
        self.timed.append(int(indices[0]))
        t = self.timings[min(len(self.timed), len(self.timings)) - 1]
        self.now += t.took
        return t

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def run(self, start: int = 0, stop: int = ROWS, rows: int = 50) -> float:
        untimed: list[int] = []
        return wait_per_batch(
            lambda indices: untimed.append(int(indices[0])),
            start,
            stop,
            rows,
            timer=self.timer,
            clock=lambda: self.now,
            sleep=self.sleep,
        )


WAIT = timing(took=0.021, used=0.001)  # waited 20 ms, the other threads idle
CPU = timing(took=0.005, used=0.004)
GIL = timing(took=0.021, used=0.001, others=0.02)  # waited as long as the others ran


@given(
    start=st.integers(0, 10_000),
    n=st.integers(1, 100_000),
    rows=st.integers(1, 4_096),
)
def test_reads_are_timed_at_distinct_places_inside_the_range_away_from_the_first(
    start: int, n: int, rows: int
) -> None:
    rows = min(rows, n)
    stop = start + n
    found = places(start, stop, rows)
    assert 1 <= len(found) <= waits.PLACES
    assert len(set(found)) == len(found)
    assert all(start <= p and p + rows <= stop for p in found)
    batches = n // rows
    if batches < 2:
        assert found == [stop - rows]
        return
    # Batches of the storage order, none the first (read untimed): the last, then the middle.
    assert all((p - start) % rows == 0 and p >= start + rows for p in found)
    assert found[0] == start + (batches - 1) * rows
    if len(found) > 1:
        assert found[1] == start + rows * (1 + (batches - 2) // 2)


def test_a_batch_timed_is_one_chunk_of_a_batchs_size() -> None:
    """Chunks of 256 rows each fetched in 20 ms: a batch of 256 rows of the storage order is one
    fetch, not two (a batch across two chunks doubled the wait and halved the groups)."""

    def read(indices: np.ndarray) -> None:
        time.sleep(0.02 * len(set((indices // 256).tolist())))

    assert 0.015 <= wait_per_batch(read, 0, 100_000, 256) < 0.035


def test_reads_that_wait_in_a_quiet_process_count_the_least_wait_of_a_few() -> None:
    script = Script(WAIT, timing(took=0.031, used=0.001))
    assert script.run() == pytest.approx(0.02)
    assert len(script.timed) == waits.PROBES and not script.pauses
    assert script.timed[0] == ROWS - 50  # the last batch first


def test_reads_that_use_the_cpu_are_not_waits_and_the_first_one_says_so() -> None:
    script = Script(CPU, WAIT)
    assert script.run() == 0.0
    assert len(script.timed) == 1


def test_time_spent_waiting_for_a_core_is_not_a_wait() -> None:
    """Other processes on every core (a loader decoding, a noisy neighbour): the read was
    ready to run, not waiting for its storage."""
    assert Script(timing(took=0.03, used=0.004, queued=0.025)).run() == 0.0
    assert Script(timing(took=0.03, used=0.004, queued=0.005)).run() == pytest.approx(0.021)


def test_cpu_reads_slowed_by_busy_threads_are_timed_again_until_they_are_not() -> None:
    script = Script(GIL, GIL, CPU)
    assert script.run() == 0.0
    assert len(script.timed) == 3 and len(script.pauses) == 2


def test_a_wait_seen_while_other_threads_ran_is_not_counted_once_one_is_seen_without() -> None:
    script = Script(timing(took=0.011, used=0.001, others=0.01), WAIT, WAIT)
    assert script.run() == pytest.approx(0.02)


def test_reads_that_wait_beside_threads_busy_throughout_are_taken_as_waits() -> None:
    """The worse mistake is a waiting storage read a whole group at a time: when the other
    threads never rest, the least wait seen counts once ``PROBE_SECONDS`` have passed."""
    slow = timing(took=0.3, used=0.001, others=0.3)
    script = Script(slow, GIL, slow)
    assert script.run() == pytest.approx(0.02)
    assert script.now >= waits.PROBE_SECONDS
    assert len(script.timed) < waits.PLACES


def test_no_place_is_timed_twice_however_long_the_other_threads_run() -> None:
    """A read of a place timed before could come from a chunk cache, and look like CPU."""
    script = Script(timing(took=1e-4, used=1e-5, others=1e-4))
    assert script.run() == pytest.approx(9e-5)
    assert len(script.timed) == len(set(script.timed)) == waits.PLACES


def test_a_storage_with_a_chunk_cache_is_still_timed_as_one_that_waits() -> None:
    """Chunks of 1,000 rows fetched once, 20 ms each, and kept: the batch after the first read
    is in a chunk already fetched."""
    fetched: set[int] = set()

    def read(indices: np.ndarray) -> None:
        for chunk in set((indices // 1000).tolist()):
            if chunk not in fetched:
                time.sleep(0.02)
                fetched.add(chunk)

    assert wait_per_batch(read, 0, 100_000, 64) >= 0.015
    assert len(fetched) >= 1 + waits.PROBES  # every read timed fetched a chunk of its own


@contextmanager
def busy_python(seconds: float) -> Iterator[threading.Thread]:
    """A thread that runs Python (holding the GIL most of the time) for ``seconds``, as another
    dataset's reader threads do right after its reading, or for good with ``inf``."""
    stop = threading.Event()
    end = time.perf_counter() + seconds

    def spin() -> None:
        while not stop.is_set() and time.perf_counter() < end:
            sum(range(2000))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    time.sleep(0.01)  # it runs before the reads are timed
    try:
        yield thread
    finally:
        stop.set()
        thread.join()


def _sleeps(seconds: float) -> Callable[[np.ndarray], None]:
    return lambda indices: time.sleep(seconds)


def test_a_read_is_timed_by_the_clock_by_its_thread_and_by_the_rest_of_the_process() -> None:
    t = Timing(_sleeps(0.03), np.arange(4))
    assert t.took >= 0.03 and t.waited >= 0.02
    assert not t.mostly_cpu
    with busy_python(float("inf")):
        t = Timing(_sleeps(0.1), np.arange(4))
    assert t.others >= 0.01  # the busy thread ran while this one slept


def test_reads_that_wait_beside_a_thread_that_never_rests_are_still_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waits, "PROBE_SECONDS", 0.3)
    with busy_python(float("inf")):
        assert wait_per_batch(_sleeps(0.02), 0, ROWS, 50) >= 0.015


@pytest.fixture(scope="module")
def gzip_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small rows in chunked gzip HDF5, written by h5py with its own chunk shape."""
    path = tmp_path_factory.mktemp("waits") / "rows.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        x = rng.integers(0, 50, size=(200_000, 32)).astype(np.float32)
        f.create_dataset("x", data=x, chunks=True, compression="gzip", shuffle=True)
    return path


def test_a_dataset_built_while_another_ones_threads_read_gets_groups_sized_by_bytes(
    gzip_file: Path,
) -> None:
    """Decoding gzip uses the CPU: a dataset built while other threads of the process are busy
    (another dataset's reads ending) gets the groups it gets in a quiet process. Timed by one
    read, it got groups of a few batches, whose fixed costs then set the rate."""
    with h5py.File(gzip_file, "r") as f:
        quiet = af.batches(f["x"], batch_size=64, shuffle="block", seed=0, processes=0)
        with busy_python(0.4):
            built_busy = af.batches(f["x"], batch_size=64, shuffle="block", seed=0, processes=0)
        assert quiet._feed.group_steps > 100
        assert built_busy._feed.group_steps == quiet._feed.group_steps
        for a, b in zip(quiet, built_busy, strict=True):
            np.testing.assert_array_equal(a, b)
