"""Is an int8 GEMM faster than the fp32 one on this CPU? oneDNN's and fbgemm's, on every linear
shape of the bench's models.

    PYTHONPATH=src python benchmarks/int8_gemm_rate.py [--rounds 11] [--rows 1024 2048 4096]
        [--out benchmarks/results/<kind>/int8_gemm_rate.json]

int8 pays only where the integer GEMM multiplies faster than the fp32 one: everything around it
(attention, LayerNorm, GELU, quantizing) costs the same or more. Three ways to compute one linear
run in turn, round after round, on the same input, for each shape (the fused Q/K/V, attention
output, FFN in and FFN out linears of BERT-base and of all-MiniLM-L6-v2) and row count:

- ``fp32``: ``F.linear`` (BLAS), what fp32 runs;
- ``onednn int8``: the integer GEMM alone of bertscope's int8 linears,
  ``torch.ops.onednn.qlinear_pointwise`` on 8-bit rows already quantized, with the per-channel
  int8 weight packed once and fp32 output; on the 7-bit grid where this CPU's int8 GEMM saturates
  on the full one (no VNNI), as bertscope's int8 mode uses it;
- ``fbgemm dynamic``: torch's fbgemm dynamic int8 linear (``quantized::linear_dynamic``, the
  kernel ``torch.ao`` dynamic quantization runs on x86, per-channel weight), which also quantizes
  its input (one scale per tensor) and dequantizes its output, so it does more than the GEMM.

Each int8 output is checked against fp32 first: relative error ‖y8 − y32‖ / ‖y32‖ under 5% (on
inputs shaped like BERT's, without outliers). Printed: each one's median GFLOP/s (useful FLOPs,
2·N·K·M) and the medians of the paired per-round ratios to fp32's time (below 1: faster). A CPU
whose int8 GEMM is no faster than its fp32 GEMM cannot gain from int8 by any choice of the steps
around it.
"""

from __future__ import annotations

import json
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bertscope.cli.common import run_script  # noqa: E402
from bertscope.errors import BertscopeError  # noqa: E402
from bertscope.fast.quant import FULL_LEVELS, REDUCED_LEVELS, Int8Linear, int8_kernel_available, int8_range_exact  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402
from microkit import LINEAR_SHAPES, micro_args, paired_ratio, round_robin  # noqa: E402

SHAPES = LINEAR_SHAPES  # name -> (in features K, out features M)
ERROR_LIMIT = 0.05  # an int8 output further than this from fp32 (relative) is not timed


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).norm() / ref.norm())


def measure(k: int, m: int, rows: int, rounds: int, levels: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g)  # (N, K)
    w = torch.randn(m, k, generator=g) / k ** 0.5  # (M, K)
    b = torch.randn(m, generator=g)  # (M,)
    lin = Int8Linear(w, b, kernel="onednn", levels=levels)  # per-channel int8 weight, packed by oneDNN
    q, lo, step, _ = lin.to_8bit(x)  # (N, K) uint8 in a scratch buffer, (N, 1), (N, 1)
    q = q.clone()  # (N, K): its own memory, outside the scratch the check below reuses
    with warnings.catch_warnings():  # torch's deprecation of quantized tensors: said once, by main()
        warnings.simplefilter("ignore", UserWarning)
        wq = torch.quantize_per_channel(w, lin.w_scale.double(), torch.zeros(m, dtype=torch.long), 0, torch.qint8)
    fb = torch.ops.quantized.linear_prepack(wq, b)  # fbgemm's packed per-channel int8 weight
    runs = {"fp32": lambda: F.linear(x, w, b),  # (N, K)@(K, M) + b -> (N, M)
            "onednn int8": lambda: lin.int8_mm(q),  # (N, K)@(K, M) -> (N, M) = q·Ŵᵀ, the GEMM alone
            "fbgemm dynamic": lambda: torch.ops.quantized.linear_dynamic(x, fb, True)}  # quantize, GEMM, fp32 out
    ref = runs["fp32"]()
    errors = {"onednn int8": rel_error(lin(x), ref),  # the whole int8 linear, around this GEMM
              "fbgemm dynamic": rel_error(runs["fbgemm dynamic"](), ref)}
    bad = {n: e for n, e in errors.items() if not e < ERROR_LIMIT}
    if bad:
        raise BertscopeError(f"int8 output off fp32 for {k}x{m} at {rows} rows, not timed: "
                             + ", ".join(f"{n} {e:.3f}" for n, e in bad.items()))
    for run in runs.values():  # warm-up
        run()
    times = round_robin(runs, rounds)
    flop = 2.0 * rows * k * m
    return {"gflops": {n: flop / statistics.median(t) / 1e9 for n, t in times.items()},
            "over_fp32": {n: paired_ratio(times, n, "fp32") for n in runs if n != "fp32"},
            "rel_error": errors}


def main() -> int:
    a, mach = micro_args(__doc__, rounds=11)
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise BertscopeError(f"this torch build ({torch.__version__}) has no fbgemm engine to time")
    if not int8_kernel_available("onednn"):
        raise BertscopeError("oneDNN's int8 matmul is not usable on this CPU with this torch: nothing to time")
    levels = FULL_LEVELS if int8_range_exact("onednn", FULL_LEVELS) else REDUCED_LEVELS
    print("(fbgemm's weight is a torch quantized tensor, a type torch has deprecated)")
    print(f"oneDNN int8 on the {'8' if levels == FULL_LEVELS else '7'}-bit grid (0..{levels}); "
          "fbgemm dynamic quantizes its input itself")
    print("| linear | K x M | rows | fp32 GFLOP/s | oneDNN int8 GFLOP/s | fbgemm dynamic GFLOP/s "
          "| oneDNN int8 time / fp32's | fbgemm's / fp32's |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    results = []
    try:
        with torch.inference_mode():
            for name, (k, mm) in SHAPES.items():
                for rows in a.rows:
                    r = measure(k, mm, rows, a.rounds, levels)
                    results.append({"linear": name, "k": k, "m": mm, "rows": rows, **r})
                    gf, o = r["gflops"], r["over_fp32"]
                    print(f"| {name} | {k} x {mm} | {rows} | {gf['fp32']:.0f} | {gf['onednn int8']:.0f} | "
                          f"{gf['fbgemm dynamic']:.0f} | {o['onednn int8']:.2f} | {o['fbgemm dynamic']:.2f} |",
                          flush=True)
    finally:
        torch.backends.quantized.engine = engine
    for n in ("onednn int8", "fbgemm dynamic"):
        rs = [r["over_fp32"][n] for r in results]
        print(f"{n} time / fp32's: {min(rs):.2f}-{max(rs):.2f}, median {statistics.median(rs):.2f}")
    if a.out:
        write_text_atomic(a.out, json.dumps({"machine": mach, "rounds": a.rounds, "levels": levels,
                                             "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a bad --out, or no usable int8 GEMM here: one line, exit 2
