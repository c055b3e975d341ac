"""Every figure bertscope draws, and the only module that imports matplotlib. Needs the ``plot`` extra.

matplotlib is imported here only, when a function of this module is called, so ``import
bertscope`` stays free of it. Figures are built with matplotlib's object API (no pyplot, no
global state, no display needed), then written atomically with :func:`bertscope.files.write_bytes_atomic`.

    head_figure, grid_figure     attention of one head, or of every layer x head (``bertscope plot``)
    heatmap_png, save_heatmap    a (layers, heads) table of numbers as a heatmap (heads, experiments)
    save_class_map               the pattern class of every head
    line_plot                    one value per layer, several series (experiments)
    faithfulness_plot            mean ± sd per layer of each explain method's agreement, per reference
    scaling_plot                 S13: time and memory against length (bench)
    tradeoff_plot                fine-tuning at several max_lengths: accuracy and time (train)

Shape legend: N layers, H heads, T tokens, W words.
"""

from __future__ import annotations

import io
import math
import os
import re
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..errors import InputError, as_index, setting, warn_caller
from ..core.words import word_attention
from ..files import write_bytes_atomic
from .report import ReportText

__all__ = ["FORMATS", "PLOT_HINT", "faithfulness_plot", "figure_bytes", "grid_figure", "has_matplotlib", "head_figure",
           "heatmap_png", "line_plot", "require_matplotlib", "save_class_map", "save_figure", "save_heatmap",
           "scaling_plot", "tradeoff_plot", "units"]

FORMATS = ("png", "svg", "pdf")


PLOT_HINT = "plotting needs matplotlib: pip install 'bertscope[plot]'"


def has_matplotlib() -> bool:
    """Whether matplotlib can be imported, found without importing it (a blocked or missing
    module is False)."""
    import importlib.util
    import sys

    if "matplotlib" in sys.modules:
        return sys.modules["matplotlib"] is not None
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


MIN_MATPLOTLIB = (3, 7)  # as pyproject's plot extra says


def require_matplotlib(what: str = "plotting") -> None:
    """InputError (one line, with the pip hint) unless matplotlib is installed, and no older than
    the plot extra asks: call it before any long work whose output includes a figure. An old one
    fails only once it draws (a NumPy 2 traceback from 3.6, say), after the work."""
    if not has_matplotlib():
        raise InputError(f"{what} needs matplotlib, which is not installed: pip install 'bertscope[plot]'")
    version = _installed_version("matplotlib")
    if version is not None and version < MIN_MATPLOTLIB:
        shown = ".".join(str(v) for v in MIN_MATPLOTLIB)
        raise InputError(f"{what} needs matplotlib {shown} or newer, and {'.'.join(map(str, version))} is "
                         f"installed: pip install --upgrade 'bertscope[plot]'")


def _installed_version(name: str) -> tuple[int, ...] | None:
    """The (major, minor) of an installed distribution, read from its metadata without importing
    it; None when unknown."""
    from importlib import metadata

    try:
        parts = metadata.version(name).split(".")[:2]
        return tuple(int(re.match(r"\d+", p).group()) for p in parts)
    except (metadata.PackageNotFoundError, AttributeError, ValueError):
        return None


def _matplotlib():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError(PLOT_HINT) from None
    return Figure


def _maps(rt: ReportText, measure: str | None) -> np.ndarray:
    """(N, H, T, T): the attention, or ``rt.measures[measure]`` (a per-layer one as H = 1)."""
    if measure is None or measure == "attention":
        return rt.attentions
    if measure not in rt.measures:
        raise InputError(f"the text has no {measure!r} maps (it has: {', '.join(rt.measures) or 'none'})")
    m = rt.measures[measure]
    return m if m.ndim == 4 else m[:, None]  # (N, T, T) -> (N, 1, T, T)


