"""The packed path's matrix products: which GEMM library runs them, and their prepared weights.

Shape legend: N rows (real tokens), C hidden size, I feed-forward width, 3C the fused Q/K/V width.

Per layer the packed path needs four linears: W_Q, W_K, W_V stacked into one (3C, C) product,
W_O (C, C), W1 with its activation (I, C), and W2 (C, I). Two backends compute them in fp32:

  * "blas":   ``F.linear`` (MKL/OpenBLAS on CPU, cuBLAS on CUDA), then the activation (on
              row counts rounded up to ROW_BUCKET: torch's CPU GELU is a oneDNN kernel
              compiled per shape, see :func:`activate_in_row_buckets`);
  * "onednn": oneDNN's fp32 GEMM with the weight reordered once into oneDNN's blocked layout
              and the activation fused as a post-op (CPU, fp32, inference only). It uses
              torch's private ``torch.ops.mkldnn`` ops, so it is probed before use and any
              failure on a real shape falls back to "blas" for the rest of the object's life.

Which one is faster depends on the CPU (oneDNN won on an AVX-512 machine and lost on an
AVX2-only one), so :class:`GemmBackend` is told which to prefer; the measured kernel choice
(:mod:`bertscope.fast.tuning`) sets it per model. It never decides from a module-level flag.
Everything it learns and caches lives on the object.

Reduced precision (CPU inference only; ``precision`` of the backend):

  * "bf16": the same oneDNN GEMM on bfloat16 copies of the weights and inputs (AMX or
            AVX512-BF16 run it natively), the result back in fp32; everything between the
            GEMMs (residuals, LayerNorm, attention) stays fp32;
  * "int8": per-channel int8 weights and per-token int8 activations (:mod:`bertscope.fast.quant`),
            except the linears a calibration keeps in fp32.

Autograd: when gradients are enabled the linears are built afresh from the live parameters on
every call (the fused Q/K/V weight is a ``torch.cat`` inside the graph), in fp32 BLAS whatever
the backend prefers, so every parameter gets its exact gradient. Only inference (no_grad or
inference_mode) uses the cache, which is keyed by the parameters' identities and versions,
dtype, device, backend, precision and inference mode.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..core.config import ACTIVATION_NAMES
from ..core.layer import activation
from ..core.weights import count_non_finite
from ..errors import NonFiniteError

__all__ = ["BACKENDS", "PRECISIONS", "GemmBackend", "LayerLinears", "Linear", "LINEAR_NAMES", "fused_qkv",
           "onednn_linear_available", "refuse_non_finite"]

log = logging.getLogger(__name__)

BACKENDS = ("blas", "onednn")
PRECISIONS = ("fp32", "bf16", "int8")
LINEAR_NAMES = ("qkv", "output", "ff_in", "ff_out")  # the fields of LayerLinears, in order
# config.hidden_act -> oneDNN's post-op (name, algorithm)
ONEDNN_POSTOPS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
                  "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", "")}
assert tuple(ONEDNN_POSTOPS) == ACTIVATION_NAMES  # one entry per activation config.py accepts
PACK_HINT = 2048  # the row count oneDNN is told to expect when it picks the weight's blocked layout
ROW_BUCKET = 64  # row counts given to oneDNN are rounded up to multiples of this (see Linear)
# What a private op that refuses its input raises, across torch versions.
ONEDNN_REFUSALS = (RuntimeError, TypeError, ValueError, NotImplementedError)


def onednn_linear_available() -> bool:
    """Whether this torch has oneDNN's linear with a pre-packed weight (the op torch.compile emits)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), 4)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(3, 2), w, torch.zeros(2), "none", [], "")
        return bool(torch.equal(y, torch.full((3, 2), 2.0)))
    except (AttributeError, RuntimeError, TypeError):
        return False


