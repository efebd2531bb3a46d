"""GIL hand-offs: how often arrayfeed's work gives the GIL away, measured beside a busy thread.

A training loop is a Python thread that holds the GIL whenever it can. Each time a reader thread
releases the GIL (a NumPy call on more than a few hundred elements, a ``pread``, a lock wait) it
waits to get it back until the busy thread is made to drop it: up to the interpreter's switch
interval, 5 ms by default. Work that is cheap on a quiet machine can then be slow in ``fit``: what
counts there is the number of hand-offs per row, not the time the GIL is held.

This benchmark counts them without instrumenting anything: it times the same work beside a thread
spinning in Python with the switch interval at 5 ms and at 1 ms. Each hand-off costs about one
interval, so ``(t_5ms - t_1ms) / 4 ms`` is the number of hand-offs (the work itself cancels out).
Measured for the index planning of an epoch (full shuffle and ``shuffle="block"``), and for a
group of batches read by the feed with one reader thread (the consumer's own wait included), for
the storages of ``bench_scaling.py`` (its data, written on demand). No TensorFlow needed.

    python benchmarks/bench_handoffs.py                 # S and L, every case (~2 min)
    python benchmarks/bench_handoffs.py --cases npy --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaling as bs  # the data and the feed, as the scaling benchmark has them

from arrayfeed._pipeline.plan.plan import Plan

INTERVALS = (0.005, 0.001)  # switch intervals (s): a hand-off costs about one


@contextmanager
def busy(interval: float | None) -> Iterator[None]:
    """A thread spinning in Python, with the switch interval at ``interval`` (None: quiet)."""
    old = sys.getswitchinterval()
    if interval is not None:
        sys.setswitchinterval(interval)
    try:
        with bs.busy_thread(interval is not None):
            yield
    finally:
        sys.setswitchinterval(old)


def timed(work: Callable[[], int], reps: int) -> dict[str, float]:
    """Seconds per unit of ``work`` (which returns the units it did) quiet and beside a busy
    thread at each switch interval, and the hand-offs per unit they imply."""
    out: dict[str, float] = {}
    for interval in (None, *INTERVALS):
        times = []
        with busy(interval):
            for _ in range(reps):
                t = time.perf_counter()
                units = work()
                times.append((time.perf_counter() - t) / units)
        out["quiet" if interval is None else f"busy {interval * 1e3:g} ms"] = statistics.median(
            times
        )
    slow, fast = out[f"busy {INTERVALS[0] * 1e3:g} ms"], out[f"busy {INTERVALS[1] * 1e3:g} ms"]
    out["hand-offs"] = max(0.0, (slow - fast) / (INTERVALS[0] - INTERVALS[1]))
    return out


def planning(
    n: int, shuffle: bool | str, block_rows: int = 1, window_blocks: int = 1
) -> Callable[[], int]:
    """The index planning of one epoch (a new epoch per call): one unit per epoch."""
    plan = Plan(
        n_rows=n,
        batch_size=bs.BATCH,
        shuffle=shuffle,  # type: ignore[arg-type]
        seed=0,
        drop_remainder=True,
        block_rows=block_rows,
        window_blocks=window_blocks,
    )
    epochs = iter(range(1 << 30))

    def work() -> int:
        plan.indices(next(epochs), 0, plan.steps)
        return 1

    return work


def groups(data: bs.Data, key: str, count: int) -> Callable[[], int]:
    """``count`` groups read by the feed with one reader thread, from a new epoch each call:
    one unit per group."""
    x, y = data.arrays(key)
    feed = bs.feed_for(x, y, bs.BATCH, bs.STORAGES[key].shuffle, 0, 1)
    epochs = iter(range(1 << 30))

    def work() -> int:
        done = 0
        for _ in feed.epoch(next(epochs)):
            done += 1
            if done == count:
                break
        return done

    work()  # files opened, indexes read
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="S,L", help="subset of: S, L")
    parser.add_argument(
        "--cases", default="npy,h5lzf,zarr,zarrconv", help="storages of bench_scaling"
    )
    parser.add_argument("--rows-scale", type=float, default=1.0, help="scale the rows (tests)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4, help="groups timed per repetition")
    parser.add_argument("--data-dir", type=Path, help="keep (and reuse) the data here")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(bs.STORAGES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {sorted(bs.STORAGES)}")

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data_dir or Path(tmp)
        for name in args.shapes.split(","):
            shape = bs.shapes(args.rows_scale)[name]
            block = 3750 if name == "L" else 15625  # HDF5 chunks=True rows, 7 blocks a window
            plans = {
                f"{name} plan of an epoch, full shuffle": planning(shape.rows, True),
                f"{name} plan of an epoch, block": planning(shape.rows, "block", block, 2),
            }
            for label, work in plans.items():
                results[label] = timed(work, args.reps)
            data = bs.Data(root, shape)
            data.ensure(set(cases))
            try:
                for key in cases:
                    label = f"{name} group of the feed, {bs.label(bs.STORAGES[key])}"
                    results[label] = timed(groups(data, key, args.groups), args.reps)
            finally:
                data.close()

    columns = ["quiet", *(f"busy {i * 1e3:g} ms" for i in INTERVALS)]
    print(
        f"\nGIL hand-offs ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})"
    )
    print(f"{'work':60s}" + "".join(f"{c:>14s}" for c in columns) + f"{'hand-offs':>11s}")
    for label, row in results.items():
        print(
            f"{label:60s}"
            + "".join(f"{row[c] * 1e3:11.2f} ms" for c in columns)
            + f"{row['hand-offs']:11.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
