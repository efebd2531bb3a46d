"""``from_arrays`` end to end: real files, real tf.data iteration, real Keras ``fit``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import arrayfeed as af
from arrayfeed._pipeline.plan.plan import Plan

from .conftest import BACKENDS, subprocess_env

Write = Callable[[str, str, np.ndarray], object]
N = 103  # prime, so batches and shards never divide evenly


def _row_ids(element: Any) -> list[np.ndarray]:
    """Row ids decoded from every leaf of a batch (each leaf encodes its row id)."""
    leaves = tf.nest.flatten(element)
    ids = []
    for leaf in leaves:
        a = leaf.numpy()
        ids.append(np.round(a.reshape(len(a), -1)[:, 0].astype(np.float64) / 2).astype(np.int64))
    return ids


def _encoded(n: int, row_shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Row i holds 2*i (mod the dtype's range) in its first element, noise elsewhere."""
    rng = np.random.default_rng(n)
    a = rng.integers(0, 50, size=(n, *row_shape)).astype(dtype)
    a.reshape(n, -1)[:, 0] = (2 * np.arange(n)).astype(dtype)
    return a


def _epoch_ids(ds: tf.data.Dataset) -> np.ndarray:
    batches = []
    for element in ds:
        ids = _row_ids(element)
        for other in ids[1:]:
            np.testing.assert_array_equal(other, ids[0])  # every leaf is the same row
        batches.append(ids[0])
    return np.concatenate(batches)


def test_all_backends_in_one_structure_stay_aligned_after_shuffling(write: Write) -> None:
    leaves = {name: write(name, f"leaf_{name}", _encoded(N, (3,), "float64")) for name in BACKENDS}
    x = {
        "image": leaves["npy_path"],
        "meta": leaves["hdf5"],
        "nested": [leaves["memmap"], leaves["open_array"]],
    }
    y = {"cls": leaves["zarr"], "reg": leaves["ndarray"]}
    ds = af.from_arrays(x, y, batch_size=10, shuffle=True, seed=3)
    assert len(ds) == 11
    first, second = _epoch_ids(ds), _epoch_ids(ds)
    assert sorted(first.tolist()) == list(range(N)) == sorted(second.tolist())
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, np.arange(N))


