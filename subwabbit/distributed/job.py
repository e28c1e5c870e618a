"""Running an AllReduce job on a Dask cluster, from the client's side.

:func:`run_job` starts the job's rendezvous beside the client, has Dask run
one node task per shard (spread over the workers; each gives its worker
thread back as it starts, so that all run at once), watches the rendezvous and the tasks, and either gathers the
nodes' reports or stops every node and raises. :func:`train` runs a job and
writes node 0's model.
"""

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import ipaddress
import logging
import numbers
import os
import secrets
import time
import uuid
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Union
from urllib.parse import urlsplit

from ..base import VowpalWabbitBaseFormatter
from ..client import check_formatter_and_batch_size
from ..command import VwArgs
from ..core.kinds import choose_kind
from ..deadlines import validate_seconds
from ..model_file import model_file_path
from .args import check_user_args
from .errors import DistributedTrainingError
from .node import NodeReport, NodeSpec, run_node
from .rendezvous import UNIQUE_ID_LIMIT, NodeState, Rendezvous

logger = logging.getLogger("subwabbit.distributed")

#: How often the client looks at the tasks' states while the job runs.
_POLL_S = 0.05
#: How long a failed job waits for its running tasks to stop their engines.
_STOP_WAIT_S = 10.0
#: How long a failed job waits for the failed node's exception to arrive.
_CAUSE_WAIT_S = 2.0

PathLike = Union[str, "os.PathLike[str]"]


@dataclasses.dataclass
class JobResult:
    """What a finished job returns (times are :func:`time.time` values).

    :ivar models: the model files' bytes of the nodes asked for, by node
    :ivar reports: every node's report, in node order
    :ivar states: what the rendezvous saw of every node (when its engine
        reached the end of its first pass, ...)
    :ivar started_at: when the job was submitted
    :ivar tree_formed_at: when the rendezvous sent the tree (the first
        averaging began)
    :ivar finished_at: when the last node finished
    """

    models: Dict[int, bytes]
    reports: List[NodeReport]
    states: List[NodeState]
    started_at: float
    tree_formed_at: float
    finished_at: float

    @property
    def lines(self) -> int:
        """Examples written to all nodes."""
        return sum(report.lines for report in self.reports)

    @property
    def seconds(self) -> float:
        """Wall time from submission to the last node's end."""
        return self.finished_at - self.started_at

    @property
    def allreduce_seconds(self) -> float:
        """From the tree's formation to the last node's end: the first
        averaging over the tree (and, with several passes, the later passes),
        and writing the models."""
        return self.finished_at - self.tree_formed_at

    @property
    def waiting_seconds(self) -> float:
        """The longest a node's engine waited at the rendezvous for the others."""
        return max(self.tree_formed_at - state.engine_at for state in self.states
                   if state.engine_at is not None)


def _import_distributed() -> Any:
    try:
        import distributed  # pylint: disable=import-outside-toplevel
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("subwabbit.distributed needs Dask distributed: "
                          "pip install 'subwabbit[dask]'") from exc
    return distributed


def _is_bag(shards: Any) -> bool:
    return hasattr(shards, "to_delayed") and hasattr(shards, "npartitions")


def _check_shards(shards: Any) -> List[Any]:
    if _is_bag(shards):
        return list(shards.to_delayed())
    if isinstance(shards, (str, bytes)) or not isinstance(shards, Iterable):
        raise TypeError("shards must be a list of iterables (one per node) or a Dask bag "
                        f"with one partition per node, got {type(shards).__name__}")
    shards = list(shards)
    for index, shard in enumerate(shards):
        if isinstance(shard, (str, bytes)) or not isinstance(shard, Iterable):
            raise TypeError(f"shards[{index}] must be an iterable of train() calls, "
                            f"got {type(shard).__name__}")
    return shards


def _check_node_options(formatter: Any, tokens: List[str], batch_size: Any,
                        prediction_type: Optional[str]) -> None:
    """Refuse here what every node's process would refuse on its worker."""
    check_formatter_and_batch_size(formatter, batch_size)
    # The kind the nodes' processes choose (a model file's saved options are
    # read on the workers): an unknown prediction_type, one that contradicts
    # the reduction in vw_args, or a reduction subwabbit cannot serve.
    choose_kind(tokens, prediction_type,
                saved_options=None if model_file_path(tokens) is not None else ())


def _check_port(port: Any) -> int:
    """Refuse a rendezvous port no socket can listen on (``bind`` raises
    OverflowError for one out of range, and reads True as port 1)."""
    if isinstance(port, bool) or not isinstance(port, numbers.Integral):
        raise TypeError(f"rendezvous_port must be an int, got {port!r}")
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"rendezvous_port must be in 0..65535 (0: any free port), got {port!r}")
    return number


