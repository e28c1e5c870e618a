"""Kinds of models: what the engine prints for an example, and what it reads as a label.

A vw model's *kind* follows from its reductions. Each kind is one object
that every client (and a pool of engines) uses the same way:

* how an example is laid out: one line per item, or (:attr:`PredictionKind.multi_line`)
  one example per call made of a ``shared`` line, one line per item and an
  empty line;
* how many output lines the engine prints per example
  (:attr:`PredictionKind.answer_lines`), which the
  :class:`~subwabbit.core.channel.Channel` counts;
* how those lines become the typed predictions ``predict`` gives, in item
  order (:meth:`PredictionKind.parse_answers`, :meth:`PredictionKind.parse_example`);
* how a training label is checked and written (:meth:`PredictionKind.check_labels`).

:func:`choose_kind` picks the kind from the engine arguments, from the
options saved in a model file loaded with ``-i`` (which the arguments then
do not show; :mod:`subwabbit.model_file` reads them), or from an explicit
``prediction_type``. Output formats were measured on vw 9.x (both vw's own
driver and the wheel's engine):

============================ ======================================= ==============
reduction                    one example's output                    kind
============================ ======================================= ==============
(none), ``--binary``, ...    ``0.703793``                            ``scalar``
``--oaa 3`` (``--ect``, ...) ``2``                                   ``multiclass``
``--csoaa 3``                ``2``                                   ``cost_sensitive``
``--oaa 3 --probabilities``  ``1:0.49 2:0.22 3:0.28``                ``class_probabilities``
``--multilabel_oaa 3``       ``0,2`` and a space (a space for none)  ``multilabel``
``--plt 10 --top_k 2``       ``4,0`` and a space                     ``multilabel``
``--cb 3``                   ``1`` then an empty line (0-based)      ``cb``
``--cb_explore 3``           ``1:0.97,0:0.02,2:0.01`` then empty     ``cb_explore``
``--cb_adf --rank_all``      ``1:0.38,0:0.57`` then empty            ``cb_adf``
``--cb_explore_adf``         ``1:0.975,0:0.025`` then empty          ``cb_explore_adf``
============================ ======================================= ==============

A tag on the example (the shared line's, for the multi-line kinds) is
printed after a space, and ignored here.

The kinds are defined in :mod:`~subwabbit.core.kind_base` (the base and the
scalar kind), ``class_kinds`` (classifiers) and ``bandit_kinds`` (contextual
bandits), the checks of label numbers in :mod:`~subwabbit.core.label_checks`;
this module chooses a kind, and says which options subwabbit cannot serve.
Nothing in these modules does I/O.
"""

from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..engine.program import learns, option_name
from .bandit_kinds import AdfKind, CbExploreKind, CbKind, ExploreAdfKind, parse_action_values
from .class_kinds import (ClassRawScoresKind, ClassScoresKind, CostSensitiveKind,
                          LabelStringsKind, MulticlassKind, MultilabelKind, _Classes)
from .kind_base import (CB, CB_ADF, CB_EXPLORE, CB_EXPLORE_ADF, CLASS_PROBABILITIES,
                        CLASS_SCORES, COST_SENSITIVE, KINDS, LABEL_STRINGS, MULTICLASS,
                        MULTILABEL, SCALAR, PredictionKind, ScalarKind)

__all__ = [
    "SCALAR", "MULTICLASS", "COST_SENSITIVE", "CLASS_PROBABILITIES", "CLASS_SCORES",
    "MULTILABEL", "LABEL_STRINGS", "CB", "CB_EXPLORE", "CB_ADF", "CB_EXPLORE_ADF", "KINDS",
    "UNSERVABLE", "PredictionKind", "ScalarKind", "MulticlassKind", "CostSensitiveKind",
    "ClassScoresKind", "ClassRawScoresKind", "MultilabelKind", "LabelStringsKind", "CbKind",
    "CbExploreKind", "AdfKind", "ExploreAdfKind", "parse_action_values", "choose_kind",
    "refuse_unservable", "learns_by_line_count", "LINE_COUNTING", "probes_would_teach", "MOVED_BY_EVERY_EXAMPLE",
    "makes_passes",
    "refuse_in_audit_mode", "AUDIT_UNSERVABLE", "AUDIT_UNSERVABLE_WHILE_LEARNING",
    "AUDIT_SILENT",
]

