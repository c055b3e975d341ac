"""bertscope view: write the attention explorer as one self-contained HTML file."""

from __future__ import annotations

import argparse

from .common import add_model_arg, check_output_file, load_model
from .guard import writing

HELP = """\
Write one HTML file that shows the attention of TEXT (and TEXT_B, side by side with the
difference) in every layer and head: a head view (lines from each token to the tokens it
attends to), a model view (every layer x head as a thumbnail), a matrix view (the heatmap with
exact values), word or sub-token level, [CLS]/[SEP] hidden or shown, the mean over heads and
attention rollout. The file has no external resources: it opens from disk in any browser,
offline. Weights are stored to within 1/2048 (rows still sum to 1).

With --model-b, TEXT runs through two models instead (A = --model, B = --model-b), side by side
with the difference: e.g. a base model and its fine-tune, to see which heads fine-tuning changed.

examples:
  bertscope view "The animal didn't cross the street because it was too tired"
  bertscope view "The animal didn't cross the street because it was too tired" \\
                 "The animal didn't cross the street because it was too wide" --out compare.html
  bertscope view "A moving, beautifully acted film" --model-b sentiment/ --out finetuned.html
"""


def register(sub) -> None:
    p = sub.add_parser("view", help="write the attention explorer as one HTML file", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", metavar="TEXT", help="the text to run through the model")
    p.add_argument("text_b", metavar="TEXT_B", nargs="?", default=None,
                   help="a second text, shown side by side with the difference")
    add_model_arg(p)
    p.add_argument("--model-b", metavar="PATH", default=None,
                   help="a second model folder (e.g. a fine-tune): TEXT through both, with the difference")
    p.add_argument("--out", metavar="FILE.html", default="bertscope-report.html",
                   help="where to write the page (default: bertscope-report.html)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..see.report import build_report

    if not args.text.strip():
        raise InputError("the text is empty")
    if args.text_b is not None and not args.text_b.strip():
        raise InputError("the second text is empty")
    if args.text_b is not None and args.model_b is not None:
        raise InputError("give TEXT_B or --model-b, not both (two texts, or one text through two models)")
    out = check_output_file(args.out, "--out", (".html", ".htm"))
    bert = load_model(args)
    bert_b = None
    if args.model_b is not None:
        from ..bert import load

        bert_b = load(args.model_b)
    report = build_report(bert, args.text, args.text_b, bert_b=bert_b)
    with writing(out):
        path = report.save(out).resolve()
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1e6:.1f} MB); open {path.as_uri()} in a browser")
    return 0
