"""bertscope explain: JSON shapes per method, the text outputs, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bertscope
from bertscope.cli.app import main
from bertscope.explain import METHODS, method_kind

from conftest import IT_ANIMAL

SIMILAR = "A tired dog rests."


def run_json(capsys, *args):
    assert main(["explain", IT_ANIMAL, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", METHODS)
def test_json_shapes(method, capsys, bert):
    L, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    kind = method_kind(method)
    extra = ["--similar-to", SIMILAR] if kind == "input" else ["--token", "it"]
    data = run_json(capsys, "--method", method, *extra)
    W = len(data["words"])
    assert data["method"] == method and data["kind"] == kind
    expected = {"head": [L, H, W, W], "layer": [L, W, W], "input": [W]}[kind]
    assert data["shape"] == expected and np.asarray(data["maps"]).shape == tuple(expected)
    assert len(data["tokens"]) == len(data["token_words"])
    ranked = data["ranked"]
    assert len(ranked) == 5 and all(set(r) == {"index", "word", "value"} for r in ranked)
    values = [r["value"] for r in ranked]
    assert values == sorted(values, reverse=True)
    # the ranking is the word-level row of the maps at the default layer (the last) / head mean
    maps = np.asarray(data["maps"])
    if kind == "input":
        row = maps
        assert data["target"].startswith("cosine similarity") and data["layer"] is None
    else:
        assert data["token"] == "it" and data["layer"] == L - 1
        row = maps[L - 1].mean(0)[data["token_index"]] if kind == "head" else maps[L - 1][data["token_index"]]
    np.testing.assert_allclose([row[r["index"]] for r in ranked], values, atol=2e-6)
    # and it agrees with the library
    lib = bertscope.explain(bert, IT_ANIMAL, method, text_b=SIMILAR if kind == "input" else None)
    np.testing.assert_allclose(maps, lib.word_maps(), atol=2e-6)


def test_json_layer_and_head_select_the_row(capsys, bert):
    data = run_json(capsys, "--method", "attention", "--token", "it", "--layer", "3", "--head", "1")
    assert data["layer"] == 3 and data["head"] == 1
    assert data["ranked"][0]["word"] == "animal" and data["ranked"][0]["value"] > 0.5


def test_compare_json(capsys, bert):
    data = run_json(capsys, "--compare", "--token", "it", "--top", "3")
    assert data["token"] == "it" and set(data["methods"]) == {m for m in METHODS if method_kind(m) != "input"}
    for m, entry in data["methods"].items():
        assert len(entry["ranked"]) == 3
    norm = data["methods"]["norm"]["ranked"]
    assert 0 < norm[0]["value"] <= 1  # shown as a share of its row
    # each head's share of its row, then the mean over heads: the figures docs/EXPERIMENTS.md's
    # re-read gives (the share of the heads' mean differed by up to 0.04)
    exp = bertscope.explain(bert, IT_ANIMAL, "norm")
    wm = exp.word_maps()[-1, :, exp.words.index("it")]  # (H, W)
    shares = (wm / wm.sum(-1, keepdims=True)).mean(0)
    for r in norm:
        assert abs(r["value"] - shares[r["index"]]) < 1e-5, r
    data = run_json(capsys, "--compare", "--token", "it", "--similar-to", SIMILAR)
    assert set(data["methods"]) == set(METHODS) and data["target"].startswith("cosine similarity")
    assert data["left_out"] == {}


def test_compare_on_a_text_over_value_zeroings_limit_leaves_it_out_with_a_note(capsys):
    """It computed every other column, then refused the whole command at value-zeroing."""
    long_text = "word " * 140 + "cat"
    assert main(["explain", long_text, "--compare", "--token", "cat", "--top", "2", "--json"]) == 0
    cap = capsys.readouterr()
    data = json.loads(cap.out)
    assert "value-zeroing" not in data["methods"] and "alti" in data["methods"]
    assert data["left_out"]["value-zeroing"].endswith("this text has 143")
    assert cap.err == ("bertscope: note: value-zeroing left out: limited to 128 tokens (it reruns every layer "
                       "once per token); this text has 143\n")


def test_compare_on_a_text_over_the_models_positions_says_it_was_cut_once(capsys):
    """The warning came twice: once from counting the tokens, once from the first method."""
    long_text = "cat " + "word " * 600
    assert main(["explain", long_text, "--compare", "--token", "cat", "--top", "2"]) == 0
    err = capsys.readouterr().err
    assert err.count("was truncated") == 1 and "value-zeroing left out" in err, err
    # the gradient methods read at most max_seq_length (256) tokens, fewer than the maps' 512:
    # that cut is said too, once
    assert main(["explain", "cat " + "word " * 300, "--compare", "--token", "cat", "--top", "2",
                 "--similar-to", "a dog"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "was truncated" in line]
    assert [line.split("longer than ")[1].split()[0] for line in said] == ["256"], said


def test_text_outputs(capsys):
    assert main(["explain", IT_ANIMAL, "--method", "alti", "--token", "it", "--top", "3"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0].startswith('What "it" (word 10) takes, by alti (Ferrando et al. 2022')
    assert len(lines) == 4 and lines[1].split()[0] == "1."
    assert main(["explain", IT_ANIMAL, "--compare", "--token", "it"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[1].split()
    assert header == ["rank", "attention", "norm", "norm-residual", "value-zeroing", "alti", "rollout"]
    assert main(["explain", IT_ANIMAL, "--method", "rollout"]) == 0  # no --token: every word's top sources
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 + 15  # a header and one line per word


@pytest.mark.parametrize("args,fragment", [
    (["--method", "saliency", "--token", "it"], "unknown method 'saliency'"),
    (["--method", "alti", "--token", "it", "--head", "2"], "--head applies to the per-head methods"),
    (["--method", "value-zeroing", "--head", "0"], "--head applies to the per-head methods"),
    (["--method", "alti", "--token", "zebra"], "'zebra' is not in the text"),
    (["--compare", "--token", "zebra"], "'zebra' is not in the text"),
    (["--method", "alti", "--token", "didn't"], "splits \"didn't\" into the words didn ' t"),
    (["--compare"], "give --token WORD"),
    (["--method", "alti", "--occurrence", "2"], "--occurrence picks one of the places --token WORD appears"),
    (["--method", "grad-input"], "give --similar-to"),
    (["--method", "grad-input", "--similar-to", "x", "--token", "it"], "--token does not apply"),
    (["--method", "norm", "--similar-to", "x"], "--similar-to is for grad-input"),
    (["--method", "norm", "--token", "it", "--layer", "6"], "--layer 6 does not exist"),
    (["--method", "norm", "--token", "it", "--head", "12"], "--head 12 does not exist"),
    (["--method", "alti", "--compare", "--token", "it"], "not allowed with argument"),
    ([], "one of the arguments --method --compare is required"),
])
def test_one_line_errors(args, fragment, capsys):
    try:
        status = main(["explain", IT_ANIMAL, *args])
    except SystemExit as e:  # usage mistakes leave through argparse, with the same one line
        status = e.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertscope: error:") and fragment in err[0], err


def test_empty_text_is_refused_before_loading(capsys):
    assert main(["explain", " ", "--method", "alti", "--model", "/nonexistent"]) == 2
    assert "the text is empty" in capsys.readouterr().err


def test_explain_experiments_writes_its_own_section(tmp_path, capsys, bert):
    """The re-read section is regenerated in place; the rest of EXPERIMENTS.md is kept; its
    numbers are the library's."""
    doc = tmp_path / "EXPERIMENTS.md"
    doc.write_text("# Experiments\n\n<!-- begin seed-claims -->\nkept\n<!-- end seed-claims -->\n", encoding="utf-8")
    assert main(["explain-experiments", "--out", str(tmp_path)]) == 0
    assert main(["explain-experiments", "--out", str(tmp_path)]) == 0  # twice: still one section
    text = doc.read_text(encoding="utf-8")
    assert "kept" in text and text.count("<!-- begin explain-reread -->") == 1
    section = text[text.index("<!-- begin explain-reread -->"):]
    exp = bertscope.explain(bert, IT_ANIMAL, "alti")
    row = exp.sources(exp.words.index("it"))
    alti = next(l for l in section.splitlines() if l.startswith("| alti | Ferrando"))
    cells = [c.strip() for c in alti.split("|")]
    assert cells[3] == f"{row[exp.words.index('animal')]:.2f}" and cells[4] == f"{row[exp.words.index('street')]:.2f}"
    att = bertscope.attend(bert, IT_ANIMAL, "it")  # the seed's heads, as `attend` measures them
    best = att.heads_for(att.words.index("animal"), k=1)[0]
    assert f"| L{best[0]} H{best[1]} | attention | {best[2]:.2f} |" in section


