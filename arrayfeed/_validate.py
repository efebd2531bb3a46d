"""Argument checks shared by every public entry point, with one message style.

Every message reads "`name` must be <what> (got <value>)." followed by the fix when one is known.
Integers may be Python ``int`` or NumPy integers; ``bool`` is never taken for an integer, and
floats are refused even when whole (``2.0``), so a mistyped argument never silently rounds.

>>> integer(np.int64(3), "batch_size", low=1)
3
>>> integer(0, "batch_size", low=1)
Traceback (most recent call last):
...
arrayfeed._errors.ConfigError: `batch_size` must be a positive int (got 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import ConfigError

__all__ = ["flag", "integer", "optional_integer", "seed"]


def _fail(name: str, what: str, value: Any, fix: str | None) -> ConfigError:
    return ConfigError(f"`{name}` must be {what} (got {value!r})" + (f"; {fix}" if fix else "."))


def _bounds(low: int | None, high: int | None) -> str:
    if low == 1 and high is None:
        what = "a positive int"
    elif low == 0 and high is None:
        what = "a non-negative int"
    elif low is not None and high is not None:
        what = f"an int in [{low}, {high})"
    elif low is not None:
        what = f"an int of at least {low}"
    elif high is not None:
        what = f"an int below {high}"
    else:
        what = "an int"
    return what


def _is_int(value: Any, low: int | None, high: int | None) -> bool:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return False
    return bool((low is None or value >= low) and (high is None or value < high))


def integer(
    value: Any,
    name: str,
    *,
    low: int | None = None,
    high: int | None = None,
    fix: str | None = None,
) -> int:
    """``value`` as an ``int`` in ``[low, high)`` (either bound may be None), else
    :class:`ConfigError` naming ``name``."""
    if not _is_int(value, low, high):
        raise _fail(name, _bounds(low, high), value, fix)
    return int(value)


def optional_integer(
    value: Any,
    name: str,
    *,
    low: int | None = None,
    high: int | None = None,
    fix: str | None = None,
) -> int | None:
    """Like :func:`integer`, but None passes through."""
    if value is None:
        return None
    if not _is_int(value, low, high):
        raise _fail(name, _bounds(low, high) + " or None", value, fix)
    return int(value)


def seed(value: Any, name: str = "seed") -> int | None:
    """A seed: None (draw one) or a non-negative int."""
    return optional_integer(value, name, low=0)


def flag(value: Any, name: str, *, allow_none: bool = False) -> bool | None:
    """``True`` or ``False`` (NumPy booleans too), or None when ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise _fail(name, "True, False or None" if allow_none else "True or False", value, None)
