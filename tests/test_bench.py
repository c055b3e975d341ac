"""Smoke test of `bertscope bench`: JSON keys present and the outputs-agree checks run (no timings)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bertscope.cli.app import main


def test_bench_quick_json(tmp_path, capsys, monkeypatch, caplog):
    monkeypatch.delenv("BERTSCOPE_HEAP", raising=False)  # the default: the heap kept (glibc, as on Linux)
    monkeypatch.delenv("BERTSCOPE_BUSY_SHARE", raising=False)
    # another job took 60% of the CPUs during the run (as /proc/stat would say): the tables say so
    import bertscope.bench.run as bench_run

    seen = []
    monkeypatch.setattr(bench_run, "others_share", lambda a, b, threads=None: seen.append((a, b)) or 0.6)
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"a first text\n\xff\xfe not utf-8\nthe third line\n\nlast one\n")
    code = main(["bench", "--quick", "--json", "--corpus", str(corpus), "--plot", str(tmp_path / "s13.png"),
                 "--progress"])
    cap = capsys.readouterr()
    out, err = cap.out, cap.err
    assert code == 0
    # each step named as it begins (the run was silent for minutes), in order
    steps = [line for line in err.splitlines() if line.startswith("bench: ")]
    begins = ["bench: the fp32 matmul peak", "bench: equal_T32: 8 texts", "bench: equal_T32: comparing",
              "bench: mixed: 3 texts", "bench: mixed: comparing", "bench: S13: attention alone"]
    assert len(steps) == len(begins) and all(s.startswith(b) for s, b in zip(steps, begins)), steps
    assert steps[4].endswith("then timing 1 round(s)")
    r = json.loads(out)
    assert r["scaling"]["machine"].endswith(f"{r['machine']['torch_threads']} thread(s)")  # the plot's caption
    assert {"machine", "matmul_peak_gflops", "workloads", "scaling"} <= set(r)
    from bertscope.fast.heap import KEEP_TRIM_BYTES  # the allocator's thresholds every system ran under
    assert r["machine"]["heap"]["kept"] is True and r["machine"]["heap"]["trim_threshold"] == KEEP_TRIM_BYTES
    for name in ("equal_T128", "mixed"):
        w = r["workloads"][name]
        assert {"real_tokens", "useful_gflop", "systems", "max_abs_diff_vs_bertscope", "skipped",
                "quality_vs_fp32", "bertscope_setup"} <= set(w)
        assert "bertscope" in w["systems"] and w["systems"]["bertscope"]["tokens_per_s"] > 0
        # every competitor that ran was compared with bertscope; the fp32 ones agree within 1e-5
        assert set(w["max_abs_diff_vs_bertscope"]) == set(w["systems"]) - {"bertscope"}
        assert set(w["bertscope_speedup_paired"]) == set(w["systems"]) - {"bertscope"}
        reduced = {"bertscope int8", "bertscope bf16", "onnxruntime int8"}
        # bf16 only where the CPU lacks it; the compiled int8 (slow to build) never in --quick
        assert set(w["skipped"]) <= {"bertscope bf16", "bertscope int8 compiled"}
        assert w["skipped"]["bertscope int8 compiled"] == "left out of --quick runs (slow to build)"
        assert set(w["systems"]) | set(w["skipped"]) == {
            "bertscope", "sentence-transformers", "transformers", "onnxruntime", "bertscope int8 compiled"} | reduced
        for name, diff in w["max_abs_diff_vs_bertscope"].items():
            if name not in reduced:
                assert diff < 1e-5
        # reduced precision is held to the quality contract's measures instead
        assert set(w["quality_vs_fp32"]) == set(w["systems"]) & reduced
        for q in w["quality_vs_fp32"].values():
            assert 0.5 < q["cosine_min"] <= q["cosine_mean"] <= 1 + 1e-6
            if q["texts"] <= 11:  # every other text is a neighbour: a term that cannot fail is not given
                assert q["top10_overlap"] is None
            else:
                assert 0 <= q["top10_overlap"] <= 1
        verdict = w["int8_contract"]
        assert set(verdict) == {"cosine_mean", "cosine_min", "top10_overlap",
                                "speedup_vs_sentence_transformers", "speedup_vs_onnxruntime_int8"}
        few = w["quality_vs_fp32"]["bertscope int8"]["texts"] <= 11
        assert all(v["measured"] is not None for k, v in verdict.items() if not (few and k == "top10_overlap"))
        assert w["int8_contracts"] == {"bertscope int8": verdict}  # one verdict per bertscope int8 row
        # what each bertscope system measured and decided is recorded
        setup = w["bertscope_setup"]
        assert setup["bertscope"]["kernel_choice"]["gemm"] in ("blas", "onednn")
        assert setup["bertscope int8"]["precision"] == "int8"
        assert "keep_fp32" in setup["bertscope int8"]["int8_calibration"]
    # --quick's equal-length texts are 32 tokens: the label says so (the key stays for consumers)
    eq = r["workloads"]["equal_T128"]
    assert eq["length_range"] == [32, 32] and eq["label"] == "equal_T32"
    # the corpus: the undecodable line is skipped with a warning naming it; the rest are used
    assert r["workloads"]["mixed"]["texts"] == 3
    assert f"bertscope: warning: {corpus}: line 2 is not UTF-8 text; skipped" in err
    assert "Loading weights" not in err and "it/s" not in err  # no transformers progress bars
    # a competitor skipped in both workloads is noted once (it was once per workload, plus warnings)
    assert err.count("bertscope: note: skipped bertscope int8 compiled: left out of --quick runs") == 1
    # ONNX Runtime's advice, logged on the root logger while quantizing, is not bertscope's warning
    assert not [r for r in caplog.records if "pre-processing before quantization" in r.getMessage()]
    s = r["scaling"]
    assert len(s["attention"]["time_s"]) == len(s["lengths"]) == len(s["model"]["time_s"])
    assert "time_exponent" in s["attention"] and "time_exponent" in s["model"]
    for kind in ("attention", "model"):  # no exponent fitted on (near) zero memory values
        mem = s[kind].get("peak_mib")
        if mem and min(mem) <= 0.05:
            assert s[kind]["memory_exponent"] is None
    # what the command prints without --json: an exponent only where the times grew measurably
    from bertscope.bench.report import write_markdown

    md = write_markdown(r)
    assert "T^-" not in md
    assert len(seen) == 1 and r["others_share"] == 0.6 and r["warnings"][0].startswith("other processes took 60%")
    assert "**Warning**: other processes took 60% of the CPUs" in md, md[:600]
    assert "took 60%" in err, err
    assert "best of 256³; torch.mm" in md  # what --quick measured, not the full run's shapes
    assert "| its time / bertscope fp32's |" in md  # the column says which way its ratio reads
    from bertscope.fast.tuning import cpu_id, describe_cpu

    ident = describe_cpu(cpu_id())  # the CPU's family, model, stepping: beside the name, in the JSON too
    assert r["machine"]["cpu_id"] == cpu_id()
    # on x86 (CI) the family numbers stand before the flags; a CPU without them shows the flags alone
    assert f"Machine: {r['machine']['cpu']} ({ident + '; ' if ident else ''}" in md
    if Path("/proc/cpuinfo").is_file() and "cpu family" in Path("/proc/cpuinfo").read_text():
        assert ident.startswith("family ")
    # --quick's tiny model: every race fits the 2 s budget at the tests' steady GEMM rate (conftest)
    choice = r["workloads"]["mixed"]["bertscope_setup"]["bertscope"]["kernel_choice"]
    assert choice["not_raced"] == {} and {"gemm", "batch_tokens", "slack"} <= set(choice["timings"])
    assert "- bertscope: kernel choice (" in md and "not raced" not in md
    for kind in ("attention", "model"):
        e = s[kind]
        if e["time_exponent"] is None:
            assert f"- {kind}: time exponent n/a" in md and e["time_s"][-1] < 1.5 * e["time_s"][0]
        else:
            assert e["time_exponent"] >= 0 and f"- {kind}: time grows as T^{e['time_exponent']:.2f}" in md
    assert (tmp_path / "s13.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert s["plot"] == str(tmp_path / "s13.png")
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


def test_memory_exponent_is_na_for_tiny_values():
    from bertscope.bench.scaling import memory_fit

    e: dict = {}
    memory_fit(e, [64, 128, 256], [0.0, 0.0, 0.1])
    assert e["memory_exponent"] is None and "n/a" in e["memory_exponent_note"]
    e = {"ratio_512_vs_192": 1.0}
    memory_fit(e, [192, 384, 512], [1.0, 4.0, 16 / 9 * 4])
    assert abs(e["memory_exponent"] - 2.0) < 0.05 and abs(e["memory_ratio_512_vs_192"] - 64 / 9) < 1e-9


def test_time_exponent_only_when_the_time_grows():
    from bertscope.bench.scaling import time_fit

    e: dict = {}
    time_fit(e, [16, 32, 64], [1.0e-4, 0.9e-4, 1.1e-4])  # overhead only: T^-0.0something means nothing
    assert e["time_exponent"] is None and "n/a" in e["time_exponent_note"]
    e = {}
    time_fit(e, [16, 32, 64], [3e-4, 2e-4, 1e-4])  # shrinking times: noise, never a negative exponent
    assert e["time_exponent"] is None
    e = {}
    time_fit(e, [64, 128, 256], [1.0, 4.0, 16.0])
    assert abs(e["time_exponent"] - 2.0) < 1e-9


def test_markdown_labels_the_true_length_and_na_exponent():
    from bertscope.bench.report import write_markdown

    r = _fake_result()
    r["workloads"] = {"equal_T128": {"label": "equal_T32", "texts": 1, "real_tokens": 32, "length_range": [32, 32],
                                     "model": "m", "systems": {}, "bertscope_speedup": {},
                                     "max_abs_diff_vs_bertscope": {}, "bertscope_fraction_of_matmul_peak": 0.1,
                                     "skipped": {}}}
    md = write_markdown(r)
    assert "### equal_T32:" in md and "equal_T128" not in md
    assert "peak memory exponent n/a" in md and "T^-" not in md
    r["scaling"]["model"].update(time_exponent=None, time_exponent_note="n/a: too little growth")
    md = write_markdown(r)
    assert "- model: time exponent n/a (n/a: too little growth)" in md and "T^" not in md.split("- model:")[1]


def test_markdown_says_when_the_libraries_were_limited_to_a_smaller_instruction_set():
    from bertscope.bench.report import write_markdown

    r = _fake_result()
    r["machine"].update(cpu_flags=["avx2", "avx512f"], isa_limits={"aten": "AVX512"})
    assert "Machine: x (avx2, avx512f), " in write_markdown(r)
    r["machine"]["isa_limits"] = {"aten": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert "Machine: x (avx2, avx512f; limited by ONEDNN_MAX_CPU_ISA=AVX2, ATen dispatching AVX2), " in write_markdown(r)
    # every benchmark script names its machine the same way (bench.machine.cpu_label)
    from bertscope.bench.machine import cpu_label

    r["machine"]["cpu_id"] = {"vendor": "AuthenticAMD", "family": 26, "model": 2, "stepping": 1}
    assert cpu_label(r["machine"]) == ("x (family 26, model 2, stepping 1; avx2, avx512f; "
                                       "limited by ONEDNN_MAX_CPU_ISA=AVX2, ATen dispatching AVX2)")
    assert f"Machine: {cpu_label(r['machine'])}, " in write_markdown(r)
    assert "C allocator" not in write_markdown(r)  # results from before the heap was recorded
    r["machine"]["heap"] = {"kept": False, "detail": "left to glibc's defaults (BERTSCOPE_HEAP=system)"}
    assert "\nC allocator, for every system in this process: left to glibc's defaults (BERTSCOPE_HEAP=system).\n" \
        in write_markdown(r)


def test_paired_speedup_follows_the_rounds_not_the_drift():
    """bertscope is 2x faster than the other system in every round, but the machine slowed 3x
    between the two runs of round 3: the ratio of the medians says 6x, the paired speed-up 2x."""
    from bertscope.bench.timing import paired_speedups

    result = {"systems": {"bertscope": {"times_s": [1.0, 1.0, 1.0, 3.0, 3.0]},
                          "other": {"times_s": [2.0, 2.0, 6.0, 6.0, 6.0]}}}
    assert paired_speedups(result, "bertscope") == {"other": 2.0}
    assert paired_speedups(result, "other") == {"bertscope": 0.5}


def test_the_s13_plot_names_its_model_and_machine(monkeypatch):
    """The figure said "time against length" and nothing of where: read away from its table (the
    docs' s13_cpu_*.png), only its file name told the machine."""
    import matplotlib

    from bertscope.bench.report import render_scaling_plot

    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")  # text as text, to be found
    r = {"lengths": [16, 32], "attention": {"time_s": [0.001, 0.002], "time_exponent": 1.0, "peak_mib": [1, 2]},
         "model": {"time_s": [0.01, 0.02]}, "machine": "AMD EPYC (avx2, fma), 2 thread(s)",
         "config": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12}}
    assert b"hidden 384, 6 layers, 12 heads; AMD EPYC (avx2, fma), 2 thread(s)" in render_scaling_plot(r, "svg")


