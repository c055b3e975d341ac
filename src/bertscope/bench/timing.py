"""Timing systems side by side: outputs compared first, then medians over round-robin rounds.

Everything runs in ONE process, on the same texts, with the same thread count. Every system's
output is compared with bertscope's (max abs difference of the normalised mean-pooled
embeddings) before any time is taken. Rounds visit every system in turn, so a burst of load
from elsewhere on the machine hits all systems alike; the median is reported. Speed-ups come
two ways: the ratio of the medians, and the paired one, the median over rounds of the two
systems' time ratio within the same round (:func:`bertscope.fast.tuning.ratios`), which a
machine whose speed drifts between rounds moves less. Each timed call's minor page faults are
counted too (where the OS reports them): a system whose large blocks the C allocator maps fresh
on every call pays for it in faults, which depends on what the process allocated before.

Each timed call starts after a pause of SETTLE_S, so that no system pays for the one before it:
ONNX Runtime's threads spin for a while after each of its calls, and a call of 12 short texts
that took 67 ms took 103 ms when it came right after ONNX Runtime's (AMD EPYC Zen 4, 2 threads;
50 ms of pause was enough; docs/BENCHMARKS.md, "Order in the rounds").
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import numpy as np

from ..fast.tuning import ratios
from .machine import sync
from .quality import embedding_agreement
from .systems import Embedder

__all__ = ["SETTLE_S", "compare_and_time", "median_time", "paired_speedups"]

SETTLE_S = 0.1  # the pause before each timed call of a round (the module's docstring says why)


def minor_faults() -> int | None:
    """This process's minor page faults so far (``getrusage``), or None where the OS has no such count."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def compare_and_time(systems: dict[str, Embedder], texts: list[str], real_tokens: int, flops: float,
                     rounds: int, device: str = "cpu", reduced: Sequence[str] = ()) -> dict:
    """Check every system's output against bertscope's, then time them round-robin.

    Systems named in ``reduced`` (int8, bf16) also get ``quality_vs_fp32``: cosine to
    bertscope fp32 and top-10 neighbour overlap (:func:`bertscope.bench.quality.embedding_agreement`).
    """
    outputs = {name: f(texts) for name, f in systems.items()}  # also the warm-up run
    ref = outputs["bertscope"]
    diffs = {name: float(np.abs(o - ref).max()) for name, o in outputs.items() if name != "bertscope"}
    quality = {name: embedding_agreement(ref, outputs[name]) for name in reduced if name in outputs}
    times: dict[str, list[float]] = {name: [] for name in systems}
    faults: dict[str, list[int]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, f in systems.items():
            sync(device)
            time.sleep(SETTLE_S)  # the previous system's threads wind down first
            f0, t = minor_faults(), time.perf_counter()
            f(texts)
            sync(device)
            times[name].append(time.perf_counter() - t)
            if f0 is not None:
                faults[name].append(minor_faults() - f0)
    result = {"texts": len(texts), "real_tokens": real_tokens, "useful_gflop": flops / 1e9,
              "max_abs_diff_vs_bertscope": diffs, "quality_vs_fp32": quality, "systems": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        result["systems"][name] = {"median_s": med, "tokens_per_s": real_tokens / med,
                                   "useful_gflops": flops / med / 1e9, "times_s": ts,
                                   "minor_faults_per_call": statistics.median(faults[name]) if faults[name] else None}
    base = result["systems"]["bertscope"]["tokens_per_s"]
    result["bertscope_speedup"] = {n: base / s["tokens_per_s"] for n, s in result["systems"].items()
                                   if n != "bertscope"}
    result["bertscope_speedup_paired"] = paired_speedups(result, "bertscope")
    return result


def paired_speedups(result: dict, of: str) -> dict[str, float]:
    """{other system: median over rounds of (its time / ``of``'s time in the same round)}: how
    many times faster ``of`` is, round by round (``result`` as :func:`compare_and_time` returns)."""
    times = {n: s["times_s"] for n, s in result["systems"].items()}
    return {n: r for n, r in ratios(times, of).items() if n != of}


def median_time(fn: Callable[[], object], min_rounds: int = 3, min_seconds: float = 0.3,
                 device: str = "cpu") -> float:
    fn()
    times = []
    end = time.perf_counter() + min_seconds
    while len(times) < min_rounds or time.perf_counter() < end:
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def median_of(fn: Callable[[], object], rounds: int, warmup: int = 1) -> float:
    """The median of ``rounds`` timed calls of ``fn`` on the CPU, in seconds, after ``warmup``
    untimed ones: a fixed count, as a benchmark script's table states it."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
