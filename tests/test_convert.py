"""``arrayfeed.convert``: round trips, layout, shuffle, atomicity and errors (in-process).

Interruptions of a real ``python -m arrayfeed convert`` process are in ``test_cli.py``.
"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af
from arrayfeed._conversion import convert as _convert
from arrayfeed._conversion import copy as _copy
from arrayfeed._conversion.copy import TEST_HOOK_ENV
from arrayfeed._storage import MARKER, ConversionRecord
from arrayfeed.storage import written_by_arrayfeed

from .conftest import subprocess_env

N = 1000
OUTPUTS = ["out.h5", "out.zarr"]


@pytest.fixture
def xy() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((N, 4, 3)).astype(np.float32), np.arange(N, dtype=np.int64)


def read(path: Path, name: str) -> np.ndarray:
    if path.suffix == ".zarr":
        return np.asarray(zarr.open_group(str(path), mode="r")[name][:])
    with h5py.File(path, "r") as f:
        return np.asarray(f[name][:])


def listing(directory: Path) -> list[str]:
    """Everything in ``directory``, hidden entries included."""
    return sorted(p.name for p in directory.iterdir())


def write_forms(tmp: Path, x: np.ndarray) -> dict[str, Callable[[], Any]]:
    """Every input form of ``x``, as a function returning the value for ``inputs``."""
    np.save(tmp / "x.npy", x)
    np.savez(tmp / "d.npz", x=x, other=np.zeros(3))
    with h5py.File(tmp / "in.h5", "w") as f:
        f.create_dataset("g/x", data=x, chunks=(7, 4, 3), compression="gzip")
    g = zarr.open_group(str(tmp / "in.zarr"), mode="w")
    g.create_array("x", data=x, chunks=(50, 2, 3))
    (tmp / "parts").mkdir()
    for i, (a, b) in enumerate([(0, 300), (300, 301), (301, N)]):
        np.save(tmp / "parts" / f"p{i}.npy", x[a:b])
    return {
        "npy": lambda: str(tmp / "x.npy"),
        "path": lambda: tmp / "x.npy",
        "npz": lambda: f"{tmp}/d.npz:x",
        "h5": lambda: f"{tmp}/in.h5:g/x",
        "zarr": lambda: f"{tmp}/in.zarr:x",
        "memory": lambda: x.copy(),
        "memmap": lambda: np.load(tmp / "x.npy", mmap_mode="r"),
        "h5py.Dataset": lambda: h5py.File(tmp / "in.h5", "r")["g/x"],
        "zarr.Array": lambda: zarr.open_group(str(tmp / "in.zarr"), mode="r")["x"],
        "open_array": lambda: af.open_array(tmp / "in.zarr", "x"),
        "glob": lambda: f"{tmp}/parts/p*.npy",
        "list": lambda: [x[:10], x[10:10], x[10:]],  # with an empty part
        "mixed list": lambda: [f"{tmp}/parts/p0.npy", f"{tmp}/in.h5:g/x", f"{tmp}/in.zarr:x"],
    }


FORMS = [
    "npy",
    "path",
    "npz",
    "h5",
    "zarr",
    "memory",
    "memmap",
    "h5py.Dataset",
    "zarr.Array",
    "open_array",
    "glob",
    "list",
]


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("form", FORMS)
def test_round_trip_every_input_form(
    tmp_path: Path, xy: tuple[np.ndarray, np.ndarray], form: str, output: str
) -> None:
    x, y = xy
    value = write_forms(tmp_path, x)[form]()
    out = tmp_path / output
    record = af.convert({"x": value, "y": y}, out, compression="lzf", progress=False)
    assert np.array_equal(read(out, "x"), x)
    assert np.array_equal(read(out, "y"), y)
    assert read(out, "x").dtype == np.float32 and read(out, "y").dtype == np.int64
    assert record == written_by_arrayfeed(out)
    assert record.complete and record.rows == N and record.shuffle_seed is None
    assert not [n for n in listing(tmp_path) if n.startswith(".")]  # no workspace left


@pytest.mark.parametrize("output", OUTPUTS)
def test_concatenation_across_forms(
    tmp_path: Path, xy: tuple[np.ndarray, np.ndarray], output: str
) -> None:
    x, _ = xy
    value = write_forms(tmp_path, x)["mixed list"]()
    out = tmp_path / output
    af.convert({"x": value}, out, progress=False)
    assert np.array_equal(read(out, "x"), np.concatenate([x[:300], x, x]))


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize(
    "dtype", ["bool", "uint8", "int16", "uint32", "float16", "float64", "complex64", ">f4", ">i8"]
)
def test_dtypes_and_shapes_are_preserved(tmp_path: Path, dtype: str, output: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((37, 2, 5)) * 50).astype(dtype)
    out = tmp_path / output
    af.convert({"x": x, "v": np.arange(37)}, out, chunk_rows=8, compression="gzip", progress=False)
    back = read(out, "x")
    assert back.shape == x.shape
    assert back.dtype == np.dtype(dtype).newbyteorder("=")  # stored in native byte order
    assert np.array_equal(back, x)


def test_nested_names(tmp_path: Path) -> None:
    for output in OUTPUTS:
        out = tmp_path / output
        af.convert({"train/x": np.ones((5, 2)), "train/y": np.arange(5)}, out, progress=False)
        assert read(out, "train/y").tolist() == list(range(5))


def test_layout_hdf5(tmp_path: Path) -> None:
    x = np.zeros((10_000, 256), np.float32)  # 1 KiB rows
    af.convert({"x": x, "y": np.arange(10_000)}, tmp_path / "plain.h5", progress=False)
    af.convert({"x": x}, tmp_path / "lzf.h5", compression="lzf", progress=False)
    af.convert({"x": x}, tmp_path / "gz.h5", compression="gzip", chunk_rows=100, progress=False)
    af.convert({"x": x}, tmp_path / "chunked.h5", chunk_rows=64, progress=False)
    with h5py.File(tmp_path / "plain.h5") as f:
        assert f["x"].chunks is None and f["x"].compression is None  # contiguous
        assert json.loads(f.attrs[MARKER])["chunk_rows"] is None
    with h5py.File(tmp_path / "lzf.h5") as f:
        assert f["x"].chunks == (256, 256) and f["x"].compression == "lzf" and f["x"].shuffle
    with h5py.File(tmp_path / "gz.h5") as f:
        assert f["x"].chunks == (100, 256)
        assert (f["x"].compression, f["x"].compression_opts) == ("gzip", 4)
    with h5py.File(tmp_path / "chunked.h5") as f:
        assert f["x"].chunks == (64, 256) and f["x"].compression is None


def test_layout_zarr(tmp_path: Path) -> None:
    # 3 KiB images with 8-byte labels: one chunk of rows is 256 rows (770 KiB) in both arrays.
    images = np.zeros((1000, 32, 32, 3), np.uint8)
    labels = np.zeros(1000, np.int64)  # all fill value: written anyway
    out = tmp_path / "out.zarr"
    record = af.convert(
        {"images": images, "labels": labels}, out, compression="lzf", progress=False
    )
    assert record.chunk_rows == 256
    group = zarr.open_group(str(out), mode="r")
    assert group["images"].chunks == (256, 32, 32, 3) and group["labels"].chunks == (256,)
    for name in ("images", "labels"):
        array = group[name]
        assert array.nchunks == 4 and array.nchunks_initialized == 4  # complete
        assert len(list((out / name / "c").iterdir())) == 4
    codec = group["images"].compressors[0]
    assert type(codec).__name__ == "BloscCodec" and str(codec.cname.value) == "lz4"
    assert group.attrs[MARKER]["complete"] is True
    af.convert({"x": labels}, tmp_path / "gz.zarr", compression="gzip", progress=False)
    af.convert({"x": labels}, tmp_path / "raw.zarr", chunk_rows=300, progress=False)
    assert type(zarr.open_array(str(tmp_path / "gz.zarr/x")).compressors[0]).__name__ == "GzipCodec"
    raw = zarr.open_array(str(tmp_path / "raw.zarr/x"))
    # No compressor: only the per-chunk checksum.
    assert [type(c).__name__ for c in raw.compressors] == ["Crc32cCodec"]
    assert raw.chunks == (300,) and raw.nchunks_initialized == 4


def test_chunk_rows_larger_than_the_data_is_one_chunk(tmp_path: Path) -> None:
    record = af.convert({"x": np.arange(10)}, tmp_path / "o.zarr", chunk_rows=10**6, progress=False)
    assert record.chunk_rows == 10


@pytest.mark.parametrize("output", OUTPUTS)
def test_shuffle_keeps_rows_aligned_and_is_a_permutation(
    tmp_path: Path, xy: tuple[np.ndarray, np.ndarray], output: str
) -> None:
    x, y = xy
    forms = write_forms(tmp_path, x)
    out = tmp_path / output
    # h5 and npz inputs (staged for random access), a concatenation and in-memory labels
    record = af.convert(
        {"a": forms["h5"](), "b": forms["glob"](), "c": forms["npz"](), "y": y},
        out,
        shuffle=True,
        seed=7,
        progress=False,
    )
    order = read(out, "y")
    assert sorted(order.tolist()) == list(range(N))
    assert not np.array_equal(order, y)
    for name in "abc":
        assert np.array_equal(read(out, name), x[order])
    assert record.shuffle_seed == 7
    again = tmp_path / ("again" + out.suffix)
    af.convert({"y": y}, again, shuffle=True, seed=7, progress=False)
    assert np.array_equal(read(again, "y"), order)  # same seed, same order
    other = tmp_path / ("other" + out.suffix)
    af.convert({"y": y}, other, shuffle=True, seed=8, progress=False)
    assert not np.array_equal(read(other, "y"), order)
    assert not [n for n in listing(tmp_path) if n.startswith(".")]  # staging removed too


def test_shuffle_without_seed_draws_and_records_one(tmp_path: Path) -> None:
    record = af.convert({"y": np.arange(50)}, tmp_path / "o.h5", shuffle=True, progress=False)
    assert isinstance(record.shuffle_seed, int)
    order = read(tmp_path / "o.h5", "y")
    af.convert({"y": np.arange(50)}, tmp_path / "p.h5", shuffle=True, seed=record.shuffle_seed)
    assert np.array_equal(read(tmp_path / "p.h5", "y"), order)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("output", OUTPUTS)
def test_many_small_blocks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    xy: tuple[np.ndarray, np.ndarray],
    output: str,
    shuffle: bool,
) -> None:
    # The test hook makes every block one chunk: many blocks cross the parts' boundaries.
    monkeypatch.setenv(TEST_HOOK_ENV, "0")
    x, y = xy
    parts = write_forms(tmp_path, x)["glob"]()
    out = tmp_path / output
    af.convert({"x": parts, "y": y}, out, chunk_rows=64, shuffle=shuffle, progress=False)
    order = read(out, "y")
    assert np.array_equal(read(out, "x"), x[order])
    assert shuffle or np.array_equal(order, y)


def test_checksums_are_crc32_of_the_rows(tmp_path: Path) -> None:
    import zlib

    x = np.arange(24, dtype="<i4").reshape(6, 4)
    record = af.convert({"x": x}, tmp_path / "o.h5", chunk_rows=2, progress=False)
    assert record.checksums == {"x": zlib.crc32(x.tobytes())}


# --- clobber protection, destinations --------------------------------------------------------


@pytest.mark.parametrize("output", OUTPUTS)
def test_existing_output_is_untouched_without_overwrite(tmp_path: Path, output: str) -> None:
    out = tmp_path / output
    af.convert({"x": np.arange(5)}, out, progress=False)
    before = read(out, "x")
    with pytest.raises(
        af.OutputExistsError, match=r"already exists; pass `overwrite=True`"
    ) as info:
        af.convert({"x": np.arange(10, 20)}, out, progress=False)
    assert isinstance(info.value, FileExistsError)
    assert np.array_equal(read(out, "x"), before)
    af.convert({"x": np.arange(10, 20)}, out, overwrite=True, progress=False)
    assert read(out, "x").tolist() == list(range(10, 20))
    assert listing(tmp_path) == [output]


def test_overwrite_in_place(tmp_path: Path) -> None:
    # Re-lay out a file into itself: the inputs are read before the output is replaced.
    out = tmp_path / "data.h5"
    with h5py.File(out, "w") as f:
        f.create_dataset("x", data=np.arange(3000.0).reshape(1000, 3), chunks=(1, 1))
    af.convert({"x": f"{out}:x"}, out, overwrite=True, compression="lzf", progress=False)
    with h5py.File(out) as f:
        assert f["x"].chunks == (1000, 3) and f["x"][-1, -1] == 2999.0


def test_overwrite_refuses_what_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "notes.zarr").mkdir()
    (tmp_path / "notes.zarr" / "thesis.tex").write_text("precious")
    (tmp_path / "dir.h5").mkdir()
    (tmp_path / "file.zarr").write_text("precious")
    for name in ("notes.zarr", "dir.h5", "file.zarr"):
        with pytest.raises(af.DestinationError, match="will not replace it"):
            af.convert({"x": np.arange(3)}, tmp_path / name, overwrite=True, progress=False)
    assert (tmp_path / "notes.zarr" / "thesis.tex").read_text() == "precious"


def test_missing_output_directory(tmp_path: Path) -> None:
    with pytest.raises(
        af.DestinationError, match=r"directory of `output` \('.*nowhere'\) does not exist"
    ):
        af.convert({"x": np.arange(3)}, tmp_path / "nowhere" / "o.h5", progress=False)


def _make_read_only(directory: Path) -> Callable[[], None]:
    """Make ``directory`` unwritable for this process, and return the undo. Root may write in any
    mode-0555 directory, so as root the directory is made immutable (``chattr +i``) instead."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return lambda: directory.chmod(0o755)
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make a directory read-only as root here: {done.stderr.strip()}")
    return lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_read_only_destination(tmp_path: Path) -> None:
    # A real read-only directory and a real CLI run.
    np.save(tmp_path / "x.npy", np.arange(10.0))
    locked = tmp_path / "locked"
    locked.mkdir()
    undo = _make_read_only(locked)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "arrayfeed",
                "convert",
                f"x={tmp_path / 'x.npy'}",
                "-o",
                str(locked / "o.h5"),
            ],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=120,
        )
    finally:
        undo()
    assert result.returncode != 0
    assert "cannot write in" in result.stderr and "Traceback" not in result.stderr
    assert listing(locked) == []


