"""From the public arguments to a :class:`Feed`: every check of the entry points.

No TensorFlow here. :func:`arrayfeed.from_arrays` (the tf.data glue) and :func:`arrayfeed.batches`
(NumPy batches for JAX, PyTorch or a plain loop) take the same arguments, defined once with their
defaults in :class:`~.options.FeedArgs`, and both call :func:`build_feed`, so they refuse the same
mistakes with the same messages and produce the same stream. A ``tf.distribute.InputContext`` is
recognised by the glue (that needs TensorFlow) and arrives here as the :class:`Shard` it names.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ..._dtypes import check_feedable
from ..._errors import ConfigError, ShapeError, StructureError
from ..._storage import Source, as_source, cache_spec, chunked_rows, is_array_like, row_bytes
from ..._validate import flag, integer
from ..loader.client import RemoteFeed
from ..loader.policy import loader_processes
from ..plan.plan import Plan, check_position
from ..plan.shard import Shard
from ..plan.shuffles import shuffle_mode
from ..read.feed import Feed
from ..read.sparse import SparseFeed, check_sparse
from ..read.structure import Treedef, flatten
from .options import FeedArgs
from .state import leaves_digest, resume_plan, state_seed

__all__ = ["Built", "ShardSpec", "build_feed", "check_map_batch", "resolve_shard", "sources_of"]

#: What ``shard`` may be once the glue has turned an ``InputContext`` into a :class:`Shard`.
ShardSpec: TypeAlias = "Shard | Literal['auto'] | None"

#: The kinds of ``shard`` named in the error for anything else (the glue adds InputContext).
SHARD_KINDS = "'auto', None or arrayfeed.Shard(count, index)"


@dataclass(frozen=True)
class Built:
    """What :func:`build_feed` returns: the feed, positioned at the start, and how it shards."""

    feed: Feed
    #: arrayfeed (not tf.data) does the sharding: the glue turns tf.data's auto-sharding off.
    sharded_by_us: bool
    #: ``(start_epoch, start_step)``, validated, or where ``resume`` starts; the feed's first
    #: epoch starts there.
    start: tuple[int, int]
    #: The start is where a state given as ``resume`` resumes.
    resumed: bool = False


def build_feed(
    args: FeedArgs, *, caller: str = "from_arrays", shard_kinds: str = SHARD_KINDS
) -> Built:
    """Check the arguments of an entry point (see :class:`~.options.FeedArgs`) and build its feed.

    ``caller`` is the entry point's name, as messages cite it; ``shard_kinds`` lists the kinds of
    ``shard`` it accepts, for the message refusing any other. Checks run in a fixed order (the
    structure and arrays, ``shard``, ``shuffle``, the plan's arguments, ``num_threads``,
    ``map_batch``, ``sparse``, ``processes``, the start position, ``resume``, the seed needed to
    resume), so a call with several mistakes reports the same one whichever entry point it went
    through.
    """
    x, y, seed, map_batch = args.x, args.y, args.seed, args.map_batch
    cache = cache_spec(args.cache, args.cache_limit)
    treedef, sources, names = sources_of(
        x, y, args.sample_weight, caller=caller, storage_options=args.storage_options, cache=cache
    )
    resolved, ours = resolve_shard(args.shard, shard_kinds)
    mode = shuffle_mode(args.shuffle)
    chunks = [rows for rows in map(chunked_rows, sources) if rows]
    block_rows, window_blocks = mode.layout(chunks, row_bytes(sources))
    if seed is None and args.resume is not None:
        seed = state_seed(args.resume)  # a saved job's drawn seed resumes too
    plan = Plan(
        n_rows=len(sources[0]),
        batch_size=args.batch_size,
        shard=resolved,
        drop_remainder=bool(flag(args.drop_remainder, "drop_remainder")),
        shuffle=mode,
        seed=int.from_bytes(os.urandom(8), "little") if seed is None else seed,
        block_rows=block_rows,
        window_blocks=window_blocks,
    )
    threads = args.num_threads
    if threads is not None:
        threads = integer(threads, "num_threads", low=1)
    if map_batch is not None:
        check_map_batch(map_batch, y is not None)
    sparse_out = check_sparse(args.sparse, sources, map_batch, caller)
    processes, required = loader_processes(
        args.processes, sources=sources, names=names, sparse=sparse_out
    )
    start = check_position(
        plan.steps, args.start_epoch, args.start_step, ("start_epoch", "start_step")
    )
    if args.resume is not None:
        if (args.start_epoch, args.start_step) != (0, 0):
            raise ConfigError(
                "`resume` and `start_epoch` / `start_step` both say where to start; give the "
                "state as `resume` alone."
            )
        plan, start = resume_plan(args.resume, plan, leaves_digest(treedef, sources))
    if seed is None and mode.random and start != (0, 0):
        raise ConfigError(
            f"resuming at `start_epoch={start[0]}, start_step={start[1]}` needs the seed of the "
            "run being resumed, but `seed` is None (a new random seed, so a different stream); "
            "pass the `seed` used before (and use a fixed seed from the first run on)."
        )
    feed = (SparseFeed if sparse_out else Feed)(
        sources,
        treedef,
        plan,
        map_batch=map_batch,
        num_threads=threads,
        processes=processes,
        loader_required=required,
        open_loaders=RemoteFeed,
    )
    feed.seed_drawn = seed is None
    feed.seek(*start)
    return Built(feed, ours, start, resumed=args.resume is not None)


def sources_of(
    x: Any,
    y: Any,
    sample_weight: Any,
    *,
    caller: str = "from_arrays",
    storage_options: Any = None,
    cache: Any = None,
) -> tuple[Treedef, list[Source], list[str]]:
    """The element's structure, one checked :class:`Source` per leaf, all of one length, and
    the leaves' names as messages cite them (``x['image']``, ``y``)."""
    if x is None:
        raise StructureError("`x` is None; give at least one array as `x`.")
    if sample_weight is not None and y is None:
        raise StructureError("`sample_weight` needs `y`; pass targets as `y` too.")
    if y is None:
        element, root = x, "x"
    elif sample_weight is None:
        element, root = (x, y), "(x, y)"
    else:
        element, root = (x, y, sample_weight), "(x, y, sample_weight)"
    leaves, treedef = flatten(element, is_array_like, root)
    if treedef.kind == "leaf":
        names = ["x"]
    else:
        names = treedef.leaf_paths("")
        if y is not None:  # "[0]['image']" reads better as "x['image']"
            roots = ("x", "y", "sample_weight")
            names = [roots[int(n[1])] + n[3:] for n in names]
        else:
            names = ["x" + n for n in names]
    sources = []
    for name, leaf in zip(names, leaves, strict=True):
        source = as_source(leaf, name, storage_options=storage_options, cache=cache)
        check_feedable(source, name)
        sources.append(source)
    lengths = {len(s) for s in sources}
    if len(lengths) > 1:
        listing = ", ".join(f"{n}: {len(s)}" for n, s in zip(names, sources, strict=True))
        raise ShapeError(
            f"all arrays must have the same number of rows (axis 0), got {listing}; "
            f"trim or align them before calling {caller}."
        )
    return treedef, sources, names


