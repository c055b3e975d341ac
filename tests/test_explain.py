"""bertscope.explain: decomposition identities, brute-force and captum references, PAD and path
properties, and the record's word rules.

References used: the model's own intermediates (the identities), the layer weights read
directly (f_h), a brute-force re-run of the whole model per (layer, token) with a hook on W_V
(value zeroing), captum's InputXGradient / IntegratedGradients (gradients), bertscope.see's
independent rollout, and HF-free properties (rows sum to 1, PAD gives and receives 0).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import bertscope
from bertscope.errors import InputError
from bertscope.explain import METHODS, Target, explain_batch, map_measures, method_kind, similarity_target
from bertscope.explain.decompose import attention_block_terms, head_vectors, mixed_vectors
from bertscope.explain.gradients import embedding_function, grad_input, integrated_gradients
from bertscope.explain.measures import (alti_layer_maps, map_methods, run_forward,
                                        value_zeroing_maps)

from conftest import IT_ANIMAL

SHORT = "The cat sat on the mat."
LONG = "The animal didn't cross the street because it was too tired to walk any further today."
TEXT_B = "A tired dog rests."
LAYER_METHODS = [m for m in METHODS if method_kind(m) == "layer"]
MAP_METHODS = [m for m in METHODS if method_kind(m) != "input"]
GRAD_METHODS = [m for m in METHODS if method_kind(m) == "input"]


def encode(bert, texts):
    b = bert.encode(texts)
    return b.input_ids, b.attention_mask, b.token_type_ids


@pytest.fixture(scope="module")
def fw(bert):
    return run_forward(bert.model, *encode(bert, [IT_ANIMAL]))


@pytest.fixture(scope="module")
def target(bert):
    return similarity_target(bert, TEXT_B)


# --- decomposition identities ---------------------------------------------------------------

def test_head_vectors_from_the_weights(bert, fw):
    """f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h, computed here straight from the weight matrices."""
    layer, rec = bert.model.layers[2], fw.records[2]
    att = layer.attention
    H, D = att.num_heads, att.head_size
    x = rec.input[0].double()  # (T, C)
    f = head_vectors(layer, rec)[0].double()  # (H, T, C)
    for h in (0, 5, H - 1):
        cols = slice(h * D, (h + 1) * D)
        v = x @ att.value.weight.double()[cols].T + att.value.bias.double()[cols]  # (T, D)
        expected = v @ att.output.weight.double()[:, cols].T  # (T, C)
        torch.testing.assert_close(f[h], expected, atol=1e-5, rtol=0)


def test_norm_identity_rebuilds_the_attention_output(bert, fw):
    """Σ_h Σ_j α^h_ij f_h(x_j) + b_O equals the attention sublayer's output, every layer."""
    for layer, rec in zip(bert.model.layers, fw.records):
        f = head_vectors(layer, rec)  # (B, H, T, C)
        rebuilt = mixed_vectors(rec.attention.probs, f).sum(2) + layer.attention.output.bias  # (B, T, C)
        assert (rebuilt - rec.attention_output).abs().max() <= 1e-5
        assert (rebuilt - rec.attention.output).abs().max() <= 1e-5


def test_norm_map_is_weight_times_vector_length(bert, fw):
    maps = map_methods()["norm"](fw)[0]  # (L, H, T, T)
    layer, rec = bert.model.layers[4], fw.records[4]
    f = head_vectors(layer, rec)[0]  # (H, T, C)
    probs = rec.attention.probs[0]  # (H, T, T)
    i, j, h = 10, 2, 11
    expected = float((probs[h, i, j] * f[h, j]).norm().detach())
    assert float(maps[4, h, i, j]) == pytest.approx(expected, rel=1e-5)


