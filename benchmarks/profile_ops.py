"""Where bertscope's time goes, per op (torch.profiler), on the benchmark's two workloads.

    PYTHONPATH=src python benchmarks/profile_ops.py [--precisions fp32 int8 int8-compiled] [--doc docs/BENCHMARKS.md]
        [--section profile] [--out benchmarks/results/profile.json]

Workloads as in `bertscope bench`: (a) 32 texts of exactly 128 tokens on a BERT-base-size model
(random weights); (b) 256 texts of 5 to 256 tokens on the bundled all-MiniLM-L6-v2. Each is
embedded once to warm up (and to make the kernel choice), once timed without the profiler, then
once under it. The table lists ops by self CPU time; "GEMM" rows are the linears, "attention"
SDPA, and the rest is the overhead around them; the heading says how much of the call the ops
fill (the rest is Python between ops and the profiler's own bookkeeping). "int8-compiled" is
``load(..., precision="int8", compile=True)`` with the compiled kernel forced on (its fused loops
show as "CompiledFxGraph" rows). Writes the tables into the --section section of --doc
("profile", the Xeon's; one section per machine kind).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torch.profiler import ProfilerActivity, profile  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.corpus import make_texts, mixed_lengths, save_random_checkpoint  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.core.config import BertConfig  # noqa: E402
from bertscope.fast.quant import COMPILED_KERNEL  # noqa: E402
from bertscope.files import update_section, write_text_atomic  # noqa: E402

GROUPS = {  # op name -> what it is, for the table
    "mkldnn::_linear_pointwise": "GEMM (oneDNN fp32/bf16)", "aten::addmm": "GEMM (BLAS)",
    "aten::linear": "GEMM (BLAS)", "aten::mm": "GEMM (BLAS)", "onednn::qlinear_pointwise": "GEMM (oneDNN int8)",
    "aten::_int_mm": "GEMM (int8)", "aten::_scaled_dot_product_flash_attention_for_cpu": "attention (SDPA)",
    "aten::native_layer_norm": "LayerNorm", "aten::add": "residual add", "aten::gelu": "GELU",
    "aten::aminmax": "int8: row min/max", "aten::addcmul": "int8: quantize", "aten::_to_copy": "int8: to uint8/int8",
    "aten::copy_": "copies", "aten::mul_": "int8: row scale", "aten::addmm_": "int8: offsets + bias",
    "aten::index_select": "gather (buckets)", "aten::index_add_": "mean pooling", "aten::fill_": "fills",
    "aten::constant_pad_nd": "row padding", "aten::embedding": "embeddings",
    "TorchDynamo Cache Lookup": "compiled: guard checks", "Pregraph bytecode": "compiled: call overhead",
    "Torch-Compiled Region": "compiled: call overhead",
    "inductor fused loops": "int8 steps, fused (rescale, residual + LayerNorm, quantize, GELU)",
}


def op_name(key: str) -> str:
    """The profiler's event name, with torch.compile's per-graph names pooled into one row each."""
    if key.startswith("## Call CompiledFxGraph"):
        return "inductor fused loops"  # one per compiled graph, named by a hash
    if key.startswith("Torch-Compiled Region"):
        return "Torch-Compiled Region"
    return key


def profile_one(bert, texts: list[str], rows: int = 12) -> dict:
    bert.embed(texts)  # warm-up, and the kernel choice
    t = time.perf_counter()
    bert.embed(texts)
    wall = time.perf_counter() - t  # the same call without the profiler
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()  # inside: the profiler's start and stop are not the call's
        bert.embed(texts)
        profiled_wall = time.perf_counter() - t
    ops: dict[str, list[float]] = {}  # name -> [self microseconds, calls]
    for e in prof.key_averages():
        if e.self_cpu_time_total > 0:
            acc = ops.setdefault(op_name(e.key), [0.0, 0])
            acc[0] += e.self_cpu_time_total
            acc[1] += e.count
    total = sum(us for us, _ in ops.values())
    top = sorted(ops.items(), key=lambda kv: -kv[1][0])[:rows]
    table = [{"op": k, "what": GROUPS.get(k, ""), "self_ms": us / 1e3, "share": us / total, "calls": n}
             for k, (us, n) in top]
    gemm = sum(us for k, (us, _) in ops.items() if GROUPS.get(k, "").startswith("GEMM"))
    # wall time the ops do not account for: Python between ops, and the profiler's own bookkeeping
    return {"total_ms": total / 1e3, "gemm_share": gemm / total, "top": table,
            "wall_ms": wall * 1e3, "profiled_wall_ms": profiled_wall * 1e3,
            "op_events": sum(n for _, n in ops.values())}


def markdown(results: dict, m: dict) -> str:
    lines = [f"Measured on {cpu_label(m)}, {m['torch_threads']} torch threads, "
             f"torch {m['versions']['torch']}; one `Bert.embed` call of each workload under `torch.profiler`, "
             "after a warm-up call and one timed without the profiler. Self CPU time per op (the profiler adds "
             "some overhead of its own); the call's time that no op accounts for is Python between ops and "
             "the profiler's bookkeeping.", ""]
    for name, r in results.items():
        lines += [f"**{name}**: {r['total_ms']:.0f} ms in all, GEMMs {100 * r['gemm_share']:.0f}%; the ops fill "
                  f"{100 * r['total_ms'] / r['profiled_wall_ms']:.0f}% of the call's {r['profiled_wall_ms']:.0f} ms "
                  f"under the profiler ({r['op_events']:,} op events), and the same call took "
                  f"{r['wall_ms']:.0f} ms without it", "",
                  "| op | what | self ms | share | calls |", "|---|---|---:|---:|---:|"]
        for row in r["top"]:
            lines.append(f"| `{row['op']}` | {row['what']} | {row['self_ms']:.1f} | {100 * row['share']:.1f}% | {row['calls']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8"], choices=["fp32", "bf16", "int8", "int8-compiled"])
    p.add_argument("--doc", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "profile.json"))
    p.add_argument("--section", default="profile", help="the named section of --doc to write (default: profile)")
    a = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = save_random_checkpoint(BertConfig.preset("bert-base"), Path(tmp) / "base", bertscope.bundled_model_path())
        for precision in a.precisions:
            for label, folder, texts_of in (
                    ("T = 128, BERT-base size", base, lambda tok: make_texts(tok, [128] * 32, seed=2)),
                    ("mixed 5-256 tokens, all-MiniLM-L6-v2", None,
                     lambda tok: make_texts(tok, mixed_lengths(256, 5, 256), seed=3))):
                compiled = precision == "int8-compiled"
                bert = bertscope.load(folder, precision="int8" if compiled else precision, compile=compiled)
                if compiled:
                    bert.fast.gemm.int8_kernel = COMPILED_KERNEL  # whatever the race picked
                results[f"{label}, {precision}"] = profile_one(bert, texts_of(bert.tokenizer))
                print(label, precision, f"{results[f'{label}, {precision}']['total_ms']:.0f} ms", flush=True)
    m = machine()
    write_text_atomic(a.out, json.dumps({"machine": m, "profiles": results}, indent=1))
    md = markdown(results, m)
    print(md)
    if a.doc:
        update_section(a.doc, a.section, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
