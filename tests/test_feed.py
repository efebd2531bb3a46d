"""The feed: groups of stacked batches, epochs taken on first request, map_batch checks."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.plan.indexblocks import groups
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._pipeline.read.structure import flatten
from arrayfeed._storage import as_source
from arrayfeed._storage.npy.memory import ArraySource


def _feed(n: int = 50, batch: int = 8, drop: bool = False, **kwargs: object) -> Feed:
    x = {"a": np.arange(n), "b": np.arange(n) * 10.0}
    leaves, treedef = flatten(x, lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=n, batch_size=batch, drop_remainder=drop, seed=1)
    return Feed([ArraySource(v) for v in leaves], treedef, plan, **kwargs)  # type: ignore[arg-type]


def _batches(feed: Feed) -> list[dict[str, np.ndarray]]:
    out = []
    for group in feed():
        if not feed.stacked:
            out.append(group)
            continue
        for i in range(len(group["a"])):
            out.append({k: v[i] for k, v in group.items()})
    return out


@pytest.mark.parametrize("group_steps", [1, 2, 3, 64])
@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("ramp", [False, True])
def test_groups_cover_every_step_once(group_steps: int, drop: bool, ramp: bool) -> None:
    feed = _feed(drop=drop)
    bounds = groups(feed.plan, 0, group_steps, ramp)
    steps = [s for first, stop in bounds for s in range(first, stop)]
    assert steps == list(range(feed.plan.steps))
    # A short last batch is always alone in its group.
    for first, stop in bounds:
        assert len({feed.plan.batch_rows(s) for s in range(first, stop)}) == 1


def test_epoch_is_taken_at_first_request_not_at_call() -> None:
    feed = _feed()
    unused = feed()  # an iterator that is never read (like Keras' extra one) uses no epoch
    first = _batches(feed)
    second = _batches(feed)
    del unused
    plan = feed.plan
    np.testing.assert_array_equal(
        np.concatenate([b["a"] for b in first]), plan.indices(0, 0, plan.steps)
    )
    np.testing.assert_array_equal(
        np.concatenate([b["a"] for b in second]), plan.indices(1, 0, plan.steps)
    )


def _reader_threads() -> int:
    return sum(t.name.startswith("arrayfeed-read") for t in threading.enumerate())


def test_group_indices_go_into_recycled_buffers() -> None:
    # Beside TensorFlow (which lowers glibc's mmap threshold) a fresh index array per group is a
    # fresh mmap: once a group's buffers are released, the next group reuses all of them.
    feed = _feed(n=5000, batch=8, num_threads=1)
    feed.group_steps = 16
    feed.read_group(0, 0, 16)
    fresh, reused = feed.pool.fresh, feed.pool.reused
    assert fresh == 3  # two leaves and the indices
    for first in range(0, 320, 16):
        group = feed.read_group(1, first, first + 16)
        rows = feed.plan.indices(1, first, first + 16).reshape(16, 8)
        np.testing.assert_array_equal(group["a"], rows)
        del group  # released before the next group is read
    assert feed.pool.fresh == fresh and feed.pool.reused == reused + 3 * 20


def test_abandoned_epoch_shuts_its_threads_down() -> None:
    _wait_for_no_reader_threads()  # (those of passes read ahead by tests before end on their own)
    for _ in range(20):
        it = _feed(n=5000, batch=8)()
        next(it)
        assert _reader_threads() > 0
        it.close()
    assert _reader_threads() == 0


def test_large_batches_are_yielded_one_at_a_time_without_a_group_axis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 1 << 20)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 1 << 20)
    n = 200  # batches of 128 rows of 12 KiB: 1.5 MiB, more than a group
    images = (np.arange(n * 64 * 64 * 3) % 251).astype(np.uint8).reshape(n, 64, 64, 3)
    leaves, treedef = flatten((images, np.arange(n)), lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=n, batch_size=128, seed=0)
    for fn in (None, lambda b: (b[0][:, ::2], b[1])):
        feed = Feed([ArraySource(v) for v in leaves], treedef, plan, map_batch=fn)  # type: ignore[arg-type]
        assert not feed.stacked
        got = list(feed())
        assert [g[0].shape[0] for g in got] == [128, 72]
        for xb, yb in got:
            np.testing.assert_array_equal(xb, images[yb][:, :: 1 if fn is None else 2])


def test_groups_are_sized_on_what_is_read_even_when_map_batch_shrinks_rows() -> None:
    n = 3000
    images = np.zeros((n, 64, 64, 3), np.uint8)
    _, treedef = flatten(images, lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=n, batch_size=256, seed=0)
    plain = Feed([ArraySource(images)], treedef, plan, map_batch=lambda b: b)
    shrunk = Feed(
        [ArraySource(images)], treedef, plan, map_batch=lambda b: b[:, 0, 0, :1].astype(np.float32)
    )
    assert shrunk.group_steps == plain.group_steps <= 6  # ~16 MiB of 12 KiB rows, not 1024 steps


@pytest.mark.parametrize(("threads", "steps"), [(1, 16), (2, 16), (4, 12), (7, 8), (16, 4)])
def test_groups_of_cheap_reads_are_larger_when_few_threads_read_ahead(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, threads: int, steps: int
) -> None:
    # Batches of 4 KiB; groups of at least 16 KiB, at most 64 KiB, and 256 KiB read ahead.
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 16 << 10)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 64 << 10)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.READ_AHEAD_BYTES", 256 << 10)
    rows = np.zeros((2000, 1024), np.uint8)
    _, treedef = flatten(rows, lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=len(rows), batch_size=4, seed=0)
    cheap = Feed([ArraySource(rows)], treedef, plan, num_threads=threads)
    assert cheap.group_steps == steps
    # A map_batch, or a leaf that reads whole chunks: the smallest groups, whatever the threads.
    mapped = Feed([ArraySource(rows)], treedef, plan, num_threads=threads, map_batch=lambda b: b)
    assert mapped.group_steps == 4
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rows, chunks=(100, 1024), compression="lzf")
    with h5py.File(path, "r") as f:
        chunked = Feed([as_source(f["x"], "x")], treedef, plan, num_threads=threads)
        assert chunked.group_steps == 4


@pytest.mark.parametrize(
    ("cores", "memory_gib", "cap"), [(2, 24, 4), (4, 24, 4), (16, 128, 19), (16, 4, 4)]
)
def test_tuned_threads_may_read_ahead_more_on_many_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, memory_gib: int, cap: int
) -> None:
    # Groups of 17 batches of 3 MiB (51 MiB: a fifth of the 256 MiB read ahead by default). On
    # 16 cores tuning may read 1 GiB ahead (64 MiB per core): 19 groups and the one requested;
    # not with 4 GiB of memory (a sixteenth of it, 256 MiB, is less).
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.usable_cores", lambda: cores)
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.usable_memory", lambda: memory_gib << 30)
    rows = np.zeros((40_000, 12_288), np.uint8)  # untouched zero pages
    _, treedef = flatten(rows, lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=len(rows), batch_size=256)
    tuned = Feed([ArraySource(rows)], treedef, plan)
    assert tuned.group_steps == 17
    assert tuned.tuner.cap == cap
    fixed = Feed([ArraySource(rows)], treedef, plan, num_threads=4)
    assert (fixed.group_steps, fixed.tuner.cap) == (17, 4)
    # Groups of other reads are 16 MiB at most (here 15 MiB), and the 256 MiB read ahead on any
    # machine holds 16 of them and the one requested.
    mapped = Feed([ArraySource(rows)], treedef, plan, map_batch=lambda b: b)
    assert (mapped.group_steps, mapped.tuner.cap) == (5, 16)


def test_the_tuner_knows_how_many_groups_a_block_shuffle_decodes_ahead(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # After a move, the tuner leaves out the groups of the window decoded ahead (6 here).
    rows = np.arange(6000 * 64, dtype=np.uint8).reshape(6000, 64)
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rows, chunks=(100, 64), compression="gzip")
    with h5py.File(path, "r") as f:
        block = af.batches(f["x"], batch_size=50, shuffle="block", seed=0, processes=0)._feed
        plan = block.plan
        window = min(plan.block_rows * plan.window_blocks, plan.rows_per_epoch)
        group = block.group_steps * plan.batch_size
        assert block.tuner.ahead == -(-window // group)
        full = af.batches(f["x"], batch_size=50, seed=0, processes=0)._feed
        assert full.tuner.ahead == 0
        # Groups of one batch (a slow map_batch, say): no more than the groups in flight at the
        # cap, or a move would leave out whole passes.
        monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 1)
        tiny = af.batches(f["x"], batch_size=50, shuffle="block", seed=0, processes=0)._feed
        assert tiny.group_steps == 1 and plan.block_rows * plan.window_blocks // 50 > 100
        assert tiny.tuner.ahead == tiny.tuner.cap + 1
    assert af.batches(rows, batch_size=50, shuffle="block", seed=0)._feed.tuner.ahead == 0


def test_the_buffer_pool_keeps_every_group_in_flight_at_any_thread_count() -> None:
    # 16 threads reading ahead 17 groups of 15 MiB, and those TensorFlow holds: more than the
    # pool's 256 MiB floor, so the pool grows with them (a fresh 15 MiB buffer page-faults).
    rows = np.zeros((40_000, 12_288), np.uint8)  # untouched zero pages
    _, treedef = flatten(rows, lambda v: isinstance(v, np.ndarray))
    feed = Feed(
        [ArraySource(rows)], treedef, Plan(n_rows=len(rows), batch_size=256), num_threads=16
    )
    group = feed.group_steps * 256 * 12_288
    assert feed.pool.max_bytes >= (16 + 5) * group > 256 << 20


def test_map_batch_may_add_drop_and_change_leaves() -> None:
    feed = _feed(map_batch=lambda b: ({"sum": b["a"] + b["b"]}, (b["a"] % 2).astype(np.bool_)))
    batches = list(feed())
    x, y = batches[0]
    assert x["sum"].dtype == np.float64 and y.dtype == np.bool_
    assert [s.dtype for s in feed.specs] == [np.dtype("float64"), np.dtype("bool")]


def test_map_batch_is_called_once_per_batch_with_whole_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sizes: list[int] = []
    lock = threading.Lock()

    def fn(b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with lock:
            sizes.append(len(b["a"]))
        return b

    # (A short pass maps the next epoch's first batches too, read ahead: not here.)
    monkeypatch.setattr("arrayfeed._pipeline.read.readers.FOLLOW_SECONDS", 0.0)
    feed = _feed(n=50, batch=8, map_batch=fn)
    sizes.clear()  # drop the probe call
    for _ in range(2):
        list(feed())
        assert sorted(sizes) == sorted([8] * 6 + [2])
        sizes.clear()


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda b: b["a"][:3], r"has shape \(3,\), but the batch has 8 rows"),
        (lambda b: np.float64(1.0), "keep the batch size"),
        (lambda b: 1 / 0, "raised ZeroDivisionError"),
        (lambda b: "text", "map_batch"),
    ],
)
def test_map_batch_errors_at_construction(fn: object, match: str) -> None:
    with pytest.raises(af.MapBatchError, match=match):
        _feed(map_batch=fn)


def test_map_batch_that_changes_later_is_named() -> None:
    calls = {"n": 0}

    def fn(b: dict[str, np.ndarray]) -> object:
        calls["n"] += 1
        if calls["n"] > 2:
            return b["a"].astype(np.float32)
        return b["a"]

    feed = _feed(map_batch=fn, num_threads=1)
    with pytest.raises(af.MapBatchError, match="same row shapes and dtypes"):
        list(feed())


def test_default_threads_follow_the_cpu_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    from arrayfeed._pipeline.read import feed as feed_module

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert feed_module.default_num_threads() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert feed_module.default_num_threads() == feed_module.READ_THREADS == 4
    assert feed_module.default_num_threads(mapped=True) == feed_module.MAP_THREADS == 8


def test_default_threads_are_more_when_map_batch_runs_in_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert _feed().num_threads == 4
    assert _feed(map_batch=lambda b: b).num_threads == 8
    assert _feed(map_batch=lambda b: b, num_threads=3).num_threads == 3


def test_a_slow_map_batch_is_mapped_batch_by_batch_on_every_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Groups shrink to one batch when map_batch is slow, so N threads map N batches at once."""
    import time

    x = np.zeros((64 * 12, 4), np.float32)
    active, peak, lock = [0], [0], threading.Lock()

    def slow(batch: np.ndarray) -> np.ndarray:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return batch

    sources = [ArraySource(x)]
    _, treedef = flatten(x, lambda o: isinstance(o, np.ndarray), "x")
    plan = Plan(n_rows=len(x), batch_size=64, shuffle="none")
    feed = Feed(sources, treedef, plan, map_batch=slow, num_threads=3)
    assert feed.group_steps == 1
    batches = list(feed.epoch(0))
    assert len(batches) == 12 and peak[0] == 3
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_MAP_SECONDS", 60.0)  # any map is cheap
    cheap = Feed(sources, treedef, plan, map_batch=lambda b: b + 1, num_threads=3)
    assert cheap.group_steps == 12  # groups sized by bytes: the whole epoch (a group is no more)