def test_read_only_destination_fails_before_reading_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a read-only directory does to the first write in it, for runs as root (which may
    # write anywhere): the error comes before any input is opened.
    def refuse(self: object) -> None:
        raise PermissionError(errno.EROFS, "Read-only file system")

    def never(*args: object) -> None:
        pytest.fail("an input was opened")

    monkeypatch.setattr(_convert.Workspace, "create", refuse)
    monkeypatch.setattr(_convert, "open_input", never)
    with pytest.raises(
        af.DestinationError, match=r"cannot write in '.*' \(Read-only file system\)"
    ):
        af.convert({"x": str(tmp_path / "x.npy")}, tmp_path / "o.zarr", progress=False)
    assert listing(tmp_path) == []


def test_stale_workspace_of_a_dead_process_is_removed(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    from arrayfeed._conversion.atomic import _host

    stale = tmp_path / f".o.h5.arrayfeed-{_host()}-{proc.pid}-0123abcd"
    stale.mkdir()
    (stale / "out.h5").write_bytes(b"partial")
    af.convert({"x": np.arange(3)}, tmp_path / "o.h5", progress=False)
    assert listing(tmp_path) == ["o.h5"]


# --- failures leave nothing ------------------------------------------------------------------


def fail_after(calls: int, exc: BaseException) -> Callable[..., None]:
    """A block writer that writes ``calls`` blocks, then raises ``exc``."""
    real = _copy.write_rows
    count = [0]

    def write(*args: Any) -> None:
        count[0] += 1
        if count[0] > calls:
            raise exc
        real(*args)

    return write


@pytest.mark.parametrize("output", OUTPUTS)
def test_full_disk_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    monkeypatch.setenv(TEST_HOOK_ENV, "0")  # several blocks
    monkeypatch.setattr(
        _copy, "write_rows", fail_after(3, OSError(errno.ENOSPC, "No space left on device"))
    )
    with pytest.raises(
        af.DestinationError, match=r"no space left on the device of .*; nothing was written"
    ):
        af.convert({"x": np.ones((1000, 8))}, tmp_path / output, chunk_rows=100, progress=False)
    assert listing(tmp_path) == []


def test_full_disk_from_hdf5_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # h5py reports a full disk as an OSError without errno, naming it in the message.
    h5_error = OSError(
        "Can't write data (file write failed: errno = 28, "
        "error message = 'No space left on device')"
    )
    monkeypatch.setattr(_copy, "write_rows", fail_after(0, h5_error))
    with pytest.raises(af.DestinationError, match="no space left"):
        af.convert({"x": np.ones((10, 8))}, tmp_path / "o.h5", progress=False)
    assert listing(tmp_path) == []


@pytest.mark.parametrize("output", OUTPUTS)
def test_failure_keeps_the_previous_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    out = tmp_path / output
    af.convert({"x": np.arange(5)}, out, progress=False)
    monkeypatch.setattr(_copy, "write_rows", fail_after(0, OSError(errno.ENOSPC, "full")))
    with pytest.raises(af.DestinationError):
        af.convert({"x": np.arange(10)}, out, overwrite=True, progress=False)
    assert read(out, "x").tolist() == list(range(5)) and listing(tmp_path) == [output]


def test_input_errors_are_not_blamed_on_the_destination(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arrayfeed._conversion import inputs as _inputs

    def unreadable(*args: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "x.npy")

    monkeypatch.setattr(_inputs, "read_run", unreadable)
    with pytest.raises(PermissionError) as info:
        af.convert({"x": np.arange(10)}, tmp_path / "o.h5", progress=False)
    assert not isinstance(info.value, af.DestinationError)
    assert listing(tmp_path) == []


def test_full_disk_while_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A chunked HDF5 input is staged (copied beside the output) before a shuffled write.
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f.create_dataset("x", data=np.arange(100), chunks=(10,))
    real_open = open

    def full_disk_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(path, mode, *args, **kwargs)
        if str(path).endswith(".bin") and "w" in mode:
            handle.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space"))
        return handle

    monkeypatch.setattr(_copy, "open", full_disk_open, raising=False)
    with pytest.raises(af.DestinationError, match="no space left"):
        af.convert({"x": f"{tmp_path}/in.h5:x"}, tmp_path / "o.zarr", shuffle=True, progress=False)
    assert listing(tmp_path) == ["in.h5"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), RuntimeError("boom")])
@pytest.mark.parametrize("output", OUTPUTS)
def test_exceptions_and_interrupts_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str, exc: BaseException
) -> None:
    monkeypatch.setattr(_copy, "write_rows", fail_after(1, exc))
    with pytest.raises(type(exc)):
        af.convert(
            {"x": np.ones((1000, 8)), "y": np.arange(1000)}, tmp_path / output, progress=False
        )
    assert listing(tmp_path) == []


