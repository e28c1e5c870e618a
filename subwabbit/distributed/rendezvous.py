"""The rendezvous of an AllReduce job: VW's spanning-tree protocol, in Python.

A vw engine started with ``--span_server HOST --span_server_port PORT
--unique_id U --total N --node I`` connects to the rendezvous when it first
needs to sum a vector (at the end of its first pass), says who it is, and
waits until every node of its job has connected. The rendezvous then lays a
binary tree over the nodes (:mod:`subwabbit.distributed.tree`), tells each
node how many children it will have, learns the port on which each node
listens for its children (vw tries 26544, then 26545, ...), and sends each
node its parent's address. The engines then connect to each other and the
rendezvous has no further part in the sums.

The spanning-tree protocol (integers in the byte order of the machines, which
is little-endian on x86-64 and arm64; the sizes are those of 64-bit vw)::

    engine -> rendezvous   unique id (8 bytes), total (8), node (8)
    rendezvous -> engine   ok (4 bytes, int; 0 refuses the engine)
      ... once every node of the job has connected ...
    rendezvous -> engine   number of children (2 bytes)
    engine -> rendezvous   its listening port (2 bytes, network order)
    rendezvous -> engine   parent's IPv4 address (4 bytes, network order) and
                           port (2 bytes, network order); all ones for the root

Supervision (subwabbit's own, on the same port). A job started by
:func:`subwabbit.distributed.train <subwabbit.distributed.job.train>` also opens a *control* connection from
each node's task, so that the rendezvous knows more than vw tells it::

    task -> rendezvous     CONTROL_MAGIC (8 bytes), unique id (8), node (8)
    rendezvous -> task     1 byte: 1 accepted; 0 refused, then a message
    task -> rendezvous     b"F": the task has written its whole shard
                           b"D": its engine finished and the task is done
                           b"E" + message: the node failed, saying this
                           b"S": after an abort, its engine has exited
    rendezvous -> task     b"A" + message: the job is aborted, stop the engine

(a message is a 4-byte little-endian length and UTF-8 text). The magic
number is above ``2**63`` while unique ids are below ``2**62``, so the two
kinds of connection never mix. With supervision the tree is formed only when
every node's task has said that its whole shard was written: an engine whose
input ended early (its worker died mid-shard) is never averaged with the
others. A node that fails, a task whose connection drops without a word, or
an engine that leaves before the tree is formed aborts the job: every task
is told to stop its engine at once (vw's own AllReduce would wait forever
for a missing peer). Once the tree is formed, a node whose engine failed
because a peer went away (:data:`PEER_LOSS_MARKERS`) waits a moment
(:data:`PEER_LOSS_GRACE_S`) for that peer's own failure, which the job then
reports.
"""

import dataclasses
import errno
import logging
import selectors
import socket
import struct
import threading
import time
from typing import Dict, List, Optional, Tuple

from .tree import chain_layout, tree_layout

logger = logging.getLogger("subwabbit.distributed")

#: The first 8 bytes of a control connection (read as a little-endian
#: integer it is above 2**63; unique ids are below 2**62).
CONTROL_MAGIC = b"swCTRL\x01\xff"
#: Unique ids are drawn below this bound (vw reads them as a 64-bit ``size_t``).
UNIQUE_ID_LIMIT = 1 << 62

_ENGINE_HELLO = struct.Struct("<QQQ")  # unique id, total, node
_CONTROL_HELLO = struct.Struct("<QQ")  # unique id, node
_OK = struct.Struct("<i")
_KID_COUNT = struct.Struct("<H")
_LENGTH = struct.Struct("<I")
_ROOT_PARENT = b"\xff" * 6  # no parent: address and port all ones
_SEND_TIMEOUT_S = 5.0
#: How long a lost engine connection waits for its node's own report (which
#: carries the engine's exit status and last words) before it aborts the job.
ENGINE_LOSS_GRACE_S = 1.0
_MAX_MESSAGE = 1 << 20
#: What vw's AllReduce says when a peer it sums with went away: a node that
#: fails so once the tree is formed did not cause the failure, its peer did.
PEER_LOSS_MARKERS = ("recv from parent", "recv from child", "Write to parent failed",
                     "child has no data to send")
