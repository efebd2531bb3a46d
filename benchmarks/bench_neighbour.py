"""The training loop beside arrayfeed: what the input pipeline costs the process that trains.

A training step is modelled as ``--gil-ms`` of Python holding the GIL (a framework dispatching
work) and ``--wait-ms`` waiting with the GIL released (for the accelerator). Each case consumes
arrayfeed's default stream with that step and is compared with the same loop over batches
already in RAM (the floor: 1.0 means the loader is invisible to the training loop). Stores:
``.npy`` paths (full shuffle, batch 256), Zarr written by ``arrayfeed convert --compression
lzf`` and HDF5 written by h5py with ``chunks=True, compression="lzf"`` (``shuffle="block"``,
batch 128); each through ``af.batches`` and ``af.from_arrays``; each with the loader process
(``processes`` left at its default) and with reader threads only (``processes=0``).

Besides the step ratio, each case reports, measured without the step (as fast as it goes):
rows/s; minor page faults of the training process per 4 KiB page delivered; CPU time of the
training process per group of batches and of the loader processes per GB delivered; and the
seconds from ``iter()`` to the first batch of a fresh dataset. ``--fit`` adds Keras 3 ``fit``
on the JAX backend of a model of almost no compute (every 16th pixel, one dense layer: the
input sets the pace), fed by ``from_arrays`` over ``.npy`` paths, against the same arrays in RAM.

Every case runs in a process of its own (TensorFlow changes the allocator of the process that
imports it), ``--reps`` times, interleaved; the tables show medians, and the targets are printed
with the machine they ran on. Data: L rows (60,000 x uint8[64,64,3], ``--rows-scale`` scales it)
in a temporary directory, or in ``--data-dir`` (kept and reused, shared with bench_scaling.py).

    python benchmarks/bench_neighbour.py              # full sizes (~15 min on 2 cores)
    python benchmarks/bench_neighbour.py --quick      # a fifth of the rows, shorter runs
    python benchmarks/bench_neighbour.py --stores npy --apis batches --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_scaling import Data, machine, shapes

import arrayfeed as af

SEED = 0
PAGE = 4096
#: store key -> (label, shuffle, batch size)
STORES: dict[str, tuple[str, bool | str, int]] = {
    "npy": (".npy path, full shuffle", True, 256),
    "zarrlzf": ("Zarr by convert --compression lzf, block", "block", 128),
    "h5lzf": ("HDF5 chunks=True lzf, block", "block", 128),
}
APIS = ("batches", "from_arrays")
#: mode -> the ``processes`` argument (None: the default)
MODES: dict[str, int | None] = {"default": None, "threads": 0, "loader": 1}


# -- data ----------------------------------------------------------------------------------------
def zarr_lzf_path(data: Data) -> Path:
    return data.root / f"{data.tag}_convert_lzf.zarr"


def prepare(root: Path, scale: float, stores: list[str], with_s: bool) -> dict[str, Any]:
    """Write what the cases read (reusing what is there); the paths each case opens."""
    shape = shapes(scale)["L"]
    data = Data(root, shape)
    data.ensure({"npy"} | ({"h5lzf"} if "h5lzf" in stores else set()))
    if "zarrlzf" in stores and not zarr_lzf_path(data).exists():
        tmp = zarr_lzf_path(data).with_name(f"{data.tag}_convert_lzf.partial.zarr")
        af.convert(
            {"x": data.path("npy_x"), "y": data.path("npy_y")},
            tmp,
            compression="lzf",
            overwrite=True,
            progress=False,
        )
        os.replace(tmp, zarr_lzf_path(data))
    files = {
        "npy": [str(data.path("npy_x")), str(data.path("npy_y"))],
        "zarrlzf": [f"{zarr_lzf_path(data)}:x", f"{zarr_lzf_path(data)}:y"],
        "h5lzf": [f"{data.path('h5lzf')}:x", f"{data.path('h5lzf')}:y"],
    }
    if with_s:
        s = Data(root, shapes(scale)["S"])
        s.ensure({"npy"})
        files["npy_S"] = [str(s.path("npy_x")), str(s.path("npy_y"))]
    data.page_cache()
    return files


# -- one case, in its own process -------------------------------------------------------------------
def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def loader_cpu() -> float:
    """CPU seconds used so far by this process's loader processes."""
    from arrayfeed._pipeline.loader.processes import loaders

    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in loaders().pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def steal() -> tuple[int, int]:
    """``(steal, total)`` CPU ticks of the whole machine so far (/proc/stat): the share a
    hypervisor gave to other guests. On a shared VM it moves every rate here, and the ratios
    of cases measured at different times with it."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def make_pipeline(spec: dict[str, Any]) -> tuple[Any, Callable[[Any], int], Any]:
    """The dataset or Batches of a case, rows of one of its batches, and its feed."""
    x, y = spec["files"]
    kwargs = {"batch_size": spec["batch"], "shuffle": spec["shuffle"], "seed": SEED}
    if spec["processes"] is not None:
        kwargs["processes"] = spec["processes"]
    if spec["api"] == "from_arrays":
        ds = af.from_arrays(x, y, **kwargs)
        return ds, lambda b: int(b[1].shape[0]), ds._arrayfeed_feed
    b = af.batches(x, y, **kwargs)
    return b, lambda b: int(b[1].shape[0]), b._feed


def epochs(source: Any) -> Iterator[Any]:
    while True:
        yield from source


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one case: first batch, as-fast-as-it-goes figures, then the step stand-in."""
    gil, wait, seconds = spec["gil_ms"] / 1e3, spec["wait_ms"] / 1e3, spec["seconds"]
    started = time.perf_counter()
    source, rows_of, feed = make_pipeline(spec)
    built = time.perf_counter()
    stream = epochs(source)
    first = rows_of(next(stream))
    result: dict[str, Any] = {
        "first_batch_after_iter_s": time.perf_counter() - built,
        "first_batch_after_build_start_s": time.perf_counter() - started,
    }
    row_bytes = spec["row_bytes"]
    rows = first
    end = time.perf_counter() + seconds  # warm-up: a first epoch's page faults are not steady
    while time.perf_counter() < end:
        rows += rows_of(next(stream))
    cpu0, faults0, loader0 = *usage(), loader_cpu()
    t0, rows = time.perf_counter(), 0
    while time.perf_counter() < t0 + seconds:
        rows += rows_of(next(stream))
    elapsed = time.perf_counter() - t0
    cpu1, faults1, loader1 = *usage(), loader_cpu()
    groups = rows / (feed.group_steps * spec["batch"])
    result.update(
        rows_per_s=rows / elapsed,
        faults_per_page=(faults1 - faults0) / (rows * row_bytes / PAGE),
        trainer_cpu_ms_per_group=1e3 * (cpu1 - cpu0) / groups,
        loader_cpu_s_per_gb=(loader1 - loader0) / (rows * row_bytes / 1e9),
        group_steps=feed.group_steps,
        processes=feed.processes,
        num_threads=feed.num_threads,
    )
    if spec.get("step", True):
        stolen0, total0 = steal()
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() < t0 + seconds:
            next(stream)
            busy(gil)
            time.sleep(wait)
            steps += 1
        result["steps_per_s"] = steps / (time.perf_counter() - t0)
        stolen1, total1 = steal()
        result["steal_share"] = (stolen1 - stolen0) / max(1, total1 - total0)
    return result


