"""bertscope experiments: the seed's claims (S1, S3, S4, S11, S12, errata) measured, as Markdown."""

from __future__ import annotations

import argparse

from .common import add_model_arg, check_output_dir, load_model
from .progress import add_progress_args, bar

HELP = """\
Run every experiment on the seed's claims and write OUT/EXPERIMENTS.md, with plots and a
results.json in OUT/experiments/. Plots need matplotlib (pip install 'bertscope[plot]'): without
it the command stops at once, before any work, unless --no-plots is given. A progress bar on
stderr counts the work (when stderr is a terminal; --quiet hides it).

  S1   with Q = K = x, how often a token's best match is itself, against the learned W_Q, W_K
  S3   softmax with and without ÷√d_head: entropy and largest weight per layer
  S4   outputs alone, padded with the mask, and padded with PAD attended
  S11  permutation equivariance without position embeddings, and how position embeddings break it
  S12  which heads point it -> animal, and whether they follow the referent (too tired / too wide)
  head pattern classes over bertscope's own sentences; WSC273 by attention (with --wsc)
  the seed's errata (its softmax example; the 7x claim as FLOPs)

examples:
  bertscope experiments --out my-experiments/
  bertscope experiments --out my-experiments/ --wsc WSCollection.xml    # with WSC273
  bertscope experiments --out /tmp/exp --no-plots
(the repository's own docs/EXPERIMENTS.md is made with --out docs/ by its maintainers)
"""


def register(sub) -> None:
    p = sub.add_parser("experiments", help="the seed's claims as experiments, written to EXPERIMENTS.md",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="DIR", required=True, help="folder for EXPERIMENTS.md (e.g. docs/)")
    p.add_argument("--wsc", metavar="FILE", help="a WSC XML file; its first --wsc-limit schemas are scored")
    p.add_argument("--wsc-limit", type=int, default=None, metavar="K",
                   help="with --wsc: score the first K schemas (default 273: WSC273)")
    p.add_argument("--no-plots", action="store_true", help="write the Markdown and JSON only (no matplotlib needed)")
    add_model_arg(p)
    add_progress_args(p)
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    """The command as run, in canonical form, for the header of EXPERIMENTS.md."""
    import shlex

    parts = ["bertscope", "experiments", "--out", args.out]
    if args.wsc is not None:
        parts += ["--wsc", args.wsc]
    if args.wsc_limit is not None:
        parts += ["--wsc-limit", str(args.wsc_limit)]
    if args.no_plots:
        parts.append("--no-plots")
    if getattr(args, "model", None):
        parts += ["--model", args.model]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from ..errors import InputError
    from ..understand.experiments.report import run_all, write_report

    if args.wsc_limit is not None and args.wsc is None:
        raise InputError("--wsc-limit needs --wsc FILE (the WSC schemas to score)")
    if args.wsc_limit is not None and args.wsc_limit < 1:
        raise InputError("--wsc-limit must be at least 1")
    if args.wsc is not None and not Path(args.wsc).is_file():
        from ..files import why_not_a_file

        raise InputError(f"--wsc: {why_not_a_file(args.wsc)}")
    out = check_output_dir(args.out)
    from ..files import check_sections
    from ..understand.experiments.report import SECTION

    check_sections(out / "EXPERIMENTS.md", SECTION)  # damaged markers: said now, not after the run
    if not args.no_plots:
        from ..see.figures import require_matplotlib

        require_matplotlib("experiments (for its plots; --no-plots skips them)")
    bert = load_model(args)
    with bar(args, "experiments", "step") as progress:
        report = run_all(bert, args.wsc, 273 if args.wsc_limit is None else args.wsc_limit, progress=progress)
    for w in report.warnings:
        print(f"bertscope: warning: {w}", file=sys.stderr)
    for p in write_report(report, out, plots=not args.no_plots, command=command_line(args)):
        print(f"wrote {p}")
    return 0