def fused_qkv(attention) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K, W_V stacked into one (3C, C) weight and (3C,) bias: one matmul instead of three."""
    w = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight], 0)  # (3C, C)
    b = torch.cat([attention.query.bias, attention.key.bias, attention.value.bias], 0)  # (3C,)
    return w, b


def activate_in_row_buckets(act: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                            weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """act(x·Wᵀ + b) by BLAS, with the activation run on a row count rounded up to ROW_BUCKET:
    (N, in) -> (N, out).

    torch computes GELU on CPU with oneDNN, which JIT-compiles and keeps one kernel per
    distinct tensor shape (a 256 KiB code buffer each, up to its primitive cache's 1,024
    entries). A streaming job's batches have hundreds of distinct row counts N: over a
    60,000-line embed job those kernels were the only memory that kept growing (69 kernels,
    17 MiB; measured with memray, docs/BENCHMARKS.md, "A million lines"). Here the GEMM writes
    the first N rows of an (N', out) buffer, N' a multiple of ROW_BUCKET, the other rows are
    zeroed, and the activation runs on all N' rows: at most ⌈max N / ROW_BUCKET⌉ shapes (32 for
    2,048-token batches). The N rows come from the same calls as F.linear and the activation.
    Under autograd (out= is not differentiable) it is plain F.linear, then the activation.
    """
    n = x.shape[0]
    rows = -(-n // ROW_BUCKET) * ROW_BUCKET
    if rows == n or torch.is_grad_enabled() or x.dim() != 2:
        return act(F.linear(x, weight, bias))  # (N, in)@(in, out) -> (N, out)
    buf = x.new_empty(rows, weight.shape[0])  # (N', out)
    torch.addmm(bias, x, weight.t(), out=buf[:n])  # (N, in)@(in, out) -> (N, out): F.linear's own call
    buf[n:].zero_()
    return act(buf)[:n]  # (N', out) -> (N, out)


def refuse_non_finite(model) -> None:
    """NonFiniteError naming the first query, key or value weight or bias of ``model`` that holds
    NaN or infinity.

    Torch's unmasked CPU attention kernel (the packed path's exact-length groups) turns a query
    row of NaN into zeros for fewer than 16 tokens (torch 2.13): a NaN in W_Q gave a finite,
    plausible embedding where the reference path gives NaN. NaN from any other weight reaches
    the residual stream and the output, as on the reference path (and ``embed`` refuses it).
    Giving those groups an all-true mask instead cost 1-7% of ``embed``'s time on an AMD EPYC
    with AVX-512 (docs/BENCHMARKS.md, "A NaN query and the unmasked kernel"). This check is one
    sum of every such tensor (NaN or infinity in any makes it non-finite; so may an overflow of
    finite values, which the exact count then clears): 0.4-0.7 ms for the bundled model, from 3.7
    with a count per tensor (docs/BENCHMARKS.md)."""
    named = [(f"layers.{i}.attention.{part}.{kind}", getattr(getattr(layer.attention, part), kind))
             for i, layer in enumerate(model.layers) for part in ("query", "key", "value") for kind in ("weight", "bias")
             if getattr(getattr(layer.attention, part), kind) is not None]
    with torch.no_grad():
        if bool(torch.isfinite(torch.stack([p.sum(dtype=torch.float32) for _, p in named]).sum())):
            return
        for name, p in named:
            bad = count_non_finite(p.detach())
            if bad:
                raise NonFiniteError(f"the model's weight {name} holds {bad:,} NaN or infinite value(s) of "
                                     f"{p.numel():,}; nothing was computed")


class Linear:
    """y = act(x·Wᵀ + b) for one weight, on the backend it was built for.

    ``dtype`` is the GEMM's compute type: float32, or bfloat16 on the "onednn" backend (the
    weight is stored in bf16, inputs are cast to bf16 and the result comes back in fp32).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, backend: str, act: str | None = None,
                 on_failure: Callable[[Exception], None] | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown GEMM backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.act_name = act
        self.act = activation(act) if act else None
        self.weight, self.bias = weight, bias
        self.on_failure = on_failure
        self.dtype = dtype
        self.packed = None
        if backend == "onednn":
            w = weight.detach()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), PACK_HINT)
            self.packed_bias = bias.detach().to(dtype)

    @property
    def row_multiple(self) -> int:
        """Row counts this linear prefers (oneDNN compiles one GEMM per distinct row count)."""
        return ROW_BUCKET if self.packed is not None else 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            try:
                return self._onednn(x)
            except ONEDNN_REFUSALS as e:  # a private op that refuses a real shape: BLAS from now on
                log.warning("oneDNN linear failed on %s (%s); using F.linear", tuple(x.shape), e)
                self.packed = None
                self.backend = "blas"
                if self.on_failure is not None:
                    self.on_failure(e)
        if self.act is None:
            return F.linear(x, self.weight, self.bias)  # (N, in)@(in, out) -> (N, out)
        return activate_in_row_buckets(self.act, x, self.weight, self.bias)  # act((N, in)@(in, out)) -> (N, out)

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        attr, algo = ONEDNN_POSTOPS[self.act_name] if self.act_name else ("none", "")
        # oneDNN compiles and caches one GEMM per distinct row count N; a streaming job sees
        # hundreds of N, and resident memory grew by ~2 MiB per new N (measured). Rounding N up
        # to a multiple of ROW_BUCKET with zero rows keeps the set of shapes small. (The packed
        # encoder rounds once per batch, so this pads only for callers that do not.)
        n = x.shape[0]
        padded = -(-n // ROW_BUCKET) * ROW_BUCKET
        if padded != n:
            x = F.pad(x, (0, 0, 0, padded - n))  # (N, in) -> (N', in), zero rows at the end
        out_dtype = x.dtype
        if self.dtype != x.dtype:
            x = x.to(self.dtype)  # (N', in) in the GEMM's compute type
        y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.packed_bias, attr, [], algo)  # (N', in) -> (N', out)
        if y.dtype != out_dtype:
            y = y.to(out_dtype)
        return y[:n] if padded != n else y  # (N, out)