@pytest.mark.parametrize("output", OUTPUTS)
def test_verification_catches_a_bad_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    real = _copy.write_rows

    def corrupt(writer: Any, name: str, start: int, rows: np.ndarray) -> None:
        real(writer, name, start, rows + 1)

    monkeypatch.setattr(_copy, "write_rows", corrupt)
    with pytest.raises(
        af.CorruptDataError,
        match=r"verifying the converted copy failed: `x` reads back with CRC-32",
    ):
        af.convert({"x": np.arange(100)}, tmp_path / output, progress=False)
    assert listing(tmp_path) == []


# --- bad arguments and inputs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"compression": "zip"}, af.ConfigError, r"`compression` must be one of none, lzf, gzip"),
        (
            {"chunk_rows": 0},
            af.ConfigError,
            r"`chunk_rows` must be a positive int or None \(got 0\)",
        ),
        ({"chunk_rows": 2.5}, af.ConfigError, r"`chunk_rows` must be a positive int"),
        ({"seed": 3}, af.ConfigError, r"`seed` \(3\) only applies with `shuffle=True`"),
        ({"shuffle": "yes"}, af.ConfigError, r"`shuffle` must be True or False"),
        (
            {"output": "o.txt"},
            af.ConfigError,
            r"`output` must end in .h5 or .hdf5 \(HDF5\) or .zarr",
        ),
        ({"inputs": {}}, af.ConfigError, r"`inputs` is empty"),
        ({"inputs": [np.arange(3)]}, af.ConfigError, r"`inputs` must be a dict"),
        (
            {"inputs": {"a b": np.arange(3)}},
            af.ConfigError,
            r"the name 'a b', which cannot name an array",
        ),
        ({"inputs": {"__x": np.arange(3)}}, af.ConfigError, r"cannot name an array"),
        ({"inputs": {"a/": np.arange(3)}}, af.ConfigError, r"cannot name an array"),
        (
            {"inputs": {"a": np.arange(3), "a/b": np.arange(3)}},
            af.ConfigError,
            r"cannot also be a group",
        ),
    ],
)
def test_bad_arguments(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    call: dict[str, Any] = {
        "inputs": {"x": np.arange(3)},
        "output": tmp_path / "o.h5",
        "progress": False,
    }
    call.update(kwargs)
    if not Path(call["output"]).is_absolute():
        call["output"] = tmp_path / call["output"]
    with pytest.raises(error, match=message):
        af.convert(call.pop("inputs"), call.pop("output"), **call)
    assert listing(tmp_path) == []


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (
            "missing.npy",
            af.SourceNotFoundError,
            r"`inputs\['x'\]`: nothing at '.*missing.npy'; check the path",
        ),
        ("d.npz:nope", af.SourceNotFoundError, r"has no array 'nope'; it holds \['x', 'other'\]"),
        (
            "in.h5:nope",
            af.SourceNotFoundError,
            r"has no dataset 'nope'; its datasets are \['g/x'\]",
        ),
        ("in.zarr:nope", af.SourceNotFoundError, r"has no array 'nope'; its arrays are \['x'\]"),
        ("x.npy:x", af.SourceNotFoundError, r"holds one array; drop `key`"),
        ("parts/q*.npy", af.SourceNotFoundError, r"no file matches the pattern"),
        ("junk.bin", af.SourceNotFoundError, r"is not a .npy, .npz, HDF5 file or Zarr store"),
    ],
)
def test_bad_inputs(
    tmp_path: Path,
    xy: tuple[np.ndarray, np.ndarray],
    spec: str,
    error: type[Exception],
    message: str,
) -> None:
    write_forms(tmp_path, xy[0])
    (tmp_path / "junk.bin").write_bytes(b"junk")
    before = listing(tmp_path)
    with pytest.raises(error, match=message):
        af.convert({"x": f"{tmp_path}/{spec}"}, tmp_path / "o.h5", progress=False)
    assert listing(tmp_path) == before


