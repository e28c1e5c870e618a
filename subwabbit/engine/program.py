"""A ``vw``-compatible command backed by the engine in the ``vowpalwabbit`` wheel.

``pip install vowpalwabbit`` ships the engine as a Python extension but no
``vw`` executable. This module stands in for one::

    python -m subwabbit.engine -p stdout --quiet -i model.vw < examples.txt

It accepts the same arguments, reads examples from stdin unless ``-d`` names
a file, and writes predictions as the engine produces them. Errors in the
arguments are printed on stderr as one line and end the process with exit
code 1, like the executable.

Two drivers feed the engine:

* **vw's own driver** (a parser thread and a learner thread), the one the
  ``vw`` executable runs, for every engine that reads stdin by itself: the
  engines of the single-process clients, write-only training, audit mode,
  data files, every model kind. Behind subwabbit's pipes its second thread
  parses the next lines while the first learns, which returned about a fifth
  more predictions within 10 ms than the loop below
  (``python -m benchmarks.nonblocking_settings driver=loop driver=vw
  blocking:driver=loop blocking:driver=vw``), for more CPU per line.
* **The one-thread loop**, for the engines of a pool forked from one
  process that loaded the model (see :func:`serve_forks`): vw's driver
  cannot be forked once started, and when a pool's engines fill every core
  a second thread per engine has no core to run on. It reads what stdin
  holds, hands the complete lines to the engine's parser in one call, has
  the engine learn from or predict each example, and writes their
  predictions together (at least every 128 lines and about every 2 ms
  of its CPU). It prints exactly what vw
  prints: the same numbers and tags, nothing for empty lines and save
  commands, and it saves the same models. It serves single-line examples
  with plain scalar predictions; a pool of any other model loads a copy per
  engine and runs vw's driver.

``SUBWABBIT_ENGINE_DRIVER`` chooses one always: ``vw`` for vw's own driver
(pools then load a copy of the model per engine), ``loop`` for the loop
wherever it can serve the model.

One difference remains: a save command in a shape other than
``[label] [']save...|`` with nothing after the ``|`` (say ``save_x|a:0``,
whose only feature vw drops) is counted in the engine's example statistics
by the loop and not by vw's driver. subwabbit never sends such lines.

This file imports nothing from subwabbit so that it can run as a plain script.
"""

import errno
import math
import os
import re
import signal
import stat
import sys
import time
from typing import Any, Iterable, List, NoReturn, Optional, Sequence, Tuple

#: Environment variable that chooses the driver: ``vw`` for vw's own driver
#: always, ``loop`` for the one-thread loop wherever it serves the model;
#: unset (or anything else), the loop for a fork server's engines and vw's
#: driver otherwise.
DRIVER_ENV_VAR = "SUBWABBIT_ENGINE_DRIVER"

#: the clock of the answer groups: this thread's CPU time
_clock = time.thread_time

_DATA_OPTIONS = ("-d", "--data")
_PREDICTION_OPTIONS = ("-p", "--predictions")
_FINAL_MODEL_OPTIONS = ("-f", "--final_regressor")
#: The options that make an engine predict without learning.
TEST_ONLY_OPTIONS = ("-t", "--testonly")
_RAW_PREDICTION_OPTIONS = ("-r", "--raw_predictions")
#: Paths through which vw writes to its stdout.
_STDOUT_PATHS = frozenset({"stdout", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})

#: Options whose input handling only vw's own driver has (files, caches,
#: passes, example limits, other input formats, servers) or that write to
#: stdout besides the predictions (audit).
_VW_DRIVER_OPTIONS = frozenset({
    "-d", "--data", "-c", "--cache", "-k", "--cache_file", "--kill_cache", "--compressed",
    "--passes", "--examples", "--early_terminate", "--holdout_off", "--holdout_period",
    "--holdout_after", "--save_per_pass", "--json", "--dsjson", "--flatbuffer", "--csv",
    "--daemon", "--port", "--foreground", "--num_children", "--pid_file", "--port_file",
    "--span_server", "--unique_id", "--total", "--node", "-a", "--audit", "--onethread",
    "--no_stdin",
    # Reductions outside _SCALAR_LEARNERS: known from the arguments, they
    # spare loading the model once only to find that out.
    "--oaa", "--ect", "--csoaa", "--wap", "--log_multi", "--recall_tree", "--plt", "--top_k",
    "--multilabel_oaa", "--probabilities", "--cb", "--cb_explore", "--cbify", "--lda",
    "--stage_poly", "--bootstrap", "--boosting", "--confidence", "--active", "--marginal",
    # Reductions with multi-line examples, which the loop does not read.
    "--cb_adf", "--cb_explore_adf", "--ccb_explore_adf", "--slates", "--csoaa_ldf",
    "--wap_ldf", "--explore_eval",
})

