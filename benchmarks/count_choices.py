"""How often did the kernel choice race the batch size and the slack, and what did it keep?

    python benchmarks/count_choices.py [FOLDER ...] [--json]

Reads every JSON file under the folders (default: benchmarks/results/) and finds every kernel
choice recorded in them (a mapping with a string "gemm", "batch_tokens" and "slack": what
`bench`, `doctor --json` and the benchmark scripts write). One choice is often recorded many
times (each system of a bench run that reads it from the cache, each script that reports it), so
choices are counted once per measurement: by their "measured_at" time where they have one. A
batch size that a flag set (`"batch_tokens_from"`) or a GEMM library that the environment forced
(`"gemm_from"`) is not the choice's, and is not counted as one.

Prints, for the distinct choices: how many kept the plain batch size (2,048 tokens) and the plain
slack (0), how many of them say the race was left out to keep the budget (`"not_raced"`, recorded
from the twenty-second session on), and the GEMM library and int8 kernel they picked. The README's
figures on the kernel choice come from this script.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAIN_BATCH_TOKENS, PLAIN_SLACK = 2048, 0.0
OVERRIDES = {"batch_tokens_from", "gemm_from"}  # a value a flag or the environment set, not the choice's


def choices_in(obj) -> list[dict]:
    """Every kernel choice recorded anywhere inside a parsed JSON document."""
    found, stack = [], [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            if isinstance(o.get("gemm"), str) and "batch_tokens" in o and "slack" in o:
                found.append(o)
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return found


def distinct(choices: list[dict]) -> list[dict]:
    """One record per measured choice, grouped by "measured_at": of each group, the first record
    that no flag or environment overrode, else the group's first. Records without "measured_at"
    (older files) each count as their own choice."""
    groups: dict = {}
    out = []
    for c in choices:
        when = c.get("measured_at")
        if when is None:
            out.append([c])
        elif when in groups:
            groups[when].append(c)
        else:
            groups[when] = [c]
            out.append(groups[when])
    return [next((c for c in g if not OVERRIDES.intersection(c)), g[0]) for g in out]


def count(folders: list[Path]) -> dict:
    records, files, unreadable = [], 0, []
    for folder in folders:
        for path in sorted(folder.rglob("*.json")):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                unreadable.append(str(path))
                continue
            files += 1
            records.extend(choices_in(doc))
    cs = distinct(records)
    own_batch = [c for c in cs if "batch_tokens_from" not in c]
    own_gemm = [c for c in cs if "gemm_from" not in c]
    with_note = [c for c in cs if "not_raced" in c]
    return {
        "files": files,
        "unreadable": unreadable,
        "records": len(records),
        "choices": len(cs),
        "batch_tokens": {"counted": len(own_batch),
                         "kept_plain": sum(c["batch_tokens"] == PLAIN_BATCH_TOKENS for c in own_batch),
                         "values": dict(collections.Counter(c["batch_tokens"] for c in own_batch))},
        "slack": {"counted": len(cs), "kept_plain": sum(float(c["slack"]) == PLAIN_SLACK for c in cs),
                  "values": dict(collections.Counter(float(c["slack"]) for c in cs))},
        "not_raced": {"recorded_in": len(with_note),
                      "batch_tokens": sum("batch_tokens" in c["not_raced"] for c in with_note),
                      "slack": sum("slack" in c["not_raced"] for c in with_note)},
        "gemm": dict(collections.Counter(c["gemm"] for c in own_gemm)),
        "int8_kernel": dict(collections.Counter(c["int8_kernel"] for c in cs if c.get("int8_kernel"))),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="*", type=Path, default=[ROOT / "benchmarks" / "results"],
                   help="folders searched for JSON files (default: benchmarks/results/)")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    a = p.parse_args(argv)
    missing = [str(f) for f in a.folders if not f.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    r = count(a.folders)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    b, s, n = r["batch_tokens"], r["slack"], r["not_raced"]
    print(f"{r['choices']} distinct kernel choices ({r['records']} records in {r['files']} JSON files)")
    print(f"batch size: the plain {PLAIN_BATCH_TOKENS} tokens kept in {b['kept_plain']} of {b['counted']} "
          f"(values: {b['values']})")
    print(f"slack: the plain 0 kept in {s['kept_plain']} of {s['counted']} (values: {s['values']})")
    print(f"{n['recorded_in']} choices say which races were left out to keep the budget: "
          f"the batch size in {n['batch_tokens']}, the slack in {n['slack']}")
    print(f"GEMM library: {r['gemm']}; int8 kernel: {r['int8_kernel']}")
    for path in r["unreadable"]:
        print(f"note: not JSON, skipped: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
