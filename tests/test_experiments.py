"""The seed's claims as experiments: checked against facts nobody here computed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import bertscope

from bertscope.cli.main import main
from bertscope.core.config import BertConfig
from bertscope.understand.experiments.claims import (errata, flops_per_forward, s1_self_match, s3_scaling, s4_padding,
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


PRONOUNS = Path(bertscope.__file__).parent / "understand" / "data" / "pronouns.xml"


def test_experiments_records_the_real_command_and_limit(tmp_path, capsys):
    out = tmp_path / "docs"
    assert main(["experiments", "--out", str(out), "--wsc", str(PRONOUNS), "--wsc-limit", "4", "--no-plots"]) == 0
    md = (out / "EXPERIMENTS.md").read_text()
    header = md.splitlines()[2]
    assert f"`bertscope experiments --out {out} --wsc {PRONOUNS} --wsc-limit 4 --no-plots`" in header
    assert "WSC273" not in md.split("## Errata")[0].split("## Pronoun resolution")[1].splitlines()[0]
    assert f"`bertscope coref {PRONOUNS} --limit 4`: 4 schemas scored" in md
    assert "--limit 273" not in md
    assert "![" not in md  # --no-plots: no link to an image that was never written
    assert not list((out / "experiments").glob("*.png"))
    res = json.loads((out / "experiments" / "results.json").read_text(),
                     parse_constant=lambda c: pytest.fail(f"{c} in results.json"))
    assert res["wsc"]["limit"] == 4 and res["wsc"]["schemas_scored"] == 4


def test_experiments_bad_arguments_fail_before_work(tmp_path, capsys):
    assert main(["experiments", "--out", str(tmp_path), "--wsc-limit", "10"]) == 2
    err = capsys.readouterr().err
    assert "--wsc-limit needs --wsc" in err and len(err.strip().splitlines()) == 1
    f = tmp_path / "in.txt"
    f.write_text("x")
    assert main(["experiments", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and len(err.strip().splitlines()) == 1
    assert main(["experiments", "--out", str(tmp_path / "d"), "--wsc", str(tmp_path / "none.xml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_wsc273_only_when_exactly_the_first_273_were_scored():
    from types import SimpleNamespace

    from bertscope.understand.experiments.report import is_wsc273, wsc_name

    r = SimpleNamespace(wsc=SimpleNamespace(numbers=list(range(1, 274))), wsc_limit=273)
    assert is_wsc273(r) and wsc_name(r) == "WSC273"
    r = SimpleNamespace(wsc=SimpleNamespace(numbers=[n for n in range(1, 274) if n != 7]), wsc_limit=273)
    assert not is_wsc273(r) and wsc_name(r) == "272 WSC schemas"
    r = SimpleNamespace(wsc=SimpleNamespace(numbers=list(range(1, 11))), wsc_limit=10)
    assert not is_wsc273(r)
