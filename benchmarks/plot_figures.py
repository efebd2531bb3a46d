"""Draw the performance page's figures from the JSON results the benchmarks write.

Reads every ``<machine>/*.json`` under ``--results`` (default ``benchmarks/results``) and writes
PNG files to ``--out`` (default ``docs/figures``), each titled with its machine and captioned
with the command that produced its data:

- ``scaling-<machine>.png`` (``bench_scaling.py``, feed and tf.data levels): rows/s by reader
  threads, one curve per storage, one panel per level and row size; NumPy's own gather from the
  memmap dashed, the tf.data floor dotted, the default thread count a star.
- ``fit-<machine>.png`` (``bench_scaling.py --levels fit``): Keras ``fit`` rows/s of each input
  pipeline, as bars.
- ``peers-<machine>.png`` (``bench_peers.py``): arrayfeed and the usual alternatives as bars
  side by side, one panel per row size; cases the run skipped are named in the caption.
- ``neighbour-<machine>.png`` (``bench_neighbour.py``, only when its results are there): steps
  per second of a training loop fed by arrayfeed over the same loop over batches in RAM, per
  case (``store|api|mode``), the median a bar and each repetition a dot.
- ``autotune-<machine>.png`` (``bench_autotune.py``): rows/s of every fixed ``num_threads``
  against the default (tuned while reading), one panel per storage.

When a machine has several results of one benchmark, a case measured by a run of fewer cases
(a follow-up) replaces the same case of a broader run, and the caption names every file drawn.

    python benchmarks/plot_figures.py
    python benchmarks/plot_figures.py --results some/results --out /tmp/figures
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter

HERE = Path(__file__).resolve().parent
LEVEL_TITLES = {"feed": "feed level (no TensorFlow)", "tfdata": "through tf.data"}
GATHER = "NumPy gather (memmap)"
FLOOR = "tf.data floor"
CAPTION_WIDTH = 110
PNG_METADATA = {"Software": None}  # no version stamp: the same data gives the same file


@dataclass
class Machine:
    """The results of one machine: ``benchmarks/results/<name>/*.json``, by benchmark."""

    name: str
    scaling: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    peers: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    neighbour: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    autotune: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)


def kind_of(report: dict[str, Any]) -> str | None:
    """Which benchmark wrote ``report``: ``"scaling"``, ``"peers"``, ``"neighbour"``,
    ``"autotune"`` or None."""
    if isinstance(report.get("samples"), dict):
        return "neighbour"
    if isinstance(report.get("cases"), list) and "targets" in report:
        return "autotune"
    config = report.get("config", {})
    if "levels" in config and "rates" in report:
        return "scaling"
    if isinstance(report.get("figures"), list) and "levels" not in config:
        return "peers"
    return None


def load(results: Path) -> list[Machine]:
    machines = []
    for folder in sorted(p for p in results.iterdir() if p.is_dir()):
        machine = Machine(folder.name)
        for path in sorted(folder.glob("*.json")):
            report = json.loads(path.read_text())
            kind = kind_of(report)
            if kind is not None:
                getattr(machine, kind).append((path, report))
        machines.append(machine)
    return machines


# -- titles and captions ------------------------------------------------------------------------
def describe_machine(name: str, info: dict[str, Any]) -> str:
    parts = [name]
    if info.get("cores"):
        parts.append(f"{info['cores']} cores")
    if info.get("cpu"):
        parts.append(str(info["cpu"]))
    if info.get("gpu"):
        parts.append(str(info["gpu"]))
    if info.get("python"):
        parts.append(f"Python {info['python']}")
    return ", ".join(parts)


def _number(value: float) -> str:
    return f"{value:g}"


@functools.cache
def default_cases(benchmark: str) -> frozenset[str]:
    """What ``--cases`` of ``bench_scaling`` or ``bench_peers`` is when not given, so that a
    command is written with ``--cases`` only when a run chose some."""
    sys.path.insert(0, str(HERE))
    if benchmark == "bench_scaling":
        from bench_scaling import BASELINES, STORAGES

        return frozenset([*STORAGES, *BASELINES])
    from bench_peers import CASES

    return frozenset(CASES)


def scaling_command(config: dict[str, Any]) -> str:
    """The ``bench_scaling.py`` command line that writes a report with this ``config``."""
    words = ["python benchmarks/bench_scaling.py"]
    quick = bool(config.get("quick"))
    if quick:
        words.append("--quick")
    words += ["--levels", ",".join(config.get("levels", []))]
    words += ["--shapes", ",".join(config.get("shapes", {}))]
    words += ["--reps", str(config.get("reps"))]
    words += ["--seconds", _number(config.get("seconds", 0))]
    cases = set(config.get("cases", []))
    if cases and cases != default_cases("bench_scaling"):
        words += ["--cases", ",".join(sorted(cases))]
    if config.get("busy_thread"):
        words.append("--busy-thread")
    scale = config.get("rows_scale")
    if scale is not None and not math.isclose(scale, 0.1 if quick else 1.0):
        words += ["--rows-scale", _number(scale)]
    return " ".join(words)


def peers_command(config: dict[str, Any]) -> str:
    words = ["python benchmarks/bench_peers.py"]
    quick = bool(config.get("quick"))
    if quick:
        words.append("--quick")
    if config.get("reps", 3) != 3:
        words += ["--reps", str(config["reps"])]
    seconds = config.get("seconds")
    if seconds is not None and not math.isclose(seconds, 0.7 if quick else 3.0):
        words += ["--seconds", _number(seconds)]
    shapes = list(config.get("shapes", {}))
    if shapes and shapes != ["S", "L"]:
        words += ["--shapes", ",".join(shapes)]
    cases = list(config.get("cases", []))
    if cases and set(cases) != default_cases("bench_peers"):
        words += ["--cases", ",".join(cases)]
    return " ".join(words)


def caption(fig: Figure, lines: Iterable[str]) -> None:
    text = "\n".join(
        textwrap.fill(line, CAPTION_WIDTH, subsequent_indent="    ") for line in lines if line
    )
    fig.text(0.01, 0.005, text, ha="left", va="bottom", fontsize=7.5, family="monospace")


def finish(
    fig: Figure, caption_lines: list[str], path: Path, legend: dict[str, Any] | None = None
) -> Path:
    """Caption at the bottom, ``legend`` (label -> artist) above it, the axes above both."""
    height = fig.get_figheight()
    rows = sum(len(textwrap.wrap(line, CAPTION_WIDTH)) or 1 for line in caption_lines)
    bottom = (0.1 + 0.13 * rows) / height
    caption(fig, caption_lines)
    if legend:
        fig.legend(
            list(legend.values()),
            list(legend),
            loc="lower center",
            ncol=3,
            fontsize=8,
            bbox_to_anchor=(0.5, bottom),
            frameon=False,
        )
        bottom += (0.1 + 0.2 * math.ceil(len(legend) / 3)) / height
    fig.tight_layout(rect=(0, bottom, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return path


def rate_label(value: float, _position: object = None) -> str:
    for limit, suffix in ((1e6, " M"), (1e3, " k")):
        if value >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:g}"


# -- thread scaling -------------------------------------------------------------------------------
def merged_figures(
    runs: list[tuple[Path, dict[str, Any]]],
) -> dict[tuple[str, ...], dict[str, Any]]:
    """Every figure of ``runs`` by (level, shape, case, threads); a run that chose fewer cases
    (a follow-up of a broader one) replaces the broader run's figures of the same case."""
    by_breadth = sorted(runs, key=lambda run: -len(run[1].get("config", {}).get("cases", [])))
    merged: dict[tuple[str, ...], dict[str, Any]] = {}
    for _, report in by_breadth:
        cases = {(f["level"], f["shape"], f["case"]) for f in report["figures"]}
        for key in list(merged):
            if key[:3] in cases:
                del merged[key]
        for f in report["figures"]:
            merged[(f["level"], f["shape"], f["case"], str(f["threads"]))] = f
    return merged


def plot_scaling(machine: Machine, out: Path) -> Path | None:
    runs = [
        run
        for run in machine.scaling
        if {"feed", "tfdata"} & {f["level"] for f in run[1]["figures"]}
    ]
    if not runs:
        return None
    figures = merged_figures(runs)
    panels = sorted(
        {(f["level"], f["shape"]) for f in figures.values() if f["level"] in LEVEL_TITLES},
        key=lambda p: (list(LEVEL_TITLES).index(p[0]), "SL".index(p[1]) if p[1] in "SL" else 9),
    )
    columns = min(2, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(6.2 * columns, 4.2 * rows + 2.4), squeeze=False
    )
    info = runs[0][1]["machine"]
    styles = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    storages = sorted(
        {
            f["case"]
            for f in figures.values()
            if f["kind"] == "arrayfeed" and not f.get("busy_thread")
        }
    )
    color = {case: styles[i % len(styles)] for i, case in enumerate(storages)}
    shapes = runs[0][1]["config"].get("shapes", {})
    for shapes_of in (r[1]["config"].get("shapes", {}) for r in runs):
        shapes = {**shapes, **shapes_of}
    handles: dict[str, Any] = {}
    for ax, (level, shape) in zip(axes.flat, panels, strict=False):
        here = [f for f in figures.values() if f["level"] == level and f["shape"] == shape]
        threads_seen = sorted({int(f["threads"]) for f in here if f["threads"].isdigit()})
        # A default whose thread count the run did not record stands at a tick of its own.
        unknown_default = (threads_seen[-1] if threads_seen else 1) * 1.7
        values: list[float] = []
        for case in storages:
            points = sorted(
                (int(f["threads"]), f["median"])
                for f in here
                if f["case"] == case and f["threads"].isdigit() and f["median"]
            )
            if not points:
                continue
            values += [v for _, v in points]
            (line,) = ax.plot(*zip(*points, strict=True), marker="o", ms=4, color=color[case])
            handles.setdefault(case, line)
            for f in here:
                if f["case"] == case and f["threads"] == "default" and f["median"]:
                    at = f.get("resolved_threads") or unknown_default
                    handles.setdefault(
                        "default thread count",
                        ax.plot(
                            at,
                            f["median"],
                            marker="*",
                            ms=11,
                            color=color[case],
                            markeredgecolor="black",
                            markeredgewidth=0.5,
                            linestyle="none",
                        )[0],
                    )
        gather = sorted(
            (int(f["threads"]), f["median"])
            for f in here
            if f["case"] == GATHER and f["threads"].isdigit() and f["median"]
        )
        if gather:
            values += [v for _, v in gather]
            (line,) = ax.plot(*zip(*gather, strict=True), "k--", lw=1.2)
            handles.setdefault(f"{GATHER}, as many threads (baseline)", line)
        for f in here:
            if f["case"] == FLOOR and f["median"]:
                values.append(f["median"])
                line = ax.axhline(f["median"], color="gray", ls=":", lw=1.2)
                handles.setdefault("tf.data floor: from_tensors(batch).repeat()", line)
        size = shapes.get(shape, {})
        detail = f"{size.get('rows', 0):,} rows x {size.get('row_bytes', 0):,} B" if size else ""
        ax.set_title(f"{shape} ({detail}), {LEVEL_TITLES[level]}", fontsize=10)
        ax.set_xscale("log", base=2)
        ticks = list(threads_seen)
        labels = [str(t) for t in threads_seen]
        if any(f["threads"] == "default" and not f.get("resolved_threads") for f in here):
            ticks.append(unknown_default)
            labels.append("default")
        ax.set_xticks(ticks, labels)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(rate_label)
        ax.yaxis.set_minor_formatter(NullFormatter())
        if values:
            ax.set_ylim(min(values) / 1.6, max(values) * 1.6)
        ax.set_xlabel("reader threads")
        ax.set_ylabel("rows/s")
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"Thread scaling per storage: {describe_machine(machine.name, info)}", fontsize=11)
    lines = [
        f"{machine.name}/{path.name}: {scaling_command(report['config'])}" for path, report in runs
    ]
    lines.append(
        'medians of interleaved repetitions; batch 256; (full): shuffle=True, (block): shuffle="block"'
    )
    return finish(fig, lines, out / f"scaling-{machine.name}.png", handles)


def bars(
    ax: Any, labels: list[str], values: list[float], samples: list[list[float]], ours: list[bool]
) -> None:
    """Horizontal bars, the first label on top; arrayfeed's darker, each repetition a dot."""
    ys = list(range(len(labels)))[::-1]
    ax.barh(ys, values, color=["#1f5fa8" if o else "#9bbbd9" for o in ours], height=0.7)
    for y, points in zip(ys, samples, strict=True):
        ax.plot(points, [y] * len(points), "k.", ms=3)
    ax.set_yticks(ys, labels, fontsize=8)
    for y, value in zip(ys, values, strict=True):
        ax.text(value, y, f" {rate_label(value)}", va="center", fontsize=7)


def plot_fit(machine: Machine, out: Path) -> Path | None:
    runs = [run for run in machine.scaling if any(f["level"] == "fit" for f in run[1]["figures"])]
    if not runs:
        return None
    path, report = runs[-1]
    fit = [f for f in report["figures"] if f["level"] == "fit" and f["median"]]
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(fit) + 2.4))
    bars(
        ax,
        [f["case"] for f in fit],
        [f["median"] for f in fit],
        [f.get("samples", []) for f in fit],
        [f["kind"] == "arrayfeed" for f in fit],
    )
    ax.set_xlabel("rows/s through Keras fit")
    ax.xaxis.set_major_formatter(rate_label)
    ax.margins(x=0.15)
    fig.suptitle(
        f"Keras fit (JAX backend) input pipelines: "
        f"{describe_machine(machine.name, report['machine'])}",
        fontsize=10,
    )
    lines = [
        f"{machine.name}/{path.name}: {scaling_command(report['config'])}",
        f"Keras {report['machine'].get('keras')}, JAX {report['machine'].get('jax')}; "
        "dark: arrayfeed; dots: repetitions",
    ]
    return finish(fig, lines, out / f"fit-{machine.name}.png")


# -- peers ----------------------------------------------------------------------------------------
def plot_peers(machine: Machine, out: Path) -> list[Path]:
    written = []
    for i, (path, report) in enumerate(machine.peers):
        measured = [f for f in report["figures"] if f.get("median") and not f.get("skipped")]
        shapes = [s for s in ("S", "L") if any(f["shape"] == s for f in measured)]
        if not shapes:
            continue
        cases = list(dict.fromkeys(f["case"] for f in measured))
        fig, axes = plt.subplots(
            1, len(shapes), figsize=(6.5 * len(shapes), 0.42 * len(cases) + 2.8), squeeze=False
        )
        for ax, shape in zip(axes.flat, shapes, strict=True):
            here = {f["case"]: f for f in measured if f["shape"] == shape}
            names = [c for c in cases if c in here]
            bars(
                ax,
                [f"{c} [{here[c].get('level', '')}]" for c in names],
                [here[c]["median"] for c in names],
                [here[c].get("rates", []) for c in names],
                [c.startswith("arrayfeed") for c in names],
            )
            size = report["config"].get("shapes", {}).get(shape, {})
            ax.set_title(
                f"{shape}: {size.get('rows', 0):,} rows x {size.get('row_bytes', 0):,} B",
                fontsize=10,
            )
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(rate_label)
            ax.set_xlabel("rows/s")
            ax.margins(x=0.2)
            if ax is not axes.flat[0]:
                ax.set_yticks(ax.get_yticks(), [""] * len(names))
        info = report["machine"]
        fig.suptitle(
            f"arrayfeed and its peers: {describe_machine(machine.name, info)}", fontsize=11
        )
        skipped = sorted({f["case"] for f in report["figures"] if f.get("skipped")})
        load = ""
        if "load_before" in info:
            load = (
                f"; load average {info['load_before']:.1f} before, "
                f"{info.get('load_average', float('nan')):.1f} after"
            )
        lines = [
            f"{machine.name}/{path.name}: {peers_command(report['config'])}",
            f"TensorFlow {info.get('tensorflow')}, Keras {info.get('keras')}, torch "
            f"{info.get('torch')}, Grain {info.get('grain')}{load}",
            "dark: arrayfeed ([NumPy] against af.batches, [tf.data] against af.from_arrays); "
            "dots: repetitions"
            + (f"; not measured in this run: {', '.join(skipped)}" if skipped else ""),
        ]
        suffix = "" if len(machine.peers) == 1 else f"-{i + 1}"
        written.append(finish(fig, lines, out / f"peers-{machine.name}{suffix}.png"))
    return written


# -- beside the training loop --------------------------------------------------------------------
def neighbour_ratios(report: dict[str, Any]) -> dict[str, list[float]]:
    """Per case (``store|api|mode``), each repetition's steps/s over the median steps/s of its
    store's floor (the same loop over batches in RAM)."""
    samples: dict[str, list[dict[str, Any]]] = report["samples"]
    ratios: dict[str, list[float]] = {}
    for key, runs in samples.items():
        if key.endswith("|floor") or key.startswith("fit|"):
            continue
        store = key.split("|")[0].split("_")[0]
        floors = [s["steps_per_s"] for s in samples.get(f"{store}|floor", []) if "steps_per_s" in s]
        steps = [s["steps_per_s"] for s in runs if "steps_per_s" in s]
        if floors and steps:
            floor = statistics.median(floors)
            ratios[key] = [value / floor for value in steps]
    return ratios


def plot_neighbour(machine: Machine, out: Path) -> list[Path]:
    written = []
    for i, (path, report) in enumerate(machine.neighbour):
        ratios = neighbour_ratios(report)
        if not ratios:
            continue
        names = sorted(ratios)
        fig, ax = plt.subplots(figsize=(11, 0.4 * len(names) + 2.6))
        ys = list(range(len(names)))[::-1]
        medians = [statistics.median(ratios[n]) for n in names]
        ax.barh(ys, medians, color=["#1f5fa8" if "|threads" not in n else "#9bbbd9" for n in names])
        for y, name in zip(ys, names, strict=True):
            ax.plot(ratios[name], [y] * len(ratios[name]), "k.", ms=3)
        ax.set_yticks(ys, names, fontsize=8)
        ax.axvline(1.0, color="gray", ls=":", lw=1.2)
        ax.set_xlabel("training steps/s with arrayfeed ÷ the same loop over batches in RAM")
        lines = titled(
            fig, "The training loop beside arrayfeed", machine, path, report, "bench_neighbour.py"
        )
        lines.append("1.0: the loader costs the loop nothing")
        suffix = "" if len(machine.neighbour) == 1 else f"-{i + 1}"
        written.append(finish(fig, lines, out / f"neighbour-{machine.name}{suffix}.png"))
    return written


def titled(
    fig: Figure, title: str, machine: Machine, path: Path, report: dict[str, Any], script: str
) -> list[str]:
    """Title ``fig`` with ``title`` and the machine; the caption's line naming the command."""
    fig.suptitle(
        f"{title}: {describe_machine(machine.name, report.get('machine', {}))}", fontsize=11
    )
    command = report.get("command", script)
    if not command.startswith("python "):
        command = f"python benchmarks/{command}"
    return [f"{machine.name}/{path.name}: {command}"]


# -- tuning --------------------------------------------------------------------------------------
def plot_autotune(machine: Machine, out: Path) -> list[Path]:
    written = []
    for i, (path, report) in enumerate(machine.autotune):
        cases = report["cases"]
        columns = min(3, len(cases))
        rows = math.ceil(len(cases) / columns)
        fig, axes = plt.subplots(
            rows, columns, figsize=(4 * columns, 3 * rows + 1.6), squeeze=False
        )
        for ax, case in zip(axes.flat, cases, strict=False):
            fixed = {int(k): v for k, v in case["rates"].items() if k != "default"}
            threads = sorted(fixed)
            (line,) = ax.plot(threads, [fixed[t] for t in threads], "o-", color="#9bbbd9")
            tuned = ax.axhline(case["rates"]["default"], color="#1f5fa8", lw=2)
            ax.set_xscale("log", base=2)
            ax.set_xticks(threads, [str(t) for t in threads])
            ax.set_ylim(bottom=0)
            ax.set_title(f"{case['case']}: {case['default_over_best']:.2f} of the best", fontsize=9)
            ax.set_xlabel("num_threads (fixed)", fontsize=8)
            ax.set_ylabel("rows/s", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(cases) :]:
            ax.set_visible(False)
        title = "Tuned while reading vs every fixed setting"
        lines = titled(fig, title, machine, path, report, "bench_autotune.py")
        lines.append("medians of alternating runs")
        suffix = "" if len(machine.autotune) == 1 else f"-{i + 1}"
        legend = {"fixed num_threads": line, "default (tuned)": tuned}
        written.append(finish(fig, lines, out / f"autotune-{machine.name}{suffix}.png", legend))
    return written


def draw(results: Path, out: Path) -> list[Path]:
    """Every figure of the results under ``results``, written to ``out``; the paths written."""
    written: list[Path] = []
    for machine in load(results):
        for path in (plot_scaling(machine, out), plot_fit(machine, out)):
            if path is not None:
                written.append(path)
        written += plot_peers(machine, out)
        written += plot_neighbour(machine, out)
        written += plot_autotune(machine, out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "figures")
    args = parser.parse_args(argv)
    for path in draw(args.results, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
