"""End-to-end demo: make a dataset on disk, train a two-input / two-output Keras model from it.

Writes images to a ``.npy`` file (memory-mapped when read), per-row metadata to HDF5 and class
labels to Zarr, keeps a regression target in memory, then trains with ``arrayfeed.from_arrays``
and prints the throughput of every epoch.

    python examples/demo.py [--rows 20000] [--epochs 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py
import keras
import numpy as np
import zarr

import arrayfeed as af


def make_data(root: Path, rows: int, seed: int = 0) -> None:
    """Per split: images in .npy, metadata in HDF5, labels in Zarr, a target in .npy.

    The labels depend on both inputs, so the model has something to learn.
    """
    rng = np.random.default_rng(seed)
    splits = {"train": rows, "val": max(1, rows // 10)}
    with h5py.File(root / "meta.h5", "w") as h5:
        labels = zarr.open_group(root / "cls.zarr", mode="w")
        for split, n in splits.items():
            images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
            brightness = images.mean(axis=(1, 2, 3)) / 255
            meta = rng.normal(size=(n, 8)).astype(np.float32)
            cls = ((brightness > 0.5).astype(np.int32) * 2 + (meta[:, 0] > 0)).astype(np.int32)
            reg = (meta[:, :4].sum(axis=1) + brightness).astype(np.float32)[:, None]
            np.save(root / f"{split}_images.npy", images)
            h5.create_dataset(f"{split}/meta", data=meta, chunks=(min(n, 4096), 8))
            labels.create_array(split, shape=(n,), dtype="int32", chunks=(min(n, 8192),))[...] = cls
            np.save(root / f"{split}_reg.npy", reg)


def build_model() -> keras.Model:
    image = keras.Input((32, 32, 3), name="image", dtype="uint8")
    meta = keras.Input((8,), name="meta")
    h = keras.layers.Rescaling(1 / 255)(image)
    h = keras.layers.Conv2D(8, 3, strides=2, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Concatenate()([h, meta])
    h = keras.layers.Dense(32, activation="relu")(h)
    model = keras.Model(
        {"image": image, "meta": meta},
        {"cls": keras.layers.Dense(4, name="cls")(h), "reg": keras.layers.Dense(1, name="reg")(h)},
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
        metrics={"cls": ["accuracy"]},
    )
    return model


class Throughput(keras.callbacks.Callback):
    """Prints rows/s of every training epoch."""

    def __init__(self, rows_per_epoch: int) -> None:
        super().__init__()
        self.rows = rows_per_epoch

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        seconds = time.perf_counter() - self.start
        logs = logs or {}
        print(
            f"epoch {epoch + 1}: {self.rows / seconds:,.0f} rows/s ({seconds:.1f} s), "
            f"loss {logs.get('loss', float('nan')):.3f}, "
            f"cls accuracy {logs.get('cls_accuracy', float('nan')):.3f}, "
            f"val loss {logs.get('val_loss', float('nan')):.3f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where to write the data (default: a temp dir)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        make_data(root, args.rows)
        print(
            f"data: {args.rows:,} training rows in {root} (*_images.npy, meta.h5, cls.zarr, *_reg.npy)"
        )

        meta_file = h5py.File(root / "meta.h5", "r")
        labels = zarr.open_group(root / "cls.zarr", mode="r")

        def inputs(split: str) -> tuple[dict[str, object], dict[str, object]]:
            x = {"image": str(root / f"{split}_images.npy"), "meta": meta_file[f"{split}/meta"]}
            y = {"cls": labels[split], "reg": np.load(root / f"{split}_reg.npy")}  # reg: in memory
            return x, y

        train = af.from_arrays(*inputs("train"), batch_size=args.batch_size, shuffle=True, seed=0)
        val = af.from_arrays(*inputs("val"), batch_size=1024, shuffle=False)
        rows_per_epoch = min(len(train) * args.batch_size, args.rows)
        print(
            f"train: {len(train)} steps of {args.batch_size} rows per epoch; val: {len(val)} steps"
        )

        model = build_model()
        model.fit(
            train,
            validation_data=val,
            epochs=args.epochs,
            verbose=0,
            shuffle=False,
            callbacks=[Throughput(rows_per_epoch)],
        )
        meta_file.close()


if __name__ == "__main__":
    main()
