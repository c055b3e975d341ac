"""The README's promises about itself: every Python block runs as written, and the figures it
quotes from a script are that script's figures today."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SRC = str(ROOT / "src")


def _python_blocks() -> list[tuple[int, str]]:
    """Each ```python block of the README: (its first line's number, its code)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    blocks, start = [], None
    for n, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = n + 1
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start - 1:n - 1]) + "\n"))
            start = None
    assert start is None, f"README.md: the block from line {start} is never closed"
    return blocks


def test_the_readme_has_the_python_blocks_the_next_test_runs():
    blocks = _python_blocks()
    assert len(blocks) >= 4, [n for n, _ in blocks]
    assert all("import bertscope" in code for _, code in blocks), [n for n, c in blocks if "import bertscope" not in c]


def _data(path: Path, rows: list[tuple[str, str]]) -> None:
    path.write_text("text,label\n" + "".join(f"{t},{label}\n" for t, label in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def readme_folder(tmp_path_factory):
    """A working folder with what the README's blocks read: train.csv, dev.csv, and sentiment/
    made by the README's own command (`bertscope finetune train.csv --dev dev.csv --out sentiment/`)."""
    where = tmp_path_factory.mktemp("readme")
    pos = ["a moving film", "a warm and funny story", "great acting", "a joy to watch", "wonderful and bright"]
    neg = ["dull", "a dull film", "boring and slow", "a tired plot", "flat and lifeless"]
    _data(where / "train.csv", [(t, "pos") for t in pos] + [(t, "neg") for t in neg])
    _data(where / "dev.csv", [("a funny film", "pos"), ("a boring story", "neg")])
    done = subprocess.run([sys.executable, "-m", "bertscope", "finetune", "train.csv", "--dev", "dev.csv",
                           "--out", "sentiment/", "--quiet"], cwd=where, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return where


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.mark.parametrize("line", [n for n, _ in _python_blocks()])
def test_every_python_block_of_the_readme_runs_as_written(readme_folder, line):
    """Each block in a fresh interpreter, in a folder holding only what the README says it reads
    (a review found two that named bertscope without importing it, and one that used variables
    it never made)."""
    code = dict(_python_blocks())[line]
    done = subprocess.run([sys.executable, "-c", code], cwd=readme_folder, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"README.md line {line}:\n{done.stderr[-3000:]}"


def test_the_readmes_kernel_choice_counts_are_the_scripts():
    """The README quotes benchmarks/count_choices.py over benchmarks/results/; a session that
    records more choices changes the count (a review found the README eight choices behind)."""
    spec = importlib.util.spec_from_file_location("count_choices", ROOT / "benchmarks" / "count_choices.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.count([ROOT / "benchmarks" / "results"])
    text = " ".join(README.read_text(encoding="utf-8").split())
    m = re.search(r"Of the (\d+) distinct choices recorded under `benchmarks/results/`, raced or not, (\d+) of "
                  r"(\d+) ended with the plain batch size and (\d+) of (\d+) with the plain slack; oneDNN's GEMMs "
                  r"won (\d+), BLAS's (\d+) \(`python benchmarks/count_choices.py`", text)
    assert m, "the README's sentence on the recorded kernel choices changed: update this test with it"
    quoted = [int(g) for g in m.groups()]
    b, s = r["batch_tokens"], r["slack"]
    counted = [r["choices"], b["kept_plain"], b["counted"], s["kept_plain"], s["counted"],
               r["gemm"].get("onednn", 0), r["gemm"].get("blas", 0)]
    assert quoted == counted, f"README says {quoted}, count_choices.py counts {counted}"
    assert not r["unreadable"]
