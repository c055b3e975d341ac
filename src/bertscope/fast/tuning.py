"""The kernel choice: which fast-path candidates win on this machine, measured, cached on disk.

What is chosen, per machine and model shape:

    gemm          "onednn" (weights pre-packed, activation fused) or "blas" (``F.linear``)
    batch_tokens  real tokens per ``embed`` batch: 1024, 2048 or 4096 (a size whose widest
                  activation reaches the heap limit is not raced: :func:`too_wide`)
    slack         padding allowed inside an attention bucket: 0 (exact length groups), 0.1, 0.3
    int8_kernel   precision "int8": oneDNN's int8 matmul or ``torch._int_mm``; when asked for
                  (``compile``), also oneDNN's with the steps around it compiled by inductor
    int8_cast     precision "int8": how quantized activations become 8-bit integers, fp32 -> uint8
                  in one copy or through int32 (:meth:`bertscope.fast.quant.Scratch.narrow`;
                  same bits)
    int8_act      precision "int8" with ``compile``: whether the compiled steps fuse W1's activation
                  into their loop or apply PyTorch's own after it
                  (:meth:`bertscope.fast.quant.CompiledSteps.epilogue`; the last bits of erf differ)
    bf16_speedup  precision "bf16": bf16 GEMMs' time against fp32 (bf16 runs only if faster)
    int8_speedup  precision "int8": the calibrated int8 plan's speed against fp32, whole model,
                  on the calibration texts (:func:`measured_speedup`; int8 runs only if faster)

Why measure: a choice that wins on one CPU loses on another. oneDNN's fp32 GEMM beat MKL by
2.3x on an AVX-512 AMD EPYC and lost to it on an AVX2-only one (146 against 168 GFLOP/s).

How: the first time a model shape meets a machine, each candidate runs ONE layer of the model
(all layers share their shapes, so the GEMMs are the model's own) on a batch of real shapes:
random tokens in sequences of mixed lengths (8 to 256 tokens, as many as fill the token budget).
The batch budget is the exception: its candidates run the first :data:`BATCH_RACE_LAYERS` layers
(all of a shallower model's). Through one layer, a 2,048-token batch cost about 9% more per
token than the same layer inside the whole model, and a 4,096-token one did not (measured, not
explained: the embeddings alone are a tenth of a layer's time), so a one-layer race credits the
larger batch with a saving the model never sees. On a 2-CPU Xeon (AMX), 4,096-token batches
measured 0.89-0.91 of 2,048's time through one layer of all-MiniLM-L6-v2 (int8, compiled
steps), 0.97 through two, 0.98-0.99 through three and 1.005-1.024 through all six, where the
whole model on the benchmark's corpus ran 1.09x slower with them. The int8 steps' race (eager
against compiled) shows no such trend there: 0.87-0.96 of the eager steps' time through one to
six layers, in no order of depth, against 0.91-0.94 for the whole model
(``benchmarks/race_depth.py``), so it runs one layer.
Rounds visit every candidate in turn, so a burst of load from elsewhere hits neighbours alike,
until the step's share of the budget (about 2 s in all, the GEMM library's step taking half) is
spent, three rounds at least. A candidate is judged by its time divided by the plain path's time
IN THE SAME ROUND, the median of those paired ratios over the rounds: a machine whose speed
drifts between rounds (a shared VM's did, by 15%) moves both sides of each ratio together, where
comparing each candidate's best time would credit whichever had the luckiest moment. The plain
path is the baseline (BLAS ``F.linear``, 2048 tokens, exact length groups), and another
candidate replaces it only if its median ratio is below ``1 - NOISE_MARGIN``: the chosen path is
never slower than the plain one beyond noise. Each race first settles the C allocator
(:func:`settle_allocator`), so a young process does not time page faults that a long-running one
never pays. (By then the fast path has usually fixed glibc's thresholds, with
:func:`bertscope.fast.heap.keep_heap`; settling is for processes where they were left alone.)
A candidate that raises is recorded with its error and never chosen. Every candidate computes
the same fp32 result within 1e-5 (tests hold each one to the padded reference); only bf16 and
int8 change results, and only when asked.

The budget: every race runs its warm-up and :data:`MIN_ROUNDS` rounds, however long they take, so a
budget can only be kept by not starting a race that cannot fit. The GEMM library (or int8 kernel,
and bf16 against fp32) is always raced: its choice is the one that moves speed most (2.3x, above).
The batch budget and the slack, which end with the plain values in most recorded choices (``python
benchmarks/count_choices.py`` counts those under benchmarks/results), are raced only when their
least time, estimated from the model's FLOPs at the host check's GEMM rate (:func:`race_cost_s`; no
clock), fits their share of the budget; otherwise ``not_raced`` says why and the plain value stays.
On the slow 2-CPU AVX2 EPYC (``bertscope doctor --precision fp32 --retune``), the bundled model's
fp32 choice took 12.9 s with every race run and 1.9 s with this rule; its int8 choice 7.5 s, 4.4 s
of it ``torch._int_mm``'s warm-up and one round (13x slower than oneDNN's int8 matmul there).
``BERTSCOPE_TUNE_BUDGET`` (seconds), or ``bertscope doctor --budget S``, gives a larger budget for a
fuller measurement, cached like any other.

Cache: one JSON file per key in ``cache_dir()/kernel-choice/``. The key is the CPU model (its name,
and its family, model and stepping numbers) and flags, logical CPUs, torch threads, torch version,
the model's shape, dtype and precision, and this module's format version. A file whose key differs
is ignored (measured again and replaced), and so is one older than ``RECHECK_S`` (a week): what a
machine does fastest can change under the same key (a VM moved to another host, a new microcode, a
different BLAS build), so the choice is measured again now and then. ``bertscope doctor --retune``
measures it at once; ``BERTSCOPE_TUNE=0`` skips measuring and uses the plain defaults. Each save
removes the folder's choices that nothing has written for ``PRUNE_S`` (30 days): a torch upgrade,
a model shape no longer used or a VM's old host leaves one file behind, never to be read again.

The host check: the key cannot tell two hosts apart that a VM presents as the same CPU (the
family number does tell a Zen 1 "AMD EPYC" from a Zen 5 one, family 23 from 26). Two
sessions' 2-CPU VMs both read "AMD EPYC", family 23 model 1, the same flags and caches, and
torch.mm ran at 83 GFLOP/s on one and 31-39 on the other, where int8 GEMMs went from no faster
than fp32 to faster. So each choice records the machine's fp32 GEMM rate when it was measured
(:func:`gemm_rate`, about 0.1 s), and a cached choice is used only while a fresh probe finds the
rate within ``HOST_SPEED_CHANGE`` (2x either way) of it; otherwise it is measured again. The
slower of those two VMs read 26.9 to 40.4 GFLOP/s in four probes of 0.05 s within an hour
(1.5x), and a shared VM drifted by 15% elsewhere: inside 2x, so drift does not trigger a new
race. A change of host smaller than 2x is caught a week later, by ``RECHECK_S``.

One probe is not enough either way. In a CI run on the slower VM, the probe taken while a choice
was measured read 26.9 GFLOP/s, and the one at the next load, a minute later, 58.6 (2.2x): the
cached choice was measured again for nothing. So the rate recorded is the better of a probe
before the races and one after them, and a probe that finds the rate moved over 2x is confirmed
by a longer one (``CONFIRM_S``, 0.5 s; the better of the two counts) before the choice is
measured again.


A busy machine: a race on a machine where another job runs times that job as much as the
candidates (on the 2-CPU Zen 5 EPYC, a new user's review saw int8 measured at 0.47x fp32 with a
test suite running beside it, 1.75x on the quiet machine minutes before). So the CPU time other processes take on this
process's CPUs is read from /proc before and after each measurement (:func:`cpu_ticks`,
:func:`others_share`: on the 2-CPU Zen 5 EPYC with 2 torch threads, one spinning process read
0.36-0.39, two 0.50-0.51; others' work on CPUs this process leaves idle does not count). A choice, or an
int8 speed verdict, measured while others took more than :data:`BUSY_SHARE` holds for that run
only and is not cached (a warning, and ``doctor``, say so); the next run measures again
(``BERTSCOPE_BUSY_SHARE`` sets another limit; 1 caches whatever was measured, for a machine that
is never quiet). And a
host check whose probe reads more than 2x slower while others are busy keeps the cached choice:
load, not another host (a faster reading still measures again, unless the cached rate itself was
read while others were busy: then the faster reading is the quiet machine's). The host check
judges "busy" by :data:`BUSY_SHARE` whatever ``BERTSCOPE_BUSY_SHARE`` says.

Threads: /proc cannot tell this process's threads apart from the measurement's (its candidates
run on torch's threads), so the work of the process's other threads counts as its own there. On
the 2-CPU Xeon, three threads each loading the bundled model and embedding at once measured three
choices side by side, at half the quiet GEMM rate, picked two different libraries, and cached the
last one as measured on a quiet machine (busy 0). So a process measures one choice at a time
(:func:`measuring`; a thread that waited finds what the one before it cached), and every model
run is marked (:mod:`bertscope.core.activity`): a choice or a speed verdict measured while
another thread of the process ran a model holds for that run only and is not cached
(``busy_threads``), and a host check whose probe reads slow while they do keeps the cached
choice."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import platform
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..core.activity import ProcessLock
from ..errors import BertscopeError
from ..files import write_text_atomic
from .gemm import GemmBackend
from .packing import PackedBatch, pack_ids

__all__ = ["BASELINE", "CONFIRM_S", "CPU_FLAGS", "FORMAT", "HEAP_BLOCK_LIMIT", "HOST_SPEED_CHANGE", "KernelChoice", "MIN_ROUNDS", "NOISE_MARGIN", "PRUNE_S", "RECHECK_S",
           "BUSY_SHARE", "TuningError", "busy_limit", "busy_note", "threads_note", "too_busy", "measuring", "cache_dir", "choice_key", "prune_cache", "cpu_ticks", "others_share", "parse_budget", "race_cost_s", "tune_budget",
           "act_runs", "cpu_flags", "cpu_id", "cpu_name", "describe_cpu", "forget_choice", "gemm_rate", "host_changed", "isa_limits", "load_choice", "measure_choice", "measured_speedup", "choose",
           "settle_allocator", "too_wide", "tuning_enabled", "usable_cpus"]

log = logging.getLogger(__name__)

# bump when what is measured changes: older cache files are then re-measured
# (4: races start with the allocator settled, see settle_allocator; 5: the 8-bit conversion
# raced; 6: batch sizes at or over the heap limit left out, see too_wide; 7: batch sizes raced
# through BATCH_RACE_LAYERS layers; 8: the activation's place on the compiled int8 steps raced;
# 9: the GEMM rate recorded, for the host check)
FORMAT = 9
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
NOISE_MARGIN = 0.05  # a candidate must beat the plain path by more than 5% to replace it
HOPELESS = 2.0  # a candidate this many times the fastest one's time in a round runs no more rounds
BUDGET_S = 2.0  # seconds; BERTSCOPE_TUNE_BUDGET (or doctor --budget) sets another
MIN_ROUNDS = 3  # rounds every race runs, whatever its share of the budget
RECHECK_S = 7 * 24 * 3600  # a cached choice older than this is measured again
PRUNE_S = 30 * 24 * 3600  # a cache file untouched this long (a torch, model or CPU gone) is removed
HOST_SPEED_CHANGE = 2.0  # a cached choice is measured again when the GEMM rate moved this much either way
PROBE_SHAPE = (512, 768, 768)  # the host check's GEMM: rows, in, out (a BERT-base linear on 512 tokens)
PROBE_S = 0.1
CONFIRM_S = 0.5  # a probe that finds the rate moved over HOST_SPEED_CHANGE is confirmed by this longer one
BUSY_SHARE = 0.3  # other processes took more of our CPUs than this while measuring: not cached
BATCH_TOKENS = (1024, 2048, 4096)
BATCH_RACE_LAYERS = 3  # layers the batch-budget candidates run (the other steps: one)
SLACKS = (0.0, 0.1, 0.3)
BASELINE = {"gemm": "blas", "batch_tokens": 2048, "slack": 0.0, "int8_kernel": "onednn", "int8_cast": "direct",
            "int8_act": "fused"}


def cpu_name() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


CPU_ID_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping"}


def cpu_id(cpuinfo: str | None = None) -> dict:
    """The CPU's vendor, family, model and stepping (from /proc/cpuinfo, or the given text; empty
    where they cannot be read). A VM can show very different CPUs under one model name: two of
    ours read "AMD EPYC" with family 23 (Zen 1) and family 26 (Zen 5), and their GEMMs ran 2.7x
    apart or more; these numbers tell them apart in the cache key and next to every figure."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    out: dict = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if out:
                break  # the first processor's block is enough
            continue
        name, _, value = line.partition(":")
        field = CPU_ID_FIELDS.get(name.strip())
        if field and field not in out:
            value = value.strip()
            out[field] = int(value) if value.isdigit() else value
    return out