def test_block_terms_rebuild_the_layernorm_output(bert, fw):
    """ALTI's and norm-residual's T_i(x_j): Σ_j T_i(x_j) + c_i = LN(x + Attention(x)), every layer;
    built a slice of queries at a time, they equal the whole."""
    for layer, rec in zip(bert.model.layers, fw.records):
        terms = attention_block_terms(layer, rec)
        rebuilt = terms.contributions.sum(2) + terms.constant  # (B, T, C)
        torch.testing.assert_close(rebuilt, rec.hidden, atol=1e-5, rtol=1e-5)  # sums of T terms, |h| ~ 10
    layer, rec = bert.model.layers[1], fw.records[1]
    whole = attention_block_terms(layer, rec).contributions
    part = attention_block_terms(layer, rec, slice(3, 7)).contributions
    torch.testing.assert_close(part, whole[:, 3:7], atol=1e-6, rtol=0)


def test_block_terms_keep_their_gradient_where_one_is_asked_for(bert, fw):
    """The terms are normalised in place; with autograd on, they still carry the gradients of
    the LayerNorm's γ and of W_O (autograd keeps what the in-place steps overwrite), with the
    same values."""
    layer, rec = bert.model.layers[2], fw.records[2]
    plain = attention_block_terms(layer, rec).contributions
    params = [layer.attention_norm.weight, layer.attention.output.weight]
    try:
        with torch.enable_grad():
            tracked = attention_block_terms(layer, rec).contributions
            assert tracked.requires_grad
            tracked.sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
        torch.testing.assert_close(tracked.detach(), plain, atol=0, rtol=0)
    finally:
        for p in params:  # the session's model: left as it was
            p.grad = None


def test_alti_layer_rule_by_hand(bert, fw):
    """c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁), row-normalised, with plain loops."""
    maps = alti_layer_maps(fw)[0]  # (L, T, T)
    for l in (0, 3):
        contrib = attention_block_terms(bert.model.layers[l], fw.records[l]).contributions[0].double()
        T = contrib.shape[0]
        for i in (0, 10, T - 1):
            y = contrib[i].sum(0)
            c = [max(0.0, float(y.abs().sum() - (y - contrib[i, j]).abs().sum())) for j in range(T)]
            expected = np.array(c) / sum(c)
            np.testing.assert_allclose(maps[l, i].numpy(), expected, atol=1e-5)


def test_rows_sum_to_one(bert):
    ids, mask, types = encode(bert, [SHORT, LONG])
    for method in LAYER_METHODS + ["attention"]:
        maps = explain_batch(bert, ids, mask, types, method)
        sums = maps.sum(-1)  # (B, L[, H], T)
        real = mask.bool()
        for b in range(2):
            row_sums = sums[b][..., real[b]]
            assert (row_sums - 1).abs().max() <= 1e-5, method
            assert (sums[b][..., ~real[b]] == 0).all(), method


def test_rollout_by_hand(bert, fw):
    """R_l = (½A_l + ½I) ··· (½A_0 + ½I), A_l the head-mean attention, as explicit products."""
    ours = map_methods()["rollout"](fw)[0].double()  # (L, T, T)
    T = ours.shape[-1]
    R = torch.eye(T, dtype=torch.float64)
    for l, rec in enumerate(fw.records):
        A = rec.attention.probs[0].double().mean(0)  # (T, T)
        R = (0.5 * A + 0.5 * torch.eye(T, dtype=torch.float64)) @ R
        torch.testing.assert_close(ours[l], R, atol=1e-5, rtol=0)


# --- value zeroing against a brute force ------------------------------------------------------