@dataclass(frozen=True)
class LayerLinears:
    """One layer's linears on the packed path (any objects that map (N, in) -> (N, out))."""

    qkv: Callable[[torch.Tensor], torch.Tensor]  # (3C, C): W_Q, W_K, W_V in one product
    output: Callable[[torch.Tensor], torch.Tensor]  # (C, C): W_O
    ff_in: Callable[[torch.Tensor], torch.Tensor]  # (I, C): W1, then the activation
    ff_out: Callable[[torch.Tensor], torch.Tensor]  # (C, I): W2

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.ff_out(self.ff_in(h))  # act((N, C)@(C, I)) -> (N, I)@(I, C) -> (N, C)

    @property
    def row_multiple(self) -> int:
        """The row count multiple the encoder should pad a batch to (1: any)."""
        return max(getattr(lin, "row_multiple", 1) for lin in (self.qkv, self.output, self.ff_in, self.ff_out))


def layer_weights(model) -> list[dict[str, tuple[torch.Tensor, torch.Tensor, str | None]]]:
    """Per layer: {linear name: (weight, bias, activation)} as the packed path multiplies them."""
    act = model.config.hidden_act
    out = []
    for layer in model.layers:
        att, ff = layer.attention, layer.feed_forward
        out.append({
            "qkv": (*fused_qkv(att), None),  # (3C, C)
            "output": (att.output.weight, att.output.bias, None),  # (C, C)
            "ff_in": (ff.dense_in.weight, ff.dense_in.bias, act),  # (I, C), then the activation
            "ff_out": (ff.dense_out.weight, ff.dense_out.bias, None),  # (C, I)
        })
    return out


