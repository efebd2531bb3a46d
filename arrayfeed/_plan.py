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
3. **Order**: positions ``0 .. rows_per_epoch-1`` map to rows of the range through a permutation of
   the whole range keyed by ``(seed, epoch, k)`` (or the identity when not shuffling).
4. **Batches**: step ``s`` takes positions ``[s * batch_size, (s + 1) * batch_size)``; the last batch
   is shorter unless ``drop_remainder``, which leaves out the last ``rows_per_epoch % batch_size``
   positions of the epoch (different rows each epoch when shuffling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from ._errors import ConfigError
from ._permutation import derive_key, permute
from ._shard import Shard

__all__ = ["Plan", "ShuffleMode", "shard_bounds"]

ShuffleMode = Literal["none", "full"]


def shard_bounds(n_rows: int, shard: Shard) -> tuple[int, int]:
    """``(start, stop)`` of shard ``shard.index`` when ``n_rows`` rows are split ``shard.count`` ways.

    >>> [shard_bounds(10, Shard(3, k)) for k in range(3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    return (n_rows * shard.index) // shard.count, (n_rows * (shard.index + 1)) // shard.count


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The batches of every epoch for one worker. See the module docstring for the layout."""

    n_rows: int
    batch_size: int
    shard: Shard = Shard(1, 0)  # noqa: RUF009  (frozen, so sharing the default is safe)
    drop_remainder: bool = False
    shuffle: ShuffleMode = "full"
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, (int, np.integer)):
            raise ConfigError(f"`batch_size` must be a positive int (got {self.batch_size!r}).")
        if self.batch_size < 1:
            raise ConfigError(f"`batch_size` must be a positive int (got {self.batch_size}).")
        if self.n_rows < 1:
            raise ConfigError(f"there must be at least one row (got {self.n_rows}).")
        if self.shuffle not in ("none", "full"):
            raise ConfigError(f"`shuffle` must be 'none' or 'full' (got {self.shuffle!r}).")
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
        """``(start, stop)`` of this worker's contiguous row range."""
        return shard_bounds(self.n_rows, self.shard)

    @property
    def rows_per_epoch(self) -> int:
        """Rows every worker uses per epoch (before `drop_remainder`)."""
        return self.n_rows // self.shard.count

    @property
    def steps(self) -> int:
        """Batches per epoch; the same on every worker."""
        full, rest = divmod(self.rows_per_epoch, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def batch_rows(self, step: int) -> int:
        """Number of rows in batch ``step``."""
        self._check_step(step)
        return min(self.batch_size, self.rows_per_epoch - step * self.batch_size)

    def indices(
        self, epoch: int, start_step: int, stop_step: int | None = None
    ) -> npt.NDArray[np.int64]:
        """Row indices of steps ``[start_step, stop_step)`` of ``epoch``, concatenated, as int64."""
        stop_step = start_step + 1 if stop_step is None else stop_step
        self._check_step(start_step)
        if not start_step < stop_step <= self.steps:
            raise ValueError(
                f"steps must satisfy {start_step} < stop_step <= {self.steps} (got {stop_step})."
            )
        first = start_step * self.batch_size
        last = min(stop_step * self.batch_size, self.rows_per_epoch)
        positions = np.arange(first, last, dtype=np.int64)
        start, stop = self.bounds
        if self.shuffle == "full":
            key = derive_key(self.seed, epoch, self.shard.index, self.shard.count)
            positions = permute(positions, stop - start, key)
        return positions + start

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.steps:
            raise ValueError(f"`step` must be in [0, {self.steps}) (got {step}).")
