"""Many datasets read at once, from many threads: each exact, loaders that outlive the threads.

Loader processes are shared by every dataset of a process, and started by whichever reading
first needs one. These tests read datasets from threads that start and end (as a validation
set read beside training, a prefetch thread per epoch, ``asyncio.to_thread`` do), and check
each stream against the same dataset read alone; they kill the training process while several
datasets read, and fork it.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.loader.processes import loaders
from arrayfeed._pipeline.loader.slots import LEDGER
from arrayfeed._pipeline.tune.machine import usable_cores

from ._feeds import image_files
from .conftest import REPO_ROOT

ROWS = 600

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="loader processes and /proc"
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """x (random uint8 images) and y (the row) as .npy paths, chunked lzf HDF5 and Zarr by
    convert."""
    root = tmp_path_factory.mktemp("many")
    made = image_files(root, ROWS, "lzf")
    af.convert(
        {"x": root / "x.npy", "y": root / "y.npy"}, root / "d.zarr", chunk_rows=50, progress=False
    )
    return {**made, "zarr": (f"{root / 'd.zarr'}:x", f"{root / 'd.zarr'}:y")}


def _datasets(files: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` dataset arguments over the three stores, mixed shuffle modes and batch sizes."""
    stores, modes = ("npy", "h5", "zarr"), (True, "block", False)
    return [
        {
            "x": files[stores[i % 3]][0],
            "y": files[stores[i % 3]][1],
            "batch_size": 16 + 7 * i,
            "shuffle": modes[(i // 3) % 3],
            "seed": i,
        }
        for i in range(count)
    ]


def _slowly() -> Any:
    """A ``map_batch`` that takes a little time (a closure: it travels to a loader by value), so
    that groups are a batch or two: an epoch is many requests to its loader."""

    def slow(batch: Any) -> Any:
        time.sleep(0.002)
        return batch

    return slow


def _make(args: dict[str, Any], **extra: Any) -> af.Batches:
    args = dict(args)
    return af.batches(args.pop("x"), args.pop("y"), **args, **extra)


def _epochs(b: af.Batches, count: int) -> list[np.ndarray]:
    """The labels of ``count`` epochs, each row's image checked against its label."""
    got = []
    for _ in range(count):
        labels = []
        for xb, yb in b:
            assert xb.shape[0] == yb.shape[0]
            labels.append(np.array(yb))
        got.append(np.concatenate(labels))
    return got


def _alone(args: dict[str, Any], count: int) -> list[np.ndarray]:
    """What ``count`` epochs of a dataset give read alone, in this process's threads."""
    return _epochs(_make(args, processes=0), count)


def _check(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert np.array_equal(g, e)  # the same stream as alone
        assert np.array_equal(np.sort(g), np.arange(ROWS))  # every row once


def _read_in_threads(datasets: list[dict[str, Any]], epochs: int) -> list[Any]:
    """Each dataset read for ``epochs`` in a thread of its own, all at once: its labels per
    epoch, or the exception it raised; checks each batch's images against its labels."""
    results: list[Any] = [None] * len(datasets)
    start = threading.Barrier(len(datasets))

    def read(i: int) -> None:
        try:
            b = _make(datasets[i])
            start.wait()
            results[i] = _epochs_aligned(b, epochs)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(datasets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def _epochs_aligned(b: af.Batches, count: int) -> list[np.ndarray]:
    got = []
    for _ in range(count):
        labels = []
        for xb, yb in b:
            assert np.array_equal(np.asarray(xb)[:, 0, 0, 0], _X0[np.asarray(yb)])
            labels.append(np.array(yb))
        got.append(np.concatenate(labels))
    return got


_X0: np.ndarray = np.empty(0)


@pytest.fixture(autouse=True)
def _first_bytes(files: dict[str, Any]) -> None:
    global _X0
    _X0 = np.asarray(files["arrays"][0])[:, 0, 0, 0].copy()


def test_twelve_datasets_in_twelve_threads_each_read_exactly(files: dict[str, Any]) -> None:
    """The case of the report: 12 datasets (.npy, HDF5, Zarr; mixed shuffle modes and batch
    sizes), 3 epochs each, a thread each; each thread ends when its dataset is done."""
    datasets = _datasets(files, 12)
    expected = [_alone(d, 3) for d in datasets]
    most = 0
    done = threading.Event()

    def count_loaders() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, len(loaders().pids()))
            time.sleep(0.01)

    counter = threading.Thread(target=count_loaders)
    counter.start()
    try:
        results = _read_in_threads(datasets, 3)
    finally:
        done.set()
        counter.join()
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, failed[:2]
    for got, want in zip(results, expected, strict=True):
        _check(got, want)
    assert 1 <= most <= usable_cores()


def test_the_slots_of_twelve_datasets_stay_within_the_process_budget(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    datasets = _datasets(files, 12)
    one_slot = 200 * max(d["batch_size"] for d in datasets) * 64  # generous: a few slots each
    budget = 12 * one_slot
    monkeypatch.setattr(LEDGER, "_budget", budget)
    gc.collect()
    _wait_for_no_slots()
    monkeypatch.setattr(LEDGER, "peak", 0)
    results = _read_in_threads(datasets, 2)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert 0 < LEDGER.peak <= budget


def _wait_for_no_slots() -> None:
    deadline = time.monotonic() + 10
    while LEDGER.held and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)


@pytest.mark.parametrize("trial", range(5))
def test_two_threads_with_a_dataset_each(files: dict[str, Any], trial: int) -> None:
    datasets = _datasets(files, 2 + trial)[trial:]
    expected = [_alone(d, 4) for d in datasets]
    results = _read_in_threads(datasets, 4)
    for got, want in zip(results, expected, strict=True):
        assert not isinstance(got, BaseException), got
        _check(got, want)


def test_datasets_made_and_dropped_in_short_threads_do_not_disturb_a_long_reader(
    files: dict[str, Any],
) -> None:
    """Each round, short-lived threads make a dataset and read it (the first of them starts
    the loader), then end while a long reader is in the middle of an epoch."""
    long_args, *short = (dict(d, map_batch=_slowly()) for d in _datasets(files, 9))
    expected = _alone(long_args, 4)
    errors: list[BaseException] = []

    def short_lived(args: dict[str, Any], reading: threading.Barrier) -> None:
        try:
            b = _make(args)
            _epochs_aligned(b, 1)
            reading.wait()  # the long reader has begun its epoch
            next(iter(b))  # an epoch begun and dropped
            del b
        except BaseException as exc:
            errors.append(exc)

    _wait_for_no_loaders()
    long: af.Batches | None = None
    got = []
    for epoch in range(4):
        reading = threading.Barrier(3)
        threads = [
            threading.Thread(target=short_lived, args=(a, reading)) for a in short[epoch::4][:2]
        ]
        for t in threads:
            t.start()
        if long is None:  # made once a short-lived thread has started the loader
            while not loaders().pids():
                time.sleep(0.01)
            long = _make(long_args)
        labels = []
        for i, (xb, yb) in enumerate(long):
            if i == 0:
                reading.wait()
                for t in threads:
                    t.join(60)  # they end while this epoch is read
            assert np.array_equal(np.asarray(xb)[:, 0, 0, 0], _X0[np.asarray(yb)])
            labels.append(np.array(yb))
        got.append(np.concatenate(labels))
    assert not errors, errors[:2]
    _check(got, expected)


def _wait_for_no_loaders() -> None:
    gc.collect()
    deadline = time.monotonic() + 15
    while loaders().pids() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_batches_read_through_asyncio_to_thread(files: dict[str, Any]) -> None:
    """Datasets made in ``asyncio.to_thread`` calls and their epochs begun in one
    ``asyncio.run``, read on in the next: each run ends its executor's threads."""
    args = [dict(d, map_batch=_slowly()) for d in _datasets(files, 4)]
    expected = [_alone(d, 2) for d in args]

    def begin(d: dict[str, Any]) -> tuple[af.Batches, Any, Any]:
        b = _make(d)
        it = iter(b)
        return b, it, next(it)

    def rest(b: af.Batches, it: Any, first: Any) -> list[np.ndarray]:
        labels = [np.array(first[1])] + [np.array(yb) for _, yb in it]
        return [np.concatenate(labels), *_epochs_aligned(b, 1)]

    async def begun() -> list[Any]:
        return list(await asyncio.gather(*(asyncio.to_thread(begin, d) for d in args)))

    async def read_on(started: list[Any]) -> list[list[np.ndarray]]:
        return list(await asyncio.gather(*(asyncio.to_thread(rest, *s) for s in started)))

    _wait_for_no_loaders()
    started = asyncio.run(begun())
    got = asyncio.run(read_on(started))
    for g, want in zip(got, expected, strict=True):
        _check(g, want)


_READING = """
    import sys, threading, time, arrayfeed as af
    from arrayfeed._pipeline.loader.processes import loaders
    x, y, h5x, h5y = sys.argv[1:5]

    def once():  # starts the loader, then its thread ends
        b = af.batches(x, y, batch_size=8, seed=0)
        for _ in b:
            pass

    def forever(a, b_):
        b = af.batches(a, b_, batch_size=8, seed=1, shuffle="block")
        while True:
            for _ in b:
                pass

    t = threading.Thread(target=once); t.start(); t.join()
    for args in ((x, y), (h5x, h5y)):
        threading.Thread(target=forever, args=args, daemon=True).start()
    deadline = time.monotonic() + 30
    while not loaders().pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    print(" ".join(map(str, loaders().pids())), flush=True)
    time.sleep(60)
"""


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_training_process_reading_several_datasets_leaves_no_loader(
    files: dict[str, Any],
) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_READING), *files["npy"], *files["h5"]],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert pids, "no loader was started"
    assert all(not _gone(p, 0.2) for p in pids)  # alive after the thread that started them ended
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert all(_gone(p, 5) for p in pids)


def _child_epochs(args: dict[str, Any]) -> list[list[int]]:
    return [e.tolist() for e in _epochs_aligned(_make(args), 2)]


def test_a_fork_while_several_datasets_read(files: dict[str, Any]) -> None:
    datasets = _datasets(files, 4)
    expected = [_alone(d, 4) for d in datasets]
    results: list[Any] = [None] * len(datasets)
    reading = threading.Barrier(len(datasets) + 1)

    def read(i: int) -> None:
        try:
            b = _make(datasets[i])
            got = _epochs_aligned(b, 1)
            reading.wait()
            results[i] = got + _epochs_aligned(b, 3)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(datasets))]
    for t in threads:
        t.start()
    reading.wait()  # every dataset is reading (or has read an epoch) in its loader
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child = pool.apply(_child_epochs, (datasets[0],))
    for t in threads:
        t.join(120)
    assert child == [e.tolist() for e in expected[0][:2]]
    for got, want in zip(results, expected, strict=True):
        assert not isinstance(got, BaseException), got
        _check(got, want)


