"""The two routes from rounded fp32 activations to 8-bit integers (Scratch.narrow), alone and in
the whole int8 model, paired round by round.

    PYTHONPATH=src python benchmarks/int8_cast.py [--rounds 11] [--model PATH | --bert-base]

"direct" is one fp32 -> uint8 copy; "int32" converts to int32 in place, then int32 -> uint8. Both
give the same integers (tests hold them to torch.trunc); which is faster depends on how torch
vectorizes each conversion on the CPU, which is why the kernel choice measures it (``doctor``
shows the race as ``int8_cast``). This script shows the size of the difference: first the
conversion alone on a linear's input (2048 rows of 384 and of 1536; each timed call refills the
fp32 input, which the int32 route overwrites, and the refill's own time is shown and taken off),
then ``Bert.embed`` on the bench's mixed corpus (or, with ``--model`` or ``--bert-base``, 32
texts of 128 tokens) with int8 and the eager steps, the two routes alternating round by round;
the embeddings are checked to be identical. ``--bert-base`` makes a BERT-base-size checkpoint
with random weights, as the bench's T = 128 workload does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.cli.common import run_script  # noqa: E402
from bertscope.bench.corpus import make_texts, mixed_lengths  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.bench.corpus import save_random_checkpoint  # noqa: E402
from bertscope.core.checkpoint import bundled_model_path  # noqa: E402
from bertscope.core.config import BertConfig  # noqa: E402
from bertscope.bench.timing import median_of  # noqa: E402
from bertscope.fast.quant import CASTS, Scratch  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=11)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model", default=None, help="a checkpoint folder (default: the bundled model, mixed corpus)")
    g.add_argument("--bert-base", action="store_true", help="a BERT-base-size model with random weights")
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bertscope-int8-cast-") as tmp:
        if a.bert_base:
            a.model = str(save_random_checkpoint(BertConfig.preset("bert-base"), Path(tmp) / "bert-base",
                                                 bundled_model_path()))
        return run(a)


def run(a: argparse.Namespace) -> int:
    bert = bertscope.load(a.model, precision="int8", keep_precision=True)  # a bad --model fails here, first
    m = machine()
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}\n")
    print("| rows x width | " + " | ".join(f"{c} ms" for c in CASTS) + " | refill ms (taken off) |")
    print("|---|" + "---:|" * (len(CASTS) + 1))
    with torch.inference_mode():
        for width in (384, 1536):
            src = torch.rand(2048, width) * 255  # (2048, K): values on the 8-bit grid, before truncation
            cells = []
            t, q = torch.empty_like(src), torch.empty(src.shape, dtype=torch.uint8)
            copy_ms = 1e3 * median_of(lambda: t.copy_(src), 40, warmup=2)  # the refill, taken off below
            for cast in CASTS:
                s = Scratch(cast)
                cells.append(1e3 * median_of(lambda: s.narrow(t.copy_(src), q), 40, warmup=2) - copy_ms)
            print(f"| 2048 x {width} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {copy_ms:.3f} |")

    lengths = mixed_lengths(256, 5, 256) if a.model is None else [128] * 32
    texts = make_texts(bert.tokenizer, lengths, seed=3 if a.model is None else 2)
    if bert.fast.gemm.int8_kernel not in ("onednn", "int_mm"):
        print(f"int8 runs the {bert.fast.gemm.int8_kernel} kernel here, which does not use these routes")
        return 1
    gemm = bert.fast.gemm
    chosen = gemm.int8_cast
    outs = {}
    for cast in CASTS:
        gemm.use_int8_cast(cast)
        outs[cast] = bert.embed(texts)
    same = all(np.array_equal(outs[CASTS[0]], o) for o in outs.values())
    times: dict[str, list[float]] = {c: [] for c in CASTS}
    for r in range(a.rounds):
        for cast in (CASTS if r % 2 else CASTS[::-1]):  # alternate who goes first
            gemm.use_int8_cast(cast)
            t = time.perf_counter()
            bert.embed(texts)
            times[cast].append(time.perf_counter() - t)
    paired = [b / d for b, d in zip(times["int32"], times["direct"])]
    print(f"\nBert.embed, int8 ({bert.fast.gemm.int8_kernel} kernel), {len(texts)} texts, {a.rounds} rounds; "
          f"embeddings identical: {same}; the kernel choice here picked {chosen}")
    print(f"direct {statistics.median(times['direct']):.3f} s, int32 {statistics.median(times['int32']):.3f} s; "
          f"int32's time / direct's, paired: median {statistics.median(paired):.3f} "
          f"(min {min(paired):.3f}, max {max(paired):.3f})")
    return 0 if same else 1


if __name__ == "__main__":
    run_script(main)  # a BertscopeError (a model folder that is not a checkpoint, ...): one line, exit 2
