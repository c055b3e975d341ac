"""Functions that read a model's attention give the eval-mode answer whatever mode the user left
the model in, return ordinary tensors, and name the mistake when handed something that is not a
loaded model (a raw BertModel, None)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertscope
from bertscope import InputTypeError

TEXT = "The animal didn't cross the street because it was too tired"


def readings(bert):
    """What each analysis function says about TEXT, as plain numbers."""
    att = bertscope.attend(bert, TEXT, "it")
    tr = bertscope.trace(bert, TEXT, "it", 3, 1)
    ab = bertscope.ablate(bert, TEXT, [(3, 1)])
    hs = bertscope.head_stats(bert, [TEXT, "The cat sat on the mat."])
    rep = bertscope.build_report(bert, TEXT)
    return {
        "attend": att.weights.numpy().copy(),
        "trace": tr.weights.numpy().copy(),
        "ablate": np.array([ab.embedding_cosine]),
        "heads": hs.stats["entropy"].numpy().copy(),
        "report": np.asarray(rep.texts[0].attentions, dtype=np.float32).copy(),
        "explain": bertscope.explain(bert, TEXT, "attention").maps.copy(),
    }


def test_training_mode_does_not_change_what_is_read(bert):
    """Dropout (0.1 on attention) changed every reading when a user left the model in train
    mode, say after their own fine-tuning loop; each reading is now taken in eval mode and the
    model's mode is given back."""
    want = readings(bert)
    bert.model.train()
    try:
        for _ in range(2):  # dropout is random: twice, so a lucky draw cannot pass
            got = readings(bert)
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert bert.model.training  # the user's mode is kept
    finally:
        bert.model.eval()
    assert not bert.model.training


def test_returned_tensors_are_ordinary(bert):
    """Results computed under inference mode could not be changed in place or used in autograd."""
    att = bertscope.attend(bert, TEXT, "it")
    tr = bertscope.trace(bert, TEXT, "it", 3, 1)
    ab = bertscope.ablate(bert, TEXT, [(3, 1)])
    for t in (att.weights, tr.weights, tr.scores, ab.token_cosine):
        assert isinstance(t, torch.Tensor) and not t.is_inference()
    w = att.weights
    w /= w.sum(-1, keepdim=True)  # in place: raised "Inplace update to inference tensor"
    x = torch.ones_like(tr.weights, requires_grad=True)
    (x * tr.weights).sum().backward()  # raised "Inference tensors cannot be saved for backward"
    torch.testing.assert_close(x.grad, tr.weights)


@pytest.mark.parametrize("call", [
    lambda b: bertscope.attend(b.model, TEXT, "it"),
    lambda b: bertscope.trace(b.model, TEXT, "it"),
    lambda b: bertscope.ablate(b.model, TEXT, [(0, 0)]),
    lambda b: bertscope.head_stats(b.model, [TEXT]),
    lambda b: bertscope.build_report(b.model, TEXT),
    lambda b: bertscope.build_report(b, TEXT, bert_b=b.model),
    lambda b: bertscope.explain(b.model, TEXT, "attention"),
    lambda b: bertscope.attend(None, TEXT, "it"),
], ids=["attend", "trace", "ablate", "head_stats", "build_report", "bert_b", "explain", "None"])
def test_a_raw_model_is_named_as_the_mistake(bert, call):
    """bert.model is the README's first line about the model, so passing it is a likely mistake;
    it raised AttributeError: 'BertModel' object has no attribute 'encode'."""
    with pytest.raises(InputTypeError, match=r"^\w+\(\)('s bert_b)? takes a loaded model, bertscope\.load\(\.\.\.\), not (BertModel|NoneType)$"):
        call(bert)


def test_bertmodel_needs_a_config():
    with pytest.raises(InputTypeError, match="BertModel takes a BertConfig"):
        bertscope.BertModel(None)
    with pytest.raises(InputTypeError, match="not dict"):
        bertscope.BertModel({"hidden_size": 8})


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_model_path_is_refused(path):
    """load("") read the current folder, ".", and said ". is not a BERT checkpoint"."""
    with pytest.raises(bertscope.InputError, match="the model folder is an empty name"):
        bertscope.load(path)


def test_each_modules_mode_is_given_back(bert):
    """A model trained with a frozen part (its embeddings in eval mode) kept that part frozen:
    restoring only the top flag set every submodule to training."""
    m = bert.model
    m.train()
    m.embeddings.eval()
    try:
        bertscope.attend(bert, TEXT, "it")
        bert.embed(["a text"])
        bertscope.explain(bert, TEXT, "attention")
        assert m.training and not m.embeddings.training and not m.embeddings.norm.training
        assert all(layer.training for layer in m.layers)
    finally:
        m.eval()


def test_overlapping_eval_blocks_keep_dropout_off_until_the_last_one_leaves(bert):
    """Two threads reading one model left in training mode: the first to finish gave the model
    back its training mode while the other was still computing (an embedding off by 0.055, with
    dropout on), and the other then left the model in eval mode for good. Blocks that overlap
    now hold eval mode until the last leaves. The interleaving is forced with events, not timed."""
    import threading

    from bertscope.core.model import evaluating

    m = bert.model
    clf_like = torch.nn.Sequential(m)  # a wrapper another thread evaluates, sharing m's modules
    m.train()
    m.embeddings.eval()  # a frozen part, kept frozen
    inside, first_left, seen = threading.Event(), threading.Event(), {}

    def second():
        with evaluating(clf_like):
            inside.set()
            first_left.wait(30)
            seen["while_second_holds"] = (m.training, any(x.training for x in m.modules()))
            seen["reading"] = bert.embed([TEXT])

    try:
        t = threading.Thread(target=second)
        with evaluating(m):
            t.start()
            assert inside.wait(30)
        first_left.set()
        t.join(30)
        assert seen["while_second_holds"] == (False, False)
        assert m.training and not m.embeddings.training and all(layer.training for layer in m.layers)
        m.eval()
        np.testing.assert_array_equal(seen["reading"], bert.embed([TEXT]))
    finally:
        m.eval()


def test_a_model_put_back_in_training_mode_inside_a_block_reads_with_dropout_off(bert):
    """A block entered while another held the model only counted itself in, so a model.train()
    in between (a user's, or a training loop's in another thread) left dropout on for it."""
    from bertscope.core.model import evaluating

    m = bert.model
    try:
        with evaluating(m):
            m.train()
            with evaluating(m):
                assert not any(x.training for x in m.modules())
    finally:
        m.eval()
