"""NumPy batches without TensorFlow: :func:`batches`, for JAX, PyTorch or any Python loop.

The feed is built by :mod:`.build` from the same arguments as :func:`arrayfeed.from_arrays`
(:class:`~.options.FeedArgs`), so the two give the same stream, bit for bit. Where the tf.data glue splits each group of stacked
batches in the graph, :class:`Batches` splits it here into NumPy views of the group's buffer; a
view keeps that buffer referenced, so the feed's :class:`~.read.BufferPool` never reuses it while
any batch of the group is alive.

:func:`tuning` and :func:`state` take a dataset of either entry point (or of
:func:`arrayfeed.distribute`) and answer for its feed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..._forks import renew_after_fork
from ..._validate import integer
from ..plan.shard import Shard
from ..read.feed import Feed
from ..read.sparse import SparseFeed, to_scipy
from ..read.structure import flatten
from ..tune.report import Tuning
from .build import build_feed
from .options import FeedArgs, takes_feed_args
from .resume import distributed_of, feeds_of
from .state import encode

__all__ = ["Batches", "batches", "state", "tuning"]


@takes_feed_args
def batches(args: FeedArgs) -> Batches:
    """Shuffled, sharded batches of NumPy arrays read from arrays on disk or in memory.

    The same stream as :func:`arrayfeed.from_arrays` with the same arguments, bit for bit, without
    TensorFlow: for JAX, PyTorch or a plain Python loop. Importing arrayfeed and iterating never
    imports TensorFlow.

    Args: FeedArgs

    Returns:
        A :class:`Batches`: ``len()`` is the number of batches per epoch on this worker, and each
        iteration (``for batch in b``) is the next epoch, taken when its first batch is
        requested. Batches are ``x``, ``(x, y)`` or ``(x, y, sample_weight)`` of NumPy arrays
        (lists become tuples, dicts stay dicts). Each array is fresh memory that nothing else
        writes: keep it as long as you like, hand it to ``jax.device_put`` or
        ``torch.from_numpy``.

    Raises:
        ArrayfeedError: The subclass and message :func:`arrayfeed.from_arrays` gives for the
            same arguments (bad arguments, shapes, dtypes, files), when this is called; faults
            only reading can find are raised by the iteration.

    >>> import numpy as np, arrayfeed as af
    >>> b = af.batches(np.arange(10.0), np.arange(10), batch_size=4, shuffle=False)
    >>> len(b)
    3
    >>> [y.tolist() for x, y in b]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    >>> b.position  # where the next batch starts: epoch 1, step 0
    (1, 0)
    >>> [y.tolist() for x, y in af.batches(np.arange(10.0), np.arange(10), batch_size=4,
    ...                                    shuffle=False, start_epoch=1, start_step=2)]
    [[8, 9]]
    """
    built = build_feed(args, caller="batches")
    return Batches(built.feed)


class Batches:
    """Epochs of NumPy batches; made by :func:`batches` (see there).

    Iterating it (``for batch in b``) yields the next epoch, from the position :meth:`seek`
    set, else after the last epoch started. :attr:`position` is where the batch after the last
    one yielded lies: save it with a checkpoint, and pass it back as ``start_epoch`` /
    ``start_step`` (or to :meth:`seek`) to continue at the first batch not yet trained on; or save
    :meth:`state` and pass it back as ``resume=``, also to a job on another number of workers.

    It pickles (the arrays by path, as the feed does): the copy continues where the feed would.
    """

    def __init__(self, feed: Feed) -> None:
        self._feed = feed
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._position = feed.next_position

    def __len__(self) -> int:
        """Batches per epoch on this worker (a resumed first epoch yields fewer)."""
        return self._feed.plan.steps

    def __iter__(self) -> Iterator[Any]:
        """The batches of the next epoch; the epoch is taken at the first request."""
        return self._epoch()

    @property
    def tuning(self) -> Tuning:
        """How many groups are read at once, by how many loader processes, and why: tuned
        while reading unless ``num_threads`` fixed it (see :func:`arrayfeed.tuning`)."""
        return self._feed.tuning

    @property
    def shard(self) -> Shard:
        """The rows this worker reads: worker ``index`` of ``count``; with ``shard="auto"``,
        :attr:`Shard.source` says which variables of the environment said so (None: none did,
        and this process reads everything)."""
        return self._feed.plan.shard

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, step)`` of the batch after the last one yielded: the next unseen batch.

        Before any batch is yielded (and after :meth:`seek`), where the next iteration starts.
        After the last batch of epoch ``e``, ``(e + 1, 0)``. An iteration abandoned mid-epoch
        leaves it mid-epoch, while the next iteration starts the next epoch (as with
        ``from_arrays``); ``seek(*b.position)`` continues the abandoned epoch instead.
        """
        with self._lock:
            return self._position

    def state(self) -> dict[str, Any]:
        """The state at :attr:`position` to checkpoint: a small JSON-serialisable dict, the same
        on every worker, that ``resume=`` takes to continue there, also on another number of
        workers or with another batch size (see :func:`arrayfeed.state`).

        >>> import numpy as np, arrayfeed as af
        >>> b = af.batches(np.arange(10.0), batch_size=4, seed=0)
        >>> first = next(iter(b))
        >>> saved = b.state()
        >>> saved["epoch"], saved["step"]
        (0, 1)
        >>> [len(x) for x in af.batches(np.arange(10.0), batch_size=4, seed=0, resume=saved)]
        [4, 2]
        """
        return encode(self._feed, *self.position)

    def _state_at(self, epoch: Any, step: Any) -> dict[str, Any]:
        return encode(self._feed, epoch, step)

    def seek(self, epoch: int, step: int = 0) -> None:
        """Make the next iteration start at ``step`` of ``epoch`` (O(1): nothing is replayed)."""
        self._feed.seek(epoch, step)
        with self._lock:
            self._position = self._feed.next_position

    def _epoch(self) -> Iterator[Any]:
        feed = self._feed
        epoch, step, groups = feed.take()
        steps = feed.plan.steps
        try:
            for group in groups:
                if feed.stacked:
                    leaves, _ = flatten(group, _is_ndarray)
                    for i in range(len(leaves[0])):
                        batch = feed.treedef.unflatten([leaf[i] for leaf in leaves])
                        step += 1
                        self._moved(epoch, step, steps)
                        yield batch
                else:
                    step += 1
                    self._moved(epoch, step, steps)
                    yield to_scipy(feed.treedef, group) if isinstance(feed, SparseFeed) else group
        finally:
            groups.close()  # stops the epoch's reader threads now, also when abandoned

    def _moved(self, epoch: int, step: int, steps: int) -> None:
        with self._lock:
            self._position = (epoch + 1, 0) if step >= steps else (epoch, step)

    def __getstate__(self) -> dict[str, Any]:
        return {"feed": self._feed, "position": self.position}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._feed = state["feed"]
        self._lock = threading.Lock()
        renew_after_fork(self, "_lock")
        self._position = state["position"]

    def __repr__(self) -> str:
        plan = self._feed.plan
        return (
            f"Batches(steps={plan.steps}, batch_size={plan.batch_size}, "
            f"shuffle={plan.mode.name!r}, shard={plan.shard!r}, position={self.position})"
        )


