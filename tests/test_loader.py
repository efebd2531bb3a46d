"""The loader process: the same stream as reading in this process, and a clean lifecycle.

Every stream test compares, bit for bit, what ``processes=1`` (a loader process reads, groups come
back in shared memory) gives against ``processes=0`` (this process's reader threads), over real
files on disk, for the arguments that shape a stream: seeds, shards, shuffle modes, resuming,
``map_batch``. The lifecycle tests kill, interrupt and abandon loaders and look for what is left.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.loader.processes import LINGER_SECONDS, LoaderProcess, loaders
from arrayfeed._pipeline.tune.tuning import Tuner

from ._feeds import image_files
from .conftest import REPO_ROOT

ROWS = 1000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """x (uint8 images) and y (int64 labels) as .npy paths, chunked lzf HDF5 and Zarr by convert."""
    root = tmp_path_factory.mktemp("loader")
    made = image_files(root, ROWS, "lzf")
    af.convert(
        {"x": root / "x.npy", "y": root / "y.npy"}, root / "d.zarr", chunk_rows=100, progress=False
    )
    return {**made, "zarr": (f"{root / 'd.zarr'}:x", f"{root / 'd.zarr'}:y")}


def _epochs(b: af.Batches, count: int) -> list[list[tuple[np.ndarray, ...]]]:
    return [[tuple(np.array(a) for a in batch) for batch in b] for _ in range(count)]


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb, strict=True):
            for la, lb in zip(ba, bb, strict=True):
                assert la.dtype == lb.dtype and la.shape == lb.shape
                assert np.array_equal(la, lb)


@pytest.mark.parametrize("store", ["npy", "h5", "zarr"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"shuffle": True, "seed": 3},
        {"shuffle": False},
        {"shuffle": "block", "seed": 5},
        {"shuffle": True, "seed": 7, "shard": af.Shard(3, 1), "drop_remainder": True},
        {"shuffle": "block", "seed": 2, "start_epoch": 2, "start_step": 3},
    ],
    ids=["full", "none", "block", "shard", "resumed"],
)
def test_the_loader_gives_the_stream_of_reader_threads(
    files: dict[str, Any], store: str, kwargs: dict[str, Any]
) -> None:
    x, y = files[store]
    here = af.batches(x, y, batch_size=48, processes=0, **kwargs)
    there = af.batches(x, y, batch_size=48, processes=1, **kwargs)
    # Three epochs: the third starts from the groups the second read ahead (either way).
    _same(_epochs(there, 3), _epochs(here, 3))
    assert there.position == here.position


def test_a_short_epoch_asks_the_loader_for_the_next_epochs_first_groups(
    files: dict[str, Any],
) -> None:
    x, y = files["npy"]
    here = af.batches(x, y, batch_size=48, seed=3, processes=0)
    there = af.batches(x, y, batch_size=48, seed=3, processes=1)
    remote = there._feed._remote
    assert remote is not None
    for epoch in range(3):
        _same(_epochs(there, 1), _epochs(here, 1))
        held = remote._ahead
        if epoch == 0:  # the first pass reads none ahead: how long an epoch takes is not known
            assert held is None
            continue
        assert held is not None and (held.epoch, held.start_step) == (epoch + 1, 0)
        assert held.asked >= 1 and held.in_flight == held.asked  # asked for, not taken
    token = remote._ahead.token
    _same(_epochs(there, 1), _epochs(here, 1))  # epoch 3: the pass asked for ahead, taken
    assert remote._ahead is not None and remote._ahead.token > token
    for position in ((5, 4), (4, 0)):  # not the epoch asked for ahead (4 from its start): ended
        here.seek(*position)
        there.seek(*position)
        assert remote._ahead is None  # at once: its slots come back
        _same(_epochs(there, 1), _epochs(here, 1))
    assert remote._ahead.epoch == 5  # read ahead by the pass over epoch 4


def test_an_error_in_a_group_asked_for_ahead_is_raised_in_its_epoch(
    files: dict[str, Any],
) -> None:
    x, y = files["npy"]
    # The first batch of epoch 2 fails, known by its labels: counting calls in the loader would
    # not tell it, as the pass ahead is read beside the end of the pass before.
    ahead = af.batches(x, y, batch_size=100, seed=6, processes=0)
    earlier = [yb for _ in range(2) for _, yb in ahead]
    failing = next(iter(ahead))[1]
    assert not any(np.array_equal(failing, e) for e in earlier)

    def fails(batch: Any) -> Any:
        if np.array_equal(batch[1], failing):
            raise ValueError("no third epoch")
        return batch

    b = af.batches(x, y, batch_size=100, seed=6, map_batch=fails, processes=1, num_threads=1)
    for _ in range(2):
        assert sum(len(yb) for _, yb in b) == ROWS
    held = b._feed._remote._ahead  # epoch 2 (one group) was asked for while epoch 1 ended
    assert held is not None and held.epoch == 2 and held.asked == 1
    with pytest.raises(af.MapBatchError, match="no third epoch"):
        next(iter(b))


@pytest.mark.parametrize("threads", [64, 100])
def test_a_loader_reading_many_groups_at_once_gets_all_its_slots(
    files: dict[str, Any], threads: int
) -> None:
    # 64 threads need 65 slots and those held: more descriptors than one message carries (the
    # loader's feed once hung up on a message of 69, and the training process saw it as lost).
    x, y = files["npy"]
    here = af.batches(x, y, batch_size=8, seed=1, processes=0)
    there = af.batches(x, y, batch_size=8, seed=1, processes=1, num_threads=threads)
    _same(_epochs(there, 2), _epochs(here, 2))


def test_a_message_carries_at_most_max_fds_descriptors() -> None:
    import socket

    from arrayfeed._pipeline.loader.wire import MAX_FDS, Channel, EpochEnded

    a, b = socket.socketpair()
    with a, b:
        sender, receiver = Channel(a), Channel(b)
        fds = [os.dup(0) for _ in range(MAX_FDS + 1)]
        try:
            with pytest.raises(ValueError, match=f"at most {MAX_FDS}"):
                sender.send(EpochEnded(1), fds)
            sender.send(EpochEnded(2), fds[:MAX_FDS])
            message, got = receiver.recv()
            assert message == EpochEnded(2) and len(got) == MAX_FDS
            for fd in got:
                os.close(fd)
        finally:
            for fd in fds:
                os.close(fd)


def test_map_batch_defined_in_a_script_runs_in_the_loader(files: dict[str, Any]) -> None:
    scale = 3

    def crop(batch: Any) -> Any:  # a closure: it travels by value
        x, y = batch
        return {"x": x[:, 2:6, 2:6].astype(np.float32) * scale}, y + 1

    x, y = files["npy"]
    here = af.batches(x, y, batch_size=64, seed=1, map_batch=crop, processes=0)
    there = af.batches(x, y, batch_size=64, seed=1, map_batch=crop, processes=1)
    a, b = list(there), list(here)
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert np.array_equal(xa["x"], xb["x"]) and np.array_equal(ya, yb)


def test_batches_kept_stay_intact_while_later_epochs_are_read(files: dict[str, Any]) -> None:
    x, y = files["npy"]
    b = af.batches(x, y, batch_size=32, seed=0, processes=1)
    kept = list(b)  # every batch of epoch 0 held: the loader must not write over them
    copies = [(xb.copy(), yb.copy()) for xb, yb in kept]
    for _ in range(3):
        for _batch in b:
            pass
    for (xb, yb), (xc, yc) in zip(kept, copies, strict=True):
        assert np.array_equal(xb, xc) and np.array_equal(yb, yc)


def test_from_arrays_through_the_loader_gives_the_same_elements(files: dict[str, Any]) -> None:
    x, y = files["h5"]
    here = af.from_arrays(x, y, batch_size=50, shuffle="block", seed=4, processes=0)
    there = af.from_arrays(x, y, batch_size=50, shuffle="block", seed=4, processes=1)
    for _ in range(2):
        got = [(a.numpy(), b.numpy()) for a, b in there]
        want = [(a.numpy(), b.numpy()) for a, b in here]
        assert len(got) == len(want)
        for (xa, ya), (xb, yb) in zip(got, want, strict=True):
            assert np.array_equal(xa, xb) and np.array_equal(ya, yb)


def test_an_exception_while_reading_is_raised_here_with_its_type_and_message(
    files: dict[str, Any],
) -> None:
    def fails(batch: Any) -> Any:
        if int(batch[1][0]) > 500 or int(batch[1][-1]) > 500:
            raise ValueError("no rows past 500")
        return batch

    x, y = files["npy"]
    b = af.batches(x, y, batch_size=100, shuffle=False, map_batch=fails, processes=1)
    with pytest.raises(af.MapBatchError, match="no rows past 500") as raised:
        list(b)
    assert "in the loader process" in str(raised.value.__cause__)


def _no_loaders() -> None:
    """Wait for the loaders of earlier tests to stop: they linger :data:`LINGER_SECONDS` after
    their last feed is gone (these tests count the loaders there are)."""
    gc.collect()
    deadline = time.monotonic() + LINGER_SECONDS + 10
    while loaders().pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not loaders().pids(), "loaders of earlier tests still serve their feeds"


def test_a_killed_loader_is_a_named_error_and_the_next_epoch_starts_a_new_one(
    files: dict[str, Any],
) -> None:
    def slow(batch: Any) -> Any:  # groups of one batch: most of the epoch is still to come
        time.sleep(0.01)
        return batch

    x, y = files["npy"]
    _no_loaders()
    b = af.batches(x, y, batch_size=10, seed=0, processes=1, map_batch=slow)
    it = iter(b)
    next(it)
    (pid,) = loaders().pids()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(af.LoaderError, match=rf"pid {pid}\) was killed by signal 9"):
        for _ in it:
            pass
    assert sum(len(batch[1]) for batch in b) == ROWS
    assert loaders().pids() and loaders().pids()[0] != pid


def _fds() -> list[str]:
    return sorted(
        os.readlink(f"/proc/self/fd/{fd}")
        for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc entries")
def test_abandoned_iterators_and_datasets_leave_nothing_behind(files: dict[str, Any]) -> None:
    x, y = files["npy"]

    def abandon() -> None:
        b = af.batches(x, y, batch_size=16, seed=0, processes=1)
        for _ in range(3):
            it = iter(b)
            next(it)
            del it

    _no_loaders()
    abandon()  # the loader process starts once
    gc.collect()
    before_fds, before_pids = _fds(), loaders().pids()
    (loader,) = before_pids
    loader_fds = len(os.listdir(f"/proc/{loader}/fd"))
    for _ in range(50):
        abandon()
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(os.listdir(f"/proc/{loader}/fd")) > loader_fds:
        time.sleep(0.05)  # the loader closes a dropped feed's slots and sockets when it sees it
    assert _fds() == before_fds
    assert loaders().pids() == before_pids
    assert len(os.listdir(f"/proc/{loader}/fd")) <= loader_fds
    assert not [p for p in _fds() if "arrayfeed-slot" in p]


def _run_script(body: str, *args: str) -> subprocess.Popen[str]:
    code = textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        time.sleep(0.05)
    return False


_ITERATING = """
    import sys, arrayfeed as af
    from arrayfeed._pipeline.loader.processes import loaders
    b = af.batches(sys.argv[1], batch_size=8, seed=0, processes=1)
    it = iter(b); next(it)
    print(loaders().pids()[0], flush=True)
    while True:
        for _ in b:
            pass
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_training_process_takes_its_loader_with_it(files: dict[str, Any]) -> None:
    proc = _run_script(_ITERATING, files["npy"][0])
    assert proc.stdout is not None
    loader = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    assert _gone(loader)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_the_training_process_and_its_loader(files: dict[str, Any]) -> None:
    proc = _run_script(_ITERATING, files["npy"][0])
    assert proc.stdout is not None
    loader = int(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert _gone(loader)


def test_a_loader_never_runs_the_scripts_main_again(tmp_path: Path, files: dict[str, Any]) -> None:
    script = tmp_path / "train.py"  # no `if __name__ == "__main__":` guard, as scripts often are
    script.write_text(
        textwrap.dedent(f"""
        import arrayfeed as af
        print("main ran", flush=True)
        b = af.batches({files["npy"][0]!r}, batch_size=100, seed=0, processes=1,
                       map_batch=lambda x: x * 2)
        print(sum(len(batch) for batch in b), flush=True)
    """)
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["main", "ran", str(ROWS)]


def test_a_map_batch_that_cannot_travel_is_refused_at_the_call(files: dict[str, Any]) -> None:
    import threading

    lock = threading.Lock()

    def locked(batch: Any) -> Any:
        with lock:
            return batch

    with pytest.raises(af.ConfigError, match=r"cannot be sent to one \(TypeError: cannot pickle"):
        af.batches(files["npy"][0], batch_size=100, map_batch=locked, processes=1)
    assert len(list(af.batches(files["npy"][0], batch_size=100, map_batch=locked))) == 10


def test_a_source_that_cannot_travel_is_named_or_read_here(tmp_path: Path) -> None:
    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(50.0)
    with h5py.File(path, "a") as f:  # open for writing here: HDF5 locks it against a loader
        with pytest.raises(
            af.ConfigError,
            match=r"`x` cannot be read from another process: .*"
            r"open for writing in this process",
        ):
            af.batches(f["x"], batch_size=10, processes=1)
        b = af.batches(f["x"], batch_size=10, shuffle=False)  # the default reads it here
        assert b._feed.processes == 0
        assert np.concatenate(list(b)).tolist() == list(np.arange(50.0))


def test_the_default_reads_files_in_a_loader_and_arrays_here(files: dict[str, Any]) -> None:
    x, y = files["npy"]
    assert af.batches(x, y).__getattribute__("_feed").processes == 1
    arrays = files["arrays"]
    assert af.batches(*arrays)._feed.processes == 0  # all in memory: gathered here
    assert af.batches(x, arrays[1])._feed.processes == 1  # labels in memory travel along
    assert af.batches(x, y, processes=0)._feed.processes == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks")
def test_a_forked_child_reads_through_loaders_of_its_own(files: dict[str, Any]) -> None:
    import multiprocessing

    x, y = files["npy"]
    b = af.batches(x, y, batch_size=100, seed=2, processes=1)
    list(b)  # the parent's loader has served it
    expected = [yb.tolist() for _, yb in af.batches(x, y, batch_size=100, seed=2, processes=0)]
    parent_loaders = loaders().pids()
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child, child_loaders = pool.apply(_epoch_in_child, (b,))
    assert child == [
        yb.tolist()
        for _, yb in af.batches(x, y, batch_size=100, seed=2, start_epoch=1, processes=0)
    ]
    assert expected != child  # epoch 1, not epoch 0
    assert child_loaders and not set(child_loaders) & set(parent_loaders)
    assert [yb.tolist() for _, yb in b] == child  # the parent's own epoch 1, unchanged


def _epoch_in_child(b: af.Batches) -> tuple[list[list[int]], list[int]]:
    got = [yb.tolist() for _, yb in b]
    return got, loaders().pids()


_FAULTS = """
import os, resource, sys
import numpy as np
import arrayfeed as af

api, x, y = sys.argv[1:4]
make = af.batches if api == "batches" else af.from_arrays
source = make(x, y, batch_size=64, seed=0)
assert source._feed.processes == 1 if api == "batches" else True
row = np.load(x, mmap_mode="r")[0].nbytes + 8

def epoch():
    n = 0
    for _, yb in source:
        n += int(np.asarray(yb).shape[0])
    return n

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

for _ in range(3):  # warm up: slots mapped, TensorFlow's allocations made
    epoch()
first = rss()
faults, rows = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, 0
for _ in range(20):
    rows += epoch()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(faults / (rows * row / 4096), (rss() - first) / 2**20)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("api", ["batches", "from_arrays"])
def test_the_training_process_touches_no_fresh_memory_in_steady_state(
    tmp_path: Path, api: str
) -> None:
    """Minor page faults per 4 KiB page delivered, and RSS growth over 20 epochs, in a process of
    its own (TensorFlow lowers the allocator's mmap threshold for the whole process)."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.integers(0, 255, (3000, 32, 32, 3), dtype=np.uint8))
    np.save(tmp_path / "y.npy", np.arange(3000))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_FAULTS),
            api,
            str(tmp_path / "x.npy"),
            str(tmp_path / "y.npy"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    faults_per_page, rss_growth_mib = map(float, out.stdout.split())
    assert faults_per_page <= 0.1
    assert rss_growth_mib < 32  # memory stays bounded: slots are reused, not made anew


def test_a_loader_that_closes_its_link_while_alive_is_named_so() -> None:
    """A loader whose side of a feed's link ended while it still runs (an error in the loader
    itself) is not reported as killed or crashed."""
    import threading

    from arrayfeed._pipeline.loader.client import RemoteFeed
    from arrayfeed._pipeline.loader.members import Link

    class Alive:
        pid = 4242

        def exit_code(self, timeout: float = 5.0) -> int | None:
            return None

    class Exited(Alive):
        def exit_code(self, timeout: float = 5.0) -> int | None:
            return 3

    remote = RemoteFeed.__new__(RemoteFeed)  # the state `_lost` uses, no loader started
    remote._cond, remote._ending = threading.Condition(), {}
    for process, says, not_said in (
        (Alive(), r"pid 4242\) closed its link to this dataset while still running", "killed"),
        (
            Exited(),
            r"pid 4242\) exited with code 3 while reading batches \(killed for memory",
            "link",
        ),
    ):
        link = Link(process, channel=None)  # type: ignore[arg-type]
        remote._lost(link)
        assert isinstance(link.error, af.LoaderError)
        assert re.search(says, str(link.error)), str(link.error)
        assert not_said not in str(link.error).split(";")[0]


class TwoThenOne(Tuner):
    """Asks for two loader processes until told to ask for one again (a tuner that tried a
    second and found that it did not pay), and for the loaders the tests set in ``spare`` to
    be started ahead. Its threads are fixed."""

    spare = 0  # (a plain attribute here: the tests set it)

    def __init__(self) -> None:
        self.wanted = 2
        self.ready: list[int] = []
        super().__init__(2, 2, fixed=True, processes=1, most_processes=2)

    @property
    def processes(self) -> int:
        return self.wanted

    def processes_ready(self, in_flight: int) -> None:
        self.ready.append(in_flight)


def test_loaders_join_while_reading_and_are_let_go_when_no_longer_asked_for(
    files: dict[str, Any],
) -> None:
    x, y = files["npy"]
    b = af.batches(x, y, batch_size=10, seed=4, processes=1)
    remote = b._feed._remote
    b._feed.tuner = remote.tuner = tuner = TwoThenOne()
    first = remote.members.links[0].process
    got = _epochs(b, 1)
    deadline = time.monotonic() + 30
    while not tuner.ready and time.monotonic() < deadline:  # the second joins within an epoch
        got += _epochs(b, 1)
    assert tuner.ready and len(remote.members.links) == 2 and len(remote.members.reading()) == 2
    second = remote.members.links[1].process
    assert second is not first and second.alive()
    got += _epochs(b, 1)  # read by both
    tuner.wanted = 1
    got += _epochs(b, 1)
    assert [link.process for link in remote.members.links] == [first]  # the second let go ...
    assert b._feed.tuning.threads == 2
    _same(got, _epochs(af.batches(x, y, batch_size=10, seed=4, processes=0), len(got)))
    deadline = time.monotonic() + LINGER_SECONDS + 10
    while second.alive() and time.monotonic() < deadline:  # ... and, serving no feed, stops
        time.sleep(0.1)
    assert not second.alive() and first.alive()


def _with_a_spare(b: af.Batches) -> tuple[Any, TwoThenOne, LoaderProcess, list[Any]]:
    """``b`` read for an epoch by one loader, a second started ahead to be tried: its feed's
    link, tuner, first loader and the epoch read."""
    remote = b._feed._remote
    b._feed.tuner = remote.tuner = tuner = TwoThenOne()
    tuner.wanted = 1
    first = remote.members.links[0].process
    tuner.spare = 2
    return remote, tuner, first, _epochs(b, 1)


def test_the_loader_to_try_next_is_started_before_it_is_tried(files: dict[str, Any]) -> None:
    """A tuner whose threads' climb is over, with a busy loader, asks for the next count to be
    started (``spare``): the process starts and imports while fewer threads are
    measured, the feed not registered with it; the count tried then reads with that very
    process. One that is not tried after all is let go, and stops."""
    x, y = files["npy"]
    b = af.batches(x, y, batch_size=10, seed=4, processes=1)
    remote, tuner, first, got = _with_a_spare(b)
    spares = list(remote.members.spares)
    assert len(spares) == 1 and spares[0] is not first and spares[0].alive()
    assert [link.process for link in remote.members.links] == [
        first
    ]  # started, not asked for groups
    assert spares[0].pid in loaders().pids()
    tuner.wanted = 2  # the count is tried: with the process started before
    deadline = time.monotonic() + 30
    while not tuner.ready and time.monotonic() < deadline:
        got += _epochs(b, 1)
    assert [link.process for link in remote.members.links] == [first, spares[0]]
    tuner.spare = 0  # settled
    got += _epochs(b, 1)
    assert remote.members.spares == [] and spares[0].alive()  # in use: kept
    _same(got, _epochs(af.batches(x, y, batch_size=10, seed=4, processes=0), len(got)))

    # Back to one loader, with two more started and then not tried: let go, and, serving no
    # feed, they stop.
    tuner.wanted, tuner.spare = 1, 3
    got = _epochs(b, 1)
    assert [link.process for link in remote.members.links] == [first]
    assert len(remote.members.spares) == 3 - 1 and spares[0] in remote.members.spares
    started = list(remote.members.spares)
    tuner.spare = 0
    got += _epochs(b, 1)
    assert remote.members.spares == []
    deadline = time.monotonic() + LINGER_SECONDS + 10
    while any(p.alive() for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.alive() for p in started) and first.alive()


def _noted(path: str) -> NotedMap:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    return NotedMap(path)


class NotedMap:
    """A ``map_batch`` that changes nothing, and notes in the file ``path`` the pid of every
    process it is unpickled in."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, batch: Any) -> Any:
        return batch

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _noted, (self.path,)


def _unpickled_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _opened_ahead(
    x: str, y: str, noted: Path, then: Callable[[], Any] = lambda: None
) -> tuple[af.Batches, Any, TwoThenOne, list[Any]]:
    """As :func:`_with_a_spare`, over a ``map_batch`` that notes where it is unpickled (in
    ``noted``); once the spare has opened the feed, ``then`` is called and the spare tried.
    Returns the batches, their link, tuner and what was read."""
    b = af.batches(x, y, batch_size=10, seed=4, processes=1, map_batch=NotedMap(str(noted)))
    remote, tuner, first, got = _with_a_spare(b)
    deadline = time.monotonic() + 30
    while len(_unpickled_in(noted)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _unpickled_in(noted) == [first.pid, remote.members.spares[0].pid]  # before it was tried
    then()
    tuner.wanted = 2
    while not tuner.ready and time.monotonic() < deadline:
        got += _epochs(b, 1)
    assert [link.process.pid for link in remote.members.links] == _unpickled_in(noted)[:2]
    return b, remote, tuner, got


def test_the_loader_to_try_next_unpickles_the_feed_before_it_is_tried(
    files: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader started ahead opens the feed (its imports, its storage) while it waits to be
    tried, and serves it with what it opened then: the feed is unpickled there once."""
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 8 << 10)  # groups for both
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 8 << 10)
    x, y = files["npy"]
    noted = tmp_path / "unpickled"
    b, remote, _, got = _opened_ahead(x, y, noted)
    deadline = time.monotonic() + 30
    while not remote.members.links[1].delivered and time.monotonic() < deadline:
        got += _epochs(b, 1)
    assert remote.members.links[1].delivered  # it served
    assert len(_unpickled_in(noted)) == 2  # with the feed it had unpickled
    _same(got, _epochs(af.batches(x, y, batch_size=10, seed=4, processes=0), len(got)))


def test_a_loader_started_ahead_opens_the_feed_again_in_an_environment_changed_since(
    files: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials or endpoints set after the spare opened the feed: it is opened again, in the
    environment the training process has when the spare is tried."""
    noted = tmp_path / "unpickled"
    since = lambda: monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # noqa: E731
    _, remote, _, _ = _opened_ahead(*files["npy"], noted, then=since)
    spare = remote.members.links[1].process
    assert _unpickled_in(noted)[1:] == [spare.pid, spare.pid]


def test_a_loader_that_cannot_start_leaves_reading_to_those_there_are(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaders().stop()  # none left lingering by the tests before: the second must be started
    x, y = files["npy"]
    b = af.batches(x, y, batch_size=10, seed=4, processes=1)
    remote = b._feed._remote
    b._feed.tuner = remote.tuner = tuner = TwoThenOne()
    started = []

    def refused(self: Any) -> None:
        started.append(1)
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(LoaderProcess, "__init__", refused)
    got = _epochs(b, 2)
    assert started == [1] and tuner.ready  # tried once, and the tuner told
    assert len(remote.members.links) == 1
    _same(got, _epochs(af.batches(x, y, batch_size=10, seed=4, processes=0), 2))


def test_a_feed_released_while_loaders_are_taken_does_not_hang(
    files: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A feed in a reference cycle is released by its finalizer whenever the garbage collector
    runs: also inside ``take``, on the thread holding the pool's lock."""
    import threading

    held = af.batches(*files["npy"], batch_size=10, seed=0, processes=1)  # a loader in the pool
    pool, real = loaders(), LoaderProcess.alive

    def alive(self: LoaderProcess) -> bool:
        pool.release(-1)  # what a finalizer run here does
        return real(self)

    monkeypatch.setattr(LoaderProcess, "alive", alive)
    taken: list[Any] = []
    thread = threading.Thread(target=lambda: taken.append(pool.take(1, -2)), daemon=True)
    thread.start()
    thread.join(10)
    monkeypatch.undo()
    assert taken, "take() hung"
    pool.release(-2)
    del held
