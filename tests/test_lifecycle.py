"""Lifecycle: concurrent and abandoned iterators, and sources and feeds in other processes."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import h5py
import keras
import numpy as np
import psutil
import pytest
import zarr

import arrayfeed as af
from arrayfeed._pipeline.api.resume import feeds_of

from . import _workers
from .conftest import REPO_ROOT
from .test_resume import CountingSource

N = 103


def _reader_threads() -> int:
    return sum(t.name.startswith("arrayfeed-read") for t in threading.enumerate())


def _ids(batches: list[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(b) for b in batches])


def test_two_interleaved_iterators_are_two_independent_epochs() -> None:
    ds = af.from_arrays(np.arange(N), batch_size=10, seed=5)
    plan = feeds_of(ds)[0].plan
    it1, it2 = iter(ds), iter(ds)
    first, second = [], []
    for _ in range(len(ds)):
        first.append(next(it1).numpy())  # it1 asks first: it takes epoch 0
        second.append(next(it2).numpy())
    for it in (it1, it2):
        with pytest.raises(StopIteration):
            next(it)
    np.testing.assert_array_equal(_ids(first), plan.indices(0, 0, plan.steps))
    np.testing.assert_array_equal(_ids(second), plan.indices(1, 0, plan.steps))


def test_iterators_consumed_by_concurrent_threads_each_get_a_whole_epoch() -> None:
    ds = af.from_arrays(np.arange(N), batch_size=10, seed=5, num_threads=2)
    plan = feeds_of(ds)[0].plan
    results: list[np.ndarray] = []
    lock = threading.Lock()

    def consume() -> None:
        ids = _ids([b.numpy() for b in ds])
        with lock:
            results.append(ids)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    epochs = {tuple(plan.indices(e, 0, plan.steps)) for e in range(3)}
    assert {tuple(r) for r in results} == epochs  # epochs 0, 1 and 2, each exactly once


@pytest.mark.slow
def test_fit_with_the_same_dataset_for_validation() -> None:
    x = np.random.default_rng(0).random((N, 3), dtype=np.float32)
    source = CountingSource(x)
    ds = af.from_arrays(source, x.sum(axis=1), batch_size=16, seed=0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(ds, validation_data=ds, epochs=2, verbose=0)
    # Training and validation passes each took one whole epoch: train 0, val 1, train 2, val 3
    # (Keras' unread extra iterators took none); each, short, read the next one's first groups
    # ahead, which the next took, and the last read some of epoch 4 (held, never taken).
    feed = feeds_of(ds)[0]
    assert feed.next_position == (4, 0)
    assert feed.ahead.held is not None and feed.ahead.held.epoch == 4
    feed.ahead.held.close()  # (its reads done)
    assert 4 * N < source.rows_read <= 5 * N


@pytest.fixture
def three_backends(tmp_path: Path) -> dict[str, Any]:
    a = np.random.default_rng(0).random((2000, 16), dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = a
        f.create_dataset("chunked", data=a, chunks=(256, 16))  # read through an h5py handle
    group = zarr.open_group(tmp_path / "a.zarr", mode="w")
    group.attrs["arrayfeed"] = {"complete": True}
    z = group.create_array(
        "x", shape=a.shape, dtype=a.dtype, chunks=(2000, 16), config={"write_empty_chunks": True}
    )
    z[...] = a
    return {
        "npy": str(tmp_path / "a.npy"),
        "h5": h5py.File(tmp_path / "a.h5", "r")["x"],  # contiguous: memory-mapped
        "h5_chunked": h5py.File(tmp_path / "a.h5", "r")["chunked"],
        "zarr": af.open_array(tmp_path / "a.zarr", "x"),
        "memmap": np.load(tmp_path / "a.npy", mmap_mode="r"),
    }


def _usage() -> tuple[int, int, int, int]:
    """(arrayfeed reader threads, OS threads, open file descriptors, RSS in MiB)."""
    proc = psutil.Process()
    return _reader_threads(), proc.num_threads(), proc.num_fds(), proc.memory_info().rss >> 20


def _settle() -> tuple[int, int, int, int]:
    for _ in range(100):
        gc.collect()
        if _reader_threads() == 0:
            break
        time.sleep(0.05)
    return _usage()


LEAK_COUNTS: dict[str, tuple[int, int, int, int]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("processes", [0, 1], ids=["threads", "loader"])
def test_abandoned_iterators_leak_no_threads_files_or_memory(
    three_backends: dict[str, Any], monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    # Groups of 4 batches: a whole epoch in one group would be read, and its readers gone, by the
    # time the first batch arrives (groups are prefetched).
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 4 * 8 * (5 * 16 * 4 + 8))
    ds = af.from_arrays(
        three_backends, np.arange(2000), batch_size=8, seed=0, num_threads=2, processes=processes
    )
    assert feeds_of(ds)[0].group_steps == 4
    for _ in range(5):  # warm up: TensorFlow's and h5py's one-off allocations, files opened once
        it = iter(ds)
        next(it)
        del it
    before, loader_before = _settle(), _loader_usage(ds)
    alive, loader_alive = None, loader_before
    for i in range(100):
        it = iter(ds)
        next(it)  # mid-epoch: reader threads running, groups in flight
        if i == 50:
            alive = _usage()
            loader_alive = _loader_usage(ds)
        del it
    after, loader_after = _settle(), _settle_loader(ds, loader_before)
    LEAK_COUNTS.update(before=before, alive=alive or before, after=after)
    print(f"\nleak counts (readers, OS threads, fds, RSS MiB): {LEAK_COUNTS}")
    assert alive is not None  # the check means something: readers were running
    assert (loader_alive[0] > loader_before[0]) if processes else (alive[0] > 0)
    assert after[0] == 0  # no arrayfeed reader thread left
    assert after[1] <= before[1]  # no OS thread left (TensorFlow's included)
    assert after[2] <= before[2]  # no file descriptor left
    assert after[3] - before[3] < 30  # RSS: no growth beyond allocator noise
    if processes:  # nor in the loader process
        assert loader_after[0] <= loader_before[0] and loader_after[1] <= loader_before[1]
        assert loader_after[2] - loader_before[2] < 30
    np.testing.assert_array_equal(  # and the dataset still works
        np.sort(np.concatenate([yb.numpy() for _, yb in ds])), np.arange(2000)
    )


def _loader_usage(ds: Any) -> tuple[int, int, int]:
    """(OS threads, file descriptors, RSS in MiB) of the dataset's loader, or zeros when it
    reads in this process."""
    remote = feeds_of(ds)[0]._remote
    if remote is None:
        return (0, 0, 0)
    (link,) = remote.members.links
    proc = psutil.Process(link.process.pid)
    return proc.num_threads(), proc.num_fds(), proc.memory_info().rss >> 20


def _settle_loader(ds: Any, before: tuple[int, int, int]) -> tuple[int, int, int]:
    usage = _loader_usage(ds)
    for _ in range(100):  # the loader ends a pass once its reads have finished
        if usage[0] <= before[0]:
            break
        time.sleep(0.05)
        usage = _loader_usage(ds)
    return usage


@pytest.mark.slow
def test_sources_and_feed_survive_spawn(three_backends: dict[str, Any]) -> None:
    ds = af.from_arrays(three_backends, np.arange(2000), batch_size=64, seed=4)
    (feed,) = feeds_of(ds)
    indices = np.array([0, 5, 6, 1999], dtype=np.int64)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        child = pool.apply(_workers.read_in_child, (feed, 3, indices))
    assert child["pid"] != os.getpid()
    assert Path(child["module"]).is_relative_to(REPO_ROOT)  # this checkout, not another
    assert child["h5_handles_inherited"] == [None]  # the path crossed, not the handle …
    assert child["h5_reopened_here"] == [True]  # … and the child opened the file itself
    feed.seek(3)
    here = list(feed())
    assert len(child["groups"]) == len(here)
    for theirs, ours in zip(child["groups"], here, strict=True):
        for key in ours[0]:
            np.testing.assert_array_equal(theirs[0][key], ours[0][key])
        np.testing.assert_array_equal(theirs[1], ours[1])
    for theirs, source in zip(child["direct"], feed.sources, strict=True):
        np.testing.assert_array_equal(theirs, source.read(indices))


@pytest.mark.slow
def test_h5py_handle_is_reopened_after_fork(tmp_path: Path) -> None:
    a = np.arange(40.0).reshape(20, 2)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=a, chunks=(4, 2))  # chunked: read through an h5py handle
    source = af.open_array(tmp_path / "a.h5", "x")
    indices = np.array([1, 7, 19], dtype=np.int64)
    np.testing.assert_array_equal(source.read(indices), a[indices])  # handle open in the parent
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply(_workers.read_after_fork, (source, indices))
    assert child["reopened"]
    np.testing.assert_array_equal(child["rows"], a[indices])


@pytest.mark.slow
def test_deleted_datasets_release_files_buffers_and_threads(tmp_path: Path) -> None:
    """k-fold loops and tuners build a dataset, iterate it and drop it, many times: every dataset
    and iterator gone must take its files, buffers and threads with it."""
    x = np.random.default_rng(0).standard_normal((4000, 256)).astype(np.float32)  # 4 MB
    np.save(tmp_path / "x.npy", x)
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f.create_dataset("y", data=np.arange(4000), chunks=(500,), compression="lzf")
    y_path = tmp_path / "y.h5"

    def one_round() -> None:
        ds = af.from_arrays(
            str(tmp_path / "x.npy"), af.open_array(y_path, "y"), batch_size=64, seed=0
        )
        it = iter(ds)
        for _ in range(5):  # mid-epoch: reader threads running, buffers pooled
            next(it)
        del it, ds

    for _ in range(5):  # warm up: TensorFlow's one-off allocations
        one_round()
    first = _settle()
    for _ in range(200):
        one_round()
    after = _settle()
    print(f"\n(readers, OS threads, fds, RSS MiB): first {first}, after 200 more {after}")
    assert after[0] == 0
    assert after[1] <= first[1]
    assert after[2] <= first[2]  # no file descriptor per deleted dataset
    assert after[3] - first[3] < 64  # not the pooled buffers of 200 datasets