#: Reductions whose output subwabbit cannot serve, with the reason.
UNSERVABLE: Dict[str, str] = {
    "--ccb_explore_adf": "conditional contextual bandits answer one line per slot",
    "--slates": "slates answer one line per slot",
    "--csoaa_ldf": "cost-sensitive examples with label-dependent features are multi-line "
                   "examples of another layout",
    "--wap_ldf": "cost-sensitive examples with label-dependent features are multi-line "
                 "examples of another layout",
    "--cbify": "it simulates a bandit from a multiclass data set (an offline tool)",
    "--cbify_ldf": "it simulates a bandit from a data set (an offline tool)",
    "--warm_cb": "it simulates a bandit from a data set (an offline tool)",
    "--explore_eval": "it evaluates exploration offline",
    "--top": "top-k answers several lines per example",
    "--lda": "topic models answer a vector of topic weights",
    "--cats": "continuous actions answer an action and a density",
    "--cats_pdf": "continuous actions answer a density",
    "--cats_tree": "continuous actions are not served",
    "--cb_continuous": "continuous actions are not served",
    "--memory_tree": "its class predictions are not served yet",
    "--emt": "its class predictions are not served yet (vw reads any uint as its label)",
    "--ot": "the offset tree answers a probability per action on one line, which a "
            "scalar model would cut to the first",
    "--cs_active": "active cost-sensitive predictions are not served",
    "--cbzo": "continuous actions are not served",
    "--sample_pdf": "continuous actions are not served",
    "--get_pmf": "continuous actions are not served",
    "--pmf_to_pdf": "continuous actions are not served",
    "--cb_explore_pdf": "continuous actions are not served",
    "--experimental_igl": "interaction-grounded learning is not served",
    "--sendto": "it sends examples to other vw processes",
}

#: Prefix of the learning-to-search options, none of which can be served.
_SEARCH_PREFIX = "--search"


#: Reductions that decide the kind, in order of precedence (a reduction
#: built on another one comes first): option -> prediction_type.
_REDUCTIONS: Tuple[Tuple[str, str], ...] = (
    ("--cb_explore_adf", CB_EXPLORE_ADF),
    ("--cb_adf", CB_ADF),
    ("--cb_explore", CB_EXPLORE),
    ("--cb", CB),
    ("--multilabel_oaa", MULTILABEL),
    ("--plt", MULTILABEL),
    ("--csoaa", COST_SENSITIVE),
    ("--oaa", MULTICLASS),
    ("--ect", MULTICLASS),
    ("--log_multi", MULTICLASS),
    ("--recall_tree", MULTICLASS),
)

#: The same, in the order they decide the kind of a model file: a file
#: saves the reductions a reduction is built on (``--cb 3`` saves ``--cb_adf``
#: as well, ``--cb_explore 3`` both ``--cb_explore_adf`` and ``--cb_adf``).
_SAVED_CB_REDUCTIONS: Tuple[str, ...] = ("--cb_explore", "--cb", "--cb_explore_adf",
                                           "--cb_adf")
_SAVED_REDUCTIONS: Tuple[str, ...] = _SAVED_CB_REDUCTIONS + (
    "--multilabel_oaa", "--plt", "--csoaa", "--oaa", "--ect", "--log_multi", "--recall_tree")

#: What a file saves for the contextual-bandit reductions it is built on
#: (their cost-sensitive learner), not reductions of its own
_SAVED_INTERNALS = ("--csoaa_ldf", "--csoaa_rank")

#: Families of kinds: an explicit prediction_type may refine what the
#: arguments say within a family (``--probabilities`` given again with a
#: model file, say), not contradict it.
_FAMILY = {CLASS_PROBABILITIES: MULTICLASS, CLASS_SCORES: MULTICLASS,
           LABEL_STRINGS: MULTILABEL}


def _option_value(args: Sequence[str], name: str) -> Optional[str]:
    """The value of the last ``name`` option in ``args`` (``''`` when it has none)."""
    value = None
    for index, token in enumerate(args):
        if option_name(token) != name:
            continue
        if "=" in token:
            value = token.split("=", 1)[1]
        elif index + 1 < len(args) and option_name(args[index + 1]) is None:
            value = args[index + 1]
        else:
            value = ""
    return value


