"""Train with ``tf.distribute.MirroredStrategy`` from ``.npy`` files on disk (one machine).

Uses every GPU when there are some; on a machine without GPUs it splits the CPU into two
logical devices, so the strategy really runs two replicas. Run: ``python examples/mirrored.py``.

A dataset from ``arrayfeed.from_arrays`` goes straight to ``model.fit``: Keras splits each batch
of ``batch_size`` rows over the replicas (32 per replica here). The second part trains the same
model in a custom loop over ``arrayfeed.distribute``, which gives each replica its own batches
of ``global_batch_size // num_replicas_in_sync`` rows.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

if not tf.config.list_physical_devices("GPU"):
    # Must happen before TensorFlow initialises its devices (before any op runs).
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras

import arrayfeed as af

ROWS, GLOBAL_BATCH, EPOCHS = 20_000, 64, 3
TRUE_W = np.array([1.0, -2.0, 3.0, 0.5], np.float32)


def make_data(folder: str) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    y = (x @ TRUE_W + 0.01 * rng.normal(size=ROWS)).astype(np.float32)[:, None]
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y)
    return os.path.join(folder, "x.npy"), os.path.join(folder, "y.npy")


def main() -> None:
    start = time.perf_counter()
    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    print(f"{strategy.num_replicas_in_sync} replicas on {devices}")

    with tempfile.TemporaryDirectory() as folder:
        x_path, y_path = make_data(folder)

        # 1. model.fit: a batch of GLOBAL_BATCH rows per step, split over the replicas by Keras.
        ds = af.from_arrays(x_path, y_path, batch_size=GLOBAL_BATCH, seed=0)
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        # shuffle=False: arrayfeed reshuffles every epoch itself; Keras cannot shuffle a dataset.
        history = model.fit(ds, epochs=EPOCHS, verbose=0, shuffle=False)
        print(
            f"fit: {len(ds)} steps per epoch, loss per epoch {np.round(history.history['loss'], 5)}"
        )

        # 2. A custom loop over arrayfeed.distribute (distribute_datasets_from_function inside).
        dist = af.distribute(strategy, x_path, y_path, global_batch_size=GLOBAL_BATCH, seed=1)
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.SGD(0.05)

        def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                per_row = tf.reduce_sum((model(x, training=True) - y) ** 2, axis=1)
                loss = tf.nn.compute_average_loss(per_row, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        @tf.function
        def train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
            losses = strategy.run(step_fn, args=batch)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        for epoch in range(EPOCHS):
            steps, total = 0, 0.0
            for batch in dist:  # each pass is the next epoch, freshly shuffled
                total += float(train_step(batch))
                steps += 1
            print(
                f"custom loop: epoch {epoch + 1}, {steps} steps "
                f"(distributed_steps={af.distributed_steps(dist)}), mean loss {total / steps:.5f}"
            )
        print("learned", np.round(model.layers[0].kernel.numpy().ravel(), 3), "true", TRUE_W)
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