#: Learners (as listed by ``get_enabled_learners``) whose predictions vw
#: prints as a plain scalar and an optional tag. Each is checked against vw's
#: own driver in ``tests/test_engine_loop.py``.
_SCALAR_LEARNERS = frozenset({
    "gd", "scorer-identity", "scorer-logistic", "scorer-glf1", "scorer-poisson", "count_label",
    "binary", "nn", "lrq", "lrqfa", "interact", "autolink", "classweight-scalar",
    "ftrl-Proximal-FTRL", "ftrl-Coin Betting", "ftrl-PiSTOL", "freegrad",
})

#: Learners that learn by the parity of a running count of the lines vw
#: reads, empty lines and save commands included (vw hands each an example
#: from its pool): the loop hands those lines to no parser, and after an odd
#: number of them ``--lrq`` learned another model than vw's driver (found by
#: a review). They predict the same: the loop serves them with ``-t``.
_COUNTING_LEARNERS = frozenset({"lrq", "lrqfa"})

_READ_BYTES = 1 << 16
#: The most predictions the loop holds back: it writes them at least this
#: often, so that a client waiting for the first lines of a long read gets
#: them before the engine has worked through the rest. Each write wakes the
#: client: 128 rather than 64 cost a pool's client and engines 5-8% less CPU
#: per prediction and returned 6-10% more predictions within 10 ms on 2 vCPUs
#: (a pool deals 100 lines at a time, up to 200 in flight per engine).
_ANSWER_LINES = 128
#: ... and at least about this often (seconds of the engine's CPU): for a
#: model slow per line the loop writes in smaller groups, sized by the CPU
#: time the last group took per line (CPU time, so that a spell without a
#: core does not shrink them: groups sized by wall time, 1 ms, returned
#: 0.96x the predictions of a pool's 10 ms calls on 2 vCPUs). Groups of 128
#: lines of a model at 300 µs a line came 40 ms apart, and a pool's 10 ms
#: calls returned nothing.
_ANSWER_S = 0.002
#: the group of the loop's first lines, before any is timed
_FIRST_ANSWER_LINES = 8
_BOM = b"\xef\xbb\xbf"
#: A featureless example tagged ``save...`` (the tag touches the ``|``; a
#: label may come first): vw's command to save the model, ``save_PATH|``
#: saves to PATH.
_SAVE_COMMAND = re.compile(rb"(?:[^|]*[ \t])?'?(save[^ \t|]*)\|")


def option_name(arg: str) -> Optional[str]:
    """The option an argument token names (``-p`` for ``-pfile``), or ``None``."""
    if arg.startswith("--"):
        return arg.split("=", 1)[0]
    if arg.startswith("-") and len(arg) >= 2 and not arg[1].isdigit() and arg[1] != ".":
        return arg[:2]
    return None


def _option_values(args: List[str], names: Iterable[str]) -> List[Tuple[int, int, str]]:
    """Where the options ``names`` are and their values: ``(first token,
    token after the value, value)`` for each occurrence."""
    found = []
    names = tuple(names)
    for index, arg in enumerate(args):
        name = option_name(arg)
        if name not in names:
            continue
        if "=" in arg and arg.startswith("--"):
            found.append((index, index + 1, arg.split("=", 1)[1]))
        elif len(arg) > 2 and not arg.startswith("--"):
            found.append((index, index + 1, arg[2:]))
        elif index + 1 < len(args):
            found.append((index, index + 2, args[index + 1]))
        else:
            found.append((index, index + 1, ""))
    return found


def chosen_driver() -> str:
    """The driver :data:`DRIVER_ENV_VAR` asks for: ``"vw"``, ``"loop"`` or
    ``""`` (the default)."""
    chosen = os.environ.get(DRIVER_ENV_VAR, "").strip().lower()
    return chosen if chosen in ("vw", "loop") else ""


