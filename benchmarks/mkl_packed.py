"""MKL's packed fp32 GEMM against plain ``F.linear``, on every linear shape of the bench's models.

    PYTHONPATH=src python benchmarks/mkl_packed.py [--rounds 15] [--rows 1024 2048 4096]
        [--out benchmarks/results/<kind>/mkl_packed.json]

torch ships ``torch.ops.mkl._mkl_linear``: a linear whose weight MKL has packed once, for a given
row count, into its own blocked layout (``torch.ops.mkl._mkl_reorder_linear_weight``), which saves
the packing a plain GEMM does on each call. Is that a candidate worth racing in the kernel choice?
For each shape (the fused Q/K/V, attention output, FFN in and FFN out linears of BERT-base and of
all-MiniLM-L6-v2) and row count, the two run in turn, round after round, on the same input; the
outputs are checked to agree first. Printed: each one's median GFLOP/s and the median of the
paired per-round ratios (packed time / F.linear time: below 1, packed is faster).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bertscope.cli.common import run_script  # noqa: E402
from bertscope.errors import InputError  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402
from microkit import LINEAR_SHAPES, micro_args, paired_ratio, round_robin  # noqa: E402

SHAPES = LINEAR_SHAPES  # name -> (in features K, out features M)


def measure(k: int, m: int, rows: int, rounds: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g)  # (N, K)
    w = torch.randn(m, k, generator=g) / k ** 0.5  # (M, K)
    b = torch.randn(m, generator=g)  # (M,)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)  # MKL's blocked layout, for N rows
    runs = {"F.linear": lambda: F.linear(x, w, b),  # (N, K)@(K, M) + b -> (N, M)
            "mkl packed": lambda: torch.ops.mkl._mkl_linear(x, packed, w, b, rows)}  # the same, packed
    diff = (runs["F.linear"]() - runs["mkl packed"]()).abs().max().item()
    if diff > 1e-3:
        raise SystemExit(f"outputs disagree for {k}x{m} at {rows} rows: max abs diff {diff:.2e}")
    for run in runs.values():  # warm-up
        run()
    times = round_robin(runs, rounds)
    flop = 2.0 * rows * k * m
    return {"gflops": {n: flop / statistics.median(t) / 1e9 for n, t in times.items()},
            "packed_over_linear": paired_ratio(times, "mkl packed", "F.linear"),
            "max_abs_diff": diff}


def main() -> int:
    a, m = micro_args(__doc__, rounds=15)
    if not torch.backends.mkl.is_available():
        raise InputError(f"this torch build ({torch.__version__}) has no MKL: there is no packed MKL GEMM to time")
    print("| linear | K x M | rows | F.linear GFLOP/s | packed GFLOP/s | packed time / F.linear's |")
    print("|---|---|---:|---:|---:|---:|")
    results = []
    with torch.inference_mode():
        for name, (k, mm) in SHAPES.items():
            for rows in a.rows:
                r = measure(k, mm, rows, a.rounds)
                results.append({"linear": name, "k": k, "m": mm, "rows": rows, **r})
                print(f"| {name} | {k} x {mm} | {rows} | {r['gflops']['F.linear']:.0f} | "
                      f"{r['gflops']['mkl packed']:.0f} | {r['packed_over_linear']:.2f} |", flush=True)
    ratios = [r["packed_over_linear"] for r in results]
    print(f"packed time / F.linear's: {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}")
    if a.out:
        write_text_atomic(a.out, json.dumps({"machine": m, "rounds": a.rounds, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a bad --out, or no MKL in this torch: one line, exit 2
