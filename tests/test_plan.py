"""Index plans: shards disjoint and complete, epochs bijective, equal steps, determinism."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayfeed as af
from arrayfeed._pipeline.plan.plan import Plan, shard_bounds


def _epoch(plan: Plan, epoch: int) -> np.ndarray:
    return plan.indices(epoch, 0, plan.steps)


@pytest.mark.parametrize(
    ("n", "count", "expected"),
    [
        (10, 1, [(0, 10)]),
        (10, 2, [(0, 5), (5, 10)]),
        (10, 3, [(0, 3), (3, 6), (6, 10)]),
        (10, 4, [(0, 2), (2, 5), (5, 7), (7, 10)]),
        (3, 3, [(0, 1), (1, 2), (2, 3)]),
        (2, 3, [(0, 0), (0, 1), (1, 2)]),
    ],
)
def test_shard_bounds_table(n: int, count: int, expected: list[tuple[int, int]]) -> None:
    assert [shard_bounds(n, af.Shard(count, k)) for k in range(count)] == expected


plans = st.builds(
    lambda n, count, batch, drop, shuffle, seed, block, window: (
        n,
        count,
        batch,
        drop,
        shuffle,
        seed,
        block,
        window,
    ),
    st.integers(1, 400),
    st.integers(1, 6),
    st.integers(1, 64),
    st.booleans(),
    st.sampled_from(["none", "full", "block"]),
    st.integers(0, 2**63),
    st.integers(1, 40),
    st.integers(1, 5),
)


def _make(
    n: int, count: int, batch: int, drop: bool, shuffle: str, seed: int, block: int, window: int
) -> list[Plan] | None:
    try:
        return [
            Plan(
                n_rows=n,
                batch_size=batch,
                shard=af.Shard(count, k),
                drop_remainder=drop,
                shuffle=shuffle,  # type: ignore[arg-type]
                seed=seed,
                block_rows=block,
                window_blocks=window,
            )
            for k in range(count)
        ]
    except af.ConfigError:
        assert n // count == 0 or (drop and n // count < batch)
        return None


@given(plans, st.integers(0, 5))
@settings(max_examples=300, deadline=None)
def test_epoch_invariants(args: tuple, epoch: int) -> None:  # type: ignore[type-arg]
    n, count, batch, drop, shuffle, _seed, _block, _window = args
    workers = _make(*args)
    if workers is None:
        return
    per_worker = [_epoch(p, epoch) for p in workers]
    # Equal steps on every worker.
    assert len({p.steps for p in workers}) == 1
    # Each worker reads only its own contiguous range, each row at most once.
    for plan, rows in zip(workers, per_worker, strict=True):
        start, stop = plan.bounds
        assert rows.dtype == np.int64
        assert ((rows >= start) & (rows < stop)).all()
        assert len(np.unique(rows)) == len(rows)
        assert len(rows) == sum(plan.batch_rows(s) for s in range(plan.steps))
    # Disjoint and complete up to the documented drop.
    everything = np.concatenate(per_worker)
    assert len(np.unique(everything)) == len(everything)
    dropped_for_equal_length = n - count * (n // count)
    dropped_for_remainder = count * ((n // count) % batch) if drop else 0
    assert len(everything) == n - dropped_for_equal_length - dropped_for_remainder
    assert dropped_for_equal_length < count
    # Without shuffling and without drops, storage order.
    if shuffle == "none":
        for plan, rows in zip(workers, per_worker, strict=True):
            start, _ = plan.bounds
            assert np.array_equal(rows, np.arange(start, start + len(rows)))


@given(plans)
@settings(max_examples=100, deadline=None)
def test_seeking_a_step_equals_slicing_the_epoch(args: tuple) -> None:  # type: ignore[type-arg]
    workers = _make(*args)
    if workers is None:
        return
    plan = workers[-1]
    whole = _epoch(plan, 3)
    for step in range(plan.steps):
        lo = step * plan.batch_size
        assert np.array_equal(plan.indices(3, step), whole[lo : lo + plan.batch_rows(step)])


def test_same_seed_same_plan_other_seed_other_plan() -> None:
    a = Plan(n_rows=1000, batch_size=10, seed=5)
    b = Plan(n_rows=1000, batch_size=10, seed=5)
    c = Plan(n_rows=1000, batch_size=10, seed=6)
    assert np.array_equal(_epoch(a, 0), _epoch(b, 0))
    assert not np.array_equal(_epoch(a, 0), _epoch(c, 0))


@given(plans, st.integers(0, 3))
@settings(max_examples=100, deadline=None)
def test_rows_of_a_batch_come_in_storage_order(args: tuple, epoch: int) -> None:  # type: ignore[type-arg]
    workers = _make(*args)
    if workers is None:
        return
    for plan in workers:
        for step in range(plan.steps):
            rows = plan.indices(epoch, step)
            assert (np.diff(rows) > 0).all()


def test_reshuffled_every_epoch() -> None:
    plan = Plan(n_rows=500, batch_size=50, seed=1)
    orders = [tuple(_epoch(plan, e)) for e in range(5)]
    assert len(set(orders)) == 5
    assert all(sorted(o) == list(range(500)) for o in orders)


def test_dropped_row_varies_between_epochs_when_shuffling() -> None:
    plan = Plan(n_rows=11, batch_size=5, shard=af.Shard(2, 1), seed=0)  # range of 6 rows, 5 used
    missing = {tuple(set(range(5, 11)) - set(_epoch(plan, e).tolist())) for e in range(20)}
    assert len(missing) > 1


@given(plans)
@settings(max_examples=100, deadline=None)
def test_indices_into_a_reused_buffer(args: tuple) -> None:  # type: ignore[type-arg]
    workers = _make(*args)
    if workers is None:
        return
    plan = workers[-1]
    for first, stop in ((0, plan.steps), (plan.steps // 2, plan.steps)):
        out = np.full(plan.index_count(first, stop), -1, dtype=np.int64)
        assert plan.indices(4, first, stop, out=out) is out
        assert np.array_equal(out, plan.indices(4, first, stop))


@pytest.mark.parametrize("shuffle", ["none", "full", "block"])
def test_indices_of_a_large_group_into_a_buffer(shuffle: str) -> None:
    # Many more rows than the pieces the positions and the permutation are computed in.
    mode: Any = shuffle
    plan = Plan(n_rows=1_000_003, batch_size=256, shuffle=mode, seed=4, block_rows=1000)
    out = np.empty(plan.index_count(10, 600), dtype=np.int64)
    plan.indices(2, 10, 600, out=out)
    expected = np.concatenate([plan.indices(2, s) for s in range(10, 600)])
    assert np.array_equal(out, expected)
    with pytest.raises(ValueError, match="out"):
        plan.indices(2, 10, 600, out=out[1:])


def test_indices_are_pinned() -> None:
    # From the release before indices were computed in place: a seed keeps its epochs.
    assert Plan(n_rows=1000, batch_size=4, seed=3).indices(2, 5).tolist() == [96, 143, 354, 893]
    big = Plan(n_rows=1_000_000, batch_size=4, seed=3)
    assert big.indices(2, 5).tolist() == [327055, 453161, 669390, 830286]


def test_huge_n_index_arithmetic() -> None:
    n = 2**40 + 3
    plan = Plan(n_rows=n, batch_size=256, shard=af.Shard(7, 6), seed=9)
    start, stop = plan.bounds
    assert stop == n and start == (n * 6) // 7
    last = plan.indices(11, plan.steps - 1)
    assert len(last) == plan.batch_rows(plan.steps - 1)
    assert ((last >= start) & (last < stop)).all()
    assert len(np.unique(last)) == len(last)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"`batch_size` must be a positive int \(got 0\)"),
        ({"batch_size": 2.5}, "must be a positive int"),
        ({"batch_size": True}, "must be a positive int"),
        ({"shard": af.Shard(20, 3)}, r"more workers \(20\) than rows \(10\)"),
        (
            {"batch_size": 4, "shard": af.Shard(4, 3), "drop_remainder": True},
            r"`batch_size` \(4\) is larger than shard 3 of 4, which has 2 rows",
        ),
        ({"shuffle": "sideways"}, "`shuffle` must be"),
        ({"shuffle": "block", "block_rows": 0}, "`block_rows` must be a positive int"),
    ],
)
def test_plan_errors(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    args = {"n_rows": 10, "batch_size": 3} | kwargs
    with pytest.raises(af.ConfigError, match=match):
        Plan(**args)


@pytest.mark.parametrize(
    ("count", "index", "match"),
    [
        (0, 0, "must be a positive int"),
        (3, 3, r"in \[0, 3\)"),
        (3, -1, r"in \[0, 3\)"),
        (2.0, 0, "must be a positive int"),
        (2, True, "must be an int"),
    ],
)
def test_shard_validates(count: object, index: object, match: str) -> None:
    with pytest.raises(af.ConfigError, match=match):
        af.Shard(count, index)  # type: ignore[arg-type]
