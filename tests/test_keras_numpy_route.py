"""Keras' tf.data adapter takes an arrayfeed dataset's NumPy batches directly.

On the JAX and torch backends Keras iterates a ``tf.data.Dataset`` in Python through
``TFDatasetAdapter.get_numpy_iterator`` / ``get_jax_iterator`` / ``get_torch_dataloader``.
``from_arrays`` makes those methods yield the feed's NumPy batches for a dataset exactly as it was
returned; these tests drive the adapter in this process (whatever the backend) and compare with
the stream tf.data gives. Real ``fit`` on every backend, and the torch route (Keras' torch backend
cannot be imported next to TensorFlow here): ``test_keras_backends.py``.
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter

import arrayfeed as af
from arrayfeed._pipeline.api import dataset as af_dataset
from arrayfeed._pipeline.api.keras import _numpy_batches_first, serve_numpy_batches

N = 100


@pytest.fixture
def tf_data_pulls(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """``id(feed)`` -> epochs begun through tf.data's generator."""
    pulls: Counter[int] = Counter()
    through_tf_data = af_dataset._WeakFeed.__call__

    def counted(self: Any) -> Any:
        pulls[id(self._feed())] += 1
        return through_tf_data(self)

    monkeypatch.setattr(af_dataset._WeakFeed, "__call__", counted)
    return pulls


def _arrays() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x: dict[str, np.ndarray] = {
        "image": rng.integers(0, 255, (N, 4, 4, 3), dtype=np.uint8),
        "ids": np.arange(N, dtype=np.int64),
    }
    return x, rng.random(N).astype(np.float32), rng.random(N).astype(np.float16)


def _as_numpy(batch: Any) -> Any:
    return tf.nest.map_structure(lambda t: t.numpy(), batch)