def check_map_batch(map_batch: Any, has_y: bool) -> None:
    """Refuse what cannot be a ``map_batch``: not callable, or needing more than one argument
    (the ``Dataset.map(lambda x, y: ...)`` habit; ``map_batch`` receives the element whole)."""
    if not callable(map_batch):
        raise ConfigError(f"`map_batch` must be callable (got {type(map_batch).__name__}).")
    try:
        parameters = inspect.signature(map_batch).parameters.values()
    except (TypeError, ValueError):  # a builtin or extension without a signature: try it
        return
    required = [
        p
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        element = "the tuple `(x, y)` (or `(x, y, sample_weight)`)" if has_y else "`x`"
        names = ", ".join(p.name for p in required)
        raise ConfigError(
            f"`map_batch` takes {len(required)} arguments ({names}), but it is called with one: "
            f"the whole batch, {element}, in the element's structure. Take one argument and "
            "unpack it, e.g. `map_batch=lambda batch: (f(batch[0]), batch[1])`."
        )


_LOG = logging.getLogger("arrayfeed")
_LOGGED: set[Shard] = set()  # shards found by "auto" and logged


def resolve_shard(shard: Any, kinds: str = SHARD_KINDS) -> tuple[Shard, bool]:
    """The shard this worker reads, and whether arrayfeed (not tf.data) does the sharding.

    >>> resolve_shard(None), resolve_shard(Shard(4, 1))
    ((Shard(count=1, index=0), False), (Shard(count=4, index=1), True))
    """
    if shard is None:
        return Shard(1, 0), False
    if isinstance(shard, str) and shard == "auto":
        found = Shard.from_env()
        if found.source is not None and found not in _LOGGED:
            _LOGGED.add(found)  # (once: every dataset of a worker finds the same)
            _LOG.info(
                "shard='auto': this process reads worker %d of %d's rows, from %s",
                found.index,
                found.count,
                found.source,
            )
        return found, True
    if isinstance(shard, Shard):
        return shard, True
    raise ConfigError(f"`shard` must be {kinds} (got {shard!r}).")
