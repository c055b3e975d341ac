"""The faithfulness experiment's parts: Spearman against scipy, each attribution against an
independent route (classify on the edited text, explain), resume, the report and the command.

The classifier here has a random head (training one takes minutes); the experiment's numbers
come from `bertscope explain-experiments --faithfulness`, not from these tests.
"""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pytest
import torch

import bertscope
from bertscope.cli.app import main
from bertscope.explain import faithfulness as fa

SENTENCE = "the film is a gorgeous , witty and moving delight"


@pytest.fixture(scope="module")
def clf_folder(bert, tmp_path_factory):
    from bertscope.core.classifier import BertForSequenceClassification
    from bertscope.train.output import save_classifier

    torch.manual_seed(1)
    clf = BertForSequenceClassification(bert.config, 2, id2label={0: "negative", 1: "positive"},
                                        encoder=copy.deepcopy(bert.encoder))
    with torch.no_grad():
        clf.classifier.weight.mul_(50)
    out = tmp_path_factory.mktemp("clf")
    save_classifier(out, clf, bert.path, 128)
    return out


@pytest.fixture(scope="module")
def clf(clf_folder):
    return bertscope.load(clf_folder)


def test_spearman_equals_scipy():
    from scipy.stats import spearmanr  # scipy comes with the test dependencies (scikit-learn)

    rng = np.random.default_rng(0)
    for n in (3, 7, 20):
        a = rng.integers(0, 5, n).astype(float)  # ties
        b = rng.normal(size=n)
        assert fa.spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert fa.spearman(np.ones(5), np.arange(5.0)) is None


def test_review_sentences_and_split():
    rows = fa.review_sentences()
    assert len(rows) == 8530 and {lab for _, lab in rows} == {"negative", "positive"}
    train, held = fa.split_sentences(rows)
    assert len(held) == fa.HELD_OUT and len(train) == len(rows) - fa.HELD_OUT
    assert fa.split_sentences(rows)[1] == held  # seeded: the same split every time


def test_attributions_against_independent_routes(clf):
    a = fa.sentence_attributions(clf, SENTENCE, ig_steps=8)
    words = SENTENCE.split()
    assert a.words == words
    probs = clf.classify([SENTENCE])[0]
    c = int(probs.argmax())
    assert a.predicted == c and a.probability == pytest.approx(float(probs[c]), abs=1e-5)
    # occlusion: classify the text with the word taken out (tokenized afresh, the string path)
    for i in (0, 4, 9):
        edited = " ".join(w for j, w in enumerate(words) if j != i)
        assert a.occlusion[i] == pytest.approx(float(probs[c] - clf.classify([edited])[0][c]), abs=1e-5)
    # gradient x input: the library's explain of the same class, at word level
    exp = bertscope.explain(clf, SENTENCE, "grad-input", target=c)
    np.testing.assert_allclose(a.grad_input, exp.word_maps()[1:-1], atol=1e-6)
    ig = bertscope.explain(clf, SENTENCE, "integrated-gradients", target=c)
    assert np.abs(ig.word_maps()[1:-1]).max() > 0 and a.integrated_gradients.shape == (len(words),)
    # the maps: [CLS]'s row at every layer, word level, heads averaged
    for m in ("alti", "norm", "value-zeroing"):
        wm = bertscope.explain(clf, SENTENCE, m).word_maps()
        if wm.ndim == 4:
            wm = wm.mean(1)
        np.testing.assert_allclose(a.maps[m], wm[:, 0, 1:-1], atol=1e-5)


def test_short_sentences_are_skipped(clf):
    assert fa.score_sentence(clf, "dull .") is None


