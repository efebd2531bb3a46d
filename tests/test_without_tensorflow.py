"""A plain install, without TensorFlow: NumPy batches, loaders, convert, inspect, verify and
bench work; ``from_arrays`` and the Keras helpers raise a named error with the install command.

Each case runs in a fresh interpreter in which TensorFlow and Keras cannot be imported (an import
hook refuses them, as in an environment without them); CI also runs this module in a virtual
environment with the plain install, where they are not there at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO_ROOT

_WITHOUT = """
    import importlib.abc, sys

    class NoTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("tensorflow", "keras", "tf_keras"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTensorFlow())
"""


def _run(body: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(_WITHOUT) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )


_NUMPY_PATH = """
    import json, sys
    import numpy as np
    import arrayfeed as af

    root = sys.argv[1]
    rows = np.arange(1000 * 4, dtype=np.float32).reshape(1000, 4)
    np.save(f"{root}/x.npy", rows)
    np.save(f"{root}/y.npy", np.arange(1000))
    af.convert({"x": f"{root}/x.npy", "y": f"{root}/y.npy"}, f"{root}/d.zarr", progress=False)
    seen = {}
    for name, x, y, processes in [
        ("npy-loader", f"{root}/x.npy", f"{root}/y.npy", 1),
        ("zarr-here", f"{root}/d.zarr:x", f"{root}/d.zarr:y", 0),
    ]:
        b = af.batches(x, y, batch_size=64, seed=0, shuffle="block", processes=processes)
        ys = np.concatenate([yb for xb, yb in b])
        assert sorted(ys.tolist()) == list(range(1000)), name
        seen[name] = len(b)
    report = af.verify(f"{root}/d.zarr")  # (raises on a store that does not check out)
    assert report.rows == 1000 and set(report.arrays) == {"x", "y"}, report
    print(json.dumps({
        "seen": seen,
        "inspected": str(af.inspect(f"{root}/d.zarr")).count("\\n") > 0,
        "tensorflow": [m for m in sys.modules if m.partition(".")[0] in ("tensorflow", "keras")],
    }))
"""


def test_numpy_batches_loaders_convert_and_verify_need_no_tensorflow(tmp_path: Path) -> None:
    done = _run(_NUMPY_PATH, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result == {
        "seen": {"npy-loader": 16, "zarr-here": 16},
        "inspected": True,
        "tensorflow": [],
    }


@pytest.mark.parametrize(
    "name", ["from_arrays", "distribute", "distributed_steps", "ResumeCallback", "DataWait"]
)
def test_what_needs_tensorflow_says_how_to_install_it(name: str) -> None:
    done = _run(
        f"""
        import arrayfeed as af
        needs = af.{name}  # (reachable: `from arrayfeed import *` works without TensorFlow)
        try:
            needs(None)
        except af.ExtraNotInstalledError as exc:
            assert isinstance(exc, ImportError)
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stdout.strip()
    assert said.startswith(f"`arrayfeed.{name}` needs TensorFlow"), said
    assert "python -m pip install 'arrayfeed[tensorflow]'" in said, said


def test_the_command_line_prints_no_tensorflow_log_lines(tmp_path: Path) -> None:
    """``arrayfeed bench`` reads NumPy batches: TensorFlow is never imported, so none of its
    start-up lines (absl, oneDNN, CUDA) reach the terminal, here or where it is installed."""
    np.save(tmp_path / "x.npy", np.zeros((3000, 8), np.float32))
    done = subprocess.run(
        [sys.executable, "-m", "arrayfeed", "bench", str(tmp_path / "x.npy"), "--seconds", "0.3"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batches(shuffle='full')" in done.stdout
    for noise in ("absl", "oneDNN", "cuda", "tensorflow", "I0000", "W0000", "E0000"):
        assert noise not in done.stderr and noise not in done.stdout, (noise, done.stderr)
