"""Reproduce docs/BENCHMARKS.md: the full CPU benchmark, its JSON, markdown tables and S13 plot.

    PYTHONPATH=src python benchmarks/run_bench.py            # writes benchmarks/results/cpu.{json,md}
                                                             # and docs/s13_cpu.png
    PYTHONPATH=src python benchmarks/run_bench.py --quick    # a smoke run in seconds
    PYTHONPATH=src python benchmarks/run_bench.py --rounds 5 --out benchmarks/results/xeon-amx \
        --plot docs/s13_cpu_xeon_amx.png --section bench-xeon-amx   # also the named section of docs/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertscope.bench.report import write_markdown  # noqa: E402
from bertscope.bench.run import run_bench  # noqa: E402
from bertscope.files import update_section, write_text_atomic  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--preset", default=None)
    p.add_argument("--corpus", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--plot", default=str(ROOT / "docs" / "s13_cpu.png"))
    p.add_argument("--doc", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    p.add_argument("--section", default=None, help="write the tables into this named section of --doc")
    a = p.parse_args()
    from bertscope.cli.bench import check_settings
    from bertscope.errors import InputError

    try:  # as `bertscope bench` checks them: one line, before a run of minutes
        check_settings(a.preset, a.rounds, a.threads)
    except InputError as e:
        print(f"run_bench.py: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    res = run_bench(model=a.model, preset=a.preset, corpus=a.corpus, quick=a.quick, threads=a.threads,
                    rounds=a.rounds, plot=a.plot)
    md = write_markdown(res)
    print(md)  # first: a failure to write below must not lose the run
    sys.stdout.flush()
    out = Path(a.out)
    name = "cpu-quick" if a.quick else "cpu"
    write_text_atomic(out / f"{name}.json", json.dumps(res, indent=1))
    write_text_atomic(out / f"{name}.md", md)
    if a.section:
        update_section(a.doc, a.section, md)
    if res["scaling"].get("plot_error"):
        print(f"could not write the plot: {res['scaling']['plot_error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
