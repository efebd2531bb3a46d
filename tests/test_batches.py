"""``arrayfeed.batches``: NumPy batches without TensorFlow, the same stream as ``from_arrays``."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import arrayfeed as af
from arrayfeed._pipeline.plan.plan import shard_bounds
from arrayfeed._pipeline.plan.shard import ENV_VARIABLES

from .conftest import subprocess_env

Write = Callable[[str, str, np.ndarray], object]
N = 103  # prime: batches and shards never divide evenly
EPOCHS = 3


def _data(write: Write, backends: tuple[str, str, str] = ("ndarray", "ndarray", "ndarray")) -> Any:
    """``(x, y, w)``: nested leaves of several dtypes; row ``i`` of ``y[0]`` is ``i``."""
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(N, 2, 3), dtype=np.uint8)
    real = rng.normal(size=(N, 4)).astype(np.float32)
    real[::7, 0] = -0.0
    real[::11, 1] = np.float32("nan")
    real[::13, 2] = np.inf
    ids = np.arange(N, dtype=np.int64)
    flags = ids % 3 == 0
    x = {"img": write(backends[0], "img", img), "real": write(backends[1], "real", real)}
    y = [write(backends[2], "ids", ids), flags]
    w = (np.arange(N) / 7).astype(np.float16)
    return x, y, w


def _numpy(batch: Any) -> Any:
    return tf.nest.map_structure(lambda t: t.numpy(), batch)


def _tf_passes(ds: tf.data.Dataset, count: int) -> list[list[Any]]:
    return [[_numpy(b) for b in ds] for _ in range(count)]


def _np_passes(b: af.Batches, count: int) -> list[list[Any]]:
    return [list(b) for _ in range(count)]


def _assert_identical(got: Any, expected: Any) -> None:
    """Same structure (dict / tuple, same keys), same dtypes and shapes, same bytes."""
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            _assert_identical(got[key], expected[key])
    elif isinstance(expected, tuple):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _assert_identical(g, e)
    else:
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()


def _assert_same_passes(got: list[list[Any]], expected: list[list[Any]]) -> None:
    assert [len(p) for p in got] == [len(p) for p in expected]
    for g_pass, e_pass in zip(got, expected, strict=True):
        for g, e in zip(g_pass, e_pass, strict=True):
            _assert_identical(g, e)


def _pair_up(batch: Any) -> Any:
    x, y, w = batch
    return {"pixels": x["img"].reshape(len(w), 6).astype(np.float32) / 255, "ids": y[0]}, w * 2


CONFIGS: dict[str, dict[str, Any]] = {
    "shuffled": {"batch_size": 10, "seed": 3},
    "storage_order": {"batch_size": 16, "shuffle": False},
    "block": {"batch_size": 8, "seed": 4, "shuffle": "block"},
    "shard_1_of_3": {"batch_size": 7, "seed": 5, "shard": af.Shard(3, 1)},
    "drop_remainder_shard_0_of_2": {
        "batch_size": 10,
        "seed": 6,
        "drop_remainder": True,
        "shard": af.Shard(2, 0),
    },
    "map_batch": {"batch_size": 9, "seed": 7, "map_batch": _pair_up, "num_threads": 1},
    "resumed": {"batch_size": 10, "seed": 8, "start_epoch": 2, "start_step": 3},
    "resumed_block_unsharded": {
        "batch_size": 6,
        "seed": 9,
        "shuffle": "block",
        "shard": None,
        "start_epoch": 5,
        "start_step": 16,
    },
}


@pytest.mark.parametrize("stacked", [True, False], ids=["groups", "one_batch_per_group"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_stream_equals_from_arrays_bit_for_bit(
    config: str, stacked: bool, write: Write, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks and windows, so that "block" really orders blocks of the Zarr / HDF5 chunks.
    monkeypatch.setattr("arrayfeed._pipeline.plan.shuffles.MIN_BLOCK_BYTES", 1)
    monkeypatch.setattr("arrayfeed._pipeline.plan.shuffles.WINDOW_BYTES", 2048)
    if not stacked:  # every batch exceeds a group: batches come one per feed element
        monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 1)
    kwargs = CONFIGS[config]
    x, y, w = _data(write, ("zarr", "hdf5", "npy_path"))
    ds = af.from_arrays(x, y, w, **kwargs)
    b = af.batches(x, y, w, **kwargs)
    assert b._feed.stacked is stacked
    assert len(b) == len(ds)
    expected = _tf_passes(ds, EPOCHS)
    _assert_same_passes(_np_passes(b, EPOCHS), expected)
    if kwargs.get("start_step"):
        assert len(expected[0]) == len(b) - kwargs["start_step"]  # the resumed first pass
        assert len(expected[1]) == len(b)


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (lambda x, y, w: (x["real"],), np.ndarray),
        (lambda x, y, w: ([x["real"], x["img"]], y[0]), tuple),
        (lambda x, y, w: (x, {"a": y[0]}, w), tuple),
    ],
    ids=["x_alone", "list_x_and_y", "x_y_sample_weight"],
)
def test_structures_match_from_arrays(args: Callable[..., Any], kind: type, write: Write) -> None:
    element = args(*_data(write))
    expected = _tf_passes(af.from_arrays(*element, batch_size=20, seed=1), 2)
    got = _np_passes(af.batches(*element, batch_size=20, seed=1), 2)
    _assert_same_passes(got, expected)
    assert isinstance(got[0][0], kind)


def test_len_is_steps_per_epoch() -> None:
    assert len(af.batches(np.zeros((N, 4)), batch_size=10)) == 11
    assert len(af.batches(np.zeros((N, 4)), batch_size=10, drop_remainder=True)) == 10
    assert len(af.batches(np.zeros((N, 4)), batch_size=10, shard=af.Shard(2, 1))) == 6
    sizes = [len(batch) for batch in af.batches(np.zeros((N, 4)), batch_size=10)]
    assert sizes == [10] * 10 + [3]


def test_each_iteration_is_the_next_epoch() -> None:
    b = af.batches(np.arange(N), batch_size=10, seed=2)
    plan = b._feed.plan
    it = iter(b)  # an iteration that never asks for a batch does not use up an epoch
    del it
    for epoch in range(3):
        assert b.position == (epoch, 0)
        np.testing.assert_array_equal(np.concatenate(list(b)), plan.indices(epoch, 0, plan.steps))
    assert b.position == (3, 0)


def test_position_follows_the_batches_consumed() -> None:
    b = af.batches(np.arange(N), batch_size=10, seed=2, start_epoch=4, start_step=8)
    assert b.position == (4, 8)
    seen = []
    for _ in b:
        seen.append(b.position)
    assert seen == [(4, 9), (4, 10), (5, 0)]
    seen = []
    for _ in b:
        seen.append(b.position)
    assert seen == [(5, s) for s in range(1, 11)] + [(6, 0)]


@pytest.mark.parametrize(
    "config", ["shuffled", "block", "map_batch", "drop_remainder_shard_0_of_2"]
)
@pytest.mark.parametrize("consumed", [0, 1, 4])
def test_resuming_from_a_saved_position_continues_exactly(
    config: str, consumed: int, write: Write
) -> None:
    kwargs = CONFIGS[config]
    x, y, w = _data(write, ("npy_path", "zarr", "hdf5"))
    reference = _np_passes(af.batches(x, y, w, **kwargs), 3)  # an uninterrupted run
    b = af.batches(x, y, w, **kwargs)
    list(b)  # epoch 0
    if consumed:
        for i, _ in enumerate(b):  # epoch 1, interrupted after `consumed` batches
            if i + 1 == consumed:
                break
    saved = b.position  # what a checkpoint stores
    assert saved == (1, consumed)
    resumed = af.batches(x, y, w, **kwargs, start_epoch=saved[0], start_step=saved[1])
    first, second = _np_passes(resumed, 2)
    _assert_same_passes([first, second], [reference[1][consumed:], reference[2]])


def test_an_abandoned_epoch_is_used_up_unless_seeked_back() -> None:
    b = af.batches(np.arange(N), batch_size=10, seed=5)
    plan = b._feed.plan
    for i, _ in enumerate(b):
        if i == 3:
            break
    assert b.position == (0, 4)
    copy = pickle.loads(pickle.dumps(b))  # the feed pickles by path, the position with it
    assert copy.position == (0, 4)
    # As with from_arrays, the next iteration is the next epoch …
    np.testing.assert_array_equal(np.concatenate(list(b)), plan.indices(1, 0, plan.steps))
    # … and seek(*position) continues the abandoned one instead.
    copy.seek(*copy.position)
    np.testing.assert_array_equal(np.concatenate(list(copy)), plan.indices(0, 4, plan.steps))
    assert copy.position == (1, 0)
    with pytest.raises(af.ConfigError, match=r"`step` \(11\) must be less than the 11 steps"):
        b.seek(0, 11)


def test_pickled_batches_give_the_same_stream(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(N * 3, dtype=np.float32).reshape(N, 3))
    b = af.batches(str(tmp_path / "x.npy"), np.arange(N), batch_size=8, seed=11)
    copy = pickle.loads(pickle.dumps(b))
    _assert_same_passes(_np_passes(copy, 2), _np_passes(b, 2))
    assert "position=(2, 0)" in repr(b)


@pytest.mark.parametrize("processes", [0, 1], ids=["threads", "loader"])
def test_batches_are_owned_by_the_consumer(tmp_path: Path, processes: int) -> None:
    n = 600  # 6 KB rows gathered from the map into pooled group buffers (or loader slots)
    a = np.random.default_rng(1).integers(0, 255, size=(n, 2048, 3), dtype=np.uint8)
    np.save(tmp_path / "a.npy", a)
    b = af.batches(
        str(tmp_path / "a.npy"), np.arange(n), batch_size=32, seed=3, processes=processes
    )
    assert b._feed.stacked
    held = []
    for epoch in range(4):
        for i, (xb, yb) in enumerate(b):
            assert xb.flags.writeable
            if i % 3 == epoch % 3:
                held.append((xb, yb))
            else:
                xb[...] = 255  # writing into a batch never reaches another batch or the file
    if processes:  # slots were written again while we held batches of others
        slots = b._feed._remote.slots
        assert slots.lent > slots.made
    else:
        assert b._feed.pool.reused > 0  # the pool recycled buffers while we held batches
    for xb, yb in held:
        np.testing.assert_array_equal(xb, a[yb])
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a)


def test_errors_are_those_of_from_arrays() -> None:
    x = np.zeros((N, 2))
    with pytest.raises(af.StructureError, match="`sample_weight` needs `y`"):
        af.batches(x, sample_weight=np.ones(N))
    with pytest.raises(
        af.ShapeError, match=r"x: 103, y: 5; trim or align them before calling batches"
    ):
        af.batches(x, np.ones(5))
    with pytest.raises(af.ConfigError, match=r"`batch_size` must be a positive int \(got 0\)"):
        af.batches(x, batch_size=0)
    with pytest.raises(af.ConfigError, match=r"`shuffle` must be True"):
        af.batches(x, shuffle="yes")
    message = r"`shard` must be 'auto', None or arrayfeed.Shard\(count, index\) \(got 3\)\.$"
    with pytest.raises(af.ConfigError, match=message):
        af.batches(x, shard=3)  # type: ignore[arg-type]
    with pytest.raises(af.ConfigError, match=r"`map_batch` takes 2 arguments"):
        af.batches(x, np.ones(N), map_batch=lambda a, b: (a, b))  # type: ignore[arg-type,misc]
    with pytest.raises(af.ConfigError, match=r"`start_step` \(11\) must be less than the 11 steps"):
        af.batches(x, batch_size=10, seed=0, start_step=11)
    with pytest.raises(af.ConfigError, match=r"pass the `seed` used before"):
        af.batches(x, batch_size=10, start_epoch=1)


def test_errors_while_reading_are_raised_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 1)  # one batch per group

    def fail_on_row_50(batch: np.ndarray) -> np.ndarray:
        if 50 in batch:
            raise KeyError("row 50")
        return batch

    b = af.batches(np.arange(N), batch_size=10, shuffle=False, map_batch=fail_on_row_50)
    with pytest.raises(af.MapBatchError, match=r"`map_batch` raised KeyError: 'row 50'"):
        list(b)
    assert b.position == (0, 5)  # the batches before the failing one were yielded
    b.seek(0, 6)
    assert len(list(b)) == 5


_NO_TF_SCRIPT = """
import importlib.abc, json, sys

