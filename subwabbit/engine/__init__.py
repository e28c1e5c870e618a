"""The engine program: the child process that subwabbit's clients talk to.

Nothing in this package is client code. :mod:`subwabbit.engine.program` is a
``vw``-compatible command backed by the engine of the ``vowpalwabbit`` wheel;
it runs as a plain script (it imports nothing from subwabbit), which is how
the clients start it, or as::

    python -m subwabbit.engine -p stdout --quiet -i model.vw < examples.txt
"""

from .program import DRIVER_ENV_VAR, main, option_name

__all__ = ["DRIVER_ENV_VAR", "main", "option_name"]
