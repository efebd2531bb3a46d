"""``build_feed``: the argument checks that ``from_arrays`` and ``batches`` share."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.api.build import SHARD_KINDS, build_feed, resolve_shard
from arrayfeed._pipeline.api.options import FeedArgs

N = 103

DEFAULTS: dict[str, Any] = {
    "batch_size": 32,
    "shuffle": True,
    "seed": None,
    "shard": "auto",
    "drop_remainder": False,
    "map_batch": None,
    "num_threads": None,
    "start_epoch": 0,
    "start_step": 0,
}


def test_the_feed_starts_where_asked_and_knows_who_shards() -> None:
    built = build_feed(
        FeedArgs(
            np.arange(N), None, None, **{**DEFAULTS, "seed": 1, "start_epoch": 2, "start_step": 3}
        )
    )
    assert built.start == (2, 3) == built.feed.next_position
    assert built.sharded_by_us and not built.feed.seed_drawn
    built = build_feed(FeedArgs(np.arange(N), None, None, **{**DEFAULTS, "shard": None}))
    assert not built.sharded_by_us and built.feed.seed_drawn
    assert built.feed.plan.steps == 4


def test_shard_kinds_are_named_by_the_caller() -> None:
    with pytest.raises(af.ConfigError, match=r"must be 'auto', None or arrayfeed\.Shard"):
        resolve_shard("everywhere")
    with pytest.raises(af.ConfigError, match=r"^`shard` must be A or B \(got 'x'\)\.$"):
        resolve_shard("x", "A or B")
    assert "InputContext" not in SHARD_KINDS


MISTAKES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "x_none": ((None,), {}),
    "weight_without_y": ((np.zeros(N),), {"sample_weight": np.ones(N)}),
    "list_of_numbers": (([1, 2, 3],), {}),
    "lengths": ((np.zeros(N), np.zeros(N - 1)), {}),
    "object_dtype": ((np.array([object()] * N),), {}),
    "batch_size": ((np.zeros(N),), {"batch_size": 0}),
    "shuffle": ((np.zeros(N),), {"shuffle": "sometimes"}),
    "seed": ((np.zeros(N),), {"seed": -1}),
    "drop_remainder": ((np.zeros(N),), {"drop_remainder": "yes"}),
    "too_many_workers": ((np.zeros(N),), {"shard": af.Shard(200, 0)}),
    "batch_above_shard": (
        (np.zeros(N),),
        {"batch_size": 60, "drop_remainder": True, "shard": af.Shard(2, 1)},
    ),
    "num_threads": ((np.zeros(N),), {"num_threads": 0}),
    "map_batch_not_callable": ((np.zeros(N),), {"map_batch": 3}),
    "map_batch_two_args": ((np.zeros(N), np.ones(N)), {"map_batch": lambda x, y: (x, y)}),
    "map_batch_raises": ((np.zeros(N),), {"map_batch": lambda b: 1 / 0}),
    "start_step": ((np.zeros(N),), {"batch_size": 10, "seed": 0, "start_step": 11}),
    "resume_without_seed": ((np.zeros(N),), {"start_epoch": 1}),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_both_entry_points_refuse_a_mistake_alike(mistake: str) -> None:
    args, kwargs = MISTAKES[mistake]
    errors = []
    for entry in (af.from_arrays, af.batches):
        with pytest.raises(af.ArrayfeedError) as info:
            entry(*args, **kwargs)
        errors.append(
            (type(info.value), str(info.value).replace("calling batches", "calling from_arrays"))
        )
    assert errors[0] == errors[1]
