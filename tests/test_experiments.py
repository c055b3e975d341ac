"""The seed's claims as experiments: checked against facts nobody here computed."""

from __future__ import annotations

import math

import pytest

from bertscope.cli.main import main
from bertscope.config import BertConfig
from bertscope.experiments import (errata, flops_per_forward, s1_self_match, s3_scaling, s4_padding,
                                   s11_permutation, s12_referent)

TEXTS = ["The cat sat on the mat.", "It was tired, so it slept."]


def test_errata_softmax_and_ratio():
    e = errata()
    # softmax by hand with math.exp, not torch
    z = [math.exp(x) for x in (0.9, 0.1, 0.3)]
    assert e.softmax == pytest.approx([v / sum(z) for v in z])
    assert [round(x, 2) for x in e.softmax] == [0.50, 0.22, 0.27]  # SPEC's errata
    assert e.attention_ratio == pytest.approx((512 / 192) ** 2)  # the seed's 7.1x, for L^2 terms only
    assert 1 < e.total_ratio < e.attention_ratio
    assert e.implied_scale[0] != pytest.approx(e.implied_scale[1], rel=0.1)  # no one temperature fits


def test_flops_grow_linearly_and_quadratically():
    c = BertConfig.preset("bert-base")
    a, b = flops_per_forward(c, 100), flops_per_forward(c, 200)
    assert b["linear"] == 2 * a["linear"] and b["attention"] == 4 * a["attention"]


def test_s1_cosine_self_match_is_certain(bert):
    r = s1_self_match(bert, TEXTS)
    assert r.identity_cosine == [1.0] * bert.config.num_hidden_layers
    assert all(0 <= x <= 1 for x in r.identity + r.learned)


def test_s3_unscaled_is_sharper(bert):
    r = s3_scaling(bert, TEXTS)
    # softmax(β·s) has entropy non-increasing in β: √D > 1 can only sharpen
    assert all(u <= s + 1e-9 for u, s in zip(r.entropy_unscaled, r.entropy_scaled))
    assert all(u >= s - 1e-9 for u, s in zip(r.max_unscaled, r.max_scaled))
    for d, std, std_scaled in r.random:
        assert std == pytest.approx(math.sqrt(d), rel=0.1) and std_scaled == pytest.approx(1.0, rel=0.1)


def test_s4_mask_makes_padding_invisible(bert):
    r = s4_padding(bert)
    assert r.pads > 0 and r.pad_weight_masked == 0.0
    assert r.masked_max_diff < 1e-4 < r.unmasked_max_diff
    assert r.pad_weight_unmasked > 0


def test_s11_equivariance(bert):
    r = s11_permutation(bert)
    assert r.attention_max_diff < 1e-4 and r.no_position_max_diff < 1e-4
    assert r.position_max_diff > 1e-2
    assert r.embedding_cos_no_position == pytest.approx(1.0, abs=1e-5)


def test_s12_shapes(bert):
    r = s12_referent(bert)
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    assert r.tired.shape == (N, H, 2) and r.wide.shape == (N, H, 2)
    assert set(r.follows_strong) <= set(r.follows)
    for l, h in r.follows:
        assert r.tired[l, h, 0] > r.tired[l, h, 1] and r.wide[l, h, 1] > r.wide[l, h, 0]


def test_experiments_cli(tmp_path, capsys):
    out = tmp_path / "docs"
    assert main(["experiments", "--out", str(out), "--no-plots"]) == 0
    md = (out / "EXPERIMENTS.md").read_text()
    for section in ("S1", "S3", "S4", "S11", "S12", "Errata", "Not run"):
        assert section in md
    assert (out / "experiments" / "results.json").is_file()
