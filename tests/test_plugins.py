"""Formats from other packages: a backend declared in the entry point group ``arrayfeed.backends``.

Real packages are built and installed (``pip install --target``) into a folder that child
interpreters put on ``PYTHONPATH``, so their entry points are found the way an installed
plugin's are: ``tinyfmt`` adds a toy format (``.tiny``: a 16-byte header, then raw little-endian
rows) with the public :class:`arrayfeed.storage.Backend`; ``badfmt`` declares the entry points a
broken package might (one that raises on import, one naming no backend, one taking a built-in
name), none of which may stop the built-in formats from opening.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arrayfeed._storage import registry

from .conftest import subprocess_env

pytestmark = pytest.mark.slow  # builds packages with pip, runs children

TINYFMT = '''
"""A toy format: the header b"TINY", rows and columns (uint32), the dtype's str (4 bytes), then
the rows, little-endian."""

import os
import struct
from pathlib import Path

import numpy as np

import arrayfeed as af
from arrayfeed.storage import ArrayLayout, Backend, Portability, StoreInfo

MAGIC = b"TINY"
HEADER = 16


def write(path, data):
    data = np.ascontiguousarray(data, dtype=np.dtype(data.dtype).newbyteorder("<"))
    head = MAGIC + struct.pack("<II", *data.shape) + data.dtype.str.encode().ljust(4)
    Path(path).write_bytes(head + data.tobytes())


class TinySource:
    def __init__(self, path):
        head = Path(path).read_bytes()[:HEADER]
        if head[:4] != MAGIC:
            raise af.CorruptDataError(f"'{path}' is not a .tiny file (no TINY header).")
        rows, cols = struct.unpack("<II", head[4:12])
        self.path, self.shape = str(path), (rows, cols)
        self.dtype = np.dtype(head[12:].decode().strip())
        self._rows = None  # mapped on the first read, in each process

    def __len__(self):
        return self.shape[0]

    def read(self, indices):
        if os.environ.get("TINYFMT_LOG"):  # which process reads (the test asks)
            with open(os.environ["TINYFMT_LOG"], "a") as log:
                log.write(f"{os.getpid()} {len(indices)}\\n")
        if self._rows is None:
            self._rows = np.memmap(self.path, self.dtype, "r", HEADER, self.shape)
        return np.asarray(self._rows[indices]).astype(self.dtype.newbyteorder("="))


class PortableTinySource(TinySource):
    def portability(self):
        return Portability("reopen")  # a copy maps the same file again

    def __getstate__(self):
        return {**self.__dict__, "_rows": None}  # the path travels, not the map


class TinyBackend(Backend):
    name = "tiny"
    label = ".tiny"
    order = 45
    suffixes = frozenset({".tiny"})

    def open(self, location, key, options):
        if key is not None:
            raise af.SourceNotFoundError(f"'{location}' holds one array; drop `key`.")
        if os.environ.get("TINYFMT_STAYS"):  # the test asks for a source without Portable
            return TinySource(location)
        return PortableTinySource(location)

    def describe(self, location):
        source = TinySource(location)
        layout = ArrayLayout(name="", shape=source.shape, dtype=source.dtype, chunks=None)
        return StoreInfo(format=".tiny", arrays=(layout,), specs={"": str(location)})
'''

BADFMT = '''
from arrayfeed.storage import Backend


class Impostor(Backend):
    """Takes the name of a built-in format."""

    name, label, order = "npy", "impostor", 0


class Nameless(Backend):
    """Forgets its name."""

    label, order = "nameless", 50


def not_a_backend():
    pass
'''

BADFMT_BROKEN = 'raise RuntimeError("badfmt_broken needs libbad.so, which is not installed")\n'


def _project(name: str, modules: list[str], entry_points: dict[str, str]) -> str:
    lines = "\n".join(f'{key} = "{value}"' for key, value in entry_points.items())
    return (
        textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "0.1"

        [tool.setuptools]
        py-modules = {json.dumps(modules)}

        [project.entry-points."arrayfeed.backends"]
        """)
        + lines
        + "\n"
    )


def _install(root: Path, name: str, modules: dict[str, str], entry_points: dict[str, str]) -> Path:
    """``name`` built from ``modules`` and installed alone into ``root/site``."""
    package = root / name
    package.mkdir()
    for module, text in modules.items():
        (package / f"{module}.py").write_text(textwrap.dedent(text).lstrip())
    (package / "pyproject.toml").write_text(_project(name, list(modules), entry_points))
    site = root / f"{name}-site"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--no-build-isolation", "--no-index", "--target", str(site), str(package)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return site


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plugins")
    return {
        "tiny": _install(root, "tinyfmt", {"tinyfmt": TINYFMT}, {"tiny": "tinyfmt:TinyBackend"}),
        "bad": _install(
            root,
            "badfmt",
            {"badfmt": BADFMT, "badfmt_broken": BADFMT_BROKEN},
            {
                "broken": "badfmt_broken:Backend",
                "impostor": "badfmt:Impostor",
                "nameless": "badfmt:Nameless",
                "nothing": "badfmt:not_a_backend",
            },
        ),
    }


