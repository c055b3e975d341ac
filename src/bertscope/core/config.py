"""BERT configuration: a frozen, typed record of the numbers that shape the model.

`BertConfig.from_json` reads a checkpoint's config.json; `BertConfig.preset` names the
well-known sizes. Every field is required in a checkpoint's file except where the BERT
format itself has a documented default (noted beside the field); nothing is guessed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import BertscopeError, InputTypeError

__all__ = ["ACTIVATION_NAMES", "BertConfig", "ConfigError", "PRESETS"]

_INT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size", "max_position_embeddings", "type_vocab_size", "pad_token_id")
# The activations bertscope implements (core/layer.py holds the one table of their functions).
ACTIVATION_NAMES = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
# A sanity bound, not a BERT limit: checkpoints in the wild use 512 to 8192 positions; a
# config asking for far more is a typo that would try to allocate terabytes.
_MAX_POSITIONS = 1 << 17


class ConfigError(BertscopeError, ValueError):
    """A config.json that does not describe a BERT encoder bertscope can build."""


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768  # C = H * D
    num_hidden_layers: int = 12
    num_attention_heads: int = 12  # H; head size D = hidden_size // num_attention_heads
    intermediate_size: int = 3072  # feed-forward width, 4 * C in BERT
    hidden_act: str = "gelu"  # exact erf GELU, as BERT was trained with (not the tanh approximation)
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1  # S6: dropout on the attention probabilities
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # segments A and B
    layer_norm_eps: float = 1e-12  # BERT's value; far smaller than PyTorch's default 1e-5
    pad_token_id: int = 0
    do_lower_case: bool = True  # not in config.json; read from the tokenizer's files on load

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be a whole number, got {value!r}")
            if value <= 0 and name != "pad_token_id":
                raise ConfigError(f"{name} must be positive, got {value}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id {self.pad_token_id} is outside the vocabulary of {self.vocab_size}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.layer_norm_eps < 1.0:
            raise ConfigError(f"layer_norm_eps must be in (0, 1), got {self.layer_norm_eps}")
        if self.max_position_embeddings > _MAX_POSITIONS:
            raise ConfigError(f"max_position_embeddings {self.max_position_embeddings} is beyond "
                              f"what bertscope supports ({_MAX_POSITIONS})")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in ACTIVATION_NAMES:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported")
        if not isinstance(self.do_lower_case, bool):
            raise ConfigError(f"do_lower_case must be true or false, got {self.do_lower_case!r}")

    @property
    def head_size(self) -> int:
        """D, the width of one head (64 in BERT-base)."""
        return self.hidden_size // self.num_attention_heads

    @property
    def num_parameters(self) -> int:
        """Every parameter of the encoder and pooler, by formula (count_params counts a built model):
        embeddings (V + P + types)·C + LayerNorm 2C; per layer 4(C² + C) attention, 2·2C
        LayerNorms, C·I + I + I·C + C feed-forward; pooler C² + C."""
        C, I = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * C + 2 * C
        layer = 4 * (C * C + C) + 2 * (2 * C) + (C * I + I) + (I * C + C)
        return embeddings + self.num_hidden_layers * layer + (C * C + C)

    def flop_terms(self, lengths: Sequence[int], layers: int | None = None) -> tuple[float, float]:
        """(linear, attention): FLOPs that real tokens need through ``layers`` layers (default:
        all), 2 per multiply-add; no padding, no embeddings, no softmax, no pooler.

        Per layer and sequence of L tokens, linear (grows with L): projections Q, K, V, O
        2·L·4C² and the feed-forward 2·L·2CI; attention (grows with L²): scores QKᵀ and context
        P·V, 2·2·L²·C.
        """
        C, I = self.hidden_size, self.intermediate_size
        N = self.num_hidden_layers if layers is None else layers
        linear = N * sum(lengths) * 2 * (4 * C * C + 2 * C * I)
        attention = N * sum(L * L for L in lengths) * 4 * C
        return float(linear), float(attention)

    def flops(self, lengths: Sequence[int], layers: int | None = None) -> float:
        """All of :meth:`flop_terms`: the useful FLOPs of a forward over ``lengths``."""
        return sum(self.flop_terms(lengths, layers))

    @classmethod
    def preset(cls, name: str) -> "BertConfig":
        """A named size: "bert-base", "bert-large" or "minilm-l6" (the bundled model's shape)."""
        try:
            return PRESETS[name]
        except KeyError:
            raise ConfigError(
                f"unknown preset {name!r}; choose one of: {', '.join(sorted(PRESETS))}"
            ) from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BertConfig":
        """A config from the keys of a Hugging Face config.json. The six shape keys (vocab_size,
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
        max_position_embeddings) must be there: a default would give another model BERT-base's
        shape in silence. Other keys default as in ``BertConfig()``; unknown keys are ignored.
        To change a few fields of the defaults, call ``BertConfig(hidden_size=...)`` instead."""
        if not isinstance(data, Mapping):
            raise InputTypeError(f"a config must be a dict (what config.json holds), got {type(data).__name__}")
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ConfigError(f"model_type is {model_type!r}, not 'bert'")
        pos_type = data.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise ConfigError(f"position_embedding_type {pos_type!r} is not supported (only 'absolute')")
        required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings")
        missing = [k for k in required if k not in data]
        if missing:
            raise ConfigError(f"the config lacks {', '.join(missing)} (config.json names every shape key; "
                              "BertConfig(...) takes a few with defaults for the rest)")
        fields = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in fields}
        return cls(**kwargs)

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        """Read a Hugging Face-format config.json."""
        if not isinstance(path, (str, os.PathLike)):
            raise InputTypeError(f"path must be a str or a Path, got {type(path).__name__}")
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path} is not a readable JSON file ({e})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} does not hold a JSON object")
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> "BertConfig":
        return replace(self, **changes)


PRESETS: dict[str, BertConfig] = {
    "bert-base": BertConfig(),
    "bert-large": BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                             intermediate_size=4096),
    "minilm-l6": BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                            intermediate_size=1536),
}
