"""Throughput of arrayfeed against baselines measured in the same run.

Generates its own seeded data (cached under ``--data``), then measures rows/s for two row shapes,
batch 256, a full random permutation per epoch (or ``shuffle="block"`` where stated),
``drop_remainder=True``, page-cached data, consumed in a plain Python loop; plus a short Keras ``fit``
and the extra anonymous memory of an epoch of L. Every case runs ``--reps`` times, interleaved
(rep 1 of every case, then rep 2 …), and the table shows medians and the targets' ratios.

    python benchmarks/bench_throughput.py            # full: S = 1,000,000 rows, L = 60,000 rows
    python benchmarks/bench_throughput.py --quick    # a tenth of the rows, for development
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py
import numpy as np
import tensorflow as tf
import zarr

import arrayfeed as af

BATCH = 256


@dataclass(frozen=True)
class Shape:
    name: str
    rows: int
    row_shape: tuple[int, ...]
    dtype: str

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape)) * np.dtype(self.dtype).itemsize + 4


def shapes(quick: bool) -> dict[str, Shape]:
    scale = 10 if quick else 1
    return {
        "S": Shape("S", 1_000_000 // scale, (32,), "float32"),
        "L": Shape("L", 60_000 // scale, (64, 64, 3), "uint8"),
    }


# -- data ------------------------------------------------------------------------------------------
def make_data(root: Path, shape: Shape) -> dict[str, Path]:
    """Write x/y for one shape in every layout (skipped when already there)."""
    root.mkdir(parents=True, exist_ok=True)
    tag = f"{shape.name}{shape.rows}"
    paths = {
        "npy_x": root / f"{tag}_x.npy",
        "npy_y": root / f"{tag}_y.npy",
        "h5_contig": root / f"{tag}_contig.h5",
        "h5_auto": root / f"{tag}_auto_lzf.h5",
        "zarr_auto": root / f"{tag}_auto.zarr",
        "h5_convert": root / f"{tag}_convert.h5",
        "zarr_convert": root / f"{tag}_convert.zarr",
    }
    if not paths["npy_x"].exists():
        rng = np.random.default_rng(0)
        x = np.lib.format.open_memmap(
            paths["npy_x"], mode="w+", dtype=shape.dtype, shape=(shape.rows, *shape.row_shape)
        )
        step = 50_000 if shape.name == "S" else 5_000
        for lo in range(0, shape.rows, step):
            hi = min(lo + step, shape.rows)
            if shape.dtype == "uint8":
                x[lo:hi] = rng.integers(0, 256, size=(hi - lo, *shape.row_shape), dtype=np.uint8)
            else:
                x[lo:hi] = rng.standard_normal((hi - lo, *shape.row_shape), dtype=np.float32)
        x.flush()
        del x
        np.save(paths["npy_y"], np.arange(shape.rows, dtype=np.int32))
    x = np.load(paths["npy_x"], mmap_mode="r")
    y = np.load(paths["npy_y"])
    if not paths["h5_contig"].exists():
        with h5py.File(paths["h5_contig"], "w") as f:
            f.create_dataset("x", data=x)
            f.create_dataset("y", data=y)
    if not paths["h5_auto"].exists():
        with h5py.File(paths["h5_auto"], "w") as f:
            f.create_dataset("x", data=x, chunks=True, compression="lzf")
            f.create_dataset("y", data=y, chunks=True, compression="lzf")
    if not paths["zarr_auto"].exists():
        g = zarr.open_group(paths["zarr_auto"], mode="w")
        zx = g.create_array("x", shape=x.shape, dtype=x.dtype, chunks="auto")
        step = max(1, (64 << 20) // (shape.row_bytes))
        for lo in range(0, shape.rows, step):
            zx[lo : lo + step] = x[lo : lo + step]
        g.create_array("y", shape=y.shape, dtype=y.dtype, chunks="auto")[...] = y
    convert = getattr(af, "convert", None)
    if convert is not None:
        for key in ("h5_convert", "zarr_convert"):
            if not paths[key].exists():
                compression = "lzf" if key == "h5_convert" else None
                convert(
                    {"x": paths["npy_x"], "y": paths["npy_y"]}, paths[key], compression=compression
                )
    return paths


# -- measuring -------------------------------------------------------------------------------------
def consume(iterable: Iterator[object], limit_rows: int | None = None) -> int:
    """Iterate in a plain Python loop; return rows seen."""
    rows = 0
    for element in iterable:
        first = element[0] if isinstance(element, tuple) else element
        rows += int(first.shape[0])
        if limit_rows is not None and rows >= limit_rows:
            break
    return rows


def timed(fn: Callable[[], int]) -> float:
    gc.collect()
    start = time.perf_counter()
    rows = fn()
    return rows / (time.perf_counter() - start)


def epoch_of(ds: tf.data.Dataset, limit_rows: int | None = None) -> Callable[[], int]:
    return lambda: consume(iter(ds), limit_rows)


def numpy_limit(x: np.ndarray, y: np.ndarray, shape: Shape, seed: int = 0) -> Callable[[], int]:
    """Sorted random batches gathered with np.take into fresh arrays: no TensorFlow at all."""
    perm = np.random.default_rng(seed).permutation(shape.rows)

    def run() -> int:
        rows = 0
        for lo in range(0, shape.rows - BATCH + 1, BATCH):
            idx = np.sort(perm[lo : lo + BATCH])
            np.take(x, idx, axis=0, out=np.empty((BATCH, *shape.row_shape), x.dtype))
            np.take(y, idx, axis=0)
            rows += BATCH
        return rows

    return run


def tf_floor(x: np.ndarray, y: np.ndarray, shape: Shape) -> Callable[[], int]:
    batch = (tf.constant(x[:BATCH]), tf.constant(y[:BATCH]))
    ds = tf.data.Dataset.from_tensors(batch).repeat(shape.rows // BATCH)
    return epoch_of(ds)


def from_tensor_slices(x: np.ndarray, y: np.ndarray, shape: Shape) -> Callable[[], int]:
    xs, ys = np.asarray(x), np.asarray(y)
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(shape.rows, seed=0)
    ds = ds.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return epoch_of(ds)


def naive_generator(x: np.ndarray, y: np.ndarray, shape: Shape) -> Callable[[], int]:
    perm = np.random.default_rng(0).permutation(shape.rows)

    def gen() -> Iterator[tuple[np.ndarray, np.int32]]:
        for i in perm:
            yield x[i], y[i]

    sig = (tf.TensorSpec(shape.row_shape, tf.as_dtype(shape.dtype)), tf.TensorSpec((), tf.int32))
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).batch(BATCH, drop_remainder=True)
    return epoch_of(ds.prefetch(tf.data.AUTOTUNE), limit_rows=20 * BATCH)


def h5py_batch_generator(path: Path, shape: Shape) -> Callable[[], int]:
    f = h5py.File(path, "r")
    dx, dy = f["x"], f["y"]
    perm = np.random.default_rng(0).permutation(shape.rows)

    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for lo in range(0, shape.rows - BATCH + 1, BATCH):
            idx = np.sort(perm[lo : lo + BATCH])
            yield dx[idx], dy[idx]

    sig = (
        tf.TensorSpec((BATCH, *shape.row_shape), tf.as_dtype(shape.dtype)),
        tf.TensorSpec((BATCH,), tf.int32),
    )
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).prefetch(tf.data.AUTOTUNE)
    return epoch_of(ds, limit_rows=max(BATCH * 40, shape.rows // 20))


def slab_ceiling(
    read: Callable[[slice], object], chunk_rows: int, shape: Shape
) -> Callable[[], int]:
    """Every chunk-aligned slab once, in order, with the storage library's own slicing."""

    def run() -> int:
        for lo in range(0, shape.rows, chunk_rows):
            read(slice(lo, min(lo + chunk_rows, shape.rows)))
        return shape.rows

    return run


