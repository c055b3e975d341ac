"""Sentence embeddings against sentence-transformers' encode of the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

import bertscope

TEXTS = [
    "The animal didn't cross the street because it was too tired",
    "A man is playing a guitar.",
    "x",
    "Sentence embeddings are the mean of the last hidden states over real tokens, then normalised.",
    "The quick brown fox jumps over the lazy dog " * 40,  # past max_seq_length = 256: truncated
]


@pytest.fixture(scope="module")
def st_model(bundled_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(bundled_path), device="cpu")


def test_embed_matches_sentence_transformers(bert, st_model):
    ref = st_model.encode(TEXTS, batch_size=2, convert_to_numpy=True, normalize_embeddings=True)
    with pytest.warns(UserWarning, match="truncated"):
        ours = bert.embed(TEXTS, batch_size=2)
    assert ours.shape == (len(TEXTS), bert.config.hidden_size) and ours.dtype == np.float32
    assert np.abs(ours - ref).max() <= 1e-5


def test_embed_is_in_input_order_and_batch_independent(bert):
    a = bert.embed(TEXTS[:4], batch_size=1)
    b = bert.embed(TEXTS[:4][::-1], batch_size=3)[::-1]
    assert np.abs(a - b).max() <= 1e-5
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


def test_embed_unnormalised_and_empty(bert, st_model):
    from sentence_transformers import SentenceTransformer

    # the checkpoint's transformer and mean-pooling modules, without its Normalize module
    unnormalised = SentenceTransformer(modules=[st_model[0], st_model[1]], device="cpu")
    ref = unnormalised.encode(TEXTS[:2], convert_to_numpy=True, normalize_embeddings=False)
    ours = bert.embed(TEXTS[:2], normalize=False)
    assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-2)
    assert np.abs(ours - ref).max() <= 1e-5
    assert bert.embed([]).shape == (0, bert.config.hidden_size)
    with pytest.raises(TypeError):
        bert.embed("one string")


def test_embed_progress_counts_every_text_once(bert):
    """Bert.embed had no progress (only embed_ids had): its calls add up to len(texts), empty
    texts included, and the rows are what they are without it."""
    texts = ["a b", "", "long " * 60, "  ", "x", "\u200b"] * 3
    seen: list[int] = []
    with_progress = bert.embed(texts, batch_size=2, progress=seen.append)
    assert sum(seen) == len(texts) and len(seen) > 2  # the empty ones, then batch by batch
    np.testing.assert_array_equal(with_progress, bert.embed(texts, batch_size=2))
    with pytest.raises(bertscope.InputTypeError, match="progress must be a function"):
        bert.embed(texts, progress=len(texts))
    with pytest.raises(bertscope.InputTypeError, match="progress must be a function"):
        bert.embed_ids([[101, 102]], progress="tqdm")


def test_max_seq_length_comes_from_sentence_bert_config(bert):
    assert bert.max_seq_length == 256
