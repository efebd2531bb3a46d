"""Where a feed is read: in loader processes, or in this process's reader threads.

By default (``processes=None``) a feed is read by one loader process (more while more pay,
tuned while reading: :mod:`..tuning`) when that can give the same stream and pays: every leaf can be read from another process (files and URLs are opened again
there; small in-memory arrays travel with the feed), the batches are dense, and this process may
run on at least two cores (on one, a loader only takes turns with the training loop). Otherwise,
when every leaf is an array in memory (gathered here about as fast as anywhere), and when the
feed cannot be pickled for a loader (a ``map_batch`` holding a lock), its reader threads read
here. ``processes=N`` asks for N loaders (and is refused, naming the
leaf, when one cannot be read there); ``processes=0`` reads here. Loaders also run ``map_batch``,
so ``processes=N`` is the way to map with a ``map_batch`` that holds the GIL.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

from ..._errors import ConfigError
from ..._storage import Source, portability
from ..._validate import optional_integer
from ..tune.machine import usable_cores

__all__ = ["CARRIED_BYTES", "loader_processes"]

#: Most bytes of in-memory arrays (labels beside files, say) a default loader is given a copy of.
CARRIED_BYTES = 64 << 20


def loader_processes(
    processes: Any,
    *,
    sources: Sequence[Source],
    names: Sequence[str],
    sparse: bool,
) -> tuple[int, bool]:
    """The loader processes of a feed (0: its reader threads read in this process), from the
    ``processes`` argument, checked, and the feed's leaves; and whether they were asked for
    (else a feed that cannot be sent to a loader is read here)."""
    asked = optional_integer(processes, "processes", low=0)
    if asked is not None:
        if asked:
            _check_can_load(asked, sources, names, sparse)
        return asked, True
    if sparse or usable_cores() < 2 or not _platform_supported():
        return 0, False
    moves = [portability(s) for s in sources]
    if any(m.how == "stays" for m in moves) or not any(m.how == "reopen" for m in moves):
        return 0, False  # arrays all in memory are read fast here; what cannot move stays
    return (1 if sum(m.nbytes for m in moves) <= CARRIED_BYTES else 0), False


def _platform_supported() -> bool:
    return os.name == "posix" and hasattr(socket, "AF_UNIX")


def _check_can_load(
    count: int, sources: Sequence[Source], names: Sequence[str], sparse: bool
) -> None:
    what = f"`processes={count}` reads in loader processes"
    if not _platform_supported():
        raise ConfigError(
            f"{what}, which need Linux or macOS (this is {os.name}); pass `processes=0`."
        )
    if sparse:
        raise ConfigError(
            f"{what}, but `sparse=True` batches are built in this process; pass `processes=0` "
            "(or leave `processes` out)."
        )
    for name, source in zip(names, sources, strict=True):
        move = portability(source)
        if move.how == "stays":
            raise ConfigError(
                f"{what}, but `{name}` cannot be read from another process: {move.why}. Pass it "
                "as a path (or open its file read-only), or pass `processes=0` to read it in "
                "this process."
            )
