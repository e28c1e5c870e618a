"""Compare settings of the nonblocking class side by side on the benchmark workload.

Run: ``python -m benchmarks.nonblocking_settings [--requests N] [SETTING ...]``
where each SETTING is ``max_pending_lines=40,write_cutoff_s=0.0005`` (any
keyword arguments of :class:`~subwabbit.nonblocking.VowpalWabbitNonBlockingProcess`
that take numbers), or ``blocking`` for the blocking class with its defaults,
or ``blocking:SETTING`` for the blocking class with settings
(``blocking:max_lateness_s=0.001``). ``driver=loop`` or ``driver=vw`` in a
setting starts that setting's engine with ``SUBWABBIT_ENGINE_DRIVER`` set so
(the wheel's engine: its one-thread loop or vw's own two threads), so that
``python -m benchmarks.nonblocking_settings driver=loop driver=vw
blocking:driver=loop blocking:driver=vw`` compares the drivers call by call.

Every request is served by each setting in turn, so that a change in the
machine's speed hits all of them alike. Prints the mean predictions per call
and wall-time quantiles under the timeout.
"""

import argparse
import os
import statistics
import tempfile
from typing import Any, Dict, List

from subwabbit import VowpalWabbitNonBlockingProcess, VowpalWabbitProcess

from .drivers import start as start_with_driver
from .report import nearest_rank
from .turns import take_turns, train_model
from .workload import RecommenderFormatter, Workload, prediction_args

#: The 2.x defaults, the defaults before the engine's one-thread loop, the
#: current defaults and the blocking class.
DEFAULT_SETTINGS = ["batch_size=20,max_pending_lines=20,write_cutoff_s=0.001",
                    "batch_size=20,max_pending_lines=40", "", "blocking"]


def parse_setting(text: str) -> Dict[str, Any]:
    """``a=1,b=0.5`` as keyword arguments (``driver`` keeps its text)."""
    options: Dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if name == "driver":
            options[name] = value
        else:
            options[name] = int(value) if value.isdigit() else float(value)
    return options


def start(formatter: Any, args: List[str], setting: str) -> Any:
    """The process a setting names, its engine started with the driver it asks for."""
    blocking = setting == "blocking" or setting.startswith("blocking:")
    options = parse_setting(setting[9:] if blocking else setting)
    driver = options.pop("driver", None)
    cls = VowpalWabbitProcess if blocking else VowpalWabbitNonBlockingProcess
    return start_with_driver(cls, formatter, args, driver, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="*", default=DEFAULT_SETTINGS,
                        help="settings to compare ('' is the class defaults)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=0.010)
    parser.add_argument("--gap", type=float, default=0.0,
                        help="seconds of idleness before each call, as between the requests "
                             "of a service with little traffic (default 0)")
    options = parser.parse_args()
    workload = Workload(options.requests, options.items)
    formatter = RecommenderFormatter()
    with tempfile.TemporaryDirectory() as directory:
        model = os.path.join(directory, "model.vw")
        train_model(workload, model)
        processes = [start(formatter, prediction_args(model), setting)
                     for setting in options.settings]
        counts, walls = take_turns(processes, workload, options.timeout, options.gap)
    print(f"{options.requests} requests x {options.items} items, timeout {options.timeout * 1000:g} ms"
          + (f", {options.gap * 1000:g} ms idle before each call" if options.gap else ""))
    for setting, count, wall in zip(options.settings, counts, walls):
        wall.sort()

        def quantile(q: float, ordered: List[float] = wall) -> float:
            return nearest_rank(ordered, q) * 1000

        print(f"{setting or 'nonblocking defaults':>45}: predictions mean {statistics.mean(count):7.1f}"
              f"  wall ms p50 {quantile(0.5):.2f} p99 {quantile(0.99):.2f}"
              f" p99.9 {quantile(0.999):.2f} max {wall[-1] * 1000:.2f}"
              f"  >+1 ms late {sum(1 for w in wall if w > options.timeout + 0.001)}")


if __name__ == "__main__":
    main()
