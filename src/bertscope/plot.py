"""Attention heatmaps as image files (PNG, SVG, PDF) for papers. Needs the ``plot`` extra.

matplotlib is imported here only, when a function of this module is called, so ``import
bertscope`` stays free of it. Figures are built with matplotlib's object API (no pyplot, no
global state, no display needed).

Shape legend: N layers, H heads, T tokens, W words.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .errors import InputError
from .inspect import word_attention
from .report import ReportText, write_atomic

__all__ = ["FORMATS", "grid_figure", "head_figure", "save_figure", "units"]

FORMATS = ("png", "svg", "pdf")


def _matplotlib():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise InputError("plotting needs matplotlib: pip install 'bertscope[plot]'") from None
    return Figure


def units(rt: ReportText, words: bool = True) -> tuple[list[str], np.ndarray]:
    """Labels and attention (N, H, U, U) of a text, at word (U = W) or sub-token (U = T) level."""
    if not words:
        return list(rt.tokens), rt.attentions
    w = word_attention(torch.from_numpy(rt.attentions), rt.token_words)  # (N, H, W, W)
    return list(rt.words), w.numpy()


def head_figure(rt: ReportText, layer: int, head: int, *, words: bool = True):
    """A heatmap of one head: rows attend (from), columns are attended to (to)."""
    Figure = _matplotlib()
    labels, att = units(rt, words)
    N, H = att.shape[:2]
    if not 0 <= layer < N:
        raise InputError(f"--layer must be 0..{N - 1}, got {layer}")
    if not 0 <= head < H:
        raise InputError(f"--head must be 0..{H - 1}, got {head}")
    M = att[layer, head]  # (U, U)
    U = len(labels)
    side = float(np.clip(0.34 * U + 2.2, 4.5, 16))
    fig = Figure(figsize=(side + 1.0, side), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(M, cmap="Blues", vmin=0.0, vmax=max(float(M.max()), 1e-9), interpolation="nearest")
    fs = 10 if U <= 30 else max(4, 10 - (U - 30) // 12)
    ax.set_xticks(range(U), labels, rotation=90, fontsize=fs)
    ax.set_yticks(range(U), labels, fontsize=fs)
    ax.tick_params(length=0)
    ax.set_xlabel("attended to (key)")
    ax.set_ylabel("attending (query)")
    ax.set_title(f"layer {layer}, head {head}", fontsize=12)
    if U <= 20:
        for i in range(U):
            for j in range(U):
                v = M[i, j]
                if v >= 0.05:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if v > 0.55 * M.max() else "#1d2330")
    fig.colorbar(im, ax=ax, shrink=0.7, label="attention weight")
    return fig


def grid_figure(rt: ReportText, *, words: bool = True):
    """Every layer (rows) x head (columns) as small heatmaps, each scaled to its own maximum."""
    Figure = _matplotlib()
    labels, att = units(rt, words)
    N, H = att.shape[:2]
    fig = Figure(figsize=(1.15 * H + 0.8, 1.15 * N + 0.8), layout="constrained")
    axes = fig.subplots(N, H, squeeze=False)
    for layer in range(N):
        for head in range(H):
            ax = axes[layer][head]
            M = att[layer, head]
            ax.imshow(M, cmap="Blues", vmin=0.0, vmax=max(float(M.max()), 1e-9), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    shown = rt.text
    fig.suptitle(shown if len(shown) <= 110 else shown[:107] + "…", fontsize=9)
    return fig


def save_figure(fig, path: str | os.PathLike, dpi: int = 200) -> Path:
    """Save as PNG, SVG or PDF (by the file's suffix), atomically."""
    import io

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise InputError(f"the output must end in .png, .svg or .pdf, got {path.name!r}")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    return write_atomic(path, buf.getvalue())
