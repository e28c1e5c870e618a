"""The pipe protocol between a client and a vw engine, without any I/O.

This package holds every rule of the conversation with the engine and none of
its input/output, in the manner of h11's state machine: it takes the bytes
the engine printed and says whose they are, and it says which bytes to write
next; it never reads a pipe, writes one, or sleeps.

* :mod:`subwabbit.core.channel`: one engine's input and output streams. It
  turns formatted lines into bytes, keeps the bytes not yet written, counts
  the lines in flight per call, discards what an ended call left behind, and
  splits the engine's output into the answers of the calls that are owed
  them. The rule "a prediction is never given to another item or another
  call" is enforced here, once.
* :mod:`subwabbit.core.exchanges`: what one call (``predict``, ``train``,
  ``save``, a start-up probe, ...) does step by step: when to format more
  lines, when to stop, when the engine has been silent too long.

The drivers (:mod:`subwabbit.sync_driver` for the blocking and nonblocking
classes, :mod:`subwabbit.asyncio_process` for asyncio) only move the bytes
the channel asks for and wait until the time an exchange names.
"""
