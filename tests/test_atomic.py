"""Atomic publication: workspaces, rename into place, stale clean-up, deferred Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from arrayfeed._conversion import atomic as _atomic
from arrayfeed._conversion.atomic import (
    ASIDE,
    Workspace,
    clean_stale,
    deferred_interrupts,
    pid_alive,
    publish,
    remove_tree,
)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_workspace_is_hidden_beside_the_output(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "data.h5").create()
    assert ws.path.parent == tmp_path
    assert ws.path.name.startswith(".data.h5.arrayfeed-")
    assert f"-{os.getpid()}-" in ws.path.name
    (ws.member("out.h5")).write_bytes(b"x")
    ws.remove()
    assert list(tmp_path.iterdir()) == []


def test_workspace_name_stays_short(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / ("n" * 240 + ".h5")).create()
    assert len(ws.path.name) < 200
    ws.remove()


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_publish_new(tmp_path: Path, kind: str) -> None:
    src, dst = tmp_path / "ws" / "out", tmp_path / "final"
    src.parent.mkdir()
    if kind == "file":
        src.write_text("new")
    else:
        src.mkdir()
        (src / "zarr.json").write_text("new")
    publish(src, dst, overwrite=False)
    assert not src.exists()
    assert (dst.read_text() if kind == "file" else (dst / "zarr.json").read_text()) == "new"


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_publish_refuses_an_existing_output(tmp_path: Path, kind: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    if kind == "file":
        src.write_text("new")
        dst.write_text("old")
    else:
        src.mkdir()
        dst.mkdir()
        (dst / "keep").write_text("old")
    with pytest.raises(FileExistsError):
        publish(src, dst, overwrite=False)
    assert (dst.read_text() if kind == "file" else (dst / "keep").read_text()) == "old"


@pytest.mark.parametrize("exchange", [True, False])
def test_publish_replaces_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:  # the portable fallback: move the old one aside, then the new one in
        monkeypatch.setattr(_atomic, "_renameat2", lambda *a: False)
    ws = tmp_path / "ws"
    ws.mkdir()
    src, dst = ws / "out", tmp_path / "data.zarr"
    src.mkdir()
    (src / "zarr.json").write_text("new")
    dst.mkdir()
    (dst / "zarr.json").write_text("old")
    publish(src, dst, overwrite=True)
    assert (dst / "zarr.json").read_text() == "new"
    old = src if exchange else ws / ASIDE
    assert (old / "zarr.json").read_text() == "old"


def test_publish_replaces_a_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_text("new")
    dst.write_text("old")
    publish(src, dst, overwrite=True)
    assert dst.read_text() == "new" and not src.exists()


def test_clean_stale_removes_only_dead_workspaces_of_this_output(tmp_path: Path) -> None:
    out = tmp_path / "data.h5"
    host = _atomic._host()
    dead = tmp_path / f".data.h5.arrayfeed-{host}-{dead_pid()}-0123abcd"
    alive = tmp_path / f".data.h5.arrayfeed-{host}-{os.getpid()}-0123abcd"
    other_host = tmp_path / f".data.h5.arrayfeed-elsewhere{host}-{dead_pid()}-0123abcd"
    other_output = tmp_path / f".other.h5.arrayfeed-{host}-{dead_pid()}-0123abcd"
    for d in (dead, alive, other_host, other_output):
        d.mkdir()
        (d / "out.h5").write_text("partial")
    assert clean_stale(out) == [dead]
    assert not dead.exists() and alive.exists() and other_host.exists() and other_output.exists()


def test_clean_stale_gives_back_an_output_moved_aside(tmp_path: Path) -> None:
    out = tmp_path / "data.zarr"
    stale = tmp_path / f".data.zarr.arrayfeed-{_atomic._host()}-{dead_pid()}-0123abcd"
    (stale / ASIDE).mkdir(parents=True)
    (stale / ASIDE / "zarr.json").write_text("old")
    clean_stale(out)
    assert (out / "zarr.json").read_text() == "old" and not stale.exists()


def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(dead_pid())
    assert not pid_alive(0)


def test_remove_tree_handles_files_dirs_and_absence(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "f").write_text("x")
    remove_tree(tmp_path / "d", settle=0)
    remove_tree(tmp_path / "f", settle=0)
    remove_tree(tmp_path / "missing", settle=0)
    assert list(tmp_path.iterdir()) == []


def test_deferred_interrupts_wait_for_a_checkpoint() -> None:
    before = signal.getsignal(signal.SIGINT)
    reached = False
    with pytest.raises(KeyboardInterrupt), deferred_interrupts() as interrupts:
        os.kill(os.getpid(), signal.SIGINT)
        reached = True  # the signal did not interrupt here
        interrupts.checkpoint()
    assert reached
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_interrupt_stops_at_once() -> None:
    with pytest.raises(KeyboardInterrupt), deferred_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        pytest.fail("the second Ctrl-C should have raised")


def test_shielded_interrupts_are_held() -> None:
    with deferred_interrupts() as interrupts:
        interrupts.shield()
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        interrupts.checkpoint()
    assert interrupts.pending == signal.SIGINT


def test_custom_handlers_are_left_alone() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda s, f: seen.append(s))
    try:
        with deferred_interrupts() as interrupts:
            os.kill(os.getpid(), signal.SIGINT)
            interrupts.checkpoint()
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)
