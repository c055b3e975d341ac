"""What `pip install bertscope` gets: the wheel built from this tree holds every file the
package reads at run time (the explorer's page, script and styles; the pronoun list; the
calibration texts), and the installed copy runs away from the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bertscope"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tree (a build in place writes build/ and egg-info)."""
    where = tmp_path_factory.mktemp("wheel")
    tree = where / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           str(tree), "-w", str(where / "dist")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [built] = (where / "dist").glob("bertscope-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_package(wheel):
    """Not only the .py files: a file added beside them (a new asset, say) that the package-data
    globs of pyproject.toml miss would be missing from every install but an editable one."""
    source = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.startswith("bertscope/")}
        entry_points = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert source - shipped == set(), f"in the source tree, not in the wheel: {sorted(source - shipped)}"
    assert shipped - source == set(), f"in the wheel, not in the source tree: {sorted(shipped - source)}"
    assert any(n.endswith(".html") for n in shipped) and any(n.endswith(".js") for n in shipped)
    assert "bertscope = bertscope.cli:main" in entry_points


def test_the_installed_wheel_runs_away_from_the_source_tree(wheel, tmp_path):
    """Installed (its dependencies from this environment), in a folder without the source: the
    explorer's page is written with its script and styles inside, from the installed files."""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    env = dict(os.environ, PYTHONPATH=str(site))
    where = subprocess.run([sys.executable, "-c", "import bertscope; print(bertscope.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
    assert Path(where.stdout.strip()).is_relative_to(site), (where.stdout, where.stderr)
    out = tmp_path / "page.html"
    done = subprocess.run([sys.executable, "-m", "bertscope", "view", "The cat sat because it was tired",
                           "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    page = out.read_text(encoding="utf-8")
    installed = site / "bertscope" / "see" / "assets"
    for asset in ("bertscope.js", "bertscope.css"):  # inlined whole: the page works offline
        assert installed.joinpath(asset).read_text(encoding="utf-8").strip()[:200] in page
