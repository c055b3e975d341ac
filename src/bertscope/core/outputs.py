"""Typed records that the model returns (never positional tuples).

Shape legend: B batch, T tokens, H heads, C hidden size, N layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BertOutput"]


@dataclass(frozen=True)
class BertOutput:
    """What :class:`bertscope.core.model.BertModel` returns.

    last_hidden_state: (B, T, C) the last layer's output.
    pooler_output:     (B, C) tanh(W·h_[CLS] + b), BERT's pooler; None for a checkpoint saved
                       without one (HF's BertForMaskedLM).
    hidden_states:     N + 1 tensors of (B, T, C): the embeddings, then each layer's output;
                       None unless asked for.
    attentions:        N tensors of (B, H, T, T): each layer's attention probabilities;
                       None unless asked for.
    scores:            N tensors of (B, H, T, T): each layer's scaled scores before the mask
                       and softmax; present whenever ``attentions`` is.
    intermediates:     N :class:`~bertscope.core.layer.LayerRecord`: every step of every
                       layer; None unless asked for (``output_intermediates=True``).
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    scores: tuple[torch.Tensor, ...] | None = None
    intermediates: tuple[Any, ...] | None = None
