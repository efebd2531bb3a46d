"""An epoch's indices computed in blocks: the same indices as the plan, each block once."""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayfeed as af
from arrayfeed._pipeline.plan import indexblocks
from arrayfeed._pipeline.plan.indexblocks import EpochIndices, groups, ramp_sizes
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._pipeline.read.structure import flatten
from arrayfeed._storage import as_source


def _plan(n: int, count: int, batch: int, drop: bool, shuffle: str) -> Plan | None:
    """The last worker's plan, or None when it has no batch."""
    try:
        return Plan(
            n_rows=n,
            batch_size=batch,
            drop_remainder=drop,
            shuffle=shuffle,  # type: ignore[arg-type]
            seed=7,
            shard=af.Shard(count, count - 1),
            block_rows=13,
            window_blocks=3,
        )
    except af.ConfigError:
        return None


plans = st.builds(
    _plan,
    n=st.integers(1, 3000),
    count=st.integers(1, 3),
    batch=st.integers(1, 40),
    drop=st.booleans(),
    shuffle=st.sampled_from(["none", "full", "block"]),
)


@settings(max_examples=150, deadline=None)
@given(
    plan=plans,
    group=st.integers(1, 9),
    block_positions=st.integers(1, 500),
    start_frac=st.floats(0, 1),
    epoch=st.integers(0, 5),
)
def test_groups_of_blocks_are_the_plans_indices(
    plan: Plan | None, group: int, block_positions: int, start_frac: float, epoch: int
) -> None:
    if plan is None:
        return  # no batch on this worker
    batch = plan.batch_size
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexblocks, "BLOCK_POSITIONS", block_positions)
        start = int(start_frac * (plan.steps - 1))
        blocks = EpochIndices(plan, epoch, start, group)
    # Blocks are whole groups, one group first, then growing, never above the largest size.
    sizes = [hi - lo for lo, hi in map(blocks.span, range(len(blocks.starts)))]
    most = max(1, block_positions // (group * batch)) * group
    assert blocks.starts[0] == start and sizes[0] == min(group, plan.steps - start)
    assert all(s % group == 0 and s <= most for s in sizes[:-1])
    assert sum(sizes) == plan.steps - start
    got = [blocks.get(lo, hi) for lo, hi in groups(plan, start, group, ramp=False)]
    assert all(not g.flags.writeable for g in got)
    np.testing.assert_array_equal(np.concatenate(got), plan.indices(epoch, start, plan.steps))


@settings(max_examples=150, deadline=None)
@given(
    plan=plans,
    group=st.integers(1, 40),
    block_positions=st.integers(1, 500),
    start_frac=st.floats(0, 1),
)
def test_a_ramping_pass_splits_its_first_group_and_reads_the_same_indices(
    plan: Plan | None, group: int, block_positions: int, start_frac: float
) -> None:
    if plan is None:
        return
    start = int(start_frac * (plan.steps - 1))
    whole = groups(plan, start, group, ramp=False)
    ramped = groups(plan, start, group, ramp=True)
    # The same steps in the same order; the first whole group split 1, 1, 2, 4, ...; the rest
    # unchanged.
    assert [s for a, b in ramped for s in range(a, b)] == [s for a, b in whole for s in range(a, b)]
    split = [g for g in ramped if g[1] <= whole[0][1]]
    assert ramped[len(split) :] == whole[1:]
    sizes = [b - a for a, b in split]
    ramp = ramp_sizes(group)
    if sizes:  # (the last may be cut short where the epoch's whole batches end)
        assert sizes[:-1] == ramp[: len(sizes) - 1] and 0 < sizes[-1] <= ramp[len(sizes) - 1]
    if whole[0][1] - whole[0][0] > 1:
        assert ramped[0] == (start, start + 1)  # the first batch waits for one batch's indices
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexblocks, "BLOCK_POSITIONS", block_positions)
        blocks = EpochIndices(plan, 3, start, group, ramp=True)
    got = [blocks.get(lo, hi) for lo, hi in ramped]  # each group inside one block
    np.testing.assert_array_equal(np.concatenate(got), plan.indices(3, start, plan.steps))


