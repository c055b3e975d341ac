"""S13: the cost of attention alone and of the whole model against the length T.

Shape legend: H heads, D head size, C = H·D hidden size, T tokens (batch of 1).

Time is the median of repeated runs. Peak memory is measured in a fresh process (CPU: resident
memory sampled while each T runs, with glibc told to map and unmap large blocks so resident
memory follows live tensors; CUDA: the allocator's own peak). Exponents are fitted on log-log
axes; a memory exponent is not fitted when some peak is too small to be more than noise.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..core.config import BertConfig
from .timing import median_time

__all__ = ["MIN_FIT_MIB", "MIN_TIME_GROWTH", "fit_exponent", "memory_fit", "scaling", "time_fit"]

log = logging.getLogger(__name__)


class Units:
    """The measured units at T tokens (batch of 1) for one config: attention alone (the L x L
    part on random q, k, v: scores, softmax, context, reference path) or the whole model (the
    packed fast path, as ``Bert`` runs it). The model is built once, on first need."""

    def __init__(self, config: BertConfig, device: str = "cpu") -> None:
        self.config, self.device = config, device
        self._model = None
        self._fast = None

    def __call__(self, kind: str, T: int):
        """A no-argument function running one unit of ``kind`` at T tokens."""
        from ..core.attention import attention_reference

        torch.manual_seed(0)
        H, D = self.config.num_attention_heads, self.config.head_size
        if kind == "attention":
            q, k, v = (torch.randn(1, H, T, D, device=self.device) for _ in range(3))  # (1, H, T, D)
            return lambda: attention_reference(q, k, v)
        if self._model is None:
            from ..core.model import BertModel
            from ..fast.encoder import PackedEncoder

            self._model = BertModel(self.config).eval().to(self.device)
            self._fast = PackedEncoder()
        model, fast = self._model, self._fast
        ids = torch.randint(1000, min(2000, self.config.vocab_size), (1, T), device=self.device)  # (1, T)

        def run():
            with torch.inference_mode():
                return fast.forward(model, ids).last_hidden_state  # (1, T, C)
        return run


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory_worker(config: dict, kind: str, lengths: list[int]) -> list[float]:
    """Run in a fresh process: peak resident memory growth (MiB) while running each T.

    The parent starts this process with MALLOC_MMAP_THRESHOLD_ set low, so every large tensor
    is mapped on allocation and unmapped on free: resident memory then follows live tensors.
    A thread samples /proc/self/statm while the measured function runs.
    """
    import threading

    units = Units(BertConfig(**config))
    out = []
    for T in lengths:
        fn = units(kind, T)
        with torch.inference_mode():
            fn()  # warm-up: lazily created buffers are not the peak we want
        peak = 0
        for _ in range(3):
            base = _rss_bytes()
            samples = [base]
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    samples.append(_rss_bytes())
                    time.sleep(0.0002)

            th = threading.Thread(target=sample)
            th.start()
            with torch.inference_mode():
                res = fn()
            samples.append(_rss_bytes())
            stop.set()
            th.join()
            del res
            peak = max(peak, max(samples) - base)
        out.append(peak / 2 ** 20)
    return out


def memory_main() -> None:
    """Entry point of the worker process :func:`_peak_memory` starts: its one JSON line on
    stdout is the reply (the one print in the library: this runs as its own program)."""
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    print(json.dumps(_memory_worker(spec["config"], spec["kind"], spec["lengths"])))


def _peak_memory(config: BertConfig, kind: str, lengths: list[int], threads: int) -> list[float] | None:
    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    spec = json.dumps({"config": config.to_dict(), "kind": kind, "lengths": lengths, "threads": threads})
    try:
        r = subprocess.run([sys.executable, "-c", "from bertscope.bench.scaling import memory_main; memory_main()", spec],
                           capture_output=True, text=True, env=env, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:  # memory is reported as missing, the benchmark goes on
        log.warning("peak-memory worker (%s) could not run: %s", kind, e)
        return None
    lines = r.stdout.strip().splitlines()
    try:
        if r.returncode == 0 and lines:
            return [float(v) for v in json.loads(lines[-1])]
    except (ValueError, TypeError):
        pass
    why = (f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit status {r.returncode}"
           if r.returncode else f"its last line is not a list of numbers: {lines[-1][:200]!r}" if lines
           else "no result printed")
    said = next((line.strip() for line in reversed(r.stderr.strip().splitlines()) if line.strip()), "")
    log.warning("peak-memory worker (%s) failed, %s%s; peak memory is left out", kind, why,
                f": {said}" if said else "")
    log.debug("peak-memory worker stderr:\n%s", r.stderr)
    return None


MIN_FIT_MIB = 0.05  # peak-memory values at or below this are noise: no exponent is fitted
MIN_TIME_GROWTH = 1.5  # the longest input must take this many times the shortest's time to fit an exponent


def time_fit(entry: dict, lengths: list[int], times: list[float]) -> None:
    """Add the time exponent to ``entry`` when the times grow measurably with T: the longest
    input takes at least MIN_TIME_GROWTH x the shortest's time and the fit is not negative.
    Otherwise (a tiny model, where a call's fixed overhead hides the work) ``time_exponent`` is
    None, with a note saying why: an exponent fitted to overhead and noise means nothing."""
    growth = times[-1] / times[0] if times and times[0] > 0 else float("nan")
    exponent = fit_exponent(lengths, times) if growth >= MIN_TIME_GROWTH else None
    if exponent is None or not exponent >= 0:
        entry["time_exponent"] = None
        entry["time_exponent_note"] = (f"n/a: T = {lengths[-1]} took {growth:.2f}x the time of T = {lengths[0]}, "
                                       "too little growth to fit (fixed per-call overhead dominates)")
        return
    entry["time_exponent"] = exponent


def memory_fit(entry: dict, lengths: list[int], mem: list[float] | None) -> None:
    """Add the memory exponent (and 512-vs-192 ratio) to ``entry`` when every value is large
    enough to fit; otherwise ``memory_exponent`` is None, with a note saying why."""
    if not mem:
        return
    if min(mem) <= MIN_FIT_MIB:
        entry["memory_exponent"] = None
        entry["memory_exponent_note"] = f"n/a: some peaks are at most {MIN_FIT_MIB} MiB, too small to fit"
        return
    entry["memory_exponent"] = fit_exponent(lengths, mem)
    if "ratio_512_vs_192" in entry:
        entry["memory_ratio_512_vs_192"] = mem[lengths.index(512)] / mem[lengths.index(192)]


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def scaling(config: BertConfig, lengths: Sequence[int], threads: int, device: str = "cpu",
            memory: bool = True) -> dict:
    """S13: time (and peak memory) of attention alone and of the whole model against T."""
    lengths = sorted(lengths)
    out: dict = {"lengths": list(lengths), "seed_claim_512_vs_192": (512 / 192) ** 2}
    units = Units(config, device)
    for kind in ("attention", "model"):
        times = [median_time(units(kind, T), device=device) for T in lengths]
        entry: dict = {"time_s": times}
        time_fit(entry, lengths, times)
        if 192 in lengths and 512 in lengths:
            entry["ratio_512_vs_192"] = times[lengths.index(512)] / times[lengths.index(192)]
        if memory and device != "cpu":  # CUDA: the allocator's own peak, per T
            mem = []
            for T in lengths:
                fn = units(kind, T)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fn()
                torch.cuda.synchronize()
                mem.append((torch.cuda.max_memory_allocated() - base) / 2 ** 20)
            entry["peak_mib"] = mem
            memory_fit(entry, lengths, mem)
        if memory and device == "cpu":
            mem = _peak_memory(config, kind, list(lengths), threads)
            entry["peak_mib"] = mem
            memory_fit(entry, lengths, mem)
        out[kind] = entry
    return out
