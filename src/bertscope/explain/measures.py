"""How much each token takes from each other token, six ways, for a padded batch.

Shape legend:
    B  batch
    L  layers
    H  heads
    T  tokens; maps[..., i, j] is what receiving token i takes from giving token j
    C  hidden size

:func:`run_forward` runs the model once on a padded batch (ids, mask, segments) and keeps every
layer's intermediates (a :class:`Forward`); every map function takes that and returns float32
maps with PAD rows and PAD columns exactly 0 (a PAD token neither gives nor receives):

    attention       (B, L, H, T, T)  the softmax weights α^h_ij
    norm            (B, L, H, T, T)  ‖α^h_ij f_h(x_j)‖                 Kobayashi et al. 2020
    norm-residual   (B, L, T, T)     ‖T_i(x_j)‖ / Σ_k ‖T_i(x_k)‖        Kobayashi et al. 2021
    value-zeroing   (B, L, T, T)     cosine distance, row-normalised   Mohebbi et al. 2023
    alti            (B, L, T, T)     L1 rule per layer, rolled out     Ferrando et al. 2022
    rollout         (B, L, T, T)     (½A + ½I) rolled out              Abnar & Zuidema 2020

f_h, T_i(x_j) and the LayerNorm split are in :mod:`bertscope.explain.decompose`. Rows of the
four per-layer maps sum to 1 at real tokens; ``norm`` is a raw vector length (not normalised,
as in the paper), and ``attention`` rows sum to 1 per head.

Everything runs on the padded reference path, ``bert.encoder(..., output_intermediates=True)``,
in eval mode (no dropout), so a map is a function of the text alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..core.layer import LayerRecord
from ..core.masks import mask_to_bias
from ..core.model import BertModel
from ..see.aggregate import attention_rollout, roll_out
from .decompose import attention_block_terms, head_vectors

__all__ = ["BLOCK_METHODS", "LAYER_METHODS", "HEAD_METHODS", "Forward", "alti_layer_maps", "attention_maps",
           "block_method_maps", "compose", "map_methods", "norm_maps", "norm_residual_maps", "rollout_maps",
           "value_zeroing_maps", "alti_maps", "run_forward", "zero_pad"]

HEAD_METHODS = ("attention", "norm")
LAYER_METHODS = ("norm-residual", "value-zeroing", "alti", "rollout")

# (B, R, T, C) contribution vectors are built R receiving tokens at a time: at most this many
# floats per slice (about 64 MiB in fp32) so long texts stay within memory.
_SLICE_FLOATS = 16 * 1024 * 1024


@dataclass(frozen=True)
class Forward:
    """One reference forward of a padded batch, with every layer's record.

    mask: (B, T) float, 1 = token, 0 = PAD.
    records: L :class:`LayerRecord`.
    """

    model: BertModel
    input_ids: torch.Tensor
    mask: torch.Tensor
    token_type_ids: torch.Tensor
    records: tuple[LayerRecord, ...]


@torch.no_grad()
def run_forward(model: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> Forward:
    """The padded reference forward with intermediates (the model must be in eval mode)."""
    if model.training:
        raise ValueError("explanations need the model in eval mode (dropout would change every map)")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    out = model(input_ids, attention_mask, token_type_ids, output_intermediates=True)
    return Forward(model=model, input_ids=input_ids, mask=attention_mask.to(out.last_hidden_state.dtype),
                   token_type_ids=token_type_ids, records=out.intermediates)


def zero_pad(maps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero PAD rows and PAD columns: maps (B, ..., T, T) times mask_i · mask_j."""
    m = mask.to(maps.dtype)  # (B, T)
    shape = (m.shape[0],) + (1,) * (maps.dim() - 3) + (m.shape[1],)
    pair = m.view(shape)[..., :, None] * m.view(shape)[..., None, :]  # (B, 1.., T, T)
    return maps * pair


def _row_normalise(maps: torch.Tensor) -> torch.Tensor:
    """Each row divided by its sum (rows that sum to 0, PAD rows, stay 0)."""
    total = maps.sum(dim=-1, keepdim=True)  # (..., T, 1)
    return torch.where(total > 0, maps / total.clamp_min(torch.finfo(maps.dtype).tiny), torch.zeros_like(maps))


def compose(maps: torch.Tensor) -> torch.Tensor:
    """Layer-wise maps M_l (B, L, T, T) -> rolled out R_l = M_l · R_{l−1}, R_0 = M_0 (Abnar & Zuidema 2020).

    Row i of R_l says how much of input token j has reached token i after layer l. Computed
    in float64: rows of row-stochastic products stay at sum 1 to ~1e-15.
    """
    return roll_out(maps).to(maps.dtype)  # (B, L, T, T)


