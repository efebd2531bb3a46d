"""What a dataset's reading runs with, and which bound decided it: :class:`Tuning`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Bound", "Tuning"]


class Bound(enum.Enum):
    """What decided a setting (``docs/explanation/tuning.md``, "The formulas")."""

    FIXED = "fixed"  # num_threads (and processes) fixed it
    MEASURING = "measuring"  # not settled yet
    CONSUMER = "consumer"  # the consumer's own rate: as many in flight as it takes
    LATENCY = "latency"  # the storage's rate: as many in flight as reach it
    CORES = "cores"  # the cores there are, less the consumer's
    MEMORY = "memory"  # the groups the read-ahead memory holds
    INTERPRETER = "interpreter"  # reads queue in each loader, and no more loaders may help


@dataclass(frozen=True)
class Tuning:
    """What a dataset's reading runs with, and the numbers that decided it (see
    :func:`arrayfeed.tuning`): ``in_flight = ceil(rate / group_rows * latency * 1.1)`` (bound
    by ``latency``: the fewest in flight measured within 10 % of ``rate``), and the groups read
    at once (``threads`` in each of ``processes`` loaders) are the least of it and ``budget``
    (but where loaders were tried: see :attr:`bound`).

    Attributes:
        threads: Groups read at once in this process or in each loader (one more is requested).
        tuned: Whether it is tuned while reading (False: ``num_threads`` fixed it).
        settled: Whether tuning has settled (always True when not tuned).
        processes: Loader processes reading (0: this process's reader threads).
        bound: What decided the setting.
        rate: Rows/s of the decision: the consumer's own rate, else what the reads delivered.
        latency: Seconds a group held a reader, with the fewest groups in flight measured.
        group_rows: Rows per group (a group is read at once).
        wait_share: The consumer's share of time spent waiting, in the window decided on.
        in_flight: Groups in flight Little's law gives for ``rate`` and ``latency`` (bound by
            ``latency``: the fewest measured that came within 10 % of ``rate``).
        budget: The most groups in flight the cores (less the consumer's) and memory allow.
        cores: Cores this process may use.
        reader_cores, consumer_cores, interpreter_cores: Cores the readers, the consumer (this
            process less its readers) and the busiest interpreter that reads used.
        noise: The standard deviation of a window's log rate at one setting (0.1 until windows
            of one setting were measured twice; formula 3 measures again a gain within it of
            paying).
        data_wait: The consumer's share of the last whole pass (epoch) spent waiting for data
            (MLPerf Storage's accelerator utilisation is one minus it); None before a pass ended.
        rates, process_rates: Rows/s measured at each number of groups in flight, and of
            loaders, tried (the latest of each).
        settled_after: Seconds of reading until tuning last settled; None while it has not.
    """

    threads: int
    tuned: bool
    settled: bool
    processes: int = 0
    bound: Bound = Bound.FIXED
    rate: float = 0.0
    latency: float = 0.0
    group_rows: int = 0
    wait_share: float = 0.0
    in_flight: int = 0
    budget: int = 0
    cores: float = 0.0
    reader_cores: float = 0.0
    consumer_cores: float = 0.0
    interpreter_cores: float = 0.0
    noise: float = 0.0
    data_wait: float | None = None
    rates: dict[int, float] = field(default_factory=dict)
    process_rates: dict[int, float] = field(default_factory=dict)
    settled_after: float | None = None

    def __str__(self) -> str:
        loaders = (
            f" x {self.processes} loader process{'es' * (self.processes > 1)}"
            if self.processes
            else ""
        )
        line = f"threads {self.threads}{loaders}: "
        if self.bound is Bound.FIXED:
            line += "fixed"
        elif self.bound is Bound.MEASURING:
            line += "measuring (tuning has not settled yet)"
        else:
            line += (
                f"bound by {self.bound.value}: {self.rate:,.0f} rows/s x {self.latency * 1e3:.1f}"
                f" ms a group of {self.group_rows} rows -> {self.in_flight} in flight"
                f" (budget {self.budget}; readers {self.reader_cores:.1f},"
                f" consumer {self.consumer_cores:.1f} of {self.cores:g} cores)"
            )
        if self.data_wait is not None:
            line += f"; waiting for data {self.data_wait:.0%} of the last epoch"
        return line
