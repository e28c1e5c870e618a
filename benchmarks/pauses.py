"""How long the machine itself stops a busy process.

A virtual machine's vCPU can be paused by its host, and a kernel can keep a
running task off its CPU for its own work. Neither shows in a client's code,
but both make a call late. :func:`machine_pauses` spins on the clock for a
while, with nothing else of the benchmark running, and records every gap
between two readings: on a quiet dedicated machine they stay in the
microseconds.
"""

import time
from typing import Any, Dict


def machine_pauses(seconds: float, threshold_s: float = 0.0002) -> Dict[str, Any]:
    """Spin for ``seconds`` and collect the gaps between clock readings.

    :returns: the number of gaps over 0.5 ms and over 1 ms, the longest ten
        (ms), and the spin's length
    """
    clock = time.perf_counter
    gaps = []
    last = started = clock()
    end = started + seconds
    while last < end:
        now = clock()
        if now - last > threshold_s:
            gaps.append(now - last)
        last = now
    gaps_ms = sorted(gap * 1000 for gap in gaps)
    return {"seconds": seconds,
            "over_0.5ms": sum(gap > 0.5 for gap in gaps_ms),
            "over_1ms": sum(gap > 1.0 for gap in gaps_ms),
            "longest_ms": [round(gap, 3) for gap in gaps_ms[-10:]],
            "method": "one busy loop reading time.perf_counter() while the benchmark waits; "
                      "gaps between consecutive readings"}
