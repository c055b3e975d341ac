"""Why the compiled int8 steps were sometimes slow: inductor's loops and the size of the first call.

    PYTHONPATH=src python benchmarks/compiled_first_call.py [--first 7x8] [--rows 2048] [--width 3072] [--repeat 3]

Inductor decides, when it compiles a CPU loop, whether to run it on several threads, from the
sizes of the first call (under about 512 elements per thread it writes a one-thread loop); with
``dynamic=True`` that code then serves every later size, and inductor's on-disk cache hands it
to later processes too. This script compiles one int8 epilogue (``quant._rescale``: Δ·y + lo·Ŵ·1
+ b) twice, each in a fresh inductor cache, first called on ``--first`` rows x columns: once
with plain ``torch.compile(dynamic=True)`` and once with bertscope's ``quant._compile`` (the same
plus ``cpp.dynamic_threads``), each in its own process. It then times each on a ``--rows`` x
``--width`` input (median of 30 calls) and counts the generated kernels that have a parallel region.

A third variant, ``quant._compile`` first called on ``--rows`` x ``--width`` itself, is the
reference: the script says whether the kernel source that bertscope's first variant generated is
the same in every process, and times it beside the other two. The three run in turn, ``--repeat`` times, each time
in fresh processes and caches; the table gives the median and range of their per-process times.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import statistics, sys, time, torch
from bertscope.fast import quant

how, first, rows, width = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
plain = lambda y, step, lo, w_sum, bias: quant._rescale(y, step, lo, w_sum, bias)
f = quant._compile(plain) if how == "bertscope" else torch.compile(plain, dynamic=True, fullgraph=True)
def args(n, m):
    return torch.randn(n, m), torch.rand(n, 1), torch.randn(n, 1), torch.randn(m), torch.randn(m)
n, m = (int(v) for v in first.split("x"))
f(*args(n, m))  # the first call sets the size hints
big = args(rows, width)
assert torch.allclose(f(*big), quant._rescale(*big), rtol=1e-5, atol=1e-5)
def ms(fn):
    fn(*big)
    ts = []
    for _ in range(30):
        t = time.perf_counter(); fn(*big); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3
print(f"{ms(f):.3f}")
"""


def probe(how: str, first: str, rows: int, width: int) -> tuple[float, list[str]]:
    """One fresh process and inductor cache: ms per call on rows x width, and the C++ kernels generated."""
    with tempfile.TemporaryDirectory(prefix="bertscope-first-call-") as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
        env.update(TORCHINDUCTOR_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
        r = subprocess.run([sys.executable, "-c", CHILD, how, first, str(rows), str(width)],
                           env=env, capture_output=True, text=True)
        if r.returncode:
            last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
            raise RuntimeError(f"the {how} probe (first call {first}) failed: {last}")
        kernels = []
        for f in sorted(Path(cache).rglob("*.py")):
            text = f.read_text()
            # the C++ source handed to cpp_pybinding: r'''...''' (the module around it also
            # holds example inputs of the first call's sizes, which are not the kernel)
            if "cpp_pybinding" in text:
                kernels += [part.split("'''")[0] for part in text.split("r'''")[1:]]
        return float(r.stdout.split()[-1]), sorted(kernels)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", default="7x8", help="rows x columns of the first call (default 7x8)")
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--width", type=int, default=3072)
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per variant, in turn (default 3)")
    a = p.parse_args()
    try:
        n, m = (int(v) for v in a.first.split("x"))
    except ValueError:
        p.error("--first must be ROWSxCOLUMNS, e.g. 7x8")
    if min(n, m, a.rows, a.width, a.repeat) < 1:
        p.error("sizes and --repeat must be at least 1")
    import statistics

    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from bertscope.bench.machine import cpu_label, machine

    mach = machine()
    big = f"{a.rows}x{a.width}"
    print(f"{cpu_label(mach)}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"first call {a.first}, then {big}; {a.repeat} fresh processes per variant, in turn\n")
    variants = (("plain", a.first, f"`torch.compile(dynamic=True)`, first call {a.first}"),
                ("bertscope", a.first, f"`quant._compile` (+ `cpp.dynamic_threads`), first call {a.first}"),
                ("bertscope", big, f"`quant._compile`, first call {big} (the reference)"))
    times: list[list[float]] = [[] for _ in variants]
    kernels: list[set[tuple[str, ...]]] = [set() for _ in variants]  # the distinct sources each variant generated
    try:
        for _ in range(a.repeat):
            for i, (how, first, _label) in enumerate(variants):
                ms, generated = probe(how, first, a.rows, a.width)
                times[i].append(ms)
                kernels[i].add(tuple(generated))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("| compiled with | ms per call, median (range) | kernels with a parallel region | kernel source the same as the reference's |")
    print("|---|---:|---:|---|")
    for i, (_how, _first, label) in enumerate(variants):
        # every process of the variant generated the one source the reference's processes all did
        same = "yes" if len(kernels[i]) == 1 and kernels[i] == kernels[-1] else "no"
        par = min(sum("#pragma omp parallel" in k for k in g) for g in kernels[i])
        total = max(len(g) for g in kernels[i])
        print(f"| {label} | {statistics.median(times[i]):.2f} ({min(times[i]):.2f}-{max(times[i]):.2f}) "
              f"| {par} of {total} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
