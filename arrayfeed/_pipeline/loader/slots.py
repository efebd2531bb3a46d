"""Shared memory that groups travel in: slots written by a loader, lent to the consumer.

A slot is one ``memfd`` (no file name: nothing in ``/dev/shm``, freed with the last process that
maps it, even after ``kill -9``; elsewhere a POSIX segment unlinked at once) mapped by the
training process and by the loader. The loader writes a group into a slot with an :class:`Area`
(an :class:`~arrayfeed._pipeline.read.rows.Allocator` that places each leaf on an aligned offset and
records its :data:`~.wire.Descriptor`); the training process makes NumPy views of those
offsets and yields them. A slot is written again only after every view of it is gone: like a
:class:`~arrayfeed._pipeline.read.rows.BufferPool` buffer, it is free when its base array's reference
count falls back to the pool's own, so batches a user keeps stay intact, and pages once touched
are reused, never faulted in again.

The slots of every feed of the process share one budget of bytes (:class:`Ledger`,
:func:`read_ahead_budget`): twelve datasets read at once share what one would read ahead,
rather than multiply it. A feed makes a slot beyond its share only when it has none in flight
and every slot it has is held (by its consumer, or by a pass ending): it always makes progress.
"""

from __future__ import annotations

import enum
import math
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._forks import renew_after_fork
from ..read.rows import ALIGNMENT
from ..tune.machine import usable_cores, usable_memory
from .wire import Descriptor

__all__ = [
    "BUDGET_ENV",
    "LEDGER",
    "Area",
    "Ledger",
    "SlotState",
    "Slots",
    "area_bytes",
    "read_ahead_budget",
    "shared_memory",
    "view",
]

#: The environment variable that sets :func:`read_ahead_budget` in bytes.
BUDGET_ENV = "ARRAYFEED_READ_AHEAD_BYTES"
#: Bytes of slots the budget allows per usable core, and at least in all.
BUDGET_PER_CORE = 64 << 20
BUDGET_LEAST = 256 << 20


