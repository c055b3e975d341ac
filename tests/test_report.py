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
from bertscope.see.report import QUANT_SCALE, align_units, build_report, parse_span, quantize_rows, render_page

from conftest import IT_ANIMAL
from viewkit import external_references

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
    assert external_references(html) == []  # no network: nothing to load from outside the page
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


@pytest.mark.parametrize("inject", [
    '<script src="https://cdn.example.com/lib.js"></script>',
    '<script src="//cdn.example.com/lib.js"></script>',
    '<script src="lib.js"></script>',
    '<link rel="stylesheet" href="https://fonts.example.com/a.css">',
    '<img src="http://tracker.example.com/p.gif">',
    '<style>@import url("theme.css");</style>',
    '<style>body { background: url(https://example.com/bg.png); }</style>',
    '<div style="background-image: url(\'bg.png\')"></div>',
    '<script>fetch("https://api.example.com/x")</script>',
    '<script>const u = "https://api.example.com/x";</script>',
])
def test_self_containment_check_finds_external_resources(bert, inject):
    html = build_report(bert, "a short text").to_html()
    assert external_references(html) == []
    bad = html.replace("</head>", inject + "\n</head>", 1)
    assert external_references(bad), inject


def test_self_containment_check_ignores_any_payload_bytes(bert):
    """The data payload may hold any bytes ("CdN", "//", "https" in base64, URLs in a text): it is
    data, and the check never reads it."""
    import os

    rep = build_report(bert, "see https://cdn.example.com/x.js and <script src='//evil.example/x.js'>")
    meta = rep.meta()
    crafted = base64.b64encode(b"\x09\xd3\x4d" * 50).decode() + "httpsCdNcdn//cdn/example//AAAA"
    payloads = [crafted] + [base64.b64encode(os.urandom(4096)).decode() for _ in range(20)]
    for blob in payloads:
        page = render_page(meta, mode="file", blob=blob, qk_blob=blob[::-1])
        assert external_references(page) == [], blob[:40]
    assert external_references(rep.to_html()) == []


def test_texts_cannot_break_out_of_the_page(bert):
    rep = build_report(bert, "</script><script>alert(1)</script> <!-- x")
    html = rep.to_html()
    assert "<script>alert(1)" not in html
    cfg, _ = _embedded(html)
    assert cfg["meta"]["texts"][0]["text"].startswith("</script>")


def test_repr_html_is_an_isolated_resizable_frame(bert):
    rep = build_report(bert, "a short text")
    frame = rep._repr_html_()
    assert "<iframe srcdoc=" in frame and "bertscope-config" in frame and "<script" not in frame
    assert "resize:vertical" in frame and "height:100%" in frame  # not a fixed 720 px: drag it taller
    long = build_report(bert, " ".join(["word"] * 60))
    assert long.frame_height() > rep.frame_height()  # a first height that follows the text


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


# ---------------------------------------------------------------------------- two texts, pairs, windows


def test_words_align_by_sequence_not_position():
    a = "[CLS] the animal didn ' t cross the street [SEP]".split()
    b = "[CLS] the old animal didn ' t cross [SEP]".split()
    pairs = align_units(a, b)
    # every word of A is paired with the same word of B, however far it moved; "old" and "the street" are not
    assert all(a[i] == b[j] for i, j in pairs)
    assert [a[i] for i, _ in pairs] == "[CLS] the animal didn ' t cross [SEP]".split()
    assert 2 not in [j for _, j in pairs]  # "old"
    assert {(2, 3), (6, 7), (9, 8)} <= {tuple(p) for p in pairs}


def test_alignment_meta_says_when_texts_are_too_different(bert):
    close = build_report(bert, IT_ANIMAL, WIDE).meta()["alignment"]
    assert close["share"] > close["min_share"] and close["matched_words"] == 12  # all but tired / wide
    far = build_report(bert, IT_ANIMAL, "그 동물은 너무 피곤해서 길을 건너지 않았다").meta()["alignment"]
    assert far["share"] < far["min_share"] and far["matched_words"] == 0


