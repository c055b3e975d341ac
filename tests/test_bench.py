"""Smoke test of `bertscope bench`: JSON keys present and the outputs-agree checks run (no timings)."""

from __future__ import annotations

import json
import sys


from bertscope.cli.main import main


def test_bench_quick_json(tmp_path, capsys):
    code = main(["bench", "--quick", "--json", "--plot", str(tmp_path / "s13.png")])
    out = capsys.readouterr().out
    assert code == 0
    r = json.loads(out)
    assert {"machine", "matmul_peak_gflops", "workloads", "scaling"} <= set(r)
    for name in ("equal_T128", "mixed"):
        w = r["workloads"][name]
        assert {"real_tokens", "useful_gflop", "systems", "max_abs_diff_vs_bertscope", "skipped"} <= set(w)
        assert "bertscope" in w["systems"] and w["systems"]["bertscope"]["tokens_per_s"] > 0
        # every competitor that ran was compared with bertscope, and agrees
        assert set(w["max_abs_diff_vs_bertscope"]) == set(w["systems"]) - {"bertscope"}
        assert set(w["skipped"]) <= {"sentence-transformers", "transformers", "onnxruntime"}
        assert set(w["systems"]) == {
            "bertscope", "sentence-transformers", "transformers", "onnxruntime"}
        for diff in w["max_abs_diff_vs_bertscope"].values():
            assert diff < 1e-5
    s = r["scaling"]
    assert len(s["attention"]["time_s"]) == len(s["lengths"]) == len(s["model"]["time_s"])
    assert "time_exponent" in s["attention"] and "time_exponent" in s["model"]
    assert (tmp_path / "s13.png").stat().st_size > 0


def test_bench_skips_a_missing_competitor(monkeypatch, tmp_path):
    from bertscope.bench import build_systems
    import bertscope

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    bert = bertscope.load()
    systems, skipped = build_systems(bert.path, bert, tmp_path, 1, only=["onnxruntime"])
    assert list(systems) == ["bertscope"]
    assert "not installed" in skipped["onnxruntime"]


def test_library_does_not_import_competitors():
    import subprocess

    code = ("import sys, bertscope; b = bertscope.load(); b.embed(['x']); "
            "import bertscope.bench, bertscope.embedjob; "
            "bad = [m for m in ('sentence_transformers', 'transformers', 'onnxruntime', 'matplotlib', 'pyarrow') "
            "if m in sys.modules]; print(bad)")
    import os
    from pathlib import Path
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_bench_bad_preset_is_one_line_error(capsys):
    assert main(["bench", "--preset", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown preset" in err[0]
