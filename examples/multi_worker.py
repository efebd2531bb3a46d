"""Multi-worker training with ``tf.distribute.MultiWorkerMirroredStrategy``, all on this machine.

Run ``python examples/multi_worker.py [--workers N]``: it writes a small data set to a temporary
folder, then starts N worker processes, each with its own ``TF_CONFIG`` (a cluster on 127.0.0.1,
free ports), and waits for them. Each worker trains the same model in a custom loop over
``arrayfeed.distribute``: its own shard of the rows, ``global_batch_size // num_replicas_in_sync``
rows per replica per step, and the same number of steps as every other worker. Each prints its
steps and rows per epoch.

On a real cluster, start the worker part (``--worker DATA_DIR``) once per machine with the
right ``TF_CONFIG``, or with ``srun`` (see the README, "Distributed training").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROWS, PER_REPLICA_BATCH, EPOCHS = 10_001, 32, 3
TRUE_W = np.array([1.0, -2.0, 3.0, 0.5], np.float32)


def make_data(folder: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), (x @ TRUE_W)[:, None].astype(np.float32))
    np.save(os.path.join(folder, "row.npy"), np.arange(ROWS, dtype=np.int64))


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch(workers: int) -> int:
    """Start ``workers`` local processes of one cluster and wait for all of them."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        make_data(folder)
        cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(workers)]}
        procs = []
        for index in range(workers):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            env = dict(os.environ, TF_CONFIG=json.dumps(tf_config))
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", folder]
            procs.append(subprocess.Popen(cmd, env=env))
        try:
            codes = [proc.wait(timeout=300) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    print(
        f"{workers} workers finished with exit codes {codes} in {time.perf_counter() - start:.1f} s"
    )
    return max(codes, key=abs)


def work(folder: str) -> None:
    """One worker: TF_CONFIG names the cluster and this worker's place in it."""
    import keras
    import tensorflow as tf

    import arrayfeed as af

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    me = strategy.cluster_resolver.task_id
    # The global batch must be a multiple of the replicas in sync: scale it with the cluster.
    global_batch = PER_REPLICA_BATCH * strategy.num_replicas_in_sync
    path = {name: os.path.join(folder, f"{name}.npy") for name in ("x", "y", "row")}
    # Each input pipeline reads its own shard (shard=input_context inside), batched per replica.
    dist = af.distribute(
        strategy,
        {"x": path["x"], "row": path["row"]},
        path["y"],
        global_batch_size=global_batch,
        seed=0,
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)

    def step_fn(inputs: dict[str, tf.Tensor], y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            per_row = tf.reduce_sum((model(inputs["x"], training=True) - y) ** 2, axis=1)
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))  # all-reduce
        return loss, inputs["row"]

    @tf.function
    def train_step(batch: Any) -> tuple[tf.Tensor, Any]:
        losses, rows = strategy.run(step_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None), rows

    for epoch in range(EPOCHS):
        steps, total, seen = 0, 0.0, []
        for batch in dist:  # each pass is the next epoch, freshly shuffled
            loss, rows = train_step(batch)
            total += float(loss)
            steps += 1
            seen += [r.numpy() for r in strategy.experimental_local_results(rows)]
        rows_seen = np.concatenate(seen)
        print(
            f"worker {me}: epoch {epoch + 1}: {steps} steps, {rows_seen.size} rows "
            f"({np.unique(rows_seen).size} distinct, ids {rows_seen.min()}..{rows_seen.max()}), "
            f"mean loss {total / steps:.5f}",
            flush=True,
        )
    kernel = np.round(model.layers[0].kernel.numpy().ravel(), 3)
    print(f"worker {me}: learned {kernel} (true {TRUE_W})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--worker", metavar="DATA_DIR", help="run one worker (uses TF_CONFIG)")
    args = parser.parse_args()
    if args.worker:
        work(args.worker)
    else:
        sys.exit(launch(args.workers))


if __name__ == "__main__":
    main()
