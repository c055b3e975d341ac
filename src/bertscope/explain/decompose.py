"""One layer's attention block, taken apart into what each token contributes to each other.

Shape legend:
    B  batch
    T  tokens; i is the receiving token (a query), j the giving token (a key)
    H  heads, D head size, C = H·D hidden size

Everything here reads the model's own intermediates (:class:`~bertscope.core.layer.LayerRecord`:
the value vectors, the probabilities, the LayerNorm's input) and the layer's own weights; no
forward arithmetic is redone. The decompositions are exact identities, and tests hold the sums
equal to the model's own tensors within 1e-5.

**Attention as a sum of vectors** (Kobayashi et al. 2020, "Attention is Not Only a Weight"):

    Attention(x)_i = Σ_h Σ_j α^h_ij f_h(x_j) + b_O,    f_h(x) = (x W_V^h + b_V^h) W_O^h

with W_V^h the h-th head's D columns of W_V, W_O^h the matching D rows of W_O, and the bias
b_O of W_O shared by every token (so it belongs to none of them).

**The attention block with its residual and LayerNorm** (Kobayashi et al. 2021,
"Incorporating Residual and Normalization Layers into Analysis of Masked Language Models";
Ferrando et al. 2022, "Measuring the Mixing of Contextual Information in the Transformer"):
the first LayerNorm's input is y_i = x_i + Attention(x)_i = Σ_j z_ij + b_O with

    z_ij = Σ_h α^h_ij f_h(x_j) + [i = j] x_i .

LayerNorm, LN(y) = γ ⊙ (y − mean(y)) / s(y) + β with s(y) = √(var(y) + ε), is affine in y
once s(y_i) is fixed at its actual value (centring is linear). So the block's output splits
exactly into one vector per giving token plus a part no token owns:

    LN(y_i) = Σ_j T_i(x_j) + c_i,   T_i(x_j) = γ ⊙ (z_ij − mean(z_ij)) / s(y_i),
                                   c_i = γ ⊙ (b_O − mean(b_O)) / s(y_i) + β .
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.layer import BertLayer, LayerRecord

__all__ = ["BlockTerms", "attention_block_terms", "head_vectors", "mixed_vectors"]


def head_vectors(layer: BertLayer, record: LayerRecord) -> torch.Tensor:
    """f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h for every head and token: (B, H, T, C).

    The value vectors (with b_V) come from the model's own record; W_O^h is the h-th block of
    D input columns of the output projection's weight; b_O is left out, as in the paper.
    """
    att = layer.attention
    v = record.attention.v  # (B, H, T, D), after W_V and b_V (and any value_mask)
    H, D = att.num_heads, att.head_size
    w_o = att.output.weight  # (C_out, C_in); y = merged @ w_o.T + b_O
    w_o_heads = w_o.view(w_o.shape[0], H, D).permute(1, 2, 0)  # (C, H, D) -> (H, D, C)
    return torch.einsum("bhjd,hdc->bhjc", v, w_o_heads)  # (B, H, T, D)@(H, D, C) -> (B, H, T, C)


def mixed_vectors(probs: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Σ_h α^h_ij f_h(x_j): what token j sends token i through all heads, (B, T_i, T_j, C).

    probs: (B, H, T_i, T_j) attention probabilities (rows may be a slice of the queries).
    f:     (B, H, T_j, C) from :func:`head_vectors`.
    """
    return torch.einsum("bhij,bhjc->bijc", probs, f)  # (B, H, Ti, Tj)·(B, H, Tj, C) -> (B, Ti, Tj, C)


@dataclass(frozen=True)
class BlockTerms:
    """The attention block's output for queries ``rows``, split by giving token.

    contributions: (B, R, T, C) T_i(x_j) for the R receiving tokens i in ``rows``.
    constant:      (B, R, C) c_i, the part of LN(y_i) no token owns (b_O through LN, and β).
    Σ_j contributions[:, i, j] + constant[:, i] = the first LayerNorm's output h_i.
    """

    contributions: torch.Tensor
    constant: torch.Tensor
    rows: slice


def attention_block_terms(layer: BertLayer, record: LayerRecord, rows: slice | None = None,
                          f: torch.Tensor | None = None) -> BlockTerms:
    """T_i(x_j) and c_i (see the module docstring) for the receiving tokens i in ``rows``.

    Args:
        layer: the model's layer whose record this is (its W_O, b_O and first LayerNorm).
        record: that layer's :class:`LayerRecord` from ``output_intermediates=True``, in eval
            mode (dropout would break the identity).
        rows: which receiving tokens (default all); the (B, R, T, C) result is built a slice of
            queries at a time by callers, to bound memory on long texts.
        f: :func:`head_vectors` of this layer, if already computed.
    """
    rows = slice(None) if rows is None else rows
    if f is None:
        f = head_vectors(layer, record)  # (B, H, T, C)
    probs = record.attention.probs[:, :, rows]  # (B, H, R, T)
    x = record.input  # (B, T, C)
    B, T, C = x.shape
    z = mixed_vectors(probs, f)  # (B, R, T, C)
    # the residual: token i carries itself, x_i, into z_ii
    idx = torch.arange(T, device=x.device)[rows]  # (R,)
    z[:, torch.arange(len(idx), device=x.device), idx] += x[:, idx]  # (B, R, C)
    norm = layer.attention_norm
    y = record.attention_residual[:, rows]  # (B, R, C), the LayerNorm's actual input
    s = torch.sqrt(y.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # (B, R, 1)
    gamma = norm.weight  # (C,)
    # T_i(x_j) = γ ⊙ (z_ij − mean(z_ij)) / s(y_i), in place: z is this call's own, and each
    # temporary would be as large (64 MiB a slice; the same arithmetic, in the same order)
    contributions = z.sub_(z.mean(dim=-1, keepdim=True)).mul_(gamma).div_(s[:, :, None])  # (B, R, T, C)
    b_o = layer.attention.output.bias  # (C,)
    constant = gamma * (b_o - b_o.mean()) / s + norm.bias  # (B, R, C)
    return BlockTerms(contributions=contributions, constant=constant, rows=rows)
