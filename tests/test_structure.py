"""Flattening and rebuilding nested structures."""

from __future__ import annotations

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.read.structure import flatten


def _is_leaf(v: object) -> bool:
    return isinstance(v, (int, np.ndarray))


def test_round_trip_sorted_dicts_and_lists_become_tuples() -> None:
    structure = {"b": [1, (2, 3)], "a": {"z": 4, "y": 5}}
    leaves, treedef = flatten(structure, _is_leaf)
    assert leaves == [5, 4, 1, 2, 3]  # dict keys sorted at every level
    assert treedef.unflatten(leaves) == {"a": {"y": 5, "z": 4}, "b": (1, (2, 3))}
    assert treedef.leaf_paths("x") == [
        "x['a']['y']",
        "x['a']['z']",
        "x['b'][0]",
        "x['b'][1][0]",
        "x['b'][1][1]",
    ]
    assert treedef.num_leaves == 5


def test_single_leaf() -> None:
    leaves, treedef = flatten(7, _is_leaf)
    assert leaves == [7] and treedef.kind == "leaf" and treedef.unflatten([8]) == 8


@pytest.mark.parametrize(
    ("structure", "match"),
    [
        ({"a": 1, 2: 3}, "keys cannot be sorted"),
        ({}, "empty dict"),
        ((1, ()), r"`value\[1\]` is an empty tuple"),
        ({"a": "text"}, r"`value\['a'\]` is a builtins.str"),
    ],
)
def test_errors_name_the_place(structure: object, match: str) -> None:
    with pytest.raises(af.StructureError, match=match):
        flatten(structure, _is_leaf)


def test_unflatten_checks_leaf_count() -> None:
    _, treedef = flatten((1, 2), _is_leaf)
    with pytest.raises(af.StructureError, match="expected 2 leaves"):
        treedef.unflatten([1])
