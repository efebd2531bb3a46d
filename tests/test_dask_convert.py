"""``convert`` on a Dask cluster: a real ``LocalCluster`` of two worker processes on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse

import arrayfeed as af
from arrayfeed.storage import written_by_arrayfeed

from .conftest import subprocess_env

distributed = pytest.importorskip("dask.distributed")

N = 5000


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(N, 24)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 10, N).astype(np.int64))
    return {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}


def _files(store: Path) -> dict[str, bytes]:
    """Every file of a Zarr store, by path (the root's record compared apart)."""
    return {
        str(p.relative_to(store)): p.read_bytes()
        for p in sorted(store.rglob("*"))
        if p.is_file() and p != store / "zarr.json"
    }


@pytest.mark.slow
# Not gzip: Zarr's gzip codec stamps each chunk with the time, so no two gzip conversions (one
# process or many) are byte-identical; its values are compared in test_gzip_output_values.
@pytest.mark.parametrize("compression", ["lzf", "none"])
def test_same_bytes_as_one_process(
    client: Any, inputs: dict[str, str], tmp_path: Path, compression: str
) -> None:
    local = af.convert(inputs, tmp_path / "local.zarr", compression=compression, chunk_rows=256)
    spread = af.convert(
        inputs, tmp_path / "dask.zarr", compression=compression, chunk_rows=256, scheduler=client
    )
    assert spread.checksums == local.checksums  # the CRC-32s joined from the workers' parts
    assert spread.rows == local.rows and spread.chunk_rows == local.chunk_rows
    assert _files(tmp_path / "dask.zarr") == _files(tmp_path / "local.zarr")
    assert written_by_arrayfeed(tmp_path / "dask.zarr") is not None  # verified, marked
    assert af.verify(tmp_path / "dask.zarr").rows == N  # raises if anything differs


@pytest.mark.slow
def test_gzip_output_values(client: Any, inputs: dict[str, str], tmp_path: Path) -> None:
    record = af.convert(
        inputs, tmp_path / "g.zarr", compression="gzip", chunk_rows=256, scheduler=client
    )
    assert record.compression == "gzip"
    for name, path in inputs.items():
        got = af.open_array(tmp_path / "g.zarr", name).read(np.arange(N))
        np.testing.assert_array_equal(got, np.load(path))
    assert af.verify(tmp_path / "g.zarr").rows == N


@pytest.mark.slow
def test_scheduler_address_and_in_memory_inputs(client: Any, tmp_path: Path) -> None:
    x = np.arange(N * 3, dtype=np.int32).reshape(N, 3)
    out = tmp_path / "mem.zarr"
    af.convert({"x": x}, out, chunk_rows=100, scheduler=client.scheduler.address)
    np.testing.assert_array_equal(af.open_array(out, "x").read(np.arange(N)), x)


@pytest.mark.slow
def test_refusals(client: Any, inputs: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(af.ConfigError, match=r"Zarr only.*\.zarr"):
        af.convert(inputs, tmp_path / "out.h5", scheduler=client)
    with pytest.raises(af.ConfigError, match="shuffle"):
        af.convert(inputs, tmp_path / "out.zarr", shuffle=True, seed=1, scheduler=client)
    with pytest.raises(af.ConfigError, match="scheduler"):
        af.convert(inputs, tmp_path / "out.zarr", scheduler=3)
    matrix = scipy.sparse.random(N, 30, density=0.1, format="csr", random_state=0)
    with pytest.raises(af.ConfigError, match=r"sparse CSR matrix.*cannot copy as CSR.*densify"):
        af.convert({"m": matrix}, tmp_path / "out.zarr", scheduler=client)
    assert not (tmp_path / "out.zarr").exists() and not (tmp_path / "out.h5").exists()


class Unreadable:
    """A source whose rows from 3000 on fail to read, on whichever worker reads them."""

    shape, dtype = (N, 4), np.dtype(np.float32)

    def __len__(self) -> int:
        return N

    def read(self, indices: np.ndarray) -> np.ndarray:
        if int(indices.max()) >= 3000:
            raise af.CorruptDataError("rows from 3000 on are unreadable")
        return np.zeros((len(indices), 4), np.float32)


@pytest.mark.slow
def test_a_failing_worker_leaves_nothing(client: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.zarr"
    with pytest.raises(af.CorruptDataError, match="unreadable"):
        af.convert({"x": Unreadable()}, out, chunk_rows=100, scheduler=client)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # the workspace is gone too


@pytest.mark.slow
def test_cli_dask_scheduler(client: Any, inputs: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "cli.zarr"
    proc = subprocess.run(
        [
            sys.executable, "-m", "arrayfeed", "convert",
            f"x={inputs['x']}", f"y={inputs['y']}", "-o", str(out),
            "--chunk-rows", "256", "--dask-scheduler", client.scheduler.address,
        ],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "zarr.json").read_text())["attributes"]
    assert record
    np.testing.assert_array_equal(af.open_array(out, "x").read(np.arange(N)), np.load(inputs["x"]))
