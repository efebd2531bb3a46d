"""The ``arrayfeed`` command line: arguments, one-line errors, interrupting a real conversion."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed._cli import main, parse_assignments
from arrayfeed._conversion.copy import TEST_HOOK_ENV
from arrayfeed.storage import written_by_arrayfeed

REPO = Path(__file__).resolve().parents[1]


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def read(path: Path, name: str) -> np.ndarray:
    if path.suffix == ".zarr":
        return np.asarray(zarr.open_group(str(path), mode="r")[name][:])
    with h5py.File(path, "r") as f:
        return np.asarray(f[name][:])


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """x.npy (100 x 3 float32), d.npz (x, y), in.h5 (g/x), parts/p0..p2.npy."""
    x = np.arange(300, dtype=np.float32).reshape(100, 3)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(100))
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["g/x"] = x
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    g.create_array("x", data=x, chunks=(10, 3))
    (tmp_path / "parts").mkdir()
    for i, (a, b) in enumerate([(0, 40), (40, 41), (41, 100)]):
        np.save(tmp_path / "parts" / f"p{i}.npy", x[a:b])
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_parse_assignments() -> None:
    assert parse_assignments(["x=a.npy"]) == {"x": "a.npy"}
    assert parse_assignments(["x=a=b.npy"]) == {"x": "a=b.npy"}  # split at the first '='
    assert parse_assignments(["x=a", "y=b", "x=c", "x=d"]) == {"x": ["a", "c", "d"], "y": "b"}
    for bad in ["a.npy", "=a.npy", "x="]:
        with pytest.raises(
            af.ConfigError, match=rf"'{bad}' is not NAME=PATH; write e.g. x=train.npy"
        ):
            parse_assignments([bad])


@pytest.mark.parametrize("output", ["out.h5", "out.zarr"])
def test_convert_every_path_form(
    capsys: pytest.CaptureFixture[str], data: Path, output: str
) -> None:
    out = data / output
    code, stdout, stderr = run(
        capsys,
        "convert",
        f"a={data}/x.npy",
        f"b={data}/d.npz:x",
        f"c={data}/in.h5:g/x",
        f"d={data}/in.zarr:x",
        f"e={data}/parts/*.npy",
        f"f={data}/parts/p0.npy",
        f"f={data}/parts/p1.npy",
        f"f={data}/parts/p2.npy",
        f"y={data}/d.npz:y",
        "-o",
        str(out),
        "--compression",
        "lzf",
        "--chunk-rows",
        "16",
    )
    assert (code, stderr) == (0, "")
    assert stdout.startswith(
        f"arrayfeed: wrote {out}: a, b, c, d, e, f, y (100 rows), chunks of 16 rows"
    )
    x = np.load(data / "x.npy")
    for name in "abcdef":
        assert np.array_equal(read(out, name), x)
    assert written_by_arrayfeed(out).chunk_rows == 16  # type: ignore[union-attr]


def test_convert_shuffle_and_quiet(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    out = data / "s.h5"
    argv = [
        "convert",
        f"x={data}/x.npy",
        f"y={data}/d.npz:y",
        "-o",
        str(out),
        "--shuffle",
        "--seed",
        "5",
        "-q",
    ]
    assert run(capsys, *argv) == (0, "", "")
    y = read(out, "y")
    assert sorted(y.tolist()) == list(range(100)) and np.array_equal(
        read(out, "x"), np.load(data / "x.npy")[y]
    )
    assert written_by_arrayfeed(out).shuffle_seed == 5  # type: ignore[union-attr]


def test_overwrite(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    out = str(data / "o.zarr")
    assert run(capsys, "convert", f"x={data}/x.npy", "-o", out, "-q")[0] == 0
    code, _, stderr = run(capsys, "convert", f"x={data}/d.npz:y", "-o", out, "-q")
    assert (
        code == 1 and "already exists; pass `overwrite=True` (command line: --overwrite)" in stderr
    )
    assert read(Path(out), "x").shape == (100, 3)
    assert run(capsys, "convert", f"x={data}/d.npz:y", "-o", out, "-q", "--overwrite")[0] == 0
    assert read(Path(out), "x").shape == (100,)


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["x={d}/missing.npy"],
            1,
            r"`inputs\['x'\]`: nothing at '.*missing.npy'; check the path\.",
        ),
        (["x={d}/d.npz:nope"], 1, r"has no array 'nope'; it holds \['x', 'y'\]"),
        (["x={d}/in.h5:nope"], 1, r"has no dataset 'nope'; its datasets are \['g/x'\]"),
        (["x={d}/in.zarr:nope"], 1, r"has no array 'nope'; its arrays are \['x'\]"),
        (["x={d}/nothing/*.npy"], 1, r"no file matches the pattern"),
        (
            ["x={d}/x.npy", "y={d}/parts/p0.npy"],
            1,
            r"`inputs\['y'\]` has 40 rows but `inputs\['x'\]` has 100",
        ),
        (["{d}/x.npy"], 1, r"'.*x.npy' is not NAME=PATH"),
        (["a b={d}/x.npy"], 1, r"the name 'a b', which cannot name an array"),
        (
            ["x={d}/x.npy", "--compression", "zip"],
            2,
            r"argument --compression: invalid choice: 'zip'",
        ),
        (["x={d}/x.npy", "--chunk-rows", "0"], 1, r"`chunk_rows` must be a positive int"),
        (
            ["x={d}/x.npy", "--chunk-rows", "ten"],
            2,
            r"argument --chunk-rows: invalid int value: 'ten'",
        ),
        (
            ["x={d}/x.npy", "--seed", "1"],
            1,
            r"`seed` \(1\) only applies with `shuffle=True` \(command line: --shuffle\)",
        ),
        (["x={d}/x.npy", "--bogus"], 2, r"unrecognized arguments: --bogus"),
    ],
)
def test_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], data: Path, argv: list[str], code: int, message: str
) -> None:
    before = listing(data)
    got, stdout, stderr = run(
        capsys, "convert", *[a.format(d=data) for a in argv], "-o", str(data / "o.h5")
    )
    assert got == code and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("arrayfeed: error: ")
    assert "Traceback" not in stderr
    assert re.search(message, stderr), stderr
    assert listing(data) == before  # nothing at OUTPUT, no workspace


def test_missing_output_option(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    code, _, stderr = run(capsys, "convert", f"x={data}/x.npy")
    assert code == 2 and stderr == (
        "arrayfeed: error: the following arguments are required: -o/--output "
        "(see 'arrayfeed convert --help').\n"
    )


def test_unexpected_errors_have_no_traceback(
    capsys: pytest.CaptureFixture[str], data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arrayfeed._conversion import copy as _copy

    def boom(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(_copy, "write_rows", boom)
    code, _, stderr = run(capsys, "convert", f"x={data}/x.npy", "-o", str(data / "o.h5"), "-q")
    assert code == 1 and stderr.startswith("arrayfeed: error: unexpected RuntimeError: boom")
    assert stderr.count("\n") == 1 and "o.h5" not in listing(data)
    monkeypatch.setenv("ARRAYFEED_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        main(["convert", f"x={data}/x.npy", "-o", str(data / "o.h5"), "-q"])


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run(capsys, "convert", "--help")
    assert code == 0 and "x='parts/*.npy'" in stdout and "sorted lexicographically" in stdout
    code, stdout, _ = run(capsys, "--version")
    assert code == 0 and stdout.strip() == f"arrayfeed {af.__version__}"
    code, _, stderr = run(capsys)
    assert code == 2 and stderr.startswith("arrayfeed: error: the following arguments are required")


def test_inspect(capsys: pytest.CaptureFixture[str], data: Path) -> None:
    code, stdout, _ = run(capsys, "inspect", str(data / "in.zarr"))
    assert code == 0 and "Layout: NOT suited to shuffled batch reads:" in stdout
    assert "chunks of 10 rows hold 120 B" in stdout
    fix = stdout.split("Fix: convert it with\n")[1].strip()
    assert (
        fix == f"arrayfeed convert x={data}/in.zarr:x -o {data}/in.arrayfeed.zarr --compression lzf"
    )
    assert run(capsys, *fix.split()[1:], "-q")[0] == 0
    code, stdout, _ = run(capsys, "inspect", f"{data}/in.arrayfeed.zarr")
    assert code == 0 and "Layout: suited to shuffled batch reads." in stdout
    code, _, stderr = run(capsys, "inspect", str(data / "missing.h5"))
    assert (
        code == 1
        and stderr == f"arrayfeed: error: nothing at '{data}/missing.h5'; check the path.\n"
    )


# --- one array of a file or store: PATH:KEY ---------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """raw.h5 (group/x in chunks of 10 rows, y), conv.zarr (x, y by `af.convert`) and a.h5ad
    (sparse X, obsm/X_pca, written by anndata)."""
    import anndata
    import scipy.sparse

    d = tmp_path_factory.mktemp("keyed")
    rng = np.random.default_rng(0)
    with h5py.File(d / "raw.h5", "w") as f:
        f.create_dataset("group/x", data=rng.normal(size=(600, 8)), chunks=(10, 8))
        f["y"] = np.arange(600)
    x = rng.normal(size=(600, 8)).astype(np.float32)
    af.convert({"x": x, "y": np.arange(600)}, d / "conv.zarr", progress=False)
    matrix = scipy.sparse.random(600, 40, density=0.1, format="csr", dtype=np.float32, rng=0)
    pca = rng.normal(size=(600, 16)).astype(np.float32)
    anndata.AnnData(X=matrix, obsm={"X_pca": pca}).write_h5ad(d / "a.h5ad")
    return d


@pytest.mark.parametrize(
    ("spec", "name", "fix"),
    [
        ("raw.h5:group/x", "group/x", "arrayfeed convert group/x={d}/raw.h5:group/x -o "),
        ("raw.h5:/group/x", "group/x", "arrayfeed convert group/x={d}/raw.h5:group/x -o "),
        ("conv.zarr:x", "x", None),
        ("a.h5ad:obsm/X_pca", "obsm/X_pca", None),
        ("a.h5ad:X", "X", None),
    ],
)
def test_inspect_one_array(
    capsys: pytest.CaptureFixture[str], keyed: Path, spec: str, name: str, fix: str | None
) -> None:
    code, stdout, stderr = run(capsys, "inspect", f"{keyed}/{spec}")
    assert (code, stderr) == (0, "")
    path = spec.partition(":")[0]
    assert stdout.startswith(f"{keyed}/{path}:{name}: ")
    assert ", 1 array, " in stdout.splitlines()[0]
    rows = [line.split()[0] for line in stdout.splitlines()[2:] if line.startswith("  ")]
    assert rows[0] == name and "y" not in rows and "obs/_index" not in rows
    if fix is None:
        assert "Fix" not in stdout
    else:  # the fix converts that array alone
        command = stdout.split("Fix: convert it with\n")[1].strip()
        assert command.startswith(fix.format(d=keyed)) and " y=" not in command
    if path == "conv.zarr":
        assert "(written by arrayfeed" in stdout


def test_verify_one_array(capsys: pytest.CaptureFixture[str], keyed: Path) -> None:
    code, stdout, stderr = run(capsys, "verify", f"{keyed}/conv.zarr:x", "-q")
    assert (code, stderr) == (0, "")
    assert stdout.startswith(f"{keyed}/conv.zarr:x: OK, 1 array of 600 rows (18.8 KiB) match")
    code, stdout, _ = run(capsys, "verify", f"{keyed}/conv.zarr:y", "-q")
    assert code == 0 and "conv.zarr:y: OK, 1 array of 600 rows (4.7 KiB)" in stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["inspect", "a.h5ad:obsm/nope"],
            r"'{d}/a.h5ad' has no array 'obsm/nope'; its arrays are \['X', 'obs/_index', "
            r"'obsm/X_pca', 'var/_index'\]. Name one as '{d}/a.h5ad:NAME', or give "
            r"'{d}/a.h5ad' alone for all of them\.",
        ),
        (["inspect", "raw.h5:group"], r"has no array 'group'; its arrays are \['group/x', 'y'\]"),
        (["verify", "conv.zarr:nope"], r"has no array 'nope'; its arrays are \['x', 'y'\]"),
        (["verify", "a.h5ad:obsm/X_pca"], r"'{d}/a.h5ad' was not written by `arrayfeed convert`"),
        (["inspect", "missing.h5:x"], r"nothing at '{d}/missing.h5'; check the path\."),
    ],
)
def test_a_key_that_is_not_there_is_named_with_what_is(
    capsys: pytest.CaptureFixture[str], keyed: Path, argv: list[str], message: str
) -> None:
    command, spec = argv
    code, stdout, stderr = run(capsys, command, f"{keyed}/{spec}")
    assert code == 1 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith("arrayfeed: error: ")
    assert re.search(message.format(d=re.escape(str(keyed))), stderr), stderr


def test_a_path_with_a_colon_is_taken_as_written(
    capsys: pytest.CaptureFixture[str], keyed: Path, tmp_path: Path
) -> None:
    import shutil

    shutil.copy(keyed / "raw.h5", tmp_path / "raw.h5:y")  # no raw.h5 beside it
    shutil.copytree(keyed / "conv.zarr", tmp_path / "conv.zarr:x")
    code, stdout, _ = run(capsys, "inspect", f"{tmp_path}/raw.h5:y")
    assert code == 0 and stdout.startswith(f"{tmp_path}/raw.h5:y: HDF5, 2 arrays")
    code, stdout, _ = run(capsys, "verify", f"{tmp_path}/conv.zarr:x", "-q")
    assert code == 0 and stdout.startswith(f"{tmp_path}/conv.zarr:x: OK, 2 arrays")
    argv = ["bench", f"{tmp_path}/raw.h5:y", "--seconds", "0.05", "--batch-size", "64"]
    code, stdout, stderr = run(capsys, *argv)
    assert (code, stderr) == (0, ""), stderr
    assert stdout.startswith("600 rows of 72 bytes, batch 64")  # group/x and y: the whole file


def test_one_array_of_a_store_behind_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fsspec")
    import uuid

    url = f"memory://arrayfeed-{uuid.uuid4().hex}/c.zarr"
    af.convert({"x": np.arange(300.0), "y": np.arange(300)}, url, progress=False)
    code, stdout, _ = run(capsys, "inspect", f"{url}:y")
    assert code == 0 and stdout.startswith(f"{url}:y: Zarr v3, 1 array")
    code, stdout, _ = run(capsys, "verify", f"{url}:x", "-q")
    assert code == 0 and stdout.startswith(f"{url}:x: OK, 1 array of 300 rows")
    code, _, stderr = run(capsys, "verify", f"{url}:z", "-q")
    assert code == 1 and f"'{url}' has no array 'z'; its arrays are ['x', 'y']" in stderr


# --- real processes --------------------------------------------------------------------------


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def python_m_arrayfeed(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arrayfeed", *argv],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_python_m_arrayfeed_does_not_import_tensorflow(data: Path) -> None:
    script = (
        "import sys\n"
        "from arrayfeed._cli import main\n"
        f"assert main(['convert', 'x={data}/x.npy', '-o', '{data}/o.h5', '-q']) == 0\n"
        f"assert main(['inspect', '{data}/o.h5']) == 0\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    proc = python_m_arrayfeed("inspect", f"{data}/o.h5")
    assert proc.returncode == 0 and "suited to shuffled batch reads" in proc.stdout


@pytest.mark.slow
def test_python_m_arrayfeed_inspects_one_array(keyed: Path) -> None:
    proc = python_m_arrayfeed("inspect", f"{keyed}/a.h5ad:obsm/X_pca")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith(f"{keyed}/a.h5ad:obsm/X_pca: HDF5, 1 array, 37.5 KiB stored\n")


def start_slow_conversion(data: Path, output: str) -> tuple[subprocess.Popen[str], Path]:
    """A ``python -m arrayfeed convert`` writing one 10-row chunk every 50 ms (100 blocks, ~5 s),
    returned once it has been writing for a while."""
    np.save(data / "big.npy", np.ones((1000, 64), np.float32))
    argv = ["convert", f"x={data}/big.npy", "-o", str(data / output), "--chunk-rows", "10"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "arrayfeed", *argv],
        env=env(**{TEST_HOOK_ENV: "0.05"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the output is being written in a workspace
        targets = list(data.glob(f".{output}.arrayfeed-*/out.*"))
        if targets:
            time.sleep(0.3)  # a few blocks in
            return proc, targets[0].parent
        if proc.poll() is not None:
            pytest.fail(f"the conversion ended early: {proc.communicate()}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail("the conversion did not start writing")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("output", ["out.h5", "out.zarr"])
def test_interrupting_a_conversion_leaves_nothing(
    data: Path, output: str, sig: signal.Signals
) -> None:
    before = listing(data)
    proc, _ = start_slow_conversion(data, output)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr == f"arrayfeed: error: interrupted; nothing was written to {data / output}.\n"
    assert listing(data) == sorted([*before, "big.npy"])  # no output, no workspace


@pytest.mark.slow
@pytest.mark.parametrize("output", ["out.h5", "out.zarr"])
def test_killing_a_conversion_leaves_nothing_at_the_output(data: Path, output: str) -> None:
    proc, workspace = start_slow_conversion(data, output)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (data / output).exists()
    assert workspace.exists()  # a stale workspace beside the output, never at it
    # the next run removes it (its process is dead) and converts
    af.convert({"x": data / "big.npy"}, data / output, progress=False)
    assert not workspace.exists() and read(data / output, "x").shape == (1000, 64)
    assert not [n for n in listing(data) if n.startswith(".")]


def test_doctests() -> None:
    import doctest

    from arrayfeed import _cli

    assert doctest.testmod(_cli, optionflags=doctest.ELLIPSIS).failed == 0
