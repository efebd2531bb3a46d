"""A one-line progress bar for long conversions: drawn on a terminal, silent anywhere else."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from .layout import format_bytes

__all__ = ["Progress"]

_WIDTH = 24


class Progress:
    """Progress of ``total`` bytes through one phase (``label``), redrawn every ``interval`` s.

    ``enabled=None`` draws only when ``stream`` (default ``sys.stderr``) is a terminal.

    >>> import io
    >>> with Progress(100, label="writing", stream=io.StringIO()) as bar:  # not a terminal: silent
    ...     bar.update(100)
    """

    def __init__(
        self,
        total: int,
        *,
        label: str,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        interval: float = 0.1,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.total = max(0, int(total))
        self.label = label
        self.interval = interval
        self.done = 0
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self._width = 0

    def update(self, n: int) -> None:
        """Count ``n`` more bytes done."""
        self.done += int(n)
        now = time.monotonic()
        if self.enabled and now - self._last_draw >= self.interval:
            self._draw(now)

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, now: float) -> None:
        self._last_draw = now
        fraction = min(1.0, self.done / self.total) if self.total else 1.0
        filled = round(fraction * _WIDTH)
        elapsed = max(now - self._start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 and self.done < self.total else 0.0
        line = (
            f"{self.label} {fraction:4.0%} [{'#' * filled}{'.' * (_WIDTH - filled)}] "
            f"{format_bytes(self.done)}/{format_bytes(self.total)} "
            f"{format_bytes(rate)}/s ETA {eta:.0f}s"
        )
        pad = max(0, self._width - len(line))
        self._width = len(line)
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
