"""Benchmark results as Markdown (docs/BENCHMARKS.md) and the S13 figure."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..fast.quant import INT8_KERNELS
from ..files import write_bytes_atomic
from .machine import cpu_label
from .scaling import MIN_FIT_MIB

__all__ = ["PLOT_SUFFIXES", "plot_scaling", "render_scaling_plot", "systems_table", "write_markdown"]

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def render_scaling_plot(result: dict, fmt: str = "png") -> bytes:
    """The S13 plot of ``result`` (:func:`bertscope.bench.scaling.scaling`'s dict) as png/svg/pdf bytes."""
    from ..see.figures import scaling_plot

    return scaling_plot(result, fmt)


def plot_scaling(result: dict, path: Path) -> Path:
    """Write the S13 plot to ``path`` (.png, .svg or .pdf) atomically: rendered in memory, then
    a temporary file renamed into place."""
    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"the plot must end in {' or '.join(PLOT_SUFFIXES)}, got {str(path)!r}")
    return write_bytes_atomic(path, render_scaling_plot(result, path.suffix.lower()[1:]))


def systems_table(w: dict, seconds: str = ".3f", gflops: str = ".1f") -> list[str]:
    """Markdown rows comparing the systems of one timed workload (as compare_and_time returns it)."""
    # speed-up: the system's time over bertscope fp32's (above 1: bertscope fp32 is faster; a
    # bertscope int8 or bf16 row below 1 is that mode's gain over fp32)
    lines = ["| system | median s | real tokens/s | useful GFLOP/s | its time / bertscope fp32's | paired | "
             "max abs diff vs bertscope |", "|---|---:|---:|---:|---:|---:|---:|"]
    x = lambda v: "—" if v is None else f"{v:.2f}×"  # noqa: E731
    for name, s in w["systems"].items():
        sp = w["bertscope_speedup"].get(name)
        paired = (w.get("bertscope_speedup_paired") or {}).get(name)
        diff = w["max_abs_diff_vs_bertscope"].get(name)
        lines.append(f"| {name} | {s['median_s']:{seconds}} | {s['tokens_per_s']:,.0f} | {s['useful_gflops']:{gflops}} | "
                     f"{x(sp)} | {x(paired)} | {'—' if diff is None else f'{diff:.1e}'} |")
    return lines


def int8_steps_text(c: dict) -> str:
    """How a kernel choice (as JSON) runs the int8 steps around the integer GEMM: ", 8-bit cast X"
    for the eager steps, ", activation fused|apart" for the compiled ones; "" for a choice that
    did not record it."""
    if c.get("int8_kernel") in INT8_KERNELS:
        return f", 8-bit cast {c['int8_cast']}" if "int8_cast" in c else ""
    return f", activation {c['int8_act']}" if "int8_act" in c else ""


def setup_lines(w: dict) -> list[str]:
    """What each bertscope system chose on this machine (kernel choice, precision notes)."""
    out = []
    for name, info in (w.get("bertscope_setup") or {}).items():
        c = info.get("kernel_choice")
        txt = f"- {name}: "
        if c:
            txt += (f"kernel choice ({c['source']}): {c['gemm']} GEMMs, {c['batch_tokens']}-token batches, "
                    f"attention slack {c['slack']:g}")
            if c.get("not_raced"):  # left at the plain values: their races would not fit the budget
                txt += f" ({' and '.join(c['not_raced'])} not raced within the budget)"
            if info.get("precision") == "int8":
                txt += f", int8 kernel {c['int8_kernel']}"
                txt += int8_steps_text(c)
        if info.get("note"):
            txt += f"; {info['note']}"
        out.append(txt)
    return [""] + out if out else []


def quality_lines(w: dict) -> list[str]:
    """Reduced-precision systems against bertscope fp32, and the int8 contract's verdict."""
    q = w.get("quality_vs_fp32") or {}
    if not q:
        return []
    out = ["", "| reduced precision | cosine to fp32: mean | min | top-10 neighbour overlap |", "|---|---:|---:|---:|"]
    for name, a in q.items():
        overlap = (f"{a['top10_overlap']:.3f}" if a["top10_overlap"] is not None
                   else f"n/a ({a['texts']} texts: each has every other as a neighbour; needs 12 or more)")
        out.append(f"| {name} | {a['cosine_mean']:.4f} | {a['cosine_min']:.4f} | {overlap} |")
    verdicts = w.get("int8_contracts") or ({"bertscope int8": w["int8_contract"]} if w.get("int8_contract") else {})
    for name, verdict in verdicts.items():
        terms = []
        for k, v in verdict.items():
            m = v["measured"]
            shown = "not measured" if m is None else (f"{m:.2f}×" if k.startswith("speedup") else f"{m:.4f}")
            terms.append(f"{k.replace('_', ' ')} ≥ {v['required']:g}: {shown} "
                         f"({'—' if v['holds'] is None else 'holds' if v['holds'] else 'FAILS'})")
        out += ["", f"int8 quality contract, {name}: " + "; ".join(terms) + "."]
    return out


