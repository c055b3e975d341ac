"""int8 linears for CPU inference, and the measured rule for which linears stay fp32.

Shape legend: N rows (tokens), K inputs, M outputs of one linear y = x·Wᵀ + b.

Weights, per output channel (symmetric):   W_jk ≈ s_j · Wq_jk,   s_j = max_k |W_jk| / 127,
    Wq int8 in [-127, 127]; Ŵ = s ⊙ Wq is the weight the int8 GEMM effectively multiplies.
Activations, per token, at run time (asymmetric, 256 levels between the row's own extremes):
    x_nk ≈ lo_n + Δ_n · q_nk,   Δ_n = (hi_n − lo_n) / 255,   q uint8 in [0, 255]
(128 levels, 0..127, on a CPU whose int8 GEMM saturates on the full range: see FULL_LEVELS).
Then
    y_nj ≈ Δ_n · (q·Ŵᵀ)_nj + lo_n · (Ŵ·1)_j + b_j
where q·Ŵᵀ is one integer GEMM (oneDNN's int8 matmul dequantizes Ŵ's per-channel scales in its
epilogue) and the last two terms are one rank-2 update [lo, 1]·[Ŵ·1; b] of the output.

fp32 input channels (the decomposition of LLM.int8(), Dettmers et al. 2022, with the channels
fixed by calibration): a few input channels S of each linear (:data:`FP32_CHANNELS`, the ones
with the largest |x| on the calibration tokens) bypass the 8 bits. Their entries are set to 0
before the row's extremes are taken, their weight columns are 0 in Wq, and the fp32 product
x_S·W_Sᵀ joins the same low-rank update, which becomes [lo, 1, x_S]·[Ŵ·1; b; W_Sᵀ]. In the
bundled model, channel 99 of every layer's LayerNorm outputs (the inputs of W_QKV and W1) peaks at
23 to 93 times the median |x|, on frequent tokens ([CLS], [SEP], commas, "of", "a"); a token
where it peaks otherwise spends its 256 levels on that one channel and rounds the other 383
coarsely.

Why this scheme: BERT's activations carry outliers (Bondarenko et al. 2021, "Understanding and
Overcoming the Challenges of Efficient Transformer Quantization"): a few tokens and channels are
tens of times larger than the rest. One scale per tensor, as ``torch.ao`` dynamic quantization
and ONNX Runtime's dynamic quantization use, spends the 8 bits on those outliers; a scale per
token confines the damage to the token that has them. Measured on the bundled model and 300
movie reviews (``benchmarks/int8_design.py``, docs/BENCHMARKS.md "int8-design"), weights per
channel in each case: per-tensor activations gave cosine to fp32 0.992 mean, 0.977 min and a
top-10 neighbour overlap of 0.859 (below the contract's 0.9); per-token symmetric 0.997, 0.990,
0.927; per-token asymmetric (this module: 256 levels between each row's own extremes, which
also doubles the resolution of W2's one-sided GELU inputs) 0.999, 0.996, 0.947.

Measured on the benchmark's mixed corpus (fake-quantized, every linear int8): two fp32 channels
per linear raised the top-10 neighbour overlap with fp32 from 0.909 to 0.944 on the 8-bit grid
and from 0.843 to 0.920 on the 7-bit one (CPUs without VNNI; docs/BENCHMARKS.md).

What stays fp32 (:func:`calibrate`): a linear whose int8 output on the calibration tokens differs
from its fp32 output by more than ``ERROR_LIMIT`` (twice that on a 7-bit grid; relative Frobenius error ‖y8 − y32‖ / ‖y32‖,
each linear fed the fp32 model's own inputs) stays fp32; then, while the calibration texts'
sentence embeddings are further than ``COSINE_FLOOR`` from fp32, the int8 linear with the next
largest error joins them. Nothing else is ever changed: attention, LayerNorm, residuals and
embeddings are fp32 throughout.

Compiled steps (int8 kernel "onednn_compiled", opt-in): in eager PyTorch the steps around the
integer GEMM -- the rows' minimum and maximum, the scaling and rounding to 8 bits, then the
output's rescale, rank-2 offset, bias and activation -- are about ten passes over memory, and
together cost as much as the GEMM itself. ``torch.compile`` (inductor) fuses them into two
loops (:class:`CompiledSteps`). When all four linears of a layer run on these steps, the
encoder goes one further (:meth:`CompiledSteps.run_layer`): the output linears' epilogues are
fused with the residual add, the LayerNorm and the next linear's quantize step, so the layer's
(N, C) tensors are written once instead of three to five times (int8 took 5-14% less time
than with the eager steps on the 2-core Xeon over 21 paired rounds, on the mixed benchmark
corpus and on BERT-base at 128 tokens; docs/BENCHMARKS.md).
Two details follow inductor's code on CPUs measured so far: LayerNorm is written as two passes
(:func:`_layer_norm`), not as inductor's Welford, and W1's activation runs fused or apart,
whichever the kernel choice measures faster (:meth:`CompiledSteps.epilogue`).
The arithmetic is the same (tests compare it with the eager steps and with ``BertLayer.run``);
compiling takes about 30 s the first time on a machine (inductor then caches the code on disk),
so it is a candidate only when asked for (``load(..., compile=True)``, ``embed --compile``)
and, like every candidate, is kept only if it measures faster.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from ..core.layer import activation
from .packing import sentence_means

__all__ = ["ACT_PLACEMENTS", "CASTS", "COMPILED_KERNEL", "COSINE_FLOOR", "CompiledSteps", "ERROR_LIMIT", "FP32_CHANNELS", "FULL_LEVELS",
           "REDUCED_LEVELS", "check_act_placement", "check_cast", "compiled_steps_of", "fp32_channels", "int8_range_exact", "INT8_KERNELS", "Int8Linear",
           "Int8Plan", "Scratch", "calibrate", "int8_kernel_available", "quantize_weight"]

log = logging.getLogger(__name__)

# The integer GEMMs torch ships that Int8Linear can use; the kernel choice measures them.
#   onednn: torch.ops.onednn.qlinear_pointwise (oneDNN int8 matmul: VNNI / AMX), fp32 output
#   int_mm: torch._int_mm (int8 x int8 -> int32), dequantized afterwards
INT8_KERNELS = ("onednn", "int_mm")
# oneDNN's int8 matmul with the steps around it compiled (CompiledSteps): raced only when asked for
COMPILED_KERNEL = "onednn_compiled"
ERROR_LIMIT = 0.05  # a linear whose int8 output is off by more than 5% (relative) stays fp32
COSINE_FLOOR = (0.995, 0.98)  # calibration embeddings vs fp32: (mean, minimum) cosine required
FP32_CHANNELS = 2  # input channels per linear that bypass the 8 bits: the largest |x| in calibration
# fp32 -> 8-bit routes for the quantized activations (Scratch.narrow); "direct" is the baseline
CASTS = ("direct", "int32")
# where the compiled steps apply W1's activation (CompiledSteps.epilogue); "fused" is the baseline
ACT_PLACEMENTS = ("fused", "apart")
PACK_HINT = 2048  # rows oneDNN is told to expect when it lays out the int8 weight
ROW_BUCKET = 64  # as for the fp32 oneDNN GEMM: one compiled GEMM per row count, so round up
_TINY = 1e-12
# Activations use the grid 0..FULL_LEVELS (8 bits). Where the integer GEMM cannot multiply that
# range exactly -- x86 without VNNI adds pairs of u8·s8 products in 16 bits, which saturate
# (255·127·2 > 32767) -- they use 0..REDUCED_LEVELS (7 bits), as PyTorch's ``reduce_range`` does;
# :func:`int8_range_exact` measures which, on the machine itself.
FULL_LEVELS = 255
REDUCED_LEVELS = 127


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: (M, K) fp32 -> Wq (M, K) int8 and scales s (M,)."""
    w = weight.detach().float()
    scale = w.abs().amax(1).clamp(min=_TINY) / 127  # (M,)
    wq = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (M, K)
    return wq, scale


