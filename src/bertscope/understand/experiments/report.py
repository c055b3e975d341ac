"""Run every experiment and write docs/EXPERIMENTS.md with its plots (matplotlib imported lazily)."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import claims as ex
from ..coref import CorefResult, evaluate
from ...files import check_sections, update_section, write_folder_atomic, write_text_atomic
from ..headstats import CLASSES, HeadStats, head_stats
from ...bert import Bert
from ..wsc import read_wsc

__all__ = ["CITATIONS", "Citation", "Report", "render_markdown", "run_all", "save_plots", "write_report"]

SECTION = "seed-claims"  # this command's section of docs/EXPERIMENTS.md (files.update_section)


@dataclass(frozen=True)
class Citation:
    """A figure someone else measured, quoted as theirs (never regenerated here)."""

    value: float
    unit: str
    what: str
    source: str

    @property
    def shown(self) -> str:
        return f"{self.value:.1%}" if self.unit == "accuracy" else f"{self.value:g}{self.unit}"


# Every figure the report quotes rather than measures: one table, shown at the end of the report.
CITATIONS: dict[str, Citation] = {
    "wsc273_mas_bert_base": Citation(0.603, "accuracy", "WSC273 with Maximum Attention Score on bert-base-uncased",
                                     "Klein & Nabi 2019, \"Attention Is (not) All You Need for Commonsense Reasoning\""),
    "spec_forward_512_vs_192": Citation(2.8, "x", "whole BERT-base forward, 512 vs 192 tokens, on one CPU",
                                        "SPEC.md, the project's specification, kept beside this repository and not in it; "
                                        "it corrects the seed with a figure its authors measured on their own CPU, quoted, "
                                        "not measured here"),
}

SEED = "the seed"


def cite(key: str) -> str:
    c = CITATIONS[key]
    return f"{c.shown} ({c.source})"


def verdict(holds: bool, agree: str, disagree: str) -> str:
    """The sentence the numbers support: ``agree`` when the seed's claim holds, else ``disagree``,
    marked so a reader sees the contradiction."""
    return agree if holds else f"**This contradicts {SEED}:** {disagree}"


@dataclass
class Report:
    model: str
    texts: int
    s1: ex.S1Result
    s3: ex.S3Result
    s4: ex.S4Result
    s11: ex.S11Result
    s12: ex.S12Result
    errata: ex.Errata
    heads: HeadStats
    wsc: CorefResult | None = None
    wsc_path: str | None = None
    wsc_limit: int | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


def run_all(bert: Bert, wsc: str | Path | None = None, wsc_limit: int = 273, *,
            progress: Callable[[int, int], None] | None = None) -> Report:
    """Every experiment. ``progress(done, total)`` counts forward-pass work: each WSC schema,
    each sentence of the head statistics, and each of the five claims S1, S3, S4, S11, S12."""
    t0 = time.perf_counter()
    texts = ex.builtin_sentences()
    warns: list[str] = []
    schemas: list = []
    w: list[str] = []
    if wsc is not None:
        schemas, w = read_wsc(wsc)
    n_wsc = sum(1 for s in schemas if s.number <= wsc_limit)
    total = n_wsc + len(texts) + 5
    tell = progress or (lambda done, total: None)
    coref = None
    if wsc is not None:
        coref = evaluate(bert, schemas, warnings=w, limit=wsc_limit, progress=lambda d, _: tell(d, total))
        warns += coref.warnings
    hs = head_stats(bert, texts, progress=lambda d, _: tell(n_wsc + d, total))
    done = n_wsc + len(texts)
    claims = {}
    for name, fn in (("s1", lambda: ex.s1_self_match(bert, texts)), ("s3", lambda: ex.s3_scaling(bert, texts)),
                     ("s4", lambda: ex.s4_padding(bert)), ("s11", lambda: ex.s11_permutation(bert)),
                     ("s12", lambda: ex.s12_referent(bert))):
        claims[name] = fn()
        done += 1
        tell(done, total)
    return Report(model=bert.name, texts=len(texts), s1=claims["s1"], s3=claims["s3"], s4=claims["s4"],
                  s11=claims["s11"], s12=claims["s12"], errata=ex.errata(), heads=hs, wsc=coref,
                  wsc_path=str(wsc) if wsc else None, wsc_limit=wsc_limit if wsc else None,
                  seconds=time.perf_counter() - t0, warnings=warns + hs.warnings)


def save_plots(r: Report, img: Path) -> dict[str, Path]:
    from ...see.figures import line_plot, save_class_map, save_heatmap

    s12_top = float(max(r.s12.tired[:, :, 0].max(), r.s12.wide[:, :, 1].max()))  # one scale: they sit side by side
    out = {
        "s1": line_plot(img / "s1_self_match.png", {"Q = K = x": r.s1.identity, "learned W_Q, W_K (mean over heads)": r.s1.learned},
                         "S1: share of tokens whose best match is themselves", "share of tokens"),
        "s3": line_plot(img / "s3_entropy.png", {"with ÷√d (as trained)": r.s3.entropy_scaled,
                                                  "without ÷√d": r.s3.entropy_unscaled,
                                                  "uniform (mean ln T)": [r.s3.ln_t] * len(r.s3.entropy_scaled)},
                         "S3: mean attention entropy per layer", "entropy (nats)"),
        "s3max": line_plot(img / "s3_max_weight.png", {"with ÷√d (as trained)": r.s3.max_scaled,
                                                        "without ÷√d": r.s3.max_unscaled},
                            "S3: mean largest attention weight per layer", "largest weight"),
        "s12_tired": save_heatmap(img / "s12_it_animal_tired.png", r.s12.tired[:, :, 0],
                                  'S12: "it" -> "animal", "... too tired"', vmin=0.0, vmax=s12_top),
        "s12_wide": save_heatmap(img / "s12_it_street_wide.png", r.s12.wide[:, :, 1],
                                 'S12: "it" -> "street", "... too wide"', vmin=0.0, vmax=s12_top),
        "classes": save_class_map(img / "heads_class.png", r.heads.classes, CLASSES,
                                  f"{r.model}: pattern class over {r.heads.num_texts} sentences"),
        "entropy": save_heatmap(img / "heads_entropy.png", r.heads.stats["entropy"], f"{r.model}: entropy (nats)"),
    }
    if r.wsc is not None:
        out["wsc"] = save_heatmap(img / "wsc_head_accuracy.png", r.wsc.head_accuracy,
                                  f"{r.model}: per-head accuracy on {wsc_name(r)} (in sample)")
    return out


def is_wsc273(r: Report) -> bool:
    """True when exactly the first 273 schemas of the file were scored (none skipped, none missing)."""
    return r.wsc is not None and r.wsc_limit == 273 and r.wsc.numbers == list(range(1, 274))


def wsc_name(r: Report) -> str:
    if r.wsc is None:
        return "WSC"
    if is_wsc273(r):
        return "WSC273"
    return f"{len(r.wsc.numbers)} WSC schemas"


def default_command(r: Report, out: str = "docs/", plots: bool = True) -> str:
    """The command line that reproduces ``r`` (used when the caller does not give the real one)."""
    import shlex

    parts = ["bertscope", "experiments", "--out", out]
    if r.wsc_path is not None:
        parts += ["--wsc", r.wsc_path]
        if r.wsc_limit is not None and r.wsc_limit != 273:
            parts += ["--wsc-limit", str(r.wsc_limit)]
    if not plots:
        parts.append("--no-plots")
    return shlex.join(parts)


def _f(x: float, d: int = 3) -> str:
    return f"{x:.{d}f}"


def _section_s1(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """S1: with Q = K = x, is a token's best match itself?"""
    layers = ctx["layers"]
    sep = ctx["sep"]
    img_rel = ctx["img_rel"]
    N = ctx["N"]
    s1 = r.s1
    a("### S1: with Q = K = x, is a token's best match itself?")
    a("")
    a(f"For each layer's input x and each of the {s1.tokens} tokens, the key with the highest score: "
      "with Q = K = x (raw dot products x·xᵀ), with unit-length x (cosine; always itself, the check), "
      f"and with the layer's learned W_Q, W_K (the model's own scaled scores, share averaged over the {r.heads.shape[1]} heads).")
    a("")
    a(f"| best match is itself | {layers} |")
    a(sep)
    a("| Q = K = x (dot) | " + " | ".join(f"{x:.1%}" for x in s1.identity) + " |")
    a("| Q = K = x (cosine) | " + " | ".join(f"{x:.1%}" for x in s1.identity_cosine) + " |")
    a("| learned W_Q, W_K | " + " | ".join(f"{x:.1%}" for x in s1.learned) + " |")
    a("")
    worst = min(range(N), key=lambda i: s1.identity[i])
    a(f"Without projections {min(s1.identity):.0%}–{max(s1.identity):.0%} of tokens match themselves best "
      f"(lowest in layer {worst}). For cosine that is a theorem (Cauchy–Schwarz); for raw dot products it is not, "
      "since a longer vector can out-score a token's own. With the learned W_Q and W_K "
      f"{min(s1.learned):.0%}–{max(s1.learned):.0%} of tokens per head pick themselves. "
      + verdict(max(s1.learned) < min(s1.identity),
                "In every layer fewer tokens pick themselves with the learned projections than with Q = K = x: "
                "the separate projections are what lets a token look elsewhere, as the seed says.",
                "in some layer the learned projections pick the token itself at least as often as Q = K = x "
                f"does (learned up to {max(s1.learned):.0%}, identity from {min(s1.identity):.0%}), so here the "
                "separate W_Q and W_K do not make tokens look elsewhere."))
    a("")
    a(f"![S1]({img_rel}/s1_self_match.png)")
    a("")


