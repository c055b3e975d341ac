"""bertscope plot: one head's attention heatmap, or every layer x head, as PNG/SVG/PDF."""

from __future__ import annotations

import argparse

from .common import add_model_arg, check_output_file, load_model
from .guard import writing

HELP = """\
Draw the attention of one head as a heatmap with the words (or sub-tokens) as row and column
labels, or with --grid every layer x head as small heatmaps, and save it as PNG, SVG or PDF
(chosen by the file's suffix). Rows attend, columns are attended to. Layers and heads are
numbered from 0. Needs matplotlib (pip install 'bertscope[plot]').

Colour scales: one head is scaled to its own largest weight unless --vmax fixes the darkest
value (draw two figures with the same --vmax to compare them). --grid draws every panel on
one scale with one colour bar; --per-panel scales each panel to its own maximum instead.
--measure draws another measure of what each token takes from the others instead of the
weights (bertscope explain's map methods): norm (per head), norm-residual, value-zeroing, alti
or rollout (one map per layer: no --head; with --grid one panel per layer). value-zeroing is
refused above 128 tokens.
--span START:END plots only a window of a long text. Its positions count sub-tokens, [CLS]
included, from 0, END excluded (as --tokens draws them, and as bertscope view numbers them); a
word with one sub-token inside the window is drawn whole.

examples:
  bertscope plot "The animal didn't cross the street because it was too tired" --layer 3 --head 1 --out it.png
  bertscope plot "The animal didn't cross the street because it was too tired" --grid --out grid.svg
  bertscope plot "The animal didn't cross the street because it was too tired" --measure alti --layer 5 --out alti.png
  bertscope plot "Tokenization splits rare words" --layer 0 --head 0 --tokens --out tokens.pdf
  bertscope plot "$(cat long.txt)" --layer 2 --head 5 --span 40:80 --vmax 1 --out window.png
"""


def register(sub) -> None:
    p = sub.add_parser("plot", help="save an attention heatmap (PNG, SVG, PDF)", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", metavar="TEXT", help="the text to run through the model")
    p.add_argument("--layer", type=int, default=None, metavar="L", help="layer, from 0; -1 is the last (default 0)")
    p.add_argument("--head", type=int, default=None, metavar="H", help="head, from 0; -1 is the last (default 0)")
    p.add_argument("--measure", default="attention", metavar="M",
                   help="attention (default), norm, norm-residual, value-zeroing, alti or rollout")
    p.add_argument("--grid", action="store_true", help="all layers x heads instead of one head")
    p.add_argument("--tokens", action="store_true", help="sub-tokens instead of words")
    p.add_argument("--out", metavar="FILE", required=True, help="FILE.png, FILE.svg or FILE.pdf")
    p.add_argument("--dpi", type=int, default=200, help="resolution of a PNG (default 200)")
    p.add_argument("--span", metavar="START:END", default=None, help="only a window of tokens (e.g. 40:80; counting from the end, with =: --span=-40:)")
    p.add_argument("--vmax", type=float, default=None, metavar="V",
                   help="the weight drawn darkest (default: the largest shown), to compare figures")
    p.add_argument("--per-panel", action="store_true",
                   help="with --grid: scale each panel to its own maximum (default: one scale)")
    add_model_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import math

    from ..errors import InputError, as_index
    from ..see.figures import FORMATS, grid_figure, head_figure, require_matplotlib, save_figure
    from ..see.report import analyze, parse_span

    if not args.text.strip():
        raise InputError("the text is empty")
    out = check_output_file(args.out, "--out", tuple(f".{f}" for f in FORMATS))
    if not 20 <= args.dpi <= 1200:
        raise InputError("--dpi must be between 20 and 1200")
    if args.vmax is not None and not (math.isfinite(args.vmax) and args.vmax > 0):
        raise InputError(f"--vmax must be a finite number above 0, got {args.vmax}")
    if args.grid and (args.layer is not None or args.head is not None):
        raise InputError("--grid draws every layer and head; leave out --layer and --head")
    if args.layer is None:
        args.layer = 0
    if args.per_panel and not args.grid:
        raise InputError("--per-panel goes with --grid (one head is one panel)")
    if args.per_panel and args.vmax is not None:
        raise InputError("--per-panel scales each panel to its own maximum and --vmax fixes one scale for all: "
                         "give one or the other")
    if args.span is not None:
        parse_span(args.span, None)  # the form now; the range once the text is tokenized
    from ..explain import MAP_METHODS, map_measures, method_kind

    measure = args.measure.strip()
    if measure not in MAP_METHODS:  # one figure, one measure: not a list, not "all"
        raise InputError(f"--measure takes one of {', '.join(MAP_METHODS)}; got {args.measure!r}")
    per_layer = method_kind(measure) == "layer"
    if per_layer and args.head is not None:
        raise InputError(f"{measure} gives one map per layer, not per head; leave out --head")
    require_matplotlib()  # before the model loads
    bert = load_model(args)
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    if not args.grid:  # -1 is the last, as for trace and explain; the figure names it from 0
        args.layer = as_index("--layer", args.layer, N)
        if args.head is not None:
            args.head = as_index("--head", args.head, H)
    [rt] = analyze(bert, [args.text], qk=False)
    if measure != "attention":
        from ..see.report import with_measures

        rt = with_measures(rt, map_measures(bert, args.text, [measure], warn=False))  # analyze() warned
    span = parse_span(args.span, len(rt.tokens))
    words = not args.tokens
    if args.grid:
        fig = grid_figure(rt, words=words, span=span, shared=not args.per_panel, vmax=args.vmax, measure=measure)
    else:
        head = None if per_layer else (0 if args.head is None else args.head)
        fig = head_figure(rt, args.layer, head, words=words, span=span, vmax=args.vmax, measure=measure)
    with writing(out):
        path = save_figure(fig, out, dpi=args.dpi)
    print(f"wrote {path}")
    return 0
