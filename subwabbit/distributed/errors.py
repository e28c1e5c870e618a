"""The error a distributed training job raises."""

from typing import List, Optional

from ..errors import VowpalWabbitError


class DistributedTrainingError(VowpalWabbitError):
    """A distributed training job failed or ran out of time. Every node's
    engine has been told to stop (and, unless a worker no longer answered,
    has stopped) by the time it is raised.

    :ivar node: the node whose failure ended the job (``None`` when the job
        ran out of time, or failed outside any node)
    :ivar reason: what that node said (for an engine: its exit status and
        last words), or why the job stopped
    :ivar node_states: one line per node: what it was doing when the job ended
    """

    def __init__(self, message: str, *, node: Optional[int] = None, reason: str = "",
                 node_states: Optional[List[str]] = None) -> None:
        super().__init__(message)
        self.node = node
        self.reason = reason
        self.node_states = list(node_states or [])

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Keyword-only state survives pickling (Dask sends errors between processes).
        return (_rebuild, (self.message, self.node, self.reason, self.node_states))


def _rebuild(message: str, node: Optional[int], reason: str,
             node_states: List[str]) -> DistributedTrainingError:
    return DistributedTrainingError(message, node=node, reason=reason, node_states=node_states)
