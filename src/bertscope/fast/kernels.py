"""Attention on packed tokens: each sequence attends only to itself, with no PAD arithmetic.

Shape legend:
    N  real tokens in the batch, all sequences together
    G  sequences in one attention bucket, each padded (inside attention only) to L tokens
    L  the longest length in a bucket
    H  heads, D head size, C = H·D hidden size

Two ways, chosen per call by :class:`AttentionKernels`:
  * groups: consecutive sequences (sorted longest first) form buckets. Where all G have exactly
    L tokens, their (G·L, 3C) rows are a free view as (G, L, 3, H, D) and SDPA needs no mask; a
    bucket of nearly equal lengths is gathered into (G, L) with its few PAD keys masked (the
    padding is bounded by ``slack`` and only attention sees it). Works on any device, under
    autograd, and with attention dropout.
  * varlen: PyTorch's variable-length flash kernel over all N tokens at once (CUDA, fp16/bf16,
    inference). If it refuses an input, that (dtype, head size) falls back to groups, for this
    kernels object only.

The arithmetic equals the padded reference (a PAD key gets weight exactly 0 there, and here it
is simply absent); tests hold the two within 1e-5 in fp32.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .packing import PackedBatch

__all__ = ["AttentionKernels", "AttentionPlan", "Bucket", "DEFAULT_SLACK", "attention_plan", "varlen_kernel"]

log = logging.getLogger(__name__)

# Attention buckets may pad sequences up to this fraction of their real tokens. On CPU exact
# equal-length groups (0.0) measured fastest on the machine the defaults were set on; on CUDA
# fewer, larger kernel calls pay. The measured kernel choice may override it per machine.
DEFAULT_SLACK = {"cpu": 0.0, "cuda": 0.25}


@dataclass(frozen=True)
class Bucket:
    """One attention call: packed rows start:end hold G sequences padded to L inside attention.

    gather: (G·L,) packed row of each grid cell (PAD cells point at any real row), or None when
        all G sequences have exactly L tokens (the rows are then a free view).
    keep:   (G, 1, 1, L) True = a real key, or None.
    real:   (n,) the grid cells that hold real tokens, or None.
    """

    start: int
    end: int
    G: int
    L: int
    gather: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    real: torch.Tensor | None = None


AttentionPlan = list[Bucket]


def attention_plan(packed: PackedBatch, slack: float | None = None) -> AttentionPlan:
    """The buckets of a batch: built once per batch, used by every layer."""
    if slack is None:
        slack = DEFAULT_SLACK.get(packed.input_ids.device.type, 0.0)
    cu = packed.cu_seqlens.tolist()
    device = packed.input_ids.device
    plan: AttentionPlan = []
    for j, G, L in packed.buckets(slack):
        start, end = cu[j], cu[j + G]
        lens = packed.lengths[j:j + G]
        if all(n == L for n in lens):
            plan.append(Bucket(start, end, G, L))
            continue
        lens_t = torch.tensor(lens, device=device)  # (G,)
        pos = torch.arange(L, device=device)  # (L,)
        keep = pos[None, :] < lens_t[:, None]  # (G, L) True = real token
        starts = torch.tensor(cu[j:j + G], device=device)  # (G,)
        gather = torch.where(keep, starts[:, None] + pos[None, :], start).reshape(-1)  # (G·L,) PAD -> any real row
        real = keep.reshape(-1).nonzero().squeeze(1)  # (n_real,) grid cells holding real tokens
        plan.append(Bucket(start, end, G, L, gather, keep[:, None, None, :], real))  # mask (G, 1, 1, L)
    return plan


def varlen_kernel():
    """PyTorch's varlen flash attention (CUDA only; torch >= 2.10), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # older torch
        return None
    return varlen_attn


# What a kernel that refuses its input raises, across torch versions.
_KERNEL_REFUSALS = (RuntimeError, TypeError, NotImplementedError, ValueError)


