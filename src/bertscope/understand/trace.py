"""Trace one layer's attention step by step on real numbers: the seed's walk-through [1]-[5].

Shape legend: B batch (1 here), T tokens, H heads, D head size, C = H·D hidden size.

The trace reads the model's own intermediates: one forward with ``output_intermediates=True``
returns, for every layer, the attention module's q, k, v, scores, probabilities, context and
output and the layer's residuals and LayerNorm outputs (:class:`bertscope.core.layer.LayerRecord`).
Nothing is recomputed here except what the model never forms on its own: one head's raw q·k
row before ÷√D, the additive mask bias it added (from the same mask, by the same function),
and a seeded dropout sample. So the trace is the model's computation made
visible (a test holds it equal to the model and to HF).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..bert import Bert, analysis
from ..core.masks import mask_to_bias
from ..core.params import matrix_counts
from ..core.tokenizer import check_text, warn_truncated
from ..core.words import find_word, group_words, word_attention
from ..errors import InputError, as_count, bad_whole, as_index, as_whole_number, check_seed, setting

__all__ = ["Trace", "trace"]


@dataclass(frozen=True)
class Trace:
    """One layer, one head, one token, every step of self-attention.

    shapes:       step name -> tensor shape, in the order the steps happen.
    tokens:       the T sub-token strings; ``token_index`` is the traced token among them.
    raw_scores:   (T,) q_t·k_j for the traced head, before ÷√D.
    scores:       (T,) raw_scores / √D (what the model adds the mask to).
    mask:         (T,) the attention mask, 1 = token, 0 = PAD; ``bias`` (T,) what it adds.
    weights:      (T,) the softmax row (sums to 1; PAD keys exactly 0).
    dropped:      (T,) one seeded sample of the same row through dropout in training mode.
    word_weights: (W,) the traced WORD's row at word level: the mean of its sub-tokens' rows, each
                  summed over every word's sub-tokens (the view's rule). For a word of one token
                  it is ``weights`` summed by word; for a split word ("op ##ht ##hal ...") it is
                  not the traced token's row alone, which ``weights`` holds.
    head_output:  (B, T, C) the attention sublayer's output (after W_O) for all heads.
    layer_output: (B, T, C) the whole layer's output (residual, LayerNorm, feed-forward).
    probs:        (B, H, T, T) the layer's attention probabilities.
    params:       parameter counts of the layer's attention (and of one head's share).
    query:        (D,) the traced token's query in the traced head; ``keys``, ``values`` (T, D)
                  every token's key and value there; ``context`` (D,) the weighted sum of the
                  values, the head's output for the token (before the merge and W_O).
    """

    text: str
    layer: int
    head: int
    num_layers: int
    num_heads: int
    head_size: int
    hidden_size: int
    tokens: list[str]
    token_index: int
    words: list[str]
    word_index: int
    shapes: dict[str, tuple[int, ...]]
    raw_scores: torch.Tensor
    scores: torch.Tensor
    mask: torch.Tensor
    bias: torch.Tensor
    weights: torch.Tensor
    dropout_p: float
    dropped: torch.Tensor
    word_weights: torch.Tensor
    head_output: torch.Tensor
    layer_output: torch.Tensor
    probs: torch.Tensor
    params: dict[str, int] = field(default_factory=dict)
    query: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    context: torch.Tensor | None = None
    word_tokens: int = 1  # the traced word's sub-tokens ("ophthalmologist": 5); word_weights averages their rows

    def __repr__(self) -> str:  # a summary: the record holds every step's tensors
        top = ", ".join(f"{w} {v:.2f}" for w, v in self.top_words(3))
        token, word = self.tokens[self.token_index], self.words[self.word_index]
        # a split word: its top words average all its sub-tokens' rows, not only this token's
        of_word = f" of the word {word!r}, {self.word_tokens} tokens" if self.word_tokens > 1 else ""
        return (f"Trace({token!r} (token {self.token_index} of {len(self.tokens)}{of_word}), "
                f"layer {self.layer}, head {self.head}; top words: {top}; .to_json() for every step)")

    def top_tokens(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` tokens this head's query weighs most, with their weights."""
        vals, idx = self.weights.topk(min(as_count(k), self.weights.numel()))
        return [(self.tokens[i], float(v)) for v, i in zip(vals.tolist(), idx.tolist())]

    def top_words(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` words the traced word weighs most, from :attr:`word_weights` (its
        sub-tokens' rows averaged; a word: the sum over its tokens)."""
        vals, idx = self.word_weights.topk(min(as_count(k), self.word_weights.numel()))
        return [(self.words[i], float(v)) for v, i in zip(vals.tolist(), idx.tolist())]

    def to_json(self) -> dict:
        r6 = lambda t: [round(float(x), 6) for x in t.tolist()]  # noqa: E731
        return {
            "text": self.text, "layer": self.layer, "head": self.head,
            "num_layers": self.num_layers, "num_heads": self.num_heads,
            "head_size": self.head_size, "hidden_size": self.hidden_size,
            "tokens": self.tokens, "token_index": self.token_index,
            "words": self.words, "word_index": self.word_index, "word_tokens": self.word_tokens,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "raw_scores": r6(self.raw_scores), "scale": round(math.sqrt(self.head_size), 6),
            "scores": r6(self.scores), "mask": [int(x) for x in self.mask.tolist()],
            "bias": [float(x) for x in self.bias.tolist()],
            "weights": r6(self.weights), "weights_sum": round(float(self.weights.sum()), 6),
            "dropout_p": self.dropout_p, "dropped_sample": r6(self.dropped),
            "word_weights": r6(self.word_weights),
            "top_tokens": [[t, round(v, 6)] for t, v in self.top_tokens()],
            "top_words": [[w, round(v, 6)] for w, v in self.top_words()],
            "params": self.params,
        }


@analysis
def trace(bert: Bert, text: str, token: str, layer: int = 0, head: int = 0, *,
          occurrence: int = 1, pad: int = 0, seed: int = 0) -> Trace:
    """Run ``text`` through the model and trace layer ``layer``, head ``head`` for ``token``.

    ``pad`` appends that many [PAD] tokens (mask 0) so the mask has something to do.
    ``seed`` fixes the dropout sample shown for training mode.
    """
    text, token = check_text(text), check_text(token, "the word")
    if not text.strip():
        raise InputError("the text is empty")
    cfg = bert.config
    layer = as_index(setting("layer", "--layer"), layer, cfg.num_hidden_layers)
    head = as_index(setting("head", "--head"), head, cfg.num_attention_heads)
    n_pad = as_whole_number(pad)
    if n_pad is None or n_pad < 0:
        raise bad_whole(n_pad, f"{setting('pad', '--pad')}, how many [PAD] tokens to add, must be a whole number, 0 or more, "
                         f"got {pad!r}")
    pad = n_pad
    check_seed(seed)
    batch = bert.encode([text], warn=False)  # the warning once the word is found: else the error says it
    words = group_words(batch, text)
    w = find_word(words.words, token, occurrence, cut_text=text if batch.truncated[0] else None,
                  positions=bert.tokenizer.max_length)
    warn_truncated(batch.truncated, bert.tokenizer.max_length)
    t = words.token_words.index(w)  # the word's first sub-token

    ids, mask, types = batch.input_ids, batch.attention_mask, batch.token_type_ids  # (1, T)
    if pad:
        if ids.shape[1] + pad > cfg.max_position_embeddings:
            raise InputError(f"{setting('pad', '--pad')} {pad} makes the input longer than {cfg.max_position_embeddings} positions")
        ids = F.pad(ids, (0, pad), value=bert.tokenizer.pad_id)  # (1, T)
        mask = F.pad(mask, (0, pad), value=0)  # (1, T)
        types = F.pad(types, (0, pad), value=0)  # (1, T)
    tokens = batch.tokens[0] + ["[PAD]"] * pad
    dev = bert.device
    ids, mask, types = ids.to(dev), mask.to(dev), types.to(dev)

    model = bert.encoder
    out = model(ids, mask, types, output_intermediates=True)
    rec = out.intermediates[layer]  # this layer's every step, as the model computed it
    att = rec.attention  # q, k, v, scores, probs, context, output
    attn = model.layers[layer].attention
    x = rec.input  # (B, T, C): this layer's input
    B, T, C = x.shape
    H, D = att.q.shape[1], att.q.shape[-1]
    shapes: dict[str, tuple[int, ...]] = {
        "x": (B, T, C),
        # [1] project: Q = x·W_Q + b, K = x·W_K + b, V = x·W_V + b, each (B, T, C)
        "Q": (B, T, C), "K": (B, T, C), "V": (B, T, C),
        # [2] split heads: (B, T, C) -> (B, H, T, D)
        "Q heads": tuple(att.q.shape), "K heads": tuple(att.k.shape), "V heads": tuple(att.v.shape),
        # [3] scores, mask, softmax: (B, H, T, T); context = weights·V: (B, H, T, D)
        "scores": tuple(att.scores.shape), "weights": tuple(att.probs.shape), "context": tuple(att.context.shape),
        # [4] merge heads: (B, H, T, D) -> (B, T, C); [5] output projection W_O: (B, T, C)
        "merged": (B, T, H * D), "output": tuple(att.output.shape),
        "layer output": tuple(rec.output.shape),
    }
    raw = att.q[0, head, t] @ att.k[0, head].transpose(0, 1)  # (D,)@(D, T) -> (T,): before ÷√D
    bias = mask_to_bias(mask, x.dtype)  # (B, 1, 1, T): what the model added to the scores
    record = att
    head_output, layer_output = att.output, rec.output  # (B, T, C) each

    row = record.probs[0, head, t]  # (T,)
    p = attn.dropout_p
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dropped = F.dropout(row.float().cpu(), p=p, training=True)  # (T,) what training would see
    n_real = int(batch.attention_mask.shape[1])
    ww = word_attention(record.probs[0, head, :n_real, :n_real].float().cpu(), words.token_words)  # (W, W)

    counts = matrix_counts(attn)  # "W_Q" -> (weights, biases), counted from this layer's modules
    per = {label: w + b for label, (w, b) in counts.items()}
    params = {**per,
              "layer_weights": sum(w for w, _ in counts.values()),
              "layer_total": sum(per.values()),
              # a head owns D output columns of W_Q, W_K, W_V (and their biases) and D input rows of W_O
              "one_head_qkv": 3 * (C * D + D), "one_head_wo": D * C}
    return Trace(
        text=text, layer=layer, head=head, num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads, head_size=D, hidden_size=C,
        tokens=tokens, token_index=t, words=words.words, word_index=w, shapes=shapes,
        raw_scores=raw.float().cpu(), scores=record.scores[0, head, t].float().cpu(),
        mask=mask[0].cpu(), bias=bias[0, 0, 0].float().cpu(), weights=row.float().cpu(),
        dropout_p=p, dropped=dropped, word_weights=ww[w], word_tokens=words.token_words.count(w),
        head_output=head_output.float().cpu(), layer_output=layer_output.float().cpu(),
        probs=record.probs.float().cpu(), params=params,
        query=att.q[0, head, t].float().cpu(), keys=att.k[0, head].float().cpu(),
        values=att.v[0, head].float().cpu(), context=att.context[0, head, t].float().cpu(),
    )
