"""Fine-tuning and classifying from Python: what a user of ``bertscope.train.finetune`` meets
beyond the CLI (paths as Path objects, mistakes of type, a run that diverges on its last step,
HF's default labels, the caller's random state)."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np
import pytest
import torch

import bertscope
from bertscope.errors import InputError, InputTypeError, NonFiniteError
from bertscope.train import FinetuneConfig
from trainkit import sentiment_rows, tiny_checkpoint, write_csv, write_jsonl


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, bundled_path):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model", bundled_path)


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", sentiment_rows(12, seed=0))


def small(train, tiny, **kw):
    from bertscope.train import FinetuneConfig

    return FinetuneConfig(train=train, model=tiny, max_length=16, epochs=1, batch_size=4, save_every=1, **kw)


def test_paths_may_be_path_objects_and_the_run_resumes(tmp_path, tiny, rows_file):
    """A Path for train crashed after training (metrics.json: "PosixPath is not JSON
    serializable"), and the state it left could never be resumed."""
    from bertscope.train import finetune

    stop = {"n": 0}

    def interrupt(info):
        stop["n"] += 1
        if stop["n"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune(small(rows_file, tiny), tmp_path / "out", on_step=interrupt)
    res = finetune(small(rows_file, tiny), tmp_path / "out", resume=True)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert res.resumed_from_step == 1 and metrics["train"] == str(rows_file)  # the checkpoint before step 2
    ref = finetune(small(str(rows_file), str(tiny)), tmp_path / "ref")  # the same run, uninterrupted
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (tmp_path / "ref" / "model.safetensors").read_bytes()
    assert ref.metrics["train"] == str(rows_file)
    assert not list(tmp_path.glob(".bertscope-check-*"))  # the output's probe folder is removed


@pytest.mark.parametrize("make, message", [
    (lambda tiny: small([{"text": "a", "label": "x"}], tiny), r"train must be a file path \(a str or Path\)"),
    (lambda tiny: small("t.jsonl", tiny, dev=3), "dev must be a file path"),
    (lambda tiny: {"train": "t.jsonl"}, "finetune takes a FinetuneConfig"),
])
def test_mistakes_of_type_are_named(tmp_path, tiny, make, message):
    """A list of dicts raised pathlib's TypeError eight frames down; a dict, AttributeError."""
    from bertscope.train import finetune

    with pytest.raises(InputTypeError, match=message):
        finetune(make(tiny), tmp_path / "out")


def test_an_output_that_cannot_be_made_is_refused_before_the_model_loads(tmp_path, tiny, rows_file, monkeypatch):
    from bertscope.train import finetune, loop

    monkeypatch.setattr(loop, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="cannot be a folder: .*afile is a file"):
        finetune(small(rows_file, tiny), tmp_path / "afile" / "sub")
    with pytest.raises(InputError, match="cannot be created in /proc"):
        finetune(small(rows_file, tiny), "/proc/bertscope-nope")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bertscope-check-")]


def test_output_mistakes_name_the_argument_a_python_caller_passed(tmp_path, tiny, rows_file, monkeypatch):
    """These said only "--out ..." and "--resume: ...", flags a Python caller never passed."""
    from bertscope.train import finetune, loop

    monkeypatch.setattr(loop, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=re.escape(f"out (--out) must be a folder: {tmp_path / 'afile'} is a file")):
        finetune(small(rows_file, tiny), tmp_path / "afile")
    with pytest.raises(InputError, match=re.escape(f"out (--out): {tmp_path / 'afile' / 'sub'} cannot be a folder")):
        finetune(small(rows_file, tiny), tmp_path / "afile" / "sub")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match=re.escape("exists and is not empty (and holds no run to resume); choose a "
                                                   "new folder")):
        finetune(small(rows_file, tiny), tmp_path / "used")
    with pytest.raises(InputError, match=re.escape(f"resume (--resume): {tmp_path / 'used'} holds no interrupted run")):
        finetune(small(rows_file, tiny), tmp_path / "used", resume=True)


def _diverging_last_step(monkeypatch) -> dict:
    """The run's last update makes the head infinite, after that step's loss was checked: what an
    lr of 1e6 did here, made certain (how far a real update overflows depends on the CPU)."""
    from bertscope.train import loop

    seen = {"steps": 0, "total": None}
    real = loop.train_step

    def step(model, *args, **kwargs):
        out = real(model, *args, **kwargs)
        seen["steps"] += 1
        if seen["steps"] == seen["total"]:
            with torch.no_grad():
                model.classifier.weight.fill_(float("inf"))
        return out

    monkeypatch.setattr(loop, "train_step", step)
    return seen


def test_a_run_that_diverges_on_its_last_step_writes_no_model(tmp_path, tiny, rows_file, monkeypatch):
    """The last step's update was checked by no loss: the run was saved as a success and
    classify() returned NaN rows. Now the epoch is checked before it is saved."""
    from bertscope.train import finetune

    def learn_total(info):
        seen["total"] = info.total_steps

    for dev in (None, write_jsonl(tmp_path / "dev.jsonl", sentiment_rows(6, seed=3))):
        seen = _diverging_last_step(monkeypatch)
        out = tmp_path / ("with-dev" if dev else "no-dev")
        with pytest.raises(NonFiniteError, match=r"after epoch 1 \(step 3 of 3\) the model computes NaN or "
                                                 r"infinity: training diverged and no model was written; start again in a new "
                                                 r"out \(--out\) folder with a lower lr \(--lr; this run's: "):
            finetune(small(rows_file, tiny, dev=dev), out, on_step=learn_total)
        assert seen["steps"] == seen["total"] == 3  # 12 examples, 4 per batch
        assert not (out / "model.safetensors").exists()
        assert not (out / "training_state.pt").exists()  # no diverged state to resume either


def test_classify_refuses_nan_and_empty_texts(tmp_path, tiny, rows_file):
    from bertscope.train import finetune

    finetune(small(rows_file, tiny), tmp_path / "out")
    clf = bertscope.load(tmp_path / "out")
    with pytest.raises(InputError, match=re.escape("texts[1] is empty")):
        clf.classify(["a fine film", "  "])
    assert clf.classify([""], pairs=["so it goes"]).shape == (1, 2)  # a pair with one side is read, as finetune reads it
    with torch.no_grad():
        clf.model.classifier.weight.fill_(float("inf"))
    with pytest.raises(NonFiniteError, match="NaN or infinite values for 2 text"):
        clf.classify(["a fine film", "dull"])


def test_a_label_written_as_nan_is_a_missing_value(tmp_path, tiny):
    """pandas writes a missing label as "nan" (astype(str)): it became a class of its own."""
    from bertscope.train import finetune

    rows = sentiment_rows(10, seed=0)
    rows[3]["label"] = "nan"
    train = write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(InputError, match="line 5: the label field 'label' is 'nan', a missing value written as text"):
        finetune(small(train, tiny), tmp_path / "out")


def test_an_hf_classifier_saved_with_default_labels_loads(tmp_path, bundled_path):
    """transformers leaves id2label out of config.json when the labels are its defaults; such a
    folder was refused ("needs id2label"). HF reads it as 2 labels, LABEL_0 and LABEL_1."""
    import shutil

    import transformers

    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification.from_pretrained(str(bundled_path)).eval()
    hf.save_pretrained(tmp_path / "hf")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (bundled_path / name).is_file():
            shutil.copy(bundled_path / name, tmp_path / "hf" / name)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.pop("id2label", None), cfg.pop("label2id", None)  # as saved with default labels
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    clf = bertscope.load(tmp_path / "hf")
    assert clf.labels == ["LABEL_0", "LABEL_1"]
    texts = ["a moving film", "dull and long"]
    tok = transformers.AutoTokenizer.from_pretrained(str(bundled_path))
    with torch.no_grad():
        want = torch.softmax(hf(**tok(texts, padding=True, return_tensors="pt")).logits, -1).numpy()
    np.testing.assert_allclose(clf.classify(texts), want, atol=1e-5)


def test_loading_and_finetuning_leave_the_callers_random_state(tmp_path, tiny, rows_file):
    from bertscope.train import finetune

    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    bertscope.load(tiny)
    finetune(small(rows_file, tiny), tmp_path / "out")
    assert torch.equal(torch.rand(3), want)


@pytest.mark.parametrize("kw, said", [
    ({"epochs": 0}, "epochs (--epochs) must be a whole number >= 1, got 0"),
    ({"text_field": "label"}, "text_field (--text-field), pair_field (--text-pair-field) and label_field "
                              "(--label-field) must name different fields"),
])
def test_a_settings_message_names_it_as_python_and_the_cli_know_it(kw, said):
    """Python callers were told about flags ("--epochs must be ...") they never passed."""
    with pytest.raises(bertscope.InputError) as e:
        FinetuneConfig(train="t.csv", **kw).check()
    assert str(e.value) == said


def _stopped_in_its_second_step(out, rows_file, tiny) -> None:
    """A fine-tuning run into ``out`` interrupted (Ctrl-C) in its second step: resumable."""
    from bertscope.train import finetune

    steps = []

    def interrupt(info):
        steps.append(info)
        if len(steps) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune(small(rows_file, tiny), out, on_step=interrupt)


def test_resume_compares_settings_as_the_run_used_them_and_says_so_in_words(tmp_path, tiny, rows_file):
    """--batch-tokens 256 was refused when the run had used the default, 16 x --max-length = 256
    ("... but the interrupted run used None"); a --dev added said "used None" too; a changed file
    was "the train or dev file", not the one that changed."""
    from bertscope.train import finetune

    out, train = tmp_path / "run", tmp_path / "train.jsonl"
    train.write_bytes(rows_file.read_bytes())
    _stopped_in_its_second_step(out, train, tiny)  # max_length 16: the default budget is 256 tokens
    for kw, said in (({"batch_tokens": 128}, "batch_tokens (--batch-tokens) is 128, but the interrupted run used the "
                                             "default (16 x max_length (--max-length) = 256)"),
                     ({"dev": str(rows_file)}, f"dev (--dev) is {str(rows_file)!r}, but the interrupted run had none"),
                     ({"lr": 1e-3}, "lr (--lr) is 0.001, but the interrupted run used 5e-05")):
        with pytest.raises(InputError) as e:
            finetune(small(train, tiny, **kw), out, resume=True)
        assert str(e.value) == f"resume (--resume): {said}"
    with pytest.raises(InputError, match=re.escape("model (--model) is the bundled model, but the interrupted run used ")):
        finetune(dataclasses.replace(small(train, tiny), model=None), out, resume=True)
    original = train.read_bytes()
    train.write_bytes(original.replace(b'"label": "pos"', b'"label": "neg"', 1))
    with pytest.raises(InputError) as e:
        finetune(small(train, tiny), out, resume=True)
    assert str(e.value) == (f"resume (--resume): the file train (TRAIN) {train} changed since the interrupted run (its "
                            "contents differ); resume with the same data, or start a new run")
    train.write_bytes(original)
    res = finetune(small(train, tiny, batch_tokens=256), out, resume=True)  # the budget it used: accepted
    assert res.resumed_from_step == 1


def test_a_second_run_in_a_folder_being_trained_in_is_refused(tmp_path, tiny, rows_file, monkeypatch):
    """Two runs trained into one folder at once (a --resume started while the first ran on), both
    writing training_state.pt. The lock here is held by this process, as a running run holds it."""
    from bertscope.files import FolderLock
    from bertscope.train import finetune, loop

    out = tmp_path / "run"

    _stopped_in_its_second_step(out, rows_file, tiny)  # resumable
    assert sorted(p.name for p in out.iterdir()) == ["training_state.pt"]  # its lock went with it
    running = FolderLock(out / ".lock", lambda pid: AssertionError("taken"))
    try:
        in_use = re.escape(f"out (--out): {out} is in use by another fine-tuning run (pid {os.getpid()})")
        with monkeypatch.context() as m:  # refused before the model or the data is read
            m.setattr(loop, "load", lambda *a, **k: pytest.fail("the model was loaded"))
            with pytest.raises(InputError, match=in_use):
                finetune(small(rows_file, tiny), out, resume=True)
            with pytest.raises(InputError, match=in_use):  # not "holds an interrupted run; pass --resume"
                finetune(small(rows_file, tiny), out)
        with monkeypatch.context() as m:  # two runs that checked at the same moment: the lock decides
            m.setattr(loop, "lock_holder", lambda path: None)
            with pytest.raises(InputError, match=in_use):
                finetune(small(rows_file, tiny), out, resume=True)
    finally:
        running.close()
    result = finetune(small(rows_file, tiny), out, resume=True)  # free again: it resumes
    assert result.resumed_from_step == 1 and ".lock" not in [p.name for p in out.iterdir()]


def test_a_run_that_finished_while_another_waited_to_lock_its_folder_is_not_trained_over(
        tmp_path, tiny, rows_file, monkeypatch):
    """The folder was checked before the model loaded and locked after: a run that finished in
    between left its folder to the second, which trained over its model. It is checked again
    once the lock is held."""
    from bertscope.files import FolderLock
    from bertscope.train import finetune, loop

    out = tmp_path / "run"
    _stopped_in_its_second_step(out, rows_file, tiny)

    def the_other_run_finishes_first(path, in_use):
        (out / "training_state.pt").unlink()
        (out / "metrics.json").write_text("{}")
        return FolderLock(path, in_use)

    monkeypatch.setattr(loop, "FolderLock", the_other_run_finishes_first)
    with pytest.raises(InputError, match="the run in .* is already complete"):
        finetune(small(rows_file, tiny), out, resume=True)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]  # left as the other run made it


