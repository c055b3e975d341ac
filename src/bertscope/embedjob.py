"""A resumable, streaming batch-embedding job: a text or JSONL file in, a folder of shards out.

Output layout (OUTPUT is a folder):

    OUTPUT/_job.json          the job's parameters and the input's size and mtime (for --resume)
    OUTPUT/part-00000.npy     rows 0 .. S-1 of the input, float32 (rows, C)   [--format npy]
    OUTPUT/part-00000.parquet columns line, status, embedding                 [--format parquet]
    OUTPUT/_part-00000.json   that shard's line range and its problem lines
    OUTPUT/_manifest.json     written last: the job is complete when it exists

One row per input line, in input order; line numbers are 1-based. A row's status is one of

    ok           the text's embedding
    truncated    longer than the model's max_seq_length: the embedding of its first tokens
    empty        an empty or whitespace-only line (or JSON field): a zero vector
    undecodable  bytes that are not UTF-8: a zero vector

Zero vectors are easy to spot (a real embedding has norm 1 when normalised), and the manifest
lists the line numbers of every row that is not ``ok``. Read it all back with
:func:`read_embeddings`, or per shard with ``numpy.load``; a parquet OUTPUT is a dataset that
``pyarrow.parquet.read_table(OUTPUT)`` or ``pandas.read_parquet(OUTPUT)`` reads directly
(files starting with ``_`` or ``.`` are skipped by both).

Every file is written to a temporary ``.tmp-*`` name in OUTPUT and renamed into place, so a
crash never leaves a half-written shard; :func:`run_embed_job` with ``resume=True`` removes
temporaries, keeps every finished shard and computes only the rest.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .errors import InputError

__all__ = ["EmbedJobResult", "read_embeddings", "run_embed_job", "STATUSES"]

log = logging.getLogger(__name__)

STATUSES = ("ok", "truncated", "empty", "undecodable")
_PROBLEMS = ("truncated", "empty", "undecodable")
JOB_FILE, MANIFEST_FILE = "_job.json", "_manifest.json"
# Test hook: SIGKILL this process while the shard after the first N is half written.
KILL_HOOK_ENV = "BERTSCOPE_EMBED_KILL_AFTER_SHARDS"
_CHUNK = 2048  # texts sorted and embedded together inside a shard


@dataclass
class EmbedJobResult:
    """What a finished job wrote: rows, dim, shards, and the line numbers of each problem."""

    out_dir: Path
    rows: int
    dim: int
    shards: int
    shards_skipped: int
    problems: dict[str, list[int]] = field(default_factory=dict)


def _is_jsonl(path: Path, field_name: str | None) -> bool:
    return field_name is not None or path.suffix.lower() in (".jsonl", ".ndjson")


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes without the line ending)."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            yield n, raw.rstrip(b"\r\n") if raw.endswith(b"\n") else raw


def _decode(n: int, raw: bytes, jsonl: bool, field_name: str, path: Path) -> tuple[str, str]:
    """(text, status) for one line; raises InputError for malformed JSONL."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "", "undecodable"
    if jsonl:
        if not line.strip():
            return "", "empty"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict) or field_name not in record:
            raise InputError(f"{path}:{n}: no field {field_name!r} (choose one with --field)")
        line = record[field_name]
        if not isinstance(line, str):
            raise InputError(f"{path}:{n}: field {field_name!r} is not a string")
    if not line.strip():
        return "", "empty"
    return line, "ok"


def _scan(path: Path, jsonl: bool, field_name: str) -> int:
    """Count lines and check every JSONL line before any work starts (fail early, not mid-job)."""
    count = 0
    for n, raw in _lines(path):
        if jsonl:
            _decode(n, raw, jsonl, field_name, path)
        count = n
    return count


def _atomic_write(path: Path, write: Callable[[object], None], kill_now: bool = False) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    if kill_now:  # the test hook: die with a finished temporary and no final file
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(tmp, path)


def _write_json(path: Path, obj: dict) -> None:
    _atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1).encode("utf-8")))


def _fingerprint(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_shard(path: Path, fmt: str, emb: np.ndarray, lines: list[int], statuses: list[str],
                 kill_now: bool) -> None:
    if fmt == "npy":
        _atomic_write(path, lambda f: np.save(f, emb), kill_now)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    C = emb.shape[1]
    table = pa.table({
        "line": pa.array(lines, pa.int64()),
        "status": pa.array(statuses, pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float32()), C),
    })
    _atomic_write(path, lambda f: pq.write_table(table, f), kill_now)


