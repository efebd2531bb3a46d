"""Claims on the objects of a cache directory: who downloads one, while the others wait for it.

A claim is an exclusive ``flock`` on a small file named after the object's key, taken without
blocking: a process (or thread) that cannot take it waits for the object to appear in the cache
instead of downloading it too. The kernel drops a lock when its process ends, however it ends
(``kill -9`` included), so a dead process leaves no lock to break: the file it leaves behind is
claimed at once by the next one. ``flock`` locks belong to an open file, not to a process, so
two threads of one process exclude each other as two processes do.

Whoever releases a claim removes its file; a claim taken on a file that was removed meanwhile
(its name now leads to another file, or to none) is given up and taken again, so that two
holders of one key never coexist. A claim is never waited for while holding another, and none
is held but across the download it guards: no cycle of waits can form.
"""

from __future__ import annotations

import contextlib
import os

from ..._errors import CacheError

__all__ = ["Claim", "claim"]


class Claim:
    """An object's claim: release it once the object is in the cache (or its download failed)."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # before the lock goes: a waiter then claims a new file
        os.close(self.fd)


def claim(directory: str, key: str) -> Claim | None:
    """The claim on ``key`` (a file name) under ``directory``, or None while another holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        raise CacheError(
            "the cache of object storage needs POSIX file locks (Linux, macOS); drop `cache`."
        ) from None
    path = os.path.join(directory, key)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return Claim(fd, path)
        os.close(fd)  # released and removed before we locked it: claim the file there now
