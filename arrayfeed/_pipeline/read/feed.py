"""The feed: turns a plan and sources into a stream of stacked batches, one epoch per call.

No TensorFlow here. A :class:`Feed` is the generator function handed to
``tf.data.Dataset.from_generator`` (and iterated by :class:`arrayfeed.Batches`): every call
starts the next epoch (taken when the first element is requested, not when the iterator is
created, so an iterator that is never read does not use up an epoch). Each element it yields is
a *group* of consecutive batches stacked on a new leading axis, shape
``(steps_in_group, batch_rows, *row_shape)`` per leaf; the tf.data glue splits groups back into
batches in the graph (``Batches`` into NumPy views), which amortises the per-element cost of
``from_generator``. When one batch alone is about a group's size (large rows), batches are
yielded one at a time, with no group axis (see :attr:`Feed.stacked`).

Groups are read ahead by reader threads (NumPy gathers release the GIL), in order
(:class:`~.readers.EpochPass`), as many at once as the feed's :class:`~.tuning.Tuner` says (and
one more requested): tuned while reading unless ``num_threads`` fixes it. With ``processes=N`` those
threads run in N loader processes instead, each reading the groups given to it into shared
memory (:mod:`.loader`): the epochs, their order and their bytes are the same, only where the
reading happens differs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..._dtypes import native_dtype
from ..._errors import ConfigError
from ..._forks import renew_after_fork
from ..._storage import GatherInto, Source, chunked_rows, kept_locally, row_bytes, verify_sources
from ..plan.indexblocks import EpochIndices
from ..plan.plan import Plan, check_position
from ..tune.machine import usable_cores, usable_memory
from ..tune.report import Tuning
from ..tune.tuning import MAX_THREADS, Tuner
from .blocks import WindowCache
from .mapbatch import Contract, LeafSpec, probe
from .readers import PassAhead, read_pass
from .resident import Resident, resident_sources
from .rows import Allocator, BufferPool, read_rows
from .structure import Treedef
from .waits import wait_per_batch

__all__ = ["Feed", "Loaders", "OpenLoaders", "default_num_threads", "usable_cores"]

#: Bytes of batches stacked into one generator element (see also :data:`MAX_GROUP_BYTES`; a group
#: is whole batches, so usually a little less). Big, because every ``from_generator`` element has
#: a fixed cost inside TensorFlow (docs/performance.md, "Group size").
GROUP_BYTES = 16 << 20
#: Up to this many bytes per group when every leaf gathers rows itself (``GatherInto``: arrays in
#: memory, memory maps, contiguous HDF5, CSR matrices whose parts gather) and no ``map_batch``
#: runs: reading then costs little per byte, and a group's fixed costs dominate (beside a training
#: loop, GIL hand-offs that each wait up to the switch interval; docs/performance.md, "Groups of
#: cheap reads").
MAX_GROUP_BYTES = 64 << 20
#: Bytes of groups read ahead (``num_threads + 1`` groups) that groups of cheap reads are sized to
#: fill, within :data:`GROUP_BYTES` and :data:`MAX_GROUP_BYTES`: fewer threads, larger groups.
#: Tuning adds reader threads only while their groups fit in these bytes (beyond the default), or
#: in :func:`tuned_read_ahead` on many cores.
READ_AHEAD_BYTES = 256 << 20
#: Bytes of groups of cheap reads (see :data:`MAX_GROUP_BYTES`) that tuned threads may read ahead,
#: per usable core, when that comes to more than :data:`READ_AHEAD_BYTES`: on 16 cores
#: memory-bound reads peak at 8-16 threads, and 256 MiB holds 4 of their 51 MiB groups
#: (docs/performance.md, "Tuning reader threads"). At most a sixteenth of the memory this
#: process may use (within a container's limit: :mod:`.machine`). Other groups are 16 MiB or
#: less, and 256 MiB holds 15 of them already.
TUNED_READ_AHEAD_PER_CORE = 64 << 20
#: Upper bound on batches per group.
MAX_GROUP_STEPS = 1024
#: Most seconds of ``map_batch`` work per group: a group is mapped batch after batch in one
#: reader thread before it is yielded, so a slow ``map_batch`` gets groups of few batches (one
#: batch when a call takes this long), and N threads map N of them at once.
GROUP_MAP_SECONDS = 0.005
#: Most seconds a reader thread waits per group (reading without using the CPU: object storage,
#: a disk, a dask array computed elsewhere): storage whose reads wait gets groups of few batches,
#: so that the reads in flight, not the size of each, carry the rate, and the tuner finds how many
#: the storage needs within the read-ahead. Reads that use the CPU (decoding) keep groups sized
#: by bytes: beside a training loop each group has fixed costs, and more of them in flight gain
#: nothing once the cores are busy. Timed on batch reads when the feed is built.
GROUP_WAIT_SECONDS = 0.05

_INDEX = np.dtype(np.int64)

#: Most reader threads by default when they only read: on many cores reads peak at a few threads
#: and fall beyond, as every hand-off between threads costs more there.
READ_THREADS = 4
#: Most reader threads by default when ``map_batch`` runs in them: the mapping is the user's own
#: work per batch, often far more than the read, and spreads over more cores.
MAP_THREADS = 8


def tuned_read_ahead() -> int:
    """Bytes of groups tuned threads may read ahead (see :data:`TUNED_READ_AHEAD_PER_CORE`)."""
    per_cores = TUNED_READ_AHEAD_PER_CORE * usable_cores()
    memory = usable_memory()
    if memory is not None:
        per_cores = min(per_cores, memory // 16)
    return max(READ_AHEAD_BYTES, per_cores)


def default_num_threads(mapped: bool = False) -> int:
    """Reader threads when none are given: one per usable core, at most :data:`READ_THREADS`
    (:data:`MAP_THREADS` when ``mapped``: a ``map_batch`` runs in the threads)."""
    return max(1, min(MAP_THREADS if mapped else READ_THREADS, usable_cores()))


class Loaders(Protocol):
    """A feed's epochs read by loader processes (:class:`~..loader.client.RemoteFeed`), the
    groups :meth:`Feed.epoch` reads here; ``pid``: its process (a forked child opens its own)."""

    pid: int

    def epoch(self, epoch: int, start_step: int = 0) -> Generator[Any, None, None]: ...

    def drop_ahead_unless(self, epoch: int, start_step: int) -> None: ...


#: Opens a feed's loaders: ``(feed, processes, the feed pickled)``; the entry points hand it in.
OpenLoaders = Callable[["Feed", int, bytes], Loaders]


class Feed:
    """Generator function over epochs of stacked batches (see the module docstring).
    ``open_loaders``: how ``processes`` loaders are opened (needed when there are any)."""

    def __init__(
        self,
        sources: Sequence[Source],
        treedef: Treedef,
        plan: Plan,
        *,
        map_batch: Callable[[Any], Any] | None = None,
        num_threads: int | None = None,
        processes: int = 0,
        loader_required: bool = False,
        open_loaders: OpenLoaders | None = None,
    ) -> None:
        if processes and open_loaders is None:
            raise ValueError("arrayfeed: a feed read by loader processes needs `open_loaders`")
        self.open_loaders = open_loaders
        self.sources = list(sources)
        #: What groups read each leaf through: small chunked leaves are held in memory.
        self.readable = resident_sources(self.sources, plan.bounds)
        self.in_treedef = treedef
        self.plan = plan
        self.map_batch = map_batch
        #: Loader processes reading this feed's epochs (0: this process's reader threads), and
        #: whether they were asked for (else a feed that cannot be sent to one is read here).
        self.processes, self.loader_required = processes, loader_required
        #: Reader threads of the default setting (of each loader process, if any), and whether
        #: ``num_threads`` fixed them (else they are tuned while reading, from this start).
        self.num_threads = num_threads or default_num_threads(mapped=map_batch is not None)
        self.threads_fixed = num_threads is not None
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._next = (0, 0)  # where the next call starts (:meth:`seek` moves it)
        self._ramp = True  # whether the next pass started ramps (see :meth:`ramps`)
        #: The pass over the next epoch that a short pass read ahead (:func:`~.readers.read_pass`).
        self.ahead = PassAhead()
        #: The seed was drawn at random (``seed=None``): a restarted process cannot repeat it.
        self.seed_drawn = False
        #: What every ``map_batch`` result must be like, learned from its first (:mod:`.mapbatch`).
        self.contract: Contract | None = None
        map_seconds = 0.0
        if map_batch is None:
            self.treedef = treedef
            self.specs = [LeafSpec(tuple(s.shape[1:]), native_dtype(s.dtype)) for s in self.sources]
        else:
            self.contract, map_seconds = self._probe_map_batch()
            self.treedef, self.specs = self.contract.treedef, list(self.contract.specs)
        # Size groups on the larger of what is read and what is yielded: a map_batch that shrinks
        # rows must not make groups read gigabytes.
        batch_bytes = max(1, self._row_bytes * plan.batch_size)
        steps = min(MAX_GROUP_STEPS, plan.steps, self._group_bytes() // batch_bytes)
        if map_seconds > 0:
            steps = min(steps, int(GROUP_MAP_SECONDS // map_seconds))
        wait_seconds = self._wait_seconds()
        if wait_seconds > 0:
            steps = min(steps, int(GROUP_WAIT_SECONDS // wait_seconds))
        self.group_steps = int(max(1, steps))
        self.tuner = self._new_tuner()
        self.pool = self._new_pool()
        self._window_pool = self._new_window_pool()
        self._remote = self._new_remote()

    @property
    def _cheap_reads(self) -> bool:
        """Whether every leaf gathers its rows itself and no ``map_batch`` runs: groups are
        then sized by the bytes read ahead (see :data:`MAX_GROUP_BYTES`)."""
        return self.map_batch is None and all(isinstance(s, GatherInto) for s in self.sources)

    def _group_bytes(self) -> int:
        """Target bytes per group (see :data:`MAX_GROUP_BYTES`)."""
        if not self._cheap_reads:
            return GROUP_BYTES
        # Tuned threads may climb: groups are sized so that READ_THREADS of them fit too.
        threads = self.num_threads if self.threads_fixed else max(self.num_threads, READ_THREADS)
        ahead = READ_AHEAD_BYTES // (threads + 1)
        return min(MAX_GROUP_BYTES, max(GROUP_BYTES, ahead))

    def _new_tuner(self) -> Tuner:
        """Reader threads: ``num_threads`` when fixed; else tuned from one (a read alone gives
        the latency the tuner's model needs), up to as many groups in flight as the bytes read
        ahead hold (:data:`READ_AHEAD_BYTES`, or :func:`tuned_read_ahead` for cheap reads, whose
        groups are sized for few threads), at most :data:`~..tune.tuning.MAX_THREADS` each;
        loaders by default up to one per usable core (those asked for stay)."""
        rows = self.group_steps * self.plan.batch_size
        if self.threads_fixed:
            start = self.num_threads
            return Tuner(start, start, fixed=True, processes=self.processes, group_rows=rows)
        ahead = tuned_read_ahead() if self._cheap_reads else READ_AHEAD_BYTES
        memory = max(2, ahead // max(1, rows * self._row_bytes))
        cap = max(1, min(MAX_THREADS, memory - 1))
        cores = usable_cores()
        most = cores if self.processes and not self.loader_required else self.processes
        return Tuner(
            1,
            cap,
            # Groups of a window decoded ahead: at most as many as are in flight at the cap.
            ahead=min(self._groups_decoded_ahead, cap + 1),
            processes=self.processes,
            most_processes=most,
            cores=cores,
            memory=memory,
            group_rows=rows,
        )

    @property
    def _reads_windows(self) -> bool:
        """Whether passes read chunked leaves through windows (``shuffle="block"``)."""
        return self.plan.mode.reads_windows and any(map(chunked_rows, self.readable))

    @property
    def _groups_decoded_ahead(self) -> int:
        """Groups in the window of a block shuffle that is decoded ahead (see
        :meth:`~.readers.EpochPass.submit`): after the tuner moves, they still come at the speed
        of the setting before, so the windows measured just after a move are not counted."""
        if not self._reads_windows:
            return 0
        window = min(self.plan.window_rows, self.plan.rows_per_epoch)
        return -(-window // (self.group_steps * self.plan.batch_size))

    @property
    def _row_bytes(self) -> int:
        """Bytes per row of the larger of what is read and what is yielded."""
        return max(row_bytes(self.sources), sum(s.row_bytes for s in self.specs))

    @property
    def pool_threads(self) -> int:
        """Threads of an :class:`~.readers.EpochPass`: the most reader threads the tuner may ask
        for (the group requested ahead waits in its queue)."""
        return self.tuner.cap

    @property
    def tuning(self) -> Tuning:
        """How many reader threads read, and why (see :class:`~.tuning.Tuning`)."""
        return self.tuner.report()

    @property
    def stacked(self) -> bool:
        """Whether elements carry a leading group axis (several batches per generator call);
        batches of a group's size or more are yielded one at a time, with no group axis."""
        return self.group_steps > 1

    def _new_pool(self) -> BufferPool:
        # Buffers in use at once: groups read ahead, groups TensorFlow still holds (its prefetch
        # buffer and the batch being consumed), and map_batch inputs; per leaf read or yielded.
        # Plus the index blocks of the epoch (:mod:`.indexblocks`).
        leaves = len(self.sources) + (len(self.specs) if self.map_batch is not None else 0)
        in_use = self.tuner.cap + 5
        per_row = row_bytes(self.sources) + 8  # and an index per row
        if self.map_batch is not None:
            per_row += sum(s.row_bytes for s in self.specs)
        per_group = self.group_steps * self.plan.batch_size * per_row
        return BufferPool(
            capacity=2 * in_use * leaves + self.pool_threads + 1,
            max_bytes=max(256 << 20, 2 * in_use * per_group),
        )

    def _new_remote(self) -> Loaders | None:
        """The link to this feed's loader processes (started now, so that they are ready by the
        first epoch), or None when this process reads."""
        if not self.processes:
            return None
        import cloudpickle  # by value: a `map_batch` defined in a script's `__main__` travels too

        state = self.__getstate__()
        state["processes"] = 0  # a loader reads in its own threads
        copy = type(self).__new__(type(self))
        copy.__setstate__(state)
        try:
            blob = cloudpickle.dumps(copy)
        except Exception as exc:
            if not self.loader_required:
                self.processes = 0  # the default reads here what cannot travel
                self.tuner = self._new_tuner()
                return None
            raise ConfigError(
                f"`processes={self.processes}` reads in loader processes, but this dataset "
                f"cannot be sent to one ({type(exc).__name__}: {exc}): `map_batch` and the "
                "arrays travel pickled, and something they hold (a lock, an open file, a "
                "generator) cannot be. Make `map_batch` a plain function, or pass `processes=0` "
                "to read in this process."
            ) from exc
        assert self.open_loaders is not None
        return self.open_loaders(self, self.processes, blob)

    def _new_window_pool(self) -> BufferPool:
        # Window buffers of every chunked leaf, as many as a cache holds.
        if not self.plan.mode.reads_windows:
            return BufferPool(capacity=0)
        chunked = [s for s in self.readable if chunked_rows(s)]
        windows = self._cache_windows  # windows still read after eviction get new buffers
        per_window = self.plan.window_rows * row_bytes(chunked)
        return BufferPool(capacity=windows * len(chunked), max_bytes=windows * per_window)

    @property
    def _cache_windows(self) -> int:
        """Windows a cache holds: those the groups in flight draw from, and two more."""
        plan = self.plan
        in_flight_rows = (self.tuner.cap + 1) * self.group_steps * plan.batch_size
        return 2 + -(-in_flight_rows // plan.window_rows)

    def readers(self, epoch: int) -> list[Source]:
        """What ``epoch`` reads each leaf through: small chunked leaves from memory
        (:mod:`.resident`); with ``shuffle="block"``, other chunked storage through a
        :class:`WindowCache` of the windows that groups in flight draw from."""
        if not self._reads_windows or not any(chunked_rows(s) for s in self.readable):
            return self.readable  # (rows gathered: no windows, no block order to work out)
        order = self.plan.block_order(epoch)
        return [
            WindowCache(s, order, self._cache_windows, self._window_pool) if chunked_rows(s) else s
            for s in self.readable
        ]

    # -- epochs ---------------------------------------------------------------------------------
    def _take_epoch(self) -> tuple[int, int]:
        with self._lock:
            epoch, step = self._next
            self._next = (epoch + 1, 0)
        return epoch, step

    def __call__(self) -> Iterator[Any]:
        """Yield the groups of the next epoch (the epoch is taken at the first request).

        Every source is verified first: a file changed since it was opened raises here, at the
        start of the epoch, before any of its rows are yielded (the first groups a short epoch
        before it read ahead are dropped then, unseen).
        """
        _, _, groups = self.take()
        yield from groups

    def take(self) -> tuple[int, int, Generator[Any, None, None]]:
        """Take the next epoch now: ``(epoch, start_step, its groups)``, as :meth:`__call__` does
        at its first request (sources verified), for callers that need to know the position."""
        epoch, start_step = self._take_epoch()
        try:
            verify_sources(self.sources)
        except BaseException:
            self.ahead.drop()  # what was read ahead: the files changed
            raise
        if self._remote is not None and self._remote.pid != os.getpid():
            self._remote = self._new_remote()  # a forked child: its own loaders and slots
        groups = self._remote.epoch if self._remote is not None else self.epoch
        return epoch, start_step, groups(epoch, start_step)

    def seek(self, epoch: int, step: int = 0) -> None:
        """Make the next call (the next iteration of the dataset) start at ``step`` of ``epoch``."""
        position = check_position(self.plan.steps, epoch, step)
        with self._lock:
            self._next = position
            self._ramp = True
        self.ahead.drop_unless(*position)  # (read ahead for another position)
        if self._remote is not None and self._remote.pid == os.getpid():
            self._remote.drop_ahead_unless(*position)

    def ramps(self) -> bool:
        """Whether the pass starting now splits its first group (``ramp_sizes``): the feed's
        first and the first after :meth:`seek`, whose first batch the consumer waits for."""
        with self._lock:
            ramp, self._ramp = self._ramp, False
        return ramp and self.group_steps > 1

    @property
    def next_position(self) -> tuple[int, int]:
        """``(epoch, step)`` where the next call will start."""
        with self._lock:
            return self._next

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # Locks cannot be pickled, and buffers are not worth it: the copy gets its own (and a
        # tuner of its own: a loader reads as many groups at once as it is asked for).
        del state["_lock"], state["pool"], state["_window_pool"], state["tuner"], state["ahead"]
        state.pop("_remote", None)  # absent while the link itself is being made
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self.ahead = PassAhead()
        self.tuner = self._new_tuner()
        self.pool = self._new_pool()
        self._window_pool = self._new_window_pool()
        self._remote = self._new_remote()

    def group_owner(self, epoch: int) -> Callable[[int], int]:
        """A key of each group of ``epoch`` (by its first step) for dealing groups out among
        loaders: consecutive groups, or, in a shuffle mode that reads windows, the window a
        group starts in (a window's groups then go to one loader, which reads it once)."""
        if not self.plan.mode.reads_windows:
            steps = self.group_steps
            return lambda first: first // steps
        order, batch = self.plan.block_order(epoch), self.plan.batch_size
        return lambda first: int(order.window_at(first * batch))

    def epoch(self, epoch: int, start_step: int = 0) -> Generator[Any, None, None]:
        """Groups of ``epoch`` from ``start_step`` on, read ahead by the reader threads, in
        order, as many at once as the tuner says and one more requested (a short pass also the
        next epoch's first groups: :func:`~.readers.read_pass`)."""
        return read_pass(self, epoch, start_step)

    # -- reading --------------------------------------------------------------------------------
    def read_group(
        self,
        epoch: int,
        first: int,
        stop: int,
        readers: Sequence[Source] | None = None,
        blocks: EpochIndices | None = None,
        out: Allocator | None = None,
    ) -> Any:
        """Steps ``[first, stop)`` of ``epoch`` in the output structure: per leaf, the batches
        stacked on a leading axis when :attr:`stacked`, else the one batch itself. ``blocks``:
        the epoch's indices, shared by its groups (else this group's are computed here);
        ``out``: where the group's arrays go (a loader's shared memory; default: the pool)."""
        plan = self.plan
        rows = plan.batch_rows(first)
        lead = (stop - first, rows) if self.stacked else (rows,)
        indices = self.group_indices(epoch, first, stop, blocks)
        into = out or self.pool
        if self.map_batch is None:
            leaves = read_rows(readers or self.readable, indices, lead_shape=lead, pool=into)
            return self.treedef.unflatten(leaves)
        leaves = read_rows(readers or self.readable, indices, lead_shape=lead, pool=self.pool)
        assert self.contract is not None
        outs = [into.empty((*lead, *s.row_shape), s.dtype) for s in self.specs]
        for i in range(stop - first):
            batch = [leaf[i] for leaf in leaves] if self.stacked else leaves
            outputs = self.contract.apply(self.map_batch, self.in_treedef.unflatten(batch), rows)
            for leaf, value in zip(outs, outputs, strict=True):
                leaf[i if self.stacked else slice(None)] = value
        return self.treedef.unflatten(outs)

    def group_indices(
        self, epoch: int, first: int, stop: int, blocks: EpochIndices | None
    ) -> np.ndarray:
        """Row indices of steps ``[first, stop)`` of ``epoch``, from ``blocks`` when given."""
        if blocks is not None:
            return blocks.get(first, stop)
        out = self.pool.empty((self.plan.index_count(first, stop),), _INDEX)
        return self.plan.indices(epoch, first, stop, out=out)

    @property
    def index_allocator(self) -> Callable[[int], np.ndarray]:
        """Room for ``n`` row indices, recycled: beside TensorFlow a fresh array of a group's
        indices is a new, page-faulting mmap. (It holds the pool, not the feed.)"""
        pool = self.pool
        return lambda n: pool.empty((n,), _INDEX)

    def _wait_seconds(self) -> float:
        """Seconds a reader thread waits per batch on the leaves read from storage for every
        group (not gathered from memory, not held in it): the time a read takes beyond the CPU
        time of its thread, when waiting is most of it (0 otherwise, or when no leaf is read
        from storage): see :mod:`.waits`."""
        slow = [  # (reads through a local cache wait the first time only)
            s
            for s in self.readable
            if not isinstance(s, (GatherInto, Resident)) and not kept_locally(s)
        ]
        if not slow:
            return 0.0
        start, stop = self.plan.bounds
        rows = min(self.plan.batch_size, self.plan.rows_per_epoch)
        waited = wait_per_batch(lambda indices: read_rows(slow, indices), start, stop, rows)
        return waited * self.plan.batch_size / max(1, rows)

    def _probe_map_batch(self) -> tuple[Contract, float]:
        """Run ``map_batch`` once on the first rows in storage order to learn its contract (and
        how long it takes, per batch)."""
        assert self.map_batch is not None
        start, _ = self.plan.bounds
        rows = min(self.plan.batch_size, self.plan.rows_per_epoch)
        leaves = read_rows(self.sources, np.arange(start, start + rows, dtype=np.int64))
        batch = self.in_treedef.unflatten(leaves)
        return probe(self.map_batch, batch, rows, self.plan.batch_size)
