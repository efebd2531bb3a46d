"""Tuning while reading: the stream never depends on it (re-tuned at random on every request,
in this process and with a loader process), what was chosen is visible, and it finds more
threads for reads that wait and fewer for a consumer that sets the pace."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.loader.wire import Loaded
from arrayfeed._pipeline.read.blocks import WindowCache
from arrayfeed._pipeline.tune.machine import usable_cores
from arrayfeed._pipeline.tune.tuning import Tuner

from ._feeds import force_retuning, image_files

ROWS = 1500


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return image_files(tmp_path_factory.mktemp("autotune"), ROWS, "gzip")


def _double(batch: Any) -> Any:
    x, y = batch
    return x, y * 2


def _stream(b: af.Batches, epochs: int) -> list[list[np.ndarray]]:
    return [[np.array(leaf) for batch in b for leaf in batch] for _ in range(epochs)]


@pytest.mark.parametrize("processes", [0, 1])
@pytest.mark.parametrize("store", ["npy", "h5"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"shuffle": True, "seed": 3},
        {"shuffle": "block", "seed": 5},
        {"shuffle": True, "seed": 7, "map_batch": _double},
    ],
    ids=["full", "block", "map_batch"],
)
def test_retuning_on_every_request_never_changes_the_stream(
    files: dict[str, tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    processes: int,
    store: str,
    kwargs: dict[str, Any],
) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 8 << 10)  # many groups
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 8 << 10)
    x, y = files[store]
    b = af.batches(x, y, batch_size=32, processes=processes, **kwargs)
    assert b._feed.group_steps < b._feed.plan.steps // 4
    served: Counter[int] = Counter()
    if processes:  # loaders join and leave while reading, too
        # Three loaders already running (and held by this dataset), so that those joining
        # register within a pass, not after the short ones of this test.
        warm = af.batches(x, y, batch_size=32, processes=3, **kwargs)
        next(iter(warm))
        remote = b._feed._remote
        dispatch = remote._dispatch

        def counting(link: Any, message: Any) -> None:
            if isinstance(message, Loaded):
                served[link.process.pid] += 1
            dispatch(link, message)

        monkeypatch.setattr(remote, "_dispatch", counting)
    chaos = force_retuning(b, seed=len(kwargs) + processes, processes=3 * processes)
    got = _stream(b, 2)
    owner = b._feed.group_owner(0)
    keys = {owner(first) for first, _ in b._feed.groups()}
    # (A loader that joins is let go unasked when the next count drawn is lower, and a block
    # shuffle deals each window's groups to one loader: a few more epochs, until two served.)
    while processes and len(served) < min(2, len(keys)) and len(got) < 8:
        got += _stream(b, 1)
    assert len(chaos.asked) >= 3  # the setting really moved
    if processes:  # so did the loaders reading (groups are dealt out by window, if any)
        assert chaos.asked_processes == {1, 2, 3}
        assert len(served) >= min(2, len(keys)), served
    expected = _stream(
        af.batches(x, y, batch_size=32, num_threads=1, processes=0, **kwargs), len(got)
    )
    assert len(got) == len(expected)
    for e, g in zip(expected, got, strict=True):
        assert len(e) == len(g)
        assert all(np.array_equal(a, c) and a.dtype == c.dtype for a, c in zip(e, g, strict=True))


def test_what_was_chosen_is_visible(files: dict[str, tuple[str, str]]) -> None:
    x, y = files["npy"]
    b = af.batches(x, y, batch_size=64, processes=0)
    report = af.tuning(b)
    assert report == b.tuning
    assert (report.tuned, report.settled, report.threads) == (True, False, b._feed.num_threads)
    fixed = af.tuning(af.batches(x, y, num_threads=3))
    assert (fixed.tuned, fixed.settled, fixed.threads) == (False, True, 3)
    assert "num_threads" in fixed.why and "threads 3" in str(fixed)
    with pytest.raises(TypeError, match=r"arrayfeed\.batches or arrayfeed\.from_arrays"):
        af.tuning(np.zeros(3))


def test_a_dataset_behind_transformations_says_how_it_reads(
    files: dict[str, tuple[str, str]],
) -> None:
    x, y = files["npy"]
    ds = af.from_arrays(x, y, batch_size=64, num_threads=2)
    mapped = ds.map(lambda a, b: (a, b)).prefetch(2)
    assert af.tuning(mapped) == af.tuning(ds)
    assert af.tuning(mapped).threads == 2


@pytest.mark.parametrize("processes", [0, 1])
def test_short_epochs_through_tf_data_hold_the_setting_and_say_why(processes: int) -> None:
    """Epochs of two groups through tf.data: each is read ahead whole while the one before is
    taken and during tf.data's pause between epochs, so each group comes at once and none is
    counted; the tuner said "measuring the starting setting" for as long as it ran."""
    x = np.arange(20_000 * 4, dtype=np.float32).reshape(-1, 4)
    ds = af.from_arrays(x, batch_size=256, shuffle=False, processes=processes)
    start = af.tuning(ds).threads
    for _ in range(12):
        assert sum(int(b.shape[0]) for b in ds) == 20_000
        if af.tuning(ds).settled:
            break
    report = af.tuning(ds)
    assert report.settled and report.threads == start, report
    assert report.why.startswith("held: the last 3 passes were each read ahead whole"), report


class Pinned(Tuner):
    """A tuned (not fixed) tuner that stays at ``threads``."""

    def __init__(self, threads: int) -> None:
        self.pinned = threads
        super().__init__(threads, 8)

    @property
    def threads(self) -> int:
        return self.pinned


@pytest.mark.parametrize(("threads", "decoded"), [(1, False), (2, True), (4, True)])
def test_the_next_window_is_decoded_ahead_only_beside_another_read(
    files: dict[str, tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    threads: int,
    decoded: bool,
) -> None:
    """A block shuffle decodes the next window ahead when the setting of the moment reads more
    than one group at once; at one, decoding it would hold back this window's groups, so it is
    only announced (object storage starts fetching it), whatever setting the pass began with."""
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 8 << 10)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 8 << 10)
    calls: list[bool] = []
    prefetch = WindowCache.prefetch_window

    def spy(self: WindowCache, window: int, read: bool = True) -> None:
        calls.append(read)
        prefetch(self, window, read)

    monkeypatch.setattr(WindowCache, "prefetch_window", spy)
    x, y = files["h5"]
    b = af.batches(x, y, batch_size=32, shuffle="block", seed=1, processes=0)
    b._feed.tuner = Pinned(threads)
    for _ in b:
        pass
    assert calls and set(calls) == {decoded}


class SlowRows:
    """Rows of an array whose every read first waits 20 ms without the GIL."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape, self.dtype = array.shape, array.dtype

    def __len__(self) -> int:
        return len(self.array)

    def read(self, indices: np.ndarray) -> np.ndarray:
        time.sleep(0.02)
        return self.array[indices]


