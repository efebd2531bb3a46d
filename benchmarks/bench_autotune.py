"""Concurrency that tunes itself, against every fixed setting, on storages whose best differs.

Each case reads ``af.batches`` (default arguments but the one varied) as fast as it goes:
``default`` (threads, and loader processes, tuned while reading) against ``num_threads=N``
fixed, for N in ``--threads``, and, for the cases read by a loader process by default,
against ``processes=P, num_threads=N`` for each ``PxN`` in ``--loaders``. Every run builds a
fresh ``Batches``, reads ``--warm`` seconds (tuning happens there), then measures rows/s for
``--measure`` seconds; settings alternate within each of ``--reps`` rounds and the tables show
medians. Cases (L rows, 60,000 x uint8[64,64,3] scaled by
``--rows-scale``):

- ``npy``: ``.npy`` paths, full shuffle, batch 256 (memory-bound);
- ``h5gzip``: HDF5 by h5py ``chunks=True, compression="gzip", shuffle=True``, ``"block"``,
  batch 128 (CPU-bound decoding);
- ``latency``: a storage wrapper whose every read waits 20 ms with the GIL released (object
  storage, a network filesystem), full shuffle, batch 256;
- ``dask``: a dask array over the ``.npy`` file whose 256-row chunks each take 20 ms to
  produce, ``"block"``, batch 256;
- ``s3zarr``: a Zarr store on S3 (moto's server on 127.0.0.1, written by ``arrayfeed convert``:
  16,384 rows of ``uint8[4096]``, chunks of 256 rows, lzf) behind a proxy that holds every
  request 20 ms (``bench_remote.py``'s), in storage order (``shuffle=False``: each group's
  chunks are fetched when it is read; a ``"block"`` shuffle fetches whole windows ahead, in
  bursts longer than the tuner's windows), batch 256; the remote cache is kept to 8 MiB, so
  that every epoch fetches its chunks again;
- ``map_wait``: ``.npy`` paths with a ``map_batch`` that waits 20 ms per batch without the GIL
  (a lookup service);
- ``map_gil``: ``.npy`` paths with a ``map_batch`` that holds the GIL (a Python loop per row).

The best fixed setting of a sweep is the largest of many noisy medians, so it is measured high
(the winner's curse): with ``--confirm K``, each case then runs ``K`` more rounds of the default
against the best fixed setting of the sweep, alternating, and the ratio is the median over those
pairs, a measure the choice of the setting did not bias. Both ratios are printed and saved.

Targets (printed with the machine): default / best fixed setting >= 0.9 per case (confirmed,
where ``--confirm`` was given); for the 20-ms cases default / one thread >= 8; the tuned
setting holds within 5 s of reading; no case where the default is slower than one thread.

    python benchmarks/bench_autotune.py                 # ~35 min on 2 cores (--reps 2: ~23)
    python benchmarks/bench_autotune.py --quick         # shorter runs, one round
    python benchmarks/bench_autotune.py --cases npy,latency --json out.json
    python benchmarks/bench_autotune.py --reps 2 --confirm 3   # ~35 min on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_remote import rows_of, s3_environment, start_moto, start_proxy
from bench_scaling import Data, machine, shapes

import arrayfeed as af

SEED = 0
LATENCY = 0.020
CASES = ("npy", "h5gzip", "latency", "s3zarr", "dask", "map_wait", "map_gil")
LATENCY_CASES = ("latency", "s3zarr", "dask", "map_wait")
S3_URL = "s3://bench/wide.zarr"


class SlowRows:
    """Rows of an array whose every read waits :data:`LATENCY` seconds first (GIL released)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.array.dtype

    def __len__(self) -> int:
        return len(self.array)

    def read(self, indices: np.ndarray) -> np.ndarray:
        time.sleep(LATENCY)
        return self.array[indices]


def wait_map(batch: Any) -> Any:
    time.sleep(LATENCY)
    return batch


def gil_map(batch: Any) -> Any:
    x, y = batch
    total = 0
    for row in range(len(y)):  # Python work per row, holding the GIL
        for k in range(40):
            total += k * row
    return x, y + (total & 0)


def dask_slow(x: np.ndarray) -> Any:
    import dask.array as da

    def produce(block: np.ndarray) -> np.ndarray:
        time.sleep(LATENCY)
        return block

    return da.from_array(x, chunks=(256, *x.shape[1:])).map_blocks(produce, dtype=x.dtype)


@contextlib.contextmanager
def s3_store(rows: int) -> Iterator[None]:
    """moto's S3 server with :data:`S3_URL` on it, and the environment pointing at a proxy that
    holds every request :data:`LATENCY` seconds (loader processes started later inherit it)."""
    import s3fs

    proc, endpoint = start_moto()
    proxy = None
    saved = dict(os.environ)
    os.environ.update(s3_environment(endpoint), ARRAYFEED_REMOTE_CACHE_BYTES=str(8 << 20))
    try:
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir("bench")
        data = rows_of(rows)
        af.convert({"x": data}, S3_URL, chunk_rows=256, compression="lzf", progress=False)
        proxy, url = start_proxy(endpoint, LATENCY * 1000)
        os.environ["AWS_ENDPOINT_URL"] = url
        s3fs.S3FileSystem.clear_instance_cache()
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for helper in (proxy, proc):
            if helper is not None:
                os.kill(helper.pid, signal.SIGTERM)
                helper.wait(timeout=10)


