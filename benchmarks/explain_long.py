"""How long ``bertscope explain --compare`` and ``bertscope view`` take on a long text.

    PYTHONPATH=src python benchmarks/explain_long.py [--rounds 3] [--words 600] [--out FILE.json]

The text is "cat" and ``--words`` more words (600: cut to the model's 512 positions). Each round
times, in this process and on the bundled all-MiniLM-L6-v2, the command's whole run (``explain
TEXT --compare --token cat``, its output discarded) and then each map method's
``bertscope.explain`` call followed by the row ``--compare`` reads from it (``sources`` of
"cat", the last layer), and then ``view TEXT --measure all`` writing its page to a temporary
folder. Reports the median over rounds and the range. Value zeroing is left out (limited to 128
tokens), as both commands leave it out.

To compare two trees of the code, run it once with ``PYTHONPATH`` at each, alternating, on a
machine with nothing else running (``flock /work/cpu.lock`` here).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.cli.app import main as cli  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402

METHODS = ("attention", "norm", "norm-residual", "alti", "rollout")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--words", type=int, default=600, help='words after "cat" (default 600)')
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    if not 1 <= a.rounds <= 100:
        p.error("--rounds must be 1 to 100")
    if not 1 <= a.words <= 100_000:
        p.error("--words must be 1 to 100,000")
    if a.out:
        check_output_file(a.out, suffixes=(".json",))
    text = "cat " + "word " * a.words
    m = machine()
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"bertscope from {Path(bertscope.__file__).parent}")
    bert = bertscope.load()
    times: dict[str, list[float]] = {"explain --compare": [], **{x: [] for x in METHODS}, "view --measure all": []}
    page = Path(tempfile.mkdtemp(prefix="bertscope-explain-long-")) / "page.html"
    for r in range(a.rounds):
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            code = cli(["explain", text, "--compare", "--token", "cat"])
            times["explain --compare"].append(time.perf_counter() - t)
            if code != 0:
                raise SystemExit(f"explain --compare exited with {code}")
            for method in METHODS:
                t = time.perf_counter()
                exp = bertscope.explain(bert, text, method)
                exp.sources("cat")
                times[method].append(time.perf_counter() - t)
            t = time.perf_counter()
            code = cli(["view", text, "--measure", "all", "--out", str(page)])
            times["view --measure all"].append(time.perf_counter() - t)
            if code != 0:
                raise SystemExit(f"view exited with {code}")
            page.unlink()
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    page.parent.rmdir()
    tokens = len(exp.tokens)
    print(f"\n{tokens} tokens, {a.rounds} rounds\n\n| what | median s | range s |\n|---|---:|---|")
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v):.2f} | {min(v):.2f}-{max(v):.2f} |")
    if a.out:
        write_text_atomic(a.out, json.dumps({"machine": m, "tokens": tokens, "rounds": a.rounds,
                                             "bertscope": str(Path(bertscope.__file__).parent),
                                             "times_s": times}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a BertscopeError: one line, exit 2
