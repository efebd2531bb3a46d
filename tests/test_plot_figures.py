"""benchmarks/plot_figures.py draws the performance page's figures from benchmark results: on a
small results tree here, and on the committed results, whose figures are the committed PNGs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .conftest import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
FIGURES = REPO_ROOT / "docs" / "figures"
PNG = b"\x89PNG\r\n\x1a\n"


def load_benchmark(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import each other by name
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plot() -> ModuleType:
    return load_benchmark("plot_figures")


MACHINE = {"cores": 2, "cpu": "Test CPU", "gpu": None, "python": "3.11.7"}


def scaling_report(levels: list[str], cases: list[str]) -> dict[str, Any]:
    figures = []
    for level in levels:
        for shape in ("S", "L"):
            for threads, rate in (("1", 100.0), ("2", 180.0), ("default", 175.0)):
                figures.append(
                    {
                        "level": level,
                        "shape": shape,
                        "case": ".npy path (full)",
                        "kind": "arrayfeed",
                        "threads": threads,
                        "busy_thread": False,
                        "median": rate,
                        "samples": [rate, rate * 1.1],
                        "storage": "npy",
                        "resolved_threads": 2 if threads == "default" and level == "feed" else None,
                    }
                )
            if level == "feed":
                figures += [
                    {
                        "level": level,
                        "shape": shape,
                        "case": "NumPy gather (memmap)",
                        "kind": "baseline",
                        "threads": t,
                        "busy_thread": False,
                        "median": r,
                        "samples": [r],
                    }
                    for t, r in (("1", 300.0), ("2", 500.0))
                ]
            else:
                figures.append(
                    {
                        "level": level,
                        "shape": shape,
                        "case": "tf.data floor",
                        "kind": "baseline",
                        "threads": "-",
                        "busy_thread": False,
                        "median": 400.0,
                        "samples": [400.0],
                    }
                )
    return {
        "machine": MACHINE,
        "config": {
            "batch_size": 256,
            "quick": True,
            "rows_scale": 0.1,
            "seconds": 0.2,
            "reps": 2,
            "threads": [1, 2],
            "busy_thread": False,
            "shapes": {
                "S": {"rows": 1000, "row_bytes": 132},
                "L": {"rows": 60, "row_bytes": 12292},
            },
            "levels": levels,
            "cases": cases,
        },
        "figures": figures,
        "rates": {},
        "targets": [],
        "skipped": [],
    }


def peers_report() -> dict[str, Any]:
    figures = [
        {
            "shape": shape,
            "case": case,
            "level": level,
            "median": rate,
            "rates": [rate],
            "skipped": None,
        }
        for shape in ("S", "L")
        for case, level, rate in (
            ("arrayfeed.batches", "NumPy", 1e6),
            ("arrayfeed.from_arrays", "tf.data", 4e5),
            ("Keras PyDataset (1 worker)", "NumPy", 3e5),
        )
    ]
    figures.append(
        {
            "shape": "S",
            "case": "torch",
            "level": "-",
            "median": None,
            "rates": [],
            "skipped": "torch not installed",
        }
    )
    return {
        "machine": {**MACHINE, "load_before": 0.5, "load_average": 0.7, "torch": "not installed"},
        "config": {
            "batch_size": 256,
            "quick": True,
            "rows_scale": 0.1,
            "seconds": 0.7,
            "reps": 3,
            "shapes": {
                "S": {"rows": 1000, "row_bytes": 132},
                "L": {"rows": 60, "row_bytes": 12292},
            },
            "cases": ["arrayfeed-batches", "arrayfeed-from-arrays", "pydataset", "torch"],
        },
        "figures": figures,
        "notes": [],
    }


def neighbour_report() -> dict[str, Any]:
    return {
        "args": {},
        "samples": {
            "npy|batches|default": [{"steps_per_s": 190.0}, {"steps_per_s": 196.0}],
            "npy|batches|threads": [{"steps_per_s": 150.0}, {"steps_per_s": 160.0}],
            "npy|floor": [{"steps_per_s": 200.0}, {"steps_per_s": 198.0}],
        },
        "machine": MACHINE,
        "command": "bench_neighbour.py --quick --stores npy --apis batches --json out.json",
    }


def autotune_report() -> dict[str, Any]:
    def case(name: str, default: float) -> dict[str, Any]:
        rates = {"default": default, "1": 100.0, "2": 190.0, "4": 200.0}
        return {"case": name, "rates": rates, "default_over_best": default / 200.0}

    return {
        "cases": [case("npy", 195.0), case("latency", 180.0)],
        "targets": [["npy: default / best fixed", 0.975, 0.9]],
        "machine": MACHINE,
        "command": "bench_autotune.py --quick --cases npy,latency --json out.json",
    }


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))


def test_figures_from_a_small_results_tree(plot: ModuleType, tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "figures"
    write(results / "test-2-cores" / "feed.json", scaling_report(["feed"], ["npy", "gather"]))
    write(results / "test-2-cores" / "tfdata.json", scaling_report(["tfdata"], ["npy", "floor"]))
    write(results / "test-2-cores" / "peers.json", peers_report())
    (results / "test-2-cores" / "notes.json").write_text("{}")  # not a benchmark's: ignored

    written = plot.draw(results, out)
    # No neighbour results: that figure is left out, not drawn empty.
    assert sorted(p.name for p in written) == ["peers-test-2-cores.png", "scaling-test-2-cores.png"]
    for path in written:
        assert path.read_bytes().startswith(PNG) and path.stat().st_size > 10_000

    write(results / "test-2-cores" / "neighbour.json", neighbour_report())
    assert "neighbour-test-2-cores.png" in {p.name for p in plot.draw(results, out)}
    write(results / "test-2-cores" / "autotune.json", autotune_report())
    assert "autotune-test-2-cores.png" in {p.name for p in plot.draw(results, out)}


def test_each_figure_names_its_command(plot: ModuleType) -> None:
    config = scaling_report(["feed"], ["npy", "gather"])["config"]
    assert plot.scaling_command(config) == (
        "python benchmarks/bench_scaling.py --quick --levels feed --shapes S,L --reps 2 "
        "--seconds 0.2 --cases gather,npy"
    )
    every = {**config, "quick": False, "rows_scale": 1.0}
    every["cases"] = ["npy", "ram", "h5", "h5lzf", "h5gzip", "zarr", "zarrconv", "h5conv"]
    every["cases"] += ["gather", "slab", "floor", "fts", "busy"]  # bench_scaling's default
    assert plot.scaling_command(every) == (
        "python benchmarks/bench_scaling.py --levels feed --shapes S,L --reps 2 --seconds 0.2"
    )
    assert plot.peers_command(peers_report()["config"]) == (
        "python benchmarks/bench_peers.py --quick "
        "--cases arrayfeed-batches,arrayfeed-from-arrays,pydataset,torch"
    )
    ratios = plot.neighbour_ratios(neighbour_report())
    assert sorted(ratios) == ["npy|batches|default", "npy|batches|threads"]
    assert ratios["npy|batches|default"] == pytest.approx([190 / 199, 196 / 199])


@pytest.mark.slow
def test_the_committed_figures_are_drawn_from_the_committed_results(
    plot: ModuleType, tmp_path: Path
) -> None:
    written = plot.draw(BENCHMARKS / "results", tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted(p.name for p in FIGURES.glob("*.png")), (
        "run `python benchmarks/plot_figures.py` and commit docs/figures/"
    )
    page = (REPO_ROOT / "docs" / "performance.md").read_text()
    for name in names:
        assert f"figures/{name}" in page, f"docs/performance.md does not show {name}"
