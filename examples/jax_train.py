"""Train a small JAX classifier on batches from ``arrayfeed.batches``: no TensorFlow involved.

Writes features to a ``.npy`` file (memory-mapped when read) and labels to HDF5 in a temporary
directory, then trains a two-layer MLP with optax's Adam when optax is installed, else plain SGD
with ``jax.grad``. The next batch is put on the device (``jax.device_put``, asynchronous) while
the current one trains. Every 20 steps the loop records a checkpoint: the weights and the stream's
position, which passed back as ``start_epoch`` / ``start_step`` resumes at the first batch not
yet trained on.

    python examples/jax_train.py [--rows 20000] [--epochs 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import jax
import jax.numpy as jnp
import numpy as np

import arrayfeed as af

try:
    import optax
except ImportError:  # plain SGD below
    optax = None

FEATURES, HIDDEN, CLASSES = 32, 64, 4


def make_data(root: Path, rows: int) -> tuple[str, h5py.Dataset]:
    """Features in ``x.npy``; labels (a linear function of the features, argmax) in HDF5."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=(FEATURES, CLASSES))).argmax(axis=1).astype(np.int32)
    np.save(root / "x.npy", x)
    with h5py.File(root / "y.h5", "w") as f:
        f.create_dataset("y", data=y, chunks=(min(rows, 4096),))
    return str(root / "x.npy"), h5py.File(root / "y.h5", "r")["y"]


def prefetch_to_device(batches: af.Batches, size: int = 2) -> Iterator[tuple[Any, tuple[int, int]]]:
    """Yield ``(batch on the default device, position after it)``, ``size`` batches ahead.

    ``jax.device_put`` returns at once and copies in the background, so the next batch travels
    to the device while the current one trains. ``batches.position`` read right after a batch
    came out of ``batches`` is where the stream continues after that batch: the position to
    checkpoint once it has trained (reading it later would skip the batches taken ahead).
    """
    queue: collections.deque[tuple[Any, tuple[int, int]]] = collections.deque()
    for batch in batches:
        queue.append((jax.device_put(batch), batches.position))
        if len(queue) >= size:
            yield queue.popleft()
    while queue:
        yield queue.popleft()


def init_params(key: jax.Array) -> dict[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, CLASSES)) / np.sqrt(HIDDEN),
        "b2": jnp.zeros(CLASSES),
    }


def loss_and_accuracy(
    params: dict[str, jax.Array], x: jax.Array, y: jax.Array
) -> tuple[jax.Array, jax.Array]:
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    log_probs = jax.nn.log_softmax(logits)
    loss = -jnp.take_along_axis(log_probs, y[:, None], axis=1).mean()
    return loss, (logits.argmax(axis=1) == y).mean()


def make_step() -> tuple[Any, Any]:
    """``(optimizer init, jitted step)``: optax's Adam if installed, else SGD with jax.grad."""
    grad_fn = jax.value_and_grad(loss_and_accuracy, has_aux=True)
    if optax is not None:
        optimizer = optax.adam(1e-2)

        @jax.jit
        def step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
            (loss, acc), grads = grad_fn(params, x, y)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, acc

        return optimizer.init, step

    @jax.jit
    def sgd_step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        (loss, acc), grads = grad_fn(params, x, y)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.2 * g, params, grads)
        return params, opt_state, loss, acc

    return lambda params: (), sgd_step


def train(root: Path, rows: int, epochs: int, batch_size: int) -> None:
    x, y = make_data(root, rows)
    # drop_remainder: every batch has one shape, so the jitted step compiles once.
    train_batches = af.batches(x, y, batch_size=batch_size, seed=0, drop_remainder=True)
    params = init_params(jax.random.PRNGKey(0))
    init_opt, step = make_step()
    opt_state = init_opt(params)
    checkpoint: tuple[Any, tuple[int, int]] | None = None
    print(
        f"{rows} rows, {len(train_batches)} steps per epoch, "
        f"{'optax adam' if optax is not None else 'sgd (jax.grad)'} on {jax.devices()[0]}"
    )
    for epoch in range(epochs):
        start, losses, accs = time.perf_counter(), [], []
        for i, ((xb, yb), position) in enumerate(prefetch_to_device(train_batches)):
            params, opt_state, loss, acc = step(params, opt_state, xb, yb)
            losses.append(loss)
            accs.append(acc)
            if i % 20 == 19:  # a checkpoint: weights and where the stream continues
                checkpoint = (params, position)
        loss = float(jnp.mean(jnp.stack(losses)))
        acc = float(jnp.mean(jnp.stack(accs)))
        print(
            f"epoch {epoch + 1}: {len(losses)} steps, loss {loss:.4f}, accuracy {acc:.3f}, "
            f"{time.perf_counter() - start:.2f} s"
        )
    assert checkpoint is not None
    epoch, step_in_epoch = checkpoint[1]
    # After a restart: restore the weights, and continue the stream at the saved position.
    resumed = af.batches(
        x,
        y,
        batch_size=batch_size,
        seed=0,
        drop_remainder=True,
        start_epoch=epoch,
        start_step=step_in_epoch,
    )
    print(
        f"last checkpoint: epoch {epoch}, step {step_in_epoch}; a restart from it trains the "
        f"{sum(1 for _ in resumed)} remaining batches of that epoch, then whole epochs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        train(args.workdir, args.rows, args.epochs, args.batch_size)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            train(Path(tmp), args.rows, args.epochs, args.batch_size)


if __name__ == "__main__":
    main()
