"""Attention aggregated over heads and layers.

Shape legend: N layers, H heads, T tokens.

* mean over heads: each layer's H maps averaged; rows still sum to 1.
* attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"):
  the residual connection carries each token forward too, so each layer's head-averaged map
  gets the identity added and its rows renormalised, A' = (A + I) / 2; the maps are then
  multiplied through the layers, R_0 = A'_0 and R_l = A'_l · R_{l-1}. Row i of R_l says how
  much of input token j has flowed into token i after layer l.
"""

from __future__ import annotations

import torch

__all__ = ["attention_rollout", "mean_heads"]


def mean_heads(attentions: torch.Tensor) -> torch.Tensor:
    """(N, H, T, T) -> (N, T, T): each layer's attention averaged over its heads."""
    if attentions.dim() != 4:
        raise ValueError(f"attentions must be (N, H, T, T), got {tuple(attentions.shape)}")
    return attentions.mean(dim=1)  # (N, T, T)


def attention_rollout(attentions: torch.Tensor) -> torch.Tensor:
    """(N, H, T, T) -> (N, T, T): the rollout after each layer (Abnar & Zuidema 2020)."""
    A = mean_heads(attentions).double()  # (N, T, T); float64 so 24 products stay exact
    N, T, _ = A.shape
    A = A + torch.eye(T, dtype=A.dtype, device=A.device)  # (N, T, T): the residual path
    A = A / A.sum(dim=-1, keepdim=True)  # (N, T, T): rows sum to 1 again
    out = torch.empty_like(A)
    rolled = torch.eye(T, dtype=A.dtype, device=A.device)  # (T, T), on the input's device
    for layer in range(N):
        rolled = A[layer] @ rolled  # (T, T)@(T, T) -> (T, T)
        out[layer] = rolled
    return out.to(attentions.dtype)
