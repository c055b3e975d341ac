"""Length-grouped training batches under a token budget, the same for a given seed and epoch.

The packed path costs what a batch's real tokens cost, so a batch is filled by real tokens
(at most ``batch_tokens``) and at most ``batch_size`` examples. Each epoch:

  1. shuffle every example (a generator seeded with (seed, epoch));
  2. cut the shuffled order into windows of about ``WINDOW_BATCHES`` batches' worth of tokens;
  3. inside a window, sort by length and fill batches (:func:`bertscope.fast.batching.token_budget_batches`),
     so a batch holds texts of similar length (few attention length groups, little waste);
  4. shuffle the order of all the batches.

This is the idea of HF's ``group_by_length`` (megabatches sorted by length), with a token budget
instead of a fixed count. The plan depends only on (lengths, budget, seed, epoch): a resumed run
rebuilds it and continues at the same batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..fast.batching import token_budget_batches

__all__ = ["WINDOW_BATCHES", "epoch_batches"]

WINDOW_BATCHES = 50  # batches' worth of tokens sorted together (HF's megabatch is 50 batches)


def epoch_batches(lengths: Sequence[int], batch_tokens: int, batch_size: int | None, seed: int,
                  epoch: int) -> list[list[int]]:
    """The batches of one epoch: lists of example indices; every index appears exactly once."""
    n = len(lengths)
    if n == 0:
        return []
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    window_tokens = WINDOW_BATCHES * batch_tokens
    if batch_size is not None:
        mean = max(1.0, float(np.mean(lengths)))
        window_tokens = min(window_tokens, int(WINDOW_BATCHES * batch_size * mean))
    batches: list[list[int]] = []
    start = 0
    while start < n:
        tokens, end = 0, start
        while end < n and (end == start or tokens + lengths[order[end]] <= window_tokens):
            tokens += lengths[order[end]]
            end += 1
        window = [int(i) for i in order[start:end]]
        for b in token_budget_batches([lengths[i] for i in window], batch_tokens, batch_size):
            batches.append([window[j] for j in b])
        start = end
    perm = rng.permutation(len(batches))
    return [batches[i] for i in perm]
