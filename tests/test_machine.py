"""What the process may use of the machine: cores and memory within a container's quotas
(cgroup v2 and v1, written as Docker, Kubernetes and Slurm write them), and what follows from
them: the tuned read-ahead and whether a loader process starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline import machine
from arrayfeed._pipeline.feed import READ_AHEAD_BYTES, tuned_read_ahead

GIB = 1 << 30


def affinity() -> int:
    return len(os.sched_getaffinity(0))


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def tree(root: Path, files: dict[str, str], listing: str) -> tuple[Path, Path]:
    """A cgroup mount at ``root/sys`` holding ``files``, and ``/proc/self/cgroup`` saying
    ``listing``."""
    for name, text in files.items():
        path = root / "sys" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    (root / "sys").mkdir(exist_ok=True)
    (root / "cgroup").write_text(listing)
    return root / "sys", root / "cgroup"


def test_a_container_with_its_own_cgroup_v2_namespace(tmp_path: Path) -> None:
    """Docker on cgroup v2 (`--cpus=1.5 --memory=2g`): the listing says `/`, the limits are at
    the mount's root. 1.5 cores round up to 2."""
    files = {
        "cgroup.controllers": "cpu memory",
        "cpu.max": "150000 100000",
        "memory.max": "2147483648",
    }
    where = tree(tmp_path, files, "0::/\n")
    assert machine.usable_cores(*where) == min(affinity(), 2)
    assert machine.usable_memory(*where) == min(machine_memory(), 2 * GIB)


def test_limits_set_above_the_process_cgroup_bind_too(tmp_path: Path) -> None:
    """Slurm on cgroup v2, no namespace: the job's cgroup holds the memory limit, the step's
    cgroup (the process's own) none; the least of the quotas on the way up binds."""
    job = "system.slice/slurmstepd.scope/job_7"
    files = {
        "cgroup.controllers": "cpu memory",
        f"{job}/memory.max": str(3 * GIB),
        f"{job}/cpu.max": "400000 100000",
        f"{job}/step_0/memory.max": "max",
        f"{job}/step_0/cpu.max": "max 100000",
        f"{job}/step_0/user/task_0/cgroup.procs": "",
        "system.slice/cpu.max": "100000 100000",  # the slice above the job: one core
    }
    where = tree(tmp_path, files, f"0::/{job}/step_0/user/task_0\n")
    assert machine.usable_memory(*where) == min(machine_memory(), 3 * GIB)
    assert machine.usable_cores(*where) == 1  # the slice above the job allows one core


def test_a_cgroup_v1_container(tmp_path: Path) -> None:
    """Docker on cgroup v1: the listing names the container's path, which is not under the
    mounts (each mount's root is the container's own cgroup)."""
    files = {
        "memory/memory.limit_in_bytes": str(GIB),
        "cpu/cpu.cfs_quota_us": "50000",
        "cpu/cpu.cfs_period_us": "100000",
    }
    listing = "12:memory:/docker/4f1c\n4:cpu,cpuacct:/docker/4f1c\n0::/\n"
    where = tree(tmp_path, files, listing)
    assert machine.usable_cores(*where) == 1  # half a core: one
    assert machine.usable_memory(*where) == min(machine_memory(), GIB)


@pytest.mark.parametrize(
    "files",
    [
        {},  # no cgroups (macOS, or not mounted)
        {
            "memory/memory.limit_in_bytes": "9223372036854771712",
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
        },  # v1 without limits (what it says then)
        {"cgroup.controllers": "", "cpu.max": "max 100000", "memory.max": "max"},  # v2, none
        {"cpu.max": "garbage", "memory.max": "", "cpu/cpu.cfs_quota_us": "x"},  # unreadable
    ],
    ids=["none", "v1-unlimited", "v2-unlimited", "unreadable"],
)
def test_no_quota_leaves_the_machine(tmp_path: Path, files: dict[str, str]) -> None:
    where = tree(tmp_path, files, "12:memory:/\n4:cpu,cpuacct:/\n0::/\n")
    assert machine.usable_cores(*where) == affinity()
    assert machine.usable_memory(*where) == machine_memory()


def test_a_missing_listing_leaves_the_machine(tmp_path: Path) -> None:
    assert machine.usable_cores(tmp_path, tmp_path / "none") == affinity()
    assert machine.usable_memory(tmp_path, tmp_path / "none") == machine_memory()


def test_in_a_small_container_reading_ahead_and_loaders_follow_its_quotas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a container allowed one core and 1 GiB of a machine with more, tuning reads ahead at
    most a sixteenth of 1 GiB (READ_AHEAD_BYTES, the floor, is more), and files are read in
    this process: a loader process would share the one core with the training loop."""
    files = {
        "cgroup.controllers": "cpu memory",
        "cpu.max": "100000 100000",
        "memory.max": str(GIB),
    }
    root, listing = tree(tmp_path, files, "0::/\n")
    monkeypatch.setattr(machine, "CGROUP_ROOT", root)
    monkeypatch.setattr(machine, "SELF_CGROUP", listing)
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda _: set(range(64)))
    assert machine.usable_cores() == 1
    assert tuned_read_ahead() == READ_AHEAD_BYTES  # (64 MiB x 64 cores outside the container)
    np.save(tmp_path / "x.npy", np.zeros((1000, 4), np.float32))
    b = af.batches(str(tmp_path / "x.npy"), batch_size=100)
    assert b._feed._remote is None  # read here
    assert b.tuning.threads == 1


def _cgroup_v1_writable() -> bool:
    return all(os.access(machine.CGROUP_ROOT / c, os.W_OK) for c in ("cpu", "memory"))


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _cgroup_v1_writable(),
    reason="needs a writable cgroup v1 hierarchy (root on a Linux host with cgroup v1); the "
    "tests above read the same files written as cgroup v1 and v2 write them",
)
def test_a_process_in_a_real_cgroup_sees_its_quotas() -> None:
    """A child process moved into a real cgroup with a quota of 1.5 cores and 768 MiB."""
    name = f"arrayfeed-test-{os.getpid()}"
    made = []
    try:
        for controller, settings in (
            ("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "150000"}),
            ("memory", {"memory.limit_in_bytes": str(768 << 20)}),
        ):
            group = machine.CGROUP_ROOT / controller / name
            group.mkdir()
            made.append(group)
            for key, value in settings.items():
                (group / key).write_text(value)
        procs = " ".join(f"echo $$ > {g}/cgroup.procs &&" for g in made)
        code = (
            "import json; from arrayfeed._pipeline import machine; "
            "print(json.dumps([machine.usable_cores(), machine.usable_memory()]))"
        )
        out = subprocess.run(
            ["sh", "-c", f'{procs} exec "$0" -c "$1"', sys.executable, code],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        cores, memory = json.loads(out)
        assert cores == min(affinity(), 2)
        assert memory == min(machine_memory(), 768 << 20)
    finally:
        for group in reversed(made):
            group.rmdir()
