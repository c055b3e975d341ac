"""The packed path against the padded reference path and against HF transformers."""

from __future__ import annotations

import re
import weakref

import numpy as np
import pytest
import torch

import bertscope
from bertscope.fast.batching import token_budget_batches
from bertscope.fast.encoder import PackedEncoder, packed_encode
from bertscope.fast.packing import masked_mean, mean_pool, pack, pack_ids, unpack

TOL = 1e-5


_ENCODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # one fast path per model, as Bert keeps one


def _both_paths(model, ids, mask, types=None):
    """last_hidden_state and pooler of the packed path and of the padded reference path (the model)."""
    encoder = _ENCODERS.setdefault(model, PackedEncoder())
    with torch.inference_mode():
        fast = encoder.forward(model, ids, mask, types)
        ref = model(ids, mask, types)
    return fast, ref


def test_packed_equals_reference_with_1_and_512_token_texts():
    torch.manual_seed(0)
    cfg = bertscope.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=128)
    model = bertscope.BertModel(cfg).eval()
    lengths = [512, 1, 37, 37, 200, 2, 1]
    B, T = len(lengths), 512
    ids = torch.randint(1, cfg.vocab_size, (B, T))
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    types = torch.randint(0, 2, (B, T)) * mask
    fast, ref = _both_paths(model, ids, mask, types)
    real = mask.bool()
    assert (fast.last_hidden_state - ref.last_hidden_state)[real].abs().max() < TOL
    assert (fast.pooler_output - ref.pooler_output).abs().max() < TOL
    assert fast.last_hidden_state[~real].abs().max() == 0  # PAD positions are zeros


def test_packed_equals_reference_on_bundled_model_mixed_batch(bert):
    long_text = " ".join(["word"] * 600)  # cut to 512 tokens (the model's positions)
    texts = ["a", long_text, "The animal didn't cross the street because it was too tired",
             "hi", "a b c d e f"]
    ids, _ = bert.tokenizer.encode_ids(texts, max_length=512)
    ids.insert(2, [bert.tokenizer.cls_id])  # a 1-token sequence in the same padded batch
    assert min(len(t) for t in ids) == 1 and max(len(t) for t in ids) == 512
    T = 512
    inp = torch.zeros(len(ids), T, dtype=torch.long)
    mask = torch.zeros(len(ids), T, dtype=torch.long)
    for b, t in enumerate(ids):
        inp[b, :len(t)] = torch.tensor(t)
        mask[b, :len(t)] = 1
    fast, ref = _both_paths(bert.model, inp, mask)
    real = mask.bool()  # 512 tokens: hidden states reach |h| ~ 10, so 1e-5 of the size is allowed too
    torch.testing.assert_close(fast.last_hidden_state[real], ref.last_hidden_state[real], atol=TOL, rtol=TOL)
    torch.testing.assert_close(fast.pooler_output, ref.pooler_output, atol=TOL, rtol=TOL)
    # A single [CLS]-only sequence (1 token) as a batch of its own.
    one = torch.tensor([[ids[0][0]]])
    fast1, ref1 = _both_paths(bert.model, one, torch.ones_like(one))
    assert (fast1.last_hidden_state - ref1.last_hidden_state).abs().max() < TOL


def test_packed_matches_hf_transformers(bert, hf_model):
    texts = ["short", "The animal didn't cross the street because it was too tired", "x " * 40]
    batch = bert.encode(texts)
    with torch.inference_mode():
        ours = bert(batch.input_ids, batch.attention_mask).last_hidden_state  # the packed path
        theirs = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    real = batch.attention_mask.bool()
    assert (ours - theirs)[real].abs().max() < TOL


def test_attention_probabilities_still_take_the_reference_path(bert):
    batch = bert.encode(["one text", "and another one here"])
    with torch.inference_mode():
        out = bert.model(batch.input_ids, batch.attention_mask, output_attentions=True)
    assert out.attentions is not None and len(out.attentions) == bert.config.num_hidden_layers


