"""Where the compiled int8 steps should apply W1's activation: fused into inductor's loop, or
apart (PyTorch's own in-place GELU after the compiled rescale), on the bench's models' shapes.

    PYTHONPATH=src python benchmarks/act_placement.py [--rounds 21] [--rows 1024 2048 4096]
        [--out benchmarks/results/<kind>/act_placement.json]

W1's epilogue on the compiled steps (:meth:`bertscope.fast.quant.CompiledSteps.epilogue`) turns
the integer GEMM's output (N, I) back into fp32 -- row scale, offsets, bias, the fp32 channels --
and applies the activation. Fused, the output is written once; apart, it is written, then read
and written again by PyTorch's GELU. Which is faster depends on how each vectorizes erf for the
CPU, so the kernel choice races the two (:func:`bertscope.fast.tuning.act_runs`, the same calls
timed here). For the FFN widths of BERT-base (3072) and all-MiniLM-L6-v2 (1536) at each row
count, the two run in turn, round after round, on the same inputs, after their outputs are
checked to agree (within fp32 rounding of erf). Printed: each one's median milliseconds and the
median of the paired per-round ratios (apart / fused: below 1, apart is faster).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))


from bertscope.cli.common import run_script  # noqa: E402
from bertscope.errors import BertscopeError  # noqa: E402
from bertscope.fast.heap import keep_heap  # noqa: E402
from bertscope.fast.quant import ACT_PLACEMENTS, FULL_LEVELS, CompiledSteps  # noqa: E402
from bertscope.fast.tuning import act_runs  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402
from microkit import micro_args, paired_ratio, round_robin  # noqa: E402

WIDTHS = {"BERT-base FFN in": 3072, "MiniLM FFN in": 1536}  # name -> I, W1's output width


def measure(steps: CompiledSteps, width: int, rows: int, rounds: int) -> dict:
    runs = act_runs(list(ACT_PLACEMENTS), rows, SimpleNamespace(intermediate_size=width, hidden_act="gelu"),
                    lambda: steps)
    out = {p: run().clone() for p, run in runs.items()}  # (rows, I) each; also the warm-up
    diff = float((out["fused"] - out["apart"]).abs().max())
    scale = float(out["fused"].abs().max())
    if not diff <= 1e-5 * max(scale, 1.0):
        raise SystemExit(f"fused and apart disagree for width {width} at {rows} rows: max abs diff {diff:.2e}")
    times = round_robin(runs, rounds)
    return {"ms": {p: 1e3 * statistics.median(t) for p, t in times.items()},
            "apart_over_fused": paired_ratio(times, "apart", "fused"),
            "max_abs_diff": diff}


def main() -> int:
    a, m = micro_args(__doc__, rounds=21)
    heap = keep_heap()  # as the fast path runs: freed activations stay in the process
    try:
        steps = CompiledSteps(FULL_LEVELS)  # compiled and checked against the eager steps (~30 s cold)
    except RuntimeError as e:  # compiling failed, or the steps disagree with the eager ones on this CPU
        raise BertscopeError(f"the compiled int8 steps are not usable here, so there is nothing to time: {e}") from e
    print("| linear | I | rows | fused ms | apart ms | apart / fused |")
    print("|---|---:|---:|---:|---:|---:|")
    results = []
    for name, width in WIDTHS.items():
        for rows in a.rows:
            r = measure(steps, width, rows, a.rounds)
            results.append({"linear": name, "width": width, "rows": rows, **r})
            print(f"| {name} | {width} | {rows} | {r['ms']['fused']:.2f} | {r['ms']['apart']:.2f} | "
                  f"{r['apart_over_fused']:.2f} |", flush=True)
    ratios = [r["apart_over_fused"] for r in results]
    print(f"apart / fused: {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}")
    if a.out:
        write_text_atomic(a.out, json.dumps({"machine": m, "heap": heap.detail,
                                             "rounds": a.rounds, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a bad --out, or compiled steps unusable here: one line, exit 2