def describe_cpu(ident: dict | None) -> str:
    """"family 26, model 2, stepping 1" (what of it is known), or "" for an empty id."""
    return ", ".join(f"{k} {ident[k]}" for k in ("family", "model", "stepping") if k in (ident or {}))


def cpu_flags() -> list[str]:
    """Which of :data:`CPU_FLAGS` this CPU has (from /proc/cpuinfo; empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in CPU_FLAGS if f in have]
    except OSError:
        pass
    return []


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")) -> int:
    """The CPUs this process can use, at least 1: those of its affinity mask (``taskset``,
    ``docker --cpuset-cpus``), fewer where a cgroup CPU quota caps it (``docker --cpus 2`` on a
    64-CPU host gives 2, rounded up; a systemd ``CPUQuota=`` or a batch scheduler's limit alike).
    ``os.cpu_count()`` counts the host's CPUs, and a pool or a thread count sized by it
    oversubscribes a container. ``cgroup`` is where the cgroup file systems are mounted and
    ``own`` names this process's cgroups (:func:`_cgroup_quota`)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup, own)
    if quota is not None:
        n = min(n, math.ceil(quota - 1e-9))
    return max(1, n)


def _cgroup_quota(root: Path, own: Path) -> float | None:
    """The tightest CPU quota, in CPUs (quota / period), of this process's cgroup and every cgroup
    above it: cgroup v2's ``cpu.max`` along the unified hierarchy's path (the ``0::PATH`` line of
    ``own``), and v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under ``root/cpu`` along the
    cpu controller's path. None where there is none ("max", -1) or nothing can be read."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = []
    paths = {"v2": "/", "v1": "/"}  # unread: the mount's own folder (a container's namespace)
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if line.startswith("0::"):
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    quotas = []
    for kind, base in (("v2", root), ("v1", root / "cpu")):
        parts = [p for p in paths[kind].split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):  # this cgroup, then each one above it
            quota = _quota_in(base.joinpath(*parts[:depth]), kind)
            if quota is not None:
                quotas.append(quota)
    return min(quotas) if quotas else None


def _quota_in(folder: Path, kind: str) -> float | None:
    try:
        if kind == "v2":
            fields = (folder / "cpu.max").read_text().split()
        else:
            fields = [(folder / f).read_text().strip() for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us")]
        quota, period = float(fields[0]), float(fields[1])
    except (OSError, IndexError, ValueError):  # no file; "max 100000": no quota
        return None
    return quota / period if quota > 0 and period > 0 else None


# Environment variables that tell a library to stop at a lower instruction set than the CPU has
# (ATen's kernels, oneDNN, MKL): a machine told to act as AVX2-only must measure its own choice.
ISA_LIMIT_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def isa_limits() -> dict[str, str]:
    """The instruction-set level ATen's kernels dispatch to ("aten", e.g. AVX512 or AVX2), and the
    limits set in the environment (:data:`ISA_LIMIT_VARS`) where any are."""
    out = {"aten": str(torch.backends.cpu.get_cpu_capability())}
    out.update({v: os.environ[v] for v in ISA_LIMIT_VARS if os.environ.get(v)})
    return out


def cache_dir() -> Path:
    """Where bertscope keeps what it measures: ``BERTSCOPE_CACHE_DIR`` (a relative one taken from
    the current folder, shown absolute; a blank one as unset), else ``$XDG_CACHE_HOME/bertscope``
    (an absolute one only, as the XDG spec says), else ``~/.cache/bertscope``."""
    own = os.environ.get("BERTSCOPE_CACHE_DIR", "").strip()
    if own:
        return Path(own).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "bertscope"


def tuning_enabled() -> bool:
    return os.environ.get("BERTSCOPE_TUNE", "1") != "0"


class TuningError(BertscopeError, ValueError):
    """A setting of the kernel choice that cannot be used (BERTSCOPE_TUNE_BUDGET)."""


def parse_budget(text: str) -> float:
    """A budget in seconds from ``text``: a finite number above 0, else :class:`TuningError`."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise TuningError(f"must be a finite number of seconds above 0, got {text!r}")
    return value


def tune_budget() -> float:
    """The kernel choice's time budget in seconds: ``BERTSCOPE_TUNE_BUDGET``, else :data:`BUDGET_S`."""
    raw = os.environ.get("BERTSCOPE_TUNE_BUDGET", "").strip()
    if not raw:
        return BUDGET_S
    try:
        return parse_budget(raw)
    except TuningError as e:
        raise TuningError(f"BERTSCOPE_TUNE_BUDGET {e}") from None


def race_cost_s(config, batches: list[PackedBatch], layers: int, rate: float,
                rounds: int = MIN_ROUNDS) -> float:
    """A race's least time, estimated without a clock: the warm-up and ``rounds`` rounds of one
    candidate per batch, each batch through ``layers`` layers, at ``rate`` GFLOP/s (the host
    check's probe, :func:`gemm_rate`; the layers ran at about 0.8 of it on the AMD EPYC)."""
    return (1 + rounds) * sum(config.flops(b.lengths, layers) for b in batches) / (rate * 1e9)


def choice_key(config, dtype: torch.dtype, precision: str, compile: bool = False) -> dict:
    """What a measured choice depends on (a different value means measuring again). ``compile``
    (int8 only): whether torch.compile'd candidates were raced."""
    key = {"format": FORMAT, "cpu": cpu_name(), "cpu_id": cpu_id(), "cpu_flags": cpu_flags(), "isa": isa_limits(),
           "logical_cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "model": {"hidden": config.hidden_size, "layers": config.num_hidden_layers,
                      "heads": config.num_attention_heads, "intermediate": config.intermediate_size,
                      "act": config.hidden_act},
            "dtype": str(dtype).replace("torch.", ""), "precision": precision}
    if precision == "int8" and compile:
        key["compile"] = True
    return key


