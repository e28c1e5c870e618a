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


def by_turn_position(frame: Any, block: int, group: int = 5) -> Any:
    """Mean predictions per contender (rows, in the order they first appear)
    and per place of the call in its contender's turn, places taken ``group``
    at a time (columns). A turn begins with its unmeasured warm-up calls
    (columns ``w1-5``, ``w6-10``, ...; the calls of phase ``warm-up`` in the
    order they were made) and goes on with the measured ones (columns ``1-5``,
    ...: a turn serves the requests ``k * block`` to ``k * block + block - 1``
    of the timeout pass). The engine alone has measured places only."""
    import pandas  # pylint: disable=import-outside-toplevel

    timed = frame[(frame["phase"] == "timeout") & frame["predictions"].notna()]
    if timed.empty:
        return pandas.DataFrame()
    warm = frame[(frame["phase"] == "warm-up") & frame["predictions"].notna()]
    warm_places = warm.groupby(["contender", "round"]).cumcount()
    timed_places = pandas.to_numeric(timed["request"]).astype(int) % block

    warm_calls = int(warm_places.max()) + 1 if len(warm) else 0

    def label(place: int, prefix: str, places: int) -> str:
        first = place // group * group + 1
        last = min(first + group - 1, places)
        return f"{prefix}{first}" if last == first else f"{prefix}{first}-{last}"

    places = pandas.concat([
        warm.assign(place=[label(place, "w", warm_calls) for place in warm_places],
                    order=warm_places // group),
        timed.assign(place=[label(place, "", block) for place in timed_places],
                     order=timed_places // group + 1_000_000)])
    places = places.assign(predictions=pandas.to_numeric(places["predictions"]))
    table = places.pivot_table(index="contender", columns="place", values="predictions",
                               aggfunc="mean")
    columns = places.drop_duplicates("place").sort_values("order")["place"]
    return table.loc[list(timed["contender"].unique()), list(columns)]


def layout_table(table: Any, digits: int, corner: str) -> str:
    """A reference-layout table as a reST simple table.

    :param corner: the header of the statistics' column (reST needs one)
    """
    from .report import simple_table  # pylint: disable=import-outside-toplevel

    rows: List[List[str]] = []
    for statistic, values in table.iterrows():
        rows.append([str(statistic)] + [f"{value:.{digits}f}" for value in values])
    return simple_table([corner] + [str(name) for name in table.columns], rows)
