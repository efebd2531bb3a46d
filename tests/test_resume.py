"""Resuming: ``from_arrays(start_epoch=, start_step=)`` continues the uninterrupted stream exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import arrayfeed as af
from arrayfeed._pipeline.api.resume import feeds_of
from arrayfeed._pipeline.plan.plan import check_position
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._storage.npy.memory import ArraySource

N = 103  # prime: batches and shards never divide evenly
EPOCHS = 4

CONFIGS: dict[str, dict[str, Any]] = {
    "shuffled": {"batch_size": 10, "seed": 7},
    "storage_order": {"batch_size": 10, "shuffle": False},
    "drop_remainder_shard_1_of_3": {
        "batch_size": 4,
        "seed": 7,
        "drop_remainder": True,
        "shard": af.Shard(3, 1),
    },
    "map_batch_one_thread": {
        "batch_size": 12,
        "seed": 9,
        "num_threads": 1,
        "map_batch": lambda b: {"ids": b[1], "twice": b[0] * 2},
    },
}


def _data() -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(N, dtype=np.int64)
    x = np.stack([ids * 2.0, -ids * 1.0], axis=1)  # row i holds 2i and -i
    return x, ids


def _passes(ds: tf.data.Dataset, count: int) -> list[list[Any]]:
    """``count`` iterations of ``ds``, each as a list of batches (nested NumPy)."""
    return [[tf.nest.map_structure(lambda t: t.numpy(), b) for b in ds] for _ in range(count)]


def _assert_same_batches(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        tf.nest.map_structure(np.testing.assert_array_equal, g, e)


def _break_points(config: str, steps: int) -> list[tuple[int, int]]:
    """Epoch starts, second steps, middles (also mid-group), last full and last batches.

    The main configuration is broken at 12 points; the variants at 4 each (time budget).
    """
    steps_at = sorted({0, 1, steps // 2, steps - 2, steps - 1})
    if config == "shuffled":
        return (
            [(0, 0), (0, 1), (0, steps - 1)]
            + [(e, s) for e in (1, 2) for s in steps_at[:-1]]
            + [(2, steps - 1)]
        )
    return [(0, steps - 1), (1, 0), (1, steps // 2), (2, steps - 2)]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_resumed_stream_equals_uninterrupted_stream_at_every_break_point(config: str) -> None:
    kwargs = CONFIGS[config]
    x, ids = _data()
    reference_ds = af.from_arrays(x, ids, **kwargs)
    steps = len(reference_ds)
    reference = _passes(reference_ds, EPOCHS)  # the uninterrupted run: epochs 0 .. EPOCHS-1
    for epoch, step in _break_points(config, steps):
        resumed = af.from_arrays(x, ids, start_epoch=epoch, start_step=step, **kwargs)
        assert len(resumed) == steps  # len() stays the number of batches of a whole epoch
        first, second = _passes(resumed, 2)
        _assert_same_batches(first, reference[epoch][step:])  # the rest of the epoch …
        _assert_same_batches(second, reference[epoch + 1])  # … then the next whole epoch


def test_break_points_checked() -> None:
    # How many distinct (config, epoch, step) resume points the tests above check.
    x, ids = _data()
    points = {c: set(_break_points(c, len(af.from_arrays(x, ids, **CONFIGS[c])))) for c in CONFIGS}
    assert len(points["shuffled"]) == 12
    assert sum(map(len, points.values())) == 24


class CountingSource(ArraySource):
    """Counts the rows read, to prove resuming reads nothing before its start."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__(array, name="counting")
        self.rows_read = 0

    def read(self, indices: np.ndarray) -> np.ndarray:
        self.rows_read += len(indices)
        return super().read(indices)

    def gather_into(self, indices: np.ndarray, out: np.ndarray) -> None:
        self.rows_read += len(indices)
        super().gather_into(indices, out)


