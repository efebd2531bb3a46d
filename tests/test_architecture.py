"""The package layout's rules, checked on the source: who may import what.

- ``h5py``, ``zarr``, ``numcodecs`` and the object-storage clients (``fsspec``, ``s3fs``) are
  imported only inside ``arrayfeed/_storage`` (its format subpackages and ``remote``);
- TensorFlow and Keras only in the tf.data glue and the Keras / tf.distribute helpers;
- code outside the storage layer imports it only through ``arrayfeed._storage`` (its public
  functions and capability protocols) and never names a concrete source class;
- ``arrayfeed.storage`` (what a format's author uses) only re-exports names of
  ``arrayfeed._storage``, and no public name is both there and at the top level;
- every subpackage of ``arrayfeed._storage`` but ``remote`` (object storage, used by every
  format) is a format family that registers exactly one backend, and each has test modules of
  its own (``tests/test_<family>*.py``);
- the tuner is pure logic (the standard library only);
- ``arrayfeed._pipeline`` is in rooms by stage, each importing only the rooms below it: the
  entry points (``api``) over the loader processes (``loader``) over reading (``read``) over
  planning the epoch (``plan``) and tuning (``tune``), which import neither each other nor
  anything above;
- no import cycles between arrayfeed's modules (imports made only for type checking count),
  and no module over 500 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "arrayfeed"
TESTS = Path(__file__).resolve().parent
STORAGE = PACKAGE / "_storage"
#: Subpackages of the storage layer that are not a format family.
NOT_FORMATS = {"remote"}
STORAGE_ONLY = {"h5py", "zarr", "numcodecs", "fsspec", "s3fs", "gcsfs", "adlfs", "aiohttp"}
TF_MODULES = {
    "arrayfeed._pipeline.api.dataset",
    "arrayfeed._pipeline.api.keras",
    "arrayfeed._pipeline.api.distribute",
}
CONCRETE_SOURCES = {
    "ArraySource",
    "MappedSource",
    "NpySource",
    "NpzMemberSource",
    "H5Source",
    "H5ContiguousSource",
    "CFSource",
    "ChunkFile",
    "ZarrSource",
    "ChunkReader",
    "CSRSource",
    "CSRGatherSource",
    "DaskSource",
    "XarraySource",
    "RemoteH5Source",
    "RemoteNpySource",
}
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(module: str) -> Iterator[tuple[str, list[str], int]]:
    """``(imported module, names, line)`` of every import in ``module``, those made only for
    type checking included (a cycle through them is a cycle of concepts all the same)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):  # (imports for type checking too: they are dependencies)
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, names, node.lineno


def _resolve(target: str, names: list[str]) -> list[str]:
    """The arrayfeed modules an import statement loads (``from pkg import mod`` loads ``mod``)."""
    loaded = [target] if target in MODULES else []
    loaded += [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
    return loaded


def test_the_layout_has_the_three_parts() -> None:
    for part in ("_storage", "_pipeline", "_conversion"):
        assert f"arrayfeed.{part}" in MODULES
    for fmt in ("npy", "hdf5", "zarr", "sparse", "lazy"):
        assert f"arrayfeed._storage.{fmt}" in MODULES


def _subpackages() -> list[Path]:
    return sorted(p.parent for p in STORAGE.glob("*/__init__.py"))


def _registrations(package: Path) -> list[int]:
    """Lines of the package's modules that call ``register(...)`` (not ``atexit.register``)."""
    lines = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                owner = getattr(getattr(func, "value", None), "id", None)
                if name == "register" and owner != "atexit":
                    lines.append(node.lineno)
    return lines


def _backend_classes(package: Path) -> list[str]:
    """Classes of the package whose bases name ``Backend``."""
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "Backend")
                or (isinstance(b, ast.Attribute) and b.attr == "Backend")
                for b in node.bases
            ):
                found.append(f"{path.name}:{node.name}")
    return found


@pytest.mark.parametrize("package", _subpackages(), ids=lambda p: p.name)
def test_every_format_subpackage_registers_exactly_one_backend(package: Path) -> None:
    registrations, classes = _registrations(package), _backend_classes(package)
    if package.name in NOT_FORMATS:
        assert not registrations and not classes, f"{package.name} is not a format"
        return
    assert len(classes) == 1, f"{package.name} defines backends {classes}; one per family"
    assert len(registrations) == 1, f"{package.name} registers {len(registrations)} backends"
    assert "register(" in (package / "__init__.py").read_text(), "register in its __init__"
    assert ast.get_docstring(ast.parse((package / "__init__.py").read_text())), (
        f"{package.name}/__init__.py must say what is in it"
    )


@pytest.mark.parametrize(
    "module", ["arrayfeed._storage.open", "arrayfeed._storage.specs", "arrayfeed._storage.registry"]
)
def test_the_entry_points_name_no_format(module: str) -> None:
    """The loops over the registry import no format family: a new format touches none of them."""
    families = {f"arrayfeed._storage.{p.name}" for p in _subpackages()} - {
        f"arrayfeed._storage.{n}" for n in NOT_FORMATS
    }
    for target, names, line in _imports(module):
        for dep in _resolve(target, names):
            family = next((f for f in families if dep == f or dep.startswith(f + ".")), None)
            assert family is None, f"{module}:{line} imports {dep}"
        assert target.split(".")[0] not in STORAGE_ONLY, f"{module}:{line} imports {target}"


