"""ResumeCallback: real Keras ``fit`` interrupted and resumed with ``BackupAndRestore``."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import arrayfeed as af

N, BATCH, EPOCHS = 60, 8, 3  # 8 steps per epoch, the last one short


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((N, 3), dtype=np.float32)
    x[:, 0] = np.arange(N)  # the row id travels in the first feature
    return x, x[:, 1:].sum(axis=1, keepdims=True)


def _model(seen: dict[int, list[np.ndarray]], epoch: list[int]) -> keras.Model:
    """A built, compiled model that records the row ids of every batch it trains on."""

    class Recording(keras.Sequential):  # type: ignore[misc]
        def train_step(self, data: Any) -> Any:
            seen[epoch[0]].append(data[0].numpy()[:, 0].astype(np.int64))
            return super().train_step(data)

    keras.utils.set_random_seed(1)
    model = Recording([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse", run_eagerly=True)
    return model


class EpochTracker(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, epoch: list[int]) -> None:
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch[0] = epoch


class Preempt(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, epoch: int, batch: int) -> None:
        super().__init__()
        self.at, self.epoch = (epoch, batch), -1

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if (self.epoch, batch) == self.at:
            raise RuntimeError("preempted")


def _fit(callbacks: list[Any]) -> tuple[keras.Model, dict[int, list[np.ndarray]]]:
    """A fresh process's view: a new dataset (same seed), a new model, then fit."""
    seen: dict[int, list[np.ndarray]] = defaultdict(list)
    epoch = [0]
    x, y = _data()
    ds = af.from_arrays(x, y, batch_size=BATCH, seed=3)
    model = _model(seen, epoch)
    try:
        model.fit(
            ds,
            epochs=EPOCHS,
            verbose=0,
            callbacks=[EpochTracker(epoch), af.ResumeCallback(ds), *callbacks],
        )
    except RuntimeError as exc:
        assert "preempted" in str(exc)
    return model, seen


def _assert_epochs_equal(got: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected) == 8
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


@pytest.fixture(scope="module")
def uninterrupted() -> tuple[list[np.ndarray], dict[int, list[np.ndarray]]]:
    model, seen = _fit([])
    assert sorted(seen) == [0, 1, 2]
    assert not np.array_equal(seen[0][0], seen[1][0])  # epochs differ: the check means something
    return model.get_weights(), seen


