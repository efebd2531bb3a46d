"""Which part of the data this input worker reads."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import ConfigError

__all__ = ["Shard"]


@dataclass(frozen=True)
class Shard:
    """Input worker ``index`` of ``count``: it reads the ``index``-th contiguous range of rows.

    >>> Shard(4, 1)
    Shard(count=4, index=1)
    """

    count: int
    index: int

    def __post_init__(self) -> None:
        for field in ("count", "index"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"`Shard.{field}` must be an int (got {value!r}).")
        if self.count < 1:
            raise ConfigError(f"`Shard.count` must be at least 1 (got {self.count}).")
        if not 0 <= self.index < self.count:
            raise ConfigError(
                f"`Shard.index` must be in [0, {self.count}) for {self.count} workers (got {self.index})."
            )