APPLIED_FIELDS = ("gemm", "batch_tokens", "slack", "int8_kernel", "int8_cast", "int8_act")


@dataclass
class KernelChoice:
    """The winning candidates for one key, and what was measured to pick them.

    timings: {step: {candidate: median seconds per 1,000 tokens through one layer (the batch
             budget: through BATCH_RACE_LAYERS), or "error: ..."}}
    ratios:  {step: {candidate: median over rounds of its time / the baseline's time in that round}}
    int8_speedup: {int8 plan (its fp32 linears, its grid): that plan's whole-model speed against
        fp32, measured on the calibration texts} (precision "int8"; :func:`measured_speedup`)
    source: "measured", "cache" (read from ``path``) or "default" (nothing measured)
    measured_at: when it was measured (Unix time; a cached choice older than RECHECK_S is re-measured)
    gemm_gflops: the machine's fp32 GEMM rate when it was measured (:func:`gemm_rate`; the host check)
    not_raced: {step: why} for a step left at the plain path's value because its race would not
        fit its share of the budget (see the module doc)
    budget_s: the budget it was measured within
    busy: the share of this process's CPUs that other processes took while it was measured
        (:func:`others_share`; None where unknown). Over :data:`BUSY_SHARE` it is not cached.
    busy_threads: model runs that other threads of this process made while it was measured
        (:mod:`bertscope.core.activity`); above 0 it is not cached either.
    """

    gemm: str = BASELINE["gemm"]
    batch_tokens: int = BASELINE["batch_tokens"]
    slack: float = BASELINE["slack"]
    int8_kernel: str = BASELINE["int8_kernel"]
    int8_cast: str = BASELINE["int8_cast"]
    int8_act: str = BASELINE["int8_act"]
    bf16_speedup: float | None = None
    int8_speedup: dict = field(default_factory=dict)
    key: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    ratios: dict = field(default_factory=dict)
    source: str = "default"
    measured_at: float | None = None
    gemm_gflops: float | None = None
    not_raced: dict = field(default_factory=dict)
    budget_s: float | None = None
    busy: float | None = None
    busy_threads: int = 0
    seconds: float = 0.0
    path: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def applied(self) -> dict:
        """The fields that change the numbers a model computes with this choice (what
        :meth:`PackedEncoder.apply` uses, the attention slack, and the batch budget where the
        caller leaves it to the choice): a job resumed in another process records them and
        computes with them again (:meth:`PackedEncoder.record`, :meth:`PackedEncoder.restore`)."""
        return {name: getattr(self, name) for name in APPLIED_FIELDS}

    @classmethod
    def from_json(cls, d: dict) -> "KernelChoice":
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


def _cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "kernel-choice" / f"{digest}.json"


MAX_CACHE_FILE = 1 << 20  # bytes; a choice is a few KiB: a larger file is not one of ours


def _number(v: object, low: float = 0.0, high: float = float("inf")) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and low <= v < high