def read_ahead_budget() -> int:
    """Bytes of shared memory the slots of all feeds of this process hold together:
    ``$ARRAYFEED_READ_AHEAD_BYTES`` if set, else 64 MiB per usable core, at most a sixteenth of
    the memory this process may use, and at least 256 MiB."""
    given = os.environ.get(BUDGET_ENV, "").strip()
    if given.isdigit():
        return int(given)
    budget = BUDGET_PER_CORE * usable_cores()
    memory = usable_memory()
    if memory is not None:
        budget = min(budget, memory // 16)
    return max(BUDGET_LEAST, budget)


class Ledger:
    """The bytes of slots each feed of this process holds, within one :attr:`budget` shared
    equally by the feeds there are (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._held: dict[int, int] = {}  # owner -> bytes, for every owner there is
        # Owners gone, told by their finalizers: the garbage collector may run one at any
        # allocation, also one made while the lock is held, so a finalizer only appends here
        # (atomic) and the next call under the lock forgets them.
        self._gone: list[int] = []
        self._budget: int | None = None
        #: The most bytes held at once, by all owners together.
        self.peak = 0

    @property
    def budget(self) -> int:
        if self._budget is None:
            self._budget = read_ahead_budget()
        return self._budget

    def _forget_gone(self) -> None:  # (under the lock)
        while self._gone:
            self._held.pop(self._gone.pop(), None)

    @property
    def held(self) -> int:
        with self._lock:
            self._forget_gone()
            return sum(self._held.values())

    def join(self, owner: int) -> None:
        """``owner`` (a feed's slots) shares the budget from now on, holding nothing yet."""
        with self._lock:
            self._forget_gone()
            self._held.setdefault(owner, 0)

    def forget(self, owner: int) -> None:
        """``owner`` is gone: it holds nothing and shares nothing any more (safe to call from a
        finalizer, at any time)."""
        self._gone.append(owner)

    def share(self, owner: int) -> int:
        """Bytes ``owner`` may hold: the budget shared among the owners there are."""
        with self._lock:
            self._forget_gone()
            owners = len(self._held) + (owner not in self._held)
        return self.budget // owners

    def fits(self, owner: int, size: int) -> bool:
        """Whether ``owner`` may make one more slot of ``size`` bytes within its share."""
        share = self.share(owner)
        with self._lock:
            mine, total = self._held.get(owner, 0), sum(self._held.values())
        return mine + size <= share and total + size <= self.budget

    def add(self, owner: int, size: int) -> None:
        with self._lock:
            self._forget_gone()
            self._held[owner] = self._held.get(owner, 0) + size
            self.peak = max(self.peak, sum(self._held.values()))

    def remove(self, owner: int, size: int) -> None:
        with self._lock:
            if owner in self._held:
                self._held[owner] = max(0, self._held[owner] - size)


#: The slots of this process's feeds.
LEDGER = Ledger()


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def area_bytes(row_specs: Sequence[tuple[tuple[int, ...], np.dtype[Any]]], rows: int) -> int:
    """Bytes of a slot holding ``rows`` rows of every leaf (per-row shape and dtype), each leaf
    on an aligned offset."""
    sizes = (rows * math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in row_specs)
    return sum(_align(n) for n in sizes) + ALIGNMENT


def shared_memory(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory that no file name refers to."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("arrayfeed-slot", os.MFD_CLOEXEC)
    else:  # macOS: a POSIX segment, unlinked at once
        from multiprocessing import shared_memory as posix

        segment = posix.SharedMemory(create=True, size=size)
        fd = os.dup(segment._fd)  # type: ignore[attr-defined]
        segment.close()
        segment.unlink()
    os.ftruncate(fd, size)
    return fd


def mapped(fd: int, size: int) -> npt.NDArray[np.uint8]:
    """The shared memory behind ``fd`` as a byte array (the mapping lives as long as it does)."""
    return np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)


def view(base: npt.NDArray[np.uint8], desc: Descriptor) -> np.ndarray:
    """The array ``desc`` describes in ``base``; a view whose ``base`` is ``base`` itself."""
    offset, shape, dtype = desc[0], desc[1], np.dtype(desc[2])
    nbytes = math.prod(shape) * dtype.itemsize
    return base[offset : offset + nbytes].view(dtype).reshape(shape)


class Area:
    """Hands out aligned arrays from one slot, one after the other, and records where they lie."""

    def __init__(self, base: npt.NDArray[np.uint8]) -> None:
        self._base, self._next = base, 0
        self.descriptors: list[Descriptor] = []

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        dtype = np.dtype(dtype)
        desc = (self._next, tuple(int(n) for n in shape), dtype.str)
        end = self._next + math.prod(shape) * dtype.itemsize
        if end > len(self._base):
            raise RuntimeError(
                f"arrayfeed: a group of {end} bytes does not fit its slot of {len(self._base)}"
            )
        self._next = _align(end)
        self.descriptors.append(desc)
        return view(self._base, desc)


class SlotState(enum.Enum):
    FREE = "free"
    LOADING = "loading"  # a loader was asked to write into it
    LENT = "lent"  # its group was yielded; free once no view of it is left


class Slots:
    """The training process's slots of one feed: ``keep`` of them kept (fewer when its share of
    the :class:`Ledger` holds fewer), more made when every slot is taken (a consumer holding
    many groups), and retired once free again."""

    def __init__(self, size: int, keep: int, ledger: Ledger = LEDGER) -> None:
        self.size, self._keep, self.ledger = size, keep, ledger
        self.owner = id(self)
        ledger.join(self.owner)
        weakref.finalize(self, ledger.forget, self.owner)
        self._bases: dict[int, npt.NDArray[np.uint8]] = {}
        self.state: dict[int, SlotState] = {}
        self._next_index = 0
        #: Slots made in all (more than ``keep`` when a consumer held every slot at once), and
        #: groups lent from them.
        self.made = self.lent = 0
        probe = {0: np.empty(1, np.uint8)}
        self._free_count = sys.getrefcount(probe[0])

    def __len__(self) -> int:
        return len(self._bases)

    @property
    def keep(self) -> int:
        """Slots kept: as many as asked, within this feed's share of the budget (one at least)."""
        return max(1, min(self._keep, self.ledger.share(self.owner) // self.size))

    def fits(self) -> bool:
        """Whether one more slot fits in this feed's share of the budget (its first always
        does: a feed must read)."""
        return not self._bases or self.ledger.fits(self.owner, self.size)

    def add(self, count: int) -> tuple[int, list[int]]:
        """Make ``count`` new slots: ``(index of the first, their descriptors)``; the caller
        sends the descriptors to the loaders and closes them."""
        first = self._next_index
        fds = []
        for i in range(first, first + count):
            fd = shared_memory(self.size)
            fds.append(fd)
            self._bases[i] = mapped(fd, self.size)
            self.state[i] = SlotState.FREE
            self.ledger.add(self.owner, self.size)
        self._next_index += count
        self.made += count
        return first, fds

    def refresh(self) -> None:
        """Lent slots that no view references any more become free."""
        for i, state in self.state.items():
            if state is SlotState.LENT and sys.getrefcount(self._bases[i]) == self._free_count:
                self.state[i] = SlotState.FREE

    def take(self) -> int | None:
        """A free slot, now loading; None when there is none."""
        self.refresh()
        for i, state in self.state.items():
            if state is SlotState.FREE:
                self.state[i] = SlotState.LOADING
                return i
        return None

    def count(self, state: SlotState) -> int:
        return sum(1 for s in self.state.values() if s is state)

    def lend(self, slot: int, arrays: Sequence[Descriptor]) -> list[np.ndarray]:
        """Views of the group in ``slot``; the slot stays taken while any of them lives."""
        self.state[slot] = SlotState.LENT
        self.lent += 1
        base = self._bases[slot]
        return [view(base, desc) for desc in arrays]

    def release(self, slot: int) -> None:
        """``slot`` was loading and nothing was lent from it: free again."""
        self.state[slot] = SlotState.FREE

    def retire_extra(self, keeping: Sequence[int] = ()) -> tuple[int, ...]:
        """Forget free slots beyond the ``keep`` first made, but those in ``keeping`` (their
        memory goes once nothing maps it); the loaders are told to unmap them too."""
        extra = [i for i in sorted(self._bases)[self.keep :] if i not in keeping]
        gone = tuple(i for i in extra if self.state[i] is SlotState.FREE)
        for i in gone:
            del self._bases[i], self.state[i]
            self.ledger.remove(self.owner, self.size)
        return gone

    def close(self) -> None:
        """Forget every slot (views still alive keep their memory mapped)."""
        self.ledger.remove(self.owner, self.size * len(self._bases))
        self._bases.clear()
        self.state.clear()