def test_top10_overlap_is_not_given_where_it_cannot_fail():
    """With 11 texts or fewer every other text is among the 10 neighbours: the overlap was 1.0
    for any embeddings at all, and the contract's term "held"."""
    import numpy as np

    from bertscope.bench.quality import contract_verdict, embedding_agreement
    from bertscope.bench.report import quality_lines

    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    ref = unit(rng.normal(size=(11, 8)))
    a = embedding_agreement(ref, unit(rng.normal(size=(11, 8))))  # unrelated embeddings
    assert a["top10_overlap"] is None and a["texts"] == 11
    assert contract_verdict(a, {})["top10_overlap"] == {"required": 0.9, "measured": None, "holds": None}
    assert "n/a (11 texts: each has every other as a neighbour; needs 12 or more)" in "\n".join(
        quality_lines({"quality_vs_fp32": {"bertscope int8": a}}))
    ref = unit(rng.normal(size=(40, 8)))
    assert embedding_agreement(ref, unit(rng.normal(size=(40, 8))))["top10_overlap"] < 0.6  # measured, and low
    assert embedding_agreement(ref, ref)["top10_overlap"] == 1.0


def test_markdown_gives_each_int8_row_its_contract_verdict():
    from bertscope.bench.report import quality_lines

    def verdict(speedup):
        return {"cosine_mean": {"required": 0.99, "measured": 0.997, "holds": True},
                "speedup_vs_sentence_transformers": {"required": 2.0, "measured": speedup, "holds": speedup >= 2}}

    q = {"cosine_mean": 0.997, "cosine_min": 0.995, "top10_overlap": 0.91}
    w = {"quality_vs_fp32": {"bertscope int8": q, "bertscope int8 compiled": q},
         "int8_contracts": {"bertscope int8": verdict(1.7), "bertscope int8 compiled": verdict(2.2)}}
    lines = [x for x in quality_lines(w) if x.startswith("int8 quality contract")]
    assert lines == [
        "int8 quality contract, bertscope int8: cosine mean ≥ 0.99: 0.9970 (holds); "
        "speedup vs sentence transformers ≥ 2: 1.70× (FAILS).",
        "int8 quality contract, bertscope int8 compiled: cosine mean ≥ 0.99: 0.9970 (holds); "
        "speedup vs sentence transformers ≥ 2: 2.20× (holds)."]


