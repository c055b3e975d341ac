"""bertscope embed: sentence embeddings for every line of a file, streamed into resumable shards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import add_engine_args, add_model_arg, engine_options, load_model
from .progress import add_progress_args, progress_enabled

HELP = """\
Embed every line of INPUT with the packed, length-batched fast path, and write OUTPUT as a
folder of shards plus _manifest.json. One row per input line, in input order.

INPUT is one file, a folder (every file in it and its subfolders, in sorted order; names that
start with "." or "_" are skipped) or a glob ("crawl/*.jsonl", "crawl/**/*.jsonl"), local or
any URI pyarrow reads (s3://, gs://, hdfs://); not standard input ("-"): write it to a file
first. Rows follow the files in that order; the manifest numbers lines across them (its
input.first_lines says where each file begins), and the bad lines printed here are named
FILE:LINE, each file's own line, where there are several files (of one file: "line N").
Each file is a text file (one text per line), JSON Lines (one JSON object per line, the text in
field "text" or the one --field names) if its name ends in .jsonl, .ndjson or .json, or if
--field is given, or Parquet (.parquet: the text in column "text" or --field). All the files of
one INPUT must be of one kind: a folder that mixes them (text and .jsonl files, say; or, with
--field, .jsonl files and others) is refused: name the files you mean with a glob. A .json
file must be JSON Lines: a single JSON document (one that starts with "[", or whose first line
is not a whole JSON object) is refused.

A bad line never stops the job: it gets a zero vector and a status -- empty (blank, or only
characters the tokenizer drops, such as U+200B), undecodable (not UTF-8 text, or NUL bytes),
bad_json (not valid JSON), no_field (not an object with the field), not_text (the field is not a
string) -- and over-long texts are cut to the model's max_seq_length (truncated); each is reported
with its line numbers, here and in the manifest. But if NO line of a file holds a text (every
non-blank line fails; of several files, with lines without the field or not JSON rather than a
null or non-string field), the input is refused at once: that is the wrong --field or file; so is a
file with a NUL byte in its first 8,000 bytes (binary data, or UTF-16 text). Each shard is written
to a temporary file and renamed, so a crash never leaves a half-written file. Finished shards wait
in OUTPUT/_staging/ and move into OUTPUT when the job is done, so a dataset reader never mistakes
an unfinished job for a complete one. --resume finishes a job without redoing shards (--format,
--shard-rows, --field and --precision default to the job's); a shard whose input lines changed
since (by content, not by size or date) is computed again in an unfinished job, and a shard whose
file is missing or no longer has the size and SHA-256 recorded when it was written is computed
again in any job, finished or not. A finished job whose input lines changed is refused, and so is
any job whose input changed in size (lines added, other files): start a new one with another --out.
A finished job that is sound is checked without loading the model, in about a second plus the time
to read its shards.
One job at a time per OUTPUT (a lock file): a second is refused, and so is an OUTPUT inside
another job's folder. A job records its model's folder and the SHA-256 of its files
(config.json, weights, tokenizer): --resume refuses other weights, even in the same folder.

OUTPUT/_manifest.json, written last (the job is done when it exists): rows, dim, format, model,
weights, precision (the one that ran: int8 or bf16 fall back to fp32 where slower), max_seq_length,
input (files, kind, rows; first_lines for several files), status_counts (ok and each status),
problems (status -> line numbers, across files), shards (file, shard, rows, first_line, sha256 of
its input lines, file_bytes, file_sha256, run), runs (run, engine, started, precision_asked) and
rows_note.
_job.json and _runs.json hold the job's settings and runs (they stay when it is done: --resume
reads them); _staging/ holds its finished shards until the end. _job.json also records the
kernel choice the job computes with (GEMM library, batch budget, attention slack; see `bertscope
doctor`), and --resume computes with it again, so the shards it adds are those an unstopped run
writes, even where this machine's cached choice was measured again since (Ray's workers make
their own).

--engine ray runs the same shards on a pool of Ray actors, each loading the model once, and
writes the same OUTPUT (a job can be resumed by either engine). Without --address Ray starts on
this machine; on a cluster, run it on the head node with --address auto. OUTPUT must be a
folder every worker can write (one machine, or a shared filesystem). Ray runs fp32 only:
--precision int8 and bf16 run on the local engine.

A progress bar on stderr counts the texts as they are embedded (when stderr is a terminal;
--quiet hides it, --progress forces it).

Read the result back in Python:
  from bertscope.fast.embedjob import read_embeddings
  emb, status = read_embeddings("OUTPUT")      # (rows, C) float32, and "ok"/"empty"/... per row
or, for --format parquet:  pyarrow.parquet.read_table("OUTPUT")  (columns line, status, embedding)

