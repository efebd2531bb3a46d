"""States and ``resume=``: a job stopped on N workers goes on on M, every row once.

Workers are simulated in one process (``shard=Shard(N, k)``), through both entry points:
``af.batches`` (``Batches.state()``) and ``af.from_arrays`` (``af.state(ds, epoch, step)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import arrayfeed as af
from arrayfeed._pipeline.plan import shuffles

SEED = 5


def make(api: str, x: Any, **kwargs: Any) -> Any:
    if api == "batches":
        return af.batches(x, seed=SEED, processes=0, **kwargs)
    return af.from_arrays(x, seed=SEED, **kwargs)


def first_batches(api: str, data: Any, count: int) -> list[np.ndarray]:
    """The first ``count`` batches of the next iteration of ``data`` (then abandoned)."""
    out = []
    for batch in data if count else ():
        out.append(np.asarray(batch))
        if len(out) == count:
            break
    return out


def whole_pass(data: Any) -> list[np.ndarray]:
    return [np.asarray(batch) for batch in data]


def stop_and_resume(
    api: str,
    n: int,
    old: tuple[int, int, bool],
    taken_steps: int,
    new: tuple[int, int, bool],
    shuffle: Any,
) -> tuple[list[np.ndarray], list[list[np.ndarray]], set[int], dict[str, Any]]:
    """Epoch 0 on ``old`` workers for ``taken_steps`` steps, then resumed on ``new`` ones: what
    the old workers took, what each new worker takes in its first pass, the rows of the old
    sharding's uninterrupted epoch, and the state."""
    x = np.arange(n, dtype=np.int64)

    def job(sharding: tuple[int, int, bool], **kwargs: Any) -> list[Any]:
        workers, batch, drop = sharding
        return [
            make(
                api,
                x,
                batch_size=batch,
                drop_remainder=drop,
                shuffle=shuffle,
                shard=af.Shard(workers, k),
                **kwargs,
            )
            for k in range(workers)
        ]

    olds = job(old)
    taken_steps = min(taken_steps, len(olds[0]))
    taken = [b for o in olds for b in first_batches(api, o, taken_steps)]
    if api == "batches":
        states = [o.state() for o in olds]
    else:
        states = [af.state(o, 0, taken_steps) for o in olds]
    assert all(s == states[0] for s in states)  # the same dict on every worker
    saved = json.loads(json.dumps(states[0]))
    # Epoch 0 uninterrupted: new datasets (a dataset's next iteration is its next epoch).
    whole = {int(r) for o in job(old) for b in whole_pass(o) for r in b}
    news = job(new, resume=saved)
    m_workers, m_batch, m_drop = new
    starts = {af.state(d)["epoch"] for d in news}
    assert len(starts) == 1
    if starts == {1}:  # nothing of epoch 0 left for the new workers: they start epoch 1
        return taken, [[] for _ in news], whole, saved
    got = [whole_pass(d) for d in news]
    if (saved["epoch"], saved["step"]) == (0, 0):  # nothing taken: the new sharding's own epoch
        per = n // m_workers
        rows = [int(r) for g in got for b in g for r in b]
        assert len(rows) == m_workers * (per - per % m_batch if m_drop else per)
        whole = set(rows)
    return taken, got, whole, saved


def fits(n: int, workers: int, batch: int, drop: bool) -> bool:
    return n // workers >= (batch if drop else 1)


def check(
    taken: list[np.ndarray], got: list[list[np.ndarray]], whole: set[int], allowed: int
) -> None:
    assert len({len(g) for g in got}) == 1, "unequal steps on the new workers"
    rows = [int(r) for b in [*taken, *(b for g in got for b in g)] for r in b]
    assert len(rows) == len(set(rows)), "a row taken twice"
    assert set(rows) <= whole
    assert len(whole) - len(rows) < max(1, allowed), "rows lost"


Job = tuple[int, tuple[int, int, bool], tuple[int, int, bool], int, Any]


def jobs(most_workers: int, most_rows: int, most_steps: int) -> st.SearchStrategy[Job]:
    """Rows, the old and the new sharding (workers, batch size, drop_remainder), the steps the
    old one took, the shuffle mode."""
    sharding = st.tuples(st.integers(1, most_workers), st.integers(1, 16), st.booleans())
    modes = st.sampled_from([True, False, "block"])
    return st.tuples(
        st.integers(1, most_rows), sharding, sharding, st.integers(0, most_steps), modes
    )


def check_job(api: str, job: Job) -> None:
    n, old, new, taken_steps, shuffle = job
    if fits(n, *old) and fits(n, *new):
        taken, got, whole, _ = stop_and_resume(api, n, old, taken_steps, new, shuffle)
        check(taken, got, whole, new[0] * new[1])


@settings(max_examples=100, deadline=None)
@given(job=jobs(most_workers=8, most_rows=200, most_steps=20))
def test_batches_resumed_on_other_workers_take_every_row_once(job: Job) -> None:
    check_job("batches", job)