def case_args(case: str, data: Data) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arrays and keyword arguments of ``case``."""
    if case == "s3zarr":
        return (f"{S3_URL}:x",), {"batch_size": 256, "shuffle": False}
    xp, yp = data.arrays("npy")
    if case == "npy":
        return (xp, yp), {"batch_size": 256}
    if case == "h5gzip":
        x, y = data.arrays("h5gzip")
        return (x, y), {"batch_size": 128, "shuffle": "block"}
    x, y = data.memmap()
    if case == "latency":
        return (SlowRows(x), y), {"batch_size": 256}
    if case == "dask":
        return (dask_slow(x), y), {"batch_size": 256, "shuffle": "block"}
    if case == "map_wait":
        return (xp, yp), {"batch_size": 256, "map_batch": wait_map}
    if case == "map_gil":
        return (xp, yp), {"batch_size": 256, "map_batch": gil_map}
    raise ValueError(f"unknown case {case!r}; choose from {', '.join(CASES)}")


def fixed_setting(key: str) -> dict[str, int]:
    """The arguments of a fixed setting: ``"N"`` threads (in the default loader process, if
    any), or ``"PxN"``: ``P`` loader processes of ``N`` threads each."""
    processes, _, threads = key.rpartition("x")
    fixed = {"num_threads": int(threads)}
    if processes:
        fixed["processes"] = int(processes)
    return fixed


def read_by_loaders(case: str, data: Data) -> bool:
    """Whether ``case`` is read by loader processes by default."""
    arrays, kwargs = case_args(case, data)
    b = af.batches(*arrays, seed=SEED, **kwargs)
    return b.tuning.processes > 0


def run(case: str, data: Data, setting: str, warm: float, measure: float) -> dict[str, Any]:
    """Rows/s of one setting (``"default"``, or see :func:`fixed_setting`) after ``warm``
    seconds, and what the tuner chose."""
    arrays, kwargs = case_args(case, data)
    fixed = {} if setting == "default" else fixed_setting(setting)
    b = af.batches(*arrays, seed=SEED, **fixed, **kwargs)
    start = time.perf_counter()
    rows, measured_from = 0, None
    while True:
        for batch in b:
            x = batch[0] if isinstance(batch, tuple) else batch
            now = time.perf_counter()
            if measured_from is None and now - start >= warm:
                measured_from, rows = now, 0
            elif measured_from is not None:
                rows += len(x)
                if now - measured_from >= measure:
                    tuning = b.tuning
                    history = list(b._feed.tuner.history)
                    del b
                    return {
                        "rows_s": rows / (now - measured_from),
                        "threads": tuning.threads,
                        "processes": tuning.processes,
                        "process_rates": {str(k): v for k, v in tuning.process_rates.items()},
                        "settled_after": tuning.settled_after,
                        "rates": {str(k): v for k, v in tuning.rates.items()},
                        "why": str(tuning),
                        "bound": tuning.bound.value,
                        "history": history,
                    }


def slowest(settled: list[float | None]) -> float:
    """The longest time to settle of the runs (None: one that had not settled when it was
    measured, which counts as never)."""
    return max((float("inf") if s is None else s for s in settled), default=float("inf"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--threads", default="1,2,4,8,16,32")
    parser.add_argument(
        "--loaders",
        default="2x1,2x2,2x4,2x16,2x32",
        help="fixed settings PxN (P loader processes of N threads) of cases read by loaders",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warm", type=float, default=5.0)
    parser.add_argument("--measure", type=float, default=3.0)
    parser.add_argument("--rows-scale", type=float, default=1.0)
    parser.add_argument("--s3-rows", type=int, default=16384, help="rows of the S3 store")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument(
        "--confirm", type=int, default=0, help="rounds of default against the best fixed, after"
    )
    parser.add_argument("--quick", action="store_true", help="--reps 1 --warm 4 --measure 1.5")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.warm, args.measure = 1, 4.0, 1.5
    cases = [c for c in args.cases.split(",") if c]
    threads = [t for t in args.threads.split(",") if t]
    loaders = [t for t in args.loaders.split(",") if t]
    for key in threads + loaders:
        fixed_setting(key)  # (a bad one fails now, not after minutes)
    with tempfile.TemporaryDirectory() as tmp:
        data = Data(args.data_dir or Path(tmp), shapes(args.rows_scale)["L"])
        data.ensure({"npy", "h5gzip"} if "h5gzip" in cases else {"npy"})
        data.page_cache()
        remote = s3_store(args.s3_rows) if "s3zarr" in cases else contextlib.nullcontext()
        with remote:
            settings = {
                case: ["default", *threads, *(loaders if read_by_loaders(case, data) else [])]
                for case in cases
            }
            runs = sweep(cases, settings, data, args)
            confirmed = confirm(runs, data, args)
        data.close()
    where = machine(None)
    report = summarise(runs, confirmed, f"{where['cores']} cores, {where['cpu']}")
    report["machine"] = where
    report["command"] = "bench_autotune.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return report


def sweep(
    cases: list[str], settings: dict[str, list[str]], data: Data, args: argparse.Namespace
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every case at each of its settings, ``args.reps`` rounds, settings alternating."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {} for c in cases}
    for rep in range(args.reps):
        for case in cases:
            order = settings[case] if rep % 2 == 0 else settings[case][::-1]
            for key in order:
                result = run(case, data, key, args.warm, args.measure)
                runs[case].setdefault(key, []).append(result)
                line = f"  {case:9} {key:>7}: {result['rows_s']:>10,.0f} rows/s"
                if key == "default":
                    line += f"  (threads {result['history']}, {result['why']})"
                    if result["processes"] > 1 or result["process_rates"]:
                        line += f"; loader processes {result['processes']}"
                print(line, flush=True)
    return runs


def medians(by_setting: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """The median rows/s of each setting."""
    return {k: statistics.median(r["rows_s"] for r in v) for k, v in by_setting.items()}


def best_fixed(rates: dict[str, float]) -> str:
    """The fixed setting of the highest rate (``"default"`` aside)."""
    return max((k for k in rates if k != "default"), key=lambda k: rates[k])


def confirm(
    runs: dict[str, dict[str, list[dict[str, Any]]]], data: Data, args: argparse.Namespace
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``args.confirm`` rounds of each case's default against its best fixed setting of the
    sweep, alternating which runs first."""
    confirmed: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for rep in range(args.confirm):
        for case, by_setting in runs.items():
            pair = ["default", best_fixed(medians(by_setting))]
            for key in pair if rep % 2 == 0 else pair[::-1]:
                result = run(case, data, key, args.warm, args.measure)
                confirmed.setdefault(case, {}).setdefault(key, []).append(result)
                print(
                    f"  {case:9} {key:>7}: {result['rows_s']:>10,.0f} rows/s (confirm)", flush=True
                )
    return confirmed


