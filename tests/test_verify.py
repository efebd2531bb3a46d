"""Bit rot is an error, never values: per-chunk checksums written by convert and checked on every
read, and `arrayfeed verify` re-reading a store against its record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

import arrayfeed as af

from .conftest import subprocess_env

ROWS = 40_000


def _convert(tmp_path: Path, output: str, compression: str) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(0).integers(0, 255, (ROWS, 16), dtype=np.uint8)
    y = np.arange(ROWS, dtype=np.int32)
    out = tmp_path / output
    af.convert({"x": x, "y": y}, out, compression=compression, chunk_rows=4096, progress=False)
    return out, x


def _flip_a_byte_of_chunk(out: Path, chunk: int) -> None:
    """One bit flipped in the middle of chunk ``chunk`` of array ``x``, the way storage rots."""
    if out.suffix == ".zarr":
        key = zarr.open_group(out, mode="r")["x"].metadata.encode_chunk_key((chunk, 0))
        path = out / "x" / key
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
        return
    with h5py.File(out, "r") as f:
        info = f["x"].id.get_chunk_info(chunk)
    with open(out, "r+b") as f:
        f.seek(info.byte_offset + info.size // 2)
        byte = f.read(1)[0]
        f.seek(info.byte_offset + info.size // 2)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("output", ["c.h5", "c.zarr"])
@pytest.mark.parametrize("compression", ["none", "lzf", "gzip"])
def test_a_flipped_byte_is_an_error_naming_the_chunk_never_values(
    tmp_path: Path, output: str, compression: str
) -> None:
    out, x = _convert(tmp_path, output, compression)
    assert np.array_equal(af.open_array(out, "x").read(np.arange(ROWS)), x)
    _flip_a_byte_of_chunk(out, 3)
    chunk = r"chunk \(3, 0\)"
    with pytest.raises(af.CorruptDataError, match=chunk):
        af.open_array(out, "x").read(np.arange(ROWS))
    ds = af.from_arrays(af.open_array(out, "x"), batch_size=512, shuffle="block", seed=0)
    with pytest.raises(Exception, match=r"CorruptDataError.*" + chunk):
        for _ in ds:
            pass
    with pytest.raises(af.CorruptDataError, match=chunk):
        af.verify(out, progress=False)


def test_converted_stores_carry_chunk_checksums(tmp_path: Path) -> None:
    h5, _ = _convert(tmp_path, "c.h5", "lzf")
    with h5py.File(h5, "r") as f:
        assert f["x"].fletcher32 and f["y"].fletcher32
    z, _ = _convert(tmp_path, "c.zarr", "lzf")
    codecs = [type(c).__name__ for c in zarr.open_group(z, mode="r")["x"].metadata.codecs]
    assert codecs[-1] == "Crc32cCodec"


@pytest.mark.parametrize("output", ["c.h5", "c.zarr"])
def test_verify_passes_an_intact_store_and_reports(tmp_path: Path, output: str) -> None:
    out, _ = _convert(tmp_path, output, "lzf")
    report = af.verify(out, progress=False)
    assert report.arrays == ("x", "y") and report.rows == ROWS
    assert report.nbytes == ROWS * (16 + 4)
    assert str(report).startswith(f"{out}: OK, 2 arrays of 40,000 rows")


def test_verify_catches_rot_in_contiguous_data_through_the_record(tmp_path: Path) -> None:
    """Uncompressed HDF5 is stored contiguous, without chunk checksums: only the record's
    CRC-32 can tell, and verify checks it."""
    out = tmp_path / "c.h5"
    x = np.random.default_rng(1).standard_normal((5000, 8))
    af.convert({"x": x}, out, progress=False)
    with h5py.File(out, "r") as f:
        assert f["x"].chunks is None
        offset = f["x"].id.get_offset()
    with open(out, "r+b") as f:
        f.seek(offset + 1234)
        byte = f.read(1)[0]
        f.seek(offset + 1234)
        f.write(bytes([byte ^ 1]))
    with pytest.raises(af.CorruptDataError, match=r"`x` in .* reads back with CRC-32"):
        af.verify(out, progress=False)


def test_verify_refuses_a_store_without_a_record(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.zeros(10)
    with pytest.raises(af.SourceNotFoundError, match="not written by `arrayfeed convert`"):
        af.verify(tmp_path / "plain.h5")


def test_the_verify_command_prints_a_verdict_and_fails_on_rot(tmp_path: Path) -> None:
    out, _ = _convert(tmp_path, "c.zarr", "gzip")
    run = [sys.executable, "-m", "arrayfeed", "verify", str(out), "-q"]
    done = subprocess.run(run, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "OK, 2 arrays" in done.stdout
    _flip_a_byte_of_chunk(out, 5)
    done = subprocess.run(run, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert done.returncode == 1
    assert "chunk (5, 0)" in done.stderr and done.stderr.startswith("arrayfeed: error:")


@pytest.mark.parametrize("output", ["c.h5", "c.zarr"])
def test_verify_checks_the_one_array_a_path_names(tmp_path: Path, output: str) -> None:
    out, _ = _convert(tmp_path, output, "lzf")
    report = af.verify(f"{out}:y", progress=False)
    assert (report.key, report.arrays, report.nbytes) == ("y", ("y",), ROWS * 4)
    assert str(report).startswith(f"{out}:y: OK, 1 array of 40,000 rows")
    _flip_a_byte_of_chunk(out, 3)
    assert af.verify(f"{out}:y", progress=False).arrays == ("y",)  # x is not read
    with pytest.raises(af.CorruptDataError, match=r"chunk \(3, 0\)"):
        af.verify(f"{out}:x", progress=False)
    with pytest.raises(af.SourceNotFoundError, match=r"no array 'z'; its arrays are \['x', 'y'\]"):
        af.verify(f"{out}:z", progress=False)


def test_verify_one_sparse_matrix_reads_its_three_arrays(tmp_path: Path) -> None:
    import scipy.sparse

    m = scipy.sparse.random(300, 20, density=0.2, format="csr", dtype=np.float32, rng=1)
    out = tmp_path / "m.zarr"
    af.convert({"m": m, "ids": np.arange(300)}, out, progress=False)
    stored = {p: af.open_array(out, f"m/{p}") for p in ("data", "indices", "indptr")}
    nbytes = {p: len(a) * a.dtype.itemsize for p, a in stored.items()}
    report = af.verify(f"{out}:m", progress=False)
    assert report.arrays == ("m",) and report.nbytes == sum(nbytes.values())
    assert af.verify(f"{out}:m/indptr", progress=False).nbytes == nbytes["indptr"]
