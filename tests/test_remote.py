"""Data on object storage, against a real S3 API: moto's server on a free port of 127.0.0.1.

The server is a subprocess started once for the module and stopped by its pid. Credentials and
the endpoint come from the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` …), as on a
cluster, except where a test passes ``storage_options`` on purpose. Stores are written with the
public API (``convert`` to ``s3://``, or written locally and uploaded object by object), and
every read is compared bit for bit with the same data read from local disk. Failures a server
cannot be made to produce on demand (503 then success, 403 on one object) come from a small
HTTP server serving a store directory, through fsspec's ``http://`` filesystem.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import scipy.sparse

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import s3fs

import arrayfeed as af
from arrayfeed._cli import main
from arrayfeed._storage import Source
from arrayfeed._storage.remote import fetcher as remote_module
from arrayfeed.testing import SourceTests

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
        yield endpoint
    finally:
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


# -- URLs are URLs ---------------------------------------------------------------------------------
def test_a_url_is_never_mangled_into_a_path(bucket: str) -> None:
    assert af._storage.split_spec("s3://b/train.zarr:x") == ("s3://b/train.zarr", "x")
    assert af._storage.split_spec("http://h:80/d/x.npy") == ("http://h:80/d/x.npy", None)
    with pytest.raises(af.SourceNotFoundError, match=f"s3://{bucket}/none.zarr"):
        af.open_array(f"s3://{bucket}/none.zarr:x")


@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_reads_are_bit_exact_in_every_shuffle_mode(
    stores: tuple[Path, str], shuffle: bool | str
) -> None:
    local, url = stores
    sources = [af.open_array(f"{url}:{k}") for k in ("x", "y")]
    remote = _all(af.batches(tuple(sources), batch_size=100, shuffle=shuffle, seed=3, shard=None))
    mine = _all(
        af.batches(
            (f"{local}:x", f"{local}:y"), batch_size=100, shuffle=shuffle, seed=3, shard=None
        )
    )
    _same(remote, mine)
    fetcher = sources[0].chunk_reader.fetcher  # type: ignore[attr-defined]
    assert fetcher is not None  # read by arrayfeed's own chunk reader, not zarr's
    assert fetcher.requests == -(-ROWS // CHUNK)  # every chunk requested once


def test_shards_and_resume_match_local_disk(stores: tuple[Path, str]) -> None:
    local, url = stores
    for index in range(2):
        kwargs: dict[str, Any] = dict(
            batch_size=64, shuffle="block", seed=5, shard=af.Shard(2, index), num_threads=2
        )
        remote = _all(af.batches((f"{url}:x", f"{url}:y"), **kwargs))
        _same(remote, _all(af.batches((f"{local}:x", f"{local}:y"), **kwargs)))
    full = af.batches(f"{url}:y", batch_size=64, shuffle=True, seed=9, shard=None)
    epochs = [[np.array(b) for b in full] for _ in range(2)]
    resumed = af.batches(
        f"{url}:y", batch_size=64, shuffle=True, seed=9, shard=None, start_epoch=1, start_step=4
    )
    tail = [np.array(b) for b in resumed]
    assert [t.tobytes() for t in tail] == [e.tobytes() for e in epochs[1][4:]]


def test_from_arrays_takes_urls_and_storage_options(
    stores: tuple[Path, str], moto: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = stores
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    options = {"endpoint_url": moto, "key": "testing", "secret": "testing"}
    ds = af.from_arrays(
        f"{url}:x", f"{url}:y", batch_size=250, shuffle=False, storage_options=options
    )
    got = [(x.numpy(), y.numpy()) for x, y in ds]
    data = _data()
    assert np.array_equal(np.concatenate([g[0] for g in got]), data["x"])
    assert np.array_equal(np.concatenate([g[1] for g in got]), data["y"])


def _read_in_child(source: Source) -> bytes:
    return source.read(np.arange(0, ROWS, 7, dtype=np.int64)).tobytes()


_INHERITED: list[Source] = []


def _read_inherited(queue: Any) -> None:
    queue.put(_read_in_child(_INHERITED[0]))


def test_a_source_pickles_as_its_url_and_reopens_in_a_spawned_process(
    stores: tuple[Path, str],
) -> None:
    import multiprocessing

    _, url = stores
    source = af.open_array(f"{url}:x")
    expected = _data()["x"][::7].tobytes()
    assert url.encode() in pickle.dumps(source)
    assert _read_in_child(pickle.loads(pickle.dumps(source))) == expected
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_read_in_child, (source,)) == expected
    source.read(np.arange(10, dtype=np.int64))  # in use here: its event loop has a thread
    _INHERITED[:] = [source]
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=_read_inherited, args=(queue,))  # inherited, not pickled
    child.start()
    try:
        assert queue.get(timeout=60) == expected
    finally:
        child.join(timeout=10)
        _INHERITED.clear()


# -- convert, inspect, bench ---------------------------------------------------------------------
def test_a_sparse_matrix_into_s3_as_csr(bucket: str) -> None:
    matrix = scipy.sparse.random(ROWS, 40, density=0.1, format="csr", random_state=3)
    url = f"s3://{bucket}/m.zarr"
    record = af.convert({"m": matrix}, url, chunk_rows=100, compression="lzf", progress=False)
    assert record.sparse == {"m": (40, matrix.nnz)} and af.written_by_arrayfeed(url) == record
    source = af.open_array(url, "m")
    assert source.read(np.arange(ROWS, dtype=np.int64)).tobytes() == matrix.toarray().tobytes()
    assert af.verify(url, progress=False).arrays == ("m",)


def test_convert_into_s3_and_back(tmp_path: Path, bucket: str) -> None:
    data = _data()
    url = f"s3://{bucket}/out.zarr"
    record = af.convert(data, url, chunk_rows=200, compression="gzip", progress=False)
    assert record.complete and af.written_by_arrayfeed(url) == record
    for name, array in data.items():
        source = af.open_array(url, name)
        assert source.strict  # type: ignore[attr-defined]
        assert source.read(np.arange(ROWS, dtype=np.int64)).tobytes() == array.tobytes()
    assert af.verify(url, progress=False).rows == ROWS
    with pytest.raises(af.OutputExistsError, match="overwrite"):
        af.convert(data, url, progress=False)
    back = tmp_path / "back.h5"
    af.convert({"x": f"{url}:x", "y": f"{url}:y"}, back, shuffle=True, seed=1, progress=False)
    y_back = af.open_array(back, "y").read(np.arange(ROWS, dtype=np.int64))
    assert np.array_equal(np.sort(y_back), np.sort(data["y"]))
    af.convert({"x": data["x"][:10]}, url, overwrite=True, progress=False)
    assert af.open_array(url, "x").shape == (10, 6, 4)
    with pytest.raises(af.SourceNotFoundError):
        af.open_array(url, "y")  # the old store went first
    with pytest.raises(af.ConfigError, match=r"\.zarr"):
        af.convert(data, f"s3://{bucket}/out.h5", progress=False)


def test_npy_and_hdf5_behind_urls(tmp_path: Path, bucket: str) -> None:
    data = _data()
    np.save(tmp_path / "x.npy", data["x"])
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("x", data=data["x"], chunks=(100, 6, 4), compression="gzip")
        f.create_dataset("y", data=data["y"])
    npy = _upload(tmp_path / "x.npy", f"s3://{bucket}/parts/x.npy")
    h5 = _upload(tmp_path / "d.h5", f"s3://{bucket}/d.h5")
    idx = np.sort(np.random.default_rng(1).choice(ROWS, 300, replace=False))
    for source in (af.open_array(npy), af.open_array(f"{h5}:x")):
        assert source.read(idx).tobytes() == data["x"][idx].tobytes()
        assert pickle.loads(pickle.dumps(source)).read(idx).tobytes() == data["x"][idx].tobytes()
    kwargs: dict[str, Any] = dict(batch_size=200, shuffle="block", seed=0, shard=None)
    got = [np.array(b) for b in af.batches(f"{h5}:x", **kwargs)]
    mine = [np.array(b) for b in af.batches(f"{tmp_path / 'd.h5'}:x", **kwargs)]
    assert [g.tobytes() for g in got] == [m.tobytes() for m in mine]
    af.convert({"x": f"s3://{bucket}/parts/*.npy"}, tmp_path / "c.zarr", progress=False)
    assert af.open_array(tmp_path / "c.zarr", "x").read(idx).tobytes() == data["x"][idx].tobytes()
    assert [a.name for a in af.inspect(h5).arrays] == ["x", "y"]


def test_inspect_and_bench_and_the_command_line(
    stores: tuple[Path, str], moto: str, capsys: pytest.CaptureFixture[str], bucket: str
) -> None:
    _, url = stores
    report = af.inspect(url)
    assert report.path == url and report.format == "Zarr v3" and report.record is not None
    assert str(report).startswith(f"{url}: Zarr v3, 2 arrays")
    result = af.bench({"x": f"{url}:x"}, seconds=0.2, modes=("block", "none"))
    assert result.rows == ROWS and result.modes["block"] > 0
    option = ["--storage-option", f"endpoint_url={moto}"]
    assert main(["inspect", url, *option]) == 0
    assert f"{url}: Zarr v3" in capsys.readouterr().out
    assert main(["bench", f"x={url}:x", "--seconds", "0.1", *option]) == 0
    assert "from_arrays(shuffle='block')" in capsys.readouterr().out
    out = f"s3://{bucket}/cli.zarr"
    assert main(["convert", f"y={url}:y", "-o", out, "-q", *option]) == 0
    assert main(["verify", out, "-q", *option]) == 0
    assert main(["convert", f"y={url}:y", "-o", out, "-q"]) == 1
    assert "already holds a Zarr store" in capsys.readouterr().err


# -- an interrupted conversion never looks complete ------------------------------------------------
def test_an_unfinished_conversion_is_refused_and_replaced(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import arrayfeed._conversion.copy as copy_module
    import arrayfeed._conversion.tourl as tourl

    data = _data()
    url = f"s3://{bucket}/cut.zarr"
    writes = 0

    def fail_after_two(writer: Any, name: str, start: int, rows: np.ndarray) -> None:
        nonlocal writes
        writes += 1
        if writes > 2:
            raise KeyboardInterrupt  # as Ctrl-C (or a kill) half-way through
        writer.write(name, start, rows)

    with monkeypatch.context() as m:
        m.setattr(copy_module, "write_rows", fail_after_two)
        m.setenv(copy_module.TEST_HOOK_ENV, "0")  # one chunk per slab
        m.setattr(tourl, "remove_store", lambda output: None)  # as after `kill -9`
        with pytest.raises(KeyboardInterrupt):
            af.convert(data, url, chunk_rows=100, progress=False)
    assert af.written_by_arrayfeed(url).complete is False  # type: ignore[union-attr]
    with pytest.raises(af.CorruptDataError, match="has not finished"):
        af.open_array(url, "x")
    assert "UNFINISHED" in str(af.inspect(url))
    _fs().pipe({f"{bucket}/cut.zarr/stray": b"left over"})
    record = af.convert(data, url, chunk_rows=100, progress=False)  # no overwrite needed
    assert record.complete and not _fs().exists(f"{bucket}/cut.zarr/stray")
    assert af.open_array(url, "y").read(np.arange(ROWS, dtype=np.int64)).tobytes() == (
        data["y"].tobytes()
    )


def test_a_failed_conversion_removes_what_it_wrote(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import arrayfeed._conversion.copy as copy_module

    def fail(writer: Any, name: str, start: int, rows: np.ndarray) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(copy_module, "write_rows", fail)
    with pytest.raises(af.DestinationError, match="disk on fire"):
        af.convert(_data(), f"s3://{bucket}/gone.zarr", progress=False)
    assert not _fs().exists(f"{bucket}/gone.zarr")


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


# -- the Source contract, for the remote backends ----------------------------------------------------
class _Remote(SourceTests):
    dtypes = ("float64", ">i2", "bool")
    row_shapes = ((4, 3), ())
    n_rows = 120


class TestRemoteZarrSource(_Remote):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        bucket = f"b{uuid.uuid4().hex[:12]}"
        _fs().mkdir(bucket)
        af.convert({"a": data}, tmp_path / "s.zarr", chunk_rows=32, progress=False)
        return af.open_array(_upload(tmp_path / "s.zarr", f"s3://{bucket}/s.zarr") + ":a")


class TestRemoteH5Source(_Remote):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        bucket = f"b{uuid.uuid4().hex[:12]}"
        _fs().mkdir(bucket)
        with h5py.File(tmp_path / "s.h5", "w") as f:
            f.create_dataset("a", data=data, chunks=(32, *data.shape[1:]))
        return af.open_array(_upload(tmp_path / "s.h5", f"s3://{bucket}/s.h5"), "a")


class TestRemoteNpySource(_Remote):
    def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
        bucket = f"b{uuid.uuid4().hex[:12]}"
        _fs().mkdir(bucket)
        np.save(tmp_path / "s.npy", data)
        return af.open_array(_upload(tmp_path / "s.npy", f"s3://{bucket}/s.npy"))
