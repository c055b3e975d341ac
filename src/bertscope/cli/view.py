"""bertscope view: write the attention explorer as one self-contained HTML file."""

from __future__ import annotations

import argparse

from .common import add_model_arg, check_output_file, load_model, page_measures
from .guard import writing

HELP = """\
Write one HTML file that shows the attention of TEXT in every layer and head: a head view
(lines from each token to the tokens it attends to, with the exact numbers beside them), a
model view (every layer x head as a thumbnail, on one stated colour scale), a matrix view (the
heatmap with exact values, zoomable), and a query-key view (for one head and one query token:
q and every k over the head's dimensions, q·k, ÷√D, the mask, the softmax and the weighted sum
of the values -- the seed's steps (the explainer bertscope grew from; see the README) on the
model's own numbers). Words or sub-tokens, [CLS]/[SEP] hidden or shown, the mean over heads
and attention rollout; a window of tokens for long texts.

With TEXT_B the two texts are shown side by side with their difference A - B (words aligned by
sequence alignment; unmatched words are marked). With --pair TEXT_B the two are read as ONE
input, a sentence pair: [CLS] TEXT [SEP] TEXT_B [SEP] with segment ids 0 and 1, as BERT reads
pairs, and the A/B boundary is drawn.

The file has no external resources: it opens from disk in any browser, offline. Weights are
stored to within 1/2048 (rows still sum to 1); queries, keys and values exactly, when they are
small enough (--qk stores them always, --no-qk never).

With --measure the page also offers other measures of what each token takes from the others
(bertscope explain's map methods): norm (Kobayashi et al. 2020, per head), norm-residual
(Kobayashi et al. 2021), value-zeroing (Mohebbi et al. 2023) and alti (Ferrando et al. 2022),
per layer. A "Measure" switch on the page picks one; head choices are switched off for the
per-layer ones. Repeat --measure or give a comma list; "all" is every one. Rollout (Abnar &
Zuidema 2020) is always on the page, as the Attention control's rollout mode. value-zeroing reruns every layer once per token: over 128 tokens it is refused when named,
and left out of "all" with a warning.

With --model-b, TEXT runs through two models instead (A = --model, B = --model-b), side by side
with the difference: e.g. a base model and its fine-tune, to see which heads fine-tuning changed.

examples:
  bertscope view "The animal didn't cross the street because it was too tired"
  bertscope view "The animal didn't cross the street because it was too tired" \\
                 "The animal didn't cross the street because it was too wide" --out compare.html
  bertscope view "A moving, beautifully acted film" --model-b sentiment/ --out finetuned.html
  bertscope view "The animal didn't cross the street because it was too tired" --measure alti,norm
  bertscope view "Where is the animal?" --pair "The animal is in the street." --out pair.html
  bertscope view "$(cat long.txt)" --span 100:180 --out long.html
"""


def register(sub) -> None:
    p = sub.add_parser("view", help="write the attention explorer as one HTML file", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", metavar="TEXT", help="the text to run through the model")
    p.add_argument("text_b", metavar="TEXT_B", nargs="?", default=None,
                   help="a second text, shown side by side with the difference")
    p.add_argument("--pair", metavar="TEXT_B", default=None,
                   help="read TEXT and TEXT_B as one sentence pair ([CLS] A [SEP] B [SEP], segments 0/1)")
    p.add_argument("--span", metavar="START:END", default=None,
                   help="open on a window of tokens (positions from 0, END excluded; e.g. 100:180; counting from the end, with =: --span=-40:)")
    p.add_argument("--qk", action=argparse.BooleanOptionalAction, default=None,
                   help="store every head's q, k, v for the query-key view (default: when small)")
    add_model_arg(p)
    p.add_argument("--model-b", metavar="PATH", default=None,
                   help="a second model folder (e.g. a fine-tune): TEXT through both, with the difference")
    p.add_argument("--measure", action="append", default=None, metavar="M[,M...]",
                   help="also offer these measures: norm, norm-residual, value-zeroing, alti, or all "
                        "(repeatable; the attention weights and their rollout are always there)")
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
    if args.pair is not None:
        if args.text_b is not None:
            raise InputError("give TEXT_B (a text to compare) or --pair TEXT_B (one sentence pair), not both")
        if not args.pair.strip():
            raise InputError("the --pair text is empty")
    if args.span is not None:
        from ..see.report import parse_span

        parse_span(args.span, None)  # the form now; the range once the text is tokenized
    measures = None
    if args.measure is not None:
        from ..explain import map_measures

        names = page_measures(args.measure)
        if names:
            # analyze() beside it says once that a long text was cut
            measures = lambda b, text, pair: map_measures(b, text, names, pair=pair, warn=False)  # noqa: E731
    out = check_output_file(args.out, "--out", (".html", ".htm"))
    bert = load_model(args)
    bert_b = None
    if args.model_b is not None:
        from ..bert import load

        bert_b = load(args.model_b)
    if measures is not None and "value-zeroing" in names:
        _fit_value_zeroing(args, names, bert, bert_b)
    report = build_report(bert, args.text, args.text_b, pair=args.pair, span=args.span, qk=args.qk, bert_b=bert_b,
                          measures=measures)
    with writing(out):
        path = report.save(out).resolve()
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1e6:.1f} MB); open {path.as_uri()} in a browser")
    return 0


def _fit_value_zeroing(args: argparse.Namespace, names: list[str], bert, bert_b) -> None:
    """Value zeroing reruns every layer once per token, so it stops at a length: over it, named
    on its own it is refused with the others to ask for instead; from "all" it is left out, with
    a warning (as explain --compare leaves it out)."""
    import sys

    from ..errors import InputError
    from ..explain import VALUE_ZEROING_MAX_TOKENS

    def tokens(model, text: str, pair: str | None) -> tuple[int, int]:  # (as the page reads it, uncut)
        n = model.tokenizer.count_tokens([text])[0]  # counted, not encoded: no truncation warning here
        if pair is not None:  # [CLS] A [SEP] B [SEP]
            n += model.tokenizer.count_tokens([pair])[0] - 1
        return min(n, model.tokenizer.max_length), n

    T, whole = max([tokens(bert, args.text, args.pair)]
                   + ([tokens(bert, args.text_b, None)] if args.text_b is not None else [])
                   + ([tokens(bert_b, args.text, args.pair)] if bert_b is not None else []))
    if T <= VALUE_ZEROING_MAX_TOKENS:
        return
    why = (f"value-zeroing is limited to {VALUE_ZEROING_MAX_TOKENS} tokens (it reruns every layer once per "
           f"token); this text has {T}" + (f" (cut from {whole})" if whole > T else ""))
    others = [m for m in names if m != "value-zeroing"]
    named = any(part.strip() == "value-zeroing" for value in args.measure for part in value.split(","))
    if named:
        raise InputError(why + (f": leave it out (--measure {','.join(others)})" if others else ""))
    names.remove("value-zeroing")  # the closure above reads this list
    print(f"bertscope: warning: {why}: left out of the page's measures", file=sys.stderr)
