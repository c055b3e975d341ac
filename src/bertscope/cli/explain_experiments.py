"""bertscope explain-experiments: the explain measures' experiments, written to EXPERIMENTS.md."""

from __future__ import annotations

import argparse

from .common import add_model_arg, check_output_dir, load_model

HELP = """\
Write the explain experiments into OUT/EXPERIMENTS.md, each in its own generated section (the
rest of the file is left as it is):

  the seed's example, re-read: for "it" in "...too tired" and "...too wide", what attention,
  norm, norm-residual, value-zeroing, alti and rollout say "it" takes from "animal" and
  from "street", per layer, and weight against norm in the heads the seed's reading rests on

examples:
  bertscope explain-experiments --out docs/
"""


def register(sub) -> None:
    p = sub.add_parser("explain-experiments", help="the explain measures' experiments, into EXPERIMENTS.md",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="DIR", required=True, help="folder of EXPERIMENTS.md (e.g. docs/)")
    add_model_arg(p)
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    import shlex

    parts = ["bertscope", "explain-experiments", "--out", args.out]
    if getattr(args, "model", None):
        parts += ["--model", args.model]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from ..explain.reread import SECTION, render_reread, reread
    from ..files import update_section

    out = check_output_dir(args.out)
    bert = load_model(args)
    md = render_reread(reread(bert), command_line(args))
    print(f"wrote {update_section(out / 'EXPERIMENTS.md', SECTION, md, title='Experiments')}")
    return 0
