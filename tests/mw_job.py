"""One worker of a real ``MultiWorkerMirroredStrategy`` job (run by tests/test_distribute.py).

Not a test module: the test launches one process per worker with its own ``TF_CONFIG`` (a cluster
on 127.0.0.1) and reads the JSON each worker writes. Rows carry their own index as the feature
``id``, so the test can check which rows each worker produced.

Routes:

- ``dsff``: ``strategy.distribute_datasets_from_function`` with ``shard=ctx`` and the per-replica
  batch size, then ``experimental_distribute_dataset`` of ``from_arrays(shard="auto")`` (sharded
  from ``TF_CONFIG``), each for ``--epochs`` epochs in a custom loop whose every step all-reduces
  gradients and row counts across workers.
- ``fit``: ``model.fit`` on ``from_arrays(shard="auto")`` (for Keras 3, which fails upstream under
  this strategy, keras-team/keras#20585, and for tf-keras with ``TF_USE_LEGACY_KERAS=1``).
- ``elastic``: ``arrayfeed.distribute`` stopped after ``--stop-after`` steps with its state, or
  resumed from ``--resume`` (a state another job saved, on another number of workers).

stderr gets ``=== PHASE name ===`` markers, so the test can tell which phase logged a warning.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np


def marker(name: str) -> None:
    sys.stderr.write(f"=== PHASE {name} ===\n")
    sys.stderr.flush()


def make_data(rows: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(rows, 4)).astype(np.float32)
    target = (features @ np.array([1.0, -2.0, 3.0, 0.5], np.float32))[:, None]
    return {"id": np.arange(rows, dtype=np.int64), "features": features}, target


def make_train_step(strategy: Any, global_batch: int) -> Any:
    """A step of a linear model whose every call all-reduces gradients and row counts: returns
    the row ids of each local replica, the rows of the step over all workers, and the loss."""
    import tensorflow as tf

    with strategy.scope():
        kernel = tf.Variable(tf.zeros((4, 1)), aggregation=tf.VariableAggregation.MEAN)

    def step_fn(batch: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        inputs, target = batch
        with tf.GradientTape() as tape:
            error = tf.matmul(inputs["features"], kernel) - target
            loss = tf.nn.compute_average_loss(
                tf.reduce_sum(error**2, axis=1), global_batch_size=global_batch
            )
        ctx = tf.distribute.get_replica_context()
        grad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tape.gradient(loss, kernel))
        kernel.assign_sub(0.1 * grad)
        rows = tf.shape(inputs["id"], out_type=tf.int64)[0]
        return inputs["id"], ctx.all_reduce(tf.distribute.ReduceOp.SUM, rows), loss

    @tf.function
    def train_step(batch: Any) -> tuple[Any, tf.Tensor, tf.Tensor]:
        ids, global_rows, loss = strategy.run(step_fn, args=(batch,))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
        return ids, strategy.experimental_local_results(global_rows)[0], loss

    return train_step


def custom_loop(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    import arrayfeed as af

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    x, y = make_data(args.rows)
    global_batch = args.global_batch
    train_step = make_train_step(strategy, global_batch)

    def run_epochs(dist_dataset: Any) -> list[dict[str, Any]]:
        epochs = []
        for _ in range(args.epochs):
            steps, ids, global_rows, losses = 0, [], [], []
            for batch in dist_dataset:  # a new iterator: the next arrayfeed epoch
                per_replica_ids, rows, loss = train_step(batch)
                steps += 1
                local = strategy.experimental_local_results(per_replica_ids)
                ids.append([t.numpy().tolist() for t in local])
                global_rows.append(int(rows))
                losses.append(float(loss))
            epochs.append({"steps": steps, "ids": ids, "global_rows": global_rows, "loss": losses})
        return epochs

    result: dict[str, Any] = {
        "task": [resolver.task_type, resolver.task_id],
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "env_shard": list(dataclass_tuple(af.Shard.from_env())),
    }

    marker("dsff")
    per_replica = None

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        nonlocal per_replica
        per_replica = ctx.get_per_replica_batch_size(global_batch)
        return af.from_arrays(x, y, batch_size=per_replica, shard=ctx, seed=args.seed)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    result["dsff"] = {"per_replica_batch": per_replica, "epochs": run_epochs(dist)}

    marker("distribute_dataset")
    ds = af.from_arrays(x, y, batch_size=global_batch, shard="auto", seed=args.seed)
    dist = strategy.experimental_distribute_dataset(ds)
    result["distribute_dataset"] = {"len_ds": len(ds), "epochs": run_epochs(dist)}

    if args.control:
        # Negative control for the warning check: tf.data's auto-sharding left on (shard=None)
        # must log its fallback warning, proving the test would see one.
        marker("control")
        ds = af.from_arrays(x, y, batch_size=global_batch, shard=None, seed=args.seed)
        next(iter(strategy.experimental_distribute_dataset(ds)))
    marker("end")
    return result


def elastic(args: argparse.Namespace) -> dict[str, Any]:
    """``arrayfeed.distribute`` with ``resume=`` the state in ``--resume`` (if given): with
    ``--stop-after K``, K steps of the first epoch and the state there; else the rest of the
    first epoch and one more."""
    import tensorflow as tf

    import arrayfeed as af

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = make_data(args.rows)
    train_step = make_train_step(strategy, args.global_batch)
    saved = None
    if args.resume:
        with open(args.resume) as f:
            saved = json.load(f)
    ds = af.distribute(strategy, x, y, global_batch_size=args.global_batch, seed=1, resume=saved)
    start = af.state(ds)
    result: dict[str, Any] = {"start": start, "epochs": []}
    for epoch in range(start["epoch"], start["epoch"] + (1 if args.stop_after else 2)):
        ids = []
        for step, batch in enumerate(ds, 1):
            per_replica_ids, _, _ = train_step(batch)
            local = strategy.experimental_local_results(per_replica_ids)
            ids.extend(i for t in local for i in t.numpy().tolist())
            if step == args.stop_after:
                result["state"] = af.state(ds, epoch, step)
                break
        result["epochs"].append({"epoch": epoch, "steps": step, "ids": ids})
    return result


def dataclass_tuple(shard: Any) -> tuple[int, int]:
    return shard.count, shard.index


def fit(args: argparse.Namespace) -> dict[str, Any]:
    """``model.fit`` under the strategy; rows seen are recorded by the train step.

    Keras 3: a from_arrays dataset passed straight to fit (fails upstream, keras-team/keras#20585).
    tf-keras (``TF_USE_LEGACY_KERAS=1``): ``arrayfeed.distribute(..., repeat=True)`` with
    ``steps_per_epoch=arrayfeed.distributed_steps(...)``.
    """
    import tensorflow as tf

    import arrayfeed as af

    legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    if legacy:
        import tf_keras as keras
    else:
        import keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = make_data(args.rows)
    # The last column carries the row id; the model sees the first four.
    features = np.concatenate([x["features"], x["id"][:, None].astype(np.float32)], axis=1)
    kwargs: dict[str, Any] = {}
    if legacy:
        data = af.distribute(
            strategy, features, y, global_batch_size=args.global_batch, repeat=True, seed=args.seed
        )
        kwargs["steps_per_epoch"] = af.distributed_steps(data)
    else:
        data = af.from_arrays(features, y, batch_size=args.global_batch, seed=args.seed)
    seen: list[Any] = []

    def record(ids: Any) -> int:
        seen[-1].extend(ids.numpy().astype(np.int64).tolist())
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

    steps: list[int] = []

    class CountSteps(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            steps.append(0)
            seen.append([])

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            steps[-1] += 1

    with strategy.scope():
        model = Linear()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    marker("fit")
    history = model.fit(data, epochs=args.epochs, verbose=0, callbacks=[CountSteps()], **kwargs)
    marker("end")
    return {
        "keras": keras.__version__,
        "steps_per_epoch": kwargs.get("steps_per_epoch"),
        "steps": steps,
        "ids": seen,
        "loss": history.history["loss"],
        "kernel": model.dense.kernel.numpy().ravel().tolist(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--route", choices=["loop", "fit", "elastic"], required=True)
    parser.add_argument("--rows", type=int, default=1001)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--control", action="store_true")
    parser.add_argument("--stop-after", type=int, default=0)
    parser.add_argument("--resume", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    routes = {"loop": custom_loop, "fit": fit, "elastic": elastic}
    result = routes[args.route](args)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
