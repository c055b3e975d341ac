"""Silence heads and measure what changes (after Michel et al. 2019, "Are Sixteen Heads Really
Better than One?").

Shape legend: N layers, H heads, T tokens, W words, C hidden size.

A head is silenced through the model's ``head_mask``: its context (B, H, T, D) is multiplied by 0
before the heads are merged and W_O is applied, so W_O's bias and the other heads are untouched.
Michel et al. rank heads by the change of a task's loss; with no task here, bertscope ranks them
by how much the model's output changes: 1 - cosine between the last hidden state of each token
with and without the head (averaged over tokens), and 1 - cosine of the sentence embedding
(the mean-pooled, normalised last hidden state, as the bundled sentence-transformers model uses;
of the text as ``embed`` reads it: a text longer than the model's ``max_seq_length``, 256 tokens
for the bundled model, gets the embedding's own forward passes on its first 256 tokens).

A silenced head changes nothing in its own layer's attention probabilities (the mask acts after
the softmax); the layers after it see different inputs, so their attention moves. That move is
measured for one chosen word as the total variation distance (half the L1 distance) between its
word-level attention rows with and without the silenced heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import InputError, as_count, as_whole_number
from ..core.tokenizer import check_text, no_tokens, warn_truncated
from ..core.words import find_word, group_words, word_attention
from ..bert import Bert, analysis

__all__ = ["Ablation", "HeadEffects", "ablate", "sweep"]


@dataclass(frozen=True)
class Ablation:
    """What silencing ``heads`` did to one text.

    token_cosine:     (T,) cosine of each token's last hidden state with vs without the heads.
    embedding_cosine: cosine of the sentence embeddings with vs without.
    word_shift:       (N, H) total variation distance of ``word``'s attention row per layer and
                      head (None if no word was asked for); ``before``/``after`` the rows (N, H, W).
    """

    text: str
    heads: list[tuple[int, int]]
    tokens: list[str]
    token_cosine: torch.Tensor
    embedding_cosine: float
    words: list[str]
    word: str | None = None
    word_index: int | None = None
    word_shift: torch.Tensor | None = None
    before: torch.Tensor | None = None
    after: torch.Tensor | None = None

    def __repr__(self) -> str:  # a summary: token_cosine and word_shift are tensors
        heads = ", ".join(f"L{l} H{h}" for l, h in self.heads[:6]) + (" ..." if len(self.heads) > 6 else "")
        word = f", word {self.word!r}" if self.word is not None else ""
        return (f"Ablation({len(self.heads)} head(s) silenced: {heads}; sentence embedding cosine "
                f"{self.embedding_cosine:.4f}, lowest token cosine {float(self.token_cosine.min()):.4f}{word})")

    def to_json(self) -> dict:
        d = {"text": self.text, "heads": [list(h) for h in self.heads], "tokens": self.tokens, "words": self.words,
             "token_cosine": [round(float(x), 6) for x in self.token_cosine.tolist()],
             "mean_token_cosine": round(float(self.token_cosine.mean()), 6),
             "embedding_cosine": round(self.embedding_cosine, 6)}
        if self.word_shift is not None:
            d["word"] = self.word
            d["word_index"] = self.word_index
            d["word_shift"] = [[round(float(x), 6) for x in row] for row in self.word_shift.tolist()]
        return d


@dataclass(frozen=True)
class HeadEffects:
    """Every head silenced alone: (N, H) effects, larger = more important."""

    text: str
    token_effect: torch.Tensor  # 1 - mean token cosine
    embedding_effect: torch.Tensor  # 1 - embedding cosine

    def ranking(self, k: int | None = None) -> list[tuple[int, int, float, float]]:
        """(layer, head, token effect, embedding effect) of every head, or the top ``k`` (>= 1),
        the largest token effect first; equal effects in layer, then head order."""
        H = self.token_effect.shape[1]
        order = self.token_effect.flatten().argsort(descending=True, stable=True).tolist()
        if k is not None:  # -1 silently dropped the last head, "2" raised TypeError
            order = order[:as_count(k)]
        return [(i // H, i % H, float(self.token_effect.flatten()[i]), float(self.embedding_effect.flatten()[i]))
                for i in order]

    def to_json(self, k: int | None = None) -> dict:
        """The (N, H) effects, and the ranking: every head, or the top ``k``."""
        r = lambda t: [[round(float(x), 6) for x in row] for row in t.tolist()]  # noqa: E731
        return {"text": self.text, "token_effect": r(self.token_effect),
                "embedding_effect": r(self.embedding_effect),
                "ranking": [{"layer": l, "head": h, "token_effect": round(a, 6), "embedding_effect": round(b, 6)}
                            for l, h, a, b in self.ranking(k)]}


def _as_heads(heads: object) -> list[tuple[int, int]]:
    """``heads`` as a list of (layer, head) pairs of whole numbers, else one InputError."""
    example = "a list of (layer, head) pairs, e.g. [(3, 1)] for one head"
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise InputError(f"heads must be {example}, got {heads!r}")
    out = []
    for pair in heads:
        try:
            l, h = pair
        except (TypeError, ValueError):
            raise InputError(f"heads must be {example}, got {heads!r}") from None
        l, h = as_whole_number(l), as_whole_number(h)
        if l is None or h is None:
            raise InputError(f"heads must be (layer, head) pairs of whole numbers, e.g. [(3, 1)], got {pair!r}")
        out.append((l, h))
    return out


def _check_heads(bert: Bert, heads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``heads`` with negative layers and heads counted from the end (-1: the last), as
    :func:`bertscope.errors.as_index` reads them; InputError for a head the model lacks."""
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    for l, h in heads:
        if not (-N <= l < N and -H <= h < H):
            raise InputError(f"head L{l} H{h} does not exist: the model has layers 0..{N - 1} and heads 0..{H - 1} "
                             "(negatives count from the end)")
    return [(l % N, h % H) for l, h in heads]


