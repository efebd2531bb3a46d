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
from arrayfeed._pipeline.read.feed import READ_AHEAD_BYTES, tuned_read_ahead
from arrayfeed._pipeline.tune import machine

GIB = 1 << 30


def affinity() -> int:
    return len(os.sched_getaffinity(0))


@pytest.fixture(autouse=True)
def many_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 cores in the affinity, so that every quota below allows fewer (on 2 cores a quota of
    2 or 3 would look like none)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(64)))


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def tree(
    tmp: Path, files: dict[str, str], listing: str, mounts: list[tuple[str, str, str]]
) -> tuple[Path, Path]:
    """Cgroup hierarchies mounted under ``tmp/sys`` holding ``files``; ``/proc/self/cgroup``
    saying ``listing``; ``/proc/self/mountinfo`` listing ``mounts`` (root, mount point under
    ``tmp/sys``, type and super options) among others, as Linux writes it."""
    for name, text in files.items():
        path = tmp / "sys" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    lines = [
        "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/root rw",
        f"31 22 0:28 / {tmp}/sys rw,nosuid shared:9 - tmpfs tmpfs rw,mode=755",
    ]
    for i, (root, point, kind) in enumerate(mounts):
        (tmp / "sys" / point).mkdir(parents=True, exist_ok=True)
        fstype, options = kind.split(" ", 1) if " " in kind else (kind, "rw")
        lines.append(
            f"{40 + i} 31 0:{40 + i} {root} {tmp}/sys/{point}".rstrip("/")
            + f" rw,nosuid,nodev,noexec shared:{10 + i} - {fstype} {fstype} {options}"
        )
    (tmp / "cgroup").write_text(listing)
    (tmp / "mountinfo").write_text("\n".join(lines) + "\n")
    return tmp / "cgroup", tmp / "mountinfo"


V2 = [("/", "", "cgroup2 rw,nsdelegate")]
V1 = [
    ("/", "cpu,cpuacct", "cgroup rw,cpu,cpuacct"),  # (no "cpu" link beside it)
    ("/", "memory", "cgroup rw,memory"),
]


def test_a_container_with_its_own_cgroup_v2_namespace(tmp_path: Path) -> None:
    """Docker on cgroup v2 (`--cpus=1.5 --memory=2g`): the listing says `/`, the limits are at
    the mount's root. 1.5 cores round up to 2."""
    files = {"cpu.max": "150000 100000", "memory.max": "2147483648"}
    where = tree(tmp_path, files, "0::/\n", V2)
    assert machine.usable_cores(*where) == 2
    assert machine.usable_memory(*where) == min(machine_memory(), 2 * GIB)


def test_limits_set_above_the_process_cgroup_bind_too(tmp_path: Path) -> None:
    """Slurm on cgroup v2, no namespace: the job's cgroup holds the memory limit, the step's
    cgroup (the process's own) none; the least of the quotas on the way up binds."""
    job = "system.slice/slurmstepd.scope/job_7"
    files = {
        f"{job}/memory.max": str(3 * GIB),
        f"{job}/cpu.max": "400000 100000",
        f"{job}/step_0/memory.max": "max",
        f"{job}/step_0/cpu.max": "max 100000",
        f"{job}/step_0/user/task_0/cgroup.procs": "",
        "system.slice/cpu.max": "100000 100000",  # the slice above the job: one core
        "other.slice/memory.max": "1",  # another branch: not this process's
    }
    where = tree(tmp_path, files, f"0::/{job}/step_0/user/task_0\n", V2)
    assert machine.usable_memory(*where) == min(machine_memory(), 3 * GIB)
    assert machine.usable_cores(*where) == 1


def test_a_cgroup_v1_container(tmp_path: Path) -> None:
    """Docker on cgroup v1: the listing names the container's cgroup, which mountinfo says is
    each mount's root; the CPU controller mounted as `cpu,cpuacct` only."""
    files = {
        "memory/memory.limit_in_bytes": str(GIB),
        "cpu,cpuacct/cpu.cfs_quota_us": "50000",
        "cpu,cpuacct/cpu.cfs_period_us": "100000",
    }
    listing = "12:memory:/docker/4f1c\n4:cpu,cpuacct:/docker/4f1c\n1:name=systemd:/docker/4f1c\n"
    mounts = [("/docker/4f1c", point, kind) for _, point, kind in V1]
    where = tree(tmp_path, files, listing, mounts)
    assert machine.usable_cores(*where) == 1  # half a core: one
    assert machine.usable_memory(*where) == min(machine_memory(), GIB)


def test_a_cgroup_v1_job_without_a_namespace(tmp_path: Path) -> None:
    """cgroup v1, mounts at the hierarchy's root, the process in a nested cgroup (as a batch
    system places a job's processes): the limits of its own cgroup and those above it."""
    files = {
        "memory/jobs/memory.limit_in_bytes": str(2 * GIB),
        "memory/jobs/42/memory.limit_in_bytes": "9223372036854771712",  # none of its own
        "cpu,cpuacct/jobs/42/cpu.cfs_quota_us": "300000",
        "cpu,cpuacct/jobs/42/cpu.cfs_period_us": "100000",
    }
    listing = "12:memory:/jobs/42\n4:cpu,cpuacct:/jobs/42\n0::/\n"
    where = tree(tmp_path, files, listing, V1)
    assert machine.usable_cores(*where) == 3
    assert machine.usable_memory(*where) == min(machine_memory(), 2 * GIB)