def damaged_field(choice: KernelChoice) -> str | None:
    """The first field of a cached choice that no measurement could have written (a hand edit,
    a damaged file), or None: such a file is measured again, never used or trusted."""
    from .gemm import BACKENDS
    from .quant import ACT_PLACEMENTS, CASTS, COMPILED_KERNEL, INT8_KERNELS

    positive = lambda v: _number(v) and v > 0  # noqa: E731
    checks = {
        "gemm": choice.gemm in BACKENDS,
        "batch_tokens": _number(choice.batch_tokens) and isinstance(choice.batch_tokens, int) and choice.batch_tokens >= 1,
        "slack": _number(choice.slack, 0.0, 1.0),
        "int8_kernel": choice.int8_kernel in (*INT8_KERNELS, COMPILED_KERNEL),
        "int8_cast": choice.int8_cast in CASTS,
        "int8_act": choice.int8_act in ACT_PLACEMENTS,
        "bf16_speedup": choice.bf16_speedup is None or positive(choice.bf16_speedup),
        "int8_speedup": isinstance(choice.int8_speedup, dict)
        and all(isinstance(k, str) and positive(v) for k, v in choice.int8_speedup.items()),
        "measured_at": _number(choice.measured_at),
        "gemm_gflops": choice.gemm_gflops is None or positive(choice.gemm_gflops),
        "budget_s": choice.budget_s is None or positive(choice.budget_s),
        "busy": choice.busy is None or _number(choice.busy, 0.0, 1.0 + 1e-9),
        "busy_threads": isinstance(choice.busy_threads, int) and not isinstance(choice.busy_threads, bool)
        and choice.busy_threads >= 0,
        "timings": isinstance(choice.timings, dict) and all(  # seconds, or "error: ..." for a candidate that raised
            isinstance(v, dict) and all(_number(t) or isinstance(t, str) for t in v.values())
            for v in choice.timings.values()),
        "ratios": isinstance(choice.ratios, dict) and all(
            isinstance(v, dict) and all(positive(r) for r in v.values()) for v in choice.ratios.values()),
        "not_raced": isinstance(choice.not_raced, dict) and all(isinstance(v, str) for v in choice.not_raced.values()),
    }
    return next((name for name, ok in checks.items() if not ok), None)


def load_choice(key: dict) -> KernelChoice | None:
    """The cached choice for ``key``, or None (none cached, unreadable, damaged, or made for
    another key): the caller measures again and its save replaces the file."""
    path = _cache_file(key)
    try:
        if path.stat().st_size > MAX_CACHE_FILE:
            log.info("%s is too large to be a cached kernel choice: measuring again", path)
            return None
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("key") != key:
        return None
    try:
        choice = KernelChoice.from_json(d)
    except TypeError:
        return None
    bad = damaged_field(choice)
    if bad is not None:  # hand-edited or damaged: measure again (the new choice replaces the file)
        log.warning("the cached kernel choice in %s has a damaged %r: measuring again", path, bad)
        return None
    age = time.time() - (choice.measured_at or 0.0)
    if not 0 <= age <= RECHECK_S:  # stale (or from the future: a clock that moved): measure again
        log.info("the cached kernel choice in %s is %.0f days old: measuring again", path, age / 86400)
        return None
    choice.source, choice.path = "cache", str(path)
    return choice


def forget_choice(key: dict) -> bool:
    """Remove the cached choice for ``key`` (the next use measures again); whether there was one."""
    try:
        _cache_file(key).unlink()
        return True
    except FileNotFoundError:
        return False


_CACHE_NAME = re.compile(r"[0-9a-f]{16}\.json|\.[0-9a-f]{16}\.json\..+\.tmp")  # a choice, or one half-written