@settings(max_examples=10, deadline=None)
@given(job=jobs(most_workers=3, most_rows=120, most_steps=12))  # each worker a tf.data dataset
def test_from_arrays_resumed_on_other_workers_take_every_row_once(job: Job) -> None:
    check_job("from_arrays", job)


@pytest.mark.parametrize("api", ["batches", "from_arrays"])
@pytest.mark.parametrize("shuffle", [True, False, "block"])
def test_the_same_sharding_resumes_the_stream_of_start_step(api: str, shuffle: Any) -> None:
    x = np.arange(103, dtype=np.int64)
    for k in range(3):
        ref = make(api, x, batch_size=4, shuffle=shuffle, shard=af.Shard(3, k))
        for step in (1, 4):
            saved = af.state(ref, 2, step)
            resumed = make(
                api, x, batch_size=4, shuffle=shuffle, shard=af.Shard(3, k), resume=saved
            )
            today = make(
                api,
                x,
                batch_size=4,
                shuffle=shuffle,
                shard=af.Shard(3, k),
                start_epoch=2,
                start_step=step,
            )
            for _ in range(2):  # the rest of epoch 2, then epoch 3
                for a, b in zip(whole_pass(resumed), whole_pass(today), strict=True):
                    np.testing.assert_array_equal(a, b)


def test_resumed_twice_in_one_epoch_every_row_once() -> None:
    x = np.arange(500, dtype=np.int64)
    first = [
        af.batches(x, batch_size=8, seed=1, shard=af.Shard(4, k), processes=0) for k in range(4)
    ]
    taken = [b for d in first for b in first_batches("batches", d, 5)]
    saved = first[0].state()
    second = [
        af.batches(x, batch_size=6, seed=1, shard=af.Shard(3, k), processes=0, resume=saved)
        for k in range(3)
    ]
    taken += [b for d in second for b in first_batches("batches", d, 4)]
    saved = json.loads(json.dumps(second[0].state()))
    assert [s["workers"] for s in saved["history"]] == [4]  # the chain, one entry per restart
    third = [
        af.batches(x, batch_size=10, seed=1, shard=af.Shard(2, k), processes=0, resume=saved)
        for k in range(2)
    ]
    got = [whole_pass(d) for d in third]
    check(taken, got, set(range(500)), 3 * 6 + 2 * 10)
    after = third[0].state()
    assert after["epoch"] == 1 and after["history"] == []  # the epoch ended: no chain left
    assert sorted(int(r) for d in third for b in whole_pass(d) for r in b) == list(range(500))


def test_the_state_is_small_whatever_the_rows() -> None:
    sizes = []
    for n in (100, 10**7):
        x = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=(n,), strides=(0,))
        b = af.batches(x, batch_size=10, seed=2**63, shard=af.Shard(8, 3), processes=0)
        sizes.append(len(json.dumps(af.state(b, 12, 1))))
    assert sizes[1] - sizes[0] <= 5 and sizes[1] < 400  # the digits of `rows`


def test_seed_none_takes_the_state_seed() -> None:
    x = np.arange(100)
    b = af.batches(x, batch_size=10, processes=0)  # a drawn seed
    first = first_batches("batches", b, 3)
    resumed = af.batches(x, batch_size=10, processes=0, resume=b.state())
    rows = np.concatenate([*first, *whole_pass(resumed)])
    assert sorted(rows.tolist()) == list(range(100))


def _state(**changes: Any) -> dict[str, Any]:
    b = af.batches(
        {"a": np.zeros((100, 2)), "b": np.arange(100)}, batch_size=10, seed=3, processes=0
    )
    saved = af.state(b, 1, 2)
    saved.update(changes)
    return saved


def _resume(saved: Any, **kwargs: Any) -> Any:
    args: dict[str, Any] = {"batch_size": 10, "seed": 3, "processes": 0, **kwargs}
    data = kwargs.pop("data", {"a": np.zeros((100, 2)), "b": np.arange(100)})
    args.pop("data", None)
    return af.batches(data, resume=saved, **args)


