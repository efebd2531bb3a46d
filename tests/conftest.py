"""Shared fixtures: small real files for every backend, written under ``tmp_path``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# A suite started in the background of a shell without job control (`cmd &`, nohup, some CI
# runners) inherits Ctrl-C ignored, and Python then raises no KeyboardInterrupt, here or in the
# processes the tests start: the tests of Ctrl-C need it as a terminal delivers it. (A handler
# set here is reset to the default in every child on exec.)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed._pipeline.tune.machine import usable_cores

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: absent without it)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: a worker per usable core, at most 4. Most tests wait on other processes
    (training jobs, servers, loaders) and pass beside a busy neighbour; beyond 4, each worker's
    TensorFlow and JAX cost more memory than the wall time they save."""
    return min(4, usable_cores())


#: Backend name -> writer(tmp_path, name, array) returning what a user passes to from_arrays.
Writer = Callable[[Path, str, np.ndarray], object]


def _ndarray(tmp: Path, name: str, a: np.ndarray) -> object:
    return a.copy()


def _memmap(tmp: Path, name: str, a: np.ndarray) -> object:
    path = tmp / f"{name}.mm.npy"
    np.save(path, a)
    return np.load(path, mmap_mode="r")


def _npy_path(tmp: Path, name: str, a: np.ndarray) -> object:
    path = tmp / f"{name}.npy"
    np.save(path, a)
    return str(path)


def _hdf5(tmp: Path, name: str, a: np.ndarray) -> object:
    path = tmp / f"{name}.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(f"group/{name}", data=a, chunks=(max(1, min(len(a), 7)), *a.shape[1:]))
    return h5py.File(path, "r")[f"group/{name}"]


def _zarr(tmp: Path, name: str, a: np.ndarray) -> object:
    z = zarr.create_array(
        tmp / f"{name}.zarr", shape=a.shape, dtype=a.dtype, chunks=(5, *a.shape[1:])
    )
    z[...] = a
    return zarr.open_array(tmp / f"{name}.zarr", mode="r")


def _open_array(tmp: Path, name: str, a: np.ndarray) -> object:
    path = tmp / f"{name}.oa.h5"
    with h5py.File(path, "w") as f:
        f[f"d/{name}"] = a
    return af.open_array(path, key=f"d/{name}")


BACKENDS: dict[str, Writer] = {
    "ndarray": _ndarray,
    "memmap": _memmap,
    "npy_path": _npy_path,
    "hdf5": _hdf5,
    "zarr": _zarr,
    "open_array": _open_array,
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str, np.ndarray], object]:
    """``write(backend, name, array)`` stores ``array`` with that backend and returns the leaf."""

    def _write(backend: str, name: str, array: np.ndarray) -> object:
        return BACKENDS[backend](tmp_path, name, array)

    return _write


def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes that must import this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_benchmark(
    script: str, args: list[str], scratch: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``benchmarks/<script> args`` run in a child process of this checkout, output captured,
    its temporary files under ``scratch`` (made here; the benchmark must leave it empty)."""
    scratch.mkdir()
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        env={**subprocess_env(), "TMPDIR": str(scratch)},
        timeout=timeout,
    )
