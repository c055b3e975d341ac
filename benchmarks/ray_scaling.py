"""The embedding job on Ray against the local engine, on one machine; Ray's own overhead; and a
paper plan for 10^8 texts from the figures measured here and on the GPU.

    flock /work/cpu.lock env PYTHONPATH=src python benchmarks/ray_scaling.py [--texts 3000] [--rounds 3]

Writes benchmarks/results/ray_scaling.json and the sections "ray-scaling" and "ray-plan" of
docs/BENCHMARKS.md (bertscope.files.update_section). Every engine embeds the same input file
into the same shards; their outputs are compared before any figure is kept.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

SHARD_ROWS = 500


def _median_time(fn, rounds: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


class Identity:
    """A Ray Data actor that does nothing: what remains is Ray's cost per batch."""

    def __call__(self, batch):
        return batch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--texts", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--small-batches", type=int, default=200)
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "ray_scaling.json"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    a = p.parse_args()

    import ray
    import ray.data

    import bertscope
    from bertscope.bench.corpus import make_texts, mixed_lengths
    from bertscope.bench.machine import machine
    from bertscope.fast.embedjob import JobOptions, read_embeddings, run_embed_job
    from bertscope.fast.jobinput import plan_input
    from bertscope.scale import EngineOptions, embed_dataset, run_ray_embed_job

    bert = bertscope.load()
    lengths = mixed_lengths(a.texts, 5, 128, seed=3)
    texts = make_texts(bert.tokenizer, lengths, seed=3)
    tokens = sum(lengths)
    res: dict = {"machine": machine(), "texts": a.texts, "real_tokens": tokens, "shard_rows": SHARD_ROWS,
                 "rounds": a.rounds, "ray": ray.__version__}
    tmp = Path(tempfile.mkdtemp(prefix="ray-scaling-"))
    try:
        inp = tmp / "in.txt"
        inp.write_text("\n".join(texts) + "\n")

        # the driver's one pass over the input (count, cut, SHA-256), on a larger file
        big = tmp / "big.txt"
        with open(big, "wb") as f:
            data = inp.read_bytes()
            while f.tell() < (64 << 20):
                f.write(data)
        t = time.perf_counter()
        plan = plan_input(big, shard_rows=10_000)
        dt = time.perf_counter() - t
        res["plan_mb_per_s"] = big.stat().st_size / 2**20 / dt
        res["plan_lines_per_s"] = plan.rows / dt
        big.unlink()

        # tokenization alone (what each worker does before its GEMMs)
        dt, _ = _median_time(lambda: bert.tokenizer.encode_ids(texts, max_length=bert.max_seq_length), a.rounds)
        res["tokenize_texts_per_s"] = a.texts / dt
        res["tokenize_tokens_per_s"] = tokens / dt

        def local():
            out = tmp / "local"
            shutil.rmtree(out, ignore_errors=True)
            run_embed_job(bert, inp, out, JobOptions(shard_rows=SHARD_ROWS, fmt="npy"))

        local()  # warm-up (oneDNN primitives), then timed
        res["local_s"], res["local_times"] = _median_time(local, a.rounds)
        res["bert_embed_s"], res["bert_embed_times"] = _median_time(lambda: bert.embed(texts), a.rounds)
        ref, ref_status = read_embeddings(tmp / "local")

        t = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
        res["ray_init_s"] = time.perf_counter() - t
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False

        one = tmp / "one.txt"
        one.write_text("one short text\n")

        def ray_job(path, workers, name):
            def run():
                out = tmp / name
                shutil.rmtree(out, ignore_errors=True)
                run_ray_embed_job(None, path, out, JobOptions(shard_rows=SHARD_ROWS, fmt="npy"),
                                  engine=EngineOptions(workers=workers))
            return run

        # start-up: a job of one short text = actor start + model load + one tiny shard + commit
        res["ray_job_startup_s"], _ = _median_time(ray_job(one, 1, "one"), a.rounds)
        for w in (1, 2):
            ray_job(inp, w, f"ray{w}")()  # warm-up
            med, times = _median_time(ray_job(inp, w, f"ray{w}"), a.rounds)
            res[f"ray{w}_s"], res[f"ray{w}_times"] = med, times
            emb, status = read_embeddings(tmp / f"ray{w}")
            assert status == ref_status
            res[f"ray{w}_max_abs_diff"] = float(np.abs(emb - ref).max())

        # Ray's cost per batch: an identity actor over N one-row blocks, minus a one-block run
        def identity(n):
            def run():
                ds = ray.data.from_items([{"i": i} for i in range(n)], override_num_blocks=n)
                ds = ds.map_batches(Identity, batch_size=1, compute=ray.data.ActorPoolStrategy(size=1))
                for _ in ds.iter_rows():
                    pass
            return run

        t1, _ = _median_time(identity(1), a.rounds)
        tn, _ = _median_time(identity(a.small_batches), a.rounds)
        res["ray_per_batch_ms"] = (tn - t1) / (a.small_batches - 1) * 1e3
        res["small_batches"] = a.small_batches
        res["ray_dataset_startup_s"] = t1

        # embed_dataset at small batches vs large, the same 512 texts, one worker
        sub = texts[:512]
        local_per_text = _median_time(lambda: [bert.embed([t]) for t in sub[:128]], a.rounds)[0] / 128

        def api(batch_size):
            def run():
                ds = embed_dataset(ray.data.from_items([{"text": t} for t in sub], override_num_blocks=4),
                                   workers=1, batch_size=batch_size)
                for _ in ds.iter_batches(batch_size=None):
                    pass
            return run

        res["api_batch1_s"], _ = _median_time(api(1), a.rounds)
        res["api_batch512_s"], _ = _median_time(api(512), a.rounds)
        res["api_texts"] = len(sub)
        res["local_one_text_ms"] = local_per_text * 1e3
        ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    Path(a.json).write_text(json.dumps(res, indent=1))
    from bertscope.files import update_section

    update_section(a.doc, "ray-scaling", scaling_markdown(res))
    update_section(a.doc, "ray-plan", plan_markdown(res, json.loads((ROOT / "benchmarks" / "results" / "gpu_h200.json").read_text())))
    print(scaling_markdown(res))
    return 0