def test_a_checkpoint_that_cannot_be_written_is_the_error_not_the_lock_left_behind(tmp_path, tiny, rows_file,
                                                                                     monkeypatch):
    """A folder made read-only during a run: the checkpoint's PermissionError was replaced by the
    one from removing the lock file (.lock), which also kept the lock's descriptor, and its flock,
    open for the rest of the process."""
    import errno
    import pathlib

    from bertscope.files import FolderLock
    from bertscope.train import finetune, loop

    out = tmp_path / "run"
    state = out / "training_state.pt"

    def cannot_write(path, _state):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    real_unlink = pathlib.Path.unlink

    def read_only_folder(self, *a, **k):
        if self.parent == out:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(self))
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(loop, "_save_state", cannot_write)
    monkeypatch.setattr(pathlib.Path, "unlink", read_only_folder)
    with pytest.raises(PermissionError) as e:
        finetune(small(rows_file, tiny), out)
    assert e.value.filename == str(state)
    monkeypatch.undo()
    FolderLock(out / ".lock", lambda pid: AssertionError(f"still locked by {pid}")).close()  # released


def test_resume_on_a_folder_that_holds_no_checkpoint_yet_starts_a_new_run(tmp_path, tiny, rows_file, caplog):
    """A run stopped before its first checkpoint leaves an empty folder: --resume was refused
    ("holds no interrupted run"), though the help says to resume after an interruption. It now
    starts the run there, with a warning, as ``embed --resume`` does; a folder that holds other
    files is still refused."""
    import logging

    from bertscope.train import finetune

    from bertscope.files import FolderLock

    out = tmp_path / "run"
    out.mkdir()
    running = FolderLock(out / ".lock", lambda pid: AssertionError("taken"))  # a run before its first checkpoint
    try:
        with caplog.at_level(logging.WARNING, logger="bertscope"), pytest.raises(InputError, match="is in use by"):
            finetune(small(rows_file, tiny), out, resume=True)
        assert not caplog.records  # not "starting a new run there", then "in use"
    finally:
        running.close()
    (out / ".lock").write_text("")  # what a killed run leaves, unheld
    with caplog.at_level(logging.WARNING, logger="bertscope"):
        result = finetune(small(rows_file, tiny), out, resume=True)
    assert result.resumed_from_step == 0 and (out / "metrics.json").is_file()
    assert any("holds no checkpoint yet" in r.getMessage() and "starting a new run there" in r.getMessage()
               for r in caplog.records)
    fresh = tmp_path / "not-yet"
    assert finetune(small(rows_file, tiny), fresh, resume=True).resumed_from_step == 0
    with pytest.raises(InputError, match="is already complete"):
        finetune(small(rows_file, tiny), out, resume=True)