def test_parse_span():
    assert parse_span("2:5", 10) == (2, 5)
    assert parse_span(":3", 10) == (0, 3) and parse_span("7:", 10) == (7, 10) and parse_span("-2:", 10) == (8, 10)
    assert parse_span("0:99", 10) == (0, 10)
    for bad in ("5", "a:b", "5:5", "9:2", "20:30"):
        with pytest.raises(bertscope.InputError):
            parse_span(bad, 10)
    # before the text is tokenized: the form, and END not after START (same sign), nothing else
    assert parse_span("2:5", None) is None and parse_span("20:30", None) is None and parse_span("-3:2", None) is None
    for bad in ("5", "a:b", "5:5", "9:2", "-1:-3"):
        with pytest.raises(bertscope.InputError, match="START:END|END must be after START"):
            parse_span(bad, None)


def test_cli_view_pair_uses_segments_like_hf(tmp_path, bert, hf_model):
    """`view TEXT --pair TEXT_B` reads one sentence pair: HF's tokenizer gives the ids and segment
    ids 0/1, HF's BertModel with those token_type_ids the attention; the page must hold the same."""
    import transformers

    a, b = "Where is the animal?", "The animal is in the street."
    out = tmp_path / "pair.html"
    r = _cli("view", a, "--pair", b, "--out", str(out))
    assert r.returncode == 0, r.stderr
    cfg, q = _embedded(out.read_text(encoding="utf-8"))
    text = cfg["meta"]["texts"][0]
    enc = transformers.AutoTokenizer.from_pretrained(str(bert.path))(a, b, return_tensors="pt")
    assert text["segments"] == enc["token_type_ids"][0].tolist() and set(text["segments"]) == {0, 1}
    assert text["tokens"] == transformers.AutoTokenizer.from_pretrained(str(bert.path)).convert_ids_to_tokens(enc["input_ids"][0])
    with torch.inference_mode():
        ref = hf_model(**enc, output_attentions=True).attentions
    ref = torch.stack([x[0] for x in ref]).numpy()  # (N, H, T, T)
    off = cfg["meta"]["data"]["layout"][0]["attn"]
    got = q[off:off + ref.size].reshape(ref.shape) / QUANT_SCALE
    assert np.abs(got - ref).max() <= 1 / QUANT_SCALE
    assert "street" in text["words"] and text["words"].count("animal") == 2  # B's words spelled from B
    # the segments matter: reading B as segment 0 gives other attention
    with torch.inference_mode():
        flat = hf_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True).attentions
    assert np.abs(torch.stack([x[0] for x in flat]).numpy() - ref).max() > 1e-3