@dataclass
class AttentionKernels:
    """The packed attention kernels and what this object has learnt about them.

    ``varlen_refused`` holds the (dtype, head size) pairs the varlen kernel refused; "auto" uses
    groups for those from then on. The state lives here, in the object the fast path owns, never
    in module globals.
    """

    varlen_refused: set[tuple[torch.dtype, int]] = field(default_factory=set)

    def _varlen_usable(self, qkv: torch.Tensor, D: int, dropout_p: float) -> bool:
        return (qkv.is_cuda and qkv.dtype in (torch.float16, torch.bfloat16) and dropout_p == 0.0
                and not torch.is_grad_enabled() and varlen_kernel() is not None
                and (qkv.dtype, D) not in self.varlen_refused)

    def attend(self, qkv: torch.Tensor, packed: PackedBatch, H: int, *, impl: str = "auto",
               plan: AttentionPlan | None = None, dropout_p: float = 0.0) -> torch.Tensor:
        """Self-attention of each sequence on its own: packed (N, 3C) -> context (N, C).

        ``qkv`` holds each token's query, key and value side by side (C each). It may carry
        extra rows after the N real tokens (the encoder rounds row counts up for oneDNN); their
        context rows are zeros. ``impl`` is "auto", "groups" or "varlen". ``dropout_p`` > 0
        applies attention dropout (training).
        """
        C3 = qkv.shape[1]  # (N, 3C), N >= packed.num_tokens
        D = C3 // 3 // H
        if impl == "auto":
            if self._varlen_usable(qkv, D, dropout_p):
                try:
                    return self._varlen(qkv, packed, H)
                except _KERNEL_REFUSALS as e:
                    self.varlen_refused.add((qkv.dtype, D))
                    log.warning("varlen attention refused %s, head size %d (%s); using length buckets",
                                qkv.dtype, D, e)
            impl = "groups"
        if impl == "varlen":
            return self._varlen(qkv, packed, H)
        if impl != "groups":
            raise ValueError(f"unknown attention implementation {impl!r}; choose auto, groups or varlen")
        return self._groups(qkv, packed, H, plan if plan is not None else attention_plan(packed), dropout_p)

    @staticmethod
    def _varlen(qkv: torch.Tensor, packed: PackedBatch, H: int) -> torch.Tensor:
        varlen_attn = varlen_kernel()
        if varlen_attn is None:
            raise RuntimeError("this torch has no torch.nn.attention.varlen")
        rows, C3 = qkv.shape
        N, C = packed.num_tokens, C3 // 3
        qkv = qkv[:N]  # (N, 3C): the real tokens
        q, k, v = qkv.view(N, 3, H, C // H).unbind(1)  # (N, H, D) each
        cu = packed.cu_seqlens.to(device=qkv.device, dtype=torch.int32)  # (B+1,)
        Lmax = max(packed.lengths, default=0)
        out = varlen_attn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, Lmax, Lmax)  # (N, H, D), scale 1/sqrt(D)
        out = out.reshape(N, C)  # (N, H, D) -> (N, C)
        return out if rows == N else F.pad(out, (0, 0, 0, rows - N))  # (rows, C), zeros after the real tokens

    @staticmethod
    def _groups(qkv: torch.Tensor, packed: PackedBatch, H: int, plan: AttentionPlan,
                dropout_p: float) -> torch.Tensor:
        rows, C3 = qkv.shape  # rows >= N: any rows after the real tokens get zero context
        N, C = packed.num_tokens, C3 // 3
        D = C // H
        # Inference writes each bucket straight into one (rows, C) buffer; under autograd the
        # buckets are concatenated instead (in-place writes into a buffer are not differentiable).
        context = None if torch.is_grad_enabled() else qkv.new_empty(rows, C)  # (rows, C)
        if context is not None and rows > N:
            context[N:].zero_()
        parts = []
        for b in plan:
            if b.gather is None:  # G sequences of exactly L tokens: a free view of the packed rows
                block = qkv[b.start:b.end].view(b.G, b.L, 3, H, D)  # (G·L, 3C) -> (G, L, 3, H, D)
            else:  # shorter sequences padded to L inside the bucket; PAD keys masked out
                block = qkv.index_select(0, b.gather).view(b.G, b.L, 3, H, D)  # (G·L, 3C) -> (G, L, 3, H, D)
            q, k, v = block.permute(2, 0, 3, 1, 4).unbind(0)  # (G, H, L, D) each
            keep = b.keep
            if keep is None and context is None:  # under autograd: masked, a NaN query stays NaN up to
                keep = torch.ones(b.G, 1, 1, b.L, dtype=torch.bool, device=qkv.device)  # the loss (gemm.refuse_non_finite)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)  # (G, H, L, D)@(G, H, D, L)@(G, H, L, D) -> (G, H, L, D)
            by_token = out.transpose(1, 2)  # (G, H, L, D) -> (G, L, H, D)
            if b.real is None:
                if context is not None:
                    context[b.start:b.end].view(b.G, b.L, H, D).copy_(by_token)  # (G·L, C) as (G, L, H, D)
                else:
                    parts.append(by_token.reshape(b.G * b.L, C))  # (G·L, C)
                continue
            grid = by_token.reshape(b.G * b.L, C)  # (G·L, C)
            if context is not None:
                torch.index_select(grid, 0, b.real, out=context[b.start:b.end])  # drop the padded queries
            else:
                parts.append(grid.index_select(0, b.real))  # (n_real, C)
        if context is not None:
            return context
        if rows > N or not parts:
            parts.append(qkv.new_zeros(rows - N, C))  # (rows - N, C)
        return parts[0] if len(parts) == 1 else torch.cat(parts, 0)  # (rows, C): buckets cover rows in order
