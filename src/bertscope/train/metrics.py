"""Classification metrics: accuracy, macro-F1, and a per-label report against gold labels."""

from __future__ import annotations

from typing import Hashable, Sequence

__all__ = ["accuracy", "label_report", "macro_f1"]


def accuracy(pred: Sequence[int], gold: Sequence[int]) -> float:
    """The share of examples whose predicted class is the gold one."""
    if len(pred) != len(gold):
        raise ValueError("pred and gold differ in length")
    return sum(p == g for p, g in zip(pred, gold)) / max(1, len(gold))


def macro_f1(pred: Sequence[int], gold: Sequence[int], num_classes: int) -> float:
    """The unweighted mean over classes of F1 = 2·P·R / (P + R) (0 for a class with P + R = 0).

    Every class of the label set counts, including one that is never predicted nor present
    (its F1 is 0), as scikit-learn's ``f1_score(average="macro", labels=range(K))`` does.
    :func:`label_report` over the classes 0..K-1.
    """
    return label_report(pred, gold, range(num_classes))["macro_f1"]


def label_report(pred: Sequence[Hashable], gold: Sequence[Hashable], labels: Sequence[Hashable]) -> dict:
    """How well predicted labels (names, or class indices) match gold ones, over a classifier's
    label set.

    ``labels`` are the classifier's classes, in its order. A gold name outside them (a class the
    model does not know) counts as a wrong prediction in the accuracy, and as a false positive of
    the class that was predicted; it is no class of the macro average, as scikit-learn's
    ``precision_recall_fscore_support(labels=labels)`` treats it. Returns::

        {"scored": n, "accuracy": ..., "macro_f1": ..., "majority_accuracy": ...,
         "per_label": {name: {"precision", "recall", "f1", "support"}},
         "confusion": {gold name: {predicted name: count}}}  (names in ``labels``' order, then others)

    ``majority_accuracy`` is what predicting the commonest gold class for every text would
    score: the baseline that learns nothing. A precision or recall of no examples is 0.
    """
    if len(pred) != len(gold):
        raise ValueError("pred and gold differ in length")
    if not labels:
        raise ValueError("no labels")
    from collections import Counter

    n = len(gold)
    pairs = Counter(zip(gold, pred))  # (gold, predicted) -> count: one pass over the texts
    predicted, support = Counter(pred), Counter(gold)
    per_label: dict[str, dict] = {}
    for name in labels:
        tp = pairs[(name, name)]
        precision = tp / predicted[name] if predicted[name] else 0.0
        recall = tp / support[name] if support[name] else 0.0
        f1 = 2 * tp / (predicted[name] + support[name]) if tp else 0.0
        per_label[name] = {"precision": precision, "recall": recall, "f1": f1, "support": support[name]}
    order = list(labels) + sorted(set(support) - set(labels), key=str)  # the model's classes in its order, then others
    confusion = {g: {p: pairs[(g, p)] for p in order if pairs[(g, p)]} for g in order if support[g]}
    return {"scored": n,
            "accuracy": sum(pairs[(g, g)] for g in support) / n if n else 0.0,
            "macro_f1": sum(r["f1"] for r in per_label.values()) / len(labels),
            "majority_accuracy": max(support.values()) / n if n else 0.0,
            "per_label": per_label,
            "confusion": confusion}
