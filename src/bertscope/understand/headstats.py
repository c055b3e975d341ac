"""What every head does over a corpus: where its attention goes, how spread it is, its pattern.

Shape legend: N layers, H heads, T tokens (keys and queries of one text), and ``...`` any
leading dimensions (for one model run: (N, H)).

Statistics (after Clark et al. 2019), per head, averaged over every query token of the corpus
(token level; [CLS] and [SEP] rows included):

    cls, sep, punct   attention to [CLS], to [SEP], to punctuation tokens (row sums over those keys)
    self, prev, next  attention to the token itself, to the one before, to the one after
                      (prev/next are averaged over the rows that have such a neighbour)
    entropy           -Σ p·ln p of the row, in nats
    entropy_gap       ln T - entropy: how far below uniform attention over the T tokens it is
    distance          Σ p·|query - key|, the mean attention distance in tokens

Pattern classes after Kovaleva et al. 2019 ("Revealing the Dark Secrets of BERT"), who labelled
maps by eye and with a CNN. bertscope uses stated rules instead. Per map (one text, one head),
over the rows of ordinary tokens (not [CLS]/[SEP] queries), three masses that sum to 1:

    v  attention to "vertical" keys: [CLS], [SEP] and punctuation (the same keys for every row)
    d  attention to ordinary keys at |query - key| <= 1 (itself, previous, next)
    r  the rest: ordinary keys two or more tokens away
    spread  how evenly r is spread over its keys: the entropy of r (renormalised) divided by
            ln(number of those keys), averaged over rows weighted by their r mass (0..1)

    u  what v + d would be under uniform attention over the same tokens (short texts have few
       tokens, so even uniform attention puts much of its mass on [CLS], [SEP] and neighbours)

    if v + d >= max(BROAD_CUTOFF (0.5), min(ABOVE_UNIFORM (1.5) x u, (1 + u) / 2)):
                                                          mostly vertical and/or diagonal:
        d < MIX_SHARE (0.25) x (v + d)   ->  "vertical"
        v < MIX_SHARE (0.25) x (v + d)   ->  "diagonal"
        otherwise                         ->  "vertical+diagonal"
    else (mostly distant ordinary tokens):
        spread >= BLOCK_SPREAD (0.7)      ->  "block"          (broad, even attention over the text)
        otherwise                         ->  "heterogeneous"  (a few specific distant tokens)

Kovaleva et al.'s "block" is attention within each sentence of a sentence pair. Texts are read
one at a time here, so "block" is its single-text counterpart, broad even attention over the
text: class counts are not comparable with the paper's.

The bar is 1.5 times uniform attention's v + d; where that leaves too little room (u > 0.5, texts
of a handful of tokens, where 1.5 u would pass 0.75 and, below about 7 tokens, 1) it is halfway
from uniform to 1. A text with no ordinary token (only [CLS] and [SEP]) has no rows to classify:
it is skipped, with a warning.

A head's class over a corpus is the class most of its maps get (ties: the order of CLASSES);
``class_share`` says what share of the maps agreed.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch

from ..errors import InputError, InputTypeError, as_whole_number
from ..files import lines_warning
from ..bert import Bert, analysis, check_bert
from ..core.tokenizer import check_text, check_texts, warn_truncated

__all__ = ["ABOVE_UNIFORM", "BLOCK_SPREAD", "BROAD_CUTOFF", "CLASSES", "MIX_SHARE", "STATS", "HeadStats",
           "HeadSums", "TokenKinds", "classify", "head_stats", "head_sums", "map_stats", "pattern_features",
           "token_kinds"]

BROAD_CUTOFF = 0.5
ABOVE_UNIFORM = 1.5
MIX_SHARE = 0.25
BLOCK_SPREAD = 0.7
CLASSES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")
STATS = ("cls", "sep", "punct", "self", "prev", "next", "entropy", "entropy_gap", "distance")
STAT_LABELS = {
    "cls": "attention to [CLS]", "sep": "attention to [SEP]", "punct": "attention to punctuation",
    "self": "attention to itself", "prev": "attention to previous token",
    "next": "attention to next token", "entropy": "entropy (nats)",
    "entropy_gap": "ln T - entropy (nats)", "distance": "mean attention distance (tokens)",
}


@dataclass(frozen=True)
class TokenKinds:
    """Per token (T,) booleans: [CLS], [SEP], punctuation."""

    cls: torch.Tensor
    sep: torch.Tensor
    punct: torch.Tensor

    @property
    def special(self) -> torch.Tensor:
        return self.cls | self.sep

    @property
    def vertical(self) -> torch.Tensor:
        return self.cls | self.sep | self.punct


def _is_punct(token: str) -> bool:
    s = token[2:] if token.startswith("##") else token
    return bool(s) and all(unicodedata.category(ch).startswith("P") for ch in s)


def token_kinds(tokens: list[str]) -> TokenKinds:
    """Kinds of the given sub-token strings ([CLS], [SEP], all-punctuation tokens)."""
    return TokenKinds(
        cls=torch.tensor([t == "[CLS]" for t in tokens]),
        sep=torch.tensor([t == "[SEP]" for t in tokens]),
        punct=torch.tensor([_is_punct(t) for t in tokens]),
    )


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # (..., T, T) -> (..., T); 0·ln 0 = 0


def map_stats(probs: torch.Tensor, kinds: TokenKinds) -> dict[str, torch.Tensor]:
    """Per-map means of :data:`STATS` for attention maps (..., T, T) over one text's tokens."""
    T = probs.shape[-1]
    if T < 1:
        raise ValueError("an attention map needs at least one token")
    pos = torch.arange(T)
    dist = (pos[:, None] - pos[None, :]).abs().to(probs.dtype)  # (T, T)
    diag = probs.diagonal(dim1=-2, dim2=-1)  # (..., T)
    prev = probs.diagonal(offset=-1, dim1=-2, dim2=-1)  # (..., T-1): row q, key q-1
    nxt = probs.diagonal(offset=1, dim1=-2, dim2=-1)  # (..., T-1): row q, key q+1
    zero = probs.new_zeros(probs.shape[:-2])
    ent = _entropy(probs)  # (..., T)
    return {
        "cls": probs[..., kinds.cls].sum(-1).mean(-1),  # (...)
        "sep": probs[..., kinds.sep].sum(-1).mean(-1),
        "punct": probs[..., kinds.punct].sum(-1).mean(-1),
        "self": diag.mean(-1),
        "prev": prev.mean(-1) if T > 1 else zero,
        "next": nxt.mean(-1) if T > 1 else zero,
        "entropy": ent.mean(-1),
        "entropy_gap": math.log(T) - ent.mean(-1),
        "distance": (probs * dist).sum(-1).mean(-1),  # (..., T, T) -> (...)
    }


