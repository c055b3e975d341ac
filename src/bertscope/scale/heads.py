"""Per-head statistics over a corpus on Ray: per-shard sums, merged exactly.

``bertscope heads CORPUS --engine ray``. The corpus file is cut into shards of whole lines
(:func:`~bertscope.fast.jobinput.plan_input`); each actor loads the model once and turns a
shard's lines into a :class:`~bertscope.understand.headstats.HeadSums` (float64 sums and integer
class counts); the driver merges them in shard order and finishes once. Every statistic is a
ratio of those sums, so the result is the local engine's (``head_stats``) up to float64
rounding of the additions' order (about 1e-15 relative).

Lines are read as the local command reads them (:func:`bertscope.files.read_lines`): split at
"\n" only, as ``embed`` counts them, stripped, blank lines skipped, lines that are not UTF-8
text skipped with one warning, a binary file refused.
Shards end just after a ``\\n``, so cutting the file never changes a line or its number.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..files import bad_lines_warning, refuse_records, text_lines
from ..fast.jobinput import InputFile, InputPlan, plan_input, read_shard_bytes, resolve_inputs
from ..understand.headstats import HeadStats, HeadSums, head_sums
from .cluster import (EngineOptions, check_address, check_engine_options, check_local_capacity, map_shards,
                      ray_session, require_ray, unwrap_error)
from .embed import load_worker_model, model_ref

__all__ = ["HeadSumsWorker", "ray_head_stats"]


class HeadSumsWorker:
    """A Ray actor: one model; each call returns the pickled HeadSums of one shard of lines."""

    def __init__(self, model, plan, threads, device):
        self.bert = load_worker_model(model, threads, device)
        self.plan = plan

    def __call__(self, batch: dict) -> dict:
        out_sums, out_bad, out_lines = [], [], []
        for k in batch["shard"]:
            items, bad, n_lines = text_lines(read_shard_bytes(self.plan, self.plan.shards[int(k)]))
            out_sums.append(pickle.dumps(head_sums(self.bert, items)))
            out_bad.append(pickle.dumps(bad))
            out_lines.append(n_lines)
        return {"shard": np.asarray(batch["shard"]), "sums": np.asarray(out_sums, dtype=object),
                "bad": np.asarray(out_bad, dtype=object), "lines": np.asarray(out_lines)}


def _plan_corpus(corpus: str | os.PathLike, shard_lines: int) -> InputPlan:
    refuse_records(corpus, "heads")
    files = resolve_inputs(corpus)
    if len(files) != 1 or files[0].kind == "parquet":
        raise InputError(f"the corpus {corpus} must be one text file (one text per line)")
    f = files[0]
    return plan_input(corpus, shard_rows=shard_lines, files=[InputFile(f.path, "text", f.fs_uri)])


def _first_text(plan: InputPlan) -> bool:
    """Whether any line holds a text (read until the first one), before Ray or the model start."""
    for shard in plan.shards:
        items, _, _ = text_lines(read_shard_bytes(plan, shard, verify=False))
        if items:
            return True
    return False


def ray_head_stats(corpus: str | os.PathLike, model=None, *, engine: EngineOptions | None = None,
                   shard_lines: int = 200,
                   progress: Callable[[int, int], None] | None = None) -> tuple[HeadStats, list[str]]:
    """Per-head statistics of a corpus file, computed by ``engine.workers`` Ray actors.
    ``progress(done, total)``: lines of the file done, after each shard comes back.

    Returns (the :class:`HeadStats`, the warnings about skipped lines that are not UTF-8, as
    ``read_lines`` words them). ``model``: a folder, None for the bundled model, or a loaded
    Bert. Bad input (no such file, no text, bad engine options, Ray missing) is one InputError
    before Ray starts.
    """
    opts = engine or EngineOptions()
    check_engine_options(opts)
    check_local_capacity(opts)  # where Ray will start here: before the model loads
    require_ray()
    if shard_lines < 1:
        raise InputError("the shard size must be at least 1")
    ref = model_ref(model)
    plan = _plan_corpus(corpus, shard_lines)
    if not _first_text(plan):
        raise InputError(f"the corpus {corpus} has no text (no non-blank UTF-8 line)")
    check_address(opts.address)  # before the model loads
    from ..bert import load

    bert = model if hasattr(model, "config") else load(ref)  # checks the folder before Ray starts
    results: dict[int, tuple[HeadSums, list[int], int]] = {}
    lines_done = 0
    ctor = {"model": ref, "plan": plan, "threads": opts.threads, "device": opts.device}
    with ray_session(opts) as ray:
        try:
            with contextlib.closing(map_shards(ray, [s.index for s in plan.shards], HeadSumsWorker, ctor, opts)) as shards:
                for row in shards:
                    results[int(row["shard"])] = (pickle.loads(row["sums"]), pickle.loads(row["bad"]), int(row["lines"]))
                    lines_done += int(row["lines"])
                    if progress is not None:
                        progress(lines_done, plan.rows)
        except Exception as e:
            inner = unwrap_error(e)
            if inner is not e:
                raise inner from None
            raise
    total = HeadSums(bert.config.num_hidden_layers, bert.config.num_attention_heads)
    warnings: list[str] = []
    shown = corpus if "://" in str(corpus) else Path(corpus)  # as read_lines names it
    offset = 0  # lines before this shard
    bad_all: list[int] = []
    for shard in plan.shards:  # merged in shard order, line numbers made global
        sums, bad, n_lines = results[shard.index]
        sums.truncated = [n + offset for n in sums.truncated]
        total.merge(sums)
        bad_all += [n + offset for n in bad]
        offset += n_lines
    warnings += bad_lines_warning(shown, bad_all)
    return total.finish(bert.name, bert.tokenizer.max_length), warnings