def test_value_zeroing_equals_brute_force_reruns(bert):
    """For every (layer, token) of a short text: a full re-run of the model with that token's
    value vector zeroed by a hook on that layer's W_V, the cosine distance of each token's
    layer output, row-normalised."""
    model = bert.model
    ids, mask, types = encode(bert, [SHORT])
    fw = run_forward(model, ids, mask, types)
    ours = value_zeroing_maps(fw)[0].double()  # (L, T, T)
    T = ids.shape[1]
    with torch.no_grad():
        base = model(ids, mask, types, output_hidden_states=True).hidden_states
        for l, layer in enumerate(model.layers):
            dist = torch.zeros(T, T, dtype=torch.float64)
            for j in range(T):
                def zero_j(module, inputs, output, j=j):
                    out = output.clone()
                    out[:, j] = 0.0
                    return out

                handle = layer.attention.value.register_forward_hook(zero_j)
                try:
                    h = model(ids, mask, types, output_hidden_states=True).hidden_states[l + 1][0]  # (T, C)
                finally:
                    handle.remove()
                cos = torch.nn.functional.cosine_similarity(h.double(), base[l + 1][0].double(), dim=-1)
                dist[:, j] = (1 - cos).clamp_min(0)
            expected = dist / dist.sum(-1, keepdim=True)
            torch.testing.assert_close(ours[l], expected, atol=1e-5, rtol=0)


# --- gradients against captum -----------------------------------------------------------------

def test_gradients_equal_captum(bert, target):
    import captum.attr  # a test dependency: a missing one must fail

    ids, mask, types = encode(bert, [IT_ANIMAL])
    F = embedding_function(bert, ids, mask, types, target)
    ours_gi = grad_input(F)  # (1, T)
    theirs_gi = captum.attr.InputXGradient(F.forward).attribute(F.inputs.clone()).sum(-1)
    assert (ours_gi - theirs_gi).abs().max() <= 1e-5
    assert ours_gi.abs().max() > 1e-3  # not trivially zero

    ours_ig = integrated_gradients(F, steps=50)
    theirs_ig = captum.attr.IntegratedGradients(F.forward).attribute(
        F.inputs.clone(), baselines=torch.zeros_like(F.inputs), n_steps=50, method="gausslegendre").sum(-1)
    assert (ours_ig - theirs_ig).abs().max() <= 1e-5
    # completeness: the attributions add up to F(e) - F(0), up to the quadrature error
    with torch.no_grad():
        gap = float(F.forward(F.inputs) - F.forward(torch.zeros_like(F.inputs)))
    assert float(ours_ig.sum()) == pytest.approx(gap, abs=0.02 * abs(gap) + 1e-3)


def test_explain_record_for_gradients_matches_batch(bert):
    exp = bertscope.explain(bert, IT_ANIMAL, "integrated-gradients", text_b=TEXT_B)
    assert exp.maps.shape == (len(exp.tokens),) and exp.target.startswith("cosine similarity")
    words = exp.word_maps()
    assert words.shape == (len(exp.words),)
    assert words.sum() == pytest.approx(exp.maps.sum(), abs=1e-5)  # a word sums its sub-tokens


def test_gradient_methods_work_inside_a_callers_inference_mode(bert):
    """Inside ``torch.inference_mode()`` grad-input raised torch's "element 0 of tensors does not
    require grad", where ``torch.no_grad()`` worked: the same map is computed in both."""
    outside = bertscope.explain(bert, IT_ANIMAL, "grad-input", text_b=TEXT_B).maps
    with torch.inference_mode():
        ids, mask, types = encode(bert, [IT_ANIMAL])
        inside = bertscope.explain(bert, IT_ANIMAL, "grad-input", text_b=TEXT_B).maps
        target = similarity_target(bert, TEXT_B)
        batch = explain_batch(bert, ids, mask, types, "grad-input", target=target)  # inference tensors in
    np.testing.assert_allclose(inside, outside, rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch[0].numpy(), outside, rtol=0, atol=1e-6)
    assert np.abs(outside).max() > 0


def test_gradient_attributions_rank_by_size_whatever_their_sign(bert):
    """grad-input ranked by signed value: the word with the largest attribution, a negative one
    ("sleeps"), came eighth, under words of almost none. Attention rows (all >= 0) rank as before."""
    exp = bertscope.explain(bert, "A dog sleeps on the sofa", "grad-input", text_b="A sleeping puppy")
    row = exp.sources()
    ranked = exp.ranked()
    assert [j for j, _, _ in ranked] == sorted(range(len(row)), key=lambda j: (-abs(row[j]), j))
    assert [v for _, _, v in ranked] == [float(row[j]) for j, _, _ in ranked]  # the signed values, kept
    assert min(row) < 0 < max(row)  # both signs occur here, so the order is a real test
    att = bertscope.explain(bert, IT_ANIMAL, "attention")
    arow = att.sources("it", 3, 1)
    assert [j for j, _, _ in att.ranked("it", 3, 1, k=5)] == list(np.argsort(-arow, kind="stable")[:5])