@pytest.fixture(scope="module")
def classifier_folder(bert, tmp_path_factory):
    """A two-class classifier folder (random head on the bundled encoder), as finetune writes one."""
    import copy

    import torch

    from bertscope.core.classifier import BertForSequenceClassification
    from bertscope.train.output import save_classifier

    torch.manual_seed(0)
    clf = BertForSequenceClassification(bert.config, 2, id2label={0: "neg", 1: "pos"},
                                        encoder=copy.deepcopy(bert.encoder))
    out = tmp_path_factory.mktemp("clf")
    save_classifier(out, clf, bert.path, 128)
    return out


def test_classifier_model_explains_its_prediction(classifier_folder, capsys):
    data = run_json(capsys, "--method", "grad-input", "--model", str(classifier_folder))
    clf = bertscope.load(classifier_folder)
    pred = clf.labels[int(clf.classify([IT_ANIMAL])[0].argmax())]
    assert data["target"] == f"probability of the predicted class {pred!r}" and data["shape"] == [len(data["words"])]
    other = "neg" if pred == "pos" else "pos"
    flipped = run_json(capsys, "--method", "grad-input", "--model", str(classifier_folder), "--label", other)
    np.testing.assert_allclose(flipped["maps"], -np.asarray(data["maps"]), atol=1e-5)
    data = run_json(capsys, "--compare", "--token", "it", "--model", str(classifier_folder))
    assert set(data["methods"]) == set(METHODS)


