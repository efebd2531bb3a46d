"""The local cache of object storage (``cache=``) against the targets of issue #49, on moto's S3
(127.0.0.1) behind a proxy adding 20 ms per request.

Writes one Zarr store with ``arrayfeed convert`` to ``s3://`` and to local disk (rows of
``uint8[4096]``, chunks of 256 rows = 1 MiB, Blosc-LZ4 + CRC-32C, as ``bench_remote.py``), keeps
the fetcher's in-memory LRU at a quarter of the store (``ARRAYFEED_REMOTE_CACHE_BYTES``), and
measures, requests counted at the proxy (a thread of this process, idle once nothing is fetched):

1. requests in epochs 2-3 / in epoch 1 (the open and its listing included), cache limit 4x the
   store, ``shuffle=True``; and the same without the cache;
2. rows/s of epochs 2-5 (``--epochs``) through the cache / the same epochs of the store on
   local disk (page-cached), ``shuffle=True`` and ``"block"``, ``arrayfeed.batches`` with its
   defaults; the epochs are timed together (a pass reads the next one's first groups ahead);
3. 4 processes reading one epoch each (other seeds) through one empty cache at once: downloads
   per chunk object (the cache's misses; and GETs at the proxy less 4 opens);
4. bytes on disk under the cache (sampled every 5 ms) / the limit, limit half the store, 4
   processes reading 3 epochs each;
5. cached chunks flipped, truncated and deleted between epochs: wrong rows (against local disk)
   and the copies dropped and fetched again;
6. a reader killed (SIGKILL) mid-download, then a new one: seconds it takes, rows wrong, what
   the dead one left behind.

Repetitions run interleaved (``--reps``); the table gives medians.

    python benchmarks/bench_cache.py --json benchmarks/results/dev-2-cores/cache.json
    python benchmarks/bench_cache.py --rows 4096 --reps 1      # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_remote import CHUNK_ROWS, ROW, rows_of, s3_environment, start_moto
from bench_remote import _ticks as remote_ticks

from arrayfeed._storage import cache_bytes_on_disk
from arrayfeed.testing.diskpeak import DiskPeak

BATCH = 256
URL = "s3://bench/cache.zarr"


def epoch_rate(batches: Any) -> tuple[float, bytes]:
    """Rows per second of one epoch, and the bytes of its first batch (for comparisons)."""
    rows, start, first = 0, time.perf_counter(), b""
    for batch in batches:
        if not rows:
            first = np.asarray(batch).tobytes()
        rows += len(batch)
    return rows / (time.perf_counter() - start), first


def _ticks(pid: int | None = None) -> int:
    return remote_ticks(pid) or 0


def _family(*roots: int) -> list[int]:
    """``roots`` and every process descended from them (loaders, readers)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _family_seconds(*helpers: int) -> float:
    """CPU seconds of this process, its descendants (alive, or ended and waited for) and
    ``helpers``."""
    own = os.times()
    alive = [p for p in _family(os.getpid(), *helpers) if p != os.getpid()]
    ticks = sum(map(_ticks, alive)) / os.sysconf("SC_CLK_TCK")
    return own.user + own.system + own.children_user + own.children_system + ticks


def busy_others(run: Callable[[], Any], *helpers: int) -> tuple[Any, float]:
    """``run()``'s result, and the share of the CPUs that processes other than this one, its
    descendants and ``helpers`` used meanwhile (as on a shared development machine)."""
    machine, ours, start = _ticks(), _family_seconds(*helpers), time.perf_counter()
    result = run()
    spent = (_ticks() - machine) / os.sysconf("SC_CLK_TCK") - (_family_seconds(*helpers) - ours)
    share = spent / ((time.perf_counter() - start) * (os.cpu_count() or 1))
    return result, max(0.0, share)


def reader(args: list[str]) -> None:
    """A reader process: ``URL CACHE LIMIT SEED EPOCHS OUT`` (the rows' checksum goes to OUT)."""
    import zlib

    import arrayfeed as af

    url, cache, limit, seed, epochs, out = args
    source = af.open_array(url, cache=cache, cache_limit=int(limit))
    b = af.batches(source, batch_size=BATCH, shuffle=True, seed=int(seed), shard=None, processes=0)
    crcs = []
    for _ in range(int(epochs)):
        crc = 0
        for batch in b:
            crc = zlib.crc32(np.asarray(batch).tobytes(), crc)
        crcs.append(crc)
    Path(out).write_text(json.dumps(crcs))


