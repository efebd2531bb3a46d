"""Locks that a forked child gets unheld.

A process made by ``fork`` (PyTorch ``DataLoader`` workers and ``multiprocessing`` on Linux by
default) inherits every lock as the parent's threads left it at that instant: a lock a reader
thread held then stays held in the child, where that thread does not exist, and the child's first
batch waits for it forever. Objects name their locks here when they make them; in the child,
before any of its threads runs, each is replaced by a new, unheld lock of the same kind. The
state a lock guarded is left as it was: every user of these locks keeps it consistent between
statements (a list pop, a counter, a reference), which a fork cannot split.

``multiprocessing``'s own locks and ``h5py``'s are not covered; sources reopen their files in a
child (HDF5 sources check the process id), and a forked child starts loader processes of its
own (:mod:`arrayfeed._pipeline.loader`), whose links the parent's never share.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["renew_after_fork"]

#: id(owner) -> (a weak reference to it, its lock attributes); by id, as owners need not hash.
_OWNERS: dict[int, tuple[weakref.ref[Any], tuple[str, ...]]] = {}
_RLOCK = type(threading.RLock())


def renew_after_fork(owner: Any, *names: str) -> None:
    """Give ``owner`` new, unheld locks for the attributes ``names`` in a forked child."""
    key = id(owner)
    known = _OWNERS.get(key)
    if known is not None and known[0]() is owner:
        names = tuple(dict.fromkeys((*known[1], *names)))

    def forget(_: weakref.ref[Any]) -> None:
        _OWNERS.pop(key, None)

    _OWNERS[key] = (weakref.ref(owner, forget), names)


def _renew() -> None:
    for ref, names in list(_OWNERS.values()):
        owner = ref()
        if owner is None:
            continue
        for name in names:
            old = getattr(owner, name, None)  # an error here would skip every later owner
            setattr(owner, name, threading.RLock() if isinstance(old, _RLOCK) else threading.Lock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew)
