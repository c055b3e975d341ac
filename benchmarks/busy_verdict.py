"""What another job on the machine does to the int8 speed verdict, and what bertscope makes of it.

    PYTHONPATH=src python benchmarks/busy_verdict.py [--loads 3] [--spinners N] [--out FILE.json]

Each load is ``bertscope.load(bundled, precision="int8", keep_precision=True)`` in a fresh kernel
choice cache, so it measures everything a first use measures: the kernel choice, then the
calibrated int8 plan's speed against fp32 (the verdict that turns int8 off where it is no
faster). Loads alternate between a quiet machine and one where ``--spinners`` other processes
(default: one per CPU this process may use) spin in pure Python, the kind of load a test suite
or a second job puts beside a user's command. For each load it records the speedup measured,
the share of the CPUs other processes took while the kernel choice and the speed were measured
(``bertscope.fast.tuning.others_share``, from /proc), and whether the choice was cached: on a
busy machine it must not be (``BERTSCOPE_BUSY_SHARE``, default 0.3).

Run it with nothing else running (it makes its own load): ``flock /work/cpu.lock`` here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.core.checkpoint import bundled_model_path  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402
from bertscope.fast import tuning  # noqa: E402

SPIN = "while True: pass"


def one_load(busy: int) -> dict:
    """One first use of int8 in a fresh cache, with ``busy`` spinning processes beside it."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        if spinners:
            time.sleep(0.5)  # the interpreters start and spin
        with tempfile.TemporaryDirectory(prefix="bertscope-busy-") as cache:
            os.environ["BERTSCOPE_CACHE_DIR"] = cache
            t = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                b = bertscope.load(bundled_model_path(), precision="int8", keep_precision=True)
            seconds = time.perf_counter() - t
            choice = b.fast.choice
            cached = list(Path(cache, "kernel-choice").glob("*.json")) if Path(cache, "kernel-choice").is_dir() else []
            stored = json.loads(cached[0].read_text()) if cached else {}
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    note = b.precision_note
    measured = None
    if "x the speed of fp32" in note:  # "...; 1.75x the speed of fp32 on the calibration texts"
        measured = float(note.split("x the speed of fp32")[0].rsplit(" ", 1)[-1])
    return {"spinners": busy, "choice_busy": choice.busy, "speedup": measured,
            "choice_cached": bool(cached), "verdict_cached": bool(stored.get("int8_speedup")),
            "precision_note": note, "seconds": round(seconds, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", type=int, default=3, help="loads per condition (default 3)")
    p.add_argument("--spinners", type=int, default=None,
                   help="spinning processes on the busy side (default: one per CPU this process may use)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    if a.loads < 1:
        p.error("--loads must be at least 1")
    if a.spinners is not None and a.spinners < 1:
        p.error("--spinners must be at least 1")
    if a.out:
        check_output_file(a.out, suffixes=(".json",))
    if os.environ.get("BERTSCOPE_BUSY_SHARE"):
        p.error("unset BERTSCOPE_BUSY_SHARE: this measures what the default does")
    spinners = a.spinners or len(os.sched_getaffinity(0))
    m = machine()
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{a.loads} loads quiet and {a.loads} with {spinners} spinning processes, alternating\n")
    rows = []
    for i in range(a.loads):
        for busy in (0, spinners):
            r = one_load(busy)
            rows.append(r)
            share = "n/a" if r["choice_busy"] is None else f"{r['choice_busy']:.0%}"
            print(f"load {i + 1}, {'busy' if busy else 'quiet'}: int8 {r['speedup']}x fp32; others took {share} "
                  f"of the CPUs while the choice was measured; choice cached: {r['choice_cached']}; "
                  f"speed verdict cached: {r['verdict_cached']}")
    print("\n| machine | loads | int8 speed / fp32 (median, range) | others' share (median) | choices cached |")
    print("|---|---:|---|---:|---:|")
    for label, busy in (("quiet", 0), (f"{spinners} spinning process{'es' if spinners > 1 else ''}", spinners)):
        rs = [r for r in rows if r["spinners"] == busy]
        sp = [r["speedup"] for r in rs if r["speedup"] is not None]
        sh = [r["choice_busy"] for r in rs if r["choice_busy"] is not None]
        sp_txt = f"{statistics.median(sp):.2f}x ({min(sp):.2f}-{max(sp):.2f})" if sp else "n/a"
        sh_txt = f"{statistics.median(sh):.0%}" if sh else "n/a"
        print(f"| {label} | {len(rs)} | {sp_txt} | {sh_txt} | {sum(r['choice_cached'] for r in rs)} of {len(rs)} |")
    if a.out:
        write_text_atomic(a.out, json.dumps({"machine": m, "busy_share_limit": tuning.busy_limit(),
                                             "spinners": spinners, "loads": rows}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a BertscopeError: one line, exit 2