@pytest.mark.parametrize("args,fragment", [
    (["--method", "grad-input", "--label", "pos"], "--label needs a fine-tuned classifier"),
    (["--method", "alti", "--label", "pos"], "--label is for grad-input"),
    (["--method", "grad-input", "--label", "pos", "--similar-to", "x"], "not both"),
])
def test_label_errors(args, fragment, capsys):
    assert main(["explain", IT_ANIMAL, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_unknown_label_on_a_classifier(classifier_folder, capsys):
    assert main(["explain", IT_ANIMAL, "--method", "grad-input", "--model", str(classifier_folder),
                 "--label", "meh"]) == 2
    assert "unknown class 'meh'" in capsys.readouterr().err


def test_compare_shows_small_values_with_two_significant_digits():
    """A classifier's gradient attributions are often about 1e-4: two decimals showed 0.00."""
    from bertscope.cli.explain import _value

    assert [_value(v) for v in (0.0, 0.1234, -0.0312, 3.1e-4, -2e-6)] == ["0.00", "0.12", "-0.03", "3.1e-04",
                                                                         "-2.0e-06"]


@pytest.mark.parametrize("follows", [True, False])
def test_the_every_layer_table_explains_its_mark_only_when_it_shows_one(follows):
    """The note under the table explained a ✓ that no cell carried (no layer follows the
    referent on the bundled model); it now says that none does."""
    from bertscope.explain.reread import Reread, render_reread

    L = 2
    tired = np.array([[0.5, 0.2, 0.3], [0.2, 0.5, 0.3]])  # layer 0: more from animal
    wide = np.array([[0.2, 0.5, 0.3] if follows else [0.5, 0.2, 0.3], [0.5, 0.2, 0.3]])  # layer 0: more from street?
    pair = np.array([[0.4, 0.1]])
    methods = [m for m in METHODS if method_kind(m) != "input"]
    r = Reread(model="m", methods=methods, shares={m: {"tired": tired, "wide": wide} for m in methods},
               heads=[(0, 0)], head_shares={(m, s): pair for m in ("attention", "norm") for s in ("tired", "wide")})
    text = render_reread(r, "cmd")
    table = text[text.index("### Every layer"):text.index("### The seed's heads")]
    assert table.count(" ✓ |") == (len(methods) if follows else 0) and tired.shape[0] == L
    assert ("✓: the layer follows the referent" in text) == follows
    assert ("No layer follows the referent under any method" in text) == (not follows)
