"""Pronoun resolution by attention alone, on Winograd schemas, with honest baselines.

Shape legend: S schemas, N layers, H heads, T tokens, W words, K candidates (2 in WSC).

Three ways to pick a candidate from one forward pass of the plain pretrained model:

* **Per head** (after Clark et al. 2019): head (l, h) says "correct" when the pronoun attends
  more to the correct candidate than to the other, at word level: attention *from* the pronoun
  is the mean over its sub-tokens, attention *to* a word the sum over its sub-tokens, and a
  candidate's attention is the largest over its words other than "the"/"a"/"an" (a stand-in for
  its head noun: "the brown suitcase" is scored by the best of "brown" and "suitcase").
  Ties count one half. Picking the best of N x H heads on the same schemas it is scored on
  overstates it, so the head is chosen on one half of the schemas and scored on the other half,
  and the other way round (:func:`held_out_heads`); twin schemas stay on the same side.

* **MAS, the Maximum Attention Score** of Klein & Nabi 2019 ("Attention Is (not) All You Need
  for Commonsense Reasoning", ACL). Per layer and head, A[l, h, c] is the attention between the
  candidate c and the pronoun; a mask keeps, per (l, h), only the candidate with the largest A;
  MAS(c) = Σ_{l,h} A[l, h, c]·mask[l, h, c] / Σ_{c'} Σ_{l,h} A[l, h, c']·mask[l, h, c'];
  the answer is the candidate with the largest MAS. In the authors' released code
  (SAP-samples/acl2019-commonsense, ``commonsense.py``) A is read as ``attention[candidate
  token, pronoun token]``: the attention *from the candidate's token to the pronoun*
  (row = query = candidate, column = key = pronoun), and for a candidate of several sub-tokens
  the largest of them, one-character tokens (such as "a") left out. bertscope implements that
  as ``mas`` ("candidate -> pronoun": A = max over the candidate's sub-tokens t other than
  "the"/"a"/"an" of Σ over the pronoun's sub-tokens p of probs[l, h, t, p]); it leaves out "the"
  and "an" too, which the released script keeps. As a variant, ``mas_pronoun`` takes A = the
  per-head word-level attention from the pronoun to the candidate described above. The same
  repository's later stand-alone ``MAS.py`` (its version 0.2) computes another score: A is the
  mean over the candidate's whole span, and a candidate's score is the share of heads where its
  A is at least the other's. bertscope follows ``commonsense.py``, the script the repository
  gives for replicating the paper's results. Their reported figure for
  bert-base-uncased on WSC273 is 60.3% (published, not reproduced here: the bundled model is a
  different, sentence-embedding model).

* **Baselines**: the candidate that comes first in the text; the candidate nearest to the
  pronoun (characters between them; as with the heads, a tie scores 1/2); chance (1/K), with
  the 95% half-width of a binomial proportion at 50% so a figure can be judged against noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import InputError, InputTypeError, as_count
from ..core.words import group_words, word_attention
from ..bert import Bert, analysis, check_bert
from .wsc import Schema, twin_groups, warnings_within

__all__ = ["CorefResult", "HeldOut", "SchemaScores", "evaluate", "held_out_heads", "hit", "mas",
           "rank_heads", "score_schema"]

DETERMINERS = frozenset({"the", "a", "an"})


def hit(scores: torch.Tensor, correct: int) -> torch.Tensor:
    """1 where the correct candidate scores strictly highest, 1/2 on a tie for the top, else 0.

    scores: (..., K) -> (...).
    """
    top = scores.max(-1).values  # (...)
    at_top = (scores == top[..., None])  # (..., K)
    n_top = at_top.sum(-1).to(torch.float32)  # (...)
    return at_top[..., correct].to(torch.float32) / n_top


def rank_heads(acc: torch.Tensor) -> list[tuple[int, int, float]]:
    """Every head of an (N, H) score table as (layer, head, score), best first.

    Ties are broken by position: the lower layer, then the lower head, comes first. The one
    ranking every "best head" in this module uses, so the best head named and the first head
    listed are always the same.
    """
    H = acc.shape[1]
    flat = acc.flatten()
    order = torch.sort(flat, descending=True, stable=True).indices.tolist()
    return [(i // H, i % H, float(flat[i])) for i in order]


def mas(a: torch.Tensor) -> torch.Tensor:
    """Maximum Attention Score: a (N, H, K) attention per layer, head, candidate -> (K,) summing to 1."""
    winner = a.argmax(-1)  # (N, H)
    mask = torch.nn.functional.one_hot(winner, a.shape[-1]).to(a.dtype)  # (N, H, K)
    kept = (a * mask).sum((0, 1))  # (K,)
    total = kept.sum()
    return kept / total if float(total) > 0 else torch.full_like(kept, 1.0 / a.shape[-1])


@dataclass(frozen=True)
class SchemaScores:
    """What the model's attention says about one schema.

    pron_to_cand: (N, H, K) word-level attention from the pronoun to each candidate.
    cand_to_pron: (N, H, K) attention from each candidate's sub-tokens to the pronoun (MAS's A).
    """

    schema: Schema
    pron_to_cand: torch.Tensor
    cand_to_pron: torch.Tensor

    @property
    def head_hits(self) -> torch.Tensor:  # (N, H)
        return hit(self.pron_to_cand, self.schema.correct)

    @property
    def mas(self) -> torch.Tensor:  # (K,)
        return mas(self.cand_to_pron)

    @property
    def mas_pronoun(self) -> torch.Tensor:  # (K,)
        return mas(self.pron_to_cand)

    def first(self) -> int:
        return min(range(len(self.schema.candidates)), key=lambda c: self.schema.candidate_spans[c][0])

    def gaps(self) -> list[int]:
        """Characters between the pronoun and each candidate (before or after it)."""
        ps, pe = self.schema.pronoun_span
        return [ps - e if e <= ps else s - pe for s, e in self.schema.candidate_spans]

    def nearest(self) -> int:
        """The candidate nearest to the pronoun (the earlier one on a tie; scored as a tie)."""
        g = self.gaps()
        return g.index(min(g))

    def nearest_hit(self) -> float:
        """The nearest baseline scored as the heads are: 1/2 when two candidates are as near."""
        return float(hit(-torch.tensor(self.gaps(), dtype=torch.float32), self.schema.correct))


def _overlapping(offsets, word_ids, span: tuple[int, int]) -> list[int]:
    s, e = span
    return [t for t, ((a, b), w) in enumerate(zip(offsets, word_ids))
            if w is not None and a < e and s < b]


@analysis
def score_schema(bert: Bert, schema: Schema) -> SchemaScores:
    """One forward pass; raises InputError naming the schema if its words cannot be found in the tokens."""
    batch = bert.encode([schema.text])
    offsets, word_ids = batch.offsets[0], batch.word_ids[0]
    words = group_words(batch, schema.text)
    pron_toks = _overlapping(offsets, word_ids, schema.pronoun_span)
    if not pron_toks:
        raise InputError(f"{schema.label}: the pronoun {schema.pronoun!r} is not among the tokens"
                         + (" (the text was truncated)" if batch.truncated[0] else ""))
    dev = bert.device
    out = bert.encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev),
                     batch.token_type_ids.to(dev), output_attentions=True)
    probs = torch.stack([a[0] for a in out.attentions]).float().cpu()  # (N, H, T, T)
    wa = word_attention(probs, words.token_words)  # (N, H, W, W)
    pron_words = sorted({words.token_words[t] for t in pron_toks})
    from_pron = wa[:, :, pron_words, :].mean(2)  # (N, H, W)
    p2c, c2p = [], []
    for c, span in enumerate(schema.candidate_spans):
        toks = _overlapping(offsets, word_ids, span)
        if not toks:
            raise InputError(f"{schema.label}: the candidate {schema.candidates[c]!r} is not among the tokens"
                             + (" (the text was truncated)" if batch.truncated[0] else ""))
        content = [t for t in toks if words.words[words.token_words[t]].lower() not in DETERMINERS] or toks
        cand_words = sorted({words.token_words[t] for t in content})
        p2c.append(from_pron[:, :, cand_words].max(-1).values)  # (N, H)
        to_pron = probs[:, :, content][:, :, :, pron_toks].sum(-1)  # (N, H, |content|)
        c2p.append(to_pron.max(-1).values)  # (N, H)
    return SchemaScores(schema=schema, pron_to_cand=torch.stack(p2c, -1), cand_to_pron=torch.stack(c2p, -1))


@dataclass(frozen=True)
class HeldOut:
    """A head chosen on some schemas and scored on the others (never on the ones it was chosen on)."""

    layer: int
    head: int
    chosen_on: tuple[int, ...]  # schema numbers used to choose the head
    scored_on: tuple[int, ...]  # schema numbers it is scored on (disjoint from chosen_on)
    choice_accuracy: float  # its accuracy on chosen_on (optimistic)
    test_accuracy: float  # its accuracy on scored_on (the honest figure)


def held_out_heads(hits: torch.Tensor, folds: list[int], numbers: list[int]) -> list[HeldOut]:
    """For each fold f: choose the best head on the schemas *not* in f, score it on f.

    hits: (S, N, H) per-schema, per-head hits (0, 1/2 or 1); folds: (S,) fold ids; numbers: (S,)
    schema numbers. A fold whose complement is empty is skipped.
    """
    if hits.dim() != 3 or hits.shape[0] != len(folds) or len(folds) != len(numbers):
        raise ValueError("hits must be (S, N, H) with one fold id and one number per schema")
    fold_t = torch.tensor(folds)
    out = []
    for f in sorted(set(folds)):
        test = fold_t == f
        train = ~test
        if not bool(train.any()):
            continue
        train_acc = hits[train].mean(0)  # (N, H)
        layer, head, _ = rank_heads(train_acc)[0]
        out.append(HeldOut(
            layer=layer, head=head,
            chosen_on=tuple(n for n, t in zip(numbers, train.tolist()) if t),
            scored_on=tuple(n for n, t in zip(numbers, test.tolist()) if t),
            choice_accuracy=float(train_acc[layer, head]),
            test_accuracy=float(hits[test][:, layer, head].mean()),
        ))
    return out


@dataclass(frozen=True)
class CorefResult:
    """Accuracies over the schemas that could be scored (``numbers``)."""

    model: str
    numbers: list[int]
    head_accuracy: torch.Tensor  # (N, H) in-sample accuracy of every head
    held_out: list[HeldOut]
    # every schema scored once, by a head chosen on the other half; None when the schemas form
    # fewer than two twin groups (there is no other half to choose a head on)
    held_out_accuracy: float | None
    mas_accuracy: float  # candidate -> pronoun, as Klein & Nabi's code
    mas_pronoun_accuracy: float  # pronoun -> candidate variant
    first_accuracy: float
    nearest_accuracy: float
    chance: float
    noise_95: float  # 1.96 x sqrt(0.25 / S): the 95% half-width of a proportion near 50%
    per_schema: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    HELD_OUT_NOTE = "not available: a held-out head needs at least two twin groups of schemas"

    def ranked_heads(self) -> list[tuple[int, int, float]]:
        """Every head by in-sample accuracy, best first (ties: lower layer, then lower head)."""
        return rank_heads(self.head_accuracy)

    @property
    def best_in_sample(self) -> tuple[int, int, float]:
        return self.ranked_heads()[0]

    def to_json(self) -> dict:
        l, h, a = self.best_in_sample
        r6 = lambda x: None if x is None else round(float(x), 6)  # noqa: E731  (as every number below)
        held: dict = {"accuracy": r6(self.held_out_accuracy)}
        if self.held_out_accuracy is None:
            held["note"] = self.HELD_OUT_NOTE
        return {
            "model": self.model, "schemas_scored": len(self.numbers), "warnings": [str(w) for w in self.warnings],
            "baselines": {"first": r6(self.first_accuracy), "nearest": r6(self.nearest_accuracy),
                          "chance": r6(self.chance), "noise_95": r6(self.noise_95)},
            "mas": {"candidate_to_pronoun": r6(self.mas_accuracy), "pronoun_to_candidate": r6(self.mas_pronoun_accuracy)},
            "held_out": {**held, "folds": [
                {"layer": f.layer, "head": f.head, "chosen_on": list(f.chosen_on), "scored_on": list(f.scored_on),
                 "choice_accuracy": round(f.choice_accuracy, 6), "test_accuracy": round(f.test_accuracy, 6)}
                for f in self.held_out]},
            "best_head_in_sample": {"layer": l, "head": h, "accuracy": round(a, 6),
                                    "note": "chosen and scored on the same schemas"},
            "head_accuracy": [[round(float(x), 6) for x in row] for row in self.head_accuracy.tolist()],
            "per_schema": self.per_schema,
        }


def evaluate(bert: Bert, schemas: list[Schema], *, warnings: list[str] | None = None,
             limit: int | None = None, progress: Callable[[int, int], None] | None = None) -> CorefResult:
    """Score every schema; schemas that fail are warned about and skipped.

    ``limit``: only the schemas numbered 1..``limit`` in their file (``Schema.number``; WSC273 is
    ``limit=273`` of the 285), whatever slice of them is given; ``warnings`` about schemas past
    it (:class:`~bertscope.understand.wsc.SchemaWarning`, as the reader gives them) are dropped.
    A warning given as a plain str (or one made from a SchemaWarning by a str operation, which
    returns a plain str) has no number and is always kept.
    ``progress(done, total)`` is called after each schema (one forward pass each).
    """
    check_bert(bert, "evaluate()")
    if isinstance(schemas, (str, bytes)) or not isinstance(schemas, (list, tuple)) or not all(
            isinstance(s, Schema) for s in schemas):
        raise InputTypeError("schemas must be a list of Schema, as read_wsc(path) or parse_wsc(data) returns "
                             f"them (not {type(schemas).__name__})")
    if limit is not None:
        limit = as_count(limit, "limit")
    if progress is not None and not callable(progress):
        raise InputTypeError(f"progress must be a function (done, total), got {type(progress).__name__}")
    warns = list(warnings or [])
    if limit is not None:
        schemas = [s for s in schemas if s.number <= limit]
        # the reader's warnings about schemas past the limit are not this count's
        warns = warnings_within(warns, limit)
        if not schemas:  # the reader's reason first: schemas 1..limit may have been unreadable
            raise InputError("no schema could be scored (" + (warns[0] if warns else
                             f"none given is numbered 1..{limit} in its file; limit counts by Schema.number") + ")")
    scored: list[SchemaScores] = []
    for done, s in enumerate(schemas):
        if progress is not None:
            progress(done, len(schemas))
        try:
            scored.append(score_schema(bert, s))
        except InputError as e:
            warns.append(f"{e}; skipped")
    if progress is not None:
        progress(len(schemas), len(schemas))
    if not scored:
        raise InputError("no schema could be scored" + (f" ({warns[0]})" if warns else ""))
    groups = twin_groups([s.schema for s in scored])
    folds = [g % 2 for g in groups]
    numbers = [s.schema.number for s in scored]
    hits = torch.stack([s.head_hits for s in scored])  # (S, N, H)
    held = held_out_heads(hits, folds, numbers)
    by_number = {}
    for f in held:
        for n in f.scored_on:
            by_number[n] = (f.layer, f.head)
    idx = {n: i for i, n in enumerate(numbers)}
    held_hits = [float(hits[idx[n], l, h]) for n, (l, h) in by_number.items()]
    per, mas_hits, masp_hits, first_hits, near_hits = [], [], [], [], []
    for s in scored:
        c = s.schema.correct
        m, mp = s.mas, s.mas_pronoun
        mas_hits.append(float(hit(m, c)))
        masp_hits.append(float(hit(mp, c)))
        first_hits.append(float(s.first() == c))
        near_hits.append(s.nearest_hit())
        per.append({"schema": s.schema.number, "text": s.schema.text, "pronoun": s.schema.pronoun,
                    "candidates": list(s.schema.candidates), "correct": c,
                    "mas": [round(float(x), 6) for x in m], "mas_pronoun": [round(float(x), 6) for x in mp],
                    "first": s.first(), "nearest": s.nearest(), "nearest_gaps": s.gaps()})
    S = len(scored)
    K = len(scored[0].schema.candidates)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return CorefResult(
        model=bert.name, numbers=numbers, head_accuracy=hits.mean(0), held_out=held,
        held_out_accuracy=mean(held_hits) if held_hits else None,
        mas_accuracy=mean(mas_hits), mas_pronoun_accuracy=mean(masp_hits),
        first_accuracy=mean(first_hits), nearest_accuracy=mean(near_hits), chance=1.0 / K,
        noise_95=1.96 * math.sqrt(0.25 / S), per_schema=per, warnings=warns,
    )
