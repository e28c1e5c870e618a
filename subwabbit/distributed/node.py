"""What runs on a Dask worker for one node: a write-only subwabbit process
fed its shard, supervised by the job's rendezvous.

The task keeps a control connection to the rendezvous (see
:mod:`subwabbit.distributed.rendezvous`) for as long as it runs. It says when
its whole shard is written (only then may its engine be averaged with the
others), when it is done, and what went wrong if it fails; a thread listens
for the rendezvous' *abort* and then kills the engine at once, since vw's
AllReduce would otherwise wait forever for a peer that is gone. If the
rendezvous itself goes away (the client stopped), the engine is killed too.
"""

import dataclasses
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sized
from typing import Any, Callable, FrozenSet, Iterable, List, Optional, Sequence, Union

from ..base import VowpalWabbitBaseFormatter
from ..blocking import VowpalWabbitProcess
from ..command import resolve_engine_command
from ..errors import VowpalWabbitError
from .args import node_args, passes
from .errors import DistributedTrainingError
from .rendezvous import (ABORT, CONTROL_MAGIC, DONE, FAILED, FED, STOPPED, _CONTROL_HELLO,
                         decode_message, encode_message)

logger = logging.getLogger("subwabbit.distributed")

_CONNECT_TIMEOUT_S = 30.0
_GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard.py")
#: How long a killed engine gets to be reaped.
_KILLED_ENGINE_CLOSE_S = 5.0
#: A node waits for its engine this much longer than the job's time limit:
#: the client aborts the job at its limit, and this is only the backstop
#: for a node that no longer hears from it.
_ENGINE_WAIT_MARGIN_S = 30.0


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """What every node of a job shares (sent to the workers with each task).

    :ivar formatter: the formatter of the write-only processes
    :ivar vw_args: the user's engine arguments, checked
    :ivar total: how many nodes
    :ivar unique_id: the job's unique id
    :ivar span_server: the rendezvous address as the workers reach it
    :ivar span_server_port: the rendezvous port
    :ivar keep_models: the nodes whose model file is sent back
    :ivar timeout_s: the job's time limit (a node never waits longer for its engine)
    :ivar vw_command: the engine command (``None``: the workers' default)
    :ivar batch_size: lines per write of the write-only processes
    :ivar prediction_type: the kind of model, when ``vw_args`` do not show it
        (a warm start from a ``-i`` model file that carries its reductions)
    """

    formatter: VowpalWabbitBaseFormatter
    vw_args: Sequence[str]
    total: int
    unique_id: int
    span_server: str
    span_server_port: int
    keep_models: FrozenSet[int]
    timeout_s: float
    vw_command: Union[str, Sequence[str], None] = None
    batch_size: int = 50
    prediction_type: Optional[str] = None


@dataclasses.dataclass
class NodeReport:
    """What a node's task sends back (times are :func:`time.time` values).

    :ivar node: the node number
    :ivar host: the worker's host name
    :ivar pid: the worker process's id
    :ivar calls: ``train()`` calls made
    :ivar lines: examples written
    :ivar started_at: when the task started
    :ivar engine_started_at: when its engine had started
    :ivar fed_at: when the whole shard was written (the engine's input then closed)
    :ivar finished_at: when the engine had exited (averaged and saved)
    :ivar model: the model file's bytes (for the nodes in ``keep_models``)
    """

    node: int
    host: str
    pid: int
    calls: int
    lines: int
    started_at: float
    engine_started_at: float
    fed_at: float
    finished_at: float
    model: Optional[bytes] = None