examples:
  bertscope embed texts.txt --out texts.emb
  bertscope embed docs.jsonl --field body --out docs.emb --format parquet
  bertscope embed texts.txt --out texts.emb --resume      # after an interruption
  bertscope embed texts.txt --out texts.emb --precision int8   # CPU: int8 linears (docs/BENCHMARKS.md)
  bertscope embed crawl/ --out crawl.emb --format parquet --engine ray --workers 2
  bertscope embed 's3://bucket/crawl/*.jsonl' --out /shared/crawl.emb --engine ray \\
      --address auto --gpus-per-worker 1

--precision int8 quantizes the linears (per-channel int8 weights, per-token int8 activations;
the few a calibration finds too sensitive stay fp32); bertscope bench prints its quality
contract (cosine to fp32 mean >= 0.99, min >= 0.97, top-10 neighbours >= 0.9) and speed.
int8 and bf16 stay on only where they measure faster than fp32 on this machine (on a CPU
without VNNI, int8 may not be); elsewhere the job runs fp32 and a warning says why, unless
--keep-precision. A job records the precision it ran in, and --resume continues in it whatever
speed is measured then (a job that began in fp32 because int8 or bf16 was off stays fp32, and
says so); asking another precision than the job's (say fp32 for an int8 job) is refused, before
the model is loaded.
--compile (with --precision int8) also tries the int8 steps compiled by torch.compile, fused
loops that took 5-14% less time end to end on a Xeon with AMX (docs/BENCHMARKS.md);
compiling takes about 30 s the first time on a machine (about 10 s once cached on disk), so it
pays for large jobs (thousands of texts), and the compiled steps are used only if they measure
faster here.
"""


def register(sub) -> None:
    p = sub.add_parser("embed", help="embed every line of a file into resumable shards",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT",
                   help="a file, folder or glob: text (one text per line), JSON Lines (.jsonl/.ndjson/.json) or Parquet")
    p.add_argument("--out", metavar="OUTPUT", required=True, help="output folder (created)")
    add_model_arg(p)
    p.add_argument("--field", "--text-field", dest="field", metavar="NAME", default=None,
                   help='the JSON Lines field or Parquet column holding the text (default "text"; '
                        'implies JSON Lines for files that are not Parquet)')
    p.add_argument("--batch-tokens", type=int, default=None, metavar="N",
                   help="real tokens per batch (default: on CPU the kernel choice's, measured on this "
                        "machine (1024, 2048 or 4096; `bertscope doctor` shows it), 2048 without one; "
                        "16384 on CUDA). Larger batches cost memory: with the bundled model, 4096 "
                        "peaked at 780-950 MiB RSS against 650 for 2048 on a 2-CPU AVX-512 EPYC "
                        "(docs/BENCHMARKS.md)")
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"], default=None,
                   help="fp32 (default, exact; with --resume, the job's); int8 (CPU: int8 linears, cosine to fp32 >= 0.99 on the "
                        "contract corpus); bf16 (CPU with AMX or AVX512-BF16, else fp32 with a warning)")
    p.add_argument("--compile", action="store_true",
                   help="with --precision int8: also race the torch.compile'd int8 steps (about 30 s to "
                        "build the first time; used only if faster here)")
    p.add_argument("--keep-precision", action="store_true",
                   help="keep --precision int8 or bf16 even where it measures no faster than fp32 on this "
                        "machine (by default bertscope then runs fp32 and says why)")
    p.add_argument("--format", default=None, metavar="npy|parquet",
                   help="shard format: npy (default) or parquet (needs pyarrow); with --resume, the job's")
    p.add_argument("--shard-rows", type=int, default=None, metavar="N",
                   help="input lines per shard (default 10000; with --resume, the job's)")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted job in OUTPUT (or check a finished one; where OUTPUT does "
                        "not exist, start one, with a note); --format, --shard-rows, --field and "
                        "--precision default to the job's")
    add_progress_args(p)
    add_engine_args(p)
    p.set_defaults(func=run, resumable=resumable)


def resumable(args: argparse.Namespace) -> bool:
    """Whether OUTPUT holds a job for --resume to finish (its job file is written once the
    input and OUTPUT are checked, before the first shard)."""
    from pathlib import Path

    from ..fast.embedjob import JOB_FILE

    return (Path(args.out) / JOB_FILE).is_file()


def _read_job_file(out: str, name: str) -> dict:
    """The JSON object in OUTPUT/``name``, or {} where there is none readable (the job's own
    checks then say what is wrong)."""
    import json
    from pathlib import Path

    try:
        obj = json.loads((Path(out) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _settings_of_the_job(args: argparse.Namespace) -> None:
    """--format, --shard-rows, --field and --precision as given, else (with --resume) the
    job's, else the defaults: a resume need not repeat them."""
    from ..fast.embedjob import JOB_FILE

    job = _read_job_file(args.out, JOB_FILE) if args.resume else {}
    if args.format is None:
        args.format = job.get("format") if job.get("format") in ("npy", "parquet") else "npy"
    if args.shard_rows is None:
        rows = job.get("shard_rows")
        args.shard_rows = rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else 10_000
    if args.field is None and isinstance(job.get("field"), str):
        args.field = job["field"]
    args.precision_given, args.precision_of_the_job = args.precision is not None, False
    if args.precision is None:  # the precision the job runs in (fp32 where int8 was off when it began)
        began = _recorded_precision(args.out)[0] if args.resume else None
        if began is not None and began not in ("fp32", "bf16", "int8"):
            from ..errors import InputError

            raise InputError(f"the job in {args.out} records the precision {began!r}, which this version of "
                             "bertscope does not know; start a new job with another --out")
        args.precision_of_the_job = began is not None
        args.precision = began or "fp32"


