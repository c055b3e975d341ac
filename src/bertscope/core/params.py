"""Parameter counts (SPEC S10): attention per layer, all layers, the whole model."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..errors import InputTypeError
from .config import BertConfig
from .model import BertModel

__all__ = ["BUILT_LAYERS", "ParamCount", "count_config", "count_params", "matrix_counts"]

BUILT_LAYERS = 64  # count_config builds at most this many layers; deeper models are counted from two


@dataclass(frozen=True)
class ParamCount:
    """Counted from a built model (not from a formula), so a wrong module would show."""

    config: BertConfig
    per_matrix: dict[str, tuple[int, int]]  # "W_Q" -> (weights, biases) for one layer
    per_layer_weights: int  # attention weights of one layer, without biases
    per_layer_total: int  # attention weights + biases of one layer
    attention_total: int  # per_layer_total summed over every layer
    model_total: int  # every parameter of the encoder, pooler included

    @property
    def attention_share(self) -> float:
        """The attention's part of every parameter: attention_total / model_total."""
        return self.attention_total / self.model_total

    def to_json(self) -> dict:
        return {
            "hidden_size": self.config.hidden_size,
            "num_attention_heads": self.config.num_attention_heads,
            "head_size": self.config.head_size,
            "num_hidden_layers": self.config.num_hidden_layers,
            "per_matrix": {k: {"weights": w, "biases": b} for k, w_b in self.per_matrix.items()
                           for w, b in [w_b]},
            "per_layer_weights": self.per_layer_weights,
            "per_layer_total": self.per_layer_total,
            "attention_total": self.attention_total,
            "model_total": self.model_total,
            "attention_share": round(self.attention_share, 6),
        }


def matrix_counts(attn: nn.Module) -> dict[str, tuple[int, int]]:
    """(weights, biases) of each of one attention layer's four matrices: "W_Q" -> (C x C, C)."""
    return {label: (lin.weight.numel(), lin.bias.numel())
            for label, lin in (("W_Q", attn.query), ("W_K", attn.key), ("W_V", attn.value), ("W_O", attn.output))}


def count_params(model: nn.Module) -> ParamCount:
    """Count a :class:`bertscope.core.model.BertModel`'s attention and total parameters (of its
    encoder, for a classifier or the ``bertscope.load`` facade)."""
    for inner in (model, getattr(model, "encoder", None), getattr(model, "bert", None)):
        if isinstance(inner, BertModel):
            model = inner
            break
    else:
        raise InputTypeError(f"count_params counts a BERT model (bertscope.load(...), or its .model), "
                             f"got {type(model).__name__}")
    config: BertConfig = model.config  # type: ignore[assignment]
    per_matrix = matrix_counts(model.layers[0].attention)  # type: ignore[index]
    per_layer_weights = sum(w for w, _ in per_matrix.values())
    per_layer_total = sum(w + b for w, b in per_matrix.values())
    attention_total = sum(sum(p.numel() for p in layer.attention.parameters())
                          for layer in model.layers)  # type: ignore[union-attr]
    model_total = sum(p.numel() for p in model.parameters())
    return ParamCount(config, per_matrix, per_layer_weights, per_layer_total, attention_total, model_total)


def count_config(config: BertConfig) -> ParamCount:
    """:func:`count_params` of the model ``config`` describes, built on the meta device (shapes
    only: no weights allocated). Up to :data:`BUILT_LAYERS` layers the whole model is built; a
    deeper one (a config may say a million) would fill memory with modules, so it is built with
    one and with two layers, and every layer counts as the second did (they are built alike)."""
    import dataclasses

    import torch

    N = config.num_hidden_layers
    with torch.device("meta"):
        if N <= BUILT_LAYERS:
            return count_params(BertModel(config))
        one, two = (count_params(BertModel(dataclasses.replace(config, num_hidden_layers=n))) for n in (1, 2))
    layer = two.model_total - one.model_total  # every parameter of one layer
    return dataclasses.replace(two, config=config, attention_total=N * two.per_layer_total,
                               model_total=one.model_total + (N - 1) * layer)
