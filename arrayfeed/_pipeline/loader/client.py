"""The training process's side of a feed read by loader processes (:mod:`.processes`).

:class:`RemoteFeed` is one feed's link to its loaders: it asks for each group of a pass by name (epoch, steps, slot), keeps a few in flight,
and yields each as views of its slot, in order. Per group that is one small message each way and
a view per leaf: no reading, decoding or planning, no row copied here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import threading
import weakref
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._errors import LoaderError
from .processes import LoaderProcess, loaders
from .slots import Slots, area_bytes
from .wire import (
    MAX_FDS,
    AddSlots,
    Channel,
    EndEpoch,
    EpochEnded,
    Loaded,
    Raised,
    Read,
    Registered,
    RemoteTraceback,
    StartEpoch,
)

if TYPE_CHECKING:
    from ..feed import Feed

__all__ = ["RemoteFeed"]

#: Groups held downstream of the feed at once (tf.data's prefetch, the group being split, the
#: batch a consumer holds): slots kept beyond those being read.
HELD_GROUPS = 4
#: Seconds between looks at the loaders while waiting (a dead one is noticed within this).
POLL_SECONDS = 0.5


@dataclass
class _Link:
    """One loader serving this feed: its process and the feed's channel to it."""

    process: LoaderProcess
    channel: Channel
    registered: bool = False
    error: BaseException | None = None
    #: Slots each pass has asked this loader to fill and that have not come back.
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)


