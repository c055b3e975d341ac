"""The attention module against torch.nn.MultiheadAttention, and its properties (S1-S9)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from bertscope import MultiHeadSelfAttention, attention_reference, mask_to_bias, to_key_padding_mask

C, H = 64, 4


def make(seed: int = 0, dropout: float = 0.1) -> MultiHeadSelfAttention:
    torch.manual_seed(seed)
    attn = MultiHeadSelfAttention(C, H, dropout).eval()
    with torch.no_grad():  # non-trivial biases so a dropped bias would show
        for lin in (attn.query, attn.key, attn.value, attn.output):
            lin.bias.normal_(0, 0.5)
    return attn


def padded_inputs(seed: int = 1):
    torch.manual_seed(seed)
    x = torch.randn(3, 7, C)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 1 + [0] * 6])
    return x, mask


def to_torch_mha(attn: MultiHeadSelfAttention) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(C, H, dropout=0.0, bias=True, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([attn.query.weight, attn.key.weight, attn.value.weight]))
        mha.in_proj_bias.copy_(torch.cat([attn.query.bias, attn.key.bias, attn.value.bias]))
        mha.out_proj.weight.copy_(attn.output.weight)
        mha.out_proj.bias.copy_(attn.output.bias)
    return mha


def test_matches_torch_multihead_attention_with_padding():
    attn = make()
    mha = to_torch_mha(attn)
    x, mask = padded_inputs()
    with torch.no_grad():
        ours, rec = attn(x, mask, output_attentions=True)
        # PyTorch's key_padding_mask is True = ignore: the opposite polarity of BERT's 1 = token.
        ref, ref_w = mha(x, x, x, key_padding_mask=to_key_padding_mask(mask), need_weights=True,
                         average_attn_weights=False)
    assert (ours - ref).abs().max() <= 1e-5
    assert (rec.probs - ref_w).abs().max() <= 1e-5


def test_mask_polarity_matters():
    """Passing BERT's mask straight to PyTorch (without conversion) gives a different answer."""
    attn = make()
    mha = to_torch_mha(attn)
    x, mask = padded_inputs()
    with torch.no_grad():
        ours, _ = attn(x, mask)
        right, _ = mha(x, x, x, key_padding_mask=to_key_padding_mask(mask), need_weights=False)
        wrong, _ = mha(x, x, x, key_padding_mask=mask.bool(), need_weights=False)
    # row 1 has 4 tokens and 3 PAD: unconverted, PyTorch attends the PAD and ignores the tokens
    assert (ours[1] - right[1]).abs().max() <= 1e-5
    assert (ours[1] - wrong[1]).abs().max() > 1e-2


def test_a_boolean_mask_is_refused_since_its_polarity_is_ambiguous(bert):
    """PyTorch's key_padding_mask (True = PAD) given where BERT's mask goes was read as True =
    token: every real token got weight 0 and the PADs all of it, with no error. A boolean mask
    is refused by the module and by the model; the integer mask it names works."""
    import pytest

    from bertscope.errors import InputError

    attn = make()
    x, mask = padded_inputs()
    for wrong in (to_key_padding_mask(mask), mask.bool()):
        with pytest.raises(InputError, match="attention_mask is boolean"):
            attn(x, wrong)
    ok, _ = attn(x, (~to_key_padding_mask(mask)).long())  # the conversion the message names
    ref, _ = attn(x, mask)
    assert torch.equal(ok, ref)
    b = bert.encode(["short one", "The animal didn't cross the street"])
    with pytest.raises(InputError, match="attention_mask is boolean"):
        bert.model(b.input_ids, to_key_padding_mask(b.attention_mask))


def test_reference_and_fused_paths_agree():
    attn = make()
    x, mask = padded_inputs()
    with torch.no_grad():
        fused, none = attn(x, mask)  # no probabilities asked: the fused SDPA path
        ref, rec = attn(x, mask, output_attentions=True)  # the explicit path
        attn.fused = False
        forced, _ = attn(x, mask)
    assert none is None and rec is not None
    assert (fused - ref).abs().max() <= 1e-5
    assert torch.equal(ref, forced)