def readers(
    count: int, url: str, cache: Path, limit: int, epochs: int, tmp: Path, seeds: range
) -> list[list[int]]:
    procs, outs = [], []
    for i, seed in zip(range(count), seeds, strict=False):
        out = tmp / f"reader-{i}.json"
        outs.append(out)
        args = [url, str(cache), str(limit), str(seed), str(epochs), str(out)]
        procs.append(subprocess.Popen([sys.executable, __file__, "--reader", *args]))
    for proc in procs:
        if proc.wait(timeout=900) != 0:
            raise SystemExit(f"a reader failed ({proc.returncode})")
    return [json.loads(out.read_text()) for out in outs]


def local_crcs(local: Path, seeds: list[int], epochs: int) -> dict[int, list[int]]:
    import zlib

    import arrayfeed as af

    found = {}
    for seed in seeds:
        b = af.batches(f"{local}:x", batch_size=BATCH, shuffle=True, seed=seed, shard=None)
        crcs = []
        for _ in range(epochs):
            crc = 0
            for batch in b:
                crc = zlib.crc32(np.asarray(batch).tobytes(), crc)
            crcs.append(crc)
        found[seed] = crcs
    return found


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--reader":
        reader(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=6, help="epochs timed after the first")
    parser.add_argument("--json", type=Path)
    # The rows/s pairs run again (up to --max-reps) while other processes used --max-busy of
    # the CPUs or more, as on a shared development machine.
    parser.add_argument("--max-reps", type=int, default=10)
    parser.add_argument("--max-busy", type=float, default=0.15)
    args = parser.parse_args()

    proc, endpoint = start_moto()
    os.environ.update(s3_environment(endpoint))
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    try:
        results = run(args, endpoint, tmp, proc)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