def _check_keep_models(keep_models: Any, total: int) -> FrozenSet[int]:
    """The nodes whose model comes back: ints (not bools) naming nodes.

    :raises TypeError: for what is not a collection of ints
    :raises ValueError: for a node the job does not have
    """
    if isinstance(keep_models, (str, bytes)) or not isinstance(keep_models, Iterable):
        raise TypeError(f"keep_models must be a collection of node numbers, got {keep_models!r}")
    keep = list(keep_models)
    for node in keep:
        if isinstance(node, bool) or not isinstance(node, numbers.Integral):
            raise TypeError(f"keep_models must hold node numbers (ints), got {node!r}")
    if not all(0 <= node < total for node in keep):
        raise ValueError(f"keep_models must name nodes 0..{total - 1}, got {sorted(keep)}")
    return frozenset(int(node) for node in keep)


def _spread_over_workers(client: Any, count: int) -> List[str]:
    """A worker address for each node: the workers in turn, each as often as
    it has threads while threads last, so that the nodes spread over the
    machines. (A node task gives its thread back as it starts, so more nodes
    than threads still run at once, sharing the cores.)

    :raises ValueError: when the cluster has no worker
    """
    # Asked of the scheduler, answered to this call: scheduler_info() returns
    # the client's cached identity, which the client's own periodic refresh
    # may replace, between its fetch and its return, with one that lists no
    # worker (a job on a cluster of 3 workers once failed so).
    threads = {address: max(1, int(count)) for address, count in client.nthreads().items()}
    if not threads:
        raise ValueError("the Dask cluster has no worker")
    if count > sum(threads.values()):
        logger.info("%d nodes on %d worker threads: some workers run several nodes at once",
                    count, sum(threads.values()))
    order: List[str] = []
    remaining = dict(threads)
    while len(order) < count:
        if not any(remaining.values()):
            remaining = dict(threads)
        for address in sorted(remaining):
            if remaining[address] > 0 and len(order) < count:
                order.append(address)
                remaining[address] -= 1
    return order


def rendezvous_address(client: Any) -> str:
    """The IPv4 address the workers reach this machine by: loopback when the
    scheduler is on this machine's loopback (or in this process), else the
    address of the interface that routes to the scheduler."""
    address = getattr(client.scheduler, "address", "") or ""
    parts = urlsplit(address)
    host = parts.hostname or ""
    if parts.scheme == "inproc" or not host or host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return "127.0.0.1"
    except ValueError:
        pass  # a host name
    from distributed.utils import get_ip  # pylint: disable=import-outside-toplevel
    return get_ip(host, parts.port or 80)