def pattern_features(probs: torch.Tensor, kinds: TokenKinds) -> dict[str, torch.Tensor]:
    """The masses v, d, r, the spread of r and u (see the module docstring), each (...)."""
    T = probs.shape[-1]
    rows = ~kinds.special  # ordinary query rows
    if not bool(rows.any()):
        rows = torch.ones(T, dtype=torch.bool)
    pos = torch.arange(T)
    near = (pos[:, None] - pos[None, :]).abs() <= 1  # (T, T)
    vert = kinds.vertical[None, :].expand(T, T)  # (T, T)
    p = probs[..., rows, :]  # (..., R, T)
    v = (p * vert[rows]).sum(-1)  # (..., R)
    d = (p * (near & ~vert)[rows]).sum(-1)  # (..., R)
    far = (~near & ~vert)[rows]  # (R, T)
    rem = p * far  # (..., R, T)
    r = rem.sum(-1)  # (..., R)
    n_far = far.sum(-1).clamp_min(1)  # (R,)
    q = rem / r.clamp_min(1e-30)[..., None]  # (..., R, T) remainder renormalised
    ent = _entropy(q)  # (..., R)
    norm = torch.where(n_far > 1, torch.log(n_far.to(probs.dtype)), torch.ones((), dtype=probs.dtype))
    spread_rows = torch.where(n_far > 1, ent / norm, torch.zeros_like(ent))  # (..., R)
    r_sum = r.sum(-1)  # (...)
    spread = torch.where(r_sum > 0, (spread_rows * r).sum(-1) / r_sum.clamp_min(1e-30), torch.zeros_like(r_sum))
    uni = 1.0 / T
    u = ((vert[rows] | near[rows]).sum(-1).to(probs.dtype) * uni).mean()  # v + d of uniform attention
    return {"v": v.mean(-1), "d": d.mean(-1), "r": r.mean(-1), "spread": spread,
            "u": torch.full_like(spread, float(u))}


