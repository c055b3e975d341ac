"""The packed (padding-free) inference path: the same BERT arithmetic, computed on real tokens only.

Shape legend:
    B  sequences in the batch
    T  padded length of the batch (the longest sequence)
    N  real tokens in the batch, all sequences together (N <= B·T)
    G  sequences in one length group (all of the same length L)
    L  length of the sequences in one group
    H  heads, D head size, C = H·D hidden size, I feed-forward width

How it works (inference only, no dropout):
  1. pack:    drop the PAD positions once: (B, T) ids -> (N,) ids, plus each token's position
              and segment, and ``cu_seqlens`` (B+1,), the offsets where each sequence starts.
              Sequences are laid out sorted by length (longest first), so sequences of similar
              length sit side by side.
  2. layers:  every projection, LayerNorm and feed-forward runs on the (N, C) packed tokens.
              W_Q, W_K and W_V are applied as one (C, 3C) matrix product.
              Attention runs per bucket of neighbouring sequences: where all G have exactly L
              tokens, their (G·L, 3C) rows are a free view as (G, L, 3, H, D) and SDPA needs no
              mask; a bucket of nearly equal lengths is gathered into (G, L) with its few PAD
              keys masked (padding bounded by PAD_SLACK, and seen by attention only).
              On CUDA in fp16/bf16, PyTorch's varlen flash kernel is used instead where present.
  3. unpack:  restore padding once at the end: (N, C) -> (B, T, C), zeros at PAD positions.

The arithmetic equals :class:`bertscope.model.BertModel`'s reference path: a PAD key gets weight
exactly 0 there, and here it is simply absent. Tests hold the two within 1e-5 in fp32.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["PackedBatch", "pack", "pack_ids", "packed_encode", "unpack", "mean_pool"]

log = logging.getLogger(__name__)

# Attention buckets may pad sequences up to this fraction of their real tokens (only attention
# sees that padding, and masks it; projections and the feed-forward never see any). On CPU
# exact equal-length groups (0.0) measured fastest; on CUDA fewer, larger kernel calls pay.
PAD_SLACK = {"cpu": 0.0, "cuda": 0.25}


@dataclass(frozen=True)
class PackedBatch:
    """B sequences laid end to end, sequences sorted by length (longest first).

    input_ids, token_type_ids, position_ids: (N,) int64.
    cu_seqlens: (B+1,) int64 offsets; sequence j of the packed order is tokens
        cu_seqlens[j]:cu_seqlens[j+1].
    lengths: B python ints, the length of each sequence in packed order.
    order: B python ints; packed sequence j is row ``order[j]`` of the caller's batch.
    flat_index: (N,) int64 positions in the caller's (B·T) grid, to restore padding (or None
        when the batch came as lists of ids and has no grid).
    padded_length: T.
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: list[int]
    order: list[int]
    flat_index: torch.Tensor | None
    padded_length: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def buckets(self, slack: float) -> list[tuple[int, int, int]]:
        """(first sequence j, number of sequences G, longest length L) for each attention bucket.

        Consecutive sequences (sorted longest first) share a bucket while padding them to the
        bucket's longest stays within ``slack`` of their real tokens (G·L <= (1 + slack)·real).
        With slack 0 every bucket holds sequences of exactly equal length.
        """
        out: list[tuple[int, int, int]] = []
        j, n = 0, len(self.lengths)
        while j < n and self.lengths[j] > 0:
            L = self.lengths[j]
            real, k = L, j + 1
            while k < n and self.lengths[k] > 0 and L * (k - j + 1) <= (1 + slack) * (real + self.lengths[k]):
                real += self.lengths[k]
                k += 1
            out.append((j, k - j, L))
            j = k
        return out


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
         token_type_ids: torch.Tensor | None) -> PackedBatch:
    """Drop PAD once: a padded (B, T) batch -> a :class:`PackedBatch` of its N real tokens.

    A token's position id is its column in the (B, T) grid, exactly as in the padded model.
    """
    B, T = input_ids.shape
    device = input_ids.device
    if attention_mask is None:
        keep = torch.ones(B, T, dtype=torch.bool, device=device)  # (B, T)
    else:
        keep = attention_mask.to(torch.bool)  # (B, T)
    lengths_t = keep.sum(1)  # (B,)
    order_t = torch.sort(lengths_t, descending=True, stable=True).indices  # (B,)
    keep_sorted = keep[order_t]  # (B, T), rows in packed order
    rows, cols = keep_sorted.nonzero(as_tuple=True)  # (N,), (N,) row-major: sequence by sequence
    src_rows = order_t[rows]  # (N,) rows of the caller's batch
    flat_index = src_rows * T + cols  # (N,)
    types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    lengths = lengths_t[order_t].tolist()
    cu = torch.zeros(B + 1, dtype=torch.long, device=device)
    cu[1:] = torch.cumsum(lengths_t[order_t], 0)  # (B+1,)
    return PackedBatch(
        input_ids=input_ids.reshape(-1)[flat_index],  # (N,)
        token_type_ids=types.reshape(-1)[flat_index],  # (N,)
        position_ids=cols,  # (N,)
        cu_seqlens=cu,
        lengths=lengths,
        order=order_t.tolist(),
        flat_index=flat_index,
        padded_length=T,
    )


