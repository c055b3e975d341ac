"""bertscope embed: sentence embeddings for every line of a file, streamed into resumable shards."""

from __future__ import annotations

import argparse
import sys

from .common import add_model_arg, load_model

HELP = """\
Embed every line of INPUT (a text file, one text per line, or JSONL with --field) with the
packed, length-batched fast path, and write OUTPUT as a folder of shards plus _manifest.json.
One row per input line, in input order. Empty lines and undecodable bytes get a zero vector;
over-long texts are cut to the model's max_seq_length; all three are reported with their
line numbers (here and in the manifest). Each shard is written to a temporary file and renamed,
so a crash never leaves a half-written file; --resume finishes a job without redoing shards.

Read the result back in Python:
  from bertscope.embedjob import read_embeddings
  emb, status = read_embeddings("OUTPUT")      # (rows, C) float32, and "ok"/"empty"/... per row
or, for --format parquet:  pandas.read_parquet("OUTPUT")  (columns line, status, embedding)

examples:
  bertscope embed texts.txt --out texts.emb
  bertscope embed docs.jsonl --field body --out docs.emb --format parquet
  bertscope embed texts.txt --out texts.emb --resume      # after an interruption
"""


def register(sub) -> None:
    p = sub.add_parser("embed", help="embed every line of a file into resumable shards",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help="text file (one text per line) or .jsonl/.ndjson")
    p.add_argument("--out", metavar="OUTPUT", required=True, help="output folder (created)")
    add_model_arg(p)
    p.add_argument("--field", metavar="NAME", default=None,
                   help='JSONL field holding the text (default "text"; implies JSONL input)')
    p.add_argument("--batch-tokens", type=int, default=None, metavar="N",
                   help="real tokens per batch (default 2048 on CPU, 16384 on CUDA)")
    p.add_argument("--format", default="npy", metavar="npy|parquet",
                   help="shard format: npy (default) or parquet (needs pyarrow)")
    p.add_argument("--shard-rows", type=int, default=10_000, metavar="N",
                   help="input lines per shard (default 10000)")
    p.add_argument("--resume", action="store_true", help="finish an interrupted job in OUTPUT")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _lines(nums: list[int], k: int = 10) -> str:
    shown = ", ".join(str(n) for n in nums[:k])
    return shown + (f", ... ({len(nums) - k} more in _manifest.json)" if len(nums) > k else "")


def run(args: argparse.Namespace) -> int:
    from ..embedjob import run_embed_job
    from ..errors import InputError

    if args.format not in ("npy", "parquet"):
        raise InputError(f"--format must be npy or parquet, not {args.format!r}")
    if (args.batch_tokens is not None and args.batch_tokens < 1) or args.shard_rows < 1:
        raise InputError("--batch-tokens and --shard-rows must be at least 1")
    from pathlib import Path

    if not Path(args.input).is_file():
        raise InputError(f"input file {args.input} does not exist" if not Path(args.input).exists()
                         else f"{args.input} is not a file")
    bert = load_model(args)
    from tqdm import tqdm

    bar = tqdm(total=0, unit="text", file=sys.stderr, disable=args.quiet, dynamic_ncols=True,
               desc="embed")

    def on_total(total: int, done: int) -> None:
        bar.reset(total=total)
        bar.update(done)

    try:
        res = run_embed_job(bert, args.input, args.out, field_name=args.field,
                            batch_tokens=args.batch_tokens, fmt=args.format, resume=args.resume,
                            shard_rows=args.shard_rows, progress=bar.update, on_total=on_total)
    finally:
        bar.close()
    skipped = f" ({res.shards_skipped} already done)" if res.shards_skipped else ""
    print(f"wrote {res.rows} rows x {res.dim} to {res.out_dir} in {res.shards} shard(s){skipped}")
    for kind, what in (("empty", "empty line(s), zero vectors"),
                       ("undecodable", "undecodable line(s) (not UTF-8), zero vectors"),
                       ("truncated", f"line(s) longer than {bert.max_seq_length} tokens, truncated")):
        nums = res.problems.get(kind, [])
        if nums:
            print(f"  {len(nums)} {what}: line {_lines(nums)}", file=sys.stderr)
    return 0