def run_job(client: Any, shards: Any, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs, *,
            timeout_s: float = 600.0, keep_models: Sequence[int] = (0,),
            rendezvous_host: Optional[str] = None, rendezvous_port: int = 0,
            vw_command: Union[str, Sequence[str], None] = None,
            batch_size: int = 50, reproducible: bool = False,
            prediction_type: Optional[str] = None) -> JobResult:
    """Train one model on many workers with VW's AllReduce, and return every
    node's report (the lower-level form of :func:`train`).

    :param client: a :class:`distributed.Client`
    :param shards: a list of iterables, or a Dask bag with one partition per
        shard; each element is one ``train()`` call's arguments
        ``(common_features, items_features, labels, weights)`` (``weights``
        may be left out). A shard is pickled to its worker, so it must be a
        list or another picklable iterable (an object whose ``__iter__``
        reads a file on the worker, say)
    :param formatter: the formatter of every node's write-only process (pickled to the workers)
    :param vw_args: the engine arguments; the job adds the AllReduce options,
        ``-f``, a cache file per node with ``--passes`` above 1, and
        ``--predict_only_model`` with ``--bfgs``
    :param timeout_s: the most the whole job may take
    :param keep_models: the nodes whose model file comes back (the nodes'
        weights are identical; their header statistics are not)
    :param rendezvous_host: the IPv4 address or host name the workers reach
        this machine by (default: see :func:`rendezvous_address`)
    :param rendezvous_port: the rendezvous port (default: any free port)
    :param vw_command: the engine command on the workers (default: theirs)
    :param batch_size: lines per write of the write-only processes
    :param reproducible: average over a chain of the nodes instead of a binary
        tree: with three nodes or more, vw's tree adds a node's two children
        in the order their bytes arrive, so the weights' last bits change
        from run to run; a chain adds in one order, and the same shards give
        the same weights bit for bit (each pass then crosses ``N - 1`` links
        instead of about ``log2(N)``)
    :param prediction_type: the kind of model, when ``vw_args`` do not show
        it (a warm start with ``-i`` from a model file that carries its
        reductions, such as ``'cb_explore_adf'``): it decides how each node
        lays out and checks its training lines
    :returns: the job's result
    :raises DistributedTrainingError: when a node fails or the job runs out
        of time (every node's engine is stopped first), or when the nodes
        finished without averaging (a learner that does not use AllReduce)
    :raises ValueError: for arguments the job (or its nodes) cannot use (a
        ``rendezvous_port`` out of 0..65535, say), or a cluster without
        workers; before anything is sent to the cluster
    :raises TypeError: for shards that are not iterables, a formatter without the
        formatter's methods, or a ``rendezvous_port`` that is not an int
    :raises OSError: when the rendezvous cannot listen on ``rendezvous_host`` and
        ``rendezvous_port`` (a port in use, say), before anything is sent to the cluster
    """
    distributed = _import_distributed()
    timeout_s = validate_seconds(timeout_s, "timeout_s", allow_none=False)  # type: ignore[assignment]
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    tokens = check_user_args(vw_args)
    _check_node_options(formatter, tokens, batch_size, prediction_type)
    rendezvous_port = _check_port(rendezvous_port)
    sources = _check_shards(shards)
    total = len(sources)
    if total < 1:
        raise ValueError("shards is empty: give at least one shard")
    keep = _check_keep_models(keep_models, total)
    slots = _spread_over_workers(client, total)
    host = rendezvous_host or rendezvous_address(client)
    unique_id = 1 + secrets.randbelow(UNIQUE_ID_LIMIT - 1)
    started_at = time.time()
    deadline = time.monotonic() + timeout_s
    rendezvous = Rendezvous(unique_id, total, host=host, port=rendezvous_port,
                            reproducible=reproducible)
    succeeded = False
    try:
        spec = NodeSpec(formatter=formatter, vw_args=tuple(tokens), total=total,
                        unique_id=unique_id, span_server=host,
                        span_server_port=rendezvous.port, keep_models=keep,
                        timeout_s=timeout_s, vw_command=vw_command, batch_size=batch_size,
                        prediction_type=prediction_type)
        futures: List[Any] = []
        shard_futures: List[Any] = []  # each node's shard, as a Dask future
        try:
            _submit(client, spec, sources, slots, rendezvous, deadline, timeout_s, futures,
                    shard_futures)
            _supervise(rendezvous, futures, deadline, timeout_s, shards=shard_futures)
            reports = _gather(client, futures, rendezvous, deadline, timeout_s)
        except BaseException as exc:
            _stop(distributed, client, rendezvous, futures,
                  exc if isinstance(exc, DistributedTrainingError) else None)
            raise
        succeeded = True
        states = rendezvous.snapshot()
        tree_formed_at = rendezvous.tree_formed_at
    finally:
        rendezvous.close(abort=not succeeded)
    if tree_formed_at is None:
        raise _never_averaged(states)
    reports.sort(key=lambda report: report.node)
    models = {report.node: report.model for report in reports if report.model is not None}
    for report in reports:
        report.model = None
    return JobResult(models=models, reports=reports, states=states, started_at=started_at,
                     tree_formed_at=tree_formed_at,
                     finished_at=max(report.finished_at for report in reports))


def _submit(client: Any, spec: NodeSpec, sources: List[Any], slots: List[str],
            rendezvous: Rendezvous, deadline: float, timeout_s: float,
            futures: List[Any], shards: List[Any]) -> None:
    """One task per node, each on its worker (a preference: Dask may move a
    task whose worker is gone or busy), appended to ``futures`` as it is
    submitted (and its shard's Dask future to ``shards``).

    The shards of lists are scattered to their workers all at once, and the
    job's deadline bounds the wait for them: Dask's scatter has no time limit
    of its own, and one to a stuck worker (stopped, or its host unreachable)
    never returns.

    :raises DistributedTrainingError: when a shard is not on its worker by
        the deadline (the node is named)
    """
    tag = f"{spec.unique_id:016x}"
    scatters = [None if _is_delayed(source) else _on_loop(
        client, client.scatter([source], workers=[worker], hash=False, asynchronous=True))
        for source, worker in zip(sources, slots)]
    try:
        for node, (source, worker) in enumerate(zip(sources, slots)):
            scatter = scatters[node]
            if scatter is None:  # a bag's partition, computed on the cluster
                shard = client.compute(source, workers=[worker], allow_other_workers=True)
            else:
                try:
                    shard = scatter.result(timeout=max(0.0, deadline - time.monotonic()))[0]
                except concurrent.futures.TimeoutError:
                    rendezvous.fail(node, f"its shard was not on its worker {worker} within "
                                    f"timeout_s={timeout_s:g} (the worker may be stuck, or "
                                    "its host unreachable)")
                    raise _job_error(rendezvous) from None
            shards.append(shard)
            futures.append(client.submit(run_node, spec, node, shard,
                                         key=f"subwabbit-node-{node}-{tag}", workers=[worker],
                                         allow_other_workers=True, retries=0, pure=False))
    finally:
        for scatter in scatters:
            if scatter is not None:
                scatter.cancel()