def _run(script: str, sites: list[Path], *args: str, **env: str) -> Any:
    """What ``script`` prints last (JSON), run in a child with ``sites`` on its path."""
    environ = subprocess_env()
    environ["PYTHONPATH"] = ":".join([*map(str, sites), environ["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_READ_TINY = """
import json, os, sys, warnings
warnings.simplefilter("error", RuntimeWarning)  # a working plugin gives no PluginWarning
import numpy as np
import arrayfeed as af
from arrayfeed._storage import describe, registry
import tinyfmt

root = sys.argv[1]
data = np.arange(41 * 3, dtype=np.float32).reshape(41, 3) - 20.5
tinyfmt.write(f"{root}/d.tiny", data)
source = af.open_array(f"{root}/d.tiny")
seen = {
    "formats": [b.name for b in registry.backends()],
    "source": type(source).__name__,
    "describe": describe(f"{root}/d.tiny").format,
    "read": source.read(np.array([0, 7, 40])).tolist() == data[[0, 7, 40]].tolist(),
}
log = os.environ["TINYFMT_LOG"]
for processes in (0, 1):
    open(log, "w").close()
    spec = f"{root}/d.tiny"
    inorder = list(af.batches(spec, batch_size=8, shuffle=False, processes=processes))
    shuffled = np.concatenate(list(af.batches(spec, batch_size=8, seed=1, processes=processes)))
    seen[f"processes={processes}"] = {
        "in order": np.concatenate(inorder).tobytes() == data.tobytes(),
        "batches": [len(b) for b in inorder],
        "shuffled": sorted(map(tuple, shuffled.tolist())) == sorted(map(tuple, data.tolist())),
        "order moved": shuffled.tobytes() != data.tobytes(),
        "rows a loader read": sum(
            int(rows) for pid, rows in map(str.split, open(log)) if int(pid) != os.getpid()
        ),
    }

# A plugin's source without Portable (arrayfeed.storage) cannot be sent to a loader:
os.environ["TINYFMT_STAYS"] = "1"
try:
    af.batches(f"{root}/d.tiny", batch_size=8, processes=1)
except af.ConfigError as exc:
    seen["not portable, processes=1"] = str(exc)
rows = np.concatenate(list(af.batches(f"{root}/d.tiny", batch_size=8, shuffle=False)))
seen["not portable, processes=None"] = rows.tobytes() == data.tobytes()

# A file no format reads: the error names the installed formats too.
open(f"{root}/junk.bin", "wb").write(b"neither")
try:
    af.open_array(f"{root}/junk.bin")
except af.SourceNotFoundError as exc:
    seen["unknown file"] = str(exc).replace(root, "ROOT")
print(json.dumps(seen))
"""


def test_a_format_from_another_package(sites: dict[str, Path], tmp_path: Path) -> None:
    """The entry point registers ``tiny`` beside the built-in formats; its files open, are
    described, and are read by ``batches`` here (``processes=0``) and in a loader process
    (``processes=1``: the source is ``Portable``, so a pickled copy maps the file there)."""
    log = str(tmp_path / "reads.log")
    seen = _run(_READ_TINY, [sites["tiny"]], str(tmp_path), TINYFMT_LOG=log)
    assert seen.pop("formats") == ["sparse", "zarr", "hdf5", "lazy", "tiny", "npy"]
    assert seen.pop("not portable, processes=1") == (
        "`processes=1` reads in loader processes, but `x` cannot be read from another "
        "process: a TinySource, which does not say how it can be read elsewhere (a format's "
        "source says it with arrayfeed.storage.Portable). Pass it as a path (or open its file "
        "read-only), or pass `processes=0` to read it in this process."
    )
    batches = [8, 8, 8, 8, 8, 1]
    assert seen == {
        "source": "PortableTinySource",
        "describe": ".tiny",
        "read": True,
        "processes=0": {
            "in order": True,
            "batches": batches,
            "shuffled": True,
            "order moved": True,
            "rows a loader read": 0,
        },
        "processes=1": {
            "in order": True,
            "batches": batches,
            "shuffled": True,
            "order moved": True,
            "rows a loader read": 2 * 41,  # every row of both epochs (a probe reads here)
        },
        "not portable, processes=None": True,  # read in this process
        "unknown file": "'ROOT/junk.bin' is not a .npy, .npz, HDF5 file or Zarr store (or, "
        "from installed packages, .tiny); convert it with `arrayfeed convert`.",
    }


_CONFORMANCE = """
import numpy as np
import arrayfeed as af
import tinyfmt
from arrayfeed.testing import SourceTests


class TestTiny(SourceTests):
    dtypes = ("float32", "int64", "uint8")
    row_shapes = ((3,),)

    def make_source(self, data, tmp_path):
        tinyfmt.write(tmp_path / "d.tiny", data)
        return af.open_array(tmp_path / "d.tiny")
"""


def test_the_plugin_passes_the_conformance_suite(sites: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent(_CONFORMANCE))
    script = """
    import json, sys
    import pytest
    code = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", sys.argv[1], sys.argv[1]])
    print(json.dumps(int(code)))
    """
    assert _run(script, [sites["tiny"]], str(tmp_path)) == 0


_BROKEN = """
import json, sys, warnings
import numpy as np
import arrayfeed as af
from arrayfeed._storage import registry
from arrayfeed.storage import PluginWarning

root = sys.argv[1]
np.save(f"{root}/x.npy", np.arange(6).reshape(3, 2))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    formats = [b.name for b in registry.backends()]
    rows = af.open_array(f"{root}/x.npy").read(np.arange(3)).tolist()
print(json.dumps({
    "formats": formats,
    "npy backend": type(registry.backends()[-1]).__name__,
    "rows": rows,
    "warnings": sorted(
        [w.category.__name__, str(w.message)] for w in caught
        if issubclass(w.category, PluginWarning)
    ),
    "other warnings": [str(w.message) for w in caught if not issubclass(w.category, PluginWarning)],
}))
"""


def test_a_broken_plugin_warns_and_the_built_in_formats_open(
    sites: dict[str, Path], tmp_path: Path
) -> None:
    seen = _run(_BROKEN, [sites["bad"], sites["tiny"]], str(tmp_path))
    assert seen["formats"] == ["sparse", "zarr", "hdf5", "lazy", "tiny", "npy"]
    assert seen["npy backend"] == "NpyBackend"  # the built-in keeps its name
    assert seen["rows"] == [[0, 1], [2, 3], [4, 5]]
    assert seen["other warnings"] == []
    messages = [message for category, message in seen["warnings"]]
    assert {category for category, message in seen["warnings"]} == {"PluginWarning"}
    start = "The storage backend entry point {} of the package badfmt in the group "
    start += "'arrayfeed.backends' "
    tail = "; every other format still opens. {}, or uninstall the package if its format is not "
    tail += "needed."
    assert messages == [
        start.format("'broken' (badfmt_broken:Backend)")
        + "failed to load (RuntimeError: badfmt_broken needs libbad.so, which is not installed)"
        + tail.format("Fix that error in the package"),
        start.format("'impostor' (badfmt:Impostor)")
        + "registers a backend named 'npy', which NpyBackend() already is; the entry point is "
        "not used" + tail.format("Give the package's Backend another `name`"),
        start.format("'nameless' (badfmt:Nameless)")
        + "names Nameless, whose name=None is not what a Backend sets"
        + tail.format("Set its class attributes `name` and `label` (str) and `order` (int)"),
        start.format("'nothing' (badfmt:not_a_backend)")
        + "names a function, which is neither a subclass nor an instance of "
        "arrayfeed.storage.Backend"
        + tail.format("Make the entry point name the package's Backend subclass"),
    ]


@pytest.fixture
def no_plugins_yet() -> Iterator[None]:
    """The registry as before its first listing (the subpackages imported), restored after."""
    registry.backends()  # a subpackage registers once, when imported: import them all first
    saved = dict(registry._REGISTERED), list(registry._PLUGINS_ASKED)
    registry._PLUGINS_ASKED.clear()
    registry._ORDERED.clear()
    try:
        yield
    finally:
        registry._REGISTERED.clear()
        registry._REGISTERED.update(saved[0])
        registry._PLUGINS_ASKED[:] = saved[1]
        registry._ORDERED.clear()


def test_entry_points_are_read_once_after_the_built_in_formats(
    no_plugins_yet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str | None] = []

    def entry_points(*, group: str | None = None) -> list[Any]:
        asked.append(group)
        return []

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", entry_points)
    registry.backends()
    registry.unregister("nothing")  # a later change of the registry lists it again
    registry.backends()
    assert asked == ["arrayfeed.backends"]