@pytest.mark.parametrize("dtype", ["uint8", "int64", "float16", "float64", "int32"])
def test_every_backend_keeps_rows_dtype_and_shape(write: Write, backend: str, dtype: str) -> None:
    a = _encoded(N, (2, 3), dtype)
    labels = _encoded(N, (), "int64")
    ds = af.from_arrays(write(backend, "a", a), labels, batch_size=16, seed=1, drop_remainder=True)
    spec_x, spec_y = ds.element_spec
    assert spec_x == tf.TensorSpec((16, 2, 3), tf.as_dtype(dtype))
    assert spec_y == tf.TensorSpec((16,), tf.int64)
    seen = []
    for xb, yb in ds:
        ids = yb.numpy() // 2
        np.testing.assert_array_equal(xb.numpy(), a[ids])
        seen.append(ids)
    assert len(np.concatenate(seen)) == (N // 16) * 16


def test_bool_and_float16_values_exact() -> None:
    flags = np.arange(N) % 3 == 0
    halves = (np.arange(N) / 7).astype(np.float16)
    ds = af.from_arrays({"f": flags, "h": halves}, np.arange(N), batch_size=9, seed=0)
    for xb, yb in ds:
        ids = yb.numpy()
        np.testing.assert_array_equal(xb["f"].numpy(), flags[ids])
        np.testing.assert_array_equal(xb["h"].numpy(), halves[ids])


@pytest.mark.parametrize("drop", [False, True])
def test_large_rows_one_batch_per_generator_call(
    drop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 1 << 20)
    n = 300  # 128 rows of 12 KiB exceed a 1 MiB group: batches are yielded one at a time
    images = (np.arange(n * 64 * 64 * 3) % 251).astype(np.uint8).reshape(n, 64, 64, 3)
    ds = af.from_arrays(images, np.arange(n), batch_size=128, seed=5, drop_remainder=drop)
    assert ds.element_spec[0].shape.as_list() == [128 if drop else None, 64, 64, 3]
    seen = []
    for xb, yb in ds:
        np.testing.assert_array_equal(xb.numpy(), images[yb.numpy()])
        seen.append(yb.numpy())
    assert [len(b) for b in seen] == ([128, 128] if drop else [128, 128, 44])


def test_len_and_dynamic_batch_axis() -> None:
    ds = af.from_arrays(np.zeros((N, 4), np.float32), batch_size=10)
    assert len(ds) == 11
    assert ds.element_spec.shape.as_list() == [None, 4]
    sizes = [len(b) for b in ds]
    assert sizes == [10] * 10 + [3]


def test_shuffle_false_gives_storage_order() -> None:
    ds = af.from_arrays(np.arange(N) * 2, batch_size=7, shuffle=False)
    np.testing.assert_array_equal(np.concatenate([b.numpy() for b in ds]), np.arange(N) * 2)
    np.testing.assert_array_equal(np.concatenate([b.numpy() for b in ds]), np.arange(N) * 2)


def test_elements_are_what_keras_takes() -> None:
    x, y, w = np.zeros((N, 2)), np.ones(N), np.full(N, 0.5)
    assert isinstance(af.from_arrays(x).element_spec, tf.TensorSpec)
    assert len(af.from_arrays(x, y).element_spec) == 2
    assert len(af.from_arrays(x, y, w).element_spec) == 3
    spec = af.from_arrays([x, x], {"o": y}).element_spec
    assert isinstance(spec, tuple) and isinstance(spec[0], tuple) and set(spec[1]) == {"o"}
    with pytest.raises(af.StructureError, match="`sample_weight` needs `y`"):
        af.from_arrays(x, sample_weight=w)


def test_batches_held_across_epochs_stay_intact() -> None:
    a = _encoded(N, (5,), "float32")
    ds = af.from_arrays(a, np.arange(N), batch_size=8, seed=2)
    held = [(xb, yb) for xb, yb in ds]
    snapshot = [(xb.numpy().copy(), yb.numpy().copy()) for xb, yb in held]
    for _ in range(2):
        for _ in ds:
            pass
    for (xb, yb), (xs, ys) in zip(held, snapshot, strict=True):
        np.testing.assert_array_equal(xb.numpy(), xs)
        np.testing.assert_array_equal(yb.numpy(), ys)
        np.testing.assert_array_equal(xs, a[ys])


@pytest.mark.parametrize("processes", [0, 1], ids=["threads", "loader"])
def test_held_batches_stay_intact_while_buffers_are_recycled(
    tmp_path: Path, processes: int
) -> None:
    from arrayfeed._pipeline.api.resume import feeds_of

    n = 600  # 6 KB rows: gathered from the map into pooled buffers (or loader slots)
    a = np.random.default_rng(1).integers(0, 255, size=(n, 2048, 3), dtype=np.uint8)
    np.save(tmp_path / "a.npy", a)
    ds = af.from_arrays(
        str(tmp_path / "a.npy"), np.arange(n), batch_size=32, seed=3, processes=processes
    )
    held = []
    for epoch in range(4):
        for i, (xb, yb) in enumerate(ds):
            if i % 3 == epoch % 3:
                held.append((xb, yb))
    (feed,) = feeds_of(ds)
    if processes:  # slots written again while we held batches of others
        assert feed._remote.slots.lent > feed._remote.slots.made
    else:
        assert feed.pool.reused > 0  # the pool was really recycling while we held batches
    for xb, yb in held:
        np.testing.assert_array_equal(xb.numpy(), a[yb.numpy()])


def test_callers_arrays_are_never_written(tmp_path: Path) -> None:
    a = _encoded(N, (4,), "float32")
    original = a.copy()

    def scribble(batch: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        xb, yb = batch
        xb += 1000  # a map_batch that writes into its input must not reach the caller's array
        return xb, yb

    ds = af.from_arrays(a, np.arange(N), batch_size=8, seed=2, map_batch=scribble)
    ds = ds.map(lambda xb, yb: (xb * 2, yb))  # downstream ops may reuse buffers
    for xb, yb in ds:
        np.testing.assert_array_equal(xb.numpy(), (original[yb.numpy()] + 1000) * 2)
    np.testing.assert_array_equal(a, original)


def test_map_batch_changes_the_signature() -> None:
    images = np.arange(N * 4, dtype=np.uint8).reshape(N, 2, 2)

    def normalise(
        batch: tuple[dict[str, np.ndarray], np.ndarray],
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        x, y = batch
        return {"pixels": x["img"].reshape(len(y), 4).astype(np.float32) / 255}, y.astype(np.int32)

    ds = af.from_arrays({"img": images}, np.arange(N), batch_size=10, seed=0, map_batch=normalise)
    assert ds.element_spec == (
        {"pixels": tf.TensorSpec((None, 4), tf.float32)},
        tf.TensorSpec((None,), tf.int32),
    )
    for xb, yb in ds:
        expected = images[yb.numpy()].reshape(-1, 4).astype(np.float32) / 255
        np.testing.assert_allclose(xb["pixels"].numpy(), expected)


def test_map_batch_error_reaches_the_user() -> None:
    calls = {"n": 0}

    def flaky(batch: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("augmentation exploded on purpose")
        return batch

    ds = af.from_arrays(np.arange(N), batch_size=4, seed=0, map_batch=flaky, num_threads=1)
    with pytest.raises(tf.errors.OpError, match="augmentation exploded on purpose"):
        for _ in ds:
            pass


def test_shards_are_disjoint_contiguous_and_equal_in_steps() -> None:
    data = np.arange(N)
    per_worker = []
    for k in range(4):
        ds = af.from_arrays(data, batch_size=5, seed=11, shard=af.Shard(4, k))
        batches = [b.numpy() for b in ds]
        assert len(batches) == len(ds) == 5  # 25 rows per worker per epoch
        rows = np.concatenate(batches)
        start, stop = (N * k) // 4, (N * (k + 1)) // 4
        assert ((rows >= start) & (rows < stop)).all()
        per_worker.append(rows)
    everything = np.concatenate(per_worker)
    assert len(np.unique(everything)) == len(everything) == 100  # 3 rows left out for equal steps


DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import arrayfeed as af
    ds = af.from_arrays(np.arange(103), batch_size=10, seed=int(sys.argv[1]))
    print(json.dumps([[int(v) for b in ds for v in b.numpy()] for _ in range(3)]))
    """
)


def test_same_seed_same_stream_in_a_fresh_process() -> None:
    def run(seed: int) -> list[list[int]]:
        out = subprocess.run(
            [sys.executable, "-c", DETERMINISM_SCRIPT, str(seed)],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            check=True,
            timeout=120,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    local = af.from_arrays(np.arange(N), batch_size=10, seed=42)
    here = [[int(v) for b in local for v in b.numpy()] for _ in range(3)]
    assert run(42) == here
    assert run(43) != here
    assert len({tuple(epoch) for epoch in here}) == 3


@pytest.mark.parametrize(
    ("kwargs", "error", "builtin", "match"),
    [
        ({"x": np.zeros((5, 2)), "y": np.zeros(4)}, af.ShapeError, ValueError, r"got x: 5, y: 4"),
        (
            {"x": {"a": np.zeros(5), "b": np.zeros(6)}, "y": [np.zeros(5)]},
            af.ShapeError,
            ValueError,
            r"x\['a'\]: 5, x\['b'\]: 6, y\[0\]: 5",
        ),
        ({"x": np.zeros((0, 3))}, af.ShapeError, ValueError, "`x` is empty"),
        ({"x": np.float64(3.0)}, af.ShapeError, ValueError, "0-d"),
        (
            {"x": np.zeros(5), "batch_size": 0},
            af.ConfigError,
            ValueError,
            r"`batch_size` must be a positive int \(got 0\)",
        ),
        ({"x": np.zeros(5), "batch_size": -3}, af.ConfigError, ValueError, "positive int"),
        ({"x": np.array([{}, {}], dtype=object)}, af.DtypeError, TypeError, "dtype object"),
        (
            {"x": "/no/such/file.npy"},
            af.SourceNotFoundError,
            FileNotFoundError,
            "nothing at '/no/such/file.npy'",
        ),
        ({"x": np.zeros(5), "shuffle": "maybe"}, af.ConfigError, ValueError, "`shuffle`"),
        ({"x": np.zeros(5), "seed": -1}, af.ConfigError, ValueError, "`seed`"),
        ({"x": np.zeros(5), "shard": 3}, af.ConfigError, ValueError, "`shard` must be"),
        (
            {"x": np.zeros(5), "map_batch": 3},
            af.ConfigError,
            ValueError,
            "`map_batch` must be callable",
        ),
        ({"x": np.zeros(5), "num_threads": 0}, af.ConfigError, ValueError, "`num_threads`"),
        ({"x": {"a": object()}}, af.StructureError, TypeError, r"`x\['a'\]` is a builtins.object"),
    ],
)
def test_errors_are_named_and_raised_at_call(
    kwargs: dict[str, Any], error: type[Exception], builtin: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        af.from_arrays(**kwargs)
    assert isinstance(info.value, builtin) and isinstance(info.value, af.ArrayfeedError)


def _two_in_two_out() -> keras.Model:
    image = keras.Input((4, 4, 1), name="image")
    meta = keras.Input((3,), name="meta")
    h = keras.layers.Concatenate()([keras.layers.Flatten()(image), meta])
    h = keras.layers.Dense(16, activation="relu")(h)
    model = keras.Model(
        {"image": image, "meta": meta},
        {"cls": keras.layers.Dense(3, name="cls")(h), "reg": keras.layers.Dense(1, name="reg")(h)},
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
    )
    return model


@pytest.mark.slow
def test_keras_fit_multi_input_multi_output_from_disk(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 600
    images = rng.random((n, 4, 4, 1), dtype=np.float32)
    meta = rng.random((n, 3), dtype=np.float32)
    cls = (images.mean(axis=(1, 2, 3)) > 0.5).astype(np.int64) + (meta[:, 0] > 0.5)
    reg = meta.sum(axis=1, keepdims=True)
    np.save(tmp_path / "images.npy", images)
    with h5py.File(tmp_path / "meta.h5", "w") as f:
        f["train/meta"] = meta
    x = {
        "image": str(tmp_path / "images.npy"),
        "meta": h5py.File(tmp_path / "meta.h5", "r")["train/meta"],
    }
    y = {"cls": cls, "reg": reg}
    train = af.from_arrays(x, y, batch_size=32, seed=0)
    val = af.from_arrays(x, y, batch_size=128, shuffle=False)
    model = _two_in_two_out()
    history = model.fit(train, validation_data=val, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert "val_loss" in history.history
    # Keras' extra iterator per epoch must not use up epochs: the next pass is epoch 4.
    plan = Plan(n_rows=n, batch_size=32, seed=0)
    after = np.concatenate([yb["reg"].numpy()[:, 0] for _, yb in train])
    np.testing.assert_allclose(after, reg[plan.indices(4, 0, plan.steps), 0])


@pytest.mark.slow
def test_keras_fit_with_sample_weight() -> None:
    n = 200
    x = np.random.default_rng(1).random((n, 3), dtype=np.float32)
    y = x.sum(axis=1)
    w = np.where(np.arange(n) % 2 == 0, 1.0, 0.0).astype(np.float32)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(af.from_arrays(x, y, w, batch_size=20, seed=0), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def _stages(ds: tf.data.Dataset) -> list[str]:
    """The dataset's transformations, outermost first (``_PrefetchDataset`` -> ``Prefetch``)."""
    names = []
    while ds is not None:
        names.append(type(ds).__name__.strip("_").removesuffix("Dataset"))
        ds = getattr(ds, "_input_dataset", None)
    return names


@pytest.mark.parametrize(
    "row_shape, dtype, batch, split_by",
    [
        ((32,), np.float32, 256, "Unbatch"),  # 32 KiB batches: copied out, no call per batch
        ((64, 64, 3), np.uint8, 256, "FlatMap"),  # 3 MiB batches: slices of their group
    ],
)
def test_groups_are_prefetched_before_the_split(
    row_shape: tuple[int, ...], dtype: type, batch: int, split_by: str
) -> None:
    x = np.zeros((batch * 12, *row_shape), dtype)
    ds = af.from_arrays(x, batch_size=batch, shard=None, drop_remainder=True)
    stages = _stages(ds)
    split = stages.index(split_by)
    assert "Prefetch" in stages[split + 1 :]  # the groups
    assert "Prefetch" not in stages[:split]  # one hand-off per group only
    got = np.concatenate([b.numpy() for b in ds])
    assert got.shape == (batch * 12, *row_shape)


def test_large_batches_share_their_groups_memory(tmp_path: Path) -> None:
    """Batches of 1 MiB or more are slices of their group, not copies in fresh memory: the
    batches of one group lie one after the other in one buffer."""
    n, batch = 256 * 8, 256
    np.save(tmp_path / "x.npy", np.random.default_rng(0).integers(0, 255, (n, 64, 64, 3), np.uint8))
    ds = af.from_arrays(str(tmp_path / "x.npy"), batch_size=batch, shuffle=False, processes=0)
    (feed,) = [ds._arrayfeed_feed]
    assert feed.stacked and feed.group_steps >= 2
    list(ds)  # (the first pass splits its first group: ramp_sizes)
    tensors = list(ds)
    address = [np.from_dlpack(t).ctypes.data for t in tensors]  # the tensor's own memory
    step = batch * 64 * 64 * 3
    assert address[1] - address[0] == step  # the second batch right after the first: one buffer
    batches = [t.numpy() for t in tensors]
    np.testing.assert_array_equal(np.concatenate(batches), np.load(tmp_path / "x.npy"))


def test_autotuning_is_off_and_can_be_turned_back_on() -> None:
    ds = af.from_arrays(np.arange(20.0), batch_size=5, seed=0, shard=None)
    assert ds.options().autotune.enabled is False
    mapped = ds.map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).prefetch(-1)
    assert sorted(np.concatenate([b.numpy() for b in mapped]).tolist()) == list(range(1, 21))
    options = tf.data.Options()
    options.autotune.enabled = True
    assert mapped.with_options(options).options().autotune.enabled is True


@pytest.mark.parametrize("shape", [(50, 0), (50, 3, 0), (50, 0, 4)])
def test_rows_of_zero_bytes_are_refused_at_the_call(shape: tuple[int, ...]) -> None:
    with pytest.raises(af.ShapeError, match=r"hold no data"):
        af.from_arrays(np.zeros(shape, np.float32), np.arange(50), batch_size=8)


def test_map_batch_returning_rows_of_zero_bytes_is_refused() -> None:
    with pytest.raises(af.MapBatchError, match=r"hold no data"):
        af.from_arrays(np.zeros((50, 3), np.float32), map_batch=lambda x: x[:, :0], batch_size=8)


def test_a_two_argument_map_batch_is_told_it_receives_one_element() -> None:
    x, y = np.zeros((10, 2)), np.zeros(10)
    with pytest.raises(af.ConfigError, match=r"takes 2 arguments \(x, y\).*\(x, y\)"):
        af.from_arrays(x, y, map_batch=lambda x, y: (x, y), batch_size=2)
    ds = af.from_arrays(x, y, map_batch=lambda batch, scale=2: (batch[0] * scale, batch[1]))
    assert len(ds) == 1


def test_plain_lists_and_sparse_matrices_get_the_fix() -> None:
    import scipy.sparse

    with pytest.raises(af.StructureError, match=r"list of numbers.*np\.asarray\(x\)"):
        af.from_arrays([1.0, 2.0, 3.0], batch_size=2)
    with pytest.raises(af.StructureError, match=r"list of numbers"):
        af.from_arrays(np.zeros((2, 2)), [[1, 2], [3, 4]], batch_size=2)
    # CSR matrices are read (tests/test_sparse.py); other formats get the conversion to CSR.
    with pytest.raises(af.StructureError, match=r"scipy\.sparse coo_matrix .*\.tocsr\(\)"):
        af.from_arrays(scipy.sparse.coo_matrix(np.eye(5)), batch_size=2)


def test_a_closed_h5py_dataset_is_named_with_the_fix(tmp_path: Path) -> None:
    import h5py

    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.zeros((10, 2))
    f = h5py.File(tmp_path / "a.h5", "r")
    dataset = f["x"]
    f.close()
    with pytest.raises(af.SourceUnavailableError, match=r"file is closed.*open_array"):
        af.from_arrays(dataset, batch_size=2)
