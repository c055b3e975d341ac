"""`bertscope doctor`: valid JSON with the machine's CPU flags, every candidate's timing and the
choice; the choice it shows is the one cached on disk and the one `load` then uses."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import torch

import bertscope
from bertscope.cli.app import main
from bertscope.fast.tuning import BASELINE, BUDGET_S, CPU_FLAGS, NOISE_MARGIN


def cpuinfo_flags() -> set[str]:
    """This CPU's flags straight from /proc/cpuinfo (the reference the doctor must agree with)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_doctor_json_is_valid_and_names_flags_timings_and_choice(tmp_path, monkeypatch, capsys, bundled_path):
    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)
    monkeypatch.delenv("BERTSCOPE_HEAP", raising=False)
    assert main(["doctor", "--json", "--precision", "fp32"]) == 0
    res = json.loads(capsys.readouterr().out)  # strict JSON: json.loads refuses anything else
    m = res["machine"]
    have = cpuinfo_flags()
    assert set(m["cpu_flags"]) == {f for f in CPU_FLAGS if f in have}
    assert m["has"]["avx2"] == ("avx2" in have) and m["has"]["avx512"] == ("avx512f" in have)
    assert m["has"]["amx"] == bool({"amx_tile", "amx_bf16", "amx_int8"} & have)
    # the numbers that tell apart CPUs a VM shows under one name, as /proc/cpuinfo gives them
    first = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                 if ":" in line)
    first = {k.strip(): v.strip() for k, v in first.items()}
    # x86 kernels write these four; other CPUs (ARM: "CPU implementer", "CPU part") none of them
    fields = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping"}
    expect = {f: int(first[k]) if first[k].isdigit() else first[k] for k, f in fields.items() if k in first}
    assert m["cpu_id"] == expect
    from bertscope.fast.heap import KEEP_TRIM_BYTES  # the thresholds the models ran under (glibc, as on Linux)
    assert m["heap"]["kept"] is True and m["heap"]["trim_threshold"] == KEEP_TRIM_BYTES
    e = res["precisions"]["fp32"]
    assert e["in_use"] == "fp32"
    c = e["choice"]
    assert c["source"] == "measured" and Path(c["path"]).is_file()
    # the GEMM library is always raced, and its winner is one of the candidates timed
    assert set(c["timings"]["gemm"]) == {"blas", "onednn"} and c["gemm"] in c["timings"]["gemm"]
    assert all(isinstance(t, float) and t > 0 or str(t).startswith("error") for t in c["timings"]["gemm"].values())
    # shown to 4 significant digits (run-to-run noise is larger); the cache file keeps them whole
    measured = [t for step in ("timings", "ratios") for t in c[step]["gemm"].values() if isinstance(t, float)]
    assert measured and all(t == float(f"{t:.4g}") for t in measured), measured
    assert isinstance(c["gemm_gflops"], float) and c["gemm_gflops"] == float(f"{c['gemm_gflops']:.4g}")
    assert c["measured_at"] == json.loads(Path(c["path"]).read_text())["measured_at"]  # a time stays whole
    # the batch size and slack races do not fit the default 2 s budget for this model at the
    # tests' steady 50 GFLOP/s (conftest): about 6 and 2 s. They keep the plain path's values,
    # and the report says why
    assert c["budget_s"] == BUDGET_S
    assert set(c["not_raced"]) == {"batch_tokens", "slack"} and not {"batch_tokens", "slack"} & set(c["timings"])
    assert (c["batch_tokens"], c["slack"]) == (BASELINE["batch_tokens"], BASELINE["slack"])
    # the plain path wins unless another candidate beat it by more than the noise margin
    # (judged as the choice judges: the median of paired per-round ratios, not the medians' ratio)
    if c["gemm"] == "onednn":
        assert c["ratios"]["gemm"]["onednn"] < 1 - NOISE_MARGIN
    else:
        assert c["ratios"]["gemm"].get("onednn", 1.0) >= 1 - NOISE_MARGIN
    from bertscope.fast.tuning import usable_cpus

    assert m["usable_cpus"] == usable_cpus() and 1 <= m["usable_cpus"] <= m["logical_cpus"]
    # the human-readable form reads the same choice from the cache, and load() applies it; where
    # fewer CPUs are usable than the host has (a container's quota: stand-ins here), it says so
    import bertscope.bench.doctor as doctor_module

    with monkeypatch.context() as limited:
        limited.setattr(doctor_module, "usable_cpus", lambda: 1)
        # the host's count as doctor reads it (the cache key keeps the real one: still cached)
        limited.setattr(doctor_module, "os", SimpleNamespace(cpu_count=lambda: 8))
        assert main(["doctor", "--precision", "fp32"]) == 0
    text = capsys.readouterr().out
    assert ", 8 logical CPUs (1 usable here); torch " in text.splitlines()[0], text.splitlines()[0]
    assert "choice (cache)" in text and "flags:" in text and f"{c['gemm']} GEMMs" in text
    if "cpu family" in first:  # the first line names them where the CPU has them
        assert f"(family {m['cpu_id']['family']}, model {m['cpu_id']['model']}" in text.splitlines()[0]
    assert "batch_tokens  not raced: about" in text and "GFLOP/s, over its 0.5 s share of the 2 s budget" in text
    b = bertscope.load(bundled_path)
    b.embed(["a text"])
    assert b.fast.choice.source == "cache" and b.fast.gemm.prefer == c["gemm"]
    assert b.fast.choice.batch_tokens == c["batch_tokens"]


