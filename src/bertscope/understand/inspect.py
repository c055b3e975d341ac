"""Look inside attention: word-level attention maps and the heads that link two words.

Shape legend: N layers, H heads, T tokens, W words.

Word level follows Clark et al. 2019: see :mod:`bertscope.core.words`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError, as_count, as_index
from ..bert import Bert, analysis
from ..core.tokenizer import check_text, warn_truncated
from ..core.words import find_word, group_words, word_attention

__all__ = ["AttendResult", "attend"]


@dataclass(frozen=True)
class AttendResult:
    """Where one word looks, in every layer and head.

    words:   the W words of the text.
    token:   the word asked about, and ``index`` its position among ``words``.
    weights: (N, H, W) attention from that word to every word (each row sums to 1).
    truncated: whether the text was cut to fit the model.
    """

    words: list[str]
    token: str
    index: int
    weights: torch.Tensor
    truncated: bool

    def __repr__(self) -> str:  # a summary: the weights are (N, H, W) numbers
        N, H, W = self.weights.shape
        return (f"AttendResult(token={self.token!r} (word {self.index} of {W}), weights: {N} layers x {H} heads "
                f"x {W} words{', truncated' if self.truncated else ''}; .top_words(layer, head), .heads_for(word))")

    def top_words(self, layer: int, head: int, k: int = 3) -> list[tuple[str, float]]:
        """The ``k`` words that ``token`` attends to most in ``layer``, ``head``, with their weights."""
        N, H, _ = self.weights.shape
        layer, head = as_index("layer", layer, N), as_index("head", head, H)
        row = self.weights[layer, head]
        vals, idx = row.topk(min(as_count(k), row.numel()))
        return [(self.words[i], float(v)) for v, i in zip(vals.tolist(), idx.tolist())]

    def heads_for(self, target: int | str, k: int | None = None, occurrence: int = 1) -> list[tuple[int, int, float]]:
        """(layer, head, weight) sorted by the weight from the token to word ``target``: an index
        into ``words``, or the word itself (matched as ``attend`` matches ``token``; its
        ``occurrence``-th appearance, from 1)."""
        if isinstance(target, str):
            target = find_word(self.words, target, occurrence)
        elif occurrence != 1:
            raise InputError("occurrence goes with a word; an index already names one word")
        target = as_index("target (an index into words)", target, len(self.words))
        w = self.weights[:, :, target]  # (N, H)
        H = w.shape[1]
        flat = w.flatten()
        order = flat.argsort(descending=True).tolist()
        if k is not None:
            order = order[:as_count(k)]
        return [(i // H, i % H, float(flat[i])) for i in order]

    def to_json(self) -> dict:
        return {
            "words": self.words,
            "token": self.token,
            "token_index": self.index,
            "truncated": self.truncated,
            "weights": [[[round(float(x), 6) for x in head] for head in layer]
                        for layer in self.weights.tolist()],
        }


@analysis
def attend(bert: Bert, text: str, token: str, occurrence: int = 1) -> AttendResult:
    """Attention from ``token`` (a word of ``text``) to every word, per layer and head.

    ``token`` is a word as written in the text, matched case-insensitively (where no word is
    equal, accents aside: "cafe" finds "café"); ``occurrence`` picks the n-th such word, the
    first being 1. Words are the tokenizer's pre-tokenized words, a split word's sub-tokens
    together (from a word: their mean; to a word: their sum), and [CLS] and [SEP] are words of
    their own. Layers and heads are numbered from 0. The text is read at the model's positions
    (a longer one is cut, with a warning, and ``truncated`` says so). Runs the reference path
    (``bert.model``) once.

    Raises InputError for an empty text, a word not in the text (or only in the part cut off),
    or an occurrence past the last.
    """
    text, token = check_text(text), check_text(token, "the word")
    if not text.strip():
        raise InputError("the text is empty")
    batch = bert.encode([text], warn=False)  # the warning once the word is found: else the error says it
    words = group_words(batch, text)
    index = find_word(words.words, token, occurrence, cut_text=text if batch.truncated[0] else None,
                      positions=bert.tokenizer.max_length)
    warn_truncated(batch.truncated, bert.tokenizer.max_length)
    dev = bert.device
    out = bert.encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev),
                     batch.token_type_ids.to(dev), output_attentions=True)
    probs = torch.stack([a[0] for a in out.attentions]).float().cpu()  # (N, H, T, T)
    w = word_attention(probs, words.token_words)  # (N, H, W, W)
    return AttendResult(words=words.words, token=words.words[index], index=index,
                        weights=w[:, :, index, :], truncated=batch.truncated[0])
