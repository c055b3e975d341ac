"""``bertscope doctor``: what this machine is, and which fast-path kernels were measured to win.

The machine (CPU model, the instruction sets that decide which kernels are fast: AVX2,
AVX-512, AVX512-BF16, VNNI, AMX), torch and its threads, which of torch's kernels work here,
the C allocator's thresholds (:mod:`bertscope.fast.heap`), then per precision the kernel choice
(:mod:`bertscope.fast.tuning`): every candidate's time and the winner, from the on-disk cache or
measured now, plus what bf16 and int8 decided.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import warnings
from pathlib import Path

import torch

from ..bert import load
from ..core.checkpoint import bundled_model_path
from ..core.config import BertConfig
from ..fast.gemm import PRECISIONS, onednn_linear_available
from ..fast.heap import keep_heap
from ..fast.quant import INT8_KERNELS, int8_kernel_available, int8_range_exact
from ..fast.tuning import (cache_dir, cpu_flags, cpu_id, cpu_name, isa_limits, retuning, tuning_enabled,
                           usable_cpus)
from .corpus import save_random_checkpoint

__all__ = ["diagnose"]


def diagnose(model: str | None = None, preset: str | None = None, precisions=PRECISIONS,
             retune: bool = False) -> dict:
    """The doctor's findings as one JSON-able dict (see the module doc).

    ``model``: a checkpoint folder (default the bundled one); ``preset``: a random-weight model
    of that size. ``retune`` measures again even where a cached choice exists.
    """
    flags = cpu_flags()
    out: dict = {
        "machine": {"cpu": cpu_name(), "cpu_id": cpu_id(), "cpu_flags": flags, "isa_limits": isa_limits(), "logical_cpus": os.cpu_count(),
                    "usable_cpus": usable_cpus(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "has": {"avx2": "avx2" in flags, "avx512": "avx512f" in flags,
                            "avx512_bf16": "avx512_bf16" in flags,
                            "vnni": bool({"avx512_vnni", "avx_vnni"} & set(flags)),
                            "amx": bool({"amx_tile", "amx_bf16", "amx_int8"} & set(flags))}},
        "kernels_available": {"onednn_fp32_linear": onednn_linear_available(),
                              **{f"int8_{k}": int8_kernel_available(k) for k in INT8_KERNELS},
                              # False: that GEMM saturates on 8-bit activations here; int8 uses 7 bits
                              **{f"int8_{k}_8bit_exact": int8_range_exact(k) for k in INT8_KERNELS}},
        "cache_dir": str(cache_dir()), "tuning_enabled": tuning_enabled(), "precisions": {},
    }
    # the allocator's thresholds, as the fast path's first CPU run leaves them (bertscope.fast.heap)
    out["machine"]["heap"] = keep_heap().to_json()
    with tempfile.TemporaryDirectory(prefix="bertscope-doctor-") as tmp:
        folder = Path(model) if model else bundled_model_path()
        if preset:
            folder = save_random_checkpoint(BertConfig.preset(preset), Path(tmp) / preset, bundled_model_path())
        out["model"] = preset or str(folder)
        for precision in precisions:
            # retune: loading measures afresh; the cached choice stays until the new one replaces it
            with warnings.catch_warnings(record=True) as caught, _logged_warnings() as logged, \
                    (retuning() if retune else contextlib.nullcontext()):
                warnings.simplefilter("always", RuntimeWarning)
                bert = load(folder, precision=precision)
                with torch.inference_mode():
                    choice = bert.fast.prepare(bert.model)
            entry = {"in_use": bert.precision, "note": bert.precision_note,
                     "warnings": [str(w.message) for w in caught] + logged,
                     "choice": _rounded(choice.to_json()) if choice is not None else None}
            if bert.int8_plan is not None:
                entry["int8_calibration"] = bert.int8_plan.to_json()
            out["precisions"][precision] = entry
    return out


# a choice's measured numbers, shown to SIGNIFICANT digits (timings vary by more than that from run
# to run); measured_at, budget_s and the chosen values stay as they are
ROUNDED = ("timings", "ratios", "int8_speedup", "bf16_speedup", "busy", "gemm_gflops", "seconds")
SIGNIFICANT = 4


def _rounded(choice: dict) -> dict:
    return {k: _significant(v) if k in ROUNDED else v for k, v in choice.items()}


def _significant(v):
    if isinstance(v, float):
        return float(f"{v:.{SIGNIFICANT}g}") if math.isfinite(v) else v
    if isinstance(v, dict):
        return {k: _significant(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_significant(x) for x in v]
    return v


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _logged_warnings():
    """The warnings bertscope logs inside the block (a choice not cached, a cached one damaged,
    a machine too busy to measure), as a list of their messages: the JSON keeps them as well as
    the log. The log still gets them."""
    handler = _Collect()
    logger = logging.getLogger("bertscope")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