def run_embed_job(
    bert,
    input_path: str | Path,
    out_dir: str | Path,
    *,
    field_name: str | None = None,
    batch_tokens: int | None = None,
    fmt: str = "npy",
    resume: bool = False,
    shard_rows: int = 10_000,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int, int], None] | None = None,
) -> EmbedJobResult:
    """Embed every line of ``input_path`` into shards under ``out_dir`` (see the module doc).

    ``progress(n)`` is called after each batch of n rows; ``on_total(total, done)`` once the
    input is counted (done = rows already in finished shards when resuming).
    """
    path, out = Path(input_path), Path(out_dir)
    if fmt not in ("npy", "parquet"):
        raise InputError(f"unknown format {fmt!r}; choose npy or parquet")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise InputError("--format parquet needs pyarrow: pip install 'bertscope[parquet]'") from None
    if not path.is_file():
        raise InputError(f"input file {path} does not exist" if not path.exists()
                         else f"{path} is not a file")
    if (batch_tokens is not None and batch_tokens < 1) or shard_rows < 1:
        raise InputError("--batch-tokens and the shard size must be at least 1")
    jsonl = _is_jsonl(path, field_name)
    field_name = field_name or "text"
    total = _scan(path, jsonl, field_name)

    job = {"input": _fingerprint(path), "format": fmt, "field": field_name if jsonl else None,
           "jsonl": jsonl, "shard_rows": shard_rows, "model": str(bert.path or bert.name),
           "dim": bert.config.hidden_size, "max_seq_length": bert.max_seq_length, "rows": total}
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a folder")
    existing = out / JOB_FILE
    if out.exists() and any(out.iterdir()):
        if not existing.is_file():
            raise InputError(f"{out} exists and is not an embedding job's folder; choose a new --out")
        if not resume:
            raise InputError(f"{out} already holds a job; pass --resume to finish it, or choose a new --out")
        try:
            before = json.loads(existing.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise InputError(f"{existing} is unreadable; remove {out} and start again") from None
        if before != job:
            changed = sorted(k for k in job if before.get(k) != job[k])
            raise InputError(f"cannot resume: {', '.join(changed)} changed since the job began")
        for tmp in out.glob(".tmp-*"):
            tmp.unlink()
    else:
        out.mkdir(parents=True, exist_ok=True)
        _write_json(existing, job)

    n_shards = (total + shard_rows - 1) // shard_rows
    names = [f"part-{k:05d}" for k in range(n_shards)]
    ext = ".npy" if fmt == "npy" else ".parquet"
    done = {k for k in range(n_shards) if (out / (names[k] + ext)).is_file()
            and (out / f"_{names[k]}.json").is_file()}
    done_rows = sum(min(shard_rows, total - k * shard_rows) for k in done)
    if on_total is not None:
        on_total(total, done_rows)
    kill_after = os.environ.get(KILL_HOOK_ENV)
    written = 0

    def finish_shard(k: int, lines: list[int], texts: list[str], statuses: list[str]) -> None:
        nonlocal written
        C = bert.config.hidden_size
        emb = np.zeros((len(lines), C), dtype=np.float32)
        todo = [i for i, s in enumerate(statuses) if s == "ok"]
        if todo:
            ids, cut = bert.tokenizer.encode_ids([texts[i] for i in todo], max_length=bert.max_seq_length)
            for i, c in zip(todo, cut):
                if c:
                    statuses[i] = "truncated"
            for a in range(0, len(todo), _CHUNK):  # chunks, so the progress bar moves within a shard
                part = todo[a:a + _CHUNK]
                emb[part] = bert.embed_ids(ids[a:a + _CHUNK], batch_tokens=batch_tokens)
                if progress is not None:
                    progress(len(part))
        if progress is not None and len(lines) > len(todo):
            progress(len(lines) - len(todo))
        problems = {p: [ln for ln, s in zip(lines, statuses) if s == p] for p in _PROBLEMS}
        kill_now = kill_after is not None and written >= int(kill_after)
        _write_json(out / f"_{names[k]}.json",
                    {"file": names[k] + ext, "first_line": lines[0], "rows": len(lines),
                     "problems": problems})
        _write_shard(out / (names[k] + ext), fmt, emb, lines, statuses, kill_now)
        written += 1
        log.info("wrote %s (%d rows)", names[k] + ext, len(lines))

    if len(done) < n_shards:
        lines: list[int] = []
        texts: list[str] = []
        statuses: list[str] = []
        for n, raw in _lines(path):
            k = (n - 1) // shard_rows
            if k in done:
                continue
            text, status = _decode(n, raw, jsonl, field_name, path)
            lines.append(n)
            texts.append(text)
            statuses.append(status)
            if len(lines) == shard_rows or n == total:
                finish_shard(k, lines, texts, statuses)
                lines, texts, statuses = [], [], []

    problems: dict[str, list[int]] = {p: [] for p in _PROBLEMS}
    shards = []
    for k in range(n_shards):
        part = json.loads((out / f"_{names[k]}.json").read_text(encoding="utf-8"))
        shards.append({"file": part["file"], "first_line": part["first_line"], "rows": part["rows"]})
        for p in _PROBLEMS:
            problems[p].extend(part["problems"][p])
    manifest = {
        "rows": total, "dim": bert.config.hidden_size, "format": fmt, "model": job["model"],
        "input": job["input"]["path"], "shards": shards,
        "status_counts": {p: len(v) for p, v in problems.items()},
        "problems": problems,
        "rows_note": "one row per input line, in order; empty and undecodable lines are zero "
                     "vectors; truncated lines embed their first max_seq_length tokens",
    }
    _write_json(out / MANIFEST_FILE, manifest)
    return EmbedJobResult(out_dir=out, rows=total, dim=bert.config.hidden_size, shards=n_shards,
                          shards_skipped=len(done), problems=problems)


def read_embeddings(out_dir: str | Path) -> tuple[np.ndarray, list[str]]:
    """A finished job's folder -> (embeddings (rows, C) float32, status per row), in input order."""
    out = Path(out_dir)
    try:
        manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{out} has no {MANIFEST_FILE}: the job is not finished (rerun with --resume)") from None
    status = ["ok"] * manifest["rows"]
    for p, lines in manifest["problems"].items():
        for ln in lines:
            status[ln - 1] = p
    if manifest["format"] == "npy":
        parts = [np.load(out / s["file"]) for s in manifest["shards"]]
    else:
        import pyarrow.parquet as pq

        parts = []
        for s in manifest["shards"]:
            col = pq.read_table(out / s["file"], columns=["embedding"]).column("embedding").combine_chunks()
            parts.append(col.flatten().to_numpy().reshape(len(col), manifest["dim"]))
    emb = np.concatenate(parts) if parts else np.zeros((0, manifest["dim"]), np.float32)
    return emb, status
