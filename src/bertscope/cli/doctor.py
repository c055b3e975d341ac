"""bertscope doctor: the machine, and the fast-path kernels measured to win on it."""

from __future__ import annotations

import argparse
import logging
import os

from .common import MODEL_HELP, check_preset, print_json

HELP = """\
Show what this machine is and which kernels bertscope's fast path uses on it, and why.

What to look for: each precision's "runs in" line (int8 or bf16 asked for but running fp32 says
why: on a CPU without VNNI int8 may be no faster); "measured on a busy machine" (the choice
holds for this run only: run doctor --retune when the machine is quiet); and the fp32 GEMM rate
(a cached choice is measured again when this machine's rate moves 2x: another host). A sample:

  fp32: runs in fp32
    choice (cache): onednn GEMMs, 2048-token batches, attention slack 0
  int8: runs in int8 -- int8 (onednn kernel); 0 of 24 linears kept fp32, ...; 1.70x the speed
        of fp32 on the calibration texts

Machine: the CPU model and the instruction sets that decide which kernels are fast (AVX2,
AVX-512, AVX512-BF16, VNNI, AMX), logical CPUs (and those usable here, where fewer), torch and its
threads, and which of torch's kernels work here (oneDNN's fp32 linear, oneDNN's int8 matmul,
torch._int_mm).

Heap: on glibc, the fast path's first run on the CPU fixes the C allocator's mmap threshold at
32 MiB and its trim threshold at 256 MiB, for the whole process, so that freed activations stay
in the process instead of being returned to the system and faulted in again on the next batch
(on an AMD EPYC, BERT-base's compiled int8 steps paid up to 515,000 page faults per 4,096-token
call without it, depending on the process). It costs up to 256 MiB of freed memory kept.
BERTSCOPE_HEAP=system leaves glibc's defaults; thresholds set in the environment (MALLOC_*_,
GLIBC_TUNABLES) and allocators other than glibc's are left alone. The heap line says which
applies.

Kernel choice, per precision (fp32, bf16, int8): the first time a model shape meets a machine,
bertscope times each candidate on one layer of the model -- oneDNN with pre-packed weights or
BLAS F.linear; 1,024, 2,048 or 4,096 tokens per batch (on the first three layers: one layer
overstates what a larger batch saves; a size whose activations reach 31 MiB, which the C
allocator then maps fresh from the system, paying page faults, is shown as not raced); exact
length groups or 10% / 30% padding in attention; for int8 oneDNN's int8 matmul or
torch._int_mm; for bf16 bf16 against fp32 --
within a budget of about 2 s, and caches the winners under the cache folder shown
(BERTSCOPE_CACHE_DIR sets it; BERTSCOPE_TUNE=0 turns measuring off; a choice older than a week
is measured again).
Budget: the GEMM library (int8 kernel, bf16) is always raced, three rounds at least. The batch
size and the slack are raced only when their estimated least time (the model's FLOPs at the
machine's GEMM rate) fits their share of the budget; otherwise they keep the plain path's value
and the report says "not raced". --budget S measures again, racing everything that fits in S
seconds, and the fuller choice is cached for every later load (BERTSCOPE_TUNE_BUDGET sets the
budget for any bertscope command that measures a choice).
Candidates run in turn, round after round, and each is compared with the plain path (BLAS,
2,048 tokens, exact groups) in the same round; one replaces the plain path only if the median
of those ratios says it is more than 5% faster. Times are median seconds per 1,000 tokens
through one layer (batch sizes: the first three layers), with the median ratio to the plain
path in brackets. bf16 runs only where the CPU has AVX512-BF16 or AMX, it measured faster
than fp32, and embeddings stayed within the stated bound; int8 shows which linears its
calibration kept in fp32.

--json prints one object: "machine" (cpu; cpu_id: vendor, family, model, stepping, where the CPU
gives them; cpu_flags; isa_limits: the instruction-set level torch's kernels use, and any limit
set in the environment; logical_cpus; usable_cpus: those this process can use, its
affinity and a container's CPU quota; torch, torch_threads; "has": the instruction sets as
true/false; "heap": kept, detail, and glibc's mmap_threshold and trim_threshold in bytes),
"kernels_available" (true/false each), "cache_dir", "tuning_enabled", "model" (the folder, or
the preset), and "precisions": {fp32, bf16, int8} -> {"in_use" (the precision it runs in),
"note", "warnings", "choice", and for int8 "int8_calibration"}. In a choice: gemm, batch_tokens
(tokens), slack (a share) and, for int8, int8_kernel, int8_cast and int8_act are the winners (in
an fp32 or bf16 choice the int8 fields hold the plain path's values, unused); "timings" are
median seconds per 1,000 tokens through one layer, "ratios" the median of a candidate's time
over the plain path's in the same round (below 1 is faster); bf16_speedup and int8_speedup are
whole-model speeds as multiples of fp32's (above 1 is faster); "source" is measured, cache or
default; measured_at is Unix time; gemm_gflops the fp32 GEMM rate in GFLOP/s; budget_s and
seconds the budget and the time measuring took; not_raced the steps left at the plain path's
value, and why; busy the share (0 to 1) of the CPUs other processes took meanwhile, busy_threads
the model runs other threads of the same process made meanwhile (above 0: not cached); "path" the
cache file; "key" what the cache is keyed by. The measured numbers (timings, ratios, the speeds,
busy, gemm_gflops, seconds) are given to 4 significant digits; the cache file keeps them whole.
int8_calibration: errors (each linear's relative error on the calibration tokens; over
error_limit it stays fp32: keep_fp32), fp32_channels
(input channels kept in fp32), cosine_mean and cosine_min to fp32 on the calibration texts
(cosine_floor: what they must reach), and steps: each decision the calibration made, as a line.

examples:
  bertscope doctor
  bertscope doctor --json
  bertscope doctor --retune --precision fp32      # measure again, replacing the cached choice
  bertscope doctor --budget 30                    # measure again; batch sizes and slack race if they fit
  bertscope doctor --preset bert-base              # BERT-base shapes (random weights)
"""


