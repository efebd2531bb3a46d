"""What ``pip install .`` installs: every package and module under ``arrayfeed/``.

A subpackage left out of the build configuration still imports in an editable install, which
reads the source tree, and is missing from the wheel. The fast test applies the configuration in
``pyproject.toml`` (setuptools' package discovery, or a list of packages) to the source tree; the
slow one builds the wheel and looks inside.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "arrayfeed"


def _packages_in_tree() -> set[str]:
    """Every directory under ``arrayfeed/`` that holds an ``__init__.py``, as a package name."""
    return {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}


def _modules_in_tree() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".typed")
    }


def test_every_directory_of_python_modules_is_a_package() -> None:
    """A directory of modules without ``__init__.py`` would be left out by package discovery."""
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" not in path.parts:
            assert (path.parent / "__init__.py").exists(), f"{path.parent} has no __init__.py"


def test_the_build_configuration_takes_every_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = config.get("packages")
    if isinstance(packages, list):  # listed by name: every one must be
        built = set(packages)
    else:
        find = (packages or {}).get("find", {})
        built = set(
            setuptools.find_packages(
                where=str(ROOT / find.get("where", ["."])[0]),
                include=find.get("include", ["*"]),
                exclude=find.get("exclude", []),
            )
        )
    assert built >= _packages_in_tree(), f"left out: {sorted(_packages_in_tree() - built)}"
    assert built <= _packages_in_tree() | {"arrayfeed"}, f"not ours: {sorted(built)}"
    assert "py.typed" in config["package-data"]["arrayfeed"]


@pytest.mark.slow
def test_the_wheel_holds_every_module(tmp_path: Path) -> None:
    """``pip wheel`` of a copy of the source tree (what a clean clone builds)."""
    source = tmp_path / "src"
    source.mkdir()
    shutil.copytree(PACKAGE, source / "arrayfeed", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path)]
    built = subprocess.run([*command, str(source)], capture_output=True, text=True, timeout=600)
    if built.returncode != 0:  # no package index here: build with what is installed
        built = subprocess.run(
            [*command, "--no-build-isolation", str(source)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    if built.returncode != 0:
        pytest.skip(f"no wheel can be built here: {built.stderr.strip().splitlines()[-1:]}")
    (wheel,) = tmp_path.glob("arrayfeed-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = {n for n in archive.namelist() if n.startswith("arrayfeed/")}
    assert _modules_in_tree() <= names, f"missing: {sorted(_modules_in_tree() - names)}"