def classify(v: float, d: float, spread: float, u: float = 0.0) -> str:
    """The pattern class of one map from its masses (the rules in the module docstring)."""
    vd = v + d
    # 1e-6: for a word or two, u = 1 and the bar is 1, which v + d meets up to float rounding
    if vd >= max(BROAD_CUTOFF, min(ABOVE_UNIFORM * u, (1 + u) / 2)) - 1e-6:
        if d < MIX_SHARE * vd:
            return "vertical"
        if v < MIX_SHARE * vd:
            return "diagonal"
        return "vertical+diagonal"
    return "block" if spread >= BLOCK_SPREAD else "heterogeneous"


@dataclass(frozen=True)
class HeadStats:
    """Per-head statistics over a corpus.

    stats:        name -> (N, H) tensor, see :data:`STATS`.
    features:     "v", "d", "r", "spread" -> (N, H), means over the corpus's maps.
    classes:      N lists of H class names; ``class_share`` (N, H) the share of maps agreeing.
    class_counts: class -> (N, H) number of maps given that class.
    """

    model: str
    num_texts: int
    num_tokens: int
    stats: dict[str, torch.Tensor]
    features: dict[str, torch.Tensor]
    classes: list[list[str]]
    class_share: torch.Tensor
    class_counts: dict[str, torch.Tensor]
    warnings: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # a summary: the statistics are (N, H) tensors
        N, H = self.class_share.shape
        counts: dict[str, int] = {}
        for row in self.classes:
            for c in row:
                counts[c] = counts.get(c, 0) + 1
        shown = ", ".join(f"{c} {n}" for c, n in sorted(counts.items(), key=lambda x: -x[1]))
        return (f"HeadStats({self.model!r}, {self.num_texts} texts, {self.num_tokens} tokens, {N} layers x {H} heads; "
                f"classes: {shown})")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.class_share.shape)  # type: ignore[return-value]

    def to_json(self) -> dict:
        r = lambda t: [[round(float(x), 6) for x in row] for row in t.tolist()]  # noqa: E731
        return {
            "model": self.model, "num_texts": self.num_texts, "num_tokens": self.num_tokens,
            "layers": self.shape[0], "heads": self.shape[1],
            "rules": {"broad_cutoff": BROAD_CUTOFF, "above_uniform": ABOVE_UNIFORM, "mix_share": MIX_SHARE, "block_spread": BLOCK_SPREAD},
            "stats": {k: r(v) for k, v in self.stats.items()},
            "features": {k: r(v) for k, v in self.features.items()},
            "classes": self.classes, "class_share": r(self.class_share),
            "warnings": self.warnings,
        }