def arrayfeed_epoch(x: object, y: object, shuffle: bool | str = True) -> Callable[[], int]:
    made: list[tf.data.Dataset] = []

    def run() -> int:  # the dataset is built on first use, so --only skips what it does not run
        if not made:
            made.append(
                af.from_arrays(
                    x, y, batch_size=BATCH, shuffle=shuffle, seed=0, drop_remainder=True, shard=None
                )
            )
        return consume(iter(made[0]))

    return run


def fit_epoch_seconds(ds: tf.data.Dataset, epochs: int = 3) -> float:
    """Median epoch time of a small MLP fit on ``ds`` (after one warm-up epoch)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(1e-3), "mse")
    times: list[float] = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            times.append(time.perf_counter() - self.t)

    model.fit(ds, epochs=epochs + 1, verbose=0, shuffle=False, callbacks=[Timer()])
    return statistics.median(times[1:])


ANON_SCRIPT = """
import os, sys, numpy as np
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import arrayfeed as af, tensorflow as tf
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
x, y = sys.argv[1], sys.argv[2]
ds = af.from_arrays(x, y, batch_size=256, seed=0, drop_remainder=True, shard=None)
next(iter(ds))  # TensorFlow's own start-up memory is not ours
base = peak = anon()
for i, _ in enumerate(ds):
    if i % 8 == 0:
        peak = max(peak, anon())