def test_a_long_text_b_is_named_in_its_truncation_warning(bert):
    """The warning for a cut text_b said "the text is longer ...", as if the text explained
    had been cut."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bertscope.explain(bert, "A dog sleeps", "grad-input", text_b="word " * 400)
    said = [str(w.message) for w in caught if issubclass(w.category, bertscope.TruncationWarning)]
    assert said == [f"the second text (text_b) is longer than {bert.max_seq_length} tokens and was truncated"]
    assert caught[0].filename == __file__  # the caller's line, as every TruncationWarning


def test_map_measures_and_build_report_take_any_sequence_of_names_and_numpy_flags(bert):
    """The checks added for strings and non-functions must not refuse what worked: a tuple or a
    numpy array of names, numpy's bool for qk."""
    want = map_measures(bert, IT_ANIMAL, ["alti", "norm"])
    for names in (("alti", "norm"), np.array(["alti", "norm"])):
        got = map_measures(bert, IT_ANIMAL, names)
        assert [type(k) for k in got] == [str, str] and list(got) == ["alti", "norm"] and all(np.array_equal(got[k], want[k]) for k in want)
    assert bertscope.build_report(bert, IT_ANIMAL, qk=np.True_).texts[0].qkv is not None


def test_a_model_loaded_in_inference_mode_refuses_the_gradient_methods_in_one_line(bundled_path):
    """Its weights are inference tensors: torch raised "Inference tensors cannot be saved for
    backward" 17 frames deep. The map methods still work on it."""
    with torch.inference_mode():
        frozen = bertscope.load(bundled_path)
    for method in ("grad-input", "integrated-gradients"):
        with pytest.raises(InputError, match=re.escape("this model was loaded inside torch.inference_mode(): "
                                                       "its weights are inference tensors")):
            bertscope.explain(frozen, IT_ANIMAL, method, text_b=TEXT_B)
    assert bertscope.explain(frozen, IT_ANIMAL, "alti").maps.shape[0] == frozen.config.num_hidden_layers
    # a plain forward outside inference mode raised that same error, on either path: it has no
    # gradient to compute, so it gives the numbers of an ordinary load
    b = frozen.encode([IT_ANIMAL, TEXT_B])
    ref = bertscope.load(bundled_path)
    with torch.no_grad():
        want = ref.model(b.input_ids, b.attention_mask, output_attentions=True)
    got = frozen.model(b.input_ids, b.attention_mask, output_attentions=True)
    assert torch.equal(got.last_hidden_state, want.last_hidden_state)
    assert all(torch.equal(g, w) for g, w in zip(got.attentions, want.attentions))
    real = b.attention_mask.bool()
    fast = frozen(b.input_ids, b.attention_mask).last_hidden_state
    assert (fast - want.last_hidden_state)[real].abs().max() <= 1e-5 and not fast.requires_grad
    embeds = frozen.encoder.embeddings.word_embeddings(b.input_ids).clone().requires_grad_()
    with pytest.raises(InputError, match=re.escape("this model was loaded inside torch.inference_mode()")):
        frozen.model(None, b.attention_mask, inputs_embeds=embeds)  # a gradient asked for: refused in one line
    head_mask = torch.ones(frozen.config.num_hidden_layers, frozen.config.num_attention_heads, requires_grad=True)
    with pytest.raises(InputError, match=re.escape("this model was loaded inside torch.inference_mode()")):
        frozen.model(b.input_ids, b.attention_mask, head_mask=head_mask)  # a gradient for the head mask, too


# --- properties: PAD, padding, the packed path -------------------------------------------------

