"""What the processes of ``test_remote_cache.py`` run on one cache directory (module level, so
that ``spawn`` finds them; light imports, so that children start fast)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

from arrayfeed._storage.remote import cache as cache_module
from arrayfeed._storage.remote.cache import open_cache


def content(name: str, size: int = 4096) -> bytes:
    """The bytes of the object ``name``: what every download of it returns."""
    seed = sum(name.encode())
    return bytes((seed + i * 7) % 251 for i in range(size))


def logged(name: str, log: str, seconds: float, size: int = 4096) -> Callable[[], bytes]:
    """A download of ``name`` taking ``seconds``, noted as one line in ``log``."""

    def download() -> bytes:
        time.sleep(seconds)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{name}\n".encode())
        finally:
            os.close(fd)
        return content(name, size)

    return download


def race(directory: str, names: list[str], limit: int, log: str, seed: int, start: float) -> int:
    """Read every object of ``names`` in an order of this ``seed``, starting at ``start``; the
    objects that came back wrong."""
    order = list(names)
    random.Random(seed).shuffle(order)
    cache = open_cache(directory)
    time.sleep(max(0.0, start - time.time()))
    wrong = 0
    for name in order:
        data = cache.get(name, "v1", limit, logged(name, log, 0.02))
        wrong += data != content(name)
    cache.flush()
    return wrong


def fill(directory: str, count: int, limit: int, seed: int, start: float) -> int:
    """Write ``count`` objects of sizes up to 64 KiB of this ``seed``; the largest size."""
    cache = open_cache(directory)
    rng = random.Random(seed)
    time.sleep(max(0.0, start - time.time()))
    largest = 0
    for i in range(count):
        size = rng.randrange(1, 64 << 10)
        largest = max(largest, size)
        name = f"w{seed}-{i}"
        cache.get(name, "v1", limit, lambda n=name, s=size: content(n, s))  # type: ignore[misc]
    cache.flush()
    return largest


def hang_downloading(directory: str, name: str, signal: str) -> None:
    """Claim ``name`` and never finish its download (``signal`` appears once it is claimed)."""

    def forever() -> bytes:
        open(signal, "w").close()
        time.sleep(3600)
        raise AssertionError("unreachable")

    open_cache(directory).get(name, "v1", 1 << 30, forever)


def hang_writing(directory: str, name: str, signal: str) -> None:
    """Download ``name``, write half of its file under ``tmp/`` and stop there."""

    real_fdopen = os.fdopen

    class Half:
        def __init__(self, fd: int) -> None:
            self.file = real_fdopen(fd, "wb")

        def __enter__(self) -> Half:
            return self

        def __exit__(self, *args: object) -> None:
            self.file.close()

        def write(self, data: bytes) -> None:
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            open(signal, "w").close()
            time.sleep(3600)

    cache_module.os.fdopen = lambda fd, mode: Half(fd)  # type: ignore[assignment,misc]
    open_cache(directory).get(name, "v1", 1 << 30, lambda: content(name))