def _loop_arguments(args: List[str]) -> Optional[Tuple[List[str], bytes]]:
    """Whether the one-thread loop can serve these arguments.

    :returns: ``None`` when vw's own driver must run, else the arguments for
        the workspace (``-p stdout`` taken out) and the ``-f`` model path
        (for ``save|``)
    """
    if chosen_driver() == "vw":
        return None
    names = {option_name(arg) for arg in args}
    if names & _VW_DRIVER_OPTIONS:
        return None
    predictions = _option_values(args, _PREDICTION_OPTIONS)
    if len(predictions) != 1 or predictions[0][2] != "stdout":
        # Without predictions (write-only training) nobody waits for an answer,
        # and vw's parser and learner threads learn faster than one thread.
        return None
    if "--quiet" not in args and not (
            "--driver_output_off" in args
            and [value for _, _, value in _option_values(args, ["--log_output"])] == ["stderr"]):
        return None  # logs or progress on stdout would interleave with the predictions
    if any(value in _STDOUT_PATHS for _, _, value in _option_values(args, _RAW_PREDICTION_OPTIONS)):
        # vw writes each raw prediction as its example finishes: before the
        # group of predictions that the loop writes after it
        return None
    start, end, _ = predictions[0]
    rest = args[:start] + args[end:]
    final = _option_values(rest, _FINAL_MODEL_OPTIONS)
    return rest, os.fsencode(final[-1][2]) if final else b""


def _serves(workspace: Any, pylibvw: Any, learns: bool = False) -> bool:
    """Whether the one-thread loop covers this workspace: single-line examples,
    plain scalar predictions, and only learners known to print them as such
    and to learn from the loop what they learn from vw's driver (not, say,
    ``--stage_poly``, which counts examples by a number that only vw's
    driver sets; nor, when it learns, ``--lrq`` and ``--lrqfa``: see
    :data:`_COUNTING_LEARNERS`).

    :param learns: whether the workspace learns (no ``-t``)
    """
    learners = set(workspace.get_enabled_learners())
    return (not workspace._is_multiline()  # pylint: disable=protected-access
            and workspace._get_prediction_type() == pylibvw.vw.pSCALAR  # pylint: disable=protected-access
            and learners <= _SCALAR_LEARNERS
            and not (learns and learners & _COUNTING_LEARNERS))


def scalar_text(value: float) -> str:
    """A scalar prediction as vw prints it: whole numbers (and infinities)
    without decimals, others with six (C++ ``std::fixed``), and ``-nan`` for
    a NaN whose sign bit is set, as C prints it."""
    if value.is_integer():
        return "%.0f" % value
    if value == value:  # pylint: disable=comparison-with-itself
        return "%.6f" % value
    return "-nan" if math.copysign(1.0, value) < 0 else "nan"


def scalars_text(values: List[float]) -> str:
    """:func:`scalar_text` of each value, one per line (no newline after
    the last)."""
    text = ("%.6f\n" * len(values)) % tuple(values)
    # "n" is in "nan" and "inf" only; whole numbers are printed without decimals.
    if "n" in text or any(map(float.is_integer, values)):
        return "\n".join(map(scalar_text, values))
    return text[:-1]


def _header_tag(line: bytes) -> Optional[bytes]:
    """The tag vw reads from ``line`` (without its newline), or ``None``:
    as vw's text parser, the header (before the first ``|``) loses
    everything up to its first tab, is split on spaces only, and its last
    word is the tag if it touches the ``|`` (or the end of the line) or
    starts with a quote, which is then dropped."""
    bar = line.find(b"|")
    header = line if bar < 0 else line[:bar]
    if not header:
        return None
    tab = header.find(b"\t")
    if tab >= 0:
        header = header[tab + 1:]
    words = [word for word in header.split(b" ") if word]
    if not words:
        return None
    last = words[-1]
    if not (header.endswith(last) or last.startswith(b"'")):
        return None
    return last[1:] if last.startswith(b"'") else last


def _raw_tag(text: bytes, index: int) -> str:
    """The tag of the ``index``-th example line of ``text``, from its bytes,
    for tags that are not UTF-8 (which the bindings cannot return)."""
    line = [line for line in text.split(b"\n") if line][index]
    return (_header_tag(line) or b"").decode("utf-8", "surrogateescape")


