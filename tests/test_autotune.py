"""Tuning while reading: the stream never depends on it (re-tuned at random on every request,
in this process and with a loader process), what was chosen is visible, and what the tuner
measures of real reads is what they took. (How well it chooses: tests/test_tune_model.py on
simulated machines; how fast: benchmarks/bench_autotune.py.)"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.loader.wire import Loaded
from arrayfeed._pipeline.plan.indexblocks import groups
from arrayfeed._pipeline.read.blocks import WindowCache
from arrayfeed._pipeline.tune.report import Bound
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
    keys = {owner(first) for first, _ in groups(b._feed.plan, 0, b._feed.group_steps, False)}
    # (A loader that joins is let go unasked when the next count drawn is lower, a block
    # shuffle deals each window's groups to one loader, and loaders join later on a busy
    # machine: more epochs, until two served.)
    while processes and len(served) < min(2, len(keys)) and len(got) < 24:
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
    assert (report.tuned, report.settled, report.threads, report.bound) == (
        True,
        False,
        1,
        Bound.MEASURING,
    )
    fixed = af.tuning(af.batches(x, y, num_threads=3))
    assert (fixed.tuned, fixed.settled, fixed.threads, fixed.bound) == (False, True, 3, Bound.FIXED)
    assert str(fixed).startswith("threads 3")
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
def test_short_epochs_through_tf_data_settle(processes: int) -> None:
    """Epochs of two groups through tf.data, each read ahead whole while the one before is
    taken: windows hold a few passes each, and the tuner settles."""
    x = np.arange(20_000 * 4, dtype=np.float32).reshape(-1, 4)
    ds = af.from_arrays(x, batch_size=256, shuffle=False, processes=processes)
    for _ in range(40):
        assert sum(int(b.shape[0]) for b in ds) == 20_000
        if af.tuning(ds).settled:
            break
    report = af.tuning(ds)
    assert report.settled and report.bound is not Bound.MEASURING, report
    assert report.data_wait is not None and 0 <= report.data_wait <= 1


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


class BusyRows(SlowRows):
    """Rows whose every read first uses the CPU for 20 ms (decoding)."""

    def read(self, indices: np.ndarray) -> np.ndarray:
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
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


def _read_windows(b: af.Batches, windows: int, seconds: float = 20.0) -> None:
    end = time.perf_counter() + seconds
    while b._feed.tuner.model.windows < windows and time.perf_counter() < end:
        for _ in b:
            if b._feed.tuner.model.windows >= windows:
                break


def _waiting(batch: Any) -> Any:
    time.sleep(0.02)  # a service: waits without the GIL
    return batch


def _computing(batch: Any) -> Any:
    end = time.thread_time() + 0.02  # decoding: 20 ms of a core
    while time.thread_time() < end:
        pass
    return batch


@pytest.mark.parametrize("processes", [0, 1])
def test_the_tuner_measures_what_real_reads_take(
    files: dict[str, tuple[str, str]], processes: int
) -> None:
    """The windows of real reads carry their latency and their CPU, in this process and from a
    loader: a read that waits 20 ms per batch takes 20 ms or more and little CPU; one that
    computes for 20 ms uses most of a core while it reads (times measured, never rates)."""
    x, y = files["npy"]
    waiting = af.batches(x, y, batch_size=16, seed=0, processes=processes, map_batch=_waiting)
    _read_windows(waiting, 3)
    report, group = waiting.tuning, waiting._feed.group_steps
    assert report.latency >= 0.02 * group * 0.9, report
    assert report.reader_cores <= 0.5 * report.threads * max(1, report.processes), report
    busy = af.batches(x, y, batch_size=16, seed=0, processes=processes, map_batch=_computing)
    _read_windows(busy, 3)
    last = busy._feed.tuner.model.last
    assert last is not None and last.reader_cpu >= 0.5 * last.groups * 0.02, last
