"""Object storage failing: each failure a named error that says how to fix it, nothing else.

Against moto's S3 server (:mod:`tests._moto`): a missing bucket, missing credentials, denied
access, a deleted chunk, fsspec not installed, an endpoint nobody answers at. Failures a server
cannot be made to produce on demand (503 then success, 403 on one object) come from a small HTTP
server serving a store directory, through fsspec's ``http://`` filesystem.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import s3fs

import arrayfeed as af
from arrayfeed._storage.remote import fetcher as remote_module

from . import _moto
from ._moto import (
    CHUNK,
    ROWS,
    _all,
    _data,
    _free_port,
    _fs,
    _upload,
)

# The server and its fixtures, for this module.
moto, aws_env, bucket, stores = _moto.moto, _moto.aws_env, _moto.bucket, _moto.stores


# -- errors ----------------------------------------------------------------------------------------
def test_a_wrong_bucket_is_named(tmp_path: Path) -> None:
    with pytest.raises(af.SourceNotFoundError, match=r"bucket 'no-such-bucket' .* does not exist"):
        af.open_array("s3://no-such-bucket/train.zarr:x")
    with pytest.raises(af.SourceNotFoundError, match="bucket 'no-such-bucket'"):
        af.inspect("s3://no-such-bucket/train.zarr")
    with pytest.raises(af.DestinationError, match="create the bucket first"):
        af.convert({"x": np.zeros(4)}, "s3://no-such-bucket/out.zarr", progress=False)


def test_missing_credentials_are_named(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, url = stores
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(af.SourceUnavailableError, match=r"no credentials .*AWS_ACCESS_KEY_ID"):
            af.open_array(url, "x")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def _moto_auth(endpoint: str, free_requests: str) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=free_requests.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(request, timeout=10).close()


def test_access_denied_for_bad_keys_is_named(
    stores: tuple[Path, str], moto: str, tmp_path: Path
) -> None:
    import boto3

    _, url = stores
    np.save(tmp_path / "y.npy", _data()["y"])
    npy = _upload(tmp_path / "y.npy", url.replace("train.zarr", "y.npy"))
    iam = boto3.client("iam", endpoint_url=moto, region_name="us-east-1")
    user = f"u{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
    keys = iam.create_access_key(UserName=user)["AccessKey"]
    good = {"key": keys["AccessKeyId"], "secret": keys["SecretAccessKey"]}
    _moto_auth(moto, "0")  # from now on, moto checks every request's signature and policy
    try:
        # Good keys pass (moto 5.2 miscomputes the signature of listings, which Zarr's open
        # makes, so the good keys read a .npy object: GETs and HEADs only).
        source = af.open_array(npy, storage_options=good)
        assert source.read(np.arange(ROWS, dtype=np.int64)).tobytes() == _data()["y"].tobytes()
        with pytest.raises(af.SourceUnavailableError, match=r"denied .*403"):
            af.open_array(f"{url}:y", storage_options={"key": "AKIABAD", "secret": "bad"})
        with pytest.raises(af.DestinationError, match="denied"):
            af.convert(
                {"x": np.zeros(3)},
                url.replace("train", "new"),
                storage_options={"key": "AKIABAD", "secret": "bad"},
                progress=False,
            )
    finally:
        _moto_auth(moto, "inf")


def test_a_chunk_deleted_from_a_marked_store_is_corruption(stores: tuple[Path, str]) -> None:
    _, url = stores
    root = url.split("://", 1)[1]
    _fs().rm(f"{root}/x/c/3/0/0")
    source = af.open_array(url, "x")
    with pytest.raises(af.CorruptDataError, match=r"chunk \(3, 0, 0\) .* is missing"):
        _all(af.batches(source, batch_size=100, shuffle="block", seed=0, shard=None))
    with pytest.raises(af.CorruptDataError, match="is missing"):
        source.read(np.arange(3 * CHUNK, 3 * CHUNK + 2, dtype=np.int64))


def test_without_fsspec_a_url_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)  # `import fsspec` raises ImportError
    with pytest.raises(af.SourceUnavailableError, match=r'pip install "arrayfeed\[remote\]"'):
        af.open_array("s3://bucket/train.zarr:x")
    with pytest.raises(af.DestinationError, match=r'pip install "arrayfeed\[remote\]"'):
        af.convert({"x": np.zeros(3)}, "s3://bucket/out.zarr", progress=False)
    code = (
        "import sys; sys.modules['fsspec'] = sys.modules['s3fs'] = None\n"
        "import arrayfeed, numpy as np\n"
        "assert len(arrayfeed.batches(np.zeros((10, 2)), batch_size=5)) == 2\n"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["s3://bucket/x.zarr", "s3://bucket/x.zarr:x", "s3://bucket/x"])
def test_an_endpoint_that_does_not_answer_ends_with_the_named_error_alone(spec: str) -> None:
    """zarr-python reads a store's metadata with several requests at once, and left the others
    running when one failed: at exit, a traceback for each ("Exception ignored in: <coroutine
    object StorePath.get ...>"). The error must be all that a failed open leaves."""
    options = {"endpoint_url": f"http://127.0.0.1:{_free_port()}", "key": "k", "secret": "s"}
    code = f"import arrayfeed as af\naf.open_array({spec!r}, storage_options={options!r})\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode != 0
    assert "SourceUnavailableError" in done.stderr and "could not be read" in done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "was never awaited" not in done.stderr, done.stderr


# -- transient failures: a small HTTP server in front of a store directory --------------------------
class _Flaky(http.server.SimpleHTTPRequestHandler):
    """Serves a directory; chunk GETs fail as ``self.server.plan`` says."""

    def do_GET(self) -> None:
        server: Any = self.server
        if "/c/" in self.path:
            with server.lock:
                seen = server.seen.get(self.path, 0)
                server.seen[self.path] = seen + 1
            status = server.plan(self.path, seen)
            if status is not None:
                self.send_error(status)
                return
        super().do_GET()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serve(directory: Path, plan: Callable[[str, int], int | None]) -> Iterator[str]:
    def handler(*args: Any, **kwargs: Any) -> _Flaky:
        return _Flaky(*args, directory=str(directory), **kwargs)

    server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.plan, server.seen, server.lock = plan, {}, threading.Lock()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_failing_twice_then_answering_is_retried(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    local, _ = stores
    monkeypatch.setattr(remote_module, "BACKOFF", 0.01)
    with _serve(local.parent, lambda path, seen: 503 if seen < 2 else None) as base:
        source = af.open_array(f"{base}/train.zarr:x")
        rows = source.read(np.arange(ROWS, dtype=np.int64))
    assert rows.tobytes() == _data()["x"].tobytes()


def test_a_server_that_keeps_failing_or_refuses_is_named(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    local, _ = stores
    monkeypatch.setattr(remote_module, "BACKOFF", 0.01)
    with _serve(
        local.parent, lambda path, seen: 503 if path.endswith("/c/2/0/0") else None
    ) as base:
        source = af.open_array(f"{base}/train.zarr:x")
        with pytest.raises(af.SourceUnavailableError, match=r"after 5 attempts .*503"):
            source.read(np.arange(ROWS, dtype=np.int64))
        assert source.read(np.arange(CHUNK, dtype=np.int64)).shape == (CHUNK, 6, 4)
    with _serve(local.parent, lambda path, seen: 403) as base:
        source = af.open_array(f"{base}/train.zarr:x")
        with pytest.raises(af.SourceUnavailableError, match="denied"):
            source.read(np.arange(10, dtype=np.int64))