def test_a_mount_point_with_a_space_in_its_name(tmp_path: Path) -> None:
    """mountinfo writes a space in a path as `\\040` (and a backslash as `\\134`)."""
    listing, mountinfo = tree(tmp_path / "a b", {"cpu.max": "200000 100000"}, "0::/\n", V2)
    text = mountinfo.read_text()
    assert f"{tmp_path}/a b/sys " in text
    mountinfo.write_text(text.replace(f"{tmp_path}/a b/", f"{tmp_path}/a\\040b/"))
    assert machine.usable_cores(listing, mountinfo) == 2


@pytest.mark.parametrize(
    ("files", "mounts"),
    [
        ({}, []),  # no cgroups (macOS, or not mounted)
        (
            {
                "memory/memory.limit_in_bytes": "9223372036854771712",
                "cpu,cpuacct/cpu.cfs_quota_us": "-1",
                "cpu,cpuacct/cpu.cfs_period_us": "100000",
            },
            V1,
        ),  # v1 without limits (what it says then)
        ({"cpu.max": "max 100000", "memory.max": "max"}, V2),  # v2, none
        ({"cpu.max": "garbage", "memory.max": ""}, V2),  # unreadable v2
        ({"cpu,cpuacct/cpu.cfs_quota_us": "x", "memory/memory.limit_in_bytes": "-"}, V1),
    ],
    ids=["none", "v1-unlimited", "v2-unlimited", "v2-unreadable", "v1-unreadable"],
)
def test_no_quota_leaves_the_machine(
    tmp_path: Path, files: dict[str, str], mounts: list[tuple[str, str, str]]
) -> None:
    where = tree(tmp_path, files, "12:memory:/\n4:cpu,cpuacct:/\n0::/\n", mounts)
    assert machine.usable_cores(*where) == affinity()
    assert machine.usable_memory(*where) == machine_memory()


def test_missing_or_forbidden_files_leave_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No listing or mountinfo (another system), or a sandbox that refuses to show the cgroup
    files (`PermissionError` on stat, as gVisor or SELinux may): the machine's figures, no
    error (a dataset is built on them)."""
    assert machine.usable_cores(tmp_path / "none", tmp_path / "none") == affinity()
    assert machine.usable_memory(tmp_path / "none", tmp_path / "none") == machine_memory()
    where = tree(tmp_path, {"cpu.max": "100000 100000"}, "0::/\n", V2)
    assert machine.usable_cores(*where) == 1

    def refused(self: Path, *args: object, **kwargs: object) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_dir", refused)
    assert machine.usable_cores(*where) == affinity()
    assert machine.usable_memory(*where) == machine_memory()


def test_in_a_small_container_reading_ahead_and_loaders_follow_its_quotas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a container allowed one core and 1 GiB of a machine with more, tuning reads ahead at
    most a sixteenth of 1 GiB (READ_AHEAD_BYTES, the floor, is more), and files are read in
    this process: a loader process would share the one core with the training loop."""
    files = {"cpu.max": "100000 100000", "memory.max": str(GIB)}
    listing, mountinfo = tree(tmp_path, files, "0::/\n", V2)
    monkeypatch.setattr(machine, "SELF_CGROUP", listing)
    monkeypatch.setattr(machine, "MOUNTINFO", mountinfo)
    assert machine.usable_cores() == 1
    assert tuned_read_ahead() == READ_AHEAD_BYTES  # (64 MiB x 64 cores outside the container)
    np.save(tmp_path / "x.npy", np.zeros((1000, 4), np.float32))
    b = af.batches(str(tmp_path / "x.npy"), batch_size=100)
    assert b._feed._remote is None  # read here
    assert b.tuning.threads == 1


CGROUP_V1 = Path("/sys/fs/cgroup")


def _cgroup_v1_writable() -> bool:
    return all(os.access(CGROUP_V1 / c / "cgroup.procs", os.W_OK) for c in ("cpu", "memory"))


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _cgroup_v1_writable(),
    reason="needs a writable cgroup v1 hierarchy (root on a Linux host with cgroup v1); the "
    "tests above read the same files written as cgroup v1 and v2 write them",
)
def test_a_process_in_a_real_cgroup_sees_its_quotas() -> None:
    """A child process moved into a real cgroup with a quota of half a core and 768 MiB."""
    name = f"arrayfeed-test-{os.getpid()}"
    made = []
    try:
        for controller, settings in (
            ("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"}),
            ("memory", {"memory.limit_in_bytes": str(768 << 20)}),
        ):
            group = CGROUP_V1 / controller / name
            group.mkdir()
            made.append(group)
            for key, value in settings.items():
                (group / key).write_text(value)
        procs = " ".join(f"echo $$ > {g}/cgroup.procs &&" for g in made)
        code = (
            "import json; from arrayfeed._pipeline.tune import machine; "
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
        assert cores == 1
        assert memory == min(machine_memory(), 768 << 20)
    finally:
        for group in reversed(made):
            group.rmdir()