#: A line (not the first) that does not start with ``|``.
_TAGGABLE_LINE = re.compile(rb"\n[^|]")


def _untagged(text: bytes) -> bool:
    """Whether every line of ``text`` starts with ``|`` (so that none has a
    label or a tag): one scan that stops at the first other line. (Counting
    the newlines and the ``\n|`` pairs took twice as long, a twelfth of the
    loop's time on predict traffic.)

    :param text: lines, the last with or without its newline
    """
    return text[:1] == b"|" and _TAGGABLE_LINE.search(text) is None


def _vw_lines(text: bytes) -> bytes:
    """``text`` as vw's line reader sees it: a UTF-8 byte order mark at the
    start of a line and a carriage return at its end dropped. (Lines that are
    then empty get no answer; the parser leaves them out.)"""
    if b"\r" not in text and b"\xef" not in text:
        return text
    lines = text.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(_BOM):
            line = line[3:]
        if line.endswith(b"\r"):
            line = line[:-1]
        lines[index] = line
    return b"\n".join(lines)


class OneThreadLoop:
    """The one-thread driver: stdin to the engine to stdout, a read at a time.

    :param workspace: a ``pylibvw.vw`` created without ``-p``
    :param pylibvw: the bindings module
    :param final_model: the ``-f`` path, where ``save|`` saves
    """

    def __init__(self, workspace: Any, pylibvw: Any, final_model: bytes) -> None:
        self.workspace = workspace
        self.final_model = final_model
        self._parse = workspace._parse  # pylint: disable=protected-access
        self._learn = pylibvw.vw.learn
        self._finish = pylibvw.vw._finish_example  # pylint: disable=protected-access
        self._prediction = pylibvw.example.get_simplelabel_prediction
        self._tag = pylibvw.example.get_tag
        self._namespaces = pylibvw.example.num_namespaces
        #: predictions written together (see _ANSWER_S)
        self.answer_lines = _FIRST_ANSWER_LINES

    def run(self) -> None:
        """Serve stdin until it ends."""
        # the reads since the last newline, joined once the line ends (adding
        # each to the bytes before it copied a long line again at every read)
        read = os.read
        pending: List[bytes] = []
        while True:
            chunk = read(0, _READ_BYTES)
            if not chunk:
                break
            end = chunk.rfind(b"\n") + 1
            if not end:
                pending.append(chunk)
                continue
            self.serve(b"".join(pending + [chunk[:end]]) if pending else chunk[:end])
            pending = [chunk[end:]] if end < len(chunk) else []
        if pending:  # a last line without its newline is an example too
            self.serve(b"".join(pending) + b"\n")
        # vw's end of input: its own driver, given no input (the bindings
        # add --no_stdin), runs the end of pass and the end of examples that
        # every reduction expects after the last example of a file.
        self.workspace.run_parser()

    def serve(self, text: bytes) -> None:
        """Learn from or predict every line of ``text`` (newline-terminated)
        and write their predictions."""
        text = _vw_lines(text)
        output: List[str] = []
        try:
            # Lines that all start with "|" (predict's) have no label and no
            # tag, hence no save command: no scan for one.
            tagged = not _untagged(text)
            if not tagged or b"save" not in text:
                self._serve_lines(text, output, tagged)
            else:
                self._serve_with_saves(text, output)
        finally:  # what was done before an error is printed, as vw would have
            self._flush(output)

    def _serve_with_saves(self, text: bytes, output: List[str]) -> None:
        """Serve ``text``, carrying out the save commands in it between the
        lines around them, without parsing them: vw's own driver counts them
        in no statistics either."""
        segment: List[bytes] = []
        for line in text.split(b"\n"):
            command = _SAVE_COMMAND.fullmatch(line)
            tag = _header_tag(line) if command is not None else None
            if tag is None or not tag.startswith(b"save"):
                segment.append(line)
                continue
            self._serve_lines(b"\n".join(segment), output, True)
            segment = []
            self._save(tag)
        self._serve_lines(b"\n".join(segment), output, True)

    def _serve_lines(self, text: bytes, output: List[str], tagged: bool) -> None:
        """Serve lines without save commands of the ``save...|`` shape.

        :param tagged: whether a line may have a label or a tag; ``False``
            spares asking the engine for each example's tag (a sixteenth of
            the loop)
        """
        if text[:1] in (b"", b"\n") and not text.strip(b"\n"):
            return  # no example (the parser would hand back an empty one)
        if not tagged:
            self._serve_untagged(self._parse(text), output)
            return
        tag = ""
        workspace, learn, finish, prediction, tag_of, append = (
            self.workspace, self._learn, self._finish, self._prediction, self._tag, output.append)
        began = _clock()
        for index, example in enumerate(self._parse(text)):
            try:
                tag = tag_of(example)
            except UnicodeDecodeError:
                tag = _raw_tag(text, index)
            if tag and tag.startswith("save") and self._namespaces(example) <= 1:
                # A save command in another shape (features that vw drops, say):
                # here it is counted in the engine's statistics, which vw's
                # own driver does not do.
                self._save(tag.encode("utf-8", "surrogateescape"))
                finish(workspace, example)
                continue
            learn(workspace, example)
            value = prediction(example)
            finish(workspace, example)
            # scalar_text(), inlined for the common case: a tenth of the loop's time
            number = "%.0f" % value if value.is_integer() else "%.6f" % value
            if number == "nan":
                number = scalar_text(value)
            append(f"{number} {tag}" if tag else number)
            if len(output) >= self.answer_lines:
                began = self._flush_group(output, began)

    def _serve_untagged(self, examples: List[Any], output: List[str]) -> None:
        """Predict examples without tags, writing their predictions in groups
        (see :meth:`_flush_group`): each group's numbers are formatted in one
        operation (a tenth less time per line than one at a time)."""
        workspace, learn, finish, prediction = (
            self.workspace, self._learn, self._finish, self._prediction)
        start, began = 0, _clock()
        while start < len(examples):
            values: List[float] = []
            keep = values.append
            end = start + self.answer_lines
            try:
                for example in examples[start:end]:
                    learn(workspace, example)
                    keep(prediction(example))
                    finish(workspace, example)
            finally:  # what was predicted before an error is printed, as vw would
                if values:
                    output.append(scalars_text(values))
            began = self._flush_group(output, began, len(values))
            start = end

    def _flush_group(self, output: List[str], began: float, lines: int = 0) -> float:
        """Write a group of predictions (``lines`` of them, or one per entry
        of ``output``), and size the next group so that it takes about
        :data:`_ANSWER_S` at this group's time per line (:data:`_ANSWER_LINES`
        at most).

        :returns: the time the next group begins
        """
        lines = lines or len(output)
        self._flush(output)
        now = _clock()
        if lines:
            per_line = (now - began) / lines
            fit = int(_ANSWER_S / per_line) if per_line > 0 else _ANSWER_LINES
            self.answer_lines = max(1, min(_ANSWER_LINES, fit))
        return now

    def _save(self, tag: bytes) -> None:
        """vw's save command: the tag ``save_PATH`` saves to PATH, other
        ``save...`` tags to the ``-f`` model (if any)."""
        path = tag[5:] if len(tag) >= 6 and tag[4:5] == b"_" else self.final_model
        if path:
            self.workspace.save(path)

    @staticmethod
    def _flush(output: List[str]) -> None:
        """Write the predictions in ``output`` and empty it."""
        if not output:
            return
        view = memoryview(("\n".join(output) + "\n").encode("utf-8", "surrogateescape"))
        output.clear()
        while view:
            try:
                view = view[os.write(1, view):]
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise
                return  # no stdout (closed): vw goes on, its predictions dropped