def test_each_block_is_computed_once_however_many_threads_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = Plan(n_rows=100_000, batch_size=16, seed=3)
    calls: list[tuple[int, int | None]] = []
    lock = threading.Lock()
    original = Plan.indices

    def counted(
        self: Plan, epoch: int, first: int, stop: int | None = None, out: Any = None
    ) -> Any:
        with lock:
            calls.append((first, stop))
        return original(self, epoch, first, stop, out)

    monkeypatch.setattr(Plan, "indices", counted)
    monkeypatch.setattr(indexblocks, "BLOCK_POSITIONS", 2048)
    blocks = EpochIndices(plan, 2, 0, 4)
    parts = []
    with ThreadPoolExecutor(8) as pool:
        for block in range(len(blocks.starts) + 1):  # and one past the end: nothing to compute
            ready = threading.Barrier(8)

            def ask(_: int, block: int = block, ready: threading.Barrier = ready) -> Any:
                ready.wait()  # eight threads at once: the first computes, the others wait
                return blocks.compute(block)

            got = list(pool.map(ask, range(8)))
            if block == len(blocks.starts):
                assert all(len(g) == 0 for g in got)
            else:
                assert all(g is got[0] for g in got)
                lo, hi = blocks.span(block)
                parts += [blocks.get(*g) for g in groups(plan, 0, 4, ramp=False) if lo <= g[0] < hi]
    np.testing.assert_array_equal(np.concatenate(parts), original(plan, 2, 0, plan.steps))
    assert len(calls) == len(set(calls)) == len(blocks.starts)


def test_a_failing_block_raises_in_every_reader_that_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = Plan(n_rows=1000, batch_size=10, seed=0)
    gate = threading.Event()

    def broken(*args: Any, **kwargs: Any) -> Any:
        gate.wait(5)
        raise MemoryError("no room for indices")

    monkeypatch.setattr(Plan, "indices", broken)
    blocks = EpochIndices(plan, 0, 0, 100)  # one block: every group waits for the same one
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(blocks.get, 0, 10) for _ in range(4)]
        gate.set()
        for future in futures:
            with pytest.raises(MemoryError, match="no room"):
                future.result()


def test_a_group_across_two_blocks_is_refused() -> None:
    blocks = EpochIndices(Plan(n_rows=1000, batch_size=10, seed=0), 0, 0, 2)
    with pytest.raises(ValueError, match="not inside one block"):
        blocks.get(1, 3)