attempted = []

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "keras"):
            attempted.append(name)
        return None

sys.meta_path.insert(0, Watch())

import h5py, numpy as np, zarr
import arrayfeed as af

root = sys.argv[1]
n = 500
x = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
np.save(f"{root}/x.npy", x)
with h5py.File(f"{root}/d.h5", "w") as f:
    f.create_dataset("chunked", data=x, chunks=(16, 4), compression="gzip")
    f.create_dataset("contiguous", data=np.arange(n))
z = zarr.create_array(f"{root}/y.zarr", shape=(n,), dtype="int64", chunks=(32,))
z[...] = np.arange(n)
h5 = h5py.File(f"{root}/d.h5", "r")
inputs = {
    "npy": f"{root}/x.npy",
    "h5py": h5["chunked"],
    "open_array_h5": af.open_array(f"{root}/d.h5", "contiguous"),
    "zarr": zarr.open_array(f"{root}/y.zarr", mode="r"),
    "open_array_zarr": af.open_array(f"{root}/y.zarr"),
}
report = {}
for shuffle in (True, "block", False):
    b = af.batches(inputs, np.arange(n), batch_size=64, shuffle=shuffle, seed=0, shard=None)
    ids = []
    for xb, yb in b:
        np.testing.assert_array_equal(xb["npy"], x[yb])
        np.testing.assert_array_equal(xb["h5py"], x[yb])
        for key in ("open_array_h5", "zarr", "open_array_zarr"):
            np.testing.assert_array_equal(xb[key], yb)
        ids.extend(yb.tolist())
    report[str(shuffle)] = sorted(ids) == list(range(n))
