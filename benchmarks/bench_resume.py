"""Elastic resume: what ``resume=state`` on another number of workers costs.

- ``first batch``: seconds from ``af.batches(..., resume=state)`` to its first batch, on a
  ``.npy`` file of ``--rows`` rows (10 M by default), the state saved by 8 workers a third into
  an epoch and resumed on 3, against a fresh start of the same dataset (``start_epoch`` of a
  new epoch), per shuffle mode (the ratio: the median of each resume over the fresh start run
  just before it); and a fresh start on 8 workers. The rest is read through the
  old workers' permutations, whose cost per position depends on their size (cycle walking, see
  ``arrayfeed/_pipeline/plan/permutation.py``): that fresh start has the same. Medians of
  ``--first-reps`` runs, interleaved.
- ``block rate``: rows/s of the rest of an epoch read with ``shuffle="block"`` from a Zarr
  store that ``arrayfeed convert`` wrote (lzf), the state saved by 4 workers a third into the
  epoch: worker 0 of 3 (the rest re-dealt) against worker 0 of 4 (an unchanged resume), each
  from ``iter()`` to the end of its first pass. Medians of ``--reps`` runs.
- ``read per row``: for that store's layout, pure planning: rows of storage read (whole windows)
  per row delivered in the rest of the epoch, by the worker that reads the most, unchanged and
  re-dealt, for several worker counts: what the rate follows. A resumed worker reads whole
  windows, so the windows partly taken before the stop and those the deal cuts between two new
  workers are read in full: a few windows per worker, whatever its share.

Both read in this process (``processes=0``, ``num_threads=2``): loader processes start the
same way either way, and the comparison is of the plans.

    python benchmarks/bench_resume.py                     # ~3 min on 2 cores
    python benchmarks/bench_resume.py --json benchmarks/results/dev-2-cores/resume.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import arrayfeed as af
from arrayfeed._pipeline.plan import elastic, permutation
from arrayfeed._pipeline.plan.elastic import Segment
from arrayfeed._pipeline.plan.plan import Plan
from arrayfeed._pipeline.tune.machine import usable_cores

BATCH = 256
OPTIONS: dict[str, Any] = {"batch_size": BATCH, "seed": 0, "processes": 0, "num_threads": 2}


def saved_state(x: Any, shuffle: Any, workers: int) -> dict[str, Any]:
    """The state of ``workers`` workers a third into epoch 1."""
    old = af.batches(x, shuffle=shuffle, shard=af.Shard(workers, 0), **OPTIONS)
    return af.state(old, 1, len(old) // 3)


def cold_plans() -> None:
    """Forget what planning keeps for reuse (the last few permutations and rests): the runs are
    interleaved, and a fresh start would otherwise find its own from the run before, where a
    restarted job (a fresh start or a resume alike) finds none."""
    permutation._exact.cache_clear()
    permutation._round_keys.cache_clear()
    permutation._tables.cache_clear()
    elastic._remaining.cache_clear()


def quiet() -> None:
    """Wait until the reader threads of the datasets dropped before have ended: a restarted job
    has none, and the one before would take the interpreter from the one timed."""
    gc.collect()
    deadline = time.perf_counter() + 2.0
    while any(t.name.startswith("arrayfeed-read") for t in threading.enumerate()):
        if time.perf_counter() > deadline:
            raise RuntimeError("the reader threads of a dropped dataset did not end in 2 s")
        time.sleep(0.001)


def first_batch(x: Any, shuffle: Any, shard: af.Shard, **start: Any) -> float:
    quiet()
    cold_plans()
    began = time.perf_counter()
    b = af.batches(x, shuffle=shuffle, shard=shard, **OPTIONS, **start)
    next(iter(b))
    return time.perf_counter() - began


def time_to_first_batch(path: Path, reps: int) -> dict[str, Any]:
    out = {}
    for shuffle in (True, False, "block"):
        saved = saved_state(str(path), shuffle, 8)
        first_batch(str(path), shuffle, af.Shard(3, 0))  # warm-up: imports, caches, threads
        fresh, resumed, fresh_old = [], [], []
        for _ in range(reps):
            fresh.append(first_batch(str(path), shuffle, af.Shard(3, 0), start_epoch=1))
            resumed.append(first_batch(str(path), shuffle, af.Shard(3, 0), resume=saved))
            fresh_old.append(first_batch(str(path), shuffle, af.Shard(8, 0), start_epoch=1))
        f, r, o = (statistics.median(v) for v in (fresh, resumed, fresh_old))
        # Each resume against the fresh start just before it: a machine whose speed drifts
        # moves both alike.
        paired = statistics.median(b / a for a, b in zip(fresh, resumed, strict=True))
        out[str(shuffle)] = {"fresh_s": f, "resumed_s": r, "fresh_8_s": o, "ratio": paired}
    return out


def rest_rate(x: Any, shard: af.Shard, saved: dict[str, Any]) -> float:
    """Rows/s of the first pass of worker ``shard`` resumed from ``saved``."""
    began = time.perf_counter()
    b = af.batches(x, shuffle="block", shard=shard, resume=saved, **OPTIONS)
    rows = sum(len(batch) for batch in b)
    return rows / (time.perf_counter() - began)


def block_rate(store: Path, reps: int) -> dict[str, Any]:
    x = af.open_array(f"{store}:x")
    saved = saved_state(x, "block", 4)
    unchanged, elastic = [], []
    for _ in range(reps):
        unchanged.append(rest_rate(x, af.Shard(4, 0), saved))
        elastic.append(rest_rate(x, af.Shard(3, 0), saved))
    u, e = statistics.median(unchanged), statistics.median(elastic)
    return {
        "layout": {k: saved[k] for k in ("block_rows", "window_blocks")},
        "unchanged_rows_per_s": u,
        "elastic_rows_per_s": e,
        "ratio": e / u,
    }


def read_per_row(plan: Any, epoch: int, step: int) -> float:
    """Rows of storage that ``plan``'s steps ``step..`` of ``epoch`` read, per row delivered."""
    order = plan.block_order(epoch)
    first = order.window_at(step * plan.batch_size)
    read = 0
    for w in range(first, order.windows):
        lo, hi = order.window_blocks(w)
        read += int((hi - lo).sum())
    return read / plan.index_count(step, plan.steps)