#: How long such a failure waits for the failure of the peer that caused it
#: (its task says why: the engine's exit status, its last words) before it
#: aborts the job itself.
PEER_LOSS_GRACE_S = 1.0

FED, DONE, FAILED, STOPPED, ABORT = b"F", b"D", b"E", b"S", b"A"


def lost_a_peer(message: str) -> bool:
    """Whether a node's failure is vw's AllReduce losing a peer (see
    :data:`PEER_LOSS_MARKERS`)."""
    return any(marker in message for marker in PEER_LOSS_MARKERS)


def encode_message(kind: bytes, text: str) -> bytes:
    """A control message with a text: ``kind``, the length, the UTF-8 text."""
    data = text.encode("utf-8", "replace")[:_MAX_MESSAGE]
    return kind + _LENGTH.pack(len(data)) + data


def decode_message(buffer: bytearray) -> Optional[Tuple[str, int]]:
    """The text of a message at the start of ``buffer`` (after its kind byte).

    :returns: ``(text, bytes used)``, or ``None`` while it is incomplete
    """
    if len(buffer) < 1 + _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(buffer, 1)
    end = 1 + _LENGTH.size + length
    if len(buffer) < end:
        return None
    return bytes(buffer[1 + _LENGTH.size:end]).decode("utf-8", "replace"), end


@dataclasses.dataclass
class NodeState:
    """What the rendezvous knows of one node (times are :func:`time.time` values).

    :ivar node: the node number
    :ivar started_at: when the node's task connected (supervised jobs)
    :ivar fed_at: when the task said its whole shard was written
    :ivar engine_at: when the node's engine connected (the end of its first pass)
    :ivar done_at: when the task said it was done
    :ivar failure: what the node said when it failed
    :ivar ended_at: when the node's engine was known to be over: its task
        said so after an abort, or its connection closed (the task ended)
    :ivar address: the engine's IPv4 address as seen here
    """

    node: int
    started_at: Optional[float] = None
    fed_at: Optional[float] = None
    engine_at: Optional[float] = None
    done_at: Optional[float] = None
    failure: Optional[str] = None
    ended_at: Optional[float] = None
    address: Optional[str] = None

    def describe(self) -> str:
        """What the node was last seen doing, in a few words."""
        if self.failure is not None:
            return "failed"
        if self.done_at is not None:
            return "done"
        if self.engine_at is not None:
            return "its engine was at the rendezvous (waiting for the others, or averaging)"
        if self.fed_at is not None:
            return "had written its shard; its engine had not reached the rendezvous"
        if self.started_at is not None:
            return "was writing its shard"
        return "never started"


class _Connection:
    """One accepted socket and what has been read from it."""

    __slots__ = ("sock", "peer", "kind", "buffer", "node", "port", "finished")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.kind: Optional[str] = None  # "engine" or "control" once known
        self.buffer = bytearray()
        self.node: Optional[int] = None
        self.port: Optional[bytes] = None  # an engine's listening port (network order)
        self.finished = False  # a control connection whose node said "done" or "failed"


