"""Train a small PyTorch classifier on batches from ``arrayfeed.batches``: no TensorFlow involved.

Writes features to a ``.npy`` file (memory-mapped when read) and labels to Zarr in a temporary
directory, then trains a two-layer MLP. Batches become tensors with ``torch.from_numpy`` (no
copy: arrayfeed hands each batch over, nothing else writes it); with CUDA they are pinned and
copied to the GPU asynchronously. ``arrayfeed.batches`` reads ahead in its own threads, so no
``DataLoader`` workers are needed; each ``for`` over it is the next, freshly shuffled epoch.

    python examples/torch_train.py [--rows 20000] [--epochs 3] [--workdir DIR]

Under ``torchrun``, each process reads its own shard: the default ``shard="auto"`` reads the
``RANK`` / ``WORLD_SIZE`` it sets.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

import arrayfeed as af

FEATURES, HIDDEN, CLASSES = 32, 64, 4


def make_data(root: Path, rows: int) -> tuple[str, Any]:
    """Features in ``x.npy``; labels (a linear function of the features, argmax) in Zarr."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=(FEATURES, CLASSES))).argmax(axis=1).astype(np.int64)
    np.save(root / "x.npy", x)
    labels = zarr.create_array(root / "y.zarr", shape=y.shape, dtype=y.dtype, chunks=(4096,))
    labels[...] = y
    return str(root / "x.npy"), zarr.open_array(root / "y.zarr", mode="r")


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch as a tensor on ``device``: pinned and copied asynchronously when it is a GPU."""
    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor


def train(root: Path, rows: int, epochs: int, batch_size: int) -> None:
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = make_data(root, rows)
    train_batches = af.batches(x, y, batch_size=batch_size, seed=0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.CrossEntropyLoss()
    print(f"{rows} rows, {len(train_batches)} steps per epoch on {device}")
    for epoch in range(epochs):
        start, total_loss, correct, seen = time.perf_counter(), 0.0, 0, 0
        for xb, yb in train_batches:
            inputs, targets = to_device(xb, device), to_device(yb, device)
            logits = model(inputs)
            loss = loss_fn(logits, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(targets)
            correct += int((logits.argmax(dim=1) == targets).sum())
            seen += len(targets)
        # A checkpoint between epochs: torch.save({"model": model.state_dict(),
        # "optimizer": optimizer.state_dict(), "position": train_batches.position}, path), and
        # after a restart af.batches(..., start_epoch=position[0], start_step=position[1]).
        print(
            f"epoch {epoch + 1}: {seen} rows, loss {total_loss / seen:.4f}, "
            f"accuracy {correct / seen:.3f}, {time.perf_counter() - start:.2f} s, "
            f"next position {train_batches.position}"
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