def _section_s3(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """S3: softmax with and without ÷√d_head."""
    layers = ctx["layers"]
    sep = ctx["sep"]
    img_rel = ctx["img_rel"]
    s3 = r.s3
    a("### S3: softmax with and without ÷√d_head")
    a("")
    a("The model's own scores (scaled, as trained) against the same scores multiplied back by √d = "
      f"√{s3.head_size} (i.e. unscaled). Mean over every row of every head; uniform "
      f"attention over these texts would have entropy {s3.ln_t:.2f} nats (mean ln T).")
    a("")
    a(f"| per layer | {layers} |")
    a(sep)
    a("| entropy, with ÷√d (nats) | " + " | ".join(_f(x, 2) for x in s3.entropy_scaled) + " |")
    a("| entropy, without ÷√d | " + " | ".join(_f(x, 2) for x in s3.entropy_unscaled) + " |")
    a("| largest weight, with ÷√d | " + " | ".join(_f(x, 2) for x in s3.max_scaled) + " |")
    a("| largest weight, without ÷√d | " + " | ".join(_f(x, 2) for x in s3.max_unscaled) + " |")
    a("")
    a("Why: for random q, k with unit-variance entries, q·k has standard deviation √d; ÷√d brings it back to 1.")
    a("")
    a("| d | std of q·k | std of q·k/√d |")
    a("|---|---|---|")
    for d, s, sc in s3.random:
        a(f"| {d} | {s:.2f} | {sc:.2f} |")
    a("")
    ratio = [u / sc if sc > 0 else 1.0 for u, sc in zip(s3.entropy_unscaled, s3.entropy_scaled)]
    sharper = all(u > sc for u, sc in zip(s3.max_unscaled, s3.max_scaled)) and max(ratio) < 1.0
    a(f"Without the scaling the mean largest weight goes from "
      f"{min(s3.max_scaled):.2f}–{max(s3.max_scaled):.2f} to {min(s3.max_unscaled):.2f}–{max(s3.max_unscaled):.2f} "
      f"and the entropy is {min(ratio):.0%}–{max(ratio):.0%} of its value with it. "
      + verdict(sharper, "The softmax saturates without ÷√d, as the seed says.",
                "without ÷√d the softmax is not sharper in every layer, so the scaling does not prevent "
                "saturation here."))
    a("")
    a(f"![S3 entropy]({img_rel}/s3_entropy.png) ![S3 max]({img_rel}/s3_max_weight.png)")
    a("")


def _section_s4(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """S4: the padding mask."""
    s4 = r.s4
    a("### S4: the padding mask")
    a("")
    a(f'"{s4.short}" alone, and in a batch with "{s4.long}" (so it gets {s4.pads} [PAD] tokens):')
    a("")
    a("| | max abs difference of its real tokens' outputs vs alone | attention mass on PAD |")
    a("|---|---|---|")
    a(f"| padded, with the mask | {s4.masked_max_diff:.2e} | {s4.pad_weight_masked:.3g} |")
    a(f"| padded, PAD attended (mask all ones) | {s4.unmasked_max_diff:.3f} (lowest cosine {s4.unmasked_min_cos:.3f}) | {s4.pad_weight_unmasked:.3f} |")
    a("")
    invisible = s4.pad_weight_masked == 0.0 and s4.masked_max_diff < 1e-4
    changes = s4.unmasked_max_diff > 1e-3
    a(verdict(invisible, f"With the mask PAD gets weight {s4.pad_weight_masked:g} and the outputs equal the unpadded "
              "ones to float rounding, as the seed says.",
              f"with the mask PAD still gets weight {s4.pad_weight_masked:.3g} or the outputs move by "
              f"{s4.masked_max_diff:.2e}: padding is not invisible."))
    a("")
    a(f"Without the mask {s4.pad_weight_unmasked:.0%} of the attention goes to PAD and the outputs "
      + (f"change (by up to {s4.unmasked_max_diff:.3f})." if changes else
         f"barely change (by at most {s4.unmasked_max_diff:.2e}): on this text the mask matters little."))
    a("")


def _section_s11(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """S11: attention is blind to order; position embeddings are not."""
    s11 = r.s11
    a("### S11: attention is blind to order; position embeddings are not")
    a("")
    a(f'The tokens of "{s11.text}" (with [CLS] and [SEP]) shuffled by a fixed permutation P; out(P·x) against P·out(x):')
    a("")
    a("| | max abs difference | sentence-embedding cosine, text vs shuffle |")
    a("|---|---|---|")
    a(f"| one attention module (layer 0) | {s11.attention_max_diff:.2e} | |")
    a(f"| whole encoder, position embeddings set to 0 | {s11.no_position_max_diff:.2e} | {s11.embedding_cos_no_position:.4f} |")
    a(f"| whole encoder, as trained | {s11.position_max_diff:.3f} (mean token cosine {s11.position_mean_cos:.3f}) | {s11.embedding_cos_position:.4f} |")
    a("")
    equivariant = s11.attention_max_diff < 1e-4 and s11.no_position_max_diff < 1e-4
    ordered = s11.position_max_diff > 1e-3
    a(verdict(equivariant and ordered,
              "Without position embeddings the encoder is permutation-equivariant (a shuffled sentence gets "
              "the same embedding); the position embeddings are the only thing that tells it the order, as the seed says.",
              "attention without positions is not permutation-equivariant here "
              f"(max difference {max(s11.attention_max_diff, s11.no_position_max_diff):.2e}), or the position "
              f"embeddings do not change the outputs of a shuffle (max difference {s11.position_max_diff:.2e})."))
    a("")


def _section_s12(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """S12: which heads point it → animal, and do they follow the referent."""
    img_rel = ctx["img_rel"]
    s12 = r.s12
    a("### S12: which heads point it → animal, and do they follow the referent?")
    a("")
    a("Word-level attention from \"it\" (Clark et al. 2019). Heads ranked by it → animal in \"…too tired\"; the "
      "same heads in \"…too wide\" (where \"it\" is the street):")
    a("")
    a("| head | tired: → animal | tired: → street | wide: → animal | wide: → street |")
    a("|---|---|---|---|---|")
    for l, h, _ in s12.top:
        t, w = s12.tired[l, h], s12.wide[l, h]
        a(f"| L{l} H{h} | {t[0]:.2f} | {t[1]:.2f} | {w[0]:.2f} | {w[1]:.2f} |")
    a("")
    n_heads = s12.tired.shape[0] * s12.tired.shape[1]
    fol = ", ".join(f"L{l} H{h}" for l, h in s12.follows) or "none"
    strong = ", ".join(f"L{l} H{h}" for l, h in s12.follows_strong) or "none"
    a(f"Heads that *follow the referent* (more to animal when tired, more to street when wide): "
      f"{len(s12.follows)} of {n_heads}: {fol}; of these, giving the referent at least 0.1 in both: {strong}.")
    a("")
    top2 = [(l, h) for l, h, _ in s12.top[:2]]
    follow2 = [p for p in top2 if p in s12.follows]
    names = " and ".join(f"L{l} H{h}" for l, h in top2)
    if not follow2:
        a(f"Honest reading: the strongest it → animal heads ({names}) do **not** follow the referent: they "
          "point at \"animal\" in both sentences (a preference for that noun, not coreference). The model "
          "shows heads that specialise, not a head that resolves this pronoun.")
    else:
        a(f"Of the strongest it → animal heads ({names}), "
          + ", ".join(f"L{l} H{h}" for l, h in follow2) + " also follow the referent to \"street\".")
    a("")
    a(f"![S12 tired]({img_rel}/s12_it_animal_tired.png) ![S12 wide]({img_rel}/s12_it_street_wide.png)")
    a("")


def _section_heads(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """Head pattern classes."""
    img_rel = ctx["img_rel"]
    hs = r.heads
    counts = {c: sum(row.count(c) for row in hs.classes) for c in CLASSES}
    a("### Head patterns (after Kovaleva et al. 2019)")
    a("")
    a(f"`bertscope heads` over the {hs.num_texts} sentences ({hs.num_tokens} tokens). Classes by the rules "
      "in `src/bertscope/understand/headstats.py` (v = attention to [CLS]/[SEP]/punctuation, d = to itself and its neighbours; "
      "vertical / diagonal / vertical+diagonal when v + d ≥ max(0.5, min(1.5 u, (1 + u) / 2)), u its uniform value, split by the "
      "share of each; otherwise block if the rest is spread evenly (normalised entropy ≥ 0.7), else heterogeneous). "
      "Kovaleva et al.'s *block* is attention within each sentence of a sentence pair; with one text at a time, "
      "*block* here is its single-text counterpart, broad even attention over the text, so these counts are not "
      "comparable with the paper's.")
    a("")
    a("| class | heads |")
    a("|---|---|")
    for c in CLASSES:
        a(f"| {c} | {counts[c]} |")
    a("")
    top_cls = hs.stats["cls"].flatten().argmax()
    H = hs.shape[1]
    a(f"Mean attention to [CLS] over all heads: {float(hs.stats['cls'].mean()):.2f}, to [SEP]: "
      f"{float(hs.stats['sep'].mean()):.2f}, to punctuation: {float(hs.stats['punct'].mean()):.2f}; "
      f"the most [CLS]-bound head is L{int(top_cls) // H} H{int(top_cls) % H} "
      f"({float(hs.stats['cls'].flatten()[top_cls]):.2f}).")
    a("")
    a(f"![classes]({img_rel}/heads_class.png)")
    a("")
    a(f"![entropy]({img_rel}/heads_entropy.png)")
    a("")


def _section_wsc(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """Pronoun resolution on WSC by attention alone."""
    img_rel = ctx["img_rel"]
    import shlex

    a(f"### Pronoun resolution on {wsc_name(r)} by attention alone")
    a("")
    if r.wsc is None:
        a("Not run (pass `--wsc PATH/WSCollection.xml`).")
    else:
        w = r.wsc
        lh, hh, acc = w.best_in_sample
        coref_cmd = shlex.join(["bertscope", "coref", str(r.wsc_path)]
                               + (["--limit", str(r.wsc_limit)] if r.wsc_limit is not None else []))
        n = len(w.numbers)
        a(f"`{coref_cmd}`: {n} schema{'s' * (n != 1)} scored"
          + (f", {len(w.warnings)} skipped" if w.warnings else ", none skipped")
          + ("" if is_wsc273(r) else " (not the full WSC273, so not comparable with published WSC273 figures)")
          + ".")
        a("")
        a("| method | accuracy |")
        a("|---|---|")
        a(f"| chance | {w.chance:.1%} (95% noise band ±{100 * w.noise_95:.1f} points) |")
        a(f"| first candidate | {w.first_accuracy:.1%} |")
        a(f"| nearest candidate | {w.nearest_accuracy:.1%} |")
        a(f"| MAS, candidate → pronoun (Klein & Nabi's direction) | {w.mas_accuracy:.1%} |")
        a(f"| MAS, pronoun → candidate (variant) | {w.mas_pronoun_accuracy:.1%} |")
        held = (f"{w.held_out_accuracy:.1%}" if w.held_out_accuracy is not None
                else "n/a (needs at least two twin groups of schemas)")
        a(f"| best head, chosen on the other half (held out) | {held} |")
        a(f"| best head in sample (optimistic: chosen on its own test data) | {acc:.1%} (L{lh} H{hh}) |")
        a("")
        a("How each is computed (details in `src/bertscope/understand/coref.py`): *per head*, the word-level attention "
          "from the pronoun (mean over its sub-tokens) to each candidate (sum over a word's sub-tokens; a "
          "candidate scores its best word other than the/a/an), ties counted one half. *MAS*: per layer and "
          "head, A = attention from the candidate's sub-tokens (the largest of them, the/a/an left out; Klein & "
          "Nabi's `commonsense.py` leaves out one-character tokens only) to the pronoun, i.e. row = candidate, "
          "column = pronoun, the direction of that released code; "
          "per (layer, head) only the candidate with the larger A keeps it; the kept values are summed per "
          "candidate and normalised; the larger sum wins. *Held out*: schemas are grouped into twin groups "
          "(consecutive schemas with the same candidates or at least half their words in common), groups "
          "alternate between two halves, the head is chosen on one half and scored on the other, both ways.")
        a("")
        for f in w.held_out:
            c = len(f.chosen_on)
            a(f"- L{f.layer} H{f.head} chosen on {c} schema{'s' * (c != 1)} ({f.choice_accuracy:.1%} there), "
              f"scored on the other {len(f.scored_on)}: {f.test_accuracy:.1%}.")
        a("")
        a("Published reference (not reproduced here, a different model): "
          f"{cite('wsc273_mas_bert_base')}, on WSC273 with MAS on bert-base-uncased.")
        honest = [x for x in (w.mas_accuracy, w.mas_pronoun_accuracy, w.held_out_accuracy, w.first_accuracy,
                              w.nearest_accuracy) if x is not None]
        published = CITATIONS["wsc273_mas_bert_base"].value
        if max(abs(x - w.chance) for x in honest) > w.noise_95:
            a("Some method is further from chance than the noise band; see the table.")
        elif w.noise_95 >= published - w.chance:  # the band cannot tell chance from what bert-base reached
            a(f"With {n} schema{'s' * (n != 1)} the noise band (±{100 * w.noise_95:.1f} points) is at least as "
              f"wide as the distance from chance to bert-base's published {published:.1%}, so these figures cannot "
              "say whether this model's attention resolves Winograd pronouns: run more schemas (WSC273 is the "
              "first 273 of the collection's 285).")
        else:
            a("On this model no method (held-out heads and MAS included) is further from chance than the noise "
              "band: these figures give no evidence that its attention resolves Winograd pronouns. WSC twins "
              "flip the answer with one word, "
              "so any fixed preference (first, nearest, subject) scores about 50%, and so does a head that only "
              "has such a preference. Only the in-sample best head looks better, which is why it is not the figure "
              "to quote.")
        a("")
        a(f"![WSC per-head accuracy]({img_rel}/wsc_head_accuracy.png)")
    a("")


def _section_errata(r: Report, a: Callable[[str], None], ctx: dict) -> None:
    """The seed's errata, and the citations."""
    e = r.errata
    a("### Errata in the seed, with the real numbers")
    a("")
    seed_wrong = max(abs(x - y) for x, y in zip(e.softmax, e.seed_softmax)) > 0.005
    real = ", ".join(f"{x:.2f}" for x in e.softmax)
    a(f"- Softmax of {e.scores}: the seed says {e.seed_softmax}; the real softmax is [{real}] "
      f"({', '.join(f'{x:.4f}' for x in e.softmax)}). "
      + (f"No single temperature fixes it: softmax(s·x) would need s = {e.implied_scale[0]:.2f} to get the seed's "
         f"first-to-second ratio and s = {e.implied_scale[1]:.2f} for its first-to-third."
         if seed_wrong else "The seed's numbers are right to two decimals."))
    claim = 7.0
    holds = abs(e.total_ratio - claim) / claim < 0.15
    a(f"- \"192 is 7x faster than 512\": counting multiply-adds of a BERT-base forward (per sequence), the L×L "
      f"attention arithmetic (Q·Kᵀ and weights·V) shrinks {e.attention_ratio:.2f}x; the projections and "
      f"feed-forward, which grow linearly with L, are {e.flops_192['linear'] / e.flops_192['total']:.0%} of the "
      f"work at 192 tokens, so the whole forward shrinks {e.total_ratio:.2f}x. "
      + ("That is the seed's 7x." if holds else
         "So 7x holds for the attention arithmetic only, not for the model.")
      + " Measured wall-clock ratios for attention alone and for the whole model are in docs/BENCHMARKS.md "
      f"(`bertscope bench`); for comparison, the project's requirements quote "
      f"{CITATIONS['spec_forward_512_vs_192'].shown} for the {CITATIONS['spec_forward_512_vs_192'].what} "
      f"({CITATIONS['spec_forward_512_vs_192'].source}).")
    a("")
    a("### Citations")
    a("")
    a("Figures quoted above, measured by others (not regenerated by this command):")
    a("")
    a("| figure | value | source |")
    a("|---|---|---|")
    for c in CITATIONS.values():
        a(f"| {c.what} | {c.shown} | {c.source} |")
    a("")

SECTIONS = (_section_s1, _section_s3, _section_s4, _section_s11, _section_s12, _section_heads, _section_wsc, _section_errata)


def render_markdown(r: Report, img_rel: str = "experiments", *, plots: bool = True,
                    command: str | None = None) -> str:
    """The Markdown of docs/EXPERIMENTS.md. ``command``: the command line that produced ``r``
    (recorded in the header); ``plots``: whether the images were written (no links otherwise)."""
    L = []

    def a(line: str) -> None:
        if plots or not line.startswith("!["):
            L.append(line)

    if command is None:
        command = default_command(r, plots=plots)
    N = len(r.s1.identity)
    layers = " | ".join(f"L{i}" for i in range(N))
    sep = "|---" * (N + 1) + "|"
    a("## The seed's claims, measured")
    a("")
    a(f"Generated by `{command}` "
      f"on **{r.model}** ({r.heads.shape[0]} layers x {r.heads.shape[1]} heads of {r.s3.head_size}), "
      f"CPU, fp32. The bundled all-MiniLM-L6-v2 is a sentence-embedding model, not bert-base: "
      "figures published for bert-base are quoted as such, never expected of it. Corpus for S1, S3 and head "
      f"statistics: bertscope's own {r.texts} sentences (`src/bertscope/understand/data/sentences.txt`). "
      "Layers and heads are numbered from 0. Every measured number below, and every conclusion drawn "
      "from one, is regenerated by that command; figures quoted from others are listed under *Citations* "
      "at the end.")
    a("")
    ctx = {"layers": layers, "sep": sep, "img_rel": img_rel, "N": N}
    for section in SECTIONS:
        section(r, a, ctx)
    return "\n".join(L) + "\n"


def _json(r: Report) -> dict:
    from dataclasses import asdict

    def clean(x):
        if isinstance(x, torch.Tensor):
            return x.tolist()
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    d = {k: clean(asdict(getattr(r, k))) for k in ("s1", "s3", "s4", "s11", "s12", "errata")}
    d["model"] = r.model
    d["heads"] = r.heads.to_json()
    if r.wsc is not None:
        w = r.wsc.to_json()
        w.pop("per_schema", None)
        w["file"], w["limit"] = r.wsc_path, r.wsc_limit
        d["wsc"] = w
    return d


def write_report(r: Report, out: Path, plots: bool = True, command: str | None = None) -> list[Path]:
    """docs/EXPERIMENTS.md (this command's section of it), docs/experiments/*.png and
    docs/experiments/results.json.

    ``command``: the command line to record in EXPERIMENTS.md (default: one rebuilt from ``r``).
    Without plots the Markdown links no image. All of them are written, or none
    (:func:`bertscope.files.write_folder_atomic`): a failure never leaves new plots beside an
    old EXPERIMENTS.md or results.json."""
    check_sections(Path(out) / "EXPERIMENTS.md", SECTION)  # named as the user knows it, not its staged copy
    if command is None:
        command = default_command(r, str(out), plots)
    results = json.dumps(_json(r), indent=1, allow_nan=False)
    markdown = render_markdown(r, plots=plots, command=command)

    def fill(stage: Path) -> list[Path]:  # every output, or none: staged, then renamed into out
        img = stage / "experiments"
        written = list(save_plots(r, img).values()) if plots else []
        written.append(write_text_atomic(img / "results.json", results))
        doc = stage / "EXPERIMENTS.md"
        if (out / "EXPERIMENTS.md").is_file():  # the other sections stay as they are
            shutil.copyfile(out / "EXPERIMENTS.md", doc)
        written.append(update_section(doc, SECTION, markdown, title="Experiments"))
        return written

    return write_folder_atomic(out, fill)
