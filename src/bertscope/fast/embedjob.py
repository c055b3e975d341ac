"""A resumable, streaming batch-embedding job: an input in, a folder of shards out.

Input: one file, a folder or a glob (see :mod:`bertscope.fast.jobinput`): text files (one text
per line), JSON Lines (one JSON object per line, the text in field ``text`` or the one
``field_name`` names) when the name ends in .jsonl, .ndjson or .json or when ``field_name`` is
given, or Parquet (the text in column ``text`` or ``field_name``). A .json file must be JSON
Lines: one that holds a single JSON document (it starts with ``[``, or its first line is not a
whole JSON object) is refused.

The input is cut into deterministic shards of ``shard_rows`` records (:func:`plan_input`);
every engine (this module's local loop, or :mod:`bertscope.scale` on Ray) computes the same
shards with the same function, :func:`compute_shard`, so OUTPUT is the same whichever wrote it.

Output layout (OUTPUT is a folder):

    OUTPUT/_job.json          the job's parameters and its input's files and record count
    OUTPUT/_runs.json         each run of the job (1 = the first, +1 per --resume) and its engine
    OUTPUT/.lock              held (flock) by the running job: a second job on OUTPUT is refused
                              (removed when the job finishes)
    OUTPUT/_staging/          finished shards while the job runs, each with its record
                              _part-00000.json (line range, SHA-256 of its input, problems, run,
                              and the shard file's size and SHA-256)
    OUTPUT/part-00000.npy     rows 0 .. S-1 of the input, float32 (rows, C)   [--format npy]
    OUTPUT/part-00000.parquet columns line, status, embedding                 [--format parquet]
    OUTPUT/_manifest.json     written last: the job is complete when it exists

Shards are moved from ``_staging/`` into OUTPUT only when every shard is done, just before the
manifest is written. Dataset readers skip names that start with ``_`` or ``.``, so
``pyarrow.parquet.read_table(OUTPUT)`` on an unfinished job sees no rows (never a silent
subset); once the job is done it reads every row in order.

One row per input record, in input order; line numbers are 1-based (for several files, records
are numbered across the files in order). A row's status is one of

    ok           the text's embedding
    truncated    longer than the model's max_seq_length: the embedding of its first tokens
    empty        an empty or whitespace-only line (or JSON field, or Parquet value), or one of only
                 characters the tokenizer drops (U+200B, control characters): a zero vector
    undecodable  bytes that are not UTF-8 text (or hold NUL bytes, as binary data does; or, in
                 JSON Lines, a string with an escaped lone surrogate such as "\udcff"): a zero vector
    bad_json     (JSON Lines) a line that is not valid JSON: a zero vector
    no_field     (JSON Lines) valid JSON, but not an object with the field: a zero vector
    not_text     (JSON Lines, Parquet) the field holds no string (a number, null, a list...): a zero vector

Zero vectors are easy to spot (a real embedding has norm 1 when normalised), and the manifest
lists the line numbers of every row that is not ``ok``. One bad line never stops the job; but
if NO line holds a text (every line fails as not UTF-8, not JSON, without the field or not a
string; blank lines aside), the input is refused before any work, as a usage mistake (the wrong
``--field``, or a file that is not JSON Lines); so is a text or JSON Lines file with a NUL byte
in its first 8,000 bytes, which is binary data (or UTF-16 text), as git judges a file. Files in
an embedding job's OUTPUT folder (one holding ``_job.json``) are never read as input: an
OUTPUT inside its own INPUT folder is left out of it. Read it all back with :func:`read_embeddings`,
or per shard with ``numpy.load``; a parquet OUTPUT is a dataset that
``pyarrow.parquet.read_table(OUTPUT)`` reads directly.

Durability. Every file is written to a temporary ``.NAME.*.tmp`` name and renamed into place,
so a crash never leaves a half-written shard; a full disk is one error naming the file, and
leaves no temporary. Each shard's record (and the manifest's entry for it) holds a SHA-256 of
its input records, and the size and SHA-256 of the shard file written: ``resume=True`` keeps
every finished shard whose input is unchanged and whose file still has that size and SHA-256,
recomputes the ones whose input changed (whatever the file's size or mtime say) or whose file
is missing, truncated or altered (a complete job too: it becomes unfinished until they are
redone), and computes the rest. Jobs written before files were hashed have their shard files'
shapes checked instead. Only the job holding OUTPUT/.lock removes temporaries, so a resume
never deletes a live job's files.

Memory. A job holds one shard (its records and embeddings) at a time, so its memory does not
grow with the input. What does grow without care is memory the C allocator keeps after torch
frees it: measured over 10⁶ lines (docs/BENCHMARKS.md), the bytes in use stayed at about 280
MiB while glibc's held-free heap grew from 240 to 376 MiB and resident memory to 812 MiB; asking
glibc to return it (``malloc_trim``) brought the process to 299 MiB. So after each shard the
job hands the allocator's free pages back to the system (:func:`bertscope.fast.heap.release_free_memory`;
glibc only, a no-op elsewhere; a few milliseconds per 10,000 lines).
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..core.tokenizer import tokenless
from ..errors import NO_SPACE, InputError, InputTypeError, as_whole_number, no_space, setting
from ..files import TEMP_SUFFIX, FolderLock, fields_note, lock_holder, move_into_place, nearly_full, sha256_file, write_atomic
from .heap import release_free_memory
from .jobinput import (JOB_FILE, InputFile, InputPlan, Shard, iter_records, plan_input, read_piece, read_shard,
                       require_pyarrow, resolve_inputs, where)

__all__ = ["EmbedJob", "EmbedJobResult", "JOB_FILE", "JobOptions", "KILL_HOOK_ENV", "LOCK_FILE", "MANIFEST_FILE",
           "RUNS_FILE", "STAGING", "STATUSES", "check_has_text", "check_json_lines", "compute_shard", "decode_record",
           "describe_model_folder", "embed_texts", "finish_embed_job", "holds_no_job", "prepare_embed_job", "read_embeddings", "release_free_memory", "run_embed_job",
           "write_error"]

log = logging.getLogger(__name__)

STATUSES = ("ok", "truncated", "empty", "undecodable", "bad_json", "no_field", "not_text")
_PROBLEMS = STATUSES[1:]
_FAILED = ("undecodable", "bad_json", "no_field", "not_text")  # lines that hold no text at all
_RESUME = setting("JobOptions(resume=True)", "--resume")  # the CLI shows the flag alone
RUNS_FILE, MANIFEST_FILE, LOCK_FILE, STAGING = "_runs.json", "_manifest.json", ".lock", "_staging"
# Test hook: SIGKILL this process after N shards (local engine: while the next one is half written);
# the Ray engine also takes "N:TERM", for SIGTERM.
KILL_HOOK_ENV = "BERTSCOPE_EMBED_KILL_AFTER_SHARDS"
_CHUNK = 2048  # texts sorted and embedded together inside a shard


@dataclass(frozen=True)
class JobOptions:
    """How an embed job reads its input and writes OUTPUT: the same for every engine
    (:func:`run_embed_job`, and ``bertscope.scale.run_ray_embed_job``)."""

    field_name: str | None = None  # JSON lines: the field that holds the text (default "text")
    batch_tokens: int | None = None  # real tokens per forward pass (default: the model's choice)
    fmt: str = "npy"  # shard format: "npy" or "parquet"
    resume: bool = False  # finish a stopped job: keep its finished shards, redo the rest
    shard_rows: int = 10_000  # input lines per shard: the unit of work, of writing and of resuming


@dataclass
class EmbedJobResult:
    """What a finished job wrote: rows, dim, shards, and the line numbers of each problem.

    ``shards_skipped``: shards already done by an earlier run and kept; ``shards_redone``: the
    indices of finished shards computed again because their input records changed;
    ``shards_repaired``: index -> why, for finished shards computed again because their file
    was missing, truncated or altered (one sentence naming the file). ``already_complete``: the
    job was finished before this run and this run changed nothing in it (a ``--resume`` that
    only checked). ``files`` and ``first_lines``: the input's files as named and the line (row)
    number, counted across them, at which each begins; ``where(n)`` says "line n" for one file
    and "NAME:k" (line k of that file) for several.
    """

    out_dir: Path
    rows: int
    dim: int
    shards: int
    shards_skipped: int
    problems: dict[str, list[int]] = field(default_factory=dict)
    shards_redone: list[int] = field(default_factory=list)
    run: int = 1
    max_seq_length: int | None = None
    shards_repaired: dict[int, str] = field(default_factory=dict)
    already_complete: bool = False
    files: tuple[str, ...] = ()
    first_lines: tuple[int, ...] = ()

    def where(self, line: int) -> str:
        """Where input line (or Parquet row) ``line``, counted across the files, is."""
        return where(line, list(self.files), self.first_lines)


# --- reading records -------------------------------------------------------------------------


def check_json_lines(file: InputFile, who: str = "embed") -> None:
    """Refuse a .json file that is one JSON document rather than one JSON object per line
    (``who``: the command named in the message)."""
    first = b""
    with file.open() as f:
        head = f.read(1 << 20)
    for raw in head.split(b"\n"):
        if raw.strip():
            first = raw.strip()
            break
    if not first:
        return  # empty: nothing to embed, nothing to refuse
    path = file.name
    hint = f"{who} reads JSON Lines, one JSON object per line"
    if first.startswith((b"[", b"\xef\xbb\xbf[")):
        raise InputError(f"{path} is one JSON document (an array), not JSON Lines; {hint} "
                         f"(convert with: jq -c '.[]' {path})")
    try:
        record = json.loads(first.decode("utf-8").lstrip("\ufeff"))
    except (UnicodeDecodeError, ValueError):
        record = None
    except RecursionError:  # nested too deep to read here: that line is a bad_json row, not the file's kind
        return
    if not isinstance(record, dict):
        raise InputError(f"{path} is not JSON Lines (its first line is not a whole JSON object); {hint} "
                         f"(convert with: jq -c . {path})")


def decode_record(raw: bytes | None, kind: str, field_name: str | None) -> tuple[str, str]:
    """(text, status) for one raw record of an input of ``kind``: a status of STATUSES, never an
    exception. ``raw`` is a line's bytes, or a Parquet value's bytes (None for null)."""
    if raw is None:
        return "", "not_text"
    if b"\x00" in raw:  # NUL bytes: binary data, not text (as git and grep judge)
        return "", "undecodable"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "", "undecodable"
    if kind == "jsonl":
        if not line.strip():
            return "", "empty"
        try:
            record = json.loads(line.lstrip("\ufeff"))  # a byte-order mark may open line 1
        except (ValueError, RecursionError):  # JSONDecodeError, a number too large, nesting too deep
            return "", "bad_json"
        if not isinstance(record, dict) or field_name not in record:
            return "", "no_field"
        line = record[field_name]
        if not isinstance(line, str):
            return "", "not_text"
        try:  # JSON may escape a lone surrogate ("\udcff"), which is no text
            line.encode("utf-8")
        except UnicodeEncodeError:
            return "", "undecodable"
    if not line.strip():
        return "", "empty"
    return line, "ok"


def _records_until_found(plan: InputPlan, found: set[int]) -> Iterator[tuple[int, bytes | None]]:
    """(record number, raw record) of the plan, file by file, leaving out the rest of a file
    once its index is in ``found`` (which the caller fills): each file is read only up to its
    first text, not to its end."""
    if len(plan.first_rows) != len(plan.files):  # a plan without file boundaries: all of it
        yield from iter_records(plan, verify=False)
        return
    row, current = 0, -1
    for shard in plan.shards:
        for piece in shard.pieces:
            if piece.file != current:
                current, row = piece.file, plan.first_rows[piece.file]
            if piece.file in found:
                continue  # no need to read on: its rows are not counted either
            for raw in read_piece(plan, piece):
                yield row, raw
                row += 1
                if piece.file in found:
                    break


def check_has_text(plan: InputPlan) -> None:
    """Refuse an input in which no record at all holds a text (see the module doc), before any
    work; of several files, each must hold one unless its field is there but null or not a
    string (a file read with the wrong --field became zero vectors, exit 0, when another file
    had texts). Each file is read only up to its first record with a text."""
    jsonl = plan.kind == "jsonl"
    several = len(plan.files) > 1 and len(plan.first_rows) == len(plan.files)
    failed: dict[int, dict[str, list[int]]] = {}  # file -> status -> its line numbers in that file
    raws: dict[tuple[int, int], bytes | None] = {}
    found: set[int] = set()
    for n, raw in _records_until_found(plan, found):
        i = bisect.bisect_right(plan.first_rows, n) - 1 if several else 0
        line = n - plan.first_rows[i] + 1 if several else n
        _, status = decode_record(raw, plan.kind, plan.field)
        if status not in _FAILED:
            if status == "ok" or (jsonl and raw is not None and raw.strip() != b"") or plan.kind == "parquet":
                found.add(i)  # a text, or (JSON) a maybe-empty string field
                if not several or len(found) == len(plan.files):
                    return
            continue
        mine = failed.setdefault(i, {s: [] for s in _FAILED})
        mine[status].append(line)
        if len(mine[status]) == 1:
            raws[i, line] = raw
    # of several files, one without a text is refused when it looks read wrongly (lines without
    # the field, or not JSON): a file of nulls (not_text) is data, zero vectors with statuses
    bad = [i for i in sorted(failed) if i not in found and not (found and failed[i]["not_text"])]
    if not bad:
        return
    i = bad[0]
    path = plan.files[i].name if several or len(plan.files) == 1 else plan.spec
    others = " (the input's other files hold texts)" if found else ""
    failed_i = failed[i]
    if plan.kind == "text":
        raise InputError(f"{path}: no line is UTF-8 text (line {failed_i['undecodable'][0]} is the first){others}")
    if plan.kind == "parquet":
        raise InputError(f"{path}: no row holds a text in the column {plan.field!r} (row "
                         f"{failed_i['not_text'][0] if failed_i['not_text'] else failed_i['undecodable'][0]} is the "
                         f"first){others}")
    if not any(failed_i[s] for s in ("no_field", "not_text")) and failed_i["bad_json"]:
        n = failed_i["bad_json"][0]
        try:
            json.loads((raws[i, n] or b"").decode("utf-8").lstrip("\ufeff"))
            why = ""
        except ValueError as e:
            why = f" (line {n}: {getattr(e, 'msg', e)})"
        except RecursionError:
            why = f" (line {n}: nested too deep to read)"
        raise InputError(f"{path}: no line is valid JSON{why}; is it JSON Lines, one object per line?{others}")
    reasons = []
    for status, what in (("no_field", "without it"), ("not_text", "where it is not a string"),
                         ("bad_json", "not valid JSON"), ("undecodable", "not UTF-8")):
        if failed_i[status]:
            reasons.append(f"{len(failed_i[status])} line(s) {what} (first: line {failed_i[status][0]})")
    first = failed_i["no_field"][0] if failed_i["no_field"] else None
    keys = fields_note(raws[i, first], first) if first is not None else ""
    hint = " (choose the field with --field)" if first is not None else ""
    raise InputError(f"{path}: no line holds a text in the field {plan.field!r}: {'; '.join(reasons)}"
                     f"{keys}{hint}{others}")


# --- embedding -------------------------------------------------------------------------------


def embed_texts(bert, texts: list[str], statuses: list[str], *, batch_tokens: int | None = None,
                normalize: bool = True, progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Embeddings (n, C) float32 of the rows whose status is "ok"; zero rows for the others.

    The texts are tokenized once (cut to the model's max_seq_length: the status becomes
    "truncated", in place) and embedded on the packed path in chunks, each sorted by length and
    batched by ``batch_tokens``. ``progress(n)`` after each chunk. The one embedding routine of
    every engine and of :func:`bertscope.scale.embed_dataset`.
    """
    emb = np.zeros((len(texts), bert.config.hidden_size), dtype=np.float32)
    todo = [i for i, s in enumerate(statuses) if s == "ok"]
    if todo:
        ids, cut = bert.tokenizer.encode_ids([texts[i] for i in todo], max_length=bert.max_seq_length)
        for i, c, row in zip(todo, cut, ids):
            if tokenless(row) and not c:  # only characters the tokenizer drops (U+200B...): empty
                statuses[i] = "empty"
            elif c:
                statuses[i] = "truncated"
        ids = [row for i, row in zip(todo, ids) if statuses[i] != "empty"]
        todo = [i for i in todo if statuses[i] != "empty"]
        for a in range(0, len(todo), _CHUNK):  # chunks of texts sorted and embedded together
            part = todo[a:a + _CHUNK]
            emb[part] = bert.embed_ids(ids[a:a + _CHUNK], batch_tokens=batch_tokens, normalize=normalize,
                                       progress=progress)  # counts texts batch by batch
    if progress is not None and len(texts) > len(todo):
        progress(len(texts) - len(todo))
    bad = ~np.isfinite(emb).all(axis=1)
    if bad.any():  # a non-finite vector is never stored as a text's embedding
        raise InputError(f"the model gave a non-finite embedding for {int(bad.sum())} text(s); "
                         "are its weights finite?")
    return emb


