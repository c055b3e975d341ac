"""How long ONNX Runtime's threads keep the CPUs busy after its call (docs/BENCHMARKS.md, "Order
in the rounds"): bertscope fp32's time right after an ONNX Runtime call and right after its own,
with a pause of 0 to 100 ms between, medians of 10 interleaved calls, on the bench's own adapters.

    PYTHONPATH=src python benchmarks/settle_order.py
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import bertscope  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.bench.systems import build_systems  # noqa: E402

WORDS = "the animal did not cross street because it was too tired wide model head layer token".split()


def main() -> int:
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) for _ in range(12)]
    bert = bertscope.load()
    with tempfile.TemporaryDirectory() as tmp:
        systems, skipped = build_systems(bertscope.bundled_model_path(), bert, Path(tmp), 2,
                                         only=["onnxruntime"], quick=True)
        if "onnxruntime" not in systems:
            print(f"onnxruntime: {skipped.get('onnxruntime')}", file=sys.stderr)
            return 1
        ours, ort = systems["bertscope"], systems["onnxruntime"]
        for f in (ours, ort, ours, ort):  # warm-up
            f(texts)

        def timed(f) -> float:
            t = time.perf_counter()
            f(texts)
            return time.perf_counter() - t

        print(f"{cpu_label(machine())}, 2 threads; {machine()['versions']}")
        print("| pause before the call | bertscope fp32 after an ONNX Runtime call | after a bertscope call |")
        print("|---|---:|---:|")
        for gap in (0, 0.005, 0.02, 0.05, 0.1):
            after_ort, after_ours = [], []
            for _ in range(10):
                ort(texts)
                time.sleep(gap)
                after_ort.append(timed(ours))
                ours(texts)
                time.sleep(gap)
                after_ours.append(timed(ours))
            print(f"| {gap * 1e3:.0f} ms | {1e3 * statistics.median(after_ort):.1f} ms "
                  f"| {1e3 * statistics.median(after_ours):.1f} ms |")
        a, b = [], []
        for _ in range(10):
            ours(texts)
            a.append(timed(ort))
            ort(texts)
            b.append(timed(ort))
        print(f"\nONNX Runtime fp32, no pause: after a bertscope call {1e3 * statistics.median(a):.1f} ms, "
              f"after its own {1e3 * statistics.median(b):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
