"""The tokenizer wrapper against HF transformers' own tokenizer for the checkpoint."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from bertscope import TruncationWarning

TEXTS = ["The animal didn't cross the street because it was too tired", "Hello, World!", "ß café naïve"]


def test_ids_match_hf_tokenizer(bert, bundled_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(bundled_path))
    ref = hf(TEXTS, padding=True, return_tensors="pt")
    ours = bert.encode(TEXTS)
    assert torch.equal(ours.input_ids, ref["input_ids"])
    assert torch.equal(ours.attention_mask, ref["attention_mask"])
    assert torch.equal(ours.token_type_ids, ref["token_type_ids"])


def test_pairs_get_segment_ids(bert):
    b = bert.encode(["first part"], pairs=["second part"])
    assert b.tokens[0][0] == "[CLS]" and b.tokens[0].count("[SEP]") == 2
    types = b.token_type_ids[0].tolist()
    assert types[0] == 0 and types[-1] == 1 and sorted(set(types)) == [0, 1]


def test_uncased_checkpoint_lowercases(bert):
    assert bert.tokenizer.do_lower_case is True
    assert bert.encode(["HELLO"]).tokens[0] == bert.encode(["hello"]).tokens[0]


def test_long_text_is_truncated_with_a_warning(bert):
    long = "word " * 1000
    with pytest.warns(TruncationWarning, match=re.escape("1 text(s) longer than 512 tokens were truncated (first: "
                                                         "text 1)")):
        b = bert.encode([long, "short"])
    with pytest.warns(TruncationWarning, match="^the text is longer than 512 tokens and was truncated$"):
        bert.encode([long])  # one text: no count, no "text 1" to find
    with pytest.warns(TruncationWarning, match=re.escape("1 text(s) longer than 256 tokens were truncated (first: text 3)")):
        bert.embed(["", "short", long])  # numbered as given, blank texts counted
    assert b.input_ids.shape == (2, 512) and b.truncated == [True, False]
    assert b.tokens[0][-1] == "[SEP]"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bert.encode(["short"])  # no warning when nothing is cut


def test_truncation_warnings_point_at_the_callers_line_so_each_is_shown(bert):
    """They pointed at a line inside bertscope: Python shows a warning once per place, so after
    the first, every later truncation (by attend, trace, encode...) went unseen."""
    import bertscope

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bert.encode(["fish " * 800])
        bertscope.attend(bert, "cat " * 600, "cat")
        bertscope.trace(bert, "dog " * 700, "dog", 0, 0)
        bert.embed(["bird " * 300])
    cuts = [w for w in caught if issubclass(w.category, TruncationWarning)]
    assert len(cuts) == 4, [str(w.message) for w in caught]
    assert {w.filename for w in cuts} == {__file__}, [(w.filename, w.lineno) for w in cuts]
    assert len({w.lineno for w in cuts}) == 4


def test_encode_rejects_a_bare_string(bert):
    with pytest.raises(TypeError):
        bert.encode("not a list")