# --- writing ---------------------------------------------------------------------------------


def write_error(path: Path, e: OSError) -> InputError:
    """One line naming the file and the reason; a full disk says so (numpy's short-write
    message, "N requested and M written", carries no errno, so the free space decides)."""
    full = no_space(e)
    if not full and e.errno is None and "written" in str(e):
        full = nearly_full(path)
    reason = NO_SPACE if full else (e.strerror or str(e))
    return InputError(f"cannot write {path}: {reason}")


def _atomic_write(path: Path, data: bytes, kill_now: bool = False, make_parents: bool = True) -> None:
    def die() -> None:  # the test hook: die with a finished temporary and no final file
        os.kill(os.getpid(), signal.SIGKILL)

    try:
        write_atomic(path, lambda f: f.write(data), fsync=True, before_rename=die if kill_now else None,
                     make_parents=make_parents)
    except OSError as e:  # write_atomic has removed its temporary
        raise write_error(path, e) from None


def _write_json(path: Path, obj: dict, make_parents: bool = True) -> None:
    _atomic_write(path, json.dumps(obj, indent=1).encode("utf-8"), make_parents=make_parents)


def _shard_bytes(fmt: str, emb: np.ndarray, lines: list[int], statuses: list[str]) -> bytes:
    """A shard file's bytes (built in memory: the file is then written with one checked write)."""
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, emb)
        return buf.getvalue()
    import pyarrow as pa
    import pyarrow.parquet as pq

    C = emb.shape[1]
    table = pa.table({
        "line": pa.array(lines, pa.int64()),
        "status": pa.array(statuses, pa.string()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float32()), C),  # (rows·C,) in rows of C
    })
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _shard_name(k: int, fmt: str) -> str:
    return f"part-{k:05d}" + (".npy" if fmt == "npy" else ".parquet")