def scaling_markdown(r: dict) -> str:
    m = r["machine"]
    n, tok = r["texts"], r["real_tokens"]
    rows = [("`Bert.embed(texts)` in memory (no job: the reference)", r["bert_embed_s"], None),
            ("local engine (1 process, 2 torch threads)", r["local_s"], None),
            ("Ray, 1 worker (1 CPU, 1 thread)", r["ray1_s"], r["ray1_max_abs_diff"]),
            ("Ray, 2 workers (1 CPU, 1 thread each)", r["ray2_s"], r["ray2_max_abs_diff"])]
    lines = [
        "## `bertscope embed --engine ray`: scaling on this machine",
        "",
        f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, flags {', '.join(m['cpu_flags']) or 'none of note'}; "
        f"torch {m['versions']['torch']}, Ray {r['ray']}. Reproduce (with the CPU lock held, so nothing else runs):",
        "",
        "```bash",
        "flock /work/cpu.lock env PYTHONPATH=src python benchmarks/ray_scaling.py --texts 3000 --rounds 3",
        "```",
        "",
        f"The same input for every engine: {n:,} texts of 5–128 tokens ({tok:,} real tokens), bundled "
        f"all-MiniLM-L6-v2, shards of {r['shard_rows']} lines, npy output; medians of {r['rounds']} runs after a "
        "warm-up, each a whole job (plan, embed, write, commit). Ray runs reuse one local Ray session, so "
        "their times include starting the actors and loading a model in each, not `ray.init`. Outputs are "
        "compared with the local engine's before any time is kept (statuses identical).",
        "",
        "| engine | median s | texts/s | real tokens/s | vs local | max abs diff vs local |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s, diff in rows:
        lines.append(f"| {name} | {s:.2f} | {n / s:,.0f} | {tok / s:,.0f} | {r['local_s'] / s:.2f}× | "
                     f"{'—' if diff is None else f'{diff:.1e}'} |")
    per_batch = r["ray_per_batch_ms"]
    lines += [
        "",
        "Ray's own overhead, measured in the same run:",
        "",
        f"- **Start-up**: `ray.init` of a local Ray took {r['ray_init_s']:.1f} s. A Ray job of one short text "
        f"(actor start, model load in the actor, one shard, commit) took {r['ray_job_startup_s']:.1f} s; "
        f"a Ray Data pipeline with one no-op actor and one row, {r['ray_dataset_startup_s']:.1f} s.",
        f"- **Per batch**: a no-op actor over {r['small_batches']} one-row batches costs "
        f"{per_batch:.1f} ms per batch (scheduling, serialisation, the object store). "
        f"`embed_dataset` over {r['api_texts']} texts: {r['api_batch1_s']:.1f} s with batches of 1 text, "
        f"{r['api_batch512_s']:.1f} s with one batch of {r['api_texts']} "
        f"(locally, one text at a time costs {r['local_one_text_ms']:.1f} ms). Batches of hundreds to "
        "thousands of texts make Ray's cost per batch vanish; the job's shards (10,000 lines by default) "
        "are far above that.",
        f"- **The driver's pass over the input** (count lines, cut shards, SHA-256 each): "
        f"{r['plan_mb_per_s']:.0f} MB/s ({r['plan_lines_per_s']:,.0f} lines/s) on one core.",
        "",
        "On 2 cores, Ray cannot beat one process that already uses both cores: two 1-thread workers do "
        "the same arithmetic as one 2-thread process, plus a model per worker and Ray's start-up. What "
        "Ray adds is the same job on more machines: throughput grows with workers as long as the input "
        "can be read and the output written as fast (see the plan below).",
    ]
    return "\n".join(lines)


def plan_markdown(r: dict, gpu: dict) -> str:
    """10^8 texts, arithmetic shown, from this run's CPU figures and the H200 run's GPU figures."""
    N = 1e8
    g = gpu["mixed"]
    tok_per_text = g["bf16"]["real_tokens"] / g["bf16"]["texts"]
    total_tok = N * tok_per_text
    gpu_bf16 = g["bf16"]["systems"]["bertscope"]["tokens_per_s"]
    gpu_fp32 = g["fp32"]["systems"]["bertscope"]["tokens_per_s"]
    cpu_tok = r["real_tokens"] / r["local_s"]  # this machine, 2 cores, whole job
    cpu_table = json.loads((ROOT / "benchmarks" / "results" / "cpu.json").read_text())
    amd = cpu_table["workloads"]["mixed"]["systems"]["bertscope"]["tokens_per_s"]
    amd_cores = cpu_table["machine"]["logical_cpus"]
    cores = r["machine"]["logical_cpus"]
    tok_rate = r["tokenize_tokens_per_s"]
    C = 384
    BYTES_PER_TOKEN = 4.5  # an assumption for English text (word pieces), not measured here
    out_bytes = N * C * 4
    gpu_texts_s = gpu_bf16 / tok_per_text
    h = lambda s: s / 3600  # noqa: E731
    lines = [
        "## A paper plan: 10⁸ texts on a Ray cluster",
        "",
        "Not measured end to end: arithmetic on the figures above (this machine) and in the GPU "
        "section (one H200), stated so it can be checked. Texts like the mixed corpus: "
        f"{g['bf16']['real_tokens']:,} real tokens over {g['bf16']['texts']:,} texts = **{tok_per_text:.1f} tokens "
        f"per text**, so 10⁸ texts = {total_tok:.3g} tokens. all-MiniLM-L6-v2 (C = {C}).",
        "",
        "| stage | rate measured | for 10⁸ texts |",
        "|---|---:|---:|",
        f"| GPU, bf16 (H200, packed path, tokenization included) | {gpu_bf16:,.0f} tokens/s | "
        f"{total_tok:.3g} / {gpu_bf16:.3g} = {total_tok / gpu_bf16:,.0f} s = **{h(total_tok / gpu_bf16):.1f} GPU-hours** |",
        f"| GPU, fp32 | {gpu_fp32:,.0f} tokens/s | {total_tok / gpu_fp32:,.0f} s = {h(total_tok / gpu_fp32):.1f} GPU-hours |",
        f"| CPU, whole job (this machine, {cores} cores) | {cpu_tok:,.0f} tokens/s = {cpu_tok / cores:,.0f} per core | "
        f"{total_tok:.3g} / {cpu_tok / cores:,.0f} = **{h(total_tok / (cpu_tok / cores)):,.0f} core-hours** |",
        f"| CPU, `Bert.embed` (the throughput table's {cpu_table['machine']['cpu']}, {amd_cores} cores) | "
        f"{amd:,.0f} tokens/s = {amd / amd_cores:,.0f} per core | {h(total_tok / (amd / amd_cores)):,.0f} core-hours |",
        f"| tokenization alone (this machine) | {tok_rate:,.0f} tokens/s | {h(total_tok / tok_rate):.1f} hours on "
        f"{cores} cores |",
        f"| driver's pass over the input (one core) | {r['plan_mb_per_s']:.0f} MB/s | "
        f"10⁸ lines of ≈ {tok_per_text * BYTES_PER_TOKEN:.0f} bytes ≈ {N * tok_per_text * BYTES_PER_TOKEN / 1e9:.0f} GB: "
        f"{N * tok_per_text * BYTES_PER_TOKEN / 2**20 / r['plan_mb_per_s'] / 60:.0f} min |",
        f"| output (fp32 vectors) | — | 10⁸ × {C} × 4 B = {out_bytes / 1e9:.1f} GB |",
        "",
        f"(Input size assumes ≈ {BYTES_PER_TOKEN} bytes of text per token, typical of English; it is not measured.)",
        "",
        "A plan, and what bounds it:",
        "",
        f"- **8 GPU workers** (`--gpus-per-worker 1 --cpus-per-worker 8`, say one 8×H200 node or eight "
        f"1-GPU nodes): {h(total_tok / gpu_bf16) / 8:.2f} h of GPU time in bf16, "
        f"{h(total_tok / gpu_fp32) / 8:.2f} h in fp32. Each GPU eats {gpu_texts_s:,.0f} texts/s, "
        f"reads ≈ {gpu_texts_s * tok_per_text * BYTES_PER_TOKEN / 1e6:.1f} MB/s of text and writes "
        f"{gpu_texts_s * C * 4 / 1e6:.1f} MB/s of vectors: a shared filesystem or object store carries "
        "that easily, so the **GPU is the bottleneck**, provided tokenization keeps up.",
        f"- **Tokenization** runs on each worker's CPUs. At this machine's {tok_rate / cores:,.0f} tokens/s "
        f"per core, one GPU's {gpu_bf16:,.0f} tokens/s need ≈ {gpu_bf16 / (tok_rate / cores):.0f} cores of "
        "tokenization (the H200 run had 16 and included it in its rate). Give each GPU worker enough "
        "`--cpus-per-worker`, or the bottleneck moves to tokenization.",
        f"- **CPU only**: {h(total_tok / (amd / amd_cores)):,.0f} to {h(total_tok / (cpu_tok / cores)):,.0f} "
        "core-hours, depending on the CPU (the two machines measured here differ by "
        f"{(amd / amd_cores) / (cpu_tok / cores):.1f}× per core); on 100 nodes of 16 cores, "
        f"{h(total_tok / (amd / amd_cores)) / 1600:.1f} to {h(total_tok / (cpu_tok / cores)) / 1600:.1f} h. "
        "The GEMMs are the bottleneck there; tokenization takes a few percent of each core.",
        f"- **The driver**: its pass over the input ({N * tok_per_text * BYTES_PER_TOKEN / 2**20 / r['plan_mb_per_s'] / 60:.0f} "
        "min on one core, sequential) comes before any worker starts; with 10,000-line shards the plan has "
        "10⁴ shards and Ray's per-batch cost (above) is negligible. A resume re-reads the input once to "
        "check every finished shard's SHA-256.",
        "- **Ray start-up** (seconds, above) and a model load per worker do not matter at this scale; "
        "a worker lost to a node failure costs only the shards it held.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