def chosen(results: list[dict[str, Any]]) -> list[Any]:
    """The setting each default run settled on: threads, or ``PxN`` with loaders."""
    return [
        r["threads"] if r.get("processes", 0) <= 1 else f"{r['processes']}x{r['threads']}"
        for r in results
    ]


def summarise(
    runs: dict[str, dict[str, list[dict[str, Any]]]],
    confirmed: dict[str, dict[str, list[dict[str, Any]]]],
    where: str,
) -> dict[str, Any]:
    print(f"\nrows/s, medians ({where})")
    rows, checks = [], []
    for case, by_setting in runs.items():
        rates = medians(by_setting)
        best_key = best_fixed(rates)
        default = rates["default"]
        again = confirmed.get(case, {})
        defaults = by_setting["default"] + again.get("default", [])
        settled = [r["settled_after"] for r in defaults]
        row = {
            "case": case,
            "rates": rates,
            "best_fixed": best_key,
            "default_over_best": default / rates[best_key],
            "default_over_one": default / rates["1"] if "1" in rates else None,
            "threads_chosen": chosen(defaults),
            "settled_after_s": settled,
            "why": by_setting["default"][-1]["why"],
        }
        if again:
            pairs = zip(again["default"], again[best_key], strict=True)
            row["confirmed_default_over_best"] = statistics.median(
                d["rows_s"] / b["rows_s"] for d, b in pairs
            )
            row["confirmed_rates"] = medians(again)
        rows.append(row)
        cells = "  ".join(f"{k}:{v:,.0f}" for k, v in rates.items())
        print(f"  {case:9} {cells}")
        print(f"  {'':9} chosen {row['threads_chosen']}, settled after {settled} s; {row['why']}")
        what = f"{best_key} threads" if "x" not in best_key else f"{best_key}: loaders x threads"
        if again:
            print(f"  {'':9} sweep: default / best fixed {row['default_over_best']:.2f}")
            name = (
                f"{case}: default / best fixed ({what}), confirmed in {len(again['default'])} pairs"
            )
            checks.append((name, row["confirmed_default_over_best"], 0.9))
        else:
            checks.append((f"{case}: default / best fixed ({what})", row["default_over_best"], 0.9))
        if case in LATENCY_CASES and row["default_over_one"] is not None:
            checks.append((f"{case}: default / one thread", row["default_over_one"], 8.0))
        checks.append(
            (f"{case}: seconds of reading until the tuned setting holds", slowest(settled), -5.0)
        )
    slower = sum(1 for r in rows if r["default_over_one"] is not None and r["default_over_one"] < 1)
    checks.append(("cases where the default is slower than one thread", slower, -0.0))
    print(f"\ntargets ({where})")
    for name, value, target in checks:
        ok = value <= -target if target <= 0 else value >= target
        bound = f"<= {-target:g}" if target <= 0 else f">= {target:g}"
        print(f"  {'ok ' if ok else 'MISS'} {name}: {value:.2f} (target {bound})")
    return {"cases": rows, "targets": [list(c) for c in checks]}


if __name__ == "__main__":
    main()
