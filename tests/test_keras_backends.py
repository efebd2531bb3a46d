"""Every Keras backend sees the same stream: Keras epoch ``k`` trains on arrayfeed epoch ``k``.

Keras picks its backend at import, so each backend runs tests/keras_backend_job.py in a fresh
process. Before training an unbuilt model, Keras (JAX and torch backends; TensorFlow under a
distribution strategy, see test_distribute.py) iterates the dataset once to look at one batch;
arrayfeed gives that pass's epoch back, so the epochs trained on are 0, 1, 2 on every backend.
On JAX and torch, Keras takes a dataset's NumPy batches directly, not through tf.data, unless the
dataset was derived from the one ``from_arrays`` returned.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import subprocess_env

JOB = Path(__file__).with_name("keras_backend_job.py")
EPOCHS, ROWS = 3, 60

BACKENDS = [
    "tensorflow",
    "jax",
    pytest.param(
        "torch",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("torch") is None,
            reason="torch is not installed (its wheel from the package index brings GBs of CUDA)",
        ),
    ),
]


def _run(backend: str, tmp_path: Path, where: str = "threads") -> dict[str, Any]:
    env = subprocess_env()
    env["KERAS_BACKEND"] = backend
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, str(JOB), where],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    assert result["backend"] == backend
    return result


def _check_epochs(run: dict[str, Any], epochs: list[int]) -> None:
    seen, stream = run["seen"], run["stream"]
    assert sorted(int(k) for k in seen) == epochs
    for epoch in epochs:
        batches = seen[str(epoch)]
        assert sorted(i for batch in batches for i in batch) == list(range(ROWS))  # exactly once
        assert batches == stream[str(epoch)], f"Keras epoch {epoch} trained on another epoch"
    assert stream["0"] != stream["1"]  # epochs differ, so the order check means something
    assert run["next_position"] == [EPOCHS, 0]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["threads", "loader"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_keras_epoch_k_trains_on_arrayfeed_epoch_k(
    backend: str, where: str, tmp_path: Path
) -> None:
    result = _run(backend, tmp_path, where)
    assert result["processes"] == (where == "loader")
    _check_epochs(result["plain"], [0, 1, 2])
    _check_epochs(result["validated"], [0, 1, 2])  # validation data: another dataset
    _check_epochs(result["resumed"], [1, 2])  # fit(initial_epoch=1) with ResumeCallback
    _check_epochs(result["derived"], [0, 1, 2])  # from_arrays(...).map(...)
    # Which way the batches came: tf.data's generator began no epoch of the dataset as
    # from_arrays returned it, except on TensorFlow (Keras' look at one batch included).
    for scenario in ("plain", "validated", "resumed"):
        pulls = result[scenario]["tf_data_pulls"]
        assert (pulls > 0) if backend == "tensorflow" else (pulls == 0), (scenario, pulls)
    assert result["derived"]["tf_data_pulls"] >= 3  # a derived dataset goes through tf.data
    # DataWait puts the share of each epoch spent waiting for data in fit's History.
    for scenario, epochs in (("plain", 3), ("validated", 3), ("resumed", 2), ("derived", 3)):
        waits = result[scenario]["data_wait"]
        assert waits is not None and len(waits) == epochs, (scenario, waits)
        assert all(0.0 <= w <= 1.0 for w in waits), (scenario, waits)
