"""Packed batches: B sequences laid end to end with no padding, and the way back.

Shape legend:
    B  sequences in the batch
    T  padded length of the batch (the longest sequence)
    N  real tokens in the batch, all sequences together (N <= B·T)
    C  hidden size

``pack`` drops the PAD positions of a padded (B, T) batch once; ``pack_ids`` builds the same
structure straight from the tokenizer's lists of ids (no padded tensor at all). Sequences are
laid out sorted by length (longest first), so sequences of equal length sit side by side and
attention can run on each length group as one dense block (:mod:`bertscope.fast.kernels`).
``unpack`` restores the padding once at the end; ``mean_pool`` pools per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["PackedBatch", "masked_mean", "mean_pool", "pack", "pack_ids", "sentence_means", "unpack"]


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


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The padded twin of :func:`mean_pool`: the mean over each row's real tokens,
    (B, T, C), (B, T) of 1 = token, 0 = PAD -> (B, C). A row with no tokens gives 0."""
    m = mask.to(hidden.dtype)[:, :, None]  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)  # (B, C)


def sentence_means(x: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Unit-length mean-pooled sentence vectors in packed order, in fp32: (N, C) -> (B, C)."""
    return torch.nn.functional.normalize(mean_pool(x.float(), packed), p=2, dim=1)  # (B, C)
