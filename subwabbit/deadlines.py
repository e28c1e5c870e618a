"""Turning caller-supplied timeouts into absolute deadlines.

All deadlines in subwabbit are :func:`time.perf_counter` values.
"""

import math
import numbers
import time
import warnings
from typing import Optional


#: The longest wait subwabbit asks of the operating system, in seconds (about
#: eleven and a half days). A number of seconds above it that converts to a
#: float, infinity included, is taken as this: no call waits so long in
#: practice, and the system's waits (``select``, ``poll``, locks) refuse
#: numbers far larger. A timeout that long means no deadline.
LONGEST_WAIT_S = 1_000_000.0


def validate_seconds(value: Optional[float], name: str, allow_none: bool = True) -> Optional[float]:
    """Check that ``value`` is a usable, non-negative number of seconds.

    :param value: the number to check
    :param name: the parameter's name, used in the error message
    :param allow_none: whether ``None`` (no limit) is acceptable
    :returns: ``value`` as a float, at most :data:`LONGEST_WAIT_S`, or ``None``
    :raises TypeError: for a bool or a non-number
    :raises ValueError: for a negative or NaN number, or ``None`` when not allowed
    """
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{name} must be a number of seconds, not None")
    if type(value) is not float and (  # (a float needs no check against the ABC: a call's cost)
            isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large: {value!r}") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return min(value, LONGEST_WAIT_S)


def validate_deadline(deadline: Optional[float], name: str = "deadline") -> Optional[float]:
    """Check an absolute :func:`time.perf_counter` deadline given by a caller.

    :returns: ``deadline`` as a float, or ``None`` (no deadline)
    :raises TypeError: for a bool or a non-number
    :raises ValueError: for NaN
    """
    if deadline is None:
        return None
    if type(deadline) is not float and (
            isinstance(deadline, bool) or not isinstance(deadline, numbers.Real)):
        raise TypeError(f"{name} must be a time.perf_counter() value or None, got {deadline!r}")
    deadline = float(deadline)
    if math.isnan(deadline):
        raise ValueError(f"{name} must be a time.perf_counter() value or None, got nan")
    return deadline


def required_seconds(value: float, name: str) -> float:
    """:func:`validate_seconds` for a parameter that must be a number (``None``
    refused)."""
    seconds = validate_seconds(value, name, allow_none=False)
    assert seconds is not None
    return seconds


def deadline_from_timeout(timeout: Optional[float], name: str = "timeout",
                          start: Optional[float] = None) -> Optional[float]:
    """Convert a relative timeout into an absolute :func:`time.perf_counter` deadline.

    ``None`` means no deadline; ``0`` means a deadline that has already passed;
    :data:`LONGEST_WAIT_S` or more (infinity included) means no deadline, as
    ``None``: ``io_timeout_s`` then still guards against a stuck engine.

    :param timeout: seconds from ``start``, or ``None``
    :param name: the parameter's name, for error messages
    :param start: the reference time (default: now)
    :returns: the deadline, or ``None``
    """
    seconds = validate_seconds(timeout, name)
    if seconds is None or seconds >= LONGEST_WAIT_S:
        return None
    return (time.perf_counter() if start is None else start) + seconds


#: A ``predict`` timeout above this many seconds is almost always milliseconds
#: passed as seconds (``timeout=10`` meant as 10 ms); it is warned about once.
SUSPICIOUS_TIMEOUT_S = 2.0
_warned_about_timeout = False


def warn_if_milliseconds(timeout: Optional[float]) -> None:
    """Warn once per process about a ``predict`` timeout above
    :data:`SUSPICIOUS_TIMEOUT_S` (timeouts are in seconds)."""
    global _warned_about_timeout  # pylint: disable=global-statement
    if timeout is None or _warned_about_timeout or isinstance(timeout, bool):
        return
    try:
        # infinity says "no limit" on purpose, not milliseconds
        large = SUSPICIOUS_TIMEOUT_S < float(timeout) < math.inf
    except (TypeError, ValueError):
        return
    if large:
        _warned_about_timeout = True
        warnings.warn(f"predict(timeout={timeout!r}): the timeout is in seconds; "
                      f"{float(timeout) * 1000:g} ms is a long budget for a request (pass "
                      f"timeout={float(timeout) / 1000:g} for {timeout!r} ms). This warning "
                      "is shown once per process.", UserWarning, stacklevel=3)


def remaining(deadline: Optional[float]) -> Optional[float]:
    """Seconds left until ``deadline`` (never negative), or ``None`` without a deadline."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.perf_counter())