@pytest.fixture(scope="module")
def padded_and_alone(bert, target):
    """Every method on [SHORT, LONG] (SHORT padded) and on SHORT alone."""
    ids, mask, types = encode(bert, [SHORT, LONG])
    alone = encode(bert, [SHORT])
    out = {}
    for m in METHODS:
        kw = {"target": target} if m in GRAD_METHODS else {}
        out[m] = (explain_batch(bert, ids, mask, types, m, **kw), explain_batch(bert, *alone, m, **kw))
    return mask, out


@pytest.mark.parametrize("method", METHODS)
def test_pad_gives_and_receives_nothing(padded_and_alone, method):
    mask, out = padded_and_alone
    maps = out[method][0][0]  # SHORT's maps in the padded batch
    pad = ~mask[0].bool()
    assert pad.any()
    if method_kind(method) == "input":
        assert (maps[pad] == 0).all()
    else:
        assert (maps[..., pad, :] == 0).all() and (maps[..., :, pad] == 0).all()
        assert maps[..., ~pad, :][..., ~pad].abs().sum() > 0


@pytest.mark.parametrize("method", METHODS)
def test_maps_unchanged_by_padding(padded_and_alone, method):
    mask, out = padded_and_alone
    batched, alone = out[method]
    T = alone.shape[-1]
    in_batch = batched[0][..., :T, :T] if method_kind(method) != "input" else batched[0][:T]
    assert (in_batch - alone[0]).abs().max() <= 1e-5


def test_gradients_same_on_packed_and_padded_paths(bert, target):
    ids, mask, types = encode(bert, [SHORT, LONG])
    for method in GRAD_METHODS:
        padded = explain_batch(bert, ids, mask, types, method, target=target, path="padded", steps=8)
        packed = explain_batch(bert, ids, mask, types, method, target=target, path="packed", steps=8)
        assert (padded - packed).abs().max() <= 1e-5, method


def test_maps_unaffected_by_the_packed_path(bert):
    """The maps come from the padded reference; running the packed path (and its caches) in
    between changes nothing, and the reference's last layer equals the packed path's output."""
    ids, mask, types = encode(bert, [SHORT, LONG])
    before = {m: explain_batch(bert, ids, mask, types, m) for m in ("norm", "alti", "value-zeroing")}
    with torch.no_grad():
        packed = bert(ids, mask, types).last_hidden_state
    fw = run_forward(bert.model, ids, mask, types)
    real = mask.bool()
    assert (fw.records[-1].output[real] - packed[real]).abs().max() <= 1e-5
    for m, maps in before.items():
        assert torch.equal(explain_batch(bert, ids, mask, types, m), maps), m


def test_training_mode_is_restored_and_maps_deterministic(bert):
    ids, mask, types = encode(bert, [SHORT])
    bert.model.train()
    try:
        a = explain_batch(bert, ids, mask, types, "value-zeroing")
        assert bert.model.training
        b = explain_batch(bert, ids, mask, types, "value-zeroing")
    finally:
        bert.model.eval()
    assert torch.equal(a, b)


# --- the record and its word rules --------------------------------------------------------------