def _recorded_precision(out: str) -> tuple[str | None, str | None]:
    """(the precision the job in ``out`` runs in, the one its first run asked for): fp32 where
    the job records none (jobs from before precisions existed), None for what it does not say
    (no readable job file: the job's own checks then say what is wrong; no record of what was
    asked: jobs from before it was recorded)."""
    from ..fast.embedjob import JOB_FILE, RUNS_FILE

    job, runs = _read_job_file(out, JOB_FILE), _read_job_file(out, RUNS_FILE)
    if not job:
        return None, None
    first = runs.get("runs") if isinstance(runs, dict) else None
    asked = first[0].get("precision_asked") if isinstance(first, list) and first and isinstance(first[0], dict) else None
    return job.get("precision", "fp32"), asked


def _resume_precision(args: argparse.Namespace) -> tuple[str | None, bool | None, str | None]:
    """How to load the model so that --resume continues the job in the precision it began with,
    whatever a speed verdict measured now would say: (precision, keep_precision, a note for
    stderr), Nones meaning "as the flags say".

    int8 and bf16 stay on only where they measure faster than fp32, and a verdict measured on a
    busy machine is not cached, so a fresh one can differ from the one the job began with. A job
    that began in the reduced precision asked again keeps it; one that began in fp32 because
    int8 or bf16 was off then continues in fp32 (with a note). Any other precision than the
    job's is refused here, before a model is loaded or measured (InputError)."""
    if not args.resume:
        return None, None, None
    began, asked = _recorded_precision(args.out)
    if began is None or began == args.precision:  # no job to read (its own checks speak), or the same
        return (began, True, None) if began in ("bf16", "int8") else (None, None, None)
    if began == "fp32" and asked in (args.precision, None):
        why = f" ({args.precision} was off then)" if asked else ""
        return "fp32", False, f"bertscope: note: the job began in fp32{why}; continuing in fp32"
    from ..errors import InputError  # refused before any model is loaded or measured

    raise InputError(f"cannot resume: precision changed: the job began with {began}, this run is "
                     f"{args.precision}; leave out --precision (the job's is {began}), or start a new job "
                     "with another --out")


def _lines(res, nums: list[int], k: int = 10) -> str:
    """The first ``k`` of the line numbers ``nums``: "line 4, 9" for one input file, "a.txt:4,
    b.txt:2" (each file's own line) for several."""
    if len(res.files) < 2:
        shown = "line " + ", ".join(str(n) for n in nums[:k])
    else:
        shown = ", ".join(res.where(n) for n in nums[:k])
    if len(nums) <= k:
        return shown
    across = "; it counts lines across the files" if len(res.files) > 1 else ""
    return shown + f", ... ({len(nums) - k} more in _manifest.json{across})"


