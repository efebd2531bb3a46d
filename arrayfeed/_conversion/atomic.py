"""Publishing a file or directory atomically: build it in a hidden workspace beside its final path.

A :class:`Workspace` is a hidden directory in the same directory as the output (hence on the same
file system), named ``.<output name>.arrayfeed-<host>-<pid>-<token>``. Everything a conversion
writes goes inside it; :func:`publish` then renames the finished result onto the output path in
one step, and the workspace is deleted. So the output path only ever holds nothing, the previous
output, or the complete new one:

- after an exception or an interruption, the workspace is removed and nothing else was touched;
- after ``kill -9`` (or a power cut), a stale workspace may remain beside the output, never at it;
  :func:`clean_stale` removes those of dead processes on this host at the start of the next run.

On Linux, :func:`publish` uses ``renameat2`` to refuse a concurrent creator of the output
(``RENAME_NOREPLACE``) and to swap a directory into place in one step (``RENAME_EXCHANGE``); where
that is not available, it falls back to ``os.rename``, moving a replaced directory aside first.

:func:`deferred_interrupts` holds Ctrl-C (and SIGTERM, when it is routed to ``KeyboardInterrupt``)
until the writer reaches a checkpoint, so background writes are never cut off half-way and the
workspace can be removed cleanly.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "ASIDE",
    "Interrupts",
    "Workspace",
    "clean_stale",
    "deferred_interrupts",
    "fsync_dir",
    "fsync_tree",
    "pid_alive",
    "publish",
    "remove_tree",
]

_MARK = ".arrayfeed-"
_NAME_CHARS = 100
_NAME_RE = re.compile(
    r"^\.(?P<name>.*)\.arrayfeed-(?P<host>[A-Za-z0-9]*)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})$"
)

#: Where :func:`publish` moves a replaced output when it cannot swap it in one step.
ASIDE = "previous"

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32]


def _prefix(output: Path) -> str:
    return output.name[:_NAME_CHARS]


class Workspace:
    """A hidden directory beside ``output`` that holds a conversion until it is published."""

    def __init__(self, output: Path) -> None:
        self.output = output
        name = f".{_prefix(output)}{_MARK}{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.path = output.parent / name

    def create(self) -> Workspace:
        """Create the directory (raises ``OSError`` when the parent is not writable)."""
        os.mkdir(self.path, 0o700)
        return self

    def member(self, name: str) -> Path:
        """A path inside the workspace."""
        return self.path / name

    def remove(self, *, settle: float = 0.05) -> None:
        """Delete the workspace and everything in it (see :func:`remove_tree` for ``settle``)."""
        remove_tree(self.path, settle=settle)


def remove_tree(path: Path, *, settle: float = 0.05, timeout: float = 10.0) -> None:
    """Delete ``path`` (file or directory), waiting out writers that are still finishing.

    Zarr writes chunks from a background event loop; after an error in one chunk write, the others
    may still land for a moment. So deletion repeats until ``path`` stays absent for ``settle``
    seconds (or ``timeout`` passes); ``settle=0`` deletes once.
    """
    deadline = time.monotonic() + timeout
    while True:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if settle <= 0:
            return
        time.sleep(settle)
        if not os.path.lexists(path) or time.monotonic() > deadline:
            return


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (always True on Windows: never guess there)."""
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate the process
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(output: Path) -> list[Path]:
    """Remove workspaces beside ``output`` left by dead processes on this host; return them.

    A workspace still holding the previous output (the process died between moving it aside and
    moving the new one in, which only the fallback of :func:`publish` does) gives it back first.
    """
    removed: list[Path] = []
    try:
        entries = list(output.parent.iterdir())
    except OSError:
        return removed
    host = _host()
    for entry in entries:
        match = _NAME_RE.match(entry.name)
        if (
            match is None
            or match["name"] != _prefix(output)
            or match["host"] != host
            or pid_alive(int(match["pid"]))
        ):
            continue
        previous = entry / ASIDE
        if os.path.lexists(previous) and not os.path.lexists(output):
            with contextlib.suppress(OSError):
                os.rename(previous, output)
        remove_tree(entry, settle=0.0)
        removed.append(entry)
    return removed


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False when the system does not offer it for these paths."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def publish(src: Path, dst: Path, *, overwrite: bool) -> None:
    """Move the finished ``src`` to ``dst`` in one step.

    Without ``overwrite``, fails with ``FileExistsError`` if ``dst`` exists (even if it appeared
    a moment ago). With ``overwrite``, an existing ``dst`` is replaced: a file by ``os.replace``; a
    directory by an atomic exchange (after which the old one is at ``src``), or else by moving it
    to :data:`ASIDE` beside ``src`` first. ``src`` must be in a workspace, which the caller deletes.
    """
    if not overwrite or not os.path.lexists(dst):
        if _renameat2(src, dst, _RENAME_NOREPLACE):
            return
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
        os.rename(src, dst)
        return
    if not src.is_dir() and not dst.is_dir():
        os.replace(src, dst)
        return
    if _renameat2(src, dst, _RENAME_EXCHANGE):
        return
    aside = src.parent / ASIDE
    os.rename(dst, aside)
    os.rename(src, dst)


def fsync_dir(path: Path) -> None:
    """Flush one file, or a directory's entries (e.g. after a rename in it), to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path, *, threads: int = 32) -> None:
    """Flush ``path`` (a file, or a directory with everything in it) to stable storage.

    The files of a directory are flushed from ``threads`` threads at once: file systems commit
    concurrent flushes together, so a store of many chunk files is not flushed one file after
    another (docs/performance.md, 'Flushing a converted store').
    """
    paths = [path]
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            paths.extend(Path(root, f) for f in files)
            paths.extend(Path(root, d) for d in dirs)
    if len(paths) == 1:
        fsync_dir(path)
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(paths))) as pool:
        for _ in pool.map(fsync_dir, paths):
            pass


class Interrupts:
    """State of :func:`deferred_interrupts`: which signal is pending, and whether to hold it."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self.shielded = False

    def checkpoint(self) -> None:
        """Raise ``KeyboardInterrupt`` here if a deferred signal arrived."""
        if self.pending is not None and not self.shielded:
            raise KeyboardInterrupt

    def shield(self) -> None:
        """From now on, hold signals until the context ends (for the final rename)."""
        self.checkpoint()
        self.shielded = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is not None and not self.shielded:
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once
        self.pending = signum


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[Interrupts]:
    """Hold SIGINT (and SIGTERM routed to ``KeyboardInterrupt``) until a checkpoint.

    Only the handlers that would raise ``KeyboardInterrupt`` are replaced (a program's own handlers
    are left alone), and only in the main thread; they are restored on exit.
    """
    state = Interrupts()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is signal.default_int_handler:
                previous[sig] = signal.signal(sig, state._handle)
    try:
        yield state
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