print((peak - base) / 2**20)
"""


def extra_anon_mib(x: Path, y: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run(
        [sys.executable, "-c", ANON_SCRIPT, str(x), str(y)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


# -- the suite -------------------------------------------------------------------------------------
def build_cases(shape: Shape, paths: dict[str, Path]) -> dict[str, Callable[[], int]]:
    x = np.load(paths["npy_x"], mmap_mode="r")
    y = np.load(paths["npy_y"], mmap_mode="r")
    for _ in range(2):  # page-cache the data
        np.asarray(x).sum(dtype=np.float64)
    cases: dict[str, Callable[[], int]] = {
        "numpy limit": numpy_limit(x, y, shape),
        "tf.data floor": tf_floor(x, y, shape),
        "from_tensor_slices": from_tensor_slices(x, y, shape),
        "naive generator": naive_generator(x, y, shape),
        "h5py batch generator": h5py_batch_generator(paths["h5_contig"], shape),
        "af npy": arrayfeed_epoch(str(paths["npy_x"]), str(paths["npy_y"])),
    }
    h5c = h5py.File(paths["h5_contig"], "r")
    cases["af h5 contiguous"] = arrayfeed_epoch(h5c["x"], h5c["y"])
    h5a = h5py.File(paths["h5_auto"], "r")
    cases["af h5 auto+lzf block"] = arrayfeed_epoch(h5a["x"], h5a["y"], shuffle="block")
    rows = h5a["x"].chunks[0]
    cases["h5 auto+lzf slab ceiling"] = slab_ceiling(
        lambda s: (h5a["x"][s], h5a["y"][s]), rows, shape
    )
    za = zarr.open_group(paths["zarr_auto"], mode="r")
    cases["af zarr auto block"] = arrayfeed_epoch(za["x"], za["y"], shuffle="block")
    rows = za["x"].chunks[0]
    cases["zarr auto slab ceiling"] = slab_ceiling(lambda s: (za["x"][s], za["y"][s]), rows, shape)
    if paths["h5_convert"].exists():
        h5v = h5py.File(paths["h5_convert"], "r")
        cases["af h5 convert block"] = arrayfeed_epoch(h5v["x"], h5v["y"], shuffle="block")
    if paths["zarr_convert"].exists():
        zv = zarr.open_group(paths["zarr_convert"], mode="r")
        cases["af zarr convert block"] = arrayfeed_epoch(zv["x"], zv["y"], shuffle="block")
    return cases


def ratio(results: dict[str, float], a: str, b: str | tuple[str, ...]) -> float | None:
    names = (b,) if isinstance(b, str) else b
    if a not in results or any(n not in results for n in names):
        return None
    return results[a] / min(results[n] for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the rows")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "arrayfeed-bench"
    )
    parser.add_argument("--shapes", default="S,L")
    parser.add_argument("--only", default="", help="comma-separated case names (substring match)")
    parser.add_argument("--no-fit", action="store_true")
    args = parser.parse_args()

    all_results: dict[str, dict[str, float]] = {}
    for name in args.shapes.split(","):
        shape = shapes(args.quick)[name]
        paths = make_data(args.data, shape)
        cases = build_cases(shape, paths)
        if args.only:
            wanted = [w.strip() for w in args.only.split(",")]
            cases = {k: v for k, v in cases.items() if any(w in k for w in wanted)}
        for fn in cases.values():  # warm-up: builds iterators, fills caches
            fn()
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.reps):
            for case, fn in cases.items():
                samples[case].append(timed(fn))
        results = {k: statistics.median(v) for k, v in samples.items()}
        if name == "S" and not args.no_fit and not args.only:
            x = np.load(paths["npy_x"], mmap_mode="r")
            y = np.load(paths["npy_y"])
            floor_ds = tf.data.Dataset.from_tensors(
                (tf.constant(x[:BATCH]), tf.constant(y[:BATCH].astype(np.float32)))
            ).repeat(shape.rows // BATCH)
            af_ds = af.from_arrays(
                str(paths["npy_x"]),
                y.astype(np.float32),
                batch_size=BATCH,
                seed=0,
                drop_remainder=True,
                shard=None,
            )
            fits = {"floor": [], "af": []}  # type: dict[str, list[float]]
            for _ in range(args.reps):
                fits["floor"].append(fit_epoch_seconds(floor_ds))
                fits["af"].append(fit_epoch_seconds(af_ds))
            results["fit epoch s: floor"] = statistics.median(fits["floor"])
            results["fit epoch s: af"] = statistics.median(fits["af"])
        if name == "L" and not args.only:
            results["extra anon MiB"] = extra_anon_mib(paths["npy_x"], paths["npy_y"])
        all_results[name] = results
        print(
            f"\n{name}: {shape.rows:,} rows of {shape.dtype}{list(shape.row_shape)} + int32 label, batch {BATCH}"
        )
        print(f"{'case':32} {'rows/s (median)':>16}")
        for case, value in results.items():
            digits = 2 if "fit" in case or "MiB" in case else 0
            print(f"{case:32} {value:>16,.{digits}f}")

    S, L = all_results.get("S", {}), all_results.get("L", {})
    targets: list[tuple[str, float | None, str, float]] = [
        ("S npy / from_tensor_slices", ratio(S, "af npy", "from_tensor_slices"), ">=", 4.0),
        ("S npy / tf.data floor", ratio(S, "af npy", "tf.data floor"), ">=", 0.6),
        ("S npy / naive generator", ratio(S, "af npy", "naive generator"), ">=", 150),
        (
            "S h5 contiguous / h5py batch generator",
            ratio(S, "af h5 contiguous", "h5py batch generator"),
            ">=",
            10,
        ),
        ("L npy / from_tensor_slices", ratio(L, "af npy", "from_tensor_slices"), ">=", 3.0),
        ("L npy / numpy limit", ratio(L, "af npy", "numpy limit"), ">=", 0.7),
        ("L h5 contiguous / af npy", ratio(L, "af h5 contiguous", "af npy"), ">=", 0.9),
    ]
    for tag, res in (("S", S), ("L", L)):
        targets += [
            (
                f"{tag} h5 auto+lzf block / min(ceiling, af npy)",
                ratio(res, "af h5 auto+lzf block", ("h5 auto+lzf slab ceiling", "af npy")),
                ">=",
                0.7,
            ),
            (
                f"{tag} zarr auto block / min(ceiling, af npy)",
                ratio(res, "af zarr auto block", ("zarr auto slab ceiling", "af npy")),
                ">=",
                0.7,
            ),
            (
                f"{tag} h5 convert block / af npy",
                ratio(res, "af h5 convert block", "af npy"),
                ">=",
                0.5,
            ),
            (
                f"{tag} zarr convert block / af npy",
                ratio(res, "af zarr convert block", "af npy"),
                ">=",
                0.5,
            ),
        ]
    if "fit epoch s: af" in S:
        targets.append(
            ("S fit epoch: af / floor", S["fit epoch s: af"] / S["fit epoch s: floor"], "<=", 1.25)
        )
    if "extra anon MiB" in L:
        targets.append(("L extra anonymous memory (MiB)", L["extra anon MiB"], "<=", 512))

    print(
        f"\nTargets ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, {args.reps} interleaved reps, medians)"
    )
    print(f"{'target':52} {'measured':>10} {'goal':>9}  met")
    for tag, value, op, goal in targets:
        if value is None:
            print(f"{tag:52} {'n/a':>10} {op + ' ' + str(goal):>9}  -")
            continue
        met = value >= goal if op == ">=" else value <= goal
        print(f"{tag:52} {value:>10.2f} {op + ' ' + str(goal):>9}  {'yes' if met else 'NO'}")


if __name__ == "__main__":
    main()
