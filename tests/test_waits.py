"""Telling reads that wait from reads that use the CPU, when other threads of the process are
busy: a wait those threads explain is timed again, and only a wait seen while they were idle (or
one that lasts while they never are) sizes the groups as a waiting storage's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline import waits
from arrayfeed._pipeline.waits import Timing, wait_per_batch

ROWS = 10_000


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


def _sleeps(seconds: float, log: list[np.ndarray] | None = None) -> Callable[[np.ndarray], None]:
    def read(indices: np.ndarray) -> None:
        if log is not None:
            log.append(indices)
        time.sleep(seconds)

    return read


def _computes(seconds: float, pieces: int = 1) -> Callable[[np.ndarray], None]:
    """A read that decodes for ``seconds`` of its thread's CPU time, in ``pieces``, giving the
    GIL away after each as a decoder of chunks does."""

    def read(indices: np.ndarray) -> None:
        for _ in range(pieces):
            end = time.thread_time() + seconds / pieces
            while time.thread_time() < end:
                sum(range(200))
            time.sleep(0)

    return read


def test_a_read_is_timed_by_the_clock_by_its_thread_and_by_the_rest_of_the_process() -> None:
    timing = Timing(_sleeps(0.03), np.arange(4))
    assert timing.took >= 0.03 and timing.used < 0.01
    assert not timing.mostly_cpu and timing.alone
    assert Timing(_computes(0.02), np.arange(4)).mostly_cpu
    with busy_python(10.0):
        timing = Timing(_sleeps(0.05), np.arange(4))
    assert timing.others >= 0.02 and not timing.alone


def test_reads_that_wait_in_a_quiet_process_are_timed_at_places_spread_over_the_range() -> None:
    log: list[np.ndarray] = []
    waited = wait_per_batch(_sleeps(0.02, log), 100, 100 + ROWS, 50)
    assert 0.02 <= waited < 0.05
    starts = [int(indices[0]) for indices in log]
    assert starts[0] == 100  # the untimed first read
    assert len(starts) == 1 + waits.PROBES
    assert len(set(starts[1:])) == waits.PROBES and max(starts) > 100 + ROWS // 2
    assert all(len(indices) == 50 and indices[-1] < 100 + ROWS for indices in log)


def test_reads_that_use_the_cpu_are_not_waits_and_the_first_one_says_so() -> None:
    log: list[np.ndarray] = []

    def read(indices: np.ndarray) -> None:
        log.append(indices)
        _computes(0.005)(indices)

    assert wait_per_batch(read, 0, ROWS, 50) == 0.0
    assert len(log) == 2  # the first, untimed, and one timed


def test_a_range_of_one_batch_times_that_batch() -> None:
    log: list[np.ndarray] = []
    assert wait_per_batch(_sleeps(0.01, log), 7, 27, 20) >= 0.01
    assert all(list(indices) == list(range(7, 27)) for indices in log)


def test_cpu_reads_slowed_by_threads_busy_for_a_while_are_timed_again_until_they_are_not() -> None:
    """Reads that compute, slowed by threads holding the GIL (another dataset's reads ending):
    one read timed alone looks like a wait; timed again once the threads are done, it is not."""
    decode = _computes(0.004, pieces=8)
    with busy_python(0.4):
        first = Timing(decode, np.arange(4))
        assert not first.mostly_cpu  # what one read timed alone took for a wait
        began = time.perf_counter()
        assert wait_per_batch(decode, 0, ROWS, 50) == 0.0
    assert time.perf_counter() - began < waits.PROBE_SECONDS + 0.5


def test_reads_that_wait_beside_threads_busy_for_a_while_are_still_waits() -> None:
    with busy_python(0.3):
        waited = wait_per_batch(_sleeps(0.02), 0, ROWS, 50)
    assert 0.02 <= waited < 0.06


def test_reads_that_wait_beside_threads_busy_throughout_are_taken_as_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worse mistake is a waiting storage read a whole group at a time: when other threads
    never rest, the least wait seen counts, after ``PROBE_SECONDS``."""
    monkeypatch.setattr(waits, "PROBE_SECONDS", 0.3)
    with busy_python(float("inf")):
        began = time.perf_counter()
        waited = wait_per_batch(_sleeps(0.02), 0, ROWS, 50)
        took = time.perf_counter() - began
    assert waited >= 0.02
    assert 0.3 <= took < 1.5


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
    read, it got groups of a few batches (half the rate on 2 cores, a third on 16)."""
    with h5py.File(gzip_file, "r") as f:
        quiet = af.batches(f["x"], batch_size=64, shuffle="block", seed=0, processes=0)
        with busy_python(0.4):
            built_busy = af.batches(f["x"], batch_size=64, shuffle="block", seed=0, processes=0)
        assert quiet._feed.group_steps > 100
        assert built_busy._feed.group_steps == quiet._feed.group_steps
        for a, b in zip(quiet, built_busy, strict=True):
            np.testing.assert_array_equal(a, b)
