"""Why the compiled int8 steps were sometimes slow: inductor's loops and the size of the first call.

    PYTHONPATH=src python benchmarks/compiled_first_call.py [--first 7x8] [--rows 2048] [--width 3072]

Inductor decides, when it compiles a CPU loop, whether to run it on several threads, from the
sizes of the first call (under about 512 elements per thread it writes a one-thread loop); with
``dynamic=True`` that code then serves every later size, and inductor's on-disk cache hands it
to later processes too. This script compiles one int8 epilogue (``quant._rescale``: Δ·y + lo·Ŵ·1
+ b) twice, each in a fresh inductor cache, first called on ``--first`` rows x columns: once
with plain ``torch.compile(dynamic=True)`` and once with bertscope's ``quant._compile`` (the same
plus ``cpp.dynamic_threads``), each in its own process. It then times each on a ``--rows`` x
``--width`` input (median of 30 calls) and counts the generated kernels that have a parallel region.
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", default="7x8", help="rows x columns of the first call (default 7x8)")
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--width", type=int, default=3072)
    a = p.parse_args()
    try:
        n, m = (int(v) for v in a.first.split("x"))
    except ValueError:
        p.error("--first must be ROWSxCOLUMNS, e.g. 7x8")
    if min(n, m, a.rows, a.width) < 1:
        p.error("sizes must be at least 1")
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from bertscope.bench.machine import machine

    mach = machine()
    print(f"{mach['cpu']} ({', '.join(mach['cpu_flags'])}), {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"first call {a.first}, then {a.rows} x {a.width}\n")
    print("| compiled with | ms per call | generated kernels with a parallel region |")
    print("|---|---:|---:|")
    for how, label in (("plain", "torch.compile(dynamic=True)"), ("bertscope", "quant._compile (+ cpp.dynamic_threads)")):
        with tempfile.TemporaryDirectory(prefix="bertscope-first-call-") as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache,
                       PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
            r = subprocess.run([sys.executable, "-c", CHILD, how, a.first, str(a.rows), str(a.width)],
                               env=env, capture_output=True, text=True)
            if r.returncode:
                print(f"error: the {how} probe failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}",
                      file=sys.stderr)
                return 1
            compiled_ms = float(r.stdout.split()[-1])
            codes = [f.read_text() for f in Path(cache).rglob("*.py") if "cpp_pybinding" in f.read_text()]
            par = sum("#pragma omp parallel" in c for c in codes)
            print(f"| {label} | {compiled_ms:.2f} | {par} of {len(codes)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
