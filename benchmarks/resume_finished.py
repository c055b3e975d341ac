"""What `embed --resume` costs on a job that is already finished: with the model loaded to check
it (before), and confirmed from the model folder's description (now).

    PYTHONPATH=src python benchmarks/resume_finished.py [--lines 2000] [--rounds 5]
        [--precisions fp32 int8] [--out FILE.json]

For each precision it embeds ``--lines`` short texts once (a finished job, shards of 1,000
lines), then resumes it ``--rounds`` times each way, alternating, in this process:

    loaded     ``run_embed_job(load, ...)``: ``bertscope.load`` runs (for int8 its calibration
               and speed check), then the job is found complete: what `embed --resume` did
    described  ``run_embed_job(load, ..., describe=...)``: the job is found complete from
               ``describe_model_folder``, and ``load`` is never called: what it does now

Both ways hash every shard file and must report every shard already done and load the model
0 times (described) or once (loaded); the script stops otherwise. The kernel choice is cached
before the first round, so neither way measures it. Run it with nothing else running (``flock
/work/cpu.lock`` here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.errors import BertscopeError  # noqa: E402
from bertscope.fast.embedjob import JobOptions, describe_model_folder, run_embed_job  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402

SHARD_ROWS = 1000


def one_precision(precision: str, lines: int, rounds: int, work: Path) -> dict:
    inp = work / f"{precision}.txt"
    inp.write_text("".join(f"text number {i}: a short line about something else\n" for i in range(lines)))
    out = work / f"{precision}.emb"
    loads = []

    def load():
        loads.append(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # int8 kept even where no faster
            return bertscope.load(precision=precision, keep_precision=precision != "fp32")

    run_embed_job(load, inp, out, JobOptions(shard_rows=SHARD_ROWS))  # the finished job; caches the choice
    shards = -(-lines // SHARD_ROWS)
    times: dict[str, list[float]] = {"loaded": [], "described": []}
    for _ in range(rounds):
        for way in times:
            loads.clear()
            describe = (lambda: describe_model_folder(None, precision)) if way == "described" else None
            t = time.perf_counter()
            res = run_embed_job(load, inp, out, JobOptions(shard_rows=SHARD_ROWS, resume=True), describe=describe)
            times[way].append(time.perf_counter() - t)
            want = 0 if way == "described" else 1
            if res.shards_skipped != shards or len(loads) != want:
                raise BertscopeError(f"{precision} {way}: {res.shards_skipped} of {shards} shards found done and "
                                     f"{len(loads)} load(s), not {shards} and {want}")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"precision": precision, "lines": lines, "shards": shards, "seconds": times,
            "median_s": med, "ratio": med["loaded"] / med["described"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=2000, help="input lines (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="resumes each way (default 5)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8"], choices=["fp32", "int8", "bf16"])
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    if a.lines < 1 or a.rounds < 1:
        p.error("--lines and --rounds must be at least 1")
    if a.out:
        check_output_file(a.out, suffixes=(".json",))
    m = machine()
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}; {a.lines} lines, "
          f"{a.rounds} resumes each way\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bertscope-resume-") as work:
        for precision in a.precisions:
            rows.append(one_precision(precision, a.lines, a.rounds, Path(work)))
    print("| precision | shards | loaded, median s (range) | described, median s (range) | loaded / described |")
    print("|---|---:|---|---|---:|")
    for r in rows:
        cells = [f"{r['median_s'][k]:.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in r["seconds"].items()]
        print(f"| {r['precision']} | {r['shards']} | {cells[0]} | {cells[1]} | {r['ratio']:.1f}x |")
    if a.out:
        write_text_atomic(a.out, json.dumps({"machine": m, "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a BertscopeError: one line, exit 2
