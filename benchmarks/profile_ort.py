"""Where ONNX Runtime's time goes, per op (its own profiler), on the benchmark's two workloads:
the other side of ``profile_ops.py``'s tables.

    PYTHONPATH=src python benchmarks/profile_ort.py [--systems fp32 int8] [--doc docs/BENCHMARKS.md]
        [--section profile-ort] [--out benchmarks/results/profile_ort.json]

The models are built as the bench builds its ONNX Runtime competitors (HF's model exported to
ONNX, optimised by onnxruntime's transformer optimizer; for int8, then quantized by
``quantize_dynamic`` with per-channel weights), and fed as the bench feeds them: texts sorted by
length in padded batches of 32, with the same threads. Workloads as in the bench: 32 texts of
128 tokens on a BERT-base-size model (random weights), and 256 texts of 5 to 256 tokens on the
bundled all-MiniLM-L6-v2. Each workload runs twice in a profiled session; only the second pass
is counted. Times are the kernels' own (ONNX Runtime's ``*_kernel_time`` events), summed by op
type. The padded tokens each workload computes are reported too: ONNX Runtime computes on PAD
positions, bertscope does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.corpus import make_texts, mixed_lengths, save_random_checkpoint  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.bench.systems.ort import export_optimized, session_embedder  # noqa: E402
from bertscope.bench.systems.ort_int8 import export_int8  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.core.config import BertConfig  # noqa: E402
from bertscope.errors import InputError  # noqa: E402
from bertscope.files import update_section, write_text_atomic  # noqa: E402

WHAT = {  # op type -> what it does, for the table
    "Attention": "Q/K/V GEMM + attention (fused)", "QAttention": "int8 Q/K/V GEMM + attention (fused)",
    "MatMul": "GEMM (fp32)", "DynamicQuantizeMatMul": "int8 GEMM with its quantize step",
    "MatMulInteger": "int8 GEMM", "DynamicQuantizeLinear": "quantize (per tensor)",
    "SkipLayerNormalization": "residual add + LayerNorm", "BiasGelu": "bias + GELU",
    "FastGelu": "bias + GELU", "EmbedLayerNormalization": "embeddings + LayerNorm",
    "QEmbedLayerNormalization": "embeddings + LayerNorm (int8 tables)", "Add": "bias add", "Mul": "scale",
    "DequantizeLinear": "int8 -> fp32", "Cast": "type cast",
}
BATCH = 32  # as the bench's adapter: session_embedder's batches


def profile_system(path: Path, tok, hidden: int, max_len: int, texts: list[str], threads: int, tmp: Path) -> dict:
    run = session_embedder(path, tok, hidden, max_len, threads, profile_prefix=str(tmp / path.stem))
    run(texts)
    run(texts)  # the counted pass
    events = json.loads(Path(run.session.end_profiling()).read_text())
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    start = runs[len(runs) // 2]  # the second pass's first batch (both passes have the same batches)
    ops: dict[str, list[float]] = {}  # op type -> [microseconds, calls]
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= start:
            acc = ops.setdefault(e.get("args", {}).get("op_name", "?"), [0.0, 0])
            acc[0] += e["dur"]
            acc[1] += 1
    total = sum(us for us, _ in ops.values())
    top = sorted(ops.items(), key=lambda kv: -kv[1][0])
    return {"total_ms": total / 1e3,
            "top": [{"op": k, "what": WHAT.get(k, ""), "ms": us / 1e3, "share": us / total, "calls": n}
                    for k, (us, n) in top]}


def padded_tokens(tok, texts: list[str], max_len: int) -> tuple[int, int]:
    """(real tokens, tokens in the padded batches of 32 the adapter makes)."""
    counts = sorted((len(ids) for ids in tok(texts, truncation=True, max_length=max_len)["input_ids"]), reverse=True)
    padded = sum(max(counts[a:a + BATCH]) * len(counts[a:a + BATCH]) for a in range(0, len(counts), BATCH))
    return sum(counts), padded


def markdown(results: dict, m: dict, threads: int) -> str:
    lines = [f"Measured on {cpu_label(m)}, {threads} threads, onnxruntime "
             f"{m['versions'].get('onnxruntime', '?')}; each workload run twice in a session with ONNX Runtime's "
             "profiler on, the second pass counted. Kernel time per op type.", ""]
    for name, r in results.items():
        pad = r["padded_tokens"] - r["real_tokens"]
        lines += [f"**{name}**: {r['total_ms']:.0f} ms in all, on {r['padded_tokens']} tokens"
                  + (f" ({r['real_tokens']} real, {pad} padding)" if pad else " (no padding)"), "",
                  "| op type | what | ms | share | calls |", "|---|---|---:|---:|---:|"]
        for row in r["top"]:
            lines.append(f"| `{row['op']}` | {row['what']} | {row['ms']:.1f} | {100 * row['share']:.1f}% | {row['calls']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=["fp32", "int8"], choices=["fp32", "int8"])
    p.add_argument("--doc", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "profile_ort.json"))
    p.add_argument("--section", default="profile-ort", help="the named section of --doc to write (default: profile-ort)")
    a = p.parse_args()
    a.out = str(check_output_file(a.out, suffixes=(".json",)))
    if a.doc:
        a.doc = str(check_output_file(a.doc, "--doc", suffixes=(".md",)))
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        raise InputError(f"this script profiles ONNX Runtime, which is not installed here ({e.name}): "
                         "pip install onnxruntime onnx") from None
    threads = torch.get_num_threads()
    results = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        base = save_random_checkpoint(BertConfig.preset("bert-base"), tmp / "base", bertscope.bundled_model_path())
        bundled = bertscope.bundled_model_path()
        for label, folder, lengths, seed in (("T = 128, BERT-base size", base, [128] * 32, 2),
                                             ("mixed 5-256 tokens, all-MiniLM-L6-v2", bundled,
                                              mixed_lengths(256, 5, 256), 3)):
            bert = bertscope.load(folder)
            texts, max_len = make_texts(bert.tokenizer, lengths, seed=seed), bert.max_seq_length
            for system in a.systems:
                work = tmp / f"{folder.name}-{system}"
                if system == "int8":
                    path, tok, cfg = export_int8(folder, work)
                else:
                    path, tok, cfg = export_optimized(folder, work)
                r = profile_system(path, tok, cfg.hidden_size, max_len, texts, threads, tmp)
                r["real_tokens"], r["padded_tokens"] = padded_tokens(tok, texts, max_len)
                results[f"{label}, ONNX Runtime {system}"] = r
                print(label, system, f"{r['total_ms']:.0f} ms", flush=True)
    m = machine()
    write_text_atomic(a.out, json.dumps({"machine": m, "threads": threads, "profiles": results}, indent=1))
    md = markdown(results, m, threads)
    print(md)
    if a.doc:
        update_section(a.doc, a.section, md)
    return 0


if __name__ == "__main__":
    run_script(main)