def test_record_shapes_and_word_rules(bert):
    L, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    for method in MAP_METHODS:
        exp = bertscope.explain(bert, IT_ANIMAL, method)
        T, W = len(exp.tokens), len(exp.words)
        assert exp.maps.dtype == np.float32
        expected = (L, H, T, T) if method_kind(method) == "head" else (L, T, T)
        assert exp.maps.shape == expected
        wm = exp.word_maps()
        assert wm.shape == expected[:-2] + (W, W)
        it, animal = exp.words.index("it"), exp.words.index("animal")
        row = exp.sources(it, layer=3, head=1 if exp.kind == "head" else None)
        assert row.shape == (W,)
        # sources takes one layer (and head) to word level: word_maps' row, every layer and head
        for layer in range(L):
            for head in [None] + (list(range(H)) if exp.kind == "head" else []):
                m = wm[layer] if head is None else wm[layer, head]
                m = m.mean(0) if exp.kind == "head" and head is None else m
                np.testing.assert_allclose(exp.sources(it, layer, head), m[it], rtol=1e-6, atol=1e-7)
        if method != "norm":  # rows that sum to 1 at token level still do at word level
            np.testing.assert_allclose(wm.sum(-1), 1.0, atol=1e-4)
        # "didn't" is three words (didn ' t): receiving sums columns, taking averages rows
        d = exp.words.index("didn")
        tok = exp.token_words.index(d)
        layer_maps = exp.maps[3, 1] if exp.kind == "head" else exp.maps[3]
        wl = wm[3, 1] if exp.kind == "head" else wm[3]
        assert wl[animal, d] == pytest.approx(layer_maps[exp.token_words.index(animal), tok], abs=1e-6)
    attn = bertscope.explain(bert, IT_ANIMAL, "attention")
    it, animal = attn.words.index("it"), attn.words.index("animal")
    assert attn.sources(it, 3, 1)[animal] > 0.5  # the seed's head, as `attend` shows it
    # a word names its first occurrence (any case); a negative index counts from the end
    np.testing.assert_array_equal(attn.sources("it", 3, 1), attn.sources(it, 3, 1))
    np.testing.assert_array_equal(attn.sources("The", 3, 1), attn.sources(attn.words.index("The"), 3, 1))
    np.testing.assert_array_equal(attn.sources(-1, 3, 1), attn.sources(len(attn.words) - 1, 3, 1))
    np.testing.assert_array_equal(attn.sources(2, -1, -1), attn.sources(2, 5, 11))  # as attend's results
    np.testing.assert_array_equal(attn.sources(__import__("torch").tensor(2)), attn.sources(2))
    assert attn.ranked("it", 3, 1, k=1)[0][1] == "animal"


@pytest.mark.parametrize("call,fragment", [
    (lambda b: bertscope.explain(b, IT_ANIMAL, "saliency"), "unknown method 'saliency'"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, None), "method is NoneType, not a string; the methods are: "),
    (lambda b: bertscope.explain(b, "  ", "alti"), "the text is empty"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti", text_b="x"), "text_b and target are for the gradient"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "grad-input"), "give text_b"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti").sources(3, head=2), "not per head"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "norm").sources(3, layer=9), "layer must be a whole number from 0 to 5"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "norm").sources(3, head=-13), "head must be a whole number from 0 to 11"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti").ranked(__import__("torch").tensor(99)), "an index 0..14"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti").ranked("zebra"), "the word 'zebra' is not in the text"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti").ranked("didn't"), "splits \"didn't\" into the words didn ' t"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti").ranked(99), "an index 0..14 (or -15 to -1, counted from the end), got 99"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti").ranked("it", k=-1), "k must be a whole number >= 1"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "alti").ranked("it", k=2.5), "k must be a whole number"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "norm").ranked("it", layer=2.0), "layer must be a whole number"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "norm").ranked("it", head="1"), "head must be a whole number"),
    # map_measures and build_report's measures: these raised TypeError or AttributeError, or gave
    # maps of [CLS] [SEP] for an empty text, or read "alti" as the measures a, l, t, i
    (lambda b: map_measures(b, "", ["alti"]), "the text is empty"),
    (lambda b: map_measures(b, "\u200b", ["alti"]), "has no tokens"),
    (lambda b: map_measures(b, IT_ANIMAL, "alti"),
     "names must be a list of measures, e.g. ['alti'], not str"),
    (lambda b: map_measures(b.model, IT_ANIMAL, ["alti"]),
     "map_measures() takes a loaded model"),
    (lambda b: bertscope.build_report(b, IT_ANIMAL, measures="alti"), "measures must be a function (bert, text, pair)"),
    (lambda b: bertscope.build_report(b, IT_ANIMAL, measures=lambda *a: [1]), "must return {name: maps}, a dict"),
    (lambda b: bertscope.build_report(b, IT_ANIMAL, qk="no"), "qk must be True, False or None"),
])
def test_errors_are_one_sentence(bert, call, fragment):
    with pytest.raises(InputError) as e:
        call(bert)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_custom_target(bert):
    """A Target is any scalar of the last hidden state: here the first dimension at [CLS]."""
    tgt = Target(name="h[CLS][0]", score=lambda h, m: h[:, 0, 0])
    exp = bertscope.explain(bert, SHORT, "grad-input", target=tgt)
    assert exp.target == "h[CLS][0]" and np.abs(exp.maps).max() > 0


