"""`embed --resume` continues a job in the precision it began with, whatever speed verdict is
measured on the resume (int8 and bf16 stay on only where they measure faster than fp32, and a
verdict measured on a busy machine is not cached, so a fresh one can differ)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bertscope.bert as facade
from bertscope.cli.app import main
from bertscope.fast.embedjob import JOB_FILE, RUNS_FILE, JobOptions, read_embeddings, run_embed_job
from test_embedjob_durable import _StopAfter  # interrupts a job after n rows

TEXTS = [f"line {i}: " + "a few more words " * (i % 5) for i in range(12)]


def _interrupted_job(tmp_path: Path, bert, precision: str, asked: str | None = "") -> tuple[Path, Path]:
    """An fp32 job stopped after its first shard of 6, recorded as begun in ``precision``, its
    first run as asked for ``asked`` (None: not recorded, as in older jobs; "": as it ran)."""
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_embed_job(bert, inp, out, JobOptions(shard_rows=6), progress=_StopAfter(6))
    job = json.loads((out / JOB_FILE).read_text())
    assert job["precision"] == "fp32"
    job["precision"] = precision
    (out / JOB_FILE).write_text(json.dumps(job))
    runs = json.loads((out / RUNS_FILE).read_text())
    assert runs["runs"][0]["precision_asked"] == "fp32"  # the fp32 model's
    if asked is None:
        del runs["runs"][0]["precision_asked"]
    else:
        runs["runs"][0]["precision_asked"] = asked or precision
    (out / RUNS_FILE).write_text(json.dumps(runs))
    return inp, out


def _spy_loads(monkeypatch) -> list[tuple[dict, object]]:
    """Each bertscope.load the CLI makes: its keyword arguments and the model it gave."""
    loads, real = [], facade.load

    def load(*a, **k):
        b = real(*a, **k)
        loads.append((k, b))
        return b
    monkeypatch.setattr(facade, "load", load)
    return loads


def _slowed(monkeypatch, cls, seconds: float) -> None:
    """Every call of ``cls`` (a linear) takes ``seconds`` longer: a CPU where it is slow."""
    import time

    inner = cls.__call__

    def call(self, x):
        time.sleep(seconds)
        return inner(self, x)
    monkeypatch.setattr(cls, "__call__", call)


def test_a_job_begun_in_fp32_with_int8_off_resumes_in_fp32_and_says_so(tmp_path, bert, capsys,
                                                                        monkeypatch):
    inp, out = _interrupted_job(tmp_path, bert, "fp32", asked="int8")
    loads = _spy_loads(monkeypatch)
    code = main(["embed", str(inp), "--out", str(out), "--shard-rows", "6", "--precision", "int8",
                 "--resume", "--quiet"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "(1 already done)" in cap.out
    note = "bertscope: note: the job began in fp32 (int8 was off then); continuing in fp32\n"
    assert cap.err.count(note) == 1 and "precision changed" not in cap.err
    [(kwargs, model)] = loads
    assert kwargs["precision"] == "fp32" and not kwargs["keep_precision"] and not kwargs["compile"]
    assert model.precision == "fp32"
    assert json.loads((out / JOB_FILE).read_text())["precision"] == "fp32"
    assert np.abs(read_embeddings(out)[0] - bert.embed(TEXTS)).max() < 1e-5


def test_a_job_begun_in_int8_resumes_in_int8_where_int8_now_measures_slower(tmp_path, bert, capsys,
                                                                            monkeypatch):
    from bertscope.fast.quant import Int8Linear

    inp, out = _interrupted_job(tmp_path, bert, "int8")
    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))  # no verdict cached
    monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)
    _slowed(monkeypatch, Int8Linear, 0.02)  # int8 GEMMs slower than fp32 ones, on any CPU
    loads = _spy_loads(monkeypatch)
    code = main(["embed", str(inp), "--out", str(out), "--shard-rows", "6", "--precision", "int8",
                 "--resume", "--quiet"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "(1 already done)" in cap.out and "int8 is off" not in cap.err and "note:" not in cap.err
    [(kwargs, model)] = loads
    assert kwargs["precision"] == "int8" and kwargs["keep_precision"] is True
    assert model.precision == "int8" and model.fast.gemm.precision == "int8"
    assert json.loads((out / JOB_FILE).read_text())["precision"] == "int8"


@pytest.mark.parametrize("began, asked", [("int8", "fp32"), ("int8", "bf16"), ("bf16", "int8")])
def test_another_precision_than_the_job_began_with_is_still_refused(tmp_path, bert, capsys, monkeypatch,
                                                                    began, asked):
    inp, out = _interrupted_job(tmp_path, bert, began)
    loads = _spy_loads(monkeypatch)
    code = main(["embed", str(inp), "--out", str(out), "--shard-rows", "6", "--resume", "--precision", asked,
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot resume: precision changed: the job began with {began}, this run is {asked}" in err
    assert "note:" not in err and loads == []  # refused before any model is loaded


def test_resume_without_precision_of_a_job_whose_int8_was_off_continues_in_fp32(tmp_path, bert, capsys,
                                                                                monkeypatch):
    """The job runs in fp32 (int8 was off when it began): its default is fp32, not int8, so no
    int8 model is loaded and measured, and the Ray engine is not refused on int8's account."""
    inp, out = _interrupted_job(tmp_path, bert, "fp32", asked="int8")
    loads = _spy_loads(monkeypatch)
    code = main(["embed", str(inp), "--out", str(out), "--resume", "--quiet"])
    cap = capsys.readouterr()
    assert code == 0 and "(1 already done)" in cap.out and "note:" not in cap.err, cap.err
    [(kwargs, model)] = loads
    assert kwargs.get("precision", "fp32") == "fp32"