class Rendezvous:
    """The rendezvous of one AllReduce job, served on a thread of its own.

    :param unique_id: the job's ``--unique_id`` (connections with another id
        are refused, so jobs running at once never mix)
    :param total: the job's ``--total``: how many nodes
    :param host: the address to listen on (``127.0.0.1`` for a job on this
        machine; the address the workers reach this machine by otherwise)
    :param port: the port to listen on (0: any free port, see :attr:`port`)
    :param supervised: whether each node's task also connects (see the module
        documentation); without, the tree is formed as soon as every engine
        has connected, as vw's own ``spanning_tree`` does
    :param reproducible: lay the nodes in a chain instead of a binary tree, in
        the order of their numbers wherever they run, so that every sum is
        added in one order and the same shards give the same weights bit for
        bit (see :mod:`subwabbit.distributed.tree`)
    :raises OSError: when the address cannot be listened on (the message
        names the address and port)
    :raises ValueError: for a unique id or total out of range
    """

    def __init__(self, unique_id: int, total: int, *, host: str = "127.0.0.1", port: int = 0,
                 supervised: bool = True, reproducible: bool = False) -> None:
        if not 0 <= unique_id < UNIQUE_ID_LIMIT:
            raise ValueError(f"unique_id must be in [0, 2**62), got {unique_id!r}")
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"total must be a positive number of nodes, got {total!r}")
        self.unique_id = unique_id
        self.total = total
        self.supervised = supervised
        self.nodes = [NodeState(node) for node in range(total)]
        #: when the tree was sent to the engines (a :func:`time.time` value)
        self.tree_formed_at: Optional[float] = None
        #: ``(node or None, message)`` of the first failure
        self.failure: Optional[Tuple[Optional[int], str]] = None
        #: every node's state when the first failure was recorded (before the
        #: abort it sets off changes them)
        self.states_at_failure: List[NodeState] = []
        self._engines: Dict[int, _Connection] = {}
        self._controls: Dict[int, _Connection] = {}
        self._connections: List[_Connection] = []
        self._ports_awaited = False
        self._positions: Dict[int, int] = {}
        self._layout = chain_layout(total) if reproducible else tree_layout(total)
        self._reproducible = reproducible
        self._engine_lost: Optional[Tuple[float, int, str]] = None
        self._peer_lost: Optional[Tuple[float, int, str]] = None
        self._aborted = False
        self._stopping = False
        self._changed = threading.Condition(threading.Lock())
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(max(16, 2 * total))
            self._listener.setblocking(False)
        except OSError as exc:
            self._listener.close()
            hint = ("choose another rendezvous_port (0: any free port)"
                    if exc.errno == errno.EADDRINUSE else
                    "give a rendezvous_host that is an IPv4 address of this machine's own "
                    "interfaces, which the workers can reach")
            raise OSError(exc.errno, f"the rendezvous cannot listen on {host}:{port} "
                                     f"({exc.strerror or exc}): {hint}") from exc
        except BaseException:
            self._listener.close()
            raise
        self.host, self.port = self._listener.getsockname()[:2]
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_reader, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name=f"subwabbit-rendezvous-{self.port}",
                                        daemon=True)
        self._thread.start()
        logger.info("rendezvous for job %d (%d nodes) listening on %s:%d",
                    unique_id, total, self.host, self.port)

    def __repr__(self) -> str:
        state = ("failed" if self.failure else "done" if self.finished
                 else "tree formed" if self.tree_formed_at else "waiting")
        return (f"<Rendezvous {self.host}:{self.port} unique_id={self.unique_id} "
                f"total={self.total} {state}>")

    # ------------------------------------------------------------ outside view

    @property
    def finished(self) -> bool:
        """Whether every node's task said it was done (supervised), or the
        tree was formed (unsupervised)."""
        with self._changed:
            return self._is_finished()

    def snapshot(self) -> List[NodeState]:
        """A copy of every node's state."""
        with self._changed:
            return [dataclasses.replace(state) for state in self.nodes]

    def wait_until_stopped(self, timeout_s: float) -> List[int]:
        """After an abort: wait until every node whose task started is over
        (its engine exited, or its task ended), at most ``timeout_s``.

        :returns: the nodes still running when the time was up
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                running = [state.node for state in self.nodes
                           if state.started_at is not None and state.ended_at is None]
                left = deadline - time.monotonic()
                if not running or left <= 0:
                    return running
                self._changed.wait(left)

    def wait(self, timeout_s: float) -> None:
        """Sleep until something changes (a node's state, a failure), at most ``timeout_s``."""
        with self._changed:
            self._changed.wait(timeout_s)

    def fail(self, node: Optional[int], message: str) -> None:
        """Record a failure seen elsewhere (a node's task raised, the job ran
        out of time) and abort the job: every connected task is told to stop
        its engine. The first failure is the one that stays."""
        with self._changed:
            self._node_failed(node, message)
        self._wake()

    def close(self, abort: bool = True) -> None:
        """Stop serving and close every socket; idempotent.

        :param abort: first tell the tasks still connected to stop their
            engines (``False`` once every task has returned: nothing runs)
        """
        if self._stopping:
            return
        with self._changed:
            self._record_peer_loss()
            if abort and not self._is_finished():
                self._record_failure(None, "the job was stopped")
            self._stopping = True
        self._wake()
        self._thread.join(10.0)
        for connection in list(self._connections):
            self._drop(connection)
        self._selector.close()
        self._listener.close()
        self._wake_reader.close()
        self._wake_writer.close()
        logger.debug("rendezvous on %s:%d closed", self.host, self.port)

    def _is_finished(self) -> bool:
        if not self.supervised:
            return self.tree_formed_at is not None
        return all(state.done_at is not None for state in self.nodes)

    def __enter__(self) -> "Rendezvous":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loop

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except OSError:
            pass

    def _serve(self) -> None:
        try:
            while not self._stopping:
                timeout = None
                with self._changed:
                    waits = [lost[0] for lost in (self._engine_lost, self._peer_lost)
                             if lost is not None]
                if waits:
                    timeout = max(0.0, min(waits) - time.monotonic())
                for key, _ in self._selector.select(timeout):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._read(key.data)
                self._check_engine_loss()
                with self._changed:
                    if self._peer_lost is not None and time.monotonic() >= self._peer_lost[0]:
                        self._record_peer_loss()
                self._broadcast_abort_once()
            self._broadcast_abort_once()  # a failure recorded with the request to stop
        except Exception:  # pylint: disable=broad-except
            logger.exception("the rendezvous on %s:%d failed", self.host, self.port)
            with self._changed:
                self._record_failure(None, "the rendezvous failed (see the log)")
            self._broadcast_abort_once()

    def _drain_wake(self) -> None:
        try:
            while self._wake_reader.recv(256):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the connection waits
                logger.warning("rendezvous: accept failed: %s", exc)
                return
            sock.settimeout(_SEND_TIMEOUT_S)
            connection = _Connection(sock, address[0])
            self._connections.append(connection)
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _drop(self, connection: _Connection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

    def _send(self, connection: _Connection, data: bytes) -> bool:
        try:
            connection.sock.sendall(data)
            return True
        except OSError as exc:
            logger.debug("rendezvous: sending to %s failed: %s", connection.peer, exc)
            return False

    def _read(self, connection: _Connection) -> None:
        try:
            chunk = connection.sock.recv(65536)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._closed_by_peer(connection)
            return
        connection.buffer += chunk
        if connection.kind is None:
            if len(connection.buffer) < len(CONTROL_MAGIC):
                return
            connection.kind = ("control" if connection.buffer[:len(CONTROL_MAGIC)] == CONTROL_MAGIC
                               else "engine")
            if connection.kind == "control":
                del connection.buffer[:len(CONTROL_MAGIC)]
        if connection.kind == "engine":
            self._read_engine(connection)
        else:
            self._read_control(connection)

    # --------------------------------------------------------------- engines

    def _read_engine(self, connection: _Connection) -> None:
        if connection.node is None:
            if len(connection.buffer) < _ENGINE_HELLO.size:
                return
            unique_id, total, node = _ENGINE_HELLO.unpack_from(connection.buffer)
            del connection.buffer[:_ENGINE_HELLO.size]
            self._engine_hello(connection, unique_id, total, node)
            return
        if connection.port is None and self._ports_awaited and len(connection.buffer) >= 2:
            connection.port = bytes(connection.buffer[:2])
            del connection.buffer[:2]
            self._send_parents_when_ready()

    def _engine_hello(self, connection: _Connection, unique_id: int, total: int, node: int) -> None:
        refusal = None
        blame: Optional[int] = None
        if unique_id != self.unique_id:
            logger.warning("rendezvous %s:%d: refused an engine from %s: unique id %d is not "
                           "this job's", self.host, self.port, connection.peer, unique_id)
            self._send(connection, _OK.pack(0))
            self._drop(connection)
            return
        if total != self.total:
            refusal = f"an engine says the job has {total} nodes, not {self.total}"
        elif node >= self.total:
            refusal = f"an engine says it is node {node} of a job of {self.total} nodes"
        elif node in self._engines:
            refusal, blame = "its engine connected twice", node
        elif self.failure is not None:
            refusal = "the job was aborted"
        if refusal is not None:
            self._send(connection, _OK.pack(0))
            self._drop(connection)
            with self._changed:
                if self.failure is None:
                    self._record_failure(blame, f"{refusal} (from {connection.peer})")
            return
        if not self._send(connection, _OK.pack(1)):
            self._drop(connection)
            return
        connection.node = node
        self._engines[node] = connection
        with self._changed:
            self.nodes[node].engine_at = time.time()
            self.nodes[node].address = connection.peer
            self._changed.notify_all()
        logger.debug("rendezvous: node %d's engine connected from %s", node, connection.peer)
        self._form_tree_when_ready()

    def _form_tree_when_ready(self) -> None:
        if self._ports_awaited or self.failure is not None or len(self._engines) < self.total:
            return
        if self.supervised and any(state.fed_at is None for state in self.nodes):
            return
        layout = self._layout
        if self._reproducible:  # the order of the sums must not depend on where nodes run
            order = sorted(self._engines)
        else:  # neighbours on one machine, as vw's spanning_tree does
            order = sorted(self._engines, key=lambda node: (
                socket.inet_aton(self._engines[node].peer), node))
        self._positions = {node: position for position, node in enumerate(order)}
        self._ports_awaited = True
        for node, position in self._positions.items():
            connection = self._engines[node]
            if not self._send(connection, _KID_COUNT.pack(layout.kid_counts[position])):
                self._engine_gone(connection)
                return
        for connection in self._engines.values():  # ports that arrived with the hello
            self._read_engine(connection)

    def _send_parents_when_ready(self) -> None:
        if self.failure is not None or self._engine_lost is not None \
                or len(self._engines) < self.total:
            return  # an engine left: the tree cannot be formed (its failure is on the way)
        if any(connection.port is None for connection in self._engines.values()):
            return
        with self._changed:
            self.tree_formed_at = time.time()
            self._changed.notify_all()
        by_position = {position: node for node, position in self._positions.items()}
        for node, position in self._positions.items():
            parent = self._layout.parents[position]
            if parent is None:
                answer = _ROOT_PARENT
            else:
                parent_connection = self._engines[by_position[parent]]
                assert parent_connection.port is not None  # (checked above)
                answer = socket.inet_aton(parent_connection.peer) + parent_connection.port
            self._send(self._engines[node], answer)
        for connection in list(self._engines.values()):
            connection.finished = True
            self._drop(connection)
        logger.info("rendezvous: the tree of job %d is formed (%d nodes)", self.unique_id,
                    self.total)

    def _engine_gone(self, connection: _Connection) -> None:
        """An engine left before the tree was complete: it died."""
        node = connection.node
        self._drop(connection)
        if node is None or connection.finished or self.failure is not None:
            return
        self._engines.pop(node, None)
        message = "its engine left the rendezvous before the tree was formed"
        if self.supervised and node in self._controls:
            # Its task will say why (the exit status, the engine's last words).
            self._engine_lost = (time.monotonic() + ENGINE_LOSS_GRACE_S, node, message)
        else:
            with self._changed:
                self._record_failure(node, message)

    def _check_engine_loss(self) -> None:
        if self._engine_lost is not None and time.monotonic() >= self._engine_lost[0]:
            _, node, message = self._engine_lost
            self._engine_lost = None
            with self._changed:
                self._record_failure(node, message)

    # --------------------------------------------------------------- control

    def _read_control(self, connection: _Connection) -> None:
        if connection.node is None:
            if len(connection.buffer) < _CONTROL_HELLO.size:
                return
            unique_id, node = _CONTROL_HELLO.unpack_from(connection.buffer)
            del connection.buffer[:_CONTROL_HELLO.size]
            if not self._control_hello(connection, unique_id, node):
                return
        while connection.buffer:
            kind = bytes(connection.buffer[:1])
            if kind == FAILED:
                decoded = decode_message(connection.buffer)
                if decoded is None:
                    return
                text, used = decoded
                del connection.buffer[:used]
                connection.finished = True
                with self._changed:
                    self._node_failed(connection.node, text)
                continue
            del connection.buffer[:1]
            with self._changed:
                state = self.nodes[connection.node]  # type: ignore[index]
                if kind == FED:
                    state.fed_at = time.time()
                elif kind == DONE:
                    state.done_at = time.time()
                    connection.finished = True
                elif kind == STOPPED:
                    state.ended_at = state.ended_at or time.time()
                else:
                    self._record_failure(connection.node, "its task sent the rendezvous an "
                                         f"unknown message {kind!r}")
                self._changed.notify_all()
            if kind == FED:
                self._form_tree_when_ready()

    def _control_hello(self, connection: _Connection, unique_id: int, node: int) -> bool:
        refusal = None
        blame: Optional[int] = None
        if unique_id != self.unique_id:
            refusal = f"unique id {unique_id} is not this job's"
        elif node >= self.total:
            refusal = f"node {node} is not in a job of {self.total} nodes"
        elif node in self._controls:
            refusal, blame = "its task started twice (did its first worker die?)", node
        elif self.failure is not None:
            refusal = f"the job was aborted: {self._failure_text()}"
        if refusal is not None:
            self._send(connection, b"\0" + encode_message(b"", refusal))
            self._drop(connection)
            if blame is not None:
                with self._changed:
                    self._record_failure(blame, refusal)
            return False
        if not self._send(connection, b"\1"):
            self._drop(connection)
            return False
        connection.node = node
        self._controls[node] = connection
        with self._changed:
            self.nodes[node].started_at = time.time()
            self._changed.notify_all()
        return True

    def _closed_by_peer(self, connection: _Connection) -> None:
        if connection.kind == "engine":
            self._engine_gone(connection)
            return
        self._drop(connection)
        if connection.kind == "control" and connection.node is not None:
            with self._changed:
                state = self.nodes[connection.node]
                state.ended_at = state.ended_at or time.time()
                self._changed.notify_all()
        if connection.kind == "control" and connection.node is not None \
                and not connection.finished:
            with self._changed:
                self._record_failure(connection.node, "its task went away without a word (its "
                                     "worker may have died)")

    # ---------------------------------------------------------------- failure

    def _failure_text(self) -> str:
        assert self.failure is not None
        node, message = self.failure
        return message if node is None else f"node {node}: {message}"

    def _node_failed(self, node: Optional[int], message: str) -> None:
        """Record a node's failure (the caller holds the lock); one that is
        vw's AllReduce losing a peer after the tree was formed waits up to
        :data:`PEER_LOSS_GRACE_S` for that peer's own failure, which then
        stays as the job's: the node whose engine died is named, not its
        neighbour that could no longer sum with it."""
        if node is None or self.failure is not None or self.tree_formed_at is None \
                or not lost_a_peer(message):
            self._record_failure(node, message)
            return
        if self.nodes[node].failure is None:
            self.nodes[node].failure = message
        if self._peer_lost is None:
            self._peer_lost = (time.monotonic() + PEER_LOSS_GRACE_S, node, message)
            logger.info("AllReduce job %d: node %d lost a peer; waiting %.1f s for the peer's "
                        "own failure: %s", self.unique_id, node, PEER_LOSS_GRACE_S, message)
        self._changed.notify_all()

    def _record_peer_loss(self) -> None:
        """Record the failure held by :meth:`_node_failed`, if any (the
        caller holds the lock); a no-op once another failure was recorded."""
        if self._peer_lost is not None:
            _, node, message = self._peer_lost
            self._peer_lost = None
            self._record_failure(node, message)

    def _record_failure(self, node: Optional[int], message: str) -> None:
        """Keep the first failure (the caller holds the lock)."""
        if node is not None and self.nodes[node].failure is None:
            self.nodes[node].failure = message
        if self.failure is None:
            self.failure = (node, message)
            self._peer_lost = None  # (the failure it waited for, or itself)
            self.states_at_failure = [dataclasses.replace(state) for state in self.nodes]
            logger.warning("AllReduce job %d failed: %s", self.unique_id, self._failure_text())
        self._changed.notify_all()

    def _broadcast_abort_once(self) -> None:
        """After a failure: tell every task to stop its engine, and let go of
        the engines waiting here (they fail at once)."""
        if self.failure is None or self._aborted:
            return
        self._aborted = True
        self._engine_lost = None
        notice = encode_message(ABORT, self._failure_text())
        for node, connection in list(self._controls.items()):
            if connection in self._connections and not connection.finished:
                self._send(connection, notice)
            # The connection stays open: the task closes it once its engine is stopped.
        for connection in list(self._engines.values()):
            if not connection.finished:
                self._drop(connection)
