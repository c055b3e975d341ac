"""Properties of the maths, on random shapes, lengths and masks (hypothesis).

Each property holds for every input, so hypothesis draws them: PAD invariance, permutation
equivariance of attention without positions, packed equals padded for any lengths (1 and 512
included), attention rows that sum to 1 with PAD columns exactly 0, and an all-ones head_mask
that changes nothing. Draws are derandomized (the same examples on every machine and run) and
few, so each property costs a few seconds. Tolerances are far above fp32 rounding (outputs are
LayerNorm-scaled, O(1)) and far below what a real defect (a PAD leak, a lost head) changes.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bertscope
from bertscope.fast.encoder import PackedEncoder

TOL = 1e-4
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def tiny() -> tuple[bertscope.BertModel, PackedEncoder]:
    torch.manual_seed(11)
    cfg = bertscope.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=512)
    return bertscope.BertModel(cfg).eval(), PackedEncoder()


def batch(lengths: list[int], seed: int, T: int | None = None):
    """Random ids (B, T) with the given real lengths, a 0/1 mask and random segment ids."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths) if T is None else T
    ids = torch.randint(1, 200, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    types = torch.randint(0, 2, (len(lengths), T), generator=g) * mask
    return ids * mask, mask, types  # PAD id 0 at PAD positions


lengths_st = st.lists(st.integers(1, 48), min_size=1, max_size=5)


@PROPERTY
@given(alone=st.integers(1, 48), others=lengths_st, extra_pad=st.integers(0, 16), seed=st.integers(0, 2 ** 16))
def test_a_text_alone_equals_the_same_text_padded_in_a_batch(alone, others, extra_pad, seed):
    model, _ = tiny()
    lengths = [alone] + others
    ids, mask, types = batch(lengths, seed, T=max(lengths) + extra_pad)
    with torch.inference_mode():
        together = model(ids, mask, types).last_hidden_state[0, :alone]  # (L, C)
        single = model(ids[:1, :alone], mask[:1, :alone], types[:1, :alone]).last_hidden_state[0]  # (L, C)
    assert (together - single).abs().max() < TOL


@PROPERTY
@given(B=st.integers(1, 3), T=st.integers(1, 24), heads=st.sampled_from([1, 2, 4, 8]),
       seed=st.integers(0, 2 ** 16), masked=st.booleans())
def test_attention_without_positions_is_permutation_equivariant(B, T, heads, seed, masked):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    attn = bertscope.MultiHeadSelfAttention(32, heads, dropout=0.0).eval()
    x = torch.randn(B, T, 32, generator=g)  # (B, T, C)
    mask = (torch.rand(B, T, generator=g) < 0.7).long() if masked else torch.ones(B, T, dtype=torch.long)
    mask[:, 0] = 1  # at least one real key per sequence
    perm = torch.randperm(T, generator=g)
    with torch.inference_mode():
        out, _ = attn(x, mask)  # (B, T, C)
        out_p, _ = attn(x[:, perm], mask[:, perm])  # the same tokens, shuffled
    assert (out_p - out[:, perm]).abs().max() < TOL


@PROPERTY
@given(lengths=st.lists(st.one_of(st.sampled_from([1, 512]), st.integers(1, 512)), min_size=1, max_size=4),
       seed=st.integers(0, 2 ** 16))
def test_packed_equals_padded_for_any_lengths(lengths, seed):
    model, encoder = tiny()
    ids, mask, types = batch(lengths, seed)
    with torch.inference_mode():
        fast = encoder.forward(model, ids, mask, types)
        ref = model(ids, mask, types)
    real = mask.bool()
    assert (fast.last_hidden_state - ref.last_hidden_state)[real].abs().max() < TOL
    assert int((fast.last_hidden_state[~real] != 0).sum()) == 0  # the packed path leaves PAD at zero
    assert (fast.pooler_output - ref.pooler_output).abs().max() < TOL


@PROPERTY
@given(lengths=lengths_st, extra_pad=st.integers(0, 8), seed=st.integers(0, 2 ** 16))
def test_attention_rows_sum_to_one_and_pad_columns_are_zero(lengths, extra_pad, seed):
    model, _ = tiny()
    ids, mask, types = batch(lengths, seed, T=max(lengths) + extra_pad)
    with torch.inference_mode():
        out = model(ids, mask, types, output_attentions=True)
    for probs in out.attentions:  # (B, H, T, T) per layer
        assert (probs.sum(-1) - 1).abs().max() < 1e-5
        pad_keys = (mask == 0)[:, None, None, :].expand_as(probs)
        assert int((probs[pad_keys] != 0).sum()) == 0  # exactly 0, not merely small


@PROPERTY
@given(lengths=lengths_st, seed=st.integers(0, 2 ** 16), attentions=st.booleans())
def test_a_head_mask_of_all_ones_is_the_identity(lengths, seed, attentions):
    model, _ = tiny()
    ids, mask, types = batch(lengths, seed)
    cfg = model.config
    ones = torch.ones(cfg.num_hidden_layers, cfg.num_attention_heads)
    with torch.inference_mode():
        plain = model(ids, mask, types, output_attentions=attentions)
        masked = model(ids, mask, types, output_attentions=attentions, head_mask=ones)
    assert torch.equal(plain.last_hidden_state, masked.last_hidden_state)  # x * 1.0 is exact
    assert torch.equal(plain.pooler_output, masked.pooler_output)
