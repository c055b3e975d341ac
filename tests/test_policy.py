"""The suite's own rule: a test never skips because something it needs is missing.

A missing test dependency stops the run with one line (conftest.py); no test file calls
importorskip or skips on its own, except on a line that says why with a "# skip-policy:"
comment (today: only BERTSCOPE_NO_BROWSER=1, the user's explicit opt-out of browser tests).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, declared_test_requirements, missing_test_dependencies

TESTS = ROOT / "tests"
SKIPPING = {"importorskip", "skip", "skipif", "xfail"}


def skipping_calls(path: Path) -> list[str]:
    """`file:line` of every pytest.importorskip / skip / mark.skip(if) / xfail not marked as allowed."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in SKIPPING:
            if "# skip-policy:" not in lines[node.lineno - 1]:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_test_skips_on_its_own():
    offenders = [hit for p in sorted(TESTS.glob("*.py")) for hit in skipping_calls(p)]
    assert offenders == []


def test_the_scan_would_see_an_importorskip(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text("import pytest\nnp = pytest.importorskip('numpy')\n"
                 "@pytest.mark.skipif(True, reason='x')\ndef test_a(): pytest.skip('no')\n")
    assert skipping_calls(f) == ["test_x.py:2", "test_x.py:3", "test_x.py:4"]


def test_every_declared_test_dependency_is_checked():
    reqs = declared_test_requirements()
    assert any(r.startswith("hypothesis") for r in reqs) and any(r.startswith("playwright") for r in reqs)
    assert missing_test_dependencies() == []  # this run has them all, or it would not have started
    assert missing_test_dependencies(["pytest>=1", "surely-not-a-package-bertscope>=1", "pytest<1"]) == [
        "surely-not-a-package-bertscope (not installed)",
        f"pytest ({pytest.__version__} installed, <1 wanted)"]


def test_a_missing_dependency_fails_the_run_with_one_line(tmp_path):
    """A copy of the suite's conftest.py beside a pyproject.toml whose [test] extra names a
    package that is not installed: pytest must refuse to run, not skip."""
    (tmp_path / "tests").mkdir()
    shutil.copy(TESTS / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_one.py").write_text("def test_one():\n    assert True\n")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(
        pyproject.replace('test = [\n', 'test = [\n    "surely-not-a-package-bertscope>=1",\n'), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    out = r.stdout + r.stderr
    assert r.returncode not in (0, 5), out  # neither passed nor "no tests ran"
    lines = [line for line in out.splitlines() if "surely-not-a-package-bertscope" in line]
    assert len(lines) == 1 and "missing test dependencies" in lines[0] and "pip install -e '.[test]'" in lines[0], out
    assert "passed" not in out and "skipped" not in out


def test_a_missing_browser_fails_unless_left_out_on_purpose(monkeypatch):
    import viewkit

    monkeypatch.setattr(viewkit, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv(viewkit.NO_BROWSER_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match="install-browser.sh"):
        with viewkit.chromium():
            pass
    monkeypatch.setenv(viewkit.NO_BROWSER_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match="left out as asked"):  # skip-policy: checks the opt-out
        with viewkit.chromium():
            pass


def test_browser_tests_do_not_depend_on_ci():
    """They used to skip unless CI=true; now they run wherever Chromium is installed."""
    needle = 'environ.get("' + 'CI"'  # spelt in two parts so this file does not match itself
    for p in TESTS.glob("*.py"):
        assert needle not in p.read_text(encoding="utf-8"), p.name


def test_a_run_told_to_act_as_a_lesser_cpu_keeps_its_own_inductor_cache(monkeypatch):
    """inductor's cache key leaves out ATEN_CPU_CAPABILITY: a run limited to AVX2 reused a native
    run's compiled LayerNorm from the shared folder, and it disagreed with F.layer_norm. The suite
    gives such a run a folder of its own, named by the limits; a folder the user names is kept."""
    from conftest import _isa_limited_inductor_cache
    from bertscope.fast.tuning import ISA_LIMIT_VARS
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    for v in (*ISA_LIMIT_VARS, "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(v, raising=False)
    assert _isa_limited_inductor_cache() is None
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    avx2 = _isa_limited_inductor_cache()
    assert avx2 is not None and "avx2" in Path(avx2).name and avx2 != default_cache_dir()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert _isa_limited_inductor_cache() not in (None, avx2)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/mine")
    assert _isa_limited_inductor_cache() is None