def fp32_channels(x: torch.Tensor, k: int = FP32_CHANNELS) -> tuple[int, ...]:
    """The ``k`` input channels of ``x`` (N, K) with the largest |x| over all rows, in ascending
    order: the channels an Int8Linear fed inputs like ``x`` keeps in fp32."""
    if k <= 0 or x.numel() == 0:
        return ()
    peak = x.detach().abs().amax(0)  # (K,) each channel's largest |x|
    return tuple(sorted(torch.topk(peak, min(k, peak.numel())).indices.tolist()))


def int8_kernel_available(kernel: str) -> bool:
    """Whether this torch runs ``kernel`` here and computes the scheme: the exact integer product
    on a tiny input, and exact products at the top of the 7-bit grid (:func:`int8_range_exact`;
    a GEMM that fails even that is of no use). For the compiled kernel, making its steps also
    checks them against the eager steps (:class:`CompiledSteps`), which compiles them."""
    try:
        x = torch.tensor([[1.0, 2.0] * 8] * 64)  # (64, 16): integers, exactly representable
        w = torch.ones(8, 16)
        lin = Int8Linear(w, torch.zeros(8), kernel=kernel, levels=REDUCED_LEVELS)
        if not torch.allclose(lin(x), x @ w.T, rtol=1e-2, atol=1e-2):
            return False
    except (AttributeError, RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    return int8_range_exact("onednn" if kernel == COMPILED_KERNEL else kernel, REDUCED_LEVELS)


def int8_range_exact(kernel: str, levels: int = FULL_LEVELS) -> bool:
    """Whether ``kernel`` multiplies activations at the top of the grid 0..``levels`` exactly here.

    Rows of ones with one zero are quantized to ``levels`` but for that one entry, and the
    weights of ones to 127: the largest products there are, whose exact result (63) the int8
    GEMM must give to within rounding. On CPUs whose int8 GEMM adds pairs of products in 16
    bits (x86 without VNNI) the 8-bit grid saturates and this returns False; it returns False too
    where the kernel does not run at all.
    """
    try:
        x = torch.ones(64, 64)  # (64, 64): lo 0, hi 1 on every row
        x[:, 0] = 0
        lin = Int8Linear(torch.ones(8, 64), torch.zeros(8), kernel=kernel, levels=levels)
        return bool(torch.allclose(lin(x), x @ torch.ones(64, 8), rtol=1e-3))
    except (AttributeError, RuntimeError, TypeError, ValueError, NotImplementedError):
        return False


def check_cast(cast: str) -> str:
    """``cast`` if it names a route of :meth:`Scratch.narrow`, else ValueError."""
    if cast not in CASTS:
        raise ValueError(f"unknown cast {cast!r}; choose one of {', '.join(CASTS)}")
    return cast


def check_act_placement(placement: str) -> str:
    """``placement`` if it is one of :data:`ACT_PLACEMENTS`, else ValueError."""
    if placement not in ACT_PLACEMENTS:
        raise ValueError(f"unknown activation placement {placement!r}; choose one of {', '.join(ACT_PLACEMENTS)}")
    return placement


class Scratch:
    """Reusable buffers for quantizing a linear's input, one set per thread.

    Quantizing an (N, K) input takes an fp32 intermediate and an 8-bit copy. Fresh tensors of
    that size come from the operating system page by page each time (glibc hands large blocks
    back on free), which cost about as much as the arithmetic: writing into a kept buffer took
    7 ms against 16 ms fresh for a 4096 x 3072 input (measured on the 2-core Xeon). A
    GemmBackend owns one Scratch shared by all its int8 linears (they run one after another);
    it holds at most the largest input seen, per thread and dtype.
    """

    def __init__(self, cast: str = "direct") -> None:
        self._bufs: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self.cast = check_cast(cast)  # how the rounded fp32 values become 8-bit integers: see narrow()

    def narrow(self, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (uint8 or int8) = ``t`` (fp32, same shape, every value in out's range)
        truncated toward zero; ``t`` is scratch and is overwritten.

        Two routes give the same integers, bit for bit. "direct" converts fp32 to 8 bits in one
        copy. "int32" converts to int32 in place (t's own memory: same element size, each element
        read before it is written) and then narrows int32 to 8 bits: one more pass over memory,
        but on the EPYC (Zen 4) torch's fp32 -> uint8 copy ran at about a third of the speed of
        the two copies together (0.29 against 0.08 ms for 2048 x 384; benchmarks/int8_cast.py).
        Which is faster depends on how torch vectorizes each conversion for the CPU, so the
        kernel choice measures both (:func:`bertscope.fast.tuning.cast_runs`) and sets ``cast``.
        Values outside out's range (possible only where fp32 rounding on a near-constant row
        carries one past the grid's end) have no defined result, and the routes may differ there.
        """
        if self.cast == "int32":
            return out.copy_(t.view(torch.int32).copy_(t))  # (N, K) fp32 -> int32 in place -> 8 bits
        return out.copy_(t)  # (N, K) fp32 -> 8 bits

    def get(self, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised (n, k) tensor of ``dtype``, valid until the next call on this thread."""
        key = (threading.get_ident(), dtype)
        flat = self._bufs.get(key)
        if flat is None or flat.numel() < n * k:
            with torch.inference_mode(False):  # a normal tensor: writable in and out of inference mode
                flat = torch.empty(n * k, dtype=dtype)
            self._bufs[key] = flat
        return flat[: n * k].view(n, k)  # (n, k)


def _quantize_rows(x: torch.Tensor, levels: int = FULL_LEVELS,
                   keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token asymmetric, as Int8Linear's eager steps: (N, K) -> q (N, K) uint8 in [0, levels], lo and Δ (N, 1).
    ``keep`` (1, K), 1 or 0 per channel, zeroes the fp32 channels first."""
    if keep is not None:
        x = x * keep  # (N, K): the fp32 channels out of the row's range
    lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)  # (N, 1) each
    step = (hi - lo).clamp(min=_TINY) / levels  # (N, 1) Δ
    inv = 1.0 / step  # (N, 1)
    # round((x − lo)/Δ) in [0, levels], in the eager steps' own order of operations (x·(1/Δ), then
    # + 0.5 − lo/Δ, truncated), so both put every input on the same side of a rounding boundary
    q = (x * inv + (0.5 - lo * inv)).to(torch.uint8)  # (N, K)
    return q, lo, step


def _layer_norm(z, gamma, beta, eps: float):
    """LayerNorm over the last dimension as the compiled steps write it: the mean, then the mean
    of squared deviations (two passes over the row, each a plain sum), where ``F.layer_norm`` would
    have inductor compute both in one pass of Welford updates (a running mean and sum of squares
    updated per element: more arithmetic than two plain sums). With the residual, rescale and
    quantize fused around it, the two-pass form took 0.60-0.71 of Welford's time on both models'
    widths at 1,024-4,096 rows on the AVX2-only AMD EPYC (``benchmarks/compiled_layer_norm.py``;
    docs/BENCHMARKS.md). The result is the same in fp32 within rounding: the squared deviations
    from the mean are summed, as Welford's are, so nothing cancels. The kernel choice still races
    the compiled steps against the eager ones."""
    mu = z.mean(-1, keepdim=True)  # (N, 1)
    d = z - mu  # (N, M)
    var = (d * d).mean(-1, keepdim=True)  # (N, 1) biased, as LayerNorm's
    return d * torch.rsqrt(var + eps) * gamma + beta  # (N, M)


def _rescale(y, step, lo, w_sum, bias, xs=None, w_s=None):
    """The integer GEMM's output y = q·Ŵᵀ (N, M) back to x·Wᵀ + b: Δ·y + [lo, 1, x_S]·[Ŵ·1; b; W_Sᵀ]
    (the compiled steps' form of Int8Linear's eager rescale and low-rank update)."""
    z = y * step + lo * w_sum + bias  # (N, M)
    if xs is not None:
        z = z + (xs[:, :, None] * w_s[None]).sum(1)  # (N, k, 1)·(1, k, M) summed over k: x_S·W_Sᵀ (N, M)
    return z


# Inductor decides at compile time whether a CPU loop runs on several threads, from the sizes of
# the first call (its "size hints"): under about 512 elements per thread it writes a one-thread
# loop, and with dynamic=True that code then serves every later size, and is kept in inductor's
# on-disk cache for other processes too. A first call on a few rows (a test, a short batch) thus
# left the steps single-threaded on 2048-row batches: on the 2-core EPYC an epilogue compiled
# after a 7 x 8 call took 3.3-4.2 ms on 2048 x 3072, against 2.5-2.9 ms with this option
# (benchmarks/compiled_first_call.py; docs/BENCHMARKS.md, "tenth session"). ``cpp.dynamic_threads``
# gives every generated kernel a parallel region whose thread count OpenMP sets at run time,
# whatever the first call was; being part of inductor's cache key, it also keeps the older
# single-threaded code from being reused.
_INDUCTOR_OPTIONS = {"cpp.dynamic_threads": True}


def _compile(fn: Callable) -> Callable:
    """``fn`` compiled by inductor for any row count, its loops parallel at any size (above)."""
    return torch.compile(fn, dynamic=True, fullgraph=True, options=_INDUCTOR_OPTIONS)


def _by_channels(plain: Callable, with_channels: Callable, norm: bool = False) -> Callable:
    """Both compiled, and one call that takes x_S, W_Sᵀ (None without fp32 channels) and picks."""
    plain_c = _compile(plain)
    channels_c = _compile(with_channels)
    if norm:
        def call(y, step, lo, w_sum, bias, x, gamma, beta, xs=None, w_s=None, keep=None):
            if xs is None:
                return plain_c(y, step, lo, w_sum, bias, x, gamma, beta, keep)
            return channels_c(y, step, lo, w_sum, bias, x, gamma, beta, xs, w_s, keep)
    else:
        def call(y, step, lo, w_sum, bias, xs=None, w_s=None):
            if xs is None:
                return plain_c(y, step, lo, w_sum, bias)
            return channels_c(y, step, lo, w_sum, bias, xs, w_s)
    return call


class CompiledSteps:
    """Int8Linear's steps around the integer GEMM, compiled by inductor (see the module doc).

    One object per GemmBackend: the quantize step, and one epilogue per activation, each
    compiled for any row count (``dynamic=True``). Making the object compiles the quantize
    step, the plain epilogue and a fused residual + LayerNorm + quantize, and checks them
    against the same steps run eagerly on random rows with outliers (:meth:`check`). Wrong code
    for this CPU -- seen when one inductor cache served a process told to act as an AVX2-only CPU
    (ATEN_CPU_CAPABILITY=avx2) and a native one: inductor reused code built for the other level,
    and the quantize step came out wrong -- raises RuntimeError here, as does a failure to
    compile; the kernel choice records that against the candidate, which is then never used.
    """

    def __init__(self, levels: int = FULL_LEVELS, *, check: bool = True, act_placement: str = "fused") -> None:
        self.levels = levels
        # where W1's activation runs (see epilogue); the kernel choice measures it per machine
        self.act_placement = check_act_placement(act_placement)

        def quantize(x, keep=None):
            return _quantize_rows(x, levels, keep)

        self.quantize = _compile(quantize)
        self._epilogues: dict[str | None, Callable] = {}
        self._norms: dict[tuple[float, bool], Callable] = {}
        if check:
            self.check()

    def check(self) -> None:
        """Raise RuntimeError unless the compiled steps give the eager steps' results (within
        1e-5; a quantized entry may land one level off for under 1% of entries, as fp32 rounding
        may put it a hair across a boundary)."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(130, 384, generator=g)  # (N, K)
        x[:, 3] *= 30  # an outlier channel
        x[5] *= 50  # an outlier token
        w_sum, bias, gamma, beta = (torch.randn(384, generator=g) for _ in range(4))
        eps = 1e-12

        def same_rows(got, ref) -> bool:
            flips = (got[0].int() - ref[0].int()).abs()
            return (int(flips.max()) <= 1 and float((flips > 0).float().mean()) < 0.01
                    and torch.allclose(got[1], ref[1], rtol=1e-5, atol=1e-6)
                    and torch.allclose(got[2], ref[2], rtol=1e-5, atol=1e-9))

        chans = torch.tensor([3, 7])  # two fp32 channels, the outlier among them
        keep = torch.ones(1, 384)
        keep[0, chans] = 0
        xs, w_s = x.index_select(1, chans), torch.randn(2, 384, generator=g)  # (N, 2), (2, M)
        with torch.inference_mode():
            q, lo, step = _quantize_rows(x, self.levels)
            ok = same_rows(self.quantize(x), (q, lo, step))
            ok = ok and same_rows(self.quantize(x, keep), _quantize_rows(x, self.levels, keep))
            y = q.float()  # (N, K): stands in for the GEMM's output
            z = y * step + lo * w_sum + bias
            ok = ok and torch.allclose(self.epilogue(None)(y, step, lo, w_sum, bias), z, rtol=1e-5, atol=1e-4)
            ok = ok and torch.allclose(self.epilogue(None)(y, step, lo, w_sum, bias, xs, w_s), z + xs @ w_s,
                                       rtol=1e-5, atol=1e-4)
            h = F.layer_norm(x + z, (384,), gamma, beta, eps)
            fused = self.residual_norm(eps, True)(y, step, lo, w_sum, bias, x, gamma, beta)
            ok = ok and torch.allclose(fused[0], h, rtol=1e-4, atol=1e-4) and same_rows(
                fused[1:], _quantize_rows(h, self.levels))
            h = F.layer_norm(x + z + xs @ w_s, (384,), gamma, beta, eps)
            fused = self.residual_norm(eps, True)(y, step, lo, w_sum, bias, x, gamma, beta, xs, w_s, keep)
            ok = ok and torch.allclose(fused[0], h, rtol=1e-4, atol=1e-4) and same_rows(
                fused[1:], _quantize_rows(h, self.levels, keep))
        if not ok:
            raise RuntimeError("torch.compile's int8 steps disagree with the eager steps on this CPU; "
                               "not using them")

    def epilogue(self, act_name: str | None) -> Callable:
        """f(y, Δ, lo, Ŵ·1, b, x_S, W_Sᵀ) = act(Δ·y + lo·(Ŵ·1) + b + x_S·W_Sᵀ), compiled: (N, M) -> (N, M);
        x_S (N, k) and W_Sᵀ (k, M) are the fp32 channels' inputs and weights, or None.

        With an activation, :attr:`act_placement` says where it runs: "fused" into the compiled
        loop, or "apart": the compiled loop without it, then PyTorch's own in-place activation,
        one more pass over the output. Fusing saves that pass, but inductor's erf can be the
        slower one: on the AVX2-only AMD EPYC (no AVX-512) W1's epilogue took 0.72-0.90 of the
        fused time apart, on both models' widths at 1,024-4,096 rows (8.89 ms fused against 6.42
        ms apart on 4096 x 1536; ``benchmarks/act_placement.py``, docs/BENCHMARKS.md), so the
        kernel choice measures both
        (:func:`bertscope.fast.tuning.act_runs`). The two differ in the last bits of erf only.
        """
        if act_name is not None and self.act_placement == "apart":
            rescale, act = self.epilogue(None), activation(act_name, in_place=True)

            def apart(y, step, lo, w_sum, bias, xs=None, w_s=None):
                return act(rescale(y, step, lo, w_sum, bias, xs, w_s))  # (N, M), activated in place
            return apart
        if act_name not in self._epilogues:
            act = activation(act_name) if act_name else None

            # two functions, not one with optional arguments: torch.compile keeps the compiled
            # variants of one function (code object) together, under a limit of 8
            def plain(y, step, lo, w_sum, bias):
                z = _rescale(y, step, lo, w_sum, bias)  # (N, M)
                return act(z) if act is not None else z

            def with_channels(y, step, lo, w_sum, bias, xs, w_s):
                z = _rescale(y, step, lo, w_sum, bias, xs, w_s)  # (N, M)
                return act(z) if act is not None else z

            self._epilogues[act_name] = _by_channels(plain, with_channels)
        return self._epilogues[act_name]

    def residual_norm(self, eps: float, quantize: bool) -> Callable:
        """f(y, Δ, lo, Ŵ·1, b, x, γ, β, x_S, W_Sᵀ, keep) = LayerNorm(x + the epilogue's z), compiled:
        (N, M) -> (N, M); with ``quantize``, also that output's 8-bit rows for the next linear
        (q, lo, Δ), its fp32 channels zeroed by ``keep`` (1, M) if given."""
        key = (float(eps), quantize)
        if key not in self._norms:
            def plain(y, step, lo, w_sum, bias, x, gamma, beta, keep=None):
                z = x + _rescale(y, step, lo, w_sum, bias)  # (N, M): residual + the linear's output
                h = _layer_norm(z, gamma, beta, key[0])  # (N, M)
                return (h, *_quantize_rows(h, self.levels, keep)) if quantize else h

            def with_channels(y, step, lo, w_sum, bias, x, gamma, beta, xs, w_s, keep=None):
                z = x + _rescale(y, step, lo, w_sum, bias, xs, w_s)  # (N, M)
                h = _layer_norm(z, gamma, beta, key[0])  # (N, M)
                return (h, *_quantize_rows(h, self.levels, keep)) if quantize else h

            self._norms[key] = _by_channels(plain, with_channels, norm=True)
        return self._norms[key]

    def run_layer(self, layer, lin, x: torch.Tensor, carried: tuple | None,
                  attend: Callable[[torch.Tensor], torch.Tensor], quantize_next: bool,
                  next_keep: torch.Tensor | None = None):
        """One layer in inference, all four linears int8 on these steps, with the steps between
        the integer GEMMs fused across the linears' boundaries: (N, C) -> (N, C).

        The recipe is :meth:`bertscope.core.layer.BertLayer.run`'s (dropout is the identity in
        inference), in the same order:

            x ─quantize─ GEMM W_QKV ─rescale─ attention ─quantize─ GEMM W_O
              ─[rescale + residual x + LayerNorm + quantize]─ h ─ GEMM W1
              ─[rescale + activation]─quantize─ GEMM W2
              ─[rescale + residual h + LayerNorm (+ quantize for the next layer)]─ out

        Each bracket is one compiled loop where the per-linear steps would write and read the
        (N, C) tensor three to five times. ``carried`` is x's 8-bit rows (q, lo, Δ) if the
        previous layer made them, else None. Returns the output and, with ``quantize_next``,
        its 8-bit rows (else None) for the next layer's W_QKV, whose fp32 channels ``next_keep``
        zeroes. Each linear's fp32 channels (x_S) are read from its input. Tests hold it to
        ``layer.run`` with the same linears.
        """
        q, lo, step = carried if carried is not None else self.quantize(x, lin.qkv.keep)  # (N, C) uint8, (N, 1) x2
        c = lin.qkv.correction
        qkv = self.epilogue(None)(lin.qkv.int8_mm(q), step, lo, c[0], c[1],
                                  *lin.qkv.fp32_part(x))  # (N, C)@(C, 3C) -> (N, 3C)
        context = attend(qkv)  # (N, C)
        q, lo, step = self.quantize(context, lin.output.keep)  # as 8-bit rows
        norm, c = layer.attention_norm, lin.output.correction
        h, q, lo, step = self.residual_norm(norm.eps, True)(
            lin.output.int8_mm(q), step, lo, c[0], c[1], x, norm.weight, norm.bias,
            *lin.output.fp32_part(context), lin.ff_in.keep)  # (N, C)@(C, C) -> (N, C)
        c = lin.ff_in.correction
        a = self.epilogue(lin.ff_in.act_name)(lin.ff_in.int8_mm(q), step, lo, c[0], c[1],
                                              *lin.ff_in.fp32_part(h))  # (N, C)@(C, I) -> (N, I)
        # (the activation is not fused with the quantize: inductor would compute it once per
        # pass over the row, and erf-GELU three times cost more than one write and read)
        q, lo, step = self.quantize(a, lin.ff_out.keep)  # (N, I) uint8
        norm, c = layer.output_norm, lin.ff_out.correction
        out = self.residual_norm(norm.eps, quantize_next)(
            lin.ff_out.int8_mm(q), step, lo, c[0], c[1], h, norm.weight, norm.bias,
            *lin.ff_out.fp32_part(a), next_keep)  # (N, I)@(I, C) -> (N, C)
        if quantize_next:
            return out[0], out[1:]
        return out, None


def compiled_steps_of(lin) -> CompiledSteps | None:
    """The :class:`CompiledSteps` that all four linears of a layer (a ``LayerLinears``) share, or
    None when any of them is something else (fp32, eager int8, or another object)."""
    parts = (lin.qkv, lin.output, lin.ff_in, lin.ff_out)
    if not all(isinstance(p, Int8Linear) and p.steps is not None for p in parts):
        return None
    steps = parts[0].steps
    if any(p.steps is not steps for p in parts) or any(p.act_name for p in (lin.qkv, lin.output, lin.ff_out)):
        return None
    return steps


def _writable(x: torch.Tensor) -> bool:
    """Whether x may be written in place here and put back: a dense tensor, and not an inference
    tensor outside inference mode. (Int8 linears run without autograd: the encoder uses fp32
    ones under it.)"""
    return x.is_contiguous() and not (x.is_inference() and not torch.is_inference_mode_enabled())


class Int8Linear:
    """y = act(x·Wᵀ + b) with int8 weights (per channel) and int8 activations (per token); the
    input channels ``channels`` (indices, e.g. from :func:`fp32_channels`) stay fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, act: str | None = None, *,
                 kernel: str = "onednn", scratch: Scratch | None = None,
                 steps: CompiledSteps | None = None, levels: int = FULL_LEVELS,
                 channels: tuple[int, ...] | list[int] = ()) -> None:
        if kernel not in INT8_KERNELS + (COMPILED_KERNEL,):
            raise ValueError(f"unknown int8 kernel {kernel!r}; choose one of "
                             f"{', '.join(INT8_KERNELS + (COMPILED_KERNEL,))}")
        M, K = weight.shape
        self.kernel = kernel
        if levels not in (FULL_LEVELS, REDUCED_LEVELS):
            raise ValueError(f"int8 activation levels must be {FULL_LEVELS} or {REDUCED_LEVELS}, got {levels}")
        self.levels = levels  # the top of the activations' grid: 255 (8 bits) or 127 (7 bits)
        self.steps = None
        if kernel == COMPILED_KERNEL:
            self.steps = steps if steps is not None else CompiledSteps(levels)
            if self.steps.levels != levels:
                raise ValueError("the compiled steps quantize to another number of levels")
        self.scratch = scratch if scratch is not None else Scratch()
        self.act_name = act
        self.act = activation(act, in_place=True) if act else None  # on the epilogue's own fp32 output
        chans = sorted(set(int(c) for c in channels))
        if any(not 0 <= c < K for c in chans):
            raise ValueError(f"fp32 channels must be input channels 0..{K - 1}, got {list(channels)}")
        w = weight.detach().float()  # (M, K)
        self.channels = self.keep = self.w_s = None  # no fp32 channels
        if chans:
            self.channels = torch.tensor(chans, dtype=torch.long)  # (k,) S
            self.keep = torch.ones(1, K)  # (1, K): 0 on S, for the compiled quantize step
            self.keep[0, self.channels] = 0
            w_s = w.index_select(1, self.channels).t()  # (k, M) W_Sᵀ, multiplied in fp32
            w = w.index_fill(1, self.channels, 0.0)  # S leaves the int8 weight
        wq, self.w_scale = quantize_weight(w)  # (M, K) int8, (M,)
        w_sum = (wq.float() * self.w_scale[:, None]).sum(1)  # (M,) Ŵ·1, for the rows' offsets lo
        rows = [w_sum[None], bias.detach().float()[None]] + ([w_s] if chans else [])
        self.correction = torch.cat(rows).contiguous()  # (2 + k, M): [Ŵ·1; b; W_Sᵀ]
        if chans:
            self.w_s = self.correction[2:]  # (k, M)
        self.w_zero = torch.zeros(M, dtype=torch.long)
        if kernel in ("onednn", COMPILED_KERNEL):
            self.packed = torch.ops.onednn.qlinear_prepack(wq, [PACK_HINT, K])
        else:
            self.wq_t = wq.t()  # (K, M), a transposed view as torch._int_mm wants it

    row_multiple = ROW_BUCKET

    def fp32_part(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(x_S, W_Sᵀ): the fp32 channels' inputs (N, k) and weights (k, M), or (None, None)."""
        if self.channels is None:
            return None, None
        return x.index_select(1, self.channels), self.w_s  # (N, k), (k, M)

    def int8_mm(self, q: torch.Tensor) -> torch.Tensor:
        """oneDNN's int8 matmul of uint8 rows q with the packed weight, in fp32: (N, K) -> (N, M) = q·Ŵᵀ."""
        return torch.ops.onednn.qlinear_pointwise(q, 1.0, 0, self.packed, self.w_scale, self.w_zero, None,
                                                  1.0, 0, torch.float32, "none", [], "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        padded = -(-n // ROW_BUCKET) * ROW_BUCKET
        if padded != n:  # the encoder rounds once per batch; this is for other callers
            x = F.pad(x, (0, 0, 0, padded - n))  # (N', K)
        if self.steps is not None:  # the same steps, compiled into two fused loops
            xs, w_s = self.fp32_part(x)  # (N', k), (k, M) or None
            q, lo, step = self.steps.quantize(x, self.keep)  # (N', K) uint8, (N', 1), (N', 1)
            y = self.int8_mm(q)  # (N', K)@(K, M) -> (N', M) = q·Ŵᵀ
            c = self.correction
            y = self.steps.epilogue(self.act_name)(y, step, lo, c[0], c[1], xs, w_s)  # (N', M)
            return y[:n] if padded != n else y
        q, offset, step, xs = self.to_8bit(x)  # (N', K) 8-bit, (N', 1), (N', 1), (N', k) or None
        y = self.finish(self.product(q), offset, step, xs)  # (N', M)
        return y[:n] if padded != n else y

    def to_8bit(self, x: torch.Tensor):
        """The eager quantize step: x (N, K) fp32 -> (q, offset, Δ, x_S): q (N, K) 8-bit in a
        scratch buffer (uint8 for oneDNN, int8 for ``torch._int_mm``), offset and Δ (N, 1) such
        that x ≈ offset + Δ·q on the int8 channels, and x_S (N, k) the fp32 channels' inputs (None
        without). x is the caller's, and is left as it was."""
        xs = x.index_select(1, self.channels) if self.channels is not None else None  # (N, k)
        restore = False
        if xs is not None:  # the fp32 channels out of the row's range: zeroed for the next three
            # steps, then restored (x is the caller's; writing it in place saves a copy). Only
            # where that is allowed: torch refuses an in-place write to an inference tensor
            # outside inference mode, and only after making it, so this is checked beforehand.
            if _writable(x):
                x.index_fill_(1, self.channels, 0.0)
                restore = True
            else:
                x = x.index_fill(1, self.channels, 0.0)  # (N, K)
        # amin and amax as two reductions: 3x faster than torch.aminmax here (measured)
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)  # (N, 1) each
        step = (hi - lo).clamp_(min=_TINY) / self.levels  # (N, 1) Δ
        inv = 1.0 / step  # (N, 1)
        rows, K = x.shape
        t = torch.mul(x, inv, out=self.scratch.get(rows, K, torch.float32))  # (N, K) x/Δ
        if restore:
            x.index_copy_(1, self.channels, xs)  # the caller's x as it was, bit for bit
        out = self.scratch.get(rows, K, torch.int8 if self.kernel == "int_mm" else torch.uint8)  # (N, K)
        if self.kernel == "int_mm":
            # torch._int_mm multiplies int8 by int8: centre the grid, q − c in [−c, levels − c]
            offset = lo + ((self.levels + 1) // 2) * step  # (N, 1)
            return self.scratch.narrow(t.sub_(offset * inv).round_(), out), offset, step, xs  # (N, K) int8
        # q = round((x − lo)/Δ) in [0, levels]: +0.5 then truncation (to uint8) rounds in one pass
        return self.scratch.narrow(t.add_(0.5 - lo * inv), out), lo, step, xs  # (N, K) uint8

    def product(self, q: torch.Tensor) -> torch.Tensor:
        """The integer GEMM: q (N, K) -> (N, M), q·Ŵᵀ in fp32 (oneDNN) or q·Wqᵀ in int32
        (``torch._int_mm``; :meth:`finish` applies the weight scales)."""
        if self.kernel == "int_mm":
            return torch._int_mm(q, self.wq_t)  # (N, K)@(K, M) -> (N, M) int32
        return self.int8_mm(q)  # (N, K)@(K, M) -> (N, M) = q·Ŵᵀ

    def finish(self, y: torch.Tensor, offset: torch.Tensor, step: torch.Tensor,
               xs: torch.Tensor | None) -> torch.Tensor:
        """The eager epilogue, on :meth:`product`'s output (overwritten where fp32):
        act(Δ·y + [offset, 1, x_S]·[Ŵ·1; b; W_Sᵀ]) (N, M)."""
        if y.dtype == torch.int32:
            y = y.float().mul_(self.w_scale)  # (N, M) q·Ŵᵀ
        y.mul_(step)  # Δ · (q·Ŵᵀ)
        left = [offset, torch.ones_like(offset)] + ([xs] if xs is not None else [])
        y.addmm_(torch.cat(left, 1), self.correction)  # + [offset, 1, x_S]·[Ŵ·1; b; W_Sᵀ]: (N, 2 + k)@(2 + k, M)
        return self.act(y) if self.act else y


@dataclass(frozen=True)
class Int8Plan:
    """What a calibration measured and decided for one model.

    errors:  {(layer, linear name): relative error of its int8 output on the calibration tokens}
    keep_fp32: the (layer, linear name) pairs that stay fp32
    cosine_mean, cosine_min: calibration texts' sentence embeddings, int8 plan vs fp32
    tokens: calibration tokens the errors were measured on
    channels: {(layer, linear name): the input channels that int8 linear keeps fp32}
    """

    errors: dict[tuple[int, str], float]
    keep_fp32: frozenset[tuple[int, str]]
    cosine_mean: float
    cosine_min: float
    tokens: int
    steps: list[str] = field(default_factory=list)
    error_limit: float = ERROR_LIMIT  # the limit applied (ERROR_LIMIT, doubled on a 7-bit grid)
    channels: dict[tuple[int, str], tuple[int, ...]] = field(default_factory=dict)

    def keep_fp32_names(self) -> list[str]:
        """The linears that stay fp32, as "layer.name", in order."""
        return [f"{i}.{n}" for i, n in sorted(self.keep_fp32)]

    def to_json(self) -> dict:
        return {"error_limit": self.error_limit, "cosine_floor": list(COSINE_FLOOR), "tokens": self.tokens,
                "errors": {f"{i}.{n}": round(e, 6) for (i, n), e in sorted(self.errors.items())},
                "keep_fp32": self.keep_fp32_names(),
                "fp32_channels": {f"{i}.{n}": list(c) for (i, n), c in sorted(self.channels.items())},
                "cosine_mean": self.cosine_mean, "cosine_min": self.cosine_min, "steps": self.steps}


class _Recorder:
    """A linear that remembers its inputs (the fp32 model's activations for the calibration)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.inputs: list[torch.Tensor] = []

    row_multiple = 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x)
        return self.inner(x)


def calibrate(encoder, model, packed, *, kernel: str = "onednn") -> Int8Plan:
    """Measure which linears of ``model`` stay fp32 in int8 mode (see the module doc).

    ``encoder`` is the :class:`~bertscope.fast.encoder.PackedEncoder` that will serve the model
    (its GEMM backend receives the decision); ``packed`` holds the calibration texts.
    """
    from .gemm import LINEAR_NAMES, Linear, LayerLinears, layer_weights

    weights = layer_weights(model)
    with torch.inference_mode():
        recorders = [{n: _Recorder(Linear(w, b, "blas", a)) for n, (w, b, a) in lw.items()} for lw in weights]
        x32 = encoder.encode(model, packed, linears=[LayerLinears(**r) for r in recorders])  # (N, C)
        ref = sentence_means(x32, packed)  # (B, C) unit vectors
        errors: dict[tuple[int, str], float] = {}
        channels: dict[tuple[int, str], tuple[int, ...]] = {}
        int8 = []
        for i, (lw, rec) in enumerate(zip(weights, recorders)):
            layer = {}
            for name in LINEAR_NAMES:
                w, b, a = lw[name]
                xin = torch.cat(rec[name].inputs)  # (N, K)
                channels[(i, name)] = fp32_channels(xin)  # the largest |x| here: kept fp32
                q = encoder.gemm.int8_linear(w, b, a, kernel=kernel, channels=channels[(i, name)])
                y32, y8 = rec[name].inner(xin), q(xin)  # (N, M) each
                errors[(i, name)] = float((y8 - y32).norm() / y32.norm().clamp(min=_TINY))
                layer[name] = q
            int8.append(layer)
        # the limit is for 8-bit activations; a 7-bit grid doubles every linear's rounding error,
        # and the rule is about outliers, not about the grid, so the limit scales with it
        limit = ERROR_LIMIT * FULL_LEVELS / encoder.gemm.int8_levels(kernel)
        keep = {k for k, e in errors.items() if e > limit}
        steps = [f"{i}.{n}: error {errors[(i, n)]:.3f} > {limit:.3g}: fp32" for i, n in sorted(keep)]

        def cosines() -> tuple[float, float]:
            lins = [LayerLinears(**{n: (rec[n].inner if (i, n) in keep else layer[n]) for n in LINEAR_NAMES})
                    for i, (rec, layer) in enumerate(zip(recorders, int8))]
            got = sentence_means(encoder.encode(model, packed, linears=lins), packed)  # (B, C)
            cos = (got * ref).sum(1)  # (B,)
            return float(cos.mean()), float(cos.min())

        mean, low = cosines()
        by_error = sorted((k for k in errors if k not in keep), key=lambda k: -errors[k])
        while (mean < COSINE_FLOOR[0] or low < COSINE_FLOOR[1]) and by_error:
            k = by_error.pop(0)
            keep.add(k)
            steps.append(f"cosine {mean:.4f} mean / {low:.4f} min below {COSINE_FLOOR}: "
                         f"{k[0]}.{k[1]} (error {errors[k]:.3f}) -> fp32")
            mean, low = cosines()
    plan = Int8Plan(errors=errors, keep_fp32=frozenset(keep), cosine_mean=mean, cosine_min=low,
                    tokens=packed.num_tokens, steps=steps, error_limit=limit, channels=channels)
    encoder.gemm.int8_keep_fp32[model] = plan.keep_fp32
    encoder.gemm.int8_channels[model] = channels
    log.info("int8 calibration: %d of %d linears stay fp32; calibration cosine %.4f mean, %.4f min",
             len(keep), len(errors), mean, low)
    return plan