def test_mismatched_lengths_are_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(
        af.ShapeError, match=r"`inputs\['y'\]` has 99 rows but `inputs\['x'\]` has 100"
    ):
        af.convert(
            {"x": np.zeros((100, 2)), "y": np.zeros(99)}, tmp_path / "o.zarr", progress=False
        )
    assert listing(tmp_path) == []


def test_mismatched_parts_name_their_files(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((3, 2)))
    np.save(tmp_path / "b.npy", np.zeros((3, 2), np.float32))
    with pytest.raises(af.DtypeError, match=r"`inputs\['x'\]\[1\] \(.*b.npy\)` has dtype float32"):
        af.convert({"x": f"{tmp_path}/*.npy"}, tmp_path / "o.h5", progress=False)


# --- progress and the record -----------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    af.convert({"x": np.arange(10)}, tmp_path / "a.h5", shuffle=True, seed=0)
    assert "writing 100%" in terminal.getvalue() and "verifying 100%" in terminal.getvalue()
    quiet = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    af.convert({"x": np.arange(10)}, tmp_path / "b.h5", progress=False)
    assert quiet.getvalue() == ""
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    af.convert({"x": np.arange(10)}, tmp_path / "c.h5")
    assert piped.getvalue() == ""


def test_written_by_arrayfeed(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = np.arange(3)
    zarr.open_group(str(tmp_path / "foreign.zarr"), mode="w").create_array("x", data=np.arange(3))
    zarr.create_array(str(tmp_path / "lone.zarr"), data=np.arange(3))
    (tmp_path / "text.txt").write_text("hi")
    for name in ("foreign.h5", "foreign.zarr", "lone.zarr", "text.txt"):
        assert written_by_arrayfeed(tmp_path / name) is None
    with pytest.raises(af.SourceNotFoundError):
        written_by_arrayfeed(tmp_path / "missing.h5")

    record = af.convert({"x": np.arange(3)}, tmp_path / "ours.zarr", progress=False)
    af.convert({"x": np.arange(3)}, tmp_path / "ours.h5", progress=False)
    assert written_by_arrayfeed(zarr.open_group(str(tmp_path / "ours.zarr"), mode="r")) == record
    with h5py.File(tmp_path / "ours.h5", "r") as f:
        assert written_by_arrayfeed(f["x"].parent) == written_by_arrayfeed(tmp_path / "ours.h5")
    assert record.version == af.__version__ and record.to_json()["checksum"] == "crc32"

    with h5py.File(tmp_path / "ours.h5", "a") as f:
        f.attrs[MARKER] = "{not json"
    with pytest.raises(af.CorruptDataError, match="not a record written by arrayfeed"):
        written_by_arrayfeed(tmp_path / "ours.h5")


def test_record_round_trips_through_json() -> None:
    record = ConversionRecord(
        version="1",
        complete=True,
        rows=3,
        chunk_rows=None,
        compression="none",
        shuffle_seed=5,
        checksums={"x": 7},
    )
    assert ConversionRecord.from_json(json.dumps(record.to_json())) == record
    with pytest.raises(af.CorruptDataError):
        ConversionRecord.from_json({**record.to_json(), "format": 99})


def test_doctests() -> None:
    import doctest

    module = _convert

    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0


_FSIZE_SCRIPT = """
import gc, resource, signal, sys
import numpy as np
import arrayfeed as af
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    af.convert({"x": np.random.default_rng(0).standard_normal((100_000, 8))}, sys.argv[1],
               compression=sys.argv[2], progress=False)
except af.DestinationError as exc:
    print("DestinationError:", exc)
gc.collect()
print("alive")
"""


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["none", "lzf", "gzip"])
def test_a_file_size_limit_is_a_destination_error_and_the_process_stays_healthy(
    tmp_path: Path, compression: str
) -> None:
    """A failed HDF5 write closes the file before its workspace goes: the next garbage collection
    and the interpreter's exit do not crash (they did, with SIGSEGV)."""
    out = tmp_path / "out" / "train.h5"
    out.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _FSIZE_SCRIPT, str(out), compression],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DestinationError: `output` grew past the largest file allowed here" in done.stdout
    assert "train.h5" in done.stdout and ".arrayfeed-" not in done.stdout
    assert done.stdout.rstrip().endswith("alive")
    assert list(out.parent.iterdir()) == []


def test_errno_in_an_hdf5_message_is_read() -> None:
    error = OSError("Can't synchronously write data (file write failed: errno = 28, ...)")
    assert isinstance(_convert._destination_error(error, Path("/d/o.h5"), 10), af.DestinationError)
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert "no space left" in str(_convert._destination_error(quota, Path("/d/o.h5"), 10))
    read_only = OSError("file write failed: errno = 30, error message = 'Read-only file system'")
    assert "cannot write in '/d'" in str(_convert._destination_error(read_only, Path("/d/o.h5"), 1))
