"""``map_batch`` in loader processes (``processes=N``), batches through shared memory.

N loaders read and map, groups dealt out among them. The stream must be the one reader threads
give, bit for bit; an exception in a loader is the ``MapBatchError`` threads raise, with the
loader's traceback as its cause; loaders stop with their datasets and leave no shared memory,
file descriptor or zombie behind.

No TensorFlow at the top of this module: loaders import it to find the ``map_batch`` functions
below, and must start fast. The ``from_arrays`` tests import it.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

import arrayfeed as af
from arrayfeed._pipeline.loader import processes as loader_processes
from arrayfeed._pipeline.loader.slots import LEDGER

from .conftest import REPO_ROOT, subprocess_env

Write = Callable[[str, str, np.ndarray], object]
N = 103  # prime: batches never divide evenly


# -- map_batch functions (module level: picklable by reference for spawn) --------------------------
def pair_up(batch: Any) -> Any:
    """A new structure, other dtypes and row shapes: uint8 (2, 3) in, float32 (6,) out."""
    x, y, w = batch
    return {"pixels": x["img"].reshape(len(w), 6).astype(np.float32) / 255, "ids": y[0]}, w * 2


def python_rows(batch: Any) -> Any:
    """GIL-bound: a Python loop per row, one float64 per row out."""
    x, y, w = batch
    out = np.empty(len(w))
    for i, row in enumerate(x["real"].tolist()):
        out[i] = sum(v * v for v in row if v == v) + y[0][i]
    return out, y[1], w


def fail_at_row_50(batch: Any) -> Any:
    if 50 in batch:
        raise KeyError("row 50")
    return batch


def other_dtype_at_row_50(batch: Any) -> Any:
    return batch.astype(np.float32) if 50 in batch else batch


def text_at_row_50(batch: Any) -> Any:
    return "text" if 50 in batch else batch


def exit_at_row_50(batch: Any, marker: str = "") -> Any:
    if 50 in batch and os.path.exists(marker):
        os.remove(marker)
        os._exit(3)  # a crash, once: the worker dies mid-batch
    return batch


def slow_identity(batch: Any) -> Any:
    time.sleep(0.02)
    return batch


def slow_fail_at_row_50(batch: Any) -> Any:
    time.sleep(0.02)
    return fail_at_row_50(batch)


# -- helpers ---------------------------------------------------------------------------------------
def _data(write: Write, backends: tuple[str, str, str] = ("zarr", "hdf5", "npy_path")) -> Any:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(N, 2, 3), dtype=np.uint8)
    real = rng.normal(size=(N, 4)).astype(np.float32)
    real[::11, 1] = np.float32("nan")
    ids = np.arange(N, dtype=np.int64)
    x = {"img": write(backends[0], "img", img), "real": write(backends[1], "real", real)}
    y = [write(backends[2], "ids", ids), ids % 3 == 0]
    w = (np.arange(N) / 7).astype(np.float16)
    return x, y, w


def _leaves(batch: Any) -> list[np.ndarray]:
    if isinstance(batch, dict):
        return [leaf for key in sorted(batch) for leaf in _leaves(batch[key])]
    if isinstance(batch, (tuple, list)):
        return [leaf for item in batch for leaf in _leaves(item)]
    return [np.asarray(batch)]  # an ndarray, or an EagerTensor from from_arrays


def _same_stream(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert type(g) is type(e)
        for a, b in zip(_leaves(g), _leaves(e), strict=True):
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
            assert a.tobytes() == b.tobytes()


def _epochs(iterable: Any, count: int = 2) -> list[Any]:
    return [batch for _ in range(count) for batch in iterable]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _zombies() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _shared_mappings() -> int:
    """Mappings of arrayfeed's shared-memory slots in this process."""
    with open(f"/proc/{os.getpid()}/maps") as maps:
        return sum("arrayfeed-slot" in line for line in maps)


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        if not any(psutil.pid_exists(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _feed(owner: Any) -> Any:
    return owner._feed if isinstance(owner, af.Batches) else owner._arrayfeed_feed


def _workers(owner: Any) -> list[int]:
    """The loader processes serving the feed of ``owner``."""
    return [link.process.pid for link in _feed(owner)._remote.members.links]


# -- the stream ------------------------------------------------------------------------------------
CONFIGS: dict[str, dict[str, Any]] = {
    "shuffled": {"batch_size": 10, "seed": 3, "map_batch": pair_up},
    "storage_order_python": {"batch_size": 16, "shuffle": False, "map_batch": python_rows},
    "block_shard_resumed": {
        "batch_size": 8,
        "seed": 4,
        "shuffle": "block",
        "shard": af.Shard(2, 1),
        "start_step": 2,
        "map_batch": python_rows,
    },
}


@pytest.mark.parametrize("stacked", [True, False], ids=["groups", "one_batch_per_group"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_batches_stream_is_the_threads_stream_bit_for_bit(
    config: str, stacked: bool, write: Write, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.plan.shuffles.MIN_BLOCK_BYTES", 1)
    monkeypatch.setattr("arrayfeed._pipeline.plan.shuffles.WINDOW_BYTES", 2048)
    if stacked:  # (a map or a read timed while a neighbour holds the cores: still groups)
        monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_MAP_SECONDS", 60.0)
        monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_WAIT_SECONDS", 60.0)
    else:
        monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 1)
    kwargs = CONFIGS[config]
    x, y, w = _data(write)
    expected = _epochs(af.batches(x, y, w, **kwargs, processes=0), 3)
    b = af.batches(x, y, w, **kwargs, processes=2)
    assert b._feed.stacked is stacked
    _same_stream(_epochs(b, 3), expected)
    assert b._feed.processes == 2 and len(set(_workers(b))) == 2


def test_results_held_by_the_caller_are_never_overwritten(
    write: Write, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot taken (all batches kept): more slots are made, none is written over."""
    monkeypatch.setattr(
        "arrayfeed._pipeline.read.feed.GROUP_BYTES", 1
    )  # 26 groups: more than slots
    x, y, w = _data(write, ("ndarray", "ndarray", "ndarray"))
    kwargs = {"batch_size": 4, "seed": 1, "map_batch": pair_up, "num_threads": 1}
    reference = af.batches(x, y, w, **kwargs, processes=0)
    expected = [_epochs(reference, 1), _epochs(reference, 1)]
    b = af.batches(x, y, w, **kwargs, processes=1)
    kept = [_epochs(b, 1), _epochs(b, 1)]
    slots = b._feed._remote.slots
    assert slots.made > slots.keep
    for got, want in zip(kept, expected, strict=True):
        _same_stream(got, want)


@pytest.mark.parametrize("shuffle", [True, False])
def test_from_arrays_stream_is_the_threads_stream_bit_for_bit(shuffle: bool, write: Write) -> None:
    x, y, w = _data(write)
    kwargs = {"batch_size": 12, "seed": 5, "shuffle": shuffle, "map_batch": python_rows}
    expected = _epochs(af.from_arrays(x, y, w, **kwargs, processes=0))
    ds = af.from_arrays(x, y, w, **kwargs, processes=2)
    _same_stream(_epochs(ds), expected)
    _same_stream(_epochs(af.batches(x, y, w, **kwargs, processes=1)), expected)


def test_interleaved_iterators_share_the_workers_and_get_their_own_epochs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        "arrayfeed._pipeline.read.feed.GROUP_BYTES", 2 * 7 * 8
    )  # groups of 2 batches
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_MAP_SECONDS", 1.0)
    kwargs = {"batch_size": 7, "seed": 8, "map_batch": slow_identity}
    expected = _epochs(af.batches(np.arange(N), **kwargs, processes=0), 2)
    b = af.batches(np.arange(N), **kwargs, processes=2)
    assert b._feed.group_steps == 2
    first, second = iter(b), iter(b)
    got: tuple[list[Any], list[Any]] = ([], [])
    for pair in zip(first, second, strict=True):  # epoch 0 and epoch 1 at once
        got[0].append(pair[0])
        got[1].append(pair[1])
    _same_stream(got[0] + got[1], expected)


def test_a_pickled_batches_has_its_own_link_to_the_loaders() -> None:
    b = af.batches(np.arange(N), batch_size=10, seed=2, map_batch=slow_identity, processes=1)
    first = list(b)
    copy = pickle.loads(pickle.dumps(b))
    copy.seek(0)
    _same_stream(list(copy), first)
    assert copy._feed._remote is not b._feed._remote  # its own slots and channels
    assert _workers(copy) == _workers(b)  # served by this process's loader


# -- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 1.0, True, "2"])
def test_bad_processes_values_are_refused(bad: object) -> None:
    message = rf"`processes` must be a non-negative int or None \(got {bad!r}\)\.$"
    with pytest.raises(af.ConfigError, match=message):
        af.batches(np.arange(N), map_batch=slow_identity, processes=bad)  # type: ignore[arg-type]


def test_a_worker_exception_is_a_map_batch_error_with_its_traceback() -> None:
    b = af.batches(
        np.arange(N), batch_size=10, shuffle=False, map_batch=slow_fail_at_row_50, processes=2
    )
    assert b._feed.group_steps == 1  # one batch per group: the batches before it come first
    with pytest.raises(af.MapBatchError, match=r"^`map_batch` raised KeyError: 'row 50'$") as info:
        list(b)
    trace = str(info.value.__cause__)
    assert "in the loader process" in trace and "Traceback (most recent call last)" in trace
    assert "in fail_at_row_50" in trace and 'raise KeyError("row 50")' in trace
    assert b.position == (0, 5)  # the batches before it were yielded
    b.seek(0, 6)
    assert len(list(b)) == 5  # the workers live on


def test_a_worker_exception_reaches_from_arrays_users() -> None:
    import tensorflow as tf

    ds = af.from_arrays(
        np.arange(N), batch_size=10, shuffle=False, map_batch=fail_at_row_50, processes=1
    )
    with pytest.raises(tf.errors.OpError) as info:
        list(ds)
    message = str(info.value.message)
    assert "MapBatchError" in message and "`map_batch` raised KeyError: 'row 50'" in message
    assert "in fail_at_row_50" in message


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (other_dtype_at_row_50, "same row shapes and dtypes"),
        (text_at_row_50, "map_batch"),
    ],
)
def test_results_unlike_the_first_are_named_as_threads_name_them(fn: Any, match: str) -> None:
    kwargs = {"batch_size": 10, "shuffle": False, "map_batch": fn}
    with pytest.raises(af.MapBatchError, match=match) as threads:
        list(af.batches(np.arange(N), **kwargs))
    with pytest.raises(af.MapBatchError, match=match) as processes:
        list(af.batches(np.arange(N), **kwargs, processes=1))
    assert str(processes.value) == str(threads.value)


def test_a_crashed_loader_is_named_and_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "crash").touch()  # the first loader to see row 50 removes it and crashes
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 1)
    crash = functools.partial(exit_at_row_50, marker=str(tmp_path / "crash"))
    b = af.batches(np.arange(N), batch_size=10, shuffle=False, map_batch=crash, processes=1)
    with pytest.raises(af.LoaderError, match=r"loader process \(pid \d+\) exited with code 3"):
        list(b)
    b.seek(0)
    np.testing.assert_array_equal(np.concatenate(list(b)), np.arange(N))
    assert _zombies() == []


# -- what travels to a loader ----------------------------------------------------------------------
def test_a_lambda_and_its_closure_travel_to_the_loaders() -> None:
    offset = 1000
    kwargs = {"batch_size": 9, "seed": 7, "map_batch": lambda batch: batch + offset}
    expected = _epochs(af.batches(np.arange(N), **kwargs, processes=0))
    _same_stream(_epochs(af.batches(np.arange(N), **kwargs, processes=2)), expected)


def test_a_map_batch_its_loaders_cannot_import_is_named() -> None:
    module = types.ModuleType("arrayfeed_test_only_here")  # importable here, not in a loader
    exec("def identity(batch):\n    return batch\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        b = af.batches(np.arange(N), map_batch=module.identity, processes=1)
        with pytest.raises(
            af.LoaderError,
            match=r"could not load this dataset's feed .*"
            r"ModuleNotFoundError.*arrayfeed_test_only_here",
        ):
            list(b)
    finally:
        del sys.modules[module.__name__]
    assert _zombies() == []


# -- lifecycle -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("entry", ["batches", "from_arrays"])
def test_abandoned_iterators_leave_no_segments_processes_or_files(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget no share binds: datasets of earlier tests collected meanwhile would otherwise
    # give this one's slots a larger share (a slot more, a descriptor more: not a leak).
    monkeypatch.setattr(LEDGER, "_budget", 1 << 40)
    x = np.random.default_rng(0).random((2000, 16), dtype=np.float32)
    make = af.batches if entry == "batches" else af.from_arrays
    gc.collect()
    mapped = _shared_mappings()  # slots of datasets other tests left alive
    # Threads fixed: a tuner that raises them adds slots, a descriptor each (not a leak).
    ds = make(
        x,
        np.arange(2000),
        batch_size=8,
        seed=0,
        map_batch=python_rows_xy,
        processes=2,
        num_threads=2,
    )
    feed_id = _feed(ds)._remote.feed_id
    for _ in range(3):  # warm up: workers started, TensorFlow's one-off threads and files
        it = iter(ds)
        next(it)
        del it
    gc.collect()
    before = (_children(), _shm(), psutil.Process().num_fds(), _shared_mappings())
    pids = _workers(ds)
    assert len(pids) == 2 and set(pids) <= before[0]
    for _ in range(50):
        it = iter(ds)
        next(it)  # mid-epoch: groups in flight in the workers
        del it
    # What the abandoned iterators hold goes as their reads end: later on a busy machine (a
    # leak stays).
    deadline = time.monotonic() + 10
    while psutil.Process().num_fds() > before[2] and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    gc.collect()
    assert _children() == before[0]  # the same workers, no new process
    assert _zombies() == []
    assert _shm() - before[1] == set()  # no shared-memory segment
    assert psutil.Process().num_fds() <= before[2]
    assert _shared_mappings() == before[3] > mapped  # the same slots, mapped once each
    assert _workers(ds) == pids
    del ds
    gc.collect()
    assert _shared_mappings() == mapped  # deleting the dataset unmaps its slots …
    assert all(
        feed_id not in users for users in loader_processes.loaders()._users.values()
    )  # … ends it
    assert _zombies() == []
    assert _shm() - before[1] == set()


def python_rows_xy(batch: Any) -> Any:
    x, y = batch
    return np.array([sum(row) for row in x.tolist()], dtype=np.float32), y


_DELETING_SCRIPT = """
import gc, sys, time
import numpy as np
import arrayfeed as af
from arrayfeed._pipeline.loader.processes import LINGER_SECONDS, loaders

def slow_identity(batch):
    time.sleep(0.02)
    return batch

make = af.batches if sys.argv[1] == "batches" else af.from_arrays
ds = make(np.arange(103), batch_size=5, seed=0, map_batch=slow_identity, processes=2)
it = iter(ds)
next(it)  # an iterator still alive, mid-epoch, with groups in the loaders
print(*loaders().pids(), flush=True)
del it, ds
gc.collect()
time.sleep(LINGER_SECONDS + 1)
print(*loaders().pids(), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["batches", "from_arrays"])
def test_deleting_the_dataset_stops_its_loaders(entry: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_DELETING_SCRIPT), entry],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
        check=True,
    )
    running, after = done.stdout.splitlines()
    pids = [int(p) for p in running.split()]
    assert len(pids) == 2 and after == ""  # the only dataset gone: its loaders stopped
    assert _gone(pids)


def test_ctrl_c_in_the_loop_leaves_the_workers_usable() -> None:
    b = af.batches(np.arange(N), batch_size=5, seed=0, map_batch=slow_identity, processes=2)
    with pytest.raises(KeyboardInterrupt):
        for _ in b:
            raise KeyboardInterrupt
    pids = _workers(b)
    assert len(list(b)) == len(b)  # the next epoch, on the same workers
    assert _workers(b) == pids


_CTRL_C_SCRIPT = """
import time
import numpy as np
import arrayfeed as af

def slow_identity(batch):
    time.sleep(0.02)
    return batch

b = af.batches(np.arange(10_000), batch_size=5, map_batch=slow_identity, processes=2)
for i, _ in enumerate(b):
    if i == 2:
        print(*[link.process.pid for link in b._feed._remote.members.links], flush=True)
"""


@pytest.mark.slow
def test_ctrl_c_stops_a_program_and_its_workers() -> None:
    script = _CTRL_C_SCRIPT
    shm = _shm()
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole group, workers included
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert err.count("Traceback") == 1  # the program's; the workers ignored SIGINT
    assert _gone(pids)
    assert _shm() - shm == set()


@pytest.mark.slow
def test_the_benchmark_runs_in_its_smallest_configuration(tmp_path: Path) -> None:
    out = tmp_path / "map.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "benchmarks" / "bench_map.py"),
            *("--transforms", "numpy S", "--processes", "1", "--reps", "1"),
            *("--seconds", "0.05", "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    modes = {f["mode"] for f in report["figures"]}
    assert modes == {"no map_batch", "in a loop", "threads", "1 processes"}
    assert "CPU us/row" in done.stdout and "processes / threads" in done.stdout
