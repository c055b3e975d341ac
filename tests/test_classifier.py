"""BertForSequenceClassification against HF transformers' (the reference nobody here wrote),
loading a classifier folder, and Bert.classify."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import bertscope
from bertscope.core.classifier import BertForSequenceClassification
from bertscope.core.weights import to_hf_state_dict
from bertscope.errors import CheckpointError, InputError
from bertscope.fast.encoder import PackedEncoder
from bertscope.train.loop import linear_schedule, make_optimizer, train_step, training_loss

TOL = 1e-5
TEXTS = ["The animal didn't cross the street because it was too tired", "Hi",
         "A rather long review: the plot wanders, the acting is wooden, and yet the music carries it.",
         "Short and sweet."]
PAIRS = ["It was exhausted.", "Hello there", "The review is negative.", "It was good."]


def _classifier(bert, num_labels=3, seed=0, dropout=None):
    """Our classifier on a copy of the bundled encoder, with a seeded random head."""
    torch.manual_seed(seed)
    enc = copy.deepcopy(bert.encoder)
    cfg = bert.config
    if dropout is not None:
        cfg = cfg.replace(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        for m in enc.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = dropout
            if hasattr(m, "dropout_p"):
                m.dropout_p = dropout
        enc.config = cfg
    return BertForSequenceClassification(cfg, num_labels, encoder=enc)


def _hf_twin(ours, bundled_path, dropout=None):
    """HF's BertForSequenceClassification with exactly our weights (head included)."""
    import transformers

    kw = {} if dropout is None else dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    cfg = transformers.BertConfig.from_pretrained(str(bundled_path), num_labels=ours.num_labels, **kw)
    cfg._attn_implementation = "eager"
    hf = transformers.BertForSequenceClassification(cfg)
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours), strict=False)
    assert not unexpected and all("position_ids" in k or "token_type_ids" in k for k in missing), (missing, unexpected)
    return hf


def _batch(bert):
    b = bert.encode(TEXTS, pairs=PAIRS)
    assert (b.attention_mask == 0).any() and (b.token_type_ids == 1).any()
    return b


def test_logits_loss_and_every_gradient_match_hf(bert, bundled_path):
    ours = _classifier(bert).eval()  # dropout off
    hf = _hf_twin(ours, bundled_path).eval()
    b = _batch(bert)
    labels = torch.tensor([0, 2, 1, 2])
    a = ours(b.input_ids, b.attention_mask, b.token_type_ids, labels=labels)
    r = hf(input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids, labels=labels)
    assert (a.logits - r.logits).abs().max() <= TOL
    assert abs(a.loss.item() - r.loss.item()) <= TOL
    a.loss.backward()
    r.loss.backward()
    theirs = dict(hf.named_parameters())
    from bertscope.core.weights import to_checkpoint_name

    compared = 0
    for name, p in ours.named_parameters():
        g_ref = theirs[to_checkpoint_name(name)].grad
        assert p.grad is not None and g_ref is not None, name
        assert (p.grad - g_ref).abs().max() <= TOL, (name, float((p.grad - g_ref).abs().max()))
        compared += 1
    assert compared == len(theirs)  # every parameter, the head and embeddings included


def test_inputs_embeds_give_the_same_logits_as_ids_and_as_hf(bert, bundled_path):
    ours = _classifier(bert).eval()
    hf = _hf_twin(ours, bundled_path).eval()
    b = _batch(bert)
    with torch.no_grad():
        by_ids = ours(b.input_ids, b.attention_mask, b.token_type_ids).logits
        emb = ours.bert.embeddings.word_embeddings(b.input_ids)  # (B, T, C)
        by_emb = ours(None, b.attention_mask, b.token_type_ids, inputs_embeds=emb).logits
        ref = hf(inputs_embeds=emb, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids).logits
    assert torch.equal(by_ids, by_emb)
    assert (by_emb - ref).abs().max() <= TOL
    with pytest.raises(ValueError, match="exactly one"):
        ours(b.input_ids, inputs_embeds=emb)