report["tensorflow_loaded"] = "tensorflow" in sys.modules
report["keras_loaded"] = "keras" in sys.modules
report["attempted"] = attempted
print(json.dumps(report))
"""


@pytest.mark.slow
def test_batches_never_import_tensorflow(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_NO_TF_SCRIPT), str(tmp_path)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {
        "True": True,
        "block": True,
        "False": True,
        "tensorflow_loaded": False,
        "keras_loaded": False,
        "attempted": [],
    }


_RANK_SCRIPT = """
import json, sys
import numpy as np
import arrayfeed as af

b = af.batches(sys.argv[1], batch_size=10, seed=3)  # shard="auto"
print(json.dumps([row for epoch in range(2) for xb in b for row in xb[:, 0].tolist()]))
"""


@pytest.mark.slow
def test_processes_under_torchrun_read_disjoint_shards(tmp_path: Path) -> None:
    """Four processes with the variables torchrun sets (two per node, each node a task that
    `srun` started) each read their own contiguous shard, by default: nothing read twice."""
    n, world = 203, 4
    np.save(tmp_path / "x.npy", np.repeat(np.arange(n, dtype=np.int64)[:, None], 3, axis=1))
    base = {k: v for k, v in subprocess_env().items() if k not in ENV_VARIABLES}
    procs = []
    for rank in range(world):
        env = dict(base, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % 2))
        env.update(LOCAL_WORLD_SIZE="2", SLURM_PROCID=str(rank // 2), SLURM_NTASKS="2")
        env.update(SLURM_STEP_ID="0")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(_RANK_SCRIPT), str(tmp_path / "x.npy")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    seen = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-4000:]
        seen.append(json.loads(out.strip().splitlines()[-1]))
    per_worker = n // world
    for rank, rows in enumerate(seen):
        epochs = [rows[:per_worker], rows[per_worker:]]
        for got in epochs:  # each epoch: this worker's own range (less one leftover row), shuffled
            assert len(got) == per_worker == len(set(got))
            assert set(got) <= set(range(*shard_bounds(n, af.Shard(world, rank))))
        assert epochs[0] != epochs[1]  # reshuffled
    firsts = [set(rows[:per_worker]) for rows in seen]
    assert all(a.isdisjoint(b) for i, a in enumerate(firsts) for b in firsts[i + 1 :])
