"""bertscope finetune and predict, end to end: training, the HF-format output, resume, bad input."""

from __future__ import annotations

import errno
import json
import os
import shutil
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bertscope
from bertscope.cli.app import main
from trainkit import sentiment_rows, tiny_checkpoint, write_csv, write_jsonl

TOL = 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, bundled_path):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", bundled_path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real run: the bundled model, 240 made-up reviews, 2 epochs (a few seconds)."""
    root = tmp_path_factory.mktemp("ft")
    train = write_csv(root / "train.csv", sentiment_rows(240, seed=1))
    dev = write_jsonl(root / "dev.jsonl", sentiment_rows(60, seed=2))
    out = root / "out"
    code = main(["finetune", str(train), "--dev", str(dev), "--out", str(out), "--epochs", "2",
                 "--batch-size", "16", "--lr", "1e-4", "--max-length", "32", "--quiet"])
    assert code == 0
    return out, dev


def test_finetune_reaches_high_dev_accuracy_and_writes_metrics(trained):
    out, _ = trained
    metrics = json.loads((out / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["epochs"]] == [1, 2]
    last = metrics["epochs"][-1]
    assert last["dev_accuracy"] >= 0.9, metrics["epochs"]
    assert last["dev_macro_f1"] >= 0.9
    assert metrics["epochs"][1]["train_loss"] < metrics["epochs"][0]["train_loss"]
    for r in metrics["epochs"]:
        assert r["tokens_per_s"] > 0 and r["wall_seconds"] >= r["train_seconds"] > 0
    # beside the dev accuracy, the baseline that learns nothing: TRAIN's commonest label for all
    train_labels = [r["label"] for r in sentiment_rows(240, seed=1)]
    commonest = max(sorted(set(train_labels)), key=train_labels.count)
    dev_labels = [r["label"] for r in sentiment_rows(60, seed=2)]
    assert last["dev_majority_accuracy"] == pytest.approx(dev_labels.count(commonest) / len(dev_labels))
    assert last["dev_labels_predicted"] == 2
    # the speed leaves out the process's first step (its warm-up), kept apart in epoch 1's row
    first, second = metrics["epochs"]
    assert 0 < first["warmup_tokens"] < first["train_tokens"]
    assert 0 < first["warmup_seconds"] < first["train_seconds"]
    assert first["tokens_per_s"] == pytest.approx((first["train_tokens"] - first["warmup_tokens"])
                                                  / (first["train_seconds"] - first["warmup_seconds"]))
    assert "warmup_seconds" not in second
    assert second["tokens_per_s"] == pytest.approx(second["train_tokens"] / second["train_seconds"])
    assert metrics["labels"] == ["neg", "pos"] and metrics["train_examples"] == 240
    assert not (out / "training_state.pt").exists()
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json",
            "metrics.json"} <= {p.name for p in out.iterdir()}


def test_output_loads_in_hf_with_equal_logits(trained):
    import transformers

    out, _ = trained
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    assert hf.config.id2label == {0: "neg", 1: "pos"}
    clf = bertscope.load(out)
    texts = ["this movie was wonderful", "the ending was awful and dull", "meh"]
    b = clf.encode(texts)
    with torch.no_grad():
        ref = hf(input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids).logits
        ours = clf.model(b.input_ids, b.attention_mask, b.token_type_ids).logits
    assert (ours - ref).abs().max() <= TOL
    probs = clf.classify(texts)
    assert np.abs(probs - torch.softmax(ref, -1).numpy()).max() <= TOL
    assert probs[0].argmax() == clf.labels.index("pos") and probs[1].argmax() == clf.labels.index("neg")


