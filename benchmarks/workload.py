"""The benchmark's recommender workload: items, requests, the formatter and the model.

Everything is generated from one seed, so that two runs with the same options
score the same lines. Nothing is downloaded.

* Items (``--items``, default 3,000) have three namespaces: ``i`` (the item
  id), ``c`` (a category) and ``t`` (1-3 tags).
* Requests (``--requests``, default 1,000) have six: ``u`` (the user id), ``w``
  (a list of 5-15 tokens, Zipf-distributed), ``n`` (a dict of six float user
  statistics), ``x`` (a dict of four float context features), ``d`` (device
  and operating system) and ``g`` (country and city).
* Each request scores the whole catalogue, in an order of its own (the order
  a candidate generator would hand over).
* The model is a logistic regression with ``--l2`` and the 18 quadratic
  interactions item namespace x request namespace.
"""

import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

from subwabbit import VowpalWabbitBaseFormatter

ITEM_NAMESPACES = "ict"
REQUEST_NAMESPACES = "uwnxdg"
#: One ``-q`` per pair of an item and a request namespace: 3 x 6 = 18.
INTERACTIONS = [item + request for item in ITEM_NAMESPACES for request in REQUEST_NAMESPACES]

_USER_STATS = ("age", "tenure", "ctr7", "ctr30", "visits", "spend")
_CONTEXT = ("hour_sin", "hour_cos", "scroll", "dwell")
_DEVICES = ("mobile", "desktop", "tablet", "tv")
_SYSTEMS = ("android", "ios", "windows", "macos", "linux")

Item = Dict[str, Any]
Request = Dict[str, Any]


def model_args(bits: int = 20) -> List[str]:
    """Engine arguments shared by training and prediction (the model's shape)."""
    args = ["--loss_function", "logistic", "--link", "logistic", "-b", str(bits), "--quiet"]
    for pair in INTERACTIONS:
        args += ["-q", pair]
    return args


def training_args(model_path: str) -> List[str]:
    """Arguments of the pretraining run: the model shape, L2, and where to write it."""
    return model_args() + ["--l2", "1e-6", "-f", model_path]


def prediction_args(model_path: str) -> List[str]:
    """Arguments of every contender at prediction time.

    ``--loss_function`` is not stored in a model file, so it is given again.
    """
    return ["-t", "-i", model_path, "--quiet", "--loss_function", "logistic"]


class RecommenderFormatter(VowpalWabbitBaseFormatter):
    """Formats the workload's requests and items into VW lines.

    An item's part of the line does not depend on the request, so it is
    formatted once and cached by item id, as a service would. One instance is
    shared by every contender, so all of them pay exactly the same.
    """

    def __init__(self) -> None:
        self._items: Dict[int, str] = {}

    def format_common_features(self, common_features: Request, debug_info: Any = None) -> str:
        request = common_features
        stats = " ".join(f"{name}:{value:.4g}" for name, value in request["user_stats"].items())
        context = " ".join(f"{name}:{value:.4g}" for name, value in request["context"].items())
        return (f"|u u{request['user_id']} |w {' '.join(request['tokens'])} |n {stats} "
                f"|x {context} |d dev_{request['device']} os_{request['os']} "
                f"|g cc_{request['country']} city_{request['city']}")

    def format_item_features(self, common_features: Any, item_features: Item,
                             debug_info: Any = None) -> str:
        try:
            return self._items[item_features["id"]]
        except KeyError:
            part = (f"|i i{item_features['id']} |c cat{item_features['category']} "
                    f"|t {' '.join(item_features['tags'])}")
            self._items[item_features["id"]] = part
            return part

    def lines(self, request: Request, items: Sequence[Item],
              labels: Optional[Sequence[int]] = None) -> List[str]:
        """The request's lines (labelled if ``labels`` are given), joined
        exactly as the models join them."""
        common = self.format_common_features(request)
        if labels is None:
            return [self.get_formatted_example(common, self.format_item_features(request, item))
                    for item in items]
        return [self.get_formatted_example(common, self.format_item_features(request, item),
                                           label=label)
                for item, label in zip(items, labels)]


class Workload:
    """Items, requests (each with its candidate list) and pretraining labels.

    :param requests: how many requests
    :param items: how many items in the catalogue; every request scores all of them
    :param seed: the seed of everything random here
    """

    def __init__(self, requests: int = 1000, items: int = 3000, seed: int = 2024) -> None:
        self.seed = seed
        rng = random.Random(seed)
        tags = [f"tag{index}" for index in range(300)]
        self.items: List[Item] = [
            {"id": index, "category": rng.randrange(40),
             "tags": rng.sample(tags, rng.randint(1, 3))}
            for index in range(items)]
        vocabulary = [f"w{index}" for index in range(5000)]
        weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]  # Zipf-like
        self.requests: List[Request] = []
        for _ in range(requests):
            self.requests.append({
                "user_id": rng.randrange(20000),
                "tokens": rng.choices(vocabulary, weights, k=rng.randint(5, 15)),
                "user_stats": {name: rng.random() * 10 for name in _USER_STATS},
                "context": {name: rng.uniform(-1, 1) for name in _CONTEXT},
                "device": rng.choice(_DEVICES),
                "os": rng.choice(_SYSTEMS),
                "country": rng.randrange(30),
                "city": rng.randrange(200),
            })
        # Each request's candidates: the whole catalogue in its own order.
        self.candidates: List[List[Item]] = []
        for _ in range(requests):
            order = self.items[:]
            rng.shuffle(order)
            self.candidates.append(order)

    def __len__(self) -> int:
        return len(self.requests)

    def pairs(self, indices: Sequence[int]) -> List[Tuple[Request, List[Item]]]:
        """``(request, candidates)`` for the given request indices."""
        return [(self.requests[index], self.candidates[index]) for index in indices]

    def training_batches(self, lines: int, per_request: int = 500
                         ) -> List[Tuple[Request, List[Item], List[int]]]:
        """Random (-1/1) labels for ``per_request`` candidates of successive
        requests, ``lines`` labelled examples in all.

        Deterministic: derived from the workload's seed, not from the state
        of the generator that built the workload.
        """
        rng = random.Random(self.seed + 1)
        batches = []
        remaining, index = lines, 0
        while remaining > 0:
            count = min(per_request, remaining)
            request = self.requests[index % len(self.requests)]
            items = rng.sample(self.items, min(count, len(self.items)))
            labels = [rng.choice((-1, 1)) for _ in items]
            batches.append((request, items, labels))
            remaining -= len(items)
            index += 1
        return batches
