"""The rest of an epoch re-dealt over another sharding: pure planning, simulated workers.

A job is simulated as plans: the workers of each sharding take their steps of the epoch through
``Plan.indices``, then the next sharding takes over with ``Plan.resumed``. Every row the epoch
had is taken once over all of them, but for what an uninterrupted epoch leaves out and fewer
than ``workers x batch_size`` rows per resume; every worker of a sharding runs the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrayfeed._pipeline.plan.elastic import Segment, first_step, quota, remaining
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.plan.shard import Shard
from arrayfeed._pipeline.read.blocks import WindowCache
from arrayfeed._storage import as_source

MODES = ["none", "full", "block"]
EPOCH = 5


@dataclass(frozen=True)
class Sharding:
    workers: int
    batch_size: int
    drop_remainder: bool = False
    #: Fraction of its steps it takes before the next one takes over (the last takes all).
    stop_at: float = 1.0


def plans(n: int, s: Sharding, mode: str, layout: tuple[int, int]) -> list[Plan]:
    return [
        Plan(
            n_rows=n,
            batch_size=s.batch_size,
            shard=Shard(s.workers, k),
            drop_remainder=s.drop_remainder,
            shuffle=mode,
            seed=11,
            block_rows=layout[0],
            window_blocks=layout[1],
        )
        for k in range(s.workers)
    ]


def fits(n: int, s: Sharding) -> bool:
    rows = n // s.workers
    return rows >= 1 and (not s.drop_remainder or rows >= s.batch_size)


def run_job(
    n: int, shardings: list[Sharding], mode: str, layout: tuple[int, int] = (7, 3)
) -> tuple[list[np.ndarray], np.ndarray, int]:
    """Epoch ``EPOCH`` run by ``shardings`` one after the other: the rows every worker of every
    sharding took (one array per worker), the rows of the uninterrupted epoch, and the rows the
    resumes may leave out."""
    first = plans(n, shardings[0], mode, layout)
    whole = np.concatenate([p.indices(EPOCH, 0, p.steps) for p in first])
    taken: list[np.ndarray] = []
    segments: list[Segment] = []
    allowance = 0
    current = first
    start = (EPOCH, 0)
    for i, s in enumerate(shardings):
        if i:
            resumed = [p.resumed(EPOCH, segments) for p in plans(n, s, mode, layout)]
            assert len({position for _, position in resumed}) == 1  # the same on every worker
            current = [p for p, _ in resumed]
            start = resumed[0][1]
            allowance += s.workers * s.batch_size
        steps = current[0].steps
        if start[0] != EPOCH:  # nothing was left to take
            break
        last = i == len(shardings) - 1
        stop = steps if last else start[1] + int((steps - start[1]) * s.stop_at)
        for p in current:  # every worker the same steps
            if stop > start[1]:
                taken.append(p.indices(EPOCH, start[1], stop))
        segments.append(
            Segment(
                workers=s.workers,
                batch_size=s.batch_size,
                drop_remainder=s.drop_remainder,
                steps=stop - start[1],
                block_rows=layout[0],
                window_blocks=layout[1],
            )
        )
    return taken, whole, allowance


def check_exactly_once(taken: list[np.ndarray], whole: np.ndarray, allowance: int) -> None:
    rows = np.concatenate([*taken, np.empty(0, np.int64)])
    assert len(np.unique(rows)) == len(rows), "a row taken twice"
    assert set(rows.tolist()) <= set(whole.tolist()), "a row the epoch did not have"
    assert len(whole) - len(rows) < max(1, allowance), "rows lost beyond the allowance"


sharding = st.builds(
    Sharding,
    workers=st.integers(1, 8),
    batch_size=st.integers(1, 24),
    drop_remainder=st.booleans(),
    stop_at=st.floats(0.0, 1.0),
)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 400),
    shardings=st.lists(sharding, min_size=2, max_size=4),
    mode=st.sampled_from(MODES),
)
def test_every_row_of_the_epoch_once_across_resumes(
    n: int, shardings: list[Sharding], mode: str
) -> None:
    if not all(fits(n, s) for s in shardings):
        return
    check_exactly_once(*run_job(n, shardings, mode))


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 300),
    old=sharding,
    new=sharding,
    layout=st.tuples(st.integers(1, 40), st.integers(1, 5)),
)
def test_a_block_shuffle_rest_reads_whole_windows_through_the_cache(
    n: int, old: Sharding, new: Sharding, layout: tuple[int, int]
) -> None:
    if not (fits(n, old) and fits(n, new)):
        return
    taken, whole, allowance = run_job(n, [old, new], "block", layout)
    check_exactly_once(taken, whole, allowance)
    segment = Segment(
        workers=old.workers,
        batch_size=old.batch_size,
        drop_remainder=old.drop_remainder,
        steps=int(plans(n, old, "block", layout)[0].steps * old.stop_at),
        block_rows=layout[0],
        window_blocks=layout[1],
    )
    data = np.arange(n, dtype=np.int64) * 3
    for plan in plans(n, new, "block", layout):
        plan, (epoch, step) = plan.resumed(EPOCH, [segment])
        if epoch != EPOCH:
            continue
        order = plan.block_order(EPOCH)
        # As a feed sizes it: the windows a batch draws from, and two more.
        capacity = 2 + -(-new.batch_size // (layout[0] * layout[1])) + 1
        cache = WindowCache(as_source(data, "x"), order, capacity=capacity)
        windows = []
        for s in range(step, plan.steps):
            rows = plan.indices(EPOCH, s)
            out = np.empty(len(rows), np.int64)
            cache.gather_into(rows, out)
            np.testing.assert_array_equal(out, data[rows])
            windows.append(order.window_at(s * plan.batch_size))
        assert windows == sorted(windows)  # windows in order: each read once
        assert cache.loads <= sum(len(order.window_blocks(w)[0]) for w in range(order.windows))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drop", [False, True])
def test_the_same_sharding_resumes_the_uninterrupted_stream(mode: str, drop: bool) -> None:
    n, workers, batch = 257, 3, 10
    for k in range(workers):
        plan = plans(n, Sharding(workers, batch, drop), mode, (7, 3))[k]
        for step in range(plan.steps + 1):
            segment = Segment(
                workers=workers,
                batch_size=batch,
                drop_remainder=drop,
                steps=step,
                block_rows=7,
                window_blocks=3,
            )
            resumed, position = plan.resumed(EPOCH, [segment])
            if step == plan.steps:
                assert position == (EPOCH + 1, 0)
                continue
            assert position == (EPOCH, step)
            np.testing.assert_array_equal(
                resumed.indices(EPOCH, step, plan.steps), plan.indices(EPOCH, step, plan.steps)
            )
            np.testing.assert_array_equal(  # later epochs are the plan's own
                resumed.indices(EPOCH + 1, 0, plan.steps), plan.indices(EPOCH + 1, 0, plan.steps)
            )


def test_a_rest_is_the_last_steps_of_the_new_sharding() -> None:
    # 100 rows on 2 workers of batch 4 (50 each: 13 steps, the last of 2 rows), 5 steps taken:
    # 30 + 30 = 60 left; one worker of batch 6 (100 rows: 17 steps, the last of 4 rows) takes
    # 58 of them (4 + 9 * 6), in its last 10 steps.
    segments = [Segment(workers=2, batch_size=4, steps=5)]
    assert remaining(100, segments) == [(20, 50), (70, 100)]
    assert quota(60, 100, 1, 6, False) == 58
    assert first_step(100, segments, Segment(workers=1, batch_size=6)) == 7
    plan = Plan(n_rows=100, batch_size=6, seed=1)
    resumed, position = plan.resumed(3, segments)
    assert position == (3, 7)
    assert [resumed.batch_rows(s) for s in range(7, 17)] == [6] * 9 + [4]
    assert resumed.first_step(3) == 7 and resumed.first_step(4) == 0
    with pytest.raises(ValueError, match="its steps before 7 were taken"):
        resumed.indices(3, 6)


def test_the_rows_read_include_the_rest() -> None:
    segments = [Segment(workers=4, batch_size=5, steps=1)]
    plan = Plan(n_rows=100, batch_size=5, shard=Shard(2, 0), shuffle=False)
    resumed, (_, step) = plan.resumed(0, segments)
    rows = resumed.indices(0, step, resumed.steps)
    start, stop = resumed.bounds
    assert plan.bounds == (0, 50)
    assert start <= rows.min() and rows.max() < stop


@pytest.mark.parametrize(
    ("segments", "match"),
    [
        ([Segment(workers=2, batch_size=4, steps=14)], "the epoch took 14 steps, but it had 13"),
        ([Segment(workers=200, batch_size=4)], "cannot shard 100 rows"),
        (
            [Segment(workers=2, batch_size=4, steps=5), Segment(workers=1, batch_size=6, steps=11)],
            "resumed sharding 1 took 11 steps, but it had 10",
        ),
    ],
)
def test_impossible_histories_are_refused(segments: list[Segment], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        remaining(100, segments)


def test_work_does_not_grow_with_the_rows() -> None:
    segments = [Segment(workers=8, batch_size=256, steps=1000, block_rows=4096, window_blocks=8)]
    plan = Plan(
        n_rows=10**12,
        batch_size=512,
        shard=Shard(3, 1),
        shuffle="block",
        seed=0,
        block_rows=4096,
        window_blocks=8,
    )
    resumed, (epoch, step) = plan.resumed(0, segments)
    assert resumed.rest is not None and len(resumed.rest.pieces) <= 4
    rows = resumed.indices(epoch, step, step + 2)
    assert len(rows) == 1024
