"""The ``map_batch`` contract: the probe and the per-batch check."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.read.mapbatch import Contract, LeafSpec, is_array, probe

BATCH = {"a": np.arange(8), "b": np.ones((8, 3), np.float32)}


def _contract(fn: Any = lambda b: b) -> Contract:
    contract, _ = probe(fn, BATCH, rows=8, batch_size=8)
    return contract


def test_the_probe_learns_structure_specs_and_time() -> None:
    contract, seconds = probe(lambda b: (b["b"] * 2, b["a"]), BATCH, rows=8, batch_size=32)
    assert contract.treedef.kind == "tuple" and contract.treedef.num_leaves == 2
    assert contract.specs == (
        LeafSpec((3,), np.dtype(np.float32)),
        LeafSpec((), np.dtype(np.int64)),
    )
    assert seconds >= 0


def test_the_probe_leaves_out_time_its_thread_waited_for_a_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Other processes keeping every core busy while the probe runs are not the map's cost: a
    map timed while its thread waited for a core (here a second of it, more than the call took
    by the clock) is not sized as a slow one (its groups one batch long)."""
    ticks = iter([0.0, 1.0])
    monkeypatch.setattr("arrayfeed._pipeline.read.mapbatch.queued", lambda: next(ticks))
    _, seconds = probe(lambda b: b, BATCH, rows=8, batch_size=8)
    assert seconds == 0.0


@pytest.mark.parametrize(
    ("fn", "error", "message"),
    [
        (lambda b: 1 / 0, af.MapBatchError, "`map_batch` raised ZeroDivisionError on a first batch of 8 rows: division by zero"),
        (lambda b: b["a"][:3], af.MapBatchError, "`map_batch(...)` has shape (3,), but the batch has 8 rows; `map_batch` must keep the batch size (axis 0) of every array it returns."),
        (lambda b: np.array(["x"] * 8), af.DtypeError, "`map_batch(...)` has dtype <U1, which TensorFlow cannot take."),
        (lambda b: np.zeros((8, 0)), af.MapBatchError, "`map_batch(...)` has rows of shape (0,), which hold no data"),
        (lambda b: "text", af.MapBatchError, "`map_batch(...)` is a builtins.str"),
    ],
)  # fmt: skip
def test_the_probe_refuses_what_cannot_be_fed(fn: Any, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        probe(fn, BATCH, rows=8, batch_size=8)
    assert str(info.value).startswith(message)


def test_a_result_like_the_first_passes_as_arrays() -> None:
    contract = _contract()
    arrays = contract.check({"a": np.arange(8), "b": np.zeros((8, 3), np.float32)}, rows=8)
    assert [a.shape for a in arrays] == [(8,), (8, 3)]
    assert all(isinstance(a, np.ndarray) for a in arrays)
    assert contract.check(BATCH, rows=2 + 6)[0] is BATCH["a"]


@pytest.mark.parametrize(
    ("result", "rows", "message"),
    [
        (np.arange(8), 8, "`map_batch` returned a structure a single array but earlier returned out['a'], out['b']; it must return the same structure for every batch."),
        ({"a": np.arange(5), "b": np.ones((5, 3), np.float32)}, 4, "`map_batch(...)['a']` has shape (5,), but the batch has 4 rows; `map_batch` must keep the batch size (axis 0) of every array it returns."),
        ({"a": np.arange(8), "b": np.ones((8, 3))}, 8, "`map_batch(...)['b']` has rows of shape (3,) and dtype float64, but earlier batches had (3,) and float32; `map_batch` must return the same row shapes and dtypes for every batch."),
    ],
)  # fmt: skip
def test_a_result_unlike_the_first_is_named(result: Any, rows: int, message: str) -> None:
    with pytest.raises(af.MapBatchError) as info:
        _contract().check(result, rows)
    assert str(info.value) == message


def test_apply_names_what_map_batch_raised() -> None:
    def fail(batch: Any) -> Any:
        raise KeyError("row 5")

    with pytest.raises(af.MapBatchError, match=r"^`map_batch` raised KeyError: 'row 5'$") as info:
        _contract().apply(fail, BATCH, rows=8)
    assert isinstance(info.value.__cause__, KeyError)
    assert _contract().apply(lambda b: b, BATCH, rows=8)[1] is BATCH["b"]


def test_is_array_tells_leaves_from_structures() -> None:
    assert is_array(np.zeros(2)) and is_array(np.float32(1))
    assert not is_array((np.zeros(2),)) and not is_array([1]) and not is_array({})
