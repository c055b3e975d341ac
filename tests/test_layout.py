"""The folder tree is the architecture: imports point down only, each idea is written once.

Read from the source with ``ast`` (nothing is imported), so a violation anywhere fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bertscope"

# Lower rank = closer to the blocks. A module may import from its own package and from packages
# of strictly lower rank (the README's layout section says so in words).
RANK = {
    "errors": 0, "files": 0.5,
    "core": 1,
    "fast": 2,
    "bert": 3,
    "see": 4,
    "understand": 5, "train": 5,
    "explain": 6, "scale": 6, "bench": 6,
    "cli": 9,
    "__init__": 10, "__main__": 10,
}


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        out.append((".".join(rel.parts), path))
    return out


def package_of(dotted: str) -> str:
    """'core.model' -> 'core'; 'bert' -> 'bert'; '' (the package itself) -> '__init__'."""
    return dotted.split(".")[0] if dotted else "__init__"


def imports(dotted: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(absolute module inside bertscope, names imported, line) for every bertscope import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = dotted.split(".")
    is_pkg = path.name == "__init__.py"
    base = here if is_pkg else here[:-1]
    if is_pkg and here == ["__init__"]:
        base = []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(parent + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("bertscope"):
                target = node.module[len("bertscope."):] if node.module != "bertscope" else ""
            else:
                continue
            found.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("bertscope"):
                    found.append((a.name[len("bertscope."):] if a.name != "bertscope" else "", [], node.lineno))
    return found


def test_every_module_is_in_a_known_package():
    unknown = {package_of(d) for d, _ in modules()} - set(RANK)
    assert not unknown, f"add these packages to RANK in {Path(__file__).name}: {sorted(unknown)}"


def test_imports_point_down():
    bad = []
    for dotted, path in modules():
        mine = package_of(dotted)
        for target, names, line in imports(dotted, path):
            targets = [target] if target else [f"{n}" for n in names]  # "from . import x"
            for t in targets:
                theirs = package_of(t)
                if theirs == mine or theirs not in RANK:
                    continue
                if RANK[theirs] < RANK[mine]:
                    continue
                bad.append(f"{path.relative_to(SRC)}:{line} imports {t or names} ({mine} -> {theirs})")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)


def test_core_imports_nothing_above_it():
    for dotted, path in modules():
        if package_of(dotted) == "core":
            for target, names, line in imports(dotted, path):
                assert package_of(target) in ("core", "errors", "files"), f"{path}:{line} imports {target}"


def test_no_private_names_imported_across_modules():
    bad = []
    for dotted, path in modules():
        for target, names, line in imports(dotted, path):
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{path.relative_to(SRC)}:{line} imports {n} from {target}")
    assert not bad, "\n".join(bad)


def _files_using(needle: str) -> list[str]:
    return sorted(str(p.relative_to(SRC)) for _, p in modules() if needle in p.read_text(encoding="utf-8"))


def test_matplotlib_is_imported_in_one_module():
    users = set()
    for dotted, path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "matplotlib" for n in names):
                users.add(str(path.relative_to(SRC)))
    assert users == {"see/figures.py"}


@pytest.mark.parametrize("needle,home", [
    ("os.replace(", ["files.py"]),  # the one atomic writer
    ("F.gelu(", ["core/layer.py"]),  # the one activation table
    (".attention_norm(", ["core/layer.py"]),  # the one layer recipe
    (".output_norm(", ["core/layer.py"]),
])
def test_one_definition(needle, home):
    assert _files_using(needle) == home


def test_no_module_level_state_picks_kernels():
    """Kernel choices and caches live on objects the fast path owns, not in module globals."""
    for _, path in modules():
        if "fast" not in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Global):
                pytest.fail(f"{path}: module-level 'global' statement")
            for inner in ast.walk(node):
                assert not isinstance(inner, ast.Global), f"{path}:{inner.lineno}: 'global' rebinds module state"
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if all(isinstance(t, ast.Name) and t.id.startswith("__") for t in targets):
                    continue  # __all__ and friends
                value = node.value
                mutable = isinstance(value, (ast.List, ast.Dict, ast.Set)) and not (
                    isinstance(value, ast.Dict) and all(isinstance(v, (ast.Constant, ast.Tuple)) for v in value.values))
                call = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in (
                    "WeakKeyDictionary", "dict", "list", "set", "defaultdict", "OrderedDict")
                assert not (mutable or call), f"{path}:{node.lineno}: mutable module-level state {ast.unparse(node)[:60]}"


def test_every_public_name_is_in_the_readme():
    """Each name of ``bertscope.__all__`` is named, in backticks, where a user reads about the
    API (README's "Every public name"), so a new public name cannot land undocumented."""
    tree = ast.parse((SRC / "__init__.py").read_text(encoding="utf-8"))
    public = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    readme = (SRC.parents[1] / "README.md").read_text(encoding="utf-8")
    readme = readme.split("### Every public name", 1)[1].split("\n## ", 1)[0]  # that section only
    assert len(public) > 30
    missing = [n for n in public if f"`{n}`" not in readme and f"`{n}(" not in readme]
    assert not missing, f"public names the README never names: {missing}"
