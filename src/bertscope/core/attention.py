"""BERT's multi-head self-attention, written out step by step (SPEC S1-S9).

Shape legend (used in every shape comment below):
    B  batch size
    T  tokens in a sequence (queries and keys; self-attention uses the same T for both)
    H  attention heads                          (12 in BERT-base)
    D  head size, C // H                        (64 in BERT-base)
    C  hidden size, H * D                       (768 in BERT-base)

Two paths compute the same thing:
  * the reference path, :func:`attention_reference`: explicit matmul, mask, softmax and
    dropout, returning the scores and probabilities for inspection;
  * the fused path, ``torch.nn.functional.scaled_dot_product_attention``, used when nobody
    asks for the probabilities. Tests hold the two within 1e-5 of each other in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError, InputTypeError
from .config import ConfigError
from .masks import check_attention_mask, mask_to_bias

__all__ = ["AttentionRecord", "MultiHeadSelfAttention", "attention_reference"]


@dataclass(frozen=True)
class AttentionRecord:
    """What attention computed on the way, returned (never stashed on the module).

    scores:  (B, H, T, T) Q·Kᵀ/√D, scaled, before the mask and softmax.
    probs:   (B, H, T, T) softmax over keys after the mask, before dropout; rows sum to 1 and
             PAD key columns are exactly 0.

    With ``output_intermediates=True`` the record also carries every other step's tensor:
    q, k, v: (B, H, T, D) the projections split into heads (step [2]);
    context: (B, H, T, D) probs·V per head (step [3], S7), after ``head_mask`` if one was given;
    output:  (B, T, C) the merged context through W_O (steps [4]-[5], S8-S9), what the module returns.
    """

    scores: torch.Tensor
    probs: torch.Tensor
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    context: torch.Tensor | None = None
    output: torch.Tensor | None = None


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> tuple[torch.Tensor, AttentionRecord]:
    """Scaled dot-product attention, the readable way (S3-S7).

    Args:
        q, k, v: (B, H, T, D) queries, keys and values.
        bias: (B, 1, 1, T) additive mask from :func:`bertscope.core.masks.mask_to_bias`, or None.
        dropout: applied to the probabilities (S6); a no-op in eval mode.

    Returns:
        context (B, H, T, D) and the :class:`AttentionRecord` of scores and probabilities.
    """
    _check_qkv(q, k, v, bias)
    d = q.shape[-1]
    # [3] S3: every query against every key, scaled by 1/sqrt(D) so the softmax is not saturated.
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)  # (B, H, T, D)@(B, H, D, T) -> (B, H, T, T)
    # [3] S4: PAD keys get the dtype's minimum, so softmax gives them weight exactly 0.
    masked = scores if bias is None else scores + bias  # (B, H, T, T) + (B, 1, 1, T)
    # [3] S5: softmax along the key axis; every row sums to 1.
    probs = torch.softmax(masked, dim=-1)  # (B, H, T, T)
    # [3] S6: dropout on the probabilities, in training only.
    dropped = probs if dropout is None else dropout(probs)  # (B, H, T, T)
    # [3] S7: the context is the probability-weighted sum of the values.
    context = torch.matmul(dropped, v)  # (B, H, T, T)@(B, H, T, D) -> (B, H, T, D)
    return context, AttentionRecord(scores=scores, probs=probs)


def _check_qkv(q: object, k: object, v: object, bias: object) -> None:
    """One line naming the argument when q, k, v or bias do not fit each other (rather than
    torch's error from inside a matmul). Shapes only: no tensor is read."""
    for name, x in (("q", q), ("k", k), ("v", v), ("bias", bias)):
        if x is None and name == "bias":
            continue
        if not isinstance(x, torch.Tensor):
            raise InputTypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
        if name != "bias" and x.dim() != 4:
            raise InputError(f"{name} must be (B, H, T, D), got shape {tuple(x.shape)}")
    B, H, T, D = q.shape
    S = k.shape[2]
    if k.shape != (B, H, S, D) or v.shape[:3] != (B, H, S):
        raise InputError(f"q, k and v must be (B, H, T, D), (B, H, S, D) and (B, H, S, Dv) with the same B, H "
                         f"and S, got {tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
    if bias is not None:
        try:
            fits = torch.broadcast_shapes(bias.shape, (B, H, T, S)) == (B, H, T, S)
        except RuntimeError:
            fits = False
        if not fits:
            raise InputError(f"bias must broadcast to the scores' (B, H, T, S) = {(B, H, T, S)}, e.g. (B, 1, 1, S) "
                             f"from bertscope.core.masks.mask_to_bias; got shape {tuple(bias.shape)}")


class MultiHeadSelfAttention(nn.Module):
    """BERT self-attention: W_Q, W_K, W_V (C->C, with bias), H heads of D, then W_O (C->C).

    Parameters per layer: 4·C·C weights + 4·C biases (2,362,368 for C = 768).
    """

    def __init__(self, hidden_size: int = 768, num_heads: int = 12, dropout: float = 0.1,
                 *, fused: bool = True) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must be a probability in [0, 1), got {dropout!r}")
        if hidden_size % num_heads != 0:
            raise ConfigError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.dropout_p = dropout
        self.fused = fused  # False forces the reference path (for teaching and for tests)
        # S1: three different learned maps. With Q = K = x a token would match itself best.
        self.query = nn.Linear(hidden_size, hidden_size)  # W_Q
        self.key = nn.Linear(hidden_size, hidden_size)  # W_K
        self.value = nn.Linear(hidden_size, hidden_size)  # W_V
        self.output = nn.Linear(hidden_size, hidden_size)  # W_O (S9)
        self.dropout = nn.Dropout(dropout)  # S6

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, H, T, D)."""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, H, T, D)

    @staticmethod
    def merge_heads(context: torch.Tensor) -> torch.Tensor:
        """(B, H, T, D) -> (B, T, C): the heads' outputs side by side."""
        B, H, T, D = context.shape
        return context.transpose(1, 2).reshape(B, T, H * D)  # (B, H, T, D) -> (B, T, H, D) -> (B, T, C)

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        head_mask: torch.Tensor | None = None,
        *,
        bias: torch.Tensor | None = None,
        output_intermediates: bool = False,
        value_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, AttentionRecord | None]:
        """Self-attention over x.

        Args:
            x: (B, T, C) hidden states.
            attention_mask: (B, T), 1 = token, 0 = PAD; None means every position is a token.
            output_attentions: also return the scores and probabilities (reference path).
            head_mask: (H,) or (B, H) multipliers on each head's context before W_O;
                0 silences a head (ablation), 1 keeps it.
            bias: (B, 1, 1, T) an additive mask already built by :func:`mask_to_bias` (the
                encoder checks its mask and builds this once per forward); instead of
                ``attention_mask``, never with it.
            output_intermediates: the record also carries q, k, v, context and the output.
            value_mask: (B, T) multipliers on each token's value vector after W_V (0 removes
                what a token offers to every query; used by value zeroing).

        Returns:
            output (B, T, C) and an :class:`AttentionRecord` (or None if not asked for).
        """
        if not isinstance(x, torch.Tensor):
            raise InputTypeError(f"x must be a torch tensor (B, T, {self.hidden_size}), got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise InputError(f"x must be (B, T, {self.hidden_size}), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise InputError(f"x must hold floating-point hidden states, got {x.dtype}")
        w = getattr(self.query.weight, "dtype", None)  # a torch.ao quantized linear's weight is a method
        if isinstance(w, torch.dtype) and x.dtype != w and not torch.is_autocast_enabled(x.device.type):
            raise InputError(f"x is {x.dtype} but the module's weights are {w}: convert one to the other "
                             f"(x.to({w}), or module.to({x.dtype}))")
        B, T, C = x.shape
        if head_mask is not None:
            if not isinstance(head_mask, torch.Tensor):
                raise InputTypeError(f"head_mask must be a torch tensor (H,) or (B, H), got {type(head_mask).__name__}")
            H = self.num_heads
            if tuple(head_mask.shape) not in ((H,), (B, H)):
                raise InputError(f"head_mask must be (H,) = ({H},) or (B, H) = ({B}, {H}), "
                                 f"got {tuple(head_mask.shape)}")
        if value_mask is not None:
            if not isinstance(value_mask, torch.Tensor):
                raise InputTypeError(f"value_mask must be a torch tensor (B, T), got {type(value_mask).__name__}")
            if tuple(value_mask.shape) != (B, T):
                raise InputError(f"value_mask must be (B, T) = ({B}, {T}), got {tuple(value_mask.shape)}")
        if attention_mask is not None:
            if bias is not None:
                raise InputError("give attention_mask or bias, not both")
            check_attention_mask(attention_mask, B, T)
            bias = mask_to_bias(attention_mask, x.dtype)  # (B, 1, 1, T)

        # [1] S1: project every token to a query, a key and a value.
        q = self.query(x)  # (B, T, C)
        k = self.key(x)  # (B, T, C)
        v = self.value(x)  # (B, T, C)
        if value_mask is not None:
            v = v * value_mask.to(v.dtype)[:, :, None]  # (B, T, C) * (B, T, 1)
        # [2] S2: split C into H heads of D; each head attends on its own.
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (B, H, T, D) each

        # [3] S3-S7: scores, mask, softmax, dropout, context (the seed's scaled dot-product).
        record = None
        if output_attentions or output_intermediates or not self.fused:
            context, record = attention_reference(q, k, v, bias, self.dropout)  # (B, H, T, D)
        else:
            if bias is None and q.device.type == "cpu":  # torch's unmasked CPU kernel turns a query row of
                bias = q.new_zeros(1, 1, 1, T)  # NaN into zeros for T < 16 (torch 2.13); masked, it stays NaN
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=self.dropout_p if self.training else 0.0
            )  # (B, H, T, D)

        if head_mask is not None:
            hm = head_mask.to(context.dtype)
            hm = hm.view(1, -1, 1, 1) if hm.dim() == 1 else hm.view(B, -1, 1, 1)  # (B|1, H, 1, 1)
            context = context * hm  # (B, H, T, D)

        # [4] S8: merge the heads back side by side.
        merged = self.merge_heads(context)  # (B, H, T, D) -> (B, T, C)
        # [5] S9: the output projection W_O mixes what the heads found.
        out = self.output(merged)  # (B, T, C)
        if output_intermediates and record is not None:
            record = AttentionRecord(scores=record.scores, probs=record.probs, q=q, k=k, v=v,
                                     context=context, output=out)
        return out, record
