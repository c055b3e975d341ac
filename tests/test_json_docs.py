"""docs/JSON.md documents every key of the commands' --json outputs: each section's example
commands are run, and the keys they print must be the keys its table lists.

Table rows name keys as paths: ``a.b`` (key b of the object at a), ``a[]`` (each element of the
list at a), ``a.*`` (each value of an object whose keys vary). A row whose type says
"(optional)" may be missing; a path may stop at a value that is null where its row's type
says "null". Top-level keys must match exactly both ways, and so must the keys of every object
whose own keys the table lists.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from bertscope.cli.app import main

from conftest import IT_ANIMAL

DOC = Path(__file__).resolve().parents[1] / "docs" / "JSON.md"

# every section docs/JSON.md must have: its heading is "## bertscope <name> --json"
SECTIONS = ["params", "attend", "trace", "heads", "coref", "ablate", "ablate --sweep", "explain",
            "explain --compare", "doctor"]
TEXT_COMMANDS = {"attend", "trace", "ablate", "explain"}  # they take a TEXT: the doc's is IT_ANIMAL

CORPUS = """The cat sat on the mat.
A dog barked at the mailman, loudly.
She read the book because it was interesting.
Rain fell all night.
"""


def sections() -> dict[str, str]:
    """Heading name ("ablate --sweep") -> the section's text."""
    out: dict[str, str] = {}
    name = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            m = re.fullmatch(r"## bertscope (.+) --json", line.strip())
            name = m.group(1) if m else None
            if name is not None:
                out[name] = ""
            continue
        if name is not None:
            out[name] += line + "\n"
    return out


def commands(section: str) -> list[list[str]]:
    """The argument lists of the ``bertscope ...`` lines in the section's ```bash blocks."""
    cmds, inside = [], False
    for line in section.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash"
            continue
        if inside and line.startswith("bertscope "):
            cmds.append(shlex.split(line)[1:])
    return cmds


def rows(section: str) -> dict[str, str]:
    """The table's key paths -> their type cells."""
    out = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        m = re.fullmatch(r"`([^`]+)`", cells[0])
        assert m and len(cells) == 3, f"a table row is not | `key` | type | meaning |: {line!r}"
        assert m.group(1) not in out, f"key {m.group(1)} is listed twice"
        out[m.group(1)] = cells[1]
    return out


def tokens(path: str) -> list[str]:
    return re.findall(r"\[\]|[^.\[\]]+", path)


def pattern(toks: list[str]) -> str:
    return "".join(t if t == "[]" or i == 0 else "." + t for i, t in enumerate(toks))


def walk(data, path: str, types: dict[str, str]) -> list[tuple[tuple, set[str], object]]:
    """Every (concrete path, documented pattern, value) the documented ``path`` reaches in ``data``
    (its prefixes included); fails where the output lacks it."""
    toks = tokens(path)
    nodes: list[tuple[tuple, object]] = [((), data)]
    found = []
    for i, tok in enumerate(toks):
        here, there = pattern(toks[:i]), pattern(toks[: i + 1])
        nxt = []
        for where, value in nodes:
            if value is None:
                assert "null" in types.get(here, ""), f"{here} is null, and its row does not say it may be"
                continue
            if tok == "[]":
                assert isinstance(value, list), f"{here} is not a list"
                nxt += [(where + (j,), x) for j, x in enumerate(value)]
            elif tok == "*":
                assert isinstance(value, dict), f"{here} is not an object"
                nxt += [(where + (k,), x) for k, x in value.items()]
            else:
                assert isinstance(value, dict), f"{here} is not an object"
                if tok not in value:  # an optional key's own keys are not looked for where it is absent
                    assert "(optional)" in types.get(there, ""), f"documented key {there} is not in the output"
                    continue
                nxt.append((where + (tok,), value[tok]))
        nodes = nxt
        found += [(where, there, x) for where, x in nxt]
    return found


