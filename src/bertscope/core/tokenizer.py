"""WordPiece tokenization through the `tokenizers` library (never hand-written here).

Shape legend: B batch, T tokens (the longest text in the batch, after truncation).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch
from tokenizers import Encoding, Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from ..errors import CheckpointError, InputError, InputTypeError, as_whole_number, bad_whole, warn_caller

__all__ = ["Batch", "BertTokenizer", "TruncationWarning", "check_text", "check_texts", "no_tokens", "tokenless",
           "warn_truncated"]

log = logging.getLogger(__name__)


# a text over max_length x this many characters is tokenized from a prefix (BertTokenizer._encode_cut)
PREFIX_CHARS_PER_TOKEN = 64
# matched up to a cap: the text up to its last space, tab or line break there. Not \s: Python
# counts \x1c-\x1f and \x85 as whitespace, which BERT's normalizer drops as control characters
# (a cut there would end a word the whole text goes on with)
_LAST_SPACE = re.compile(r".*[ \t\n\r]", re.S)


class TruncationWarning(UserWarning):
    """A text was longer than the model's positions and was cut."""


def warn_truncated(truncated: Sequence[bool], limit: int, numbers: Sequence[int] | None = None,
                   *, lines: bool = False) -> None:
    """The one TruncationWarning for the texts cut to ``limit`` tokens, if any: how many, and the
    first, named as Python indexes the list, ``texts[i]`` (``numbers``: the texts' own 0-based
    positions, where ``truncated`` covers a subset), or with ``lines``, as "line N" (``numbers``:
    1-based line numbers); a lone text is just "the text"."""
    cut = [k for k, t in enumerate(truncated) if t]
    if not cut:
        return
    if len(truncated) == 1 and numbers is None:
        warn_caller(f"the text is longer than {limit} tokens and was truncated", TruncationWarning)
        return
    first = cut[0] if numbers is None else numbers[cut[0]]
    warn_caller(f"{len(cut)} text(s) longer than {limit} tokens were truncated "
                f"(first: {f'line {first}' if lines else f'texts[{first}]'})", TruncationWarning)


