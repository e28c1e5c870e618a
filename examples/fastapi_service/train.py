"""Train a toy model for the example service's formatter (``app.Formatter``).

Run it from this folder: ``python train.py /models/current.vw``
(``--flip`` trains the opposite preferences, to see a reload change the
scores). A real model learns from logged impressions and clicks; this one
is shown every third item and learns that user ``u`` likes item ``i`` when
``u + i`` is odd (``--flip``: even). Items it was never shown get about the
same score from every user.
"""

import argparse
from typing import Any

from subwabbit import VowpalWabbitProcess

#: The model's shape: logistic loss and the user x item interactions.
MODEL_ARGS = ["-q", "ui", "--loss_function", "logistic", "--link", "logistic", "--quiet"]


def train(path: str, formatter: Any, flip: int = 0, users: int = 8, items: int = 400) -> None:
    """Write a model learnt on every third item of each user to ``path``."""
    with VowpalWabbitProcess(formatter, MODEL_ARGS + ["-f", path], write_only=True) as trainer:
        for user in range(users):
            shown = list(range(0, items, 3))
            labels = [1 if (item + user + flip) % 2 else -1 for item in shown]
            trainer.train({"user": user}, shown, labels, [None] * len(shown))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="where to write the model")
    parser.add_argument("--flip", action="store_true", help="the opposite preferences")
    args = parser.parse_args()
    from app import Formatter  # pylint: disable=import-outside-toplevel
    train(args.path, Formatter(), flip=int(args.flip))
    print(f"wrote {args.path}")


if __name__ == "__main__":
    main()