def _count(args: Sequence[str], name: str) -> Optional[int]:
    value = _option_value(args, name)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def refuse_unservable(vw_args: Sequence[str], source: str = "vw_args contains") -> None:
    """Refuse reductions whose output subwabbit cannot read.

    :param source: what the messages say holds the options
    :raises ValueError: naming the argument and why
    """
    names = [option_name(token) for token in vw_args]
    for name in names:
        if name is None:
            continue
        if name in UNSERVABLE:
            raise ValueError(f"{source} {name}: subwabbit cannot serve it "
                             f"({UNSERVABLE[name]})")
        if name.startswith(_SEARCH_PREFIX):
            raise ValueError(f"{source} {name}: subwabbit cannot serve learning to "
                             "search (its examples and answers are sequences)")
    if "--probabilities" in names:
        others = [option for option, _ in _REDUCTIONS if option in names and option != "--oaa"]
        if others:
            raise ValueError(f"{source} --probabilities with {others[0]}: subwabbit "
                             "serves --probabilities with --oaa only (with the others vw "
                             "ignores it, refuses it, or prints a second line per example)")


#: Reductions that learn by the parity of a running count of the lines the
#: engine reads, empty lines and save commands included (vw hands each line
#: an example from its pool): a control line the caller did not write must
#: not change that parity (:func:`learns_by_line_count`).
LINE_COUNTING = ("--lrq", "--lrqfa")


def learns_by_line_count(options: Sequence[str]) -> bool:
    """Whether the engine options (arguments and the model file's saved
    options) include a reduction of :data:`LINE_COUNTING`."""
    return any(option_name(token) in LINE_COUNTING for token in options)


#: Reductions whose learning the probe examples would move (an unlabelled
#: example teaches other reductions nothing), measured on vw 9.x: for each
#: example a learning engine reads, ``--bootstrap`` and ``--active``
#: (``--simulation``) draw from the engine's random numbers, and
#: ``--stage_poly`` schedules its support updates by the count of lines read
#: (empty lines and save commands too); ``--rank`` (matrix factorisation)
#: learns differently after an unlabelled example. (``--lrq`` and ``--lrqfa``, which
#: learn by that count's parity, are not moved by a probe's two lines:
#: :data:`LINE_COUNTING`.)
MOVED_BY_EVERY_EXAMPLE = ("--bootstrap", "--active", "--stage_poly", "--rank")


def probes_would_teach(vw_args: Sequence[str], saved_options: Sequence[str]) -> Optional[str]:
    """The reduction of :data:`MOVED_BY_EVERY_EXAMPLE` that a learning engine
    (no ``-t``) runs, from its arguments or the options saved in the model
    file it loads, or ``'--passes'`` for a learning engine that makes more
    than one pass (:func:`makes_passes`); ``None`` for any other engine.
    Such an engine is started and saved without probe examples (see
    :data:`~subwabbit.core.channel.START_BLANK`).
    """
    if not learns(vw_args):
        return None
    for token in list(vw_args) + list(saved_options):
        name = option_name(token)
        if name in MOVED_BY_EVERY_EXAMPLE:
            return name
    if makes_passes(vw_args):
        return "--passes"
    return None


def makes_passes(vw_args: Sequence[str]) -> bool:
    """Whether the engine makes more than one pass over its examples
    (``--passes`` above 1): vw caches every line it reads, and after its
    input ends it learns from them all again, every 10th example held out
    unless ``--holdout_off``. A probe example would be one of them, shifting
    which examples are held out (the model then differed from the one vw
    makes of the same lines read from a file), and a save command would be
    carried out again in every later pass."""
    return (_count(vw_args, "--passes") or 1) > 1


#: Reductions that call the learner under them more than once per example:
#: in audit mode vw then prints more than the three lines per example that
#: audit mode reads, depending on the example (a labelled one, a tree's path).
AUDIT_UNSERVABLE = ("--plt", "--lrq", "--lrqfa", "--multilabel_oaa", "--nn", "--bootstrap",
                    "--boosting", "--autolink", "--interact", "--new_mf", "--stage_poly",
                    "--ksvm")

#: Reductions that, while they learn (no ``-t``), make vw print a second
#: audit record for a labelled line, or a replayed example's record later:
#: three labelled lines gave 15 audit lines (165 with ``--active_cover``)
#: where audit mode reads 9. With ``-t`` they print three lines per
#: example and are served (found by a review).
AUDIT_UNSERVABLE_WHILE_LEARNING = ("--ftrl", "--coin", "--classweight", "--active",
                                   "--active_cover", "--replay_b", "--replay_c", "--baseline")


#: Learners under which vw prints no audit record at all (the prediction
#: line only): audit mode, which reads three lines per example, found out
#: only when its start-up probe went unanswered for ``startup_timeout_s``
#: (found by a review: 60 s, then "did not answer a probe example").
AUDIT_SILENT = ("--OjaNewton", "--svrg", "--noop", "--print")