def write_markdown(r: dict) -> str:
    """The results as markdown tables (for docs/BENCHMARKS.md)."""
    m = r["machine"]
    # the name, family numbers, flags and any instruction-set limits, as every benchmark names them
    lines = [f"Machine: {cpu_label(m)}, {m['logical_cpus']} logical CPUs, {m['torch_threads']} torch threads; "
             f"{m.get('gpu', 'no GPU used') if r['device'] != 'cpu' else 'CPU'}; dtype {r['dtype']}; "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
             *([f"\nC allocator, for every system in this process: {m['heap']['detail']}."] if m.get("heap") else []),
             *([f"\n**Warning**: {w}." for w in r.get("warnings", []) if "other processes took" in w]),
             "", f"Measured fp32 matmul peak (best of {r.get('matmul_peak_shapes', '1024³, 2048³, 4096×768×3072')}; "
                 f"torch.mm): **{r['matmul_peak_gflops']:.1f} GFLOP/s**"
             + (f"; through oneDNN: **{r['matmul_peak_onednn_gflops']:.1f} GFLOP/s**"
                if r.get("matmul_peak_onednn_gflops") else "") + ".", ""]
    for wname, w in r["workloads"].items():
        lines += [f"### {w.get('label', wname)}: {w['texts']} texts, {w['real_tokens']} real tokens "
                  f"(lengths {w['length_range'][0]}–{w['length_range'][1]}), {w['model']}; {cpu_label(m)}", "",
                  ] + systems_table(w)
        lines.append(f"\nbertscope's useful GFLOP/s are {100 * w['bertscope_fraction_of_matmul_peak']:.0f}% of the "
                     "higher measured matmul peak.")
        lines += setup_lines(w) + quality_lines(w)
        for name, why in w["skipped"].items():
            lines.append(f"Skipped {name}: {why}.")
        lines.append("")
    s = r["scaling"]
    lines += [f"### S13: cost against length (batch of 1, {s['config']['hidden_size']} hidden, "
              f"{s['config']['num_hidden_layers']} layers)", "",
              "| T | attention alone ms | whole model ms | attention peak MiB | model peak MiB |", "|---:|---:|---:|---:|---:|"]
    am, mm = s["attention"].get("peak_mib") or [], s["model"].get("peak_mib") or []
    for i, T in enumerate(s["lengths"]):
        lines.append(f"| {T} | {1e3 * s['attention']['time_s'][i]:.2f} | {1e3 * s['model']['time_s'][i]:.1f} | "
                     f"{am[i] if i < len(am) else float('nan'):.1f} | {mm[i] if i < len(mm) else float('nan'):.1f} |")
    lines.append("")
    for kind in ("attention", "model"):
        e = s[kind]
        if e.get("time_exponent") is not None:
            txt = f"- {kind}: time grows as T^{e['time_exponent']:.2f}"
        else:
            txt = f"- {kind}: time exponent n/a ({e.get('time_exponent_note', 'not fitted')})"
        if e.get("memory_exponent") is not None:
            txt += f", peak memory as T^{e['memory_exponent']:.2f}"
        elif "memory_exponent" in e:
            txt += f", peak memory exponent n/a (some peaks ≤ {MIN_FIT_MIB} MiB, too small to fit)"
        if "ratio_512_vs_192" in e:
            txt += f"; 512 vs 192 tokens: **{e['ratio_512_vs_192']:.1f}×** the time (seed claims {s['seed_claim_512_vs_192']:.1f}×)"
        if "memory_ratio_512_vs_192" in e:
            txt += f", {e['memory_ratio_512_vs_192']:.1f}× the memory"
        lines.append(txt)
    return "\n".join(lines) + "\n"
