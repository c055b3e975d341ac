"""Does `bertscope embed` stream? Peak memory for 10,000 and 1,000,000 texts should be the same.

    PYTHONPATH=src python benchmarks/embed_memory.py [--sizes 10000 100000] [--plot docs/embed_rss.png]
    PYTHONPATH=src python benchmarks/embed_memory.py --sizes 1000000 --out benchmarks/results/embed_memory_1m.json \
        --plot docs/embed_rss_1m.png

Writes a text file of N mixed-length lines (3 to 40 words) for each size, runs `bertscope embed`
on it in a fresh process, and reports wall time, texts/s and that process's peak RSS
(ru_maxrss), plus its curve: every half second, the process's RSS and what glibc's allocator
says of its heap (``mallinfo2``: bytes in use by the program, and bytes it holds free but has
not returned to the system). At the end it asks glibc to return what it holds free
(``malloc_trim(0)``) and records the RSS after that: memory that comes back then was allocator
retention (fragmentation), not a leak.

A long run keeps its curve when it is cut short: the samples are appended to a file as they are
taken (``--samples PATH`` keeps that file; otherwise it lives in a temporary folder), and
``--deadline-s S`` stops the run after S seconds and reports what it reached (``"partial": true``,
``texts_done`` counted from the finished shards, the peak RSS from the kernel's account of the
stopped process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRAPPER = r"""
import ctypes, json, resource, sys, threading, time
MiB = 2**20
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                              "fsmblks", "uordblks", "fordblks", "keepcost")]
try:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
except (OSError, AttributeError):
    libc = None
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / MiB
def heap():
    if libc is None:
        return None, None
    m = libc.mallinfo2()
    return (m.uordblks + m.hblkhd) / MiB, m.fordblks / MiB  # in use (incl. mmapped blocks), held free
import os, tracemalloc
if os.environ.get("EMBED_MEMORY_TRACE_PYTHON") == "1":
    tracemalloc.start(1)  # what the interpreter and numpy allocate (torch's tensors are not counted)
log = open(os.environ["EMBED_MEMORY_SAMPLES"], "a", buffering=1)  # one row per line, kept if the run is stopped
t0 = time.perf_counter()
def sample():
    while True:
        used, free = heap()
        row = [round(time.perf_counter() - t0, 1), rss(), used, free]
        if tracemalloc.is_tracing():
            row.append(tracemalloc.get_traced_memory()[0] / MiB)
        log.write(json.dumps(row) + "\n")
        time.sleep(0.5)
threading.Thread(target=sample, daemon=True).start()
from bertscope.cli.app import main
t = time.perf_counter()
rc = main(sys.argv[1:])
wall = time.perf_counter() - t
end_rss, (end_used, end_free) = rss(), heap()
if libc is not None:
    libc.malloc_trim(0)
print(json.dumps({"rc": rc, "wall_s": wall, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "end_rss_mib": end_rss, "end_heap_in_use_mib": end_used, "end_heap_held_free_mib": end_free,
                  "rss_after_malloc_trim_mib": rss()}), file=sys.stderr)