def test_pack_unpack_roundtrip_and_order():
    ids = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 10], [11, 0, 0, 0]])
    mask = (ids != 0).long()
    p = pack(ids, mask, None)
    assert p.lengths == [4, 2, 1] and p.order == [1, 0, 2]
    assert p.input_ids.tolist() == [7, 8, 9, 10, 5, 6, 11]
    assert p.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 0]
    assert p.cu_seqlens.tolist() == [0, 4, 6, 7]
    back = unpack(p.input_ids[:, None].float(), p, 3)[..., 0]
    assert torch.equal(back.long(), ids)


def test_mean_pool_matches_padded_mean():
    torch.manual_seed(1)
    p = pack_ids([[1, 2, 3], [4], [5, 6]])
    x = torch.randn(p.num_tokens, 8)
    pooled = mean_pool(x, p)
    assert torch.allclose(pooled[0], x[0:3].mean(0)) and torch.allclose(pooled[2], x[5:6].mean(0))
    # the padded twin: the same three texts laid out (B, T) with garbage at PAD, and a fourth
    # row with no tokens at all (its mean is 0)
    padded = torch.full((4, 3, 8), 100.0)  # (B, T, C)
    padded[0, :3], padded[1, :2], padded[2, :1] = x[0:3], x[3:5], x[5:6]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(masked_mean(padded, mask), torch.cat([pooled, torch.zeros(1, 8)]))


def test_token_budget_batches_cover_every_index_once():
    lengths = [5, 300, 1, 17, 17, 600, 2, 9]
    batches = token_budget_batches(lengths, max_tokens=320)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or sum(lengths[i] for i in b) <= 320
    assert batches[0] == [5]  # the longest first, alone since it exceeds the budget
    assert all(len(b) <= 2 for b in token_budget_batches(lengths, 10_000, max_texts=2))
    with pytest.raises(ValueError):
        token_budget_batches(lengths, 0)


def test_embed_returns_input_order_and_matches_sentence_transformers(bert, bundled_path):
    from sentence_transformers import SentenceTransformer

    texts = ["the " * n + "end" for n in (50, 1, 120, 7, 7, 0, 30)]
    ours = bert.embed(texts, batch_tokens=100)  # several batches, reordered inside
    st = SentenceTransformer(str(bundled_path), device="cpu")
    theirs = st.encode(texts, batch_size=3, convert_to_numpy=True)
    assert np.abs(ours - theirs).max() < TOL
    # each row equals embedding that text alone: nothing shuffled
    for i in (0, 3, 6):
        assert np.abs(ours[i] - bert.embed([texts[i]])[0]).max() < TOL


@pytest.mark.parametrize("slack", [0.0, 0.25, 10.0])
def test_packed_attention_buckets_any_slack_equal_reference(slack):
    torch.manual_seed(3)
    cfg = bertscope.BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=64)
    model = bertscope.BertModel(cfg).eval()
    lengths = [60, 59, 59, 40, 33, 33, 33, 7, 2, 1]
    T = max(lengths)
    ids = torch.randint(1, cfg.vocab_size, (len(lengths), T))
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    p = pack(ids, mask, None)
    buckets = p.buckets(slack)
    assert sum(G for _, G, _ in buckets) == len(lengths)
    if slack == 0.0:  # exact length groups
        assert [(G, L) for _, G, L in buckets] == [(1, 60), (2, 59), (1, 40), (3, 33), (1, 7), (1, 2), (1, 1)]
    if slack == 10.0:  # everything in one padded bucket
        assert len(buckets) == 1
    with torch.inference_mode():
        fast = unpack(packed_encode(model, p, slack=slack), p, len(lengths))
        ref = model(ids, mask).last_hidden_state
    assert (fast - ref)[mask.bool()].abs().max() < TOL


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("onednn", ["1", "0"])
def test_packed_every_activation_and_gemm_backend(act, onednn, monkeypatch):
    monkeypatch.setenv("BERTSCOPE_ONEDNN", onednn)
    torch.manual_seed(4)
    cfg = bertscope.BertConfig(vocab_size=300, hidden_size=48, num_hidden_layers=2,
                               num_attention_heads=3, intermediate_size=96, hidden_act=act)
    model = bertscope.BertModel(cfg).eval()
    lengths = [9, 1, 30, 30]
    ids = torch.randint(1, cfg.vocab_size, (4, 30))
    mask = (torch.arange(30)[None, :] < torch.tensor(lengths)[:, None]).long()
    fast, ref = _both_paths(model, ids, mask)
    assert (fast.last_hidden_state - ref.last_hidden_state)[mask.bool()].abs().max() < TOL