def attention_maps(fw: Forward) -> torch.Tensor:
    """α^h_ij, the softmax weights as the model computed them: (B, L, H, T, T)."""
    probs = torch.stack([r.attention.probs for r in fw.records], dim=1)  # (B, L, H, T, T)
    return zero_pad(probs.float(), fw.mask)


def norm_maps(fw: Forward) -> torch.Tensor:
    """Kobayashi et al. 2020: ‖α^h_ij f_h(x_j)‖ = α^h_ij ‖f_h(x_j)‖, (B, L, H, T, T).

    f_h(x) = (x W_V^h + b_V^h) W_O^h, the bias of W_O left out. Raw lengths in the hidden
    space, not normalised: a large weight on a token whose transformed vector is short moves
    little (the paper's finding for [CLS], [SEP] and punctuation).
    """
    out = []
    with torch.no_grad():
        for layer, rec in zip(fw.model.layers, fw.records):
            f_len = head_vectors(layer, rec).norm(dim=-1)  # (B, H, T, C) -> (B, H, T)
            out.append(rec.attention.probs * f_len[:, :, None, :])  # (B, H, T, T) * (B, H, 1, T)
    return zero_pad(torch.stack(out, dim=1).float(), fw.mask)  # (B, L, H, T, T)


def _norm_residual_score(contrib: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """‖T_i(x_j)‖₂ of every giving token j (PAD scored 0): (B, R, T, C) -> (B, R, T)."""
    return contrib.norm(dim=-1) * mask[:, None, :].to(contrib.dtype)  # (B, R, T)


def _alti_score(contrib: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁) of every giving token j (PAD scored 0): (B, R, T)."""
    y = contrib.sum(dim=2, keepdim=True)  # (B, R, 1, C)
    closeness = y.abs().sum(-1) - (y - contrib).abs().sum(-1)  # (B, R, 1) - (B, R, T) -> (B, R, T)
    return closeness.clamp_min(0) * mask[:, None, :].to(contrib.dtype)  # (B, R, T)


# the methods that score the attention block's decomposition, per layer, before rows are normalised
_BLOCK_SCORES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "norm-residual": _norm_residual_score, "alti": _alti_score}
BLOCK_METHODS = tuple(_BLOCK_SCORES)


def _block_maps(fw: Forward, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Per layer, each named score of the contributions (B, R, T, C) for every query slice:
    name -> (B, L, T, T). One decomposition serves every name (norm-residual and alti both)."""
    B, T = fw.mask.shape
    C = fw.records[0].input.shape[-1]
    step = max(1, _SLICE_FLOATS // max(1, B * T * C))
    maps: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    with torch.no_grad():
        for layer, rec in zip(fw.model.layers, fw.records):
            f = head_vectors(layer, rec)  # (B, H, T, C)
            parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
            for start in range(0, T, step):
                terms = attention_block_terms(layer, rec, slice(start, min(T, start + step)), f=f)
                for name in names:
                    parts[name].append(_BLOCK_SCORES[name](terms.contributions, fw.mask))  # (B, R, T)
            for name in names:
                maps[name].append(torch.cat(parts[name], dim=1))  # (B, T, T)
    return {name: torch.stack(m, dim=1) for name, m in maps.items()}  # (B, L, T, T)


def block_method_maps(fw: Forward, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """norm-residual and alti (any of them named) from one decomposition of each layer: name ->
    (B, L, T, T), as :func:`norm_residual_maps` and :func:`alti_maps` give them alone."""
    names = list(dict.fromkeys(names))  # a name asked for twice is computed once
    if not names:
        return {}
    raw = _block_maps(fw, names)
    out = {}
    for name in names:
        layer_maps = _normalised(raw[name], fw.mask)
        out[name] = layer_maps if name == "norm-residual" else zero_pad(compose(layer_maps), fw.mask)
    return out


def _normalised(raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scores (B, L, T, T) -> per-layer maps whose real rows sum to 1."""
    return zero_pad(_row_normalise(raw.float()), mask)


def norm_residual_maps(fw: Forward) -> torch.Tensor:
    """Kobayashi et al. 2021 (attention + residual + LayerNorm), a per-layer mixing map (B, L, T, T).

    N_ij = ‖T_i(x_j)‖₂ / Σ_k ‖T_i(x_k)‖₂, with T_i(x_j) the part of the first LayerNorm's
    output h_i that token j sends (its own residual included for j = i; see
    :mod:`~bertscope.explain.decompose`). Rows sum to 1. The diagonal is the share a token
    keeps of itself; the paper's finding is that it dominates.
    """
    return block_method_maps(fw, ["norm-residual"])["norm-residual"]


def alti_layer_maps(fw: Forward) -> torch.Tensor:
    """Ferrando et al. 2022's per-layer contributions (before rollout), (B, L, T, T).

    With y_i = Σ_j T_i(x_j) (the block's output less the part no token owns),

        c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁) / Σ_k max(0, ‖y_i‖₁ − ‖y_i − T_i(x_k)‖₁)

    a token's vector counts by how close it lies to the sum y_i: ‖y_i‖₁ less its L1 distance
    to y_i, floored at 0 (the paper's L1-distance rule; a vector far from the sum, or pointing
    away from it, counts 0). Rows sum to 1.
    """
    return _normalised(_block_maps(fw, ["alti"])["alti"], fw.mask)


def alti_maps(fw: Forward) -> torch.Tensor:
    """ALTI, Aggregation of Layer-wise Token-to-token Interactions (Ferrando et al. 2022), (B, L, T, T).

    The per-layer contributions of :func:`alti_layer_maps`, rolled out through the layers with
    :func:`compose`: map l says how much of each input token has reached token i after layer l.
    The feed-forward sublayer acts on each token alone and mixes nothing, so it is left out, as
    in the paper. Rows sum to 1.
    """
    return block_method_maps(fw, ["alti"])["alti"]


def rollout_maps(fw: Forward) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020), (B, L, T, T).

    Each layer's head-mean attention with the residual as an equal partner, Â_l = ½·mean_h(A_l) + ½·I
    (rows sum to 1), multiplied through the layers: R_l = Â_l · R_{l−1}. The arithmetic is the
    explorer's own (:func:`bertscope.see.aggregate.attention_rollout`), per text.
    """
    A = attention_maps(fw)  # (B, L, H, T, T)
    rolled = torch.stack([attention_rollout(a) for a in A])  # (B, L, T, T)
    return zero_pad(rolled.float(), fw.mask)


def value_zeroing_maps(fw: Forward, max_tokens: int = 8192) -> torch.Tensor:
    """Value zeroing (Mohebbi et al. 2023), (B, L, T, T).

    In layer l, with the layer's actual input, zero token j's value vector (all heads; every
    query then gets nothing from j through attention, while j's residual stays), run the whole
    layer, and measure how far token i's layer output moved:

        VZ_ij = d_cos(x̃_i^{¬j}, x̃_i) / Σ_k d_cos(x̃_i^{¬k}, x̃_i),   d_cos(a, b) = 1 − a·b / (‖a‖‖b‖)

    One batch of copies of the sequence, copy j with ``value_mask`` 0 at j, gives every j of a
    layer in one call of the model's own layer (at most ``max_tokens`` tokens per call). Rows sum to 1.
    """
    model = fw.model
    B, T = fw.mask.shape
    bias = mask_to_bias(fw.mask, fw.records[0].input.dtype)  # (B, 1, 1, T)
    per_call = max(1, max_tokens // T)  # copies per call
    eye = torch.eye(T, dtype=fw.mask.dtype, device=fw.mask.device)  # (T, T)
    maps = torch.zeros(B, len(model.layers), T, T, dtype=torch.float64, device=fw.mask.device)
    with torch.no_grad():
        for l, (layer, rec) in enumerate(zip(model.layers, fw.records)):
            for b in range(B):
                real = fw.mask[b].nonzero().flatten()  # the real tokens' positions
                x = rec.input[b:b + 1]  # (1, T, C)
                ref = rec.output[b]  # (T, C)
                for start in range(0, len(real), per_call):
                    js = real[start:start + per_call]  # (K,)
                    K = len(js)
                    value_mask = 1.0 - eye[js]  # (K, T): copy k has token js[k]'s value zeroed
                    out, _ = layer(x.expand(K, -1, -1), bias[b:b + 1].expand(K, -1, -1, -1),
                                   value_mask=value_mask)  # (K, T, C)
                    cos = torch.nn.functional.cosine_similarity(out.double(), ref.double()[None], dim=-1)  # (K, T)
                    maps[b, l, :, js] = (1.0 - cos).transpose(0, 1)  # (T, K): rows i, columns j
    return zero_pad(_row_normalise(maps.clamp_min(0)).float(), fw.mask)


def map_methods() -> dict[str, Callable[[Forward], torch.Tensor]]:
    """The map methods by name, in the order they are shown."""
    return {"attention": attention_maps, "norm": norm_maps, "norm-residual": norm_residual_maps,
            "value-zeroing": value_zeroing_maps, "alti": alti_maps, "rollout": rollout_maps}