def pack_ids(ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None = None,
             device: torch.device | str = "cpu") -> PackedBatch:
    """Pack lists of token ids straight from the tokenizer; no padded tensor is ever built."""
    B = len(ids)
    order = sorted(range(B), key=lambda i: -len(ids[i]))
    lengths = [len(ids[i]) for i in order]
    flat_ids = [t for i in order for t in ids[i]]
    if type_ids is None:
        flat_types = [0] * len(flat_ids)
    else:
        flat_types = [t for i in order for t in type_ids[i]]
    positions = [p for L in lengths for p in range(L)]
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    as_long = dict(dtype=torch.long, device=device)
    return PackedBatch(
        input_ids=torch.tensor(flat_ids, **as_long),  # (N,)
        token_type_ids=torch.tensor(flat_types, **as_long),  # (N,)
        position_ids=torch.tensor(positions, **as_long),  # (N,)
        cu_seqlens=torch.tensor(cu, **as_long),  # (B+1,)
        lengths=lengths,
        order=order,
        flat_index=None,
        padded_length=max(lengths, default=0),
    )


def _varlen_attention():
    """PyTorch's varlen flash kernel (CUDA only; torch >= 2.10), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # older torch
        return None
    return varlen_attn


_varlen_failed = False  # set once if the varlen kernel refuses these inputs; "auto" then uses groups


def _attention(qkv: torch.Tensor, packed: PackedBatch, H: int, impl: str,
               plan: list[tuple] | None = None) -> torch.Tensor:
    """Self-attention of each sequence on its own: packed (N, 3C) -> context (N, C)."""
    global _varlen_failed
    N, C3 = qkv.shape
    C = C3 // 3
    D = C // H
    if impl == "auto":
        if (qkv.is_cuda and qkv.dtype in (torch.float16, torch.bfloat16)
                and _varlen_attention() is not None and not _varlen_failed):
            try:
                return _attention(qkv, packed, H, "varlen", plan)
            except (RuntimeError, TypeError, NotImplementedError) as e:
                _varlen_failed = True
                log.warning("varlen attention unavailable (%s); using length buckets", e)
        impl = "groups"
    if impl == "varlen":
        varlen_attn = _varlen_attention()
        if varlen_attn is None:
            raise RuntimeError("this torch has no torch.nn.attention.varlen")
        q, k, v = qkv.view(N, 3, H, D).unbind(1)  # (N, H, D) each
        cu = packed.cu_seqlens.to(device=qkv.device, dtype=torch.int32)  # (B+1,)
        Lmax = max(packed.lengths, default=0)
        out = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, Lmax, Lmax)  # (N, H, D), scale 1/sqrt(D)
        return out.reshape(N, C)  # (N, H, D) -> (N, C)
    plan = plan if plan is not None else attention_plan(packed)
    context = torch.empty(N, C, dtype=qkv.dtype, device=qkv.device)  # (N, C)
    for start, end, G, L, gather, keep, real in plan:
        if gather is None:  # G sequences of exactly L tokens: a free view of the packed rows
            block = qkv[start:end].view(G, L, 3, H, D)  # (G·L, 3C) -> (G, L, 3, H, D)
        else:  # shorter sequences padded to L inside the bucket; PAD keys masked out
            block = qkv.index_select(0, gather).view(G, L, 3, H, D)  # (G·L, 3C) -> (G, L, 3, H, D)
        q, k, v = block.permute(2, 0, 3, 1, 4).unbind(0)  # (G, H, L, D) each
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (G, H, L, D)@(G, H, D, L)@(G, H, L, D) -> (G, H, L, D)
        if gather is None:
            context[start:end].view(G, L, H, D).copy_(out.transpose(1, 2))  # (G, H, L, D) -> (G, L, H, D)
        else:
            grid = out.transpose(1, 2).reshape(G * L, C)  # (G, L, H, D) -> (G·L, C)
            torch.index_select(grid, 0, real, out=context[start:end])  # drop the padded queries
    return context


def attention_plan(packed: PackedBatch, slack: float | None = None) -> list[tuple]:
    """Built once per batch, used by every layer: per bucket, its packed token range, G, L, and
    for a padded bucket the gather index (G·L,), key mask (G, 1, 1, L) and real-row index."""
    if slack is None:
        slack = PAD_SLACK.get(packed.input_ids.device.type, 0.0)
    cu = packed.cu_seqlens.tolist()
    device = packed.input_ids.device
    plan = []
    for j, G, L in packed.buckets(slack):
        start, end = cu[j], cu[j + G]
        lens = packed.lengths[j:j + G]
        if all(n == L for n in lens):
            plan.append((start, end, G, L, None, None, None))
            continue
        lens_t = torch.tensor(lens, device=device)  # (G,)
        pos = torch.arange(L, device=device)  # (L,)
        keep = pos[None, :] < lens_t[:, None]  # (G, L) True = real token
        starts = torch.tensor(cu[j:j + G], device=device)  # (G,)
        gather = torch.where(keep, starts[:, None] + pos[None, :], start).reshape(-1)  # (G·L,) PAD -> any real row
        real = keep.reshape(-1).nonzero().squeeze(1)  # (n_real,) grid cells holding real tokens
        plan.append((start, end, G, L, gather, keep[:, None, None, :], real))  # mask (G, 1, 1, L)
    return plan


def fused_qkv(attention) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K, W_V stacked into one (3C, C) weight and (3C,) bias: one matmul instead of three."""
    w = torch.cat([attention.query.weight, attention.key.weight, attention.value.weight], 0)  # (3C, C)
    b = torch.cat([attention.query.bias, attention.key.bias, attention.value.bias], 0)  # (3C,)
    return w, b