def test_resuming_is_o1_nothing_before_the_start_is_read() -> None:
    source = CountingSource(np.arange(100_000, dtype=np.int64))
    ds = af.from_arrays(source, batch_size=100, seed=1, start_epoch=10**12, start_step=997)
    batches = [b.numpy() for b in ds]  # the last three batches of epoch 10**12
    assert len(batches) == 3
    assert source.rows_read == 300  # (a first pass reads no epoch ahead)
    plan = feeds_of(ds)[0].plan
    np.testing.assert_array_equal(np.concatenate(batches), plan.indices(10**12, 997, 1000))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start_step": 11}, r"`start_step` \(11\) must be less than the 11 steps"),
        ({"start_step": 11, "start_epoch": 2}, "use `start_epoch=3, start_step=0`"),
        ({"start_step": -1}, r"`start_step` must be a non-negative int \(got -1\)"),
        ({"start_epoch": -2}, r"`start_epoch` must be a non-negative int \(got -2\)"),
        ({"start_epoch": 1.0}, r"`start_epoch` must be a non-negative int \(got 1.0\)"),
        ({"start_step": True}, r"`start_step` must be a non-negative int \(got True\)"),
    ],
)
def test_start_position_is_validated(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(af.ConfigError, match=match) as info:
        af.from_arrays(np.arange(N), batch_size=10, **kwargs)
    assert isinstance(info.value, ValueError)


def test_numpy_integers_are_positions() -> None:
    assert check_position(5, np.int64(3), np.int32(4)) == (3, 4)
    ds = af.from_arrays(np.arange(N), batch_size=10, shuffle=False, start_step=np.int64(10))
    assert [b.numpy().tolist() for b in ds] == [[100, 101, 102]]


def test_feed_is_found_through_transformations_and_not_elsewhere() -> None:
    ds = af.from_arrays(np.arange(N), batch_size=10, seed=0)
    (feed,) = feeds_of(ds)
    assert isinstance(feed, Feed)
    options = tf.data.Options()
    options.deterministic = True
    derived = ds.map(lambda b: b * 2).prefetch(1).with_options(options)
    assert feeds_of(derived) == [feed]
    other = af.from_arrays(np.arange(N), batch_size=10, seed=1)
    both = feeds_of(tf.data.Dataset.zip((ds, other)))
    assert {id(f) for f in both} == {id(feed), id(feeds_of(other)[0])}
    assert feeds_of(tf.data.Dataset.range(3)) == []
    assert feeds_of(object()) == []


def test_seek_moves_the_next_iteration() -> None:
    ds = af.from_arrays(np.arange(N), batch_size=10, seed=4)
    (feed,) = feeds_of(ds)
    plan = feed.plan
    feed.seek(6)
    assert feed.next_position == (6, 0)
    np.testing.assert_array_equal(
        np.concatenate([b.numpy() for b in ds]), plan.indices(6, 0, plan.steps)
    )
    assert feed.next_position == (7, 0)
    with pytest.raises(af.ConfigError, match=r"`step` \(11\) must be less than the 11 steps"):
        feed.seek(1, 11)


def test_stream_is_the_same_whatever_threads_and_storage(write: Any) -> None:
    # Resuming in another process or machine relies on this: the stream depends on the plan's
    # arguments only, not on the reader threads or the backend the rows are stored in.
    x, ids = _data()
    streams = []
    for backend, threads in [("ndarray", 1), ("npy_path", 4), ("hdf5", 2), ("zarr", 3)]:
        ds = af.from_arrays(write(backend, "x", x), ids, batch_size=9, seed=21, num_threads=threads)
        streams.append(_passes(ds, 2))
    for other in streams[1:]:
        for got, expected in zip(other, streams[0], strict=True):
            _assert_same_batches(got, expected)


@pytest.mark.parametrize("start", [{"start_epoch": 1}, {"start_step": 2}])
def test_resuming_with_a_drawn_seed_is_refused(start: dict[str, int]) -> None:
    with pytest.raises(af.ConfigError, match=r"pass the `seed` used before"):
        af.from_arrays(np.arange(N), batch_size=10, **start)
    # Without shuffling there is nothing to repeat: the seed does not matter.
    af.from_arrays(np.arange(N), batch_size=10, shuffle=False, **start)


def test_resume_callback_refuses_a_drawn_seed() -> None:
    with pytest.raises(af.ConfigError, match=r"fixed seed"):
        af.ResumeCallback(af.from_arrays(np.arange(N), batch_size=10))
    af.ResumeCallback(af.from_arrays(np.arange(N), batch_size=10, seed=3))