def test_a_nan_query_stays_nan_on_the_fused_path_as_on_the_reference():
    """Without a mask, torch's CPU kernel turned a query row of NaN into zeros for fewer than
    16 tokens: a NaN weight gave a plausible output on the fused path and NaN on the reference
    path. Both give NaN in the same places now, for short and long sequences."""
    for T in (5, 15, 40):
        attn = make(dropout=0.0)
        with torch.no_grad():
            attn.query.weight[0, 0] = float("nan")
            x = torch.randn(2, T, C)
            fused, _ = attn(x)
            ref, _ = attn(x, output_attentions=True)
        assert ref.isnan().any()
        assert torch.equal(fused.isnan(), ref.isnan()), T


def test_a_torch_ao_quantized_module_still_runs():
    """The dtype check read ``query.weight.dtype``; a torch.ao dynamically quantized linear's
    ``weight`` is a method, and the module raised AttributeError."""
    attn = make(dropout=0.0)
    x = torch.randn(1, 5, C)
    quantized = torch.ao.quantization.quantize_dynamic(attn, {nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():
        out, rec = quantized(x, output_attentions=True)
        ref, _ = attn(x)
    assert out.shape == (1, 5, C) and rec.probs.shape == (1, H, 5, 5)
    assert (out - ref).abs().max() < 0.1  # int8 weights: near, not equal


def test_an_input_of_another_dtype_than_the_weights_is_one_clear_error():
    import pytest

    from bertscope.errors import InputError

    with pytest.raises(InputError, match="x is torch.bfloat16 but the module's weights are torch.float32"):
        make()(torch.randn(1, 5, C).bfloat16())


def test_rows_sum_to_one_and_pad_columns_are_exactly_zero():
    attn = make()
    x, mask = padded_inputs()
    with torch.no_grad():
        _, rec = attn(x, mask, output_attentions=True)
    assert rec.probs.shape == (3, H, 7, 7) and rec.scores.shape == (3, H, 7, 7)
    assert torch.allclose(rec.probs.sum(-1), torch.ones(3, H, 7), atol=1e-6)
    pad_cols = (mask == 0)[:, None, None, :].expand_as(rec.probs)
    assert (rec.probs[pad_cols] == 0).all()
    # and the real columns carry weight
    assert (rec.probs[~pad_cols] > 0).all()


def test_scores_are_scaled_dot_products():
    attn = make()
    x, _ = padded_inputs()
    with torch.no_grad():
        _, rec = attn(x, output_attentions=True)
        q = attn.query(x).view(3, 7, H, C // H).transpose(1, 2)
        k = attn.key(x).view(3, 7, H, C // H).transpose(1, 2)
        expected = torch.einsum("bhid,bhjd->bhij", q, k) / (C // H) ** 0.5
    assert (rec.scores - expected).abs().max() <= 1e-5


def test_real_tokens_unchanged_when_pad_is_appended():
    attn = make()
    torch.manual_seed(3)
    x = torch.randn(2, 5, C)
    x_padded = torch.cat([x, torch.randn(2, 4, C) * 10], dim=1)  # PAD positions hold garbage
    mask = torch.cat([torch.ones(2, 5), torch.zeros(2, 4)], dim=1).long()
    with torch.no_grad():
        short, _ = attn(x)
        long_fused, _ = attn(x_padded, mask)
        long_ref, _ = attn(x_padded, mask, output_attentions=True)
    assert (long_fused[:, :5] - short).abs().max() <= 1e-5
    assert (long_ref[:, :5] - short).abs().max() <= 1e-5


def test_permutation_equivariant():
    """S11: attention alone is blind to order: permuting tokens permutes the outputs."""
    attn = make()
    x, mask = padded_inputs()
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out, rec = attn(x, mask, output_attentions=True)
        out_p, rec_p = attn(x[:, perm], mask[:, perm], output_attentions=True)
    assert (out_p - out[:, perm]).abs().max() <= 1e-5
    assert (rec_p.probs - rec.probs[:, :, perm][:, :, :, perm]).abs().max() <= 1e-6


def test_dropout_only_in_training_and_at_the_configured_rate():
    p = 0.1
    attn = make(dropout=p)
    x, mask = padded_inputs()
    with torch.no_grad():
        a, _ = attn(x, mask)
        b, _ = attn(x, mask)
        assert torch.equal(a, b)  # eval: deterministic, no dropout
        attn.train()
        c, _ = attn(x, mask)
        d, _ = attn(x, mask)
        assert not torch.allclose(c, d)  # training: dropout is on (fused path)
        e, _ = attn(x, mask, output_attentions=True)
        assert not torch.allclose(e, a)  # and on the reference path

    # The rate, read off the probabilities themselves: with V = identity, context = dropped probs.
    torch.manual_seed(0)
    T = D = 64
    q, k = torch.randn(8, 4, T, D), torch.randn(8, 4, T, D)
    v = torch.eye(T).expand(8, 4, T, T)
    drop = nn.Dropout(p).train()
    context, rec = attention_reference(q, k, v, None, drop)
    zero_rate = (context == 0).float().mean().item()
    assert abs(zero_rate - p) < 0.01  # 131,072 draws: the standard error is under 0.001
    kept = context != 0
    assert torch.allclose(context[kept], rec.probs[kept] / (1 - p), rtol=1e-5, atol=1e-7)


def test_mask_to_bias_uses_dtype_minimum():
    mask = torch.tensor([[1, 1, 0]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        bias = mask_to_bias(mask, dtype)
        assert bias.shape == (1, 1, 1, 3) and bias.dtype == dtype
        assert bias[0, 0, 0, 2] == torch.finfo(dtype).min and (bias[0, 0, 0, :2] == 0).all()


def test_bad_shapes_raise_clear_errors():
    attn = make()
    import pytest

    with pytest.raises(ValueError, match=r"x must be \(B, T, 64\)"):
        attn(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        attn(torch.randn(2, 5, C), torch.ones(2, 4))
    with pytest.raises(ValueError, match="only 1 .* and 0"):
        attn(torch.randn(2, 5, C), torch.full((2, 5), 2))
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadSelfAttention(100, 12)


def test_head_mask_silences_one_head():
    attn = make()
    x, mask = padded_inputs()
    hm = torch.ones(H)
    hm[2] = 0
    with torch.no_grad():
        out, _ = attn(x, mask, head_mask=hm)
        # by hand: the context of head 2 zeroed before W_O
        _, rec = attn(x, mask, output_attentions=True)
        v = attn.value(x).view(3, 7, H, C // H).transpose(1, 2)
        ctx = rec.probs @ v
        ctx[:, 2] = 0
        expected = attn.output(ctx.transpose(1, 2).reshape(3, 7, C))
    assert (out - expected).abs().max() <= 1e-5


def test_to_key_padding_mask_refuses_values_neither_convention_has():
    """A mask of 2s was turned into "not PAD" without a word, where the model itself refuses it."""
    import pytest

    from bertscope.errors import InputError

    with pytest.raises(InputError, match="only 1 \\(token\\) and 0 \\(PAD\\)"):
        to_key_padding_mask(torch.tensor([[1, 2, 0]]))
    assert to_key_padding_mask(torch.tensor([[1, 1, 0]])).tolist() == [[False, False, True]]


def test_attention_reference_names_the_argument_that_does_not_fit():
    """A wrong bias shape raised torch's "The size of tensor a (5) must match ..." from inside
    the addition; now one line naming bias and the shape it must broadcast to."""
    from bertscope.errors import InputError

    q = torch.randn(2, 3, 5, 4)
    with pytest.raises(InputError, match=re.escape("bias must broadcast to the scores' (B, H, T, S) = (2, 3, 5, 5)")):
        attention_reference(q, q, q, torch.zeros(2, 5))
    with pytest.raises(InputError, match="q, k and v must be"):
        attention_reference(q, q[:, :, :3], q)
    with pytest.raises(InputError, match=re.escape("q must be (B, H, T, D), got shape (3, 5, 4)")):
        attention_reference(q[0], q, q)
    # keys and values may be fewer or more than the queries (S != T), and bias (B, 1, 1, S) fits
    k = torch.randn(2, 3, 7, 4)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=torch.zeros(2, 1, 1, 7))
    assert torch.allclose(attention_reference(q, k, k, torch.zeros(2, 1, 1, 7))[0], ref, atol=1e-6)