def refuse_in_audit_mode(vw_args: Sequence[str]) -> None:
    """Refuse, for audit mode, reductions that print several audit lines per
    example (:data:`AUDIT_UNSERVABLE`, and
    :data:`AUDIT_UNSERVABLE_WHILE_LEARNING` without ``-t``) or none
    (:data:`AUDIT_SILENT`). A model loaded
    with ``-i`` carries its reductions in the file: pass the options it
    saved with ``vw_args``; the start-up probe catches some of the others.

    :raises ValueError: naming the argument
    """
    learning = learns(vw_args)
    for token in vw_args:
        name = option_name(token)
        if name in AUDIT_UNSERVABLE:
            raise ValueError(f"audit_mode cannot serve {name}: vw prints more than one "
                             "audit record per example with it, and how many depends on the "
                             "example")
        if name in AUDIT_SILENT:
            raise ValueError(f"audit_mode cannot serve {name}: vw prints no audit record "
                             "with it")
        if learning and name in AUDIT_UNSERVABLE_WHILE_LEARNING:
            raise ValueError(f"audit_mode cannot serve {name} while it learns: vw prints more "
                             "than one audit record for a labelled line with it; explain "
                             "with -t")


def choose_kind(vw_args: Sequence[str], prediction_type: Optional[str] = None,
                default: Optional[str] = None,
                saved_options: Optional[Sequence[str]] = ()) -> PredictionKind:
    """The kind of model the engine arguments, the model file's saved options
    or ``prediction_type`` describe.

    :param vw_args: normalised engine arguments
    :param prediction_type: one of :data:`KINDS`, for a model file whose
        reductions neither the arguments nor its saved options show; it must
        agree with the reductions they do show
    :param default: the kind of a client class when none of them says one
        (:class:`~subwabbit.plt.VowpalWabbitPLTProcess`: ``'label_strings'``,
        used for ``--plt``/``--multilabel_oaa`` or no reduction)
    :param saved_options: the options saved in the model file that
        ``vw_args`` load (:func:`subwabbit.model_file.saved_options_of`):
        its reduction decides the kind when ``vw_args`` name none, and its
        ``--named_labels``, ``--indexing`` and ``--cb_force_legacy`` count
        (vw refuses to start when ``vw_args`` give other values); ``None``
        when they are not read here (a distributed job's driver: each
        node reads them), which leaves what they may tell (a class count)
        to the nodes' own check
    :raises ValueError: for an unknown ``prediction_type``, one that
        contradicts the arguments or the file, or a reduction subwabbit
        cannot serve
    """
    args = list(vw_args)
    refuse_unservable(args)
    if prediction_type is not None and prediction_type not in KINDS:
        raise ValueError(f"prediction_type must be one of {', '.join(sorted(KINDS))}, "
                         f"got {prediction_type!r}")
    names = {option_name(token) for token in args}
    option = next((option for option, _ in _REDUCTIONS if option in names), None)
    where = "in vw_args"
    source = args
    saved = list(saved_options or ())
    if option is None and saved:
        option = _saved_reduction(saved)
        if option is not None:
            where, source = "saved in the model file", saved
            if "--probabilities" in names and option != "--oaa":
                raise ValueError(f"vw_args contain --probabilities for a model file of "
                                 f"{option}: subwabbit serves --probabilities with --oaa only")
    inferred = dict(_REDUCTIONS).get(option) if option else None
    if inferred in (MULTICLASS, None) and "--probabilities" in names:
        inferred = CLASS_PROBABILITIES
    elif inferred == MULTICLASS and "--scores" in names and option == "--oaa":
        inferred = CLASS_SCORES  # (vw ignores --scores with the other reductions)
    if option is not None:
        count = _option_value(source, option)
        reduction = f"{option} {count}" if count else option
        origin = reduction + (", saved in the model file" if source is saved else "")
    else:
        reduction = origin = "--probabilities" if inferred else "no reduction in vw_args"
    if prediction_type is not None:
        chosen = prediction_type
        if chosen == MULTICLASS and inferred in (CLASS_PROBABILITIES, CLASS_SCORES):
            chosen = inferred  # --probabilities given again with a model file
        if inferred is not None and (_FAMILY.get(chosen, chosen)
                                     != _FAMILY.get(inferred, inferred)):
            raise ValueError(f"prediction_type={prediction_type!r} contradicts {reduction} "
                             f"{where}, which makes a {inferred!r} model")
        origin = f"prediction_type={prediction_type!r}"
    elif default is not None and inferred in (None, MULTILABEL):
        chosen = default
    else:
        chosen = inferred or SCALAR
    classes = _count(source, option) if option else None
    if chosen in (CLASS_PROBABILITIES, CLASS_SCORES):
        _check_class_scores(chosen, origin, names, option)
        if (classes is None and saved_options is not None
                and not _option_value(saved + args, "--named_labels")):
            raise ValueError(
                f"a {chosen!r} model ({origin}) needs its class count, which neither vw_args "
                "nor the model file show: pass --oaa K in vw_args, as the model was trained "
                "(vw takes it again with -i); without it the tag an answer may carry after "
                "its class pairs (such as '4:9') would be read as one more class")
    # What the arguments say last counts: the file's options come first.
    return _build(chosen, saved + args, origin, classes, option)


