"""Page faults per call with glibc's heap kept (the default) and left to glibc's defaults.

    PYTHONPATH=src python benchmarks/heap_faults.py [--calls 6] [--repeat 1] [--model bert-base|bundled] \
        [--fresh-weights] [--out FILE.json]

``bertscope.fast.heap.keep_heap`` fixes glibc's mmap threshold at 32 MiB and its trim threshold
at 256 MiB when the fast path first runs on the CPU; ``BERTSCOPE_HEAP=system`` leaves glibc's
defaults (trim threshold 64 MiB at most). This script embeds the bench's T = 128 workload (32
texts of 128 tokens; BERT-base size with random weights, or the bundled model with
``--model bundled``) ``--calls`` times in fp32, in int8 and in int8 with ``compile=True``, each
in a fresh process of its own, under both settings (``--repeat`` processes each, in turn: with
glibc's defaults, whether a process faults on every call differs from one process to the next).

Every process loads its kernel choice from a cache that a first process per variant filled (so,
as for a user's second run, no race runs before the calls). With ``--fresh-weights`` each
process first makes its own random-weight checkpoint, as the bench's process does, which leaves
the heap in another state. It reports, per process, the minor page faults of each call after the
first (``getrusage``), the median seconds per call, and the free memory at the top of glibc's
heap after the last call (``mallinfo2``'s keepcost: what the heap would give back at a trim).

The processes run one after another; nothing else should run on the machine (times are
reported, but the faults are the point: one process's calls are not paired with another's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertscope.bench.machine import machine  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.errors import BertscopeError  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402

VARIANTS = {"fp32": ("fp32", False), "int8": ("int8", False), "int8 compiled": ("int8", True)}

CHILD = r"""
import ctypes, json, os, resource, sys, time
from pathlib import Path
import bertscope
from bertscope.bench.corpus import make_texts, save_random_checkpoint
from bertscope.core.checkpoint import bundled_model_path
from bertscope.core.config import BertConfig

model, precision, compile_, calls, work = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5]
fresh = sys.argv[6] == "1"
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if model == "bundled":
    folder = bundled_model_path()
else:
    folder = Path(work) / (f"{model}-{os.getpid()}" if fresh else model)
    if not folder.exists():  # with fresh weights, made in this process, as the bench's own process does
        save_random_checkpoint(BertConfig.preset(model), folder, bundled_model_path())
bert = bertscope.load(folder, precision=precision, compile=compile_)
texts = make_texts(bert.tokenizer, [128] * 32, seed=2)
faults, seconds = [], []
for _ in range(calls):
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    bert.embed(texts)
    seconds.append(time.perf_counter() - t0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
choice = bert.fast.choice
if fresh and model != "bundled":
    import shutil
    shutil.rmtree(folder)  # 440 MB at BERT-base size: one per process would fill the disk
print(json.dumps({"faults": faults, "seconds": seconds, "heap_top_mib": libc.mallinfo2().keepcost / 2**20,
                  "heap": bert.fast.heap.detail if bert.fast.heap else None,
                  "choice": None if choice is None else {"source": choice.source, "batch_tokens": choice.batch_tokens,
                                                         "int8_kernel": choice.int8_kernel}}))
"""


def child(model: str, variant: str, calls: int, work: Path, heap: str, fresh: bool = False) -> dict:
    precision, compile_ = VARIANTS[variant]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    env.update(BERTSCOPE_HEAP=heap, BERTSCOPE_CACHE_DIR=str(work / "cache"),
               PYTHONPATH=str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD, model, precision, "1" if compile_ else "0", str(calls), str(work),
                        "1" if fresh else "0"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise BertscopeError(f"the {variant} process (BERTSCOPE_HEAP={heap}) failed: {last}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=6, help="embed calls per process (default 6; the first is not counted)")
    p.add_argument("--repeat", type=int, default=1, help="processes per variant and setting (default 1)")
    p.add_argument("--model", default="bert-base", choices=["bert-base", "bundled"],
                   help="BERT-base size with random weights (default) or the bundled all-MiniLM-L6-v2")
    p.add_argument("--fresh-weights", action="store_true",
                   help="each process makes its own random-weight checkpoint first, as the bench's process does "
                        "(default: all load one checkpoint from disk, as a user's process does)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    if a.out:
        check_output_file(a.out, suffixes=(".json",))
    if a.calls < 2:
        p.error("--calls must be at least 2 (the first call is not counted)")
    if a.repeat < 1:
        p.error("--repeat must be at least 1")
    result = {"machine": machine(), "model": a.model, "calls": a.calls, "repeat": a.repeat,
              "fresh_weights": a.fresh_weights, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bertscope-heap-") as tmp:
        work = Path(tmp)
        for variant in VARIANTS:
            child(a.model, variant, 2, work, "keep")  # fills the kernel-choice cache (and inductor's)
            for k in range(a.repeat):
                for heap in ("system", "keep"):
                    r = child(a.model, variant, a.calls, work, heap, a.fresh_weights)
                    later = r["faults"][1:]
                    row = {"faults_per_call_median": statistics.median(later), "faults_per_call_max": max(later),
                           "seconds_median": statistics.median(r["seconds"][1:]), **r}
                    result["runs"].setdefault(f"{variant} / {heap}", []).append(row)
                    print(f"{variant:<14} BERTSCOPE_HEAP={heap:<7} process {k + 1}: faults per call (after the first) "
                          f"median {row['faults_per_call_median']:>9,.0f}  max {row['faults_per_call_max']:>9,}  "
                          f"{row['seconds_median']:.3f} s/call  heap top {r['heap_top_mib']:.0f} MiB  "
                          f"(choice {r['choice']['source'] if r['choice'] else 'none'})", flush=True)
    if a.out:
        write_text_atomic(Path(a.out), json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)
