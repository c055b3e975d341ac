"""Word-level attention (Clark et al. 2019) and the it -> animal heads (S12)."""

from __future__ import annotations

import unicodedata

import pytest
import torch

import bertscope
from bertscope.core.words import find_word, group_words, word_attention
from bertscope.errors import InputError

from conftest import IT_ANIMAL


def test_word_attention_sums_to_words_and_averages_from_words():
    # tokens: [CLS] play ##ing [SEP] -> words: [CLS], playing, [SEP]
    probs = torch.tensor([
        [0.1, 0.2, 0.3, 0.4],
        [0.5, 0.1, 0.1, 0.3],
        [0.2, 0.2, 0.2, 0.4],
        [0.0, 0.5, 0.5, 0.0],
    ])
    w = word_attention(probs, [0, 1, 1, 2])
    expected = torch.tensor([
        [0.1, 0.5, 0.4],  # [CLS]: to "playing" = 0.2 + 0.3
        [0.35, 0.3, 0.35],  # "playing": mean of rows 1 and 2 -> (0.5+0.2)/2, (0.2+0.4)/2, (0.3+0.4)/2
        [0.0, 1.0, 0.0],
    ])
    assert torch.allclose(w, expected)
    assert torch.allclose(w.sum(-1), torch.ones(3))


def test_group_words_keeps_the_text_as_written(bert):
    text = "Tokenization splits unbelievably long words."
    batch = bert.encode([text])
    words = group_words(batch, text)
    assert words.words[0] == "[CLS]" and words.words[-1] == "[SEP]"
    assert "Tokenization" in words.words and "unbelievably" in words.words
    assert len(words.token_words) == len(batch.tokens[0])
    assert len(batch.tokens[0]) > len(words.words)  # some words were split into sub-tokens


def test_find_word_errors():
    words = ["[CLS]", "The", "cat", "the", "[SEP]"]
    assert find_word(words, "the") == 1 and find_word(words, "THE", 2) == 3
    with pytest.raises(InputError, match="'dog' is not in the text"):
        find_word(words, "dog")
    with pytest.raises(InputError, match="occurs 2 time"):
        find_word(words, "the", 3)


def test_find_word_looks_past_accents_only_when_no_word_is_equal():
    """--token cafe found nothing in "at the café", which the uncased model reads as "cafe"."""
    words = ["[CLS]", "at", "the", "café", "near", "the", "Cafe", "[SEP]"]
    assert find_word(words, "cafe") == 6  # an equal word first, as written
    assert find_word(["[CLS]", "the", "café", "[SEP]"], "cafe") == 2
    assert find_word(["[CLS]", "the", "cafe\u0301", "[SEP]"], "CAFÉ") == 2  # é decomposed
    assert find_word(["[CLS]", "naïve", "[SEP]"], "naive") == 1
    with pytest.raises(InputError, match="'cafes' is not in the text"):
        find_word(["[CLS]", "café", "[SEP]"], "cafes")


def test_it_attends_to_animal_in_the_heads_the_spec_names(bert, hf_model):
    res = bertscope.attend(bert, IT_ANIMAL, "it")
    animal = res.words.index("animal")
    assert res.token == "it"
    assert torch.allclose(res.weights.sum(-1), torch.ones(res.weights.shape[:2]), atol=1e-5)
    top2 = {(l, h) for l, h, _ in res.heads_for(animal, k=2)}
    assert top2 == {(3, 1), (5, 11)}
    assert res.top_words(3, 1, 1)[0][0] == "animal" and res.top_words(5, 11, 1)[0][0] == "animal"
    # The same word-level number computed from HF transformers' attentions.
    batch = bert.encode([IT_ANIMAL])
    with torch.no_grad():
        ref = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       output_attentions=True).attentions
    words = group_words(batch, IT_ANIMAL)
    for layer, head in ((3, 1), (5, 11)):
        w = word_attention(ref[layer][0, head], words.token_words)
        assert abs(w[res.index, animal].item() - res.weights[layer, head, animal].item()) < 1e-5
        assert w[res.index, animal].item() > 0.5


def test_find_word_explains_split_words_and_empty_texts():
    words = ["[CLS]", "The", "animal", "didn", "'", "t", "cross", "[SEP]"]
    with pytest.raises(InputError, match=r"splits \"didn't\" into the words didn ' t; give one of them, e.g. 'didn'"):
        find_word(words, "didn't")
    with pytest.raises(InputError, match="the text has no tokens"):
        find_word(["[CLS]", "[SEP]"], "x")


def test_attend_on_a_text_of_control_characters(bert):
    with pytest.raises(InputError, match="no tokens"):
        bertscope.attend(bert, "\x01\x02", "x")


@pytest.mark.parametrize("text", ["Le cafe\u0301 est ouvert", "e\u0301e\u0301e\u0301 x", "Le café est ouvert"])
def test_words_keep_combining_marks_the_tokenizer_strips(bert, text):
    """Decomposed accents (e + U+0301): the tokenizer strips the mark, and the last sub-token's
    offset ended before it, so the word read "cafe" and --token café was refused."""
    words = group_words(bert.encode([text]), text).words
    assert words[1:-1] == text.split()
    for spelling in ("café", unicodedata.normalize("NFD", "café")):  # either spelling finds either text
        if "caf" in text:
            assert bertscope.attend(bert, text, spelling).index == 2


def test_cut_off_counts_whole_words_and_punctuation_and_cjk_characters():
    """'at' is not a word of "the cat sat"; "." and a CJK character are words wherever they stand."""
    from bertscope.core.words import _cut_off

    assert not _cut_off("the cat sat", "at", 0) and _cut_off("a mat b", "mat", 0)
    assert _cut_off("the cat sat. the end. x.", ".", 2) and not _cut_off("the cat sat. x.", ".", 2)
    assert _cut_off("東京都", "京", 0)