def run_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """The step stand-in over batches held in RAM (copies of the default stream's first ones):
    NumPy arrays in a list, or (``spec["tf"]``) one batch repeated by tf.data, what any tf.data
    input costs the loop that consumes it; with the consumer's CPU time per batch."""
    x = np.load(spec["files"][0], mmap_mode="r")
    y = np.load(spec["files"][1], mmap_mode="r")
    rng = np.random.default_rng(SEED)
    kept = []
    for _ in range(64):
        idx = np.sort(rng.choice(len(x), spec["batch"], replace=False))
        kept.append((np.ascontiguousarray(x[idx]), np.ascontiguousarray(y[idx])))
    if spec.get("tf"):
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensors(kept[0]).repeat()
        stream: Iterator[Any] = iter(ds)
    else:
        stream = (kept[i % len(kept)] for i in range(1 << 62))
    next(stream)
    cpu0, t0, n = usage()[0], time.perf_counter(), 0
    while time.perf_counter() < t0 + spec["seconds"]:
        next(stream)
        n += 1
    cpu_ms_per_batch = 1e3 * (usage()[0] - cpu0) / n
    gil, wait = spec["gil_ms"] / 1e3, spec["wait_ms"] / 1e3
    (stolen0, total0), steps, t0 = steal(), 0, time.perf_counter()
    while time.perf_counter() < t0 + spec["seconds"]:
        next(stream)
        busy(gil)
        time.sleep(wait)
        steps += 1
    stolen1, total1 = steal()
    return {
        "steps_per_s": steps / (time.perf_counter() - t0),
        "cpu_ms_per_batch": cpu_ms_per_batch,
        "steal_share": (stolen1 - stolen0) / max(1, total1 - total0),
    }