def test_a_feed_computes_indices_block_by_block_into_recycled_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20,000 rows in groups of 4 batches of 16: blocks of up to 1,024 positions (16 groups)
    # instead of one index computation per group, and the same batches as the plan's.
    monkeypatch.setattr(indexblocks, "BLOCK_POSITIONS", 1024)
    x = np.arange(20_000, dtype=np.int64)
    _, treedef = flatten(x, lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=len(x), batch_size=16, seed=5)
    feed = Feed([as_source(x, "x")], treedef, plan, num_threads=2)
    feed.group_steps = 4
    expected = [plan.indices(epoch, 5, plan.steps) for epoch in range(3)]
    calls = _count_indices(monkeypatch)
    for epoch in range(3):
        got = np.concatenate([g.reshape(-1) for g in feed.epoch(epoch, start_step=5)])
        np.testing.assert_array_equal(got, expected[epoch])
    count = len(groups(plan, 5, 4, ramp=False))
    assert len(calls) <= 3 * (count // 16 + 6 + 3)  # 1, 2, 4, 8 groups, then 16 at a time
    # (+3: the first pass ramps, 1, 1, 2 steps)
    feed = Feed([as_source(x, "x")], treedef, plan, num_threads=1)  # one order of events
    feed.group_steps = 4
    for _ in feed.epoch(0):  # each group let go before the next
        pass
    fresh = feed.pool.fresh
    for epoch in (1, 2):
        for _ in feed.epoch(epoch):
            pass
    assert feed.pool.fresh == fresh  # index blocks and groups reuse the pool's buffers


@settings(max_examples=40, deadline=None)
@given(
    plan=plans,
    threads=st.integers(1, 4),
    group=st.integers(1, 5),
    block_positions=st.integers(1, 200),
    start_frac=st.floats(0, 1),
)
def test_a_feed_reading_small_blocks_on_threads_yields_the_plans_batches(
    plan: Plan | None, threads: int, group: int, block_positions: int, start_frac: float
) -> None:
    if plan is None:
        return  # no batch on this worker
    n = plan.n_rows
    x = np.arange(n, dtype=np.int64)
    _, treedef = flatten(x, lambda v: isinstance(v, np.ndarray))
    feed = Feed([as_source(x, "x")], treedef, plan, num_threads=threads)
    feed.group_steps = group
    start = int(start_frac * (plan.steps - 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(indexblocks, "BLOCK_POSITIONS", block_positions)
        got = [g.reshape(-1).copy() for g in feed.epoch(4, start_step=start)]
    np.testing.assert_array_equal(np.concatenate(got), plan.indices(4, start, plan.steps))


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_a_block_that_fails_ahead_of_need_fails_the_epoch(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    monkeypatch.setattr(indexblocks, "BLOCK_POSITIONS", 256)
    x = np.arange(5000, dtype=np.int64)
    _, treedef = flatten(x, lambda v: isinstance(v, np.ndarray))
    plan = Plan(n_rows=len(x), batch_size=16, seed=5)
    feed = Feed([as_source(x, "x")], treedef, plan, num_threads=threads)
    feed.group_steps = 2
    original = Plan.indices

    def broken(self: Plan, epoch: int, first: int, *args: Any, **kwargs: Any) -> Any:
        if first >= 100:
            raise MemoryError("no room for indices")
        return original(self, epoch, first, *args, **kwargs)

    monkeypatch.setattr(Plan, "indices", broken)
    steps = 0
    with pytest.raises(MemoryError, match="no room"):
        for group in feed.epoch(0):
            steps += len(group)  # batches stacked in the group
    starts = EpochIndices(plan, 0, 0, 2, ramp=True).starts  # (a feed's first pass ramps)
    assert steps == next(s for s in starts if s >= 100)  # every batch before the broken block


def test_blocks_of_every_size_reuse_one_size_of_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    # Blocks of 1, 2, 4, ... 64 steps: each in a buffer of the largest block's size, so a pool
    # that matches buffers by size reuses them while the consumer keeps a few recent batches.
    monkeypatch.setattr(indexblocks, "BLOCK_POSITIONS", 1024)
    x = np.arange(100_000, dtype=np.int64)
    _, treedef = flatten(x, lambda v: isinstance(v, np.ndarray))
    feed = Feed([as_source(x, "x")], treedef, Plan(n_rows=len(x), batch_size=16), num_threads=1)
    feed.group_steps = 1

    def run(epoch: int) -> None:
        kept: deque[Any] = deque(maxlen=5)
        for batch in feed.epoch(epoch):
            kept.append(batch)

    run(0)
    fresh = feed.pool.fresh
    run(1)
    run(2)
    assert feed.pool.fresh == fresh


def test_a_finished_block_is_not_computed_again_ahead_of_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan = Plan(n_rows=1000, batch_size=10, seed=0)
    blocks = EpochIndices(plan, 0, 0, 2)
    calls = _count_indices(monkeypatch)
    lo, hi = blocks.span(1)
    for first in range(lo, hi, 2):  # every group of block 1
        blocks.get(first, first + 2)
    blocks.prepare(1)  # late: already handed out
    blocks.prepare(2)
    blocks.prepare(2)  # computed once
    assert [args[1] for args in calls] == [lo, hi]


def _count_indices(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The arguments of every ``Plan.indices`` call from now on (after ``self``)."""
    calls: list[tuple[Any, ...]] = []
    original = Plan.indices

    def counted(self: Plan, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Plan, "indices", counted)
    return calls


def test_a_start_or_a_resume_waits_for_one_batchs_indices_later_epochs_take_whole_groups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first pass of a dataset, and the first after a resume on another number of workers,
    compute one batch's indices before the first batch (a shuffle of millions of rows costs
    one batch, not a group of thousands), and nothing else: work ahead of it would take the
    interpreter from it; later passes read whole groups."""
    x = np.arange(400_000, dtype=np.int64)
    computed: list[tuple[int, int, int]] = []
    done: list[int] = []  # how many had begun when each ended
    original = Plan.indices

    def recorded(self: Plan, epoch: int, first: int, stop: int, *args: Any, **kw: Any) -> Any:
        computed.append((epoch, first, stop))
        try:
            return original(self, epoch, first, stop, *args, **kw)
        finally:
            done.append(len(computed))

    monkeypatch.setattr(Plan, "indices", recorded)
    options: dict[str, Any] = dict(batch_size=64, seed=3, processes=0, num_threads=2)
    old = af.batches(x, shard=af.Shard(4, 1), **options)
    group = old._feed.group_steps
    assert group >= 64  # small rows: large groups
    first = next(iter(old))
    assert computed[0] == (0, 0, 1) and done[0] == 1  # nothing planned or read beside it
    np.testing.assert_array_equal(first, x[old._feed.plan.indices(0, 0, 1)])
    computed.clear()
    list(old)  # a later pass: whole groups
    assert computed[0] == (1, 0, group)
    state = af.state(old, 0, len(old) // 3)
    new = af.batches(x, shard=af.Shard(3, 2), resume=state, **options)
    computed.clear()
    done.clear()
    epoch, step = new._feed.next_position
    resumed = next(iter(new))
    assert computed[0] == (epoch, step, step + 1) and done[0] == 1
    np.testing.assert_array_equal(resumed, x[new._feed.plan.indices(epoch, step, step + 1)])


def _readers_alive() -> int:
    return sum(t.name.startswith("arrayfeed-read") for t in threading.enumerate())


@pytest.mark.parametrize("resume", [False, True])
def test_a_start_starts_its_reader_threads_while_its_first_group_is_read(
    monkeypatch: pytest.MonkeyPatch, resume: bool
) -> None:
    """A thread started when the rest is asked for (after the first group, before it is handed
    over) would take the interpreter from the consumer waiting for it: the threads the tuner
    asks for are all running before the first group's indices are done."""
    x = np.arange(400_000, dtype=np.int64)
    options: dict[str, Any] = dict(batch_size=64, seed=3, processes=0, num_threads=3)
    data = af.batches(x, shard=af.Shard(3, 1), **options)
    if resume:
        state = af.state(data, 0, len(data) // 3)  # on 3 workers, resumed on 2
        data = af.batches(x, shard=af.Shard(2, 1), resume=state, **options)
    original = Plan.indices
    seen: list[bool] = []

    def first_waits(self: Plan, *args: Any, **kw: Any) -> Any:
        if not seen:  # the first group: its pass's other threads start meanwhile (or never)
            deadline = time.monotonic() + 10
            while _readers_alive() < 3 and time.monotonic() < deadline:
                time.sleep(0.001)
            seen.append(_readers_alive() >= 3)
        return original(self, *args, **kw)

    gc.collect()
    deadline = time.monotonic() + 10
    while _readers_alive() and time.monotonic() < deadline:  # (datasets dropped before)
        time.sleep(0.001)
    assert _readers_alive() == 0
    monkeypatch.setattr(Plan, "indices", first_waits)
    epoch, step = data._feed.next_position
    first = next(iter(data))
    assert seen == [True]
    np.testing.assert_array_equal(first, x[data._feed.plan.indices(epoch, step, step + 1)])
