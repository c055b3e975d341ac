"""What calling ``torch.set_num_threads`` does to a process, even with the count it already has.

    PYTHONPATH=src python benchmarks/threads_state.py [--processes 4] [--rounds 7] [--out FILE.json]

In each of ``--processes`` fresh processes, in turn: ``--rounds`` rounds of three timed steps
with torch's thread count as the process started with it; then
``torch.set_num_threads(torch.get_num_threads())`` (the same count); then the same rounds again.
The steps, on the benchmark's mixed corpus (256 texts of 5 to 256 tokens, bundled
all-MiniLM-L6-v2, 12 heads of 32):

  * attention: PyTorch's fused CPU attention (SDPA) on the corpus's attention buckets (exact
    length groups in 2,048-token batches, as the fast path forms them; one layer's worth);
  * gemm: a (2048, 384) x (384, 1536) ``F.linear``, BLAS at top level (a control: a machine
    that got slower between the two halves shows it here too);
  * embed: a whole fp32 ``Bert.embed`` of the corpus.

It reports, per process and step, the median seconds before and after and their ratio, and the
threads the process had. The halves are not interleaved (the change cannot be undone in a
process), so a drift in the machine's speed lands in the ratio; the GEMM control and several
processes say how much. Nothing else should run on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertscope.bench.machine import machine  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.errors import BertscopeError, InputError  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402

CHILD = r"""
import json, os, statistics, sys, time
import torch
import torch.nn.functional as F
import bertscope
from bertscope.bench.corpus import make_texts, mixed_lengths
from bertscope.fast.batching import token_budget_batches
from bertscope.fast.kernels import AttentionKernels, attention_plan
from bertscope.fast.packing import pack_ids

rounds = int(sys.argv[1])
bert = bertscope.load(None)
cfg = bert.model.config
H, C = cfg.num_attention_heads, cfg.hidden_size
lengths = mixed_lengths(256, 5, 256)
texts = make_texts(bert.tokenizer, lengths, seed=3)
g = torch.Generator().manual_seed(0)
calls = []
for idx in token_budget_batches(lengths, 2048):
    packed = pack_ids([[5] * lengths[i] for i in idx])
    calls.append((torch.randn(packed.num_tokens, 3 * C, generator=g), packed, attention_plan(packed, 0.0)))
kernels = AttentionKernels()
x, w = torch.randn(2048, C, generator=g), torch.randn(4 * C, C, generator=g)

def attention():
    with torch.inference_mode():
        for qkv, packed, plan in calls:
            kernels.attend(qkv, packed, H, impl="groups", plan=plan)

def gemm():
    with torch.inference_mode():
        for _ in range(20):
            F.linear(x, w)

def embed():
    bert.embed(texts)

steps = {"attention": attention, "gemm": gemm, "embed": embed}

def half():
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for k, f in steps.items():
            t0 = time.perf_counter(); f(); times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}

for f in steps.values():
    f()  # warm-up: kernel choice, first calls
threads = lambda: len(os.listdir(f"/proc/{os.getpid()}/task"))  # noqa: E731
before, threads_before = half(), threads()
torch.set_num_threads(torch.get_num_threads())
after, threads_after = half(), threads()
print(json.dumps({"torch_threads": torch.get_num_threads(), "before": before, "after": after,
                  "os_threads_before": threads_before, "os_threads_after": threads_after}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=4, help="fresh processes, one after another (default 4)")
    p.add_argument("--rounds", type=int, default=7, help="rounds of the three steps in each half (default 7)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = p.parse_args()
    if a.processes < 1 or a.rounds < 1:
        raise InputError("--processes and --rounds must be at least 1")
    if a.out is not None:
        a.out = check_output_file(str(a.out))
    runs = []
    for i in range(a.processes):
        r = subprocess.run([sys.executable, "-c", CHILD, str(a.rounds)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        if r.returncode != 0:
            raise BertscopeError(f"process {i + 1} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
        lines = r.stdout.strip().splitlines()
        if not lines:
            raise BertscopeError(f"process {i + 1} printed no result")
        runs.append(json.loads(lines[-1]))
        res = runs[-1]
        print(f"process {i + 1}: {res['torch_threads']} torch threads; OS threads {res['os_threads_before']} -> "
              f"{res['os_threads_after']}; " + "; ".join(
                  f"{k} {res['before'][k] * 1e3:.1f} -> {res['after'][k] * 1e3:.1f} ms "
                  f"({res['after'][k] / res['before'][k]:.2f}x)" for k in res["before"]), flush=True)
    summary = {k: statistics.median(r["after"][k] / r["before"][k] for r in runs) for k in runs[0]["before"]}
    print("median over processes, time after / before: " + ", ".join(f"{k} {v:.2f}x" for k, v in summary.items()))
    if a.out is not None:
        write_text_atomic(a.out, json.dumps({"machine": machine(), "processes": a.processes, "rounds": a.rounds,
                                             "runs": runs, "median_ratio_after_before": summary}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)