class ControlLink:
    """A node task's control connection to the rendezvous.

    :param host: the rendezvous address
    :param port: the rendezvous port
    :param unique_id: the job's unique id
    :param node: this node's number
    :raises DistributedTrainingError: when the rendezvous cannot be reached or refuses the node
    """

    def __init__(self, host: str, port: int, unique_id: int, node: int) -> None:
        self.node = node
        #: why the job was aborted, once the rendezvous said so (or went away)
        self.abort_reason: Optional[str] = None
        self._on_abort: Optional[Callable[[], Optional[int]]] = None
        self._finished = False
        self._lock = threading.Lock()
        try:
            self._sock = socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise _node_error(node, f"cannot reach the job's rendezvous at {host}:{port}: "
                              f"{exc}") from exc
        try:
            self._sock.sendall(CONTROL_MAGIC + _CONTROL_HELLO.pack(unique_id, node))
            status = self._recv_exactly(1)
            if status != b"\1":
                refusal = decode_message(bytearray(b"\0" + self._recv_rest()))
                raise _node_error(node, "the job's rendezvous refused it: "
                                  + (refusal[0] if refusal else "no reason given"))
            self._sock.settimeout(None)
        except OSError as exc:
            self._sock.close()
            raise _node_error(node, f"the job's rendezvous at {host}:{port} did not answer: "
                              f"{exc}") from exc
        except BaseException:
            self._sock.close()
            raise
        self._listener = threading.Thread(target=self._listen, name=f"subwabbit-node{node}-control",
                                          daemon=True)
        self._listener.start()

    def _recv_exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self._sock.recv(count - len(data))
            if not chunk:
                raise OSError("the connection closed")
            data += chunk
        return data

    def _recv_rest(self) -> bytes:
        data = b""
        while True:
            chunk = self._sock.recv(65536)
            if not chunk:
                return data
            data += chunk

    def _listen(self) -> None:
        buffer = bytearray()
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._abort("the job's rendezvous went away (the client stopped the job)")
                return
            buffer += chunk
            if buffer[:1] == ABORT:
                decoded = decode_message(buffer)
                if decoded is not None:
                    self._abort(decoded[0])
                    return

    def _abort(self, reason: str) -> None:
        with self._lock:
            if self._finished or self.abort_reason is not None:
                return
            self.abort_reason = reason
            callback = self._on_abort
        logger.warning("node %d: stopping its engine: %s", self.node, reason)
        if callback is not None:
            self._stop_engine(callback)

    def _stop_engine(self, stop: Callable[[], Optional[int]]) -> None:
        if stop() is not None:
            self._send(STOPPED)

    def on_abort(self, stop: Callable[[], Optional[int]]) -> None:
        """Have ``stop`` kill the engine (from the listening thread) when the
        job is aborted; at once if it already was. ``stop`` returns the
        engine's exit status once it has exited (``None`` if it has not):
        the rendezvous is then told that this node's engine is over, even if
        the task itself is still busy (in a shard's iterator, say)."""
        with self._lock:
            self._on_abort = stop
            aborted = self.abort_reason is not None
        if aborted:
            self._stop_engine(stop)

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            logger.debug("node %d: the rendezvous did not take a message: %s", self.node, exc)

    def fed(self) -> None:
        """Say that the whole shard was written."""
        self._send(FED)

    def done(self) -> None:
        """Say that the node finished; an abort after this is ignored."""
        with self._lock:
            self._finished = True
        self._send(DONE)

    def failed(self, reason: str) -> None:
        """Say why the node failed."""
        with self._lock:
            self._finished = True
        self._send(encode_message(FAILED, reason))

    def close(self) -> None:
        """Close the connection and wait for the listening thread."""
        with self._lock:
            self._finished = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.join(5.0)
        self._sock.close()


def guarded_command(vw_command: Union[str, Sequence[str], None]) -> List[str]:
    """The engine command (resolved here, on the worker), started through
    :mod:`subwabbit.distributed.guard` on Linux so that the engine dies with
    its worker."""
    command = resolve_engine_command(vw_command)
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, _GUARD, str(os.getpid())] + command


def _leave_thread_pool() -> None:
    """Give the worker its thread back (``distributed.secede``): a node runs
    until every other node of its job has come, so it must not hold one of
    the slots that those nodes, or another job's, may be waiting for."""
    try:
        from distributed import secede  # pylint: disable=import-outside-toplevel
        secede()
    except (ImportError, ValueError):  # not on a Dask worker
        pass


def _node_error(node: int, reason: str) -> DistributedTrainingError:
    """An error of node ``node``: its message names the node, its reason does not."""
    return DistributedTrainingError(f"node {node}: {reason}", node=node, reason=reason)


