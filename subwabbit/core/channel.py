"""One engine's input and output streams, and whose each answer is.

The engine answers every example with a fixed number of output lines, set by
the kind of model (:mod:`subwabbit.core.kinds`): 1 for a scalar or a class
label, 2 for the contextual-bandit kinds (the answer, then an empty line), 3
in audit mode, none for a write-only engine; it answers in the order the
examples were written. An example is one line, or, for the multi-line kinds
(``--cb_adf``, ``--cb_explore_adf``), a shared line, one line per item and an
empty line that ends it. A :class:`Channel` therefore keeps, in input order, a
queue of *segments*: runs of examples queued together by one call, with the
byte range they occupy in the input stream and the number of output lines
still owed. Each output line the engine prints goes to the oldest segment
still owed one:

* the segment of the call in progress: the line is that call's answer;
* the segment of a call that has ended (finished early, timed out, was
  abandoned or cancelled): the line is read and thrown away.

When a call ends, its examples that have not reached the engine at all are
forgotten (never written, so never answered); an example that is partly
written is completed, since the engine would otherwise read it glued to the
next one (a single-line example is completed to its newline, a multi-line
example to the empty line that ends it).
Nothing here does I/O: :meth:`Channel.write_with` hands the bytes to a
function of the driver, :meth:`Channel.receive` takes what the driver read.
"""

import collections
from typing import Callable, Deque, List, Optional, Sequence

from ..errors import VowpalWabbitError, VowpalWabbitProtocolError
from ..lines import encode_example, encode_lines

#: A featureless, unlabelled example and an empty line: it produces exactly
#: one answer and teaches the model nothing, whether the engine reads
#: single-line examples (the empty line gets no answer) or multi-line ones
#: (the empty line ends an example of one featureless item). Used to see that
#: the engine is alive and to mark a point in the output stream (after a
#: save, say).
PROBE_LINE = b"|\n\n"

#: What starts an engine that the probes would teach (a learning engine with
#: a reduction of :data:`~subwabbit.core.kinds.MOVED_BY_EVERY_EXAMPLE`, which
#: draws random numbers for each example, or counts lines): a space. That the
#: engine has read it shows that it started; vw's parser skips it as the
#: leading blank of the line that follows, so it is neither an example nor a
#: line (the same model and answers, on vw's driver and the one-thread loop;
#: an engine closed before any line reads it as a last, featureless example,
#: after its learning). No answer is checked at such a start. A byte order
#: mark that starts the next line is written as three spaces
#: (see :class:`Channel`'s ``after_blank``): vw would keep it after the
#: blank.
START_BLANK = b" "

#: A UTF-8 byte order mark, and the three spaces that stand for it where a
#: line continues :data:`START_BLANK`.
_BOM = "\ufeff".encode("utf-8")
_BOM_SPACES = b"   "

#: Kinds of segments.
EXAMPLES = "examples"
PROBE = "probe"
CONTROL = "control"

# Written bytes are cut from the front of the buffer once this many have gathered.
_COMPACT_BYTES = 1 << 16


