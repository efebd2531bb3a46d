"""CSR entries in pure NumPy (no I/O): ragged ranges, the spans a batch reads, dense rows.

:func:`ragged_arange` expands ranges of ``data``/``indices`` into positions, :func:`plan_spans`
merges nearby ranges into one storage read, and :func:`scatter` puts a batch's entries into dense
rows (summing repeated entries, as ``scipy.sparse`` does; :func:`repeats` says whether there are
any); :func:`canonical` turns entries into a canonical CSR batch.
"""

from __future__ import annotations

import numpy as np

from ..base import Indices

__all__ = ["canonical", "plan_spans", "ragged_arange", "repeats", "scatter"]


def ragged_arange(starts: Indices, lengths: Indices) -> Indices:
    """The concatenation of ``arange(s, s + n)`` for every ``(s, n)``, as ``int64``.

    >>> ragged_arange(np.array([5, 0, 9]), np.array([2, 0, 3])).tolist()
    [5, 6, 9, 10, 11]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.asarray(starts, dtype=np.int64) - (ends - lengths)
    return np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)


def plan_spans(starts: Indices, stops: Indices, gap: int) -> tuple[Indices, Indices]:
    """Spans that cover increasing, non-overlapping ranges ``[starts[i], stops[i])``: ranges at
    most ``gap`` elements apart share a span; empty ranges need none. Pure (no I/O).

    >>> a, b = plan_spans(np.array([0, 10, 12, 100]), np.array([4, 12, 15, 101]), gap=5)
    >>> list(zip(a.tolist(), b.tolist()))
    [(0, 4), (10, 15), (100, 101)]
    """
    keep = stops > starts
    s, e = starts[keep], stops[keep]
    if not len(s):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    breaks = np.flatnonzero(s[1:] - e[:-1] > gap) + 1
    first = np.concatenate(([0], breaks))
    last = np.concatenate((breaks - 1, [len(s) - 1]))
    return s[first].astype(np.int64), e[last].astype(np.int64)


def repeats(rows: Indices, cols: Indices, n_cols: int) -> bool:
    """Whether an entry ``(row, col)`` occurs more than once (never in canonical CSR).

    >>> repeats(np.array([0, 0, 1]), np.array([3, 1, 1]), 4), repeats(np.array([0, 0]), np.array([1, 1]), 4)
    (False, True)
    """
    keys = rows * n_cols + cols
    if len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1])):
        return False  # sorted within rows, as CSR writers store it: no repeats
    return len(np.unique(keys)) < len(keys)


def scatter(
    out: np.ndarray, rows: Indices, cols: Indices, values: np.ndarray, summed: bool = False
) -> None:
    """Zero ``out`` (2-D) and put ``values`` at ``(rows, cols)``; ``summed``: some entries repeat
    (see :func:`repeats`), and are summed, as ``scipy.sparse`` does.

    >>> out = np.full((2, 3), 7.0)
    >>> scatter(out, np.array([0, 1, 1]), np.array([2, 0, 0]), np.array([1.0, 2.0, 3.0]), True)
    >>> out.tolist()
    [[0.0, 0.0, 1.0], [5.0, 0.0, 0.0]]
    """
    out[...] = 0
    if summed:
        np.add.at(out, (rows, cols), values)
    elif len(values) and out.flags.c_contiguous:
        out.reshape(-1)[rows * out.shape[1] + cols] = values  # one flat index: cheaper than 2-D
    elif len(values):
        out[rows, cols] = values


def canonical(
    rows: Indices, cols: Indices, values: np.ndarray, n_rows: int, n_cols: int
) -> tuple[Indices, Indices, np.ndarray]:
    """``(indptr, cols, values)`` of the entries ``(rows, cols, values)``, sorted by row then
    column, repeated entries summed."""
    keys = rows * n_cols + cols
    if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        first = np.concatenate(([True], keys[1:] != keys[:-1]))
        starts = np.flatnonzero(first)
        if len(starts) < len(keys):
            values = np.add.reduceat(values, starts).astype(values.dtype, copy=False)
        keys = keys[starts]
        rows, cols = keys // n_cols, keys % n_cols
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return indptr, cols.astype(np.int64, copy=False), values
