"""The report: its numbers (against HF transformers), its compact storage, its HTML, the CLI."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import bertscope
from bertscope.see.report import QUANT_SCALE, build_report, quantize_rows

from conftest import IT_ANIMAL

ROOT = Path(__file__).resolve().parents[1]
WIDE = "The animal didn't cross the street because it was too wide"


def hf_attentions(hf_model, bert, text: str) -> np.ndarray:
    """(N, H, T, T) from HF transformers' BertModel: a reference nobody here wrote."""
    b = bert.encode([text])
    with torch.inference_mode():
        out = hf_model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                       token_type_ids=b.token_type_ids, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).numpy()


def test_report_matches_hf_and_strips_padding(bert, hf_model):
    rep = build_report(bert, IT_ANIMAL, WIDE + " and it was very late at night")  # B is longer: A is padded
    a, b = rep.texts
    assert len(a.tokens) < len(b.tokens)
    for rt, text in ((a, IT_ANIMAL), (b, WIDE + " and it was very late at night")):
        ref = hf_attentions(hf_model, bert, text)
        assert rt.attentions.shape == ref.shape
        np.testing.assert_allclose(rt.attentions, ref, atol=1e-5)
        np.testing.assert_allclose(rt.attentions.sum(-1), 1.0, atol=1e-5)


def test_rollout_against_an_independent_computation(bert, hf_model):
    [rt] = build_report(bert, IT_ANIMAL).texts
    ref = hf_attentions(hf_model, bert, IT_ANIMAL).astype(np.float64)
    T = ref.shape[-1]
    rolled = np.eye(T)
    for layer in range(ref.shape[0]):
        a = 0.5 * ref[layer].mean(0) + 0.5 * np.eye(T)  # rows of (A + I) renormalised
        rolled = a @ rolled
        np.testing.assert_allclose(rt.rollout[layer], rolled, atol=1e-5)


def test_quantization_error_is_bounded_for_values_and_word_sums():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(40, 0.3), size=(3, 5, 40))  # (N, H, T, T), peaky rows like attention
    q = quantize_rows(p)
    back = q.astype(np.float64) / QUANT_SCALE
    assert np.abs(back - p).max() <= 1 / QUANT_SCALE
    assert (q.sum(-1) == QUANT_SCALE).all()  # rows still sum to exactly 1
    for a, b in [(3, 6), (0, 40), (10, 11), (20, 33)]:  # any run of neighbours, e.g. a split word
        assert np.abs(back[..., a:b].sum(-1) - p[..., a:b].sum(-1)).max() <= 1 / QUANT_SCALE + 1e-12


def _embedded(html: str):
    cfg = json.loads(re.search(r'<script id="bertscope-config" type="application/json">(.*?)</script>', html, re.S)[1])
    blob = re.search(r'<script id="bertscope-blob" type="application/octet-stream">(.*?)</script>', html, re.S)[1]
    raw = np.frombuffer(zlib.decompress(base64.b64decode(blob)), np.uint8)
    n = cfg["meta"]["data"]["count"]
    q = raw[:n].astype(np.uint16) | (raw[n:].astype(np.uint16) << 8)
    return cfg, q


def test_html_is_self_contained_and_carries_the_numbers(bert, hf_model):
    rep = build_report(bert, IT_ANIMAL, WIDE)
    html = rep.to_html()
    # no network: no external scripts, styles, images, fonts or fetches
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html, re.I)
    assert "<link" not in html and "@import" not in html and "url(http" not in html
    assert "cdn" not in html.lower()
    cfg, q = _embedded(html)
    assert cfg["mode"] == "file"
    meta = cfg["meta"]
    assert meta["layers"] == 6 and meta["heads"] == 12 and len(meta["texts"]) == 2
    for t, text in enumerate((IT_ANIMAL, WIDE)):
        ref = hf_attentions(hf_model, bert, text)
        T = ref.shape[-1]
        off = meta["data"]["layout"][t]["attn"]
        got = q[off:off + ref.size].reshape(ref.shape) / QUANT_SCALE
        assert np.abs(got - ref).max() <= 1 / QUANT_SCALE
        assert meta["texts"][t]["tokens"][0] == "[CLS]" and len(meta["texts"][t]["tokens"]) == T


def test_texts_cannot_break_out_of_the_page(bert):
    rep = build_report(bert, "</script><script>alert(1)</script> <!-- x")
    html = rep.to_html()
    assert "<script>alert(1)" not in html
    cfg, _ = _embedded(html)
    assert cfg["meta"]["texts"][0]["text"].startswith("</script>")


def test_repr_html_is_an_isolated_frame(bert):
    rep = build_report(bert, "a short text")
    frame = rep._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and "bertscope-config" in frame and "<script" not in frame


def test_empty_text_is_an_input_error(bert):
    with pytest.raises(bertscope.InputError):
        build_report(bert, "   ")
    with pytest.raises(bertscope.InputError):
        build_report(bert, "fine", " ")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "bertscope", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_cli_view_writes_the_page(tmp_path):
    out = tmp_path / "r.html"
    r = _cli("view", IT_ANIMAL, WIDE, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left behind


def test_cli_view_user_errors(tmp_path):
    r = _cli("view", "", "--out", str(tmp_path / "x.html"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "empty" in r.stderr
    r = _cli("view", "text", "--out", str(tmp_path / "x.png"))
    assert r.returncode == 2 and ".html" in r.stderr
    r = _cli("view", "text", "--out", str(tmp_path / "missing" / "x.html"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_cli_view_bad_output_paths(tmp_path):
    folder = tmp_path / "d.html"
    folder.mkdir()
    r = _cli("view", "text", "--out", str(folder))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is a folder" in r.stderr
    if Path("/proc/self").is_dir():  # a folder the permission bits call writable (as root) but is not
        r = _cli("view", "text", "--out", "/proc/x.html")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("bertscope: error: --out") and ".tmp" not in r.stderr
