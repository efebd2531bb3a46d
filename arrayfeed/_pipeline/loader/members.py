"""The loaders that read a feed: the training process's link to each, the passes they serve,
and how many of them are asked for groups — as many as the tuner says (:mod:`..tune.tuning`):
a loader started while a pass is read joins it, and is asked for groups once registered (the
tuner counting from its first group: it opens the files, or the storage's connections, there);
one no longer asked for leaves once it has delivered what it was asked for. The loader the tuner
may try next is started before it is tried, and unpickles the feed then (its imports, and the
storage it opens), but is registered with it, and asked for groups, only once tried.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tune.tuning import Tuner
from .processes import LoaderProcess, loaders
from .slots import Slots
from .wire import Channel, StartEpoch

__all__ = ["Asked", "Link", "LoaderCountMixin"]


@dataclass
class Link:
    """One loader serving this feed: its process and the feed's channel to it."""

    process: LoaderProcess
    channel: Channel
    registered: bool = False
    error: BaseException | None = None
    #: Slots each pass has asked this loader to fill and that have not come back.
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Passes ended here whose end this loader has not confirmed yet.
    ending: set[int] = field(default_factory=set)
    #: Groups it has delivered (a loader that joined counts for the tuner from its first).
    delivered: int = 0
    #: CPU seconds the loader had used at its last group delivered (it says with each).
    cpu: float = 0.0


@dataclass
class Asked:
    """A pass over ``epoch`` from ``start_step`` as asked of the loaders: its groups, the key
    that deals them out, the loaders serving it, how many groups were asked for and how many of
    those are not taken yet."""

    token: int
    epoch: int
    start_step: int
    todo: list[tuple[int, int]]
    owner: Callable[[int], int]
    links: list[Link]
    asked: int = 0
    in_flight: int = 0
    #: The loader each group asked for and not yet taken was asked of, by its first step.
    route: dict[int, Link] = field(default_factory=dict)


class LoaderCountMixin:
    """How many loaders a feed's link asks for groups (see the module docstring); mixed into
    :class:`~.client.RemoteFeed`, which holds the state below."""

    tuner: Tuner
    processes: int
    feed_id: int
    slots: Slots
    _cond: threading.Condition
    _links: list[Link]
    _live: dict[int, Asked]  # passes started and not ended, by token
    _joining: list[Link]  # loaders added while reading, not registered yet
    _warming: list[Link]  # loaders joined, reading, that have delivered nothing
    _warm_token: int  # the last pass started when they joined
    _no_more: bool  # a loader could not be started: no more are tried
    _spares: list[LoaderProcess]  # loaders started before they are tried (see _fit_spares)
    _spare_count: int  # the count the tuner asked to have started, when they were
    _blob: bytes  # the feed, pickled

    def _connect(self) -> None:
        raise NotImplementedError

    def _send(self, link: Link, message: Any, fds: Sequence[int] = ()) -> None:
        raise NotImplementedError

    def _confirm_end(self, token: int) -> None:
        raise NotImplementedError

    def _drop_pending(self, link: Link) -> None:
        """Nothing more will come from ``link``: its slots come back, and the passes whose end
        it was to confirm no longer wait for it (under ``_cond``)."""
        for slot in link.slots:
            self.slots.release(slot)
        link.slots.clear()
        for token in link.ending:
            self._confirm_end(token)
        link.ending.clear()

    def _serving(self) -> list[Link]:
        return [link for link in self._links if link not in self._joining]

    # -- how many loaders (tuned while reading) --------------------------------------------------
    def _reading(self) -> list[Link]:
        """The loaders groups are asked of now: as many as the tuner says, of those serving."""
        count = max(1, self.tuner.processes)
        return [link for link in self._links[:count] if link not in self._joining]

    def _fit_loaders(self) -> None:
        """Start the loaders the tuner asks for beyond those serving (they join every pass
        under way and are asked for groups once registered; the tuner counts from their first
        group on: the first opens the files, or the storage's connections, there), and let go
        of those beyond it once they have no group to deliver."""
        count = max(1, self.tuner.processes)
        spare = self.tuner.spare
        if (
            count == len(self._links)
            and not self._joining
            and not self._warming
            and spare == self._spare_count
        ):
            return
        with self._cond:  # (two passes of one feed may be read at once)
            if count > len(self._links) and not self._joining and not self._no_more:
                try:
                    self._grow(count)
                except OSError:  # no more processes here: the tuner measures those there are
                    self._no_more = True
                    self.tuner.processes_ready(sum(p.in_flight for p in self._live.values()))
            if self._joining and all(link.registered for link in self._joining):
                joined, self._joining = self._joining, []
                for link in joined:
                    if link.error is not None:  # could not start: read with those there are
                        self._retire(link)
                    else:
                        self._warming.append(link)
                self._warm_token = max(self._live, default=0)
                if not self._warming:
                    self.tuner.processes_ready(sum(p.in_flight for p in self._live.values()))
            # Warm once each has delivered a group, or once a pass started since (an epoch of
            # fewer groups than loaders may never deal one to it).
            if self._warming and (
                max(self._live, default=0) > self._warm_token
                or all(
                    link.delivered or link.error is not None or link not in self._links
                    for link in self._warming
                )
            ):
                self._warming = []
                self.tuner.processes_ready(sum(p.in_flight for p in self._live.values()))
            if len(self._links) > count and not self._joining:
                for link in self._links[count:]:
                    if not link.slots:
                        self._retire(link)
            if spare != self._spare_count:
                self._fit_spares(spare)

    def _fit_spares(self, spare: int) -> None:
        """Start the loaders the tuner may try next (``spare`` in all), not yet registered
        with this feed, and have them unpickle it: a new interpreter imports the package, and
        then the feed's storage (a Zarr store on S3: its libraries, credentials, the store's
        metadata), for 0.2-0.5 s of a core, which then passes while the tuner measures
        fewer threads, not while it measures more loaders; let go of those it no longer may try
        (those it did are among the links)."""
        self._spare_count = spare
        linked = [link.process for link in self._links]
        if spare > len(self._links) and not self._no_more:
            try:
                taken = loaders().take(spare, self.feed_id)
            except OSError:  # no more processes here: the tuner will find so when it tries
                return
            for process in taken:
                if process not in linked and process not in self._spares:
                    with contextlib.suppress(OSError):  # one that died: found when tried
                        process.prepare(self.feed_id, self._blob)
            self._spares = [p for p in taken if p not in linked]
            return
        for process in self._spares:
            if process not in linked:
                loaders().release(self.feed_id, process)
        self._spares = []

    def _grow(self, count: int) -> None:
        with self._cond:
            before = list(self._links)
            self.processes = count
            self._connect()
            self._joining = [link for link in self._links if link not in before]
            for link in self._joining:
                for live in self._live.values():
                    self._send(link, StartEpoch(live.token, live.epoch, live.start_step))
                    live.links.append(link)

    def _retire(self, link: Link) -> None:
        """Stop asking ``link``'s loader for this feed's groups (it has none to deliver): its
        side of the feed ends when the link closes."""
        with self._cond:
            if link in self._links:
                self._links.remove(link)
            for live in self._live.values():
                if link in live.links:
                    live.links.remove(link)
            self._drop_pending(link)
            self.processes = len(self._links)
        with contextlib.suppress(OSError):
            link.channel.close()
        loaders().release(self.feed_id, link.process)
