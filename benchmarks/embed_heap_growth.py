"""What memory grows over a long `bertscope embed` job, and which library holds it (memray).

    PYTHONPATH=src python benchmarks/embed_heap_growth.py [--lines 60000] [--doc docs/BENCHMARKS.md]

Runs `bertscope embed` on N lines (the recipe of embed_memory.py: 3 to 40 random vocabulary
words, seed 0) under memray's native tracking (`memray run --native`, the bench extra installs
it), which records every allocation with its native and Python stack: malloc and its family,
and mmap. Each live allocation is put in one group by the libraries on its stack:

    oneDNN GELU kernels   oneDNN's JIT-compiled eltwise (GELU) primitives and their descriptors
    oneDNN, other         any other oneDNN frame
    MKL                   MKL's GEMM buffers
    tokenizers            the Rust tokenizer
    torch tensors         the rest under c10 / ATen frames (tensors and their metadata)
    Python object arenas  pymalloc's 1 MiB arenas for small Python objects (whoever asked)
    other                 everything else (Python objects' native parts, numpy, the interpreter)

At 400 points evenly spread over the run (its last 3%, the process's exit, left out) it sums the live bytes of each group, and reports, for
each tenth of the run, the group's floor (the least live over that tenth: what stays whatever
batch is in flight) and median. A group whose floor rises from tenth to tenth is memory that
grows with the input. Writes the JSON to --out and the "heap-growth" section of --doc.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GROUPS = ("oneDNN GELU kernels", "oneDNN, other", "MKL", "tokenizers", "torch tensors", "Python object arenas", "other")
MMAP = 14  # memray.AllocatorType.MMAP
PYMALLOC_MAX = 4  # memray's pymalloc allocator types are 1-4
END = 0.97  # the last 3% of the run is the process's exit (interpreter teardown): left out


def group_of(frames: str) -> str:
    """The group of an allocation, from its native stack's function names joined by spaces."""
    if "_PyObject_ArenaMmap" in frames:
        return "Python object arenas"
    if "dnnl" in frames and "eltwise" in frames:
        return "oneDNN GELU kernels"
    if "dnnl" in frames:
        return "oneDNN, other"
    if "mkl_" in frames:
        return "MKL"
    if "tokenizers" in frames:
        return "tokenizers"
    if "c10::" in frames or "at::" in frames:
        return "torch tensors"
    return "other"


def analyse(capture: Path, points: int = 400) -> dict:
    """{(group, "malloc" | "mmap"): {"floor": [MiB per tenth], "median": [...]}} and counts."""
    import memray
    import numpy as np

    reader = memray.FileReader(str(capture))
    n = len(list(reader.get_memory_snapshots()))
    idx = np.linspace(0, int(n * END) - 1, points).astype(int)  # (points,) snapshot indices
    live = collections.defaultdict(lambda: np.zeros(points))
    gelu_code_buffers = 0
    for rec in reader.get_temporal_allocation_records(merge_threads=True):
        if rec.allocator <= PYMALLOC_MAX:
            continue  # single small Python objects: their arenas are counted instead
        frames = " ".join(f[0] for f in rec.native_stack_trace(max_stacks=12))
        group = group_of(frames)
        kind = "mmap" if rec.allocator == MMAP else "malloc"
        for iv in rec.intervals:
            a, d = iv.allocated_before_snapshot, iv.deallocated_before_snapshot
            alive = (idx >= a) & ((idx < d) if d is not None else True)  # (points,)
            live[(group, kind)] += alive * iv.n_bytes
            if group == "oneDNN GELU kernels" and kind == "mmap":
                gelu_code_buffers += iv.n_allocations
    out = {}
    for key, v in live.items():
        tenths = np.array_split(v / 2**20, 10)
        out[f"{key[0]} ({key[1]})"] = {"floor": [round(float(t.min()), 2) for t in tenths],
                                       "median": [round(float(np.median(t)), 2) for t in tenths]}
    return {"groups": out, "gelu_code_buffers": gelu_code_buffers, "snapshots": n}


def table(result: dict) -> str:
    rows = ["| group (allocator) | floor MiB, tenths 1 → 10 of the run | rise, 3rd → 10th tenth |",
            "|---|---|---:|"]
    order = {g: i for i, g in enumerate(GROUPS)}
    for name in sorted(result["groups"], key=lambda k: (order.get(k.rsplit(" (", 1)[0], 9), k)):
        f = result["groups"][name]["floor"]
        if max(f) < 0.05:
            continue  # a group with nothing live that stays
        rows.append(f"| {name} | {' · '.join(f'{x:.1f}' for x in f)} | {f[-1] - f[2]:+.1f} |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lines", type=int, default=60_000)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "embed_heap_growth.json"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "BENCHMARKS.md"), help="'' to leave the docs alone")
    p.add_argument("--keep", default=None, help="also keep memray's capture file here")
    a = p.parse_args()
    if a.lines < 1000:
        p.error(f"--lines must be at least 1000 (a tenth of the run needs a few batches), got {a.lines}")
    try:
        import memray  # noqa: F401
    except ImportError:
        print("error: this benchmark needs memray (pip install -e '.[bench]')", file=sys.stderr)
        return 2
    import bertscope
    from bertscope.bench.corpus import vocab_words
    from bertscope.bench.machine import machine
    from bertscope.files import update_section, write_text_atomic
    from embed_memory import write_lines

    words = vocab_words(bertscope.load().tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        inp, capture = Path(tmp) / "texts.txt", Path(a.keep or Path(tmp) / "embed.bin")
        write_lines(inp, a.lines, words, random.Random(0))
        capture.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "memray", "run", "--native", "-q", "-o", str(capture), "-m", "bertscope",
               "embed", str(inp), "--out", str(Path(tmp) / "out"), "--quiet"]
        print("running:", " ".join(cmd[1:]), flush=True)
        r = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if r.returncode != 0:
            print(f"error: the embed job under memray exited with {r.returncode}", file=sys.stderr)
            return 1
        result = analyse(capture)
    m = machine()
    result.update(lines=a.lines, machine=m)
    write_text_atomic(Path(a.out), json.dumps(result, indent=1))
    text = (f"`python benchmarks/embed_heap_growth.py --lines {a.lines}` on {m['cpu']} "
            f"({', '.join(m['cpu_flags'])}), torch {m['versions']['torch']}: `bertscope embed` of {a.lines:,} lines "
            f"under memray's native tracking; oneDNN GELU code buffers created: {result['gelu_code_buffers']}.\n\n"
            + table(result))
    print(text)
    if a.doc:
        update_section(a.doc, "heap-growth", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
