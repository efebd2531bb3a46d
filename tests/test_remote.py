"""Data on object storage, against a real S3 API: moto's server on a free port of 127.0.0.1.

The server runs for the module (:mod:`tests._moto`). Credentials and the endpoint come from the
environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` …), as on a cluster, except where a test
passes ``storage_options`` on purpose. Stores are written with the public API (``convert`` to
``s3://``, or written locally and uploaded object by object), and every read is compared bit for
bit with the same data read from local disk. Failures are in ``test_remote_errors.py``.
"""

from __future__ import annotations

import contextlib
import http.server
import pickle
import socket
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import scipy.sparse

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import s3fs
import zarr

import arrayfeed as af
from arrayfeed._cli import main
from arrayfeed._storage import Source
from arrayfeed.storage import written_by_arrayfeed
from arrayfeed.testing import SourceTests
from arrayfeed.testing.latency import LatencyProxy

from . import _moto
from ._feeds import force_retuning
from ._moto import (
    CHUNK,
    ROWS,
    _all,
    _data,
    _fs,
    _same,
    _upload,
)

# The server and its fixtures, for this module.
moto, aws_env, bucket, stores = _moto.moto, _moto.aws_env, _moto.bucket, _moto.stores


# -- reads that wait ------------------------------------------------------------------------------
@pytest.mark.parametrize("processes", [0, 1])
def test_a_store_behind_latency_streams_the_same_whatever_reads_at_once(
    stores: tuple[Path, str], aws_env: str, monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    """Zarr on S3 with 20 ms per request (a proxy): the reads at once re-drawn at random on
    every request, here and in a loader, and the stream is that of one thread on local disk."""
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.GROUP_BYTES", 4 << 10)  # many groups
    monkeypatch.setattr("arrayfeed._pipeline.read.feed.MAX_GROUP_BYTES", 4 << 10)
    local, url = stores
    kwargs: dict[str, Any] = {"batch_size": 32, "shuffle": "block", "seed": 11, "shard": None}
    expected = _all(af.batches(f"{local}:x", f"{local}:y", num_threads=1, processes=0, **kwargs))
    with LatencyProxy(aws_env, 0.02) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        s3fs.S3FileSystem.clear_instance_cache()
        b = af.batches(f"{url}:x", f"{url}:y", processes=processes, **kwargs)
        chaos = force_retuning(b, seed=processes)
        try:
            got = _all(b)
        finally:
            del b
            s3fs.S3FileSystem.clear_instance_cache()  # clients of the proxy, gone after the block
    assert proxy.held >= ROWS // CHUNK  # every chunk came through the proxy
    assert len(chaos.asked) >= 3  # the setting really moved
    _same(got, expected)


@pytest.mark.parametrize("processes", [0, 1])
def test_each_chunk_is_one_request(
    stores: tuple[Path, str], aws_env: str, monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    """A chunk is one GET: s3fs (from 2025) asks for an object's size first (a HEAD) unless told
    not to split it, which doubles the round trips per chunk, the time each read waits and the
    requests billed."""
    local, url = stores
    chunks = 2 * -(-ROWS // CHUNK)  # x and y
    with LatencyProxy(aws_env, 0.0001) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        s3fs.S3FileSystem.clear_instance_cache()
        b = af.batches(f"{url}:x", f"{url}:y", batch_size=100, shuffle=False, processes=processes)
        try:
            got = _all(b)
        finally:
            del b
            s3fs.S3FileSystem.clear_instance_cache()
    _same(got, _all(af.batches(f"{local}:x", f"{local}:y", batch_size=100, shuffle=False)))
    assert proxy.requests["GET"] >= chunks, proxy.requests  # (and the metadata)
    assert proxy.requests["HEAD"] == 0, proxy.requests


def test_each_chunk_of_an_array_opened_by_the_user_is_one_request(
    stores: tuple[Path, str], aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user opened the array with zarr, on a filesystem of s3fs's defaults (which ask for
    each object's size first): its chunks, and the metadata arrayfeed reads, are still one GET
    each (what zarr reads through the array's own store is zarr's)."""
    local, url = stores
    with LatencyProxy(aws_env, 0.0001) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        s3fs.S3FileSystem.clear_instance_cache()
        array = zarr.open_array(f"{url}/x", mode="r")
        opened = proxy.requests.copy()  # (zarr's own reads of its metadata, on its defaults)
        b = af.batches(array, batch_size=100, shuffle=False, processes=0)
        built = proxy.requests.copy()
        try:
            got = _all(b)
        finally:
            del b, array
            s3fs.S3FileSystem.clear_instance_cache()
    _same(got, _all(af.batches(f"{local}:x", batch_size=100, shuffle=False)))
    # Built: the group above the array opened through its own store (zarr's read) asks once.
    assert (built - opened)["HEAD"] <= 1, (opened, built)
    reading = proxy.requests - built
    assert reading["HEAD"] == 0 and reading["GET"] >= 1, (built, reading)


def test_the_latency_proxy_holds_each_request_and_passes_every_byte() -> None:
    """What the latency tests rest on: a request through the proxy arrives whole, and no sooner
    than the time it is held."""
    listener = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):  # the proxy may end the connection abruptly
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    server = threading.Thread(target=echo, daemon=True)
    server.start()
    payload = bytes(range(256)) * 40
    target = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with (
        LatencyProxy(target, 0.05) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as client,
    ):
        began = time.perf_counter()
        client.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += client.recv(1 << 16)
        waited = time.perf_counter() - began
    server.join(10)
    listener.close()
    assert got == payload
    assert waited >= 0.05
    assert proxy.held >= 1


@pytest.mark.parametrize("seconds", [0.0, 0.01])
def test_the_latency_proxy_counts_requests_by_method(seconds: float) -> None:
    class Empty(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Empty)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with LatencyProxy(f"http://127.0.0.1:{server.server_port}", seconds) as proxy:
            for method in ("GET", "HEAD", "GET"):
                request = urllib.request.Request(f"{proxy.url}/k", method=method)
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
    finally:
        server.shutdown()
    assert proxy.requests == {"GET": 2, "HEAD": 1}


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
    remote = _all(  # read here: the requests counted below are this process's
        af.batches(tuple(sources), batch_size=100, shuffle=shuffle, seed=3, shard=None, processes=0)
    )
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
    assert record.sparse == {"m": (40, matrix.nnz)} and written_by_arrayfeed(url) == record
    source = af.open_array(url, "m")
    assert source.read(np.arange(ROWS, dtype=np.int64)).tobytes() == matrix.toarray().tobytes()
    assert af.verify(url, progress=False).arrays == ("m",)


def test_convert_into_s3_and_back(tmp_path: Path, bucket: str) -> None:
    data = _data()
    url = f"s3://{bucket}/out.zarr"
    record = af.convert(data, url, chunk_rows=200, compression="gzip", progress=False)
    assert record.complete and written_by_arrayfeed(url) == record
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
    assert "batches(shuffle='block')" in capsys.readouterr().out
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
    import arrayfeed._storage.zarr.write as zarr_write

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
        m.setattr(zarr_write, "remove_store", lambda output: None)  # as after `kill -9`
        with pytest.raises(KeyboardInterrupt):
            af.convert(data, url, chunk_rows=100, progress=False)
    assert written_by_arrayfeed(url).complete is False  # type: ignore[union-attr]
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
