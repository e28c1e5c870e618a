"""The engine arguments of an AllReduce node: the user's, checked, plus the
job's (rendezvous, node number, model file, cache file)."""

from typing import Dict, List, Optional, Sequence

from ..command import VwArgs, normalize_vw_args
from ..engine.program import option_name

#: Options the job sets for every node, and why the user may not.
_JOB_OPTIONS: Dict[str, str] = {
    "--span_server": "the job runs its own rendezvous",
    "--span_server_port": "the job runs its own rendezvous",
    "--unique_id": "each job draws a unique id of its own",
    "--total": "the number of nodes is the number of shards",
    "--node": "each shard's task is given its node number",
    "-f": "node 0's model is written to model_path",
    "--final_regressor": "node 0's model is written to model_path",
    "-c": "each node gets a cache file of its own when --passes is above 1",
    "--cache": "each node gets a cache file of its own when --passes is above 1",
    "--cache_file": "each node gets a cache file of its own when --passes is above 1",
    "-k": "each node's cache file is new",
    "--kill_cache": "each node's cache file is new",
    "--readable_model": "every node would write the same path; write it from the trained "
                        "model (vw -i MODEL -t --readable_model FILE)",
    "--invert_hash": "every node would write the same path; write it from the trained "
                     "model (vw -i MODEL -t --invert_hash FILE)",
    "--save_per_pass": "the nodes' models stay on the workers",
    "-r": "every node would write the same path",
    "--raw_predictions": "every node would write the same path",
    "--output_feature_regularizer_binary": "every node would write the same path (and vw "
                                           "then writes no -f model)",
    "--output_feature_regularizer_text": "every node would write the same path",
    "--extra_metrics": "every node would write the same path",
    "--dump_json_weights_experimental": "every node would write the same path; write it from "
                                        "the trained model",
    "-t": "a job trains: with it the nodes learn nothing and the model is the one they began "
          "with",
    "--testonly": "a job trains: with it the nodes learn nothing and the model is the one "
                  "they began with",
}

#: vw's batch learners, whose model vw 9 saves only with ``--predict_only_model``.
_BATCH_OPTIONS = ("--bfgs", "--conjugate_gradient")


def check_user_args(vw_args: VwArgs) -> List[str]:
    """Check the user's engine arguments for a distributed job.

    :param vw_args: as for :class:`~subwabbit.blocking.VowpalWabbitProcess`
    :returns: the arguments as strings
    :raises ValueError: for an option the job sets itself (the AllReduce
        options, ``-f``, cache files), an option that would make every node
        write the same file, or anything
        :func:`~subwabbit.command.normalize_vw_args` refuses
    :raises TypeError: for a token that is not a string or a number
    """
    tokens = normalize_vw_args(vw_args)
    for token in tokens:
        name = option_name(token)
        if name in _JOB_OPTIONS:
            raise ValueError(f"vw_args must not contain {token!r} for distributed training: "
                             f"{_JOB_OPTIONS[name]}")
    passes(tokens)  # a malformed --passes is refused here, not on every worker
    return tokens


def passes(tokens: Sequence[str]) -> int:
    """The ``--passes`` value of normalised arguments (1 without one).

    :raises ValueError: when the value is not a positive whole number
    """
    value: Optional[str] = None
    for index, token in enumerate(tokens):
        if token == "--passes":
            value = tokens[index + 1] if index + 1 < len(tokens) else ""
        elif token.startswith("--passes="):
            value = token.split("=", 1)[1]
    if value is None:
        return 1
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"--passes must be a positive whole number, got {value!r}")
    return count


def is_batch_learner(tokens: Sequence[str]) -> bool:
    """Whether the arguments choose vw's BFGS (or conjugate gradient) learner."""
    return any(option_name(token) in _BATCH_OPTIONS for token in tokens)


def node_args(tokens: Sequence[str], *, span_server: str, span_server_port: int,
              unique_id: int, total: int, node: int, model_path: str,
              cache_path: Optional[str]) -> List[str]:
    """A node's full engine arguments.

    :param tokens: the user's arguments, from :func:`check_user_args`
    :param span_server: the rendezvous address as the workers reach it
    :param span_server_port: the rendezvous port
    :param unique_id: the job's unique id
    :param total: the number of nodes
    :param node: this node's number
    :param model_path: where this node writes its model (``-f``)
    :param cache_path: this node's cache file (needed, and used, with more than one pass)
    :returns: the arguments to give the node's write-only process
    """
    args = list(tokens) + [
        "--span_server", span_server, "--span_server_port", str(span_server_port),
        "--unique_id", str(unique_id), "--total", str(total), "--node", str(node),
        "-f", model_path,
    ]
    if passes(tokens) > 1:
        if cache_path is None:
            raise ValueError("more than one pass needs a cache file")
        args += ["--cache_file", cache_path, "--kill_cache"]
    if is_batch_learner(tokens) and "--predict_only_model" not in tokens:
        # vw 9 refuses to save a BFGS model with the state that resumes training.
        args.append("--predict_only_model")
    return args