"""


def write_lines(path: Path, n: int, words: list[str], rng: random.Random) -> None:
    """n lines of 3 to 40 words drawn from ``words`` (the input every run here uses)."""
    with open(path, "w") as f:
        for _ in range(n):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) + "\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "embed_memory.json"))
    p.add_argument("--plot", default=None, help="also draw the RSS curves into this PNG")
    p.add_argument("--trace-python", action="store_true",
                   help="also sample the memory Python and numpy hold (tracemalloc; slower): a rise in "
                        "glibc's bytes in use that this does not show is native (torch, MKL, the tokenizer)")
    p.add_argument("--deadline-s", type=float, default=None, metavar="S",
                   help="stop each run after S seconds and report what it reached (partial: true)")
    p.add_argument("--samples", default=None, metavar="PATH",
                   help="append the curve's samples to this file as they are taken (JSON lines, one "
                        "[seconds, rss, heap in use, held free] row per line), so a run that is killed "
                        "keeps its curve; with several sizes, the size is added to the name")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                   help="further arguments for `bertscope embed` (e.g. --extra --precision bf16)")
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from bertscope.files import write_text_atomic
    import bertscope
    from bertscope.bench.corpus import vocab_words
    from bertscope.bench.machine import cpu_flags, cpu_id, cpu_name

    bert = bertscope.load()
    words = vocab_words(bert.tokenizer)
    precision = a.extra[a.extra.index("--precision") + 1] if "--precision" in a.extra[:-1] else "fp32"
    rng = random.Random(0)
    results = []
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               EMBED_MEMORY_TRACE_PYTHON="1" if a.trace_python else "0")
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.sizes:
            inp = Path(tmp) / f"texts{n}.txt"
            write_lines(inp, n, words, rng)
            log = samples_path(a.samples, n, len(a.sizes), Path(tmp))
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("")
            out_dir = Path(tmp) / f"out{n}"
            stats = run_one([sys.executable, "-c", WRAPPER, "embed", str(inp), "--out", str(out_dir), "--quiet",
                             *a.extra], dict(env, EMBED_MEMORY_SAMPLES=str(log)), a.deadline_s, out_dir)
            if stats is None:
                return 1
            samples = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            s = [row[1] for row in samples]
            done = stats.get("texts_done", n)
            stats.update(texts=n, texts_per_s=done / stats["wall_s"], cpu=cpu_name(), cpu_id=cpu_id(), cpu_flags=cpu_flags(),
                         logical_cpus=os.cpu_count(), torch=__import__("torch").__version__,
                         embed_arguments=list(a.extra), environment=run_environment(),
                         kernel_choice=kernel_choice(bert.config, precision, a.extra),
                         rss_mib_at_10_50_90_percent=[s[int(len(s) * q)] for q in (0.1, 0.5, 0.9)] if s else None,
                         # the curve, at most 400 points: [seconds, RSS, heap in use, heap held free] (MiB)
                         curve=samples[:: max(1, len(samples) // 400)],
                         curve_columns=["seconds", "rss_mib", "heap_in_use_mib", "heap_held_free_mib"]
                         + (["python_traced_mib"] if a.trace_python else []))
            if s:  # medians over stretches of the run: what grows with the input shows here
                stats["stretch_medians"] = stretch_medians(samples)
            results.append(stats)
            print(json.dumps({k: v for k, v in stats.items() if k != "curve"}))
    write_text_atomic(Path(a.out), json.dumps(results, indent=1))
    if a.plot:
        plot(results, Path(a.plot))
    return 0


def samples_path(given: str | None, n: int, sizes: int, tmp: Path) -> Path:
    """Where the run over n lines streams its samples: the given file (the size added to its name
    when several sizes run), else a file in the temporary folder."""
    if given is None:
        return tmp / f"samples{n}.jsonl"
    path = Path(given)
    return path if sizes == 1 else path.with_name(f"{path.stem}_{n}{path.suffix}")


def run_one(cmd: list[str], env: dict, deadline_s: float | None, out_dir: Path) -> dict | None:
    """Run the wrapped `bertscope embed`; return its summary, or None (with its stderr shown) when
    it failed. Past the deadline, stop it and return what it reached: partial, the texts in its
    finished shards, and its peak RSS as the kernel counted it for the stopped process."""
    import signal
    import time

    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            rc = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except ChildProcessError:  # already reaped
                usage = None
            proc.returncode = -signal.SIGTERM
            wall = time.perf_counter() - t
            return {"partial": True, "stopped_after_s": deadline_s, "wall_s": wall,
                    "texts_done": shard_rows_done(out_dir),
                    "peak_rss_mib": usage.ru_maxrss / 1024 if usage is not None else None}
        err.seek(0)
        text = err.read()
    if rc != 0:
        print(text[-2000:], file=sys.stderr)
        return None
    return json.loads(text.strip().splitlines()[-1])


def shard_rows_done(out_dir: Path) -> int:
    """Rows in the shards a stopped `embed` job finished (they wait in OUTPUT/_staging/)."""
    import numpy as np

    staging = out_dir / "_staging"
    return sum(len(np.load(f, mmap_mode="r")) for f in staging.glob("part-*.npy")) if staging.is_dir() else 0


def run_environment() -> dict[str, str]:
    """The settings of the run that live in the environment: bertscope's own (BERTSCOPE_HEAP,
    BERTSCOPE_ONEDNN, ...), glibc's malloc ones, which change the memory figures, and the
    libraries' instruction-set limits (a machine told to act as AVX2-only)."""
    from bertscope.fast.tuning import ISA_LIMIT_VARS

    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(("BERTSCOPE_", "MALLOC_")) or k in ("GLIBC_TUNABLES", "OMP_NUM_THREADS", "LD_PRELOAD", *ISA_LIMIT_VARS)}


