"""File fingerprints: a file replaced, truncated or modified under a source is an error.

A file-backed source takes a :class:`Fingerprint` (device, inode, size, modification time) of its
file when it is opened, and the feed checks every fingerprint at the start of every epoch: a file
replaced or truncated between epochs raises :class:`~arrayfeed.CorruptDataError` naming it,
instead of feeding a mix of old and new rows (or touching a truncated memory map, which kills the
process with ``SIGBUS``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .._errors import CorruptDataError

__all__ = ["Fingerprint", "memmap_fingerprint"]


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """Identity and state of a file when it was opened, cheap to compare again (one ``stat``).

    ``mutable`` files may legitimately change in place (an HDF5 file appended to by a SWMR writer,
    or one the caller opened writable): for them only a replacement by another file counts.
    """

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    mutable: bool = False

    @classmethod
    def of(cls, path: str | os.PathLike[str], *, mutable: bool = False) -> Fingerprint | None:
        """The fingerprint of the file at ``path`` now, or None if it cannot be examined."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls._from_stat(os.fspath(path), st, mutable)

    @classmethod
    def of_fd(cls, fd: int, path: str, *, mutable: bool = False) -> Fingerprint | None:
        """The fingerprint of the file open as ``fd`` (the file actually read, not the path)."""
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return cls._from_stat(path, st, mutable)

    @classmethod
    def _from_stat(cls, path: str, st: os.stat_result, mutable: bool) -> Fingerprint:
        return cls(
            path=path,
            device=st.st_dev,
            inode=st.st_ino,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            mutable=mutable,
        )

    def changes(self) -> list[str]:
        """How the file at ``path`` differs from the fingerprint (empty if it does not)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return ["it no longer exists"]
        except OSError as exc:
            return [f"it cannot be examined ({exc})"]
        found = []
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            found.append("it was replaced by another file")
        if not self.mutable:
            if st.st_size != self.size:
                found.append(f"its size went from {self.size} to {st.st_size} bytes")
            elif st.st_mtime_ns != self.mtime_ns:
                found.append("it was modified")
        return found

    def check(self, name: str) -> None:
        """Raise :class:`CorruptDataError` naming the file if it changed."""
        found = self.changes()
        if found:
            label = f"'{self.path}'" if name == self.path else f"'{self.path}' (source `{name}`)"
            raise CorruptDataError(
                f"{label} changed since arrayfeed opened it: {'; '.join(found)}. A dataset never "
                "reads a file that changed under it; to use the new data, call from_arrays again "
                "(resuming with `start_epoch` / `start_step` if needed)."
            )


def memmap_fingerprint(array: np.ndarray) -> Fingerprint | None:
    """The fingerprint of the file behind an ``np.memmap`` (None for other arrays)."""
    filename = getattr(array, "filename", None)
    if not isinstance(array, np.memmap) or not filename:
        return None
    return Fingerprint.of(filename)