def test_five_adamw_steps_equal_hf_with_torch_adamw(bert, bundled_path):
    """Our training step (packed path, clipping, AdamW with decay groups, linear schedule)
    against HF's model trained with torch's AdamW and transformers' own linear schedule."""
    import transformers

    ours = _classifier(bert, num_labels=2, seed=1, dropout=0.0).train()
    hf = _hf_twin(ours, bundled_path, dropout=0.0).train()
    lr, wd, steps = 5e-5, 0.01, 5
    opt = make_optimizer(ours, lr, wd)
    sched = linear_schedule(opt, 2, steps)
    # HF's side: the grouping HF's Trainer uses (no decay on biases and LayerNorm weights)
    decay = [p for n, p in hf.named_parameters() if "bias" not in n and "LayerNorm" not in n]
    no_decay = [p for n, p in hf.named_parameters() if "bias" in n or "LayerNorm" in n]
    hf_opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                               lr=lr, betas=(0.9, 0.999), eps=1e-8)
    hf_sched = transformers.get_linear_schedule_with_warmup(hf_opt, 2, steps)
    enc = PackedEncoder()
    rng = np.random.default_rng(0)
    for step in range(steps):
        pick = rng.choice(len(TEXTS), size=3, replace=False).tolist()
        ids, types, _ = bert.tokenizer.encode_segments([TEXTS[i] for i in pick], [PAIRS[i] for i in pick])
        labels = [int(x) for x in rng.integers(0, 2, size=3)]
        train_step(ours, enc, opt, sched, ids, types, labels)
        b = bert.encode([TEXTS[i] for i in pick], pairs=[PAIRS[i] for i in pick])
        out = hf(input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids,
                 labels=torch.tensor(labels))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        hf_opt.step()
        hf_sched.step()
        hf_opt.zero_grad()
    theirs = hf.state_dict()
    start = to_hf_state_dict(_classifier(bert, num_labels=2, seed=1, dropout=0.0))
    moved = 0
    for name, w in to_hf_state_dict(ours).items():
        assert (w - theirs[name]).abs().max() <= TOL, (name, float((w - theirs[name]).abs().max()))
        moved += int(not torch.equal(w, start[name]))
    assert moved > 100  # the steps really changed the weights


def test_packed_training_step_equals_padded(bert):
    """The packed path's loss and every gradient against the padded reference path (dropout off)."""
    model = _classifier(bert, num_labels=3, seed=2).eval()
    ids, types, _ = bert.tokenizer.encode_segments(TEXTS + TEXTS[:2], PAIRS + [PAIRS[0], "x"])
    labels = [0, 1, 2, 1, 0, 2]
    assert len(set(len(t) for t in ids)) >= 4  # several length groups
    enc = PackedEncoder()
    packed_loss, n = training_loss(model, enc, ids, types, labels, packed=True)
    packed_loss.backward()
    packed_grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    padded_loss, m = training_loss(model, enc, ids, types, labels, packed=False)
    padded_loss.backward()
    assert n == m == sum(len(t) for t in ids)
    assert abs(float(packed_loss) - float(padded_loss)) <= TOL
    for k, p in model.named_parameters():
        assert (packed_grads[k] - p.grad).abs().max() <= TOL, k
    assert sum(float(g.abs().sum()) for g in packed_grads.values()) > 0


def test_attention_dropout_rate_on_the_packed_training_path():
    """With uniform attention (Q = K = 0) and one-hot values (V = I), each context row is the
    dropped probability row itself: count the zeroed weights against the configured rate."""
    from bertscope.fast.kernels import AttentionKernels
    from bertscope.fast.packing import pack_ids

    p_drop, H, L = 0.1, 4, 16
    D = L  # one value dimension per key position
    packed = pack_ids([[1] * L] * 6 + [[1] * (L - 3)] * 4)  # two length groups
    N = packed.num_tokens
    v = torch.zeros(N, H, D)
    for j, start in enumerate(packed.cu_seqlens[:-1].tolist()):
        n = packed.lengths[j]
        v[start:start + n, :, :n] = torch.eye(n)[:, None, :]  # token t offers e_t in every head
    qkv = torch.cat([torch.zeros(N, H * D), torch.zeros(N, H * D), v.reshape(N, H * D)], 1).requires_grad_()
    torch.manual_seed(0)
    ctx = AttentionKernels().attend(qkv, packed, H, impl="groups", dropout_p=p_drop).detach()  # (N, H·D)
    ctx = ctx.view(N, H, D)
    zeros = kept = 0
    for j, start in enumerate(packed.cu_seqlens[:-1].tolist()):
        n = packed.lengths[j]
        w = ctx[start:start + n, :, :n]  # (n, H, n) dropped weights of this sequence
        keep = w != 0
        torch.testing.assert_close(w[keep], torch.full_like(w[keep], 1 / n / (1 - p_drop)))  # survivors scaled
        zeros += int((~keep).sum())
        kept += int(keep.sum())
    total = zeros + kept
    rate = zeros / total
    se = (p_drop * (1 - p_drop) / total) ** 0.5
    assert abs(rate - p_drop) <= 3 * se, (rate, se)


def test_training_mode_passes_the_configured_attention_dropout_to_the_kernels():
    from bertscope.fast.kernels import AttentionKernels
    from bertscope.fast.packing import pack_ids

    seen = []

    class Recording(AttentionKernels):
        def attend(self, qkv, packed, H, **kw):
            seen.append(kw.get("dropout_p"))
            return super().attend(qkv, packed, H, **kw)

    cfg = bertscope.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=32, attention_probs_dropout_prob=0.17)
    model = BertForSequenceClassification(cfg, 2)
    enc = PackedEncoder(kernels=Recording())
    p = pack_ids([[1, 5, 6, 2], [1, 7, 2]])
    model.train()
    enc.classify(model, p).sum().backward()
    model.eval()
    with torch.no_grad():
        enc.classify(model, p)
    assert seen == [0.17, 0.17, 0.0, 0.0]