def test_run_resumes_and_renders(clf, clf_folder, tmp_path, monkeypatch):
    r = fa.run_faithfulness(clf, clf_folder, tmp_path, limit=3)
    assert len(r.sentences) + r.skipped == 3 and r.held_out == fa.HELD_OUT
    assert 0.0 <= r.accuracy <= 1.0
    lines = (tmp_path / "faithfulness.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["ig_steps"] == 0

    def boom(*a, **k):
        raise AssertionError("a cached sentence was scored again")

    monkeypatch.setattr(fa, "score_sentence", boom)
    monkeypatch.setattr(clf, "classify", boom)  # the held-out accuracy comes from the cache too
    again = fa.run_faithfulness(clf, clf_folder, tmp_path, limit=3)
    assert [s.rho for s in again.sentences] == [s.rho for s in r.sentences]
    assert r.cached == 0 and again.cached == 3 and again.scoring_seconds == pytest.approx(r.scoring_seconds)
    assert again.accuracy == r.accuracy == json.loads(lines[0])["accuracy"]
    md = fa.render_faithfulness(again, "bertscope explain-experiments --faithfulness", "experiments/x.png")
    L = clf.config.num_hidden_layers
    assert md.count(f"| method | {' | '.join(f'L{l}' for l in range(L))} |") == 2
    mean, sd, n = again.summary("occlusion", "alti")
    assert mean.shape == (L,) and (n <= len(again.sentences)).all()
    alti_row = [l for l in md.splitlines() if l.startswith("| alti |")][1]  # the occlusion table
    assert f"{mean[L - 1]:+.2f}" in alti_row
    assert "0.55" in md and "Ferrando et al. 2022" in md  # their figures, quoted as theirs


def test_command_writes_the_section_and_plot(clf_folder, tmp_path, capsys):
    out, work = tmp_path / "docs", tmp_path / "work"
    assert main(["explain-experiments", "--out", str(out), "--faithfulness", "--classifier", str(clf_folder),
                 "--work", str(work), "--limit", "2", "--ig-steps", "4", "--quiet"]) == 0
    text = (out / "EXPERIMENTS.md").read_text(encoding="utf-8")
    assert "<!-- begin explain-faithfulness -->" in text and "<!-- begin explain-reread -->" in text
    assert "integrated-gradients (input)" in text
    png = out / "experiments" / "explain_faithfulness.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,fragment", [
    (["--limit", "3"], "--limit is for --faithfulness"),
    (["--epochs", "5"], "--epochs is for --faithfulness"),  # flags the re-read ignores are refused
    (["--no-plots"], "--no-plots is for --faithfulness"),
    (["--work", "/nonexistent/zzz"], "--work is for --faithfulness"),
    (["--faithfulness", "--limit", "0"], "--limit must be at least 1"),
    (["--faithfulness", "--classifier", "/nonexistent"], "is not a folder"),
    (["--faithfulness", "--model", "/somewhere"], "pass --classifier"),
])
def test_command_errors(args, fragment, tmp_path, capsys):
    assert main(["explain-experiments", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "EXPERIMENTS.md").exists()  # refused before any work


def test_a_classifier_folder_is_checked_before_anything_is_written(bert, tmp_path, capsys):
    """--classifier naming no checkpoint, or a model with no classification head: the re-read
    section was written first, then the error came, and it did not name --classifier."""
    out = tmp_path / "docs"
    for folder, said in ((tmp_path, f"--classifier: {tmp_path} is not a BERT checkpoint"),
                         (bert.path, f"--classifier: {bert.path} has no classification head")):
        assert main(["explain-experiments", "--out", str(out), "--faithfulness", "--classifier", str(folder),
                     "--limit", "1", "--no-plots", "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"bertscope: error: {said}"), err
        assert not out.exists()


@pytest.mark.parametrize("command", [["explain-experiments"], ["experiments", "--no-plots"]])
def test_damaged_section_markers_are_refused_before_the_run_and_keep_the_users_text(command, tmp_path, capsys,
                                                                                     monkeypatch):
    """A begin marker without its end: the first run appended a second section, the next
    replaced everything from the first begin to the new end, deleting what the user wrote.
    Now refused before any work (the model is never loaded), and the library's writer refuses
    too, naming the user's document, not its staged copy."""
    import importlib

    from bertscope.explain.reread import SECTION as REREAD
    from bertscope.understand.experiments.report import SECTION as CLAIMS

    cli = importlib.import_module(f"bertscope.cli.{command[0].replace('-', '_')}")
    monkeypatch.setattr(cli, "load_model", lambda *a, **k: pytest.fail("the model was loaded: the run began"))
    section = REREAD if command[0] == "explain-experiments" else CLAIMS
    doc = tmp_path / "EXPERIMENTS.md"
    mine = f"# Mine\n\nmy notes\n\n<!-- begin {section} -->\nold stuff\n\nmore of my notes\n"
    doc.write_text(mine, encoding="utf-8")
    for _ in range(2):
        assert main([*command, "--out", str(tmp_path), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"bertscope: error: {doc}: section {section!r} has damaged markers (<!-- begin {section} --> "
                       f"without <!-- end {section} -->, from line 5); mend them or remove the section by hand, then "
                       "run again (nothing was written)"], err
        assert doc.read_text(encoding="utf-8") == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["EXPERIMENTS.md"]
    if command[0] == "experiments":  # write_report, from Python, with a report made elsewhere
        from bertscope.understand.experiments import report as rp

        with pytest.raises(bertscope.InputError, match=re.escape(f"{doc}: section {section!r} has damaged markers")):
            rp.write_report(None, tmp_path, plots=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["EXPERIMENTS.md"]


def test_update_section_refuses_every_kind_of_damaged_markers(tmp_path):
    from bertscope.files import check_sections, update_section

    doc = tmp_path / "DOC.md"
    b, e = "<!-- begin s -->", "<!-- end s -->"
    for text, what in ((f"x\n{b}\ny\n", f"{b} without {e}, from line 2"),
                       (f"x\ny\n{e}\n", f"{e} without {b}, from line 3"),
                       (f"{e}\nx\n{b}\n", f"{e} before {b}, from line 1"),
                       (f"{b}\n{e}\n{b}\n{e}\n", f"{b} 2 times, from line 1"),
                       (f"{b}\n{e}\nx\n{e}\n", f"{e} 2 times, from line 1")):
        doc.write_text(text)
        for call in (lambda: check_sections(doc, "other", "s"), lambda: update_section(doc, "s", "new")):
            with pytest.raises(bertscope.InputError, match=re.escape(f"section 's' has damaged markers ({what})")):
                call()
        assert doc.read_text() == text
    check_sections(tmp_path / "missing.md", "s")  # no document yet: nothing to refuse
    doc.write_text(f"a\n{b}\nold\n{e}\nb\n")
    check_sections(doc, "s", "t")
    update_section(doc, "s", "new")
    assert doc.read_text() == f"a\n{b}\nnew\n{e}\nb\n"


def test_a_classifier_of_other_classes_or_settings_is_refused(clf_folder, tmp_path, capsys):
    """--classifier with classes other than negative/positive, --epochs beside --classifier, and a
    finished WORK/classifier fine-tuned with other settings: one line each, before any scoring
    (they used to give 0.0% accuracy, or the old classifier reported under the new settings)."""
    import shutil

    other = tmp_path / "nli"
    shutil.copytree(clf_folder, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["id2label"], cfg["label2id"] = {"0": "0", "1": "1"}, {"0": 0, "1": 1}
    (other / "config.json").write_text(json.dumps(cfg))
    for args, fragment in (
            (["--classifier", str(other)], "its classes are 0, 1"),
            (["--classifier", str(clf_folder), "--epochs", "5"], "--epochs is for the classifier")):
        assert main(["explain-experiments", "--out", str(tmp_path / "docs"), "--faithfulness",
                     "--work", str(tmp_path / "w"), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
    with pytest.raises(bertscope.InputError, match="classes are 0, 1"):
        fa.run_faithfulness(bertscope.load(other), other, tmp_path / "w2", limit=1)
    # a finished classifier in WORK, fine-tuned with 3 epochs, asked for with 5
    work = tmp_path / "work"
    shutil.copytree(clf_folder, work / "classifier")
    (work / "classifier" / "metrics.json").write_text(json.dumps(
        {"settings": {"epochs": 3, "max_length": 128, "lr": 5e-5}}))
    with pytest.raises(bertscope.InputError, match="fine-tuned with epochs 3, max_length 128"):
        fa.prepare_classifier(work, epochs=5)
    assert fa.prepare_classifier(work, epochs=3) == work / "classifier"  # the same settings: reused
