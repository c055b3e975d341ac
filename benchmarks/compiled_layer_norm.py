"""The compiled int8 steps' residual + LayerNorm + quantize: LayerNorm as ``F.layer_norm`` (which
inductor computes with Welford updates) against the two-pass form the steps use
(:func:`bertscope.fast.quant._layer_norm`: the mean, then the mean of squared deviations).

    PYTHONPATH=src python benchmarks/compiled_layer_norm.py [--rounds 21] [--rows 1024 2048 4096]
        [--out benchmarks/results/<kind>/compiled_layer_norm.json]

Both are the whole fused step that follows W_O and W2 in a layer
(:meth:`bertscope.fast.quant.CompiledSteps.residual_norm`): the integer GEMM's output rescaled,
offsets, bias and two fp32 channels added, the residual added, LayerNorm, and the result's 8-bit
rows for the next linear. For the hidden widths of all-MiniLM-L6-v2 (384) and BERT-base (768) at
each row count, both are compiled as the steps compile (dynamic shapes, parallel loops), checked
to agree (LayerNorm's output within 1e-4, under 1% of the 8-bit entries one level apart), then
timed in turn, round after round, on the same inputs. Printed: each one's median milliseconds
and the median of the paired per-round ratios (two-pass / Welford: below 1, two-pass is faster).
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
from bertscope.fast.heap import keep_heap  # noqa: E402
from bertscope.fast.quant import REDUCED_LEVELS, _compile, _layer_norm, _quantize_rows, _rescale  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402
from microkit import micro_args, paired_ratio, round_robin  # noqa: E402

WIDTHS = {"MiniLM": 384, "BERT-base": 768}  # the hidden size C: W_O's and W2's output width
EPS = 1e-12


def welford(y, step, lo, w_sum, bias, x, gamma, beta, xs, w_s, keep):
    z = x + _rescale(y, step, lo, w_sum, bias, xs, w_s)  # (N, C)
    h = F.layer_norm(z, (z.shape[-1],), gamma, beta, EPS)  # (N, C): inductor's Welford reduction
    return (h, *_quantize_rows(h, REDUCED_LEVELS, keep))


def two_pass(y, step, lo, w_sum, bias, x, gamma, beta, xs, w_s, keep):
    z = x + _rescale(y, step, lo, w_sum, bias, xs, w_s)  # (N, C)
    h = _layer_norm(z, gamma, beta, EPS)  # (N, C): mean, then mean of squared deviations
    return (h, *_quantize_rows(h, REDUCED_LEVELS, keep))


FORMS = {"welford": _compile(welford), "two-pass": _compile(two_pass)}


def inputs(rows: int, width: int) -> tuple:
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():  # as the encoder's tensors are
        y = torch.randn(rows, width, generator=g).mul_(30.0)  # (N, C) q·Ŵᵀ
        step, lo = torch.rand(rows, 1, generator=g).mul_(0.01), torch.rand(rows, 1, generator=g).neg_()  # (N, 1)
        w_sum, bias, gamma, beta = (torch.randn(width, generator=g) for _ in range(4))  # (C,)
        x = torch.randn(rows, width, generator=g).mul_(3.0)  # (N, C) the residual
        x[:, 5] *= 30  # an outlier channel, as BERT's LayerNorm inputs have
        xs, w_s = torch.randn(rows, 2, generator=g), torch.randn(2, width, generator=g)  # fp32 channels
        keep = torch.ones(1, width)
        keep[0, 3] = keep[0, 7] = 0
    return y, step, lo, w_sum, bias, x, gamma, beta, xs, w_s, keep


def measure(width: int, rows: int, rounds: int) -> dict:
    args = inputs(rows, width)
    with torch.inference_mode():
        ref = F.layer_norm(args[5] + _rescale(*args[:5], args[8], args[9]), (width,), args[6], args[7], EPS)
        outs = {name: f(*args) for name, f in FORMS.items()}  # also the warm-up (and the compile)
    for name, (h, q, _, _) in outs.items():
        flips = (q.int() - outs["welford"][1].int()).abs()
        if not (torch.allclose(h, ref, rtol=1e-4, atol=1e-4) and int(flips.max()) <= 1
                and float((flips > 0).float().mean()) < 0.01):
            raise SystemExit(f"{name} disagrees with F.layer_norm for width {width} at {rows} rows")
    with torch.inference_mode():
        times = round_robin({name: (lambda f=f: f(*args)) for name, f in FORMS.items()}, rounds)
    return {"ms": {n: 1e3 * statistics.median(t) for n, t in times.items()},
            "two_pass_over_welford": paired_ratio(times, "two-pass", "welford")}


def main() -> int:
    a, m = micro_args(__doc__, rounds=21)
    heap = keep_heap()  # as the fast path runs
    print("| model | C | rows | Welford ms | two-pass ms | two-pass / Welford |")
    print("|---|---:|---:|---:|---:|---:|")
    results = []
    for name, width in WIDTHS.items():
        for rows in a.rows:
            r = measure(width, rows, a.rounds)
            results.append({"model": name, "width": width, "rows": rows, **r})
            print(f"| {name} | {width} | {rows} | {r['ms']['welford']:.2f} | {r['ms']['two-pass']:.2f} | "
                  f"{r['two_pass_over_welford']:.2f} |", flush=True)
    ratios = [r["two_pass_over_welford"] for r in results]
    print(f"two-pass / Welford: {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}")
    if a.out:
        write_text_atomic(a.out, json.dumps({"machine": m, "heap": heap.detail, "rounds": a.rounds,
                                             "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a bad --out: one line, exit 2