def test_doctor_int8_reports_its_calibration(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["doctor", "--json", "--precision", "int8"]) == 0
    e = json.loads(capsys.readouterr().out)["precisions"]["int8"]
    # int8 where its calibrated plan measures faster than fp32 here; else fp32, and the note and
    # a warning say so (a CPU without VNNI may measure either way, so both are right answers)
    assert e["in_use"] == "int8" or (e["in_use"] == "fp32" and e["note"].startswith("int8 is off: measured")
                                     and any("int8 is off" in w for w in e["warnings"])), e["note"]
    cal = e["int8_calibration"]
    assert len(cal["errors"]) == 6 * 4  # every linear of the bundled model's 6 layers was measured
    # the stated rule: every linear whose error is over the limit stays fp32
    over = {k for k, v in cal["errors"].items() if v > cal["error_limit"]}
    assert over <= set(cal["keep_fp32"])
    # and each int8 linear's fp32 input channels: the FP32_CHANNELS largest |x| of its input
    from bertscope.fast.quant import FP32_CHANNELS

    assert set(cal["fp32_channels"]) == set(cal["errors"])
    assert all(len(c) == FP32_CHANNELS and c == sorted(c) for c in cal["fp32_channels"].values())
    assert e["choice"]["int8_kernel"] in e["choice"]["timings"]["int8_kernel"]


def _keys(obj, skip=("timings", "ratios", "errors", "fp32_channels", "int8_speedup", "not_raced", "key",
                                 "has", "kernels_available", "isa_limits")) -> set[str]:
    """Every field name of a doctor --json object (the entries of maps keyed by candidate or
    linear name, and the cache key's own fields, are values, not fields)."""
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj)) if obj else set()
    if not isinstance(obj, dict):
        return set()
    return set(obj) | set().union(*(_keys(v) for k, v in obj.items() if k not in skip and k != "precisions"),
                                   *(_keys(v) for v in obj.get("precisions", {}).values()))


def test_doctor_help_names_every_field_of_its_json(tmp_path, monkeypatch, capsys):
    """The JSON had no documentation: which numbers are seconds, which ratios are below 1 when
    faster. --help describes it; a field added to the JSON and not to the help fails here."""
    import re

    from bertscope.cli.doctor import HELP

    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["doctor", "--json", "--precision", "int8"]) == 0
    fields = _keys(json.loads(capsys.readouterr().out))
    assert {"in_use", "choice", "int8_calibration", "gemm_gflops", "cosine_floor", "heap", "model"} <= fields
    unnamed = sorted(f for f in fields if not re.search(rf"\b{re.escape(f)}\b", HELP))
    assert not unnamed, " ".join(unnamed)