def units(rt: ReportText, words: bool = True, span: tuple[int, int] | None = None,
          measure: str | None = None) -> tuple[list[str], np.ndarray]:
    """Labels and attention (N, H, U, U) of a text, at word (U = W) or sub-token (U = T) level.

    ``span`` (start, end): only the units inside that window of token positions (a word is kept
    if one of its sub-tokens is); rows are not renormalised. ``measure``: the maps of
    ``rt.measures[measure]`` instead of the attention ((N, 1, U, U) for a per-layer measure).
    """
    maps = _maps(rt, measure)
    if not words:
        labels, att = list(rt.tokens), maps
        keep = list(range(len(labels)))
        if span is not None:
            keep = [i for i in keep if span[0] <= i < span[1]]
    else:
        w = word_attention(torch.from_numpy(maps), rt.token_words)  # (N, H, W, W)
        labels, att = list(rt.words), w.numpy()
        keep = list(range(len(labels)))
        if span is not None:
            inside = {rt.token_words[t] for t in range(span[0], min(span[1], len(rt.tokens)))}
            keep = [i for i in keep if i in inside]
    if len(keep) != len(labels):
        idx = np.array(keep)
        att = att[:, :, idx[:, None], idx[None, :]]  # (N, H, U, U)
        labels = [labels[i] for i in keep]
    return labels, att


