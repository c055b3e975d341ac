"""Head statistics on hand-made attention maps with known answers, and the heads command."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from bertscope.cli.app import main
from bertscope.errors import InputError
from bertscope.understand.headstats import classify, head_stats, map_stats, pattern_features, token_kinds

TOKENS = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]  # no punctuation
T = len(TOKENS)
KINDS = token_kinds(TOKENS)


def _cls(probs):
    f = pattern_features(probs, KINDS)
    return classify(float(f["v"]), float(f["d"]), float(f["spread"]), float(f["u"]))


def test_identity_is_diagonal_and_all_self():
    m = torch.eye(T)
    s = map_stats(m, KINDS)
    assert float(s["self"]) == 1.0 and float(s["prev"]) == 0.0 and float(s["next"]) == 0.0
    assert float(s["entropy"]) == 0.0 and float(s["distance"]) == 0.0
    assert _cls(m) == "diagonal"


def test_previous_token_head_is_diagonal():
    m = torch.zeros(T, T)
    m[0, 0] = 1
    for q in range(1, T):
        m[q, q - 1] = 1
    s = map_stats(m, KINDS)
    assert float(s["prev"]) == 1.0 and float(s["distance"]) == pytest.approx((T - 1) / T)
    assert _cls(m) == "diagonal"


def test_sep_only_head_is_vertical():
    m = torch.zeros(T, T)
    m[:, T - 1] = 1
    s = map_stats(m, KINDS)
    assert float(s["sep"]) == 1.0 and float(s["cls"]) == 0.0
    assert _cls(m) == "vertical"


def test_uniform_entropy_is_ln_t_and_block():
    m = torch.full((T, T), 1.0 / T, dtype=torch.float64)
    s = map_stats(m, KINDS)
    assert float(s["entropy"]) == pytest.approx(math.log(T))
    assert float(s["entropy_gap"]) == pytest.approx(0.0, abs=1e-12)
    assert float(s["cls"]) == pytest.approx(1 / T)
    # mean |q - k| over all pairs of T positions: (T^2 - 1) / (3T)
    assert float(s["distance"]) == pytest.approx((T * T - 1) / (3 * T))
    assert _cls(m) == "block"


def test_half_sep_half_self_is_vertical_plus_diagonal():
    m = 0.5 * torch.eye(T)
    m[:, T - 1] += 0.5
    assert _cls(m) == "vertical+diagonal"


def test_one_distant_word_is_heterogeneous():
    m = torch.zeros(T, T)
    m[:, 2] = 1  # everyone looks at "cat"
    m[1:4, :] = 0
    m[1:4, 6] = 1  # "the cat sat" look at "mat"
    assert _cls(m) == "heterogeneous"


def test_punctuation_counts():
    kinds = token_kinds(["[CLS]", "hi", ",", "there", ".", "[SEP]"])
    assert kinds.punct.tolist() == [False, False, True, False, True, False]
    m = torch.zeros(6, 6)
    m[:, 2] = 0.25
    m[:, 4] = 0.75
    assert float(map_stats(m, kinds)["punct"]) == pytest.approx(1.0)


def test_batched_maps_match_single():
    maps = torch.softmax(torch.randn(3, 4, T, T, generator=torch.Generator().manual_seed(0)), -1)
    s = map_stats(maps, KINDS)
    one = map_stats(maps[1, 2], KINDS)
    for k in one:
        assert float(s[k][1, 2]) == pytest.approx(float(one[k]), rel=1e-6)


def test_head_stats_on_model(bert):
    hs = head_stats(bert, ["The cat sat on the mat.", "It was tired, so it slept."])
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    assert hs.shape == (N, H) and hs.num_texts == 2
    total = hs.stats["cls"] + hs.stats["sep"] + hs.stats["punct"]
    assert bool((total <= 1 + 1e-5).all())
    assert bool((hs.stats["entropy_gap"] >= -1e-5).all())
    assert sum(int(c.sum()) for c in hs.class_counts.values()) == 2 * N * H
    with pytest.raises(InputError, match="no text"):
        head_stats(bert, ["", "   "])


def test_heads_cli(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"The cat sat on the mat.\n\n\xff\xfe bad line\nIt was tired.\n")
    out = tmp_path / "maps"
    assert main(["heads", str(corpus), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert "line 3" in cap.err and "pattern class" in cap.out
    assert (out / "heads_entropy.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "heads.json").read_text())["num_texts"] == 2
    assert main(["heads", str(corpus), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layers"] > 0
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    assert main(["heads", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no text" in err and len(err.strip().splitlines()) == 1
    assert main(["heads", str(tmp_path / "missing.txt")]) == 2


def test_a_short_text_can_still_have_vertical_heads():
    """A 7-token text: uniform attention puts u = 0.6 on [CLS], [SEP], "." and neighbours, so 1.5 u
    = 0.9 left almost no head vertical; the bar is now halfway from u to 1 there (0.8)."""
    tokens = ["[CLS]", "the", "cat", "sat", "on", "mat", ".", "[SEP]"]
    kinds = token_kinds(tokens)
    n = len(tokens)
    m = torch.zeros(n, n, dtype=torch.float64)
    m[:, 0] = 0.85  # mostly [CLS], as many heads do
    for q in range(n):
        far = [k for k in range(1, n - 2) if abs(k - q) > 1]
        m[q, far] += 0.15 / len(far)
    m[:, n - 1] += 1 - m.sum(-1)  # the rounding to 1
    f = pattern_features(m, kinds)
    u = float(f["u"])
    assert u > 0.5 and float(f["v"] + f["d"]) < 1.5 * u  # the old bar would call it block
    assert classify(float(f["v"]), float(f["d"]), float(f["spread"]), u) == "vertical"
    uniform = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    g = pattern_features(uniform, kinds)
    assert classify(float(g["v"]), float(g["d"]), float(g["spread"]), float(g["u"])) == "block"


def test_a_text_with_no_tokens_is_skipped_with_a_warning(bert):
    stats = head_stats(bert, [(1, "the cat sat on the mat"), (2, "\u200b\u200b")])
    assert stats.num_texts == 1
    assert any("line 2 has no tokens" in w for w in stats.warnings)
    with pytest.raises(InputError, match="has no tokens"):
        head_stats(bert, [(1, "\u200b")])


def test_a_blank_text_is_skipped_with_a_warning_as_a_tokenless_one_is(bert):
    """A blank text was skipped without a word, while a tokenless one was named."""
    stats = head_stats(bert, ["the cat sat on the mat", "", "a dog ran", "  \t "])
    assert stats.num_texts == 2
    assert "2 lines are blank and were skipped (lines 2, 4)" in stats.warnings
    one = head_stats(bert, [(7, " "), (8, "the cat sat")])
    assert one.num_texts == 1 and "line 7 is blank and was skipped" in one.warnings
    assert not any("blank" in w for w in head_stats(bert, ["the cat sat"]).warnings)
    with pytest.raises(InputError, match="the corpus has no text"):
        head_stats(bert, ["", " "])


def test_head_stats_refuses_pairs_that_are_not_numbered_texts_and_odd_options(bert):
    """A pair of strings read its first string as a line number and dropped it without a word;
    warnings="abc" became ['a', 'b', 'c']; progress=5 raised TypeError from inside."""
    for texts, fragment in (([("a b", "c d")], "item 1 is a pair whose first element, 'a b', is not a line number"),
                            (["ok", (0, "x")], "item 2 is a pair whose first element, 0, is not a line number"),
                            ([(True, "x")], "first element, True, is not a line number")):
        with pytest.raises(InputError, match=re.escape(fragment)):
            head_stats(bert, texts)
    with pytest.raises(InputError, match="warnings must be a list of strings"):
        head_stats(bert, ["the cat sat"], warnings="abc")
    with pytest.raises(InputError, match=re.escape("progress must be a function (done, total), got int")):
        head_stats(bert, ["the cat sat"], progress=5)
    stats = head_stats(bert, [(3, "the cat sat"), "a dog ran"], warnings=["the reader's note"])
    assert stats.num_texts == 2 and "the reader's note" in stats.warnings
    import numpy as np  # line numbers from a table's index: zip(df.index, df.text)

    assert head_stats(bert, [(np.int64(3), "the cat sat"), (np.int64(4), "a dog ran")]).num_texts == 2


def test_a_text_of_one_word_is_classed_by_its_shares_not_by_rounding():
    """One word: u = 1, so the bar is 1, which v + d meets only up to float rounding."""
    for vd in (1 - 1e-7, 1.0, 1 + 1e-7):
        assert classify(vd, 0.0, 0.0, 1.0) == "vertical"
        assert classify(0.0, vd, 0.0, 1.0) == "diagonal"