# --- a classifier's predicted class as the output ------------------------------------------------

@pytest.fixture(scope="module")
def classifier(bert):
    """A two-class BertForSequenceClassification on a copy of the bundled encoder (random head)."""
    import copy

    from bertscope.core.classifier import BertForSequenceClassification

    torch.manual_seed(0)
    clf = BertForSequenceClassification(bert.config, 2, id2label={0: "neg", 1: "pos"},
                                        encoder=copy.deepcopy(bert.encoder))
    with torch.no_grad():
        clf.classifier.weight.mul_(50)  # a head with opinions, so the probabilities are not all ~0.5
    return bertscope.Bert(config=bert.config, model=clf.eval(), tokenizer=bert.tokenizer, name="test-classifier")


def test_class_target_is_the_classifiers_probability(classifier):
    """F at the text's own embeddings equals Bert.classify's probability of the predicted class
    (the packed classification path, written for fine-tuning), and captum agrees on the gradient."""
    import captum.attr

    from bertscope.explain import class_target

    texts = [SHORT, LONG]
    ids, mask, types = encode(classifier, texts)
    probs = classifier.classify(texts)  # (2, K)
    tgt = class_target(classifier, ids, mask, types)
    for path in ("padded", "packed"):
        F = embedding_function(classifier, ids, mask, types, tgt, path=path)
        with torch.no_grad():
            np.testing.assert_allclose(F.forward(F.inputs).numpy(), probs.max(1), atol=1e-5)
    F = embedding_function(classifier, ids[:1], mask[:1], types[:1], class_target(classifier, ids[:1], mask[:1], types[:1]))
    theirs = captum.attr.InputXGradient(F.forward).attribute(F.inputs.clone()).sum(-1)
    assert (grad_input(F) - theirs).abs().max() <= 1e-5


def test_explain_a_classifier(classifier, bert):
    exp = bertscope.explain(classifier, SHORT, "grad-input")  # default: the predicted class
    pred = classifier.labels[int(classifier.classify([SHORT])[0].argmax())]
    assert exp.target == f"probability of the predicted class {pred!r}"
    other = "neg" if pred == "pos" else "pos"
    exp_other = bertscope.explain(classifier, SHORT, "grad-input", target=other)
    # p(other) = 1 - p(pred) for two classes: the gradients are opposite
    np.testing.assert_allclose(exp_other.maps, -exp.maps, atol=1e-6)
    with pytest.raises(InputError, match="unknown class 'meh'"):
        bertscope.explain(classifier, SHORT, "grad-input", target="meh")
    with pytest.raises(InputError, match="class 5 does not exist"):
        bertscope.explain(classifier, SHORT, "grad-input", target=5)
    # numpy's and torch's integers are indices too (they were "class np.int64(1) does not exist")
    index = classifier.labels.index(other)
    for idx in (np.int64(index), torch.tensor(index)):
        np.testing.assert_array_equal(bertscope.explain(classifier, SHORT, "grad-input", target=idx).maps,
                                      exp_other.maps)
    for bad in (True, 1.0, np.float32(1)):
        with pytest.raises(InputError, match="does not exist"):
            bertscope.explain(classifier, SHORT, "grad-input", target=bad)
    maps = bertscope.explain(classifier, SHORT, "alti").maps  # map methods read the classifier's encoder
    np.testing.assert_array_equal(maps, bertscope.explain(bert, SHORT, "alti").maps)


