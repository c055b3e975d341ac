"""The BERT encoder around the attention (SPEC S14).

Shape legend: B batch, T tokens, H heads, D head size, C = H·D hidden size, I feed-forward
width (4·C in BERT), N layers, V vocabulary.

    embeddings:  word + position + segment, LayerNorm, dropout          (B, T) -> (B, T, C)
    N x layer:   x = LayerNorm(x + Dropout(Attention(x)))               (post-LayerNorm, as BERT)
                 x = LayerNorm(x + Dropout(W2·GELU(W1·x)))
    pooler:      tanh(W·x[:, 0] + b)                                    (B, T, C) -> (B, C)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import AttentionRecord, MultiHeadSelfAttention
from .config import BertConfig
from .masks import check_attention_mask
from .outputs import BertOutput
from .packed import pack, packed_encode, unpack

__all__ = ["BertEmbeddings", "BertLayer", "BertModel", "BertPooler", "FeedForward"]


_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # exact erf form, as BERT was trained
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class BertEmbeddings(nn.Module):
    """Token + position + segment embeddings, then LayerNorm and dropout (S11, S14).

    Attention alone is blind to order (S11); the position embeddings added here are where
    order enters the model.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        C = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, C, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, C)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, C)
        self.norm = nn.LayerNorm(C, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None, :]  # (1, T)
        x = (
            self.word_embeddings(input_ids)  # (B, T, C)
            + self.position_embeddings(position_ids)  # (1, T, C)
            + self.token_type_embeddings(token_type_ids)  # (B, T, C)
        )
        return self.dropout(self.norm(x))  # (B, T, C)


class FeedForward(nn.Module):
    """Position-wise feed-forward: C -> I, GELU, I -> C."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense_in = nn.Linear(config.hidden_size, config.intermediate_size)  # W1
        self.dense_out = nn.Linear(config.intermediate_size, config.hidden_size)  # W2
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_out(self.act(self.dense_in(x)))  # (..., C) -> (..., I) -> (..., C)


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

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None,
                output_attentions: bool = False, head_mask: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, AttentionRecord | None]:
        attended, record = self.attention(x, attention_mask, output_attentions, head_mask)  # (B, T, C)
        x = self.attention_norm(x + self.dropout(attended))  # (B, T, C)
        x = self.output_norm(x + self.dropout(self.feed_forward(x)))  # (B, T, C)
        return x, record


class BertPooler(nn.Module):
    """tanh(W·h_[CLS] + b): BERT's sentence vector for next-sentence prediction."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # (B, T, C) -> (B, C)


class BertModel(nn.Module):
    """The BERT encoder: embeddings, N layers, pooler. Load real weights with bertscope.load."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = BertPooler(config)
        # Inference without probabilities, hidden states or head_mask takes the packed path
        # (bertscope.packed): no arithmetic on PAD. False forces the padded reference path.
        self.packed_inference = True
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        head_mask: torch.Tensor | None = None,
    ) -> BertOutput:
        """Encode a batch.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T), 1 = token, 0 = PAD; None = no padding.
            token_type_ids: (B, T) segment ids (0 = A, 1 = B); None = all A.
            output_attentions: return every layer's probabilities (and scores).
            output_hidden_states: return the embeddings and every layer's output.
            head_mask: (N, H) multipliers on each head's context before W_O (0 = silence).

        Returns:
            a :class:`bertscope.outputs.BertOutput`. On the packed path (the default in eval
            mode when no attentions, hidden states or head_mask are asked for) the PAD positions
            of ``last_hidden_state`` are 0; on the padded path they hold values nobody should use.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T), got {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(
                f"{T} tokens exceed the model's {self.config.max_position_embeddings} positions"
            )
        if attention_mask is not None:
            check_attention_mask(attention_mask, B, T)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)  # (B, T)
        N = self.config.num_hidden_layers
        if head_mask is not None and tuple(head_mask.shape) != (N, self.config.num_attention_heads):
            raise ValueError(
                f"head_mask must be (layers, heads) = ({N}, {self.config.num_attention_heads}), "
                f"got {tuple(head_mask.shape)}"
            )

        if (self.packed_inference and not self.training and not output_attentions
                and not output_hidden_states and head_mask is None):
            packed = pack(input_ids, attention_mask, token_type_ids)  # (N,) real tokens only
            x = unpack(packed_encode(self, packed), packed, B)  # (N, C) -> (B, T, C)
            return BertOutput(last_hidden_state=x, pooler_output=self.pooler(x))

        x = self.embeddings(input_ids, token_type_ids)  # (B, T, C)
        hidden_states = [x] if output_hidden_states else None
        attentions: list[torch.Tensor] | None = [] if output_attentions else None
        scores: list[torch.Tensor] | None = [] if output_attentions else None
        for i, layer in enumerate(self.layers):
            x, record = layer(x, attention_mask, output_attentions,
                              None if head_mask is None else head_mask[i])  # (B, T, C)
            if hidden_states is not None:
                hidden_states.append(x)
            if record is not None and attentions is not None and scores is not None:
                attentions.append(record.probs)  # (B, H, T, T)
                scores.append(record.scores)  # (B, H, T, T)
        return BertOutput(
            last_hidden_state=x,
            pooler_output=self.pooler(x),
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
            scores=tuple(scores) if scores is not None else None,
        )
