"""The machine a benchmark runs on: what it is (CPU model and flags, versions) and its
measured matrix-multiply peak, the bar useful GFLOP/s are held against.

Shape legend: M, K, N the sides of a product (M x K)·(K x N).
"""

from __future__ import annotations

import os
import platform
import time
from typing import Callable

import torch

from ..fast.tuning import CPU_FLAGS, cpu_flags, cpu_id, cpu_name, describe_cpu, isa_limits, usable_cpus

__all__ = ["CPU_FLAGS", "PEAK_SHAPES", "best_rate", "cpu_flags", "cpu_label", "cpu_name", "machine", "matmul_peak",
           "onednn_matmul_peak", "sync"]

PEAK_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 768, 3072))  # (M, K, N)


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


_SYSTEMS = ("transformers", "sentence_transformers", "onnxruntime", "numpy")


def _version(module: str) -> str | None:
    """``module``'s version: the imported module's own, else that of the installed distribution
    that provides it (read without importing it: importing transformers, sentence-transformers
    and ONNX Runtime took 11.6 s on a 2-CPU machine, for a line in a JSON file), else, for a
    module found without a distribution's records, its own after importing it; None when it
    cannot be imported."""
    import importlib
    import importlib.util
    import sys
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    for dist in packages_distributions().get(module, ()):  # onnxruntime, onnxruntime-gpu, ...
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    try:
        if importlib.util.find_spec(module) is None:
            return None
        return str(importlib.import_module(module).__version__)
    except (ImportError, AttributeError, ValueError):
        return None


def machine() -> dict:
    """CPU, flags, threads, platform and the versions of every system compared."""
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions.update({mod: _version(mod) for mod in _SYSTEMS})
    info = {"cpu": cpu_name(), "cpu_id": cpu_id(), "cpu_flags": cpu_flags(), "isa_limits": isa_limits(), "logical_cpus": os.cpu_count(),
            "usable_cpus": usable_cpus(),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform(), "versions": versions}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def cpu_label(m: dict) -> str:
    """How a figure names its machine: "AMD EPYC (family 26, model 2, stepping 1; avx2, avx512f, ...)"
    from :func:`machine`'s dict (the numbers tell apart CPUs a VM shows under one name). Where the
    libraries were told to act as a smaller CPU (``isa_limits``), the label says so after the flags:
    "...; limited by ONEDNN_MAX_CPU_ISA=AVX2, ATen dispatching AVX2"."""
    flags = ", ".join(m.get("cpu_flags") or []) or "none of the tracked flags"
    ident = describe_cpu(m.get("cpu_id"))
    isa = m.get("isa_limits") or {}
    limits = {k: v for k, v in isa.items() if k != "aten"}
    limited = ("; limited by " + ", ".join(f"{k}={v}" for k, v in limits.items())
               + f", ATen dispatching {isa.get('aten')}") if limits else ""
    return f"{m['cpu']} ({ident + '; ' if ident else ''}{flags}{limited})"


def best_rate(run: Callable[[], object], flop: float, seconds: float, device: str) -> float:
    """GFLOP/s of ``run`` at its 10th-percentile time over ``seconds`` (load only ever slows)."""
    run()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - t)
    return flop / sorted(times)[len(times) // 10] / 1e9


def matmul_peak(n: int | None = None, seconds: float = 1.0, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> float:
    """The machine's measured matmul peak in GFLOP/s through torch.mm: the best over square
    1024³ and 2048³ and BERT-base's feed-forward shape (4096, 768) x (768, 3072), each rated at
    its 10th-percentile time. ``n`` measures one n x n x n product instead."""
    shapes = PEAK_SHAPES if n is None else ((n, n, n),)
    best = 0.0
    for M, K, N in shapes:
        a = torch.randn(M, K, device=device, dtype=dtype)
        b = torch.randn(K, N, device=device, dtype=dtype)
        best = max(best, best_rate(lambda: torch.mm(a, b), 2 * M * K * N, seconds / len(shapes), device))
    return best


def onednn_matmul_peak(n: int | None = None, seconds: float = 1.0) -> float | None:
    """The same products through oneDNN with a pre-packed weight, as the packed path can run
    them on CPU (None where this torch has no such op)."""
    from ..fast.gemm import Linear, onednn_linear_available

    if not onednn_linear_available():
        return None
    shapes = PEAK_SHAPES if n is None else ((n, n, n),)
    best = 0.0
    for M, K, N in shapes:
        x = torch.randn(M, K)
        lin = Linear(torch.randn(N, K), torch.zeros(N), "onednn")
        best = max(best, best_rate(lambda: lin(x), 2 * M * K * N, seconds / len(shapes), "cpu"))
    return best
