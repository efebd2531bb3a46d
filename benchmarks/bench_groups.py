"""Groups of a dataset built right after another one read: batches per group and rows/s.

A feed sizes its groups when it is built, from a timed read of its storage (``waits.py``): reads
that wait get groups of few batches, reads that use the CPU groups of 16 MiB. This benchmark
builds feeds over bench_scaling's data one after another in one process, as its sweep does (a
feed read for a while, then the next built while the threads of the one before still read) and
as a script that builds its validation dataset after reading the training one does, and reports
for each: the batches per group it chose, its reader threads, and its rows/s (``--seconds`` of
reading, then 1 s timed; a fixed setting reads 1 s, then 1 s timed). With the default threads
it also logs every measurement of the tuner.

Target (any machine): a feed built right after another one read chooses the groups one built in
a quiet process chooses (the first of each storage), for storage whose reads use the CPU.

    python benchmarks/bench_groups.py --cases h5gzip,h5lzf --shape S --variants 8,default,8,default \
        --data-dir /tmp/bsdata --json groups.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaling as bs  # the data and the feed, as the sweep builds them

from arrayfeed._pipeline.tune.model import Model
from arrayfeed._pipeline.tune.windows import Window


def run(data: bs.Data, key: str, variant: str, seconds: float) -> dict[str, Any]:
    """Build a feed over ``key`` (``variant``: a thread count, or ``default``), read it, time it."""
    windows: list[tuple[float, int, float]] = []
    began = time.perf_counter()
    observe = Model.observe

    def logged(self: Model, w: Window) -> None:
        windows.append((round(time.perf_counter() - began, 2), self.threads, round(w.rate)))
        observe(self, w)

    x, y = data.arrays(key)
    threads = None if variant == "default" else int(variant)
    built = time.perf_counter()
    feed = bs.feed_for(x, y, bs.BATCH, bs.STORAGES[key].shuffle, bs.SEED, threads)
    build_seconds = time.perf_counter() - built
    epoch = [0]

    def new_epoch() -> Any:
        feed.seek(epoch[0])
        epoch[0] += 1
        return feed()

    Model.observe = logged  # type: ignore[method-assign]
    try:
        began = time.perf_counter()
        bs.drain(new_epoch, seconds if threads is None else 1.0, bs.numpy_rows)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rows, timed = bs.drain(new_epoch, 1.0, bs.numpy_rows)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    finally:
        Model.observe = observe  # type: ignore[method-assign]
    result = {
        "storage": key,
        "variant": variant,
        "group_steps": feed.group_steps,
        "build_seconds": build_seconds,
        "threads": feed.tuning.threads,
        "rows_per_s": rows / timed,
        "page_faults_per_s": faults / timed,
        "why": str(feed.tuning),
        "windows": windows if threads is None else [],
    }
    print(
        f"{data.shape.name} {bs.label(bs.STORAGES[key]):34} {variant:>7}: "
        f"{feed.group_steps:5} batches per group (built in {build_seconds * 1e3:.0f} ms), "
        f"{result['threads']:2} threads, {result['rows_per_s']:>12,.0f} rows/s",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="h5gzip,h5lzf", help="bench_scaling storages")
    parser.add_argument("--shape", default="S", choices=("S", "L"))
    parser.add_argument(
        "--variants", default="8,default,8,default", help="thread counts or 'default', in order"
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="reading before the timed 1 s")
    parser.add_argument("--rows-scale", type=float, default=1.0, help="a share of the rows")
    parser.add_argument(
        "--data-dir", default=None, help="keep (and reuse) the data here (default: removed)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    keys = args.cases.split(",")
    variants = args.variants.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        data = bs.Data(Path(args.data_dir or scratch), bs.shapes(args.rows_scale)[args.shape])
        data.ensure(set(keys))
        results = [run(data, key, v, args.seconds) for key in keys for v in variants]
        data.close()
    failed = []
    for key in keys:
        steps = [r["group_steps"] for r in results if r["storage"] == key]
        if len(set(steps)) > 1:
            failed.append(f"{key}: {steps}")
    machine = bs.machine(None)
    print(f"\n{machine['usable_cores']} usable cores, {machine['cpu']}, numpy {np.__version__}")
    print(
        "every feed of a storage chooses the groups the first one chose: "
        + ("✓" if not failed else "✗ " + "; ".join(failed))
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