def _record_name(k: int) -> str:
    return f"_part-{k:05d}.json"


def compute_shard(bert, plan: InputPlan, shard: Shard, out_dir: str | Path, *, fmt: str,
                  batch_tokens: int | None = None, run: int = 1, engine: str = "local",
                  progress: Callable[[int], None] | None = None, kill_now: bool = False) -> dict:
    """Read, embed and write one shard into OUTPUT/_staging, then its record; return the record.

    The same function serves every engine (it needs only a loaded model, the plan and a path).
    The shard's input must still hash to the plan's SHA-256 (else InputError).
    """
    staging = Path(out_dir) / STAGING
    raws = read_shard(plan, shard)
    lines = list(range(shard.first_row, shard.first_row + shard.rows))
    texts, statuses = [], []
    for raw in raws:
        text, status = decode_record(raw, plan.kind, plan.field)
        texts.append(text)
        statuses.append(status)
    emb = embed_texts(bert, texts, statuses, batch_tokens=batch_tokens, progress=progress)
    name = _shard_name(shard.index, fmt)
    data = _shard_bytes(fmt, emb, lines, statuses)
    # the job made _staging: a worker still running after its job was undone (a Ray actor the
    # cluster has not stopped yet) must not make it again, in a folder that holds no job
    _atomic_write(staging / name, data, kill_now, make_parents=False)
    record = {"file": name, "shard": shard.index, "first_line": shard.first_row, "rows": shard.rows,
              "sha256": shard.sha256, "file_bytes": len(data), "file_sha256": hashlib.sha256(data).hexdigest(),
              "run": run, "engine": engine,
              "problems": {p: [ln for ln, s in zip(lines, statuses) if s == p] for p in _PROBLEMS}}
    _write_json(staging / _record_name(shard.index), record, make_parents=False)  # last: the shard is done
    log.info("wrote %s (%d rows)", name, shard.rows)
    del emb, texts, raws, data
    release_free_memory()  # see "Memory" in the module doc
    return record


