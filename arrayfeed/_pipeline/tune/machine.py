"""What this process may use of the machine: cores and memory, within a container's quotas.

A container or a batch job often gets a share of a larger machine: Docker's ``--cpus`` and
``--memory``, a Kubernetes pod's limits and Slurm's job limits are cgroup quotas, which neither
``os.cpu_count`` nor the CPU affinity nor ``sysconf`` sees. Reading as if the whole machine
were free would read ahead a sixteenth of the host's memory in a pod allowed a fraction of it
(killed for memory), and start a loader process beside a training loop allowed one core. The
quotas are read here for both: cgroup v2 (``cpu.max``, ``memory.max``) and v1
(``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, ``memory.limit_in_bytes``), in the process's
own cgroup and each one above it (a Slurm job's limits are set on the job's cgroup, above its
steps), the least of them binding. Each controller's cgroup is found as the JDK's container
support and Go's automaxprocs find it: its path in ``/proc/self/cgroup``, under the mount of
that hierarchy in ``/proc/self/mountinfo`` (whose root field maps a container's own cgroup to
its mount point). Hand-written rather than taken from a library: loky (joblib's process pool)
reads only the CPU quota, at fixed paths, and psutil reads neither. Anything unreadable leaves
the machine's figure.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from pathlib import Path

__all__ = ["MOUNTINFO", "SELF_CGROUP", "process_cpu_seconds", "usable_cores", "usable_memory"]

#: Where the process's cgroups are listed, and its mounts (the cgroup hierarchies among them).
SELF_CGROUP = Path("/proc/self/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")

_ESCAPED = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as \040


def usable_cores(listing: Path | None = None, mountinfo: Path | None = None) -> int:
    """Cores this process may run on: its CPU affinity (a Slurm task or a container may get
    fewer than the machine has), within the CPU quota of its cgroups rounded up; at least 1.
    ``listing`` and ``mountinfo``: read instead of :data:`SELF_CGROUP` and :data:`MOUNTINFO`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cores = os.cpu_count() or 1
    quota = _cpu_quota(listing or SELF_CGROUP, mountinfo or MOUNTINFO)
    return max(1, cores if quota is None else min(cores, math.ceil(quota)))


def usable_memory(listing: Path | None = None, mountinfo: Path | None = None) -> int | None:
    """Bytes of memory this process may use: the machine's, within the memory limit of its
    cgroups; None where the machine's cannot be asked. ``listing``, ``mountinfo``: as above."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf on this platform
        return None
    dirs = _cgroups(listing or SELF_CGROUP, mountinfo or MOUNTINFO, "", "memory")
    limits = [_read_int(d / "memory.max") for d in dirs[""]]
    limits += [_read_int(d / "memory.limit_in_bytes") for d in dirs["memory"]]
    return min([memory] + [v for v in limits if v is not None and v > 0])


def _cpu_quota(listing: Path, mountinfo: Path) -> float | None:
    """Cores the CPU quota of the process's cgroups allows (the least), or None without one."""
    dirs = _cgroups(listing, mountinfo, "", "cpu")
    quotas = []
    for d in dirs[""]:
        fields = _read(d / "cpu.max").split()
        if len(fields) == 2 and fields[0] != "max":
            quotas.append(_ratio(fields[0], fields[1]))
    for d in dirs["cpu"]:
        quotas.append(_ratio(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")))
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _cgroups(listing: Path, mountinfo: Path, *controllers: str) -> dict[str, list[Path]]:
    """For each of ``controllers`` (``""``: cgroup v2), the directories of the process's cgroup
    and of each cgroup above it within the hierarchy's mount, nearest first; none if anything is
    unreadable. A cgroup path outside the mount's root (a container that sees only its own
    cgroup, mounted at the root, without a namespace of its own) is taken at the mount's root."""
    found: dict[str, list[Path]] = {c: [] for c in controllers}
    try:
        own = _own_cgroups(listing.read_text())
        mounts = _cgroup_mounts(mountinfo.read_text())
        for controller in controllers:
            if controller in own:
                found[controller] = _within(own[controller], mounts, controller)
    except (OSError, ValueError):  # unreadable, or paths that do not fit: the machine's figure
        return {c: [] for c in controllers}
    return found


def _within(path: str, mounts: list[tuple[str, str, str, set[str]]], controller: str) -> list[Path]:
    """The directories of cgroup ``path`` of ``controller`` and those above it, in its mount."""
    for root, point, fstype, options in mounts:
        if fstype != ("cgroup" if controller else "cgroup2"):
            continue
        if controller and controller not in options:
            continue
        inside = posixpath.relpath(path, root)
        top = Path(point)
        here = top if inside.startswith("..") else top / inside
        found = [here, *here.parents]
        return [d for d in found[: found.index(top) + 1] if d.is_dir()]
    return []


def _own_cgroups(text: str) -> dict[str, str]:
    """``/proc/self/cgroup``: the process's cgroup path per controller (``""``: cgroup v2)."""
    own = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                own[name] = parts[2]
    return own


def _cgroup_mounts(text: str) -> list[tuple[str, str, str, set[str]]]:
    """``/proc/self/mountinfo``'s cgroup mounts: (root, mount point, type, super options)."""
    mounts = []
    for line in text.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or not tail[0].startswith("cgroup"):
            continue
        root, point = (_ESCAPED.sub(lambda m: chr(int(m.group(1), 8)), f) for f in fields[3:5])
        mounts.append((root, point, tail[0], set(tail[2].split(","))))
    return mounts


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _read_int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text.isdigit() else None  # ("max": no limit)


def _ratio(quota: str, period: str) -> float | None:
    """``quota / period``: cores a CFS quota allows; None for no quota (-1) or unreadable."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) the process ``pid`` has used, from ``/proc/PID/stat``; 0.0
    when it cannot be read (the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command: state (field 3), ..., utime (14) and stime (15), in clock ticks.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
