"""How long `serve` computes a measure map of its longest text (2,000 characters, 461 tokens of
the bundled model): medians of 3 (docs/BENCHMARKS.md, "A NaN query and the unmasked kernel").

    PYTHONPATH=src python benchmarks/measure_seconds.py
"""
import time, statistics, bertscope
from bertscope.explain import map_measures
b = bertscope.load()
text = ("The animal didn't cross the street because it was too tired. " * 40)[:2000]
n = len(b.tokenizer.encode_segments([text], None, max_length=512)[0][0])
for m in ["norm", "norm-residual", "alti"]:
    ts = []
    for _ in range(3):
        t = time.perf_counter(); map_measures(b, text, [m]); ts.append(time.perf_counter() - t)
    print(f"{m}: {statistics.median(ts):.2f} s for {n} tokens")
