"""The ``map_batch`` contract: the probe, the per-batch check, and the typed worker replies."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.mapbatch import (
    Contract,
    LeafSpec,
    Mapped,
    Raised,
    Refused,
    is_array,
    probe,
)
from arrayfeed._pipeline.mapworker import Job, LoadFailed, Ready, Task, _run
from arrayfeed._pipeline.structure import flatten

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


def test_messages_across_the_pipe_are_picklable_values() -> None:
    task = Task(((64, (2, 8), "<i8"),), ((192, (2, 8), "<f4"),), steps=2, rows=8, stacked=True)
    contract = _contract()
    for message in (
        Mapped(),
        Raised("KeyError", "'x'", "Traceback ..."),
        Refused("no"),
        task,
        Ready(7),
        LoadFailed("Traceback ..."),
        Job(np.negative, flatten(BATCH, is_array)[1], contract),
    ):
        assert pickle.loads(pickle.dumps(message)) == message


def test_replies_raise_what_a_reader_thread_raises() -> None:
    try:
        {}["row 50"]
    except KeyError as exc:
        raised = Raised.of(exc)
    assert (raised.name, raised.message) == ("KeyError", "'row 50'")
    error = raised.error()
    assert isinstance(error, af.MapBatchError)
    assert str(error).startswith(
        "`map_batch` raised KeyError: 'row 50' (in a worker process; its traceback:)\n"
        "Traceback (most recent call last):"
    )
    assert str(Refused("the message").error()) == "the message"


def _group(fn: Any, steps: int = 2, rows: int = 4) -> tuple[Any, np.ndarray, np.ndarray]:
    """Run a stacked group of ``steps`` batches of ``rows`` through a worker's task runner, in
    this process, over a plain buffer standing in for the shared file."""
    x = np.arange(steps * rows, dtype=np.int64).reshape(steps, rows)
    contract, _ = probe(fn, x[0], rows=rows, batch_size=rows)
    buf = np.zeros(1024, np.uint8)
    buf[: x.nbytes] = x.view(np.uint8).ravel()
    spec = contract.specs[0]
    task = Task(
        ((0, x.shape, x.dtype.str),),
        ((512, (steps, rows, *spec.row_shape), spec.dtype.str),),
        steps=steps,
        rows=rows,
        stacked=True,
    )
    _, treedef = flatten(x[0], is_array)
    reply = _run(Job(fn, treedef, contract), buf, task)
    out = buf[512 : 512 + x.size * spec.dtype.itemsize].view(spec.dtype).reshape(x.shape)
    return reply, x, out


def test_a_worker_maps_a_group_in_place() -> None:
    reply, x, out = _group(lambda b: b * 10)
    assert reply == Mapped()
    np.testing.assert_array_equal(out, x * 10)


def test_a_worker_refuses_with_the_threads_message() -> None:
    calls = [0]

    def changes(batch: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return batch if calls[0] < 3 else batch.astype(np.float32)

    reply, _, _ = _group(changes)
    assert isinstance(reply, Refused)
    with pytest.raises(af.MapBatchError) as threads:
        _contract_of(np.arange(4)).check(np.zeros(4, np.float32), rows=4)
    assert reply.message == str(threads.value)


def _contract_of(batch: np.ndarray) -> Contract:
    return probe(lambda b: b, batch, rows=len(batch), batch_size=len(batch))[0]


def test_a_worker_reports_what_map_batch_raised() -> None:
    def fail(batch: np.ndarray) -> np.ndarray:
        if batch[0] >= 4:
            raise ValueError("second batch")
        return batch

    reply, _, _ = _group(fail)
    assert isinstance(reply, Raised)
    assert (reply.name, reply.message) == ("ValueError", "second batch")
    assert "in fail" in reply.traceback
