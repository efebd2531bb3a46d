"""A forked child gets every lock arrayfeed makes unheld (``arrayfeed/_forks.py``).

A process forked while one of the parent's threads held a lock (a reader thread taking a buffer,
say) inherits the lock held, with no thread left to release it. PyTorch ``DataLoader`` workers
and ``multiprocessing`` fork on Linux by default.
"""

from __future__ import annotations

import gc
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed import _forks
from arrayfeed._pipeline.read.resident import Resident

from . import _workers


class _Owner:
    def __init__(self) -> None:
        self.plain = threading.Lock()
        self.reentrant = threading.RLock()
        _forks.renew_after_fork(self, "plain")
        _forks.renew_after_fork(self, "reentrant")  # names add up


def test_renewed_locks_are_unheld_and_of_the_same_kind() -> None:
    owner = _Owner()
    owner.plain.acquire()
    owner.reentrant.acquire()
    _forks._renew()  # what the child runs right after a fork
    assert owner.plain.acquire(blocking=False)
    assert owner.reentrant.acquire(blocking=False) and owner.reentrant.acquire(blocking=False)
    assert isinstance(owner.reentrant, type(threading.RLock()))
    assert not isinstance(owner.plain, type(threading.RLock()))


def test_an_owner_that_is_gone_is_forgotten() -> None:
    owner = _Owner()
    key = id(owner)
    assert key in _forks._OWNERS
    del owner
    gc.collect()
    assert key not in _forks._OWNERS


def _held_locks() -> list[Any]:
    """Every lock arrayfeed registered, acquired here."""
    held = []
    for ref, names in list(_forks._OWNERS.values()):
        owner = ref()
        for name in names if owner is not None else ():
            lock = getattr(owner, name)
            assert lock.acquire(timeout=10), f"{type(owner).__name__}.{name} stays held"
            held.append(lock)
    return held


@pytest.mark.slow
def test_a_child_forked_while_every_lock_is_held_reads_its_epochs(tmp_path: Path) -> None:
    n = 3000
    # x: 256 bytes a row, so y (8) beside it is held in memory (a Resident, with its lock).
    np.save(tmp_path / "x.npy", np.arange(n * 64, dtype=np.float32).reshape(n, 64))
    with h5py.File(tmp_path / "y.h5", "w") as f:  # chunked + gzip: decoded outside h5py's lock
        f.create_dataset("y", data=np.arange(n), chunks=(250,), compression="gzip")
    y = af.open_array(tmp_path / "y.h5", "y")
    streams = [  # read in this process: its reader threads' locks are what a fork inherits
        af.batches(str(tmp_path / "x.npy"), y, batch_size=64, seed=3, shard=None, processes=0),
        af.batches(y, y, batch_size=64, seed=4, shard=None, shuffle="block", processes=0),
    ]
    for b in streams:  # epochs 0, 1 here: pools, readers, file descriptors and windows exist
        for _ in range(2):
            assert sorted(i for _, yb in b for i in yb.tolist()) == list(range(n))
        # and epoch 2's first groups, read ahead by threads the child does not have: it reads
        # epoch 2 itself, the parent takes what was read ahead (the same batches).
        assert b._feed.ahead.held is not None and b._feed.ahead.held.epoch == 2
    assert (
        isinstance(streams[0]._feed.readable[1], Resident) and streams[0]._feed.readable[1].loaded
    )
    # Not read yet: the child takes the held leaf's lock to read it.
    streams.append(
        af.batches(str(tmp_path / "x.npy"), y, batch_size=64, seed=5, shard=None, processes=0)
    )
    assert not streams[2]._feed.readable[1].loaded
    _workers.INHERITED[:] = streams
    held = _held_locks()
    assert streams[2]._feed.readable[1]._lock in held  # as a reader thread reading it at fork
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:  # forks now, locks held
            child = pool.apply_async(_workers.iterate_inherited).get(timeout=120)
    finally:
        for lock in held:
            lock.release()
        _workers.INHERITED.clear()
    here = [[yb.tolist() for _, yb in b] for b in streams]  # the same epochs in the parent
    assert child == here
    assert all(sorted(i for batch in epoch for i in batch) == list(range(n)) for epoch in child)