@pytest.mark.parametrize("make_in_inference_mode", [False, True])
def test_packed_path_sees_weight_changes(make_in_inference_mode):
    """The packed path caches fused / pre-packed weights; an in-place weight change must show."""
    torch.manual_seed(0)
    cfg = bertscope.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=128)
    if make_in_inference_mode:
        with torch.inference_mode():
            model = bertscope.BertModel(cfg).eval()
    else:
        model = bertscope.BertModel(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    before, _ = _both_paths(model, ids, mask)
    with torch.inference_mode() if make_in_inference_mode else torch.no_grad():
        model.layers[1].attention.value.weight.mul_(-1.5)
        model.layers[0].feed_forward.dense_in.bias.add_(0.3)
    fast, ref = _both_paths(model, ids, mask)
    real = mask.bool()
    assert (fast.last_hidden_state - before.last_hidden_state)[real].abs().max() > 1e-2
    assert (fast.last_hidden_state - ref.last_hidden_state)[real].abs().max() < TOL


def test_a_nan_weight_is_refused_by_the_fast_path_not_turned_into_a_plausible_embedding(bert):
    """A NaN in W_Q gave a finite, unit-length embedding: torch's unmasked CPU attention kernel
    (the exact-length groups) turns a query row of NaN into zeros for fewer than 16 tokens, where
    the reference path gives NaN. The fast path now refuses such weights, and works again once
    they are restored."""
    from bertscope.errors import NonFiniteError

    texts = ["The animal didn't cross the street"]  # 9 tokens: one exact-length group
    before = bert.embed(texts)
    w = bert.model.layers[2].attention.query.weight
    kept = w[0, 0].item()
    try:
        with torch.no_grad():
            w[0, 0] = float("nan")
        ids = bert.encode(texts).input_ids
        with torch.inference_mode():
            assert bert.model(ids).last_hidden_state.isnan().any()  # the reference: NaN
        with pytest.raises(NonFiniteError, match=re.escape("layers.2.attention.query.weight holds 1 NaN")):
            bert.embed(texts)
        with pytest.raises(NonFiniteError):
            bert(ids)
    finally:
        with torch.no_grad():
            w[0, 0] = kept
    assert torch.equal(torch.as_tensor(bert.embed(texts)), torch.as_tensor(before))


def test_a_nan_written_in_place_into_a_model_made_under_inference_mode_is_refused():
    """Such a model keeps no version counters, so the check (run once per change of the
    weights) did not see an in-place NaN until a tensor was replaced; it now runs on every call
    for such a model. Huge finite weights, whose sum overflows, are not taken for NaN."""
    from bertscope.errors import NonFiniteError

    torch.manual_seed(0)
    cfg = bertscope.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=128)
    with torch.inference_mode():
        model = bertscope.BertModel(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (2, 7))  # one exact-length group of 7 tokens
    mask = torch.ones_like(ids)
    encoder = PackedEncoder()  # one: its checks are kept per model
    with torch.inference_mode():
        assert encoder.forward(model, ids, mask).last_hidden_state.isfinite().all()
        model.layers[1].attention.key.bias[3] = float("inf")
        with pytest.raises(NonFiniteError, match=re.escape("layers.1.attention.key.bias holds 1 NaN or infinite")):
            encoder.forward(model, ids, mask)
        model.layers[1].attention.key.bias[3] = 0.0
        model.layers[0].attention.value.weight[:2] = 3e38  # finite; their sum is not
        encoder.forward(model, ids, mask)  # not refused


