"""What a dataset's reading runs with, and why: :class:`Tuning`, as :mod:`.tuning` reports it."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DOING", "Tuning"]

#: What a tuner that has not settled is doing, by phase (the end of :attr:`Tuning.why`).
DOING = {
    "warm-up": "measuring the starting setting",
    "measure": "measuring the starting setting",
    "up": "trying more threads",
    "again": "measuring the best so far again",
    "down": "trying fewer threads",
    "processes": "trying more loader processes",
    "each": "trying more threads in each loader process",
}


@dataclass(frozen=True)
class Tuning:
    """What a dataset's reading runs with, and why (see :func:`arrayfeed.tuning`).

    Attributes:
        threads: Reader threads: groups read at once, in this process or in each loader (one
            more group is requested ahead), as ``num_threads`` would set them.
        tuned: Whether ``threads`` is tuned while reading (False: fixed by ``num_threads``).
        settled: Whether tuning has settled (always True when not tuned).
        rates: Rows per second delivered at each setting tried, the latest measurement of each
            (of the best when the climb ended, the larger of its last two: see :class:`Tuner`).
        why: How ``threads`` was chosen, in words.
        settled_after: Seconds of reading (from the first group delivered) until tuning last
            settled; None while it has not.
        processes: Loader processes reading (0: this process reads, in its reader threads).
        process_rates: Rows per second delivered with each number of loader processes tried,
            when more were tried (with ``threads`` in each, or fewer where the groups read ahead
            would not fit: see :class:`Tuner`).
    """

    threads: int
    tuned: bool
    settled: bool
    rates: dict[int, float] = field(default_factory=dict)
    why: str = ""
    settled_after: float | None = None
    processes: int = 0
    process_rates: dict[int, float] = field(default_factory=dict)

    def __str__(self) -> str:
        tried = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(self.rates.items()))
        line = f"threads {self.threads} ({self.why}); rows/s per setting: {tried or 'none yet'}"
        if self.processes > 1 or self.process_rates:
            counts = ", ".join(f"{k}: {v:,.0f}" for k, v in sorted(self.process_rates.items()))
            line += f"; loader processes {self.processes}" + (
                f" (rows/s: {counts})" if counts else ""
            )
        return line