def test_doctor_budget_reaches_the_kernel_choice(tmp_path, monkeypatch, capsys):
    """--budget measures the choice again within that many seconds (a bad value is refused by the
    parser); the default budget is BUDGET_S."""
    from bertscope.fast import tuning

    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("BERTSCOPE_TUNE_BUDGET", "")  # restored after the test: doctor sets it for its process
    budgets = []

    def measured(model, **kw):
        budgets.append(tuning.tune_budget() if kw.get("budget_s") is None else kw["budget_s"])
        return tuning.KernelChoice(key=tuning.choice_key(model.config, torch.float32, kw.get("precision", "fp32")),
                                   source="measured", budget_s=budgets[-1], measured_at=time.time())

    monkeypatch.setattr(tuning, "measure_choice", measured)
    assert main(["doctor", "--json", "--precision", "fp32"]) == 0
    assert main(["doctor", "--json", "--precision", "fp32"]) == 0  # cached: nothing measured
    assert main(["doctor", "--json", "--precision", "fp32", "--budget", "7.5"]) == 0  # measures again
    assert budgets == [BUDGET_S, 7.5]
    out, reports = capsys.readouterr().out, []
    while out.strip():  # two JSON documents, one per run
        doc, end = json.JSONDecoder().raw_decode(out.lstrip())
        reports.append(doc)
        out = out.lstrip()[end:]
    choices = [r["precisions"]["fp32"]["choice"] for r in reports]
    assert [(c["source"], c["budget_s"]) for c in choices] == [("measured", BUDGET_S), ("cache", BUDGET_S),
                                                               ("measured", 7.5)]
    for bad in ("0", "-2", "soon"):
        try:
            main(["doctor", "--budget", bad])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"--budget {bad} was accepted")
        assert "--budget: must be a finite number of seconds above 0" in capsys.readouterr().err


def test_doctor_retune_on_a_busy_machine_keeps_the_last_cached_choice(tmp_path, monkeypatch, capsys, caplog):
    """--retune measures again; measured while others took half the CPUs, the new choice is shown
    (with why it is not cached) and the last cached one stays for the next run."""
    from bertscope.fast import tuning

    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)
    monkeypatch.delenv("BERTSCOPE_BUSY_SHARE", raising=False)  # conftest's, for the CLI's subprocesses

    def measured(model, **kw):
        return tuning.KernelChoice(key=tuning.choice_key(model.config, torch.float32, kw.get("precision", "fp32")),
                                   source="measured", measured_at=time.time())

    monkeypatch.setattr(tuning, "measure_choice", measured)
    assert main(["doctor", "--precision", "fp32"]) == 0  # quiet (conftest: no reading): cached
    capsys.readouterr()
    (path,) = (tmp_path / "cache" / "kernel-choice").glob("*.json")
    first = json.loads(path.read_text())
    k = [0]

    def busy():  # others take half of every 200 ticks
        k[0] += 1
        return (k[0] * 150, k[0] * 200, k[0] * 50, 1)

    monkeypatch.setattr(tuning, "cpu_ticks", busy)
    assert main(["doctor", "--precision", "fp32", "--retune"]) == 0
    text = capsys.readouterr().out
    assert "choice (measured" in text and "measured on a busy machine: other processes took 50%" in text
    assert json.loads(path.read_text())["measured_at"] == first["measured_at"]  # the last one stays
    monkeypatch.setattr(tuning, "cpu_ticks", lambda: None)
    assert main(["doctor", "--precision", "fp32"]) == 0
    assert "choice (cache)" in capsys.readouterr().out
    # every precision measured while busy: stdout says so for each, stderr warns once (it said it 3x)
    monkeypatch.setattr(tuning, "cpu_ticks", busy)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertscope.fast.tuning"):
        assert main(["doctor", "--precision", "all", "--retune"]) == 0
    out = capsys.readouterr().out
    assert out.count("measured on a busy machine") >= 2, out
    warned = [r for r in caplog.records if r.getMessage().startswith("the kernel choice holds for this run only")]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def test_doctor_json_keeps_the_warnings_it_logged(tmp_path, monkeypatch, capsys, caplog):
    """A choice that could not be cached was said on stderr only: a script reading --json saw
    nothing wrong. The JSON now has the logged warning too, and the log still gets it."""
    from bertscope.fast import tuning

    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernel-choice").write_text("a file where the cache folder goes")

    def measured(model, **kw):
        return tuning.KernelChoice(key=tuning.choice_key(model.config, torch.float32, kw.get("precision", "fp32")),
                                   source="measured", measured_at=time.time())

    monkeypatch.setattr(tuning, "measure_choice", measured)
    with caplog.at_level(logging.WARNING, logger="bertscope"):
        assert main(["doctor", "--json", "--precision", "fp32"]) == 0
    res = json.loads(capsys.readouterr().out)
    said = [w for w in res["precisions"]["fp32"]["warnings"] if "could not cache the kernel choice" in w]
    assert len(said) == 1 and "set BERTSCOPE_CACHE_DIR to a writable folder" in said[0]
    assert [r.getMessage() for r in caplog.records if "could not cache" in r.getMessage()] == said