_FUSED_ACT = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
              "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


def _onednn_pointwise_available() -> bool:
    """oneDNN linear with a dense input and a pre-packed weight (the op torch.compile emits)."""
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), 4)
        y = torch.ops.mkldnn._linear_pointwise(torch.ones(3, 2), w, torch.zeros(2), "none", [], "")
        return bool(torch.equal(y, torch.full((3, 2), 2.0)))
    except (AttributeError, RuntimeError, TypeError):
        return False


class _Linear:
    """y = act(x·Wᵀ + b) for one weight: oneDNN on CPU when asked, else F.linear.

    On CPUs where MKL's SGEMM is not tuned (measured here: AMD with AVX-512) oneDNN's fp32
    GEMM is 1.3-1.8x faster; it is still IEEE fp32 arithmetic (tests hold it within 1e-5).
    The weight is reordered once into oneDNN's blocked layout, and the activation (GELU) can
    run inside the GEMM as a post-op instead of as another pass over (N, I).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, onednn: bool, act: str | None = None) -> None:
        self.onednn = onednn
        self.act = act
        if onednn:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_HINT)
            self.bias = bias.detach()
        else:
            self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            attr, algo = _FUSED_ACT[self.act] if self.act else ("none", "")
            # oneDNN compiles and caches one GEMM per distinct row count N; a streaming job sees
            # hundreds of N, and resident memory grew by ~2 MiB per new N (measured). Rounding N
            # up to a multiple of _ROW_BUCKET with zero rows keeps the set of shapes small.
            n = x.shape[0]
            padded = -(-n // _ROW_BUCKET) * _ROW_BUCKET
            if padded != n:
                x = F.pad(x, (0, 0, 0, padded - n))  # (N, in) -> (N', in), zero rows at the end
            y = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, attr, [], algo)  # (N', in) -> (N', out)
            return y[:n] if padded != n else y  # (N, out)
        y = F.linear(x, self.weight, self.bias)  # (N, in)@(in, out) -> (N, out)
        return _ACTS[self.act](y) if self.act else y


_ACTS = {"gelu": F.gelu, "gelu_new": lambda y: F.gelu(y, approximate="tanh"),
         "gelu_pytorch_tanh": lambda y: F.gelu(y, approximate="tanh"), "relu": F.relu}
_PACK_HINT = 2048  # oneDNN's expected row count when it picks the weight's blocked layout
_ROW_BUCKET = 64  # row counts given to oneDNN are multiples of this (see _Linear.__call__)

# model -> (parameter versions, per-layer linears): built once, rebuilt if a weight changes.
_LINEARS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_POINTWISE: list[bool] = []  # probed once


def use_onednn(x: torch.Tensor) -> bool:
    """oneDNN GEMMs for fp32 CPU inference where this torch has them (BERTSCOPE_ONEDNN=0: off)."""
    if not (x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
            and torch.backends.mkldnn.is_available() and os.environ.get("BERTSCOPE_ONEDNN", "1") != "0"):
        return False
    if not _POINTWISE:
        _POINTWISE.append(_onednn_pointwise_available())
    return _POINTWISE[0]


def layer_linears(model, onednn: bool) -> list[tuple[_Linear, _Linear, _Linear, _Linear]]:
    """Per layer: (fused W_QKV, W_O, GELU∘W1, W2) as :class:`_Linear` callables, cached per model."""
    params = list(model.parameters())
    # Inference tensors (made under torch.inference_mode) keep no version counter, so an in-place
    # change could not be seen: such a model's linears are rebuilt on every call, never cached.
    cacheable = not any(p.is_inference() for p in params)
    key = (onednn,) + tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params) if cacheable else None
    cached = _LINEARS.get(model) if cacheable else None
    if cached is not None and cached[0] == key:
        return cached[1]
    act = model.config.hidden_act
    linears = []
    for layer in model.layers:
        att, ff = layer.attention, layer.feed_forward
        linears.append((
            _Linear(*fused_qkv(att), onednn),  # (3C, C)
            _Linear(att.output.weight, att.output.bias, onednn),  # (C, C)
            _Linear(ff.dense_in.weight, ff.dense_in.bias, onednn, act),  # (I, C), then the activation
            _Linear(ff.dense_out.weight, ff.dense_out.bias, onednn),  # (C, I)
        ))
    if cacheable:
        _LINEARS[model] = (key, linears)
    return linears


def packed_encode(model, packed: PackedBatch, attention_impl: str = "auto",
                  slack: float | None = None) -> torch.Tensor:
    """Run the encoder (embeddings and every layer, no pooler) on packed tokens: (N,) -> (N, C).

    ``model`` is a :class:`bertscope.model.BertModel` in eval mode. ``attention_impl`` is
    "auto", "groups" (SDPA per length bucket; any device) or "varlen" (CUDA flash kernel).
    ``slack`` bounds the padding inside an attention bucket (default PAD_SLACK[device]).
    """
    emb = model.embeddings
    x = (
        emb.word_embeddings(packed.input_ids)  # (N, C)
        + emb.position_embeddings(packed.position_ids)  # (N, C)
        + emb.token_type_embeddings(packed.token_type_ids)  # (N, C)
    )
    x = emb.norm(x)  # (N, C)
    H = model.config.num_attention_heads
    plan = attention_plan(packed, slack) if attention_impl != "varlen" else None  # once, for every layer
    linears = layer_linears(model, use_onednn(x))
    for layer, (w_qkv, w_o, w_1, w_2) in zip(model.layers, linears):
        qkv = w_qkv(x)  # (N, C)@(C, 3C) -> (N, 3C): W_Q, W_K, W_V in one product
        context = _attention(qkv, packed, H, attention_impl, plan)  # (N, C)
        x = layer.attention_norm(x + w_o(context))  # (N, C)@(C, C) -> (N, C)
        hidden = w_1(x)  # GELU((N, C)@(C, I)) -> (N, I)
        x = layer.output_norm(x + w_2(hidden))  # (N, I)@(I, C) -> (N, C)
    return x


def unpack(x: torch.Tensor, packed: PackedBatch, batch: int) -> torch.Tensor:
    """Restore padding once: packed (N, C) -> (B, T, C), zeros at PAD positions."""
    if packed.flat_index is None:
        raise ValueError("this PackedBatch came from lists of ids and has no padded grid")
    C = x.shape[-1]
    out = x.new_zeros(batch * packed.padded_length, C)  # (B·T, C)
    out[packed.flat_index] = x  # scatter the N real tokens back to their grid cells
    return out.view(batch, packed.padded_length, C)  # (B·T, C) -> (B, T, C)


def mean_pool(x: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Mean over each sequence's tokens, in packed order: (N, C) -> (B, C). Empty sequences give 0."""
    B = len(packed.lengths)
    seq = torch.repeat_interleave(
        torch.arange(B, device=x.device), torch.tensor(packed.lengths, device=x.device)
    )  # (N,) sequence of each token
    sums = x.new_zeros(B, x.shape[-1]).index_add_(0, seq, x)  # (B, C)
    counts = torch.tensor(packed.lengths, dtype=x.dtype, device=x.device).clamp(min=1)  # (B,)
    return sums / counts[:, None]  # (B, C)
