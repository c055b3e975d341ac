"""The packed (padding-free) encoder: the model's own layers, run on real tokens only.

Shape legend:
    B  sequences in the batch
    T  padded length of the batch (the longest sequence)
    N  real tokens in the batch, all sequences together (N <= B·T)
    H  heads, D head size, C = H·D hidden size, I feed-forward width

How it works:
  1. pack:    drop the PAD positions once: (B, T) ids -> (N,) ids, with each token's position
              and segment (:mod:`bertscope.fast.packing`).
  2. layers:  each layer of the :class:`~bertscope.core.model.BertModel` runs its own recipe
              (:meth:`bertscope.core.layer.BertLayer.run`: residuals, LayerNorms, dropout) on
              the (N, C) tokens. Only the two sublayers are computed differently: W_Q, W_K and
              W_V as one (C, 3C) product and the GEMMs on the backend chosen for this machine
              (:mod:`bertscope.fast.gemm`), and attention per length group
              (:mod:`bertscope.fast.kernels`). int8 layers on compiled steps instead run
              :meth:`bertscope.fast.quant.CompiledSteps.run_layer`: the same recipe, with the
              steps between the integer GEMMs fused across the linears.
  3. unpack:  restore padding once at the end: (N, C) -> (B, T, C), zeros at PAD positions.

It works under autograd and in training mode (dropout where the model has it, attention
dropout included), so training can skip the arithmetic on padding too. Tests hold it equal to
the padded reference path within 1e-5 in fp32, outputs and gradients.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..core.activity import ProcessLock, marks_runs
from ..core.model import check_inputs
from ..core.outputs import BertOutput
from .gemm import GemmBackend, LayerLinears
from .heap import HeapPolicy, keep_heap
from .kernels import AttentionKernels, attention_plan
from .packing import PackedBatch, pack, unpack
from .quant import compiled_steps_of
from .tuning import KernelChoice, choose

__all__ = ["PackedEncoder", "packed_encode"]

log = logging.getLogger(__name__)


@dataclass
class PackedEncoder:
    """The fast path's state: its GEMM backend (and cache) and its attention kernels.

    One object serves any number of models (caches are per model, weakly held). The
    :class:`bertscope.Bert` facade owns one; nothing here is module-global.
    """

    gemm: GemmBackend = field(default_factory=GemmBackend)
    kernels: AttentionKernels = field(default_factory=AttentionKernels)
    tune: bool = False  # measure the kernel choice at first CPU inference (the Bert facade sets it)
    choice: KernelChoice | None = None  # the measured (or cached) choice, once made
    heap: HeapPolicy | None = None  # glibc's thresholds, fixed at the first CPU run (see bertscope.fast.heap)
    # held while the choice is made: threads that meet a model first at once measure it once
    # (a copy, or a child made by fork, gets a lock of its own)
    _choosing: ProcessLock = field(default_factory=ProcessLock, init=False, repr=False, compare=False)

    def prepare(self, model) -> KernelChoice | None:
        """Make the kernel choice for ``model`` if this encoder tunes and has none yet (CPU, fp32
        model, inference only), and apply it; the choice, or None when nothing was chosen.

        The choice comes from the on-disk cache when one was measured for this machine, torch,
        model shape, dtype and precision; otherwise it is measured now (about 2 s) and cached.
        See :mod:`bertscope.fast.tuning`.

        The first time it sees a model on the CPU, it also fixes the C allocator's thresholds, so
        that freed activations stay in the process (:func:`bertscope.fast.heap.keep_heap`).

        Threads that call it at once (a server's first requests) wait for one measurement: each
        measuring its own would time the others' work as its candidates' and cache the result.
        """
        first = next(model.parameters(), None)
        if self.heap is None and first is not None and first.device.type == "cpu":
            self.heap = keep_heap()
        if self.choice is not None:
            return self.choice
        p = next(model.parameters())
        if not self.tune or torch.is_grad_enabled() or p.device.type != "cpu" or p.dtype != torch.float32:
            return None
        with self._choosing:
            if self.choice is None:  # not made by a thread this one waited for
                # the race's int8 candidates probe the 8-bit grid into this backend's own record,
                # so the model does not probe (and warn) a second time
                self.apply(choose(model, precision=self.gemm.precision, compile=self.gemm.compile,
                                  levels=self.gemm.measured_levels))
        return self.choice

    def apply(self, choice: KernelChoice) -> None:
        """Use ``choice`` from now on: its GEMM library, int8 kernel, 8-bit conversion and
        activation placement, and attention slack."""
        if os.environ.get("BERTSCOPE_ONEDNN", "1") != "0":  # the environment's "blas" wins
            self.gemm.prefer = choice.gemm
        self.gemm.int8_kernel = choice.int8_kernel
        self.gemm.use_int8_cast(choice.int8_cast)
        self.gemm.use_int8_act(choice.int8_act)
        self.choice = choice  # last: a thread that finds a choice finds the backend set for it

    def record(self, model) -> dict | None:
        """The kernel choice for ``model`` (made now if not yet), as the fields that change the
        numbers (:meth:`KernelChoice.applied`), with the GEMM library in use (``BERTSCOPE_ONEDNN=0``
        keeps BLAS whatever was chosen); None where there is none (a GPU, a grad-enabled model).
        A job that may be resumed in another process keeps it beside its output."""
        with torch.inference_mode():
            choice = self.prepare(model)
        return None if choice is None else {**choice.applied(), "gemm": self.gemm.prefer}

    def restore(self, recorded: object, where: str) -> bool:
        """Compute with a recorded choice (:meth:`record`) from now on, without measuring one:
        whether that changed the choice. ``where`` names the record's file, for the messages.

        A resumed job's rows must be those an unstopped job computes, and this machine's cached
        choice may have been measured again since the job began (a week later, a busy machine,
        another cache folder): another GEMM library or batch budget changes the last digits. A
        damaged record is an InputError; one this version cannot read (another's fields), or one
        whose library or int8 kernel cannot run here, is a warning, and this machine's is used."""
        from dataclasses import replace

        from ..errors import InputError
        from .tuning import APPLIED_FIELDS, damaged_field

        if recorded is None:  # a GPU's job, or one from before records
            return False
        if not isinstance(recorded, dict) or set(recorded) != set(APPLIED_FIELDS):
            log.warning("%s: its kernel choice is not recorded as this version of bertscope records one; "
                        "computing with this machine's (the rows may differ from an unstopped run's in their "
                        "last digits)", where)
            return False
        bad = damaged_field(replace(KernelChoice(measured_at=0.0), **recorded))
        if bad is not None:
            raise InputError(f"{where}: the kernel choice recorded there is damaged (its {bad!r} is "
                             f"{recorded[bad]!r}); remove its \"kernel\" entry to compute with this machine's")
        recorded = dict(recorded)
        if recorded["gemm"] == "onednn" and os.environ.get("BERTSCOPE_ONEDNN", "1") == "0":
            log.warning("%s: the run began with oneDNN's GEMMs and BERTSCOPE_ONEDNN=0 keeps BLAS: the rows may "
                        "differ from an unstopped run's in their last digits", where)
        if self.gemm.precision == "int8":
            from .quant import COMPILED_KERNEL, int8_kernel_available

            kernel = recorded["int8_kernel"]
            if kernel != self.gemm.int8_kernel and not int8_kernel_available(
                    "onednn" if kernel == COMPILED_KERNEL else kernel):
                log.warning("%s: the run began with the int8 kernel %s, which this machine cannot run: computing "
                            "with %s (the rows may differ from an unstopped run's)", where, kernel,
                            self.gemm.int8_kernel)
                recorded["int8_kernel"] = self.gemm.int8_kernel
        if self.choice is not None and {**self.choice.applied(), "gemm": self.gemm.prefer} == recorded:
            return False
        log.info("computing with the kernel choice the job began with: %s", recorded)
        self.apply(replace(self.choice or KernelChoice(), **recorded, source="recorded"))
        return True

    def encode(self, model, packed: PackedBatch, *, attention_impl: str = "auto",
               slack: float | None = None, linears: list[LayerLinears] | None = None,
               inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Embeddings and every layer (no pooler) on packed tokens: (N,) ids -> (N, C).

        ``attention_impl``: "auto", "groups" (SDPA per length bucket; any device) or "varlen"
        (CUDA flash kernel). ``slack`` bounds the padding inside an attention bucket (default:
        the measured choice for this model, if one was made, else the device's default).
        ``linears`` replaces the GEMM backend's linears (the kernel choice and the int8
        calibration time and compare their own). ``inputs_embeds`` (N, C), given, stands in
        for the packed tokens' word embeddings (gradient attributions differentiate through it).
        """
        if linears is None:
            self.prepare(model)  # before the run is marked: a thread waiting here for a choice runs nothing
        return self._encode(model, packed, attention_impl, slack, linears, inputs_embeds)

    @marks_runs  # a kernel choice measured on another thread meanwhile knows (core.activity)
    def _encode(self, model, packed: PackedBatch, attention_impl: str, slack: float | None,
                linears: list[LayerLinears] | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """:meth:`encode` once the kernel choice is made."""
        ids = packed.input_ids if inputs_embeds is None else None
        x = model.embeddings(ids, packed.token_type_ids, packed.position_ids, inputs_embeds=inputs_embeds)  # (N, C)
        if linears is None:
            linears = self.gemm.linears(model, x)
        N = x.shape[0]
        rows = max((lin.row_multiple for lin in linears), default=1)
        if rows > 1 and N % rows:
            # oneDNN compiles one GEMM per row count: round N up once here (zero rows after the
            # real tokens, which every row-wise step leaves alone and attention never sees)
            # rather than in each of the 4 linears of every layer.
            x = F.pad(x, (0, 0, 0, -(-N // rows) * rows - N))  # (N', C)
        H = model.config.num_attention_heads
        if slack is None and self.choice is not None:
            slack = self.choice.slack
        plan = attention_plan(packed, slack) if attention_impl != "varlen" else None  # once, for every layer
        # int8 layers on compiled steps run with those steps fused across linears (inference only)
        fused = [None if layer.training or torch.is_grad_enabled() else compiled_steps_of(lin)
                 for layer, lin in zip(model.layers, linears)]
        carried = None  # the 8-bit rows of x, when the previous fused layer made them
        for i, (layer, lin) in enumerate(zip(model.layers, linears)):
            if fused[i] is not None:
                quantize_next = i + 1 < len(fused) and fused[i + 1] is fused[i]
                x, carried = fused[i].run_layer(
                    layer, lin, x, carried, quantize_next=quantize_next,
                    next_keep=linears[i + 1].qkv.keep if quantize_next else None,
                    attend=lambda qkv: self.kernels.attend(qkv, packed, H, impl=attention_impl, plan=plan))  # (N', C)
                continue
            dropout_p = layer.attention.dropout_p if layer.training else 0.0

            def attend(h: torch.Tensor, lin=lin, dropout_p=dropout_p):
                qkv = lin.qkv(h)  # (N', C)@(C, 3C) -> (N', 3C): W_Q, W_K, W_V in one product
                context = self.kernels.attend(qkv, packed, H, impl=attention_impl, plan=plan,
                                              dropout_p=dropout_p)  # (N', C)
                return lin.output(context), None  # (N', C)@(C, C) -> (N', C): W_O

            x, _ = layer.run(x, attend, lin.feed_forward)  # (N', C)
        return x[:N] if x.shape[0] != N else x  # (N, C)

    def forward(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> BertOutput:
        """What ``model(input_ids, attention_mask, token_type_ids)`` returns, computed packed;
        PAD positions of ``last_hidden_state`` are zeros."""
        check_inputs(model.config, input_ids, attention_mask, token_type_ids)
        B = input_ids.shape[0]
        packed = pack(input_ids, attention_mask, token_type_ids)  # (N,) real tokens only
        x = unpack(self.encode(model, packed), packed, B)  # (N, C) -> (B, T, C)
        return BertOutput(last_hidden_state=x, pooler_output=model.pooler(x) if model.pooler is not None else None)

    def classify(self, model, packed: PackedBatch) -> torch.Tensor:
        """A sequence classifier's logits on packed tokens: (N,) ids -> (B, K), in packed order.

        ``model`` is a :class:`~bertscope.core.classifier.BertForSequenceClassification`; its
        encoder runs packed and its own head reads each sequence's first token ([CLS]). Works
        under autograd and in training mode (the training path of ``bertscope finetune``).
        """
        x = self.encode(model.bert, packed)  # (N, C)
        cls = x.index_select(0, packed.cu_seqlens[:-1])  # (B, C): the first token of each sequence
        return model.logits_from_cls(cls)  # (B, K)


def packed_encode(model, packed: PackedBatch, attention_impl: str = "auto",
                  slack: float | None = None, encoder: PackedEncoder | None = None) -> torch.Tensor:
    """:meth:`PackedEncoder.encode` with a given (or a fresh) encoder: (N,) ids -> (N, C)."""
    return (encoder or PackedEncoder()).encode(model, packed, attention_impl=attention_impl, slack=slack)
