"""Why the packed path checks its Q/K/V weights for NaN instead of masking every attention group
(docs/BENCHMARKS.md, "A NaN query and the unmasked kernel").

1. torch's scaled_dot_product_attention without a mask, on the CPU, turns a query row of NaN into
   zeros for short sequences; with a mask (even all true) the row stays NaN. Printed: the lengths
   where it happens.
2. bertscope fp32 `embed` with the exact-length groups unmasked (as shipped) and given an
   all-true mask: outputs compared, then medians of interleaved rounds on short texts and on a
   mixed corpus.
3. What the check that replaced the mask costs: refuse_non_finite on the bundled model.
4. Training, where the weights change every step and the packed path masks every group instead:
   one layer's attention call (forward and backward, 64 texts of 12 tokens, dropout 0.1) masked
   and unmasked, against a whole training step of the bundled model on those texts.

    PYTHONPATH=src python benchmarks/exact_group_mask.py [--rounds 21] [--check-only]

--check-only runs part 3 alone.
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
import torch.nn.functional as F  # noqa: E402

import bertscope  # noqa: E402
import bertscope.fast.encoder as encoder  # noqa: E402
import bertscope.fast.kernels as kernels  # noqa: E402
from bertscope.bench.corpus import make_texts, review_corpus  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.bench.timing import median_of  # noqa: E402
from bertscope.fast.gemm import refuse_non_finite  # noqa: E402

SHIPPED = kernels.attention_plan


def masked_plan(packed, slack=None):
    """The shipped plan, with an all-true key mask on every exact-length group."""
    out = []
    for b in SHIPPED(packed, slack):
        if b.keep is None:
            b = kernels.Bucket(b.start, b.end, b.G, b.L, None, torch.ones(b.G, 1, 1, b.L, dtype=torch.bool), None)
        out.append(b)
    return out


def hidden_nan_lengths(max_len: int = 64) -> list[int]:
    """The sequence lengths at which an unmasked SDPA call turns a head's NaN queries into zeros."""
    hidden = []
    for L in range(1, max_len + 1):
        q, k, v = (torch.randn(1, 12, L, 32) for _ in range(3))  # (B, H, T, D)
        q[0, 0, :, 0] = float("nan")
        with torch.inference_mode():
            plain = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D)
            masked = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(1, 1, 1, L, dtype=torch.bool))
        if not plain.isnan().any() and masked.isnan().any():
            hidden.append(L)
    return hidden


def embed(bert, texts: list[str], masked: bool):
    encoder.attention_plan = masked_plan if masked else SHIPPED
    try:
        return bert.embed(texts)
    finally:
        encoder.attention_plan = SHIPPED


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--check-only", action="store_true", help="time only the weight check (part 3)")
    args = p.parse_args()
    print(f"{cpu_label(machine())}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.check_only:
        check_cost(bertscope.load(), args.rounds)
        return 0
    lengths = hidden_nan_lengths()
    print(f"unmasked SDPA turns NaN queries into zeros at T = {lengths[0]}..{lengths[-1]}" if lengths
          else "unmasked SDPA keeps NaN at every T up to 64")
    bert = bertscope.load()
    workloads = {"512 texts of 8 tokens": make_texts(bert.tokenizer, [8] * 512, seed=3),
                 "512 texts of 12 tokens": make_texts(bert.tokenizer, [12] * 512, seed=4),
                 "300 reviews (mixed lengths)": review_corpus(300)}
    print("| workload | unmasked (shipped) | all-true mask | ratio |\n|---|---:|---:|---:|")
    for name, texts in workloads.items():
        a, m = embed(bert, texts, False), embed(bert, texts, True)
        diff = float(abs(a - m).max())
        times = {False: [], True: []}
        for r in range(args.rounds):
            for masked in ((False, True) if r % 2 else (True, False)):
                time.sleep(0.1)
                t = time.perf_counter()
                embed(bert, texts, masked)
                times[masked].append(time.perf_counter() - t)
        plain, mask = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {name} | {plain:.3f} s | {mask:.3f} s | {mask / plain:.3f} (outputs differ by {diff:.1e}) |")
    check_cost(bert, 5)
    training_share(bert)
    return 0


def check_cost(bert, rounds: int) -> None:
    took = []
    for _ in range(rounds):
        t = time.perf_counter()
        refuse_non_finite(bert.model)
        took.append(time.perf_counter() - t)
    print(f"refuse_non_finite on the bundled model: {1e3 * statistics.median(took):.2f} ms (median of {rounds}, "
          f"{1e3 * min(took):.2f}-{1e3 * max(took):.2f})")


def training_share(bert) -> None:
    from bertscope.fast.encoder import PackedEncoder

    model, packed = bert.model.train(), PackedEncoder()
    batch = bert.encode(make_texts(bert.tokenizer, [12] * 64, seed=4))
    try:
        def step():
            packed.forward(model, batch.input_ids, batch.attention_mask).last_hidden_state.sum().backward()

        G, H, L, D = 64, bert.config.num_attention_heads, 12, bert.config.hidden_size // bert.config.num_attention_heads
        q, k, v = (torch.randn(G, H, L, D, requires_grad=True) for _ in range(3))  # (G, H, L, D)
        keep = torch.ones(G, 1, 1, L, dtype=torch.bool)

        def attend(mask):
            F.scaled_dot_product_attention(q, k, v, attn_mask=keep if mask else None, dropout_p=0.1).sum().backward()

        whole = median_of(step, 15)
        masked, plain = median_of(lambda: attend(True), 15), median_of(lambda: attend(False), 15)
        layers = bert.config.num_hidden_layers
        print(f"training step (64 texts of 12 tokens, forward and backward): {1e3 * whole:.1f} ms; one layer's "
              f"attention masked {1e3 * masked:.2f} ms, unmasked {1e3 * plain:.2f} ms: "
              f"{100 * layers * (masked - plain) / whole:.2f}% of the step for {layers} layers")
    finally:
        model.eval()


if __name__ == "__main__":
    sys.exit(main())