def _fake_result() -> dict:
    entry = {"time_s": [0.001, 0.002], "time_exponent": 1.0, "peak_mib": [0.0, 0.0],
             "memory_exponent": None, "memory_exponent_note": "n/a"}
    return {"machine": {"cpu": "x", "logical_cpus": 1, "torch_threads": 1, "versions": {}},
            "device": "cpu", "dtype": "float32", "matmul_peak_gflops": 1.0, "workloads": {},
            "scaling": {"lengths": [16, 32], "seed_claim_512_vs_192": 7.1,
                        "config": {"hidden_size": 64, "num_hidden_layers": 2},
                        "attention": dict(entry), "model": dict(entry)}}


def test_setup_lines_say_which_races_the_budget_left_out():
    from bertscope.bench.report import setup_lines

    choice = {"source": "measured", "gemm": "onednn", "batch_tokens": 2048, "slack": 0.0,
              "not_raced": {"batch_tokens": "about 6.4 s ...", "slack": "about 1.8 s ..."}}
    w = {"bertscope_setup": {"bertscope": {"precision": "fp32", "note": "", "kernel_choice": choice}}}
    assert setup_lines(w) == ["", "- bertscope: kernel choice (measured): onednn GEMMs, 2048-token batches, attention "
                                  "slack 0 (batch_tokens and slack not raced within the budget)"]
    choice["not_raced"] = {}
    assert setup_lines(w)[1].endswith("attention slack 0")


def test_bench_bad_plot_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    import bertscope.bench

    def no_run(**kw):
        raise AssertionError("the benchmark ran before --plot was checked")

    monkeypatch.setattr(bertscope.bench, "run_bench", no_run)
    (tmp_path / "dir.png").mkdir()
    for bad, why in ((tmp_path / "nodir" / "s.png", "does not exist"), (tmp_path / "s.jpg", "must end in"),
                     (tmp_path / "dir.png", "is a folder"), (Path("/proc/s13.png"), "--plot")):
        assert main(["bench", "--quick", "--plot", str(bad)]) == 2
        cap = capsys.readouterr()
        lines = cap.err.strip().splitlines()
        assert cap.out == "" and len(lines) == 1 and why in lines[0], cap.err
        assert lines[0].startswith("bertscope: error:")


def test_bench_prints_results_before_a_failed_plot_write(tmp_path, capsys, monkeypatch):
    import bertscope.bench
    import bertscope.files

    monkeypatch.setattr(bertscope.bench, "run_bench", lambda **kw: _fake_result())

    def disk_full(path, data, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bertscope.files, "write_bytes_atomic", disk_full)
    assert main(["bench", "--json", "--plot", str(tmp_path / "s.svg")]) == 2
    cap = capsys.readouterr()
    assert json.loads(cap.out)["scaling"]["lengths"] == [16, 32]  # the results came out whole
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "(no space left on the device)" in lines[0] and "results above are complete" in lines[0]
    assert not (tmp_path / "s.svg").exists()


def test_plot_scaling_is_atomic_and_checks_the_suffix(tmp_path, monkeypatch):
    import os

    from bertscope.bench.report import plot_scaling
    from bertscope.errors import InputError

    r = _fake_result()["scaling"]
    path = tmp_path / "s.pdf"
    path.write_bytes(b"old")
    real_replace = os.replace

    def crash(src, dst):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        plot_scaling(r, path)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["s.pdf"]
    monkeypatch.setattr(os, "replace", real_replace)
    assert plot_scaling(r, path) == path and path.read_bytes()[:4] == b"%PDF"
    with pytest.raises(InputError):
        plot_scaling(r, tmp_path / "s.jpg")


