"""Index planning: which rows form each batch of each epoch on this worker.

Pure NumPy: no I/O, no TensorFlow, no global random state. Every quantity is a function of
``(n_rows, shard, batch_size, drop_remainder, shuffle, seed)`` and the epoch, so any batch of any
epoch can be computed directly (resuming costs O(1)), and memory is O(batch) for any number of rows.

Layout of one epoch on worker ``k`` of ``K``:

1. **Shard** (before shuffling): rows ``[start_k, stop_k)``, the ``k``-th of ``K`` contiguous,
   disjoint ranges that cover all rows; range lengths differ by at most one.
2. **Equal length**: every worker uses ``rows_per_epoch = n_rows // K`` rows of its range per
   epoch, so every worker runs the same number of steps. A worker whose range is one row longer
   leaves one row out of each epoch: with shuffling a different row every epoch, without it the
   last row of its range. At most ``K - 1`` rows of ``n_rows`` are left out per epoch in all.
3. **Order**: positions ``0 .. rows_per_epoch-1`` map to rows of the range through the plan's
   shuffle mode (:mod:`.shuffles`): a permutation of the whole range keyed by
   ``(seed, epoch, k)`` (``shuffle="full"``), the identity (``"none"``), or a chunk-aware block
   order (``"block"``).
4. **Batches**: step ``s`` takes positions ``[s * batch_size, (s + 1) * batch_size)``; the last batch
   is shorter unless ``drop_remainder``, which leaves out the last ``rows_per_epoch % batch_size``
   positions of the epoch (different rows each epoch when shuffling). Inside a batch, rows come in
   storage order: which rows form a batch is random, their order inside it is not (a loss, a
   batch norm or in-batch negatives do not depend on it), and sorted reads are sequential.

A plan resumed from another sharding (:meth:`Plan.resumed`) holds a :class:`~.elastic.Rest`:
its epoch ``rest.epoch`` is the rest of that epoch as the earlier workers left it, in the
plan's last steps (see :mod:`.elastic`); every other epoch is laid out as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import ConfigError
from ..._validate import integer
from .elastic import Rest, RestOrder, Segment, deal, epoch_steps
from .shard import Shard, shard_bounds
from .shuffles import BlockOrder, Shuffle, Span, block_layout, shuffle_mode

# block_layout: where the benchmarks have always imported it from.
__all__ = ["Plan", "block_layout", "check_position", "shard_bounds"]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The batches of every epoch for one worker. See the module docstring for the layout."""

    n_rows: int
    batch_size: int
    shard: Shard = Shard(1, 0)  # noqa: RUF009  (frozen, so sharing the default is safe)
    drop_remainder: bool = False
    #: The shuffle mode, or what ``shuffle=`` may name it by; kept as the mode's name.
    shuffle: Shuffle | bool | str = "full"
    seed: int = 0
    block_rows: int = 1
    window_blocks: int = 1
    #: The rest of an epoch begun by other workers, which this plan's last steps of that epoch
    #: take (:meth:`resumed`); None: every epoch is this plan's own.
    rest: Rest | None = None
    #: The shuffle mode itself (:mod:`.shuffles`), which the rest of the package asks.
    mode: Shuffle = field(init=False, repr=False, compare=False)
    #: What the mode needs to know of this plan.
    span: Span = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("batch_size", "block_rows", "window_blocks"):
            object.__setattr__(self, name, integer(getattr(self, name), name, low=1))
        object.__setattr__(self, "seed", integer(self.seed, "seed", low=0))
        if self.n_rows < 1:
            raise ConfigError(f"there must be at least one row (got {self.n_rows}).")
        mode = shuffle_mode(self.shuffle)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "shuffle", mode.name)
        start, stop = shard_bounds(self.n_rows, self.shard)
        shard, blocks = self.shard, (self.block_rows, self.window_blocks)
        span = Span(start, stop, self.seed, shard.index, shard.count, *blocks)
        object.__setattr__(self, "span", span)
        if self.rows_per_epoch == 0:
            raise ConfigError(
                f"there are more workers ({self.shard.count}) than rows ({self.n_rows}); "
                "use fewer workers or more data."
            )
        if self.steps == 0:
            raise ConfigError(
                f"`batch_size` ({self.batch_size}) is larger than shard {self.shard.index} of "
                f"{self.shard.count}, which has {self.rows_per_epoch} rows per epoch, and "
                "`drop_remainder=True` leaves no batch; lower `batch_size`, use fewer workers "
                "or set `drop_remainder=False`."
            )

    @property
    def bounds(self) -> tuple[int, int]:
        """``(start, stop)`` of the rows this worker reads: its contiguous row range, and the
        rows of the :attr:`rest` it takes, if any."""
        start, stop = shard_bounds(self.n_rows, self.shard)
        if self.rest is None:
            return start, stop
        lo, hi = self.rest.bounds
        return min(start, lo), max(stop, hi)

    @property
    def segment(self) -> Segment:
        """This plan's sharding, as a resumed plan's history records it (no steps taken)."""
        return Segment(
            workers=self.shard.count,
            batch_size=self.batch_size,
            drop_remainder=self.drop_remainder,
            block_rows=self.block_rows,
            window_blocks=self.window_blocks,
        )

    def resumed(self, epoch: int, segments: Sequence[Segment]) -> tuple[Plan, tuple[int, int]]:
        """This plan taking over ``epoch`` from ``segments`` (the first began it; each took
        ``steps`` batches): the plan whose epoch ``epoch`` is the rest they left (see
        :mod:`.elastic`), and the position ``(epoch, step)`` where that rest begins, or
        ``(epoch + 1, 0)`` when nothing is left for this sharding to take."""
        rest = deal(
            n_rows=self.n_rows,
            seed=self.seed,
            epoch=epoch,
            segments=segments,
            to=self.segment,
            index=self.shard.index,
        )
        if rest is None:
            return self._with_rest(None), (epoch + 1, 0)
        return self._with_rest(rest), (epoch, rest.first_step)

    def _with_rest(self, rest: Rest | None) -> Plan:
        """This plan with ``rest`` (checked by :func:`~.elastic.deal`; the rest of the plan was
        checked when it was made, so it is copied, not made again)."""
        plan = object.__new__(type(self))  # (copy.copy goes through __reduce_ex__: slower)
        plan.__dict__.update(self.__dict__, rest=rest)
        return plan

    def first_step(self, epoch: int) -> int:
        """The first step of ``epoch`` this worker takes: 0, or where the rest begins."""
        rest = self.rest
        return rest.first_step if rest is not None and rest.epoch == epoch else 0

    @property
    def window_rows(self) -> int:
        """Rows of one window of a ``"block"`` shuffle (its blocks, read together)."""
        return self.block_rows * self.window_blocks

    @property
    def rows_per_epoch(self) -> int:
        """Rows every worker uses per epoch (before `drop_remainder`)."""
        return self.n_rows // self.shard.count

    @property
    def steps(self) -> int:
        """Batches per epoch; the same on every worker."""
        return epoch_steps(self.rows_per_epoch, self.batch_size, self.drop_remainder)

    def batch_rows(self, step: int) -> int:
        """Number of rows in batch ``step``."""
        self._check_step(step)
        return min(self.batch_size, self.rows_per_epoch - step * self.batch_size)

    def index_count(self, start_step: int, stop_step: int) -> int:
        """Number of row indices of steps ``[start_step, stop_step)``: the length of
        :meth:`indices` (and of the ``out`` it takes)."""
        return min(stop_step * self.batch_size, self.rows_per_epoch) - start_step * self.batch_size

    def indices(
        self,
        epoch: int,
        start_step: int,
        stop_step: int | None = None,
        out: npt.NDArray[np.int64] | None = None,
    ) -> npt.NDArray[np.int64]:
        """Row indices of steps ``[start_step, stop_step)`` of ``epoch``, concatenated, as int64.

        ``out``: a C-contiguous int64 array of :meth:`index_count` elements to compute them in
        (returned); by default a new array. A reader that reuses one computes a group's indices
        without allocating (see :mod:`.permutation` for why that matters beside TensorFlow).
        """
        stop_step = start_step + 1 if stop_step is None else stop_step
        self._check_step(start_step)
        if not start_step < stop_step <= self.steps:
            raise ValueError(
                f"steps must satisfy {start_step} < stop_step <= {self.steps} (got {stop_step})."
            )
        count = self.index_count(start_step, stop_step)
        if out is None:
            rows = np.empty(count, dtype=np.int64)
        elif out.shape != (count,) or out.dtype != np.int64 or not out.flags.c_contiguous:
            raise ValueError(
                f"`out` must be a C-contiguous int64 array of shape ({count},) "
                f"(got {out.dtype} {out.shape})."
            )
        else:
            rows = out
        if self.rest is not None and epoch == self.rest.epoch:
            self.rest.fill(self.mode, start_step * self.batch_size, rows)
        else:
            self.mode.fill(self.span, epoch, start_step * self.batch_size, rows)
        if self.mode.random:
            # Storage order within each batch: the permutation decides which rows form a batch;
            # the order inside a batch carries no randomness a loss can use, and sorted reads are
            # sequential (docs/performance.md, "Rows sorted within a batch").
            full = (len(rows) // self.batch_size) * self.batch_size
            rows[:full].reshape(-1, self.batch_size).sort(axis=1)
            rows[full:].sort()
        return rows

    def block_order(self, epoch: int) -> BlockOrder | RestOrder:
        """The block order of ``epoch`` (``shuffle="block"``): where every block and row goes
        (the windows of the rest, in a resumed epoch)."""
        if self.rest is not None and epoch == self.rest.epoch:
            return self.rest.order()
        return BlockOrder(self.span, epoch)

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.steps:
            raise ValueError(f"`step` must be in [0, {self.steps}) (got {step}).")


def check_position(
    steps: int, epoch: Any, step: Any, names: tuple[str, str] = ("epoch", "step")
) -> tuple[int, int]:
    """Validate a position ``(epoch, step)`` in a stream of epochs of ``steps`` batches each."""
    epoch, step = (integer(v, n, low=0) for n, v in zip(names, (epoch, step), strict=True))
    if step >= steps:
        raise ConfigError(
            f"`{names[1]}` ({step}) must be less than the {steps} steps (batches) of an epoch on "
            f"this worker; to start after the last step of epoch {epoch}, use "
            f"`{names[0]}={epoch + 1}, {names[1]}=0`."
        )
    return epoch, step
