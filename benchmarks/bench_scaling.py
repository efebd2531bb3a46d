"""Many-core scaling of arrayfeed: rows/s per reader-thread count, storage and level.

For two row sizes (S: 1,000,000 x (float32[32] + int32); L: 60,000 x (uint8[64,64,3] + int32)) and
eight storages (``.npy`` path, in-RAM ndarray, contiguous HDF5, chunked HDF5 with lzf and with
gzip+shuffle, Zarr with auto chunks, Zarr and HDF5 written by ``arrayfeed.convert``), it sweeps the
reader threads (1, 2, 4, ... up to the core count, and the default) at three levels:

- ``feed``: the reading engine alone, no TensorFlow (runs where TensorFlow is absent);
- ``tfdata``: through ``arrayfeed.from_arrays``, when TensorFlow is installed;
- ``fit``: Keras 3 ``fit`` with ``KERAS_BACKEND=jax`` of a small CNN on L rows, fed by
  ``from_arrays`` (whose NumPy batches Keras takes directly on JAX), by the same dataset made to
  go through tf.data, and by ``af.batches`` in a generator, against its peers (``PyDataset``,
  Grain, NumPy arrays in RAM, one batch repeated), only when JAX sees a GPU.

Batch 256, ``drop_remainder``, a full shuffle (``shuffle="block"`` for chunked storage), data
page-cached before timing. Each figure is the rows consumed in a plain Python loop divided by the
time: whole epochs (a new permutation each) until ``--seconds`` have passed, an epoch cut short
only after 3x that (or ``--seconds`` after the first batch, if later). Every case runs ``--reps``
times, interleaved (rep 1 of every case, then rep 2 ...), and the tables show medians.
Baselines are measured in the same run: NumPy ``np.take`` of sorted random batches with T
threads (from the memmap and from RAM), the storage library's own chunk-aligned slab reads with
T threads, and, with TensorFlow, ``from_tensor_slices(in RAM).shuffle(N).batch`` and the tf.data
floor (``from_tensors(batch).repeat()``). ``--busy-thread`` runs every feed and tf.data measurement
beside a thread spinning in Python, as a training loop would be; without it, the ``.npy`` cases
(and the memmap gather) are measured both ways.

The targets are printed with ✓/✗ for the machine the run is on; on 2 cores, the 2-core targets
(every case at 2 threads >= 0.95x its 1-thread figure, chunked HDF5 + lzf "block" >= 1.6x) replace
the 16-core speed-ups. The data lives in a temporary directory removed at the end, or in
``--data-dir``, where it is kept and reused.

L images are 32x32 random pixels upscaled 2x, which compress like photos (lzf ~1.6x, gzip ~1.9x):
random bytes would make HDF5 skip its filters and time no decompression at all.

    python benchmarks/bench_scaling.py                # full sizes (~8 min on 2 cores)
    python benchmarks/bench_scaling.py --quick        # a tenth of the rows (~2 min)
    python benchmarks/bench_scaling.py --cases npy,h5lzf,gather --levels feed --json out.json

The default threads are tuned while reading: timed from a cold start (``--warm 0``) the figure
shows what a short job sees; ``--warm 4 --warm-fixed 1`` reads 4 s (1 s with fixed threads)
before each timed run, so that the default is timed once tuned (``--verbose`` logs every run,
which is what comes back from a run cut short by a time limit):

    python benchmarks/bench_scaling.py --levels feed --reps 1 --seconds 1 --warm 4 --warm-fixed 1 \
        --cases npy,ram,h5,h5lzf,h5gzip,zarr,zarrconv,h5conv,busy --verbose
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py
import numpy as np
import zarr

import arrayfeed as af
from arrayfeed._pipeline.plan.plan import Plan, block_layout
from arrayfeed._pipeline.read.feed import Feed
from arrayfeed._pipeline.read.structure import flatten
from arrayfeed._storage import as_source, chunked_rows, row_bytes

BATCH = 256
SEED = 0
LEVELS = ("feed", "tfdata", "fit")
LEVEL_TITLES = {
    "feed": "feed level (arrayfeed's reading engine, no TensorFlow)",
    "tfdata": "tf.data level (arrayfeed.from_arrays)",
    "fit": "end to end: Keras 3 fit, small CNN on L rows",
}
#: The cases that have no reader threads to set.
SINGLE = ("tf.data floor", "from_tensor_slices.shuffle(N).batch")


# -- the glue: NumPy batches without TensorFlow ----------------------------------------------------
def feed_for(
    x: Any, y: Any, batch_size: int, shuffle: bool | str, seed: int, num_threads: int | None
) -> Feed:
    """A :class:`Feed` over ``(x, y)`` built the way ``from_arrays`` builds it (no sharding,
    ``drop_remainder=True``); ``feed()`` yields the next epoch's groups of batches as NumPy arrays.

    The only place that reaches into arrayfeed's internals: swap it for a public NumPy-batches
    API when there is one.
    """
    leaves, treedef = flatten((x, y), lambda v: not isinstance(v, (tuple, list, dict)), "(x, y)")
    sources = [as_source(leaf, name) for leaf, name in zip(leaves, ("x", "y"), strict=True)]
    block_rows, window_blocks = 1, 1
    if shuffle == "block":
        chunks = [rows for rows in map(chunked_rows, sources) if rows]
        block_rows, window_blocks = block_layout(chunks, row_bytes(sources))
    plan = Plan(
        n_rows=len(sources[0]),
        batch_size=batch_size,
        drop_remainder=True,
        shuffle=shuffle,  # type: ignore[arg-type]  # Plan takes True / "full" / "block"
        seed=seed,
        block_rows=block_rows,
        window_blocks=window_blocks,
    )
    return Feed(sources, treedef, plan, num_threads=num_threads)


# -- what is measured ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    name: str
    rows: int
    row_shape: tuple[int, ...]
    dtype: str

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape)) * np.dtype(self.dtype).itemsize + 4


def shapes(scale: float) -> dict[str, Shape]:
    def rows(n: int) -> int:
        return max(2 * BATCH, round(n * scale))

    return {
        "S": Shape("S", rows(1_000_000), (32,), "float32"),
        "L": Shape("L", rows(60_000), (64, 64, 3), "uint8"),
    }


@dataclass(frozen=True)
class Storage:
    key: str  # the name --cases takes
    label: str
    shuffle: bool | str  # full shuffle, or "block" for chunked storage


STORAGES = {
    s.key: s
    for s in (
        Storage("npy", ".npy path", True),
        Storage("ram", "in-RAM ndarray", True),
        Storage("h5", "HDF5 contiguous", True),
        Storage("h5lzf", "HDF5 chunked lzf", "block"),
        Storage("h5gzip", "HDF5 chunked gzip+shuffle", "block"),
        Storage("zarr", "Zarr auto chunks", "block"),
        Storage("zarrconv", "Zarr by convert", "block"),
        Storage("h5conv", "HDF5 by convert (lzf)", "block"),
    )
}
CHUNKED = ("h5lzf", "h5gzip", "zarr", "zarrconv", "h5conv")
#: Baselines --cases takes: NumPy gather, slab reads, tf.data floor, from_tensor_slices, and
#: the .npy cases again beside a busy Python thread.
BASELINES = ("gather", "slab", "floor", "fts", "busy")
#: The NumPy gather baseline in groups of the feed's size (see gather_run).
GROUPED_GATHER = "NumPy gather (memmap), the feed's groups"


def label(storage: Storage) -> str:
    return f"{storage.label} ({'block' if storage.shuffle == 'block' else 'full'})"


# -- data ------------------------------------------------------------------------------------------
class Data:
    """The files of one shape under ``root``, written on demand and reused when present."""

    def __init__(self, root: Path, shape: Shape) -> None:
        self.root, self.shape = root, shape
        self.tag = f"{shape.name}{shape.rows}"
        self._open: dict[str, Any] = {}
        self._ram: tuple[np.ndarray, np.ndarray] | None = None

    def path(self, key: str) -> Path:
        names = {
            "npy_x": "x.npy",
            "npy_y": "y.npy",
            "h5": "contig.h5",
            "h5lzf": "chunked_lzf.h5",
            "h5gzip": "chunked_gzip.h5",
            "zarr": "auto.zarr",
            "zarrconv": "convert.zarr",
            "h5conv": "convert_lzf.h5",
        }
        return self.root / f"{self.tag}_{names[key]}"

    def ensure(self, keys: set[str]) -> None:
        """Write the files of ``keys`` that are not there yet (each written beside its final
        name and renamed, so that an interrupted run leaves nothing to reuse by mistake)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.path("npy_y").exists():
            self._write_npy()
        x = np.load(self.path("npy_x"), mmap_mode="r")
        y = np.load(self.path("npy_y"))
        for key in sorted(keys - {"npy", "ram"}):
            path = self.path(key)
            if path.exists():
                continue
            with self._writing(path) as tmp:
                if key in ("h5", "h5lzf", "h5gzip"):
                    filters: dict[str, Any] = {
                        "h5": {},
                        "h5lzf": {"chunks": True, "compression": "lzf"},
                        "h5gzip": {"chunks": True, "compression": "gzip", "shuffle": True},
                    }[key]
                    with h5py.File(tmp, "w") as f:
                        f.create_dataset("x", data=x, **filters)
                        f.create_dataset("y", data=y, **filters)
                elif key == "zarr":
                    group = zarr.open_group(tmp, mode="w")
                    zx = group.create_array("x", shape=x.shape, dtype=x.dtype, chunks="auto")
                    step = max(1, (64 << 20) // self.shape.row_bytes)
                    for lo in range(0, len(x), step):
                        zx[lo : lo + step] = x[lo : lo + step]
                    group.create_array("y", shape=y.shape, dtype=y.dtype, chunks="auto")[...] = y
                else:
                    af.convert(
                        {"x": self.path("npy_x"), "y": self.path("npy_y")},
                        tmp,
                        compression="lzf" if key == "h5conv" else None,
                        progress=False,
                    )

    @staticmethod
    @contextlib.contextmanager
    def _writing(path: Path) -> Iterator[Path]:
        tmp = path.with_name(f"{path.stem}.partial{path.suffix}")
        for leftover in (tmp, path):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink(missing_ok=True)
        yield tmp
        os.replace(tmp, path)

    def _write_npy(self) -> None:
        shape, rng = self.shape, np.random.default_rng(SEED)
        with self._writing(self.path("npy_x")) as tmp:
            x = np.lib.format.open_memmap(
                tmp, mode="w+", dtype=shape.dtype, shape=(shape.rows, *shape.row_shape)
            )
            step = max(1, (32 << 20) // shape.row_bytes)
            for lo in range(0, shape.rows, step):
                n = min(step, shape.rows - lo)
                if shape.dtype == "uint8":  # 2x upscaled noise: compresses about like photos
                    h, w, c = shape.row_shape
                    small = rng.integers(0, 256, size=(n, h // 2, w // 2, c), dtype=np.uint8)
                    x[lo : lo + n] = small.repeat(2, axis=1).repeat(2, axis=2)
                else:
                    x[lo : lo + n] = rng.standard_normal((n, *shape.row_shape), dtype=np.float32)
            x.flush()
            del x
        with self._writing(self.path("npy_y")) as tmp:  # written last: marks the pair complete
            np.save(tmp, (np.arange(shape.rows) % 10).astype(np.int32))

    def files(self) -> list[Path]:
        mine = [p for p in self.root.iterdir() if p.name.startswith(self.tag + "_")]
        return sorted(
            f for p in mine for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()
        )

    def page_cache(self) -> None:
        """Read every file of this shape once, so that timings see page-cached data."""
        for path in self.files():
            with open(path, "rb", buffering=0) as f:
                while f.read(16 << 20):
                    pass

    def memmap(self) -> tuple[np.ndarray, np.ndarray]:
        return np.load(self.path("npy_x"), mmap_mode="r"), np.load(self.path("npy_y"))

    def ram(self) -> tuple[np.ndarray, np.ndarray]:
        if self._ram is None:
            self._ram = np.load(self.path("npy_x")), np.load(self.path("npy_y"))
        return self._ram

    def arrays(self, key: str) -> tuple[Any, Any]:
        """What a user passes to arrayfeed for storage ``key``."""
        if key == "npy":
            return str(self.path("npy_x")), str(self.path("npy_y"))
        if key == "ram":
            return self.ram()
        if key not in self._open:
            path = self.path(key)
            if key.startswith("h5"):
                self._open[key] = h5py.File(path, "r")
            else:
                self._open[key] = zarr.open_group(path, mode="r")
        group = self._open[key]
        return group["x"], group["y"]

    def slab_reader(self, key: str) -> tuple[Callable[[int, int], object], int]:
        """``read(lo, hi)`` with the storage library itself, and the rows of x's chunks."""
        x, y = self.arrays(key)
        shards = getattr(x, "shards", None)  # zarr: a sharded array reads whole shards
        rows = int((shards or x.chunks)[0])
        return (lambda lo, hi: (x[lo:hi], y[lo:hi])), rows

    def close(self) -> None:
        for handle in self._open.values():
            if isinstance(handle, h5py.File):
                handle.close()
        self._open.clear()
        self._ram = None


# -- measuring -------------------------------------------------------------------------------------
Run = Callable[[float], tuple[int, float]]  # budget in seconds -> (rows, seconds)


@dataclass
class Case:
    level: str
    shape: str
    name: str
    kind: str  # "arrayfeed" or "baseline"
    threads: str  # "1", "2", ... , "default", or "-" (no reader threads to set)
    busy: bool
    run: Run
    info: dict[str, Any] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)

    def figure(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "shape": self.shape,
            "case": self.name,
            "kind": self.kind,
            "threads": self.threads,
            "busy_thread": self.busy,
            "median": statistics.median(self.samples) if self.samples else None,
            "samples": self.samples,
            **self.info,
        }


@contextlib.contextmanager
def busy_thread(on: bool) -> Iterator[None]:
    """A thread spinning in Python (holding the GIL), as a training loop beside the reader."""
    if not on:
        yield
        return
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    thread = threading.Thread(target=spin, name="busy", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


#: An epoch is cut short only after this many budgets (and never before a budget has passed
#: since its first element): capping at the budget itself would count little but an epoch's
#: start-up (iterator, threads, the first window of a block shuffle).
CAP = 3.0


def drain(
    new_epoch: Callable[[], Any],
    budget: float,
    rows_of: Callable[[Any], int],
    whole_epochs: bool = False,
) -> tuple[int, float]:
    """Consume whole epochs in a plain loop until ``budget`` seconds have passed, cutting an
    epoch short only at ``CAP`` budgets, or a budget after its first element if that is later
    (never with ``whole_epochs``); ``(rows, seconds)``, start-up included. The clock stops
    before an interrupted epoch is closed (its in-flight reads are not waited for)."""
    rows, start = 0, time.perf_counter()
    cap = float("inf") if whole_epochs else start + CAP * budget
    while True:
        it = iter(new_epoch())
        try:
            for element in it:
                now = time.perf_counter()
                if rows == 0:  # the first element of the run
                    cap = max(cap, now + budget)
                rows += rows_of(element)
                if now >= cap:
                    return rows, now - start
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
            del it
        if time.perf_counter() >= start + budget:
            return rows, time.perf_counter() - start


def numpy_rows(group: Any) -> int:
    return int(group[1].size)  # y holds one int32 per row, with or without a group axis


def tf_rows(batch: Any) -> int:
    return int(batch[1].shape[0])


def feed_run(make: Callable[[], Feed], info: dict[str, Any], warm: float = 0.0) -> Run:
    """Epochs of a Feed built afresh for every run (untimed), so that only one case's buffers
    exist at a time (dozens of feeds kept alive held 7 GiB for L on 2 cores); the epoch number
    carries on from run to run. With ``warm``, the feed is read that long before it is timed
    (tuned threads settle there), and what the tuner chose is kept in ``info``."""
    state = {"epoch": 0}

    def run(budget: float) -> tuple[int, float]:
        feed = make()
        info["resolved_threads"] = feed.num_threads
        info.setdefault("group_steps", []).append(feed.group_steps)  # batches per group

        def new_epoch() -> Iterator[Any]:
            # Called as tf.data calls it, so that a short epoch reads the next one ahead.
            feed.seek(state["epoch"])
            state["epoch"] += 1
            return feed()

        if warm > 0:
            drain(new_epoch, warm, numpy_rows)
        result = drain(new_epoch, budget, numpy_rows)
        tuning = feed.tuning
        if tuning.tuned:
            info.setdefault("tuned_threads", []).append(tuning.threads)
            info.setdefault("settled_after", []).append(tuning.settled_after)
            info.setdefault("history", []).append([t for t, _ in feed.tuner.history])
            info["why"] = str(tuning)
        return result

    return run


def from_arrays_run(make: Callable[[int], Any], warm: float = 0.0) -> Run:
    """Like :func:`feed_run`, for ``make(start_epoch)`` building a ``from_arrays`` dataset:
    every iteration of it is the next epoch."""
    state = {"epoch": 0}

    def run(budget: float) -> tuple[int, float]:
        ds = make(state["epoch"])

        def new_epoch() -> Any:
            state["epoch"] += 1
            return ds

        if warm > 0:
            drain(new_epoch, warm, tf_rows)
        return drain(new_epoch, budget, tf_rows)

    return run


def dataset_run(make: Callable[[], Any], whole_epochs: bool = False) -> Run:
    made: list[Any] = []

    def run(budget: float) -> tuple[int, float]:
        if not made:
            made.append(make())
        return drain(lambda: iter(made[0]), budget, tf_rows, whole_epochs)

    return run


def threaded(work: Callable[[int, int, float], int], threads: int) -> Run:
    """``work(k, threads, deadline) -> rows`` on ``threads`` threads at once."""

    def run(budget: float) -> tuple[int, float]:
        start = time.perf_counter()
        deadline = start + budget
        with ThreadPoolExecutor(threads, thread_name_prefix="baseline") as pool:
            rows = sum(pool.map(lambda k: work(k, threads, deadline), range(threads)))
        return rows, time.perf_counter() - start

    return run


def gather_run(x: np.ndarray, y: np.ndarray, threads: int, group: int = 1) -> Run:
    """NumPy ceiling: ``np.take`` of sorted random batches into reused per-thread buffers.

    ``group`` batches per call, into one of three buffers per thread in turn (as a feed's
    groups): a batch's output stays in the CPU's cache from one call to the next, a group of
    many megabytes goes out to memory, as a feed's groups do."""
    group = max(1, min(group, len(x) // BATCH))  # a group is at most the whole epoch
    steps = len(x) // BATCH // group
    order = np.random.default_rng(SEED).permutation(len(x))[: steps * group * BATCH]
    order = np.sort(order.reshape(steps * group, BATCH), axis=1).reshape(steps, group * BATCH)
    kept = 1 if group == 1 else 3
    buffers = [
        [
            (np.empty((group * BATCH, *x.shape[1:]), x.dtype), np.empty(group * BATCH, y.dtype))
            for _ in range(kept)
        ]
        for _ in range(threads)
    ]

    def work(k: int, stride: int, deadline: float) -> int:
        rows, step = 0, k
        while True:  # at least one call, however late the thread starts
            idx = order[step % steps]
            xb, yb = buffers[k][step % kept]
            # mode="clip": with the default mode, NumPy gathers into a temporary and copies
            # that into `out` (2x slower for 12 KiB rows); the indices are in range anyway.
            np.take(x, idx, axis=0, out=xb, mode="clip")
            np.take(y, idx, axis=0, out=yb, mode="clip")
            rows, step = rows + len(idx), step + stride
            if time.perf_counter() >= deadline:
                return rows

    return threaded(work, threads)


def slab_run(read: Callable[[int, int], object], n: int, slab_rows: int, threads: int) -> Run:
    """The storage library's own ceiling: every chunk-aligned slab once per pass."""
    slabs = [(lo, min(lo + slab_rows, n)) for lo in range(0, n, slab_rows)]

    def work(k: int, stride: int, deadline: float) -> int:
        rows, i = 0, k
        while True:  # at least one slab, however late the thread starts
            lo, hi = slabs[i % len(slabs)]
            read(lo, hi)
            rows, i = rows + hi - lo, i + stride
            if time.perf_counter() >= deadline:
                return rows

    return threaded(work, threads)


def anon_gib() -> float:
    """This process's anonymous memory (not counting mapped files), in GiB."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def measure(
    cases: list[Case],
    reps: int,
    seconds: float,
    log: Callable[[str], None],
    warm: float = 0.0,
    verbose: bool = False,
) -> None:
    """Warm every case up (unless each run reads ``warm`` seconds first), then ``reps`` rounds
    over all cases (interleaved)."""
    for case in cases if not warm else ():
        case.run(max(0.05, seconds / 4))
    # What exists now lives to the end: frozen, a collection before each run costs microseconds
    # instead of ~0.2 s with TensorFlow loaded.
    gc.collect()
    gc.freeze()
    try:
        for rep in range(reps):
            for case in cases:
                gc.collect()
                with busy_thread(case.busy):
                    rows, secs = case.run(seconds)
                case.samples.append(rows / secs if secs > 0 else 0.0)
                if verbose:
                    log(f"    {case.shape} {case.name} T={case.threads}: {case.samples[-1]:,.0f}")
            log(f"  rep {rep + 1}/{reps} done ({anon_gib():.1f} GiB anonymous memory)")
    finally:
        gc.unfreeze()


# -- the cases of each level -----------------------------------------------------------------------
def thread_sweep(cores: int) -> list[int]:
    """1, 2, 4, ... below ``cores``, then ``cores``."""
    sweep, t = [], 1
    while t < cores:
        sweep.append(t)
        t *= 2
    return [*sweep, cores]


def reader_cases(
    level: str,
    data: Data,
    wanted: set[str],
    sweep: list[int],
    busy_all: bool,
    tf: Any,
    warm: float = 0.0,
    warm_fixed: float | None = None,
) -> list[Case]:
    """The cases of the feed or tf.data level for one shape: arrayfeed over every storage at
    every thread count (and the default), then the baselines. Runs with the default threads
    read ``warm`` seconds before they are timed, those with fixed threads ``warm_fixed``
    (default: ``warm``)."""
    cases: list[Case] = []

    def add(
        name: str, kind: str, threads: int | str | None, busy: bool, run: Run, info: dict[str, Any]
    ) -> None:
        t = "default" if threads is None else str(threads)
        cases.append(Case(level, data.shape.name, name, kind, t, busy or busy_all, run, info))

    def make_feed(key: str, threads: int | None) -> Callable[[], Feed]:
        def make() -> Feed:
            x, y = data.arrays(key)
            return feed_for(x, y, BATCH, STORAGES[key].shuffle, SEED, threads)

        return make

    def make_dataset(key: str, threads: int | None) -> Callable[[int], Any]:
        def make(start_epoch: int) -> Any:
            x, y = data.arrays(key)
            return af.from_arrays(
                x,
                y,
                batch_size=BATCH,
                shuffle=STORAGES[key].shuffle,
                seed=SEED,
                shard=None,
                drop_remainder=True,
                num_threads=threads,
                start_epoch=start_epoch,
            )

        return make

    variants = [(key, False) for key in STORAGES if key in wanted]
    if "busy" in wanted and "npy" in wanted and not busy_all:
        variants.append(("npy", True))
    for key, busy in variants:
        name = label(STORAGES[key]) + (" +busy" if busy else "")
        for threads in [*sweep, None]:
            info: dict[str, Any] = {"storage": key}
            before = warm if threads is None or warm_fixed is None else warm_fixed
            if level == "feed":
                run = feed_run(make_feed(key, threads), info, before)
            else:
                run = from_arrays_run(make_dataset(key, threads), before)
            add(name, "arrayfeed", threads, busy, run, info)  # the feed adds its thread count
    if level == "feed" and "gather" in wanted:
        (xm, ym), (xr, yr) = data.memmap(), data.ram()
        for threads in sweep:
            for where, x, y in (("memmap", xm, ym), ("RAM", xr, yr)):
                run = gather_run(x, y, threads)
                add(
                    f"NumPy gather ({where})",
                    "baseline",
                    threads,
                    False,
                    run,
                    {"baseline": "gather"},
                )
            # The same in the feed's groups (as many batches per call, as many bytes to write).
            group = min(feed_for(xm, ym, BATCH, True, SEED, threads).group_steps, len(xm) // BATCH)
            add(
                GROUPED_GATHER,
                "baseline",
                threads,
                False,
                gather_run(xm, ym, threads, group),
                {"baseline": "gather", "batches_per_call": group},
            )
            if "busy" in wanted and not busy_all:
                run = gather_run(xm, ym, threads)
                add(
                    "NumPy gather (memmap) +busy",
                    "baseline",
                    threads,
                    True,
                    run,
                    {"baseline": "gather"},
                )
    if level == "feed" and "slab" in wanted:
        for key in (k for k in CHUNKED if k in wanted):
            read, rows = data.slab_reader(key)
            library = "h5py" if key.startswith("h5") else "zarr"
            for threads in sweep:
                add(
                    f"{library} slabs: {STORAGES[key].label}",
                    "baseline",
                    threads,
                    False,
                    slab_run(read, data.shape.rows, rows, threads),
                    {"baseline": "slab", "storage": key, "slab_rows": rows},
                )
    if level == "tfdata" and tf is not None and "floor" in wanted:
        xm, ym = data.memmap()

        def floor() -> Any:
            batch = (tf.constant(xm[:BATCH]), tf.constant(ym[:BATCH]))
            return tf.data.Dataset.from_tensors(batch).repeat()

        add(SINGLE[0], "baseline", "-", False, dataset_run(floor), {"baseline": "floor"})
    if level == "tfdata" and tf is not None and "fts" in wanted:

        def fts() -> Any:
            x, y = data.ram()
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=SEED)
            return ds.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

        run = dataset_run(fts, whole_epochs=True)
        add(SINGLE[1], "baseline", "-", False, run, {"baseline": "fts"})
    return cases


# -- end to end: Keras 3 fit -----------------------------------------------------------------------
def jax_gpu() -> str | None:
    """The first GPU JAX sees, or None (no JAX, or no GPU)."""
    if importlib.util.find_spec("jax") is None:
        return None
    try:
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
    except Exception:
        return None
    return str(gpus[0].device_kind) if gpus else None


def fit_level(
    data: Data, args: argparse.Namespace, tf: Any, log: Callable[[str], None]
) -> tuple[list[Case], str | None]:
    """Keras ``fit`` rows/s per input pipeline, or ``([], why it was skipped)``."""
    backend = args.fit_backend
    if backend == "jax":
        gpu = jax_gpu()
        if gpu is None and not args.fit_without_gpu:
            return [], "fit level skipped: JAX is not installed or sees no GPU"
    if importlib.util.find_spec("keras") is None:
        return [], "fit level skipped: Keras is not installed"
    import keras

    if keras.backend.backend() != backend:
        return [], f"fit level skipped: Keras runs on {keras.backend.backend()}, not {backend}"
    shape = data.shape
    xm, ym = data.memmap()
    steps = shape.rows // BATCH
    n = steps * BATCH
    threads = max(1, min(8, os.cpu_count() or 1))  # the peers' pools, sized like arrayfeed's
    order_rng = np.random.default_rng(SEED)

    class MemmapBatches(keras.utils.PyDataset):  # type: ignore[misc]
        """Sorted random batches gathered from the memmap, a fresh permutation per epoch."""

        def __init__(self) -> None:
            super().__init__(workers=threads, use_multiprocessing=False, max_queue_size=2 * threads)
            self.on_epoch_end()

        def __len__(self) -> int:
            return steps

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            idx = self.order[i]
            return np.take(xm, idx, axis=0), np.take(ym, idx, axis=0)

        def on_epoch_end(self) -> None:
            order = order_rng.permutation(shape.rows)[:n].reshape(steps, BATCH)
            self.order = np.sort(order, axis=1)

    def aligned(a: np.ndarray) -> np.ndarray:
        """A copy at a 64-byte boundary: JAX on a CPU takes such arrays without copying them."""
        raw = np.empty(a.nbytes + 64, np.uint8)
        start = -raw.ctypes.data % 64
        out = raw[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
        out[...] = a
        return out

    def repeated() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        xb, yb = aligned(xm[:BATCH]), aligned(ym[:BATCH])
        while True:
            yield xb, yb

    # The same stream for from_arrays (tf.data) and batches (NumPy).
    npy_args = (str(data.path("npy_x")), str(data.path("npy_y")))
    stream_args: dict[str, Any] = {
        "batch_size": BATCH,
        "seed": SEED,
        "shard": None,
        "drop_remainder": True,
    }

    def numpy_batches(num_threads: int | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``af.batches`` over the epochs: NumPy batches straight to Keras, no tf.data."""
        stream = af.batches(*npy_args, **stream_args, num_threads=num_threads)
        while True:
            yield from stream

    # name -> what fit gets at each call: (positional, keyword) arguments
    FitArgs = tuple[tuple[Any, ...], dict[str, Any]]
    peers: dict[str, Callable[[], FitArgs]] = {}

    def always(*positional: Any, **keywords: Any) -> Callable[[], FitArgs]:
        return lambda: (positional, keywords)

    by_steps = {"steps_per_epoch": steps, "shuffle": False}  # shuffling is the pipeline's job
    for t in (None, 1):
        threads_name = "default threads" if t is None else "1 thread"
        if tf is not None:
            ds = af.from_arrays(*npy_args, **stream_args, num_threads=t)
            peers[f"arrayfeed from_arrays ({threads_name})"] = always(ds, shuffle=False)
            if backend != "tensorflow" and t is None:
                # A transformation that may change elements (take) makes Keras iterate the
                # dataset through tf.data: how from_arrays reached the JAX backend before.
                through = ds.take(len(ds))
                peers["arrayfeed from_arrays through tf.data"] = always(through, shuffle=False)
        # The same stream as NumPy batches: what a JAX or torch backend can take without tf.data.
        generator = numpy_batches(t)
        peers[f"arrayfeed batches ({threads_name})"] = always(generator, **by_steps)
    peers[f"PyDataset ({threads} threads)"] = always(MemmapBatches(), shuffle=False)
    if importlib.util.find_spec("grain") is not None:
        try:
            import grain

            grain_order = np.sort(
                np.random.default_rng(SEED).permutation(shape.rows)[:n].reshape(steps, BATCH),
                axis=1,
            )

            def grain_batch(i: int) -> tuple[np.ndarray, np.ndarray]:
                idx = grain_order[i]
                return np.take(xm, idx, axis=0), np.take(ym, idx, axis=0)

            grain_ds = (
                grain.MapDataset.range(steps)
                .shuffle(seed=SEED)
                .map(grain_batch)
                .to_iter_dataset(
                    grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
                )
            )
            peers[f"Grain ({threads} threads)"] = always(grain_ds, **by_steps)
        except Exception as exc:  # a Grain API this benchmark does not know: say so, go on
            log(f"  Grain skipped: {type(exc).__name__}: {exc}")
    else:
        log("  Grain skipped: not installed")
    x_ram, y_ram = np.array(xm[:n]), np.array(ym[:n])
    peers["NumPy arrays in RAM (fit shuffle)"] = always(
        x_ram, y_ram, batch_size=BATCH, shuffle=True
    )
    peers["one batch repeated (floor)"] = lambda: ((repeated(),), by_steps)

    def model_for() -> Any:
        keras.utils.set_random_seed(SEED)
        layers = keras.layers
        convs = [
            layers.Conv2D(32, 3, strides=2, activation="relu"),
            layers.Conv2D(64, 3, strides=2, activation="relu"),
            layers.Conv2D(128, 3, strides=2, activation="relu"),
        ]
        model = keras.Sequential(
            [
                keras.Input(shape.row_shape, dtype="uint8"),
                layers.Rescaling(1 / 255),
                *(convs if args.fit_model == "cnn" else []),
                layers.GlobalAveragePooling2D(),
                layers.Dense(10),
            ]
        )
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    class Timer(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            self.seconds = time.perf_counter() - self.start

    def fit_run(model: Any, args_of: Callable[[], FitArgs]) -> Run:
        def run(budget: float) -> tuple[int, float]:  # one epoch whatever the budget
            timer = Timer()
            positional, keywords = args_of()
            model.fit(*positional, epochs=1, verbose=0, callbacks=[timer], **keywords)
            return n, timer.seconds

        return run

    device = (jax_gpu() if backend == "jax" else None) or "CPU"
    cases = [
        Case(
            "fit",
            shape.name,
            name,
            "arrayfeed" if name.startswith("arrayfeed") else "peer",
            "-",
            False,
            fit_run(model_for(), args_of),
            {"backend": backend, "device": device, "steps": steps, "model": args.fit_model},
        )
        for name, args_of in peers.items()
    ]
    return cases, None


# -- report ----------------------------------------------------------------------------------------
def versions(tf: Any) -> dict[str, str]:
    def version(*dists: str) -> str:
        for dist in dists:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        return "absent"

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "h5py": h5py.__version__,
        "zarr": zarr.__version__,
        "arrayfeed": af.__version__,
        "tensorflow": tf.__version__ if tf is not None else version("tensorflow", "tensorflow-cpu"),
        "keras": version("keras"),
        "jax": version("jax"),
        "grain": version("grain", "grain-nightly"),
    }


def machine(tf: Any) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    from arrayfeed._pipeline.tune.machine import usable_cores, usable_memory

    return {
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),  # affinity, within a container's CPU quota
        "usable_memory": usable_memory(),  # bytes, within a container's memory limit
        "cpu": cpu,
        "gpu": jax_gpu(),
        **versions(tf),
    }


def rates_of(cases: list[Case]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """level -> shape -> case -> threads -> median rows/s."""
    rates: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for case in cases:
        if case.samples:
            by_case = rates.setdefault(case.level, {}).setdefault(case.shape, {})
            by_case.setdefault(case.name, {})[case.threads] = statistics.median(case.samples)
    return rates


def fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def table(level: str, cases: list[Case], sweep: list[int]) -> str:
    rates = rates_of(cases).get(level, {})
    kinds = {(c.shape, c.name): c.kind for c in cases}
    top = str(sweep[-1])
    lines = [f"\n{LEVEL_TITLES[level]}: rows/s, medians"]
    if level == "fit":
        rows = rates.get("L", {})
        floor = rows.get("one batch repeated (floor)", {}).get("-")
        info = next(c.info for c in cases if c.level == "fit")
        lines[-1] += f"; Keras on {info['backend']}, training on {info['device']}"
        if info.get("model") == "tiny":
            lines[-1] = lines[-1].replace("small CNN", "a model of almost no compute")
        lines.append(f"{'input pipeline':44} {'rows/s':>11} {'/ floor':>8}")
        for name, by_t in rows.items():
            value = by_t["-"]
            lines.append(
                f"{name:44} {fmt(value):>11} {fmt(value / floor if floor else None, 2):>8}"
            )
        return "\n".join(lines)
    heads = [f"T={t}" for t in sweep] + ["default"]
    lines.append(
        f"{'case':52} "
        + " ".join(f"{h:>11}" for h in heads)
        + f" {'T' + top + '/T1':>8} {'dflt/best':>9}"
    )
    for shape in ("S", "L"):
        rows = rates.get(shape, {})
        if not rows:
            continue
        ordered = sorted(rows, key=lambda name: kinds[(shape, name)] != "arrayfeed")
        singles = []
        for name in ordered:
            by_t = rows[name]
            if "-" in by_t:
                singles.append((name, by_t["-"]))
                continue
            cells = [fmt(by_t.get(str(t))) for t in sweep] + [fmt(by_t.get("default"))]
            one, best = (
                by_t.get("1"),
                max((by_t[str(t)] for t in sweep if str(t) in by_t), default=None),
            )
            speedup = by_t[top] / one if one and top in by_t else None
            dflt = by_t["default"] / best if best and "default" in by_t else None
            lines.append(
                f"{shape + ' ' + name:52} "
                + " ".join(f"{c:>11}" for c in cells)
                + f" {fmt(speedup, 2):>8} {fmt(dflt, 2):>9}"
            )
        for name, value in singles:
            lines.append(f"{shape + ' ' + name:52} {fmt(value):>11}   (no reader threads)")
    return "\n".join(lines)


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
    rates = rates_of(cases)
    top = str(cores)

    def rate(level: str, shape: str, case: str, threads: str) -> float | None:
        return rates.get(level, {}).get(shape, {}).get(case, {}).get(threads)

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    def worst(level: str, of: Callable[[dict[str, float]], float | None], goal: float) -> Target:
        found = [
            (value, f"{shape} {name}")
            for shape, by_case in rates.get(level, {}).items()
            for name, by_t in by_case.items()
            if (shape, name, level) in arrayfeed and (value := of(by_t)) is not None
        ]
        if not found:
            return Target("", None, goal)
        low, where = min(found)
        met = sum(v >= goal for v, _ in found)
        return Target("", low, goal, f"worst: {where}; {met}/{len(found)} cases meet it")

    arrayfeed = {(c.shape, c.name, c.level) for c in cases if c.kind == "arrayfeed"}
    npy, gather = label(STORAGES["npy"]), "NumPy gather (memmap)"
    out = [
        Target(
            f"L .npy path, feed, T={top} / NumPy gather T={top}",
            ratio(rate("feed", "L", npy, top), rate("feed", "L", gather, top)),
            0.7,
        )
    ]
    grouped = ratio(rate("feed", "L", npy, top), rate("feed", "L", GROUPED_GATHER, top))
    if grouped is not None:
        out.append(Target("  the same / NumPy gathering the feed's groups", grouped, 0.7))
    busy = ratio(rate("feed", "L", npy + " +busy", top), rate("feed", "L", gather + " +busy", top))
    if busy is not None:
        out.append(Target("  the same, each beside a busy Python thread", busy, 0.7))
    if cores == 2:
        for level in ("feed", "tfdata"):
            t = worst(level, lambda by_t: ratio(by_t.get("2"), by_t.get("1")), 0.95)
            t.name = f"every {level} case: T=2 / T=1"
            out.append(t)
        for shape in ("L", "S"):
            out.append(
                Target(
                    f"{shape} HDF5 chunked lzf, block, feed: T=2 / T=1",
                    ratio(
                        rate("feed", shape, label(STORAGES["h5lzf"]), "2"),
                        rate("feed", shape, label(STORAGES["h5lzf"]), "1"),
                    ),
                    1.6,
                )
            )
    else:
        note = "" if cores == 16 else "goal set for 16 cores"
        for key, goal in (("h5lzf", 5.0), ("h5gzip", 5.0), ("zarr", 4.0), ("zarrconv", 4.0)):
            name = label(STORAGES[key])
            value = ratio(rate("feed", "L", name, top), rate("feed", "L", name, "1"))
            if cores == 1:
                value = None
            out.append(Target(f"L {name}, feed: T={top} / T=1", value, goal, note))

    def default_over_best(by_t: dict[str, float]) -> float | None:
        explicit = [v for t, v in by_t.items() if t.isdigit()]
        return ratio(by_t.get("default"), max(explicit, default=None))

    for level in ("feed", "tfdata"):
        t = worst(level, default_over_best, 0.9)
        t.name = f"every {level} case: default threads / best explicit"
        out.append(t)
    out.append(
        Target(
            "S .npy through tf.data (default threads) / tf.data floor",
            ratio(rate("tfdata", "S", npy, "default"), rate("tfdata", "S", SINGLE[0], "-")),
            0.8,
        )
    )
    fit = rates.get("fit", {}).get("L", {})
    if fit:
        backend = next(c.info["backend"] for c in cases if c.level == "fit")
        keras_on = "Keras-" + {"jax": "JAX", "tensorflow": "TF"}.get(backend, backend)
        # from_arrays as a user passes it when TensorFlow is there, else batches
        ours = next(
            (
                v["-"]
                for prefix in ("arrayfeed from_arrays (default", "arrayfeed batches (default")
                for k, v in fit.items()
                if k.startswith(prefix)
            ),
            None,
        )
        floor = fit.get("one batch repeated (floor)", {}).get("-")
        peers = [
            v["-"]
            for k, v in fit.items()
            if k.startswith(("PyDataset", "Grain", "NumPy arrays in RAM"))
        ]
        out.append(
            Target(f"{keras_on} fit: arrayfeed / one batch repeated", ratio(ours, floor), 0.95)
        )
        out.append(
            Target(
                f"{keras_on} fit: arrayfeed / best of PyDataset, Grain, NumPy in RAM",
                ratio(ours, max(peers, default=None)),
                1.0,
            )
        )
    return out


def target_table(found: list[Target], info: dict[str, Any]) -> str:
    lines = [
        f"\nTargets ({info['cores']} cores, {info['cpu']}; Python {info['python']}, "
        f"numpy {info['numpy']}, h5py {info['h5py']}, zarr {info['zarr']}, "
        f"TensorFlow {info['tensorflow']}, Keras {info['keras']}, JAX {info['jax']}"
        + (f", GPU {info['gpu']}" if info.get("gpu") else "")
        + ")",
        f"{'target':66} {'measured':>9} {'goal':>7}  met",
    ]
    for t in found:
        mark = {True: "✓", False: "✗", None: "-"}[t.met]
        note = t.note or ("not measured" if t.value is None else "")
        note = f"  ({note})" if note else ""
        value = "—" if t.value is None else f"{t.value:.3g}"
        lines.append(f"{t.name:66} {value:>9} {'≥ ' + str(t.goal):>7}  {mark}{note}")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the rows, shorter runs")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (median)")
    parser.add_argument(
        "--seconds",
        type=float,
        help="timed seconds per case and rep (default 0.6; quick 0.15); an epoch is cut short "
        f"only after {CAP:g}x that",
    )
    parser.add_argument(
        "--cases",
        default=",".join([*STORAGES, *BASELINES]),
        help=f"comma-separated subset of: {', '.join([*STORAGES, *BASELINES])}",
    )
    parser.add_argument("--levels", default=",".join(LEVELS), help="subset of: feed, tfdata, fit")
    parser.add_argument("--shapes", default="S,L", help="subset of: S, L")
    parser.add_argument(
        "--threads",
        help="comma-separated fixed thread counts to sweep (default: 1, 2, 4, ... up to the cores)",
    )
    parser.add_argument(
        "--busy-thread",
        action="store_true",
        help="run every feed and tf.data measurement beside a thread spinning in Python",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep (and reuse) the data here instead of a temporary directory removed at the end",
    )
    parser.add_argument(
        "--warm",
        type=float,
        default=0.0,
        help="seconds each feed and tf.data run reads before it is timed (the default's tuned "
        "threads settle there; 0: timed from the start, as a short job sees it)",
    )
    parser.add_argument(
        "--warm-fixed",
        type=float,
        help="the same for runs with a fixed thread count, which have nothing to settle "
        "(default: --warm)",
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--verbose", action="store_true", help="log every run's rows/s")
    # Development knobs, not part of the interface.
    parser.add_argument("--rows-scale", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--fit-backend", default="jax", help=argparse.SUPPRESS)
    parser.add_argument("--fit-without-gpu", action="store_true", help=argparse.SUPPRESS)
    # A model with almost no compute, so that on a CPU the input pipeline is the limit, as it is
    # on a GPU for the CNN.
    parser.add_argument(
        "--fit-model", choices=("cnn", "tiny"), default="cnn", help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    args.levels = [v.strip() for v in args.levels.split(",") if v.strip()]
    args.shapes = [v.strip() for v in args.shapes.split(",") if v.strip()]
    args.cases = {v.strip() for v in args.cases.split(",") if v.strip()}
    for what, given, known in (
        ("--levels", set(args.levels), set(LEVELS)),
        ("--shapes", set(args.shapes), {"S", "L"}),
        ("--cases", args.cases, {*STORAGES, *BASELINES}),
    ):
        if given - known:
            parser.error(f"{what}: unknown {sorted(given - known)}; choose from {sorted(known)}")
    if args.seconds is None:
        args.seconds = 0.15 if args.quick else 0.6
    if args.rows_scale is None:
        args.rows_scale = 0.1 if args.quick else 1.0
    return args


def load_tensorflow() -> ModuleType | None:
    if importlib.util.find_spec("tensorflow") is None:
        return None
    return importlib.import_module("tensorflow")


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    begin = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - begin:6.1f}s] {message}", file=sys.stderr, flush=True)

    cores = os.cpu_count() or 1
    sweep = (
        [int(t) for t in args.threads.split(",") if t.strip()]
        if args.threads
        else thread_sweep(cores)
    )
    fit_possible = args.fit_backend != "jax" or args.fit_without_gpu or jax_gpu() is not None
    if "fit" in args.levels and fit_possible and importlib.util.find_spec(args.fit_backend):
        # Keras fixes its backend when first imported, and importing TensorFlow imports it.
        os.environ["KERAS_BACKEND"] = args.fit_backend
    tf = load_tensorflow() if {"tfdata", "fit"} & set(args.levels) else None
    skipped: list[str] = []
    if "tfdata" in args.levels and tf is None:
        skipped.append("tf.data level skipped: TensorFlow is not installed")
    if "fit" in args.levels and "L" not in args.shapes:
        skipped.append("fit level skipped: it trains on L rows, and --shapes leaves L out")
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="arrayfeed-scaling-"))
    all_cases: list[Case] = []
    shape_info = {}
    try:
        for shape in (shapes(args.rows_scale)[s] for s in args.shapes):
            shape_info[shape.name] = {"rows": shape.rows, "row_bytes": shape.row_bytes}
            data = Data(root, shape)
            log(f"{shape.name}: writing {shape.rows:,} rows of {shape.row_bytes:,} bytes")
            readers = {"feed", "tfdata"} & set(args.levels)
            data.ensure({k for k in STORAGES if k in args.cases} if readers else set())
            for level in args.levels:
                if level == "fit":
                    if shape.name != "L":
                        continue
                    data.page_cache()
                    cases, why = fit_level(data, args, tf, log)
                    if why:
                        skipped.append(why)
                        continue
                elif level == "tfdata" and tf is None:
                    continue
                else:
                    data.page_cache()
                    cases = reader_cases(
                        level,
                        data,
                        args.cases,
                        sweep,
                        args.busy_thread,
                        tf,
                        args.warm,
                        args.warm_fixed,
                    )
                log(f"{shape.name} {level}: {len(cases)} cases x {args.reps} reps")
                measure(cases, args.reps, args.seconds, log, args.warm, args.verbose)
                for case in cases:
                    case.run = _spent  # drop datasets, feeds and their buffers
                all_cases.extend(cases)
                del cases
                gc.collect()
            data.close()
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)

    info = machine(tf)
    print(
        f"\narrayfeed scaling: batch {BATCH}, drop_remainder, page-cached; {args.reps} interleaved "
        f"reps of {args.seconds:g} s"
        + (f" after {args.warm:g} s of reading" if args.warm else "")
        + (f" ({args.warm_fixed:g} s with fixed threads)" if args.warm_fixed is not None else "")
        + f"; threads {sweep} + default"
        + ("; every case beside a busy Python thread" if args.busy_thread else "")
    )
    for name, s in shape_info.items():
        print(f"  {name}: {s['rows']:,} rows of {s['row_bytes']:,} bytes")
    for level in args.levels:
        if any(c.level == level for c in all_cases):
            print(table(level, all_cases, sweep))
    tuned = [c for c in all_cases if c.info.get("tuned_threads")]
    if tuned:
        print(
            "\ndefault threads, as tuned (each timed run), the settings tried in the last,"
            " and the batches per group"
        )
        for c in tuned:
            name = f"{c.level} {c.shape} {c.name}"
            print(
                f"  {name:52} {c.info['tuned_threads']} after {c.info['settled_after']} s: "
                f"{c.info['history'][-1]}; batches per group {c.info.get('group_steps')}"
            )
    for line in skipped:
        print(f"\n{line}")
    found = targets(all_cases, cores)
    print(target_table(found, info))
    elapsed = time.perf_counter() - begin
    print(f"\ntotal {elapsed:.0f} s")
    if args.json:
        report = {
            "machine": info,
            "config": {
                "batch_size": BATCH,
                "quick": args.quick,
                "rows_scale": args.rows_scale,
                "seconds": args.seconds,
                "reps": args.reps,
                "warm": args.warm,
                "warm_fixed": args.warm if args.warm_fixed is None else args.warm_fixed,
                "threads": sweep,
                "busy_thread": args.busy_thread,
                "shapes": shape_info,
                "levels": args.levels,
                "cases": sorted(args.cases),
            },
            "figures": [c.figure() for c in all_cases],
            "rates": rates_of(all_cases),
            "targets": [
                {"name": t.name, "value": t.value, "goal": t.goal, "met": t.met, "note": t.note}
                for t in found
            ],
            "skipped": skipped,
            "seconds_total": elapsed,
        }
        args.json.write_text(json.dumps(report, indent=1))


def _spent(budget: float) -> tuple[int, float]:
    raise RuntimeError("this case has been measured and released")


if __name__ == "__main__":
    main()
