"""Simulated machines and storages, to drive the tuner's model through the windows it would
measure on them (tests/test_tune_model.py).

A :class:`Storage` says what one group costs: seconds its read waits without the CPU (object
storage), CPU seconds that release the interpreter's lock (decoding, gathering) and that hold
it (a ``map_batch`` looping in Python), the most groups per second the storage (or memory
bandwidth) delivers, and the consumer's seconds per group and the share of those on the CPU.
:func:`supply` is what a setting delivers, the least of what each resource allows:

- the reads in flight: ``in flight / latency`` (Little's law, a read alone taking
  ``wait + cpu + gil``, plus ``in flight / capacity`` in a storage that queues its reads);
- the storage: ``bandwidth`` (memory bandwidth: its threads stall on the cores, which their
  CPU time shows);
- the cores: ``cores / (cpu + gil + the consumer's CPU per group)``;
- each interpreter: ``lock / gil`` per loader (reading in the training process: one interpreter
  shared with the consumer's CPU), where ``lock`` is the share of a core its lock is held
  when it binds: 1 where one thread holds it for long, less where many threads and an event
  loop hand it over many times a millisecond (each hand-off leaves it idle a moment);
- a small cost for reads in flight beyond what the rate needs (hand-offs between threads), so
  that more threads than needed deliver a little less, as on real machines (5 % at twice as
  many).

:func:`window` is what the tuner measures of a setting over one window, with multiplicative
noise, and the consumer taking at most ``1 / consumer`` groups per second; ``timed`` of a read's
time shows in its latency (a source that computes part of a group outside its timed read).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from arrayfeed._pipeline.tune.model import Limits, Model
from arrayfeed._pipeline.tune.windows import Window

__all__ = ["Storage", "best", "delivered", "run", "supply", "window"]

#: Share of the rate lost per time as many reads in flight beyond those the rate needs.
CROWDING = 0.05


@dataclass(frozen=True)
class Storage:
    wait: float = 0.0
    cpu: float = 0.001
    gil: float = 0.0
    bandwidth: float = math.inf
    consumer: float = 0.0
    consumer_cpu: float = 1.0
    cores: int = 2
    seconds: float = 0.5  # of a window
    timed: float = 1.0  # share of a read's time its latency shows (a dask graph: less)
    lock: float = 1.0  # share of a core an interpreter's lock is busy when it binds
    capacity: float = math.inf  # groups/s a storage that queues its reads serves

    @property
    def latency(self) -> float:
        return self.wait + self.cpu + self.gil

    def queued(self, in_flight: int) -> float:
        """A read's latency with ``in_flight`` reads: a storage that queues them (a disk array,
        a service under load) adds ``in_flight / capacity`` to a read alone's, so its rate
        ``in_flight / latency`` nears ``capacity`` gradually, each doubling gaining less."""
        return self.latency + in_flight / self.capacity


def supply(s: Storage, threads: int, processes: int) -> float:
    """Groups per second a setting delivers (see the module docstring), the consumer aside."""
    loaders = max(1, processes)
    in_flight = threads * loaders
    consumer_cpu = s.consumer * s.consumer_cpu
    reads = in_flight / s.queued(in_flight)
    limits = [reads, s.bandwidth, s.cores / (s.cpu + s.gil + consumer_cpu)]
    if s.gil:
        limits.append(s.lock * (loaders / s.gil if processes else 1 / (s.gil + consumer_cpu)))
    rate = min(limits)
    needed = max(1.0, rate * s.queued(in_flight))
    return rate * max(0.5, 1 - CROWDING * max(0.0, in_flight / needed - 1))


def delivered(s: Storage, threads: int, processes: int) -> float:
    """Groups per second the consumer takes at a setting."""
    rate = supply(s, threads, processes)
    return min(rate, 1 / s.consumer) if s.consumer else rate


def best(s: Storage, processes: bool = True, memory: int = 256) -> float:
    """The most any setting delivers (threads 1-64 each, loaders 1 to one per core, groups in
    flight and requested ahead within ``memory``)."""
    counts = range(1, s.cores + 1) if processes else [0]
    settings = [(t, p) for t in range(1, 65) for p in counts if (t + 1) * max(1, p) <= memory]
    return max(delivered(s, t, p) for t, p in settings)


def window(
    s: Storage, threads: int, processes: int, rng: random.Random, noise: float, tail: float = 0.0
) -> Window:
    """What the tuner measures of one window at a setting; ``tail``: the share of windows whose
    noise is 4 x ``noise`` (a shared machine's windows dip or leap now and then)."""
    loaders = max(1, processes)
    if tail and rng.random() < tail:
        noise *= 4
    rate = supply(s, threads, processes)
    reads_bind = not s.consumer or rate < 1 / s.consumer
    taken = (rate if reads_bind else 1 / s.consumer) * math.exp(rng.gauss(0, noise))
    waited = max(0.0, 1 - taken * s.consumer) * s.seconds
    in_flight = threads * loaders
    # Reads all busy when they set the pace (Little's law); as a read alone when they do not.
    latency = max(s.latency, in_flight / rate) if reads_bind else s.latency
    latency *= s.timed * math.exp(rng.gauss(0, noise))
    groups = max(1, round(taken * s.seconds))
    seconds = groups / taken
    reader_cpu = groups * (s.cpu + s.gil)
    if rate >= s.bandwidth * 0.999:  # memory bandwidth: threads stall on the cores
        reader_cpu = max(reader_cpu, min(in_flight, s.cores) * seconds)
    consumer_cpu = groups * s.consumer * s.consumer_cpu
    interpreter_cpu = reader_cpu / loaders if processes else reader_cpu + consumer_cpu
    return Window(
        threads=threads,
        processes=processes,
        seconds=seconds,
        groups=groups,
        rows=groups * 256,
        waited=min(waited, seconds),
        latency=latency,
        reader_cpu=reader_cpu,
        interpreter_cpu=interpreter_cpu,
        consumer_cpu=consumer_cpu,
    )


def run(
    s: Storage,
    *,
    processes: int = 1,
    windows: int = 40,
    noise: float = 0.0,
    seed: int = 0,
    memory: int = 256,
    model: Model | None = None,
    tail: float = 0.0,
) -> tuple[Model, list[tuple[int, int]]]:
    """A model driven through ``windows`` windows of ``s``: it, and the settings it measured."""
    rng = random.Random(seed)
    if model is None:
        limits = Limits(
            cores=s.cores, memory=memory, threads=64, processes=s.cores if processes else 0
        )
        model = Model(1, processes, limits)
    settings = []
    for _ in range(windows):
        settings.append((model.threads, model.processes))
        model.observe(window(s, model.threads, model.processes, rng, noise, tail))
    return model, settings
