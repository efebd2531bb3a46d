"""The examples run as documented (each in well under a minute); the JAX and PyTorch ones when
that framework is installed (arrayfeed does not depend on either)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from arrayfeed._pipeline.plan.shard import ENV_VARIABLES

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_VARS = ENV_VARIABLES


def run_example(name: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_mirrored_example() -> None:
    out = run_example("mirrored.py")
    assert "2 replicas" in out or "GPU" in out
    assert re.search(r"custom loop: epoch 3, 313 steps \(distributed_steps=313\)", out), out
    assert "learned [ 1.  -2.   3.   0.5]" in out


@pytest.mark.slow
def test_multi_worker_example() -> None:
    out = run_example("multi_worker.py", "--workers", "2")
    # 10001 rows: worker 1's range has 5001 rows, one of which (a different one each epoch) is
    # left out so that both workers run 157 steps.
    shards = {0: r"0\.\.4999", 1: r"500[01]\.\.(9999|10000)"}
    for worker, ids in shards.items():
        for epoch in (1, 2, 3):
            line = rf"worker {worker}: epoch {epoch}: 157 steps, 5000 rows \(5000 distinct, "
            line += rf"ids {ids}\)"
            assert re.search(line, out), out
    assert "2 workers finished with exit codes [0, 0]" in out


@pytest.mark.slow
def test_jax_example() -> None:
    pytest.importorskip("jax", reason="JAX is not installed (pip install 'jax[cpu]')")
    out = run_example("jax_train.py")
    assert "20000 rows, 78 steps per epoch" in out, out
    for epoch in (1, 2, 3):
        assert re.search(rf"^epoch {epoch}: 78 steps, loss [0-9.]+, accuracy [0-9.]+", out, re.M)
    # The last checkpoint follows batch 59 of the third epoch (index 2): the stream continues
    # at step 60, 18 batches before that epoch ends.
    assert "last checkpoint: epoch 2, step 60; a restart from it trains the 18 remaining" in out


@pytest.mark.slow
def test_torch_example() -> None:
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    out = run_example("torch_train.py")
    assert "20000 rows, 79 steps per epoch" in out, out
    for epoch in (1, 2, 3):
        line = rf"^epoch {epoch}: 20000 rows, loss [0-9.]+, accuracy [0-9.]+, .* "
        assert re.search(line + rf"next position \({epoch}, 0\)$", out, re.M), out