def run_fit(spec: dict[str, Any]) -> dict[str, Any]:
    """Keras-JAX ``fit`` rows/s of the input-bound model, fed by ``spec["feed"]``."""
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    x_path, y_path = spec["files"]
    batch = spec["batch"]

    def model() -> Any:
        inputs = keras.Input((64, 64, 3), dtype="uint8")
        pixels = keras.layers.Lambda(lambda t: keras.ops.cast(t[:, ::16, ::16, :], "float32"))(
            inputs
        )
        out = keras.layers.Dense(10)(keras.layers.Flatten()(pixels))
        m = keras.Model(inputs, out)
        m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
        return m

    m = model()
    if spec["feed"] == "from_arrays":
        ds = af.from_arrays(x_path, y_path, batch_size=batch, seed=SEED, drop_remainder=True)
        fit = lambda epochs: m.fit(ds, epochs=epochs, verbose=0)  # noqa: E731
        n = len(ds) * batch
    elif spec["feed"] == "ram":
        x, y = np.load(x_path), np.load(y_path)
        n = (len(x) // batch) * batch
        x, y = x[:n], y[:n]
        fit = lambda epochs: m.fit(x, y, batch_size=batch, epochs=epochs, shuffle=True, verbose=0)  # noqa: E731
    else:  # one batch repeated, from a Python generator: the model's own ceiling
        x = np.load(x_path, mmap_mode="r")[:batch].copy()
        y = np.load(y_path)[:batch].copy()
        steps = len(np.load(y_path, mmap_mode="r")) // batch

        def repeated() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            while True:
                yield x, y

        fit = lambda epochs: m.fit(repeated(), steps_per_epoch=steps, epochs=epochs, verbose=0)  # noqa: E731
        n = steps * batch
    fit(1)  # compile and warm up
    t0 = time.perf_counter()
    fit(spec["epochs"])
    return {"rows_per_s": n * spec["epochs"] / (time.perf_counter() - t0)}


def child(spec_json: str) -> None:
    spec = json.loads(spec_json)
    work = {"case": run_case, "floor": run_floor, "fit": run_fit}[spec["kind"]]
    print("RESULT " + json.dumps(work(spec)), flush=True)
    os._exit(0)  # loaders and reader threads end with the process


def in_child(spec: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"  timed out: {spec}", file=sys.stderr)
        return None
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    print(f"  failed ({out.returncode}): {spec}\n{out.stderr[-3000:]}", file=sys.stderr)
    return None


# -- the run -------------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a fifth of the rows, 2 s runs")
    p.add_argument("--rows-scale", type=float, default=None)
    p.add_argument("--seconds", type=float, default=None, help="per measurement (default 4)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--gil-ms", type=float, default=2.0, help="step time holding the GIL")
    p.add_argument("--wait-ms", type=float, default=3.0, help="step time waiting, GIL released")
    p.add_argument("--stores", default=",".join(STORES))
    p.add_argument("--apis", default=",".join(APIS))
    p.add_argument("--modes", default="default,threads", help="of: default, threads, loader")
    p.add_argument("--fit", action="store_true", help="also Keras-JAX fit (needs jax)")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.rows_scale = args.rows_scale or (0.2 if args.quick else 1.0)
    args.seconds = args.seconds or (2.0 if args.quick else 4.0)
    return args


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child is not None:
        child(args.child)
        return
    stores = [s for s in args.stores.split(",") if s]
    apis = [a for a in args.apis.split(",") if a]
    modes = [m for m in args.modes.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="bench_neighbour_") as tmp:
        root = args.data_dir or Path(tmp)
        files = prepare(root, args.rows_scale, stores, with_s="npy" in stores)
        report = measure(args, files, stores, apis, modes)
    report["machine"] = machine(None)
    report["command"] = " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])
    print(tables(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def measure(
    args: argparse.Namespace,
    files: dict[str, Any],
    stores: list[str],
    apis: list[str],
    modes: list[str],
) -> dict[str, Any]:
    base = {"gil_ms": args.gil_ms, "wait_ms": args.wait_ms, "seconds": args.seconds}
    l_row = int(np.prod(shapes(1)["L"].row_shape)) + 4
    specs: dict[str, dict[str, Any]] = {}
    for store in stores:
        _, shuffle, batch = STORES[store]
        for api in apis:
            for mode in modes:
                specs[f"{store}|{api}|{mode}"] = dict(
                    base,
                    kind="case",
                    files=files[store],
                    shuffle=shuffle,
                    batch=batch,
                    api=api,
                    processes=MODES[mode],
                    row_bytes=l_row,
                )
        specs[f"{store}|floor"] = dict(base, kind="floor", files=files["npy"], batch=batch)
        if "from_arrays" in apis:
            specs[f"{store}|tffloor"] = dict(
                base, kind="floor", files=files["npy"], batch=batch, tf=True
            )
    if "npy_S" in files:
        if "from_arrays" in apis:
            specs["npy_S|tffloor"] = dict(
                base, kind="floor", files=files["npy_S"], batch=256, tf=True, seconds=1.0
            )
        for api in apis:
            for mode in modes:
                specs[f"npy_S|{api}|{mode}"] = dict(
                    base,
                    kind="case",
                    files=files["npy_S"],
                    shuffle=True,
                    batch=256,
                    api=api,
                    processes=MODES[mode],
                    row_bytes=32 * 4 + 4,
                    step=False,
                )
    if args.fit:
        for feed in ("from_arrays", "ram", "repeated"):
            specs[f"fit|{feed}"] = dict(
                kind="fit", files=files["npy"], batch=256, feed=feed, epochs=2
            )
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in specs}
    for rep in range(args.reps):
        for key, spec in specs.items():
            print(f"rep {rep + 1}/{args.reps}: {key}", file=sys.stderr, flush=True)
            got = in_child(spec, timeout=120 + 10 * args.seconds)
            if got is not None:
                samples[key].append(got)
    return {"args": {k: str(v) for k, v in vars(args).items()}, "samples": samples}


def summary(samples: list[dict[str, Any]], key: str) -> float | None:
    return median([s[key] for s in samples if key in s])


def tables(report: dict[str, Any]) -> str:
    samples = report["samples"]
    lines = [f"machine: {report['machine']}", f"command: {report['command']}", ""]
    head = (
        f"{'case':38} {'rows/s':>11} {'faults/pg':>9} {'step/floor':>10} {'/tf floor':>9} "
        f"{'cpu ms/grp':>10} {'(net)':>7} {'loader s/GB':>11} {'1st batch s':>11}"
    )
    lines.append(head)
    ratios: dict[str, float | None] = {}
    for key, runs in samples.items():
        if key.endswith(("|floor", "|tffloor")) or key.startswith("fit|") or not runs:
            continue
        store, api = key.split("|")[:2]
        floor = summary(samples.get(f"{store.split('_')[0]}|floor", []), "steps_per_s")
        tf_floor = summary(samples.get(f"{store.split('_')[0]}|tffloor", []), "steps_per_s")
        steps = summary(runs, "steps_per_s")
        ratio = steps / floor if steps and floor else None
        tf_ratio = steps / tf_floor if steps and tf_floor and api == "from_arrays" else None
        ratios[key] = ratio
        net = net_cpu(samples, key, runs)
        lines.append(
            f"{key:38} {fmt(summary(runs, 'rows_per_s'), 0):>11} "
            f"{fmt(summary(runs, 'faults_per_page'), 3):>9} {fmt(ratio):>10} {fmt(tf_ratio):>9} "
            f"{fmt(summary(runs, 'trainer_cpu_ms_per_group')):>10} {fmt(net):>7} "
            f"{fmt(summary(runs, 'loader_cpu_s_per_gb')):>11} "
            f"{fmt(summary(runs, 'first_batch_after_iter_s')):>11}"
        )
    stolen = [r["steal_share"] for runs in samples.values() for r in runs if "steal_share" in r]
    if stolen:
        lines.append(
            f"\nCPU time taken by the hypervisor (steal) during the steps: median "
            f"{statistics.median(stolen):.0%}, most {max(stolen):.0%}"
        )
    lines += ["", *target_lines(samples, ratios)]
    return "\n".join(lines)


def net_cpu(
    samples: dict[str, list[dict[str, Any]]], key: str, runs: list[dict[str, Any]]
) -> float | None:
    """Training-process CPU per group beyond what consuming the same batches from RAM costs
    (the tf.data floor's per batch for ``from_arrays``; nothing for NumPy batches)."""
    cpu = summary(runs, "trainer_cpu_ms_per_group")
    if cpu is None:
        return None
    store, api = key.split("|")[:2]
    if api != "from_arrays":
        return cpu
    per_batch = summary(samples.get(f"{store}|tffloor", []), "cpu_ms_per_batch")
    steps = summary(runs, "group_steps")
    return None if per_batch is None or steps is None else max(0.0, cpu - per_batch * steps)


def target_lines(
    samples: dict[str, list[dict[str, Any]]], ratios: dict[str, float | None]
) -> list[str]:
    out = ["targets (this machine):"]

    def check(name: str, value: float | None, ok: Callable[[float], bool], goal: str) -> None:
        mark = "-" if value is None else ("✓" if ok(value) else "✗")
        out.append(f"  {mark} {name}: {fmt(value, 3)} ({goal})")

    for key in sorted(
        k for k in samples if k.endswith("|default") and k.split("|")[0] in ("npy", "npy_S")
    ):
        check(
            f"faults per page, {key}",
            summary(samples[key], "faults_per_page"),
            lambda v: v <= 0.1,
            "<= 0.1",
        )
    tf_l = summary(samples.get("npy|from_arrays|default", []), "rows_per_s")
    np_l = summary(samples.get("npy|batches|default", []), "rows_per_s")
    check(
        "L .npy from_arrays / batches",
        tf_l / np_l if tf_l and np_l else None,
        lambda v: v >= 0.8,
        ">= 0.8",
    )
    for key, ratio in ratios.items():
        if key.endswith("|default") and not key.startswith("npy_S"):
            check(f"step / floor, {key}", ratio, lambda v: v >= 0.85, ">= 0.85")
    for store in sorted({k.split("|")[0] for k in samples if k.endswith("|tffloor")} - {"npy_S"}):
        tf_floor = summary(samples[f"{store}|tffloor"], "steps_per_s")
        floor = summary(samples.get(f"{store}|floor", []), "steps_per_s")
        out.append(
            f"    (tf.data's own floor, one batch repeated, {store}: {fmt(tf_floor / floor if tf_floor and floor else None)} of the NumPy floor)"
        )
    for key in sorted(k for k in samples if k.endswith("|default")):
        other = key.replace("|default", "|threads")
        threads = net_cpu(samples, other, samples.get(other, []))
        mine = net_cpu(samples, key, samples[key])
        check(
            f"trainer CPU per group beyond consuming, loader / threads, {key}",
            mine / threads if mine is not None and threads else None,
            lambda v: v <= 0.1,
            "<= 0.1",
        )
    for key in sorted(k for k in samples if k.endswith("|default")):
        check(
            f"first batch after iter(), {key}",
            summary(samples[key], "first_batch_after_iter_s"),
            lambda v: v <= 2.0,
            "<= 2 s",
        )
    fit_af = summary(samples.get("fit|from_arrays", []), "rows_per_s")
    fit_ram = summary(samples.get("fit|ram", []), "rows_per_s")
    if fit_af or fit_ram:
        check(
            "Keras-JAX fit, from_arrays / arrays in RAM",
            fit_af / fit_ram if fit_af and fit_ram else None,
            lambda v: v >= 0.9,
            ">= 0.9",
        )
        out.append(
            f"    (rows/s: from_arrays {fmt(fit_af, 0)}, in RAM {fmt(fit_ram, 0)}, "
            f"one batch repeated {fmt(summary(samples.get('fit|repeated', []), 'rows_per_s'), 0)})"
        )
    return out


if __name__ == "__main__":
    main()
