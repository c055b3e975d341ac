"""A loaded model can be copied and pickled (copy.deepcopy, pickle, torch.save; what
multiprocessing, joblib and caches do), and the copy computes what the original does. All three
raised "cannot pickle '_thread.lock' object" (the tokenizer's lock), and after an embed, oneDNN's
packed weights: "Cannot access storage of OpaqueTensorImpl"."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch

from bertscope import TruncationWarning

TEXTS = ["The animal didn't cross the street because it was too tired", "a short one", "words " * 40]


def _round_trip(obj, how: str):
    if how == "deepcopy":
        return copy.deepcopy(obj)
    if how == "pickle":
        return pickle.loads(pickle.dumps(obj))
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_loaded_model_copies_and_the_copy_computes_the_same(bert, how):
    before = bert.embed(TEXTS)  # the fast path's prepared (packed) weights exist now
    twin = _round_trip(bert, how)
    assert twin.model is not bert.model and twin.tokenizer is not bert.tokenizer
    np.testing.assert_array_equal(twin.embed(TEXTS), before)
    assert twin.encode(TEXTS).input_ids.tolist() == bert.encode(TEXTS).input_ids.tolist()
    with torch.no_grad():  # the copy's weights are its own, and its fast path reads them
        twin.encoder.embeddings.word_embeddings.weight.mul_(0.5)
    assert not np.allclose(twin.embed(TEXTS), before, atol=1e-3)
    np.testing.assert_array_equal(bert.embed(TEXTS), before)


def test_the_tokenizer_copies_and_its_copy_still_guards_truncation(bert):
    tok = pickle.loads(pickle.dumps(bert.tokenizer))
    long = "word " * 600
    with pytest.warns(TruncationWarning):
        b = tok.encode([long, "short"])
    assert b.input_ids.shape == (2, bert.tokenizer.max_length) and b.truncated == [True, False]
    assert tok._lock is not bert.tokenizer._lock