# --- the job folder --------------------------------------------------------------------------


def _contents(out: Path) -> list[Path]:
    """What OUTPUT holds, apart from the lock file and temporaries of killed runs."""
    return [p for p in out.iterdir() if p.name != LOCK_FILE and not (p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX))]


def holds_no_job(out: str | os.PathLike) -> bool:
    """Whether OUTPUT is a folder with nothing of a job in it: empty, or what a run killed
    while it loaded the model left (its lock file, temporaries)."""
    out = Path(out)
    return out.is_dir() and not _contents(out)


def _check_out_dir(out: Path, resume: bool) -> bool:
    """Refuse an OUTPUT that cannot hold this job; True if it holds a job."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a folder")
    for parent in out.resolve().parents:  # a job's readers (pyarrow's dataset, too) read its whole folder
        if (parent / JOB_FILE).is_file() and ((parent / RUNS_FILE).is_file() or (parent / MANIFEST_FILE).is_file()):
            raise InputError(f"{out} is inside the embedding job's folder {parent}, whose readers would take "
                             "its files for rows of that job; choose a --out outside it")
    if out.is_dir() and _contents(out):
        if not (out / JOB_FILE).is_file():
            raise InputError(f"{out} exists and is not an embedding job's folder; choose a new --out")
        if not resume:
            pid = _running_job(out)
            if pid is not None:  # "pass --resume to finish it" would only meet the lock
                raise _in_use(out, pid)
            if (out / MANIFEST_FILE).is_file():
                raise InputError(f"{out} already holds a finished job; pass {_RESUME} to check it (and "
                                 "recompute missing or damaged shard files), or choose a new --out")
            raise InputError(f"{out} already holds an unfinished job; pass {_RESUME} to finish it, or choose "
                             "a new --out")
        return True
    return False


def _running_job(out: Path) -> str | None:
    """The pid written in OUTPUT/.lock while a job holds its lock; None when no job runs there."""
    return lock_holder(out / LOCK_FILE)


def _in_use(out: Path, pid: str) -> InputError:
    return InputError(f"{out} is in use by another running job (pid {pid}); wait for it to finish, or "
                      "choose another --out")


class _Lock(FolderLock):
    """An exclusive lock on OUTPUT/.lock, held for the whole job (see :class:`FolderLock`)."""

    def __init__(self, out: Path) -> None:
        super().__init__(out / LOCK_FILE, lambda pid: _in_use(out, pid))


@dataclass
class EmbedJob:
    """A job prepared by :func:`prepare_embed_job`: checked, planned and locked; ready to run.

    ``pending``: the shards still to compute (in order); ``done``: index -> record of the
    finished ones kept; ``redone``: finished shards whose input changed (recomputed);
    ``repaired``: index -> why, for finished shards whose file failed its check (recomputed).
    """

    plan: InputPlan
    out: Path
    fmt: str
    batch_tokens: int | None
    job: dict
    run: int
    engine: str
    pending: list[Shard]
    done: dict[int, dict]
    redone: list[int]
    complete: bool
    lock: _Lock | None = None
    repaired: dict[int, str] = field(default_factory=dict)
    new: bool = False  # this run wrote _job.json: no job was there before
    made_folders: tuple[Path, ...] = ()  # the folders preparing it made, innermost first

    @property
    def done_rows(self) -> int:
        return sum(r["rows"] for r in self.done.values())

    def close(self, finished: bool = False) -> None:
        """Release OUTPUT's lock; a ``finished`` job also removes the lock file."""
        if self.lock is not None:
            self.lock.close(remove=finished)
            self.lock = None

    def undo(self) -> bool:
        """Release the lock and, if this run started the job and nothing has been computed for it
        yet (its staging folder holds nothing), remove what preparing it made, so that OUTPUT is
        as it was found. For an engine that fails to start: a job left behind would make the next
        try ask for --resume. True if undone; otherwise the job is only closed, kept to resume."""
        try:  # the staging folder first, and only while empty: a worker cannot make it again
            (self.out / STAGING).rmdir()
        except FileNotFoundError:
            pass
        except OSError:  # it holds work (or a worker's temporary): keep the job, to resume
            self.close()
            return False
        if not self.new:
            self.close()
            return False
        for name in (RUNS_FILE, JOB_FILE):
            (self.out / name).unlink(missing_ok=True)
        self.close(finished=True)  # the lock file too, removed while still held
        for folder in self.made_folders:  # innermost first; only while empty
            try:
                folder.rmdir()
            except OSError:
                break
        return True


def _remove_temporaries(folder: Path) -> None:
    if folder.is_dir():
        for tmp in folder.glob(f".*{TEMP_SUFFIX}"):  # left by a killed run
            tmp.unlink(missing_ok=True)