def run(
    args: argparse.Namespace, endpoint: str, tmp: Path, proc: subprocess.Popen[bytes]
) -> dict[str, Any]:
    import s3fs

    import arrayfeed as af
    from arrayfeed.testing.latency import LatencyProxy

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("bench")
    data = rows_of(args.rows)
    af.convert({"x": data}, URL, chunk_rows=CHUNK_ROWS, compression="lzf", progress=False)
    local = tmp / "cache.zarr"
    af.convert({"x": data}, local, chunk_rows=CHUNK_ROWS, compression="lzf", progress=False)
    chunks = sorted(k for k in fs.find("bench/cache.zarr/x") if "/c/" in k)
    stored = sum(fs.du("bench/cache.zarr/x", total=False).values())
    largest = max(fs.size(k) for k in chunks)
    os.environ["ARRAYFEED_REMOTE_CACHE_BYTES"] = str(stored // 4)  # the store: 4x the LRU
    url = f"{URL}:x"
    results: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "rows": args.rows,
        "row_bytes": ROW,
        "stored_bytes": stored,
        "chunk_objects": len(chunks),
        "largest_object": largest,
        "memory_lru_bytes": stored // 4,
        "latency_ms": args.latency_ms,
        "reps": args.reps,
        "epochs_timed": args.epochs,
    }
    with LatencyProxy(endpoint, args.latency_ms / 1000) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        s3fs.S3FileSystem.clear_instance_cache()

        def requests() -> int:
            return sum(proxy.requests.values())

        opened = requests()
        af.open_array(url, cache=tmp / "opening", cache_limit=4 * stored)
        open_requests = requests() - opened  # (with its listing)
        results["requests_per_open"] = open_requests

        ratios: dict[str, list[float]] = {"cached": [], "uncached": []}
        counts: dict[str, list[int]] = {}  # requests in epochs 1, 2 and 3 of the first rep

        def epochs(b: Any, count: int) -> tuple[float, list[int]]:
            """Rows/s over ``count`` epochs taken together (a pass reads the next one's first
            groups ahead: one epoch timed alone is not its own work), and the requests of
            each."""
            rows, seconds, counts = 0, 0.0, []
            for _ in range(count):
                before, start = requests(), time.perf_counter()
                rows += sum(len(batch) for batch in b)
                seconds += time.perf_counter() - start
                counts.append(requests() - before)
            return rows / seconds, counts

        # Pairs (cached, local) of timed epochs, until --reps of them ran while other processes
        # (neither this one, its loaders and readers, nor moto) used under --max-busy of the CPUs.
        pairs: dict[str, list[dict[str, float]]] = {"True": [], "block": []}
        for rep in range(args.max_reps):
            for mode in (True, "block"):
                kwargs = {"cache": tmp / f"c-{rep}-{mode}", "cache_limit": 4 * stored}
                b = af.batches(
                    af.open_array(url, **kwargs),
                    batch_size=BATCH,
                    shuffle=mode,
                    seed=rep,
                    shard=None,
                )
                _, first = epochs(b, 1)
                (cached, later), busy = busy_others(lambda b=b: epochs(b, args.epochs), proc.pid)
                del b
                if mode is True:
                    ratios["cached"].append((later[0] + later[1]) / first[0])
                    counts.setdefault("cached", [first[0], *later[:2]])
                lb = af.batches(f"{local}:x", batch_size=BATCH, shuffle=mode, seed=rep, shard=None)
                epochs(lb, 1)
                (local_rate, _), local_busy = busy_others(
                    lambda lb=lb: epochs(lb, args.epochs), proc.pid
                )
                del lb
                pairs[str(mode)].append(
                    {"cached": cached, "local": local_rate, "busy": max(busy, local_busy)}
                )
            if rep == 0:  # the same without the cache, once: every epoch fetches again
                b = af.batches(
                    af.open_array(url), batch_size=BATCH, shuffle=True, seed=0, shard=None
                )
                _, first = epochs(b, 1)
                _, later = epochs(b, 2)
                del b
                ratios["uncached"].append((later[0] + later[1]) / first[0])
                counts["uncached"] = [first[0], *later]
            clean = [p for p in pairs["True"] if p["busy"] < args.max_busy]
            if len(clean) >= args.reps and rep + 1 >= args.reps:
                break
        results["requests_epochs_2_3_over_1"] = {k: statistics.median(v) for k, v in ratios.items()}
        results["requests_per_epoch"] = counts
        results["pairs"] = pairs
        results["epoch2_over_local"] = {}
        results["rows_per_s"] = {}
        for mode, found in pairs.items():
            clean = [p for p in found if p["busy"] < args.max_busy]
            kept = clean if len(clean) >= args.reps else found  # (a machine busy throughout)
            results["epoch2_over_local"][mode] = statistics.median(
                p["cached"] / p["local"] for p in kept
            )
            results["rows_per_s"][f"cached {mode}"] = statistics.median(p["cached"] for p in kept)
            results["rows_per_s"][f"local {mode}"] = statistics.median(p["local"] for p in kept)
            results.setdefault("busiest_kept", {})[mode] = max(p["busy"] for p in kept)
            results.setdefault("pairs_kept", {})[mode] = len(kept)

        # 3. four processes, one empty cache, one epoch each.
        shared = tmp / "shared"
        before = proxy.requests.copy()
        readers(4, url, shared, 4 * stored, 1, tmp, range(4))
        gets = (proxy.requests - before)["GET"]
        report = af.cache_report(shared, cache_limit=4 * stored)
        results["four_processes"] = {
            "downloads_per_object": report.misses / len(chunks),
            "proxy_gets_less_opens_per_object": (gets - 4 * open_requests) / len(chunks),
            "waits": report.waits,
        }

        # 4. the bound: limit half the store, 4 processes, 3 epochs each.
        bounded, limit = tmp / "bounded", stored // 2
        af.cache_report(bounded, cache_limit=limit)  # the directory, made
        with DiskPeak(bounded) as disk:
            got = readers(4, url, bounded, limit, 3, tmp, range(10, 14))
        peak = [disk.peak]
        expected = local_crcs(local, list(range(10, 14)), 3)
        report = af.cache_report(bounded, cache_limit=limit)
        results["bounded"] = {
            "limit": limit,
            "peak_on_disk": peak[0],
            "peak_over_limit": peak[0] / limit,
            "bound": 1 + largest / limit,
            "evicted": report.evicted,
            "wrong_epochs": sum(g != expected[s] for g, s in zip(got, range(10, 14), strict=True)),
        }

        # 5. damage between epochs.
        damaged_dir = tmp / "damaged"
        source = af.open_array(url, cache=damaged_dir, cache_limit=4 * stored)
        b = af.batches(source, batch_size=BATCH, shuffle=True, seed=7, shard=None, processes=0)
        epoch_rate(b)
        files = sorted(p for p in (damaged_dir / "objects").rglob("*") if p.is_file())
        hurt = Counter()
        for i, path in enumerate(files[::4]):
            kind = ("flip", "truncate", "delete")[i % 3]
            raw = bytearray(path.read_bytes())
            if kind == "flip":
                raw[len(raw) // 3] ^= 0x10
                path.write_bytes(bytes(raw))
            elif kind == "truncate":
                path.write_bytes(bytes(raw[: len(raw) // 2]))
            else:
                path.unlink()
            hurt[kind] += 1
        before_report = af.cache_report(damaged_dir, cache_limit=4 * stored)
        import zlib

        # Epoch 2 by a new source (a restarted job): nothing of epoch 1 held in its memory.
        source = af.open_array(url, cache=damaged_dir, cache_limit=4 * stored)
        again = af.batches(
            source, batch_size=BATCH, shuffle=True, seed=7, shard=None, processes=0, start_epoch=1
        )
        crc = 0
        for batch in again:
            crc = zlib.crc32(np.asarray(batch).tobytes(), crc)
        after = af.cache_report(damaged_dir, cache_limit=4 * stored).since(before_report)
        results["damaged"] = {
            "damaged": dict(hurt),
            "wrong_epochs": int(crc != local_crcs(local, [7], 2)[7][1]),
            "corrupt_dropped": after.corrupt_dropped,
            "fetched_again": after.misses,
        }
        del b, again, source

        # 6. a reader killed mid-download, then a new one.
        killed = tmp / "killed"
        out = tmp / "killed.json"
        victim = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--reader",
                url,
                str(killed),
                str(4 * stored),
                "3",
                "1",
                str(out),
            ]
        )
        deadline = time.monotonic() + 120
        while not any((killed / "claims").glob("*")) and time.monotonic() < deadline:
            time.sleep(0.01)  # until it has claimed a download
        time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        left = cache_bytes_on_disk(killed)
        started = time.perf_counter()
        (crcs,) = readers(1, url, killed, 4 * stored, 1, tmp, range(3, 4))
        seconds = time.perf_counter() - started
        report = af.cache_report(killed, cache_limit=4 * stored)
        results["killed"] = {
            "left_on_disk_by_the_dead": left,
            "next_reader_seconds": seconds,
            "wrong_epochs": int(crcs != local_crcs(local, [3], 1)[3]),
            "corrupt_dropped": report.corrupt_dropped,
            "tmp_files_after": len(list((killed / "tmp").iterdir())),
        }
    s3fs.S3FileSystem.clear_instance_cache()
    return results


def print_table(r: dict[str, Any]) -> None:
    print(
        f"\n== cache of object storage: moto on 127.0.0.1 behind a {r['latency_ms']:g} ms proxy; "
        f"{r['rows']:,} rows of {r['row_bytes']} B, {r['stored_bytes'] / 2**20:.0f} MiB stored in "
        f"{r['chunk_objects']} chunk objects, in-memory LRU {r['memory_lru_bytes'] / 2**20:.0f} MiB; "
        f"{r['machine']}; rows/s: medians of {min(r['pairs_kept'].values())}+ paired reps, other "
        f"processes using up to {max(r['busiest_kept'].values()):.0%} of the CPUs meanwhile =="
    )
    req = r["requests_epochs_2_3_over_1"]
    rows = [
        (
            "requests epochs 2-3 / epoch 1, cache >= store",
            f"{req['cached']:.3f}",
            "<= 0.02",
            req["cached"] <= 0.02,
        ),
        (
            "  requests in epochs 1, 2, 3: with the cache / without",
            f"{r['requests_per_epoch']['cached']} / {r['requests_per_epoch']['uncached']}",
            "",
            None,
        ),
    ]
    for mode in ("True", "block"):
        ratio = r["epoch2_over_local"][mode]
        cached, local = r["rows_per_s"][f"cached {mode}"], r["rows_per_s"][f"local {mode}"]
        rows.append(
            (
                f"rows/s epochs 2-{1 + r['epochs_timed']} / local disk, shuffle={mode}",
                f"{ratio:.2f} ({cached:,.0f} / {local:,.0f})",
                ">= 0.9",
                ratio >= 0.9,
            )
        )
    four = r["four_processes"]
    rows.append(
        (
            "4 processes, one cache: downloads per object",
            f"{four['downloads_per_object']:.2f} (GETs: {four['proxy_gets_less_opens_per_object']:.2f})",
            "<= 1.1",
            four["downloads_per_object"] <= 1.1,
        )
    )
    b = r["bounded"]
    rows.append(
        (
            "bytes on disk / limit, limit = store / 2, 4 procs x 3 epochs",
            f"{b['peak_over_limit']:.3f} (bound {b['bound']:.3f}; wrong epochs {b['wrong_epochs']})",
            "<= 1 + one object",
            b["peak_over_limit"] <= b["bound"],
        )
    )
    d = r["damaged"]
    rows.append(
        (
            "cached chunks damaged between epochs: wrong rows",
            f"{d['wrong_epochs']} (dropped {d['corrupt_dropped']}, fetched again {d['fetched_again']} of {sum(d['damaged'].values())})",
            "0, all re-fetched",
            d["wrong_epochs"] == 0 and d["corrupt_dropped"] == sum(d["damaged"].values()),
        )
    )
    k = r["killed"]
    rows.append(
        (
            "kill -9 mid-download, then a new reader",
            f"{k['next_reader_seconds']:.1f} s, wrong {k['wrong_epochs']}, corrupt {k['corrupt_dropped']}, tmp left {k['tmp_files_after']}",
            "no partial used, no hang",
            k["wrong_epochs"] == 0 and k["corrupt_dropped"] == 0,
        )
    )
    width = max(len(row[0]) for row in rows)
    print(f"| {'measure':{width}} | figure | target | |")
    for label, figure, target, ok in rows:
        verdict = "" if ok is None else ("ok" if ok else "MISSED")
        print(f"| {label:{width}} | {figure} | {target} | {verdict} |")


if __name__ == "__main__":
    main()