def _run(bert: Bert, batch, head_mask: torch.Tensor | None, attentions: bool):
    dev = bert.device
    return bert.encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.token_type_ids.to(dev),
                      output_attentions=attentions, head_mask=None if head_mask is None else head_mask.to(dev))


def _embedding(h: torch.Tensor) -> torch.Tensor:
    return F.normalize(h[0].mean(0), dim=0)  # (T, C) -> (C,)  (one text, no PAD)


def _embedded(bert: Bert, text: str, batch, hidden: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
    """The sentence embedding (C,) that ``bert.embed`` gives ``text`` (with ``head_mask``): from
    ``hidden`` (1, T, C), the last hidden state of ``batch``, unless ``embed`` cuts the text shorter."""
    if batch.lengths[0] <= bert.max_seq_length:
        return _embedding(hidden)
    cut = bert.encode([text], max_length=bert.max_seq_length, warn=False)
    return _embedding(_run(bert, cut, head_mask, False).last_hidden_state.float().cpu())  # (1, T', C) -> (C,)


@analysis
def ablate(bert: Bert, text: str, heads: list[tuple[int, int]], word: str | None = None,
           occurrence: int = 1) -> Ablation:
    """Silence ``heads`` ((layer, head) pairs) on ``text`` and compare with the intact model."""
    text = check_text(text)
    if word is not None:
        check_text(word, "the word")
    if not text.strip():
        raise InputError("the text is empty")
    heads = _as_heads(heads)
    if not heads:
        raise InputError("name at least one head to silence (heads=[(layer, head)]; in the CLI --layer L "
                         "--head H), or sweep every head (bertscope.understand.ablate.sweep(bert, text); --sweep)")
    heads = list(dict.fromkeys(_check_heads(bert, heads)))  # each head once, in order (-1 and 5 are one)
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    batch = bert.encode([text], warn=False)  # the warning once the word is found: else the error says it
    if batch.lengths[0] <= 2:  # [CLS] [SEP]: characters the tokenizer drops (U+200B...)
        raise no_tokens()
    words = group_words(batch, text)
    wi = (find_word(words.words, word, occurrence, cut_text=text if batch.truncated[0] else None,
                    positions=bert.tokenizer.max_length) if word is not None else None)
    warn_truncated(batch.truncated, bert.tokenizer.max_length)
    mask = torch.ones(N, H)
    for l, h in heads:
        mask[l, h] = 0.0
    base = _run(bert, batch, None, wi is not None)
    cut = _run(bert, batch, mask, wi is not None)
    a, b = base.last_hidden_state.float().cpu(), cut.last_hidden_state.float().cpu()  # (1, T, C)
    cos = F.cosine_similarity(a[0], b[0], dim=-1)  # (T,)
    emb = float(torch.dot(_embedded(bert, text, batch, a, None), _embedded(bert, text, batch, b, mask)))
    shift = before = after = None
    if wi is not None:
        pa = torch.stack([x[0] for x in base.attentions]).float().cpu()  # (N, H, T, T)
        pb = torch.stack([x[0] for x in cut.attentions]).float().cpu()  # (N, H, T, T)
        before = word_attention(pa, words.token_words)[:, :, wi]  # (N, H, W)
        after = word_attention(pb, words.token_words)[:, :, wi]  # (N, H, W)
        shift = 0.5 * (before - after).abs().sum(-1)  # (N, H)
    return Ablation(text=text, heads=list(heads), tokens=batch.tokens[0], token_cosine=cos,
                    embedding_cosine=emb, words=words.words, word=words.words[wi] if wi is not None else None,
                    word_index=wi, word_shift=shift, before=before, after=after)


@analysis
def sweep(bert: Bert, text: str, *, progress: Callable[[int, int], None] | None = None) -> HeadEffects:
    """Silence every head alone, one forward pass each, and measure the output change.

    ``progress(done, total)`` is called after each head (N·H forward passes in all).
    """
    text = check_text(text)
    if not text.strip():
        raise InputError("the text is empty")
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    batch = bert.encode([text])
    if batch.lengths[0] <= 2:  # [CLS] [SEP]: characters the tokenizer drops (U+200B...)
        raise no_tokens()
    a = _run(bert, batch, None, False).last_hidden_state.float().cpu()  # (1, T, C)
    ea = _embedded(bert, text, batch, a, None)
    tok = torch.zeros(N, H)
    emb = torch.zeros(N, H)
    for l in range(N):
        for h in range(H):
            if progress is not None:
                progress(l * H + h, N * H)
            mask = torch.ones(N, H)
            mask[l, h] = 0.0
            b = _run(bert, batch, mask, False).last_hidden_state.float().cpu()  # (1, T, C)
            tok[l, h] = 1 - F.cosine_similarity(a[0], b[0], dim=-1).mean()
            emb[l, h] = 1 - torch.dot(ea, _embedded(bert, text, batch, b, mask))
    if progress is not None:
        progress(N * H, N * H)
    return HeadEffects(text=text, token_effect=tok, embedding_effect=emb)
