"""How many CPUs this process may use: the CPUs it may run on
(``os.sched_getaffinity``), lowered to its cgroup's CPU quota.

A container started with ``docker run --cpus 2`` (or a Kubernetes CPU limit)
on a 64-core host may run on all 64 cores but gets 2 cores' worth of time:
a pool of 64 engines there would spend its quota switching between them.
The quota is read from cgroup v2 (``cpu.max``) or v1
(``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), in the process's own
cgroup and every cgroup above it, and rounded up to whole CPUs.
"""

import logging
import math
import os
from typing import Iterator, List, Optional, Tuple

logger = logging.getLogger("subwabbit")

#: Where the cgroup file systems are mounted.
CGROUP_ROOT = "/sys/fs/cgroup"


def usable_cpus(cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup") -> int:
    """The CPUs this process may use: those it may run on, no more than its
    cgroup's CPU quota rounded up (at least 1).

    :param cgroup_root: where the cgroup file systems are mounted
    :param proc_cgroup: the file that lists the process's cgroups
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota = cpu_quota(cgroup_root, proc_cgroup)
    except Exception as exc:  # pylint: disable=broad-except
        # (an odd system's files must never stop a pool from starting)
        logger.debug("cannot read the cgroup CPU quota: %r", exc)
        quota = None
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cpu_quota(cgroup_root: str = CGROUP_ROOT,
              proc_cgroup: str = "/proc/self/cgroup") -> Optional[float]:
    """The smallest CPU quota (in CPUs, say ``1.5``) of the process's cgroup
    and the cgroups above it, or ``None`` when none is set or none can be read."""
    try:
        with open(proc_cgroup, encoding="utf-8", errors="surrogateescape") as listing:
            memberships = _memberships(listing.read())
    except (OSError, ValueError):
        return None
    quotas = [quota for directory in _quota_dirs(cgroup_root, memberships)
              for quota in [_read_quota(directory)] if quota is not None]
    return min(quotas) if quotas else None


def _memberships(listing: str) -> List[Tuple[str, str]]:
    """``(controllers, path)`` of each line of ``/proc/PID/cgroup``
    (``hierarchy-id:controllers:path``; the v2 line has no controllers)."""
    found = []
    for line in listing.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            found.append((parts[1], parts[2]))
    return found


def _quota_dirs(root: str, memberships: List[Tuple[str, str]]) -> Iterator[str]:
    """The cgroup directories whose quota applies: for v1 the ``cpu``
    hierarchy's, for v2 the unified one's, from the process's cgroup up to
    the root. In a container the listed path may be the host's, which is
    not mounted there: its own cgroup is then the mount's root."""
    for controllers, path in memberships:
        if controllers == "":  # v2: the unified hierarchy (beside v1's on hybrid systems)
            mounts, marker = [root, os.path.join(root, "unified")], "cgroup.controllers"
        elif "cpu" in controllers.split(","):
            mounts = [os.path.join(root, controllers), os.path.join(root, "cpu"),
                      os.path.join(root, "cpu,cpuacct")]
            marker = "cpu.cfs_period_us"
        else:
            continue
        for mount in mounts:
            if not os.path.isfile(os.path.join(mount, marker)):
                continue
            relative = path.strip("/")
            if relative and not os.path.isdir(os.path.join(mount, relative)):
                relative = ""
            while True:
                yield os.path.join(mount, relative) if relative else mount
                if not relative:
                    break
                relative = os.path.dirname(relative)
            break


def _read_quota(directory: str) -> Optional[float]:
    """The quota set in one cgroup directory, in CPUs (``None``: none)."""
    try:
        with open(os.path.join(directory, "cpu.max"), encoding="ascii") as v2:
            quota, _, period = v2.read().strip().partition(" ")
        return None if quota == "max" else _ratio(quota, period or "100000")
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us"), encoding="ascii") as v1_quota:
            quota = v1_quota.read().strip()
        with open(os.path.join(directory, "cpu.cfs_period_us"), encoding="ascii") as v1_period:
            period = v1_period.read().strip()
    except (OSError, ValueError):
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> Optional[float]:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:  # -1: no limit
        return None
    return quota_us / period_us
