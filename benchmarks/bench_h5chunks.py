"""Chunked HDF5 through arrayfeed's feed: raw chunks decoded in reader threads against h5py.

Writes L rows (uint8[64, 64, 3] images and int32 labels) to HDF5 files with h5py's automatic
chunks (``chunks=True``), compressed with lzf and with shuffle+gzip, then reads one epoch with
``shuffle="block"`` through :class:`arrayfeed._pipeline.read.feed.Feed` (no TensorFlow) with 1 and 2
reader threads: once through h5py's own reads (``before``: every HDF5 call under h5py's lock)
and once through raw chunks decoded outside it (``after``). Cases run interleaved, ``--reps``
times each; the table shows median rows/s and the ratios.

Images are 8x8 patterns scaled up with a little noise, so that lzf and gzip compress them
somewhat, as they do photographs (the header line prints lzf's ratio); ``--data random`` writes
uniform noise instead, which lzf stores uncompressed (its filter marked skipped per chunk).

    python benchmarks/bench_h5chunks.py                  # 20,000 rows, 5 reps
    python benchmarks/bench_h5chunks.py --rows 5000 --reps 3
    python benchmarks/bench_h5chunks.py --max-busy 0.1   # on a shared machine
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from arrayfeed._pipeline.plan.plan import Plan, block_layout
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._pipeline.read.structure import flatten
from arrayfeed._storage import Source, chunked_rows, row_bytes
from arrayfeed._storage.hdf5.source import H5Source, open_hdf5

BATCH = 256
ROW = (64, 64, 3)


def images(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    if kind == "random":
        return rng.integers(0, 256, size=(n, *ROW), dtype=np.uint8)
    coarse = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.int16)
    fine = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)
    return np.clip(fine + rng.integers(-2, 3, size=fine.shape), 0, 255).astype(np.uint8)


def make_file(path: Path, rows: int, kind: str, compression: str) -> None:
    if path.exists():
        return
    options: dict[str, object] = {"chunks": True, "compression": compression}
    if compression == "gzip":
        options["shuffle"] = True
    rng = np.random.default_rng(0)
    tmp = path.with_suffix(".tmp")
    with h5py.File(tmp, "w") as f:
        x = f.create_dataset("x", shape=(rows, *ROW), dtype="uint8", **options)
        for lo in range(0, rows, 5000):
            hi = min(lo + 5000, rows)
            x[lo:hi] = images(rng, hi - lo, kind)
        f.create_dataset("y", data=np.arange(rows, dtype=np.int32), **options)
    tmp.rename(path)


def feed_of(path: Path, threads: int, direct: bool) -> tuple[Feed, list[Source]]:
    sources = [open_hdf5(path, "x"), open_hdf5(path, "y")]
    for source in sources:
        assert isinstance(source, H5Source)
        if not direct:  # as before this module: every read through h5py
            source._chunk_reader, source._reader_pid = "off (benchmark)", os.getpid()
    chunks = [c for c in (chunked_rows(s) for s in sources) if c]
    block_rows, window_blocks = block_layout(chunks, row_bytes(sources))
    plan = Plan(
        n_rows=len(sources[0]),
        batch_size=BATCH,
        shuffle="block",
        seed=0,
        drop_remainder=True,
        block_rows=block_rows,
        window_blocks=window_blocks,
    )
    _, treedef = flatten((0, 0), lambda v: isinstance(v, int))
    return Feed(sources, treedef, plan, num_threads=threads), sources


def epoch_rate(path: Path, threads: int, direct: bool) -> float:
    feed, sources = feed_of(path, threads, direct)
    gc.collect()
    start = time.perf_counter()
    rows = 0
    for x, _y in feed.epoch(0):
        rows += int(np.prod(x.shape[: x.ndim - len(ROW)]))
    rate = rows / (time.perf_counter() - start)
    for source in sources:
        assert isinstance(source, H5Source)
        reader = source.chunk_reader()
        assert (reader is not None) == direct, source.read_path
        source.close()
    return rate


def _cpu_ticks() -> int | None:
    """CPU time all processes used so far, in clock ticks (None off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n")[0].split()[1:]
    except OSError:
        return None
    values = [int(v) for v in fields]
    return sum(values) - values[3] - values[4]  # all but idle and iowait


def others_share(run: Callable[[], float]) -> tuple[float, float]:
    """``run()``'s result, and the share of the machine's CPUs that *other* processes used
    meanwhile (0 when unknown): on a shared machine their benchmarks take the cores ours need."""
    tick = os.sysconf("SC_CLK_TCK")
    ticks0, own0, wall0 = _cpu_ticks(), os.times(), time.perf_counter()
    result = run()
    ticks1, own1, wall1 = _cpu_ticks(), os.times(), time.perf_counter()
    if ticks0 is None or ticks1 is None:
        return result, 0.0
    own = (own1.user - own0.user) + (own1.system - own0.system)
    others = max(0.0, (ticks1 - ticks0) / tick - own)
    return result, others / ((wall1 - wall0) * (os.cpu_count() or 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5, help="clean repetitions per case")
    parser.add_argument("--data", choices=["images", "random"], default="images")
    parser.add_argument("--dir", type=Path, default=Path(".benchmarks/h5chunks"))
    parser.add_argument(
        "--max-busy",
        type=float,
        default=1.0,
        help="keep only repetitions during which other processes used less than this share "
        "of the CPUs (e.g. 0.1 on a shared machine); runs until --reps such repetitions or "
        "--max-reps in all",
    )
    parser.add_argument("--max-reps", type=int, default=50)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for compression in ("lzf", "gzip"):
        path = args.dir / f"L{args.rows}_{args.data}_{compression}.h5"
        make_file(path, args.rows, args.data, compression)
        files[compression] = path
    with h5py.File(files["lzf"], "r") as f:
        x = f["x"]
        ratio = x.size / x.id.get_storage_size()
        print(f"x: {x.shape} chunks {x.chunks}; lzf ratio {ratio:.2f}; cores {os.cpu_count()}")
    cases = [(c, t, d) for c in files for d in (False, True) for t in (1, 2)]
    rates: dict[tuple[str, int, bool], list[float]] = {case: [] for case in cases}
    dropped = 0
    for _ in range(args.max_reps):
        # One repetition of every case, interleaved; kept only if every case ran undisturbed.
        rep = {}
        for case in cases:
            compression, threads, direct = case
            run = functools.partial(epoch_rate, files[compression], threads, direct)
            rep[case], busy = others_share(run)
            if busy >= args.max_busy:
                break
        else:
            for case, rate in rep.items():
                rates[case].append(rate)
            if len(rates[cases[0]]) >= args.reps:
                break
            continue
        dropped += 1
    kept = len(rates[cases[0]])
    if not kept:
        raise SystemExit(f"no repetition ran with other processes below --max-busy {args.max_busy}")
    print(
        f"\nrows/s, median of {kept} repetitions ({dropped} dropped: other processes busy); "
        f"one epoch, batch {BATCH}, shuffle='block'"
    )
    print(
        f"{'file':8} {'threads':>7} {'before (h5py)':>14} {'after (chunks)':>15} {'after/before':>13}"
    )
    for compression in files:
        for threads in (1, 2):
            before = statistics.median(rates[(compression, threads, False)])
            after = statistics.median(rates[(compression, threads, True)])
            print(
                f"{compression:8} {threads:>7} {before:>14,.0f} {after:>15,.0f} "
                f"{after / before:>12.2f}x"
            )
        for direct, label in ((False, "before"), (True, "after")):
            one = statistics.median(rates[(compression, 1, direct)])
            two = statistics.median(rates[(compression, 2, direct)])
            print(f"{compression:8} {label}: 2 threads / 1 thread = {two / one:.2f}x")


if __name__ == "__main__":
    main()