@dataclass
class HeadSums:
    """Running sums behind :class:`HeadStats`, over any set of texts: add texts one by one, merge
    the sums of disjoint sets exactly (float64 sums and integer counts), finish once.

    Every statistic of :class:`HeadStats` is a ratio of these sums, so the statistics of a corpus
    cut into shards are those of the whole corpus: ``merge`` the shards' sums, then ``finish``
    (what ``bertscope heads --engine ray`` does). ``truncated``: line numbers of texts that were
    cut to the tokenizer's limit.
    """

    layers: int
    heads: int
    stats: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> (N, H) float64 sums
    features: dict[str, torch.Tensor] = field(default_factory=dict)  # v d r spread u -> (N, H) sums
    counts: dict[str, torch.Tensor] = field(default_factory=dict)  # class -> (N, H) maps
    num_texts: int = 0
    rows_total: int = 0  # query rows (tokens)
    rows_nb: int = 0  # query rows that have a previous (or next) neighbour
    truncated: list[int] = field(default_factory=list)
    no_tokens: list[int] = field(default_factory=list)  # texts with no ordinary token: skipped
    blank: list[int] = field(default_factory=list)  # texts empty or only whitespace: skipped

    def __post_init__(self) -> None:
        N, H = self.layers, self.heads
        for k in STATS:
            self.stats.setdefault(k, torch.zeros(N, H, dtype=torch.float64))
        for k in ("v", "d", "r", "spread", "u"):
            self.features.setdefault(k, torch.zeros(N, H, dtype=torch.float64))
        for c in CLASSES:
            self.counts.setdefault(c, torch.zeros(N, H, dtype=torch.long))

    def add(self, probs: torch.Tensor, kinds: TokenKinds) -> None:
        """Add one text's attention maps (N, H, T, T) (float64 for exact sums)."""
        N, H, T = probs.shape[0], probs.shape[1], probs.shape[-1]
        ms = map_stats(probs, kinds)
        for k in STATS:
            w = (T - 1) if k in ("prev", "next") else T
            self.stats[k] += ms[k] * w
        self.rows_total += T
        self.rows_nb += T - 1
        pf = pattern_features(probs, kinds)
        for k in self.features:
            self.features[k] += pf[k]
        for li in range(N):
            for hi in range(H):
                c = classify(float(pf["v"][li, hi]), float(pf["d"][li, hi]), float(pf["spread"][li, hi]),
                             float(pf["u"][li, hi]))
                self.counts[c][li, hi] += 1
        self.num_texts += 1

    def merge(self, other: "HeadSums") -> "HeadSums":
        """These sums plus ``other``'s (texts of another shard), in place; returns self."""
        if (other.layers, other.heads) != (self.layers, self.heads):
            raise ValueError("cannot merge head sums of models of different shapes")
        for k in self.stats:
            self.stats[k] += other.stats[k]
        for k in self.features:
            self.features[k] += other.features[k]
        for c in self.counts:
            self.counts[c] += other.counts[c]
        self.num_texts += other.num_texts
        self.rows_total += other.rows_total
        self.rows_nb += other.rows_nb
        self.truncated.extend(other.truncated)
        self.no_tokens.extend(other.no_tokens)
        self.blank.extend(other.blank)
        return self

    def finish(self, model: str, max_length: int, warnings: list[str] | None = None) -> HeadStats:
        """The statistics: means over the corpus's rows and maps, and each head's majority class."""
        if not self.num_texts:
            raise InputError("the corpus has no text (every line is empty, or has no tokens)")
        N, H = self.layers, self.heads
        warns = list(warnings or [])
        warns += lines_warning(sorted(self.truncated), f"is longer than {max_length} tokens and was truncated",
                                f"are longer than {max_length} tokens and were truncated")
        warns += lines_warning(sorted(self.blank), "is blank and was skipped", "are blank and were skipped")
        warns += lines_warning(sorted(self.no_tokens), "has no tokens (the tokenizer drops every character of it) "
                                "and was skipped", "have no tokens (the tokenizer drops every character of "
                                "them) and were skipped")
        stats = {}
        for k in STATS:
            rows = self.rows_nb if k in ("prev", "next") else self.rows_total
            stats[k] = (self.stats[k] / rows).float() if rows else self.stats[k].float()
        stacked = torch.stack([self.counts[c] for c in CLASSES])  # (classes, N, H)
        best = stacked.argmax(0)  # (N, H); argmax takes the first of equal counts, i.e. CLASSES order
        classes = [[CLASSES[int(best[li, hi])] for hi in range(H)] for li in range(N)]
        share = (stacked.max(0).values.double() / self.num_texts).float()
        return HeadStats(
            model=model, num_texts=self.num_texts, num_tokens=self.rows_total, stats=stats,
            features={k: (v / self.num_texts).float() for k, v in self.features.items()},
            classes=classes, class_share=share, class_counts={c: v.clone() for c, v in self.counts.items()},
            warnings=warns,
        )