def test_a_number_that_is_both_a_class_index_and_another_classs_label_is_refused(classifier):
    """With labels "1" and "2" (star ratings), target=1 explained class 1, the label '2', where
    `bertscope explain --label 1` explains the label '1': the same number, another class. An
    int that names another class is now refused as ambiguous; names are taken as names."""
    import copy

    stars = copy.copy(classifier)
    stars.model = copy.copy(classifier.model)
    stars.model.id2label = {0: "1", 1: "2"}
    with pytest.raises(InputError, match=re.escape("class 1 is ambiguous: this classifier's labels are numbers, "
                                                   "and the label '1' is class 0 while class 1 is the label '2'")):
        bertscope.explain(stars, SHORT, "grad-input", target=1)
    by_name = bertscope.explain(stars, SHORT, "grad-input", target="2")
    np.testing.assert_array_equal(by_name.maps, bertscope.explain(classifier, SHORT, "grad-input",
                                                                  target=classifier.labels[1]).maps)
    assert by_name.target == "probability of class '2'"
    stars.model.id2label = {0: "2", 1: "10"}  # 2 is no index here: the message says it is a label
    with pytest.raises(InputError, match=re.escape("the label '2' is class 0: give it as a string, 2 -> '2'")):
        bertscope.explain(stars, SHORT, "grad-input", target=2)
    stars.model.id2label = {0: "0", 1: "1"}  # each number names its own index: not ambiguous
    np.testing.assert_array_equal(bertscope.explain(stars, SHORT, "grad-input", target=1).maps, by_name.maps)
    # the faithfulness scores pass the predicted class to the same target: by its label, so a
    # classifier whose labels are numbers scores every sentence (it refused class 1 as ambiguous)
    from bertscope.explain.faithfulness import sentence_attributions

    stars.model.id2label = {0: "1", 1: "2"}
    for text in (SHORT, "a dull , lifeless and boring film", "a wonderful , moving and beautiful film"):
        got, ref = sentence_attributions(stars, text), sentence_attributions(classifier, text)
        assert got.predicted == ref.predicted
        np.testing.assert_array_equal(got.grad_input, ref.grad_input)


def test_a_classifier_explains_the_text_it_classifies(classifier):
    """A classifier fine-tuned at a shorter length cuts the text there, as classify and predict
    do: explain's predicted class is theirs (it used to read up to 512 tokens, and could explain
    another class than predict printed)."""
    import dataclasses

    short = dataclasses.replace(classifier, max_seq_length=6)
    exp = bertscope.explain(short, LONG, "grad-input")
    assert exp.truncated and len(exp.tokens) == 6
    with pytest.warns(bertscope.TruncationWarning):
        pred = short.labels[int(short.classify([LONG])[0].argmax())]
    assert exp.target == f"probability of the predicted class {pred!r}"
    assert len(bertscope.explain(short, LONG, "alti").tokens) == 6  # its maps too: one text, one cut
    # view --measure pairs map_measures with analyze: both cut where analyze cuts (the positions)
    from bertscope.explain import map_measures
    from bertscope.see.report import analyze

    [rt] = analyze(short, [LONG], qk=False)
    assert map_measures(short, LONG, ["alti"])["alti"].shape[-1] == len(rt.tokens) > 6


def test_norm_residual_and_alti_from_one_decomposition_are_what_each_gives_alone(bert):
    """map_measures takes the attention block apart once for both (the explorer's page asks for
    both): each map equals the one its method computes alone, bit for bit."""
    both = map_measures(bert, IT_ANIMAL, ["alti", "norm", "norm-residual"])
    for name in ("alti", "norm-residual", "norm"):
        np.testing.assert_array_equal(both[name], bertscope.explain(bert, IT_ANIMAL, name).maps)
    twice = map_measures(bert, IT_ANIMAL, ["alti", "norm-residual", "alti"])  # a name asked for twice
    assert list(twice) == ["alti", "norm-residual"]
    np.testing.assert_array_equal(twice["alti"], both["alti"])
