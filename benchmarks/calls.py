"""Per-call measurements as a pandas DataFrame, and tables in the layout of
subwabbit 2.x's documentation.

Every call a run times is one row of ``calls.csv.gz`` in the output folder
(read it back with ``pandas.read_csv(path)``):

========================  ================================================================
column                    meaning
========================  ================================================================
``phase``                 ``timeout`` (the pass with ``timeout``), ``warm-up`` (the
                          unmeasured calls that begin a contender's turn in that pass),
                          ``throughput`` (no timeout), ``breakdown`` (with
                          ``detailed_metrics``) or ``train``
``contender``             the row's name in the tables (``blocking``, ``engine alone
                          (wheel)``, ``write-only train (vw)``, ...)
``engine``                the engine it ran on (``wheel``, ``vw``; empty for pyvw)
``round``                 the turn or round of the phase
``request``               the request's index in the workload (a batch's, for ``train``)
``items``                 items (lines) the call was given
``predictions``           predictions it returned (for the engine alone: the lines it
                          finishes within the timeout)
``wall_s``                the call's wall time (empty for the engine alone)
``over_deadline_s``       ``wall_s`` minus the timeout: positive when the call was late
``timeout_s``             the timeout of the call (empty: none)
``engine_s``              the engine alone's time on all the request's lines
``cleanup_s`` ...         ``breakdown`` only: the call's ``detailed_metrics`` sums
========================  ================================================================
"""

import os
from typing import Any, Dict, List, Sequence

#: The columns always present, in this order.
COLUMNS = ("phase", "contender", "engine", "round", "request", "items", "predictions", "wall_s",
           "over_deadline_s", "timeout_s", "engine_s")
FILE_NAME = "calls.csv.gz"
#: The statistics of the reference page, in its order.
REFERENCE_STATISTICS = ("mean", "min", "25%", "50%", "75%", "90%", "99%", "max")


def calls_frame(rows: Sequence[Dict[str, Any]]) -> Any:
    """The rows as a DataFrame with :data:`COLUMNS` first."""
    import pandas  # pylint: disable=import-outside-toplevel

    frame = pandas.DataFrame(list(rows))
    for column in COLUMNS:
        if column not in frame:
            frame[column] = None
    extra = [column for column in frame.columns if column not in COLUMNS]
    frame = frame[list(COLUMNS) + extra]
    if len(frame):
        with_timeout = frame["wall_s"].notna() & frame["timeout_s"].notna()
        frame.loc[with_timeout, "over_deadline_s"] = (frame.loc[with_timeout, "wall_s"]
                                                      - frame.loc[with_timeout, "timeout_s"])
    return frame


def save_calls(frame: Any, out_dir: str) -> str:
    """Write ``frame`` to ``out_dir/calls.csv.gz``; return the path."""
    path = os.path.join(out_dir, FILE_NAME)
    frame.to_csv(path, index=False, compression="gzip")
    return path


def reference_layout(frame: Any, column: str, phase: str = "timeout") -> Any:
    """``column`` of ``phase`` summarised per contender as on the reference page:
    one column per contender (in the order they first appear), one row per
    statistic of :data:`REFERENCE_STATISTICS` (pandas' ``describe``, whose
    percentiles interpolate linearly)."""
    import pandas  # pylint: disable=import-outside-toplevel

    chosen = frame[(frame["phase"] == phase) & frame[column].notna()]
    columns = {}
    for contender in chosen["contender"].unique():
        values = pandas.to_numeric(chosen.loc[chosen["contender"] == contender, column])
        columns[contender] = values.describe(percentiles=[0.25, 0.5, 0.75, 0.9, 0.99])
    table = pandas.DataFrame(columns)
    if table.empty:
        return table
    return table.loc[list(REFERENCE_STATISTICS)]


def by_turn_position(frame: Any, block: int) -> Any:
    """Mean predictions of the timeout pass per contender (rows, in the order
    they first appear) and per place of the call in its contender's turn
    (columns 1 to ``block``: a turn serves the requests ``k * block`` to
    ``k * block + block - 1``, after its unmeasured warm-up calls)."""
    import pandas  # pylint: disable=import-outside-toplevel

    timed = frame[(frame["phase"] == "timeout") & frame["predictions"].notna()]
    if timed.empty:
        return pandas.DataFrame()
    timed = timed.assign(place=pandas.to_numeric(timed["request"]).astype(int) % block + 1,
                         predictions=pandas.to_numeric(timed["predictions"]))
    table = timed.pivot_table(index="contender", columns="place", values="predictions",
                              aggfunc="mean")
    return table.loc[list(timed["contender"].unique())]


def layout_table(table: Any, digits: int, corner: str) -> str:
    """A reference-layout table as a reST simple table.

    :param corner: the header of the statistics' column (reST needs one)
    """
    from .report import simple_table  # pylint: disable=import-outside-toplevel

    rows: List[List[str]] = []
    for statistic, values in table.iterrows():
        rows.append([str(statistic)] + [f"{value:.{digits}f}" for value in values])
    return simple_table([corner] + [str(name) for name in table.columns], rows)
