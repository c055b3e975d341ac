"""A resumable, streaming batch-embedding job: a text or JSON Lines file in, a folder of shards out.

Input: a text file (one text per line), or JSON Lines (one JSON object per line, the text in
field ``text`` or the one ``field_name`` names) when the name ends in .jsonl, .ndjson or .json,
or when ``field_name`` is given. A .json file must be JSON Lines: one that holds a single JSON
document (it starts with ``[``, or its first line is not a whole JSON object) is refused.

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
    bad_json     (JSON Lines) a line that is not valid JSON: a zero vector
    no_field     (JSON Lines) valid JSON, but not an object with the field: a zero vector
    not_text     (JSON Lines) the field holds no string (a number, null, a list...): a zero vector

Zero vectors are easy to spot (a real embedding has norm 1 when normalised), and the manifest
lists the line numbers of every row that is not ``ok``. One bad line never stops the job; but
if NO line holds a text (every line fails as not UTF-8, not JSON, without the field or not a
string; blank lines aside), the input is refused before any work, as a usage mistake (the wrong
``--field``, or a file that is not JSON Lines). Read it all back with :func:`read_embeddings`,
or per shard with ``numpy.load``; a parquet OUTPUT is a dataset that
``pyarrow.parquet.read_table(OUTPUT)`` reads directly (files starting with ``_`` or ``.`` are
skipped).

Every file is written to a temporary ``.NAME.*.tmp`` name in OUTPUT and renamed into place, so a
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

from ..errors import InputError
from ..files import TEMP_SUFFIX, write_atomic

__all__ = ["EmbedJobResult", "read_embeddings", "run_embed_job", "STATUSES"]

log = logging.getLogger(__name__)

STATUSES = ("ok", "truncated", "empty", "undecodable", "bad_json", "no_field", "not_text")
_PROBLEMS = STATUSES[1:]
_FAILED = ("undecodable", "bad_json", "no_field", "not_text")  # lines that hold no text at all
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
    """Whether ``path`` is read as JSON Lines; a .json file holding one JSON document is refused."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        _check_json_lines(path)
    return field_name is not None or suffix in (".jsonl", ".ndjson", ".json")


def _check_json_lines(path: Path) -> None:
    """Refuse a .json file that is one JSON document rather than one JSON object per line."""
    first = b""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                first = raw.strip()
                break
    if not first:
        return  # empty: nothing to embed, nothing to refuse
    hint = "embed reads JSON Lines, one JSON object per line"
    if first.startswith((b"[", b"\xef\xbb\xbf[")):
        raise InputError(f"{path} is one JSON document (an array), not JSON Lines; {hint} "
                         f"(convert with: jq -c '.[]' {path})")
    try:
        record = json.loads(first.decode("utf-8").lstrip("\ufeff"))
    except (UnicodeDecodeError, ValueError):
        record = None
    if not isinstance(record, dict):
        raise InputError(f"{path} is not JSON Lines (its first line is not a whole JSON object); {hint} "
                         f"(convert with: jq -c . {path})")


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes without the line ending)."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            yield n, raw.rstrip(b"\r\n") if raw.endswith(b"\n") else raw


