"""One layer recipe, one mask conversion per forward, and the intermediates every path can read."""

from __future__ import annotations

import torch

import bertscope
from bertscope.core import attention as attention_mod
from bertscope.core import model as model_mod
from bertscope.files import update_section

TOL = 1e-5


def _tiny(seed: int = 0) -> bertscope.BertModel:
    torch.manual_seed(seed)
    cfg = bertscope.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=3,
                               num_attention_heads=4, intermediate_size=64)
    return bertscope.BertModel(cfg).eval()


def _batch():
    ids = torch.randint(1, 200, (3, 9))
    mask = (torch.arange(9)[None, :] < torch.tensor([9, 4, 1])[:, None]).long()  # (3, 9)
    return ids, mask


def test_mask_is_checked_and_converted_once_per_forward(monkeypatch):
    model = _tiny()
    ids, mask = _batch()
    calls = {"check": 0, "bias": 0}

    def counting(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    for mod in (model_mod, attention_mod):
        monkeypatch.setattr(mod, "check_attention_mask", counting("check", mod.check_attention_mask))
        monkeypatch.setattr(mod, "mask_to_bias", counting("bias", mod.mask_to_bias))
    with torch.inference_mode():
        model(ids, mask, output_attentions=True)
    assert calls == {"check": 1, "bias": 1}  # not once per layer (3 layers here)


def test_intermediates_are_the_layer_recipe_step_by_step():
    model = _tiny(1)
    ids, mask = _batch()
    with torch.no_grad():
        out = model(ids, mask, output_intermediates=True, output_hidden_states=True, output_attentions=True)
    _check_records(model, out)


@torch.no_grad()
def _check_records(model, out):
    assert len(out.intermediates) == model.config.num_hidden_layers
    for i, rec in enumerate(out.intermediates):
        layer = model.layers[i]
        torch.testing.assert_close(rec.input, out.hidden_states[i])
        torch.testing.assert_close(rec.output, out.hidden_states[i + 1])
        torch.testing.assert_close(rec.attention.probs, out.attentions[i])
        # each recorded step follows from the one before, by the layer's own modules
        att = rec.attention
        torch.testing.assert_close(att.output, rec.attention_output)
        torch.testing.assert_close(att.probs @ att.v, att.context, atol=TOL, rtol=TOL)  # (B, H, T, D)
        torch.testing.assert_close(rec.attention_residual, rec.input + rec.attention_output)
        torch.testing.assert_close(rec.hidden, layer.attention_norm(rec.attention_residual))
        torch.testing.assert_close(rec.ffn_output, layer.feed_forward(rec.hidden))
        torch.testing.assert_close(rec.output, layer.output_norm(rec.hidden + rec.ffn_output))
        # and q, k, v are the projections of the input, split into heads
        torch.testing.assert_close(att.q, layer.attention.split_heads(layer.attention.query(rec.input)))


def test_value_mask_zeroes_what_a_token_offers():
    model = _tiny(2)
    ids, mask = _batch()
    attn = model.layers[0].attention
    with torch.inference_mode():
        x = model.embeddings(ids, torch.zeros_like(ids))
        vm = torch.ones(3, 9)
        vm[0, 2] = 0.0
        _, rec = attn(x, mask, output_intermediates=True, value_mask=vm)
    assert rec.v[0, :, 2].abs().max() == 0 and rec.v[0, :, 3].abs().max() > 0


def test_facade_call_is_packed_and_equals_the_reference(bert):
    batch = bert.encode(["a short one", "The animal didn't cross the street because it was too tired"])
    with torch.inference_mode():
        fast = bert(batch.input_ids, batch.attention_mask)
        ref = bert.model(batch.input_ids, batch.attention_mask)
        asked = bert(batch.input_ids, batch.attention_mask, output_attentions=True)
    real = batch.attention_mask.bool()
    assert (fast.last_hidden_state - ref.last_hidden_state)[real].abs().max() < TOL
    assert fast.last_hidden_state[~real].abs().max() == 0  # packed: PAD positions are zeros
    assert asked.attentions is not None  # asking for attentions runs the reference model


def test_update_section_replaces_only_its_block(tmp_path):
    doc = tmp_path / "DOC.md"
    update_section(doc, "a", "first", title="Title")
    update_section(doc, "b", "second")
    doc.write_text(doc.read_text() + "\nhand-written tail\n")
    update_section(doc, "a", "first, again")
    text = doc.read_text()
    assert text.startswith("# Title\n")
    assert "first, again" in text and "first\n" not in text and "second" in text
    assert text.index("first, again") < text.index("second") < text.index("hand-written tail")
    assert not [p for p in tmp_path.iterdir() if p.name != "DOC.md"]  # no temporary left behind