def _is_delayed(source: Any) -> bool:
    """Whether a shard is a bag's partition (a Dask collection to compute)."""
    return hasattr(source, "dask") and hasattr(source, "key")


def _on_loop(client: Any, awaitable: Any) -> "concurrent.futures.Future[Any]":
    """Run one of the client's calls (made with ``asynchronous=True``) on its
    event loop, so that this thread can wait for it a bounded time and
    cancel it: the blocking forms of Dask's scatter and gather have no time
    limit, and wait for a stuck worker for as long as it stays stuck."""
    return asyncio.run_coroutine_threadsafe(awaitable, client.loop.asyncio_loop)


def _gather(client: Any, futures: List[Any], rendezvous: Rendezvous, deadline: float,
            timeout_s: float) -> List[NodeReport]:
    """Every node's report, fetched from its worker by the job's deadline.

    One node at a time: Dask merges gathers that run at once into one, which
    a stuck worker holds up for every node, and the node could not be named.

    :raises DistributedTrainingError: when a report is not here by then (its
        worker stopped, or its host unreachable, once the node finished); the
        node is named
    """
    reports = []
    for node, future in enumerate(futures):
        fetch = _on_loop(client, client.gather(future, asynchronous=True))
        try:
            reports.append(fetch.result(timeout=max(0.0, deadline - time.monotonic())))
        except concurrent.futures.TimeoutError:
            rendezvous.fail(node, "its report did not come back from its worker within "
                            f"timeout_s={timeout_s:g} (the worker may be stuck, or its host "
                            "unreachable)")
            raise _job_error(rendezvous) from None
        finally:
            fetch.cancel()
    return reports


def _supervise(rendezvous: Rendezvous, futures: List[Any], deadline: float,
               timeout_s: float, shards: Sequence[Any] = ()) -> None:
    """Wait until every task has finished; raise when one fails or time is up."""
    while True:
        if rendezvous.failure is not None:
            raise _job_error(rendezvous)
        statuses = [future.status for future in futures]
        for node, status in enumerate(statuses):
            if status in ("error", "cancelled", "lost"):
                rendezvous.fail(node, _task_failure(futures[node], status,
                                                    shards[node] if node < len(shards) else None))
        if rendezvous.failure is None and all(status == "finished" for status in statuses):
            return
        if rendezvous.failure is None and time.monotonic() >= deadline:
            rendezvous.fail(None, f"the job did not finish within timeout_s={timeout_s:g}")
        rendezvous.wait(_POLL_S)


def _task_failure(future: Any, status: str, shard: Any = None) -> str:
    if status == "cancelled" and shard is not None and shard.status == "cancelled" \
            and future.client.status == "running":
        # Dask cancels a task whose input is gone: a scattered shard whose
        # only worker died or left (this client did not cancel it: it runs).
        return ("its shard was lost before its task ran: the Dask worker that held it died "
                "or left the cluster, and Dask cancelled the task")
    if status != "error":
        return f"its Dask task was {status}"
    try:
        exc = future.exception(timeout=1)
    except Exception as error:  # pylint: disable=broad-except
        return f"its Dask task failed ({error})"
    if isinstance(exc, DistributedTrainingError) and exc.reason:
        return exc.reason
    return f"its Dask task raised {type(exc).__name__}: {exc}"


def _job_error(rendezvous: Rendezvous) -> DistributedTrainingError:
    assert rendezvous.failure is not None
    node, reason = rendezvous.failure
    # What each node was doing when the job failed, not after the abort (a
    # node stopped by it reports a failure of its own soon after).
    states = [f"node {state.node}: {state.describe()}" for state in rendezvous.states_at_failure]
    if node is None:
        message = f"distributed training failed: {reason}"
    else:
        message = f"distributed training failed: node {node} failed: {reason}"
    message += "\n" + "\n".join(states)
    return DistributedTrainingError(message, node=node, reason=reason, node_states=states)