def _decode(raw: bytes, jsonl: bool, field_name: str) -> tuple[str, str]:
    """(text, status) for one line: a status of STATUSES, never an exception."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "", "undecodable"
    if jsonl:
        if not line.strip():
            return "", "empty"
        try:
            record = json.loads(line.lstrip("\ufeff"))  # a byte-order mark may open line 1
        except ValueError:  # JSONDecodeError, and the odd number too large to parse
            return "", "bad_json"
        if not isinstance(record, dict) or field_name not in record:
            return "", "no_field"
        line = record[field_name]
        if not isinstance(line, str):
            return "", "not_text"
    if not line.strip():
        return "", "empty"
    return line, "ok"


def _scan(path: Path, jsonl: bool, field_name: str) -> int:
    """Count the lines, and refuse an input in which no line at all holds a text (see the
    module doc) before any work starts. Lines are decoded only until the first one with a text."""
    count, found = 0, False
    failed: dict[str, list[int]] = {s: [] for s in _FAILED}
    for n, raw in _lines(path):
        count = n
        if not found:
            _, status = _decode(raw, jsonl, field_name)
            if status in failed:
                failed[status].append(n)
            else:
                found = status == "ok" or (jsonl and raw.strip() != b"")  # a (maybe empty) string field
    if found or not any(failed.values()):
        return count
    if not jsonl:
        raise InputError(f"{path}: no line is UTF-8 text (line {failed['undecodable'][0]} is the first)")
    if not any(failed[s] for s in ("no_field", "not_text")) and failed["bad_json"]:
        n = failed["bad_json"][0]
        raw = next(r for m, r in _lines(path) if m == n)
        try:
            json.loads(raw.decode("utf-8").lstrip("\ufeff"))
            why = ""
        except ValueError as e:
            why = f" (line {n}: {getattr(e, 'msg', e)})"
        raise InputError(f"{path}: no line is valid JSON{why}; is it JSON Lines, one object per line?")
    reasons = []
    for status, what in (("no_field", "without it"), ("not_text", "where it is not a string"),
                         ("bad_json", "not valid JSON"), ("undecodable", "not UTF-8")):
        if failed[status]:
            reasons.append(f"{len(failed[status])} line(s) {what} (first: line {failed[status][0]})")
    keys = ""
    if failed["no_field"]:
        n = failed["no_field"][0]
        record = json.loads(next(r for m, r in _lines(path) if m == n).decode("utf-8").lstrip("\ufeff"))
        if isinstance(record, dict) and record:
            shown = ", ".join(repr(k) for k in list(record)[:6])
            keys = f"; line {n} has {shown}{', ...' if len(record) > 6 else ''}"
    hint = " (choose the field with --field)" if failed["no_field"] else ""
    raise InputError(f"{path}: no line holds a text in the field {field_name!r}: {'; '.join(reasons)}"
                     f"{keys}{hint}")


def _check_out_dir(out: Path, resume: bool) -> bool:
    """Refuse an OUTPUT that cannot hold this job, before any work; True if it holds a job."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / JOB_FILE).is_file():
            raise InputError(f"{out} exists and is not an embedding job's folder; choose a new --out")
        if not resume:
            raise InputError(f"{out} already holds a job; pass --resume to finish it, or choose a new --out")
        return True
    return False


def _atomic_write(path: Path, write: Callable[[object], None], kill_now: bool = False) -> None:
    def die() -> None:  # the test hook: die with a finished temporary and no final file
        os.kill(os.getpid(), signal.SIGKILL)

    write_atomic(path, write, fsync=True, before_rename=die if kill_now else None)


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

    ``bert`` is a loaded :class:`~bertscope.loading.Bert`, or a function that returns one: it
    is then called only once the arguments, the input and ``out_dir`` have been checked, so a
    bad one fails in moments, not after loading the model. ``progress(n)`` is called after each
    batch of n rows; ``on_total(total, done)`` once the input is counted and checked (done =
    rows already in finished shards when resuming). Bad input raises InputError, before work.
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
    has_job = _check_out_dir(out, resume)
    jsonl = _is_jsonl(path, field_name)
    field_name = field_name or "text"
    total = _scan(path, jsonl, field_name)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the folder {out} ({e.strerror or e})") from None
    if not hasattr(bert, "config") and callable(bert):
        bert = bert()

    job = {"input": _fingerprint(path), "format": fmt, "field": field_name if jsonl else None,
           "jsonl": jsonl, "shard_rows": shard_rows, "model": str(bert.path or bert.name),
           "dim": bert.config.hidden_size, "max_seq_length": bert.max_seq_length, "rows": total,
           "precision": getattr(bert, "precision", "fp32")}
    existing = out / JOB_FILE
    if has_job:
        try:
            before = json.loads(existing.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise InputError(f"{existing} is unreadable; remove {out} and start again") from None
        if isinstance(before, dict):
            before.setdefault("precision", "fp32")  # jobs from before precisions existed were fp32
        if before != job:
            changed = sorted(k for k in job if before.get(k) != job[k])
            raise InputError(f"cannot resume: {', '.join(changed)} changed since the job began")
        for tmp in out.glob(f".*{TEMP_SUFFIX}"):  # left by a killed run
            tmp.unlink()
    else:
        try:
            _write_json(existing, job)
        except OSError as e:
            raise InputError(f"cannot write in {out} ({e.strerror or e})") from None

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
            for a in range(0, len(todo), _CHUNK):  # chunks of texts sorted and embedded together
                part = todo[a:a + _CHUNK]
                emb[part] = bert.embed_ids(ids[a:a + _CHUNK], batch_tokens=batch_tokens,
                                           progress=progress)  # counts texts batch by batch
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
            text, status = _decode(raw, jsonl, field_name)
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
            problems[p].extend(part["problems"].get(p, []))
    manifest = {
        "rows": total, "dim": bert.config.hidden_size, "format": fmt, "model": job["model"],
        "input": job["input"]["path"], "shards": shards,
        "status_counts": {p: len(v) for p, v in problems.items()},
        "problems": problems,
        "rows_note": "one row per input line, in order; empty, undecodable, bad_json, no_field and "
                     "not_text lines are zero vectors; truncated lines embed their first "
                     "max_seq_length tokens",
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