def _assert_same_batches(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        tf.nest.assert_same_structure(g, w)
        for a, b in zip(tf.nest.flatten(g), tf.nest.flatten(w), strict=True):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("method", ["get_numpy_iterator", "get_jax_iterator"])
def test_the_adapter_yields_the_tf_data_stream_as_numpy_without_tf_data(
    method: str, drop_remainder: bool, tf_data_pulls: Counter[int]
) -> None:
    if method == "get_jax_iterator" and importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed")
    x, y, w = _arrays()
    args: dict[str, Any] = dict(batch_size=16, seed=7, shard=None, drop_remainder=drop_remainder)
    ds = af.from_arrays(x, y, w, **args)
    twin = af.from_arrays(x, y, w, **args)  # the same stream, read through tf.data
    adapter = TFDatasetAdapter(ds)
    for epoch in range(3):
        got = list(getattr(adapter, method)())
        _assert_same_batches(got, [_as_numpy(b) for b in twin])
        ids = np.concatenate([b[0]["ids"] for b in got])
        assert len(set(ids.tolist())) == len(ids) == (96 if drop_remainder else N)
        assert ds._arrayfeed_feed.next_position == (epoch + 1, 0)
    assert tf_data_pulls[id(ds._arrayfeed_feed)] == 0
    assert tf_data_pulls[id(twin._arrayfeed_feed)] == 3


def test_large_batches_split_from_stacked_groups_are_the_same(tf_data_pulls: Counter[int]) -> None:
    # 12 KiB rows: groups of several batches are stacked and split (views of one buffer here).
    x = np.random.default_rng(0).integers(0, 255, (600, 64, 64, 3), dtype=np.uint8)
    y = np.arange(600, dtype=np.int32)
    ds = af.from_arrays(x, y, batch_size=64, seed=1, shard=None)
    twin = af.from_arrays(x, y, batch_size=64, seed=1, shard=None)
    assert ds._arrayfeed_feed.stacked
    for _ in range(2):
        got = list(TFDatasetAdapter(ds).get_numpy_iterator())
        _assert_same_batches(got, [_as_numpy(b) for b in twin])
        np.testing.assert_array_equal(np.sort(np.concatenate([b[1] for b in got])), y)
    assert tf_data_pulls[id(ds._arrayfeed_feed)] == 0


def test_derived_datasets_and_class_weights_go_through_tf_data(
    tf_data_pulls: Counter[int],
) -> None:
    x, y, _ = _arrays()
    labels = (y * 3).astype(np.int64)
    ds = af.from_arrays(x["image"], labels, batch_size=16, seed=2, shard=None)
    twin = af.from_arrays(x["image"], labels, batch_size=16, seed=2, shard=None)
    feed = ds._arrayfeed_feed
    derived = list(TFDatasetAdapter(ds.map(lambda a, b: (a, b))).get_numpy_iterator())
    _assert_same_batches(derived, [_as_numpy(b) for b in twin])
    assert tf_data_pulls[id(feed)] == 1
    weighted = list(
        TFDatasetAdapter(ds, class_weight={0: 0.5, 1: 2.0, 2: 4.0}).get_numpy_iterator()
    )
    assert tf_data_pulls[id(feed)] == 2
    for (_, yb, sw), (_, want_y) in zip(weighted, (_as_numpy(b) for b in twin), strict=True):
        np.testing.assert_array_equal(yb, want_y)
        np.testing.assert_array_equal(sw, np.array([0.5, 2.0, 4.0])[yb])


def test_prefetch_and_options_are_looked_through(tf_data_pulls: Counter[int]) -> None:
    x, y, w = _arrays()
    ds = af.from_arrays(x, y, w, batch_size=16, seed=5, shard=None)
    twin = af.from_arrays(x, y, w, batch_size=16, seed=5, shard=None)
    options = tf.data.Options()
    options.deterministic = False
    served = ds.prefetch(tf.data.AUTOTUNE).with_options(options).prefetch(2)
    for _ in range(2):
        got = list(TFDatasetAdapter(served).get_numpy_iterator())
        _assert_same_batches(got, [_as_numpy(b) for b in twin])
    assert tf_data_pulls[id(ds._arrayfeed_feed)] == 0
    taken = list(TFDatasetAdapter(ds.prefetch(1).take(len(ds))).get_numpy_iterator())
    _assert_same_batches(taken, [_as_numpy(b) for b in twin])
    assert tf_data_pulls[id(ds._arrayfeed_feed)] == 1  # take: through tf.data


def test_calls_with_arguments_go_to_keras_own_method() -> None:
    calls: list[Any] = []

    def original(self: Any, *args: Any, **kwargs: Any) -> str:
        calls.append((args, kwargs))
        return "keras"

    wrapped = _numpy_batches_first(original, "get_numpy_iterator")
    adapter = TFDatasetAdapter(af.from_arrays(np.zeros((4, 2)), batch_size=2))
    assert wrapped(adapter, 1, key=2) == "keras"  # a Keras that passes more than we know of
    assert calls == [((1,), {"key": 2})]
    assert wrapped(adapter) != "keras" and calls == [((1,), {"key": 2})]


def test_sparse_tensors_go_through_tf_data(tf_data_pulls: Counter[int]) -> None:
    sparse = pytest.importorskip("scipy.sparse")
    m = sparse.random(40, 12, density=0.2, format="csr", dtype=np.float32, random_state=0)
    ds = af.from_arrays(m, np.arange(40), batch_size=8, seed=0, shard=None, sparse=True)
    got = list(TFDatasetAdapter(ds).get_numpy_iterator())
    assert tf_data_pulls[id(ds._arrayfeed_feed)] == 1
    rows = np.concatenate([b[1] for b in got])
    dense = np.concatenate([tf.sparse.to_dense(b[0]).numpy() for b in ds])
    np.testing.assert_array_equal(np.sort(rows), np.arange(40))
    assert dense.shape == (40, 12)


def test_read_errors_are_the_arrayfeed_error_itself(tmp_path: Path) -> None:
    x = np.arange(N * 3, dtype=np.float64).reshape(N, 3)
    path = tmp_path / "x.npy"
    np.save(path, x)
    ds = af.from_arrays(str(path), batch_size=16, seed=0, shard=None)
    adapter = TFDatasetAdapter(ds)
    assert sum(len(b) for b in adapter.get_numpy_iterator()) == N
    before = os.stat(path)
    with open(path, "r+b") as f:  # the file changes between epochs
        f.seek(-8, os.SEEK_END)
        f.write(np.float64(-1.0).tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    with pytest.raises(af.CorruptDataError, match="changed since arrayfeed opened it"):
        next(adapter.get_numpy_iterator())


def test_serving_is_installed_once() -> None:
    af.from_arrays(np.zeros((4, 2)), batch_size=2)
    serve_numpy_batches()
    for method in ("get_numpy_iterator", "get_jax_iterator", "get_torch_dataloader"):
        wrapped = TFDatasetAdapter.__dict__[method]
        assert wrapped._arrayfeed_numpy
        assert not getattr(wrapped.__wrapped__, "_arrayfeed_numpy", False)