@pytest.mark.slow
@pytest.mark.parametrize("save_freq", ["epoch", 3])
# Keras' own weight saving warns under NumPy 2 (keras/src/backend/tensorflow/core.py).
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
def test_fit_preempted_then_resumed_trains_on_the_uninterrupted_batches(
    tmp_path: Path,
    save_freq: str | int,
    uninterrupted: tuple[list[np.ndarray], dict[int, list[np.ndarray]]],
) -> None:
    reference_weights, reference = uninterrupted
    backup = str(tmp_path / "backup")
    _, before = _fit([keras.callbacks.BackupAndRestore(backup, save_freq=save_freq), Preempt(1, 4)])
    assert sorted(before) == [0, 1] and len(before[1]) == 5  # preempted in epoch 1 after step 4
    _assert_epochs_equal(before[0], reference[0])

    resumed_model, after = _fit([keras.callbacks.BackupAndRestore(backup, save_freq=save_freq)])
    # Keras resumes at epoch 1 (from its first batch, also with save_freq=3: Keras 3.15 keeps the
    # batch in its backup but restarts the epoch); the dataset follows and gives the same batches.
    assert sorted(after) == [1, 2]
    for epoch in (1, 2):
        _assert_epochs_equal(after[epoch], reference[epoch])
    if save_freq == "epoch":  # same weights after epoch 0, then the same batches: same weights
        for got, expected in zip(resumed_model.get_weights(), reference_weights, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_callback_needs_an_arrayfeed_dataset() -> None:
    import tensorflow as tf

    with pytest.raises(af.ConfigError, match=r"was not made by arrayfeed\.from_arrays"):
        af.ResumeCallback(tf.data.Dataset.range(3))


@pytest.mark.slow
def test_callback_refuses_steps_per_epoch_that_splits_epochs() -> None:
    x, y = _data()
    ds = af.from_arrays(x, y, batch_size=BATCH, seed=3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(af.ConfigError, match="fit runs 3 steps per epoch and the dataset has 8"):
        model.fit(ds, epochs=1, steps_per_epoch=3, verbose=0, callbacks=[af.ResumeCallback(ds)])


def test_on_epoch_begin_moves_the_dataset_to_keras_epoch() -> None:
    x, y = _data()
    ds = af.from_arrays(x, y, batch_size=BATCH, seed=3)
    reference = [b[0].numpy()[:, 0] for b in af.from_arrays(x, y, batch_size=BATCH, seed=3)]
    callback = af.ResumeCallback(ds.prefetch(2))
    callback.on_epoch_begin(0)
    got = [b[0].numpy()[:, 0] for b in ds]
    for g, e in zip(got, reference, strict=True):
        np.testing.assert_array_equal(g, e)


def _sleepy(batch: Any) -> Any:
    import time

    time.sleep(0.02)  # reads that take 20 ms a batch (without the GIL)
    return batch


class _SlowStep(keras.callbacks.Callback):  # type: ignore[misc]
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        import time

        time.sleep(0.02)  # a training step of 20 ms more


@pytest.mark.parametrize(
    ("reads", "step", "waits"), [("slow", "fast", True), ("fast", "slow", False)]
)
def test_data_wait_in_fit_tells_an_input_bound_epoch_from_a_compute_bound_one(
    reads: str, step: str, waits: bool
) -> None:
    """``DataWait`` adds ``data_wait`` to every epoch's logs: most of the epoch when reads take
    20 ms a batch and training none; little when training takes 20 ms a step and reads none."""
    x, y = _data()
    mapped = {"map_batch": _sleepy, "num_threads": 1} if reads == "slow" else {}
    train = af.from_arrays(x, y, batch_size=BATCH, seed=0, processes=0, **mapped)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    callbacks = [af.DataWait(train)] + ([_SlowStep()] if step == "slow" else [])
    history = model.fit(train, epochs=3, verbose=0, callbacks=callbacks)
    waits_seen = history.history["data_wait"]
    assert len(waits_seen) == 3 and all(0.0 <= w <= 1.0 for w in waits_seen)
    assert (waits_seen[-1] > 0.5) if waits else (waits_seen[-1] < 0.5), waits_seen


def test_data_wait_refuses_what_is_not_an_arrayfeed_dataset() -> None:
    with pytest.raises(TypeError, match=r"arrayfeed\.batches or arrayfeed\.from_arrays"):
        af.DataWait(np.zeros(3))


def _fit_on(shard: Any, backup_dir: Path, preempt: bool) -> tuple[dict[int, list[np.ndarray]], Any]:
    """One worker's process: the dataset resumes from the state saved in ``backup_dir``."""
    seen: dict[int, list[np.ndarray]] = defaultdict(list)
    epoch = [0]
    backup = keras.callbacks.BackupAndRestore(str(backup_dir), save_freq=2)
    saved = af.ResumeCallback.saved_state(backup)
    x, y = _data()
    ds = af.from_arrays(x, y, batch_size=BATCH, seed=3, shard=shard, resume=saved)
    model = _model(seen, epoch)
    callbacks = [EpochTracker(epoch), backup, af.ResumeCallback(ds, backup=backup)]
    try:
        model.fit(
            ds, epochs=EPOCHS, verbose=0, callbacks=[*callbacks, *([Preempt(1, 2)] * preempt)]
        )
    except RuntimeError as exc:
        assert "preempted" in str(exc)
    return seen, af.ResumeCallback.saved_state(backup)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")
@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_fit_preempted_on_two_workers_resumes_on_one_with_every_row_once(tmp_path: Path) -> None:
    before, states = [], []
    for k in range(2):  # each worker of the first run, preempted in epoch 1 after batch 2
        seen, saved = _fit_on(af.Shard(2, k), tmp_path / f"backup{k}", preempt=True)
        before.append(seen[1][:2])  # the backup (save_freq=2) holds batches 0..1 of epoch 1
        states.append(saved)
    assert states[0] == states[1] and (states[0]["epoch"], states[0]["step"]) == (1, 2)
    # One worker now (shard="auto" would count one): Keras restores epoch 1 from the backup.
    after, _ = _fit_on(None, tmp_path / "backup0", preempt=False)
    assert sorted(after) == [1, 2]
    rows = np.concatenate([*before[0], *before[1], *after[1]])
    assert len(np.unique(rows)) == len(rows)  # none twice
    assert len(rows) == N  # 2 x (30 - 16) rows left: 28 = 3 x 8 + 4, one worker's last steps
    assert sorted(np.concatenate(after[2]).tolist()) == list(range(N))  # then whole epochs