#: What the bindings raise for vw's errors: ``RuntimeError``, or, for a
#: message that is not UTF-8 (a path's bytes), the ``UnicodeDecodeError`` of
#: decoding it, which holds the message.
_VW_ERRORS = (RuntimeError, UnicodeDecodeError)


def _report_error(exc: BaseException) -> None:
    """Print what the engine said in ``exc`` on stderr, as vw prints it."""
    if isinstance(exc, UnicodeDecodeError) and isinstance(exc.object, bytes):
        text = exc.object.decode("utf-8", "backslashreplace")
    else:
        text = str(exc)
    sys.stderr.write(f"vw: {text}\n")
    sys.stderr.flush()


def learns(args: Sequence[str]) -> bool:
    """Whether an engine started with ``args`` learns from labelled lines
    (no ``-t``/``--testonly``)."""
    return not any(option_name(arg) in TEST_ONLY_OPTIONS for arg in args)


def _reads_data_file(args: List[str]) -> bool:
    return any(option_name(arg) in _DATA_OPTIONS for arg in args)


def _workspace(pylibvw: Any, args: List[str]) -> Any:
    """``pylibvw.vw(args)``, refused as the vw executable refuses it when the
    last argument is an option left without its value: the bindings append
    ``--no_stdin`` to the arguments, which the option would take as its
    value (``-f`` last saved the model to a file named ``--no_stdin``).

    :raises RuntimeError: for such arguments, or any the engine refuses
    """
    try:
        workspace = pylibvw.vw(args)
    except RuntimeError as exc:
        # An option that opens its value at once (-i) fails on the appended
        # token before any check below: "can't open: --no_stdin".
        if args and option_name(args[-1]) is not None and "--no_stdin" in str(exc):
            raise RuntimeError(f"Expected value for {args[-1]} but found nothing") from exc
        raise
    for groups in workspace.get_options(lambda *fields: fields, True).values():
        for _, options in groups:
            # (name, help, short name, keep, necessary, allow override, value, ...)
            if any(option[0] == "no_stdin" and option[6] is not True for option in options):
                del workspace  # without finish(), which would save the model
                raise RuntimeError(f"Expected value for {args[-1]} but found nothing")
    return workspace