class GemmBackend:
    """Builds and caches the packed path's linears for one preference of GEMM library.

    ``prefer``: "onednn" uses oneDNN where it can (CPU, fp32, inference, the op present), else
    BLAS; "blas" always uses BLAS. The environment variable BERTSCOPE_ONEDNN=0 forces "blas"
    when the object is made. The measured choice per machine sets ``prefer`` (see
    :mod:`bertscope.fast.tuning`).

    ``precision``: "fp32" (exact), "bf16" or "int8" (see the module doc); reduced precision
    applies to CPU inference of an fp32 model only, everything else runs fp32. ``int8_kernel``
    names the integer GEMM (:data:`bertscope.fast.quant.INT8_KERNELS`). ``int8_keep_fp32``
    holds, per model, the (layer, linear name) pairs that stay fp32 in int8 mode, and
    ``int8_channels`` each int8 linear's input channels that stay fp32 (both set by
    :func:`bertscope.fast.quant.calibrate`; none without a calibration).
    """

    def __init__(self, prefer: str = "onednn", precision: str = "fp32", int8_kernel: str = "onednn",
                 compile: bool = False, levels: dict[str, int] | None = None) -> None:
        if prefer not in BACKENDS:
            raise ValueError(f"unknown GEMM backend {prefer!r}; choose one of {', '.join(BACKENDS)}")
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
        if os.environ.get("BERTSCOPE_ONEDNN", "1") == "0":
            prefer = "blas"
        self.prefer = prefer
        self.precision = precision
        self.int8_kernel = int8_kernel
        self._onednn_ok: bool | None = None  # probed on first need
        self.failures: list[str] = []  # oneDNN failures seen on real shapes
        self._cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._finite: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> weights checked
        self.int8_keep_fp32: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.int8_channels: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.scratch = None  # int8 linears' shared buffers (bertscope.fast.quant.Scratch), made with them
        self.int8_cast = "direct"  # how their inputs become 8-bit integers (Scratch.narrow; measured)
        self.compile = compile  # may the kernel choice race torch.compile'd candidates (slow to build)
        self.steps = None  # int8 linears' compiled steps (bertscope.fast.quant.CompiledSteps), made with them
        self.int8_act = "fused"  # where those steps apply W1's activation (CompiledSteps.epilogue; measured)
        # int8 GEMM -> activation levels measured here (int8_levels). Backends may share one dict
        # (``levels``): a kernel race's candidates and the model's own backend do, so the probe
        # runs, and warns, once per GEMM for them all
        self.measured_levels: dict[str, int] = levels if levels is not None else {}

    def __getstate__(self) -> dict:
        """For pickle and copy.deepcopy: the settings and each model's int8 plan, not the
        prepared weights (oneDNN's packed tensors cannot be copied; they are made again on first
        use). A model pickled with its backend (as a Bert holds both) stays one object."""
        state = dict(self.__dict__)
        state["_cache"] = state["_finite"] = None
        state["scratch"] = state["steps"] = None
        for name in ("int8_keep_fp32", "int8_channels"):
            state[name] = list(self.__dict__[name].items())  # (model, value): the weak keys, kept
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._cache = weakref.WeakKeyDictionary()
        self._finite = weakref.WeakKeyDictionary()
        for name in ("int8_keep_fp32", "int8_channels"):
            setattr(self, name, weakref.WeakKeyDictionary(state[name]))

    def onednn_usable(self) -> bool:
        if self._onednn_ok is None:
            self._onednn_ok = onednn_linear_available()
        return self._onednn_ok and not self.failures

    def backend_for(self, x: torch.Tensor) -> str:
        """The fp32 backend these inputs get: oneDNN only for fp32 CPU inference."""
        if (self.prefer == "onednn" and x.device.type == "cpu" and x.dtype == torch.float32
                and not torch.is_grad_enabled() and self.onednn_usable()):
            return "onednn"
        return "blas"

    def precision_for(self, x: torch.Tensor) -> str:
        """The precision these inputs get: bf16/int8 only for fp32 CPU inference, else fp32."""
        if (self.precision == "fp32" or x.device.type != "cpu" or x.dtype != torch.float32
                or torch.is_grad_enabled()):
            return "fp32"
        if self.precision == "bf16" and not self.onednn_usable():
            return "fp32"
        return self.precision

    def _failed(self, e: Exception) -> None:
        self.failures.append(f"{type(e).__name__}: {e}")
        self._cache.clear()  # rebuild with BLAS next time

    def build(self, model, backend: str, precision: str = "fp32") -> list[LayerLinears]:
        """Fresh linears for every layer of ``model`` from its current parameters."""
        keep = self.int8_keep_fp32.get(model, frozenset()) if precision == "int8" else frozenset()
        channels = self.int8_channels.get(model, {}) if precision == "int8" else {}
        out = []
        for i, weights in enumerate(layer_weights(model)):
            lins = {}
            for name, (w, b, act) in weights.items():
                if precision == "int8" and (i, name) not in keep:
                    lins[name] = self.int8_linear(w, b, act, channels=channels.get((i, name), ()))
                elif precision == "bf16":
                    lins[name] = Linear(w, b, "onednn", act, self._failed, dtype=torch.bfloat16)
                else:
                    lins[name] = Linear(w, b, backend, act, self._failed)
            out.append(LayerLinears(**lins))
        return out

    def int8_linear(self, weight: torch.Tensor, bias: torch.Tensor, act: str | None = None, *,
                    kernel: str | None = None, channels: tuple[int, ...] = ()):
        """An int8 linear on ``kernel`` (default: this backend's ``int8_kernel``), sharing this
        backend's scratch buffers and compiled steps; its input ``channels`` stay fp32."""
        from .quant import COMPILED_KERNEL, Int8Linear, CompiledSteps, Scratch

        kernel = kernel or self.int8_kernel
        levels = self.int8_levels(kernel)
        if self.scratch is None:
            self.scratch = Scratch(self.int8_cast)
        if kernel == COMPILED_KERNEL and self.steps is None:
            self.steps = CompiledSteps(levels, act_placement=self.int8_act)
        return Int8Linear(weight, bias, act, kernel=kernel, scratch=self.scratch,
                          steps=self.steps if kernel == COMPILED_KERNEL else None, levels=levels,
                          channels=channels)

    def use_int8_cast(self, cast: str) -> None:
        """Convert int8 linears' inputs to 8 bits by ``cast`` from now on (the same integers
        either way; :meth:`bertscope.fast.quant.Scratch.narrow`)."""
        from .quant import check_cast

        self.int8_cast = check_cast(cast)
        if self.scratch is not None:
            self.scratch.cast = cast

    def use_int8_act(self, placement: str) -> None:
        """Apply W1's activation on the compiled int8 steps ``placement`` ("fused" or "apart")
        from now on (:meth:`bertscope.fast.quant.CompiledSteps.epilogue`)."""
        from .quant import check_act_placement

        self.int8_act = check_act_placement(placement)
        if self.steps is not None:
            self.steps.act_placement = placement

    def int8_levels(self, kernel: str | None = None) -> int:
        """The top of the int8 activations' grid for ``kernel`` on this machine: 255 (8 bits) where
        its integer GEMM multiplies that range exactly, else 127 (7 bits); measured once per kernel
        (:func:`bertscope.fast.quant.int8_range_exact`)."""
        from .quant import COMPILED_KERNEL, FULL_LEVELS, REDUCED_LEVELS, int8_range_exact

        kernel = kernel or self.int8_kernel
        gemm = "onednn" if kernel == COMPILED_KERNEL else kernel  # the compiled steps use oneDNN's GEMM
        if gemm not in self.measured_levels:
            exact = int8_range_exact(gemm)
            self.measured_levels[gemm] = FULL_LEVELS if exact else REDUCED_LEVELS
            if not exact:
                log.warning("the %s int8 GEMM saturates on 8-bit activations on this CPU (no VNNI?); "
                            "using 7-bit activations", gemm)
        return self.measured_levels[gemm]

    def _refuse_non_finite_once(self, model, params: list | None = None) -> None:
        """:func:`refuse_non_finite`, again only when a parameter has changed since (a model with
        a tensor made under torch.inference_mode, which keeps no version counter: every call)."""
        params = list(model.parameters()) if params is None else params
        if any(p.is_inference() for p in params):
            refuse_non_finite(model)
            return
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self._finite.get(model) != key:
            refuse_non_finite(model)
            self._finite[model] = key

    def linears(self, model, x: torch.Tensor) -> list[LayerLinears]:
        """The linears for a forward of ``model`` on inputs like ``x`` (see the module doc)."""
        if torch.is_grad_enabled():
            if not model.training:  # gradients of a fixed model; in training the weights change every
                self._refuse_non_finite_once(model)  # step, and the kernels mask every group instead
            return self.build(model, "blas")  # in the graph: every parameter gets its gradient
        backend = self.backend_for(x)
        precision = self.precision_for(x)
        params = list(model.parameters())
        # Inference tensors (made under torch.inference_mode) keep no version counter, so an
        # in-place change could not be seen: such a model's linears are rebuilt on every call.
        if any(p.is_inference() for p in params):
            self._refuse_non_finite_once(model, params)
            return self.build(model, backend, precision)
        keep = self.int8_keep_fp32.get(model) if precision == "int8" else None
        channels = self.int8_channels.get(model) if precision == "int8" else None
        channels = tuple(sorted(channels.items())) if channels else None
        key = (backend, precision, self.int8_kernel, keep, channels, torch.is_inference_mode_enabled(), x.dtype,
               x.device) + tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        cached = self._cache.get(model)
        if cached is not None and cached[0] == key:
            return cached[1]
        refuse_non_finite(model)  # once per change of the weights
        built = self.build(model, backend, precision)
        self._cache[model] = (key, built)
        return built
