"""bertscope coref: pronoun resolution by attention alone on Winograd schemas."""

from __future__ import annotations

import argparse
import math

from .common import add_model_arg, load_model
from .guard import print_json_strict
from .progress import add_progress_args, bar

NOISE_NOTE = 0.10  # a 95% noise band wider than this many points (a share) gets a note under the table

HELP = """\
Read a file in the Winograd Schema Challenge XML format and ask the attention, with no
training, which candidate each pronoun refers to:

  per head     how often the pronoun attends more to the correct candidate than to the other
               (word level); the best head is chosen on one half of the schemas and scored on
               the other half, and the reverse, so the figure is not picked on its own test data
  MAS          Klein & Nabi 2019's Maximum Attention Score (attention from the candidate to the
               pronoun, per head the larger candidate kept, summed); also the pronoun-to-candidate
               variant. Their published figure for bert-base-uncased on WSC273: 60.3%.
  baselines    first candidate, nearest candidate, chance (with the 95% noise band)

Schemas that cannot be used (malformed XML, a candidate not in the text) are named on stderr
and skipped; the others are scored. A progress bar on stderr counts the schemas (when stderr
is a terminal; --quiet hides it).

--bundled scores bertscope's own 12 schemas (understand/data/pronouns.xml, shipped with the
package). WSC273 itself is not shipped: it is the first 273 schemas of WSCollection.xml, the
Winograd Schema Challenge collection by Levesque, Davis and Morgenstern (CC BY 4.0), from
https://cs.nyu.edu/faculty/davise/papers/WinogradSchemas/WS.html.

examples:
  bertscope coref --bundled
  bertscope coref WSCollection.xml --limit 273      # WSC273, once downloaded
  bertscope coref schemas.xml --json
"""


def register(sub) -> None:
    p = sub.add_parser("coref", help="pronoun resolution by attention on WSC-format schemas",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", nargs="?", default=None, help="a WSC XML file (<schema> elements)")
    p.add_argument("--bundled", action="store_true", help="score bertscope's own 12 schemas (no FILE)")
    p.add_argument("--limit", type=int, metavar="K", default=None,
                   help="only the first K schemas of the file (273 for WSC273)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="heads to list (default 5)")
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON (with per-schema details)")
    add_progress_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from ..understand.coref import evaluate
    from ..errors import InputError
    from ..understand.wsc import BUNDLED_SCHEMAS, read_wsc, warnings_within

    if args.limit is not None and args.limit < 1:
        raise InputError("--limit must be at least 1")
    if args.top < 1:
        raise InputError("--top must be at least 1")
    if args.bundled == (args.file is not None):
        raise InputError("give a WSC XML FILE or --bundled (bertscope's own 12 schemas), one of the two")
    path = BUNDLED_SCHEMAS if args.bundled else args.file
    schemas, warns = read_wsc(path)
    warns = warnings_within(warns, args.limit)  # schemas past the limit are not this run's, nor their warnings
    if not schemas:
        for w in warns:
            print(f"bertscope: warning: {w}", file=sys.stderr)
        raise InputError(f"{path}: no usable schema ({len(warns)} skipped)")
    bert = load_model(args)
    with bar(args, "coref", "schema") as progress:
        res = evaluate(bert, schemas, warnings=warns, limit=args.limit, progress=progress)
    for w in res.warnings:
        print(f"bertscope: warning: {w}", file=sys.stderr)
    if args.json:
        print_json_strict(res.to_json())
        return 0
    S = len(res.numbers)
    pct = lambda x: f"{100 * x:5.1f}%"  # noqa: E731
    print(f"{res.model}: {S} schema{'s' * (S != 1)} scored" + (f", {len(res.warnings)} skipped" if res.warnings else ""))
    print()
    print(f"  chance                              {pct(res.chance)}   (95% noise band: +/- {100 * res.noise_95:.1f} points)")
    print(f"  first candidate                     {pct(res.first_accuracy)}")
    print(f"  nearest candidate                   {pct(res.nearest_accuracy)}")
    print(f"  MAS, candidate -> pronoun (K&N)     {pct(res.mas_accuracy)}")
    print(f"  MAS, pronoun -> candidate           {pct(res.mas_pronoun_accuracy)}")
    if res.held_out_accuracy is None:
        print("  best head, held out                 n/a    (needs at least two twin groups of schemas)")
    else:
        print(f"  best head, held out                 {pct(res.held_out_accuracy)}")
    for f in res.held_out:
        print(f"      L{f.layer} H{f.head}: chosen on {len(f.chosen_on)} schema{'s' * (len(f.chosen_on) != 1)} "
              f"({100 * f.choice_accuracy:.1f}%), "
              f"scored on the other {len(f.scored_on)}: {100 * f.test_accuracy:.1f}%")
    l, h, a = res.best_in_sample
    print(f"  best head in sample (optimistic)    {pct(a)}   L{l} H{h}, chosen and scored on the same schemas")
    if res.noise_95 > NOISE_NOTE:  # a band this wide: no score above can be told from chance
        enough = math.ceil((1.96 * 0.5 / NOISE_NOTE) ** 2)  # the schemas that narrow it to NOISE_NOTE
        print(f"  note: with {S} schema{'s' * (S != 1)}, a score within +/- {100 * res.noise_95:.1f} points of "
              f"chance may be noise;\n        {enough} or more schemas narrow that to +/- {100 * NOISE_NOTE:.0f} points")
    print()
    ranked = res.ranked_heads()[: args.top]  # the same ranking that names the best head above
    print("heads where the pronoun attends more to the correct candidate (in sample; ties: lower layer, head first):")
    print("  " + "  ".join(f"L{l} H{h} {pct(a)}" for l, h, a in ranked))
    return 0