def _never_averaged(states: List[NodeState]) -> DistributedTrainingError:
    """Every node finished, but no engine came to the rendezvous: each learnt
    its own shard alone, and node 0's model is not the job's."""
    reason = ("every node's engine finished, but none ever reached the rendezvous: the "
              "learner in vw_args does not average over AllReduce (vw's --ftrl, --coin, "
              "--pistol, --OjaNewton, --svrg and --ksvm do not), so each node learnt its "
              "own shard alone; no model is returned")
    node_states = [f"node {state.node}: {state.describe()}" for state in states]
    return DistributedTrainingError(f"distributed training failed: {reason}\n"
                                    + "\n".join(node_states), reason=reason,
                                    node_states=node_states)


def _attach_node_error(error: DistributedTrainingError, futures: List[Any]) -> None:
    """Chain the failed node's own exception (with its remote traceback)."""
    if error.node is None or error.__cause__ is not None or error.node >= len(futures) \
            or futures[error.node].status != "error":
        return
    try:
        error.__cause__ = futures[error.node].exception(timeout=1)
    except Exception:  # pylint: disable=broad-except
        pass


def _stop(distributed: Any, client: Any, rendezvous: Rendezvous, futures: List[Any],
          error: Optional[DistributedTrainingError]) -> None:
    """After a failure: have every running task stop its engine and wait (a
    bounded time) until they have; cancel the tasks that never started."""
    if rendezvous.failure is None:
        rendezvous.fail(None, "the job was interrupted")
    running = rendezvous.wait_until_stopped(_STOP_WAIT_S)
    if running:
        logger.error("nodes %s did not say that their engines stopped within %.0f s of the "
                     "abort; their workers may be unresponsive", running, _STOP_WAIT_S)
    if error is not None and error.node is not None and error.node < len(futures):
        try:  # the failed node's own exception, with its remote traceback
            distributed.wait([futures[error.node]], timeout=_CAUSE_WAIT_S)
        except Exception:  # pylint: disable=broad-except  (distributed's TimeoutError)
            pass
        _attach_node_error(error, futures)
    try:
        client.cancel(futures)
    except Exception as exc:  # pylint: disable=broad-except  (a closed client)
        # The job's own error says what happened; a client closed mid-job
        # (its tasks were cancelled with it) cannot cancel them again.
        logger.debug("the job's tasks could not be cancelled: %s", exc)


def train(client: Any, shards: Any, formatter: VowpalWabbitBaseFormatter, vw_args: VwArgs,
          model_path: PathLike, timeout_s: float = 600.0, **options: Any) -> str:
    """Train one model on many Dask workers with VW's AllReduce.

    One write-only :class:`~subwabbit.blocking.VowpalWabbitProcess` per shard
    runs on the workers, all at once; at the end of every pass their engines
    average their weights over a tree set up by a rendezvous that runs beside
    this client, so every node ends with the same weights. Node 0's model
    file comes back to the client and is written to ``model_path``.

    :param client: a :class:`distributed.Client`
    :param shards: a list of iterables, or a Dask bag with one partition per
        shard; each element is one ``train()`` call's arguments
        ``(common_features, items_features, labels, weights)``
    :param formatter: the formatter of every node's process
    :param vw_args: the engine arguments (the AllReduce options, ``-f`` and
        cache files are added)
    :param model_path: where node 0's model is written (replaced atomically)
    :param timeout_s: the most the whole job may take
    :param options: passed to :func:`run_job` (``rendezvous_host``,
        ``rendezvous_port``, ``vw_command``, ``batch_size``, ``reproducible``,
        ``prediction_type``)
    :returns: ``model_path``
    :raises DistributedTrainingError: when a node fails, the job runs out
        of time, or the nodes finished without averaging (no model is written)
    :raises OSError: when no file can be written beside ``model_path``, or
        the rendezvous cannot listen on its port, before the job starts
    """
    path = os.fspath(model_path)
    # A name of its own (two jobs of one process may write the same path),
    # never left behind. Created before the job: a path that cannot be
    # written fails at once, not after hours of training.
    temporary = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    if os.path.isdir(path):
        raise IsADirectoryError(f"model_path is a directory: {path}")
    handle = open(temporary, "wb")  # pylint: disable=consider-using-with
    try:
        with handle:
            result = run_job(client, shards, formatter, vw_args, timeout_s=timeout_s,
                             keep_models=(0,), **options)
            handle.write(result.models[0])
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    logger.info("distributed training: %d lines on %d nodes in %.1f s; model written to %s",
                result.lines, len(result.reports), result.seconds, path)
    return path
