"""A ``MirroredStrategy`` over two logical CPU devices, in its own process (run by the tests).

Logical devices must be configured before TensorFlow initialises its devices, hence a process
of its own. Writes a JSON report: Keras ``fit`` on a from_arrays dataset (rows seen recorded by
the train step), and a custom loop over ``arrayfeed.distribute``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

import arrayfeed as af  # noqa: E402

ROWS, GLOBAL_BATCH, EPOCHS = 1001, 64, 2


def main(out: str) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    features = rng.normal(size=(ROWS, 4)).astype(np.float32)
    target = (features @ np.array([1.0, -2.0, 3.0, 0.5], np.float32))[:, None]
    ids = np.arange(ROWS, dtype=np.int64)
    report: dict[str, Any] = {"replicas": strategy.num_replicas_in_sync}

    # 1. model.fit on a from_arrays dataset: Keras splits each batch over the replicas.
    with_ids = np.concatenate([features, ids[:, None].astype(np.float32)], axis=1)
    ds = af.from_arrays(with_ids, target, batch_size=GLOBAL_BATCH, seed=0)
    seen: list[list[int]] = []

    def record(batch_ids: Any) -> int:
        seen[-1].extend(batch_ids.numpy().astype(np.int64).tolist())
        return 0

    class Linear(keras.Model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1, use_bias=False)

        def call(self, inputs: Any) -> Any:
            return self.dense(inputs[:, :4])

        def train_step(self, data: Any) -> Any:
            tf.py_function(record, [data[0][:, 4]], tf.int64)
            return super().train_step(data)

    class Epochs(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            seen.append([])

    with strategy.scope():
        model = Linear()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(ds, epochs=3, verbose=0, callbacks=[Epochs()])
    stream = af.batches(with_ids, target, batch_size=GLOBAL_BATCH, seed=0)  # epoch 0, 1, 2 …
    report["fit"] = {
        "len_ds": len(ds),
        "loss": history.history["loss"],
        "kernel": model.dense.kernel.numpy().ravel().tolist(),
        "ids": seen,
        "next_position": list(ds._arrayfeed_feed.next_position),
        # The rows of each epoch's first batch in the stream (Keras' look at a batch before
        # building the model must not shift epochs: Keras epoch k trains on epoch k).
        "stream_first": [next(iter(stream))[0][:, 4].astype(np.int64).tolist() for _ in range(3)],
    }

    # 2. A custom loop over arrayfeed.distribute (distribute_datasets_from_function inside).
    dist = af.distribute(
        strategy, {"id": ids, "x": features}, target, global_batch_size=GLOBAL_BATCH, seed=1
    )
    with strategy.scope():
        kernel = tf.Variable(tf.zeros((4, 1)), aggregation=tf.VariableAggregation.MEAN)

    def step_fn(batch: Any) -> Any:
        inputs, y = batch
        with tf.GradientTape() as tape:
            error = tf.matmul(inputs["x"], kernel) - y
            loss = tf.nn.compute_average_loss(
                tf.reduce_sum(error**2, axis=1), global_batch_size=GLOBAL_BATCH
            )
        ctx = tf.distribute.get_replica_context()
        kernel.assign_sub(
            0.1 * ctx.all_reduce(tf.distribute.ReduceOp.SUM, tape.gradient(loss, kernel))
        )
        return inputs["id"], loss

    @tf.function
    def train_step(batch: Any) -> Any:
        batch_ids, loss = strategy.run(step_fn, args=(batch,))
        return batch_ids, strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

    epochs = []
    for _ in range(EPOCHS):
        steps, per_step, losses = 0, [], []
        for batch in dist:
            batch_ids, loss = train_step(batch)
            steps += 1
            per_step.append(
                [t.numpy().tolist() for t in strategy.experimental_local_results(batch_ids)]
            )
            losses.append(float(loss))
        epochs.append({"steps": steps, "ids": per_step, "loss": losses})
    report["loop"] = {
        "distributed_steps": af.distributed_steps(dist),
        "epochs": epochs,
        "kernel": kernel.numpy().ravel().tolist(),
    }
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