@analysis
def head_sums(bert: Bert, texts: list[tuple[int, str]] | list[str], *,
              progress: Callable[[int, int], None] | None = None) -> HeadSums:
    """The :class:`HeadSums` of ``texts`` (strings, or (line number, string) pairs); blank
    texts are skipped (and named in the statistics' warnings). Each text runs alone through the reference model (its attentions).
    ``progress(done, total)`` is called after each text (one forward pass each)."""
    if (isinstance(texts, (str, bytes, Mapping, set, frozenset)) or hasattr(texts, "columns")
            or not isinstance(texts, Iterable)):
        check_texts(texts)  # one string, a dict, a set, a table, None: the one-line InputTypeError
    if progress is not None and not callable(progress):
        raise InputTypeError(f"progress must be a function (done, total), got {type(progress).__name__}")
    items = [t if isinstance(t, tuple) and len(t) == 2 else (i + 1, t) for i, t in enumerate(texts)]
    for i, (n, t) in enumerate(items):  # ("a b", "c d") read "a b" as a line number, dropped without a word
        line = as_whole_number(n)  # numpy's too: zip(df.index, df.text)
        if line is None or line < 1:
            raise InputTypeError(f"item {i + 1} is a pair whose first element, {n!r}, is not a line number: "
                                 "give texts as strings, or as (line number, text) pairs")
        items[i] = (line, t)
    items = [(n, check_text(t, f"line {n}")) for n, t in items]
    sums = HeadSums(bert.config.num_hidden_layers, bert.config.num_attention_heads)
    dev = bert.device
    for done, (n, text) in enumerate(items):
        if progress is not None:
            progress(done, len(items))
        if not text.strip():  # said once, by finish(), as the tokenless are
            sums.blank.append(n)
            continue
        batch = bert.encode([text], warn=False)  # said once, by finish(), with the line number
        if batch.lengths[0] <= 2:  # [CLS] [SEP] only: no ordinary rows to classify
            sums.no_tokens.append(n)
            continue
        if batch.truncated[0]:
            sums.truncated.append(n)
        out = bert.encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev),
                         batch.token_type_ids.to(dev), output_attentions=True)
        probs = torch.stack([a[0] for a in out.attentions]).double().cpu()  # (N, H, T, T)
        sums.add(probs, token_kinds(batch.tokens[0]))
    if progress is not None:
        progress(len(items), len(items))
    return sums


def head_stats(bert: Bert, texts: list[tuple[int, str]] | list[str], *,
               warnings: list[str] | None = None,
               progress: Callable[[int, int], None] | None = None) -> HeadStats:
    """Statistics of every layer and head over ``texts`` (strings, or (line number, string) pairs).

    Texts are named by line number in warnings and errors ("line 2"): the given ones, or 1, 2, ...
    for plain strings, as a file's lines are numbered.

    ``warnings``: notes about the corpus gathered before (a file reader's skipped lines, say),
    kept in the result's warnings before this function's own; the list is not changed.
    ``progress(done, total)`` is called after each text (one forward pass each).
    """
    check_bert(bert, "head_stats()")
    if warnings is not None and (isinstance(warnings, str) or not isinstance(warnings, (list, tuple))
                                 or not all(isinstance(w, str) for w in warnings)):
        raise InputTypeError(f"warnings must be a list of strings (the reader's, kept in the record), "
                             f"got {type(warnings).__name__}")
    sums = head_sums(bert, texts, progress=progress)
    if not sums.num_texts:
        raise InputError("the corpus has no text (every line is empty, or has no tokens)")
    hs = sums.finish(bert.name, bert.tokenizer.max_length, warnings)
    cut = sorted(sums.truncated)  # the TruncationWarning every cut text raises (the record lists them all)
    warn_truncated([True] * len(cut), bert.tokenizer.max_length, numbers=cut, lines=True)
    return hs
