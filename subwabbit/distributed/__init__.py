"""Training beyond one machine: one model from many workers with VW's
AllReduce, run on Dask (``pip install 'subwabbit[dask]'``).

:func:`train` runs one write-only subwabbit process per shard on the
workers of a :class:`distributed.Client`; their engines average their weights
at the end of every pass over a tree that a rendezvous beside the client sets
up (:mod:`~subwabbit.distributed.rendezvous`), and node 0's model is written
where you say. See :doc:`/distributed`.

Importing this package does not import Dask; :func:`train` does.
"""

from .errors import DistributedTrainingError
from .job import JobResult, run_job, train
from .rendezvous import Rendezvous

__all__ = ["DistributedTrainingError", "JobResult", "Rendezvous", "run_job", "train"]