def _start_loop(pylibvw: Any, args: List[str]) -> Optional[OneThreadLoop]:
    """The one-thread loop for ``args``, or ``None`` when vw's own driver must run."""
    chosen = _loop_arguments(args)
    if chosen is None:
        return None
    loop_args, final_model = chosen
    workspace = _workspace(pylibvw, loop_args)
    if not _serves(workspace, pylibvw, learns(args)):
        del workspace  # frees the model; vw's driver loads it again
        return None
    return OneThreadLoop(workspace, pylibvw, final_model)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the engine with ``argv`` (default: ``sys.argv[1:]``).

    The one-thread loop and the fork server end the process themselves once
    done (:func:`exit_now`); vw's own driver and errors return.

    :returns: the process exit code
    """
    args = list(sys.argv[1:] if argv is None else argv)
    # Behave like a C program: die quietly when the reader goes away or on ^C.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # The client starts it in a process group of its own. When its parent
    # ends (a fork server closed after a reload), the group is orphaned, and
    # a member that is stopped then (a debugger, SIGSTOP) gets SIGHUP from the
    # kernel: it must not die of it. It ends when its input closes.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        import pylibvw  # pylint: disable=import-outside-toplevel,import-error
    except ImportError as exc:
        sys.stderr.write(f"subwabbit.engine: cannot import pylibvw from the vowpalwabbit package: {exc}\n")
        return 1
    fork_server_fd = os.environ.pop(FORK_SERVER_ENV_VAR, None)
    try:
        if fork_server_fd is not None:
            exit_now(serve_forks(_start_loop(pylibvw, args), int(fork_server_fd)))
        loop = _start_loop(pylibvw, args) if chosen_driver() == "loop" else None
        if loop is not None:
            loop.run()
            loop.workspace.finish()
            exit_now(0)
        return _run_vw_driver(pylibvw, args)
    except _VW_ERRORS as exc:
        _report_error(exc)
        return 1


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once Python's own output is flushed,
    without the interpreter's teardown: what the one-thread loop, its forked
    engines and the fork server had to write is written by then
    (predictions with ``os.write``, models saved by ``finish``). A pool's
    old engines close while its new ones serve: ``python -m
    benchmarks.reload --closes 6`` gave 11 to 15 ms for closing a pool of 2
    and 9 to 14 ms of its processes' CPU on their way out, against 21 to 40
    and 20 to 30 ms with the teardown (2 vCPUs). vw's own driver is not
    ended this way: it may still hold output in the C library's buffers,
    which only a normal exit writes."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # its descriptor was closed when Python started
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or the reader went away
            pass
    os._exit(code)  # pylint: disable=protected-access


#: Environment variable naming the descriptor of a ``SOCK_SEQPACKET`` Unix
#: socket: the engine then loads the model once and becomes a *fork server*
#: (see :func:`serve_forks`) instead of reading stdin.
FORK_SERVER_ENV_VAR = "SUBWABBIT_ENGINE_FORK_SERVER"


def serve_forks(loop: Optional[OneThreadLoop], sock_fd: int) -> int:
    """Serve engines that share this process's model: the fork server.

    The client sends ``fork`` with three descriptors (the new engine's stdin,
    stdout and stderr); the server forks, and the child serves those pipes
    with the one-thread loop over the model loaded here, whose pages the
    children share until one of them writes to them (a model loaded with
    ``-t`` is only read). The server answers ``pid N``, reports ``exit N
    CODE`` when a child ends, and ends itself when its stdin or the socket
    closes (or is reset: the client closed it before reading every status).
    It answers ``nofork`` (then ends) when the model needs vw's own driver,
    which cannot be forked once started.
    """
    import selectors  # pylint: disable=import-outside-toplevel
    import socket  # pylint: disable=import-outside-toplevel
    sock = socket.socket(fileno=sock_fd)
    if loop is None:
        sock.send(b"nofork")
        return 0
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    sock.send(b"ready")
    children = set()
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                try:
                    message, fds, _, _ = socket.recv_fds(sock, 64, 3)
                except OSError:  # reset: the client closed with statuses unread
                    return 0
                if not message:
                    return 0
                if message == b"fork" and len(fds) == 3:
                    pid = os.fork()
                    if pid == 0:
                        selector.close()
                        sock.close()
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        os.close(wake_r)
                        os.close(wake_w)
                        exit_now(_serve_forked(loop, fds))
                    children.add(pid)
                    sock.send(b"pid %d" % pid)
                for fd in fds:
                    os.close(fd)
            elif key.fileobj == 0:
                if not os.read(0, 4096):
                    return 0
            else:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            try:
                sock.send(b"exit %d %d" % (pid, os.waitstatus_to_exitcode(status)))
            except OSError:
                return 0


def _serve_forked(loop: OneThreadLoop, fds: List[int]) -> int:
    """In a forked child of the fork server: serve the given pipes.

    :returns: the exit code (the caller ends the process: :func:`exit_now`)
    """
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    try:
        loop.run()
        loop.workspace.finish()
    except BaseException as exc:  # pylint: disable=broad-except
        _report_error(exc)
        return 1
    return 0


def _run_vw_driver(pylibvw: Any, args: List[str]) -> int:
    """vw's own driver: a parser thread and a learner thread."""
    from_stdin = not _reads_data_file(args)
    if from_stdin:  # first, so that an option without its value last cannot take it
        args = ["--data", "/dev/stdin"] + args
    workspace = _workspace(pylibvw, args)
    try:
        workspace.run_parser()
    except _VW_ERRORS as exc:
        # The learner thread's error (a save command that cannot write its
        # file, say) leaves vw's parser thread running: the workspace's
        # teardown then ended the process with std::terminate (SIGABRT,
        # "terminate called without an active exception"), where the vw
        # executable exits with code 1. End it here, the workspace untouched.
        _report_error(exc)
        _flush_c_streams()
        exit_now(1)
    if from_stdin and not _input_exhausted():
        # The wheel's driver logs a fatal example error (a malformed
        # multiclass label, say) and returns as if the input had ended;
        # the vw executable exits with code 1 instead. So do we, without
        # writing a -f model.
        sys.stderr.write("vw: stopped before the end of its input after an error\n")
        sys.stderr.flush()
        return 1
    workspace.finish()
    return 0


def _flush_c_streams() -> None:
    """Write what the C library's buffers hold (``fflush(NULL)``), for an
    end without the interpreter's teardown (:func:`exit_now`)."""
    try:
        import ctypes  # pylint: disable=import-outside-toplevel
        ctypes.CDLL(None).fflush(None)
    except (ImportError, OSError, AttributeError):
        pass


def _input_exhausted() -> bool:
    """Whether a stdin pipe is at end of file (the writer closed it and all was read).

    Only a pipe can tell: the engine reads ``/dev/stdin`` through a descriptor
    of its own, which for a regular file has its own offset.
    """
    try:
        if not stat.S_ISFIFO(os.fstat(0).st_mode):
            return True
        os.set_blocking(0, False)
        return os.read(0, 1) == b""
    except BlockingIOError:  # the writer is still there: the parser gave up early
        return False
    except OSError:  # nothing we can query; trust the driver
        return True


if __name__ == "__main__":
    sys.exit(main())
