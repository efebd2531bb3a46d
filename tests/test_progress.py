"""The progress bar: drawn on a terminal, silent elsewhere."""

from __future__ import annotations

import io

from arrayfeed._conversion.progress import Progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_draws_on_a_terminal() -> None:
    stream = FakeTerminal()
    with Progress(4 << 20, label="writing", stream=stream, interval=0) as bar:
        bar.update(1 << 20)
        bar.update(3 << 20)
    text = stream.getvalue()
    assert "\rwriting  25% [######" in text
    assert "100%" in text and "4.0 MiB/4.0 MiB" in text
    assert text.endswith("\n")


def test_silent_when_not_a_terminal_or_disabled() -> None:
    for stream, enabled in ((io.StringIO(), None), (FakeTerminal(), False)):
        with Progress(100, label="writing", stream=stream, enabled=enabled, interval=0) as bar:
            bar.update(100)
        assert stream.getvalue() == ""


def test_forced_on_and_throttled() -> None:
    stream = io.StringIO()
    with Progress(100, label="verifying", stream=stream, enabled=True, interval=3600) as bar:
        for _ in range(100):
            bar.update(1)
    assert stream.getvalue().count("\r") == 2  # the first update, then the final state


def test_doctests() -> None:
    import doctest

    from arrayfeed._conversion import progress as _progress

    assert doctest.testmod(_progress, optionflags=doctest.ELLIPSIS).failed == 0
