"""How well does ``shuffle="block"`` mix, compared with a full shuffle? Pure planning, no I/O.

For the layouts of the throughput benchmark (S: 1,000,000 rows of 132 bytes; L: 60,000 rows of
12,292 bytes) and the chunk sizes that HDF5/Zarr automatic chunking and ``arrayfeed convert`` give,
it prints per shuffle mode:

- chunks per batch: distinct storage chunks a batch of 256 draws from (full shuffle: ~256);
- class entropy: mean entropy (bits) of the labels in a batch when the data is stored *sorted by
  class* (10 classes, the worst case for local shuffles; a full shuffle gives ~3.3 bits);
- same as above after ``arrayfeed convert --shuffle`` (rows stored in a random order), when block
  shuffling is again close to a full shuffle;
- |rank correlation| between a row's storage index and its position in the epoch.

    python benchmarks/bench_mixing.py
"""

from __future__ import annotations

import numpy as np

from arrayfeed._pipeline.plan.permutation import derive_key, permute
from arrayfeed._pipeline.plan.plan import Plan, block_layout

BATCH = 256
CLASSES = 10


def entropy_bits(labels: np.ndarray) -> float:
    counts = np.bincount(labels, minlength=CLASSES)
    p = counts[counts > 0] / len(labels)
    return float(-(p * np.log2(p)).sum())


def measure(rows: int, row_bytes: int, chunk_rows: int | None, shuffle: str) -> dict[str, float]:
    block_rows, window = block_layout([chunk_rows] if chunk_rows else [], row_bytes)
    plan = Plan(
        n_rows=rows,
        batch_size=BATCH,
        shuffle=shuffle,  # type: ignore[arg-type]
        seed=0,
        block_rows=block_rows,
        window_blocks=window,
        drop_remainder=True,
    )
    order = plan.indices(0, 0, plan.steps)
    batches = order.reshape(plan.steps, BATCH)
    sorted_labels = (np.arange(rows) * CLASSES) // rows  # stored sorted by class
    stored_random = permute(np.arange(rows), rows, derive_key(99))  # convert --shuffle
    shuffled_labels = sorted_labels[stored_random]
    sample = batches[:: max(1, plan.steps // 200)]
    chunk = chunk_rows or block_rows
    ranks = np.empty(len(order))
    ranks[np.argsort(order)] = np.arange(len(order))
    return {
        "chunks/batch": float(np.mean([len(np.unique(b // chunk)) for b in sample])),
        "entropy sorted": float(np.mean([entropy_bits(sorted_labels[b]) for b in sample])),
        "entropy convert --shuffle": float(
            np.mean([entropy_bits(shuffled_labels[b]) for b in sample])
        ),
        "|rank corr|": abs(float(np.corrcoef(ranks, np.arange(len(order)))[0, 1])),
        "window rows": float(block_rows * window if shuffle == "block" else rows),
    }


def main() -> None:
    layouts = [
        ("S, HDF5 auto chunks", 1_000_000, 132, 15_625),
        ("S, Zarr auto chunks", 1_000_000, 132, 62_500),
        ("S, .npy (no chunks)", 1_000_000, 132, None),
        ("L, HDF5 auto chunks", 60_000, 12_292, 3_750),
        ("L, Zarr auto chunks", 60_000, 12_292, 7_500),
        ("L, .npy (no chunks)", 60_000, 12_292, None),
    ]
    header = f"{'layout':22} {'shuffle':7} {'window rows':>11} {'chunks/batch':>12} {'H sorted':>9} {'H conv.shuf':>11} {'|rank corr|':>11}"
    print(header)
    for name, rows, row_bytes, chunk in layouts:
        for shuffle in ("full", "block"):
            m = measure(rows, row_bytes, chunk, shuffle)
            print(
                f"{name:22} {shuffle:7} {m['window rows']:>11,.0f} {m['chunks/batch']:>12.1f} "
                f"{m['entropy sorted']:>9.2f} {m['entropy convert --shuffle']:>11.2f} {m['|rank corr|']:>11.3f}"
            )
    print(f"(uniform over {CLASSES} classes: {np.log2(CLASSES):.2f} bits)")


if __name__ == "__main__":
    main()