def test_predict_agrees_with_classify_and_reports_bad_lines(trained, tmp_path, capsys):
    out, dev = trained
    lines = [json.loads(x) for x in dev.read_text().splitlines()][:20]
    inp = tmp_path / "in.jsonl"
    body = [json.dumps({"text": r["text"]}) for r in lines]
    body.insert(3, "{not json")
    body.insert(7, json.dumps({"body": "no text field"}))
    body.insert(9, json.dumps({"text": 42}))
    body.insert(11, json.dumps({"text": "   "}))
    inp.write_text("\n".join(body) + "\n")
    pred = tmp_path / "pred.jsonl"
    assert main(["predict", str(out), str(inp), "--json", "--out", str(pred), "--quiet"]) == 0
    rows = [json.loads(x) for x in pred.read_text().splitlines()]
    assert [r["line"] for r in rows] == list(range(1, len(body) + 1))
    assert {r["line"]: r["status"] for r in rows if r["status"] != "ok"} == {4: "bad_json", 8: "no_field",
                                                                             10: "not_text", 12: "empty"}
    clf = bertscope.load(out)
    probs = clf.classify([r["text"] for r in lines])
    good = [r for r in rows if r["status"] == "ok"]
    assert len(good) == len(lines)
    for r, p in zip(good, probs):
        assert r["label"] == clf.labels[int(p.argmax())]
        assert max(abs(r["probs"][n] - float(v)) for n, v in zip(clf.labels, p)) <= TOL
    assert "\n  1 bad_json record(s): line 4\n" in capsys.readouterr().err  # under "wrote ..."
    # the plain table on stdout: a header, then one row per line
    capsys.readouterr()
    assert main(["predict", str(out), str(inp), "--quiet"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split("\t") == ["line", "status", "label", "p_neg", "p_pos"]
    assert len(table) == len(body) + 1 and table[4].split("\t")[:3] == ["4", "bad_json", ""]


def test_predict_moves_its_progress_every_few_long_texts(trained, tmp_path):
    """The bar moved once per 1,024 records: minutes at 0% on long reviews with a large model.
    A chunk now also ends past 50,000 characters; the rows are those of one classify call."""
    from bertscope.cli.predict import predictions
    from bertscope.train.data import read_records

    out, _ = trained
    clf = bertscope.load(out)
    texts = [f"review {i}: " + "a long and rather dull film " * 800 for i in range(12)]  # 22,411 characters each
    texts[5] = "short"
    path = write_jsonl(tmp_path / "long.jsonl", [{"text": t} for t in texts])
    seen: list[int] = []
    rows = predictions(clf, read_records(path), progress=seen.append)
    assert seen == [3, 4, 3, 2]  # 3 texts pass 50,000 characters; "short" (text 6) adds a fourth to one
    assert sum(seen) == len(texts) and [r["line"] for r in rows] == list(range(1, 13))
    probs = clf.classify(texts)
    for r, p in zip(rows, probs):
        assert max(abs(r["probs"][n] - float(v)) for n, v in zip(clf.labels, p)) <= TOL
    seen.clear()
    predictions(clf, read_records(write_jsonl(tmp_path / "short.jsonl", [{"text": "ok"}] * 1500)), progress=seen.append)
    assert seen == [1024, 476]


def _long_reviews(path: Path, n: int = 60) -> Path:
    """n reviews of about 2,100 characters: a predict chunk ends past 50,000, so 24 per chunk."""
    rows = sentiment_rows(n, seed=7)
    return write_jsonl(path, [{"text": ((r["text"] + ". ") * 200)[:2100]} for r in rows])


def test_predict_resumes_after_a_kill_and_writes_what_an_unstopped_run_writes(trained, tmp_path, capsys,
                                                                             monkeypatch, caplog):
    """predict kept its rows in memory and wrote at the end: a kill near the end of a large
    input lost every row. The rows now go to FILE.partial chunk by chunk.

    The resumed run computes with the kernel choice the run began with, which FILE.partial
    records: on a Xeon whose oneDNN and BLAS GEMMs raced within noise of each other, the killed
    run and the resumed one chose differently 2 times in 6, and the file differed from the
    unstopped run's in a probability's last digits. Here the first runs compute with the plain
    choice (BERTSCOPE_TUNE=0), and the resumed run's own is made another."""
    import dataclasses

    from bertscope.fast import encoder, tuning

    out, _ = trained
    inp = _long_reviews(tmp_path / "in.jsonl")
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    plain = {"BERTSCOPE_TUNE": "0", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    unstopped = _run_cli(["predict", str(out), str(inp), "--json", "--out", str(whole), "--quiet"], plain)
    assert unstopped.returncode == 0, unstopped.stderr
    assert not Path(f"{whole}.partial").exists()  # a finished run leaves its output alone
    killed = _run_cli(["predict", str(out), str(inp), "--json", "--out", str(cut), "--quiet"],
                      {"BERTSCOPE_PREDICT_KILL_AFTER_CHUNKS": "2", **plain})
    assert killed.returncode == -9, killed.stderr
    partial = Path(f"{cut}.partial")
    assert not cut.exists() and partial.is_file()
    with partial.open("a") as f:  # a row cut off by the kill, after the second chunk's mark
        f.write('{"line": 49, "status": "ok", "lab')
    capsys.readouterr()
    # the same command again without --resume: refused, nothing dropped
    assert main(["predict", str(out), str(inp), "--json", "--out", str(cut), "--quiet"]) == 2
    assert "holds an unfinished predict run (48 of 60 records done); pass --resume" in capsys.readouterr().err
    header = json.loads(partial.read_text().splitlines()[0])
    assert header["kernel"] == tuning.KernelChoice().applied()  # the plain choice, as BERTSCOPE_TUNE=0 makes
    other = dataclasses.replace(tuning.KernelChoice(source="measured"), gemm="onednn", slack=0.3)
    monkeypatch.setattr(encoder, "choose", lambda *a, **k: other)  # this machine's choice is now another
    with caplog.at_level("INFO", logger="bertscope.fast.encoder"):
        assert main(["predict", str(out), str(inp), "--json", "--out", str(cut), "--quiet", "--resume"]) == 0
    assert "computing with the kernel choice the job began with" in caplog.text
    assert capsys.readouterr().err.startswith(f"bertscope: resuming at record 49 of 60 (48 done in {partial})")
    assert not partial.exists()
    rows = [json.loads(x) for x in cut.read_text().splitlines()]
    # what the unstopped run wrote, row for row: the same lines, labels and statuses, and the same
    # probabilities to within float32 noise (two runs of one command can differ in the last bits: a
    # fresh-clone run here saw 0.9...4 against 0.9...8 in line 1's, which no resume had touched)
    unstopped_rows = [json.loads(x) for x in whole.read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "probs"} for r in rows] == \
        [{k: v for k, v in r.items() if k != "probs"} for r in unstopped_rows]
    assert all(r["probs"].keys() == u["probs"].keys() for r, u in zip(rows, unstopped_rows))
    assert max(abs(r["probs"][k] - u["probs"][k]) for r, u in zip(rows, unstopped_rows) for k in r["probs"]) <= 1e-6
    probs = bertscope.load(out).classify([json.loads(x)["text"] for x in inp.read_text().splitlines()])
    assert [r["line"] for r in rows] == list(range(1, 61))
    assert max(abs(r["probs"]["pos"] - float(p[1])) for r, p in zip(rows, probs)) <= TOL


def test_predict_resume_refuses_another_input_or_setting_and_ctrl_c_says_resume(trained, tmp_path, capsys,
                                                                                monkeypatch):
    from bertscope.train.progressfile import RunProgress

    out, _ = trained
    inp = _long_reviews(tmp_path / "in.jsonl")
    pred = tmp_path / "pred.tsv"
    add = RunProgress.add

    def stop_after_one(self, rows):
        add(self, rows)
        raise KeyboardInterrupt

    monkeypatch.setattr(RunProgress, "add", stop_after_one)
    args = ["predict", str(out), str(inp), "--out", str(pred), "--quiet"]
    assert main(args) == 130
    assert capsys.readouterr().err == ("bertscope: interrupted; rerun the same command with --resume to "
                                       "finish\n")
    monkeypatch.setattr(RunProgress, "add", add)
    assert main(args + ["--resume", "--max-length", "16"]) == 2
    assert capsys.readouterr().err == (f"bertscope: error: cannot resume: max-length was 32 when the run began, "
                                       f"now 16; delete {pred}.partial to start over\n")
    assert main(args + ["--resume", "--batch-tokens", "100"]) == 2  # the batches change a probability's last digits
    assert "cannot resume: batch-tokens was not given when the run began, now 100" in capsys.readouterr().err
    inp.write_text(inp.read_text() + json.dumps({"text": "one more"}) + "\n")
    assert main(args + ["--resume"]) == 2
    assert "cannot resume: INPUT " in capsys.readouterr().err
    assert Path(f"{pred}.partial").is_file() and not pred.exists()  # the rows are kept
    # progress whose rows are not INPUT's first lines is refused, and the file let go of (the
    # refusal held its descriptor and lock: the next run in this process was "another run")
    partial = Path(f"{pred}.partial")
    good = partial.read_text()
    partial.write_text(good.replace('{"line": 1,', '{"line": 7,', 1))
    inp.write_text("".join(inp.read_text().splitlines(keepends=True)[:60]))  # INPUT as the run began
    assert main(args + ["--resume"]) == 2
    assert "holds rows for other lines than INPUT's first 24 records" in capsys.readouterr().err
    partial.write_text(good)
    stale = tmp_path / f".{pred.name}.k3j2.tmp"  # left by a kill while FILE was written
    stale.write_text("half a table")
    assert main(args + ["--resume"]) == 0 and pred.is_file() and not partial.exists()
    assert not stale.exists()
    # a FILE.partial that predict did not write (a user's notes, or INPUT itself) is never emptied
    notes = tmp_path / "notes.tsv.partial"
    notes.write_text("my notes: do not lose\n")
    assert main(["predict", str(out), str(inp), "--out", str(tmp_path / "notes.tsv"), "--quiet"]) == 2
    assert "notes.tsv.partial exists and is not a predict run's progress: move it away" in capsys.readouterr().err
    assert notes.read_text() == "my notes: do not lose\n"
    one = tmp_path / "t.partial"
    one.write_text("a wonderful, moving film\n")
    assert main(["predict", str(out), str(one), "--out", str(tmp_path / "t"), "--quiet"]) == 2
    assert one.read_text() == "a wonderful, moving film\n"
    assert main(["predict", str(out), str(inp), "--resume", "--quiet"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err
    # a device or a stream keeps no progress (it made /dev/null.partial, as root)
    assert main(["predict", str(out), str(inp), "--out", os.devnull, "--resume", "--quiet"]) == 2
    assert "--resume needs --out to name a file (not /dev/null)" in capsys.readouterr().err
    monkeypatch.setattr(RunProgress, "__init__", lambda *a, **k: pytest.fail("progress kept beside a device"))
    assert main(["predict", str(out), str(inp), "--out", os.devnull, "--quiet"]) == 0


def test_predict_on_a_text_file_gives_every_line_a_row(trained, tmp_path, capsys):
    """A blank line of a text file is a record with status "empty", as `embed` gives it, so the
    output's rows line up with the input's lines; a file whose every non-blank line fails is
    refused (one line, exit 2)."""
    out, _ = trained
    inp = tmp_path / "in.txt"
    inp.write_bytes(b"hello world\nThe cat sat.\n\n   \nthird line here\n\xff bad\n")
    assert main(["predict", str(out), str(inp)]) == 0  # stderr is not a terminal here: no bar
    cap = capsys.readouterr()
    assert "\r" not in cap.err and "predict:" not in cap.err
    rows = [r.split("\t") for r in cap.out.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("1", "ok"), ("2", "ok"), ("3", "empty"), ("4", "empty"),
                                            ("5", "ok"), ("6", "undecodable")]
    assert "2 empty record(s): lines 3, 4" in cap.err
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    assert main(["predict", str(out), str(blank), "--quiet"]) == 0  # nothing failed: zero texts, two rows
    assert [r.split("\t")[1] for r in capsys.readouterr().out.splitlines()[1:]] == ["empty", "empty"]
    crlf = tmp_path / "crlf.txt"  # lines as `embed` counts them: at "\n", whatever "\r"s end them
    crlf.write_bytes(b"first text\r\r\nsecond\rstill second\r\n")
    assert main(["predict", str(out), str(crlf), "--quiet"]) == 0
    assert [r.split("\t")[:2] for r in capsys.readouterr().out.splitlines()[1:]] == [["1", "ok"], ["2", "ok"]]
    tokenless = tmp_path / "zw.txt"  # only characters the tokenizer drops: empty, as in `embed`
    tokenless.write_text("\u200b\nA fine film.\n\u0301\n", encoding="utf-8")
    assert main(["predict", str(out), str(tokenless), "--quiet"]) == 0
    clf = bertscope.load(out)
    label = clf.labels[int(clf.classify(["A fine film."]).argmax())]
    assert [r.split("\t")[1:3] for r in capsys.readouterr().out.splitlines()[1:]] == [
        ["empty", ""], ["ok", label], ["empty", ""]]
    with pytest.raises(bertscope.InputError, match=re.escape("texts[1] has no tokens (only characters the tokenizer")):
        clf.classify(["A fine film.", "\u200b"])
    empties = tmp_path / "empties.jsonl"  # empty text fields count as texts, as in `embed`
    empties.write_text('{"text": ""}\n{"body": "x"}\n')
    assert main(["predict", str(out), str(empties), "--quiet"]) == 0
    assert [r.split("\t")[1] for r in capsys.readouterr().out.splitlines()[1:]] == ["empty", "no_field"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\n\xff\xfe\n")
    assert main(["predict", str(out), str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no record of" in err and "line 2 is undecodable" in err


def test_predict_refuses_to_write_over_its_input_and_a_pair_field_it_cannot_read(trained, tmp_path, capsys):
    """Before: --out INPUT replaced the texts with the table (exit 0), and --text-pair-field on a
    text file was ignored (a pair model silently fed single texts)."""
    out, _ = trained
    inp = tmp_path / "same.txt"
    inp.write_text("a first text\nanother\n")
    assert main(["predict", str(out), str(inp), "--out", str(inp), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is INPUT itself: writing there would replace the texts" in err
    (tmp_path / "link.txt").symlink_to(inp)
    assert main(["predict", str(out), str(inp), "--out", str(tmp_path / "link.txt"), "--quiet"]) == 2
    assert "is INPUT itself" in capsys.readouterr().err
    assert inp.read_text() == "a first text\nanother\n"
    assert main(["predict", str(out), str(inp), "--text-pair-field", "x", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--text-pair-field needs JSON Lines (.jsonl) or CSV/TSV input" in err
    for flag in ("--text-field", "--field"):  # a field of a text file: refused, not ignored
        assert main(["predict", str(out), str(inp), flag, "body", "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--text-field needs JSON Lines (.jsonl) or CSV/TSV input" in err


def test_predict_gives_a_csv_row_that_is_not_utf8_a_row_of_status_undecodable(trained, tmp_path, capsys):
    out, _ = trained
    inp = tmp_path / "bad.csv"
    inp.write_bytes(b"text\nfine\nnot \xff utf-8\nalso fine\n")
    assert main(["predict", str(out), str(inp), "--quiet"]) == 0
    cap = capsys.readouterr()
    assert [r.split("\t")[:2] for r in cap.out.splitlines()[1:]] == [["2", "ok"], ["3", "undecodable"], ["4", "ok"]]
    assert "1 undecodable record(s): line 3" in cap.err


def test_a_csv_row_with_more_fields_than_its_header_is_a_bad_record(trained, tmp_path, capsys):
    """An unquoted comma in a text shifts the columns: finetune took "really" and "slow film" as
    labels, predict scored "Great movie" alone, both in silence. Empty extra fields (a trailing
    comma) carry nothing and are read as before."""
    from bertscope.errors import InputError
    from bertscope.train.data import read_examples, read_records

    shifted = tmp_path / "comma.csv"
    shifted.write_text("text,label\nGreat movie, really,pos\nDull, slow film,neg\nfine,pos\ntrailing,neg,\n")
    recs = read_records(shifted, label_field="label")
    assert [(r.line, r.status, r.label) for r in recs] == [(2, "extra_fields", None), (3, "extra_fields", None),
                                                           (4, "ok", "pos"), (5, "ok", "neg")]
    with pytest.raises(InputError, match=re.escape("2 bad record(s): line 2 has more fields than the header names "
                                                   "(a comma or tab in a text? quote that field); line 3 has")):
        read_examples(shifted)
    assert main(["finetune", str(shifted), "--out", str(tmp_path / "m"), "--quiet"]) == 2
    assert "line 2 has more fields than the header names" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    out, _ = trained
    assert main(["predict", str(out), str(shifted), "--quiet"]) == 0
    cap = capsys.readouterr()
    assert [r.split("\t")[:2] for r in cap.out.splitlines()[1:]] == [["2", "extra_fields"], ["3", "extra_fields"],
                                                                     ["4", "ok"], ["5", "ok"]]
    assert "bertscope: note: 2 extra_fields record(s): lines 2, 3" in cap.err  # a line of its own
    tsv = tmp_path / "tab.tsv"
    tsv.write_text("text\tlabel\na\ttab inside\tpos\n")
    assert [r.status for r in read_records(tsv, label_field="label")] == ["extra_fields"]


def test_predict_gives_a_blank_line_of_json_lines_or_csv_a_row_of_status_empty(trained, tmp_path, capsys):
    """A blank line of a JSON Lines file is a record of status "empty", as `embed` counts it: a
    row in order, listed on stderr, and not counted as a prediction."""
    out, _ = trained
    inp = tmp_path / "docs.jsonl"
    texts = ["a wonderful film", "dull and awful", "great acting", "boring plot", "", "loved it", "hated it"]
    inp.write_text("".join((json.dumps({"text": t}) if t else "") + "\n" for t in texts))
    pred = tmp_path / "pred.jsonl"
    assert main(["predict", str(out), str(inp), "--json", "--out", str(pred), "--quiet"]) == 0
    rows = [json.loads(x) for x in pred.read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert rows[4] == {"line": 5, "status": "empty", "label": None, "probs": None}
    assert all(r["status"] == "ok" for r in rows[:4] + rows[5:])
    err = capsys.readouterr().err
    assert f"wrote 6 predictions, 1 empty record to {pred}" in err and "1 empty record(s): line 5" in err
    few = tmp_path / "few.jsonl"  # the count is of predictions, not of rows
    few.write_text('{"text": "a fine film"}\n   \n{"text": "a poor film"}\n')
    assert main(["predict", str(out), str(few), "--out", str(tmp_path / "few.tsv"), "--quiet"]) == 0
    assert "wrote 2 predictions, 1 empty record to" in capsys.readouterr().err
    table = tmp_path / "docs.csv"  # a blank line of CSV too
    table.write_text("text,extra\ngood film,1\n\nbad film,2\n")
    assert main(["predict", str(out), str(table), "--quiet"]) == 0
    got = [r.split("\t")[:2] for r in capsys.readouterr().out.splitlines()[1:]]
    assert got == [["2", "ok"], ["3", "empty"], ["4", "ok"]]
    blanks_and_bad = tmp_path / "bad.jsonl"  # a blank line is no text: still refused
    blanks_and_bad.write_text("\n{not json\n\n")
    assert main(["predict", str(out), str(blanks_and_bad), "--quiet"]) == 2
    assert "no record of" in capsys.readouterr().err


def _run_cli(args: list[str], env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "bertscope", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_resume_after_a_kill_mid_epoch_ends_with_the_uninterrupted_weights(tmp_path, tiny):
    from safetensors.torch import load_file

    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(120, seed=5))
    common = ["finetune", str(train), "--model", str(tiny), "--epochs", "2", "--batch-size", "8",
              "--max-length", "24", "--save-every", "4", "--seed", "3", "--quiet"]
    full = _run_cli(common + ["--out", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr
    # 15 steps per epoch: kill right after the checkpoint of step 20 (mid second epoch)
    cut = _run_cli(common + ["--out", str(tmp_path / "cut")], {"BERTSCOPE_TRAIN_KILL_AFTER_STEP": "20"})
    assert cut.returncode == -9, cut.stderr
    assert (tmp_path / "cut" / "training_state.pt").is_file() and not (tmp_path / "cut" / "model.safetensors").exists()
    again = _run_cli(common + ["--out", str(tmp_path / "cut"), "--resume"])
    assert again.returncode == 0, again.stderr
    assert "resumed at step 20" in again.stdout
    assert again.stderr.startswith("bertscope: resuming at step 20 of 30\n")  # said at once, --quiet or not
    a = load_file(str(tmp_path / "full" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ma = json.loads((tmp_path / "full" / "metrics.json").read_text())
    mb = json.loads((tmp_path / "cut" / "metrics.json").read_text())
    assert [r["train_loss"] for r in ma["epochs"]] == [r["train_loss"] for r in mb["epochs"]]
    # and the run changed the weights
    start = load_file(str(tiny / "model.safetensors"))
    assert not torch.equal(a["bert.encoder.layer.0.attention.self.query.weight"],
                           start["encoder.layer.0.attention.self.query.weight"])


def test_ctrl_c_inside_a_checkpoint_write_is_an_interrupt_not_torchs_error(tmp_path, tiny, capsys, monkeypatch):
    """Ctrl-C landing inside torch.save: its zip writer's cleanup raised RuntimeError("[enforce
    fail at inline_container.cc:672] . unexpected pos ...") over the KeyboardInterrupt, and the
    command printed that, exit 1. The checkpoint before it stays, and --resume finishes."""
    from bertscope.train import loop

    real_save, calls = torch.save, []

    def save(obj, f, *a, **kw):  # the second checkpoint is interrupted as torch's writer is
        calls.append(1)
        if len(calls) == 2:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 71388288 vs 71388176")
        return real_save(obj, f, *a, **kw)

    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(40, seed=5))
    args = ["finetune", str(train), "--model", str(tiny), "--epochs", "1", "--batch-size", "8", "--max-length", "24",
            "--save-every", "1", "--out", str(tmp_path / "run"), "--quiet"]
    monkeypatch.setattr(loop.torch, "save", save)
    assert main(args) == 130
    assert capsys.readouterr().err == "bertscope: interrupted; rerun the same command with --resume to finish\n"
    monkeypatch.setattr(loop.torch, "save", real_save)
    assert main([*args, "--resume"]) == 0
    assert "resumed at step 1" in capsys.readouterr().out


def test_examples_longer_than_the_token_budget_are_said_to_go_over_it(tmp_path, tiny, capsys):
    """--batch-tokens below an example's length was taken in silence: such an example makes a
    batch of its own, over the budget. The run says how many, and trains."""
    rows = sentiment_rows(16, seed=5)
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    tok = bertscope.BertTokenizer.from_folder(tiny)
    ids, _, _ = tok.encode_segments([r["text"] for r in rows], None, max_length=24)
    budget = sorted(len(t) for t in ids)[len(ids) // 2]  # about half the examples are longer
    over = sum(len(t) > budget for t in ids)
    assert 0 < over < len(ids)
    args = ["finetune", str(train), "--model", str(tiny), "--epochs", "1", "--max-length", "24", "--quiet"]
    run = _run_cli([*args, "--batch-tokens", str(budget), "--out", str(tmp_path / "a")])  # the CLI's own log lines
    assert run.returncode == 0, run.stderr
    err = run.stderr
    assert (f"bertscope: warning: {over} of the 16 training examples are longer than the {budget}-token budget "
            "(--batch-tokens): each is a batch of its own, over the budget\n") in err, err
    assert main([*args, "--out", str(tmp_path / "b")]) == 0  # the default budget holds 16 at --max-length
    assert "budget" not in capsys.readouterr().err


# --- bad input: one line, a non-zero exit, nothing written in DIR ---------------------------------

def _refused(capsys, args: list[str], match: str, out: Path | None = None) -> None:
    code = main(args + ["--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("bertscope: error:") and len(err.splitlines()) == 1, err
    assert match in err, err
    if out is not None:
        assert not out.exists() or not any(out.iterdir())


@pytest.fixture
def good_train(tmp_path):
    return write_jsonl(tmp_path / "train.jsonl", sentiment_rows(20, seed=0))


def test_refuses_missing_label_field(tmp_path, tiny, capsys):
    rows = sentiment_rows(10, seed=0)
    del rows[4]["label"]
    train = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(train), "--model", str(tiny), "--out", str(out)],
             "line 5: the label field 'label' is missing", out)
    csv_train = write_csv(tmp_path / "t.csv", sentiment_rows(10, seed=0))
    _refused(capsys, ["finetune", str(csv_train), "--model", str(tiny), "--out", str(out), "--label-field", "stars"],
             "has no column 'stars'", out)


def test_a_run_that_gives_every_dev_example_one_label_says_so(tmp_path, tiny, capsys):
    """Dev accuracy 0.6067 looked like learning; it was the share of the commonest label, every
    example predicted 'neg'. The epoch line now gives that baseline, and a warning when every
    DEV example got the same label (here: DEV's texts are all the same text)."""
    train = write_jsonl(tmp_path / "t.jsonl", sentiment_rows(24, seed=0))
    dev = write_jsonl(tmp_path / "d.jsonl", [{"text": "the same text", "label": lab} for lab in ("pos", "neg", "neg")])
    assert main(["finetune", str(train), "--dev", str(dev), "--model", str(tiny), "--out", str(tmp_path / "o"),
                 "--epochs", "1", "--max-length", "16", "--quiet"]) == 0
    err = capsys.readouterr().err
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())["epochs"][0]
    assert metrics["dev_labels_predicted"] == 1
    assert f"(majority-label baseline {metrics['dev_majority_accuracy']:.4f})" in err
    assert ("bertscope: warning: epoch 1 gave every DEV example the same label: so far the model does no better "
            "than the majority-label baseline") in err
    # a few steps (one in 24 examples): more of them, not a higher --lr, is the advice that helped
    assert f"(an epoch of {metrics['steps']:,} steps is few: smaller batches (--batch-size, --batch-tokens) give more" in err


def test_refuses_only_one_class(tmp_path, tiny, capsys):
    rows = [dict(r, label="pos") for r in sentiment_rows(10, seed=0)]
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(write_jsonl(tmp_path / "t.jsonl", rows)), "--model", str(tiny),
                      "--out", str(out)], "only one class", out)


def test_refuses_unknown_labels_in_dev(tmp_path, tiny, good_train, capsys):
    dev = sentiment_rows(6, seed=1)
    dev[2]["label"] = "neutral"
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(good_train), "--dev", str(write_jsonl(tmp_path / "d.jsonl", dev)),
                      "--model", str(tiny), "--out", str(out)], "line 3 has the label 'neutral'", out)


def test_refuses_an_empty_file(tmp_path, tiny, capsys):
    empty = tmp_path / "t.csv"
    empty.write_text("")
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(empty), "--model", str(tiny), "--out", str(out)],
             "holds no examples (it is empty)", out)
    empty.write_text("text,label\n")  # not empty: "it is empty" was wrong
    _refused(capsys, ["finetune", str(empty), "--model", str(tiny), "--out", str(out)],
             "holds no examples (no record: only a header, or blank lines)", out)


def test_refuses_a_text_the_tokenizer_leaves_nothing_of(tmp_path, tiny, capsys):
    """A text of only zero-width spaces was trained on as [CLS] [SEP], where a blank one is refused."""
    rows = sentiment_rows(6, seed=0)
    rows[1]["text"] = "\u200b"
    rows[4]["text"] = "\u200b \u0301"
    train = write_jsonl(tmp_path / "t.jsonl", rows)
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(train), "--model", str(tiny), "--out", str(out)],
             f"TRAIN {train}: 2 bad record(s): line 2 has no tokens (only characters the tokenizer drops); "
             "line 5 has no tokens", out)


@pytest.mark.parametrize("label", [1.5, None, ["pos"], True, {"a": 1}])
def test_refuses_labels_that_are_not_strings_or_ints(tmp_path, tiny, label, capsys):
    rows = sentiment_rows(10, seed=0)
    rows[6]["label"] = label
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(write_jsonl(tmp_path / "t.jsonl", rows)), "--model", str(tiny),
                      "--out", str(out)], "line 7: the label field 'label' is", out)


def test_int_labels_are_a_label_set(tmp_path, tiny):
    from bertscope.train.data import LabelSet, read_examples

    rows = [dict(r, label=10 if r["label"] == "pos" else 2) for r in sentiment_rows(10, seed=0)]
    ex = read_examples(write_jsonl(tmp_path / "t.jsonl", rows))
    assert LabelSet.from_examples(ex).names == ("2", "10")  # numeric order, not "10" < "2"


def test_labels_that_differ_only_in_case_are_said_to(tmp_path, caplog):
    """'neg' and 'Neg' became two classes without a word."""
    import logging

    from bertscope.train.data import LabelSet, read_examples

    rows = [dict(r, label="Neg" if i == 3 else r["label"]) for i, r in enumerate(sentiment_rows(10, seed=0))]
    assert "neg" in {r["label"] for r in rows}
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="bertscope"):
        names = LabelSet.from_examples(read_examples(path), path).names
    assert names == ("Neg", "neg", "pos")
    assert [r.getMessage() for r in caplog.records] == [
        f"{path} has the labels 'Neg' and 'neg', which differ only in case: each is a class of its own "
        "(write each label one way if they are one class)"]


def test_refuses_max_length_over_the_positions(tmp_path, tiny, good_train, capsys):
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(good_train), "--model", str(tiny), "--out", str(out), "--max-length", "257"],
             "--max-length must be at most the model's 256 positions, got 257", out)


@pytest.mark.parametrize("seed", ["-1", str(2 ** 64)])
def test_refuses_a_seed_out_of_range(tmp_path, tiny, good_train, capsys, seed):
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(good_train), "--model", str(tiny), "--out", str(out), "--seed", seed],
             f"--seed must be a whole number from 0 to 2**64 - 1, got {seed}", out)


def test_refuses_an_unwritable_out(tmp_path, tiny, good_train, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _refused(capsys, ["finetune", str(good_train), "--model", str(tiny), "--out", str(blocker / "sub")],
             "cannot be a folder")
    _refused(capsys, ["finetune", str(good_train), "--model", str(tiny), "--out", "/proc/bertscope-out"],
             "--out")


def test_refuses_an_existing_non_empty_out_without_resume(tmp_path, tiny, good_train, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    _refused(capsys, ["finetune", str(good_train), "--model", str(tiny), "--out", str(out)],
             "exists and is not empty (and holds no run to resume); choose a new folder")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    _refused(capsys, ["finetune", str(good_train), "--model", str(tiny), "--out", str(out), "--resume"],
             "holds no interrupted run")


def test_a_folder_with_a_run_says_whether_resume_can_continue_it(tmp_path, tiny, good_train, capsys):
    """A finished run's folder said "pass --resume to continue the run in it", and --resume then
    said the run was complete. An interrupted run's folder names --resume."""
    args = ["finetune", str(good_train), "--model", str(tiny), "--max-length", "16", "--epochs", "1", "--quiet"]
    done = tmp_path / "done"
    assert main([*args, "--out", str(done)]) == 0
    capsys.readouterr()
    _refused(capsys, [*args, "--out", str(done)], f"--out: {done} holds a finished run (metrics.json); choose a new "
                                                  "folder (or delete this one to train it again)")
    cut = tmp_path / "cut"
    from bertscope.train import FinetuneConfig, finetune

    steps = []

    def stop(info):  # in the second step: the first one's checkpoint is written
        steps.append(info)
        if len(steps) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune(FinetuneConfig(train=str(good_train), model=str(tiny), max_length=16, epochs=1, batch_size=4,
                                save_every=1), cut, on_step=stop)
    _refused(capsys, [*args, "--out", str(cut)], f"--out: {cut} holds an interrupted run; pass --resume to continue "
                                                 "it, or choose a new folder")


def test_read_records_line_numbers_and_statuses(tmp_path):
    from bertscope.train.data import read_records

    csv_path = tmp_path / "a.csv"
    csv_path.write_text('text,label\n"a review\nover two lines",pos\n\nshort,neg\nonly-text\n')
    recs = read_records(csv_path, label_field="label")
    assert [(r.line, r.status, r.label) for r in recs] == [(2, "ok", "pos"), (5, "ok", "neg"), (6, "ok", None)]
    assert recs[2].label_problem == "is missing"
    tsv = tmp_path / "a.tsv"
    tsv.write_text("label\ttext\tpair\n1\tfirst\tsecond\n0\t\t\n")
    recs = read_records(tsv, pair_field="pair", label_field="label")
    assert [(r.text, r.pair, r.status, r.label) for r in recs] == [("first", "second", "ok", "1"), ("", "", "empty", "0")]
    raw = tmp_path / "b.jsonl"
    raw.write_bytes(b'{"text": "ok"}\n\xff\xfe\n[1]\n')
    assert [r.status for r in read_records(raw)] == ["ok", "undecodable", "no_field"]


def test_a_csv_text_longer_than_the_csv_modules_field_limit_is_read_and_cut(trained, tmp_path, capsys):
    """One review of 240,000 characters refused the whole file ("field larger than field limit
    (131072)", the csv module's words) in predict and finetune; in .jsonl it was read and cut."""
    import csv

    out, _ = trained
    long_text = "a very long and rather dull review " * 7000  # 245,000 characters
    kept = csv.field_size_limit(131072)  # the module's default (another test may have raised it)
    try:
        _long_csv_texts(out, long_text, tmp_path, capsys)
        assert csv.field_size_limit() == 131072  # raised while a file is read, then given back
    finally:
        csv.field_size_limit(kept)


def _long_csv_texts(out, long_text, tmp_path, capsys):
    import csv

    assert len(long_text) > csv.field_size_limit()
    for name, sep in (("long.csv", ","), ("long.tsv", "\t")):
        path = tmp_path / name
        path.write_text(f"text{sep}label\n{long_text}{sep}neg\nA fine film.{sep}pos\n")
        assert main(["predict", str(out), str(path), "--json", "--quiet"]) == 0
        rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [(r["line"], r["status"]) for r in rows] == [(2, "truncated"), (3, "ok")]
        clf = bertscope.load(out)
        expected = clf.classify([long_text])[0]  # cut as classify cuts it
        assert max(abs(rows[0]["probs"][n] - float(v)) for n, v in zip(clf.labels, expected)) <= TOL
    from bertscope.train.data import read_records

    assert [len(r.text) for r in read_records(tmp_path / "long.csv", label_field="label")] == [len(long_text), 12]


def test_a_csv_or_tsv_row_that_is_not_utf8_is_an_undecodable_record(tmp_path):
    """As a text or JSON Lines file's line is (predict gives it a row of that status; training
    data with one is refused naming its line), where before the whole file was refused; a
    header that is not UTF-8 still refuses the file. A BOM is still dropped."""
    from bertscope.errors import InputError
    from bertscope.train.data import read_examples, read_records

    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\xef\xbb\xbftext,label\ngood one,pos\n\"caf\xe9\nquoted\",neg\nlast,neg\n")
    recs = read_records(bad, label_field="label")
    assert [(r.line, r.status, r.text) for r in recs] == [(2, "ok", "good one"), (3, "undecodable", ""),
                                                          (5, "ok", "last")]
    with pytest.raises(InputError, match="1 bad record.*line 3 is not UTF-8 text"):
        read_examples(bad)
    tsv = tmp_path / "bad.tsv"
    tsv.write_bytes(b"t\xffext\tlabel\nx\ty\n")
    with pytest.raises(InputError, match=r"bad\.tsv: line 1 \(the header\) is not UTF-8 text"):
        read_records(tsv)
    other = tmp_path / "other.csv"  # a bad byte in a column that is not read costs nothing
    other.write_bytes(b"text,note\ngood text,caf\xe9\n")
    assert [(r.status, r.text) for r in read_records(other)] == [("ok", "good text")]


def test_read_records_keeps_blank_lines_as_empty_records_when_asked(tmp_path):
    """Training data skips blank lines; predict asks for them (keep_blank) and gets one record of
    status "empty" each, marked blank, unlike an empty text field."""
    from bertscope.train.data import read_records

    raw = tmp_path / "c.jsonl"
    raw.write_text('{"text": "a"}\n\n  \n{"text": ""}\n')
    assert [(r.line, r.status) for r in read_records(raw)] == [(1, "ok"), (4, "empty")]
    recs = read_records(raw, keep_blank=True)
    assert [(r.line, r.status, r.blank) for r in recs] == [(1, "ok", False), (2, "empty", True),
                                                         (3, "empty", True), (4, "empty", False)]
    csv_path = tmp_path / "c.csv"
    csv_path.write_text("text\nfirst\n\nsecond\n")
    assert [(r.line, r.status) for r in read_records(csv_path, keep_blank=True)] == [(2, "ok"), (3, "empty"),
                                                                                    (4, "ok")]
    text = tmp_path / "c.txt"
    text.write_text("x\n \n")
    assert [(r.status, r.blank) for r in read_records(text, lines_ok=True)] == [("ok", False), ("empty", True)]


def test_epoch_batches_cover_every_example_once_within_budget_and_are_reproducible():
    from bertscope.train.batches import epoch_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, size=500).tolist()
    a = epoch_batches(lengths, 1024, 16, seed=7, epoch=0)
    assert sorted(i for b in a for i in b) == list(range(500))
    assert all(len(b) <= 16 and (len(b) == 1 or sum(lengths[i] for i in b) <= 1024) for b in a)
    assert a == epoch_batches(lengths, 1024, 16, seed=7, epoch=0)
    assert a != epoch_batches(lengths, 1024, 16, seed=7, epoch=1)
    # length-grouped: inside a batch lengths are close (far closer than in a random batch)
    spread = np.mean([max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in a if len(b) > 1])
    assert spread < 40


def test_macro_f1_matches_scikit_learn():
    from sklearn.metrics import f1_score

    from bertscope.train.metrics import accuracy, macro_f1

    rng = np.random.default_rng(1)
    gold = rng.integers(0, 3, 200).tolist()
    pred = [g if rng.random() < 0.7 else int(rng.integers(0, 3)) for g in gold]
    assert abs(macro_f1(pred, gold, 3) - f1_score(gold, pred, average="macro")) < 1e-12
    assert accuracy(pred, gold) == np.mean(np.array(pred) == np.array(gold))


def test_label_report_matches_scikit_learn_with_an_unknown_and_a_never_predicted_class():
    """Per label precision/recall/F1/support, accuracy and macro-F1 as scikit-learn computes them
    over the model's labels; a gold name outside them ("meh") is a wrong prediction, not a class."""
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

    from bertscope.train.metrics import label_report

    labels = ["neg", "neutral", "pos"]
    rng = np.random.default_rng(3)
    gold = [str(x) for x in rng.choice(["neg", "neutral", "pos", "meh"], 300, p=[0.4, 0.1, 0.4, 0.1])]
    pred = [g if g != "neutral" and g != "meh" and rng.random() < 0.8 else str(rng.choice(["neg", "pos"]))
            for g in gold]  # "neutral" is never predicted
    report = label_report(pred, gold, labels)
    p, r, f, support = precision_recall_fscore_support(gold, pred, labels=labels, zero_division=0)
    for k, name in enumerate(labels):
        row = report["per_label"][name]
        assert (row["precision"], row["recall"], row["f1"]) == pytest.approx((p[k], r[k], f[k]), abs=1e-12)
        assert row["support"] == support[k]
    assert report["per_label"]["neutral"]["precision"] == 0 and report["per_label"]["neutral"]["support"] > 0
    assert report["accuracy"] == pytest.approx(accuracy_score(gold, pred), abs=1e-12)
    assert report["macro_f1"] == pytest.approx(f1_score(gold, pred, labels=labels, average="macro",
                                                        zero_division=0), abs=1e-12)
    every = labels + ["meh"]
    matrix = confusion_matrix(gold, pred, labels=every)
    assert {g: {q: int(matrix[i, j]) for j, q in enumerate(every) if matrix[i, j]} for i, g in enumerate(every)
            if matrix[i].sum()} == report["confusion"]
    assert report["majority_accuracy"] == pytest.approx(max(gold.count(x) for x in set(gold)) / len(gold))
    assert report["scored"] == 300
    assert list(report["confusion"]) == ["neg", "neutral", "pos", "meh"]  # the model's order, then others
    assert list(report["confusion"]["neg"]) == ["neg", "pos"]


def test_predict_scores_its_predictions_against_a_label_field(trained, tmp_path, capsys):
    """--label-field: a gold column, accuracy and macro-F1 on stderr, --metrics as JSON; records
    without a label are predicted and not scored, a label the model lacks is named and wrong."""
    from sklearn.metrics import accuracy_score, f1_score

    out, dev = trained
    rows = [json.loads(x) for x in dev.read_text().splitlines()][:30]
    rows[4] = {"text": rows[4]["text"], "label": ""}  # no gold label: predicted, not scored
    rows[9] = {"text": rows[9]["text"], "label": "meh"}  # a class the model lacks: scored as wrong
    inp = write_csv(tmp_path / "test.csv", rows)
    pred, metrics = tmp_path / "pred.tsv", tmp_path / "scores" / "m.json"
    (tmp_path / "scores").mkdir()
    assert main(["predict", str(out), str(inp), "--label-field", "label", "--out", str(pred),
                 "--metrics", str(metrics), "--quiet"]) == 0
    err = capsys.readouterr().err
    table = [line.split("\t") for line in pred.read_text().splitlines()]
    assert table[0] == ["line", "status", "label", "gold", "p_neg", "p_pos"]
    assert [t[3] for t in table[1:]] == [r["label"] for r in rows]  # the gold column, "" for none
    report = json.loads(metrics.read_text())
    scored = [(t[2], t[3]) for t in table[1:] if t[3]]
    assert report["scored"] == len(scored) == 29
    assert report["accuracy"] == pytest.approx(accuracy_score([g for _, g in scored], [q for q, _ in scored]))
    assert report["macro_f1"] == pytest.approx(f1_score([g for _, g in scored], [q for q, _ in scored],
                                                        labels=["neg", "pos"], average="macro"))
    assert report["accuracy"] >= 0.85  # the fine-tune is good on this easy task (see the test above)
    assert report["unknown_labels"] == {"meh": 1} and report["unlabelled_lines"] == [6]  # line 1 is the header
    assert report["labels"] == ["neg", "pos"] and report["label_field"] == "label"
    assert f"accuracy {report['accuracy']:.4f}, macro-F1 {report['macro_f1']:.4f} over 29 labelled" in err
    assert "'meh' (1)" in err and "1 predicted record(s) without a gold label, not scored: line 6" in err
    # JSON Lines output gets a "gold" key; stdout works too, without --metrics. A label that is
    # there and cannot be read (1.0, as pandas writes an integer column with a gap; a list) is
    # named apart from a missing one (null)
    odd = rows[:3] + [{"text": "a wonderful film", "label": 1.0}, {"text": "dull", "label": None},
                      {"text": "awful", "label": ["neg"]}]
    jin = write_jsonl(tmp_path / "test.jsonl", odd)
    assert main(["predict", str(out), str(jin), "--label-field", "label", "--json", "--quiet"]) == 0
    cap = capsys.readouterr()
    got = [json.loads(x) for x in cap.out.splitlines()]
    assert [g["gold"] for g in got] == [r["label"] for r in rows[:3]] + [None, None, None]
    assert list(got[0]) == ["line", "status", "label", "gold", "probs"]
    assert ("2 gold label(s) could not be read, not scored (first: line 4: the field 'label' is float (1.0), "
            "not a string or an integer): lines 4, 6") in cap.err
    assert "1 predicted record(s) without a gold label, not scored: line 5" in cap.err
    metrics = tmp_path / "odd.json"
    assert main(["predict", str(out), str(jin), "--label-field", "label", "--metrics", str(metrics), "--quiet"]) == 0
    report = json.loads(metrics.read_text())
    assert report["unlabelled_lines"] == [5] and [b["line"] for b in report["unreadable_labels"]] == [4, 6]


def test_predict_label_field_refusals_are_one_line(trained, tmp_path, capsys):
    out, _ = trained
    txt = tmp_path / "in.txt"
    txt.write_text("a fine film\n")
    good = write_jsonl(tmp_path / "in.jsonl", [{"text": "a fine film", "label": "pos"}])
    cases = [
        ([str(txt), "--label-field", "label"], "--label-field needs JSON Lines (.jsonl) or CSV/TSV input"),
        ([str(good), "--metrics", str(tmp_path / "m.json")], "--metrics needs --label-field"),
        ([str(good), "--label-field", "label", "--out", str(tmp_path / "p.tsv"), "--metrics",
          str(tmp_path / "p.tsv")], "is --out too"),
        ([str(write_csv(tmp_path / "in.csv", [{"text": "x", "label": "pos"}])), "--label-field", "gold"],
         "has no column 'gold'"),
        ([str(write_jsonl(tmp_path / "none.jsonl", [{"text": "x"}, {"text": "y", "label": None}])),
          "--label-field", "label"], "no record of"),
        ([str(write_jsonl(tmp_path / "other.jsonl", [{"text": "x", "label": "positive"}])),
          "--label-field", "label"], "none of the labels in 'label' ('positive') is a label of"),
        ([str(write_jsonl(tmp_path / "upper.jsonl", [{"text": "x", "label": "POS"}, {"text": "y", "label": "NEG"}])),
          "--label-field", "label"], "they differ from the model's only in case"),
        ([str(good), "--label-field", "text"], "--label-field 'text' is the field the texts are read from"),
        ([str(good), "--label-field", "label", "--out", str(tmp_path / "p.tsv"), "--metrics",
          str(tmp_path / "p.tsv.partial")], "is --out's progress file too"),
        ([str(good), "--label-field", "label", "--metrics", str(tmp_path / "nowhere" / "m.json")], "--metrics: "),
        ([str(good), "--label-field", "label", "--metrics", str(tmp_path)], f"--metrics {str(tmp_path)!r} is a folder"),
        ([str(write_jsonl(tmp_path / "lable.jsonl", [{"text": "x", "lable": "pos"}])), "--label-field", "label"],
         "the field 'label' is missing; line 1 has 'text', 'lable'"),
    ]
    for extra, message in cases:
        assert main(["predict", str(out)] + extra + ["--quiet"]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (extra, err)
    assert "first: line 1: the field 'label' is missing" in (
        main(["predict", str(out), str(tmp_path / "none.jsonl"), "--label-field", "label", "--quiet"]),
        capsys.readouterr().err)[1]
    assert not (tmp_path / "p.tsv").exists() and not (tmp_path / "m.json").exists()
    long = write_jsonl(tmp_path / "long.jsonl", [{"text": "x", "label": "a very long review " * 20}])
    assert main(["predict", str(out), str(long), "--label-field", "label", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err) < 400 and "'a very long review a very l...'" in err, err  # a value is cut short


def test_predict_reads_integer_gold_labels_as_hugging_faces_default_names():
    from bertscope.cli.predict import gold_labels
    from bertscope.train.data import Record

    records = [Record(1, "a", None, "ok", "0"), Record(2, "b", None, "ok", "1"), Record(3, "c", None, "ok", None),
               Record(4, "d", None, "ok", "7")]
    assert gold_labels(records, ["LABEL_0", "LABEL_1"]) == (["LABEL_0", "LABEL_1", None, "7"], True)
    assert gold_labels(records, ["0", "1"]) == (["0", "1", None, "7"], False)  # named as read: no renaming
    assert gold_labels(records, ["neg", "pos"]) == (["0", "1", None, "7"], False)


def test_predict_names_the_label_a_mismatched_gold_label_most_likely_means():
    """A case-only difference, or an integer written as a float (pandas writes 1.0 for an integer
    column with a gap, in CSV as in JSON): the warning and the refusal name the model's label."""
    from bertscope.cli.predict import _twin

    assert _twin("POS", ["neg", "pos"]) == "pos" and _twin("pos", ["neg", "pos"]) == "pos"
    assert _twin("1.0", ["0", "1"]) == "1" and _twin("1.00", ["LABEL_0", "LABEL_1"]) == "LABEL_1"
    assert _twin("1.5", ["1", "2"]) is None and _twin("meh", ["neg", "pos"]) is None


def test_view_one_text_through_base_and_fine_tuned_model(trained, bert, tmp_path):
    """`view TEXT --model-b DIR`: A is the base model's attention, B the fine-tune's (each against
    HF transformers), and fine-tuning changed them."""
    import transformers

    from bertscope.see.report import build_report

    out, _ = trained
    text = "the acting was wonderful but the story was dull"
    clf = bertscope.load(out)
    rep = build_report(bert, text, bert_b=clf)
    a, b = rep.texts
    assert a.text == b.text == text and a.tokens == b.tokens
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out), attn_implementation="eager").eval()
    enc = clf.encode([text])
    with torch.no_grad():
        ref = hf(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_attentions=True).attentions
    np.testing.assert_allclose(b.attentions, torch.stack([x[0] for x in ref]).numpy(), atol=1e-5)
    assert np.abs(a.attentions - b.attentions).max() > 1e-3  # fine-tuning moved the attention
    page = tmp_path / "ab.html"
    assert main(["view", text, "--model-b", str(out), "--out", str(page)]) == 0
    assert f"B = {out.name}" in page.read_text()
    with pytest.raises(bertscope.InputError, match="not both"):
        build_report(bert, text, "another text", bert_b=clf)


def test_head_change_against_hf_attentions(trained, bert, hf_model):
    """Per head, the mean total variation between base and fine-tuned attention rows, against the
    same quantity computed from HF transformers' attentions of the two models."""
    import transformers

    from bertscope.train.tradeoff import head_change

    out, _ = trained
    clf = bertscope.load(out)
    texts = ["the acting was wonderful", "i thought the story was dull and the music weak"]
    ours = head_change(bert, clf, texts)
    tuned = transformers.AutoModelForSequenceClassification.from_pretrained(str(out), attn_implementation="eager").eval()
    ref = np.zeros_like(ours)
    for t in texts:
        b = bert.encode([t])
        with torch.no_grad():
            p = torch.stack([x[0] for x in hf_model(input_ids=b.input_ids, output_attentions=True).attentions])
            q = torch.stack([x[0] for x in tuned(input_ids=b.input_ids, output_attentions=True).attentions])
        ref += (0.5 * (p - q).abs().sum(-1).mean(-1)).numpy() / len(texts)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    assert ours.max() > 1e-3
    assert np.abs(head_change(bert, bert, texts)).max() == 0


def test_movie_reviews_long_split_is_balanced_disjoint_and_long(bert):
    from bertscope.train.tradeoff import long_review_split, reviews

    rt = reviews("rt")
    assert len(rt) == 8530 and {lab for _, lab in rt} == {"pos", "neg"}  # the package's Rotten Tomatoes set
    rows = rt[:400] + rt[-400:]
    train, dev = long_review_split(bert, rows, 20, 10, min_tokens=30, seed=1)
    assert [r["label"] for r in train].count("pos") == 10 and [r["label"] for r in dev].count("neg") == 5
    assert not {r["text"] for r in train} & {r["text"] for r in dev}
    assert min(bert.tokenizer.count_tokens([r["text"] for r in train + dev])) >= 30
    assert (train, dev) == long_review_split(bert, rows, 20, 10, min_tokens=30, seed=1)


def test_the_text_field_flag_has_one_name_in_every_command(trained, tmp_path, capsys):
    """embed's --field and predict's (and finetune's) --text-field each take the other's name
    too, with the same result."""
    out, _ = trained
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"body": "a fine film"}\n{"body": "dull"}\n')
    tables = []
    for flag in ("--text-field", "--field"):
        assert main(["predict", str(out), str(inp), flag, "body", "--quiet"]) == 0
        tables.append(capsys.readouterr().out)
    assert tables[0] == tables[1] and tables[0].count("\tok\t") == 2
    for flag, folder in (("--field", "a"), ("--text-field", "b")):
        assert main(["embed", str(inp), "--out", str(tmp_path / folder), flag, "body", "--quiet"]) == 0
    from bertscope.fast.embedjob import read_embeddings

    a, b = read_embeddings(tmp_path / "a"), read_embeddings(tmp_path / "b")
    assert np.array_equal(a[0], b[0]) and a[1] == b[1] == ["ok", "ok"]
    from bertscope.cli.app import build_parser

    for flag in ("--text-field", "--field"):
        args = build_parser().parse_args(["finetune", "train.csv", "--out", "o", flag, "body"])
        assert args.text_field == "body"


def test_predict_with_a_wrong_text_field_names_the_fields_there_are(trained, tmp_path, capsys):
    """As embed does ("line 1 has 'text'"), where predict said only "line 1 is no_field"."""
    out, _ = trained
    (tmp_path / "in.jsonl").write_text('{"body": "a fine film", "id": 3}\n{"body": "dull"}\n')
    assert main(["predict", str(out), str(tmp_path / "in.jsonl"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"bertscope: error: no record of {tmp_path / 'in.jsonl'} holds a text (first: "
                                       "line 1 is no_field; line 1 has 'body', 'id'); check --text-field and the "
                                       "file's format\n")


def test_predict_names_a_parquet_file_or_a_json_array_for_what_it_is(trained, tmp_path, capsys):
    """Before: "line 1 is undecodable; check --text-field" for Parquet, and "no_field" for a
    .json file holding one JSON array."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out, _ = trained
    pq.write_table(pa.table({"text": ["a fine film"]}), tmp_path / "in.parquet")
    assert main(["predict", str(out), str(tmp_path / "in.parquet"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "predict reads text, JSON Lines, CSV or TSV files, not Parquet" in err
    (tmp_path / "in.json").write_text('[{"text": "a fine film"}, {"text": "dull"}]\n')
    assert main(["predict", str(out), str(tmp_path / "in.json"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is one JSON document (an array), not JSON Lines; predict reads JSON Lines" in err


def test_predict_and_finetune_refuse_a_utf16_or_binary_file_as_embed_does(trained, tmp_path, capsys):
    """predict read a UTF-16 file as lines: the first text lost as "undecodable", a phantom empty
    line at the end, exit 0; a binary file with one text line predicted it and went on."""
    out, _ = trained
    texts = "a fine film\nrather dull\n"
    utf16 = tmp_path / "utf16.txt"
    utf16.write_text(texts, encoding="utf-16")  # with its byte-order mark, as Windows writes it
    mostly_binary = tmp_path / "mostly.txt"
    mostly_binary.write_bytes(b"a fine film\n" + bytes(range(256)) * 4)
    for path, extra in ((utf16, "; it is UTF-16 text: convert it to UTF-8 first"), (mostly_binary, "")):
        for cmd in (["predict", str(out), str(path)], ["embed", str(path), "--out", str(tmp_path / "e.npy")]):
            assert main([*cmd, "--quiet"]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith(f"bertscope: error: {path} looks like a binary file, not text (a NUL byte on line")
            assert err.endswith(extra) and err.count("\n") == 0, err
    csv16 = tmp_path / "train.csv"
    csv16.write_text("text,label\na fine film,pos\nrather dull,neg\n", encoding="utf-16")
    _refused(capsys, ["finetune", str(csv16), "--out", str(tmp_path / "o")], "it is UTF-16 text: convert it to UTF-8 first")


def test_a_diverging_run_stops_at_its_first_non_finite_loss(tmp_path, tiny, good_train, capsys):
    """A learning rate far too high: the run stops with one line at the first NaN/inf loss and
    writes no model (it used to train on, report the majority class's accuracy, and fail at
    the end writing metrics.json, with model.safetensors already written)."""
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(good_train), "--model", str(tiny), "--out", str(out), "--lr", "1e8",
                      "--warmup", "0", "--epochs", "3", "--batch-size", "4", "--save-every", "0"],
             "the training loss became")
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()


def test_a_temporary_left_by_a_killed_write_does_not_block_out(tmp_path, tiny, good_train):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".training_state.pt.x1y2.tmp").write_bytes(b"half a checkpoint")
    assert main(["finetune", str(good_train), "--model", str(tiny), "--out", str(out), "--epochs", "1",
                 "--max-length", "16", "--quiet"]) == 0
    assert (out / "model.safetensors").is_file()


def test_resume_takes_the_same_files_by_another_path(tmp_path, tiny, monkeypatch):
    """--resume compares TRAIN and --model as files: ./train.jsonl, an absolute path, or the run
    resumed from another working folder."""
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(40, seed=5))
    monkeypatch.chdir(tmp_path)
    common = ["--model", str(tiny), "--epochs", "2", "--batch-size", "8", "--max-length", "16", "--seed", "1",
              "--save-every", "2", "--quiet"]
    cut = _run_cli(["finetune", "train.jsonl", "--out", "run", *common], {"BERTSCOPE_TRAIN_KILL_AFTER_STEP": "2"})
    assert cut.returncode == -9, cut.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = _run_cli(["finetune", str(train), "--out", str(tmp_path / "run"), "--resume",
                      "--model", str(tiny) + "/", *common[2:]])
    assert again.returncode == 0, again.stderr
    assert "resumed at step 2" in again.stdout
    renamed = tmp_path / "other.jsonl"  # a different file is still refused, by its name
    renamed.write_bytes(train.read_bytes())
    cut2 = _run_cli(["finetune", str(train), "--out", str(tmp_path / "run2"), *common],
                    {"BERTSCOPE_TRAIN_KILL_AFTER_STEP": "2"})
    assert cut2.returncode == -9
    refused = _run_cli(["finetune", str(renamed), "--out", str(tmp_path / "run2"), "--resume", *common])
    assert refused.returncode == 2 and "--resume: TRAIN is" in refused.stderr


def test_an_unclosed_quote_is_refused_not_merged_and_a_stray_one_is_kept(tmp_path, trained, capsys):
    """A quote opening a CSV/TSV field that never closes used to swallow every later line into
    one record, silently (predict) or with a misleading label error (finetune)."""
    model, _ = trained
    tsv = tmp_path / "q.tsv"
    tsv.write_text('text\n"Wow, just wow\nawful film\nbad\ngreat\n', encoding="utf-8")
    csv_ = tmp_path / "q.csv"
    csv_.write_text('text,label\nfine,pos\n"never closed,neg\nok,pos\n', encoding="utf-8")
    _refused(capsys, ["predict", str(model), str(tsv), "--out", str(tmp_path / "p.jsonl")],
             "a quoted field (\") opens on line 2 and does not end where a TSV field ends (its quote never "
             "closes, or text follows it), so lines 2-5")
    _refused(capsys, ["finetune", str(csv_), "--out", str(tmp_path / "o")], "opens on line 3")
    # the same for a quote that closes lines later, merging the lines between, and in the header
    for name, body, line in (("mid.csv", 'text,label\n"abc,pos\nmid,neg\n"def,neg\nok,pos\n', 2),
                             ("head.csv", '"text,label\nhello,pos\nbye,neg\n', 1),
                             ("last.csv", 'text,label\nok,pos\n"never closed,neg\n', 3)):
        (tmp_path / name).write_text(body, encoding="utf-8")
        _refused(capsys, ["finetune", str(tmp_path / name), "--out", str(tmp_path / "o")], f"opens on line {line} ")
    # a quote inside a field, a quoted field over two lines, and text after a closing quote are read
    ok = tmp_path / "ok.tsv"
    ok.write_text('text\tlabel\nhe said "hi"\tpos\n"two\nlines"\tneg\n"Hello," she said.\tpos\nlast\tneg\n'
                  '"multi\nline"\t12" pizza\n', encoding="utf-8")
    from bertscope.train.data import read_records
    got = [(r.line, r.text, r.label) for r in read_records(ok, label_field="label")]
    assert [g[0] for g in got] == [2, 3, 5, 6, 7]
    assert [g[2] for g in got] == ["pos", "neg", "pos", "neg", '12" pizza']
    assert got[0][1] == 'he said "hi"' and got[1][1] == "two\nlines"
    assert got[2][1] == '"Hello," she said.'  # as written: the lenient reader dropped the quotes
    # a field that goes on after its closing quote is taken as written; the fields are split as
    # Python's csv module splits them (a tab inside the quotes stays inside), the others unquoted
    tsv = tmp_path / "q2.tsv"
    tsv.write_text('text\tlabel\n"a\tb" c\tpos\n"He said ""hi"""\t"neg" x\n', encoding="utf-8")
    got = [(r.text, r.label) for r in read_records(tsv, label_field="label")]
    assert got == [('"a\tb" c', "pos"), ('He said "hi"', '"neg" x')]
    csv2 = tmp_path / "q2.csv"
    csv2.write_text('text,label,notes\nhello,pos,"see" above\n"Great" movie,neg,\n"a film" ,pos,x\n', encoding="utf-8")
    got = [(r.line, r.text, r.label) for r in read_records(csv2, label_field="label")]
    assert got == [(2, "hello", "pos"), (3, '"Great" movie', "neg"), (4, '"a film" ', "pos")]


def test_one_number_written_two_ways_is_refused_as_two_labels(tmp_path, tiny, capsys):
    rows = sentiment_rows(10, seed=0)
    for i, r in enumerate(rows):
        r["label"] = ["1", "0.0", "1.0", "0"][i % 4]
    out = tmp_path / "out"
    _refused(capsys, ["finetune", str(write_csv(tmp_path / "t.csv", rows)), "--model", str(tiny), "--out", str(out)],
             "one number written two ways", out)
    from bertscope.train.data import Example, LabelSet
    # words that float() would read as numbers are words: "nan", "inf", "Infinity" are three classes
    names = LabelSet.from_examples([Example(i, "t", None, n) for i, n in enumerate(["nan", "inf", "Infinity"])]).names
    assert sorted(names) == ["Infinity", "inf", "nan"]


def test_finetune_names_a_json_array_for_what_it_is(tmp_path, tiny, capsys):
    arr = tmp_path / "train.json"
    arr.write_text(json.dumps(sentiment_rows(6, seed=0)), encoding="utf-8")
    _refused(capsys, ["finetune", str(arr), "--model", str(tiny), "--out", str(tmp_path / "o")],
             "is one JSON document (an array), not JSON Lines")


@pytest.mark.parametrize("kw, fragment", [({"lr": True}, "lr (--lr) must be a number"),
                                          ({"warmup": "0.1"}, "warmup (--warmup) must be a number"),
                                          ({"weight_decay": "0"}, "weight_decay (--weight-decay) must be a number")])
def test_finetune_config_refuses_values_that_are_not_numbers(kw, fragment):
    from bertscope.train.loop import FinetuneConfig

    with pytest.raises(bertscope.InputError, match=re.escape(fragment)):  # the setting, then its flag
        FinetuneConfig(train="t.csv", **kw).check()


def test_predict_warns_when_a_pair_model_is_given_single_texts(tmp_path, tiny, capsys):
    """A classifier fine-tuned on pairs classified single texts silently when
    --text-pair-field was left out."""
    rows = [dict(r, pair="and so it was") for r in sentiment_rows(16, seed=3)]
    train = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "clf"
    assert main(["finetune", str(train), "--text-pair-field", "pair", "--model", str(tiny), "--out", str(out),
                 "--epochs", "1", "--max-length", "16", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["predict", str(out), str(train), "--quiet"]) == 0
    assert "was fine-tuned on text pairs (its metrics.json: --text-pair-field pair)" in capsys.readouterr().err
    assert main(["predict", str(out), str(train), "--text-pair-field", "pair", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_predict_warns_of_a_csv_header_in_a_text_file(trained, tmp_path, capsys):
    """A CSV named .txt was read line by line without a word: its header predicted as a text,
    each row's label part of its text."""
    out, _ = trained
    path = tmp_path / "reviews.txt"
    path.write_text("text,label\nA fine film.,pos\n")
    assert main(["predict", str(out), str(path), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err == (f"bertscope: warning: line 1 of {path} looks like a CSV/TSV header ('text,label'); a file not "
                   "named .csv or .tsv is read as one text per line, header and all: rename it to read its columns\n")
    path.write_text("Texts, labels and more: a film about text.\n")  # prose with commas: no header
    assert main(["predict", str(out), str(path), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_predict_warns_when_a_single_text_model_is_given_pairs(trained, tmp_path, capsys):
    """The other way round was silent: pairs given to a classifier fine-tuned on single texts."""
    out, _ = trained
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [dict(r, pair="and so it was") for r in sentiment_rows(4, seed=3)])
    assert main(["predict", str(out), str(pairs), "--text-pair-field", "pair", "--quiet"]) == 0
    assert (f"bertscope: warning: {out} was fine-tuned on single texts (its metrics.json has no --text-pair-field); "
            "this run gives it pairs") in capsys.readouterr().err
    assert main(["predict", str(out), str(pairs), "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err
    bare = tmp_path / "bare"  # a folder without bertscope's metrics.json: nothing is said
    shutil.copytree(out, bare)
    (bare / "metrics.json").unlink()
    assert main(["predict", str(bare), str(pairs), "--text-pair-field", "pair", "--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_label_with_a_tab_or_a_line_break_is_refused(tmp_path, tiny, capsys):
    """predict writes labels as TSV cells: such a label broke its table's header."""
    for label in ("very\tgood", "very\nbad"):
        rows = sentiment_rows(10, seed=0)
        rows[3]["label"] = label
        _refused(capsys, ["finetune", str(write_jsonl(tmp_path / "t.jsonl", rows)), "--model", str(tiny),
                          "--out", str(tmp_path / "o")], "line 4: the label field 'label' holds a tab or a line break")


def test_a_run_of_one_step_trains(tmp_path, tiny):
    """With the default warm-up, a one-step run (a few examples, one epoch) had learning rate 0
    at its only step: it wrote the base model back, whatever --lr said."""
    out = tmp_path / "one"
    train = write_jsonl(tmp_path / "t.jsonl", sentiment_rows(6, seed=0))
    assert main(["finetune", str(train), "--model", str(tiny), "--out", str(out), "--epochs", "1",
                 "--max-length", "16", "--quiet"]) == 0
    assert json.loads((out / "metrics.json").read_text())["total_steps"] == 1
    base, tuned = bertscope.load(tiny), bertscope.load(out)
    moved = [name for (name, a), (_, b) in zip(base.model.named_parameters(), tuned.model.named_parameters())
             if not torch.equal(a, b)]
    assert moved  # the encoder's weights changed


def test_a_pair_needs_three_positions_and_epochs_have_a_ceiling(tmp_path, tiny, trained, capsys):
    """Under 3 ([CLS] A [SEP] B [SEP]) the tokenizer left a pair uncut: finetune crashed with an
    IndexError, predict refused the file. 10**9 epochs planned batches until memory ran out."""
    rows = [dict(r, pair="and so it was") for r in sentiment_rows(8, seed=3)]
    train = write_jsonl(tmp_path / "pairs.jsonl", rows)
    _refused(capsys, ["finetune", str(train), "--text-pair-field", "pair", "--model", str(tiny), "--out",
                      str(tmp_path / "o"), "--max-length", "4"], "--max-length must be a whole number >= 5, got 4")
    # a single text needs room for one token: at 2 ([CLS] [SEP]) it trained on nothing of the text
    _refused(capsys, ["finetune", str(train), "--model", str(tiny), "--out", str(tmp_path / "o"), "--max-length",
                      "2"], "--max-length must be a whole number >= 3, got 2")
    model, _ = trained
    _refused(capsys, ["predict", str(model), str(train), "--text-pair-field", "pair", "--max-length", "4"],
             "--max-length must be 5..512 for text pairs (room for one token of each text), got 4")
    _refused(capsys, ["predict", str(model), str(train), "--max-length", "2"],  # read [CLS] [SEP] only
             "--max-length must be 3..512 (room for one token of each text), got 2")
    with pytest.raises(bertscope.InputError, match=r"from 3 \(\[CLS\] and two \[SEP\] for a pair\)"):
        bertscope.load(tiny).tokenizer.encode_segments(["a b c"], ["d e f"], max_length=2)
    _refused(capsys, ["finetune", str(train), "--model", str(tiny), "--out", str(tmp_path / "o"),
                      "--epochs", "1000000000"], "--epochs must be at most 10,000")


def test_predict_on_a_fine_tune_that_did_not_finish_says_so(tmp_path, tiny, capsys):
    out = tmp_path / "run"
    train = write_jsonl(tmp_path / "t.jsonl", sentiment_rows(20, seed=0))
    from bertscope.train.loop import KILL_HOOK_ENV

    env = dict(os.environ, **{KILL_HOOK_ENV: "1"})
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    killed = subprocess.run([sys.executable, "-m", "bertscope", "finetune", str(train), "--model", str(tiny),
                             "--out", str(out), "--epochs", "1", "--batch-size", "4", "--save-every", "1",
                             "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode != 0 and (out / "training_state.pt").is_file()
    _refused(capsys, ["predict", str(out), str(train)],
             "holds a fine-tuning run that did not finish (training_state.pt, no model yet); finish it with the "
             "same bertscope finetune command and --resume")


def test_field_spans_split_as_pythons_csv_does():
    """The splitter behind "taken as written" against the csv module, on every line of up to 7
    characters from a small alphabet: the same fields, the same values where well formed, and
    malformed exactly where csv's strict mode refuses."""
    import csv
    import itertools

    from bertscope.train.data import _field_spans

    for delim in (",", "\t"):
        for k in range(1, 8):
            for chars in itertools.product(['a', ' ', '"', delim], repeat=k):
                raw = "".join(chars)
                if '"' not in raw:
                    continue
                [row] = list(csv.reader([raw], delimiter=delim))
                try:
                    list(csv.reader([raw], delimiter=delim, strict=True))
                    valid = True
                except csv.Error as e:
                    if "unexpected end of data" in str(e):  # a quote never closed: another rule
                        continue
                    valid = False
                spans = _field_spans(raw, delim)
                assert len(spans) == len(row), raw
                assert any(bad for *_, bad in spans) == (not valid), raw
                for (a, b, bad), cell in zip(spans, row):
                    if not bad:  # the field alone reads as csv read it in the line
                        alone = next(csv.reader([raw[a:b]], delimiter=delim), [])
                        assert (alone[0] if alone else "") == cell, raw


@pytest.mark.parametrize("full", [True, False], ids=["disk-full", "other-failure"])
def test_a_full_disk_while_saving_the_training_state_names_the_file(tmp_path, tiny, capsys, monkeypatch, full):
    """torch's zip writer reports a write that failed for lack of space as a RuntimeError
    ("unexpected pos 64 vs 0"), which the CLI printed as such; with the disk (nearly) full, it is
    now one line naming the file. Any other failure of torch.save is left as it was."""
    from bertscope.train import loop

    def cut_short(obj, f, *a, **k):
        f.write(b"PK\x03\x04")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(loop.torch, "save", cut_short)
    monkeypatch.setattr(loop, "nearly_full", lambda path: full)
    train = write_jsonl(tmp_path / "t.jsonl", sentiment_rows(12, seed=0))
    out = tmp_path / "run"
    code = main(["finetune", str(train), "--model", str(tiny), "--out", str(out), "--epochs", "1",
                 "--max-length", "16", "--save-every", "1", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    if full:
        assert code == 2 and err[-1] == f"bertscope: error: cannot write {out / 'training_state.pt'}: no space " \
                                         "left on the device", err
    else:
        assert code == 1 and "RuntimeError: [enforce fail" in err[-1], err
    assert not out.exists() or not any(out.iterdir())  # no temporary left behind


def test_predict_progress_keeps_only_whole_chunks_and_a_run_that_saved_none_leaves_no_file(tmp_path):
    """A "done" mark without its newline (a short write) counted as whole, and the next chunk
    was appended straight after it; and a run that failed before its first chunk left a
    FILE.partial with a header alone."""
    from bertscope.train.progressfile import RunProgress, _parse, partial_path

    header = {"kind": "bertscope predict progress", "version": 1, "input": "in.txt", "input_bytes": 9,
              "input_sha256": "ab", "records": 3, "model": "m", "weights": "cd", "settings": {"max_length": 8}}
    row = lambda n: json.dumps({"line": n, "status": "ok"})  # noqa: E731
    data = (json.dumps(header) + "\n" + row(1) + "\n" + '{"done": 1}' + "\n" + row(2) + "\n" + '{"done": 2}').encode()
    _, rows, keep = _parse(data, tmp_path / "x")
    assert [r["line"] for r in rows] == [1] and data[:keep].endswith(b'{"done": 1}\n')
    out = tmp_path / "out.tsv"
    kept = RunProgress(out, header, resume=False)
    assert partial_path(out).is_file()
    kept.close()  # nothing done: nothing to resume from, no file left
    assert not partial_path(out).exists()
    kept = RunProgress(out, header, resume=False)
    kept.add([{"line": 1, "status": "ok"}])
    kept.close()
    assert partial_path(out).is_file()  # a chunk done: kept for --resume
    again = RunProgress(out, header, resume=True)
    assert [r["line"] for r in again.rows] == [1]
    again.close()
    # a run removes only the file it holds: not one another run made at that path meanwhile
    partial_path(out).unlink()
    first = RunProgress(out, header, resume=False)
    partial_path(out).unlink()  # (as a run that finished did) ...
    partial_path(out).write_text("another run's\n")  # ... and a new one began
    first.close()
    assert partial_path(out).read_text() == "another run's\n"


def test_predict_on_a_full_disk_says_resume_finishes_and_does(trained, tmp_path, capsys, monkeypatch):
    """A full disk after some chunks were saved is one line that names the file and says that
    --resume finishes the run (as a Ctrl-C's line does); with space again, it does."""
    from bertscope.train.progressfile import RunProgress

    out, _ = trained
    inp = _long_reviews(tmp_path / "in.jsonl")
    pred = tmp_path / "pred.tsv"
    write, calls = RunProgress._write, []

    def full_after_one_chunk(self, data):
        calls.append(len(data))
        if len(calls) > 2:  # the header, one chunk, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write(self, data)

    monkeypatch.setattr(RunProgress, "_write", full_after_one_chunk)
    args = ["predict", str(out), str(inp), "--out", str(pred), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (f"bertscope: error: --out: cannot write '{pred}.partial' (no space left on the device); free "
                   "some space, then rerun the same command with --resume to finish\n")
    monkeypatch.setattr(RunProgress, "_write", write)
    assert main(args + ["--resume"]) == 0 and not Path(f"{pred}.partial").exists()
    resumed = pred.read_text()
    assert main(["predict", str(out), str(inp), "--out", str(tmp_path / "whole.tsv"), "--quiet"]) == 0
    assert resumed == (tmp_path / "whole.tsv").read_text()


def test_a_folder_made_read_only_mid_run_is_one_line_that_says_resume_finishes(tmp_path, tiny, capsys,
                                                                                 monkeypatch):
    """A folder made read-only during a run (chattr +i): exit 1, "PermissionError: ...
    '.lock' (rerun with --debug for details)", naming the lock file, not the checkpoint that
    could not be written, and no word of --resume, which finishes the run."""
    import errno

    from bertscope.train import loop

    real_save, saved = loop._save_state, []

    def second_save_refused(path, state):
        if saved:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_save(path, state)
        saved.append(path)

    monkeypatch.setattr(loop, "_save_state", second_save_refused)
    train = write_jsonl(tmp_path / "t.jsonl", sentiment_rows(12, seed=0))
    out = tmp_path / "run"
    args = ["finetune", str(train), "--model", str(tiny), "--out", str(out), "--epochs", "1", "--max-length", "16",
            "--batch-size", "4", "--save-every", "1", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertscope: error: {out / 'training_state.pt'}: Operation not permitted; once that is "
                   "fixed, rerun the same command with --resume to finish"], err
    monkeypatch.undo()
    assert main(args + ["--resume"]) == 0 and (out / "metrics.json").is_file()


def test_predict_takes_a_dash_for_standard_output(trained, tmp_path, capfd):
    """--out - writes the rows to standard output, as no --out does; --metrics - writes the
    scores' JSON there when the rows go to a file, and is refused when they would share it."""
    out, _ = trained
    inp = write_jsonl(tmp_path / "in.jsonl", [{"text": "a wonderful film", "label": "pos"},
                                              {"text": "a dull, awful film", "label": "neg"}])
    assert main(["predict", str(out), str(inp), "--quiet"]) == 0
    plain = capfd.readouterr().out
    assert main(["predict", str(out), str(inp), "--out", "-", "--quiet"]) == 0
    assert capfd.readouterr().out == plain and plain.startswith("line\tstatus\tlabel")
    assert not (tmp_path / "-").exists() and not Path("-").exists()
    rows, scores = tmp_path / "p.tsv", tmp_path / "m.json"
    assert main(["predict", str(out), str(inp), "--label-field", "label", "--out", str(rows),
                 "--metrics", str(scores), "--quiet"]) == 0
    capfd.readouterr()
    assert main(["predict", str(out), str(inp), "--label-field", "label", "--out", str(tmp_path / "q.tsv"),
                 "--metrics", "-", "--quiet"]) == 0
    cap = capfd.readouterr()
    assert json.loads(cap.out) == json.loads(scores.read_text()) and "wrote the scores to standard output" in cap.err
    assert (tmp_path / "q.tsv").read_text() == rows.read_text()
    for extra in (["--metrics", "-"], ["--metrics", "-", "--out", "-"]):
        assert main(["predict", str(out), str(inp), "--label-field", "label", "--quiet"] + extra) == 2
        err = capfd.readouterr().err
        assert err.count("\n") == 1 and "--metrics - and the predictions would both go to standard output" in err
    assert main(["predict", str(out), str(inp), "--out", "-", "--resume", "--quiet"]) == 2
    assert "--resume needs --out" in capfd.readouterr().err
