"""Choosing the item to show from a contextual bandit's probabilities.

A ``--cb_explore_adf`` model gives, per item, the probability with which its
policy would show it. The service draws one item from those probabilities,
shows it, and logs the probability it had: VW learns from the reward
weighted by the inverse of that probability, so the label passed back to
``train`` is ``(cost, probability)`` for the item that was shown.
"""

import math
import numbers
from typing import Any, Sequence, Tuple


def sample_item(probabilities: Sequence[float], rng: Any) -> Tuple[int, float]:
    """Draw an item from a ``--cb_explore_adf`` prediction.

    The draw takes one number from ``rng``, so a seeded generator repeats
    the same choices. Items of probability 0 are never drawn. The
    probabilities vw prints are rounded to six digits and need not sum to 1
    exactly; the draw is over their sum.

    :param probabilities: one per item, as ``predict`` gives them (also a
        ``--cb_explore`` prediction: index ``i`` is action ``i + 1``)
    :param rng: the caller's random generator: a :class:`random.Random`, a
        :class:`numpy.random.Generator`, or anything whose ``random()``
        returns a float in [0, 1)
    :returns: ``(index, probability)``: the item's position in
        ``probabilities`` and the probability to log and later pass to
        ``train`` as the item's label ``(cost, probability)``
    :raises ValueError: for no items, a probability that is negative, not
        finite or not a number, or probabilities that are all 0
    """
    values = list(probabilities)
    if not values:
        raise ValueError("no probabilities to sample an item from")
    total = 0.0
    for index, value in enumerate(values):
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(value) or value < 0):
            raise ValueError(f"probabilities[{index}] must be a finite number >= 0, "
                             f"got {value!r}")
        total += value
    if total <= 0:
        raise ValueError("the probabilities are all 0: no item can be sampled")
    threshold = float(rng.random()) * total
    cumulative = 0.0
    chosen = 0
    for index, value in enumerate(values):
        if value > 0:
            chosen = index
            cumulative += value
            if threshold < cumulative:
                break
    return chosen, float(values[chosen])