def test_in_training_a_nan_query_weight_reaches_the_output():
    """Training skips the weight check (the loop checks its loss): there the packed path masks
    its exact-length groups, so a NaN in W_Q reaches the output (and the loss) as on the
    reference path, instead of torch's unmasked kernel zeroing the head on short texts (with
    attention dropout the kernel is another, which keeps NaN; without it, it did not)."""
    torch.manual_seed(0)
    cfg = bertscope.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=128, attention_probs_dropout_prob=0.0)
    model = bertscope.BertModel(cfg).train()
    with torch.no_grad():
        model.layers[1].attention.query.weight[0, 0] = float("nan")
    ids = torch.randint(1, cfg.vocab_size, (3, 7))  # one exact-length group of 7 tokens
    fast = PackedEncoder().forward(model, ids, torch.ones_like(ids))
    assert fast.last_hidden_state.isnan().any()
    assert model(ids).last_hidden_state.isnan().any()  # the reference path, for the record


def test_blas_activation_sees_few_row_counts_and_keeps_each_row():
    """oneDNN (torch's CPU GELU) compiles one kernel per tensor shape; on the BLAS backend the
    activation must run on row counts rounded up to ROW_BUCKET, so a stream of batches with
    hundreds of token counts makes a handful of shapes, with each real row as F.linear + GELU
    computes it."""
    import torch.nn.functional as F

    from bertscope.fast.gemm import ROW_BUCKET, Linear

    torch.manual_seed(5)
    w, b = torch.randn(96, 48), torch.randn(96)
    seen = []

    def spy_gelu(t):
        seen.append(tuple(t.shape))
        return F.gelu(t)

    lin = Linear(w, b, "blas", act="gelu")
    lin.act = spy_gelu
    counts = range(1, 3 * ROW_BUCKET + 1)
    with torch.inference_mode():
        for n in counts:
            x = torch.randn(n, 48)
            got = lin(x)
            assert got.shape == (n, 96) and got.is_contiguous()
            assert torch.allclose(got, F.gelu(F.linear(x, w, b)), rtol=1e-5, atol=1e-5)
    assert len(counts) == 3 * ROW_BUCKET and sorted(set(seen)) == [(k * ROW_BUCKET, 96) for k in (1, 2, 3)]
    # under autograd the plain path (no out= buffers): PyTorch's own gradients
    x = torch.randn(5, 48, requires_grad=True)
    lin(x).pow(2).sum().backward()
    assert seen[-1] == (5, 96)
    ref_x = x.detach().clone().requires_grad_(True)
    F.gelu(F.linear(ref_x, w, b)).pow(2).sum().backward()
    assert torch.allclose(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)


def test_threads_embedding_at_once_get_what_each_call_alone_gets(bert):
    """One loaded model serving several threads at once (a web service's pool): every call's rows
    are those of the same call made alone, whatever ran beside it."""
    from concurrent.futures import ThreadPoolExecutor

    sets = [[f"request {i}, text {j}: " + "the cat sat on the mat " * (1 + (3 * i + j) % 17) for j in range(12)]
            for i in range(4)]
    alone = [bert.embed(texts) for texts in sets]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda k: [bert.embed(sets[k]) for _ in range(3)], range(4)))
    for k, rounds in enumerate(together):
        for got in rounds:
            np.testing.assert_allclose(got, alone[k], rtol=0, atol=1e-6)