def prune_cache(folder: Path, now: float | None = None) -> list[Path]:
    """Remove the choices in ``folder`` that nothing has written for :data:`PRUNE_S` (30 days),
    and temporary files that a killed write left; only files named as this module names them.
    A choice is measured again after a week anyway, so what is removed would never be read: each
    torch upgrade, model shape or VM host leaves one file behind. Returns what was removed."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            if (_CACHE_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)
                    and now - entry.stat(follow_symlinks=False).st_mtime > PRUNE_S):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:  # another process removed or replaced it: nothing to do
            continue
    if removed:
        log.info("removed %d kernel choice(s) unused for %d days from %s", len(removed), PRUNE_S // 86400, folder)
    return removed


def save_choice(choice: KernelChoice) -> None:
    """Cache ``choice`` on disk, unless it was measured while other processes took more than
    :data:`BUSY_SHARE` of the CPUs (then it holds for this process only, and the next one
    measures again). A choice read from the cache is saved whatever it recorded (it was cached
    under a higher ``BERTSCOPE_BUSY_SHARE``): only a measurement made now can be too busy."""
    if choice.source == "measured" and (too_busy(choice.busy) or choice.busy_threads):
        return
    path = _cache_file(choice.key)
    try:
        write_text_atomic(path, json.dumps(choice.to_json(), indent=1))
        choice.path = str(path)
        prune_cache(path.parent)
    except (OSError, BertscopeError) as e:  # a read-only home, a file in the folder's place: the
        log.warning("could not cache the kernel choice in %s (%s): each run measures it again (a few "  # it still holds
                    "seconds); set BERTSCOPE_CACHE_DIR to a writable folder, or BERTSCOPE_TUNE=0 to use the "
                    "plain kernels without measuring", path.parent, e)


class _FirstLayers(nn.Module):
    """A model's embeddings and first ``k`` layers (its parameters, not copies): what one
    candidate runs."""

    def __init__(self, model, k: int = 1) -> None:
        super().__init__()
        self.config = model.config
        self.embeddings = model.embeddings
        self.layers = nn.ModuleList(list(model.layers)[:k])


def synthetic_batch(config, tokens: int, max_len: int, seed: int = 0) -> PackedBatch:
    """Random tokens in sequences of mixed lengths (8 to min(256, max_len)) filling ``tokens``."""
    rng = random.Random(seed)
    hi = max(8, min(256, max_len, config.max_position_embeddings))
    ids: list[list[int]] = []
    left = tokens
    while left > 0:
        L = min(left, rng.randint(min(8, hi), hi))
        ids.append([rng.randrange(1000, config.vocab_size) if config.vocab_size > 1000 else
                    rng.randrange(1, config.vocab_size) for _ in range(L)])
        left -= L
    return pack_ids(ids)


# glibc serves a block above its mmap threshold with fresh pages from the system, faulted in on
# first touch, and returns them on free. The threshold starts at 128 KiB and rises to the size of
# the largest such block freed, up to 32 MiB: a long-running process ends up there. Freeing one
# block just under that cap first puts a young process in the same state.
_SETTLE_BYTES = 31 * 2**20
HEAP_BLOCK_LIMIT = _SETTLE_BYTES  # blocks this large or larger are mapped from the system (too_wide)


def too_wide(config, tokens: int) -> str | None:
    """Why a batch of ``tokens`` is not raced for a model of ``config``, or None.

    Its widest fp32 activation (the fused Q/K/V output, 3C wide, or the feed-forward's, I wide,
    over ``tokens`` rows rounded up to the GEMMs' row bucket) must be under the block size that
    :func:`settle_allocator` leaves glibc serving from its heap (31 MiB; glibc's dynamic mmap
    threshold never rises past 32 MiB on 64-bit systems). A larger block is mapped fresh from the
    system whenever the heap's free top cannot hold it, and paid for in page faults on first
    touch. On the AMD EPYC (docs/BENCHMARKS.md, ``benchmarks/wide_batches.py``, four runs)
    BERT-base's feed-forward linear with the compiled int8 steps took 1.37-1.89x as long per row
    at 4096 rows as at 2048 (12,289-24,578 faults per call); the whole int8 model took 0.99-1.13x
    as long with the eager steps and, in three runs of four, 1.12-1.20x with the compiled ones (in
    the fourth its 2048-token batches faulted too). A one-layer race, noisy at that margin, had
    once picked 4096 all the same. The rule reads no clock, so no CPU's speed decides it. It
    holds for glibc with its dynamic thresholds at their highest and with the thresholds that
    :func:`bertscope.fast.heap.keep_heap` fixes (mmap threshold 32 MiB). Other allocators, or
    thresholds the user fixed, may serve such blocks without faults: there it only costs a
    candidate. The smallest candidate is always raced.
    """
    from .gemm import ROW_BUCKET

    rows = -(-tokens // ROW_BUCKET) * ROW_BUCKET
    widest = rows * max(3 * config.hidden_size, config.intermediate_size) * 4  # bytes, fp32
    if widest < HEAP_BLOCK_LIMIT:
        return None
    return f"not raced: {widest / 2**20:.1f} MiB activations >= {HEAP_BLOCK_LIMIT / 2**20:.1f} MiB heap limit"


def settle_allocator() -> None:
    """Put the C allocator in the state a long-running process reaches, before timing anything.

    A race early in a young process otherwise times page faults. On the AMD EPYC (docs/
    BENCHMARKS.md), the first race after compiling measured the compiled int8 steps at 0.87-1.17
    of the eager steps' time, against 0.90-0.94 with glibc's thresholds fixed high, because
    candidates that allocate more fresh memory paid more faults. Allocating and freeing one
    block of 31 MiB (only its header page is touched) raises glibc's mmap threshold, and its trim
    threshold to twice that, as a process's own large tensors eventually do.

    The effect is process-wide and lasts: blocks up to 31 MiB then come from the heap, and up to
    62 MiB of free heap is kept before trimming. A process running bertscope reaches about that
    on its own, and only a measured choice (not a cached one) settles. Where the thresholds were
    fixed by the user (``MALLOC_MMAP_THRESHOLD_``, ``mallopt``), glibc keeps them; under another
    allocator (jemalloc, tcmalloc, musl) this is a plain allocation.
    """
    block = torch.empty(_SETTLE_BYTES, dtype=torch.uint8)
    del block


def race(candidates: dict[str, Callable[[], object]], budget_s: float, min_rounds: int = MIN_ROUNDS,
         max_rounds: int = 15, keep: str | None = None, work: dict[str, float] | None = None) -> dict:
    """Round-robin timing: {name: [seconds in round 1, round 2, ...]}, or {name: "error: ..."} for
    a candidate that raised.

    At least ``min_rounds`` rounds; then more while ``budget_s`` lasts, at most ``max_rounds``
    (a small model is measured in a fraction of the budget). Every live candidate runs once in
    every round, so the lists line up: entry i of each was measured in round i.

    A candidate that took :data:`HOPELESS` times as long as the round's fastest one or longer
    runs no more rounds (its list stops there; it still lines up with the others' first
    entries), except ``keep``, the baseline every other candidate is compared with. It could
    only be picked if it came within 5% of the baseline, and at that distance no round's noise
    (15% at most, on a shared VM) brings it there. It saves minutes where a kernel has no fast
    path on a CPU: ``torch._int_mm`` ran 40x slower than oneDNN's int8 matmul on an AVX2-only
    AMD EPYC (no VNNI), and ``bertscope doctor --preset bert-base --precision int8`` measured its
    choice in 39.1 s when it raced every round, 22.3 s when it ran one (docs/BENCHMARKS.md).

    ``work`` gives each candidate's amount of work per call (tokens) where the candidates differ
    in it, as the batch sizes do: the rule then compares time per unit of work. Compared by raw
    time, a 4,096-token batch takes about four times a 1,024-token one's time at the same speed,
    and was dropped after one round on every machine (nineteenth session, docs/BENCHMARKS.md)."""
    out: dict[str, list[float] | str] = {}
    live = dict(candidates)
    settle_allocator()
    for name, run in list(live.items()):  # warm-up (builds, packs, first-call costs), and errors
        try:
            run()
        except Exception as e:  # any candidate may fail on a machine: it is never chosen
            out[name] = f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            del live[name]
            log.warning("kernel candidate %s failed: %s", name, out[name])
    for name in live:
        out[name] = []
    end = time.perf_counter() + budget_s
    rounds = 0
    while live and (rounds < min_rounds or (time.perf_counter() < end and rounds < max_rounds)):
        for name, run in live.items():
            t = time.perf_counter()
            run()
            out[name].append(time.perf_counter() - t)
        rounds += 1
        cost = {n: out[n][-1] / (work[n] if work else 1.0) for n in live}  # seconds per unit of work
        fastest = min(cost.values())
        hopeless = [n for n in live if n != keep and cost[n] >= HOPELESS * fastest] if fastest > 0 else []
        for name in hopeless:  # (a round too fast for the clock to see judges nobody)
            log.info("kernel candidate %s took %.1fx the fastest one's time%s: no more rounds",
                     name, cost[name] / fastest, " per token" if work else "")
            del live[name]
    return out


def _rounds(v) -> list[float] | None:
    """A race entry as its list of per-round times (a bare number is one round); None for an error."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return [float(v)]
    if isinstance(v, list) and v:
        return [float(t) for t in v]
    return None


def ratios(times: dict, baseline: str) -> dict[str, float]:
    """{candidate: median over rounds of (its time / the baseline's time in the same round)}, for
    the candidates that ran; {} when the baseline did not run."""
    base = _rounds(times.get(baseline))
    if base is None:
        return {}
    out = {}
    for name, v in times.items():
        r = _rounds(v)
        if r is not None:
            n = min(len(r), len(base))
            out[name] = statistics.median(r[i] / base[i] for i in range(n))
    return out


def pick(times: dict, baseline: str) -> str:
    """The candidate with the lowest median paired ratio to ``baseline`` if that ratio is below
    ``1 - NOISE_MARGIN``, else the baseline. A baseline that failed gives way to the candidate
    with the lowest median time."""
    ok = {k: r for k, v in times.items() if (r := _rounds(v)) is not None}
    if not ok:
        return baseline
    if baseline not in ok:
        return min(ok, key=lambda k: statistics.median(ok[k]))
    rel = ratios(times, baseline)
    best = min(rel, key=rel.get)
    return best if rel[best] < 1 - NOISE_MARGIN else baseline


def measure_choice(model, *, precision: str = "fp32", budget_s: float | None = None, max_len: int = 256,
                   candidates: dict | None = None, compile: bool = False,
                   levels: dict[str, int] | None = None) -> KernelChoice:
    """Measure every candidate for ``model`` on this machine (see the module doc). ``compile``
    adds the torch.compile'd int8 steps (:data:`~bertscope.fast.quant.COMPILED_KERNEL`) to the
    int8 candidates: compiling them takes about 30 s the first time on a machine.

    ``levels`` is the dict in which the int8 candidates record the 8-bit grid each integer GEMM
    multiplies exactly here (:attr:`GemmBackend.measured_levels`); give the model's own
    backend's, and the model reuses the race's probes (and their warnings) instead of repeating
    them. By default the race keeps its own.

    ``candidates`` overrides the lists measured ({"gemm": [...], "batch_tokens": [...],
    "slack": [...], "int8_kernel": [...]}), for tests and ``doctor``. ``budget_s`` defaults to
    :func:`tune_budget`.
    """
    from .encoder import PackedEncoder
    from .quant import ACT_PLACEMENTS, CASTS, COMPILED_KERNEL, INT8_KERNELS, CompiledSteps

    cands = {"gemm": ["blas", "onednn"], "batch_tokens": list(BATCH_TOKENS), "slack": list(SLACKS),
             "int8_kernel": list(INT8_KERNELS) + ([COMPILED_KERNEL] if compile else []), "int8_cast": list(CASTS),
             "int8_act": list(ACT_PLACEMENTS)}
    cands.update(candidates or {})
    budget_s = tune_budget() if budget_s is None else budget_s
    started = time.perf_counter()
    dtype = next(model.parameters()).dtype
    one = _FirstLayers(model)
    deeper = _FirstLayers(model, BATCH_RACE_LAYERS)  # for the batch budget (see the module doc)
    deeper_layers = len(deeper.layers)
    choice = KernelChoice(key=choice_key(model.config, dtype, precision, compile), source="measured",
                          measured_at=time.time(), gemm_gflops=gemm_rate(), budget_s=budget_s)
    # the GEMM library (or int8 kernel) matters most: half the budget; the other steps share the rest
    others = 2 + (precision == "bf16")
    shares = {"gemm": budget_s / 2, "int8_kernel": budget_s / 2, "int8_cast": budget_s / 20, "int8_act": budget_s / 10}
    if precision == "int8":  # the fp32 library serves only some linears there: a smaller share
        shares["gemm"] = budget_s / 4
    per_k = lambda secs, n: secs * 1000 / n  # noqa: E731  seconds per 1,000 tokens

    def runner(make_gemm: Callable[[], GemmBackend], packed: PackedBatch, slack: float,
               layers: nn.Module = one) -> Callable[[], object]:
        encoder: list[PackedEncoder] = []  # made at the first (warm-up) call: a failure is the candidate's

        def run():
            if not encoder:
                encoder.append(PackedEncoder(gemm=make_gemm()))
            with torch.inference_mode():
                return encoder[0].encode(layers, packed, slack=slack)
        return run

    def share(step: str) -> float:
        return shares.get(step, budget_s / 2 / others)

    def timed(step: str, runs: dict, n_tokens: dict, baseline: str) -> str:
        """Race ``runs``, record their median times per 1,000 tokens and paired ratios; the pick."""
        raw = race(runs, share(step), keep=baseline, work=n_tokens)
        per_round = {k: ([per_k(t, n_tokens[k]) for t in v] if isinstance(v, list) else v) for k, v in raw.items()}
        choice.timings[step] = {k: (statistics.median(v) if isinstance(v, list) else v) for k, v in per_round.items()}
        choice.ratios[step] = ratios(per_round, baseline)
        return pick(per_round, baseline)

    # the batch the library, kernel and precision steps race on: the plain path's size, halved
    # while its activations would be mapped fresh on every call (a model wider than BERT-base)
    base_tokens = BASELINE["batch_tokens"]
    while too_wide(model.config, base_tokens) and base_tokens > 256:
        base_tokens //= 2
    base_batch = synthetic_batch(model.config, base_tokens, max_len)
    # the fp32 GEMM library (in int8 mode it serves the linears calibration keeps fp32, and the
    # whole model where int8 is declined: raced there too, as on AVX2-only CPUs oneDNN's is slower)
    runs = {g: runner(lambda g=g: GemmBackend(prefer=g), base_batch, BASELINE["slack"]) for g in cands["gemm"]}
    choice.gemm = timed("gemm", runs, {g: base_batch.num_tokens for g in runs}, BASELINE["gemm"])

    if levels is None:  # the 8-bit grid each int8 GEMM multiplies exactly: probed once, for all candidates
        levels = {}

    compiled_steps: list = []  # the compiled int8 steps, made once (about 30 s the first time on a machine)

    def shared_steps() -> CompiledSteps:
        if not compiled_steps:
            compiled_steps.append(CompiledSteps(GemmBackend(precision="int8", levels=levels).int8_levels(COMPILED_KERNEL)))
        compiled_steps[0].act_placement = choice.int8_act
        return compiled_steps[0]

    def int8_gemm(kernel: str, prefer: str = "onednn") -> GemmBackend:
        gemm = GemmBackend(prefer=prefer, precision="int8", int8_kernel=kernel, levels=levels)
        gemm.use_int8_cast(choice.int8_cast)  # the conversion raced first, for every int8 candidate
        gemm.use_int8_act(choice.int8_act)  # and so was the activation's place on the compiled steps
        if kernel == COMPILED_KERNEL:
            gemm.steps = shared_steps()  # candidates share one compiled object, as one model's linears do
        return gemm

    if precision == "int8":
        # first the 8-bit conversion (it serves either eager kernel), so that the eager kernels
        # race the compiled steps with the conversion they will use
        runs = cast_runs(cands["int8_cast"], base_tokens, model.config)
        choice.int8_cast = timed("int8_cast", runs, {c: base_tokens for c in runs},
                                 BASELINE["int8_cast"])
        if COMPILED_KERNEL in cands["int8_kernel"]:  # likewise W1's activation on the compiled steps
            runs = act_runs(cands["int8_act"], base_tokens, model.config, shared_steps)
            choice.int8_act = timed("int8_act", runs, {a: base_tokens for a in runs}, BASELINE["int8_act"])
        runs = {k: runner(lambda k=k: int8_gemm(k), base_batch, BASELINE["slack"]) for k in cands["int8_kernel"]}
        choice.int8_kernel = timed("int8_kernel", runs, {k: base_batch.num_tokens for k in runs},
                                   BASELINE["int8_kernel"])

    runs_in = precision  # the precision the remaining candidates run in

    def chosen_gemm() -> GemmBackend:
        if runs_in == "int8":
            return int8_gemm(choice.int8_kernel, prefer=choice.gemm)
        return GemmBackend(prefer=choice.gemm, precision=runs_in, int8_kernel=choice.int8_kernel)

    if precision == "bf16":  # bf16 against the fp32 winner, both on the chosen GEMM library
        runs = {"fp32": runner(lambda: GemmBackend(prefer=choice.gemm), base_batch, 0.0),
                "bf16": runner(lambda: GemmBackend(prefer="onednn", precision="bf16"), base_batch, 0.0)}
        timed("bf16", runs, {k: base_batch.num_tokens for k in runs}, "fp32")
        if "bf16" in choice.ratios["bf16"]:
            choice.bf16_speedup = 1 / choice.ratios["bf16"]["bf16"]
        # where bf16 does not run here (a CPU flag says yes, oneDNN says no) or is no faster than
        # fp32, the model will run fp32 (unless the user keeps bf16 anyway), so the batch budget
        # and slack are measured for fp32, rather than failing again or timing the other precision
        if choice.bf16_speedup is None or choice.bf16_speedup < 1 + NOISE_MARGIN:
            runs_in = "fp32"

    def affordable(step: str, race_batches: list[PackedBatch], layers: int) -> bool:
        """Whether ``step``'s race fits its share of the budget (estimated, :func:`race_cost_s`);
        if not, it is recorded as not raced and keeps the plain path's value."""
        if len(race_batches) < 2:
            return True  # one candidate: nothing to race, and it costs nothing
        need = race_cost_s(model.config, race_batches, layers, choice.gemm_gflops)
        if need <= share(step):
            return True
        choice.not_raced[step] = (f"about {need:.1f} s at {choice.gemm_gflops:.0f} GFLOP/s, over its "
                                  f"{share(step):.2g} s share of the {budget_s:g} s budget")
        log.info("kernel choice: %s not raced (%s)", step, choice.not_raced[step])
        return False

    # the rate recorded, and the one the estimates below use: the better of a probe before the
    # races and one after the GEMM races (warm threads and allocator), so one slow probe at the
    # first call neither records a rate too low nor leaves out a race that would fit
    choice.gemm_gflops = max(choice.gemm_gflops, gemm_rate())
    wide = {n: why for n in cands["batch_tokens"] if (why := too_wide(model.config, n))}
    sizes = [n for n in cands["batch_tokens"] if n not in wide] or [min(cands["batch_tokens"])]
    if sizes[0] in wide:
        log.info("every batch size is over the heap limit for this model; racing the smallest, %d tokens", sizes[0])
    batches = {n: synthetic_batch(model.config, n, max_len) for n in sizes}
    if affordable("batch_tokens", list(batches.values()), deeper_layers):
        runs = {str(n): runner(chosen_gemm, batches[n], BASELINE["slack"], deeper) for n in batches}
        choice.batch_tokens = int(timed("batch_tokens", runs, {str(n): batches[n].num_tokens for n in batches},
                                        str(BASELINE["batch_tokens"])))
        choice.timings["batch_tokens"].update({str(n): why for n, why in wide.items() if n not in batches})

    packed = batches.get(choice.batch_tokens) or synthetic_batch(model.config, choice.batch_tokens, max_len)
    if affordable("slack", [packed] * len(cands["slack"]), 1):
        runs = {str(s): runner(chosen_gemm, packed, s) for s in cands["slack"]}
        choice.slack = float(timed("slack", runs, {str(s): packed.num_tokens for s in cands["slack"]},
                                   str(BASELINE["slack"])))
    choice.seconds = time.perf_counter() - started
    log.info("kernel choice for %s measured in %.1f s: gemm %s, batch %d tokens, slack %g",
             choice.key["model"], choice.seconds, choice.gemm, choice.batch_tokens, choice.slack)
    return choice


def cast_runs(casts: list[str], rows: int, config) -> dict[str, Callable[[], object]]:
    """One timed call per route of :meth:`~bertscope.fast.quant.Scratch.narrow`: the 8-bit
    conversion of every int8 linear's input in one layer, at ``rows`` tokens (the widths C, C, C
    and I of W_QKV, W_O, W1 and W2), from fp32 values on the 8-bit grid, to uint8 (oneDNN's
    input) and to int8 (``torch._int_mm``'s), since the route serves whichever kernel wins.

    Each conversion starts with a refill of its fp32 input (the int32 route overwrites it), the
    same copy on every side; it dilutes the ratios toward 1, so a route must win by the margin
    even so (a conservative race)."""
    from .quant import Scratch

    g = torch.Generator().manual_seed(0)
    widths = (config.hidden_size,) * 3 + (config.intermediate_size,)
    src = {k: torch.rand(rows, k, generator=g).mul_(255.0) for k in set(widths)}  # (rows, K) in [0, 255)
    grids = ((torch.uint8, 0.0), (torch.int8, -128.0))  # out dtype, and the shift onto its range

    def run_for(cast: str) -> Callable[[], object]:
        scratch = Scratch(cast)

        def run():
            for k in widths:
                for dtype, shift in grids:
                    t = torch.add(src[k], shift, out=scratch.get(rows, k, torch.float32))  # narrow() may overwrite it
                    scratch.narrow(t, scratch.get(rows, k, dtype))  # (rows, K) -> 8 bits
        return run
    return {c: run_for(c) for c in casts}


def act_runs(placements: list[str], rows: int, config,
             make_steps: Callable[[], object]) -> dict[str, Callable[[], object]]:
    """One timed call per place of W1's activation on the compiled int8 steps
    (:attr:`bertscope.fast.quant.CompiledSteps.act_placement`): W1's epilogue -- rescale, offsets,
    bias, fp32 channels and the model's activation -- on a (rows, I) GEMM output, the shape it has
    in a layer. Everything else in a layer is the same for both places, so only this is timed (as
    :func:`cast_runs` times only the conversion). All places share the one steps object that
    ``make_steps`` makes at the first (warm-up) call; each call sets its own place first. Inputs
    are made in inference mode, as the encoder's are, so the compiled code is the one it uses."""
    from .gemm import ROW_BUCKET
    from .quant import FP32_CHANNELS

    rows = -(-rows // ROW_BUCKET) * ROW_BUCKET
    g = torch.Generator().manual_seed(0)
    width, k = config.intermediate_size, FP32_CHANNELS
    with torch.inference_mode():
        y = torch.randn(rows, width, generator=g).mul_(40.0)  # (rows, I): q·Ŵᵀ, 7-bit rows' products
        step = torch.rand(rows, 1, generator=g).mul_(0.05)  # (rows, 1) Δ
        lo = torch.rand(rows, 1, generator=g).neg_()  # (rows, 1)
        w_sum, bias = torch.randn(width, generator=g), torch.randn(width, generator=g)  # (I,) each
        xs, w_s = torch.randn(rows, k, generator=g), torch.randn(k, width, generator=g)  # (rows, k), (k, I)
    steps: list = []

    def run_for(placement: str) -> Callable[[], object]:
        def run():
            if not steps:
                steps.append(make_steps())
            steps[0].act_placement = placement
            with torch.inference_mode():
                return steps[0].epilogue(config.hidden_act)(y, step, lo, w_sum, bias, xs, w_s)  # (rows, I)
        return run
    return {p: run_for(p) for p in placements}


def cpu_ticks() -> tuple[int, int, int, int] | None:
    """(busy ticks, all ticks) of the CPUs this process may run on, this process's own busy ticks
    (its threads', and its finished children's: the compiler ``torch.compile`` runs), and how
    many CPUs those are, from /proc (Linux); None elsewhere. Two readings give
    :func:`others_share`."""
    try:
        stat = Path("/proc/stat").read_text().splitlines()
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    try:
        allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    except (AttributeError, OSError):
        allowed = set()
    lines = [ln.split() for ln in stat if ln.startswith("cpu")]
    mine = [f for f in lines if f[0] in allowed]  # the CPUs of this process's affinity
    cpus = len(mine)
    if not mine:  # ids that /proc/stat does not show (a container's renumbering): all of them
        mine = [f for f in lines if f[0] == "cpu"]
        cpus = sum(f[0] != "cpu" for f in lines)
    if not mine or not cpus:
        return None
    busy = total = 0
    for f in mine:
        ticks = [int(v) for v in f[1:9]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    # utime + stime, and cutime + cstime: the children waited for (g++ under torch.compile took
    # 500 of 585 busy ticks of a cold compile on a quiet machine; they are this process's work)
    return busy, total, sum(int(v) for v in own[11:15]), cpus


def others_share(before: tuple[int, int, int, int] | None, after: tuple[int, int, int, int] | None,
                 threads: int | None = None) -> float | None:
    """The share (0 to 1) of the CPUs this process needs (``threads``, default torch's) that other
    processes (and the hypervisor's steal) took between two :func:`cpu_ticks` readings; None
    where unknown. Others' work on CPUs this process leaves free does not count: a Ray actor of
    one thread beside another on a 2-CPU machine reads 0. A race on a machine where another job
    runs measures that job as much as the candidates: on the 2-CPU Zen 5 EPYC with 2 torch
    threads, one spinning process read 0.36-0.39, two 0.50-0.51 (benchmarks/busy_verdict.py)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    share = ((after[0] - before[0]) - (after[2] - before[2])) / (after[1] - before[1])
    cpus = after[3]
    need = min(cpus, threads or torch.get_num_threads())
    if need < cpus:  # others may use the CPUs this process leaves idle without slowing it
        share = (share - (cpus - need) / cpus) * cpus / need
    return min(1.0, max(0.0, share))


def busy_limit() -> float:
    """The share of the CPUs others may take while a choice is measured for it still to be cached:
    ``BERTSCOPE_BUSY_SHARE`` (0 to 1; 1 caches whatever was measured, for a machine that is never
    quiet), else :data:`BUSY_SHARE`."""
    raw = os.environ.get("BERTSCOPE_BUSY_SHARE", "").strip()
    if not raw:
        return BUSY_SHARE
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:
        raise TuningError(f"BERTSCOPE_BUSY_SHARE must be a number from 0 to 1, got {raw!r}")
    return value


def too_busy(share: float | None) -> bool:
    """Whether other processes took more of the CPUs than :func:`busy_limit` allows (unknown: no)."""
    return share is not None and share > busy_limit()


def busy_note(share: float | None, what: str = "it") -> str:
    """"other processes took 48% of the CPUs while it was measured, so it is not cached", or ""
    (``what``: what was measured, where "it" would be unclear)."""
    if not too_busy(share):
        return ""
    return (f"other processes took {share:.0%} of the CPUs while {what} was measured, so {what} is not cached "
            "(BERTSCOPE_BUSY_SHARE=1 caches it anyway)")


def gemm_rate(budget_s: float = PROBE_S, min_runs: int = 5, max_runs: int = 200) -> float:
    """This machine's fp32 GEMM rate now, in GFLOP/s: the best of repeated ``torch.mm`` runs of
    :data:`PROBE_SHAPE` on torch's current threads, until ``budget_s`` of them is spent (at least
    ``min_runs``, at most ``max_runs``, after one warm-up). The best run, not the median: a burst of load elsewhere
    slows some runs, and the host check asks what the machine can do."""
    rows, k, n = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, k, generator=gen)  # (rows, in)
    w = torch.randn(k, n, generator=gen)  # (in, out)
    torch.mm(a, w)  # warm-up: first-call costs are not the machine's rate
    best, spent, runs = float("inf"), 0.0, 0
    while runs < min_runs or (spent < budget_s and runs < max_runs):
        t0 = time.perf_counter()
        torch.mm(a, w)  # (rows, in) @ (in, out) -> (rows, out)
        t = time.perf_counter() - t0
        best, spent, runs = min(best, t), spent + t, runs + 1
    return 2 * rows * k * n / max(best, 1e-9) / 1e9


def host_changed(choice: KernelChoice, rate: float | None = None) -> str | None:
    """Why ``choice`` (cached) no longer fits this machine, or None: the fp32 GEMM rate it
    recorded and ``rate`` differ by more than ``HOST_SPEED_CHANGE`` either way. ``rate`` defaults
    to a probe now (:func:`gemm_rate`), and a probe past the threshold is confirmed by a longer
    one (``CONFIRM_S``; the better rate counts). A choice without a recorded rate is not checked."""
    if not choice.gemm_gflops:
        return None

    def change(r: float) -> float:
        return max(r / choice.gemm_gflops, choice.gemm_gflops / r)

    from ..core.activity import watching

    share = threads = None
    if rate is None:
        with watching() as watch:
            before = cpu_ticks()
            rate = gemm_rate()
            if change(rate) > HOST_SPEED_CHANGE:  # a short probe can read 2x low: confirm before acting
                rate = max(rate, gemm_rate(budget_s=CONFIRM_S))
            share = others_share(before, cpu_ticks())
        threads = watch.others
    if change(rate) <= HOST_SPEED_CHANGE:
        return None
    if rate < choice.gemm_gflops and threads:  # this process's other threads ran models: not another host
        log.info("the fp32 GEMM rate read %.1f GFLOP/s against the cached choice's %.1f while other threads of "
                 "this process ran a model: keeping the cached kernel choice", rate, choice.gemm_gflops)
        return None
    # BUSY_SHARE itself here, not BERTSCOPE_BUSY_SHARE: that setting says what may be cached, and
    # at 1 (a machine never quiet) it must not turn every busy reading into "another host"
    if rate > choice.gemm_gflops and choice.busy is not None and choice.busy > BUSY_SHARE:
        log.info("the fp32 GEMM rate read %.1f GFLOP/s against the %.1f recorded while other processes "
                 "took %.0f%% of the CPUs: the recorded rate was the busy one; keeping the cached kernel "
                 "choice", rate, choice.gemm_gflops, 100 * choice.busy)
        return None
    if rate < choice.gemm_gflops and share is not None and share > BUSY_SHARE:  # others run: not another host
        log.info("the fp32 GEMM rate read %.1f GFLOP/s against the cached choice's %.1f while other "
                 "processes took %.0f%% of the CPUs: keeping the cached kernel choice", rate,
                 choice.gemm_gflops, 100 * share)
        return None
    return (f"this machine's fp32 GEMM rate is {rate:.1f} GFLOP/s, {change(rate):.1f}x away from the "
            f"{choice.gemm_gflops:.1f} measured with the cached kernel choice (another host behind "
            "the same CPU name?)")


def measured_speedup(fast: Callable[[], object], base: Callable[[], object],
                     budget_s: float | None = None) -> float | None:
    """How many times faster ``fast`` runs than ``base`` here: the median over paired rounds
    (:func:`race`, at least three, within ``budget_s``, by default half of :func:`tune_budget`)
    of base's time / fast's time in the same round. None when either raised (logged)."""
    times = race({"base": base, "fast": fast}, tune_budget() / 2 if budget_s is None else budget_s, keep="base")
    rel = ratios(times, "base")
    if "fast" not in rel:
        return None
    return 1 / rel["fast"]


_RETUNING = contextvars.ContextVar("bertscope_retuning", default=False)


@contextlib.contextmanager
def retuning():
    """Inside the block, :func:`choose` measures again instead of reading the cache (``doctor
    --retune``). The cached file stays until the new choice replaces it, atomically: a run
    stopped meanwhile, or another process loading a model, still finds the last one; and a
    choice measured on a busy machine, which is not cached, leaves it in place."""
    token = _RETUNING.set(True)
    try:
        yield
    finally:
        _RETUNING.reset(token)


def choose(model, *, precision: str = "fp32", budget_s: float | None = None, max_len: int = 256,
           retune: bool = False, candidates: dict | None = None, compile: bool = False,
           levels: dict[str, int] | None = None) -> KernelChoice:
    """The kernel choice for ``model`` here: from the cache when its key matches, else measured
    (and cached); the plain defaults when ``BERTSCOPE_TUNE=0``. ``levels`` and ``budget_s``: as
    for :func:`measure_choice` (a cached choice probes nothing)."""
    dtype = next(model.parameters()).dtype
    key = choice_key(model.config, dtype, precision, compile)
    if not tuning_enabled() and not retune:
        return KernelChoice(key=key, source="default")
    busy_limit()  # a bad BERTSCOPE_BUSY_SHARE: refused now, not after a whole measurement
    if budget_s is None:
        tune_budget()  # a bad BERTSCOPE_TUNE_BUDGET too: not a week later, when the cache expires
    from ..core.activity import watching

    # one measurement at a time in this process, the host check's probe included (see measuring()):
    # a thread that waited here finds the choice the one before it measured and cached
    with _MEASURING:
        if not retune and not _RETUNING.get():
            cached = load_choice(key)
            if cached is not None:
                why = host_changed(cached)
                if why is None:
                    return cached
                log.warning("%s: measuring the kernel choice again", why)
        with watching() as watch:
            before = cpu_ticks()
            choice = measure_choice(model, precision=precision, budget_s=budget_s, max_len=max_len,
                                    candidates=candidates, compile=compile, levels=levels)
            choice.busy = others_share(before, cpu_ticks())
        choice.busy_threads = watch.others
        if too_busy(choice.busy) or choice.busy_threads:
            log.warning("the kernel choice holds for this run only and is measured again next time: %s",
                        busy_note(choice.busy) or threads_note(choice.busy_threads))
        save_choice(choice)  # before a thread waiting to measure the same choice looks for it
    return choice


# one measurement at a time in this process: two would time each other (see measuring())
_MEASURING = ProcessLock()  # a fork child gets a fresh one


@contextlib.contextmanager
def measuring():
    """Hold this process's measurement lock (threads that measure wait for each other's
    measurements, which would time each other, and no reading of other processes' CPU time sees
    that) and watch for model runs on other threads meanwhile: the
    :class:`~bertscope.core.activity.Watch` given counts them once the block ends."""
    from ..core.activity import watching

    with _MEASURING, watching() as watch:
        yield watch


def threads_note(runs: int, what: str = "it") -> str:
    """"other threads of this process ran a model 3 time(s) while it was measured, so it is not
    cached", or "" (none)."""
    if not runs:
        return ""
    return (f"other threads of this process ran a model {runs} time(s) while {what} was measured, so {what} is "
            "not cached")