_MANY = """
    import os, resource, sys
    import numpy as np, arrayfeed as af
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    x, y = sys.argv[1:3]
    made = [af.batches(x, y, batch_size=32, seed=i) for i in range(150)]
    its = [iter(b) for b in made]
    for it in its:  # every dataset's epoch begun at once: its slots and links all open
        next(it)
    rows = [32 + sum(len(yb) for _, yb in it) for it in its]
    print(len(os.listdir("/proc/self/fd")), min(rows), max(rows))
"""


def test_a_hundred_and_fifty_datasets_read_at_once_within_the_usual_descriptor_limit(
    files: dict[str, Any],
) -> None:
    """Each dataset read by loaders holds a few descriptors: starting a loader raises the soft
    limit (1,024 here) within the hard one, and waiting on links copes with descriptors beyond
    ``select``'s 1,024."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_MANY), *files["npy"]],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fds, least, most = map(int, done.stdout.split())
    assert least == most == ROWS
    assert fds > 150  # (at least one link per dataset: the case the limit is raised for)


def test_a_feed_collected_while_the_ledger_is_busy_does_not_hang() -> None:
    """The garbage collector may finalize a feed's slots at any allocation, also one made while
    the ledger's lock is held (seen: a feed collected inside ``Ledger.share``)."""
    from arrayfeed._pipeline.loader.slots import Ledger, Slots

    ledger = Ledger()
    ledger._budget = 1 << 20
    done = threading.Event()

    def collect_while_busy() -> None:
        slots = Slots(4096, 2, ledger)
        cycle: list[Any] = [slots]
        cycle.append(cycle)  # collected by the garbage collector, not by reference counting
        del slots, cycle
        with ledger._lock:
            gc.collect()  # the finalizer runs here, the lock held
        done.set()

    worker = threading.Thread(target=collect_while_busy, daemon=True)
    worker.start()
    assert done.wait(10), "the finalizer waited for the ledger's lock"
    assert ledger.held == 0 and ledger.share(1) == 1 << 20


