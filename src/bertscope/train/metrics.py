"""Classification metrics: accuracy and macro-F1."""

from __future__ import annotations

from typing import Sequence

__all__ = ["accuracy", "macro_f1"]


def accuracy(pred: Sequence[int], gold: Sequence[int]) -> float:
    """The share of examples whose predicted class is the gold one."""
    if len(pred) != len(gold):
        raise ValueError("pred and gold differ in length")
    return sum(p == g for p, g in zip(pred, gold)) / max(1, len(gold))


def macro_f1(pred: Sequence[int], gold: Sequence[int], num_classes: int) -> float:
    """The unweighted mean over classes of F1 = 2·P·R / (P + R) (0 for a class with P + R = 0).

    Every class of the label set counts, including one that is never predicted nor present
    (its F1 is 0), as scikit-learn's ``f1_score(average="macro", labels=range(K))`` does.
    """
    if len(pred) != len(gold):
        raise ValueError("pred and gold differ in length")
    total = 0.0
    for k in range(num_classes):
        tp = sum(p == k and g == k for p, g in zip(pred, gold))
        fp = sum(p == k and g != k for p, g in zip(pred, gold))
        fn = sum(p != k and g == k for p, g in zip(pred, gold))
        total += 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
    return total / num_classes
