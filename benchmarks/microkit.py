"""What the micro-benchmark scripts in this folder share: those that time one step, two or
more ways, on a grid of the models' shapes (``mkl_packed.py``, ``int8_gemm_rate.py``,
``act_placement.py``, ``compiled_layer_norm.py``). Their command line (``--rounds``, ``--rows``, ``--out``), the
machine line they print first, and paired round-robin timing."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from bertscope.bench.machine import cpu_label, machine
from bertscope.cli.common import check_output_file

__all__ = ["LINEAR_SHAPES", "micro_args", "paired_ratio", "round_robin"]

# every linear of the bench's two models: name -> (in features K, out features M)
LINEAR_SHAPES = {
    "BERT-base Q/K/V": (768, 2304), "BERT-base attention out": (768, 768),
    "BERT-base FFN in": (768, 3072), "BERT-base FFN out": (3072, 768),
    "MiniLM Q/K/V": (384, 1152), "MiniLM attention out": (384, 384),
    "MiniLM FFN in": (384, 1536), "MiniLM FFN out": (1536, 384),
}


def micro_args(doc: str, rounds: int, rows: tuple[int, ...] = (1024, 2048, 4096)) -> tuple[argparse.Namespace, dict]:
    """Parse a micro-benchmark's arguments (``doc`` is its --help text) and print the machine
    line; (arguments, :func:`~bertscope.bench.machine.machine`). Non-positive --rounds or
    --rows is a usage error (exit 2); an --out that is a folder or not writable raises
    InputError (one line, exit 2 under ``run_script``), before anything is timed."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=rounds, help=f"paired rounds per shape (default {rounds})")
    p.add_argument("--rows", type=int, nargs="+", default=list(rows),
                   help=f"row counts (tokens per batch) to time (default {' '.join(map(str, rows))})")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args()
    if a.rounds < 1 or any(r < 1 for r in a.rows):
        p.error("--rounds and --rows must be positive")
    if a.out:
        check_output_file(a.out, suffixes=(".json",))
    m = machine()
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    return a, m


def round_robin(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Each run once per round, in turn, for ``rounds`` rounds: {name: [seconds in round 1, ...]}.
    (Warm-up is the caller's: its first call is usually also its output check.)"""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    return times


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """The median over rounds of num's time / den's time in the same round."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))
