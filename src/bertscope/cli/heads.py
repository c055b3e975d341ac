"""bertscope heads: what every layer x head does over a corpus, with its pattern class."""

from __future__ import annotations

import argparse

from .common import add_engine_args, add_model_arg, check_output_dir, engine_options, load_model
from .guard import dumps_strict, print_json_strict, writing
from .progress import add_progress_args, bar

HELP = """\
For every layer and head, over a corpus (a UTF-8 text file, one text per line, blank lines
skipped; a .jsonl, .json, .csv, .tsv or .parquet file is refused, its syntax would be read as
text: write its texts one per line first): mean attention to [CLS], to [SEP], to punctuation, to the token itself, to the
previous and to the next token (after Clark et al. 2019); entropy in nats and its gap to
uniform (ln T - entropy); mean attention distance in tokens; and a pattern class after
Kovaleva et al. 2019 (vertical, diagonal, vertical+diagonal, block, heterogeneous) by stated
rules ("block" is broad, even attention over one text, not the paper's attention within each
sentence of a pair): see docs/EXPERIMENTS.md, or
  python -c "import bertscope.understand.headstats as h; print(h.__doc__)"

With --out DIR it also writes one layer x head heatmap per statistic (PNG; needs matplotlib:
pip install 'bertscope[plot]'; checked before any work), the class map, and heads.json.
A progress bar on stderr counts the texts (the lines, with --engine ray), when stderr is a terminal;
--quiet hides it, --progress forces it.

With --engine ray the corpus is cut into shards of lines, Ray actors (each holding the model)
sum each shard's statistics, and the sums are merged: the same result as the local engine
(to float64 rounding), for corpora too big for one process.

examples:
  bertscope heads corpus.txt
  bertscope heads corpus.txt --out heads-report/
  bertscope heads corpus.txt --json > heads.json
  bertscope heads big-corpus.txt --engine ray --workers 4 --json > heads.json
"""


def register(sub) -> None:
    p = sub.add_parser("heads", help="statistics and pattern class of every head over a corpus",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", metavar="CORPUS", help="a text file, one text per line")
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--out", metavar="DIR", help="write heatmaps (PNG) and heads.json into DIR")
    add_progress_args(p)
    add_engine_args(p)
    p.set_defaults(func=run)


def _table(title: str, values, fmt: str = "{:5.2f}") -> list[str]:
    N, H = values.shape
    lines = [title, "      " + " ".join(f"{'H' + str(h):>5}" for h in range(H))]
    for li in range(N):
        lines.append(f"  L{li:<2} " + " ".join(fmt.format(float(values[li, h])) for h in range(H)))
    return lines


def _write_maps(out, hs, result: dict) -> list:
    from ..files import write_text_atomic
    from ..see.figures import save_class_map, save_heatmap
    from ..understand.headstats import CLASSES, STAT_LABELS, STATS

    written = []
    for k in STATS:
        written.append(save_heatmap(out / f"heads_{k}.png", hs.stats[k],
                                    f"{hs.model}: {STAT_LABELS[k]} ({hs.num_texts} text{'s' * (hs.num_texts != 1)})"))
    written.append(save_class_map(out / "heads_class.png", hs.classes, CLASSES, f"{hs.model}: pattern class"))
    written.append(write_text_atomic(out / "heads.json", dumps_strict(result)))  # what --json prints
    return written


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from ..files import read_lines, refuse_records
    from ..understand.headstats import CLASSES, STAT_LABELS, STATS, head_stats

    refuse_records(args.corpus, "heads")
    engine = engine_options(args)
    out = check_output_dir(args.out) if args.out is not None else None
    if out is not None:
        from ..see.figures import require_matplotlib

        require_matplotlib("heads --out (for its heatmaps)")
    if engine is not None:
        from ..scale.heads import ray_head_stats

        with bar(args, "heads", "line") as progress:
            hs, warns = ray_head_stats(args.corpus, args.model, engine=engine, progress=progress)
        for w in warns:
            print(f"bertscope: warning: {w}", file=sys.stderr)
    else:
        lines, warns = read_lines(args.corpus)
        for w in warns:
            print(f"bertscope: warning: {w}", file=sys.stderr)
        if not lines:
            from ..errors import InputError

            raise InputError(f"the corpus {args.corpus} has no text (no non-blank UTF-8 line)")
        bert = load_model(args)
        import warnings

        from ..core.tokenizer import TruncationWarning

        with bar(args, "heads", "text") as progress, warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncationWarning)  # said below, with the line numbers
            hs = head_stats(bert, lines, progress=progress)
    for w in hs.warnings:
        print(f"bertscope: warning: {w}", file=sys.stderr)
    res = hs.to_json()
    res["warnings"] = list(warns) + list(res.get("warnings", []))  # the lines skipped as not text too
    written: list[Path] = []
    if out is not None:  # every file or none: staged, then renamed into place
        from ..files import write_folder_atomic

        with writing(out):
            written += write_folder_atomic(out, lambda stage: _write_maps(stage, hs, res))
    if args.json:
        print_json_strict(res)
        return 0
    N, H = hs.shape
    print(f"{hs.model}: {N} layers x {H} heads over {hs.num_texts} text{'s' * (hs.num_texts != 1)} ({hs.num_tokens} tokens)")
    for k in STATS:
        print()
        print("\n".join(_table(STAT_LABELS[k], hs.stats[k])))
    print()
    print("pattern class (V vertical, D diagonal, V+D, B block, Het heterogeneous; share of texts agreeing)")
    short = {"vertical": "V", "diagonal": "D", "vertical+diagonal": "V+D", "block": "B", "heterogeneous": "Het"}
    print("      " + " ".join(f"{'H' + str(h):>8}" for h in range(H)))
    for li in range(N):
        cells = [f"{short[hs.classes[li][h]]} {float(hs.class_share[li, h]):.0%}" for h in range(H)]
        print(f"  L{li:<2} " + " ".join(f"{c:>8}" for c in cells))
    print()
    print("heads per class: " + ", ".join(
        f"{c} {sum(row.count(c) for row in hs.classes)}" for c in CLASSES))
    for p in written:
        print(f"wrote {p}")
    return 0
