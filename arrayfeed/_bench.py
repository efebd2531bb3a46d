"""Measure how fast arrayfeed reads the user's own arrays, and suggest what would be faster.

``bench(arrays)`` times one pass of ``batches`` over the arrays for each shuffle mode (capped
by a time budget), plus the storage's own ceiling for chunked arrays (every chunk-aligned slab read
once, in order), and turns the figures into advice: which ``shuffle`` mode to use, and the
``arrayfeed convert`` command to run when the layout itself is the bottleneck.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._dtypes import check_feedable
from ._errors import ConfigError
from ._pipeline.plan.shuffles import BLOCK, FULL, STORAGE_ORDER, shuffle_mode
from ._pipeline.tune.report import Tuning
from ._storage import (
    CacheReport,
    Source,
    array_keys,
    as_source,
    cache_report,
    cache_spec,
    chunked_rows,
    is_url,
    open_source,
    row_bytes,
    split_spec,
)

__all__ = ["BenchReport", "arrays_at", "bench"]


@dataclass(frozen=True, kw_only=True)
class BenchReport:
    """Rows per second for each way of reading, and what to do about it."""

    rows: int
    row_bytes: int
    batch_size: int
    #: Rows/s of ``batches`` per shuffle mode ("none", "full", "block").
    modes: dict[str, float]
    #: Rows/s of reading every chunk-aligned slab once, in order, with the storage library.
    ceiling: float | None
    chunk_rows: dict[str, int | None] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    #: How each mode's pass read: the groups read at once it chose, and the rows/s per setting.
    tuning: dict[str, Tuning] = field(default_factory=dict)
    #: What the cache of object storage (``cache=``) did while measuring; None without one.
    cache: CacheReport | None = None

    def format(self) -> str:
        """A small table and the advice, for the terminal."""
        lines = [
            f"{self.rows:,} rows of {self.row_bytes:,} bytes, batch {self.batch_size}",
            f"{'reading':34} {'rows/s':>12}",
        ]
        for mode, rate in self.modes.items():
            line = f"{'batches(shuffle=' + repr(mode) + ')':34} {rate:>12,.0f}"
            tuned = self.tuning.get(mode)
            if tuned is not None:
                line += f"  {_setting(tuned)}"
            lines.append(line)
        if self.ceiling is not None:
            lines.append(f"{'storage ceiling (slabs in order)':34} {self.ceiling:>12,.0f}")
        unsettled = [mode for mode, t in self.tuning.items() if not t.settled]
        if unsettled:
            lines.append(
                f"tuning had not settled in {', '.join(unsettled)}: those rows/s are of the "
                "settings shown, measured while tuning (a longer run settles: --seconds)"
            )
        if self.cache is not None:
            lines.append(str(self.cache))
        lines += [f"- {line}" for line in self.advice]
        return "\n".join(lines)


def _setting(tuned: Tuning) -> str:
    """``threads N [x P loaders], bound by B[, waiting for data W]``."""
    text = f"threads {tuned.threads}"
    if tuned.processes > 1:
        text += f" x {tuned.processes} loaders"
    if tuned.settled:
        text += f", bound by {tuned.bound.value}"
    if tuned.data_wait is not None:
        text += f", waiting for data {tuned.data_wait:.0%}"
    return text


def _timed_pass(
    x: dict[str, Source], batch_size: int, shuffle: bool | str, seconds: float
) -> tuple[float, Tuning]:
    from ._pipeline.api.batches import batches, tuning

    # NumPy batches, as a JAX or PyTorch loop takes them: no TensorFlow in the command line (the
    # same reading as from_arrays, less tf.data's hand-over of each batch).
    ds = batches(x, batch_size=batch_size, shuffle=shuffle, seed=0, shard=None)
    first_key = sorted(x)[0]
    it = iter(ds)
    next(it)  # start-up (iterator, threads, first read) is not throughput
    # Epoch after epoch, as `fit` reads them: one short epoch is not a steady state.
    epochs = itertools.chain(it, itertools.chain.from_iterable(itertools.repeat(ds)))
    rows, start = 0, time.perf_counter()
    for batch in epochs:
        rows += int(batch[first_key].shape[0])
        if time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return (rows / elapsed if elapsed > 0 and rows else 0.0), tuning(ds)


def _ceiling(sources: dict[str, Source], block_rows: int, n: int, seconds: float) -> float:
    rows, start = 0, time.perf_counter()
    for lo in range(0, n, block_rows):
        hi = min(lo + block_rows, n)
        for source in sources.values():
            source.read(np.arange(lo, hi, dtype=np.int64))
        rows += hi - lo
        if time.perf_counter() - start > seconds:
            break
    return rows / (time.perf_counter() - start)


def bench(
    arrays: Mapping[str, Any] | str | os.PathLike[str] | list[str],
    *,
    batch_size: int = 256,
    seconds: float = 3.0,
    modes: tuple[str, ...] = (FULL.name, BLOCK.name, STORAGE_ORDER.name),
    storage_options: Mapping[str, Any] | None = None,
    cache: str | os.PathLike[str] | bool | None = None,
    cache_limit: int | None = None,
) -> BenchReport:
    """Time :func:`arrayfeed.batches` over ``arrays`` (name -> array-like or path) for each
    shuffle mode (NumPy batches: no TensorFlow).

    ``arrays`` may also be one path or a list of them, read as ``arrayfeed bench`` reads its
    arguments (:func:`arrays_at`): ``"store.zarr:x"`` measures that array alone, a whole HDF5
    file or Zarr group every array in it.

    Each mode reads for ``seconds`` after its first batch, epoch after epoch as ``fit`` reads
    them (a short epoch alone would time its start-up, and give the tuner nothing to measure).
    Paths may be URLs, opened with ``storage_options`` and read through ``cache`` (see
    :func:`arrayfeed.open_array`): the report then says what the cache did.
    Returns a :class:`BenchReport` whose ``advice`` says which mode to use and whether
    converting the data (``arrayfeed convert``) would pay off.

    >>> import numpy as np
    >>> report = bench({"x": np.zeros((5000, 8), np.float32)}, seconds=0.2, modes=("full",))
    >>> report.rows, sorted(report.modes)
    (5000, ['full'])
    """
    kept = cache_spec(cache, cache_limit)
    if not isinstance(arrays, Mapping):
        specs = [arrays] if isinstance(arrays, (str, os.PathLike)) else arrays
        named = {os.fspath(s).partition("=")[2] or os.fspath(s) for s in specs}
        arrays = arrays_at(
            [os.fspath(s) for s in specs], storage_options=storage_options, cache=kept
        )
    else:
        named = {value for value in arrays.values() if isinstance(value, str)}
    sources = {
        name: as_source(value, name, storage_options=storage_options, cache=kept)
        for name, value in arrays.items()
    }
    before = cache_report(kept.directory, kept.limit) if kept else None
    for name, source in sources.items():
        check_feedable(source, name)
    n = min(len(s) for s in sources.values())
    if n < batch_size:
        raise ConfigError(
            f"too few rows for one batch: the arrays have {n} rows and `batch_size` is "
            f"{batch_size}; measure more data or a smaller batch (--batch-size)."
        )
    bytes_per_row = row_bytes(sources.values())
    # Keyed by each mode's name; a mode is parsed just before its pass, as batches would.
    passes = {
        shuffle_mode(mode).name: _timed_pass(sources, batch_size, mode, seconds) for mode in modes
    }
    rates = {mode: rate for mode, (rate, _) in passes.items()}
    chunked = {name: rows for name, s in sources.items() if (rows := chunked_rows(s))}
    ceiling = None
    if chunked:
        ceiling = _ceiling(sources, max(chunked.values()), n, seconds)
    report = BenchReport(
        rows=n,
        row_bytes=bytes_per_row,
        batch_size=batch_size,
        modes=rates,
        ceiling=ceiling,
        chunk_rows={name: getattr(s, "chunk_rows", None) for name, s in sources.items()},
        tuning={mode: tuned for mode, (_, tuned) in passes.items()},
        cache=cache_report(kept.directory, kept.limit).since(before) if kept and before else None,
    )
    report.advice.extend(_advise(report, sources))
    if kept is None and any(map(is_url, named)):
        report.advice.append(
            "the arrays are on object storage: every epoch fetches again what a process does not "
            f"hold in memory (up to {n * bytes_per_row / 2**20:,.0f} MiB a pass), and every "
            "process and restarted job all of it; --cache DIR (cache=DIR) keeps them on local "
            "disk, checked on every read, and later epochs read them there."
        )
    return report


def _advise(report: BenchReport, sources: dict[str, Source]) -> list[str]:
    advice = []
    full, block = report.modes.get(FULL.name), report.modes.get(BLOCK.name)
    if full and block and block > 1.5 * full:
        advice.append(
            f"shuffle='block' reads {block / full:.1f}x faster than a full shuffle here: use it "
            "(rows are shuffled within windows of chunks; see README, 'Block shuffle')."
        )
    elif full and block and full > 1.5 * block:
        advice.append(
            f"a full shuffle (shuffle=True) reads {full / block:.1f}x faster than 'block' here: "
            "keep it."
        )
    elif full and block:
        advice.append("a full shuffle (shuffle=True) is about as fast as 'block' here: keep it.")
    splits = [name for name, s in sources.items() if chunked_rows(s) and _splits_rows(s)]
    slow = (
        report.ceiling is not None and max(report.modes.values(), default=0) < 0.5 * report.ceiling
    )
    if splits or slow:
        reason = (
            f"chunks of {', '.join(splits)} split rows across several chunks"
            if splits
            else "reading is far below the storage's own slab speed"
        )
        names = " ".join(f"{name}=PATH" for name in sorted(sources))
        advice.append(
            f"{reason}; rewriting the data with whole-row chunks sized for batch reads should be "
            f"faster: arrayfeed convert {names} -o converted.h5 --compression lzf"
        )
    return advice


def _splits_rows(source: Any) -> bool:
    """True when a chunk holds only part of each row (chunking along a non-batch axis)."""
    chunks: tuple[int, ...] | None = getattr(source, "chunks", None)
    return chunks is not None and tuple(chunks[1:]) != tuple(source.shape[1:])


def arrays_at(
    specs: list[str], *, storage_options: Mapping[str, Any] | None = None, cache: Any = None
) -> dict[str, Source]:
    """The arrays named on a command line: ``NAME=PATH[:KEY]``, ``PATH:KEY`` (named KEY), a
    ``.npy`` file (named after the file), or a whole HDF5 file / Zarr group (every array in it,
    named by its path inside). A path that exists as written (a file named with a ``:``) is
    taken whole.

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> np.save(path, np.zeros((4, 2)))
    >>> sorted(arrays_at([path, f"labels={path}"]))
    ['labels', 'x']
    """
    arrays: dict[str, Source] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        if not sep:
            name, rest = "", spec
        path, key = (rest, None) if os.path.lexists(rest) else split_spec(rest)  # as open_array
        keys = array_keys(path, storage_options, cache) if key is None else None
        if keys is None:
            found = {name or key or _stem(path): open_source(path, key, storage_options, cache)}
        else:
            found = {k: open_source(path, k, storage_options, cache) for k in keys}
        if name and len(found) != 1:
            raise ConfigError(
                f"'{spec}' names {len(found)} arrays; give one with NAME=PATH:KEY or drop NAME."
            )
        for array_name, source in found.items():
            if array_name in arrays:
                raise ConfigError(
                    f"two arrays are called '{array_name}'; name them apart with NAME=PATH."
                )
            arrays[array_name] = source
    if not arrays:
        raise ConfigError("no arrays to measure; give at least one PATH[:KEY].")
    return arrays


def _stem(path: str) -> str:
    return Path(path.rstrip("/")).stem
