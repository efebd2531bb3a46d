"""``map_batch`` in reader threads vs loader processes (``processes=N``): rows/s and ratios.

Three transforms, each run through ``arrayfeed.batches`` (no TensorFlow) with ``map_batch`` in
reader threads of this process (``processes=0``) and in N loader processes, N = 1, 2, 4 …
up to the core count:

- ``python``: GIL-bound, a Python loop per row (what random crops, tokenisers and decoders
  written in Python do): S rows, 40,000 x (float32[32] + int32), the loop reads each row's values
  ``--python-passes`` times and returns one float32 per row;
- ``numpy S``: NumPy-vectorized on S rows: standardise ``x`` (float32[32]), labels passed on;
- ``numpy L``: NumPy-vectorized on L rows, 8,000 x (uint8[64,64,3] + int32): to float32 in
  [-1, 1] and flipped left-right (48 KiB out per row: the most bytes to carry back).

Baselines measured in the same run: the same feed with no ``map_batch`` (the reading alone) and
the transform called in a plain loop over pre-read batches in this process (one core's worth).
Batch 256, full shuffle, arrays in RAM; ``--reps`` interleaved repetitions (rep 1 of every case,
then rep 2 …), each iterating whole epochs until ``--seconds`` have passed, after one untimed
epoch (workers started, buffers allocated); the tables show medians, and the CPU time per row
spent in this process and its workers (which other load on the machine does not change).

Targets, printed with ✓/✗: ``python`` with 2 processes >= 1.6x threads on 2 cores (8 processes
>= 5x threads on 16); ``numpy`` with processes (N = the core count, at most 8) >= 0.9x threads.
Loaders are new interpreters; the arrays, in RAM here, are copied to each.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:
    import psutil  # the workers' CPU time (a test dependency); without it, this process's only
except ImportError:
    psutil = None

import arrayfeed as af

BATCH = 256
SEED = 0
S_ROWS, L_ROWS = 40_000, 8_000
#: Passes of the Python loop over each row's values (``--python-passes``): 8 make ~10 us a row
#: here, the order of a random crop or a short tokenisation written in Python.
PYTHON_PASSES = 8


# -- the transforms (module level: a loader imports them by reference) -----------------------------
def python_map(
    batch: tuple[np.ndarray, np.ndarray], passes: int = PYTHON_PASSES
) -> tuple[np.ndarray, np.ndarray]:
    """A Python loop per row, holding the GIL throughout (one float32 per row out)."""
    x, y = batch
    out = np.empty(len(x), dtype=np.float32)
    for i, row in enumerate(x.tolist()):
        acc = 0.0
        for _ in range(passes):
            for v in row:
                acc = acc + v * v if v > 0.5 else acc - v
        out[i] = acc
    return out, y


def numpy_s_map(batch: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Standardise each row of ``x``; vectorized."""
    x, y = batch
    mean = x.mean(axis=1, keepdims=True)
    std = x.std(axis=1, keepdims=True) + np.float32(1e-6)
    return (x - mean) / std, y


