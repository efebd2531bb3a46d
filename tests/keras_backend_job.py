"""Keras ``fit`` on the backend named by ``KERAS_BACKEND``, recording the rows of every step.

Run by tests/test_keras_backends.py in a fresh process (Keras picks its backend at import).
Prints one JSON object: per scenario, per Keras epoch, the row ids of each batch trained on, the
stream ``arrayfeed.batches`` gives for the same arguments (epoch by epoch) to compare with, and how
many epochs tf.data pulled from the training feed (Keras on JAX and torch takes the NumPy batches of
a dataset as ``from_arrays`` returned it directly, and of a derived dataset through tf.data).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from typing import Any

import keras
import numpy as np

import arrayfeed as af
from arrayfeed._pipeline.api import dataset as af_dataset

N, BATCH, EPOCHS, SEED = 60, 8, 3, 5  # 8 steps per epoch, the last one short
#: Where the training datasets are read: "loader" (a loader process), else this process.
PROCESSES = 1 if sys.argv[1:] == ["loader"] else 0


def _data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).random((N, 3), dtype=np.float32)
    x[:, 0] = np.arange(N)  # the row id travels in the first feature
    return x, x[:, 1:].sum(axis=1, keepdims=True)


def _model(seen: dict[int, list[list[int]]], epoch: list[int]) -> keras.Model:
    """A compiled, unbuilt model that records the row ids of every batch it trains on."""

    class Recording(keras.Sequential):  # type: ignore[misc]
        def train_step(self, *args: Any) -> Any:
            data = args[-1]  # JAX: (state, data); TensorFlow and torch: (data,)
            ids = keras.ops.convert_to_numpy(data[0])[:, 0]
            seen[epoch[0]].append(ids.astype(np.int64).tolist())
            return super().train_step(*args)

    keras.utils.set_random_seed(1)
    model = Recording([keras.layers.Dense(4), keras.layers.Dense(1)])  # built by fit
    model.compile(keras.optimizers.Adam(0.01), "mse", run_eagerly=True)
    return model


class _Epoch(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, epoch: list[int]) -> None:
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch[0] = epoch


_TF_DATA_PULLS: dict[int, int] = defaultdict(int)  # id(feed) -> epochs tf.data's generator began


def _count_tf_data_pulls() -> None:
    through_tf_data = af_dataset._WeakFeed.__call__

    def counted(self: Any) -> Any:
        feed = self._feed()
        _TF_DATA_PULLS[id(feed)] += 1
        return through_tf_data(self)

    af_dataset._WeakFeed.__call__ = counted  # type: ignore[method-assign]


def _fit(
    *, resume: bool, initial_epoch: int = 0, validate: bool = False, derived: bool = False
) -> dict[str, Any]:
    x, y = _data()
    made = af.from_arrays(x, y, batch_size=BATCH, seed=SEED, processes=PROCESSES)
    assert made._arrayfeed_feed.processes == PROCESSES
    ds = made.map(lambda *batch: batch) if derived else made
    seen: dict[int, list[list[int]]] = defaultdict(list)
    epoch = [0]
    callbacks: list[Any] = [_Epoch(epoch)]
    if resume:
        callbacks.append(af.ResumeCallback(ds))
    callbacks.append(af.DataWait(ds))
    val = af.from_arrays(x, y, batch_size=BATCH, shuffle=False) if validate else None
    history = _model(seen, epoch).fit(
        ds,
        epochs=EPOCHS,
        initial_epoch=initial_epoch,
        validation_data=val,
        verbose=0,
        callbacks=callbacks,
    )
    expected = af.batches(x, y, batch_size=BATCH, seed=SEED)
    stream = {e: [b[0][:, 0].astype(np.int64).tolist() for b in expected] for e in range(EPOCHS)}
    return {
        "seen": {str(k): v for k, v in seen.items()},
        "stream": {str(k): v for k, v in stream.items()},
        "next_position": list(made._arrayfeed_feed.next_position),
        "tf_data_pulls": _TF_DATA_PULLS[id(made._arrayfeed_feed)],
        "data_wait": history.history.get("data_wait"),
    }


def main() -> None:
    _count_tf_data_pulls()
    result = {
        "backend": keras.backend.backend(),
        "processes": PROCESSES,
        "plain": _fit(resume=False),
        "validated": _fit(resume=False, validate=True),
        "resumed": _fit(resume=True, initial_epoch=1),
        "derived": _fit(resume=False, derived=True),
    }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    assert os.environ.get("KERAS_BACKEND"), "set KERAS_BACKEND"
    main()
