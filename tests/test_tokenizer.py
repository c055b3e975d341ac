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
                                                         "texts[0])")):
        b = bert.encode([long, "short"])
    with pytest.warns(TruncationWarning, match="^the text is longer than 512 tokens and was truncated$"):
        bert.encode([long])  # one text: no count, no "texts[0]" to find
    with pytest.warns(TruncationWarning, match=re.escape("1 text(s) longer than 256 tokens were truncated (first: texts[2])")):
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


def _whole_text_reference(bundled_path, items, limit):
    """HF tokenizers' own encodings of the whole texts (or pairs), cut to ``limit``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundled_path / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(limit, strategy="longest_first")
    return tok.encode_batch(items)


def test_a_text_far_over_the_limit_is_cut_as_the_whole_text_would_be(bert, bundled_path):
    """A 10 MB line was tokenized whole (1.2 GB, 7 s) to keep 512 tokens; now from a prefix that
    ends at a whitespace, where that prefix alone holds more tokens than the limit. Held to the
    tokenizer's own encoding of every whole text: ids, segments, and whether it was cut."""
    import random

    from bertscope.core.tokenizer import PREFIX_CHARS_PER_TOKEN

    rng = random.Random(7)
    pieces = ["word", "Café", "naïve", "don't", "x" * 120, "日本語", "a,b;c", "\t", "\n", "  ", "\u200b",
              "\u0301", "émigré", "ﬁ", "(!)", "12.5%", "\x07", "supercalifragilistic", "\x1c", "\u3000", "\x85"]
    limit = 9
    cap = limit * PREFIX_CHARS_PER_TOKEN
    texts = []
    for n in (cap // 8, cap // 2, cap + 3, 2 * cap, 5 * cap):  # under and over the cap, by characters
        for _ in range(6):
            t = ""
            while len(t) < n:
                t += rng.choice(pieces) + rng.choice([" ", "", "  ", "\n"])
            texts.append(t)
    texts.append("word " * cap + " " * (3 * cap))  # the prefix's tokens, then only whitespace
    texts.append("word " * 3 + "\u200b " * (2 * cap))  # few tokens, then characters the tokenizer drops
    texts.append("y" * (3 * cap) + " end")  # one word longer than the cap: no place to cut
    # \x1c is whitespace to Python but a control character BERT's normalizer drops: a cut there
    # ended the word "unbelievablyunbelievably☃☃..." (one [UNK]) early, as un ##bel ##ie ##va
    texts.append("a b c " + "\x07" * (cap - 32) + "unbelievablyunbelievably\x1c" + "\u2603" * 10 + " tail" * cap)
    tok = bert.tokenizer
    short = tok._prefixes(texts, limit)  # the path under test is taken: many texts are read from a prefix
    assert sum(len(a) < len(b) for a, b in zip(short, texts)) >= 10 and short[-2] == texts[-2]
    ids, cut = tok.encode_ids(texts, max_length=limit)
    ref = _whole_text_reference(bundled_path, texts, limit)
    assert ids == [e.ids for e in ref]
    assert cut == [bool(e.overflowing) for e in ref]
    assert sum(cut) > len(texts) // 2 and not all(cut)  # both kinds occur
    pairs = list(zip(texts, reversed(texts)))
    p_ids, p_types, p_cut = tok.encode_segments(texts, list(reversed(texts)), max_length=limit)
    ref = _whole_text_reference(bundled_path, pairs, limit)
    assert (p_ids, p_types, p_cut) == ([e.ids for e in ref], [e.type_ids for e in ref],
                                      [bool(e.overflowing) for e in ref])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)
        batch = tok.encode(texts[-8:], max_length=limit)
    assert batch.truncated == cut[-8:]
    assert [row[:n].tolist() for row, n in zip(batch.input_ids, batch.lengths)] == ids[-8:]