@pytest.mark.parametrize("package", _subpackages(), ids=lambda p: p.name)
def test_every_storage_subpackage_has_test_modules_of_its_own(package: Path) -> None:
    assert sorted(TESTS.glob(f"test_{package.name}*.py")), f"no tests/test_{package.name}*.py"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_storage_libraries_only_in_the_storage_layer(module: str) -> None:
    if module.startswith("arrayfeed._storage"):
        return
    for target, _, line in _imports(module):
        assert target.split(".")[0] not in STORAGE_ONLY, f"{module}:{line} imports {target}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_tensorflow_only_in_the_glue(module: str) -> None:
    if module in TF_MODULES:
        return
    for target, _, line in _imports(module):
        assert target.split(".")[0] not in ("tensorflow", "keras"), (
            f"{module}:{line} imports {target}"
        )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_storage_reached_through_its_public_surface(module: str) -> None:
    if module.startswith("arrayfeed._storage"):
        return
    for target, names, line in _imports(module):
        if target.startswith("arrayfeed._storage."):
            pytest.fail(f"{module}:{line} imports {target}; import from arrayfeed._storage")
        if target == "arrayfeed._storage":
            named = CONCRETE_SOURCES.intersection(names)
            assert not named, f"{module}:{line} imports concrete source classes {named}"
    tree = ast.parse(MODULES[module].read_text())
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not CONCRETE_SOURCES & used, f"{module} names {CONCRETE_SOURCES & used}"


def test_the_storage_namespace_only_reexports_the_storage_layer() -> None:
    """``arrayfeed.storage`` names objects ``arrayfeed._storage`` defines, and defines none: a
    format's author and the storage layer see the same classes."""
    tree = ast.parse(MODULES["arrayfeed.storage"].read_text())
    imported: list[str] = []
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and (node.level, node.module) == (1, "_storage"):
            imported += [alias.asname or alias.name for alias in node.names]
        elif isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
            exported = ast.literal_eval(node.value)
        else:
            pytest.fail(f"arrayfeed/storage.py:{node.lineno} does more than re-export _storage")
    assert exported == sorted(imported), "__all__ is every name imported, sorted"


def test_a_public_name_has_one_home() -> None:
    """The top level keeps what a training script uses; a format's author imports from
    ``arrayfeed.storage``; no name is in both."""
    import arrayfeed
    import arrayfeed.storage

    for module in (arrayfeed, arrayfeed.storage):
        assert module.__all__ == sorted(module.__all__), module.__name__
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
    assert not set(arrayfeed.__all__) & set(arrayfeed.storage.__all__)


#: Modules of pure logic: the standard library only (no I/O libraries, no NumPy, no arrayfeed
#: but one another).
PURE_LOGIC = (
    "arrayfeed._pipeline.tune.tuning",
    "arrayfeed._pipeline.tune.model",
    "arrayfeed._pipeline.tune.windows",
    "arrayfeed._pipeline.tune.report",
)


@pytest.mark.parametrize("module", PURE_LOGIC)
def test_tuning_is_pure_logic(module: str) -> None:
    imported = {name for name, _, _ in _imports(module) if name not in PURE_LOGIC}
    assert {name.partition(".")[0] for name in imported} <= {
        "__future__",
        "threading",
        "time",
        "collections",
        "dataclasses",
        "enum",
        "math",
        "statistics",
    }, imported


def test_no_import_cycles() -> None:
    graph = {
        module: {dep for target, names, _ in _imports(module) for dep in _resolve(target, names)}
        - {module}
        for module in MODULES
    }
    # A package's __init__ importing its own submodules is not a cycle of the layering; a
    # submodule importing its parent package is (the parent imports the submodule back).
    for module, deps in graph.items():
        graph[module] = {d for d in deps if not module.startswith(d + ".")} | {
            d for d in deps if module.startswith(d + ".") and d == "arrayfeed"
        }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = [*stack[stack.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


#: The rooms of ``arrayfeed._pipeline``, by floor: a room imports only rooms on lower floors.
ROOMS = {"api": 3, "loader": 2, "read": 1, "plan": 0, "tune": 0}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["arrayfeed", "_pipeline"] or len(parts) < 3:
        return None
    return parts[2]


def test_the_pipeline_is_in_rooms() -> None:
    rooms = {r for m in MODULES if (r := _room(m)) is not None}
    assert rooms == set(ROOMS), rooms
    assert not [
        m
        for m in MODULES
        if m.count(".") == 2 and _room(m) and m not in (f"arrayfeed._pipeline.{r}" for r in ROOMS)
    ], "every module of _pipeline is in a room"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _room(m)))
def test_a_room_imports_only_the_rooms_below_it(module: str) -> None:
    here = _room(module)
    assert here is not None
    for target, names, line in _imports(module):
        for dep in _resolve(target, names):
            there = _room(dep)
            if there is None or there == here:
                continue
            assert ROOMS[there] < ROOMS[here], f"{module}:{line} imports {dep} ({there}/)"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by concept"


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The checks above parse imports correctly: relative imports resolve to real modules."""
    deps = {dep for t, n, _ in _imports("arrayfeed._pipeline.api.build") for dep in _resolve(t, n)}
    assert {"arrayfeed._storage", "arrayfeed._pipeline.plan.plan", "arrayfeed._errors"} <= deps
    deps = {t for t, _, _ in _imports("arrayfeed._storage.hdf5.source")}
    assert "h5py" in deps