@pytest.mark.parametrize(
    ("saved", "kwargs", "match"),
    [
        (_state(), {"seed": 4}, r"other data: seed 3 in the state, 4 here"),
        (_state(), {"shuffle": False}, r"shuffle 'full' in the state, 'none' here"),
        (
            _state(),
            {"data": {"a": np.zeros((101, 2)), "b": np.arange(101)}},
            r"rows 100 in the state, 101 here",
        ),
        (
            _state(),
            {"data": {"a": np.zeros((100, 3)), "b": np.arange(100)}},
            r"leaves '[0-9a-f]+' in the state, '[0-9a-f]+' here \(the arrays' names, row shapes",
        ),
        (
            _state(),
            {"data": {"x": np.zeros((100, 2)), "b": np.arange(100)}},
            r"leaves .*names, row shapes or dtypes differ",
        ),
        (_state(format=2), {}, r"state of format 2, written by a newer arrayfeed.*Upgrade"),
        (_state(epoch="1"), {}, r"not a state of arrayfeed: 'epoch' is '1', not int"),
        ([1, 2], {}, r"must be a state \(a dict\).*\(got list\)"),
        (_state(step=99), {}, r"not a state a job could have saved: the epoch took 99 steps"),
        (_state(step=-1), {}, r"not a state a job could have saved: its position"),
    ],
)
def test_a_state_of_other_data_is_refused_saying_what_differs(
    saved: Any, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(af.ResumeError, match=match) as info:
        _resume(saved, **kwargs)
    assert isinstance(info.value, ValueError)


def test_several_differences_are_named_together() -> None:
    with pytest.raises(af.ResumeError, match=r"seed 3 in the state, 4 here; shuffle 'full'"):
        _resume(_state(), seed=4, shuffle="block")


def test_resume_with_a_start_position_is_refused() -> None:
    with pytest.raises(af.ConfigError, match="`resume` and `start_epoch` / `start_step`"):
        _resume(_state(), start_step=1)


def test_state_takes_both_epoch_and_step_or_neither() -> None:
    b = af.batches(np.arange(10), batch_size=2, seed=0, processes=0)
    with pytest.raises(TypeError, match="both `epoch` and `step`"):
        af.state(af.from_arrays(np.arange(10), batch_size=2, seed=0), 1)
    with pytest.raises(TypeError, match=r"takes what arrayfeed\.batches"):
        af.state(tf.data.Dataset.range(3))
    assert af.state(b, 0, len(b))["epoch"] == 1  # the end of an epoch is the next one's start


def test_a_position_before_the_rest_has_no_state() -> None:
    x = np.arange(100)
    old = af.batches(x, batch_size=5, seed=0, shard=af.Shard(2, 0), processes=0)
    new = af.batches(x, batch_size=5, seed=0, processes=0, resume=af.state(old, 0, 3))
    start = af.state(new)
    assert (start["epoch"], start["step"]) == (0, 6)  # 70 rows left: the last 14 of 20 steps
    with pytest.raises(af.ConfigError, match=r"`step` \(5\) is before step 6"):
        af.state(new, 0, 5)


class FakeStrategy:
    """One input pipeline of ``replicas`` replicas."""

    def __init__(self, replicas: int) -> None:
        self.num_replicas_in_sync = replicas

    def distribute_datasets_from_function(self, fn: Any) -> Any:
        return fn(tf.distribute.InputContext(1, 0, self.num_replicas_in_sync))


def test_distribute_counts_its_own_steps_and_keeps_the_global_batch() -> None:
    x = np.arange(100)
    ds = af.distribute(FakeStrategy(2), x, global_batch_size=10, seed=0)
    saved = af.state(ds, 0, 3)  # 3 steps of 2 batches of 5
    assert (saved["step"], saved["batch_size"]) == (6, 5)
    resumed = af.distribute(FakeStrategy(1), x, global_batch_size=10, seed=0, resume=saved)
    start = af.state(resumed)
    assert (start["step"], start["batch_size"]) == (3, 10)  # the same 70 rows, 7 steps of 10
    assert af.state(resumed, 0, 2)["step"] == 5  # 2 steps into the resumed iteration
    rows = [int(r) for batch in resumed for r in np.asarray(batch)]
    assert len(rows) == len(set(rows)) == 70


def test_a_block_shuffled_store_resumed_in_a_loader_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Blocks of one 50-row chunk, windows of 4 blocks: many windows in a small store.
    monkeypatch.setattr(shuffles, "MIN_BLOCK_BYTES", 1)
    monkeypatch.setattr(shuffles, "WINDOW_BYTES", 4 * 50 * 64)
    rows = np.repeat(np.arange(3000, dtype=np.int64)[:, None], 8, axis=1)
    af.convert({"x": rows}, tmp_path / "s.zarr", chunk_rows=50, compression="lzf")
    x = af.open_array(f"{tmp_path / 's.zarr'}:x")
    olds = [
        af.batches(x, batch_size=32, shuffle="block", seed=2, shard=af.Shard(3, k), processes=0)
        for k in range(3)
    ]
    taken = [b[:, 0] for o in olds for b in first_batches("batches", o, 20)]
    saved = olds[0].state()
    assert saved["block_rows"] == 50 and saved["window_blocks"] == 4
    news = [
        af.batches(
            x,
            batch_size=48,
            shuffle="block",
            seed=2,
            shard=af.Shard(2, m),
            processes=1,
            resume=saved,
        )
        for m in range(2)
    ]
    assert all(d._feed.processes == 1 for d in news)  # the rest planned in a loader process
    got = [[b[:, 0] for b in whole_pass(d)] for d in news]
    check(taken, got, set(range(3000)), 2 * 48)
