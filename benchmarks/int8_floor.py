"""How fast can int8 get here? The work no int8 path with fp32 attention can skip, timed against
sentence-transformers fp32 and bertscope int8 in the same paired rounds.

    PYTHONPATH=src python benchmarks/int8_floor.py [--rounds 15] [--workloads T128 mixed] [--compiled]
        [--out benchmarks/results/<kind>/int8_floor.json]

Issue 9 asks int8 for 2x sentence-transformers fp32. Where a CPU's int8 GEMM is only about twice
its fp32 rate (x86 without VNNI), is that reachable at all? The "floor" does, for exactly the
batches ``Bert.embed`` forms (same token budget, same length groups), only what any int8 path that
keeps attention, LayerNorm and GELU in fp32 (as issue 9's scheme does, and ONNX Runtime's dynamic
int8 too) must do:

    per batch:  the embeddings (lookup + LayerNorm)
    per layer:  the four integer GEMMs on 8-bit inputs of their real shapes (the model's own
                int8 weights, on the int8 kernel its race chose: oneDNN's or torch._int_mm;
                a linear calibration kept fp32 runs its fp32 GEMM),
                attention on the length groups (the model's own kernels),
                two residual adds, two LayerNorms and GELU, in fp32

and nothing else: no quantizing of activations, no rescaling of the GEMMs' outputs, no offsets, no
fp32 channels, next to no Python. Its inputs are made beforehand (random, of the real shapes), so
its time is a lower bound for an int8 model of this design on this machine, and
sentence-transformers' time / the floor's is the most any such int8 model could reach. Each round
runs sentence-transformers fp32, bertscope int8 (as loaded: its kernel choice) and the floor in
turn on the same texts; ratios are paired per round (median, quartiles, a 95% bootstrap interval).
bertscope int8's output is checked against bertscope fp32's before timing (cosine), and the floor's
shapes against the model's. ``--compiled`` adds bertscope int8 with ``compile=True`` and the
compiled steps forced on (the kernel race may have kept the eager ones), checked the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.corpus import make_texts, mixed_lengths, save_random_checkpoint  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.bench.systems import build_systems  # noqa: E402
from bertscope.cli.common import check_output_file, run_script  # noqa: E402
from bertscope.core.checkpoint import bundled_model_path  # noqa: E402
from bertscope.core.config import BertConfig  # noqa: E402
from bertscope.core.layer import activation  # noqa: E402
from bertscope.fast.batching import token_budget_batches  # noqa: E402
from bertscope.fast.kernels import attention_plan  # noqa: E402
from bertscope.fast.packing import pack_ids  # noqa: E402
from bertscope.errors import BertscopeError  # noqa: E402
from bertscope.fast.quant import COMPILED_KERNEL, Int8Linear, int8_kernel_available  # noqa: E402
from bertscope.files import write_text_atomic  # noqa: E402
from int8_vs_ort import ST, bootstrap_median  # noqa: E402

INT8 = "bertscope int8"
COMPILED = "bertscope int8 compiled"
FLOOR = "int8 floor"


def floor_runner(bert, texts: list[str]):
    """The floor (module doc) for ``bert`` (an int8 :class:`bertscope.Bert`) on ``texts``: a
    callable doing that work once, and the shapes it checked."""
    model, fast = bert.encoder, bert.fast
    cfg = model.config
    C, I, H = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    ids, _ = bert.tokenizer.encode_ids(texts, max_length=bert.max_seq_length)
    with torch.inference_mode():
        choice = fast.prepare(model)
        batch_tokens = choice.batch_tokens if choice is not None else 2048
        slack = choice.slack if choice is not None else None
        g = torch.Generator().manual_seed(0)
        batches = []
        for idx in token_budget_batches([len(t) for t in ids], batch_tokens, None):
            packed = pack_ids([ids[i] for i in idx])
            N = packed.num_tokens
            rows = -(-N // 64) * 64  # as the encoder rounds for oneDNN
            x = model.embeddings(packed.input_ids, packed.token_type_ids, packed.position_ids)  # (N, C)
            linears = fast.gemm.linears(model, x)
            batches.append({
                "packed": packed, "plan": attention_plan(packed, slack), "linears": linears, "rows": rows,
                # 8-bit rows of each kind an int8 kernel takes: uint8 (oneDNN), int8 (torch._int_mm)
                "q": {(K, dt): torch.randint(lo, lo + 128, (rows, K), dtype=dt, generator=g)
                      for K in (C, I) for dt, lo in ((torch.uint8, 0), (torch.int8, -64))},
                "f": {K: torch.randn(rows, K, generator=g) for K in (C, I)},  # fp32 rows (fp32-kept linears)
                "qkv": torch.randn(rows, 3 * C, generator=g),  # (rows, 3C) attention's input
                "x": torch.randn(rows, C, generator=g)})  # (rows, C) the residual stream
    gelu = activation(cfg.hidden_act, in_place=True)

    def gemm(lin, K: int, b: dict) -> torch.Tensor:
        if isinstance(lin, Int8Linear):  # the integer GEMM on whichever kernel the model runs
            q = b["q"][K, torch.int8 if lin.kernel == "int_mm" else torch.uint8]  # (rows, K)
            y = lin.product(q)  # (rows, K)@(K, M) -> (rows, M): fp32 (oneDNN) or int32 (_int_mm)
            return y if y.dtype == torch.float32 else y.float()  # int32 -> fp32: the least _int_mm needs
        return lin(b["f"][K])  # a linear calibration kept fp32: its fp32 GEMM

    shapes = []

    def run():
        with torch.inference_mode():
            for b in batches:
                p = b["packed"]
                model.embeddings(p.input_ids, p.token_type_ids, p.position_ids)  # (N, C)
                for layer, lin in zip(model.layers, b["linears"]):
                    qkv = gemm(lin.qkv, C, b)  # (rows, 3C)
                    ctx = fast.kernels.attend(b["qkv"], p, H, impl="groups", plan=b["plan"])  # (rows, C)
                    o = gemm(lin.output, C, b)  # (rows, C)
                    h = F.layer_norm(b["x"] + o, (C,), layer.attention_norm.weight, layer.attention_norm.bias,
                                     layer.attention_norm.eps)  # (rows, C)
                    a = gelu(gemm(lin.ff_in, C, b))  # (rows, I)
                    y = gemm(lin.ff_out, I, b)  # (rows, C)
                    out = F.layer_norm(h + y, (C,), layer.output_norm.weight, layer.output_norm.bias,
                                       layer.output_norm.eps)  # (rows, C)
                    if not shapes:
                        shapes.append((tuple(qkv.shape), tuple(ctx.shape), tuple(a.shape), tuple(out.shape)))

    run()  # warm-up; records the shapes
    rows = batches[0]["rows"]
    want = ((rows, 3 * C), (rows, C), (rows, I), (rows, C))
    if shapes[0] != want:
        raise SystemExit(f"the floor's shapes {shapes[0]} are not the model's {want}")
    return run, {"batches": len(batches), "batch_tokens": batch_tokens, "slack": slack,
                 "attention_groups": sum(len(b["plan"]) for b in batches)}


def paired(times: dict, num: str, den: str) -> dict:
    """num's time / den's, round by round: median, quartiles, 95% bootstrap interval."""
    r = [n / d for n, d in zip(times[num], times[den])]
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    lo, hi = bootstrap_median(r)
    return {"median": statistics.median(r), "quartiles": [q[0], q[2]], "bootstrap_95": [lo, hi],
            "rounds_over_2": sum(x >= 2.0 for x in r), "per_round": r}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15, help="paired rounds per workload (default 15)")
    p.add_argument("--workloads", nargs="+", choices=("mixed", "T128"), default=["T128", "mixed"])
    p.add_argument("--compiled", action="store_true",
                   help="also time int8 with compile=True, the compiled steps forced on (compiles: slow)")
    p.add_argument("--texts", type=int, default=None, help=argparse.SUPPRESS)  # fewer mixed texts (tests)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    if a.rounds < 3:
        p.error("--rounds must be at least 3")
    if a.out:
        check_output_file(a.out, suffixes=(".json",))  # a folder, or not writable: one line, exit 2
    threads = torch.get_num_threads()
    m = machine()
    result: dict = {"machine": m, "rounds": a.rounds, "workloads": {}}
    print(f"{cpu_label(m)}, {threads} threads, torch {torch.__version__}; "
          f"{a.rounds} paired rounds per workload\n")
    with tempfile.TemporaryDirectory(prefix="bertscope-int8-floor-") as tmp:
        work = Path(tmp)
        for wname in a.workloads:
            if wname == "mixed":
                folder = bundled_model_path()
                lengths = mixed_lengths(a.texts or 256, 5, 256)
            else:
                folder = save_random_checkpoint(BertConfig.preset("bert-base"), work / "equal", bundled_model_path())
                lengths = [128] * (a.texts or 32)
            bert = bertscope.load(folder)
            texts = make_texts(bert.tokenizer, lengths, seed=3 if wname == "mixed" else 2)  # the bench's inputs
            ours = [INT8] + ([COMPILED] if a.compiled else [])
            systems, skipped = build_systems(folder, bert, work / wname, threads, only=[ST] + ours)
            if any(s not in systems for s in [ST] + ours):
                print(f"could not build {[s for s in [ST] + ours if s not in systems]}: {skipped}", file=sys.stderr)
                return 1
            if a.compiled:
                if not int8_kernel_available(COMPILED_KERNEL):
                    raise BertscopeError("--compiled: the compiled int8 steps are not usable on this machine "
                                         "(compiling failed, or they disagree with the eager steps)")
                systems[COMPILED].bert.fast.gemm.int8_kernel = COMPILED_KERNEL  # whatever the race picked
            bert8 = systems[INT8].bert
            ref = systems["bertscope"](texts)
            cosines = {}
            for s in ours:
                cos = (ref * systems[s](texts)).sum(1)
                if not (float(cos.mean()) >= 0.99 and float(cos.min()) >= 0.97):
                    raise SystemExit(f"{s} misses the quality contract here: cosine {cos.mean():.4f} "
                                     f"mean, {cos.min():.4f} min")
                cosines[s] = [float(cos.mean()), float(cos.min())]
            st_diff = float(np.abs(systems[ST](texts) - ref).max())
            if st_diff >= 1e-4:
                raise SystemExit(f"sentence-transformers disagrees with bertscope fp32: max abs diff {st_diff:.1e}")
            floor, info = floor_runner(bert8, texts)
            runs = {ST: systems[ST], **{s: systems[s] for s in ours}, FLOOR: lambda _texts: floor()}
            times: dict[str, list[float]] = {n: [] for n in runs}
            for _ in range(a.rounds):
                for n, f in runs.items():
                    t = time.perf_counter()
                    f(texts)
                    times[n].append(time.perf_counter() - t)
            entry = {"texts": len(texts), "floor": info, "cosine_int8": cosines[INT8], "cosine": cosines,
                     "kernel_choice": bert8.fast.choice.to_json() if bert8.fast.choice else None,
                     "precision_note": bert8.precision_note,
                     "median_s": {n: statistics.median(t) for n, t in times.items()}, "times_s": times,
                     "st_over_int8": paired(times, ST, INT8), "st_over_floor": paired(times, ST, FLOOR),
                     "floor_over_int8": paired(times, FLOOR, INT8)}
            if a.compiled:
                c = systems[COMPILED].bert.fast
                entry["compiled"] = {"kernel_choice": c.choice.to_json() if c.choice else None,
                                     "act_placement": c.gemm.steps.act_placement if c.gemm.steps else None,
                                     "st_over_compiled": paired(times, ST, COMPILED),
                                     "compiled_over_int8": paired(times, COMPILED, INT8)}
            result["workloads"][wname] = entry
            print(f"{wname}: {info['batches']} batches of up to {info['batch_tokens']} tokens, "
                  f"{info['attention_groups']} attention groups per layer pass; cosine to fp32 "
                  + ", ".join(f"{s} {c[0]:.4f} mean, {c[1]:.4f} min" for s, c in cosines.items()), flush=True)
    print("\n| workload | sentence-transformers s | bertscope int8 s | floor s | ST / int8 | ST / floor "
          "(95% interval) | rounds floor ≥ 2× | floor / int8 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for wname, e in result["workloads"].items():
        s = e["median_s"]
        sf = e["st_over_floor"]
        print(f"| {wname} | {s[ST]:.3f} | {s[INT8]:.3f} | {s[FLOOR]:.3f} | {e['st_over_int8']['median']:.2f}× | "
              f"**{sf['median']:.2f}×** ({sf['bootstrap_95'][0]:.2f}-{sf['bootstrap_95'][1]:.2f}) | "
              f"{sf['rounds_over_2']} of {a.rounds} | {e['floor_over_int8']['median']:.2f} |")
    if a.compiled:
        print("\n| workload | bertscope int8 compiled s | ST / compiled (95% interval) | compiled / eager int8 "
              "(95% interval) | W1's activation |")
        print("|---|---:|---:|---:|---|")
        for wname, e in result["workloads"].items():
            c = e["compiled"]
            sc, ce = c["st_over_compiled"], c["compiled_over_int8"]
            print(f"| {wname} | {e['median_s'][COMPILED]:.3f} | **{sc['median']:.2f}×** ({sc['bootstrap_95'][0]:.2f}-"
                  f"{sc['bootstrap_95'][1]:.2f}) | {ce['median']:.3f} ({ce['bootstrap_95'][0]:.3f}-"
                  f"{ce['bootstrap_95'][1]:.3f}) | {c['act_placement']} |")
    if a.out:
        write_text_atomic(Path(a.out), json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)  # a bad --out, or --compiled where the steps are unusable: one line, exit 2
