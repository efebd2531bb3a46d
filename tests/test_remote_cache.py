"""The local cache of object storage (``arrayfeed._storage.remote.cache``) on its own: real
processes racing on one directory, writers killed mid-download and mid-write, copies damaged
between reads, new versions, the bound with several writers, permissions. Reads from S3
through it are in ``test_remote_cached_reads.py``."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import arrayfeed as af
from arrayfeed._storage import cache_bytes_on_disk
from arrayfeed._storage.remote.cache import open_cache, versions_under
from arrayfeed._storage.remote.cacheclaims import claim
from arrayfeed._storage.remote.cachespec import DEFAULT_SHARE, cache_spec
from arrayfeed.testing.diskpeak import DiskPeak

from . import _cachejobs
from ._cachejobs import content

LIMIT = 1 << 30


def _files(directory: Path, *parts: str) -> list[Path]:
    return [p for part in parts for p in (directory / part).rglob("*") if p.is_file()]


class Downloads:
    """A download function per name that counts its calls."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __call__(self, name: str, data: bytes | None = None) -> object:
        def download() -> bytes:
            self.calls[name] += 1
            return content(name) if data is None else data

        return download


def test_a_miss_is_fetched_once_then_read_back_checked(tmp_path: Path) -> None:
    cache, downloads = open_cache(str(tmp_path)), Downloads()
    for _ in range(3):
        assert cache.get("s3://b/a", "v1", LIMIT, downloads("a")) == content("a")  # type: ignore[arg-type]
    assert downloads.calls == {"a": 1}
    report = af.cache_report(tmp_path, cache_limit=LIMIT)
    assert (report.hits, report.misses, report.bytes_fetched, report.objects) == (2, 1, 4096, 1)
    assert report.bytes_held == 4096 and report.corrupt_dropped == 0
    assert "2 hits, 1 misses" in str(report)


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "delete", "empty"])
def test_a_damaged_copy_is_dropped_counted_and_fetched_again(tmp_path: Path, damage: str) -> None:
    cache, downloads = open_cache(str(tmp_path)), Downloads()
    for _ in range(2):  # fetched, then read back: this process remembers where it is
        cache.get("s3://b/a", "v1", LIMIT, downloads("a"))  # type: ignore[arg-type]
    (path,) = _files(tmp_path, "objects")
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[100] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:1000]))
    elif damage == "extend":
        path.write_bytes(bytes(data) + b"x")
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
    before = af.cache_report(tmp_path, cache_limit=LIMIT)
    assert cache.get("s3://b/a", "v1", LIMIT, downloads("a")) == content("a")  # type: ignore[arg-type]
    assert downloads.calls == {"a": 2}
    done = af.cache_report(tmp_path, cache_limit=LIMIT).since(before)
    assert (done.corrupt_dropped, done.misses, done.hits) == (1, 1, 0)
    assert cache.get("s3://b/a", "v1", LIMIT, downloads("a")) == content("a")  # type: ignore[arg-type]
    assert downloads.calls == {"a": 2}  # the copy fetched again is good


def test_a_new_version_of_an_object_drops_its_old_copy(tmp_path: Path) -> None:
    cache, downloads = open_cache(str(tmp_path)), Downloads()
    cache.get("s3://b/a", '"etag1"|4096|t1', LIMIT, downloads("a"))  # type: ignore[arg-type]
    new = content("other")
    got = cache.get("s3://b/a", '"etag2"|4096|t2', LIMIT, downloads("a", new))  # type: ignore[arg-type]
    assert got == new and downloads.calls == {"a": 2}
    report = af.cache_report(tmp_path, cache_limit=LIMIT)
    assert (report.stale_dropped, report.objects) == (1, 1)
    # The old version is never returned again, and the new one is kept.
    assert cache.get("s3://b/a", '"etag2"|4096|t2', LIMIT, downloads("a")) == new  # type: ignore[arg-type]
    assert downloads.calls == {"a": 2}


