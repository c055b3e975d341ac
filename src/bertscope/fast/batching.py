"""Length-aware batching: sort texts by length, fill each batch up to a token budget.

With the packed path (bertscope.fast.packing) a batch costs what its real tokens cost, so a batch is
filled by *real* tokens, not by a count of texts: many short texts or a few long ones. Sorting
by length puts texts of equal length side by side, which the packed attention runs as one
group. Callers scatter results back with the indices each batch carries, so the output is
always in input order.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["token_budget_batches"]


def token_budget_batches(lengths: Sequence[int], max_tokens: int,
                         max_texts: int | None = None) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches, longest texts first.

    Each batch holds at most ``max_tokens`` real tokens (a single text longer than the budget
    gets a batch of its own) and at most ``max_texts`` texts. Every index appears exactly once.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if max_texts is not None and max_texts < 1:
        raise ValueError("max_texts must be at least 1")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i in order:
        n = max(int(lengths[i]), 1)
        full = tokens + n > max_tokens or (max_texts is not None and len(current) >= max_texts)
        if current and full:
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    return batches