def _is_ndarray(obj: Any) -> bool:
    return isinstance(obj, np.ndarray)


def tuning(data: Any) -> Tuning:
    """How the reading of ``data`` runs: the groups read at once, the loader processes reading
    them, whether and how they were tuned, and the rows per second each setting tried
    delivered.

    ``data``: what :func:`arrayfeed.batches` returns, or a dataset of
    :func:`arrayfeed.from_arrays` (also behind ``tf.data`` transformations such as ``map``).

    >>> import numpy as np, arrayfeed as af
    >>> af.tuning(af.batches(np.zeros((100, 3)), num_threads=2)).threads
    2
    """
    if isinstance(data, Batches):
        return data.tuning
    todo = [data]
    while todo:
        node = todo.pop()
        feed = getattr(node, "_arrayfeed_feed", None)
        if feed is not None:
            return feed.tuning  # type: ignore[no-any-return]
        inputs = getattr(node, "_inputs", None)
        if callable(inputs):
            todo.extend(inputs())
    raise TypeError(
        f"arrayfeed.tuning() takes what arrayfeed.batches or arrayfeed.from_arrays returned (or a "
        f"tf.data dataset made from one), not {type(data).__name__}"
    )


def state(data: Any, epoch: int | None = None, step: int | None = None) -> dict[str, Any]:
    """The state to checkpoint at ``(epoch, step)`` of ``data``, for ``resume=`` (the same dict
    on every worker).

    Args:
        data: A dataset :func:`arrayfeed.from_arrays` returned (also behind ``map``,
            ``prefetch`` …), what :func:`arrayfeed.batches` returned, or a dataset of
            :func:`arrayfeed.distribute`.
        epoch: The epoch of the next batch to train on; by default where the next iteration of
            ``data`` starts (for a :class:`~arrayfeed.Batches`, its ``position``).
        step: The step of that batch in ``epoch``, as ``data`` numbers them: an epoch's first
            batch is step 0 and a resumed first iteration starts at the step this function gives
            for it (its ``"step"``); ``len(data)`` is the end of the epoch. For a dataset of
            :func:`arrayfeed.distribute`, the steps of the distributed dataset taken in the
            iteration over ``epoch``, from 0.

    Returns:
        A small JSON-serialisable dict; see :doc:`/guide/resume`.

    >>> import numpy as np, arrayfeed as af
    >>> ds = af.batches(np.arange(100.0), batch_size=10, seed=0, shard=af.Shard(4, 1))
    >>> saved = af.state(ds, epoch=2, step=1)        # worker 1 of 4 took one batch of epoch 2
    >>> saved["epoch"], saved["step"], saved["workers"]
    (2, 1, 4)
    >>> resumed = af.batches(np.arange(100.0), batch_size=10, seed=0, shard=af.Shard(2, 0),
    ...                      resume=saved)           # on 2 workers: 60 rows of epoch 2 are left
    >>> af.state(resumed)["step"], len(resumed)      # worker 0 of 2 takes its last 3 steps of 5
    (2, 5)
    """
    if isinstance(data, Batches):
        return data.state() if epoch is None and step is None else data._state_at(epoch, step)
    distributed = distributed_of(data)
    feeds = [distributed.feed] if distributed is not None else feeds_of(data)
    if len(feeds) != 1:
        raise TypeError(
            "arrayfeed.state() takes what arrayfeed.batches, from_arrays or distribute returned "
            f"(or a tf.data dataset made from one), not {type(data).__name__}"
        )
    feed = feeds[0]
    start = feed.next_position
    if epoch is None and step is None:
        return encode(feed, *start)
    if epoch is None or step is None:
        raise TypeError("arrayfeed.state() takes both `epoch` and `step`, or neither")
    if distributed is not None:
        epoch, step = integer(epoch, "epoch", low=0), integer(step, "step", low=0)
        begins = distributed.start[1] if epoch == distributed.start[0] else 0
        step = min(feed.plan.steps, begins + step * distributed.replicas)
    return encode(feed, epoch, step)