def test_least_recently_used_objects_go_first_within_the_limit(tmp_path: Path) -> None:
    cache, downloads = open_cache(str(tmp_path)), Downloads()
    limit = 3 * 4096
    for name in "abc":
        cache.get(name, "v", limit, downloads(name))  # type: ignore[arg-type]
        time.sleep(0.01)
    cache.get("a", "v", limit, downloads("a"))  # type: ignore[arg-type]
    cache.flush()  # the use of "a" reaches the index
    cache.get("d", "v", limit, downloads("d"))  # type: ignore[arg-type]
    report = af.cache_report(tmp_path, cache_limit=limit)
    assert report.bytes_held <= limit and report.evicted == 1
    for name in "acd":  # b, the least recently used, went
        cache.get(name, "v", limit, downloads(name))  # type: ignore[arg-type]
    assert downloads.calls == {"a": 1, "b": 1, "c": 1, "d": 1}
    cache.get("b", "v", limit, downloads("b"))  # type: ignore[arg-type]
    assert downloads.calls["b"] == 2


def test_an_object_larger_than_the_limit_is_returned_not_kept(tmp_path: Path) -> None:
    cache, downloads = open_cache(str(tmp_path)), Downloads()
    assert cache.get("a", "v", 1000, downloads("a")) == content("a")  # type: ignore[arg-type]
    report = af.cache_report(tmp_path, cache_limit=1000)
    assert (report.skipped, report.objects, report.bytes_held) == (1, 0, 0)
    assert _files(tmp_path, "objects", "tmp") == []


def test_a_missing_object_is_not_kept(tmp_path: Path) -> None:
    cache = open_cache(str(tmp_path))
    assert cache.get("a", "v", LIMIT, lambda: None) is None
    assert af.cache_report(tmp_path, cache_limit=LIMIT).objects == 0


@pytest.mark.slow
def test_four_processes_racing_download_each_object_once(tmp_path: Path) -> None:
    names = [f"s3://b/chunk-{i}" for i in range(40)]
    log = tmp_path / "downloads.log"
    directory = str(tmp_path / "cache")
    start = time.time() + 2.0  # all four reading before the first download ends
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        wrong = pool.starmap(
            _cachejobs.race, [(directory, names, LIMIT, str(log), seed, start) for seed in range(4)]
        )
    assert wrong == [0, 0, 0, 0]
    downloads = Counter(log.read_text().split())
    assert set(downloads) == set(names)
    assert max(downloads.values()) == 1, downloads  # every other reader waited for the copy
    report = af.cache_report(directory, cache_limit=LIMIT)
    assert (report.misses, report.hits) == (40, 120)
    assert report.waits > 0


@pytest.mark.slow
def test_four_writers_stay_within_the_limit(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    limit = 512 << 10
    open_cache(str(directory))
    start = time.time() + 2.0
    with DiskPeak(directory) as disk, multiprocessing.get_context("spawn").Pool(4) as pool:
        biggest = pool.starmap(
            _cachejobs.fill, [(str(directory), 60, limit, seed, start) for seed in range(4)]
        )
    report = af.cache_report(directory, cache_limit=limit)
    assert report.bytes_held <= limit and cache_bytes_on_disk(directory) == report.bytes_held
    assert disk.peak <= limit + max(biggest), (disk.peak, limit)
    assert report.evicted > 0 and report.misses == 240


def _child(function: str, *args: str) -> subprocess.Popen[bytes]:
    code = f"import sys; from tests import _cachejobs; _cachejobs.{function}(*sys.argv[1:])"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=Path(__file__).resolve().parents[1]
    )


def _wait_for(path: Path, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert child.poll() is None, "the child ended early"
        assert time.monotonic() < deadline, "the child never got there"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["hang_downloading", "hang_writing"])
def test_a_reader_killed_mid_download_or_write_leaves_nothing_used_and_no_hang(
    tmp_path: Path, where: str
) -> None:
    directory, signal_file = tmp_path / "cache", tmp_path / "there"
    child = _child(where, str(directory), "s3://b/a", str(signal_file))
    try:
        _wait_for(signal_file, child)
        if where == "hang_writing":
            assert [p.stat().st_size for p in _files(directory, "tmp")] == [2048]
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    started = time.monotonic()
    cache, downloads = open_cache(str(directory)), Downloads()
    assert cache.get("s3://b/a", "v1", LIMIT, downloads("a")) == content("a")  # type: ignore[arg-type]
    assert time.monotonic() - started < 5  # the dead reader's claim held nobody up
    assert downloads.calls == {"a": 1}  # its partial file was never used
    report = af.cache_report(directory, cache_limit=LIMIT)
    assert report.bytes_held == 4096 and report.corrupt_dropped == 0
    assert _files(directory, "tmp") == [] and len(_files(directory, "objects")) == 1