class _FakeLoader:
    def __init__(self, pid: int) -> None:
        self.pid, self.stopped = pid, 0

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        self.stopped += 1


def test_a_release_never_waits_for_the_thread_that_takes_loaders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A feed's finalizer releases its loaders on whatever thread the garbage collector runs:
    also the starter thread while another thread holds the loaders' lock, waiting for that
    thread to start a loader. The release must not wait for the lock (that hung the suite); it
    is applied when the holder lets go."""
    from arrayfeed._pipeline.loader import processes

    monkeypatch.setattr(processes, "LINGER_SECONDS", 0.05)
    pool = processes._Loaders()
    fake = _FakeLoader(pid=123456)
    pool._processes.append(fake)  # type: ignore[arg-type]
    pool._users[fake.pid] = {1, 2}
    pool._lock.acquire()  # another thread taking loaders holds it
    releasing = threading.Thread(target=pool.release, args=(1,))
    releasing.start()
    releasing.join(timeout=10)
    assert not releasing.is_alive(), "a release waited for the lock"
    assert pool._users[fake.pid] == {1, 2}  # queued, not applied under another's lock
    pool._unlock()  # the holder lets go: the queued release is applied
    assert pool._users[fake.pid] == {2}
    pool.release(2)  # the lock free: applied at once, and the idle loader stops soon
    deadline = time.monotonic() + 10
    while not fake.stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.stopped == 1 and pool._processes == []
