"""States to checkpoint: where a job is in its stream, and what resuming it needs.

No TensorFlow. A *state* is a small JSON-serialisable dict, the same on every worker: the
position of the next batch (``epoch``, ``step``), the sharding the job ran on (``workers``,
``batch_size``, ``drop_remainder``, the block layout), what identifies its data (``rows``,
``seed``, ``shuffle``, a digest of the arrays' names, row shapes and dtypes), and, when the
job itself resumed in the middle of this epoch on another sharding, the ``history`` of the
shardings that took part of it (:class:`~..plan.elastic.Segment`: one entry per restart, never
per row). :func:`resume_plan` turns a state back into a plan and a start position
(:mod:`..plan.elastic` deals the rest of the epoch over the new workers); :func:`encode` writes
one (for :func:`arrayfeed.state` and :meth:`arrayfeed.Batches.state`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from ..._errors import ConfigError, ResumeError
from ..._storage import Source
from ..plan.elastic import Segment, first_step
from ..plan.plan import Plan, check_position
from ..read.feed import Feed
from ..read.structure import Treedef

__all__ = ["FORMAT", "encode", "leaves_digest", "resume_plan", "state_seed"]

#: The version of the state's layout this arrayfeed writes and reads.
FORMAT = 1
#: What identifies the data: a state of other data is refused, naming each that differs.
_IDENTITY = ("rows", "seed", "shuffle", "leaves")
_SEGMENT = ("workers", "batch_size", "drop_remainder", "block_rows", "window_blocks")
_FIX = (
    "resume with the data, `seed` and `shuffle` the state was saved with, or start afresh "
    "without `resume`."
)


def leaves_digest(treedef: Treedef, sources: Sequence[Source]) -> str:
    """A short digest of the element's structure and each leaf's row shape and dtype."""
    leaves = [
        [name, list(s.shape[1:]), s.dtype.str]
        for name, s in zip(treedef.leaf_paths(""), sources, strict=True)
    ]
    # (repr: lists of str and int print alike everywhere; blake2b: no OpenSSL lookup per call.)
    return hashlib.blake2b(repr(leaves).encode(), digest_size=8).hexdigest()


def encode(feed: Feed, epoch: int, step: int) -> dict[str, Any]:
    """The state of ``feed`` at ``(epoch, step)`` (``step`` may be the epoch's steps: its end)."""
    plan = feed.plan
    if step == plan.steps:
        epoch, step = epoch + 1, 0
    epoch, step = check_position(plan.steps, epoch, step)
    rest = plan.rest
    history: list[dict[str, Any]] = []
    if rest is not None and rest.epoch == epoch:
        if step < rest.first_step:
            raise ConfigError(
                f"`step` ({step}) is before step {rest.first_step}, where this worker's part of "
                f"epoch {epoch} begins (the workers before the resume took the steps before it)."
            )
        history = [asdict(s) for s in rest.segments]
    segment = plan.segment
    return {
        "format": FORMAT,
        "epoch": epoch,
        "step": step,
        "rows": plan.n_rows,
        "seed": plan.seed,
        "shuffle": plan.mode.name,
        "leaves": leaves_digest(feed.in_treedef, feed.sources),
        **{name: getattr(segment, name) for name in _SEGMENT},
        "history": history,
    }


def _field(state: Mapping[str, Any], name: str, kind: type) -> Any:
    if type(state) is not dict and not isinstance(state, Mapping):  # (a dict: no ABC check)
        raise ResumeError(
            f"`resume` must be a state (a dict) saved by `Batches.state()` or "
            f"`arrayfeed.state()` (got {type(state).__name__})."
        )
    value = state.get(name)
    if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        raise ResumeError(
            f"`resume` is not a state of arrayfeed: {name!r} is {value!r}, not "
            f"{getattr(kind, '__name__', kind)}; pass what `Batches.state()` or "
            "`arrayfeed.state()` returned (after a JSON round trip too)."
        )
    return value


def _segment(entry: Mapping[str, Any], steps: int | None = None) -> Segment:
    """A sharding of the state (``steps``: taken, else the entry's own ``"steps"``)."""
    return Segment(
        workers=_field(entry, "workers", int),
        batch_size=_field(entry, "batch_size", int),
        drop_remainder=_field(entry, "drop_remainder", bool),
        steps=_field(entry, "steps", int) if steps is None else steps,
        block_rows=_field(entry, "block_rows", int),
        window_blocks=_field(entry, "window_blocks", int),
    )


def resume_plan(state: Mapping[str, Any], plan: Plan, leaves: str) -> tuple[Plan, tuple[int, int]]:
    """``plan`` resuming from ``state``, and the position its first iteration starts at.

    ``leaves``: the :func:`leaves_digest` of the data ``plan`` is for. Raises
    :class:`~arrayfeed.ResumeError` for a state of other data, of a newer format, or that is
    no state.
    """
    version = _field(state, "format", int)
    if version > FORMAT:
        raise ResumeError(
            f"`resume` is a state of format {version}, written by a newer arrayfeed; this one "
            f"reads format {FORMAT} and older. Upgrade arrayfeed where the job resumes."
        )
    ours = {"rows": plan.n_rows, "seed": plan.seed, "shuffle": plan.mode.name, "leaves": leaves}
    kinds: dict[str, type] = {"rows": int, "seed": int, "shuffle": str, "leaves": str}
    theirs = {name: _field(state, name, kinds[name]) for name in _IDENTITY}
    differ = [name for name in _IDENTITY if theirs[name] != ours[name]]
    if differ:
        said = "; ".join(f"{n} {theirs[n]!r} in the state, {ours[n]!r} here" for n in differ)
        if "leaves" in differ:
            said += " (the arrays' names, row shapes or dtypes differ)"
        raise ResumeError(f"`resume` is the state of other data: {said}; {_FIX}")
    epoch, step = _field(state, "epoch", int), _field(state, "step", int)
    history = [_segment(entry) for entry in _field(state, "history", list)]
    saved = _segment(state, 0)
    try:
        if epoch < 0 or step < 0:
            raise ValueError(f"its position ({epoch}, {step}) is negative")
        if not history:
            if step == 0:
                return plan, (epoch, 0)
            return plan.resumed(epoch, [_with_steps(saved, step)])
        begins = first_step(plan.n_rows, history, saved)
        if not begins <= step:
            raise ValueError(f"its step {step} is before the first of its part, {begins}")
        if _sharding(saved) == _sharding(plan.segment):  # the saved job's own rest, went on
            resumed, start = plan.resumed(epoch, history)
            return resumed, (epoch, step) if start[0] == epoch else start
        return plan.resumed(epoch, [*history, _with_steps(saved, step - begins)])
    except ValueError as exc:  # a history no job can have made
        raise ResumeError(f"`resume` is not a state a job could have saved: {exc}") from None


def state_seed(state: Any) -> int:
    """The seed of ``state`` (for ``resume=`` with ``seed=None``)."""
    return int(_field(state, "seed", int))


def _with_steps(segment: Segment, steps: int) -> Segment:
    return replace(segment, steps=steps)


def _sharding(segment: Segment) -> tuple[int, int, bool]:
    return segment.workers, segment.batch_size, segment.drop_remainder
