"""The largest pool this process can run.

Every engine of a pool holds file descriptors in the client (its three
pipes, a pidfd, the fork server's socket: about five), and a ``reload``
starts a whole new generation of engines while the old one still serves,
so for a while a pool holds twice its engines. A pool larger than the
descriptors the process may open fails half way with ``Too many open
files`` (or, larger still, starts more processes than the machine holds);
:func:`largest_pool_size` is the bound checked at construction instead.
"""

import resource

#: The most engines a pool takes, whatever the limits: far more than any
#: machine has CPUs to serve them with.
MAX_POOL_SIZE = 1024

#: File descriptors the client holds per engine (measured: 3 for a lone
#: engine, 4.6 per engine in a pool of 5 that shares its weights).
FDS_PER_ENGINE = 5

#: Descriptors left for everything else the process opens.
FD_RESERVE = 64


def largest_pool_size() -> int:
    """The largest ``size`` a pool may have here: :data:`MAX_POOL_SIZE`,
    or fewer when the soft ``RLIMIT_NOFILE`` (``ulimit -n``) does not leave
    descriptors for two generations of engines (see the module's text).

    :returns: at least 1
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_POOL_SIZE
    return max(1, min(MAX_POOL_SIZE, (soft - FD_RESERVE) // (2 * FDS_PER_ENGINE)))


def size_limit_reason() -> str:
    """What :func:`largest_pool_size` is bound by, for error messages."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if largest_pool_size() == MAX_POOL_SIZE:
        return f"subwabbit's limit (MAX_POOL_SIZE = {MAX_POOL_SIZE})"
    return (f"the open files this process may have (RLIMIT_NOFILE, ulimit -n: {soft}) "
            f"leave room for {largest_pool_size()} engines, each holding about "
            f"{FDS_PER_ENGINE} files, twice over during a reload; raise the limit for "
            "a larger pool")
