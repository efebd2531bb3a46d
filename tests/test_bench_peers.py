"""The peers benchmark runs end to end in its smallest configuration (no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_benchmark


@pytest.mark.slow
def test_quick_run_prints_the_peers_table(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    scratch = tmp_path / "tmp"  # where the benchmark makes (and must remove) its data
    done = run_benchmark(
        "bench_peers.py",
        [
            "--quick",
            "--seconds",
            "0.2",
            "--reps",
            "1",
            "--cases",
            "arrayfeed-batches,generator",
            "--json",
            str(out),
        ],
        scratch,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "| pipeline | level | S rows/s | S vs arrayfeed | L rows/s | L vs arrayfeed |" in (
        done.stdout
    )
    assert "| arrayfeed.batches | NumPy |" in done.stdout
    # The hand-written generator is measured with TensorFlow, and skipped with a note without.
    assert (
        "| from_generator (hand-written) | tf.data |" in done.stdout
        or "generator: tensorflow not installed" in done.stdout
    )

    report = json.loads(out.read_text())
    figures = {(f["shape"], f["case"]): f for f in report["figures"]}
    for shape in ("S", "L"):
        ours = figures[(shape, "arrayfeed.batches")]
        assert len(ours["rates"]) == 1 and ours["median"] > 0
    assert not any(scratch.iterdir())