def run(args: argparse.Namespace) -> int:
    from ..fast.embedjob import JobOptions, describe_model_folder, holds_no_job, run_embed_job
    from ..errors import InputError
    from .common import check_output_dir

    _settings_of_the_job(args)
    if args.format not in ("npy", "parquet"):
        raise InputError(f"--format must be npy or parquet, not {args.format!r}")
    if args.batch_tokens is not None and args.batch_tokens < 1:
        raise InputError(f"--batch-tokens must be at least 1, not {args.batch_tokens}")
    if args.shard_rows < 1:
        raise InputError(f"--shard-rows must be at least 1, not {args.shard_rows}")
    engine = engine_options(args)  # Ray missing, --workers 0...: one line, before anything
    of_job = f" (the job being resumed runs in {args.precision})" if args.precision_of_the_job else ""
    if args.compile and args.precision != "int8":
        raise InputError("--compile applies to --precision int8 only" + of_job)
    if args.keep_precision and args.precision == "fp32":
        raise InputError("--keep-precision applies to --precision int8 or bf16 only" + of_job)
    if engine is not None and args.precision != "fp32":
        what = f"the job runs in {args.precision}, which" if args.precision_of_the_job else f"--precision {args.precision}"
        raise InputError(f"{what} runs on the local engine only; leave out --engine ray")
    from ..fast.jobinput import resolve_inputs

    resolve_inputs(args.input, args.field)  # no such file, a glob matching nothing: one line
    check_output_dir(args.out)
    if args.resume and not Path(args.out).exists():  # runs (a script may always pass --resume), but said
        print(f"bertscope: note: --resume: {args.out} does not exist yet; starting a new job there",
              file=sys.stderr)
    elif args.resume and holds_no_job(args.out):  # a run stopped while it loaded the model
        print(f"bertscope: note: --resume: {args.out} holds no job yet (a run stopped, or is still loading its "
              "model, before it began one); starting a new job there with this command's settings", file=sys.stderr)
    from tqdm import tqdm

    bar = None
    loaded = []

    precision, keep_precision, note = _resume_precision(args)

    def load():  # called by the job only once INPUT and OUTPUT have been checked
        if note:
            print(note, file=sys.stderr)
        loaded.append(load_model(args, precision=precision, keep_precision=keep_precision))
        return loaded[0]

    def on_total(total: int, done: int) -> None:  # the bar starts once everything is checked
        nonlocal bar
        bar = tqdm(total=total, initial=done, unit="text", file=sys.stderr, disable=not progress_enabled(args),
                   dynamic_ncols=True, desc="embed", mininterval=0.2)

    def progress(n: int) -> None:
        if bar is not None:
            bar.update(n)

    options = JobOptions(field_name=args.field, batch_tokens=args.batch_tokens, fmt=args.format,
                         resume=args.resume, shard_rows=args.shard_rows)
    try:
        if engine is None:
            def describe() -> dict:  # a finished job is confirmed without loading the model
                return describe_model_folder(args.model, precision or args.precision)

            res = run_embed_job(load, args.input, args.out, options, progress=progress, on_total=on_total,
                                describe=describe)
        else:
            from ..scale.embed import run_ray_embed_job

            res = run_ray_embed_job(args.model, args.input, args.out, options, engine=engine, progress=progress,
                                    on_total=on_total)
    finally:
        if bar is not None:
            bar.close()
    ran = _recorded_precision(args.out)[0] or "fp32"  # what the job computes in, as it recorded it
    if res.already_complete:  # --resume of a finished, sound job
        print(f"nothing to do: {res.out_dir} already holds its {res.rows} rows x {res.dim} ({ran}) in "
              f"{res.shards} shard(s) ({res.shards_skipped} already done), each checked; nothing written")
    else:
        skipped = f" ({res.shards_skipped} already done)" if res.shards_skipped else ""
        print(f"wrote {res.rows} rows x {res.dim} ({ran}) to {res.out_dir} in {res.shards} shard(s){skipped}")
    if res.rows == 0:
        print(f"bertscope: warning: {args.input} holds no lines: the job has no rows", file=sys.stderr)
    elif len(res.problems.get("empty", [])) == res.rows:
        print(f"bertscope: warning: every line of {args.input} is blank: every row is a zero vector",
              file=sys.stderr)
    if res.shards_redone:
        print(f"  recomputed shard(s) {', '.join(str(k) for k in res.shards_redone)}: their input lines "
              "changed since they were embedded", file=sys.stderr)
    damaged = list(res.shards_repaired.items())
    for k, why in damaged[:5]:
        print(f"  recomputed shard {k}: {why}", file=sys.stderr)
    if len(damaged) > 5:
        print(f"  recomputed {len(damaged) - 5} more damaged shard(s): "
              f"{', '.join(str(k) for k, _ in damaged[5:15])}{', ...' if len(damaged) > 15 else ''}",
              file=sys.stderr)
    field = args.field or "text"
    max_len = res.max_seq_length or "max_seq_length"
    for kind, what in (("bad_json", "line(s) not valid JSON, zero vectors"),
                       ("no_field", f"line(s) not a JSON object with a field {field!r}, zero vectors"),
                       ("not_text", f"line(s) whose field {field!r} is not a string, zero vectors"),
                       ("empty", "empty line(s), zero vectors"),
                       ("undecodable", "undecodable line(s) (not UTF-8 text), zero vectors"),
                       ("truncated", f"line(s) longer than {max_len} tokens, truncated")):
        nums = res.problems.get(kind, [])
        if nums:
            print(f"  {len(nums)} {what}: {_lines(res, nums)}", file=sys.stderr)
    return 0
