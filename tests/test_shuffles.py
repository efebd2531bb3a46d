"""Shuffle modes: how ``shuffle=`` is read, what each mode answers, and each mode's order.

Every mode is pure planning: an epoch visits every row of the worker's range once, the same
seed gives the same order in any process, and any stretch of positions can be computed alone.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayfeed as af
from arrayfeed._pipeline.plan.permutation import permute
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.plan.shuffles import (
    BLOCK,
    FULL,
    SHUFFLES,
    STORAGE_ORDER,
    BlockShuffle,
    FullShuffle,
    Shuffle,
    StorageOrder,
    block_layout,
    shuffle_mode,
)

MODES = [STORAGE_ORDER, FULL, BLOCK]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, FullShuffle),
        (False, StorageOrder),
        (np.bool_(True), FullShuffle),
        (np.bool_(False), StorageOrder),
        ("full", FullShuffle),
        ("none", StorageOrder),
        ("block", BlockShuffle),
        (BLOCK, BlockShuffle),
    ],
)
def test_the_shuffle_argument_names_a_mode(value: object, expected: type[Shuffle]) -> None:
    assert type(shuffle_mode(value)) is expected


@pytest.mark.parametrize("value", ["sideways", "Full", "", 1, 0, None, 1.0])
def test_anything_else_is_refused_naming_every_mode(value: object) -> None:
    with pytest.raises(af.ConfigError) as info:
        shuffle_mode(value)
    assert str(info.value) == (
        f"`shuffle` must be True (or 'full'), False (or 'none') or 'block' (got {value!r})."
    )


@pytest.mark.parametrize(
    ("mode", "name", "random", "reads_windows"),
    [
        (STORAGE_ORDER, "none", False, False),
        (FULL, "full", True, False),
        (BLOCK, "block", True, True),
    ],
)
def test_what_each_mode_answers(
    mode: Shuffle, name: str, random: bool, reads_windows: bool
) -> None:
    assert (mode.name, mode.random, mode.reads_windows) == (name, random, reads_windows)
    assert shuffle_mode(mode.name) is mode
    assert mode in SHUFFLES


def test_modes_are_values() -> None:
    assert StorageOrder() == STORAGE_ORDER and hash(FullShuffle()) == hash(FULL)
    assert FULL != BLOCK and FULL != "full"
    for mode in MODES:
        assert pickle.loads(pickle.dumps(mode)) == mode
    assert repr(BLOCK) == "BlockShuffle()"


def test_only_the_block_mode_lays_out_blocks() -> None:
    for mode in (STORAGE_ORDER, FULL):
        assert mode.layout([16], row_bytes=12292) == (1, 1)
    assert BLOCK.layout([16], row_bytes=12292) == block_layout([16], 12292) == (352, 7)
    assert BLOCK.layout([], row_bytes=12292) == block_layout([], 12292)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_plan_holds_its_mode_and_keeps_the_name(mode: Shuffle) -> None:
    plan = Plan(n_rows=100, batch_size=7, shuffle=mode.name, seed=3, block_rows=10)
    assert plan.mode is mode and plan.shuffle == mode.name
    assert f"shuffle={mode.name!r}" in repr(plan)
    assert Plan(n_rows=100, batch_size=7, shuffle=mode, seed=3, block_rows=10) == plan
    copy = pickle.loads(pickle.dumps(plan))
    assert copy == plan and copy.mode == mode
    assert np.array_equal(copy.indices(2, 0, copy.steps), plan.indices(2, 0, plan.steps))
    assert Plan(n_rows=100, batch_size=7, shuffle=True).mode is FULL
    assert Plan(n_rows=100, batch_size=7, shuffle=False).mode is STORAGE_ORDER


def test_batches_repr_names_the_mode() -> None:
    b = af.batches(np.zeros((10, 2)), batch_size=4, shuffle="block", seed=0, shard=None)
    assert "shuffle='block'" in repr(b)
    assert "shuffle='full'" in repr(af.batches(np.zeros((10, 2)), batch_size=4, shard=None))


@pytest.mark.parametrize(
    ("mode", "batch_7", "last"),
    [
        (STORAGE_ORDER, [66703, 66704, 66705, 66706, 66707], [99998, 99999, 100000, 100001]),
        (FULL, [71887, 75040, 75202, 80844, 84807], [79519, 83912, 88114, 99922]),
        (BLOCK, [67537, 67868, 67936, 83929, 83973], [70348, 70941, 74956, 78332]),
    ],
    ids=lambda v: getattr(v, "name", ""),
)
def test_each_mode_is_pinned(mode: Shuffle, batch_7: list[int], last: list[int]) -> None:
    # Values from before modes were objects: a seed keeps its stream in every mode.
    plan = Plan(
        n_rows=100_003,
        batch_size=5,
        shard=af.Shard(3, 2),
        shuffle=mode,
        seed=11,
        block_rows=1000,
        window_blocks=4,
    )
    assert plan.indices(3, 7).tolist() == batch_7
    assert plan.indices(0, plan.steps - 1).tolist() == last


def _filled(mode: Shuffle, plan: Plan, epoch: int, first: int, count: int) -> np.ndarray:
    out = np.full(count, -1, dtype=np.int64)
    mode.fill(plan.span, epoch, first, out)
    return out


workers = st.tuples(
    st.integers(1, 3000),  # rows
    st.integers(1, 4),  # workers
    st.integers(0, 2**63),  # seed
    st.integers(1, 300),  # block rows
    st.integers(1, 5),  # window blocks
)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@given(args=workers, epoch=st.integers(0, 5))
@settings(max_examples=100, deadline=None)
def test_every_row_once_per_epoch(mode: Shuffle, args: tuple[int, ...], epoch: int) -> None:
    n, count, seed, block, window = args
    if n < count:
        return
    for k in range(count):
        plan = Plan(
            n_rows=n,
            batch_size=1,
            shard=af.Shard(count, k),
            shuffle=mode,
            seed=seed,
            block_rows=block,
            window_blocks=window,
        )
        start, stop = plan.bounds
        rows = _filled(mode, plan, epoch, 0, stop - start)
        assert np.array_equal(np.sort(rows), np.arange(start, stop))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@given(args=workers, data=st.data())
@settings(max_examples=100, deadline=None)
def test_seekable_and_the_same_for_the_same_seed(
    mode: Shuffle, args: tuple[int, ...], data: st.DataObject
) -> None:
    n, count, seed, block, window = args
    if n < count:
        return

    def plan(seed: int) -> Plan:
        return Plan(
            n_rows=n,
            batch_size=1,
            shard=af.Shard(count, count - 1),
            shuffle=mode,
            seed=seed,
            block_rows=block,
            window_blocks=window,
        )

    a, b = plan(seed), plan(seed)
    whole = _filled(mode, a, 4, 0, a.rows_per_epoch)
    assert np.array_equal(whole, _filled(mode, b, 4, 0, b.rows_per_epoch))
    first = data.draw(st.integers(0, a.rows_per_epoch - 1))
    stop = data.draw(st.integers(first + 1, a.rows_per_epoch))
    assert np.array_equal(_filled(mode, b, 4, first, stop - first), whole[first:stop])


@pytest.mark.parametrize("mode", [FULL, BLOCK], ids=lambda m: m.name)
def test_random_modes_reshuffle_every_epoch_and_follow_the_seed(mode: Shuffle) -> None:
    def epoch(seed: int, e: int) -> tuple[int, ...]:
        plan = Plan(n_rows=5000, batch_size=10, shuffle=mode, seed=seed, block_rows=50)
        return tuple(_filled(mode, plan, e, 0, plan.rows_per_epoch).tolist())

    assert len({epoch(0, e) for e in range(4)}) == 4
    assert epoch(1, 0) != epoch(0, 0) == epoch(0, 0)


def test_storage_order_is_the_identity() -> None:
    plan = Plan(n_rows=10, batch_size=3, shard=af.Shard(2, 1), shuffle=STORAGE_ORDER, seed=5)
    assert _filled(STORAGE_ORDER, plan, 9, 1, 4).tolist() == [6, 7, 8, 9]


# -- the block order ----------------------------------------------------------------------------
@given(
    n=st.integers(1, 3000),
    count=st.integers(1, 3),
    block=st.integers(1, 200),
    window=st.integers(1, 6),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=150, deadline=None)
def test_block_order_is_local_to_windows(
    n: int, count: int, block: int, window: int, seed: int
) -> None:
    for k in range(count):
        try:
            plan = Plan(
                n_rows=n,
                batch_size=7,
                shard=af.Shard(count, k),
                shuffle="block",
                block_rows=block,
                window_blocks=window,
                seed=seed,
            )
        except af.ConfigError:
            return
        epoch = plan.indices(epoch=2, start_step=0, stop_step=plan.steps)
        rows = plan.block_order(2).rows(np.arange(len(epoch), dtype=np.int64))
        # Batches are the block order's batches, each in storage order.
        for s in range(plan.steps):
            lo, hi = s * 7, s * 7 + plan.batch_rows(s)
            assert np.array_equal(epoch[lo:hi], np.sort(rows[lo:hi]))
        # Window w holds exactly the rows of the blocks at slots [w*window, (w+1)*window) of the
        # permuted block order (the last window may be cut short by the equal-steps rule).
        order = plan.block_order(2)
        slot = 0
        while slot < order.count:
            slots = np.arange(slot, min(slot + window, order.count), dtype=np.int64)
            lo_row, hi_row = (
                int(order.rows_before_slot(np.array(v))) for v in (slot, slot + window)
            )
            blocks = permute(slots, order.count, order.block_key)
            lo, hi = order.block_bounds(blocks)
            expected = set(
                np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)]).tolist()
            )
            got = rows[lo_row:hi_row].tolist()
            assert len(set(got)) == len(got)
            assert set(got) <= expected
            if hi_row <= len(rows):
                assert set(got) == expected
            slot += window


def test_block_mode_reads_chunks_in_random_order() -> None:
    plan = Plan(
        n_rows=100_000, batch_size=256, shuffle="block", block_rows=1000, window_blocks=4, seed=0
    )
    rows = plan.block_order(0).rows(np.arange(plan.rows_per_epoch, dtype=np.int64))
    first_blocks = [int(b) for b in dict.fromkeys((rows // 1000).tolist())][:20]
    assert first_blocks != sorted(first_blocks)
    batch = plan.indices(0, 10)
    assert len(np.unique(batch // 1000)) <= 8  # one window, or two at a boundary
    other = Plan(
        n_rows=100_000, batch_size=256, shuffle="block", block_rows=1000, window_blocks=4, seed=0
    )
    assert not np.array_equal(other.indices(1, 0, other.steps), rows)  # reshuffled per epoch
