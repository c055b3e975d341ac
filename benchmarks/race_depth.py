"""How deep the kernel choice's int8-kernel race must run to agree with the whole model.

    PYTHONPATH=src python benchmarks/race_depth.py [--rounds 9] [--depths 1 2 3 6] [--out FILE.json]

The kernel choice (``bertscope.fast.tuning``) races the int8 steps, eager against compiled
(``compile=True``'s), through the first layer of the model on a synthetic batch of 2,048 tokens.
In the whole model, consecutive layers on the compiled steps are fused across the layer
boundary (a layer's last step also quantizes the next layer's input), which one layer never
shows; the batch budget's race was biased by running one layer (docs/BENCHMARKS.md).

This script races the same two candidates the way the kernel choice does (same synthetic batch,
same encoder, paired rounds after settling the allocator) through the first k layers of the
bundled all-MiniLM-L6-v2 for each k in ``--depths``, and then times the whole model as users run
it: ``bertscope.load(..., precision="int8")`` twice, one kept on the eager steps and one on the
compiled steps (both calibrated, both with 2,048-token batches and the same 8-bit conversion),
embedding the bench's mixed corpus (256 texts of 5 to 256 tokens) in paired rounds. Each line
reports the median over rounds of the compiled steps' time over the eager steps' in that round:
below 1 means the compiled steps are faster; the race adopts them below 0.95.

Compiling takes about 30 s the first time on a machine. The loads use the usual kernel-choice and
inductor caches.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.errors import InputError  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402

BATCH = 2048


def race_at_depth(model, depth: int, rounds: int, cast: str, levels: dict, plan: tuple | None = None) -> dict:
    """The int8-kernel race through the first ``depth`` layers: {"ratio", "times_s"}. ``plan``
    (the fp32 linears, the fp32 input channels), given, is applied as calibration applies it to
    the whole model; the kernel choice's own race runs without one (it comes before calibration)."""
    from bertscope.fast.encoder import PackedEncoder
    from bertscope.fast.gemm import GemmBackend
    from bertscope.fast.quant import COMPILED_KERNEL
    from bertscope.fast.tuning import _FirstLayers, race, ratios, synthetic_batch

    layers = _FirstLayers(model, depth)
    batch = synthetic_batch(model.config, BATCH, 256)

    def runner(kernel: str):
        gemm = GemmBackend(prefer="onednn", precision="int8", int8_kernel=kernel, levels=levels)
        gemm.use_int8_cast(cast)
        if plan is not None:
            gemm.int8_keep_fp32[layers] = frozenset(x for x in plan[0] if x[0] < depth)
            gemm.int8_channels[layers] = {k: v for k, v in plan[1].items() if k[0] < depth}
        encoder = PackedEncoder(gemm=gemm)

        def run():
            with torch.inference_mode():
                return encoder.encode(layers, batch, slack=0.0)
        return run

    times = race({"eager": runner("onednn"), "compiled": runner(COMPILED_KERNEL)}, 0.0, min_rounds=rounds)
    if not isinstance(times["compiled"], list):  # the compiled steps fail on this machine
        raise InputError(f"the compiled int8 steps do not run here ({times['compiled']}): nothing to race")
    return {"ratio": ratios(times, "eager")["compiled"], "times_s": times}


def whole_model(rounds: int) -> dict:
    """The two steps on the whole model, embedding the bench's mixed corpus: {"ratio", "times_s", "choice"}."""
    import bertscope
    from bertscope.bench.corpus import make_texts, mixed_lengths
    from bertscope.fast.quant import COMPILED_KERNEL
    from bertscope.fast.tuning import race, ratios

    # int8 kept even where it measures no faster than fp32 here: the question is the steps' race
    eager = bertscope.load(precision="int8", keep_precision=True)
    compiled = bertscope.load(precision="int8", compile=True, keep_precision=True)
    texts = make_texts(eager.tokenizer, mixed_lengths(256, 5, 256), seed=3)  # the bench's mixed inputs
    eager.embed(texts[:2])  # the kernel choice is made at the first inference
    compiled.embed(texts[:2])
    raced = compiled.fast.choice
    if COMPILED_KERNEL not in (raced.ratios.get("int8_kernel") or {}):
        why = (raced.timings.get("int8_kernel") or {}).get(COMPILED_KERNEL, "not raced")
        raise InputError(f"the compiled int8 steps do not run here ({why}): nothing to race")
    for bert, kernel in ((eager, "onednn"), (compiled, COMPILED_KERNEL)):
        bert.fast.apply(dataclasses.replace(bert.fast.choice, int8_kernel=kernel, batch_tokens=BATCH,
                                            int8_cast=raced.int8_cast))
    times = race({"eager": lambda: eager.embed(texts, batch_tokens=BATCH),
                  "compiled": lambda: compiled.embed(texts, batch_tokens=BATCH)}, 0.0, min_rounds=rounds)
    return {"ratio": ratios(times, "eager")["compiled"], "times_s": times, "cast": raced.int8_cast,
            "load_race": raced.ratios.get("int8_kernel"), "model": compiled.encoder,
            "plan": (compiled.fast.gemm.int8_keep_fp32[compiled.encoder],
                     compiled.fast.gemm.int8_channels[compiled.encoder])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=9, help="paired rounds per line (default 9)")
    p.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 6], help="layers raced (default 1 2 3 6)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    if a.rounds < 3:
        p.error("--rounds must be at least 3")
    if any(d < 1 for d in a.depths):
        p.error("--depths must be 1 or more")
    if a.out:  # checked before minutes of measuring, not after: one line, exit 2
        check_output_file(a.out, suffixes=(".json",))
    m = machine()
    print(f"{cpu_label(m)}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{a.rounds} paired rounds per line\n", flush=True)
    whole = whole_model(a.rounds)
    model, plan = whole.pop("model"), whole.pop("plan")
    whole["plan"] = {"fp32_linears": sorted(plan[0]), "fp32_channels": {f"{i} {n}": list(c) for (i, n), c in plan[1].items()}}
    depths = sorted({min(d, model.config.num_hidden_layers) for d in a.depths})
    result = {"machine": m, "rounds": a.rounds, "batch_tokens": BATCH, "whole_model": whole, "race": {}}
    print("| what runs | compiled steps' time / eager steps', median of paired rounds | rounds below 0.95 |")
    print("|---|---:|---:|")
    for d in depths:
        for calibrated in (False, True):
            r = race_at_depth(model, d, a.rounds, whole["cast"], {}, plan if calibrated else None)
            result["race"][f"{d}{' calibrated' * calibrated}"] = r
            below = sum(c / e < 0.95 for c, e in zip(r["times_s"]["compiled"], r["times_s"]["eager"]))
            print(f"| race, first {d} layer{'s' * (d > 1)} ({BATCH} synthetic tokens"
                  f"{', with the calibrated plan' * calibrated}) | {r['ratio']:.3f} | {below} of {a.rounds} |",
                  flush=True)
    t = whole["times_s"]
    below = sum(c / e < 0.95 for c, e in zip(t["compiled"], t["eager"]))
    print(f"| whole model, mixed corpus (eager {statistics.median(t['eager']):.3f} s) | {whole['ratio']:.3f} | "
          f"{below} of {a.rounds} |")
    if a.out:
        write_text_atomic(Path(a.out), json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)