def _save_classifier_folder(tmp_path, bert, bundled_path, labels=("neg", "pos")):
    from bertscope.train.output import save_classifier

    model = _classifier(bert, num_labels=len(labels), seed=3)
    model.id2label = dict(enumerate(labels))
    out = tmp_path / "clf"
    save_classifier(out, model.eval(), bundled_path, max_length=64)
    return out, model


def test_classifier_folder_loads_in_bertscope_and_hf_with_equal_logits(tmp_path, bert, bundled_path):
    import transformers

    out, model = _save_classifier_folder(tmp_path, bert, bundled_path)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    assert cfg["id2label"] == {"0": "neg", "1": "pos"} and cfg["label2id"] == {"neg": 0, "pos": 1}
    clf = bertscope.load(out)
    assert clf.is_classifier and clf.labels == ["neg", "pos"] and clf.max_seq_length == 64
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    b = clf.encode(TEXTS)
    with torch.no_grad():
        ref = hf(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        ours = clf.model(b.input_ids, b.attention_mask).logits
    assert (ours - ref).abs().max() <= TOL
    probs = clf.classify(TEXTS, batch_size=2)  # packed, several batches, input order
    assert probs.shape == (len(TEXTS), 2)
    assert np.abs(probs - torch.softmax(ref, -1).numpy()).max() <= TOL
    assert np.allclose(probs.sum(1), 1.0, atol=1e-6)
    pair_probs = clf.classify(TEXTS, pairs=PAIRS)
    bp = clf.encode(TEXTS, pairs=PAIRS)
    with torch.no_grad():
        ref_pair = hf(input_ids=bp.input_ids, attention_mask=bp.attention_mask, token_type_ids=bp.token_type_ids).logits
    assert np.abs(pair_probs - torch.softmax(ref_pair, -1).numpy()).max() <= TOL
    # everything else keeps working on the classifier's encoder
    emb = clf.embed(["a text"])
    assert emb.shape == (1, bert.config.hidden_size)
    res = bertscope.attend(clf, TEXTS[0], "it")
    assert res.weights.shape[0] == bert.config.num_hidden_layers


def test_classifier_folder_runs_in_reduced_precision_and_tunes_on_its_encoder(tmp_path, bert, bundled_path,
                                                                              monkeypatch):
    """A fine-tuned folder loads with precision int8 or bf16 (calibrated and timed on its encoder),
    and embed, the first call on a fresh kernel-choice cache, measures the choice on the encoder."""
    import warnings

    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)
    out, _ = _save_classifier_folder(tmp_path, bert, bundled_path)
    fp32 = bertscope.load(out)
    emb = fp32.embed(TEXTS)  # the kernel choice is measured here, on the classifier's encoder
    assert fp32.fast.choice is not None and fp32.fast.choice.source == "measured"
    probs = fp32.classify(TEXTS)
    int8 = bertscope.load(out, precision="int8", keep_precision=True)
    assert int8.precision == "int8" and int8.int8_plan is not None
    assert np.abs(int8.classify(TEXTS) - probs).max() < 0.02
    assert (int8.embed(TEXTS) * emb).sum(1).min() > 0.97
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # bf16 is off on CPUs without it
        bf16 = bertscope.load(out, precision="bf16")
    assert bf16.precision in ("bf16", "fp32")
    assert np.abs(bf16.classify(TEXTS) - probs).max() < 0.02


def test_plain_encoder_has_no_classify(bert):
    assert not bert.is_classifier and bert.labels is None
    with pytest.raises(InputError, match="no classification head"):
        bert.classify(["a text"])


def test_classifier_folder_without_head_or_labels_is_refused(tmp_path, bert, bundled_path):
    from safetensors.torch import load_file, save_file

    out, _ = _save_classifier_folder(tmp_path, bert, bundled_path)
    weights = load_file(str(out / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith("classifier.")}, str(out / "model.safetensors"))
    with pytest.raises(CheckpointError, match="classifier.weight"):
        bertscope.load(out)
    save_file(weights, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["id2label"] = {"0": "neg", "1": "pos", "2": "mixed"}
    cfg["label2id"] = {"neg": 0, "pos": 1, "mixed": 2}
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="classifier.weight.*shape"):
        bertscope.load(out)
    cfg["label2id"] = {"neg": 1, "pos": 0, "mixed": 2}
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="label2id"):
        bertscope.load(out)