def test_resume_without_precision_takes_the_jobs(tmp_path, bert, capsys, monkeypatch):
    """--resume need not repeat --precision (it was refused as fp32, the flag's default)."""
    inp, out = _interrupted_job(tmp_path, bert, "int8")
    loads = _spy_loads(monkeypatch)
    code = main(["embed", str(inp), "--out", str(out), "--resume", "--quiet"])
    cap = capsys.readouterr()
    assert code == 0 and "(1 already done)" in cap.out, cap.err
    [(kwargs, model)] = loads
    assert kwargs["precision"] == "int8" and kwargs["keep_precision"] is True


def test_a_job_asked_for_in_fp32_is_refused_another_precision(tmp_path, bert, capsys, monkeypatch):
    """Before, an fp32 job resumed with --precision int8 continued in fp32 "as int8 was off then",
    which was never asked; then the int8 model was loaded and measured (half a minute on a busy
    machine), and refused only if int8 measured fast. Now it is refused before any load."""
    inp, out = _interrupted_job(tmp_path, bert, "fp32")
    loads = _spy_loads(monkeypatch)
    code = main(["embed", str(inp), "--out", str(out), "--shard-rows", "6", "--precision", "int8",
                 "--keep-precision", "--resume", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot resume: precision changed: the job began with fp32, this run is int8" in err
    assert "note:" not in err and loads == []


def test_an_older_fp32_job_that_does_not_say_what_was_asked_resumes_in_fp32(tmp_path, bert, capsys):
    inp, out = _interrupted_job(tmp_path, bert, "fp32", asked=None)
    code = main(["embed", str(inp), "--out", str(out), "--shard-rows", "6", "--precision", "int8",
                 "--resume", "--quiet"])
    cap = capsys.readouterr()
    assert code == 0 and "(1 already done)" in cap.out, cap.err
    assert "bertscope: note: the job began in fp32; continuing in fp32\n" in cap.err


def test_flags_that_need_another_precision_name_the_jobs(tmp_path, bert, capsys):
    """--compile or --keep-precision on a job that runs in fp32 (int8 was off when it began):
    the refusal says the precision is the job's, as the user gave no --precision."""
    inp, out = _interrupted_job(tmp_path, bert, "fp32", asked="int8")
    for flag, fragment in (("--compile", "--compile applies to --precision int8 only (the job being resumed "
                                         "runs in fp32)"),
                           ("--keep-precision", "--keep-precision applies to --precision int8 or bf16 only "
                                                "(the job being resumed runs in fp32)")):
        assert main(["embed", str(inp), "--out", str(out), "--resume", flag, "--quiet"]) == 2
        assert fragment in capsys.readouterr().err
    assert main(["embed", str(inp), "--out", str(tmp_path / "none"), "--resume", "--compile", "--quiet"]) == 2
    assert "(the job" not in capsys.readouterr().err  # no job there: nothing to say about one
