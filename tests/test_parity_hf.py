"""The encoder against HF transformers' BertModel (eager attention) on the bundled checkpoint.

HF transformers is a test dependency only: nobody here wrote it, so agreement with it is
evidence, not a tautology.
"""

from __future__ import annotations

import pytest
import torch

from bertscope.core.weights import to_checkpoint_name

TEXTS = [
    "The animal didn't cross the street because it was too tired",
    "Hi",
    "Self-attention lets every token look at every other token; its cost grows with the square "
    "of the length, which is why long inputs are expensive.",
    "Ünïcödé, émojis 🙂 and numbers 3.14159 are tokenized too.",
]


@pytest.fixture(scope="module")
def padded(bert):
    batch = bert.encode(TEXTS)
    assert (batch.attention_mask == 0).any(), "the batch must contain padding"
    return batch


def run_both(bert, hf_model, batch, **kw):
    args = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                token_type_ids=batch.token_type_ids)
    with torch.no_grad():
        ours = bert.model(**args, **kw)
        ref = hf_model(**args, **kw)
    return ours, ref


def test_last_hidden_state_and_pooler(bert, hf_model, padded):
    ours, ref = run_both(bert, hf_model, padded)
    real = padded.attention_mask.bool()
    # PAD positions' outputs are never read (no real token attends to them); compare real tokens.
    # within 1e-5, plus 1e-5 of the value's size: hidden states reach |h| ~ 10, and a CPU or
    # thread count whose GEMMs sum in another order moves their last bits (7e-6 measured here)
    torch.testing.assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.pooler_output, ref.pooler_output, atol=1e-5, rtol=1e-5)


def test_every_hidden_state_and_attention(bert, hf_model, padded):
    ours, ref = run_both(bert, hf_model, padded, output_attentions=True, output_hidden_states=True)
    real = padded.attention_mask.bool()
    assert len(ours.hidden_states) == len(ref.hidden_states) == bert.config.num_hidden_layers + 1
    for a, b in zip(ours.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)  # as above
    assert len(ours.attentions) == len(ref.attentions) == bert.config.num_hidden_layers
    for a, b in zip(ours.attentions, ref.attentions):
        assert a.shape == b.shape
        # every probability, PAD rows and columns included
        assert (a - b).abs().max() <= 1e-5


def test_pad_appended_changes_nothing_at_real_tokens(bert):
    one = bert.encode([TEXTS[0]])
    n = one.input_ids.shape[1]
    ids = torch.cat([one.input_ids, torch.zeros(1, 9, dtype=torch.long)], 1)
    mask = torch.cat([one.attention_mask, torch.zeros(1, 9, dtype=torch.long)], 1)
    with torch.no_grad():
        short = bert.model(one.input_ids, one.attention_mask).last_hidden_state
        long = bert.model(ids, mask).last_hidden_state
        long_attn = bert.model(ids, mask, output_attentions=True)
    assert (long[:, :n] - short).abs().max() <= 1e-5
    assert (long_attn.last_hidden_state[:, :n] - short).abs().max() <= 1e-5
    for p in long_attn.attentions:
        assert (p[..., n:] == 0).all()


def test_gradients_match_hf(bert, hf_model, padded):
    """One backward pass of a mean loss: every parameter's gradient within 1e-4 of HF's.

    Absolute agreement alone would be weak for small gradients, so each parameter's
    gradient must also agree relative to its own largest entry (fp32 rounding is ~1e-7).
    """
    real = padded.attention_mask.bool()
    torch.manual_seed(0)
    probe = torch.randn(*padded.input_ids.shape, bert.config.hidden_size)
    probe_pool = torch.randn(padded.input_ids.shape[0], bert.config.hidden_size)
    args = dict(input_ids=padded.input_ids, attention_mask=padded.attention_mask,
                token_type_ids=padded.token_type_ids)
    bert.model.zero_grad()
    hf_model.zero_grad()
    for model in (bert.model, hf_model):
        out = model(**args)
        loss = (out.last_hidden_state * probe)[real].mean() + (out.pooler_output * probe_pool).mean()
        loss.backward()
    hf_params = dict(hf_model.named_parameters())
    compared = 0
    try:
        for name, p in bert.model.named_parameters():
            ref = hf_params[to_checkpoint_name(name)]
            assert p.grad is not None and ref.grad is not None, name
            diff = (p.grad - ref.grad).abs().max().item()
            scale = ref.grad.abs().max().item()
            assert diff <= 1e-4, (name, diff)
            # W_K's bias gets no gradient in exact arithmetic (it shifts a whole score row by a
            # constant, which softmax ignores), so its gradients are pure rounding: the 1e-9 floor.
            assert diff <= 1e-5 * scale + 1e-9, (name, diff, scale)
            compared += 1
    finally:
        bert.model.zero_grad(set_to_none=True)
        hf_model.zero_grad(set_to_none=True)
    assert compared == len(hf_params)  # every weight, embeddings and pooler included


def test_random_bert_base_matches_hf():
    """Same check on a BERT-base-shaped model with random weights copied across."""
    import transformers

    import bertscope

    cfg = bertscope.BertConfig.preset("bert-base").replace(num_hidden_layers=2)
    torch.manual_seed(0)
    ours = bertscope.BertModel(cfg).eval()
    hf = transformers.BertModel(transformers.BertConfig(
        hidden_size=768, num_hidden_layers=2, num_attention_heads=12, intermediate_size=3072,
        attn_implementation="eager")).eval()
    state = {to_checkpoint_name(k): v for k, v in ours.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing)
    ids = torch.randint(1000, 30000, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 25:] = 0
    with torch.no_grad():
        a = ours(ids, mask, output_attentions=True)
        b = hf(input_ids=ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    assert (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max() <= 1e-5
    for x, y in zip(a.attentions, b.attentions):
        assert (x - y).abs().max() <= 1e-5
