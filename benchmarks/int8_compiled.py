"""int8 with and without the torch.compile'd steps, against sentence-transformers fp32, on the
benchmark's mixed corpus (256 texts of 5 to 256 tokens, bundled all-MiniLM-L6-v2).

    PYTHONPATH=src python benchmarks/int8_compiled.py [--rounds 5]

Each system embeds the corpus once to warm up (bertscope compiles and measures its kernel
choice while loading), then the systems take turns, round after round; medians and the ratio
to sentence-transformers are printed as a markdown table, with the CPU and its flags. Outputs
are checked against bertscope fp32 first (cosine), as the quality contract does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.corpus import make_texts, mixed_lengths  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.bench.quality import embedding_agreement  # noqa: E402
from bertscope.core.checkpoint import bundled_model_path  # noqa: E402
from bertscope.fast.tuning import ratios  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    from sentence_transformers import SentenceTransformer

    fp32 = bertscope.load()
    texts = make_texts(fp32.tokenizer, mixed_lengths(256, 5, 256), seed=3)  # the bench's mixed corpus
    st = SentenceTransformer(str(bundled_model_path()), device="cpu")
    eager = bertscope.load(precision="int8")
    t = time.perf_counter()
    compiled = bertscope.load(precision="int8", compile=True)
    load_s = time.perf_counter() - t
    systems = {
        "sentence-transformers fp32": lambda: st.encode(texts, batch_size=32),
        "bertscope fp32": lambda: fp32.embed(texts),
        "bertscope int8 (eager steps)": lambda: eager.embed(texts),
        "bertscope int8 (compile=True)": lambda: compiled.embed(texts),
    }
    ref = fp32.embed(texts)
    quality = {k: embedding_agreement(ref, f()) for k, f in systems.items() if "int8" in k}
    times: dict[str, list[float]] = {k: [] for k in systems}
    with torch.inference_mode():
        for _ in range(a.rounds):
            for k, f in systems.items():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
    m = machine()
    base = statistics.median(times["sentence-transformers fp32"])
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{a.rounds} rounds; compile=True chose int8 kernel `{compiled.fast.choice.int8_kernel}` "
          f"(load with compile: {load_s:.0f} s)\n")
    paired = ratios(times, "sentence-transformers fp32")  # median over rounds of (time / ST's time)
    print("| system | median s | vs sentence-transformers | paired | cosine to fp32 mean / min | top-10 overlap |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, v in times.items():
        q = quality.get(k)
        qs = f"{q['cosine_mean']:.4f} / {q['cosine_min']:.4f} | {q['top10_overlap']:.3f}" if q else "— | —"
        print(f"| {k} | {statistics.median(v):.3f} | {base / statistics.median(v):.2f}× | {1 / paired[k]:.2f}× | {qs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
