"""Tokens and words: which sub-tokens make up each word, and attention at word level.

Shape legend: N layers, H heads, T tokens, W words.

Word level follows Clark et al. 2019 ("What Does BERT Look At?"): the attention *to* a word
is the sum over its sub-tokens (so a split word is not penalised), the attention *from* a
word is the mean over its sub-tokens (so each row still sums to 1). [CLS] and [SEP] count as
words of their own: much attention goes to them, and hiding that would mislead.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import InputError, as_whole_number, bad_whole, setting
from .tokenizer import Batch, check_text, no_tokens

__all__ = ["Words", "find_word", "group_words", "word_attention"]


@dataclass(frozen=True)
class Words:
    """How one text's tokens group into words.

    words:       W word strings, as written in the text ([CLS]/[SEP] as themselves).
    token_words: per token, the index of its word (T entries).
    """

    words: list[str]
    token_words: list[int]


def group_words(batch: Batch, text: str, index: int = 0, pair: str | None = None) -> Words:
    """Group the tokens of text ``index`` of a batch into words (the tokenizer's pre-tokenized words).

    For a sentence pair ([CLS] A [SEP] B [SEP], segment ids 0 and 1) give the second text as
    ``pair``: its words are then cut from it by their character offsets, as A's are from ``text``
    (without it, a word of B is spelled by its first sub-token).
    """
    words: list[str] = []
    token_words: list[int] = []
    last: tuple[int, int | None] | None = None  # (sequence id, word id) of the previous token
    first_offset = 0  # character offset of the current word's first sub-token
    for t, (tok, wid, (s, e)) in enumerate(zip(batch.tokens[index], batch.word_ids[index],
                                             batch.offsets[index])):
        if wid is None:
            words.append(tok)
            token_words.append(len(words) - 1)
            last = None
            continue
        key = (int(batch.token_type_ids[index, t]), wid)
        source = text if key[0] == 0 else pair
        if source is not None:  # combining marks the tokenizer strips (e + U+0301) stay in the word
            while e < len(source) and unicodedata.category(source[e]) in ("Mn", "Me"):
                e += 1
        if key != last:
            words.append(source[s:e] if source is not None else tok)
            first_offset = s
            last = key
        elif source is not None:
            words[-1] = source[first_offset:e]  # extend the word's text to cover this sub-token
        token_words.append(len(words) - 1)
    return Words(words=words, token_words=token_words)


def word_attention(probs: torch.Tensor, token_words: Sequence[int]) -> torch.Tensor:
    """Token attention (..., T, T) -> word attention (..., W, W).

    To a word: sum over its sub-tokens (columns). From a word: mean over its sub-tokens (rows).
    ``token_words``: the word of each token, numbered 0..W-1 in order, every number used (as
    :func:`group_words` gives them, with [CLS] and [SEP] words of their own). A tokenizer's
    ``word_ids`` (None for [CLS]/[SEP], counted per text) are not such numbers: group them first.
    """
    if not isinstance(probs, torch.Tensor) or probs.dim() < 2 or probs.shape[-1] != probs.shape[-2]:
        shape = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        raise InputError(f"probs must be a tensor of token attention (..., T, T), got {shape}")
    T = probs.shape[-1]
    if isinstance(token_words, (str, bytes)) or not hasattr(token_words, "__len__"):
        raise InputError(f"token_words must be a list of word indices, one per token, got {type(token_words).__name__}")
    if len(token_words) != T:
        raise InputError(f"token_words has {len(token_words)} entries (one word index per token) for {T} tokens")
    numbers = [as_whole_number(w) for w in token_words]
    bad = next((i for i, n in enumerate(numbers) if n is None or n < 0), None)
    if bad is not None:
        hint = " (a tokenizer's word_ids? group_words gives [CLS] and [SEP] words of their own)" \
            if token_words[bad] is None else ""
        raise InputError(f"token_words[{bad}] is {token_words[bad]!r}: word indices are whole numbers >= 0{hint}")
    W = max(numbers, default=-1) + 1
    if W > T:  # every word needs a token of its own
        raise InputError(f"token_words names word {W - 1} for {T} tokens: number the words 0..W-1, "
                         "each with at least one token")
    unused = sorted(set(range(W)) - set(numbers))
    if unused:  # an empty word would be a row of 0/0
        raise InputError(f"token_words never names word {unused[0]} of 0..{W - 1}: number the words 0..W-1, "
                         "each with at least one token")
    token_words = numbers
    assign = torch.zeros(T, W, dtype=probs.dtype, device=probs.device)  # (T, W)
    assign[torch.arange(T), torch.tensor(token_words)] = 1.0
    summed_cols = probs @ assign  # (..., T, T)@(T, W) -> (..., T, W)
    mean_rows = assign / assign.sum(0, keepdim=True)  # (T, W), each column sums to 1
    return mean_rows.transpose(0, 1) @ summed_cols  # (W, T)@(..., T, W) -> (..., W, W)


def find_word(words: Sequence[str], word: str, occurrence: int = 1, *, cut_text: str | None = None,
              positions: int | None = None) -> int:
    """Index of the ``occurrence``-th word equal to ``word`` (case-insensitive; where no word
    is equal, accents aside: "cafe" finds "café", as an uncased model reads both the same).

    ``cut_text``: the whole text, when the tokenizer cut it to ``positions`` tokens; a word found
    only in the part cut off is then said to be cut off, not missing."""
    check_text(word, "the word")
    if not word.strip():
        raise InputError("the word to look for (--token) is empty")
    n = as_whole_number(occurrence)
    if n is None or n < 1:  # 0 or -1 are not Python indices here: the first occurrence is 1
        raise bad_whole(n, f"{setting('occurrence', '--occurrence')} must be a whole number >= 1 (the first is 1), got {occurrence!r}")
    occurrence = n
    target = _fold(word.strip())
    hits = [i for i, w in enumerate(words) if _fold(w) == target]
    if not hits:
        hits = [i for i, w in enumerate(words) if _unaccented(w) == _unaccented(target)]
    if not hits:
        real = [w for w in words if w not in ("[CLS]", "[SEP]")]
        if not real:
            raise no_tokens()
        span = _split_span(real, target)
        if span:
            raise InputError(
                f"the tokenizer splits {word!r} into the words {' '.join(span)}; "
                f"give one of them, e.g. {span[0]!r}")
        if _cut_off(cut_text, target, 0):
            raise InputError(f"the word {word!r} was cut off: the text is longer than {_limit(positions)}")
        shown = " ".join(real[:40]) + (f" ... ({len(real)} words)" if len(real) > 40 else "")
        raise InputError(f"the word {word!r} is not in the text (its words are: {shown})")
    if occurrence > len(hits) and _cut_off(cut_text, target, len(hits)):
        total = _count(cut_text, target)
        if occurrence > total:  # not in the whole text either: nothing was cut off
            raise InputError(f"the word {word!r} occurs {total} times in the text; occurrence {occurrence} does not "
                             f"exist (and {len(hits)} of them fit in {_limit(positions)})")
        raise InputError(f"occurrence {occurrence} of {word!r} was cut off: the text is longer than "
                         f"{_limit(positions)}, and {len(hits)} occurrence(s) fit")
    if occurrence < 1 or occurrence > len(hits):
        times = "once" if len(hits) == 1 else f"{len(hits)} times"
        raise InputError(f"the word {word!r} occurs {times}; occurrence {occurrence} does not exist")
    return hits[occurrence - 1]


def _limit(positions: int | None) -> str:
    return f"the {positions} tokens it was cut to" if positions else "the model's positions"


def _cut_off(cut_text: str | None, target: str, found: int) -> bool:
    """Whether the whole text (given when it was cut) holds ``target`` as a word more often than
    the ``found`` times the part kept does."""
    return cut_text is not None and _count(cut_text, target) > found


def _count(text: str, target: str) -> int:
    """How often ``target`` (folded) stands as a word in ``text``."""
    return len(re.findall(as_word(re.escape(target), target), _fold(text)))


def needs_boundary(ch: str) -> bool:
    """Whether a word ending in ``ch`` must end at a word boundary to be that word: a letter or
    digit of a script written with spaces ("at" is not a word of "cat"); CJK, kana and
    punctuation are words wherever they stand (猫 in 猫が)."""
    return (ch.isalnum() or ch == "_") and not unicodedata.name(ch, "").startswith(("CJK", "HIRAGANA", "KATAKANA"))


def as_word(pattern: str, word: str) -> str:
    """``pattern`` (a regex matching ``word``) held to word boundaries where ``word`` needs them."""
    return ((r"(?<!\w)" if needs_boundary(word[0]) else "") + pattern
            + (r"(?!\w)" if needs_boundary(word[-1]) else ""))


def _fold(s: str) -> str:
    """How words are compared: case-insensitive, é composed or not (NFC)."""
    return unicodedata.normalize("NFC", s).lower()


def _unaccented(s: str) -> str:
    """:func:`_fold`, accents dropped (é -> e): as BERT's uncased normalizer strips them."""
    return "".join(c for c in unicodedata.normalize("NFD", _fold(s)) if not unicodedata.combining(c))


def _split_span(words: Sequence[str], target: str) -> list[str] | None:
    """The run of consecutive words that spells ``target`` (e.g. didn ' t for "didn't"), if any."""
    for i in range(len(words)):
        joined = ""
        for j in range(i, min(i + 8, len(words))):
            joined += _fold(words[j])
            if joined == target:
                return list(words[i:j + 1]) if j > i else None
            if not target.startswith(joined):
                break
    return None
