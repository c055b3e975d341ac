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
from torch import nn

import numbers
import threading
import weakref
from contextlib import contextmanager
from typing import Iterator, Mapping

from ..errors import InputError, InputTypeError
from .activity import marks_runs
from .attention import AttentionRecord
from .config import BertConfig
from .layer import BertLayer, FeedForward, LayerRecord
from .masks import check_attention_mask, mask_to_bias
from .outputs import BertOutput
from .tokenizer import Batch

__all__ = ["BertEmbeddings", "BertLayer", "BertModel", "BertPooler", "FeedForward", "check_id_lists", "check_inputs",
           "check_tensor", "evaluating"]


_EVAL_LOCK = threading.Lock()
# module -> [how many blocks hold it in eval mode now, the mode it was in before the first]
_EVAL_HOLDS: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (dropout off) for the block, then in the modes it was in, module by
    module (a user's frozen part stays in eval mode): every reading of attention, an explanation
    or an embedding is taken with dropout off, even on a model its user left in training mode.

    Blocks may overlap, in one thread or several (two threads embedding with one model, or one
    explaining a classifier while another embeds with its encoder): a module stays in eval mode
    while any block holds it, and the last block to leave it gives it back the mode it had
    before the first. (A training step running meanwhile in another thread would see eval mode.)
    """
    modules = list(model.modules())
    with _EVAL_LOCK:
        for m in modules:
            hold = _EVAL_HOLDS.get(m)
            if hold is None:
                hold = _EVAL_HOLDS[m] = [0, m.training]
            m.training = False  # on every entry: a model.train() meanwhile must not turn dropout on
            hold[0] += 1
    try:
        yield model
    finally:
        with _EVAL_LOCK:
            for m in modules:
                hold = _EVAL_HOLDS[m]
                hold[0] -= 1
                if hold[0] == 0:
                    del _EVAL_HOLDS[m]
                    m.training = hold[1]


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

    def forward(self, input_ids: torch.Tensor | None, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None, *,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, T, C); or, with ``position_ids`` given, ids of any shape, e.g. the
        (N,) tokens of a packed batch -> (N, C).

        ``inputs_embeds`` (B, T, C), given instead of ``input_ids``, stands in for the word
        embeddings (as in HF transformers): gradient attributions differentiate through it.
        """
        words = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        if position_ids is None:
            T = words.shape[1]
            position_ids = torch.arange(T, device=words.device)[None, :]  # (1, T)
        x = (
            words  # (B, T, C)
            + self.position_embeddings(position_ids)  # (1, T, C)
            + self.token_type_embeddings(token_type_ids)  # (B, T, C)
        )
        return self.dropout(self.norm(x))  # (B, T, C)


class BertPooler(nn.Module):
    """tanh(W·h_[CLS] + b): BERT's sentence vector for next-sentence prediction."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))  # (B, T, C) -> (B, C)


def check_tensor(x: object, name: str) -> None:
    """InputTypeError (one line) unless ``x`` is None or a torch tensor."""
    if x is not None and not isinstance(x, torch.Tensor):
        if isinstance(x, Batch):  # bertscope's own encode(): its tensors are the arguments
            hint = "; pass batch.input_ids, batch.attention_mask, batch.token_type_ids"
        elif name in ("input_ids", "attention_mask"):
            hint = "; bert.encode(texts) gives a batch of them"
        else:
            hint = ""
        shape = {"head_mask": "(layers, heads)", "inputs_embeds": "(B, T, C)"}.get(name, "(B, T)")
        raise InputTypeError(f"{name} must be a torch tensor {shape}, got {type(x).__name__}{hint}")


def check_id_lists(config: BertConfig, ids: object, what: str = "ids", vocab: int | None = None) -> None:
    """Raise InputError (one line) unless ``ids`` holds token-id lists the model can run: a
    sequence of lists (or of 1-D integer tensors or arrays), or a 2-D integer tensor or array;
    each row whole numbers in 0..``vocab`` - 1 (default: the vocabulary), 1 to
    max_position_embeddings long."""
    ndim = getattr(ids, "ndim", None)  # a tensor, an array or a pandas Series
    if (isinstance(ids, (str, bytes, Mapping, set, frozenset))
            or not (hasattr(ids, "__len__") and hasattr(ids, "__getitem__"))
            or ndim not in (None, 2) and not (ndim == 1 and str(getattr(ids, "dtype", "")) == "object")):
        shape = f" of shape {tuple(ids.shape)}" if hasattr(ids, "shape") else ""
        raise InputTypeError(f"{what} must be a list of token-id lists, got {type(ids).__name__}{shape}")
    P, V = config.max_position_embeddings, config.vocab_size if vocab is None else vocab
    name = "the vocabulary" if vocab is None else "the segment types"
    for i, one in enumerate(ids):
        if isinstance(one, (str, bytes)) or not hasattr(one, "__len__") or getattr(one, "ndim", 1) != 1:
            raise InputTypeError(f"{what}[{i}] must be a list of token ids, got {type(one).__name__}")
        if not 1 <= len(one) <= P:
            raise InputError(f"{what}[{i}] has {len(one)} tokens; the model takes 1 to {P} "
                             "(with [CLS] and [SEP])")
        if hasattr(one, "dtype") and str(one.dtype) != "object":  # a tensor or array row: its dtype says
            if "int" not in str(one.dtype):
                raise InputTypeError(f"{what}[{i}] must hold whole-number token ids, not {one.dtype}")
            lo, hi = int(one.min()), int(one.max())
        else:
            lo, hi = min(one), max(one)
            bad = [v for v in (lo, hi) if isinstance(v, bool) or not isinstance(v, numbers.Integral)]
            if bad:
                raise InputTypeError(f"{what}[{i}] must hold whole-number token ids, found {bad[0]!r}")
        if lo < 0 or hi >= V:
            raise InputError(f"{what}[{i}] holds ids {lo}..{hi}; they must lie in 0..{V - 1} ({name})")


def _wider(dtype: torch.dtype, than: torch.dtype) -> bool:
    """Whether ``dtype`` does not promote to ``than`` (float64 against float32; float8, which
    torch does not promote at all)."""
    try:
        return torch.promote_types(dtype, than) != than
    except RuntimeError:
        return True


INFERENCE_WEIGHTS = ("this model was loaded inside torch.inference_mode(): its weights are inference tensors, "
                     "which no gradient can pass through; load it outside inference mode (torch.no_grad() is "
                     "fine) to take gradients")


def check_inputs(config: BertConfig, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None, head_mask: torch.Tensor | None = None, *,
                 inputs_embeds: torch.Tensor | None = None) -> None:
    """Raise InputError (a ValueError; one sentence) unless the batch fits the model: ids (B, T) with
    1 <= T <= positions and every id in the vocabulary (or, instead of ids, ``inputs_embeds``
    (B, T, C) floats); a 0/1 mask and segment ids in range of the same shape; a (layers, heads)
    head_mask. Run once per forward (each check that reads values is one reduction, and one
    host sync on a GPU)."""
    for x, name in ((input_ids, "input_ids"), (attention_mask, "attention_mask"),
                    (token_type_ids, "token_type_ids"), (inputs_embeds, "inputs_embeds"), (head_mask, "head_mask")):
        check_tensor(x, name)
    if (input_ids is None) == (inputs_embeds is None):
        raise InputError("give input_ids or inputs_embeds (exactly one of them)")
    if inputs_embeds is not None:
        C = config.hidden_size
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != C:
            raise InputError(f"inputs_embeds must be (B, T, {C}), got {tuple(inputs_embeds.shape)}")
        if not inputs_embeds.is_floating_point():
            raise InputError(f"inputs_embeds must be floating point, got {inputs_embeds.dtype}")
        B, T = inputs_embeds.shape[:2]
    else:
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be (B, T), got {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise InputError(f"input_ids must be integer token ids, got {input_ids.dtype}")
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= config.vocab_size):
            raise InputError(f"input_ids must lie in 0..{config.vocab_size - 1} (the vocabulary), "
                             f"got {int(input_ids.min())}..{int(input_ids.max())}")
    if T == 0:
        raise InputError("the input has no tokens (T = 0): a BERT input holds at least [CLS]")
    if T > config.max_position_embeddings:
        raise InputError(f"{T} tokens exceed the model's {config.max_position_embeddings} positions")
    if attention_mask is not None:
        check_attention_mask(attention_mask, B, T)
    if token_type_ids is not None:
        if tuple(token_type_ids.shape) != (B, T):
            raise InputError(f"token_type_ids must have the shape of input_ids ({B}, {T}), "
                             f"got {tuple(token_type_ids.shape)}")
        if token_type_ids.is_floating_point() or token_type_ids.dtype == torch.bool:
            raise InputError(f"token_type_ids must be integer segment ids, got {token_type_ids.dtype}")
        n = config.type_vocab_size
        if token_type_ids.numel() and (int(token_type_ids.min()) < 0 or int(token_type_ids.max()) >= n):
            raise InputError(f"token_type_ids must lie in 0..{n - 1} (the model has {n} segment types), "
                             f"got {int(token_type_ids.min())}..{int(token_type_ids.max())}")
    if head_mask is not None:
        N, H = config.num_hidden_layers, config.num_attention_heads
        if tuple(head_mask.shape) != (N, H):
            raise InputError(f"head_mask must be (layers, heads) = ({N}, {H}), got {tuple(head_mask.shape)}")


class BertModel(nn.Module):
    """The BERT encoder: embeddings, N layers, pooler. Load real weights with bertscope.load.

    This is the readable reference: a padded (B, T) batch, the PAD mask as an additive bias.
    The packed fast path (:mod:`bertscope.fast.encoder`) runs the same layers on real tokens
    only; :class:`bertscope.Bert` chooses it for plain inference.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if not isinstance(config, BertConfig):
            raise InputTypeError(f"BertModel takes a BertConfig (e.g. BertConfig.preset(\"bert-base\")), "
                                 f"not {type(config).__name__}")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = BertPooler(config)
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

    @marks_runs  # a kernel choice measured on another thread meanwhile knows (core.activity)
    def forward(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        head_mask: torch.Tensor | None = None,
        *,
        output_intermediates: bool = False,
        inputs_embeds: torch.Tensor | None = None,
    ) -> BertOutput:
        """Encode a padded batch.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, T), 1 = token, 0 = PAD; None = no padding.
            token_type_ids: (B, T) segment ids (0 = A, 1 = B); None = all A.
            output_attentions: return every layer's probabilities (and scores).
            output_hidden_states: return the embeddings and every layer's output.
            head_mask: (N, H) multipliers on each head's context before W_O (0 = silence).
            output_intermediates: return every layer's :class:`~bertscope.core.layer.LayerRecord`
                (q, k, v, scores, probs, context, sublayer outputs, residuals).

        Returns:
            a :class:`bertscope.core.outputs.BertOutput`. Outputs at PAD positions are whatever
            arithmetic on the PAD embeddings gave: nobody should use them.
        """
        check_inputs(self.config, input_ids, attention_mask, token_type_ids, head_mask,
                     inputs_embeds=inputs_embeds)
        table = self.embeddings.word_embeddings.weight
        if inputs_embeds is not None and _wider(inputs_embeds.dtype, table.dtype):
            # wider than the weights (float64 on fp32): torch's "mixed dtype (CPU)" from the LayerNorm;
            # narrower (bf16 on fp32) is promoted at the first addition, as it always was
            raise InputError(f"inputs_embeds must be {table.dtype}, as the model's weights are (or narrower), got "
                             f"{inputs_embeds.dtype}: pass inputs_embeds.to({table.dtype})")
        if torch.is_grad_enabled() and table.is_inference():
            # weights made inside torch.inference_mode(): no gradient can pass through them, and
            # autograd refuses to record them; without one to compute, the same numbers under no_grad
            if any(t is not None and t.requires_grad for t in (inputs_embeds, head_mask)):
                raise InputError(INFERENCE_WEIGHTS)
            with torch.no_grad():
                return self.forward(input_ids, attention_mask, token_type_ids, output_attentions,
                                    output_hidden_states, head_mask, output_intermediates=output_intermediates,
                                    inputs_embeds=inputs_embeds)
        if token_type_ids is None:
            given = input_ids if inputs_embeds is None else inputs_embeds
            token_type_ids = torch.zeros(given.shape[:2], dtype=torch.long, device=given.device)  # (B, T)
        x = self.embeddings(input_ids, token_type_ids, inputs_embeds=inputs_embeds)  # (B, T, C)
        # The mask is checked above and turned into an additive bias here, once for every layer.
        bias = None if attention_mask is None else mask_to_bias(attention_mask, x.dtype)  # (B, 1, 1, T)
        want_attn = output_attentions or output_intermediates
        hidden_states = [x] if output_hidden_states else None
        attentions: list[torch.Tensor] = []
        scores: list[torch.Tensor] = []
        records: list[LayerRecord] = []
        for i, layer in enumerate(self.layers):
            x, rec = layer(x, bias, want_attn, None if head_mask is None else head_mask[i],
                           output_intermediates=output_intermediates)  # (B, T, C)
            if hidden_states is not None:
                hidden_states.append(x)
            if isinstance(rec, LayerRecord):
                records.append(rec)
                rec = rec.attention
            if output_attentions and isinstance(rec, AttentionRecord):
                attentions.append(rec.probs)  # (B, H, T, T)
                scores.append(rec.scores)  # (B, H, T, T)
        return BertOutput(
            last_hidden_state=x,
            pooler_output=self.pooler(x) if self.pooler is not None else None,  # None: saved without one
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if output_attentions else None,
            scores=tuple(scores) if output_attentions else None,
            intermediates=tuple(records) if output_intermediates else None,
        )
