"""Many datasets read at once from many threads: failures, loaders, shared memory, fairness.

Measures what a process reading several datasets at once gets (each dataset in a thread of its
own, as a validation set read beside training, a prefetch thread per epoch, or a service
answering from worker threads do), with ``arrayfeed.batches`` and default arguments:

- ``twelve``: 12 datasets (``.npy``, chunked lzf HDF5 and Zarr by ``convert``; full, block and
  no shuffle; batch sizes 64-141) read for 3 epochs, each in a thread that ends with it: the
  datasets that fail (an exception, or an epoch that is not every row once), the most loader
  processes seen at once (against the usable cores), and the most bytes of shared-memory slots
  held at once (against the process-wide read-ahead budget);
- ``pairs``: two threads with one dataset each, 4 epochs, ``--trials`` times: the runs with an
  error;
- ``rate``: 12 ``.npy`` datasets (the same file, 12 seeds) read at once, against one alone:
  aggregate rows/s over their ratio, and the slowest dataset's rows/s against its fair share
  (the aggregate over 12).

    python benchmarks/bench_many.py                      # ~1 min on 2 cores
    python benchmarks/bench_many.py --trials 20 --json benchmarks/results/dev-2-cores/many.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import arrayfeed as af
from arrayfeed._pipeline.loader.processes import loaders
from arrayfeed._pipeline.loader.slots import LEDGER
from arrayfeed._pipeline.tune.machine import usable_cores


def write(root: Path, rows: int, row_bytes: int) -> dict[str, tuple[str, str]]:
    """x (uint8 rows) and y (the row number) as .npy, chunked lzf HDF5 and Zarr."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (rows, row_bytes), dtype=np.uint8)
    y = np.arange(rows, dtype=np.int64)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    with h5py.File(root / "d.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(256, row_bytes), compression="lzf")
        f.create_dataset("y", data=y, chunks=(256,), compression="lzf")
    af.convert({"x": root / "x.npy", "y": root / "y.npy"}, root / "d.zarr", progress=False)
    return {
        "npy": (str(root / "x.npy"), str(root / "y.npy")),
        "h5": (f"{root / 'd.h5'}:x", f"{root / 'd.h5'}:y"),
        "zarr": (f"{root / 'd.zarr'}:x", f"{root / 'd.zarr'}:y"),
    }


def read_all(made: list[tuple[Any, ...]], epochs: int, rows: int) -> list[dict[str, Any]]:
    """Each ``(x, y, kwargs)`` read for ``epochs`` in a thread of its own, all started at once:
    per dataset, its error (or None), its rows and its seconds."""
    out: list[dict[str, Any]] = [{} for _ in made]
    start = threading.Barrier(len(made))

    def run(i: int) -> None:
        x, y, kwargs = made[i]
        try:
            b = af.batches(x, y, **kwargs)
            start.wait()
            began, seen = time.perf_counter(), 0
            for _ in range(epochs):
                labels = np.concatenate([np.array(yb) for _, yb in b])
                if not np.array_equal(np.sort(labels), np.arange(rows)):
                    raise AssertionError("an epoch that is not every row once")
                seen += len(labels)
            out[i] = {"error": None, "rows": seen, "seconds": time.perf_counter() - began}
        except BaseException as exc:
            out[i] = {"error": f"{type(exc).__name__}: {exc}"[:200], "rows": 0, "seconds": 0.0}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(made))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def twelve(files: dict[str, tuple[str, str]], rows: int) -> dict[str, Any]:
    stores, modes = ("npy", "h5", "zarr"), (True, "block", False)
    made = [
        (
            *files[stores[i % 3]],
            {"batch_size": 64 + 7 * i, "shuffle": modes[(i // 3) % 3], "seed": i},
        )
        for i in range(12)
    ]
    most, done = 0, threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, len(loaders().pids()))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    LEDGER.peak = 0
    watcher.start()
    try:
        results = read_all(made, 3, rows)
    finally:
        done.set()
        watcher.join()
    errors = [r["error"] for r in results if r["error"]]
    return {
        "failed": len(errors),
        "errors": errors[:3],
        "loaders_most": most,
        "usable_cores": usable_cores(),
        "slot_bytes_peak": LEDGER.peak,
        "budget_bytes": LEDGER.budget,
    }


def pairs(files: dict[str, tuple[str, str]], rows: int, trials: int) -> dict[str, Any]:
    failed = 0
    for trial in range(trials):
        made = [
            (*files["npy"], {"batch_size": 64 + trial, "seed": trial}),
            (*files["h5"], {"batch_size": 96 + trial, "seed": trial + 1, "shuffle": "block"}),
        ]
        failed += any(r["error"] for r in read_all(made, 4, rows))
    return {"runs": trials, "runs_with_an_error": failed}


def rate(files: dict[str, tuple[str, str]], rows: int, epochs: int, reps: int) -> dict[str, Any]:
    one, many, slowest, errors = [], [], [], 0
    for rep in range(reps):
        alone = read_all([(*files["npy"], {"batch_size": 256, "seed": rep})], epochs, rows)[0]
        made = [(*files["npy"], {"batch_size": 256, "seed": 100 * rep + i}) for i in range(12)]
        began = time.perf_counter()
        results = read_all(made, epochs, rows)
        wall = time.perf_counter() - began
        if alone["error"] or any(r["error"] for r in results):
            errors += 1
            continue
        one.append(alone["rows"] / alone["seconds"])
        total = sum(r["rows"] for r in results) / wall
        many.append(total)
        fair = total / len(results)
        slowest.append(min(r["rows"] / r["seconds"] for r in results) / fair)
    if not one:
        return {
            "reps_with_an_error": errors,
            "ratio": float("nan"),
            "one_rows_per_s": 0.0,
            "twelve_rows_per_s": 0.0,
            "slowest_over_fair_share": float("nan"),
        }
    return {
        "reps_with_an_error": errors,
        "one_rows_per_s": statistics.median(one),
        "twelve_rows_per_s": statistics.median(many),
        "ratio": statistics.median(many) / statistics.median(one),
        "slowest_over_fair_share": statistics.median(slowest),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--row-bytes", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = write(Path(tmp), args.rows, args.row_bytes)
        result = {
            "machine": {"cores": usable_cores(), "python": platform.python_version()},
            "rows": args.rows,
            "row_bytes": args.row_bytes,
            "twelve": twelve(files, args.rows),
            "pairs": pairs(files, args.rows, args.trials),
            "rate": rate(files, args.rows, args.epochs, args.reps),
        }
    t, p, r = result["twelve"], result["pairs"], result["rate"]
    print(f"12 datasets x 3 epochs in 12 threads: {t['failed']} failed {t['errors']}")
    print(f"2 threads x 1 dataset, {p['runs']} runs: {p['runs_with_an_error']} with an error")
    print(f"loader processes at most: {t['loaders_most']} (usable cores {t['usable_cores']})")
    print(
        f"slots at most: {t['slot_bytes_peak'] / 2**20:.1f} MiB "
        f"(budget {t['budget_bytes'] / 2**20:.0f} MiB)"
    )
    print(
        f".npy, rows/s: one dataset {r['one_rows_per_s']:,.0f}, twelve at once "
        f"{r['twelve_rows_per_s']:,.0f} (ratio {r['ratio']:.2f}); slowest / fair share "
        f"{r['slowest_over_fair_share']:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
