"""CPU accounting from /proc: who used the machine while a contender ran."""

import os
import resource
from typing import List, Union

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: Union[int, List[int], None]) -> float:
    """CPU time (user + system, all threads) a process has used so far (the
    sum, for a list of processes: a pool's engines); 0 for ``None`` (pyvw
    runs in the benchmark's own process)."""
    if pid is None:
        return 0.0
    if isinstance(pid, list):
        return sum(process_cpu_seconds(one) for one in pid)
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _TICKS


def parent_pid(pid: int) -> int:
    """The pid of the process's parent."""
    return int(_stat_fields(pid)[1])


def _stat_fields(pid: int) -> List[str]:
    """The fields of ``/proc/PID/stat`` after the command name (the state first)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        return handle.read().rsplit(")", 1)[1].split()


def machine_busy_seconds() -> float:
    """CPU time all processes on the machine have used so far (every state
    but idle and iowait, summed over the cores)."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(field) for field in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest time is already counted in user time
    return (sum(fields[:8]) - idle) / _TICKS


def children_cpu_seconds() -> float:
    """CPU time of this process's children that have exited and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