def kernel_choice(config, precision: str, extra: list[str]) -> dict | None:
    """What the run's kernel choice was (the cached one it used or measured, read after the run so
    that reading it measures nothing; the plain defaults under BERTSCOPE_TUNE=0), with the batch
    size that --batch-tokens set, if given, and BLAS when BERTSCOPE_ONEDNN=0 forced it: the batch size
    and GEMM library decide the working set."""
    import torch
    from bertscope.fast import tuning

    if tuning.tuning_enabled():
        c = tuning.load_choice(tuning.choice_key(config, torch.float32, precision))
    else:
        c = tuning.KernelChoice(source="default")
    if c is None:
        return None
    out = {k: v for k, v in c.to_json().items() if k not in ("key", "timings", "path")}
    if "--batch-tokens" in extra[:-1]:
        out.update(batch_tokens=int(extra[extra.index("--batch-tokens") + 1]), batch_tokens_from="--batch-tokens")
    if os.environ.get("BERTSCOPE_ONEDNN", "1") == "0":  # the environment's "blas" wins over the cached choice
        out.update(gemm="blas", gemm_from="BERTSCOPE_ONEDNN=0")
    return out


STRETCHES = ((0, 0.05), (0.05, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 0.9), (0.9, 1.0))


def stretch_medians(samples: list[list]) -> dict[str, list]:
    """{column: [median over each stretch of the run (0-5%, 5-25%, ... 90-100% of its samples)]}
    for RSS, glibc's bytes in use and, when traced, Python's."""
    names = {1: "rss_mib", 2: "heap_in_use_mib", 4: "python_traced_mib"}
    n = len(samples)
    out = {}
    for col, name in names.items():
        if col >= len(samples[0]) or samples[0][col] is None:
            continue
        out[name] = [round(statistics.median(r[col] for r in samples[int(a * n):max(int(b * n), int(a * n) + 1)]), 1)
                     for a, b in STRETCHES]
    out["stretches"] = [f"{a:.0%}-{b:.0%}" for a, b in STRETCHES]
    return out


def plot(results: list[dict], path: Path) -> None:
    """RSS and the allocator's heap against the fraction of the run, one panel per size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 3.6), squeeze=False)
    for ax, r in zip(axes[0], results):
        c = r["curve"]
        x = [row[0] for row in c]
        ax.plot(x, [row[1] for row in c], label="RSS")
        if c and c[0][2] is not None:
            ax.plot(x, [row[2] for row in c], label="heap in use (mallinfo2)")
            ax.plot(x, [row[3] for row in c], label="heap held free by glibc")
        ax.set_title(f"bertscope embed, {r['texts']:,} texts ({r['wall_s']:.0f} s)")
        ax.set_xlabel("seconds")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