def check_text(text: object, what: str = "the text") -> str:
    """One text from a caller, checked: a str that is valid Unicode (encodable as UTF-8).

    Raises InputTypeError (an InputError and a TypeError; one line) for None, a number or any
    other non-string, and InputError for a string holding a lone surrogate ("\\ud800", or the
    "\\udcff" Python makes of a non-UTF-8 byte in a command-line argument)."""
    if not isinstance(text, str):
        raise InputTypeError(f"{what} is {type(text).__name__}, not a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        raise InputError(f"{what} is not valid Unicode text (a lone surrogate U+{ord(bad):04X} "
                         f"at character {e.start}; non-UTF-8 bytes look like this)") from None
    return text


def no_tokens(what: str = "the text") -> InputError:
    """The error for a text the tokenizer leaves nothing of but [CLS] and [SEP] (it holds only
    characters the tokenizer drops, such as U+200B): there is no word to show or explain."""
    return InputError(f"{what} has no tokens (it holds only characters the tokenizer drops: spaces, "
                      "control characters, accents without a letter)")


def tokenless(ids: Sequence[int], pair: bool = False) -> bool:
    """Whether an encoded text (or pair) holds no token but [CLS] and [SEP]: its characters were
    all dropped by the tokenizer (U+200B, control characters, a lone accent). Such a text is
    empty, as a blank line is: ``embed`` gives it zeros, ``predict`` no class."""
    return len(ids) <= (3 if pair else 2)


def least_read_length(pair: bool = False) -> int:
    """The shortest ``max_length`` that leaves a classifier one token of each text: [CLS] A [SEP]
    takes 3, [CLS] A [SEP] B [SEP] takes 5. Under it a text is read as nothing."""
    return 5 if pair else 3


def check_texts(texts: object, what: str = "texts") -> list[str]:
    """A list of texts from a caller, checked: a sequence of str, each valid Unicode.

    Raises InputTypeError (an InputError and a TypeError; one line) for a single string or a
    non-string item (None, a number), and InputError for a text that cannot be encoded as UTF-8
    (a lone surrogate such as "\\ud800")."""
    if isinstance(texts, (str, bytes)):
        raise InputTypeError(f"{what} must be a list of strings, not one {type(texts).__name__}")
    kind = type(texts).__name__
    if hasattr(texts, "columns"):  # a table: iterating it gives its column names
        raise InputTypeError(f"{what} must be a list of strings, not a {kind} (its column names would be "
                             "read as the texts); pass one column, e.g. df['text'].tolist()")
    if isinstance(texts, Mapping):
        raise InputTypeError(f"{what} must be a list of strings, not a {kind} (its keys would be read as "
                             "the texts); pass list(d.values())")
    if isinstance(texts, (set, frozenset)):
        raise InputTypeError(f"{what} must be a list of strings, not a {kind}: its order is arbitrary, so "
                             "rows could not be matched to texts; pass a list")
    try:
        items = list(texts)  # type: ignore[call-overload]
    except TypeError:
        raise InputTypeError(f"{what} must be a list of strings, got {type(texts).__name__}") from None
    for i, t in enumerate(items):
        check_text(t, f"{what}[{i}]")
    return items


@dataclass(frozen=True)
class Batch:
    """A tokenized, padded batch, ready for the model.

    input_ids, attention_mask, token_type_ids: (B, T) int64; attention_mask 1 = token, 0 = PAD.
    tokens:    per text, its sub-token strings (without padding).
    word_ids:  per text, per token, the index of the word it belongs to (None for [CLS]/[SEP]).
    offsets:   per text, per token, (start, end) character offsets into the text.
    truncated: per text, whether it was cut to fit.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    tokens: list[list[str]]
    word_ids: list[list[int | None]]
    offsets: list[list[tuple[int, int]]]
    truncated: list[bool]

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]


class BertTokenizer:
    """BERT's WordPiece tokenizer, cased or uncased as the checkpoint says.

    Built from a checkpoint folder's tokenizer.json (preferred) or vocab.txt. Any padding or
    truncation stored in tokenizer.json is switched off; this class pads and truncates itself.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int, do_lower_case: bool) -> None:
        length = as_whole_number(max_length)
        if length is None or length < 2:
            raise bad_whole(length, f"max_length must be a whole number >= 2 ([CLS] and [SEP]), got {max_length!r}")
        max_length = length
        self._tok = tokenizer
        self._tok.no_padding()
        self._tok.no_truncation()
        # BERT's normalizer and pre-tokenizer: a text cut at a whitespace tokenizes to a prefix of
        # the whole text's tokens (what _encode_cut relies on)
        self._splits_at_whitespace = (type(tokenizer.normalizer).__name__ == "BertNormalizer"
                                      and type(tokenizer.pre_tokenizer).__name__ == "BertPreTokenizer")
        self.max_length = max_length
        self.do_lower_case = do_lower_case
        self._lock = threading.Lock()  # truncation is state on the shared Tokenizer
        self.pad_id = self._id("[PAD]")
        self.cls_id = self._id("[CLS]")
        self.sep_id = self._id("[SEP]")

    def __getstate__(self) -> dict:  # for pickle and copy.deepcopy: a lock is not copied
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _id(self, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise CheckpointError(f"the tokenizer's vocabulary has no {token} token")
        return i

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def vocab(self) -> dict[str, int]:
        """The vocabulary: token string -> id."""
        return self._tok.get_vocab()

    @classmethod
    def from_folder(cls, folder: str | Path, max_length: int = 512) -> "BertTokenizer":
        if not isinstance(folder, (str, os.PathLike)):
            raise InputTypeError(f"folder must be a str or a Path, got {type(folder).__name__}")
        folder = Path(folder)
        if not folder.is_dir():
            raise CheckpointError(f"{folder} is not a folder" if folder.exists() else f"{folder} does not exist")
        lower = _read_do_lower_case(folder)
        tj, vt = folder / "tokenizer.json", folder / "vocab.txt"
        try:
            if tj.is_file():
                tok = Tokenizer.from_file(str(tj))
                if lower is None:
                    norm = json.loads(tj.read_text(encoding="utf-8")).get("normalizer") or {}
                    lower = bool(norm.get("lowercase", True))
            elif vt.is_file():  # tokenizer_config.json's settings, as HF's BertTokenizer reads them
                lower = True if lower is None else lower
                strip = _read_tokenizer_setting(folder, "strip_accents")  # None: as lowercase does
                chinese = _read_tokenizer_setting(folder, "tokenize_chinese_chars")
                tok = BertWordPieceTokenizer(str(vt), lowercase=lower, strip_accents=strip,
                                             handle_chinese_chars=True if chinese is None else chinese)._tokenizer
            else:
                raise CheckpointError(f"{folder} has neither tokenizer.json nor vocab.txt")
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"the tokenizer in {folder} could not be read ({e})") from None
        return cls(tok, max_length=max_length, do_lower_case=bool(lower))

    def encode(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        *,
        warn: bool = True,
    ) -> Batch:
        """Tokenize and pad a batch; texts over ``max_length`` tokens are cut with a warning
        (``warn=False``: without, for a caller that encoded the same texts and warned already)."""
        texts = check_texts(texts)
        if pairs is not None:
            pairs = check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise InputError(f"texts and pairs must have the same length ({len(texts)} and {len(pairs)})")
        limit = self._limit(max_length, pairs is not None)
        encs = self._encode_cut(texts, pairs, limit)
        truncated = [bool(e.overflowing) for e in encs]
        if warn:
            warn_truncated(truncated, limit)
        return self._pad(encs, truncated)

    def _limit(self, max_length: int | None, pairs: bool = False) -> int:
        """The length to cut texts to: ``max_length`` (checked), or the model's positions. A pair
        needs 3 at least: under that the tokenizer leaves it uncut."""
        if max_length is None:
            return self.max_length
        low, why = (3, "[CLS] and two [SEP] for a pair") if pairs else (2, "[CLS] and [SEP]")
        n = as_whole_number(max_length)
        if n is None or not low <= n <= self.max_length:
            raise bad_whole(n, f"max_length must be a whole number from {low} ({why}) to "
                             f"{self.max_length} (the model's positions), got {max_length!r}")
        return n

    def _pad(self, encs: list[Encoding], truncated: list[bool]) -> Batch:
        B = len(encs)
        T = max((len(e.ids) for e in encs), default=0)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros((B, T), dtype=torch.long)  # (B, T)
        types = torch.zeros((B, T), dtype=torch.long)  # (B, T)
        for b, e in enumerate(encs):
            n = len(e.ids)
            ids[b, :n] = torch.tensor(e.ids, dtype=torch.long)
            mask[b, :n] = 1
            types[b, :n] = torch.tensor(e.type_ids, dtype=torch.long)
        return Batch(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=types,
            tokens=[list(e.tokens) for e in encs],
            word_ids=[list(e.word_ids) for e in encs],
            offsets=[[tuple(o) for o in e.offsets] for e in encs],
            truncated=truncated,
        )

    def encode_ids(self, texts: Sequence[str], max_length: int | None = None,
                   ) -> tuple[list[list[int]], list[bool]]:
        """Token ids per text (with [CLS] and [SEP], cut to ``max_length``), unpadded, and
        whether each text was cut. No warning: the caller reports truncation its own way."""
        texts = check_texts(texts)
        encs = self._encode_cut(texts, None, self._limit(max_length))
        return [e.ids for e in encs], [bool(e.overflowing) for e in encs]

    def encode_segments(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                        max_length: int | None = None) -> tuple[list[list[int]], list[list[int]], list[bool]]:
        """Token ids and segment ids per text (or text pair: ``[CLS] A [SEP] B [SEP]`` with
        segments 0 and 1), cut to ``max_length`` (the longer of a pair first), unpadded, and
        whether each was cut. No warning: the caller reports truncation its own way."""
        if isinstance(texts, str):
            raise TypeError("encode_segments takes a list of texts, not one string")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError("texts and pairs must have the same length")
        encs = self._encode_cut(texts, pairs, self._limit(max_length, pairs is not None))
        return [e.ids for e in encs], [e.type_ids for e in encs], [bool(e.overflowing) for e in encs]

    def _encode_cut(self, texts: Sequence[str], pairs: Sequence[str] | None, limit: int) -> list[Encoding]:
        """The encodings of texts (or pairs) cut to ``limit`` tokens, the longer of a pair first.

        A text far longer than any limit (a 10 MB line) is tokenized from a prefix: the tokenizer
        would otherwise hold every token of it at once (1.2 GB and 7 s for 10 MB). The prefix
        ends at a whitespace and is used only when it alone holds more than ``limit`` tokens; with
        BERT's normalizer and pre-tokenizer (per-character, split at whitespace) its tokens are
        then the first tokens of the whole text, so the cut encoding, and its overflow, are the
        same. Other tokenizers are given the whole text."""
        with self._lock:  # truncation is state on the shared Tokenizer
            texts = self._prefixes(texts, limit)
            pairs = None if pairs is None else self._prefixes(pairs, limit)
            self._tok.enable_truncation(limit, strategy="longest_first")
            try:
                return self._tok.encode_batch(list(texts) if pairs is None else list(zip(texts, pairs)))
            finally:
                self._tok.no_truncation()

    def _prefixes(self, texts: Sequence[str], limit: int) -> Sequence[str]:
        """``texts``, each over ``limit`` x PREFIX_CHARS_PER_TOKEN characters replaced by its
        prefix where that is safe (see :meth:`_encode_cut`); called with truncation off."""
        cap = limit * PREFIX_CHARS_PER_TOKEN
        if not self._splits_at_whitespace or all(len(t) <= cap for t in texts):
            return texts
        out = list(texts)
        for i, t in enumerate(texts):
            if len(t) <= cap:
                continue
            end = _LAST_SPACE.match(t, 0, cap)
            if end is None:  # one word of cap characters: no safe place to cut
                continue
            prefix = t[:end.end()]
            if len(self._tok.encode(prefix, add_special_tokens=False).ids) > limit:
                out[i] = prefix
        return out

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text with [CLS] and [SEP], before any truncation."""
        texts = check_texts(texts)
        with self._lock:
            return [len(e.ids) for e in self._tok.encode_batch(texts)]


def _read_do_lower_case(folder: Path) -> bool | None:
    return _read_tokenizer_setting(folder, "do_lower_case")


def _read_tokenizer_setting(folder: Path, name: str) -> bool | None:
    """A true/false setting of tokenizer_config.json; None when it is absent (or not a bool)."""
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            value = json.loads(cfg.read_text(encoding="utf-8")).get(name)
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(value, bool):
            return value
    return None