def test_storage_slow_per_batch_gets_groups_of_few_batches() -> None:
    """Reads that wait 20 ms: groups of ~50 ms of waiting (not 16 MiB), so that up to 64 fit the
    read-ahead for the tuner to climb to; the stream is the same as from memory. Reads that use
    the CPU as long keep groups sized by bytes."""
    x = np.arange(20_000 * 4, dtype=np.float32).reshape(-1, 4)
    slow = af.batches(SlowRows(x), batch_size=32, seed=0, processes=0)
    fast = af.batches(x, batch_size=32, seed=0, processes=0)
    assert 1 <= slow._feed.group_steps <= 2
    assert fast._feed.group_steps >= 100
    assert slow._feed.tuner.cap == 64
    for a, b in zip(slow, fast, strict=True):
        np.testing.assert_array_equal(a, b)
    busy = af.batches(BusyRows(x), batch_size=32, seed=0, processes=0)
    assert busy._feed.group_steps == fast._feed.group_steps


def test_reading_in_this_process_leaps_as_far_as_its_cpu_says_more_would_fit() -> None:
    """The training process reads (``processes=0``): what it used while 2 threads waited on
    reads (the consumer's share too) tells the tuner that many more would fit in the cores,
    and its first step up leaps there, not to 3."""
    x = np.arange(50_000 * 4, dtype=np.float32).reshape(-1, 4)
    b = af.batches(SlowRows(x), batch_size=32, seed=0, processes=0)
    tuner = b._feed.tuner
    assert tuner.loaders.cpu is time.process_time
    start = tuner.threads
    end = time.perf_counter() + 20
    while len(tuner.history) < 2 and time.perf_counter() < end:
        for _ in b:
            if len(tuner.history) >= 2:
                break
    assert tuner.history[0] == start and tuner.history[1] >= 4 * start, tuner.history


class BusyRows(SlowRows):
    """Rows whose every read first uses the CPU for 20 ms (decoding)."""

    def read(self, indices: np.ndarray) -> np.ndarray:
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        return self.array[indices]


def _read_for(b: af.Batches, seconds: float, pause: float = 0.0) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in b:
            if pause:
                time.sleep(pause)
            if time.perf_counter() >= end:
                break


@pytest.mark.slow
def test_reads_that_wait_get_more_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 4 * 32 * 16)  # 4 batches
    x = np.arange(50_000 * 4, dtype=np.float32).reshape(-1, 4)
    b = af.batches(SlowRows(x), batch_size=32, seed=0)
    start = b.tuning.threads
    _read_for(b, 8)
    report = b.tuning
    assert report.settled, report
    assert report.threads >= 4 * start, report
    assert report.rates[report.threads] > 3 * report.rates[start], report
    assert report.settled_after is not None and report.settled_after < 8


@pytest.mark.slow
def test_a_consumer_that_sets_the_pace_gets_fewer_threads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 16 << 10)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 16 << 10)
    x = np.arange(40_000 * 4, dtype=np.float32).reshape(-1, 4)
    b = af.batches(x, batch_size=64, seed=0, processes=0)
    start = b.tuning.threads
    _read_for(b, 6, pause=0.002)  # a training step of 2 ms: far slower than the reads
    report = b.tuning
    assert report.settled and report.threads < start, report


def _python_loop(batch: Any) -> Any:
    """A ``map_batch`` that holds the interpreter's lock: a Python loop over every row."""
    x, y = batch
    total = 0
    for row in range(len(y)):
        for k in range(400):
            total += k * row
    return x, y + (total & 0)


@pytest.mark.slow
@pytest.mark.skipif(usable_cores() < 2, reason="a second loader needs a second core")
def test_a_map_batch_holding_the_interpreter_gets_more_loader_processes(
    files: dict[str, tuple[str, str]],
) -> None:
    """Threads cannot run a ``map_batch`` that holds the GIL side by side; loader processes
    (an interpreter each) can: by default a second one is started, measured and kept."""
    x, y = files["npy"]
    b = af.batches(x, y, batch_size=32, seed=0, map_batch=_python_loop)
    assert b.tuning.processes == 1
    _read_for(b, 12)
    report = b.tuning
    assert report.settled and report.processes >= 2, report
    assert f"with {report.processes} loader processes" in report.why
    assert len(b._feed._remote._reading()) == report.processes
    assert f"loader processes {report.processes} (rows/s: 1: " in str(report)