class RemoteFeed:
    """Epochs of one feed read by ``processes`` loader processes (see the module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, feed: Feed, processes: int, blob: bytes) -> None:
        self._feed = weakref.ref(feed)  # the feed holds this link, not the other way round
        #: The process this link belongs to (a forked child makes its own).
        self.pid = os.getpid()
        self.processes = processes
        #: Reader threads of each loader (tuned while reading, see :mod:`..tuning`): each is
        #: asked for that many groups and one more. Slots are made as they are needed, up to as
        #: many as the most groups in flight.
        self.tuner = feed.tuner
        rows = feed.group_steps * feed.plan.batch_size
        self.slots = Slots(
            area_bytes([(s.row_shape, s.dtype) for s in feed.specs], rows),
            keep=(self.tuner.cap + 1) * processes + HELD_GROUPS,
        )
        self._first_slots = (self.tuner.threads + 1) * processes + HELD_GROUPS
        self._fds: dict[int, int] = {}  # slot -> its descriptor (sent again to a new loader)
        self._blob = blob
        self.feed_id = next(self._ids)
        self._cond = threading.Condition()
        self._receiving = threading.Lock()
        self._tokens = itertools.count(1)
        self._arrived: dict[tuple[int, int], Loaded | Raised] = {}
        self._ending: dict[int, int] = {}  # token -> loaders yet to confirm its end
        self._links: list[_Link] = []
        self._connect()
        weakref.finalize(self, RemoteFeed._close, self.feed_id, self._links, self._fds)

    # -- connecting ---------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Register with the loaders (starting them); known slots go to any new one."""
        processes = loaders().take(self.processes, self.feed_id)
        links = []
        for process in processes:
            old = next((k for k in self._links if k.process is process and k.error is None), None)
            if old is not None:
                links.append(old)
                continue
            link = _Link(process, process.register(self.feed_id, self._blob))
            if self._fds:
                self._send_slots(link, sorted(self._fds))
            links.append(link)
        for link in self._links:
            if link not in links:
                with contextlib.suppress(OSError):
                    link.channel.close()
        self._links[:] = links

    def _send_slots(self, link: _Link, slots: Sequence[int], retire: tuple[int, ...] = ()) -> None:
        # Slots are numbered consecutively from their first, so each run goes in one message (of
        # at most MAX_FDS descriptors: a loader reading 64 groups at once has 65 slots and more).
        runs: list[list[int]] = []
        for slot in slots:
            if runs and runs[-1][-1] + 1 == slot and len(runs[-1]) < MAX_FDS:
                runs[-1].append(slot)
            else:
                runs.append([slot])
        for i, run in enumerate(runs or [[]]):
            if not run and not retire:
                return
            message = AddSlots(run[0] if run else 0, self.slots.size, retire if i == 0 else ())
            self._send(link, message, [self._fds[s] for s in run])

    def _add_slots(self, count: int) -> None:
        first, fds = self.slots.add(count)
        self._fds.update(zip(range(first, first + count), fds, strict=True))
        retire = self.slots.retire_extra(keeping=range(first, first + count))
        for slot in retire:
            os.close(self._fds.pop(slot))
        for link in self._links:
            self._send_slots(link, range(first, first + count), retire)

    def _check_links(self) -> None:
        """Restart dead loaders, and wait until every loader has unpickled the feed."""
        if any(link.error is not None or not link.process.alive() for link in self._links):
            self._connect()
        while not all(link.registered for link in self._links):
            self._pump()
        for link in self._links:
            if link.error is not None:
                raise link.error

    # -- messages --------------------------------------------------------------------------------
    def _send(self, link: _Link, message: Any, fds: Sequence[int] = ()) -> None:
        """Send ``message`` to a loader; one that is gone is a :class:`LoaderError`."""
        try:
            link.channel.send(message, fds)
        except OSError:
            self._lost(link)
            assert link.error is not None
            raise link.error from None

    def _pump(self) -> None:
        """Receive what the loaders sent (one thread at a time; the others wait for it)."""
        if not self._receiving.acquire(blocking=False):
            with self._cond:
                self._cond.wait(POLL_SECONDS)
            return
        try:
            channels = {link.channel.fileno(): link for link in self._links if link.error is None}
            ready, _, _ = select.select(list(channels), [], [], POLL_SECONDS)
            for fd in ready:
                link = channels[fd]
                try:
                    message, _ = link.channel.recv()
                except (EOFError, OSError):
                    self._lost(link)
                    continue
                with self._cond:
                    self._dispatch(link, message)
            for fd, link in channels.items():
                if link.error is None and fd not in ready and not link.process.alive():
                    self._lost(link)
        finally:
            self._receiving.release()
            with self._cond:
                self._cond.notify_all()

    def _dispatch(self, link: _Link, message: Any) -> None:
        if isinstance(message, (Loaded, Raised)):
            link.slots.pop(message.slot, None)
            if message.token in self._ending:
                self.slots.release(message.slot)  # a pass gone: nothing will be lent from it
            else:
                self._arrived[(message.token, message.first)] = message
        elif isinstance(message, EpochEnded):
            for slot, (token, _) in list(link.slots.items()):
                if token == message.token:
                    del link.slots[slot]
                    self.slots.release(slot)
            left = self._ending.get(message.token, 1) - 1
            if left > 0:
                self._ending[message.token] = left
            else:
                self._ending.pop(message.token, None)
        elif isinstance(message, Registered):
            link.registered = True
            if message.error is not None:
                failed = message.error
                link.error = LoaderError(
                    f"a loader process could not load this dataset's feed ({failed.kind}: "
                    f"{failed.message}): its `map_batch` and sources are unpickled there, in a "
                    "new interpreter. Define `map_batch` in an importable module (or in the "
                    "script itself), or pass `processes=0` to read in this process."
                )
                link.error.__cause__ = RemoteTraceback(failed.trace)

    def _lost(self, link: _Link) -> None:
        if link.error is not None:
            return
        code = link.process.exit_code()
        how = "is still running" if code is None else f"exited with code {code}"
        if code is not None and code < 0:
            how = f"was killed by signal {-code}"
        error = LoaderError(
            f"the arrayfeed loader process (pid {link.process.pid}) {how} while reading batches "
            "(killed for memory? a crash in native code, e.g. in `map_batch`?); a new loader "
            "starts with the next epoch. To read in this process instead, pass `processes=0`."
        )
        with self._cond:
            link.registered, link.error = True, error
            for slot in link.slots:
                self.slots.release(slot)
            link.slots.clear()
            for token in list(self._ending):
                self._ending[token] -= 1
                if self._ending[token] <= 0:
                    del self._ending[token]

    # -- epochs ------------------------------------------------------------------------------------
    def epoch(self, epoch: int, start_step: int = 0) -> Generator[Any, None, None]:
        """Groups of ``epoch`` from ``start_step`` on, read by the loaders, in order."""
        feed = self._feed()
        if feed is None:
            raise RuntimeError("arrayfeed: a pass over a feed that is gone")
        todo = feed.groups(start_step)
        owner = feed.group_owner(epoch)
        treedef, feed_batch = feed.treedef, feed.plan.batch_size
        del feed
        with self._cond:
            self._check_links()
            if not len(self.slots):
                self._add_slots(self._first_slots)
            token = next(self._tokens)
            links = list(self._links)
            for link in links:
                self._send(link, StartEpoch(token, epoch, start_step))
        asked = 0
        in_flight = 0
        tuner, batch = self.tuner, feed_batch
        tuner.pass_started()
        try:
            for first, stop in todo:
                threads = tuner.threads
                while asked < len(todo) and in_flight < (wanted := (threads + 1) * len(links)):
                    slot = self._slot(in_flight, wanted)
                    if slot is None:
                        break
                    a, b = todo[asked]
                    link = links[owner(a) % len(links)]
                    with self._cond:
                        link.slots[slot] = (token, a)
                    self._send(link, Read(token, a, b, slot, threads))
                    asked += 1
                    in_flight += 1
                message = self._await(token, first, links[owner(first) % len(links)])
                in_flight -= 1
                if isinstance(message, Raised):
                    with self._cond:
                        self.slots.release(message.slot)
                    raise message.error.raised_here()
                with self._cond:
                    arrays = self.slots.lend(message.slot, message.arrays)
                tuner.delivered((stop - first) * batch)
                yield treedef.unflatten(arrays)
                del arrays
        finally:
            self._end(token, links)

    def _slot(self, in_flight: int, wanted: int) -> int | None:
        """A slot to read the next group into: None when the pass should first take a group
        that is in flight; a new slot when every one is held (by the consumer, or by the groups
        another pass has not yet taken), or when tuning wants more groups in flight than there
        are slots."""
        while True:
            with self._cond:
                slot = self.slots.take()
                if slot is not None:
                    return slot
                if in_flight and len(self.slots) < min(wanted + HELD_GROUPS, self.slots.keep):
                    self._add_slots(1)
                    continue
                if in_flight:
                    return None
                ending = any(
                    token in self._ending
                    for link in self._links
                    for token, _ in link.slots.values()
                )
                if not ending:  # held by the consumer, or by another pass's groups: one more
                    self._add_slots(1)
                    continue
            self._pump()  # an ended pass's slots come back when its end is confirmed

    def _await(self, token: int, first: int, link: _Link) -> Loaded | Raised:
        while True:
            with self._cond:
                message = self._arrived.pop((token, first), None)
                if message is not None:
                    return message
                if link.error is not None:
                    raise link.error
            self._pump()

    def _end(self, token: int, links: list[_Link]) -> None:
        with self._cond:
            for key in [k for k in self._arrived if k[0] == token]:
                self.slots.release(self._arrived.pop(key).slot)
            live = [link for link in links if link.error is None]
            if live:
                self._ending[token] = len(live)
            for link in live:
                try:
                    link.channel.send(EndEpoch(token))
                except Exception:  # the loader is gone (or this interpreter is exiting)
                    self._ending[token] -= 1

    @staticmethod
    def _close(feed_id: int, links: list[_Link], fds: dict[int, int]) -> None:
        loaders().release(feed_id)
        for link in links:  # a closed channel ends the feed in its loader
            with contextlib.suppress(OSError):
                link.channel.close()
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        fds.clear()
