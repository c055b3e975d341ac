"""Shared fixtures. The bundled checkpoint is loaded once per test session.

Policy: a test never skips because something it needs is missing. Every test dependency is in
pyproject.toml's ``[test]`` extra, and a missing one stops the run at once with one line
(:func:`missing_test_dependencies`); no test uses ``importorskip`` or skips on an ImportError
(tests/test_policy.py checks both). Browser tests need Debian's Chromium: missing, they fail
too, unless BERTSCOPE_NO_BROWSER=1 asks to leave them out (then each is reported as skipped).
"""

from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The measured kernel choice is cached here, never in the user's own cache folder (and a folder
# made here is removed at the end of the session: pytest_sessionfinish). The CLI run as a
# subprocess and this process cache apart: this process reads a stand-in GEMM rate
# (steady_gemm_rate below), a subprocess the real one, and each took the other's choices for
# another host's and measured them again (3 s a time, with the kernels changing under the tests)
MADE_CACHE_DIR = None if "BERTSCOPE_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="bertscope-test-cache-")
SUBPROCESS_CACHE_DIR = IN_PROCESS_CACHE_DIR = None
if MADE_CACHE_DIR is not None:
    SUBPROCESS_CACHE_DIR = os.path.join(MADE_CACHE_DIR, "subprocesses")
    IN_PROCESS_CACHE_DIR = os.path.join(MADE_CACHE_DIR, "in-process")
    os.environ["BERTSCOPE_CACHE_DIR"] = SUBPROCESS_CACHE_DIR
# the CLI run as a subprocess caches its kernel choices whatever else runs on the machine (in this
# process the busy reading itself is a stand-in: steady_gemm_rate below)
os.environ.setdefault("BERTSCOPE_BUSY_SHARE", "1")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def _isa_limited_inductor_cache() -> str | None:
    """An inductor cache folder of its own for a run told to act as a lesser CPU (one of the ISA
    limits of bertscope.fast.tuning set), unless one is named. inductor's cache key leaves the
    limit out: a run with ATEN_CPU_CAPABILITY=avx2 reused the code that a native run had built
    in the shared folder (/tmp/torchinductor_<user>), and its compiled LayerNorm disagreed with
    F.layer_norm (benchmarks/compiled_layer_norm.py stopped); a native run after may read the
    limited run's code as well. None: nothing to set."""
    from bertscope.fast.tuning import ISA_LIMIT_VARS

    limits = [f"{v}-{os.environ[v]}" for v in ISA_LIMIT_VARS if os.environ.get(v)]
    if not limits or os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    try:
        user = getpass.getuser()  # as inductor names its own folder
    except (KeyError, OSError):
        user = str(os.getuid())
    name = "_".join(["torchinductor", user, *limits])
    return os.path.join(tempfile.gettempdir(), "".join(c if c.isalnum() or c in "_-" else "_" for c in name))


if (_cache := _isa_limited_inductor_cache()) is not None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache

IT_ANIMAL = "The animal didn't cross the street because it was too tired"


STEADY_GFLOPS = 50.0


@pytest.fixture(autouse=True)
def steady_gemm_rate(request, monkeypatch):
    """The kernel-choice cache's host check (tuning.gemm_rate) reads one fixed rate in every test,
    except those marked ``real_gemm_rate``: a real 0.1 s probe can read 2x apart on one busy VM,
    and no test may depend on this CPU's timing. The host check itself is tested with stand-in
    probes (tests/test_tuning.py). Likewise the reading of how busy the machine is
    (tuning.cpu_ticks, which decides whether a measured choice is cached) reads "unknown" except
    in tests marked ``real_cpu_ticks``: what else runs on a CI machine is not the tests' to decide."""
    from bertscope.fast import tuning

    if request.node.get_closest_marker("real_gemm_rate") is None:
        monkeypatch.setattr(tuning, "gemm_rate", lambda *a, **k: STEADY_GFLOPS)
    if request.node.get_closest_marker("real_cpu_ticks") is None:
        monkeypatch.setattr(tuning, "cpu_ticks", lambda: None)
    if IN_PROCESS_CACHE_DIR is not None:  # this process's own cache folder, unless a test sets one
        real_cache_dir = tuning.cache_dir

        def cache_dir():
            if os.environ.get("BERTSCOPE_CACHE_DIR") == SUBPROCESS_CACHE_DIR:
                return Path(IN_PROCESS_CACHE_DIR)
            return real_cache_dir()

        monkeypatch.setattr(tuning, "cache_dir", cache_dir)


@pytest.fixture(scope="session")
def bert():
    """The bundled all-MiniLM-L6-v2, loaded by bertscope (eval mode, CPU, fp32)."""
    import bertscope

    return bertscope.load()


@pytest.fixture(scope="session")
def bundled_path(bert):
    return bert.path


@pytest.fixture(scope="session")
def hf_model(bundled_path):
    """HF transformers' BertModel on the same checkpoint, eager attention (the reference)."""
    import transformers  # a test dependency: a missing one must fail, not skip
    return transformers.BertModel.from_pretrained(str(bundled_path), attn_implementation="eager").eval()


def declared_test_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The ``[test]`` extra's requirements, read from pyproject.toml (the source of truth)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: tomli (in the [test] extra there), the same parser
        try:
            import tomli as tomllib
        except ImportError:  # not installed yet: the installed package's metadata, as last installed
            import importlib.metadata as md

            return [r for r in md.requires("bertscope") or [] if 'extra == "test"' in r]  # markers kept
    with open(pyproject, "rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"]["test"])


def missing_test_dependencies(requirements: list[str] | None = None) -> list[str]:
    """Each requirement that is not installed (or not at a wanted version), as "name (why)"."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    missing = []
    for line in declared_test_requirements() if requirements is None else requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": "test"}):
            continue  # for another Python (tomli, say)
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            missing.append(f"{req.name} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            missing.append(f"{req.name} ({have} installed, {req.specifier} wanted)")
    return missing


def pytest_configure(config) -> None:
    missing = missing_test_dependencies()
    if missing:  # one line, and no test runs: a missing dependency is a failure, never a skip
        raise pytest.UsageError(f"missing test dependencies: {', '.join(missing)}; "
                                "run: pip install -e '.[test]' (or make test)")


def pytest_sessionfinish(session, exitstatus):
    """The session's kernel-choice cache folder, if this file made it, goes with the session."""
    if MADE_CACHE_DIR is not None:
        shutil.rmtree(MADE_CACHE_DIR, ignore_errors=True)
