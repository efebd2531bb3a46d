"""The elastic-resume benchmark runs end to end in a small configuration (no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_benchmark


@pytest.mark.slow
def test_quick_run_prints_the_tables(tmp_path: Path) -> None:
    out = tmp_path / "resume.json"
    args = [
        "--rows",
        "200000",
        "--store-rows",
        "60000",
        "--row-bytes",
        "64",
        "--reps",
        "1",
        "--first-reps",
        "1",
    ]
    done = run_benchmark(
        "bench_resume.py", [*args, "--json", str(out)], tmp_path / "tmp", timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "| shuffle | fresh start s | resume=state s |" in done.stdout
    assert "| 3 workers (re-dealt) |" in done.stdout
    result = json.loads(out.read_text())
    assert set(result["first_batch"]) == {"True", "False", "block"}
    assert result["read_per_row"]["4->3"]["redealt"] >= 1.0
    assert not any((tmp_path / "tmp").iterdir())