def register(sub) -> None:
    p = sub.add_parser("doctor", help="the machine, and the kernels measured to be fastest on it",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", metavar="NAME", default=None, help="bert-base, bert-large or minilm-l6 (random weights)")
    g.add_argument("--model", metavar="PATH", default=None, help=MODEL_HELP)
    p.add_argument("--precision", choices=["fp32", "bf16", "int8", "all"], default="all",
                   help="which precision's choice to show (default: all)")
    p.add_argument("--retune", action="store_true", help="measure again even where a choice is cached")
    p.add_argument("--budget", metavar="S", type=_seconds, default=None,
                   help="measure the choice again (as --retune) within S seconds (default budget: about 2)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _seconds(text: str) -> float:
    from ..fast.tuning import TuningError, parse_budget

    try:
        return parse_budget(text)
    except TuningError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# races that time one step of a layer, not the layer: their seconds are not comparable with the rows'
_PART = {"int8_cast": "the 8-bit conversions of one layer's inputs, alone",
         "int8_act": "W1's activation step, alone"}


def _timings(choice: dict, in_use: str | None = None) -> list[str]:
    """The candidates' lines, the winner of each step marked; ``in_use``: the precision the model
    runs in, which is the bf16 step's winner (bf16 or fp32)."""
    lines = []
    winners = {"gemm": choice["gemm"], "batch_tokens": str(choice["batch_tokens"]),
               "slack": str(float(choice["slack"])), "int8_kernel": choice["int8_kernel"],
               "int8_cast": choice.get("int8_cast", "direct"), "int8_act": choice.get("int8_act", "fused")}
    if in_use in ("bf16", "fp32"):
        winners["bf16"] = in_use
    for step, times in choice.get("timings", {}).items():
        cells = []
        rel = choice.get("ratios", {}).get(step, {})
        for cand, t in times.items():
            mark = " *" if winners.get(step) == cand else ""
            ratio = f" ({rel[cand]:.2f})" if cand in rel else ""
            cells.append(f"{cand} {t:.4f}{ratio}{mark}" if isinstance(t, float) else f"{cand} {t}")
        part = f"   [{_PART[step]}]" if step in _PART else ""
        lines.append(f"    {step:<13} " + "   ".join(cells) + part)
    for step, why in choice.get("not_raced", {}).items():
        lines.append(f"    {step:<13} not raced: {why}; kept {winners.get(step, '')} (--budget S races it)")
    return lines


class _OnceBusy(logging.Filter):
    """Lets through the first "the kernel choice holds for this run only" warning, not the next."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("the kernel choice holds for this run only"):
            return True
        first, self.seen = not self.seen, True
        return first


def run(args: argparse.Namespace) -> int:
    from ..bench.doctor import diagnose
    from ..bench.report import int8_steps_text
    from ..errors import InputError
    from ..fast.tuning import BATCH_RACE_LAYERS, HOST_SPEED_CHANGE, busy_note, describe_cpu, tuning_enabled

    check_preset(args.preset)
    if (args.retune or args.budget is not None) and not tuning_enabled():
        raise InputError("--retune and --budget measure the kernel choice, which BERTSCOPE_TUNE=0 turns off: "
                         "unset BERTSCOPE_TUNE (or set it to 1) to measure")
    if args.budget is not None:  # read by the kernel choice wherever this process measures one
        os.environ["BERTSCOPE_TUNE_BUDGET"] = repr(args.budget)
    precisions = ("fp32", "bf16", "int8") if args.precision == "all" else (args.precision,)
    tuning_log = logging.getLogger("bertscope.fast.tuning")
    once = _OnceBusy()  # each choice measured while busy warned alike: once is enough (the report says which)
    tuning_log.addFilter(once)
    try:
        res = diagnose(model=args.model, preset=args.preset, precisions=precisions,
                       retune=args.retune or args.budget is not None)
    finally:
        tuning_log.removeFilter(once)
    if args.json:
        print_json(res)
        return 0
    m = res["machine"]
    yes = lambda v: "yes" if v else "no"  # noqa: E731
    ident = describe_cpu(m.get("cpu_id"))
    usable = m.get("usable_cpus", m["logical_cpus"])
    fewer = "" if usable == m["logical_cpus"] else f" ({usable} usable here)"
    print(f"CPU:      {m['cpu']}{f' ({ident})' if ident else ''}, {m['logical_cpus']} logical CPUs{fewer}; "
          f"torch {m['torch']}, {m['torch_threads']} threads")
    print(f"flags:    {' '.join(m['cpu_flags']) or '(none of the tracked ones)'}")
    h = m["has"]
    print(f"          AVX2 {yes(h['avx2'])}, AVX-512 {yes(h['avx512'])}, AVX512-BF16 {yes(h['avx512_bf16'])}, "
          f"VNNI {yes(h['vnni'])}, AMX {yes(h['amx'])}")
    print(f"ISA:      ATen dispatches {m['isa_limits']['aten']}" + "".join(
        f"; {k}={v}" for k, v in m["isa_limits"].items() if k != "aten"))
    k = res["kernels_available"]
    print("kernels:  " + ", ".join(f"{name} {yes(v)}" for name, v in k.items()))
    print(f"heap:     {m['heap']['detail']}")
    print(f"cache:    {res['cache_dir']}" + ("" if res["tuning_enabled"] else " (BERTSCOPE_TUNE=0: not measuring)"))
    print(f"model:    {res['model']}")
    for precision, e in res["precisions"].items():
        c = e["choice"]
        print(f"\n{precision}: runs in {e['in_use']}" + (f" -- {e['note']}" if e["note"] else ""))
        if c:
            print(f"  choice ({c['source']}{', ' + format(c['seconds'], '.1f') + ' s' if c['source'] == 'measured' else ''}{'; budget ' + format(c['budget_s'], 'g') + ' s' if c['source'] == 'measured' and c.get('budget_s') else ''}): "
                  f"{c['gemm']} GEMMs, {c['batch_tokens']}-token batches, attention slack {c['slack']:g}"
                  + (f", int8 kernel {c['int8_kernel']}" if precision == "int8" else "")
                  + (int8_steps_text(c) if precision == "int8" else "")
                  + (f", bf16 {c['bf16_speedup']:.2f}x fp32" if c.get("bf16_speedup") else ""))
            if c["source"] == "measured" and busy_note(c.get("busy")):  # timed others' work too
                print(f"  measured on a busy machine: {busy_note(c['busy'])}; run doctor --retune when it is quiet")
            if c.get("gemm_gflops"):
                print(f"  fp32 GEMM rate when measured: {c['gemm_gflops']:.1f} GFLOP/s (a cached choice is measured "
                      f"again if this machine's moves {HOST_SPEED_CHANGE}x either way)")
            print(f"  candidates (median s per 1,000 tokens, one layer unless [said]; batch sizes: the first "
                  f"{BATCH_RACE_LAYERS} layers; in brackets the median of each round's time over the first's, which decides; * = chosen):")
            for line in _timings(c, e["in_use"] if precision == "bf16" else None):
                print(line)
        cal = e.get("int8_calibration")
        if cal:
            worst = sorted(cal["errors"].items(), key=lambda kv: -kv[1])[:3]
            print(f"  int8 calibration on {cal['tokens']} tokens: kept fp32: {', '.join(cal['keep_fp32']) or 'none'}; "
                  f"largest errors {', '.join(f'{n} {v:.3f}' for n, v in worst)} (limit {cal['error_limit']}); "
                  f"cosine to fp32 {cal['cosine_mean']:.4f} mean, {cal['cosine_min']:.4f} min")
            chans = cal.get("fp32_channels") or {}
            if chans:
                shown = "; ".join(f"{n} {', '.join(map(str, c))}" for n, c in list(chans.items())[:4])
                print(f"  fp32 input channels of the int8 linears (largest |x| in calibration): {shown}"
                      + (f"; ... ({len(chans) - 4} more in --json)" if len(chans) > 4 else ""))
    return 0