def test_bench_corpus_with_no_text_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\n\n")
    assert main(["bench", "--corpus", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no non-empty UTF-8 lines" in err[0]


def test_competitor_setup_silences_and_restores_progress_bars():
    import transformers.utils.logging as hf_logging

    from bertscope.bench.systems import quiet_hub_progress

    hf_logging.enable_progress_bar()
    env_before = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    with quiet_hub_progress():
        assert not hf_logging.is_progress_bar_enabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert hf_logging.is_progress_bar_enabled()
    assert os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == env_before


def test_bench_skips_a_missing_competitor(monkeypatch, tmp_path, caplog):
    from bertscope.bench.systems import build_systems
    import bertscope

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    bert = bertscope.load()
    systems, skipped = build_systems(bert.path, bert, tmp_path, 1, only=["onnxruntime"])
    assert list(systems) == ["bertscope"]
    assert skipped["onnxruntime"] == ("not installed (onnxruntime; pip install 'bertscope[bench]' installs every "
                                      "competitor)")
    assert not [r for r in caplog.records if r.levelno >= 30]  # the caller reports it, once


def test_library_does_not_import_competitors():
    """Nor does describing the machine, whose JSON names their versions: the versions are the
    modules' own (imported here, in the test's process)."""
    import subprocess

    import platform

    import numpy as np
    import onnxruntime
    import sentence_transformers
    import torch
    import transformers

    code = ("import json, sys, bertscope; b = bertscope.load(); b.embed(['x']); "
            "import bertscope.bench, bertscope.fast.embedjob; from bertscope.bench.machine import machine; "
            "v = machine()['versions']; "
            "bad = [m for m in ('sentence_transformers', 'transformers', 'onnxruntime', 'matplotlib', 'pyarrow') "
            "if m in sys.modules]; print(bad); print(json.dumps(v))")
    import os
    from pathlib import Path
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    bad, versions = r.stdout.strip().splitlines()
    assert bad == "[]"
    assert json.loads(versions) == {"python": platform.python_version(), "torch": torch.__version__,
                                    "transformers": transformers.__version__, "numpy": np.__version__,
                                    "sentence_transformers": sentence_transformers.__version__,
                                    "onnxruntime": onnxruntime.__version__}


def test_bench_bad_preset_is_one_line_error(capsys):
    assert main(["bench", "--preset", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown preset" in err[0]


@pytest.mark.parametrize("args, message", [
    (["--threads", "99999"], "--threads must be 1 to"),  # OpenBLAS could not start its threads: exit 139
    (["--threads", "0"], "--threads must be 1 to"),
    (["--rounds", "0"], "--rounds must be 1 to 1,000"),
    (["--rounds", "99999999999"], "--rounds must be 1 to 1,000"),
    (["--quick", "--rounds", "3"], "--quick runs one round"),  # --rounds was ignored without a word
])
def test_bench_settings_out_of_range_are_refused_before_any_work(capsys, monkeypatch, args, message):
    import bertscope.bench as bench

    monkeypatch.setattr(bench, "run_bench", lambda **kw: pytest.fail("the benchmark started"))
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_failed_memory_worker_says_why(monkeypatch, caplog):
    """A worker that printed nothing was reported as "list index out of range", its exit status
    and its own last words dropped."""
    import subprocess

    from bertscope.bench import scaling
    from bertscope.core.config import BertConfig

    cfg = BertConfig.preset("minilm-l6")
    answers = iter([subprocess.CompletedProcess([], -9, "", "some note\n"),
                    subprocess.CompletedProcess([], 1, "", "Traceback...\nMemoryError: out of memory\n"),
                    subprocess.CompletedProcess([], 0, "a stray line\n", ""),
                    subprocess.CompletedProcess([], 0, "noise\n[1.5, 2.5]\n", "")])
    monkeypatch.setattr(scaling.subprocess, "run", lambda *a, **k: next(answers))
    with caplog.at_level("WARNING", logger=scaling.log.name):
        assert scaling._peak_memory(cfg, "model", [8, 16], 1) is None
        assert scaling._peak_memory(cfg, "model", [8, 16], 1) is None
        assert scaling._peak_memory(cfg, "model", [8, 16], 1) is None
        assert scaling._peak_memory(cfg, "model", [8, 16], 1) == [1.5, 2.5]
    said = [r.getMessage() for r in caplog.records]
    assert said == ["peak-memory worker (model) failed, killed by signal 9: some note; peak memory is left out",
                    "peak-memory worker (model) failed, exit status 1: MemoryError: out of memory; "
                    "peak memory is left out",
                    "peak-memory worker (model) failed, its last line is not a list of numbers: 'a stray line'; "
                    "peak memory is left out"]


def test_timing_counts_each_systems_page_faults_in_its_own_calls():
    """compare_and_time reports minor page faults per call from the OS's own count (getrusage):
    a system that writes 64 MiB of anonymous memory mapped afresh in every call faults, and one
    that rewrites a buffer it already touched faults less."""
    import mmap

    import numpy as np

    from bertscope.bench.timing import compare_and_time

    kept = np.zeros(8 * 2**20, np.uint8)  # touched once, here
    out = np.ones((2, 4), np.float32)

    def reuses(texts):
        kept[:] = 1
        return out

    def fresh(texts):
        block = mmap.mmap(-1, 64 * 2**20)  # anonymous pages: each faults on first write
        block.write(b"\1" * (64 * 2**20))
        block.close()
        return out

    r = compare_and_time({"bertscope": reuses, "fresh": fresh}, ["a", "b"], 2, 1.0, rounds=3)
    faults = {n: s["minor_faults_per_call"] for n, s in r["systems"].items()}
    assert faults["fresh"] > 0
    assert faults["bertscope"] < faults["fresh"]


@pytest.mark.parametrize("args, said", [
    (["--threads", "0"], "--threads must be 1 to"),  # a traceback from torch.set_num_threads
    (["--preset", "foo"], "unknown preset 'foo'"),  # a traceback (ConfigError)
    (["--rounds", "0"], "--rounds must be 1 to 1,000, not 0"),  # a whole run, ending in median([])
])
def test_the_reproduce_script_checks_its_flags_as_bench_does(args, said):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "run_bench.py"
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"run_bench.py: error: {said}") and r.stderr.count("\n") == 1, r.stderr


def test_every_timed_call_waits_for_the_previous_system_to_wind_down(monkeypatch):
    """bertscope's first call of each round came right after ONNX Runtime's, whose threads spin
    on for tens of ms: it was timed slower for it. Each timed call now follows a pause (what
    happens in the rounds, in order, recorded; nothing is timed here)."""
    import numpy as np

    from bertscope.bench import timing

    events = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(("pause", s)))
    out = np.ones((2, 4), np.float32)

    def system(name):
        return lambda texts: events.append(("call", name)) or out

    timing.compare_and_time({"bertscope": system("bertscope"), "ort": system("ort")}, ["a", "b"], 2, 1.0, rounds=2)
    timed = events[2:]  # after the warm-up calls that compare the outputs
    assert events[:2] == [("call", "bertscope"), ("call", "ort")]
    pause = ("pause", timing.SETTLE_S)
    assert timed == [pause, ("call", "bertscope"), pause, ("call", "ort")] * 2
    assert timing.SETTLE_S >= 0.05  # enough for ONNX Runtime's threads (docs/BENCHMARKS.md)


def test_onnx_runtime_profiling_counts_the_fused_ops_and_changes_no_output(tmp_path, bundled_path, caplog):
    """benchmarks/profile_ort.py reads ONNX Runtime's own profile through the bench's adapter:
    the profiled session returns the same embeddings, and its profile names the optimizer's
    fused ops (what the per-op table of docs/BENCHMARKS.md is made of). Where the optimizer
    fuses no attention (onnxruntime 1.23.2, the last for Python 3.10), the adapter says so."""
    import numpy as np
    import onnxruntime

    from bertscope.bench.systems.ort import export_optimized, session_embedder

    with caplog.at_level("WARNING", logger="bertscope.bench.systems.ort"):
        path, tok, cfg = export_optimized(bundled_path, tmp_path / "ort")
    said = [r.getMessage() for r in caplog.records if "fused no attention" in r.getMessage()]
    texts = ["the animal didn't cross the street because it was too tired", "a short one", "x"]
    plain = session_embedder(path, tok, cfg.hidden_size, 128, 1)(texts)
    run = session_embedder(path, tok, cfg.hidden_size, 128, 1, profile_prefix=str(tmp_path / "prof"))
    np.testing.assert_allclose(run(texts), plain, atol=1e-6)
    written = Path(run.session.end_profiling())
    assert written.parent == tmp_path and written.name.startswith("prof")  # where it was asked for
    events = json.loads(written.read_text())
    ops = {e["args"]["op_name"] for e in events
           if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")}
    assert "SkipLayerNormalization" in ops
    if "Attention" in ops:
        assert said == []
    else:  # the figures are of ORT's unfused attention, and the bench says so
        assert said == [f"ONNX Runtime {onnxruntime.__version__}'s optimizer fused no attention in this model: "
                        "its figures are those of the unfused attention (1.32 fuses it)"]
        assert {"Softmax", "MatMul"} <= ops
    assert sum(e.get("name") == "model_run" for e in events) == 1  # one padded batch of 3 texts


def benchmark_script(name: str):
    """A script of benchmarks/ loaded as a module (its main() is called in-process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_paired_summary_of_int8_vs_ort_counts_rounds_against_its_target():
    """benchmarks/int8_vs_ort.py's paired statistics: each round's ratio is the reference's time
    over bertscope's in that round, and "rounds faster" counts the rounds past the target (1.0
    against ONNX Runtime int8, 2.0 against sentence-transformers)."""
    mod = benchmark_script("int8_vs_ort")
    entry = {"systems": {"ours": {"times_s": [1.0, 2.0, 1.0, 4.0]},
                         mod.ORT: {"times_s": [1.2, 1.8, 2.5, 4.4]},
                         mod.ST: {"times_s": [2.5, 3.0, 1.5, 9.0]}}}
    vs_ort = mod.summarise(entry, "ours")
    assert vs_ort["per_round"] == pytest.approx([1.2, 0.9, 2.5, 1.1])
    assert vs_ort["median"] == pytest.approx(1.15)
    assert vs_ort["rounds_faster"] == 3 and vs_ort["target"] == 1.0
    vs_st = mod.summarise(entry, "ours", mod.ST, 2.0)
    assert vs_st["per_round"] == pytest.approx([2.5, 1.5, 1.5, 2.25])
    assert vs_st["rounds_faster"] == 2 and vs_st["target"] == 2.0
    lo, hi = vs_st["bootstrap_95"]
    assert 1.5 <= lo <= vs_st["median"] <= hi <= 2.5


def test_int8_vs_ort_with_st_and_fp32_times_all_in_the_same_rounds(tmp_path, capsys, monkeypatch):
    """benchmarks/int8_vs_ort.py --st --fp32 end to end, on a smaller mixed corpus:
    sentence-transformers and ONNX Runtime fp32 join the round-robin, every summary is computed
    from the times the JSON records for the same rounds, and every table is printed (the figures
    in docs/BENCHMARKS.md come from it)."""
    mod = benchmark_script("int8_vs_ort")
    full = mod.mixed_lengths
    monkeypatch.setattr(mod, "mixed_lengths", lambda n, lo, hi: full(24, lo, 64))  # 24 texts, not 256
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["int8_vs_ort.py", "--rounds", "3", "--workloads", "mixed", "--st",
                                      "--fp32", "--out", str(out)])
    assert mod.main() == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["rounds"] == 3 and list(r["workloads"]) == ["mixed"]
    w = r["workloads"]["mixed"]
    assert w["texts"] == 24
    times = {s: v["times_s"] for s, v in w["systems"].items()}
    assert {"bertscope int8", mod.ORT, mod.ST} <= set(times) and all(len(t) == 3 for t in times.values())
    ours = times["bertscope int8"]
    for key, ref, target in (("vs_onnxruntime_int8", mod.ORT, 1.0), ("vs_sentence_transformers", mod.ST, 2.0)):
        s = w[key]["bertscope int8"]
        assert s["target"] == target and s["rounds"] == 3
        assert s["per_round"] == pytest.approx([t / o for o, t in zip(ours, times[ref])])
        assert s["rounds_faster"] == sum(x > target for x in s["per_round"])
    assert set(w["quality_vs_fp32"]) == {"bertscope int8", mod.ORT}  # fp32 systems agree, not rated
    assert w["bertscope_setup"]["bertscope int8"]["precision"] == "int8"
    # the second table: int8 against sentence-transformers, with its own median
    assert "vs sentence-transformers fp32, median of paired ratios" in printed
    st_table = printed.split("vs sentence-transformers fp32")[1]
    med = w["vs_sentence_transformers"]["bertscope int8"]["median"]
    assert f"| mixed | bertscope int8 | {w['systems']['bertscope int8']['median_s']:.3f} | **{med:.3f}×**" in st_table
    assert f"| mixed | {mod.ST} | " in st_table
    # --fp32: ONNX Runtime fp32 in the same rounds, bertscope fp32 summarised against it (1.0x)
    f = w["fp32_vs_onnxruntime_fp32"]
    assert f["target"] == 1.0 and f["rounds"] == 3
    assert f["per_round"] == pytest.approx([t / o for o, t in zip(times["bertscope"], times[mod.ORT_FP32])])
    assert w["max_abs_diff_vs_bertscope"][mod.ORT_FP32] < 1e-4  # the fp32 systems agree before they are timed
    fp32_table = printed.split("vs ONNX Runtime fp32, median of paired ratios")[1]
    assert f"| mixed | bertscope fp32 | {w['systems']['bertscope']['median_s']:.3f} | **{f['median']:.3f}×**" in fp32_table


def test_mkl_packed_times_every_linear_shape_after_checking_the_outputs_agree(tmp_path, capsys, monkeypatch):
    """benchmarks/mkl_packed.py (the MKL packed-GEMM figures in docs/BENCHMARKS.md): every linear
    shape of both models at every row count, each with MKL's output checked against F.linear's
    before it is timed; bad arguments are a usage error."""
    mod = benchmark_script("mkl_packed")
    out = tmp_path / "mkl.json"
    monkeypatch.setattr(sys, "argv", ["mkl_packed.py", "--rounds", "2", "--rows", "8", "24", "--out", str(out)])
    assert mod.main() == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["rounds"] == 2
    assert [(x["k"], x["m"], x["rows"]) for x in r["results"]] == \
        [(k, m, rows) for k, m in mod.SHAPES.values() for rows in (8, 24)]
    assert all(x["max_abs_diff"] < 1e-3 and x["packed_over_linear"] > 0 for x in r["results"])
    assert all(f"| {x['linear']} | {x['k']} x {x['m']} | {x['rows']} |" in printed for x in r["results"])
    monkeypatch.setattr(sys, "argv", ["mkl_packed.py", "--rounds", "0"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2
    from bertscope.errors import InputError

    monkeypatch.setattr(sys, "argv", ["mkl_packed.py", "--rounds", "1", "--out", str(tmp_path)])  # a folder
    with pytest.raises(InputError):
        mod.main()
    monkeypatch.setattr(sys, "argv", ["mkl_packed.py", "--rounds", "1"])
    monkeypatch.setattr(mod.torch.backends.mkl, "is_available", lambda: False)  # a torch built without MKL
    with pytest.raises(InputError, match="no MKL"):
        mod.main()


def test_int8_gemm_rate_times_both_int8_gemms_against_fp32_after_checking_their_outputs(tmp_path, capsys, monkeypatch):
    """benchmarks/int8_gemm_rate.py (the int8 GEMM rates in docs/BENCHMARKS.md): every linear
    shape of both models at every row count, oneDNN's and fbgemm's int8 outputs checked against
    fp32 before they are timed; an output off fp32 is refused in one line, as is a torch without
    the engines, and bad arguments are a usage error."""
    from bertscope.errors import BertscopeError, InputError

    from bertscope.fast.quant import int8_kernel_available

    mod = benchmark_script("int8_gemm_rate")
    out = tmp_path / "rate.json"
    monkeypatch.setattr(sys, "argv", ["int8_gemm_rate.py", "--rounds", "2", "--rows", "8", "70", "--out", str(out)])
    if "fbgemm" not in mod.torch.backends.quantized.supported_engines:  # a torch without fbgemm: one line
        with pytest.raises(BertscopeError, match="no fbgemm"):
            mod.main()
        return
    if not int8_kernel_available("onednn"):  # a CPU where oneDNN's int8 matmul fails its check: one line
        with pytest.raises(BertscopeError, match="not usable"):
            mod.main()
        return
    assert mod.main() == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["rounds"] == 2 and r["levels"] in (127, 255)
    assert [(x["k"], x["m"], x["rows"]) for x in r["results"]] == \
        [(k, m, rows) for k, m in mod.SHAPES.values() for rows in (8, 70)]
    for x in r["results"]:
        assert set(x["gflops"]) == {"fp32", "onednn int8", "fbgemm dynamic"}
        assert set(x["over_fp32"]) == {"onednn int8", "fbgemm dynamic"} and min(x["over_fp32"].values()) > 0
        assert 0 < max(x["rel_error"].values()) < mod.ERROR_LIMIT  # int8 is close to fp32, not equal
    assert all(f"| {x['linear']} | {x['k']} x {x['m']} | {x['rows']} |" in printed for x in r["results"])
    # an int8 GEMM whose output is off fp32 is not timed: one line
    monkeypatch.setattr(mod, "ERROR_LIMIT", 1e-9)
    with pytest.raises(BertscopeError, match="off fp32"):
        mod.main()
    monkeypatch.setattr(mod, "ERROR_LIMIT", 0.05)
    monkeypatch.setattr(sys, "argv", ["int8_gemm_rate.py", "--rows", "0"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2
    monkeypatch.setattr(sys, "argv", ["int8_gemm_rate.py", "--rounds", "1", "--out", str(tmp_path)])  # a folder
    with pytest.raises(InputError):
        mod.main()
    monkeypatch.setattr(sys, "argv", ["int8_gemm_rate.py", "--rounds", "1"])
    monkeypatch.setattr(mod, "int8_kernel_available", lambda kernel: False)  # a CPU where oneDNN's int8 fails
    with pytest.raises(BertscopeError, match="not usable"):
        mod.main()


def test_act_placement_times_both_places_after_checking_they_agree(tmp_path, capsys, monkeypatch):
    """benchmarks/act_placement.py (the activation-placement figures in docs/BENCHMARKS.md): W1's
    compiled epilogue with GELU fused and apart, on both models' FFN widths at every row count,
    their outputs checked to agree before they are timed; bad arguments are a usage error."""
    from bertscope.errors import BertscopeError
    from bertscope.fast.quant import COMPILED_KERNEL, int8_kernel_available

    mod = benchmark_script("act_placement")
    out = tmp_path / "act.json"
    monkeypatch.setattr(sys, "argv", ["act_placement.py", "--rounds", "2", "--rows", "8", "70", "--out", str(out)])
    if not int8_kernel_available(COMPILED_KERNEL):  # a CPU whose compiled steps fail their check: one line
        with pytest.raises(BertscopeError, match="not usable"):
            mod.main()
        return
    assert mod.main() == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["rounds"] == 2
    assert [(x["width"], x["rows"]) for x in r["results"]] == [(w, rows) for w in mod.WIDTHS.values() for rows in (8, 70)]
    assert all(set(x["ms"]) == {"fused", "apart"} and x["apart_over_fused"] > 0 for x in r["results"])
    assert all(f"| {x['linear']} | {x['width']} | {x['rows']} |" in printed for x in r["results"])
    monkeypatch.setattr(sys, "argv", ["act_placement.py", "--rows", "0"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2
    from bertscope.errors import InputError

    monkeypatch.setattr(sys, "argv", ["act_placement.py", "--rounds", "1", "--out", str(tmp_path)])  # a folder
    with pytest.raises(InputError):
        mod.main()


def test_int8_floor_times_the_unavoidable_work_beside_st_and_int8(tmp_path, capsys, monkeypatch):
    """benchmarks/int8_floor.py (the int8 floor figures in docs/BENCHMARKS.md): sentence-transformers
    fp32, bertscope int8 (eager and, forced, compiled) and the floor, round by round on the same
    texts, after int8 is checked
    against fp32 and the floor's shapes against the model's; paired ratios per round; bad
    arguments are a usage error."""
    from bertscope.errors import BertscopeError
    from bertscope.fast.quant import COMPILED_KERNEL, int8_kernel_available

    mod = benchmark_script("int8_floor")
    out = tmp_path / "floor.json"
    compiled_ok = int8_kernel_available(COMPILED_KERNEL)
    monkeypatch.setattr(sys, "argv", ["int8_floor.py", "--rounds", "3", "--workloads", "mixed", "--texts", "12",
                                      "--out", str(out)] + (["--compiled"] if compiled_ok else []))
    assert mod.main() == 0
    printed = capsys.readouterr().out
    e = json.loads(out.read_text())["workloads"]["mixed"]
    assert e["texts"] == 12 and e["floor"]["batches"] >= 1 and e["floor"]["attention_groups"] >= 1
    assert all(len(e["times_s"][n]) == 3 for n in (mod.ST, mod.INT8, mod.FLOOR))
    for key, (num, den) in {"st_over_int8": (mod.ST, mod.INT8), "st_over_floor": (mod.ST, mod.FLOOR),
                            "floor_over_int8": (mod.FLOOR, mod.INT8)}.items():
        want = [a / b for a, b in zip(e["times_s"][num], e["times_s"][den])]
        assert e[key]["per_round"] == pytest.approx(want)
    assert e["cosine_int8"][0] >= 0.99
    assert f"| mixed | {e['median_s'][mod.ST]:.3f} | {e['median_s'][mod.INT8]:.3f} |" in printed
    if compiled_ok:  # --compiled: int8 with compile=True, the compiled steps forced on, in the same rounds
        from bertscope.fast.quant import ACT_PLACEMENTS

        c = e["compiled"]
        assert c["act_placement"] in ACT_PLACEMENTS and len(e["times_s"][mod.COMPILED]) == 3
        assert e["cosine"][mod.COMPILED][0] >= 0.99
        assert c["st_over_compiled"]["per_round"] == pytest.approx(
            [a / b for a, b in zip(e["times_s"][mod.ST], e["times_s"][mod.COMPILED])])
        assert f"| mixed | {e['median_s'][mod.COMPILED]:.3f} |" in printed
    else:  # a CPU whose compiled steps fail their check: --compiled is one line
        monkeypatch.setattr(sys, "argv", ["int8_floor.py", "--rounds", "3", "--texts", "4", "--compiled"])
        with pytest.raises(BertscopeError, match="not usable"):
            mod.main()
    monkeypatch.setattr(sys, "argv", ["int8_floor.py", "--rounds", "2"])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2
    from bertscope.errors import InputError

    monkeypatch.setattr(sys, "argv", ["int8_floor.py", "--out", str(tmp_path)])  # a folder
    with pytest.raises(InputError):
        mod.main()


def test_int8_floor_runs_on_whichever_int8_kernel_the_race_chose(bundled_path):
    """The kernel race can pick torch._int_mm (it did here once, on a CPU with VNNI): the floor then
    times that kernel's GEMM, on int8 rows, not oneDNN's packed weight, which such a linear lacks."""
    import torch

    import bertscope
    from bertscope.fast.quant import Int8Linear

    mod = benchmark_script("int8_floor")
    bert8 = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    texts = ["a short text", "a somewhat longer text about the floor of int8 models"] * 3
    for kernel in ("onednn", "int_mm"):
        bert8.fast.gemm.int8_kernel = kernel  # the linears are rebuilt on this kernel
        run, info = mod.floor_runner(bert8, texts)
        run()
        assert info["batches"] == 1
        with torch.inference_mode():
            x = torch.randn(64, bert8.encoder.config.hidden_size)
            lins = [lin for lin in vars(bert8.fast.gemm.linears(bert8.encoder, x)[0]).values()
                    if isinstance(lin, Int8Linear)]
        assert lins and all(lin.kernel == kernel for lin in lins)


@pytest.mark.real_cpu_ticks
def test_busy_verdict_shows_a_busy_machines_choice_is_not_cached(tmp_path, capsys, monkeypatch):
    """benchmarks/busy_verdict.py (docs/BENCHMARKS.md): int8's first use beside spinning
    processes, one per CPU, reads others' share over the limit and caches neither the kernel
    choice nor the speed verdict; refuses to run under a BERTSCOPE_BUSY_SHARE override."""
    mod = benchmark_script("busy_verdict")
    out = tmp_path / "busy.json"
    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))  # the script sets its own; restored
    monkeypatch.setenv("BERTSCOPE_BUSY_SHARE", "1")
    cpus = len(os.sched_getaffinity(0))
    spin = min(cpus, 8)  # one per CPU (CI: 2); a larger machine runs 8, which its 2 torch threads may not feel
    monkeypatch.setattr(sys, "argv", ["busy_verdict.py", "--loads", "1", "--spinners", str(spin), "--out", str(out)])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2 and "unset BERTSCOPE_BUSY_SHARE" in capsys.readouterr().err
    monkeypatch.delenv("BERTSCOPE_BUSY_SHARE")
    assert mod.main() == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["busy_share_limit"] == 0.3 and [x["spinners"] for x in r["loads"]] == [0, spin]
    busy = r["loads"][1]
    assert busy["speedup"] > 0 and busy["choice_cached"] == (not busy["choice_busy"] > 0.3)
    if spin == cpus:  # every CPU has a spinner: the 2 torch threads must feel it
        assert busy["choice_busy"] > 0.3 and not busy["choice_cached"] and not busy["verdict_cached"], busy
        assert "not cached" in busy["precision_note"]
    assert "| quiet | 1 |" in printed and "| 1 |" in printed.split("spinning process")[1]


def test_compiled_layer_norm_times_both_forms_after_checking_they_agree(tmp_path, capsys, monkeypatch):
    """benchmarks/compiled_layer_norm.py (the LayerNorm figures in docs/BENCHMARKS.md): the fused
    residual + LayerNorm + quantize step with inductor's Welford LayerNorm and with the two-pass
    one, both widths at every row count, checked against F.layer_norm before timing."""
    mod = benchmark_script("compiled_layer_norm")
    out = tmp_path / "ln.json"
    monkeypatch.setattr(sys, "argv", ["compiled_layer_norm.py", "--rounds", "2", "--rows", "8", "70", "--out", str(out)])
    assert mod.main() == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert [(x["width"], x["rows"]) for x in r["results"]] == [(w, n) for w in mod.WIDTHS.values() for n in (8, 70)]
    assert all(set(x["ms"]) == {"welford", "two-pass"} and x["two_pass_over_welford"] > 0 for x in r["results"])
    assert all(f"| {x['model']} | {x['width']} | {x['rows']} |" in printed for x in r["results"])
    monkeypatch.setattr(sys, "argv", ["compiled_layer_norm.py", "--rounds", "0"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2


def test_compiled_step_benchmarks_refuse_in_one_line_where_the_compiled_steps_are_unusable(tmp_path, monkeypatch,
                                                                                          capsys):
    """Where compiling fails or the compiled steps disagree with the eager ones (stand-ins here,
    whatever this CPU does), act_placement.py and int8_floor.py --compiled stop with one line and
    exit 2 under run_script, before timing anything."""
    from bertscope.errors import BertscopeError

    act = benchmark_script("act_placement")

    def refused(*args, **kwargs):
        raise RuntimeError("torch.compile's int8 steps disagree with the eager steps on this CPU")

    monkeypatch.setattr(act, "CompiledSteps", refused)
    monkeypatch.setattr(sys, "argv", ["act_placement.py", "--rounds", "1", "--rows", "8"])
    with pytest.raises(SystemExit) as e:
        act.run_script(act.main)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the compiled int8 steps are not usable here") and "\n" not in err
    floor = benchmark_script("int8_floor")
    monkeypatch.setattr(floor, "int8_kernel_available", lambda kernel: False)
    monkeypatch.setattr(sys, "argv", ["int8_floor.py", "--rounds", "3", "--texts", "4", "--workloads", "mixed",
                                      "--compiled"])
    with pytest.raises(BertscopeError, match="not usable"):
        floor.main()


def test_embed_memory_keeps_the_curve_of_a_run_it_stops_at_its_deadline(tmp_path, monkeypatch, capsys):
    """benchmarks/embed_memory.py (the `embed` memory figures in docs/BENCHMARKS.md): a complete run
    reads its curve back from the samples file it streamed; a run stopped at --deadline-s is
    reported as partial, with the texts of its finished shards and the stopped process's peak RSS,
    and its streamed samples survive it."""
    import numpy as np

    mod = benchmark_script("embed_memory")
    out, log = tmp_path / "m.json", tmp_path / "samples.jsonl"
    monkeypatch.setattr(sys, "argv", ["embed_memory.py", "--sizes", "120", "--out", str(out), "--samples", str(log),
                                      "--extra", "--batch-tokens", "1024"])
    assert mod.main() == 0
    r = json.loads(out.read_text())[0]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert r["texts"] == 120 and "partial" not in r and r["peak_rss_mib"] > 0 and "kernel_choice" in r
    assert r["kernel_choice"]["batch_tokens"] == 1024  # what the run used, not the cached choice
    assert rows and r["curve"] == rows[:: max(1, len(rows) // 400)]
    assert all(len(row) == 4 and row[1] > 0 for row in rows)

    deadline = 12.0
    monkeypatch.setattr(sys, "argv", ["embed_memory.py", "--sizes", "50000", "--deadline-s", str(deadline),
                                      "--out", str(out), "--samples", str(log), "--extra", "--shard-rows", "300"])
    assert mod.main() == 0
    r = json.loads(out.read_text())[0]
    assert r["partial"] is True and r["stopped_after_s"] == deadline and r["wall_s"] >= deadline
    assert r["texts_done"] % 300 == 0 and r["texts_done"] < 50_000  # whole shards only, far from the end
    assert r["peak_rss_mib"] > 100  # torch and the model were loaded when it was stopped
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert rows and rows[-1][0] <= r["wall_s"] and r["curve"] == rows[:: max(1, len(rows) // 400)]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["partial"] is True

    staging = tmp_path / "job" / "_staging"  # what a stopped job leaves: its finished shards
    staging.mkdir(parents=True)
    np.save(staging / "part-00000.npy", np.zeros((300, 4), np.float32))
    np.save(staging / "part-00001.npy", np.zeros((17, 4), np.float32))
    assert mod.shard_rows_done(tmp_path / "job") == 317 and mod.shard_rows_done(tmp_path / "none") == 0
    assert mod.samples_path("a/s.jsonl", 10, 2, tmp_path) == Path("a/s_10.jsonl")
    assert mod.samples_path(None, 10, 1, tmp_path) == tmp_path / "samples10.jsonl"


def test_embed_memory_records_blas_when_the_environment_forces_it(monkeypatch):
    """A run under BERTSCOPE_ONEDNN=0 computes with BLAS whatever the cached choice says
    (GemmBackend), so its record must say BLAS and why, or a memory figure gets the wrong library;
    and the run records the environment's settings that change its memory (the heap policy)."""
    from bertscope.fast import gemm, tuning

    mod = benchmark_script("embed_memory")
    cached = tuning.KernelChoice(gemm="onednn", source="cache")  # what a fast AVX-512 host caches
    monkeypatch.setattr(tuning, "tuning_enabled", lambda: True)
    monkeypatch.setattr(tuning, "choice_key", lambda config, dtype, precision: "key")
    monkeypatch.setattr(tuning, "load_choice", lambda key: cached)
    monkeypatch.delenv("BERTSCOPE_ONEDNN", raising=False)
    plain = mod.kernel_choice(None, "fp32", [])
    assert plain["gemm"] == "onednn" and plain["source"] == "cache" and "gemm_from" not in plain
    monkeypatch.setenv("BERTSCOPE_ONEDNN", "0")
    forced = mod.kernel_choice(None, "fp32", ["--batch-tokens", "4096"])
    assert forced["gemm"] == "blas" and forced["gemm_from"] == "BERTSCOPE_ONEDNN=0"
    assert forced["batch_tokens"] == 4096
    monkeypatch.setenv("BERTSCOPE_HEAP", "system")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    recorded = mod.run_environment()
    assert recorded["BERTSCOPE_HEAP"] == "system" and recorded["MALLOC_ARENA_MAX"] == "2"
    assert recorded["BERTSCOPE_ONEDNN"] == "0" and recorded["ONEDNN_MAX_CPU_ISA"] == "AVX2" and "PATH" not in recorded
    assert gemm.GemmBackend(prefer="onednn").prefer == "blas"  # what the run computed with


def test_count_choices_counts_each_measured_choice_once_and_skips_overridden_values(tmp_path, capsys):
    """benchmarks/count_choices.py (the README's counts of the kernel choices): a choice recorded
    by several systems counts once, a batch size set by --batch-tokens or BLAS forced by the
    environment is not the choice's, and a file that is not JSON is named, not fatal."""
    mod = benchmark_script("count_choices")
    plain = {"gemm": "onednn", "batch_tokens": 2048, "slack": 0.0, "int8_kernel": "onednn", "measured_at": 1.0,
             "not_raced": {"batch_tokens": "over its share"}}
    flagged = dict(plain, batch_tokens=4096, batch_tokens_from="--batch-tokens")
    forced = dict(plain, gemm="blas", gemm_from="BERTSCOPE_ONEDNN=0", measured_at=2.0, slack=0.1)
    old = {"gemm": "blas", "batch_tokens": 1024, "slack": 0}  # an older record: no measured_at
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bench.json").write_text(json.dumps({"w": [{"kernel_choice": flagged}, {"kernel_choice": plain},
                                                                 {"ratios": {"gemm": {"blas": 1.0}}}]}))
    (tmp_path / "a" / "embed.json").write_text(json.dumps([{"kernel_choice": forced}, {"kernel_choice": old}]))
    (tmp_path / "broken.json").write_text("{not json")
    r = mod.count([tmp_path])
    assert r["files"] == 2 and r["records"] == 4 and r["choices"] == 3
    assert r["unreadable"] == [str(tmp_path / "broken.json")]
    assert r["batch_tokens"] == {"counted": 3, "kept_plain": 2, "values": {2048: 2, 1024: 1}}
    assert r["slack"] == {"counted": 3, "kept_plain": 2, "values": {0.0: 2, 0.1: 1}}
    assert r["gemm"] == {"onednn": 1, "blas": 1}  # the forced BLAS is not a choice of BLAS
    assert r["not_raced"] == {"recorded_in": 2, "batch_tokens": 2, "slack": 0}
    assert mod.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 distinct kernel choices (4 records in 2 JSON files)") and "broken.json" in out
    assert mod.main([str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == f"error: not a folder: {tmp_path / 'none'}"


def test_resume_finished_times_both_ways_and_checks_neither_recomputes(tmp_path, capsys, monkeypatch):
    """benchmarks/resume_finished.py (docs/BENCHMARKS.md): a finished job resumed with the model
    loaded, and confirmed from its description without loading it; both find every shard done."""
    mod = benchmark_script("resume_finished")
    out = tmp_path / "resume.json"
    monkeypatch.setattr(sys, "argv", ["resume_finished.py", "--lines", "30", "--rounds", "1",
                                      "--precisions", "fp32", "--out", str(out)])
    assert mod.main() == 0
    [r] = json.loads(out.read_text())["results"]
    assert r["precision"] == "fp32" and r["shards"] == 1 and len(r["seconds"]["described"]) == 1
    assert "| fp32 | 1 |" in capsys.readouterr().out
    # a described resume that had to load the model after all is caught, not timed
    monkeypatch.setattr(mod, "describe_model_folder", lambda path, precision: {"model": "another"})
    with pytest.raises(mod.BertscopeError, match="described: 1 of 1 shards found done and 1 load"):
        mod.main()


def test_explain_long_times_the_command_and_each_method_on_the_cut_text(tmp_path, capsys, monkeypatch):
    """benchmarks/explain_long.py (the `explain` figures in docs/BENCHMARKS.md): each round times
    the whole `explain --compare`, each map method with its row, and `view`; the JSON keeps every round;
    bad arguments are a usage error."""
    mod = benchmark_script("explain_long")
    out = tmp_path / "e.json"
    monkeypatch.setattr(sys, "argv", ["explain_long.py", "--rounds", "2", "--words", "20", "--out", str(out)])
    assert mod.main() == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["tokens"] == 23 and r["rounds"] == 2  # [CLS] cat, 20 words, [SEP]
    assert list(r["times_s"]) == ["explain --compare", *mod.METHODS, "view --measure all"]
    assert all(len(v) == 2 and min(v) > 0 for v in r["times_s"].values())
    assert all(f"| {k} | " in printed for k in r["times_s"])
    for bad in (["--rounds", "0"], ["--words", "0"]):
        monkeypatch.setattr(sys, "argv", ["explain_long.py", *bad])
        with pytest.raises(SystemExit) as e:
            mod.main()
        assert e.value.code == 2
