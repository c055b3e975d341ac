"""Why the kernel choice does not race batches whose widest activation reaches 31 MiB.

    PYTHONPATH=src python benchmarks/wide_batches.py [--rounds 7] [--whole-model] [--out FILE.json]

glibc serves a block from its heap only below its mmap threshold, which never rises past 32 MiB
on a 64-bit system (``bertscope.fast.tuning.settle_allocator`` sets it to 31 MiB at once); a
larger block is mapped fresh from the system whenever the heap's free top cannot hold it, and
paid for in page faults on first touch. At
BERT-base's sizes a 4096-token batch makes the feed-forward's (N, 3072) fp32 output 48 MiB, where
2048 tokens make it 24 MiB.

This script times one int8 linear of that shape (768 -> 3072 with GELU, BERT-base's W1, random
weights, two fp32 input channels), with the eager steps and with the compiled ones
(``compile=True``'s), at 2048 and 4096 rows, in paired rounds after settling the allocator. It
reports the median time per 1,000 rows and the minor page faults per call
(``getrusage``). With ``--whole-model`` it also loads BERT-base size with random weights in int8
(eager and ``compile=True``) and embeds the bench's T = 128 workload (32 texts of 128 tokens)
with ``batch_tokens`` 2048 and 4096, in paired rounds. The compiled variants compile on first
use (about 30 s the first time on a machine). The loads use the usual kernel-choice and inductor
caches (``BERTSCOPE_CACHE_DIR=<empty folder>`` measures the choices afresh).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402

SIZES = (2048, 4096)


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def paired(calls: dict, rounds: int) -> dict:
    """{name: {"s": [seconds per round], "faults": [minor faults per round]}}, every call once per round."""
    for f in calls.values():  # warm-up: builds, compiles, first-call costs
        f()
    out = {k: {"s": [], "faults": []} for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            f0, t = faults(), time.perf_counter()
            f()
            out[k]["s"].append(time.perf_counter() - t)
            out[k]["faults"].append(faults() - f0)
    return out


def one_linear(rounds: int) -> dict:
    from bertscope.fast import quant
    from bertscope.fast.tuning import settle_allocator

    settle_allocator()
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(3072, 768, generator=g) * 0.05, torch.randn(3072, generator=g) * 0.05
    steps = quant.CompiledSteps(quant.FULL_LEVELS)
    calls = {}
    for kernel, label in (("onednn", "eager steps"), (quant.COMPILED_KERNEL, "compiled steps")):
        lin = quant.Int8Linear(w, b, "gelu", kernel=kernel, steps=steps if kernel == quant.COMPILED_KERNEL else None,
                               channels=(0, 1))
        for n in SIZES:
            x = torch.randn(n, 768, generator=g)

            def call(lin=lin, x=x):
                with torch.inference_mode():
                    lin(x)
            calls[f"{label}, {n} rows"] = call
    return paired(calls, rounds)


def whole_model(rounds: int) -> dict:
    import bertscope
    from bertscope.bench.corpus import make_texts, save_random_checkpoint
    from bertscope.core.checkpoint import bundled_model_path
    from bertscope.core.config import BertConfig

    with tempfile.TemporaryDirectory(prefix="bertscope-wide-") as tmp:
        folder = save_random_checkpoint(BertConfig.preset("bert-base"), Path(tmp) / "equal", bundled_model_path())
        models = {"eager steps": bertscope.load(folder, precision="int8"),
                  "compiled steps": bertscope.load(folder, precision="int8", compile=True)}
    texts = make_texts(models["eager steps"].tokenizer, [128] * 32, seed=2)  # the bench's T = 128 inputs
    calls = {f"{k}, batch_tokens {n}": (lambda b=b, n=n: b.embed(texts, batch_tokens=n))
             for k, b in models.items() for n in SIZES}
    return paired(calls, rounds)


def table(res: dict, unit: str, per: dict[str, float]) -> list[str]:
    lines = [f"| variant | median {unit} | vs the 2048 variant, paired | minor page faults per call |",
             "|---|---:|---:|---:|"]
    for k, v in res.items():
        base_key = k.replace("4096", "2048")
        scale = per[k]
        med = statistics.median(s * scale for s in v["s"])
        rel = ""
        if base_key != k:
            b = res[base_key]
            rel = f"{statistics.median((s * per[k]) / (t * per[base_key]) for s, t in zip(v['s'], b['s'])):.3f}"
        lines.append(f"| {k} | {med:.2f} | {rel} | {statistics.median(v['faults']):.0f} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7, help="paired rounds (default 7)")
    p.add_argument("--whole-model", action="store_true", help="also the whole BERT-base-size model at T = 128")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    if a.rounds < 3:
        p.error("--rounds must be at least 3")
    if a.out:  # checked before minutes of measuring, not after: one line, exit 2
        check_output_file(a.out, suffixes=(".json",))
    m = machine()
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{a.rounds} paired rounds\n")
    result = {"machine": m, "rounds": a.rounds, "one_linear": one_linear(a.rounds)}
    per_row = {k: 1e3 * 1000 / int(k.split(", ")[1].split()[0]) for k in result["one_linear"]}  # ms per 1,000 rows
    print("One int8 linear, 768 -> 3072 with GELU (ms per 1,000 rows):\n")
    print("\n".join(table(result["one_linear"], "ms per 1,000 rows", per_row)))
    if a.whole_model:
        result["whole_model"] = whole_model(a.rounds)
        print("\nWhole model, BERT-base size, int8, 32 texts of 128 tokens (s per embed):\n")
        print("\n".join(table(result["whole_model"], "s", {k: 1.0 for k in result["whole_model"]})))
    if a.out:
        write_text_atomic(Path(a.out), json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)