def numpy_l_map(batch: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images to float32 in [-1, 1], flipped left-right; vectorized."""
    x, y = batch
    out = x[:, :, ::-1].astype(np.float32)
    out *= np.float32(2 / 255)
    out -= np.float32(1)
    return out, y


TRANSFORMS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "python": (python_map, "S"),
    "numpy S": (numpy_s_map, "S"),
    "numpy L": (numpy_l_map, "L"),
}


def data(shape: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if shape == "S":
        return rng.random((S_ROWS, 32), dtype=np.float32), np.arange(S_ROWS, dtype=np.int32)
    x = rng.integers(0, 256, size=(L_ROWS, 64, 64, 3), dtype=np.uint8)
    return x, np.arange(L_ROWS, dtype=np.int32)


# -- measuring -------------------------------------------------------------------------------------
Run = Callable[[float], tuple[int, float, float]]  # seconds -> rows, elapsed, CPU seconds


@dataclass
class Case:
    transform: str
    mode: str  # "threads", "N processes", "no map_batch", "in a loop"
    run: Run
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)  # CPU per row, this process + workers

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its live children (the workers)."""
    children = 0.0
    if psutil is not None:
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                children += sum(child.cpu_times()[:2])
    return time.process_time() + children


def timed(epoch: Callable[[], int]) -> Run:
    """Whole passes of ``epoch`` (which returns its rows) until ``seconds`` have passed."""

    def run(seconds: float) -> tuple[int, float, float]:
        rows = 0
        cpu, start = cpu_seconds(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            rows += epoch()
        return rows, time.perf_counter() - start, cpu_seconds() - cpu

    return run


def batches_run(b: af.Batches) -> Run:
    for _ in b:  # untimed: workers started, buffers allocated
        pass
    return timed(lambda: sum(len(batch[1]) for batch in b))


def loop_run(fn: Callable[[Any], Any], x: np.ndarray, y: np.ndarray) -> Run:
    """``fn`` on pre-read batches in this thread: what one core does with no feed at all."""
    batches = [(x[i : i + BATCH].copy(), y[i : i + BATCH].copy()) for i in range(0, len(y), BATCH)]
    return timed(lambda: sum(len(fn(batch)[1]) for batch in batches))


def process_sweep(cores: int) -> list[int]:
    sweep, n = [], 1
    while n < cores:
        sweep.append(n)
        n *= 2
    return [*sweep, cores]


def cases_for(transform: str, sweep: list[int], threads: int | None, passes: int) -> list[Case]:
    fn, shape = TRANSFORMS[transform]
    if fn is python_map:
        fn = functools.partial(python_map, passes=passes)  # picklable: spawn takes it too
    x, y = data(shape)

    def make(**kwargs: Any) -> af.Batches:
        return af.batches(x, y, batch_size=BATCH, seed=SEED, num_threads=threads, **kwargs)

    cases = [
        Case(transform, "no map_batch", batches_run(make(processes=0))),
        Case(transform, "in a loop", loop_run(fn, x, y)),
        Case(transform, "threads", batches_run(make(map_batch=fn, processes=0))),
    ]
    for n in sweep:
        b = make(map_batch=fn, processes=n)
        cases.append(Case(transform, f"{n} processes", batches_run(b)))
    return cases


def measure(cases: list[Case], reps: int, seconds: float, log: Callable[[str], None]) -> None:
    for rep in range(reps):
        for case in cases:
            rows, elapsed, cpu = case.run(seconds)
            case.rates.append(rows / elapsed)
            case.cpu_us.append(cpu / rows * 1e6)
        log(f"rep {rep + 1}/{reps} done")


# -- reporting -------------------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    value: float | None
    goal: float
    note: str = ""

    @property
    def met(self) -> bool | None:
        return None if self.value is None else self.value >= self.goal


def targets(cases: list[Case], cores: int) -> list[Target]:
    rate = {(c.transform, c.mode): c.median for c in cases}

    def ratio(transform: str, mode: str) -> float | None:
        ours, threads = rate.get((transform, mode)), rate.get((transform, "threads"))
        return None if ours is None or not threads else ours / threads

    found = []
    n = 2 if cores <= 2 else min(8, cores)
    goal = 1.6 if cores <= 2 else 5.0
    note = "" if cores in (2, 16) else f"goal set for {2 if cores < 16 else 16} cores"
    found.append(
        Target(f"python: {n} processes / threads", ratio("python", f"{n} processes"), goal, note)
    )
    n = min(8, cores)
    for transform in ("numpy S", "numpy L"):
        found.append(
            Target(f"{transform}: {n} processes / threads", ratio(transform, f"{n} processes"), 0.9)
        )
    return found


def table(cases: list[Case]) -> str:
    lines = [
        f"{'transform':10} {'map_batch runs':16} {'rows/s':>12} {'vs threads':>11} "
        f"{'CPU us/row':>11}"
    ]
    threads = {c.transform: c.median for c in cases if c.mode == "threads"}
    for c in cases:
        vs = f"{c.median / threads[c.transform]:.2f}x" if c.mode != "threads" else "1"
        cpu = statistics.median(c.cpu_us)
        lines.append(f"{c.transform:10} {c.mode:16} {c.median:12,.0f} {vs:>11} {cpu:11.2f}")
    return "\n".join(lines)


def target_table(found: list[Target], info: dict[str, Any]) -> str:
    lines = [
        f"\nTargets ({info['cores']} cores, {info['cpu']}; Python {info['python']}, "
        f"numpy {info['numpy']}; load average "
        f"{info['load_before']:.2f} before, {info['load_average']:.2f} after)",
        f"{'target':42} {'measured':>9} {'goal':>7}  met",
    ]
    for t in found:
        mark = {True: "✓", False: "✗", None: "-"}[t.met]
        value = "—" if t.value is None else f"{t.value:.3g}"
        note = f"  ({t.note})" if t.note else ""
        lines.append(f"{t.name:42} {value:>9} {'≥ ' + str(t.goal):>7}  {mark}{note}")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "arrayfeed": af.__version__,
        "load_average": os.getloadavg()[0],  # other work on the machine skews the figures
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (median)")
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per case and rep")
    parser.add_argument(
        "--transforms",
        default=",".join(TRANSFORMS),
        help=f"comma-separated subset of: {', '.join(TRANSFORMS)}",
    )
    parser.add_argument(
        "--processes", help="comma-separated process counts (default 1, 2, 4 … up to the cores)"
    )
    parser.add_argument("--threads", type=int, help="reader threads (default: arrayfeed's)")
    parser.add_argument(
        "--python-passes",
        type=int,
        default=PYTHON_PASSES,
        help=f"weight of the python transform: passes over each row (default {PYTHON_PASSES})",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    args.transforms = [t.strip() for t in args.transforms.split(",") if t.strip()]
    unknown = set(args.transforms) - set(TRANSFORMS)
    if unknown:
        parser.error(f"--transforms: unknown {sorted(unknown)}; choose from {list(TRANSFORMS)}")
    cores = os.cpu_count() or 1
    args.processes = (
        [int(n) for n in args.processes.split(",")] if args.processes else process_sweep(cores)
    )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    begin = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - begin:6.1f}s] {message}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()[0]
    cases: list[Case] = []
    for transform in args.transforms:
        cases += cases_for(transform, args.processes, args.threads, args.python_passes)
        log(f"{transform}: built and warmed up")
    measure(cases, args.reps, args.seconds, log)
    info = {**machine(), "load_before": load_before}
    cores = info["cores"] or 1
    print(
        f"\nmap_batch in threads vs processes: batch {BATCH}, full shuffle, arrays in RAM; "
        f"{args.reps} interleaved reps of {args.seconds:g} s; medians"
    )
    print(table(cases))
    found = targets(cases, cores)
    print(target_table(found, info))
    print(f"\ntotal {time.perf_counter() - begin:.0f} s")
    if args.json:
        report = {
            "machine": info,
            "config": {
                "batch_size": BATCH,
                "reps": args.reps,
                "seconds": args.seconds,
                "processes": args.processes,
                "threads": args.threads,
                "python_passes": args.python_passes,
            },
            "figures": [
                {
                    "transform": c.transform,
                    "mode": c.mode,
                    "rates": c.rates,
                    "median": c.median,
                    "cpu_us_per_row": c.cpu_us,
                }
                for c in cases
            ],
            "targets": [
                {"name": t.name, "value": t.value, "goal": t.goal, "met": t.met, "note": t.note}
                for t in found
            ],
        }
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
