"""GPU benchmark: the packed path in fp32/bf16/fp16 (varlen flash or length-group SDPA kernels)
against HF transformers (sdpa) and sentence-transformers on the same GPU, plus S13 on the GPU.

Run through benchmarks/gpu_bench.sh. Every section is fenced: one that fails is recorded in
the JSON (with its error) and the rest still run. Writes OUT/gpu_bench.json, OUT/gpu_bench.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench import corpus, machine, report, scaling, timing  # noqa: E402
from bertscope.bench import systems as bench_systems  # noqa: E402
from bertscope.fast.encoder import packed_encode  # noqa: E402
from bertscope.fast.packing import pack  # noqa: E402

log = logging.getLogger("gpu_bench")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def section(results: dict, name: str, fn, save=None) -> None:
    t = time.perf_counter()
    try:
        results[name] = fn()
        log.info("%s done in %.1f s", name, time.perf_counter() - t)
    except Exception as e:  # record and go on: one broken part must not cost the others
        results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        log.error("%s failed: %s", name, e)
    if save is not None:
        save()  # after every section: a run cut short still leaves what it measured


def parity(model_dir: Path, device: str) -> dict:
    """Packed path (each dtype, each attention kernel) against the fp32 padded reference path."""
    out = {}
    ref_bert = bertscope.load(model_dir, device=device)
    tok = ref_bert.tokenizer
    lengths = [ref_bert.config.max_position_embeddings, 1, 3, 37, 37, 200, 77]
    texts = corpus.make_texts(tok, lengths, seed=5)
    ids, _ = tok.encode_ids(texts, max_length=ref_bert.config.max_position_embeddings)
    T = max(len(t) for t in ids)
    inp = torch.zeros(len(ids), T, dtype=torch.long)
    mask = torch.zeros(len(ids), T, dtype=torch.long)
    for b, t in enumerate(ids):
        inp[b, :len(t)] = torch.tensor(t)
        mask[b, :len(t)] = 1
    inp, mask = inp.to(device), mask.to(device)
    real = mask.bool()
    m = ref_bert.model
    with torch.inference_mode():
        ref = m(inp, mask).last_hidden_state.float()  # the model is the padded reference
    impls = ["groups"] + (["varlen"] if device.startswith("cuda") else [])
    for dname, dt in DTYPES.items():
        if dname != "fp32" and not device.startswith("cuda"):
            continue
        model = bertscope.load(model_dir, device=device, dtype=dt).model
        for impl in impls:
            key = f"{dname}/{impl}"
            try:
                with torch.inference_mode():
                    p = pack(inp, mask, None)
                    x = packed_encode(model, p, attention_impl=impl).float()  # (N, C)
                    flat = ref.reshape(-1, ref.shape[-1])[p.flat_index]  # (N, C)
                out[key] = {"max_abs_diff_vs_fp32_reference": float((x - flat).abs().max()),
                            "tokens": int(real.sum())}
            except Exception as e:
                out[key] = {"error": f"{type(e).__name__}: {e}"}
    return out


def throughput(folder: Path, texts: list[str], device: str, rounds: int, work: Path, label: str) -> dict:
    """bertscope (fp32 and half precision) vs HF sdpa and sentence-transformers in the same dtype."""
    out = {}
    ref = bertscope.load(folder, device=device)
    ref_vecs = ref.embed(texts)
    ids, _ = ref.tokenizer.encode_ids(texts, max_length=ref.max_seq_length)
    lengths = [len(t) for t in ids]
    flops = ref.config.flops(lengths)
    dtypes = ["fp32", "bf16", "fp16"] if device.startswith("cuda") else ["fp32"]
    for dname in dtypes:
        try:
            out[dname] = _throughput_one(folder, texts, device, rounds, work, label, dname, ref_vecs, lengths, flops)
        except Exception as e:  # one dtype failing must not cost the others
            out[dname] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            log.error("%s %s failed: %s", label, dname, e)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def _throughput_one(folder, texts, device, rounds, work, label, dname, ref_vecs, lengths, flops) -> dict:
    """One dtype: every system built in it, outputs compared, then timed round-robin."""
    dt = None if dname == "fp32" else DTYPES[dname]
    bert = bertscope.load(folder, device=device, dtype=dt)
    systems, skipped = bench_systems.build_systems(folder, bert, work / f"{label}-{dname}", torch.get_num_threads(),
                                           device, dt, only=["sentence-transformers", "transformers"])
    r = timing.compare_and_time(systems, texts, sum(lengths), flops, rounds, device)
    r["max_abs_diff_bertscope_vs_fp32"] = float(np.abs(bert.embed(texts) - ref_vecs).max())
    r["skipped"] = skipped
    return r


def to_markdown(r: dict) -> str:
    lines = [f"GPU benchmark on {r['machine'].get('gpu', r['device'])} "
             f"(torch {r['machine']['versions']['torch']}), {r.get('wall_s', 0):.0f} s; matmul peak "
             f"fp32 {r.get('matmul_peak_gflops')} GFLOP/s, bf16 {r.get('matmul_peak_bf16_gflops')} GFLOP/s", ""]
    par = r.get("parity", {})
    if "error" not in par:
        lines += ["| packed path | max abs diff vs fp32 reference |", "|---|---:|"]
        for k, v in par.items():
            lines.append(f"| {k} | {v.get('max_abs_diff_vs_fp32_reference', v.get('error'))} |")
        lines.append("")
    for wname in ("mixed", "equal_T128"):
        w = r.get(wname, {})
        if "error" in w:
            lines.append(f"{wname}: failed: {w['error']}\n")
            continue
        for dname, d in w.items():
            if "error" in d:
                lines.append(f"{wname}, {dname}: failed: {d['error']}\n")
                continue
            lines += [f"### {wname}, {dname}: {d['texts']} texts, {d['real_tokens']} real tokens", ""]
            lines += report.systems_table(d, seconds=".4f", gflops=".0f")
            lines.append(f"\nbertscope {dname} vs bertscope fp32: max abs diff {d['max_abs_diff_bertscope_vs_fp32']:.1e}\n")
    s = r.get("scaling", {})
    if "error" not in s and s:
        lines += ["### S13 on the GPU (fp32, batch of 1)", "", "| T | attention ms | model ms | attention MiB | model MiB |",
                  "|---:|---:|---:|---:|---:|"]
        for i, T in enumerate(s["lengths"]):
            am = (s["attention"].get("peak_mib") or [float("nan")] * len(s["lengths"]))[i]
            mm = (s["model"].get("peak_mib") or [float("nan")] * len(s["lengths"]))[i]
            lines.append(f"| {T} | {1e3 * s['attention']['time_s'][i]:.3f} | {1e3 * s['model']['time_s'][i]:.2f} | {am:.1f} | {mm:.1f} |")
        for kind in ("attention", "model"):
            e = s[kind]
            fitted = f"T^{e['time_exponent']:.2f}" if e.get("time_exponent") is not None else "exponent n/a"
            lines.append(f"- {kind}: {fitted}; 512 vs 192: {e.get('ratio_512_vs_192', float('nan')):.1f}× "
                         f"(seed: {s['seed_claim_512_vs_192']:.1f}×)")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=str(ROOT / ".devcarry" / "model"), help="the bundled model's folder")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu-out"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a CPU dry run of the script)")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(a.model)
    if not (model_dir / "config.json").is_file():
        print(f"gpu_bench: no model at {model_dir} (pass --model)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    dev = a.device
    r: dict = {"machine": machine.machine(), "device": dev, "quick": a.quick}
    if dev.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    work = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    rounds = 1 if a.quick else 5
    def save() -> None:
        r["wall_s"] = time.perf_counter() - started
        (out / "gpu_bench.json").write_text(json.dumps(r, indent=1, default=str))
        try:
            (out / "gpu_bench.md").write_text(to_markdown(r))
        except Exception as e:  # a partial result may not render; the JSON still holds it
            log.error("markdown failed: %s", e)

    mm_dev = "cuda" if dev.startswith("cuda") else "cpu"
    n_mm = 256 if a.quick else 8192
    section(r, "matmul_peak_gflops", lambda: machine.matmul_peak(n_mm, 0.3 if a.quick else 1.0, device=mm_dev), save)
    if dev.startswith("cuda"):
        section(r, "matmul_peak_bf16_gflops",
                lambda: machine.matmul_peak(n_mm, 1.0, device=mm_dev, dtype=torch.bfloat16), save)
    section(r, "parity", lambda: parity(model_dir, dev), save)
    tok = bertscope.load(model_dir).tokenizer
    n_mix, n_eq = (16, 8) if a.quick else (4096, 1024)
    hi = 64 if a.quick else 256
    mixed = corpus.make_texts(tok, corpus.mixed_lengths(n_mix, 5, hi), seed=3)
    section(r, "mixed", lambda: throughput(model_dir, mixed, dev, rounds, work, "mixed"), save)
    cfg = (bertscope.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
           if a.quick else bertscope.BertConfig.preset("bert-base"))
    base_dir = corpus.save_random_checkpoint(cfg, work / "bert-base", model_dir)
    equal = corpus.make_texts(tok, [32 if a.quick else 128] * n_eq, seed=2)
    section(r, "equal_T128", lambda: throughput(base_dir, equal, dev, rounds, work, "equal"), save)
    section(r, "scaling", lambda: scaling.scaling(cfg, [16, 32, 64] if a.quick else [64, 128, 192, 256, 384, 512],
                                                torch.get_num_threads(), dev, memory=True), save)
    save()
    print((out / "gpu_bench.md").read_text())
    failed = [k for k, v in r.items() if isinstance(v, dict) and "error" in v]
    print(f"gpu_bench: wrote {out}/gpu_bench.json and gpu_bench.md; failed sections: {failed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