def _check_class_scores(chosen: str, origin: str, names: Set[Optional[str]],
                        option: Optional[str]) -> None:
    """Refuse a ``class_probabilities`` or ``class_scores`` model whose answers
    vw would print otherwise.

    vw prints a ``class:value`` pair per class with ``--oaa`` and
    ``--probabilities`` (probabilities, whatever ``--scores`` says) or
    ``--scores`` (raw scores); neither is kept in a model file, and without
    them vw prints the class alone.

    :param origin: what chose the kind, for messages
    :raises ValueError: naming what is missing or contradicts ``chosen``
    """
    flag = "--probabilities" if chosen == CLASS_PROBABILITIES else "--scores"
    what = f"a {chosen!r} model ({origin})"
    if option not in (None, "--oaa"):
        raise ValueError(f"{what} is served with --oaa only; {option} prints the class alone")
    if chosen == CLASS_SCORES and "--probabilities" in names:
        raise ValueError(f"{what} contradicts --probabilities in vw_args, with which vw prints "
                         "probabilities, not raw scores: pass prediction_type="
                         "'class_probabilities', or leave --probabilities out")
    if flag not in names:
        raise ValueError(f"{what} needs {flag} in vw_args: without it vw prints the class "
                         f"alone (vw does not keep {flag} in a model file)")


def _saved_reduction(saved: List[str]) -> Optional[str]:
    """The reduction that decides the kind of a model file with these saved
    options (``None``: none of :data:`_REDUCTIONS`).

    :raises ValueError: for a reduction subwabbit cannot serve
    """
    names = [option_name(token) for token in saved]
    option = next((option for option in _SAVED_REDUCTIONS if option in names), None)
    internal = _SAVED_INTERNALS if option in _SAVED_CB_REDUCTIONS else ()
    refuse_unservable([token for token in saved if option_name(token) not in internal],
                      source="the model file was trained with")
    return option


#: The reductions that read ``--indexing`` (vw ignores it with ``--ect``,
#: ``--log_multi`` and ``--recall_tree``, whose classes count from 1)
_INDEXED = ("--oaa", "--csoaa")


def _build(chosen: str, args: List[str], origin: str, count: Optional[int],
           option: Optional[str]) -> PredictionKind:
    if chosen in (MULTICLASS, COST_SENSITIVE, CLASS_PROBABILITIES, CLASS_SCORES):
        names_value = _option_value(args, "--named_labels")
        names = tuple(names_value.split(",")) if names_value else None
        first = 0 if (_option_value(args, "--indexing") == "0"
                      and option in (None,) + _INDEXED) else 1
        if names is not None and first == 0:
            raise ValueError(f"{origin}: subwabbit cannot serve --named_labels with --indexing "
                             "0: vw numbers the names from 1 and the classes from 0, so it "
                             "cannot learn the last name, and answers class 0 with an empty "
                             "line")
        classes = _Classes(len(names) if names else count, first, names)
        factory: Callable[..., PredictionKind] = {
            MULTICLASS: MulticlassKind, COST_SENSITIVE: CostSensitiveKind,
            CLASS_PROBABILITIES: ClassScoresKind, CLASS_SCORES: ClassRawScoresKind}[chosen]
        return factory(origin, classes)
    ordered = any(option_name(token) == "--multilabel_oaa" for token in args)
    if chosen == MULTILABEL:
        return MultilabelKind(origin, count, ordered)
    if chosen in (CB, CB_EXPLORE):
        factory = CbExploreKind if chosen == CB_EXPLORE else CbKind
        return factory(origin, count, "--cb_force_legacy" in args)
    if chosen == CB_ADF:
        return AdfKind(origin)
    if chosen == CB_EXPLORE_ADF:
        return ExploreAdfKind(origin)
    if chosen == LABEL_STRINGS:
        # (a count: the multilabel reduction's K, whose labels are checked)
        return LabelStringsKind(origin, count, ordered)
    return ScalarKind(origin)
