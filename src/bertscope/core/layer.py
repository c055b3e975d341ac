"""One encoder layer, written once: the post-LayerNorm recipe every path runs (SPEC S14).

Shape legend: B batch, T tokens, H heads, D head size, C = H·D hidden size, I feed-forward
width (4·C in BERT). On the packed path the leading (B, T) is one axis of N real tokens.

    h   = LayerNorm(x + Dropout(Attention(x)))          attention sublayer, residual, LayerNorm
    out = LayerNorm(h + Dropout(W2·act(W1·h + b1) + b2)) feed-forward sublayer, residual, LayerNorm

:meth:`BertLayer.run` is that recipe. The padded reference path (:meth:`BertLayer.forward`),
the packed fast path (:mod:`bertscope.fast.encoder`) and ``trace`` all go through it; they
differ only in how tokens are laid out and how the two sublayers are computed (three
projections and masked attention over (B, T), or one fused projection and attention per
length group over (N,)). Nothing about residuals, LayerNorm or dropout is written twice, with
one exception, for speed: int8 inference on compiled steps
(:meth:`bertscope.fast.quant.CompiledSteps.run_layer`) fuses the residual and LayerNorm into the
steps around its integer GEMMs, and ``tests/test_int8.py`` holds it to this recipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionRecord, MultiHeadSelfAttention
from .config import ACTIVATION_NAMES, BertConfig

__all__ = ["ACTIVATIONS", "BertLayer", "FeedForward", "LayerRecord", "activation"]


# The one activation table: config.hidden_act -> function. BERT was trained with the exact
# erf GELU; "gelu_new" / "gelu_pytorch_tanh" name the tanh approximation some checkpoints use.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES  # config.py validates against the same names
# The same functions, writing over their input (the same kernels, so the same values): for
# inference steps that own their tensor and would otherwise allocate another one as large.
_IN_PLACE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_new": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
}
assert tuple(_IN_PLACE) == ACTIVATION_NAMES


def activation(name: str, in_place: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function a config's ``hidden_act`` names (``in_place``: the version that
    overwrites its input and returns it; not for tensors autograd needs)."""
    return (_IN_PLACE if in_place else ACTIVATIONS)[name]


@dataclass(frozen=True)
class LayerRecord:
    """Every intermediate of one layer, when asked for (``output_intermediates=True``).

    input:        (B, T, C) the layer's input x.
    attention:    the attention module's :class:`AttentionRecord` (q, k, v, scores, probs,
                  context, output), or None on paths that do not record it.
    attention_output: (B, T, C) Attention(x), after W_O, before dropout and the residual.
    attention_residual: (B, T, C) x + Attention(x), the input of the first LayerNorm.
    hidden:       (B, T, C) h, after the first LayerNorm.
    ffn_output:   (B, T, C) the feed-forward's output, before dropout and the residual.
    ffn_residual: (B, T, C) h + FFN(h), the input of the second LayerNorm.
    output:       (B, T, C) the layer's output.
    """

    input: torch.Tensor
    attention: AttentionRecord | None
    attention_output: torch.Tensor
    attention_residual: torch.Tensor
    hidden: torch.Tensor
    ffn_output: torch.Tensor
    ffn_residual: torch.Tensor
    output: torch.Tensor


class FeedForward(nn.Module):
    """Position-wise feed-forward: C -> I, activation, I -> C."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense_in = nn.Linear(config.hidden_size, config.intermediate_size)  # W1
        self.dense_out = nn.Linear(config.intermediate_size, config.hidden_size)  # W2
        self.act_name = config.hidden_act
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_out(self.act(self.dense_in(x)))  # (..., C) -> (..., I) -> (..., C)


# A sublayer as a path computes it: attention maps x to (Attention(x), its record or None);
# the feed-forward maps h to FFN(h).
AttendFn = Callable[[torch.Tensor], "tuple[torch.Tensor, AttentionRecord | None]"]
FeedForwardFn = Callable[[torch.Tensor], torch.Tensor]


class BertLayer(nn.Module):
    """One encoder layer: attention -> residual -> LayerNorm -> feed-forward -> residual -> LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = MultiHeadSelfAttention(
            config.hidden_size, config.num_attention_heads, config.attention_probs_dropout_prob
        )
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = FeedForward(config)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def run(self, x: torch.Tensor, attend: AttendFn, feed_forward: FeedForwardFn | None = None,
            record: bool = False) -> tuple[torch.Tensor, LayerRecord | None]:
        """The recipe, with the two sublayers as the caller computes them.

        Args:
            x: (..., C) the layer's input: (B, T, C) padded, or (N, C) packed.
            attend: x -> (Attention(x), record or None).
            feed_forward: h -> FFN(h); default: this layer's own :class:`FeedForward`.
            record: return a :class:`LayerRecord` of every intermediate.

        Returns:
            the layer's output (same shape as x) and the record (or None).
        """
        ff = self.feed_forward if feed_forward is None else feed_forward
        attended, att_record = attend(x)  # (..., C)
        residual = x + self.dropout(attended)  # (..., C)
        h = self.attention_norm(residual)  # (..., C)
        ffn = ff(h)  # (..., C)
        residual2 = h + self.dropout(ffn)  # (..., C)
        out = self.output_norm(residual2)  # (..., C)
        if not record:
            return out, None
        return out, LayerRecord(input=x, attention=att_record, attention_output=attended,
                                attention_residual=residual, hidden=h, ffn_output=ffn,
                                ffn_residual=residual2, output=out)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                output_attentions: bool = False, head_mask: torch.Tensor | None = None, *,
                output_intermediates: bool = False, value_mask: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, AttentionRecord | LayerRecord | None]:
        """The padded reference path of one layer.

        Args:
            x: (B, T, C).
            bias: (B, 1, 1, T) additive PAD mask (:func:`bertscope.core.masks.mask_to_bias`), or None.
            output_attentions: return the attention's :class:`AttentionRecord`.
            head_mask: (H,) or (B, H) multipliers on each head's context.
            output_intermediates: return a :class:`LayerRecord` instead (it holds the attention's).
            value_mask: (B, T) multipliers on each token's value vector (value zeroing).

        Returns:
            (B, T, C) and the record asked for (or None).
        """
        seen: list[AttentionRecord | None] = []

        def attend(h: torch.Tensor):
            out, att = self.attention(h, None, output_attentions, head_mask, bias=bias,
                                      output_intermediates=output_intermediates, value_mask=value_mask)
            seen.append(att)
            return out, att

        out, rec = self.run(x, attend, record=output_intermediates)
        return out, rec if output_intermediates else seen[0]
