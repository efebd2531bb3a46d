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
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..tune.tuning import Tuner
from .processes import LoaderProcess, loaders
from .wire import Channel

__all__ = ["Asked", "Link", "LinkHost", "Members"]


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


class LinkHost(Protocol):
    """What the loaders of a feed need of the feed's link (:class:`~.client.RemoteFeed`): the
    slots and passes are its own, and so is the tuner that says how many loaders read."""

    tuner: Tuner

    def opened(self, link: Link) -> None:
        """A loader's link is new: send it the slots there are."""

    def joined(self, link: Link) -> None:
        """A loader joins while passes are read: start them there."""

    def dropped(self, link: Link) -> None:
        """Nothing more comes from ``link``: its slots come back, its ends are not waited for."""

    def in_flight(self) -> int:
        """Groups asked for and not yet taken, in every pass."""

    def latest_pass(self) -> int:
        """The token of the last pass started (0: none)."""


class Members:
    """The loader processes that read one feed (see the module docstring): ``processes`` of
    them to start with, as many as the tuner asks for then; ``lock``: the feed link's, under
    which passes and links change."""

    def __init__(
        self,
        host: LinkHost,
        feed_id: int,
        blob: bytes,
        processes: int,
        lock: threading.Condition,
    ) -> None:
        # Weakly: the link owns its members, and a dropped dataset is freed by reference count.
        self._host = weakref.proxy(host)
        self.feed_id, self._blob, self.processes = feed_id, blob, processes
        self._lock = lock
        #: The loaders serving this feed, in order (the tuner's count are asked for groups).
        self.links: list[Link] = []
        self._joining: list[Link] = []  # loaders added while reading, not registered yet
        self._warming: list[Link] = []  # loaders joined, reading, that have delivered nothing
        self._warm_token = 0  # the last pass started when they joined
        self._no_more = False  # a loader could not be started: no more are tried
        self.spares: list[LoaderProcess] = []  # started before they are tried
        self._spare_count = 0

    def connect(self) -> None:
        """Register with the loaders (starting them); a new one gets the slots there are."""
        processes = loaders().take(self.processes, self.feed_id)
        links = []
        for process in processes:
            old = next((k for k in self.links if k.process is process and k.error is None), None)
            if old is not None:
                links.append(old)
                continue
            link = Link(process, process.register(self.feed_id, self._blob))
            self._host.opened(link)
            links.append(link)
        for link in self.links:
            if link not in links:
                with contextlib.suppress(OSError):
                    link.channel.close()
        self.links[:] = links

    def serving(self) -> list[Link]:
        """The loaders registered with the feed (not those joining)."""
        return [link for link in self.links if link not in self._joining]

    def reading(self) -> list[Link]:
        """The loaders groups are asked of now: as many as the tuner says, of those serving."""
        count = max(1, self._host.tuner.processes)
        return [link for link in self.links[:count] if link not in self._joining]

    def fit(self) -> None:
        """Start the loaders the tuner asks for beyond those serving (they join every pass
        under way and are asked for groups once registered; the tuner counts from their first
        group on: the first opens the files, or the storage's connections, there), and let go
        of those beyond it once they have no group to deliver."""
        count = max(1, self._host.tuner.processes)
        spare = self._host.tuner.spare
        if (
            count == len(self.links)
            and not self._joining
            and not self._warming
            and spare == self._spare_count
        ):
            return
        with self._lock:  # (two passes of one feed may be read at once)
            if count > len(self.links) and not self._joining and not self._no_more:
                try:
                    self._grow(count)
                except OSError:  # no more processes here: the tuner measures those there are
                    self._no_more = True
                    self._host.tuner.processes_ready(self._host.in_flight())
            if self._joining and all(link.registered for link in self._joining):
                joined, self._joining = self._joining, []
                for link in joined:
                    if link.error is not None:  # could not start: read with those there are
                        self.retire(link)
                    else:
                        self._warming.append(link)
                self._warm_token = self._host.latest_pass()
                if not self._warming:
                    self._host.tuner.processes_ready(self._host.in_flight())
            # Warm once each has delivered a group, or once a pass started since (an epoch of
            # fewer groups than loaders may never deal one to it).
            if self._warming and (
                self._host.latest_pass() > self._warm_token
                or all(
                    link.delivered or link.error is not None or link not in self.links
                    for link in self._warming
                )
            ):
                self._warming = []
                self._host.tuner.processes_ready(self._host.in_flight())
            if len(self.links) > count and not self._joining:
                for link in self.links[count:]:
                    if not link.slots:
                        self.retire(link)
            if spare != self._spare_count:
                self._fit_spares(spare)

    def _fit_spares(self, spare: int) -> None:
        """Start the loaders the tuner may try next (``spare`` in all), not yet registered
        with this feed, and have them unpickle it: a new interpreter imports the package, and
        then the feed's storage (its libraries, credentials, metadata), which then passes while
        the tuner measures, not while the loaders tried are; let go of those it no longer may
        try (those it did are among the links)."""
        self._spare_count = spare
        linked = [link.process for link in self.links]
        if spare > len(self.links) and not self._no_more:
            try:
                taken = loaders().take(spare, self.feed_id)
            except OSError:  # no more processes here: the tuner will find so when it tries
                return
            for process in taken:
                if process not in linked and process not in self.spares:
                    with contextlib.suppress(OSError):  # one that died: found when tried
                        process.prepare(self.feed_id, self._blob)
            self.spares = [p for p in taken if p not in linked]
            return
        for process in self.spares:
            if process not in linked:
                loaders().release(self.feed_id, process)
        self.spares = []

    def _grow(self, count: int) -> None:
        before = list(self.links)
        self.processes = count
        self.connect()
        self._joining = [link for link in self.links if link not in before]
        for link in self._joining:
            self._host.joined(link)

    def retire(self, link: Link) -> None:
        """Stop asking ``link``'s loader for this feed's groups (it has none to deliver): its
        side of the feed ends when the link closes."""
        with self._lock:
            if link in self.links:
                self.links.remove(link)
            self._host.dropped(link)
            self.processes = len(self.links)
        with contextlib.suppress(OSError):
            link.channel.close()
        loaders().release(self.feed_id, link.process)
