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

import numpy as np
import torch

from ..errors import InputError, InputTypeError

__all__ = ["attention_rollout", "mean_heads", "roll_out"]


def _one_text(attentions: object) -> torch.Tensor:
    """One text's maps as an (N, H, T, T) tensor, from that tensor, a numpy array, or a model's
    ``attentions`` (a tuple of N (B, H, T, T) maps, as bertscope and HF return them) for B = 1."""
    if isinstance(attentions, (tuple, list)):
        if not attentions:
            raise InputError("attentions is empty: give one map per layer")
        try:
            attentions = torch.stack([torch.as_tensor(np.asarray(a) if not isinstance(a, torch.Tensor) else a)
                                      for a in attentions])  # (N, ...)
        except (RuntimeError, TypeError, ValueError):
            raise InputError("attentions must be one map per layer, all of one shape") from None
    elif isinstance(attentions, np.ndarray):
        attentions = torch.from_numpy(attentions)
    elif not isinstance(attentions, torch.Tensor):
        raise InputTypeError(f"attentions must be a tensor (N, H, T, T) or a model's tuple of attentions, "
                             f"got {type(attentions).__name__}")
    if attentions.dim() == 5:  # (N, B, H, T, T): the model's tuple, stacked
        if attentions.shape[1] != 1:
            raise InputError(f"attentions hold {attentions.shape[1]} texts (N, B, H, T, T) = "
                             f"{tuple(attentions.shape)}; pick one: torch.stack(attentions)[:, i]")
        attentions = attentions[:, 0]  # (N, H, T, T)
    if attentions.dim() != 4 or attentions.shape[-1] != attentions.shape[-2]:
        raise InputError(f"attentions must be (N, H, T, T), got {tuple(attentions.shape)}")
    if not attentions.is_floating_point():
        raise InputError(f"attentions must be probabilities (floats), got {attentions.dtype}")
    return attentions


def mean_heads(attentions: torch.Tensor) -> torch.Tensor:
    """(N, H, T, T) -> (N, T, T): each layer's attention averaged over its heads.

    Also takes a numpy array, or a model's ``out.attentions`` (N maps of (1, H, T, T)) for one
    text."""
    return _one_text(attentions).mean(dim=1)  # (N, T, T)


def attention_rollout(attentions: torch.Tensor) -> torch.Tensor:
    """(N, H, T, T) -> (N, T, T): the rollout after each layer (Abnar & Zuidema 2020).

    Takes what :func:`mean_heads` takes."""
    attentions = _one_text(attentions)
    A = mean_heads(attentions).double()  # (N, T, T); float64 so 24 products stay exact
    T = A.shape[-1]
    A = A + torch.eye(T, dtype=A.dtype, device=A.device)  # (N, T, T): the residual path
    A = A / A.sum(dim=-1, keepdim=True)  # (N, T, T): rows sum to 1 again
    return roll_out(A).to(attentions.dtype)  # (N, T, T)


def roll_out(maps: torch.Tensor) -> torch.Tensor:
    """Layer-wise maps M_l (..., N, T, T) -> R_l = M_l · R_{l−1}, R_0 = M_0, in float64: row i
    of R_l is how much of input token j has reached token i after layer l (the product
    :func:`attention_rollout` takes of the weights, and ALTI of its own maps)."""
    M = maps.double()  # (..., N, T, T); float64 so 24 products stay exact
    out = torch.empty_like(M)
    if M.shape[-3] == 0:  # no layers: nothing to roll out
        return out
    rolled = M[..., 0, :, :]  # (..., T, T)
    out[..., 0, :, :] = rolled
    for layer in range(1, M.shape[-3]):
        rolled = M[..., layer, :, :] @ rolled  # (..., T, T)@(..., T, T) -> (..., T, T)
        out[..., layer, :, :] = rolled
    return out
