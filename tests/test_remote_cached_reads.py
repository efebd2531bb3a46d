"""Zarr, ``.npy`` and HDF5 on S3 (moto's server, :mod:`tests._moto`) read through the local cache
(``cache=``): later epochs, processes and jobs fetch nothing again; copies damaged in the cache
and objects replaced on the store are fetched anew, never returned stale; no credentials reach
the cache. The cache on its own is tested in ``test_remote_cache.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import s3fs
import zarr

import arrayfeed as af
from arrayfeed._cli import main
from arrayfeed._storage import kept_locally
from arrayfeed._storage.remote import blocks
from arrayfeed.testing.latency import LatencyProxy

from . import _moto
from ._moto import CHUNK, ROWS, _data, _upload

moto, aws_env, bucket, stores = _moto.moto, _moto.aws_env, _moto.bucket, _moto.stores

LIMIT = 1 << 30
CHUNKS = -(-ROWS // CHUNK)


@pytest.fixture
def proxy(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[LatencyProxy]:
    """A proxy in front of the server that counts requests; no chunks kept in memory, so
    that every read goes to the cache or the store."""
    monkeypatch.setenv("ARRAYFEED_REMOTE_CACHE_BYTES", "0")
    with LatencyProxy(aws_env, 0.0001) as counting:
        monkeypatch.setenv("AWS_ENDPOINT_URL", counting.url)
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            yield counting
        finally:
            s3fs.S3FileSystem.clear_instance_cache()


def _feed(source: Any, processes: int = 0) -> af.Batches:
    return af.batches(source, batch_size=100, shuffle=True, seed=3, shard=None, processes=processes)


def _epoch(b: af.Batches) -> list[bytes]:
    return [np.array(batch).tobytes() for batch in b]


def _report(cache: Path) -> af.CacheReport:
    return af.cache_report(cache, cache_limit=LIMIT)


def test_zarr_epochs_after_the_first_fetch_nothing(
    stores: tuple[Path, str], proxy: LatencyProxy, tmp_path: Path
) -> None:
    local, url = stores
    cache = tmp_path / "cache"
    source = af.open_array(f"{url}:x", cache=cache, cache_limit=LIMIT)
    # Reads planned as local ones: the waits of a cold cache are not the next epochs'.
    assert kept_locally(source) and not kept_locally(af.open_array(f"{url}:x"))
    b = _feed(source)  # (reads a little)
    first = _epoch(b)
    after_first = proxy.requests.copy()
    later = _epoch(b) + _epoch(b)
    assert after_first["GET"] >= CHUNKS
    assert proxy.requests == after_first  # epochs 2 and 3: no request at all
    expected = _feed(f"{local}:x")
    assert first + later == _epoch(expected) + _epoch(expected) + _epoch(expected)
    report = _report(cache)
    assert (report.misses, report.objects) == (CHUNKS, CHUNKS)
    assert report.hits >= 2 * CHUNKS  # (more: nothing is kept in memory here)


def test_a_new_process_finds_what_an_earlier_one_cached(
    stores: tuple[Path, str], proxy: LatencyProxy, tmp_path: Path
) -> None:
    _, url = stores
    cache = tmp_path / "cache"
    first = _epoch(_feed(af.open_array(f"{url}:x", cache=cache, cache_limit=LIMIT)))
    # This process writes its counts at most half a second late: written now, they cannot land
    # inside the new process's own reads (its start can take less than that).
    _report(cache)
    code = (
        "import json, sys, numpy as np, arrayfeed as af\n"
        "before = af.cache_report(sys.argv[2], cache_limit=1 << 30)\n"
        "s = af.open_array(sys.argv[1], cache=sys.argv[2], cache_limit=1 << 30)\n"
        "rows = s.read(np.arange(len(s)))\n"
        "done = af.cache_report(sys.argv[2], cache_limit=1 << 30).since(before)\n"
        "print(json.dumps([done.hits, done.misses, s.chunk_reader.fetcher.requests, "
        "rows.tobytes().hex()[:64]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, f"{url}:x", str(cache)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0, out.stderr
    hits, misses, requests, head = json.loads(out.stdout.strip().splitlines()[-1])
    assert (hits, misses, requests) == (CHUNKS, 0, 0), out.stderr
    assert head == _data()["x"].tobytes().hex()[:64]
    assert len(first) == -(-ROWS // 100)


def test_loader_processes_read_through_the_same_cache(
    stores: tuple[Path, str], proxy: LatencyProxy, tmp_path: Path
) -> None:
    local, url = stores
    cache = tmp_path / "cache"
    b = _feed(af.open_array(f"{url}:x", cache=cache, cache_limit=LIMIT), processes=1)
    try:
        first = _epoch(b)
        before = proxy.requests.copy()
        second = _epoch(b)
        assert proxy.requests == before  # the loader's second epoch: all from the cache
    finally:
        del b
    expected = _feed(f"{local}:x")
    assert first + second == _epoch(expected) + _epoch(expected)
    deadline = time.monotonic() + 10  # the loader writes its counts within half a second
    while _report(cache).hits < CHUNKS and time.monotonic() < deadline:
        time.sleep(0.1)
    report = _report(cache)
    assert report.misses == CHUNKS and report.hits >= CHUNKS  # counted in the loader


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_copies_damaged_in_the_cache_are_fetched_again_never_returned(
    stores: tuple[Path, str], proxy: LatencyProxy, tmp_path: Path, damage: str
) -> None:
    _, url = stores
    cache = tmp_path / "cache"
    _epoch(_feed(af.open_array(f"{url}:x", cache=cache, cache_limit=LIMIT)))
    files = sorted(p for p in (cache / "objects").rglob("*") if p.is_file())
    assert len(files) == CHUNKS
    for path in files[::3]:
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x40
            path.write_bytes(bytes(data))
        elif damage == "truncate":
            path.write_bytes(bytes(data[:-1]))
        else:
            path.unlink()
    before = _report(cache)
    source = af.open_array(f"{url}:x", cache=cache, cache_limit=LIMIT)
    got = source.read(np.arange(ROWS, dtype=np.int64))
    assert got.tobytes() == _data()["x"].tobytes()  # no wrong row
    done = _report(cache).since(before)
    damaged = len(files[::3])
    assert (done.corrupt_dropped, done.misses, done.hits) == (damaged, damaged, CHUNKS - damaged)


def _replace_chunk(tmp_path: Path, url: str) -> np.ndarray:
    """Overwrite the first chunk of ``x`` on the store with that of other data; the new rows."""
    other = {name: array[::-1].copy() for name, array in _data().items()}
    store = tmp_path / "other.zarr"
    af.convert(other, store, chunk_rows=CHUNK, compression="lzf", progress=False)
    _upload(store / "x" / "c" / "0" / "0" / "0", f"{url}/x/c/0/0/0")
    return other["x"][:CHUNK]


def test_a_chunk_replaced_on_the_store_is_read_anew(
    stores: tuple[Path, str], proxy: LatencyProxy, tmp_path: Path
) -> None:
    _, url = stores
    cache = tmp_path / "cache"
    first = af.open_array(f"{url}:x", cache=cache, cache_limit=LIMIT)
    rows = np.arange(ROWS, dtype=np.int64)
    assert first.read(rows).tobytes() == _data()["x"].tobytes()
    new = _replace_chunk(tmp_path, url)
    again = af.open_array(f"{url}:x", cache=cache, cache_limit=LIMIT).read(rows)
    assert again[:CHUNK].tobytes() == new.tobytes()  # never the copy of the old version
    assert again[CHUNK:].tobytes() == _data()["x"][CHUNK:].tobytes()
    assert _report(cache).stale_dropped == 1


def _single_files(tmp_path: Path, bucket: str, x: np.ndarray) -> dict[str, str]:
    np.save(tmp_path / "x.npy", x)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(100, 6, 4), compression="gzip")
    return {
        "npy": _upload(tmp_path / "x.npy", f"s3://{bucket}/x.npy"),
        "hdf5": _upload(tmp_path / "d.h5", f"s3://{bucket}/d.h5") + ":x",
    }


@pytest.mark.parametrize("kind", ["npy", "hdf5"])
def test_npy_and_hdf5_are_read_in_cached_blocks_and_replaced_files_anew(
    proxy: LatencyProxy,
    tmp_path: Path,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 16 << 10)  # several blocks
    x = _data()["x"]
    url = _single_files(tmp_path, bucket, x)[kind]
    cache = tmp_path / "cache"
    idx = np.sort(np.random.default_rng(1).choice(ROWS, 300, replace=False))
    first = af.open_array(url, cache=cache, cache_limit=LIMIT)
    assert kept_locally(first) and not kept_locally(af.open_array(url))
    assert first.read(idx).tobytes() == x[idx].tobytes()
    everything = np.arange(ROWS, dtype=np.int64)
    assert first.read(everything).tobytes() == x.tobytes()
    fetched = _report(cache)
    size = (tmp_path / ("x.npy" if kind == "npy" else "d.h5")).stat().st_size
    assert 0 < fetched.misses <= -(-size // (16 << 10))  # each block once at most
    second = af.open_array(url, cache=cache, cache_limit=LIMIT)
    before = proxy.requests.copy()
    assert second.read(everything).tobytes() == x.tobytes()
    assert proxy.requests["GET"] == before["GET"]  # every block from the cache
    assert _report(cache).since(fetched).misses == 0
    new = x * 2  # the same size, other bytes: a new ETag
    url = _single_files(tmp_path, bucket, new)[kind]
    third = af.open_array(url, cache=cache, cache_limit=LIMIT)
    assert third.read(everything).tobytes() == new.tobytes()
    assert _report(cache).stale_dropped > 0


def test_missing_chunks_of_a_foreign_store_cost_no_request(
    proxy: LatencyProxy, tmp_path: Path, bucket: str
) -> None:
    local = tmp_path / "sparse.zarr"
    array = zarr.create_array(local, shape=(ROWS, 4), chunks=(CHUNK, 4), dtype="f4", fill_value=0)
    array[:CHUNK] = 1.0  # the other chunks are never written
    url = _upload(local, f"s3://{bucket}/sparse.zarr")
    cache = tmp_path / "cache"
    source = af.open_array(url, cache=cache, cache_limit=LIMIT)
    before = proxy.requests.copy()
    got = source.read(np.arange(ROWS, dtype=np.int64))
    assert got.tobytes() == zarr.open_array(local, mode="r")[:].tobytes()
    assert (proxy.requests - before)["GET"] == 1  # the one chunk there: the listing said so


def test_no_credentials_reach_the_cache(
    stores: tuple[Path, str],
    proxy: LatencyProxy,
    tmp_path: Path,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, url = stores
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVIRONMENTSECRETMARKER")
    options = {"key": "KEYIDMARKER", "secret": "OPTIONSECRETMARKER"}
    cache = tmp_path / "cache"
    x = _data()["x"]
    for spec in (f"{url}:x", *_single_files(tmp_path, bucket, x).values()):
        source = af.open_array(spec, storage_options=options, cache=cache, cache_limit=LIMIT)
        assert source.read(np.arange(ROWS, dtype=np.int64)).tobytes() == x.tobytes()
    af.cache_report(cache, cache_limit=LIMIT)  # every count written
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert len(files) > 3
    for path in files:
        data = path.read_bytes()
        for secret in ("ENVIRONMENTSECRETMARKER", "KEYIDMARKER", "OPTIONSECRETMARKER", bucket):
            assert secret.encode() not in data, (path, secret)


def test_verify_and_inspect_take_the_cache_on_the_command_line(
    stores: tuple[Path, str],
    proxy: LatencyProxy,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, url = stores
    cache = tmp_path / "cache"
    flags = ["--cache", str(cache), "--cache-limit", str(LIMIT)]
    assert main(["verify", url, "-q", *flags]) == 0
    assert "OK, 2 arrays" in capsys.readouterr().out
    fetched = _report(cache)
    assert fetched.misses == 2 * CHUNKS  # x and y, each chunk once
    assert main(["verify", url, "-q", *flags]) == 0  # checked again: from the cache
    assert _report(cache).since(fetched).misses == 0
    assert main(["inspect", url, *flags]) == 0
    assert main(["inspect", url, "--cache-limit", "5"]) == 1
    assert "`cache_limit` (5) needs `cache`" in capsys.readouterr().err


def test_from_arrays_and_batches_read_every_url_leaf_through_the_cache(
    stores: tuple[Path, str], proxy: LatencyProxy, tmp_path: Path
) -> None:
    local, url = stores
    cache = tmp_path / "cache"
    labels = tmp_path / "labels.npy"  # a local leaf beside them: read as it is
    np.save(labels, np.arange(ROWS))
    kwargs: dict[str, Any] = {"batch_size": 100, "seed": 3, "shard": None, "cache": cache}
    b = af.batches({"x": f"{url}:x", "y": f"{url}:y", "i": str(labels)}, **kwargs)
    first = [{k: v.tobytes() for k, v in batch.items()} for batch in b]
    before = proxy.requests.copy()
    second = [{k: v.tobytes() for k, v in batch.items()} for batch in b]
    assert proxy.requests == before and first != second  # epoch 2 from the cache
    expected = af.batches({"x": f"{local}:x", "y": f"{local}:y", "i": str(labels)}, **kwargs)
    assert first == [{k: v.tobytes() for k, v in batch.items()} for batch in expected]
    assert af.cache_report(cache).objects == 2 * CHUNKS  # (its default limit)
    ds = af.from_arrays(f"{url}:x", batch_size=100, shuffle=False, cache=cache)
    got = np.concatenate([np.asarray(batch) for batch in ds])
    assert got.tobytes() == _data()["x"].tobytes()
    with pytest.raises(af.ConfigError, match=r"`cache_limit` \(5\) needs `cache`"):
        af.batches(f"{url}:x", cache_limit=5)


def test_bench_advises_the_cache_and_reports_it(
    stores: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = stores
    plain = af.bench([f"x={url}:x"], seconds=0.2, modes=("block",))
    assert plain.cache is None and any("--cache DIR" in line for line in plain.advice)
    cache = tmp_path / "cache"
    kept = af.bench({"x": f"{url}:x"}, seconds=0.2, modes=("block",), cache=cache)
    assert kept.cache is not None and kept.cache.misses == CHUNKS
    assert not any("--cache DIR" in line for line in kept.advice)
    assert main(["bench", f"x={url}:x", "--seconds", "0.1", "--cache", str(cache)]) == 0
    assert f"cache {cache}: " in capsys.readouterr().out