def reading(n_rows: int, layout: dict[str, int], pairs: list[tuple[int, int]]) -> dict[str, Any]:
    """Most rows read per row delivered over the workers, unchanged and re-dealt (see above)."""
    out = {}
    for old, new in pairs:
        kwargs = {"n_rows": n_rows, "batch_size": BATCH, "shuffle": "block", "seed": 0, **layout}
        plans = [Plan(shard=af.Shard(old, k), **kwargs) for k in range(old)]
        taken = plans[0].steps // 3
        segment = Segment(workers=old, batch_size=BATCH, steps=taken, **layout)
        unchanged = max(read_per_row(p, 1, taken) for p in plans)
        worst = 0.0
        for m in range(new):
            plan, (epoch, step) = Plan(shard=af.Shard(new, m), **kwargs).resumed(1, [segment])
            worst = max(worst, read_per_row(plan, epoch, step))
        out[f"{old}->{new}"] = {
            "unchanged": unchanged,
            "redealt": worst,
            "ratio": unchanged / worst,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the .npy file")
    parser.add_argument("--store-rows", type=int, default=2_400_000, help="rows of the store")
    parser.add_argument("--row-bytes", type=int, default=512, help="bytes per row of the store")
    parser.add_argument("--reps", type=int, default=9, help="runs of the block rate")
    parser.add_argument(
        "--first-reps",
        type=int,
        default=101,
        help="runs of each first batch (a few ms each, a quarter of them 15%% apart: many)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        np.save(root / "ids.npy", np.arange(args.rows, dtype=np.int64))
        first = time_to_first_batch(root / "ids.npy", args.first_reps)
        rng = np.random.default_rng(0)  # compressible rows, as most stored data is
        rows = rng.integers(0, 16, (args.store_rows, args.row_bytes), dtype=np.uint8)
        af.convert({"x": rows}, root / "s.zarr", compression="lzf", progress=False)
        del rows
        block = block_rate(root / "s.zarr", args.reps)
    pairs = [(4, 3), (8, 3), (8, 6), (3, 4), (8, 12)]
    amplification = reading(args.store_rows, block["layout"], pairs)
    print(f"Time to the first batch, {args.rows:,} rows, state of 8 workers resumed on 3:")
    print("| shuffle | fresh start s | resume=state s | ratio (target <= 1.10) | fresh on 8 s |")
    print("|---|---:|---:|---:|---:|")
    for shuffle, m in first.items():
        print(
            f"| {shuffle} | {m['fresh_s']:.4f} | {m['resumed_s']:.4f} | {m['ratio']:.2f} "
            f"| {m['fresh_8_s']:.4f} |"
        )
    print(
        f"\nshuffle='block', Zarr lzf by convert, {args.store_rows:,} rows of {args.row_bytes} B, "
        f"blocks {block['layout']}: rest of an epoch of 4 workers"
    )
    print("| resumed on | rows/s | vs unchanged (target >= 0.8) |")
    print("|---|---:|---:|")
    print(f"| 4 workers (unchanged) | {block['unchanged_rows_per_s']:,.0f} | 1.00 |")
    print(f"| 3 workers (re-dealt) | {block['elastic_rows_per_s']:,.0f} | {block['ratio']:.2f} |")
    print(f"\nRows read per row delivered, worst worker, {args.store_rows:,} rows, that layout:")
    print("| workers | unchanged | re-dealt | rate ratio |")
    print("|---|---:|---:|---:|")
    for pair, m in amplification.items():
        print(f"| {pair} | {m['unchanged']:.2f} | {m['redealt']:.2f} | {m['ratio']:.2f} |")
    if args.json:
        result = {
            "machine": {"cores": usable_cores(), "python": platform.python_version()},
            "args": vars(args),
            "first_batch": first,
            "block_rate": block,
            "read_per_row": amplification,
        }
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