def check_table(table: dict[str, str]) -> None:
    """Each path's parent is a row of its own (but a.* and a[]), typed as an object or a list."""
    for path in table:
        toks = tokens(path)
        for i in range(1, len(toks)):
            parent = pattern(toks[:i])
            if toks[i - 1] in ("*", "[]"):
                continue
            assert parent in table, f"{path} is listed, but {parent} is not"
            kind = "list" if toks[i] == "[]" else "object"
            assert kind in table[parent], f"{path} is listed, but {parent}'s type is not an {kind}"


def check(data, table: dict[str, str]) -> None:
    check_table(table)
    assert isinstance(data, dict)
    top = {re.split(r"[.\[]", k, maxsplit=1)[0] for k in table}
    required = {k for k in top if "(optional)" not in table.get(k, "")}
    assert set(data) <= top and required <= set(data), (
        f"undocumented: {sorted(set(data) - top)}; documented but not printed: {sorted(required - set(data))}")
    nodes: dict[tuple, tuple[object, set[str]]] = {(): (data, {""})}
    for path in table:
        for where, pat, value in walk(data, path, table):
            nodes.setdefault(where, (value, set()))[1].add(pat)
    kids: dict[tuple, set] = {}
    for where in nodes:
        if where:
            kids.setdefault(where[:-1], set()).add(where[-1])
    # objects whose keys vary (a.* rows) are not held to a fixed set of keys
    varying = {pattern(tokens(p)[:i]) for p in table for i, t in enumerate(tokens(p)) if t == "*"}
    for where, (value, pats) in nodes.items():
        if isinstance(value, dict) and where in kids and not pats & varying:
            name = pattern([str(w) if not isinstance(w, int) else "[]" for w in where]) or "(top level)"
            assert set(value) == kids[where], (f"{name}: undocumented keys {sorted(set(value) - kids[where])}")


def test_every_section_is_there():
    assert sorted(sections()) == sorted(SECTIONS)


@pytest.mark.parametrize("name", SECTIONS)
def test_documented_keys_match_the_output(name, tmp_path, monkeypatch, capsys):
    section = sections()[name]
    table = rows(section)
    cmds = commands(section)
    assert table, f"no key table in the section for {name}"
    assert cmds, f"no example command in the section for {name}"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    if name == "doctor":  # measured kernel choices go to this test's folder, not the user's cache
        monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)
    for args in cmds:
        sub = name.split()
        assert args[0] == sub[0] and all(flag in args for flag in sub[1:]), f"{args} is not {name}"
        if sub[0] in TEXT_COMMANDS:
            assert args[1] == IT_ANIMAL
        assert main(args) == 0
        out = capsys.readouterr().out
        if "--out" in args:  # heads --out DIR: the same object, in DIR/heads.json
            data = json.loads((tmp_path / args[args.index("--out") + 1] / "heads.json").read_text(encoding="utf-8"))
        else:
            assert "--json" in args
            data = json.loads(out)
        check(data, table)


def test_the_check_fails_on_a_key_added_or_removed():
    table = {"a": "int", "b": "object", "b.c": "int", "d": "list", "d[].e": "string", "f": "object",
             "f.*.g": "int", "h": "object or null", "h.i": "int", "j": "object", "j.k": "int (optional)"}
    good = {"a": 1, "b": {"c": 2}, "d": [{"e": "x"}], "f": {"any": {"g": 3}}, "h": None, "j": {}}
    check(good, table)
    bad = [{**good, "z": 0}, {k: v for k, v in good.items() if k != "a"}, {**good, "b": {"c": 2, "z": 0}},
           {**good, "b": {}}, {**good, "d": [{"e": "x", "z": 0}]}, {**good, "f": {"any": {}}},
           {**good, "j": None}, {**good, "j": {"k": 1, "z": 0}}]
    for data in bad:
        with pytest.raises(AssertionError):
            check(data, table)
    for broken in ({k: v for k, v in table.items() if k != "b"}, {**table, "a.z": "int"}):
        with pytest.raises(AssertionError):
            check(good, broken)