def _ticks(ax, labels: list[str]) -> None:
    """Row and column labels that stay readable: smaller type for longer texts, and only every
    k-th label once there are more than 80."""
    U = len(labels)
    fs = 10 if U <= 30 else max(5, 10 - (U - 30) // 10)
    step = max(1, -(-U // 80))
    pos = list(range(0, U, step))
    ax.set_xticks(pos, [labels[i] for i in pos], rotation=90, fontsize=fs)
    ax.set_yticks(pos, [labels[i] for i in pos], fontsize=fs)
    ax.tick_params(length=0)


def _check_vmax(vmax: object) -> None:
    """A number (a numpy or 0-d torch one too) that is finite and above 0, or None."""
    if vmax is None:
        return
    try:
        v = float(vmax) if not isinstance(vmax, (bool, str)) else float("nan")
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise InputError(f"{setting('vmax', '--vmax')} must be a finite number above 0, got {vmax!r}")


def head_figure(rt: ReportText, layer: int, head: int | None, *, words: bool = True,
                span: tuple[int, int] | None = None, vmax: float | None = None, measure: str | None = None):
    """A heatmap of one head: rows attend (from), columns are attended to (to).

    ``vmax``: the weight drawn darkest (default: this map's largest), so that two figures can be
    drawn on the same scale; ``span``: a window of token positions (start, end). ``measure``:
    one of ``rt.measures`` instead of the attention; a per-layer one takes ``head`` None.
    """
    Figure = _matplotlib()
    labels, att = units(rt, words, span, measure)
    per_layer = measure not in (None, "attention") and rt.measures[measure].ndim == 3
    if per_layer and head is not None:
        raise InputError(f"{measure} gives one map per layer, not per head; leave out --head")
    head = 0 if head is None else head
    N, H = att.shape[:2]
    layer, head = as_index(setting("layer", "--layer"), layer, N), as_index(setting("head", "--head"), head, H)
    _check_vmax(vmax)
    M = att[layer, head]  # (U, U)
    U = len(labels)
    top = float(vmax) if vmax is not None else max(float(M.max()), 1e-9)
    side = float(np.clip(0.34 * U + 2.2, 4.5, 16))
    fig = Figure(figsize=(side + 1.0, side), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(M, cmap="Blues", vmin=0.0, vmax=top, interpolation="nearest")
    _ticks(ax, labels)
    ax.set_xlabel("attended to (key)")
    ax.set_ylabel("attending (query)")
    where = f", tokens {span[0]}–{span[1] - 1} (rows not renormalised)" if span is not None else ""
    what = f"layer {layer}" + ("" if per_layer else f", head {head}")
    if measure not in (None, "attention"):
        what = f"{measure}, {what}"
    ax.set_title(f"{what}{where}", fontsize=12)
    if U <= 20:
        for i in range(U):
            for j in range(U):
                v = M[i, j]
                if v >= 0.05:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if v > 0.55 * top else "#1d2330")
    named = measure if measure not in (None, "attention") else "attention weight"
    fig.colorbar(im, ax=ax, shrink=0.7, label=named + (" (scale fixed by --vmax)" if vmax is not None else ""),
                 extend="max" if vmax is not None and float(M.max()) > top else "neither")
    return fig


def grid_figure(rt: ReportText, *, words: bool = True, span: tuple[int, int] | None = None,
                shared: bool = True, vmax: float | None = None, measure: str | None = None):
    """Every layer (rows) x head (columns) as small heatmaps.

    ``shared`` (default): one colour scale for every panel (0 .. the largest weight of all, or
    ``vmax``), with one colour bar; otherwise each panel is scaled to its own maximum, and the
    title says the colours cannot be compared. ``measure``: one of ``rt.measures`` instead of the
    attention (a per-layer measure is one row of panels, one per layer).
    """
    Figure = _matplotlib()
    labels, att = units(rt, words, span, measure)
    per_layer = measure not in (None, "attention") and rt.measures[measure].ndim == 3
    if per_layer:
        att = att[:, 0][None]  # (N, 1, U, U) -> (1, N, U, U): one row, a panel per layer
    N, H = att.shape[:2]
    _check_vmax(vmax)
    if vmax is not None and not shared:
        raise InputError(f"{setting('vmax', '--vmax')} fixes one scale for every panel; shared=False (--per-panel) scales "
                         "each panel to its own maximum: give one or the other")
    common = float(vmax) if vmax is not None else max(float(att.max()), 1e-9)
    fig = Figure(figsize=(1.15 * H + 1.6, 1.15 * N + 0.8), layout="constrained")
    axes = fig.subplots(N, H, squeeze=False)
    im = None
    for layer in range(N):
        for head in range(H):
            ax = axes[layer][head]
            M = att[layer, head]
            top = common if shared else max(float(M.max()), 1e-9)
            im = ax.imshow(M, cmap="Blues", vmin=0.0, vmax=top, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if per_layer:
                ax.set_title(f"layer {head}", fontsize=8)  # one row: the columns are the layers
                continue
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    shown = rt.text if len(rt.text) <= 110 else rt.text[:107] + "…"
    named = measure not in (None, "attention")
    if named:
        shown = f"{measure}: {shown}"
    if span is not None:
        shown += f"  [tokens {span[0]}–{span[1] - 1}]"
    if shared and im is not None:
        fig.colorbar(im, ax=axes, shrink=0.6,
                     label=f"{measure if named else 'attention weight'} (one scale for every panel)")
    else:
        shown += "\n(each panel scaled to its own maximum: colours are not comparable between panels)"
    fig.suptitle(shown, fontsize=9)
    return fig


def figure_bytes(fig, fmt: str = "png", dpi: int = 110) -> bytes:
    """A figure rendered in memory as the bytes of a png, svg or pdf, its labels kept whole (the
    box is fitted to what is drawn). Characters the fonts lack are said once, not once each."""
    buf = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    missing: set[str] = set()
    for w in caught:
        m = _NO_GLYPH.match(str(w.message))
        if m:
            missing.add(chr(int(m.group(1))))
        else:
            warn_caller(str(w.message), w.category)
    if missing:
        shown = "".join(sorted(missing)[:12]) + ("..." if len(missing) > 12 else "")
        warn_caller(f"{len(missing)} character(s) of the text have no glyph in matplotlib's fonts ({shown}): "
                    "they are drawn as boxes; install a font that has them (e.g. fonts-noto-cjk, "
                    "fonts-noto-color-emoji)", UserWarning)
    return buf.getvalue()


_NO_GLYPH = re.compile(r"Glyph (\d+) .*missing from")


def save_figure(fig, path: str | os.PathLike, dpi: int = 200, *, make_parents: bool = False) -> Path:
    """Save as PNG, SVG or PDF (by the file's suffix), atomically."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise InputError(f"the output must end in .png, .svg or .pdf, got {path.name!r}")
    return write_bytes_atomic(path, figure_bytes(fig, fmt, dpi), make_parents=make_parents)


# --------------------------------------------------------------------------------------------
# (layers, heads) tables as heatmaps


def heatmap_png(values: torch.Tensor, title: str, *, labels: Sequence[Sequence[str]] | None = None,
                cmap: str = "viridis", fmt: str = "{:.2f}", colorbar: bool = True,
                vmin: float | None = None, vmax: float | None = None) -> bytes:
    """A (N layers, H heads) heatmap with the value (or a label) written in each cell, as PNG bytes."""
    Figure = _matplotlib()
    N, H = values.shape
    fig = Figure(figsize=(1.0 + 0.55 * H, 0.9 + 0.45 * N), layout="tight")
    ax = fig.add_subplot()
    im = ax.imshow(values.float().numpy(), cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(H))
    ax.set_yticks(range(N))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    for li in range(N):
        for hi_ in range(H):
            v = float(values[li, hi_])
            text = labels[li][hi_] if labels is not None else fmt.format(v)
            ax.text(hi_, li, text, ha="center", va="center", fontsize=6, color=_ink(im.cmap(im.norm(v))))
    if colorbar:
        fig.colorbar(im, ax=ax, fraction=0.03)
    return figure_bytes(fig)


def _ink(rgba: Sequence[float]) -> str:
    """"black" or "white", whichever reads better on a cell of colour ``rgba`` (0-1 sRGB): the
    larger contrast ratio by WCAG 2's relative luminance. A pale colour map (Set3, the class
    map's) gets black labels in every cell, a dark cell of viridis white ones. A see-through
    colour (a NaN cell's) is taken over the white axes it shows."""
    alpha = rgba[3] if len(rgba) > 3 else 1.0
    rgb = [alpha * c + (1.0 - alpha) for c in rgba[:3]]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def save_heatmap(path: str | Path, values: torch.Tensor, title: str, **kw) -> Path:
    return write_bytes_atomic(path, heatmap_png(values, title, **kw))


_SHORT = {"vertical": "V", "diagonal": "D", "vertical+diagonal": "V+D", "block": "B", "heterogeneous": "Het"}


def save_class_map(path: str | Path, classes: list[list[str]], order: Sequence[str], title: str) -> Path:
    """A map of the pattern class of every head (colour = class, label = short name)."""
    idx = torch.tensor([[order.index(c) for c in row] for row in classes], dtype=torch.float32)
    labels = [[_SHORT.get(c, c) for c in row] for row in classes]
    return save_heatmap(path, idx, title + "  (V vertical, D diagonal, V+D both, B block, Het heterogeneous)",
                        labels=labels, cmap="Set3", colorbar=False, vmin=0, vmax=len(order) - 1)


# --------------------------------------------------------------------------------------------
# line plots


def line_plot(path: str | Path, series: dict[str, list[float]], title: str, ylabel: str,
              xlabel: str = "layer") -> Path:
    """One value per layer (x = 0, 1, ...) for each named series, as a PNG written atomically."""
    Figure = _matplotlib()
    fig = Figure(figsize=(5.5, 3.2), layout="tight")
    ax = fig.add_subplot()
    for name, ys in series.items():
        ax.plot(range(len(ys)), ys, marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.set_xticks(range(len(next(iter(series.values())))))
    ax.legend(fontsize=8)
    return write_bytes_atomic(path, figure_bytes(fig, "png", 100))


def faithfulness_plot(path: str | Path, panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
                      title: str) -> Path:
    """One panel per reference ({panel title: {method: (means per layer, sds per layer)}}):
    each method's mean over sentences, with ± one standard deviation as an error bar (methods
    set slightly apart along x so the bars stay readable); a PNG written atomically."""
    Figure = _matplotlib()
    fig = Figure(figsize=(5.2 * len(panels), 3.8), layout="tight")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (name, series) in zip(axes, panels.items()):
        k = len(series)
        for j, (method, (mean, sd)) in enumerate(series.items()):
            x = np.arange(len(mean)) + (j - (k - 1) / 2) * 0.07
            ax.errorbar(x, np.asarray(mean, dtype=float), yerr=np.asarray(sd, dtype=float), marker="o",
                        markersize=4, capsize=2, elinewidth=0.7, linewidth=1.4, label=method)
        ax.axhline(0.0, color="grey", linewidth=0.6)
        ax.set_xlabel("layer")
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(len(next(iter(series.values()))[0])))
    axes[0].set_ylabel("Spearman ρ (mean ± sd over sentences)")
    axes[-1].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    return write_bytes_atomic(path, figure_bytes(fig, "png", 110))


def scaling_plot(result: dict, fmt: str = "png") -> bytes:
    """S13: time (log-log) and peak memory against tokens T, for attention alone and the whole
    model, from the dict :func:`bertscope.bench.scaling.scaling` returns; bytes of a png/svg/pdf."""
    Figure = _matplotlib()
    Ls = result["lengths"]
    fig = Figure(figsize=(10, 4), layout="tight")
    axes = fig.subplots(1, 2)
    for kind, label in (("attention", "attention alone (QKᵀ, softmax, ·V)"), ("model", "whole model")):
        e = result[kind]
        fitted = f"T^{e['time_exponent']:.2f}" if e.get("time_exponent") is not None else "exponent n/a"
        axes[0].loglog(Ls, [t * 1e3 for t in e["time_s"]], "o-", label=f"{label}: {fitted}")
        if e.get("peak_mib"):
            axes[1].plot(Ls, e["peak_mib"], "o-", label=label)
    axes[0].set(xlabel="tokens T", ylabel="ms (median)", title="time against length")
    axes[1].set(xlabel="tokens T", ylabel="peak memory growth (MiB)", title="peak memory against length")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    cfg = result.get("config") or {}
    shape = (f"hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads"
             if {"hidden_size", "num_hidden_layers", "num_attention_heads"} <= set(cfg) else "")
    caption = "; ".join(x for x in (shape, result.get("machine")) if x)
    if caption:  # which model and machine: a figure read away from its table still says
        fig.suptitle(caption, fontsize=8)
    return figure_bytes(fig, fmt, 110)


def tradeoff_plot(path: str | Path, rows: Sequence[dict], title: str) -> Path:
    """The max_length trade-off: dev accuracy (left) and seconds per training epoch and per 1,000
    reviews classified (right, log scale) against max_length; one dict per length with keys
    max_length, dev_accuracy, train_seconds, inference_s_per_text. A PNG written atomically."""
    Figure = _matplotlib()
    Ls = [r["max_length"] for r in rows]
    fig = Figure(figsize=(10, 3.8), layout="tight")
    left, right = fig.subplots(1, 2)
    left.plot(Ls, [r["dev_accuracy"] for r in rows], "o-", color="tab:green")
    for L, r in zip(Ls, rows):
        left.annotate(f"{r['dev_accuracy']:.3f}", (L, r["dev_accuracy"]), textcoords="offset points",
                      xytext=(0, 6), ha="center", fontsize=8)
    left.set(xlabel="max_length (tokens)", ylabel="dev accuracy", title="what truncation costs")
    left.set_xticks(Ls)
    right.plot(Ls, [r["train_seconds"] for r in rows], "o-", label="training: s per epoch")
    right.plot(Ls, [r["inference_s_per_text"] * 1000 for r in rows], "s-", label="inference: s per 1,000 reviews")
    right.set_yscale("log")
    right.set(xlabel="max_length (tokens)", ylabel="seconds", title="what it saves")
    right.set_xticks(Ls)
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return write_bytes_atomic(path, buf.getvalue())
