"""The embedding job on Ray, and ``embed_dataset`` for Ray Data pipelines.

``run_ray_embed_job`` is ``bertscope embed --engine ray``. It is the local job
(:mod:`bertscope.fast.embedjob`) with the shard loop handed to a pool of actors:

    driver:  check, plan the input's shards, lock OUTPUT      prepare_embed_job  (as local)
    actors:  each loads the model once; per shard:            compute_shard      (as local)
             read its records, embed them (packed path, token-budget batches), write the
             shard and its record into OUTPUT/_staging
    driver:  count the shards as they finish, then commit     finish_embed_job   (as local)

So OUTPUT has the same layout, rows and statuses whichever engine wrote it, and a job started
by one engine can be resumed by the other. OUTPUT and the input must be reachable from every
worker under the same name (one machine; a shared filesystem; or, for the input, any URI pyarrow
reads). A worker that dies is started again by Ray (at most
:data:`~bertscope.scale.cluster.WORKER_RESTARTS` times in a job; one more death ends the job with
one line, :class:`~bertscope.scale.cluster.WorkerDied`) and its shards retried; a shard is never
written half, and one written twice is written identically. ``embed_dataset``'s workers are
started again as often.

``embed_dataset`` maps a ``ray.data.Dataset`` through the same embedding routine
(:func:`~bertscope.fast.embedjob.embed_texts`) and adds two columns: ``embedding`` (fixed-size
list of float32) and ``status`` (as in the job: ok, truncated, empty, undecodable, not_text).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InputError
from ..fast.tuning import usable_cpus
from ..fast.embedjob import (KILL_HOOK_ENV, EmbedJobResult, JobOptions, compute_shard, decode_record,
                             describe_model_folder, embed_texts, finish_embed_job, prepare_embed_job)
from .cluster import (EngineOptions, check_address, check_engine_options, check_local_capacity, map_shards,
                      pool_size, ray_session, require_ray, unwrap_error, worker_remote_args)

__all__ = ["BatchEmbedder", "ShardEmbedder", "embed_dataset", "run_ray_embed_job", "WORKER_KILL_HOOK_ENV"]

log = logging.getLogger(__name__)

# Test hook: the first worker to reach it SIGKILLs itself in the middle of a shard, once (the
# value is a path; the worker that creates it dies, every later one goes on).
WORKER_KILL_HOOK_ENV = "BERTSCOPE_RAY_KILL_WORKER_ONCE"


def model_ref(model) -> str | None:
    """What a worker loads: a folder path, or None for the bundled model."""
    if model is None:
        return None
    if hasattr(model, "config"):  # a loaded Bert: its folder (workers load their own copy)
        from ..bert import bundled_model_path

        path = getattr(model, "path", None)
        if path is None:
            raise InputError("this Bert has no folder to load on the workers; pass the model's folder")
        return None if Path(path) == bundled_model_path() else str(path)
    return str(Path(model).expanduser().resolve())  # workers may start in another folder


def load_worker_model(model: str | None, threads: int, device: str):
    """The worker's model, with ``threads`` torch threads, at most the CPUs this process can use (a larger
    --cpus-per-worker reserves CPUs in Ray; as OpenMP threads, 1e9 of them ended the worker as
    it started, out of memory for their stacks, and Ray started it again and again)."""
    import torch

    from ..bert import load

    torch.set_num_threads(max(1, min(threads, usable_cpus())))
    return load(model, device=device)


class ShardEmbedder:
    """A Ray actor: holds one model; each call computes the shards of its batch (see the module doc)."""

    def __init__(self, model, plan, out_dir, fmt, batch_tokens, run, threads, device, die_once=None):
        self.bert = load_worker_model(model, threads, device)
        self.plan, self.out, self.fmt, self.batch_tokens, self.run = plan, out_dir, fmt, batch_tokens, run
        self.die_once = die_once

    def _maybe_die(self, n: int) -> None:
        try:
            os.close(os.open(self.die_once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)  # mid-shard: embedded, nothing written yet

    def __call__(self, batch: dict) -> dict:
        records = []
        for k in batch["shard"]:
            rec = compute_shard(self.bert, self.plan, self.plan.shards[int(k)], self.out, fmt=self.fmt,
                                batch_tokens=self.batch_tokens, run=self.run, engine="ray",
                                progress=self._maybe_die if self.die_once else None)
            records.append(json.dumps(rec))
        return {"shard": np.asarray(batch["shard"]), "record": np.asarray(records, dtype=object)}


def run_ray_embed_job(model, input_path: str | os.PathLike, out_dir: str | os.PathLike,
                      options: JobOptions | None = None, *, engine: EngineOptions | None = None,
                      progress: Callable[[int], None] | None = None,
                      on_total: Callable[[int, int], None] | None = None) -> EmbedJobResult:
    """``bertscope embed --engine ray``: :func:`~bertscope.fast.embedjob.run_embed_job` with the
    shards computed by ``engine.workers`` Ray actors (see the module doc). ``options``: how to
    read and write, as for the local engine (:class:`~bertscope.fast.embedjob.JobOptions`).

    ``model``: a folder, None for the bundled model, or a loaded Bert (its folder is what the
    workers load). Everything is checked before Ray starts (bad flags, Ray missing, an input
    that matches nothing, OUTPUT) and before the model loads. ``progress(n)`` after each shard.
    """
    opts = engine or EngineOptions()
    check_engine_options(opts)
    check_local_capacity(opts)  # where Ray will start here: before the model loads
    require_ray()
    ref = model_ref(model)

    def load():  # on the driver: checks the folder once, and gives dim and max_seq_length
        from ..bert import load as load_bert

        return model if hasattr(model, "config") else load_bert(ref)

    def describe() -> dict:  # a finished job is confirmed without loading the model on the driver
        return describe_model_folder(ref)

    job = prepare_embed_job(load, input_path, out_dir, options, engine="ray",
                            before_model=lambda: check_address(opts.address),
                            describe=None if hasattr(model, "config") else describe)
    options = options if options is not None else JobOptions()
    try:
        if on_total is not None:
            on_total(job.plan.rows, job.done_rows)
        records: dict[int, dict] = {}
        kill_after = os.environ.get(KILL_HOOK_ENV)
        if job.pending:
            ctor = {"model": ref, "plan": job.plan, "out_dir": str(job.out.resolve()), "fmt": options.fmt,
                    "batch_tokens": options.batch_tokens, "run": job.run, "threads": opts.threads,
                    "device": opts.device, "die_once": os.environ.get(WORKER_KILL_HOOK_ENV)}
            with ray_session(opts) as ray:
                try:
                    with contextlib.closing(map_shards(ray, [s.index for s in job.pending], ShardEmbedder, ctor,
                                                       opts)) as shards:
                        for row in shards:
                            rec = json.loads(row["record"])
                            records[rec["shard"]] = rec
                            if progress is not None:
                                progress(rec["rows"])
                            if kill_after is not None and len(records) == int(kill_after.partition(":")[0]):
                                term = kill_after.endswith(":TERM")  # test hook: the driver dies, or is told to stop
                                os.kill(os.getpid(), signal.SIGTERM if term else signal.SIGKILL)
                except Exception as e:
                    inner = unwrap_error(e)
                    if inner is not e:
                        raise inner from None
                    raise
    except BaseException:  # Ray did not start, say: a new job with nothing computed is undone
        job.undo()
        raise
    return finish_embed_job(job, records)


class BatchEmbedder:
    """A Ray actor for :func:`embed_dataset`: one model; each call embeds one Arrow batch."""

    def __init__(self, model, text_column, batch_tokens, normalize, threads, device):
        self.bert = load_worker_model(model, threads, device)
        self.column, self.batch_tokens, self.normalize = text_column, batch_tokens, normalize

    def __call__(self, table):
        import pyarrow as pa

        texts, statuses = [], []
        for value in table.column(self.column).to_pylist():
            if isinstance(value, str):
                text, status = decode_record(value.encode("utf-8", "surrogatepass"), "text", None)
            elif isinstance(value, bytes):
                text, status = decode_record(value, "text", None)
            else:  # null, a number, a list: not a text
                text, status = "", "not_text"
            texts.append(text)
            statuses.append(status)
        emb = embed_texts(self.bert, texts, statuses, batch_tokens=self.batch_tokens, normalize=self.normalize)
        C = emb.shape[1]
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float32()), C)  # (rows·C,) in rows of C
        return table.append_column("embedding", vectors).append_column("status", pa.array(statuses, pa.string()))


def embed_dataset(ds, text_column: str = "text", model=None, *, batch_size: int = 1024,
                  batch_tokens: int | None = None, normalize: bool = True, workers: int | None = None,
                  cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0):
    """``ds`` (a ``ray.data.Dataset``) with two more columns: ``embedding`` and ``status``.

    Each row's ``embedding`` is ``Bert.embed`` of its ``text_column`` (a fixed-size list of
    float32, unit length when ``normalize``): the same numbers, computed by ``workers`` actors
    that each load ``model`` once (a folder, or None for the bundled all-MiniLM-L6-v2) and
    embed ``batch_size`` rows per call on the packed path, sorted by length and batched by
    ``batch_tokens`` inside the call. ``status`` is ok, truncated (cut to max_seq_length),
    empty, undecodable or not_text (null or not a string): those rows get zero vectors. Rows
    keep their order and other columns: the returned dataset has its own copy of ``ds``'s
    context, with Ray Data's ``execution_options.preserve_order`` set (``ds`` and the datasets
    made from it keep theirs); without it, the actors' batches came back in the order they
    finished.
    ``workers=None``: as many as the cluster's CPUs / ``cpus_per_worker`` (Ray must be
    initialised then). Lazy, like every Ray Data transform: it composes with
    ``.write_parquet(...)``, ``.iter_batches()``, ``.materialize()``.
    """
    require_ray()  # a missing Ray is one line with the pip hint
    import ray.data

    opts = EngineOptions(workers=workers, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker)
    check_engine_options(opts)
    if batch_size < 1 or (batch_tokens is not None and batch_tokens < 1):
        raise InputError("batch_size and batch_tokens must be at least 1")
    schema = ds.schema(fetch_if_missing=False)
    if schema is not None:
        names = list(schema.names)
        if text_column not in names:
            raise InputError(f"the dataset has no column {text_column!r}; its columns are "
                             f"{', '.join(repr(n) for n in names[:8])}")
        clash = [c for c in ("embedding", "status") if c in names]
        if clash:
            raise InputError(f"the dataset already has a column {clash[0]!r}; rename it first")
    ctor = {"model": model_ref(model), "text_column": text_column, "batch_tokens": batch_tokens,
            "normalize": normalize, "threads": opts.threads, "device": opts.device}
    size = workers if workers is not None else pool_size(ray, opts)
    import warnings

    with warnings.catch_warnings():  # Ray Data's own deprecation notes about its context
        warnings.simplefilter("ignore", DeprecationWarning)
        out = ds.map_batches(BatchEmbedder, fn_constructor_kwargs=ctor, batch_size=batch_size,
                             batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=size),
                             **worker_remote_args(opts))
    out = type(out).copy(out, _deep_copy=True)  # a context of its own: Ray Data shares the parent's
    out.context.execution_options.preserve_order = True
    return out