@pytest.mark.slow
def test_the_claim_of_a_dead_process_is_no_claim(tmp_path: Path) -> None:
    code = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); open(sys.argv[2], 'w').close(); time.sleep(3600)"
    )
    held, there = tmp_path / "key", tmp_path / "there"
    child = subprocess.Popen([sys.executable, "-c", code, str(held), str(there)])
    try:
        _wait_for(there, child)
        assert claim(str(tmp_path), "key") is None  # a live holder's claim holds
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    taken = claim(str(tmp_path), "key")  # its file is left, its lock is not
    assert taken is not None
    assert claim(str(tmp_path), "key") is None  # one holder at a time, threads included
    taken.release()
    assert not held.exists()


@pytest.mark.slow
def test_the_reservation_of_a_dead_writer_is_taken_back(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    code = (
        "import sys, os; from arrayfeed._storage.remote.cache import open_cache; "
        "c = open_cache(sys.argv[1]); c.index.reserve('k', 'v', 1000, 0, 5000, 'kfile'); "
        "open(os.path.join(sys.argv[1], 'tmp', 'kfile'), 'wb').write(b'x' * 500); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(directory)], check=True)
    with contextlib.closing(sqlite3.connect(directory / "index.sqlite")) as db:
        assert db.execute("SELECT value FROM counters WHERE name = 'held'").fetchone() == (1000,)
    assert len(_files(directory, "tmp")) == 1
    # Taken back by the next process that opens the cache (and by any that needs the room).
    assert af.cache_report(directory, cache_limit=5000).bytes_held == 0
    assert _files(directory, "tmp") == []


def test_the_directory_is_the_users_alone(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "cache"
    spec = cache_spec(directory, LIMIT)
    assert spec is not None and spec.directory == str(directory)
    open_cache(spec.directory).get("a", "v", LIMIT, lambda: content("a"))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in directory.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_the_arguments_are_checked(tmp_path: Path) -> None:
    assert cache_spec(None) is None and cache_spec(False) is None
    with pytest.raises(af.ConfigError, match=r"`cache_limit` .* needs `cache`"):
        cache_spec(None, 1000)
    with pytest.raises(af.ConfigError, match="`cache` must be True, False, None or a directory"):
        cache_spec(3)
    with pytest.raises(af.ConfigError, match="`cache_limit` must be a positive int"):
        cache_spec(tmp_path, 0)
    (tmp_path / "file").write_text("")
    with pytest.raises(af.CacheError, match="cannot be used"):
        cache_spec(tmp_path / "file")


def test_the_default_limit_is_a_share_of_the_free_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = cache_spec(tmp_path)
    stats = os.statvfs(tmp_path)
    assert spec is not None
    assert spec.limit == pytest.approx(DEFAULT_SHARE * stats.f_bavail * stats.f_frsize, rel=0.01)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = cache_spec(True)
    assert default is not None and default.directory == str(tmp_path / "xdg" / "arrayfeed")


def test_the_report_reads_as_prose_and_subtracts(tmp_path: Path) -> None:
    cache = open_cache(str(tmp_path))
    before = af.cache_report(tmp_path, cache_limit=LIMIT)
    cache.get("a", "v", LIMIT, lambda: content("a"))
    cache.get("a", "v", LIMIT, lambda: content("a"))
    after = af.cache_report(tmp_path, cache_limit=LIMIT)
    assert after.since(before).hits == 1 and after.since(before).bytes_held == 4096
    assert str(after).startswith(f"cache {tmp_path}: 4.0 KiB of 1.0 GiB held in 1 objects")


def test_an_unlistable_root_has_no_versions() -> None:
    class Unlistable:
        def find(self, root: str, detail: bool) -> dict[str, object]:
            raise NotImplementedError("HTTP cannot list")

    assert versions_under(Unlistable(), "https://host/store") is None
