"""The training process's side of a feed read by loader processes (:mod:`.processes`).

:class:`RemoteFeed` is one feed's link to its loaders: it asks for each group of a pass by name
(epoch, steps, slot), keeps a few in flight, and yields each as views of its slot, in order. Per
group that is one small message each way and a view per leaf: no reading, decoding or planning,
no row copied here. The groups are dealt out among as many loaders as the tuner says
(:mod:`..tuning`): a loader started while a pass is read joins it, and one no longer asked for
leaves once it has delivered what it was asked for.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

from ..._errors import LoaderError
from ..plan.indexblocks import groups
from ..read.readers import reads_next
from .members import Asked, Link, Members
from .processes import loaders
from .slots import Slots, area_bytes
from .wire import (
    MAX_FDS,
    AddSlots,
    EndEpoch,
    EpochEnded,
    Loaded,
    Raised,
    Read,
    Registered,
    RemoteTraceback,
    StartEpoch,
    readable,
)

if TYPE_CHECKING:
    from ..read.feed import Feed

__all__ = ["RemoteFeed"]


#: Groups held downstream of the feed at once (tf.data's prefetch, the group being split, the
#: batch a consumer holds): slots kept beyond those being read.
HELD_GROUPS = 4
#: Seconds between looks at the loaders while waiting (a dead one is noticed within this).
POLL_SECONDS = 0.5


class RemoteFeed:
    """Epochs of one feed read by ``processes`` loader processes (see the module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, feed: Feed, processes: int, blob: bytes) -> None:
        self._feed = weakref.ref(feed)  # the feed holds this link, not the other way round
        #: The process this link belongs to (a forked child makes its own).
        self.pid = os.getpid()
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
        self._live: dict[int, Asked] = {}  # passes started and not ended, by token
        self._ahead: Asked | None = None  # the next epoch's pass, asked for ahead
        #: The loaders reading this feed (as many as the tuner says).
        self.members = Members(self, self.feed_id, blob, processes, self._cond)
        self.members.connect()
        links = self.members.links
        weakref.finalize(self, RemoteFeed._close, self.feed_id, links, self._fds)

    # -- what the loaders of the feed ask of it (see :class:`~.members.LinkHost`) ---------------
    def opened(self, link: Link) -> None:
        if self._fds:
            self._send_slots(link, sorted(self._fds))

    def joined(self, link: Link) -> None:
        for live in self._live.values():
            self._send(link, StartEpoch(live.token, live.epoch, live.start_step))
            live.links.append(link)

    def dropped(self, link: Link) -> None:
        for live in self._live.values():
            if link in live.links:
                live.links.remove(link)
        self._drop_pending(link)

    def in_flight(self) -> int:
        return sum(p.in_flight for p in self._live.values())

    def latest_pass(self) -> int:
        return max(self._live, default=0)

    def _drop_pending(self, link: Link) -> None:
        """Nothing more will come from ``link``: its slots come back, and the passes whose end
        it was to confirm no longer wait for it (under ``_cond``)."""
        for slot in link.slots:
            self.slots.release(slot)
        link.slots.clear()
        for token in link.ending:
            self._confirm_end(token)
        link.ending.clear()

    # -- connecting ---------------------------------------------------------------------------------

    def _send_slots(self, link: Link, slots: Sequence[int], retire: tuple[int, ...] = ()) -> None:
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
        self._retire_slots(range(first, first + count))

    def _retire_slots(self, added: Sequence[int] = ()) -> None:
        """Let go of free slots beyond those kept (this feed's share of the budget may have
        shrunk as other feeds started reading); tell the loaders, with the slots ``added``."""
        retire = self.slots.retire_extra(keeping=added)
        for slot in retire:
            os.close(self._fds.pop(slot))
        if added or retire:
            for link in self.members.links:
                self._send_slots(link, added, retire)

    def _check_links(self) -> None:
        """Restart dead loaders, and wait until every loader has unpickled the feed (those
        joining while reading are waited for by :meth:`_fit_loaders`)."""
        if any(
            link.error is not None or not link.process.alive() for link in self.members.serving()
        ):
            self.members.connect()
        while not all(link.registered for link in self.members.serving()):
            self._pump()
        for link in self.members.serving():
            if link.error is not None:
                raise link.error

    # -- messages --------------------------------------------------------------------------------
    def _send(self, link: Link, message: Any, fds: Sequence[int] = ()) -> None:
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
            channels = {
                link.channel.fileno(): link for link in self.members.links if link.error is None
            }
            ready = readable(list(channels), POLL_SECONDS)
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

    def _dispatch(self, link: Link, message: Any) -> None:
        if isinstance(message, (Loaded, Raised)):
            link.slots.pop(message.slot, None)
            link.delivered += 1
            if isinstance(message, Loaded) and message.cpu > link.cpu:  # (the tuner measures it)
                self.tuner.read_cpu(message.cpu - link.cpu, reader=link.process.pid)
                link.cpu = message.cpu
            if message.token in self._ending:
                self.slots.release(message.slot)  # a pass gone: nothing will be lent from it
            else:
                self._arrived[(message.token, message.first)] = message
        elif isinstance(message, EpochEnded):
            for slot, (token, _) in list(link.slots.items()):
                if token == message.token:
                    del link.slots[slot]
                    self.slots.release(slot)
            link.ending.discard(message.token)
            self._confirm_end(message.token)
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

    def _confirm_end(self, token: int) -> None:
        """One loader fewer to confirm the end of the pass ``token``."""
        left = self._ending.get(token, 1) - 1
        if left > 0:
            self._ending[token] = left
        else:
            self._ending.pop(token, None)

    def _lost(self, link: Link) -> None:
        if link.error is not None:
            return
        code = link.process.exit_code()
        if code is None:  # alive: its side of this feed's link ended (its stderr says why)
            how = (
                "closed its link to this dataset while still running (an error in the loader "
                "itself, not in your data or `map_batch`: its traceback is on stderr; please "
                "report it)"
            )
        else:
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            how += (
                " while reading batches (killed for memory? a crash in native code, e.g. in "
                "`map_batch`?)"
            )
        error = LoaderError(
            f"the arrayfeed loader process (pid {link.process.pid}) {how}; a new loader "
            "starts with the next epoch. To read in this process instead, pass `processes=0`."
        )
        with self._cond:
            link.registered, link.error = True, error
            self._drop_pending(link)

    # -- epochs ------------------------------------------------------------------------------------
    def epoch(self, epoch: int, start_step: int = 0) -> Generator[Any, None, None]:
        """Groups of ``epoch`` from ``start_step`` on, read by the loaders, in order; a short
        pass also asks for the next epoch's first groups (as :func:`~..readers.read_pass`)."""
        feed = self._feed()
        if feed is None:
            raise RuntimeError("arrayfeed: a pass over a feed that is gone")
        treedef, batch = feed.treedef, feed.plan.batch_size
        asked = self._take_ahead(epoch, start_step) or self._start(
            feed, epoch, start_step, ramp=feed.ramps()
        )
        del feed
        tuner, after, kept, follow = self.tuner, None, None, True
        tuner.pass_started(carried=asked.asked, whole=asked.asked == len(asked.todo))
        began = time.perf_counter()
        try:
            for first, stop in asked.todo:
                self.members.fit()
                threads = tuner.threads
                wanted = (threads + 1) * len(self.members.reading())
                self._ask(asked, threads, wanted, asked.in_flight)
                if follow and asked.asked == len(asked.todo):
                    after, follow = self._follow(epoch, began), False
                if after is not None:  # within the same groups in flight
                    self._ask(after, threads, wanted, asked.in_flight + after.in_flight)
                waiting = time.perf_counter()
                message = self._await(asked.token, first, asked.route.pop(first))
                waited = time.perf_counter() - waiting
                asked.in_flight -= 1
                if isinstance(message, Raised):
                    with self._cond:
                        self.slots.release(message.slot)
                    raise message.error.raised_here()
                with self._cond:
                    arrays = self.slots.lend(message.slot, message.arrays)
                tuner.delivered((stop - first) * batch, waited=waited, seconds=message.seconds)
                yield treedef.unflatten(arrays)
                del arrays
            tuner.pass_ended()
            kept, after = after, None
            feed = self._feed()
            if feed is not None:
                feed.ahead.last_seconds = time.perf_counter() - began
        finally:
            self._end(asked.token, asked.links)
            if after is not None:  # cut short: what was asked for the next epoch goes too
                self._end(after.token, after.links)
        if kept is not None:
            self._keep_ahead(kept)

    def _start(self, feed: Feed, epoch: int, start_step: int, ramp: bool = False) -> Asked:
        """Start a pass in every loader (``ramp``: see :meth:`~..read.feed.Feed.ramps`)."""
        with self._cond:
            self._check_links()
            if not len(self.slots):
                room = self.slots.keep  # (within this feed's share of the budget)
                self._add_slots(max(1, min(self._first_slots, room)))
            else:
                self._retire_slots()
            token = next(self._tokens)
            links = list(self.members.links)
            for link in links:
                self._send(link, StartEpoch(token, epoch, start_step, ramp))
            todo = groups(feed.plan, start_step, feed.group_steps, ramp)
            asked = Asked(token, epoch, start_step, todo, feed.group_owner(epoch), links)
            self._live[token] = asked
        return asked

    def _follow(self, epoch: int, began: float) -> Asked | None:
        """The pass over the next epoch, started now, if the pass over ``epoch`` that began at
        ``began`` reads it ahead (see :func:`~..readers.reads_next`)."""
        feed = self._feed()
        if feed is None or not reads_next(feed, epoch, began):
            return None
        try:
            return self._start(feed, epoch + 1, 0)
        except Exception:  # a loader lost: the next epoch's own pass says so, not this one
            return None

    def _take_ahead(self, epoch: int, start_step: int) -> Asked | None:
        """The pass asked for ahead for ``epoch`` from ``start_step``, if that is the one held
        and its loaders still serve this feed; another is ended."""
        with self._cond:
            held, self._ahead = self._ahead, None
        if held is None:
            return None
        same = len(held.links) == len(self.members.links) and all(
            a is b and a.error is None and a.process.alive()
            for a, b in zip(held.links, self.members.links, strict=False)
        )
        if same and (held.epoch, held.start_step) == (epoch, start_step):
            return held
        self._end(held.token, held.links)
        return None

    def drop_ahead_unless(self, epoch: int, start_step: int) -> None:
        """End the pass asked for ahead unless it is for ``epoch`` from ``start_step`` (the
        feed was moved: its slots come back now, not at the next call)."""
        held = self._take_ahead(epoch, start_step)
        if held is not None:
            self._keep_ahead(held)

    def _keep_ahead(self, asked: Asked) -> None:
        """Hold ``asked`` for the call that takes its epoch (ending one held before: another
        iterator's, never taken)."""
        with self._cond:
            dropped, self._ahead = self._ahead, asked
        if dropped is not None:
            self._end(dropped.token, dropped.links)

    def _ask(self, asked: Asked, threads: int, wanted: int, in_flight: int) -> None:
        """Ask for the next groups of a pass while fewer than ``wanted`` (of every pass) are in
        flight and slots are free or can be made."""
        reading = self.members.reading()
        while asked.asked < len(asked.todo) and in_flight < wanted:
            slot = self._slot(in_flight, wanted)
            if slot is None:
                break
            a, b = asked.todo[asked.asked]
            link = asked.route[a] = reading[asked.owner(a) % len(reading)]
            with self._cond:
                link.slots[slot] = (asked.token, a)
            self._send(link, Read(asked.token, a, b, slot, threads, len(reading)))
            asked.asked += 1
            asked.in_flight += 1
            in_flight += 1

    def _slot(self, in_flight: int, wanted: int) -> int | None:
        """A slot to read the next group into: None when the pass should first take a group
        that is in flight; a new slot when every one is held (by the consumer, or by the groups
        another pass has not yet taken), or when tuning wants more groups in flight than there
        are slots and the feed's share of the budget holds one more."""
        while True:
            with self._cond:
                slot = self.slots.take()
                if slot is not None:
                    return slot
                wants = len(self.slots) < min(wanted + HELD_GROUPS, self.slots.keep)
                if in_flight and wants and self.slots.fits():
                    self._add_slots(1)
                    continue
                if in_flight:
                    return None
                ending = any(
                    token in self._ending
                    for link in self.members.links
                    for token, _ in link.slots.values()
                )
                if not ending:  # held by the consumer, or by another pass's groups: one more
                    self._add_slots(1)
                    continue
            self._pump()  # an ended pass's slots come back when its end is confirmed

    def _await(self, token: int, first: int, link: Link) -> Loaded | Raised:
        while True:
            with self._cond:
                message = self._arrived.pop((token, first), None)
                if message is not None:
                    return message
                if link.error is not None:
                    raise link.error
            self._pump()

    def _end(self, token: int, links: list[Link]) -> None:
        with self._cond:
            self._live.pop(token, None)
            for key in [k for k in self._arrived if k[0] == token]:
                self.slots.release(self._arrived.pop(key).slot)
            live = [link for link in links if link.error is None]
            if live:
                self._ending[token] = len(live)
            for link in live:
                link.ending.add(token)
                try:
                    link.channel.send(EndEpoch(token))
                except Exception:  # the loader is gone (or this interpreter is exiting)
                    link.ending.discard(token)
                    self._confirm_end(token)

    @staticmethod
    def _close(feed_id: int, links: list[Link], fds: dict[int, int]) -> None:
        loaders().release(feed_id)
        for link in links:  # a closed channel ends the feed in its loader
            with contextlib.suppress(OSError):
                link.channel.close()
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        fds.clear()
