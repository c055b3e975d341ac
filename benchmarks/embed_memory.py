"""Does `bertscope embed` stream? Peak memory for 10,000 and 100,000 texts should be the same.

    PYTHONPATH=src python benchmarks/embed_memory.py [--sizes 10000 100000]

Writes a text file of N mixed-length lines (3 to 40 words) for each size, runs `bertscope embed`
on it in a fresh process, and reports wall time, texts/s and that process's peak RSS
(ru_maxrss), plus its RSS sampled every half second while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRAPPER = r"""
import json, resource, sys, threading, time
samples = []
def sample():
    while True:
        with open("/proc/self/statm") as f:
            samples.append(int(f.read().split()[1]) * 4096 / 2**20)
        time.sleep(0.5)
threading.Thread(target=sample, daemon=True).start()
from bertscope.cli.main import main
t = time.perf_counter()
rc = main(sys.argv[1:])
wall = time.perf_counter() - t
print(json.dumps({"rc": rc, "wall_s": wall, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_samples_mib": samples}), file=sys.stderr)
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "embed_memory.json"))
    a = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import bertscope
    from bertscope.bench.corpus import vocab_words

    words = vocab_words(bertscope.load().tokenizer)
    rng = random.Random(0)
    results = []
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.sizes:
            inp = Path(tmp) / f"texts{n}.txt"
            with open(inp, "w") as f:
                for _ in range(n):
                    f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) + "\n")
            r = subprocess.run([sys.executable, "-c", WRAPPER, "embed", str(inp), "--out", str(Path(tmp) / f"out{n}"),
                                "--quiet"], env=env, capture_output=True, text=True)
            stats = json.loads(r.stderr.strip().splitlines()[-1])
            s = stats.pop("rss_samples_mib")
            stats.update(texts=n, texts_per_s=n / stats["wall_s"],
                         rss_mib_at_10_50_90_percent=[s[int(len(s) * q)] for q in (0.1, 0.5, 0.9)] if s else None)
            results.append(stats)
            print(json.dumps(stats))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