def _read_json(path: Path, out: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise InputError(f"{path} is unreadable; remove {out} and start again") from None
    shards = data.get("shards", []) if isinstance(data, dict) else None
    if not (isinstance(shards, list) and all(isinstance(x, dict) for x in shards)):  # "[]", or edited by hand
        raise InputError(f"{path} is damaged (not the JSON object a job writes); remove {out} and start again")
    return data


def _describe_model(bert) -> dict:
    from ..core.checkpoint import fingerprint

    folder = Path(bert.path).expanduser().resolve() if bert.path is not None else None
    return {"model": str(folder or bert.name), "weights": fingerprint(folder) if folder else None,
            "dim": bert.config.hidden_size, "max_seq_length": bert.max_seq_length,
            "precision": getattr(bert, "precision", "fp32")}


def _same_model(before: dict, job: dict) -> tuple[dict, dict]:
    """``before`` and ``job`` as they are compared: a job records its model's folder and the
    fingerprint of its files (``weights``); the same fingerprint is the same model, by any path
    (a moved folder, another working folder), and other weights by the same path are another
    model. A job from before fingerprints (no ``weights``) compares the folders it names."""
    before, job = dict(before), dict(job)
    before.pop("kernel", None)  # how it computes, not what: a resumed job takes the recorded one on
    job.pop("kernel", None)
    if before.get("weights") is not None and before.get("weights") == job.get("weights"):
        before.pop("model", None)
        job.pop("model", None)
    elif "weights" not in before:
        job.pop("weights", None)
        try:
            if Path(str(before.get("model"))).expanduser().resolve() == Path(str(job.get("model"))):
                job["model"] = before.get("model")
        except (OSError, RuntimeError):
            pass
    return before, job


def describe_model_folder(path: str | os.PathLike | None, precision: str = "fp32") -> dict:
    """What a job records of the model that ``bertscope.load(path, precision=...)`` would give,
    read from the folder's small JSON files without loading it (``path=None``: the bundled model).

    Pass it as ``prepare_embed_job(..., describe=...)`` so that resuming a finished job finds
    there is nothing to do without loading (and, for int8, calibrating) the model. It is what
    the load gives where the load keeps ``precision`` (fp32, or ``keep_precision=True`` on a CPU
    that runs it). Where the load would not (bf16 on a CPU without AVX512-BF16 or AMX, int8
    without an int8 kernel), a finished job recorded in that precision is still confirmed
    complete: it needs nothing computed. Any other difference loads the model to decide."""
    from ..core.checkpoint import bundled_model_path, fingerprint, read_config, read_max_seq_length

    folder = (bundled_model_path() if path is None else Path(path).expanduser()).resolve()
    config = read_config(folder)
    return {"model": str(folder), "weights": fingerprint(folder), "dim": config.hidden_size,
            "max_seq_length": read_max_seq_length(folder, config), "precision": precision}


class _NeedsModel(Exception):
    """A finished job that cannot be confirmed complete from a described model: load it."""


def prepare_embed_job(bert, input_path: str | os.PathLike, out_dir: str | os.PathLike,
                      options: JobOptions | None = None, *, engine: str = "local",
                      before_model: Callable[[], object] | None = None,
                      describe: Callable[[], dict] | None = None) -> EmbedJob:
    """Check everything, plan the input's shards and lock OUTPUT: the first half of every engine.

    ``bert`` is a loaded :class:`~bertscope.bert.Bert`, or a function that returns one: it is
    called only once the arguments, the input and OUTPUT have been checked, so a bad one fails
    in moments, not after loading the model. ``before_model()`` runs just before that (an
    engine's own checks, such as reaching a cluster). Bad input raises InputError, before any
    work. Close the returned job (or let :func:`finish_embed_job` do it) to release the lock.

    ``describe()`` (with a function for ``bert``, when resuming): the model's description as
    the job records it (:func:`describe_model_folder`). A finished job whose record, input and
    files all match it is returned complete without calling ``bert`` at all; anything else
    loads the model and is decided as without it.
    """
    o = options if options is not None else JobOptions()
    if not isinstance(o, JobOptions):
        raise TypeError(f"options must be a JobOptions, got {type(o).__name__}: "
                        "JobOptions(shard_rows=..., fmt=..., ...)")
    field_name, batch_tokens, fmt, resume, shard_rows = o.field_name, o.batch_tokens, o.fmt, o.resume, o.shard_rows
    _check_bert(bert)
    if not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir).strip():
        raise InputError(f"the output folder (--out) must be a folder name, got {out_dir!r}")
    out = Path(out_dir)
    if batch_tokens is not None:
        if as_whole_number(batch_tokens) is None:
            raise InputTypeError(f"batch_tokens must be a whole number, got {batch_tokens!r}")
        batch_tokens = as_whole_number(batch_tokens)  # a numpy or 0-d tensor int: a plain int, for the JSON
    if as_whole_number(shard_rows) is None:
        raise InputTypeError(f"shard_rows must be a whole number, got {shard_rows!r}")
    shard_rows = as_whole_number(shard_rows)
    if field_name is not None and not isinstance(field_name, str):
        raise InputError(f"{setting('field_name', '--field')} must be a string, got {field_name!r}")
    if fmt not in ("npy", "parquet"):
        raise InputError(f"unknown format {fmt!r}; choose npy or parquet")
    if fmt == "parquet":
        require_pyarrow("--format parquet")
    if batch_tokens is not None and batch_tokens < 1:
        raise InputError(f"--batch-tokens must be at least 1, not {batch_tokens}")
    if shard_rows < 1:
        raise InputError(f"the shard size (--shard-rows) must be at least 1, not {shard_rows}")
    files = resolve_inputs(input_path, field_name)
    for f in files:
        if f.kind == "jsonl" and f.name.lower().endswith(".json"):
            check_json_lines(f)
    _check_out_dir(out, resume)  # early, before reading a large input
    try:
        plan = plan_input(input_path, field_name=field_name, shard_rows=shard_rows, files=files)
    except InputError:
        if resume:  # a Parquet column that is not there, say: a --field the job did not begin with?
            _refuse_a_changed_reading(None, out, fmt, field_name)
        raise
    try:
        check_has_text(plan)
    except InputError:
        if resume:  # read as the job began (another --field, say), it may well have texts: say that
            _refuse_a_changed_reading(plan, out, fmt, field_name)
        raise
    if before_model is not None:
        before_model()
    loader = not hasattr(bert, "config") and callable(bert)
    if loader and describe is not None and resume and (out / MANIFEST_FILE).is_file():
        finished = _finished_job(describe, plan, out, fmt, batch_tokens, engine)
        if finished is not None:
            return finished
    target = Path(os.path.abspath(out))  # ".." resolved by name, so no existing folder counts as new
    new = [d for d in (target, *target.parents) if not d.exists()]  # what mkdir makes, innermost first
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the folder {out} ({e.strerror or e})") from None
    if loader:
        made = {d: _identity(d) for d in new}
        try:
            bert = bert()
        except BaseException:  # a model that does not load leaves no empty OUTPUT behind
            for d in new:  # innermost first; only the very folders made above, and only while empty
                try:
                    if _identity(d) != made[d]:
                        break
                    d.rmdir()
                except OSError:
                    break
            raise
    lock = _Lock(out)
    try:
        job = _open_job(bert, plan, out, fmt, batch_tokens, resume, engine, lock)
    except BaseException:
        _release(lock, out)
        raise
    job.made_folders = tuple(new)
    return job


def _finished_job(describe: Callable[[], dict], plan: InputPlan, out: Path, fmt: str,
                  batch_tokens: int | None, engine: str) -> EmbedJob | None:
    """The finished job in ``out``, complete (nothing to compute) as the described model would
    find it, or None where only the loaded model can decide (the lock released again)."""
    try:
        model = describe()
    except Exception as e:  # an unreadable folder: the load says what is wrong
        log.debug("not described (%s): loading the model", _first_line(e))
        return None
    lock = _Lock(out)
    try:
        return _open_job(model, plan, out, fmt, batch_tokens, True, engine, lock, only_if_complete=True)
    except _NeedsModel:
        lock.close()
        return None
    except BaseException:
        _release(lock, out)
        raise


def _release(lock: _Lock, out: Path) -> None:
    """Release a lock taken for a job that was refused: a finished folder (it holds the
    manifest) is left as it was found, without the lock file."""
    lock.close(remove=(out / MANIFEST_FILE).is_file())