def _record_reads(feed: Feed) -> list[tuple[int, int]]:
    """``(epoch, first_step)`` of every group the feed reads from now on."""
    reads: list[tuple[int, int]] = []
    lock, read = threading.Lock(), feed.read_group

    def recorded(epoch: int, first: int, stop: int, *args: object, **kwargs: object) -> object:
        with lock:
            reads.append((epoch, first))
        return read(epoch, first, stop, *args, **kwargs)  # type: ignore[arg-type]

    feed.read_group = recorded  # type: ignore[method-assign]
    return reads


def _ids(batches: list[dict[str, np.ndarray]]) -> np.ndarray:
    return np.concatenate([b["a"] for b in batches])


def _wait_for_no_reader_threads(seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while _reader_threads() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _reader_threads() == 0


def test_a_short_pass_reads_the_next_epochs_first_groups_as_it_ends() -> None:
    """Every pass starts with nothing in flight; a short one reads the next epoch's first groups
    while its last are taken. The stream is the same, and no group is read twice."""
    feed = _feed(n=500, batch=8, num_threads=2)
    feed.group_steps = 4  # 63 steps (the last of 4 rows): 17 groups
    reads = _record_reads(feed)
    plan = feed.plan
    for epoch in range(3):
        np.testing.assert_array_equal(_ids(_batches(feed)), plan.indices(epoch, 0, plan.steps))
        after = feed.ahead.held
        if epoch == 0:  # the first pass reads none ahead: how long an epoch takes is not known
            assert after is None
            continue
        assert after is not None and (after.epoch, after.start_step) == (epoch + 1, 0)
        assert 1 <= len(after.pending) <= 3  # as many as in flight: 2 threads and one more
        steps, first = after.pending[0]
        assert steps == 4
        np.testing.assert_array_equal(
            first.result(timeout=10)["a"].ravel(), plan.indices(epoch + 1, 0, 4)
        )
    _wait_for_no_reader_threads()  # the threads end once the groups read ahead are read
    assert sorted(reads) == sorted(set(reads))  # each group once: those read ahead were taken
    epochs = {e for e, _ in reads}
    assert epochs == {0, 1, 2, 3}
    assert feed.ahead.last_seconds is not None and feed.ahead.last_seconds < 2
    assert {f for e, f in reads if e in (1, 2)} == {*range(0, 62, 4), 62}  # (62: 4 rows)
    assert {f for e, f in reads if e == 0} == {0, 1, 2, *range(4, 62, 4), 62}  # the first ramps
    assert {f for e, f in reads if e == 3} <= {0, 4, 8}


def test_a_pass_read_ahead_is_dropped_when_the_feed_moves() -> None:
    feed = _feed(n=500, batch=8, num_threads=2)
    feed.group_steps = 4
    plan = feed.plan
    _batches(feed), _batches(feed)
    held = feed.ahead.held
    assert held is not None and (held.epoch, held.start_step) == (2, 0)
    feed.seek(2, 8)  # the epoch read ahead, but not from its start: dropped, its reads ended
    assert feed.ahead.held is None and held._pool.alive == 0
    assert all(f.done() for _, f in held.pending)
    np.testing.assert_array_equal(_ids(_batches(feed)), plan.indices(2, 8, plan.steps))
    assert feed.ahead.held is not None and feed.ahead.held.epoch == 3
    feed.seek(3)  # the one read ahead: kept, and taken
    held = feed.ahead.held
    assert held is not None and held.epoch == 3
    np.testing.assert_array_equal(_ids(_batches(feed)), plan.indices(3, 0, plan.steps))
    feed.seek(7, 1)
    np.testing.assert_array_equal(_ids(_batches(feed)), plan.indices(7, 1, plan.steps))


def test_a_pass_reads_ahead_only_the_epoch_its_feed_takes_next() -> None:
    """Two iterators: the first takes epoch 1, the second epoch 2 before the first ends, so
    the first reads nothing ahead (epoch 2 is taken); the second reads epoch 3 ahead."""
    feed = _feed(n=500, batch=8, num_threads=2)
    feed.group_steps = 4
    plan = feed.plan
    _batches(feed)  # epoch 0: a pass has ended, so passes know how long one takes
    first, second = feed(), feed()
    a, b = [next(first)], [next(second)]
    a += list(first)
    assert feed.ahead.held is None
    b += list(second)
    held = feed.ahead.held
    assert held is not None and (held.epoch, held.start_step) == (3, 0)
    for taken, epoch in ((a, 1), (b, 2)):
        ids = np.concatenate([g["a"].reshape(-1) for g in taken])
        np.testing.assert_array_equal(ids, plan.indices(epoch, 0, plan.steps))


def test_an_error_reading_ahead_is_raised_in_the_epoch_it_belongs_to() -> None:
    """The first group of epoch 2, read ahead while epoch 1 ends, fails: epoch 1 ends as it
    should, and epoch 2 raises the error at its first group."""
    x = np.arange(500)
    calls = [0]
    fail_at = 19 + 17 + 1  # one thread reads in order: 17 groups an epoch (the first ramps: 19)

    class Fails(ArraySource):
        def gather_into(self, indices: np.ndarray, out: np.ndarray) -> None:
            calls[0] += 1
            if calls[0] == fail_at:
                raise OSError("the disk went away")
            super().gather_into(indices, out)

    _, treedef = flatten({"a": x}, lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=500, batch_size=8, seed=1)
    feed = Feed([Fails(x)], treedef, plan, num_threads=1)  # groups read in order
    feed.group_steps = 4
    for epoch in range(2):
        np.testing.assert_array_equal(_ids(_batches(feed)), plan.indices(epoch, 0, plan.steps))
    held = feed.ahead.held
    assert held is not None and held.epoch == 2
    held.pending[0][1].exception(timeout=10)  # it failed already, before epoch 2 was asked for
    assert calls[0] >= fail_at
    with pytest.raises(OSError, match="the disk went away"):
        next(feed())
    np.testing.assert_array_equal(_ids(_batches(feed)), plan.indices(3, 0, plan.steps))


def test_a_long_pass_reads_no_epoch_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passes longer than FOLLOW_SECONDS end with their threads, holding nothing."""
    monkeypatch.setattr("arrayfeed._pipeline.read.readers.FOLLOW_SECONDS", 0.0)
    feed = _feed(n=500, batch=8, num_threads=2)
    feed.group_steps = 4
    reads = _record_reads(feed)
    for epoch in range(2):
        np.testing.assert_array_equal(
            _ids(_batches(feed)), feed.plan.indices(epoch, 0, feed.plan.steps)
        )
        assert feed.ahead.held is None
        assert _reader_threads() == 0  # ended with the pass, not later
    assert {e for e, _ in reads} == {0, 1} and len(reads) == 19 + 17  # (the first pass ramps)


def test_an_epoch_cut_short_drops_the_pass_read_ahead() -> None:
    feed = _feed(n=500, batch=8, num_threads=2)
    feed.group_steps = 4
    _batches(feed)  # epoch 0
    reads = _record_reads(feed)
    it = feed()
    taken = [next(it) for _ in range(17)]  # every group: the next epoch is read ahead now
    assert len(taken) == 17
    deadline = time.monotonic() + 10
    while (2, 0) not in reads:
        assert time.monotonic() < deadline, reads
        time.sleep(0.001)
    it.close()  # but the epoch was not finished (no StopIteration)
    assert feed.ahead.held is None
    assert _reader_threads() == 0
    np.testing.assert_array_equal(_ids(_batches(feed)), feed.plan.indices(2, 0, feed.plan.steps))


def test_a_file_changed_between_epochs_drops_what_was_read_ahead(tmp_path: Path) -> None:
    """The epoch after a change raises at its start; the groups read ahead from the file as it
    was are dropped then, never yielded (PassAhead.drop)."""
    np.save(tmp_path / "x.npy", np.arange(500))
    b = af.batches(str(tmp_path / "x.npy"), batch_size=8, seed=0, processes=0)
    feed = b._feed
    feed.group_steps = 4
    for _ in range(2):
        assert sorted(int(i) for batch in b for i in batch) == list(range(500))
    held = feed.ahead.held
    assert held is not None and held.epoch == 2
    np.save(tmp_path / "x.npy", np.arange(501))  # another size: a changed file
    with pytest.raises(af.CorruptDataError, match="changed since arrayfeed opened it"):
        next(iter(b))
    assert feed.ahead.held is None and held._pool.alive == 0