def _unpack_call(call: Any, node: int, index: int) -> List[Any]:
    """A shard element as ``train()`` arguments."""
    if isinstance(call, (tuple, list)) and len(call) in (3, 4):
        return list(call) + [None] * (4 - len(call))
    raise TypeError(f"element {index} of node {node}'s shard must be a tuple "
                    "(common_features, items_features, labels[, weights]), "
                    f"got {type(call).__name__}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, VowpalWabbitError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _read_model(node: int, model_path: str) -> bytes:
    """The model file a node's engine wrote when it exited without an error.

    :raises DistributedTrainingError: when there is none (what vw does with
        a holdout set and no holdout example on any node)
    """
    try:
        with open(model_path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise _node_error(node, "its engine finished without an error but wrote no model: "
                          "with --passes above 1 and a holdout set (the default) vw writes "
                          "it at the end of a pass whose holdout loss is the best yet, and "
                          "over AllReduce none is when no node has a holdout example (every "
                          "10th example of a shard is held out); give the nodes more "
                          "examples, or pass --holdout_off") from None


def run_node(spec: NodeSpec, node: int, shard: Iterable[Any]) -> NodeReport:
    """Train node ``node`` on ``shard`` (the body of the node's Dask task).

    :param spec: the job's settings
    :param node: this node's number
    :param shard: the node's ``train()`` calls, each
        ``(common_features, items_features, labels[, weights])``
    :returns: the node's report, with its model if asked for
    :raises DistributedTrainingError: when the node fails (the rendezvous has
        then been told why) or the job was aborted
    """
    started_at = time.time()
    _leave_thread_pool()
    directory = tempfile.mkdtemp(prefix=f"subwabbit-node{node}-")
    try:
        link = ControlLink(spec.span_server, spec.span_server_port, spec.unique_id, node)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        return _train(spec, node, shard, link, directory, started_at)
    except BaseException as exc:
        if link.abort_reason is not None:
            raise _node_error(node, f"stopped: the job was aborted ({link.abort_reason})") \
                from exc
        if isinstance(exc, DistributedTrainingError):
            link.failed(exc.reason)
            raise
        reason = _describe(exc)
        link.failed(reason)
        raise DistributedTrainingError(f"node {node} failed: {reason}", node=node,
                                       reason=reason) from exc
    finally:
        link.close()
        shutil.rmtree(directory, ignore_errors=True)


def _train(spec: NodeSpec, node: int, shard: Iterable[Any], link: ControlLink, directory: str,
           started_at: float) -> NodeReport:
    model_path = os.path.join(directory, "model.vw")
    args = node_args(spec.vw_args, span_server=spec.span_server,
                     span_server_port=spec.span_server_port, unique_id=spec.unique_id,
                     total=spec.total, node=node, model_path=model_path,
                     cache_path=os.path.join(directory, "cache") if passes(spec.vw_args) > 1
                     else None)
    process = VowpalWabbitProcess(spec.formatter, args, batch_size=spec.batch_size,
                                  write_only=True, vw_command=guarded_command(spec.vw_command),
                                  startup_timeout_s=min(spec.timeout_s, 60.0),
                                  prediction_type=spec.prediction_type)
    try:
        engine_started_at = time.time()
        engine = process.vw_process
        assert engine is not None  # started by the constructor, not closed since

        def stop_engine() -> Optional[int]:
            engine.kill()
            try:
                return engine.wait(_KILLED_ENGINE_CLOSE_S)
            except Exception:  # pylint: disable=broad-except  (TimeoutExpired)
                return None

        link.on_abort(stop_engine)
        calls = lines = 0
        for index, call in enumerate(shard):
            if link.abort_reason is not None:
                break
            common, items, labels, weights = _unpack_call(call, node, index)
            if not isinstance(items, Sized):
                items = list(items)
            process.train(common, items, labels, weights)
            calls += 1
            lines += len(items)
        if link.abort_reason is not None:
            raise _node_error(node, f"stopped: {link.abort_reason}")
        link.fed()
        fed_at = time.time()
        # The engine finishes its passes, averages with the others at the end
        # of each, writes its model and exits; an abort kills it meanwhile.
        process.close(timeout=spec.timeout_s + _ENGINE_WAIT_MARGIN_S)
        finished_at = time.time()
        if link.abort_reason is not None:
            raise _node_error(node, f"stopped: {link.abort_reason}")
        if engine.returncode != 0:
            raise _node_error(node, "its engine did not finish within "
                              f"{spec.timeout_s + _ENGINE_WAIT_MARGIN_S:g} s of the end of its "
                              f"shard ({process!r})")
        model = None
        if node in spec.keep_models:
            model = _read_model(node, model_path)
        link.done()
        return NodeReport(node=node, host=socket.gethostname(), pid=os.getpid(), calls=calls,
                          lines=lines, started_at=started_at, engine_started_at=engine_started_at,
                          fed_at=fed_at, finished_at=finished_at, model=model)
    finally:
        if process.vw_process is not None and process.vw_process.poll() is None:
            process.vw_process.kill()
        try:
            process.close(timeout=_KILLED_ENGINE_CLOSE_S)
        except VowpalWabbitError:
            pass