def _check_bert(bert: object) -> None:
    if not (hasattr(bert, "config") or callable(bert)):
        raise InputTypeError("bert must be a model from bertscope.load(), or a function that returns one; "
                             f"got {type(bert).__name__}")


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of ``folder``, or None: the same pair later means the same folder."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _open_job(bert, plan: InputPlan, out: Path, fmt: str, batch_tokens: int | None, resume: bool,
              engine: str, lock: _Lock, only_if_complete: bool = False) -> EmbedJob:
    """Open (or start) the job in ``out``. ``bert``: the loaded model, or its description (a
    dict). ``only_if_complete``: raise _NeedsModel, before changing anything, unless the job in
    ``out`` is finished and sound."""
    has_job = _check_out_dir(out, resume)  # again, now that OUTPUT is ours
    model = bert if isinstance(bert, dict) else _describe_model(bert)
    job = {"input": plan.describe(), "format": fmt, "field": plan.field, "shard_rows": plan.shard_rows,
           **model, "rows": plan.rows}
    staging = out / STAGING
    if only_if_complete and not (has_job and (out / MANIFEST_FILE).is_file()):
        raise _NeedsModel
    if has_job:
        before = _read_json(out / JOB_FILE, out)
        if not isinstance(before, dict):
            raise InputError(f"{out / JOB_FILE} is unreadable; remove {out} and start again")
        before.setdefault("precision", "fp32")  # jobs from before precisions existed were fp32
        if _same_model(before, job)[0] != _same_model(before, job)[1]:
            if only_if_complete:  # the loaded model may differ from its description: let it decide
                raise _NeedsModel
            raise InputError(_why_not_resumable(before, job))
        _remove_temporaries(out)  # we hold the lock: these belong to no live job
        _remove_temporaries(staging)
        if not isinstance(bert, dict) and engine == "local":  # the shards left: with the job's kernel choice
            if "kernel" not in before:  # begun by Ray, or before records: the resumes from now on agree
                before["kernel"] = bert.kernel_record()
                _write_json(out / JOB_FILE, before)
            bert.use_kernel_record(before["kernel"], str(out / JOB_FILE))
        runs = _read_json(out / RUNS_FILE, out) if (out / RUNS_FILE).is_file() else {"runs": []}
    else:
        if not isinstance(bert, dict) and engine == "local":  # the kernel choice, made now: a resumed job
            job["kernel"] = bert.kernel_record()  # computes with it again (Ray's workers choose their own)
        _write_json(out / JOB_FILE, job)
        runs = {"runs": []}
    run = len(runs["runs"]) + 1
    entry = {"run": run, "engine": engine, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if not isinstance(bert, dict):  # what load() was asked for: "int8 was off" is not "fp32 was asked"
        entry["precision_asked"] = getattr(bert, "precision_asked", job["precision"])
    runs["runs"].append(entry)

    done: dict[int, dict] = {}
    redone: list[int] = []
    repaired: dict[int, str] = {}
    complete = False
    manifest_path = out / MANIFEST_FILE
    if manifest_path.is_file():  # a finished job: nothing to do if its input and files are sound
        manifest = _read_json(manifest_path, out)
        old = {s.get("shard", k): s.get("sha256") for k, s in enumerate(manifest.get("shards", []))}
        changed = [s for s in plan.shards if old.get(s.index) != s.sha256]
        if changed:
            first = changed[0]
            raise InputError(f"cannot resume: the job in {out} is complete, but input records "
                             f"{first.first_row}..{first.first_row + first.rows - 1}"
                             f"{f' and {len(changed) - 1} more shard(s)' if len(changed) > 1 else ''} "
                             "changed since; embed into a new --out")
        records = _manifest_records(manifest)
        for k, rec in records.items():
            why = _shard_file_problem(out / rec["file"], rec, fmt, job["dim"])
            if why is not None:
                repaired[k] = why
        if repaired and only_if_complete:  # shards to recompute: with the model
            raise _NeedsModel
        if not repaired:
            done, complete = records, True
        else:  # unfinish the job: the good shards' records back in _staging, then no manifest
            for k, rec in records.items():
                if k not in repaired:
                    _write_json(staging / _record_name(k), rec)
                    done[k] = rec
            for k in repaired:
                (out / records[k]["file"]).unlink(missing_ok=True)
            manifest_path.unlink()
    elif staging.is_dir():
        for shard in plan.shards:
            rec_path = staging / _record_name(shard.index)
            if not rec_path.is_file():
                continue
            try:
                rec = json.loads(rec_path.read_text(encoding="utf-8"))
                if not isinstance(rec, dict):
                    raise ValueError("not a record")
            except (OSError, ValueError):  # damaged (a crash mid-write of an older version, a disk error)
                repaired[shard.index] = f"its record {STAGING}/{rec_path.name} was unreadable"
                rec_path.unlink(missing_ok=True)
                continue
            name = _shard_name(shard.index, fmt)
            present = (staging / name).is_file() or (out / name).is_file()
            if rec.get("sha256") == shard.sha256 and rec.get("rows") == shard.rows:
                path = staging / name if (staging / name).is_file() else out / name  # the one kept
                why = _shard_file_problem(path, rec, fmt, job["dim"])
                if why is None:
                    done[shard.index] = rec
                    continue
                repaired[shard.index] = why
                path.unlink(missing_ok=True)
            elif present and rec.get("sha256") != shard.sha256:
                redone.append(shard.index)
            rec_path.unlink()
    for k, why in repaired.items():
        log.info("recomputing shard %d: %s", k, why)
    if not complete:  # a finished job's resume computes nothing: not a run
        _write_json(out / RUNS_FILE, runs)
        staging.mkdir(exist_ok=True)  # where the shards go (compute_shard does not make it)
    pending = [s for s in plan.shards if s.index not in done]
    return EmbedJob(plan=plan, out=out, fmt=fmt, batch_tokens=batch_tokens, job=job, run=run,
                    engine=engine, pending=pending, done=done, redone=redone, complete=complete,
                    lock=lock, repaired=repaired, new=not has_job)


def _refuse_a_changed_reading(plan: InputPlan | None, out: Path, fmt: str, field_name: str | None) -> None:
    """Where OUTPUT's job read its input with another field or as another kind of file, the
    refusal of :func:`_why_not_resumable`, naming every change to the input and the job's
    options (``plan``: None where the input could not be planned; then only --field is
    compared). Else nothing: the caller's error stands. Run where the input's own checks failed
    ("no line is valid JSON", say), which hid the change that caused them."""
    try:
        before = json.loads((out / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    old_in = before.get("input") if isinstance(before, dict) else None
    if not isinstance(old_in, dict):
        return
    if plan is None:
        if field_name is not None and field_name != before.get("field"):
            old = "none" if before.get("field") is None else repr(before.get("field"))
            raise InputError(f"cannot resume: --field is now {field_name!r}, not the {old} the job began with; "
                             "start a new job with another --out (or rerun with the settings the job began with)")
        return
    new_in = plan.describe()
    if before.get("field") == plan.field and old_in.get("kind") == new_in.get("kind"):
        return
    job = {**before, "input": new_in, "field": plan.field, "rows": plan.rows, "format": fmt,
           "shard_rows": plan.shard_rows}  # the model's entries as the job's: not known before loading it
    raise InputError(_why_not_resumable(before, job))


def _why_not_resumable(before: dict, job: dict) -> str:
    """One line saying how this job differs from the one OUTPUT holds (``before``, its _job.json),
    naming the old and the new value of each difference, and what to do."""
    old_in = before.get("input") if isinstance(before.get("input"), dict) else {}
    new_in = job["input"]
    inputs: list[str] = []  # reasons about the input
    settings: list[str] = []  # reasons about the options and the model

    def began(new: object, old: object) -> str:
        return f"{new}, not the {old} the job began with"

    def files(names: object) -> str:
        if not isinstance(names, list):
            return repr(names)
        shown = ", ".join(str(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        return shown if len(names) == 1 else f"{len(names)} files ({shown})"

    if old_in.get("files") != new_in.get("files"):
        inputs.append(f"the input is now {files(new_in.get('files'))}, not {files(old_in.get('files'))} "
                      "as when the job began")
    if old_in.get("kind") != new_in.get("kind"):
        inputs.append(f"the input is now read as {began(new_in.get('kind'), old_in.get('kind'))}")
    old_rows = before.get("rows", old_in.get("rows"))
    if old_rows != job["rows"] or old_in.get("rows") != new_in.get("rows"):
        unit = "rows" if new_in.get("kind") == "parquet" else "lines"
        inputs.append(f"the input now has {job['rows']} {unit}, not the {old_rows} the job began with")
    flags = {"format": "--format", "field": "--field", "shard_rows": "--shard-rows"}
    for key, flag in flags.items():
        if before.get(key) != job.get(key):
            old, new = before.get(key), job.get(key)
            if key == "field":  # a text input has none
                old, new = ("none" if v is None else repr(v) for v in (old, new))
            settings.append(f"{flag} is now {began(new, old)}")
    before, job = _same_model(before, job)
    if before.get("weights") != job.get("weights") and before.get("model") == job.get("model"):
        settings.append(f"the model's files in {job.get('model')} (config.json, weights, tokenizer) are not "
                        "those the job began with")
    elif before.get("model") != job.get("model"):
        settings.append(f"the model is now {began(job.get('model'), before.get('model'))}")
    else:
        for key in ("dim", "max_seq_length"):
            if before.get(key) != job.get(key):
                settings.append(f"the model's {key} is now {began(job.get(key), before.get(key))}")
    if before.get("precision") != job.get("precision"):
        settings.append(f"precision changed: the job began with {before.get('precision')}, this run is "
                        f"{job.get('precision')}")
    known = {"input", "rows", "model", "weights", "dim", "max_seq_length", "precision", *flags}
    for key in sorted(k for k in set(job) | set(before) if k not in known and before.get(k) != job.get(k)):
        settings.append(f"{key} is now {began(job.get(key), before.get(key))}")
    fixes = (["restore the input"] if inputs else []) + (["rerun with the settings the job began with"]
                                                           if settings else [])
    return (f"cannot resume: {'; '.join(inputs + settings)}; start a new job with another --out "
            f"(or {' and '.join(fixes)})")


def _manifest_records(manifest: dict) -> dict[int, dict]:
    """A finished job's shards as records (index -> record), each with its own problems."""
    problems = {p: sorted(v) for p, v in manifest.get("problems", {}).items()}
    records = {}
    for k, s in enumerate(manifest.get("shards", [])):
        first, rows = s.get("first_line", 1), s.get("rows", 0)
        mine = {p: v[bisect.bisect_left(v, first):bisect.bisect_left(v, first + rows)] for p, v in problems.items()}
        records[s.get("shard", k)] = {**s, "problems": mine}
    return records


def _file_sha256(path: Path) -> str:
    return sha256_file(path).hexdigest()


def _unreadable(path: Path, e: OSError) -> InputError:
    """A finished shard that cannot be read (permissions, an I/O error) is not proof it is damaged:
    one line naming it, rather than deleting it and computing it again."""
    return InputError(f"cannot read {path} ({e.strerror or e}); fix its permissions, or remove it "
                      "to have --resume recompute it")


def _shard_file_problem(path: Path, rec: dict, fmt: str, dim: int) -> str | None:
    """Why the finished shard file ``path`` cannot be trusted (one clause naming it), or None:
    it must have the size and SHA-256 its record holds; a record from before files were hashed
    has its file's shape checked instead. A file there that cannot be read raises InputError."""
    name = path.name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{name} is missing"
    except OSError as e:
        raise _unreadable(path, e) from None
    want = rec.get("file_bytes")
    if want is not None and size != want:
        return f"{name} has {size} bytes, not the {want} recorded"
    digest = rec.get("file_sha256")
    if digest is None:
        return _shard_shape_problem(path, fmt, rec.get("rows"), dim)
    try:
        if _file_sha256(path) != digest:
            return f"{name} does not match the SHA-256 recorded for it"
    except FileNotFoundError:  # removed meanwhile
        return f"{name} is missing"
    except OSError as e:
        raise _unreadable(path, e) from None
    return None


def _shard_shape_problem(path: Path, fmt: str, rows: object, dim: int) -> str | None:
    """Why ``path`` is not a readable shard of ``rows`` x ``dim`` (one clause), or None."""
    try:
        if fmt == "npy":
            arr = np.load(path, mmap_mode="r")  # the header, and a size check; no data read
            shape = arr.shape
            del arr
        else:
            import pyarrow.parquet as pq

            meta = pq.read_metadata(path)  # the footer only; no data read
            emb = meta.schema.to_arrow_schema().field("embedding").type  # KeyError: no such column
            shape = (meta.num_rows, getattr(emb, "list_size", -1))  # a fixed-size list of C floats
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EIO):  # the system's, not the content's
            raise _unreadable(path, e) from None
        return f"{path.name} is truncated or corrupt ({_first_line(e)})"
    except Exception as e:  # any other failure to read it means it cannot be trusted
        return f"{path.name} is truncated or corrupt ({_first_line(e)})"
    if shape != (rows, dim):
        return f"{path.name} holds {' x '.join(map(str, shape))} values, not the {rows} x {dim} recorded"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def finish_embed_job(job: EmbedJob, records: dict[int, dict]) -> EmbedJobResult:
    """Move the staged shards into OUTPUT and write the manifest: the job is complete.

    ``records``: index -> record of each shard computed by this run. A crash during the moves
    leaves every record in _staging, so a resume simply does this again. Releases the lock.
    """
    try:
        out, plan = job.out, job.plan
        skipped = len(job.done)
        all_records = {**job.done, **records}
        missing = [s.index for s in plan.shards if s.index not in all_records]
        if missing:
            raise InputError(f"shard(s) {missing[:5]} were not computed; rerun with --resume")
        staging = out / STAGING
        if not job.complete:
            for s in plan.shards:  # commit: move each staged shard into place
                name = _shard_name(s.index, job.fmt)
                if (staging / name).is_file():
                    move_into_place(staging / name, out / name)
        problems: dict[str, list[int]] = {p: [] for p in _PROBLEMS}
        shards = []
        for s in plan.shards:
            rec = all_records[s.index]
            entry = {"file": rec["file"], "shard": s.index, "first_line": rec["first_line"],
                     "rows": rec["rows"], "sha256": rec["sha256"]}
            for key in ("file_bytes", "file_sha256"):  # absent from shards of older jobs
                if key in rec:
                    entry[key] = rec[key]
            shards.append({**entry, "run": rec.get("run", 1)})
            for p in _PROBLEMS:
                problems[p].extend(rec.get("problems", {}).get(p, []))
        if job.complete:  # a finished job's manifest already holds the problems
            problems = _read_json(out / MANIFEST_FILE, out)["problems"]
        runs = _read_json(out / RUNS_FILE, out)["runs"] if (out / RUNS_FILE).is_file() else []
        # where each file's lines begin, for a reader to turn a line number into file:line
        first_lines = {"first_lines": list(plan.first_rows)} if len(plan.files) > 1 else {}
        manifest = {
            "rows": plan.rows, "dim": job.job["dim"], "format": job.fmt, "model": job.job["model"],
            "weights": job.job.get("weights"), "precision": job.job["precision"],  # the precision that ran
            "max_seq_length": job.job["max_seq_length"],
            "input": {**job.job["input"], **first_lines}, "shards": shards, "runs": runs,
            "status_counts": {"ok": plan.rows - sum(len(v) for v in problems.values()),
                              **{p: len(v) for p, v in problems.items()}},
            "problems": problems,
            "rows_note": "one row per input line, in order; empty, undecodable, bad_json, no_field and "
                         "not_text lines are zero vectors; truncated lines embed their first "
                         "max_seq_length tokens",
        }
        if not job.complete:
            _write_json(out / MANIFEST_FILE, manifest)
            shutil.rmtree(staging, ignore_errors=True)
        job.close(finished=True)
        return EmbedJobResult(out_dir=out, rows=plan.rows, dim=job.job["dim"], shards=len(plan.shards),
                              shards_skipped=skipped, problems=problems, shards_redone=list(job.redone),
                              run=job.run, max_seq_length=job.job["max_seq_length"],
                              shards_repaired=dict(job.repaired), already_complete=job.complete and not records,
                              files=tuple(f.name for f in plan.files), first_lines=plan.first_rows)
    finally:
        job.close()


def run_embed_job(bert, input_path: str | Path, out_dir: str | Path, options: JobOptions | None = None, *,
                  progress: Callable[[int], None] | None = None,
                  on_total: Callable[[int, int], None] | None = None,
                  describe: Callable[[], dict] | None = None) -> EmbedJobResult:
    """Embed every record of ``input_path`` into shards under ``out_dir`` (see the module doc),
    in this process: the local engine. ``options``: how to read and write (:class:`JobOptions`;
    its defaults when None).

    ``bert`` is a loaded :class:`~bertscope.bert.Bert`, or a function that returns one (called
    only once everything is checked, and not at all for a finished job that ``describe``
    confirms: see :func:`prepare_embed_job`). ``progress(n)`` is called after each batch of n
    rows; ``on_total(total, done)`` once the input is counted and checked (done = rows already
    in finished shards when resuming). Bad input raises InputError, before work.
    """
    _check_bert(bert)
    if hasattr(bert, "config"):  # a loaded model describes itself: a description could differ
        describe = None
    loaded: list = []

    def load():
        loaded.append(bert() if not hasattr(bert, "config") and callable(bert) else bert)
        return loaded[0]

    job = prepare_embed_job(load, input_path, out_dir, options, engine="local", describe=describe)
    options = options if options is not None else JobOptions()
    try:
        if on_total is not None:
            on_total(job.plan.rows, job.done_rows)
        kill_after = os.environ.get(KILL_HOOK_ENV)
        records: dict[int, dict] = {}
        for shard in job.pending:
            kill_now = kill_after is not None and len(records) >= int(kill_after)
            records[shard.index] = compute_shard(loaded[0], job.plan, shard, job.out, fmt=options.fmt,
                                                 batch_tokens=options.batch_tokens, run=job.run, engine="local",
                                                 progress=progress, kill_now=kill_now)
    except BaseException:
        job.close()
        raise
    return finish_embed_job(job, records)


def read_embeddings(out_dir: str | Path, *, verify: bool = True) -> tuple[np.ndarray, list[str]]:
    """A finished job's folder -> (embeddings (rows, C) float32, status per row), in input order.

    A shard file that is missing, truncated or corrupt (not the size, or with ``verify`` not the
    SHA-256, that the manifest records for it) raises InputError naming it; ``--resume`` on the
    job recomputes it. ``verify=False`` skips the hashes (about 1 s per 1.5 GB read).
    """
    out = Path(out_dir)
    if not out.exists():
        raise InputError(f"{out} does not exist")
    if not out.is_dir():
        raise InputError(f"{out} is a file, not an embed job's folder")
    try:
        manifest = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not (out / JOB_FILE).is_file():
            raise InputError(f"{out} is not an embed job's folder (it has no {JOB_FILE})") from None
        raise InputError(f"{out} has no {MANIFEST_FILE}: the job is not finished (rerun with --resume)") from None
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read {out / MANIFEST_FILE} ({_first_line(e)})") from None
    try:
        rows, dim, fmt, shards = manifest["rows"], manifest["dim"], manifest["format"], manifest["shards"]
        status = ["ok"] * rows
        for p, lines in manifest["problems"].items():
            for ln in lines:
                status[ln - 1] = p
        for s in shards:  # each entry names its file and rows
            s["file"], s["rows"]
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise InputError(f"{out / MANIFEST_FILE} is damaged ({type(e).__name__}: {_first_line(e)})") from None
    parts = [_read_shard_file(out, s, fmt, dim, verify) for s in shards]
    emb = np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)
    return emb, status


def _read_shard_file(out: Path, entry: dict, fmt: str, dim: int, verify: bool = True) -> np.ndarray:
    """One finished shard's embeddings (rows, dim), or InputError naming its file."""
    path = out / entry["file"]
    fix = "run the embed job again with --resume to recompute it"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise InputError(f"{path} is missing; {fix}") from None
    except OSError as e:
        raise InputError(f"cannot read {path} ({e.strerror or e})") from None
    if entry.get("file_bytes") not in (None, size):
        raise InputError(f"{path} is truncated or corrupt: it has {size} bytes, not the "
                         f"{entry['file_bytes']} its manifest records; {fix}")
    if verify and entry.get("file_sha256") is not None:  # a same-size change: only the hash sees it
        try:
            digest = _file_sha256(path)
        except OSError as e:
            raise InputError(f"cannot read {path} ({e.strerror or e})") from None
        if digest != entry["file_sha256"]:
            raise InputError(f"{path} is corrupt: it does not match the SHA-256 its manifest records; {fix}")
    try:
        if fmt == "npy":
            arr = np.load(path)
        else:
            import pyarrow.parquet as pq

            col = pq.read_table(path, columns=["embedding"]).column("embedding").combine_chunks()
            arr = col.flatten().to_numpy().reshape(len(col), dim)
    except (OSError, ValueError, EOFError, KeyError) as e:  # numpy's, pyarrow's "not a valid file"
        raise InputError(f"{path} is truncated or corrupt ({_first_line(e)}); {fix}") from None
    if arr.shape != (entry["rows"], dim):
        raise InputError(f"{path} holds {' x '.join(map(str, arr.shape))} values, not the "
                         f"{entry['rows']} x {dim} its manifest records; {fix}")
    return arr