def test_doctor_says_which_candidate_rows_time_one_step_not_a_layer():
    """The 8-bit conversion's row showed seconds a fifth of the int8 kernel's, under a heading
    that said every row timed one layer: it times the conversions alone."""
    from bertscope.cli.doctor import _timings

    choice = {"gemm": "onednn", "batch_tokens": 2048, "slack": 0.0, "int8_kernel": "onednn", "int8_cast": "direct",
              "timings": {"gemm": {"blas": 0.30, "onednn": 0.21}, "int8_cast": {"direct": 0.10, "int32": 0.14},
                          "int8_kernel": {"onednn": 0.52, "int_mm": 0.63}},
              "ratios": {"int8_cast": {"direct": 1.0, "int32": 1.5}}}
    rows = {line.split()[0]: line for line in _timings(choice)}
    assert rows["int8_cast"].endswith("[the 8-bit conversions of one layer's inputs, alone]")
    assert "direct 0.1000 (1.00) *" in rows["int8_cast"] and "int32 0.1400 (1.50)" in rows["int8_cast"]
    assert "[" not in rows["gemm"] and "[" not in rows["int8_kernel"]  # these time a whole layer


def test_doctor_marks_the_precision_bf16_runs_in():
    """The bf16 row carried no "*" though its legend says "* = chosen": the winner is the
    precision the model runs in."""
    from bertscope.cli.doctor import _timings

    choice = {"gemm": "onednn", "batch_tokens": 2048, "slack": 0.0, "int8_kernel": "onednn",
              "timings": {"bf16": {"fp32": 0.0211, "bf16": 0.0140}}, "ratios": {"bf16": {"fp32": 1.0, "bf16": 0.67}}}
    (on,) = _timings(choice, "bf16")
    (off,) = _timings(choice, "fp32")  # bf16 asked for, running fp32 (no CPU support, or not faster)
    assert on.split()[-1] == "*" and "fp32 0.0211 (1.00)   bf16" in on
    assert "fp32 0.0211 (1.00) *" in off and not off.endswith("*")


def test_doctor_retune_keeps_the_cached_choice_until_the_new_one_replaces_it(tmp_path, monkeypatch, capsys):
    """--retune deleted the cached choice before measuring: Ctrl-C lost it, and another process
    loading a model meanwhile found none and measured too."""
    from bertscope.fast import tuning

    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)
    seen: list[bool] = []

    def measured(model, **kw):
        seen.append(any((tmp_path / "cache" / "kernel-choice").glob("*.json")))  # still there while measuring?
        return tuning.KernelChoice(key=tuning.choice_key(model.config, torch.float32, kw.get("precision", "fp32")),
                                   source="measured", measured_at=time.time())

    monkeypatch.setattr(tuning, "measure_choice", measured)
    assert main(["doctor", "--precision", "fp32"]) == 0
    (path,) = (tmp_path / "cache" / "kernel-choice").glob("*.json")
    first = path.read_text()

    def stopped(model, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(tuning, "measure_choice", stopped)
    assert main(["doctor", "--precision", "fp32", "--retune"]) == 130
    assert path.read_text() == first  # Ctrl-C while measuring: the last choice stays
    monkeypatch.setattr(tuning, "measure_choice", measured)
    assert main(["doctor", "--precision", "fp32", "--retune"]) == 0
    assert seen == [False, True]  # the second measurement ran with the cached file in place
    assert json.loads(path.read_text())["measured_at"] > json.loads(first)["measured_at"]  # and was replaced
    capsys.readouterr()