def test_cli_view_pair_and_span_errors(tmp_path):
    r = _cli("view", "a text", "another", "--pair", "third", "--out", str(tmp_path / "x.html"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not both" in r.stderr
    r = _cli("view", "a text", "--span", "40:50", "--out", str(tmp_path / "x.html"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "selects no token" in r.stderr
    r = _cli("view", "a text", "--span", "nope", "--out", str(tmp_path / "x.html"))
    assert r.returncode == 2 and "START:END" in r.stderr
    assert not (tmp_path / "x.html").exists()


def test_query_key_vectors_are_the_models_own_and_stored_when_small(bert):
    rep = build_report(bert, IT_ANIMAL)
    qkv = rep.texts[0].qkv  # (3, N, H, T, D)
    b = bert.encode([IT_ANIMAL])
    with torch.inference_mode():
        recs = bert.model(b.input_ids, b.attention_mask, b.token_type_ids, output_intermediates=True).intermediates
    for layer in (0, 3, 5):
        att = recs[layer].attention
        for i, x in enumerate((att.q, att.k, att.v)):
            np.testing.assert_array_equal(qkv[i, layer], x[0].numpy())
    cfg, _ = _embedded(rep.to_html())
    assert cfg["meta"]["qk"]["layout"][0]["shape"] == list(qkv.shape)
    assert build_report(bert, IT_ANIMAL, qk=False).texts[0].qkv is None
    assert "qk" not in build_report(bert, IT_ANIMAL, qk=False).meta()


def test_rollout_of_no_layers_is_empty():
    from bertscope import attention_rollout

    assert attention_rollout(torch.zeros(0, 2, 4, 4)).shape == (0, 4, 4)


def test_rollout_stays_on_the_inputs_device():
    from bertscope import attention_rollout

    x = torch.rand(2, 3, 4, 4, device="meta")  # no data: only where the tensors live is checked
    assert attention_rollout(x).device.type == "meta"
    if torch.cuda.is_available():
        y = torch.softmax(torch.rand(2, 3, 4, 4, device="cuda"), -1)
        out = attention_rollout(y)
        assert out.device.type == "cuda"
        torch.testing.assert_close(out.cpu(), attention_rollout(y.cpu()))


# ---------------------------------------------------------------------------- show(): any model's attention


def test_show_takes_hf_layouts_and_strips_padding(bert, hf_model):
    """A batch of two texts from HF (the shorter one padded) becomes A and B without the padding."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(bert.path))
    enc = tok([IT_ANIMAL, "Tokenization splits rare words"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        att = hf_model(**enc, output_attentions=True).attentions  # N x (2, H, T, T)
    n_b = int(enc["attention_mask"][1].sum())
    toks_a = tok.convert_ids_to_tokens(enc["input_ids"][0])
    toks_b = tok.convert_ids_to_tokens(enc["input_ids"][1][:n_b])
    rep = bertscope.show(att, toks_a, tokens_b=toks_b)
    a, b = rep.texts
    assert rep.num_layers == 6 and rep.num_heads == 12
    np.testing.assert_allclose(b.attentions, torch.stack([x[1, :, :n_b, :n_b] for x in att]).numpy(), atol=1e-6)
    np.testing.assert_allclose(b.attentions.sum(-1), 1.0, atol=1e-5)
    assert "tokenization" in b.words and "##ization" not in b.words  # WordPiece pieces joined into words
    assert b.token_words[b.tokens.index("##ization")] == b.words.index("tokenization")
    own = build_report(bert, "Tokenization splits rare words").texts[0]
    np.testing.assert_allclose(b.rollout, own.rollout, atol=1e-5)
    # one (N, H, T, T) array works too
    # the padded tokens themselves, as convert_ids_to_tokens gives them: the [PAD]s go too
    padded = bertscope.show(att, toks_a, tokens_b=tok.convert_ids_to_tokens(enc["input_ids"][1]))
    assert padded.texts[1].tokens == b.tokens and "[PAD]" not in padded.texts[1].words
    np.testing.assert_array_equal(padded.texts[1].attentions, b.attentions)
    one = bertscope.show(np.stack([x[0].numpy() for x in att]), toks_a)
    np.testing.assert_allclose(one.texts[0].attentions, a.attentions)
    # padded on the left (padding_side="left"): the leading [PAD]s were kept as words, their
    # meaningless rows drawn; they go as the trailing ones do, and B is the same text
    tok.padding_side = "left"
    left = tok([IT_ANIMAL, "Tokenization splits rare words"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        att_l = hf_model(**left, output_attentions=True).attentions
    toks_l = tok.convert_ids_to_tokens(left["input_ids"][1])
    assert toks_l[0] == "[PAD]"
    shown = bertscope.show(att_l, tok.convert_ids_to_tokens(left["input_ids"][0]), tokens_b=toks_l).texts[1]
    assert shown.tokens == b.tokens and "[PAD]" not in shown.words
    s0 = len(toks_l) - n_b  # (the positions differ from B's above: BERT numbers them from the padding)
    np.testing.assert_allclose(shown.attentions, torch.stack([x[1, :, s0:, s0:] for x in att_l]).numpy(), atol=1e-6)
    np.testing.assert_allclose(shown.attentions.sum(-1), 1.0, atol=1e-5)
    # a leading <pad> that the tokens attend to is a real token (T5's decoder starts with one): kept
    causal = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]  # (T, T), rows sum to 1
    t5 = bertscope.show([causal[None, None]], ["<pad>", "▁Das", "▁Haus", "</s>"]).texts[0]
    assert t5.tokens == ["<pad>", "▁Das", "▁Haus", "</s>"]
    np.testing.assert_allclose(t5.attentions[0, 0], causal, atol=1e-7)
    # masked left padding before such a <pad>: the padding goes, the <pad> the tokens attend to stays
    padded = np.zeros((6, 6))
    padded[2:, 2:] = causal
    t5 = bertscope.show([padded[None, None]], ["<pad>", "<pad>", "<pad>", "▁Das", "▁Haus", "</s>"]).texts[0]
    assert t5.tokens == ["<pad>", "▁Das", "▁Haus", "</s>"]


@pytest.mark.parametrize("attentions, tokens, kw, message", [
    ([], ["a"], {}, "empty"),
    ([np.full((1, 2, 3, 4), 0.25)], ["a", "b", "c"], {}, "square"),
    ([np.full((1, 2, 3, 3), 1 / 3), np.full((1, 2, 4, 4), 0.25)], ["a"] * 3, {}, "same shape"),
    ([np.full((1, 2, 3, 3), 1 / 3)], ["a"] * 4, {}, "4 tokens"),
    ([np.full((2, 2, 3, 3), 1 / 3)], ["a"] * 3, {}, "tokens_b"),
    ([np.full((1, 2, 3, 3), 1 / 3)], ["a"] * 3, {"tokens_b": ["b"] * 3}, "exactly 2"),
    ([np.full((1, 2, 3, 3), 2.0)], ["a"] * 3, {}, "probabilities"),
    ([np.full((1, 2, 3, 3), np.nan)], ["a"] * 3, {}, "NaN or infinite values (first: layer 0, head 0, row "
                                                      "tokens[0], column tokens[0]: nan)"),
    ([np.full((1, 2, 3, 3), 1 / 3)], ["a", "b\ud800", "c"], {}, "tokens[1] is not valid Unicode"),  # save() failed
    # whole numbers that sum to 0 (a softmax cast to int): no "for bfloat16 values" about them
    ([np.zeros((1, 2, 3, 3), dtype=np.int64)], ["a"] * 3, {}, "sums to 0.0000 over the 3 tokens given, not 1 "
                                                              "(within 0.001):"),
    ([np.full((1, 2, 4, 4), 0.25)], ["a"] * 3, {}, "sums to"),
    ([np.full((1, 2, 3, 3), 1 / 3)], "a b c", {}, "list of token strings"),
    ([np.full((1, 2, 3, 3), 1 / 3)], ["a", None, "c"], {}, "not a string"),
    ("not attention", ["a"], {}, "not an array"),
    (None, ["a"], {}, "attentions is NoneType, not an array"),  # it said "has shape ()"
    (0.5, ["a"], {}, "attentions is float, not an array"),
    # one layer's (B=2, H, T, T) as a bare array reads as 2 layers of a batch of 1: the error says so
    (np.full((2, 2, 3, 3), 1 / 3), ["a"] * 3, {"tokens_b": ["b"] * 3}, "as a list, [a]"),
])
def test_show_refuses_what_does_not_fit_with_one_sentence(attentions, tokens, kw, message):
    with pytest.raises(bertscope.InputError) as e:
        bertscope.show(attentions, tokens, **kw)
    text = str(e.value)
    assert message in text and "\n" not in text, text


def test_show_names_a_bad_value_by_the_callers_own_token_positions_under_left_padding():
    """With padding on the left the row was counted from the first real token: tokens[1] for
    the caller's tokens[2]."""
    att = np.zeros((1, 1, 4, 4))
    att[0, 0, 1:, 1:] = 1 / 3  # a masked [PAD] first, then three tokens that attend to each other
    att[0, 0, 0, 0] = 1.0
    att[0, 0, 2, 3] = np.nan
    with pytest.raises(bertscope.InputError, match=re.escape("row tokens[2], column tokens[3]: nan")):
        bertscope.show([att], ["[PAD]", "a", "b", "c"])
    att[0, 0, 2, 3] = 0.0  # now its row sums to 2/3
    with pytest.raises(bertscope.InputError, match=re.escape("the row of tokens[2] sums to 0.6667")):
        bertscope.show([att], ["[PAD]", "a", "b", "c"])


def test_show_takes_tokens_as_a_numpy_array_as_embed_takes_texts():
    """A numpy array of strings (or anything with .tolist(), a pandas Series) is a list of tokens;
    one of another shape is refused as its items are."""
    att = [np.full((1, 2, 3, 3), 1 / 3)]
    assert bertscope.show(att, np.array(["[CLS]", "a", "[SEP]"])).texts[0].tokens == ["[CLS]", "a", "[SEP]"]
    with pytest.raises(bertscope.InputTypeError, match=re.escape("tokens[0] is list, not a string")):
        bertscope.show(att, np.array([["[CLS]", "a", "[SEP]"]]))


def test_words_from_tokens_of_other_tokenizers():
    from bertscope.see.show import words_from_tokens

    words, tw, special = words_from_tokens(["<s>", "▁The", "▁anim", "al", "▁is", "</s>"])  # SentencePiece
    assert words == ["<s>", "The", "animal", "is", "</s>"] and tw == [0, 1, 2, 2, 3, 4]
    assert special == [True, False, False, False, False, True]
    words, tw, _ = words_from_tokens(["<|endoftext|>", "The", "Ġanimal", "Ġis"])  # byte-level BPE
    assert words == ["<|endoftext|>", "The", "animal", "is"]
    words, tw, _ = words_from_tokens(["[CLS]", "token", "##ization", "[SEP]", "##x"])  # WordPiece
    assert words == ["[CLS]", "tokenization", "[SEP]", "##x"] and tw == [0, 1, 1, 2, 3]


def test_save_refuses_a_name_that_is_not_a_page(bert, tmp_path):
    """Report.save("x.png") wrote HTML into a .png file (view's --out refuses that name)."""
    rep = bertscope.show([np.full((1, 2, 3, 3), 1 / 3)], ["[CLS]", "a", "[SEP]"])
    with pytest.raises(bertscope.InputError, match="give a name ending in .html"):
        rep.save(tmp_path / "x.png")
    assert not list(tmp_path.iterdir())
    assert rep.save(tmp_path / "x.HTML").is_file()


def test_show_takes_bfloat16_attention_from_hf(bundled_path):
    """A bfloat16 model's softmax rows sum to 1 only within about 2^-8: show() refused HF's
    bf16 attentions as if the tokens were wrong (a row summed to 0.9989). float16 passed."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(bundled_path))
    enc = tok(["The animal didn't cross the street because it was too tired"], return_tensors="pt")
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    rows = {}
    for dtype in (torch.float32, torch.bfloat16):
        hf = transformers.BertModel.from_pretrained(str(bundled_path), attn_implementation="eager", dtype=dtype).eval()
        with torch.no_grad():
            rows[dtype] = hf(**enc, output_attentions=True).attentions
    deviation = max(float((a.float().sum(-1) - 1).abs().max()) for a in rows[torch.bfloat16])
    assert deviation > bertscope.see.show.ROW_SUM_TOLERANCE  # what the fp32 tolerance refused
    rep = bertscope.show(rows[torch.bfloat16], tokens)
    ref = bertscope.show(rows[torch.float32], tokens)
    assert np.abs(rep.texts[0].attentions - ref.texts[0].attentions).max() < 0.05
    # numpy has no bfloat16: the same values cast to float32 are read by what they are
    as_f32 = bertscope.show([a.float().numpy() for a in rows[torch.bfloat16]], tokens)
    np.testing.assert_array_equal(as_f32.texts[0].attentions, rep.texts[0].attentions)
    # the wider tolerance still catches tokens that do not fit: one token left out of each row
    with pytest.raises(bertscope.InputError, match=r"not 1 \(within 0\.016 for bfloat16 values\)"):
        bertscope.show(rows[torch.bfloat16], tokens[:-1])
    with pytest.raises(bertscope.InputError, match=r"not 1 \(within 0\.001\): the tokens"):  # fp32: as before
        bertscope.show([a * 0.998 for a in rows[torch.float32]], tokens)