class _Segment:
    """Examples queued together by one call.

    A segment is either a run of single-line examples (each line is answered
    on its own, and the run may be cut between lines) or one *whole* example
    that must reach the engine entire (a multi-line example, a probe).
    """

    __slots__ = ("call", "kind", "lines", "owed", "start", "end", "whole")

    def __init__(self, call: Optional["Call"], kind: str, lines: int, owed: int, start: int,
                 end: int, whole: bool) -> None:
        self.call = call      # None once the call has ended: its answers are discarded
        self.kind = kind
        self.lines = lines    # example lines (items) in the segment: what pacing counts
        self.owed = owed      # output lines the engine still owes for it
        self.start = start    # stream positions of its bytes in the engine's input
        self.end = end
        self.whole = whole    # one example: never cut, answered all at once

    def examples_owed(self, per_example: int) -> int:
        """Lines (items) of the examples not yet fully answered."""
        if not self.owed:
            return 0
        if self.whole:
            return self.lines
        return -(-self.owed // max(1, per_example))


class Call:
    """One call's share of a channel: the lines it queued and the answers it is owed.

    A call is *active* from :meth:`Channel.begin` until :meth:`Channel.end`
    (or until a later call begins, which ends it). Only an active call
    receives answers; an ended call's answers are discarded.
    """

    __slots__ = ("channel", "active", "keep", "answers", "probe_answers", "queued_lines",
                 "owed_lines", "superseded", "ended_because")

    def __init__(self, channel: "Channel", keep: bool) -> None:
        self.channel = channel
        self.active = True
        self.superseded = False
        #: why the call was ended from outside (see :meth:`Channel.abandon`)
        self.ended_because: Optional[str] = None
        #: whether the answers to its examples are kept (``False`` for training)
        self.keep = keep
        #: raw output lines owed to this call, in order, not yet taken
        self.answers: List[bytes] = []
        #: raw output lines that answered this call's probes
        self.probe_answers: List[bytes] = []
        #: example lines this call has queued in all
        self.queued_lines = 0
        #: example and probe lines of this call whose answers have not all arrived
        self.owed_lines = 0

    def check_active(self) -> None:
        """Raise if this call has ended: nothing it would read is its own any more.

        :raises VowpalWabbitError: when a later call superseded it, or it ended
        """
        if not self.active:
            if self.ended_because is not None:
                raise VowpalWabbitError(
                    f"this call cannot go on: {self.ended_because}; its remaining "
                    "predictions were discarded")
            if self.superseded:
                raise VowpalWabbitError(
                    "this predict() iterator was superseded by a later call on the same "
                    "process; its remaining predictions were discarded")
            raise VowpalWabbitError("this call has ended")

    def queue_lines(self, lines: Sequence[str], first_index: Optional[int] = None) -> int:
        """Check and encode formatted single-line examples and queue them for the engine.

        :param lines: formatted examples without newlines
        :param first_index: the request position of ``lines[0]``, for error
            messages (``None``: the lines this call queued before them)
        :returns: how many lines were queued
        :raises ValueError: when a line is not exactly one example or holds
            text UTF-8 cannot encode (nothing is queued), or the channel reads
            multi-line examples
        """
        self.check_active()
        if self.channel.multi_line:
            raise ValueError("this engine reads multi-line examples: queue them with "
                             "queue_example()")
        data = encode_lines(lines, self.queued_lines if first_index is None else first_index)
        if data:
            self.channel._queue(self, EXAMPLES, data, len(lines))
            self.queued_lines += len(lines)
        return len(lines)

    def queue_example(self, lines: List[str]) -> None:
        """Queue one multi-line example: its lines, then the empty line that ends it.

        The example reaches the engine whole or not at all, and is answered
        once (:attr:`Channel.outputs_per_line` output lines). Its item lines
        are what pacing counts as its lines in flight.

        :param lines: the example's lines without newlines: its shared line,
            then one line per item (see
            :meth:`PredictionKind.example_lines <subwabbit.core.kinds.PredictionKind.example_lines>`)
        :raises ValueError: when the channel reads single-line examples, or a
            line would split the example or end it early (see
            :func:`~subwabbit.lines.encode_example`; nothing is queued)
        """
        self.check_active()
        if not self.channel.multi_line:
            raise ValueError("this engine reads single-line examples: queue them with "
                             "queue_lines()")
        data = encode_example(lines)
        items = len(lines) - 1
        self.channel._queue(self, EXAMPLES, data, items, whole=True)
        self.queued_lines += items

    def queue_probe(self) -> None:
        """Queue :data:`PROBE_LINE`; its answer goes to :attr:`probe_answers`."""
        self.check_active()
        self.channel._queue(self, PROBE, PROBE_LINE, 1, whole=True)

    def queue_control(self, data: bytes) -> None:
        """Queue a line the engine answers with nothing (its save command).

        :param data: one line, newline included
        """
        self.check_active()
        if data.count(b"\n") != 1 or not data.endswith(b"\n"):
            raise ValueError(f"a control line must be one line: {data!r}")
        self.channel._queue(self, CONTROL, data, 0)

    def take_answers(self) -> List[bytes]:
        """The raw answers that arrived for this call since the last take,
        whole examples only (groups of :attr:`Channel.outputs_per_line` lines)."""
        answers = self.answers
        per_line = self.channel.outputs_per_line
        if per_line == 1 or len(answers) % per_line == 0:
            self.answers = []
            return answers
        whole = len(answers) - len(answers) % per_line
        self.answers = answers[whole:]
        return answers[:whole]


class Channel:
    """The input and output streams of one engine, and who is owed each answer.

    :param outputs_per_line: output lines the engine prints per example:
        1, 2 for the contextual-bandit kinds, 3 in audit mode, 0 for a
        write-only engine (which prints nothing); see
        :attr:`PredictionKind.answer_lines <subwabbit.core.kinds.PredictionKind.answer_lines>`
    :param multi_line: whether an example is several lines ended by an empty
        line (:meth:`Call.queue_example`) instead of one line (:meth:`Call.queue_lines`)
    :param after_blank: whether the engine was started with
        :data:`START_BLANK`, which the first bytes queued continue
    """

    def __init__(self, outputs_per_line: int = 1, multi_line: bool = False,
                 after_blank: bool = False) -> None:
        if outputs_per_line < 0:
            raise ValueError("outputs_per_line must not be negative")
        self.outputs_per_line = outputs_per_line
        self.multi_line = multi_line
        self._after_blank = after_blank
        self._out = bytearray()   # bytes queued and not yet cut off after writing
        self._out_off = 0         # index in _out of the first byte not written
        self._out_base = 0        # stream position of _out[0]
        #: how much of _out's start holds no newline (a compaction found none
        #: there: searching it again at every write made writing a line of
        #: N bytes cost O(N**2))
        self._out_scanned = 0
        #: the start of an output line whose newline has not come, in the pieces
        #: that reads returned (joined once the newline comes: joining at every
        #: read made a line of N bytes cost O(N**2))
        self._partial: List[bytes] = []
        self._segments: Deque[_Segment] = collections.deque()
        self._current: Optional[Call] = None
        #: example and probe lines whose answers have not all arrived (all calls)
        self.in_flight_lines = 0
        #: of those, the lines of calls that have ended
        self.stale_lines = 0
        #: lines per second the engine answered in the last split call that
        #: measured it (:mod:`subwabbit.core.split`), ``None`` before one did
        self.pace: Optional[float] = None
        #: bytes written and received so far (progress counts)
        self.bytes_written = 0
        self.bytes_received = 0
        #: since when the engine has owed answers and printed nothing, as
        #: last noted between calls (``None``: it owed none); see
        #: :meth:`note_progress`
        self.quiet_since: Optional[float] = None
        self._quiet_mark = -1
        #: changes of the channel under way: one that an exception cut short
        #: leaves it above 0 (see :attr:`torn`)
        self._changing = 0
        #: a write under way: one that an exception cut short leaves it set
        #: (see :attr:`input_torn`)
        self._writing = False

    @property
    def input_torn(self) -> bool:
        """Whether a write was cut short by an exception between the
        driver's system call and the bookkeeping of what it wrote: which
        bytes the engine was given is then unknown, and its input may end in
        the middle of a line (a :attr:`torn` channel whose input is intact
        was torn by a read)."""
        return self._writing

    @property
    def input_ends_whole(self) -> bool:
        """Whether what the engine was given ends on a whole line: no write
        was cut short (:attr:`input_torn`), and the bytes written end with a
        line break, or none were (the buffer starts on a line boundary)."""
        return not self._writing and (self._out_off == 0
                                      or self._out[self._out_off - 1] == 0x0A)

    @property
    def torn(self) -> bool:
        """Whether a change of the channel was cut short by an exception:
        one raised between a driver's read or write and the bookkeeping of
        what it moved (a ``KeyboardInterrupt`` lands between any two
        bytecodes), or inside the bookkeeping itself. Who is owed which
        answer is then unknown, and the engine must not serve another call.

        Exceptions the channel raises on purpose leave it torn too; those
        end the engine anyway (:class:`~subwabbit.errors.VowpalWabbitProtocolError`).
        An exception from outside a change (a formatter's, a caller's
        between two predictions) leaves it exact."""
        return self._changing > 0

    # ------------------------------------------------------- a quiet engine

    def note_progress(self, now: float) -> None:
        """Start or stop the clock of an engine that owes answers and prints
        nothing (called between calls, when a call ends or before one
        begins; nobody reads the engine's pipe in between): stopped when it
        owes none, started again when it printed something since the clock
        started."""
        if not self.in_flight_lines:
            self.quiet_since = None
        elif self.quiet_since is None or self.bytes_received != self._quiet_mark:
            self.quiet_since = now
            self._quiet_mark = self.bytes_received

    def quiet_for(self, now: float, idle_s: Optional[float]) -> bool:
        """Whether the engine has owed answers, with no byte of output, for
        ``idle_s`` (``None``: no limit) by the clock of :meth:`note_progress`.
        Calls with deadlines end before any such wait: an engine that
        stopped (``SIGSTOP``, a hung engine) is found this way between them."""
        return (idle_s is not None and self.quiet_since is not None
                and self.bytes_received == self._quiet_mark
                and now - self.quiet_since >= idle_s)

    # ----------------------------------------------------------------- calls

    @property
    def current(self) -> Optional[Call]:
        """The active call, if any."""
        return self._current

    def begin(self, keep: bool = True) -> Call:
        """Start a call; an active earlier call is ended (superseded) first.

        :param keep: keep the answers to the call's examples (``False``: discard them)
        """
        self._changing += 1
        self.supersede()
        call = Call(self, keep)
        self._current = call
        self._changing -= 1
        return call

    def supersede(self) -> None:
        """End the active call, if any, as superseded by a later call: if
        its caller goes on with it, it raises."""
        if self._current is not None:
            self._changing += 1
            self._current.superseded = True
            self.end(self._current)
            self._changing -= 1

    def let_go_in_fork(self, reason: str) -> None:
        """In a forked child, which never uses this channel: mark the active
        call, if any, ended because of ``reason``, touching nothing else. (A
        thread of the parent may have been writing from the output buffer
        at the fork: the view it held is never released in the child, and
        the buffer can be neither trimmed nor resized there.)"""
        call = self._current
        if call is not None:
            call.ended_because = reason
            call.active = False
            self._current = None

    def abandon(self, reason: str) -> None:
        """End the active call, if any, because the channel itself is let go
        (its engine replaced or closed): the call raises ``reason`` if its
        caller goes on with it."""
        if self._current is not None:
            self._changing += 1
            self._current.ended_because = reason
            self.end(self._current)
            self._changing -= 1

    def end(self, call: Call) -> None:
        """End ``call``: forget its lines that never reached the engine, and
        discard the answers it is still owed. Idempotent."""
        if not call.active:
            return
        self._changing += 1
        call.active = False
        if self._current is call:
            self._current = None
        self.forget_unwritten(call)
        for segment in self._segments:
            if segment.call is call:
                segment.call = None
                self.stale_lines += segment.examples_owed(self.outputs_per_line)
        call.owed_lines = 0
        call.answers = []
        self._changing -= 1

    def forget_unwritten(self, call: Call) -> None:
        """Forget the examples at the end of the input that ``call`` queued
        and no byte of which has been written (a partly written example is
        kept whole): they will never reach the engine, so nothing is owed for them."""
        self._changing += 1
        written = self._out_base + self._out_off
        segments = self._segments
        per_line = self.outputs_per_line
        while segments and segments[-1].call is call and segments[-1].end > written:
            segment = segments[-1]
            partly_written = segment.start < written
            if partly_written and segment.whole:
                break  # the engine gets all of it
            if not partly_written:
                cut = segment.start
                dropped = segment.lines
                segments.pop()
            else:
                index = self._out_off
                # The buffer starts on a line boundary, so index 0 is one.
                if index == 0 or self._out[index - 1] == 0x0A:
                    cut = written
                else:
                    cut = self._out_base + self._out.index(b"\n", index) + 1
                dropped = self._out.count(b"\n", cut - self._out_base,
                                          segment.end - self._out_base)
                segment.end = cut
                segment.lines -= dropped
            if segment.kind != CONTROL and per_line:
                segment.owed -= per_line if segment.whole else dropped * per_line
                self.in_flight_lines -= dropped
                call.owed_lines -= dropped
            if segment.kind == EXAMPLES:
                call.queued_lines -= dropped
            del self._out[cut - self._out_base:]
            if partly_written:
                break
        self._pop_settled()
        self._changing -= 1

    def _queue(self, call: Call, kind: str, data: bytes, lines: int, whole: bool = False) -> None:
        if self._after_blank:
            # The blank starts the first line, where vw drops a byte order
            # mark; after the blank it would stay, in the header (a label
            # '\ufeff1' is read as 0): three spaces, as long, stand for it.
            self._after_blank = False
            if data.startswith(_BOM):
                data = _BOM_SPACES + data[len(_BOM):]
        self._changing += 1
        start = self._out_base + len(self._out)
        self._out += data
        per_line = self.outputs_per_line
        owed = 0 if kind == CONTROL else per_line if whole else lines * per_line
        self._segments.append(_Segment(call, kind, lines, owed, start, start + len(data), whole))
        if owed:
            self.in_flight_lines += lines
            call.owed_lines += lines
        self._changing -= 1

    # ------------------------------------------------------------- writing

    @property
    def unwritten_bytes(self) -> int:
        """Bytes queued that the engine has not been given yet."""
        return len(self._out) - self._out_off

    def write_with(self, write: Callable[[memoryview], int]) -> int:
        """Give the unwritten bytes to ``write`` (the driver's non-blocking
        write), and advance by what it took.

        The view passed to ``write`` is released before this returns, even
        when ``write`` raises, so the buffer can always grow or be cleared.

        :param write: takes a view of the bytes, returns how many it wrote
        :returns: the number of bytes written
        """
        if self._out_off >= len(self._out):
            return 0
        self._changing += 1  # from before the write: what it wrote must be counted
        self._writing = True
        with memoryview(self._out) as whole, whole[self._out_off:] as view:
            written = write(view)
        if written:
            self._wrote(written)
        self._writing = False
        self._changing -= 1
        return written

    def _wrote(self, count: int) -> None:
        self._out_off += count
        self.bytes_written += count
        if self._out_off == len(self._out):
            self._out_base += len(self._out)
            del self._out[:]
            self._out_off = self._out_scanned = 0
        elif self._out_off > _COMPACT_BYTES:
            # Cut on a line boundary: the buffer always starts at one.
            cut = self._out.rfind(b"\n", self._out_scanned, self._out_off) + 1
            if cut:
                self._out_base += cut
                del self._out[:cut]
                self._out_off -= cut
                self._out_scanned = 0
            else:
                self._out_scanned = self._out_off
        self._pop_settled()

    def _pop_settled(self) -> None:
        """Forget segments that are written and answered."""
        segments = self._segments
        written = self._out_base + self._out_off
        while segments and not segments[0].owed and segments[0].end <= written:
            segments.popleft()

    # ------------------------------------------------------------- reading

    @property
    def expects_output(self) -> bool:
        """Whether the engine owes any output line."""
        return self.in_flight_lines > 0

    def read_with(self, read: Callable[[Optional[float]], bytes],
                  deadline: Optional[float] = None) -> bytes:
        """Take what ``read(deadline)`` (the driver's non-blocking read)
        returns, as :meth:`receive` does: a read whose bytes an exception
        kept from :meth:`receive` leaves the channel :attr:`torn`.

        :returns: the bytes read (empty: nothing was there)
        """
        self._changing += 1  # from before the read: what it read must be handed out
        data = read(deadline)
        if data:
            self.receive(data)
        self._changing -= 1
        return data

    def receive(self, data: bytes) -> int:
        """Take bytes the engine printed and hand each complete line to its owner.

        :param data: what one read returned (not empty: EOF is the driver's to report)
        :returns: the number of complete lines received
        :raises VowpalWabbitProtocolError: when the engine printed a line nobody
            is owed (the stream can no longer be matched to the calls)
        """
        self._changing += 1
        self.bytes_received += len(data)
        lines = data.split(b"\n")
        rest = lines.pop()
        if lines:
            if self._partial:
                self._partial.append(lines[0])
                lines[0] = b"".join(self._partial)
            self._partial = [rest] if rest else []
            self._hand_out(lines)
        elif rest:
            self._partial.append(rest)
        self._changing -= 1
        return len(lines)

    def _hand_out(self, lines: List[bytes]) -> None:
        segments = self._segments
        per_line = self.outputs_per_line
        count = len(lines)
        index = 0
        while index < count:
            segment = next((s for s in segments if s.owed), None)
            if segment is None:
                raise VowpalWabbitProtocolError(
                    f"the vw engine printed {lines[index][:200]!r} where no answer was expected")
            take = min(segment.owed, count - index)
            owner = segment.call
            owed_before = segment.examples_owed(per_line)
            segment.owed -= take
            if per_line == 1 and not segment.whole:
                answered = take
            else:  # an example counts as answered with its last output line
                answered = owed_before - segment.examples_owed(per_line)
            self.in_flight_lines -= answered
            if owner is None:
                self.stale_lines -= answered
            else:
                owner.owed_lines -= answered
                if segment.kind == PROBE:
                    owner.probe_answers.extend(lines[index:index + take])
                elif owner.keep:
                    if index == 0 and take == count:
                        owner.answers.extend(lines)
                    else:
                        owner.answers.extend(lines[index:index + take])
            index += take
            if not segment.owed:
                self._pop_settled()

    # --------------------------------------------------------------- status

    def describe(self) -> str:
        """A short account of the channel for reprs and logs."""
        return (f"in_flight_lines={self.in_flight_lines} stale_lines={self.stale_lines} "
                f"unwritten_bytes={self.unwritten_bytes}")

    def __repr__(self) -> str:
        return f"<Channel {self.describe()}>"

