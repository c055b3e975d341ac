"""bertscope itself: ``Bert.embed`` (packed path, token-budget batches)."""

from __future__ import annotations

NAME = "bertscope"
ORDER = 0
DEVICES = ("cpu", "cuda")


def build(setup):
    bert = setup.bert
    return lambda texts: bert.embed(texts)
