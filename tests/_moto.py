"""A real S3 API for the tests of object storage: moto's server on a free port of 127.0.0.1.

The server is a subprocess started once for each test module that binds :func:`moto` and
stopped by its pid. Credentials and the endpoint come from the environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` …, :func:`aws_env`), as on a cluster. Stores are
written with the public API or locally and uploaded object by object (:func:`_upload`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import s3fs

import arrayfeed as af

__all__ = [
    "CHUNK",
    "ROWS",
    "_all",
    "_data",
    "_free_port",
    "_fs",
    "_same",
    "_upload",
    "aws_env",
    "bucket",
    "moto",
    "stores",
]

ROWS = 1500
CHUNK = 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    """The endpoint of a moto S3 server running for this module."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        # Filesystems cached for another module's server (the endpoint comes from the
        # environment, which is not part of s3fs's cache key) would call a server that is gone.
        s3fs.S3FileSystem.clear_instance_cache()
        yield endpoint
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        os.kill(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, 9)
            proc.wait()


@pytest.fixture(autouse=True)
def aws_env(moto: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Credentials and endpoint from the environment, as on a cluster."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto


def _fs() -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(skip_instance_cache=True)


@pytest.fixture
def bucket() -> str:
    name = f"b{uuid.uuid4().hex[:12]}"
    _fs().mkdir(name)
    return name


def _upload(local: Path, url: str) -> str:
    """Upload a file or a directory tree, object by object."""
    fs, root = _fs(), url.split("://", 1)[1]
    if local.is_file():
        fs.pipe({root: local.read_bytes()})
        return url
    fs.pipe(
        {
            f"{root}/{p.relative_to(local).as_posix()}": p.read_bytes()
            for p in sorted(local.rglob("*"))
            if p.is_file()
        }
    )
    return url


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(ROWS, 6, 4)).astype(np.float32),
        "y": rng.integers(0, 1000, ROWS).astype(np.int64),
    }


@pytest.fixture
def stores(tmp_path: Path, bucket: str) -> tuple[Path, str]:
    """The same converted Zarr store on local disk and at an s3:// URL."""
    local = tmp_path / "train.zarr"
    af.convert(_data(), local, chunk_rows=CHUNK, compression="lzf", progress=False)
    return local, _upload(local, f"s3://{bucket}/train.zarr")


def _all(batches: af.Batches) -> list[tuple[np.ndarray, ...]]:
    return [tuple(np.array(leaf) for leaf in batch) for batch in batches]


def _same(a: list[tuple[np.ndarray, ...]], b: list[tuple[np.ndarray, ...]]) -> None:
    assert len(a) == len(b)
    for left, right in zip(a, b, strict=True):
        for u, v in zip(left, right, strict=True):
            assert u.dtype == v.dtype and u.shape == v.shape
            assert u.tobytes() == v.tobytes()
