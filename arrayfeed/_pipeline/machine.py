"""What this process may use of the machine: cores and memory, within a container's quotas.

A container or a batch job often gets a share of a larger machine: Docker's ``--cpus`` and
``--memory``, a Kubernetes pod's limits and Slurm's job limits are cgroup quotas, which neither
``os.cpu_count`` nor the CPU affinity nor ``sysconf`` sees. Reading as if the whole machine
were free would read ahead a sixteenth of the host's memory in a pod allowed a fraction of it
(killed for memory), and start a loader process beside a training loop allowed one core. The
quotas are read here the way loky (joblib's process pool) reads the CPU quota, and for memory
too: cgroup v2 (``cpu.max``, ``memory.max``) and v1 (``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``, ``memory.limit_in_bytes``), in the process's own cgroup and each one above
it (a Slurm job's limits are set on the job's cgroup, above its steps), the least of them
binding. Hand-written rather than taken from loky or psutil: loky reads only the CPU quota, at
the mount's root, and psutil reads neither.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["CGROUP_ROOT", "SELF_CGROUP", "usable_cores", "usable_memory"]

#: Where cgroups are mounted, and where the process's own cgroups are listed.
CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def usable_cores(root: Path | None = None, listing: Path | None = None) -> int:
    """Cores this process may run on: its CPU affinity (a Slurm task or a container may get
    fewer than the machine has), within the CPU quota of its cgroups rounded up; at least 1.
    ``root`` and ``listing``: where to look instead of :data:`CGROUP_ROOT`, :data:`SELF_CGROUP`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cores = os.cpu_count() or 1
    quota = _cpu_quota(root or CGROUP_ROOT, listing or SELF_CGROUP)
    return max(1, cores if quota is None else min(cores, math.ceil(quota)))


def usable_memory(root: Path | None = None, listing: Path | None = None) -> int | None:
    """Bytes of memory this process may use: the machine's, within the memory limit of its
    cgroups; None where the machine's cannot be asked. ``root``, ``listing``: as above."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf on this platform
        return None
    root, listing = root or CGROUP_ROOT, listing or SELF_CGROUP
    limits = [_read_int(d / "memory.max") for d in _cgroups(root, listing, "")]
    limits += [_read_int(d / "memory.limit_in_bytes") for d in _cgroups(root, listing, "memory")]
    return min([memory] + [v for v in limits if v is not None and v > 0])


def _cpu_quota(root: Path, listing: Path) -> float | None:
    """Cores the CPU quota of the process's cgroups allows (the least), or None without one."""
    quotas = []
    for d in _cgroups(root, listing, ""):
        fields = _read(d / "cpu.max").split()
        if len(fields) == 2 and fields[0] != "max":
            quotas.append(_ratio(fields[0], fields[1]))
    for d in _cgroups(root, listing, "cpu"):
        quotas.append(_ratio(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")))
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _cgroups(root: Path, listing: Path, controller: str) -> list[Path]:
    """The directories of the process's cgroup for ``controller`` (``""``: cgroup v2) and of
    each cgroup above it, that exist under ``root``. Inside a container with its own cgroup
    namespace the listing says ``/`` and the mount's root is the container's cgroup; where the
    path listed is not under the mount (a v1 container without one), the mount's root is."""
    try:
        lines = listing.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        if controller not in (names.split(",") if controller else [names]):
            continue
        if controller:
            mount = root / controller
        else:  # unified (v2) only, or beside v1 controllers ("hybrid")
            mount = root if (root / "cgroup.controllers").exists() else root / "unified"
        own = mount / path.strip("/")
        if not own.is_dir():
            return [mount] if mount.is_dir() else []
        found = [own, *own.parents]
        return found[: found.index(mount) + 1] if mount in found else [own]
    return []


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
