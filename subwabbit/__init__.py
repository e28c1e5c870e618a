"""subwabbit: serve Vowpal Wabbit models from Python through a vw engine on pipes.

:class:`~subwabbit.blocking.VowpalWabbitProcess` gives the best throughput;
:class:`~subwabbit.nonblocking.VowpalWabbitNonBlockingProcess` (Linux) returns by a
hard deadline; :class:`~subwabbit.asyncio_process.AsyncVowpalWabbitProcess` does the
same for asyncio code. :class:`~subwabbit.pool.VowpalWabbitPool` serves many
threads with several engines.
"""

import logging

from .asyncio_pool import AsyncVowpalWabbitPool
from .asyncio_process import AsyncVowpalWabbitProcess
from .base import VowpalWabbitBaseFormatter, VowpalWabbitBaseModel, VowpalWabbitDummyFormatter
from .blocking import VowpalWabbitProcess
from .errors import (VowpalWabbitBusyError, VowpalWabbitEngineExitedError, VowpalWabbitError,
                     VowpalWabbitProtocolError, VowpalWabbitStartupError,
                     VowpalWabbitTimeoutError)
from .escaping import escape_name
from .exploration import sample_item
from .explanation import AuditFeature, parse_audit_features
from .nonblocking import VowpalWabbitNonBlockingProcess
from .plt import VowpalWabbitPLTProcess
from .pool import VowpalWabbitPool
from .version import __version__

# A library's loggers stay silent unless the application configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AsyncVowpalWabbitPool",
    "AsyncVowpalWabbitProcess",
    "AuditFeature",
    "VowpalWabbitBaseFormatter",
    "VowpalWabbitBaseModel",
    "VowpalWabbitBusyError",
    "VowpalWabbitDummyFormatter",
    "VowpalWabbitEngineExitedError",
    "VowpalWabbitError",
    "VowpalWabbitNonBlockingProcess",
    "VowpalWabbitPLTProcess",
    "VowpalWabbitPool",
    "VowpalWabbitProcess",
    "VowpalWabbitProtocolError",
    "VowpalWabbitStartupError",
    "VowpalWabbitTimeoutError",
    "__version__",
    "escape_name",
    "parse_audit_features",
    "sample_item",
]
