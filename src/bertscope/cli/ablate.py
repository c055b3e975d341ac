"""bertscope ablate: silence heads and see what changes."""

from __future__ import annotations

import argparse

from .common import add_model_arg, load_model
from .guard import print_json_strict
from .progress import add_progress_args, bar

HELP = """\
Silence attention heads (their output is zeroed before W_O, through the model's head_mask) and
report how the model's output changes: the cosine between each token's final vector with and
without the heads, and between the sentence embeddings (as `bertscope embed` makes them: of the
text's first 256 tokens for the bundled model, its max_seq_length). With --token WORD, how far
WORD's attention moves in every later layer too (total variation distance of its word-level row).

--sweep silences every head alone and ranks the heads by how much the output changes
(after Michel et al. 2019, who ranked heads by the change of a task's loss); a progress bar on
stderr counts the heads (when stderr is a terminal; --quiet hides it).

Layers and heads are numbered from 0. Repeat --layer/--head to silence several heads at once.

examples:
  bertscope ablate "The animal didn't cross the street because it was too tired" --layer 3 --head 1 --token it
  bertscope ablate "The cat sat on the mat" --layer 0 --head 2 --layer 1 --head 5
  bertscope ablate "The cat sat on the mat" --sweep --top 10
"""


def register(sub) -> None:
    p = sub.add_parser("ablate", help="silence heads and measure the change", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", metavar="TEXT", help="the text to run through the model")
    p.add_argument("--layer", type=int, action="append", default=[], metavar="L", help="layer of a head to silence")
    p.add_argument("--head", type=int, action="append", default=[], metavar="H", help="head to silence (pairs with --layer)")
    p.add_argument("--token", metavar="WORD", help="also show how WORD's attention moves downstream")
    p.add_argument("--occurrence", type=int, default=None, metavar="K",
                   help="which occurrence of WORD, if it appears more than once (default 1)")
    p.add_argument("--sweep", action="store_true", help="silence every head alone and rank them")
    p.add_argument("--top", type=int, default=None, metavar="K",
                   help="heads to list with --sweep (default 10; with --json, the ranking's length: default all)")
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    add_progress_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..understand.ablate import ablate, sweep
    from ..errors import InputError

    if not args.text.strip():
        raise InputError("the text is empty")
    if len(args.layer) != len(args.head):
        raise InputError(f"give --layer and --head in pairs ({len(args.layer)} --layer, {len(args.head)} --head)")
    if not args.sweep and not args.layer:
        raise InputError("name a head to silence with --layer L --head H (repeat both for more), or give "
                         "--sweep to silence each head in turn and rank them")
    if args.sweep and args.layer:
        raise InputError("--sweep silences every head in turn; do not name heads with it")
    if args.sweep and args.token is not None:
        raise InputError("--token shows how silencing named heads moves WORD's attention; --sweep ranks "
                         "every head by the change of the whole output: use one or the other")
    if args.occurrence is not None and args.token is None:
        raise InputError("--occurrence picks which occurrence of --token WORD; give --token too")
    if args.top is not None and not args.sweep:
        raise InputError("--top is for --sweep (the number of heads to list)")
    if args.top is not None and args.top < 1:
        raise InputError("--top must be at least 1")
    bert = load_model(args)
    if args.sweep:
        with bar(args, "ablate --sweep", "head") as progress:
            eff = sweep(bert, args.text, progress=progress)
        if args.json:
            print_json_strict(eff.to_json(args.top))
            return 0
        print("Every head silenced alone; effect = 1 - cosine with the intact output")
        print(f"  {'head':<9}{'tokens':>10}{'embedding':>12}")
        for l, h, t, e in eff.ranking(10 if args.top is None else args.top):
            print(f"  L{l:<2} H{h:<4}{t:>10.4f}{e:>12.4f}")
        return 0
    heads = list(dict.fromkeys(zip(args.layer, args.head)))  # a head named twice is silenced once
    res = ablate(bert, args.text, heads, args.token, 1 if args.occurrence is None else args.occurrence)
    if args.json:
        print_json_strict(res.to_json())
        return 0
    names = ", ".join(f"L{l} H{h}" for l, h in res.heads)
    print(f"Silenced {names}")
    print(f"  sentence embedding cosine (intact vs silenced): {res.embedding_cosine:.4f}")
    print(f"  mean token cosine: {float(res.token_cosine.mean()):.4f}; per token:")
    print("    " + "  ".join(f"{t} {float(c):.3f}" for t, c in zip(res.tokens, res.token_cosine)))
    if res.word_shift is not None and res.before is not None and res.after is not None:
        first = min(l for l, _ in res.heads)  # normalised: --layer -1 is the last layer
        print(f'  how "{res.word}" (word {res.word_index})\'s attention moves (total variation distance, '
              "0 = unchanged, 1 = disjoint):")
        N, H = res.word_shift.shape
        print(f"    L{first}: the silenced heads' own layer: largest move {float(res.word_shift[first].max()):.3f} "
              "(its attention is computed before the heads are silenced)")
        for l in range(first + 1, N):
            row = res.word_shift[l]
            hmax = int(row.argmax())
            b, a = res.before[l, hmax], res.after[l, hmax]
            top_b, top_a = int(b.argmax()), int(a.argmax())
            print(f"    L{l}: mean {float(row.mean()):.3f}, most moved H{hmax} {float(row[hmax]):.3f} "
                  f"(top word {res.words[top_b]} {float(b[top_b]):.2f} -> {res.words[top_a]} {float(a[top_a]):.2f})")
        if first + 1 >= N:
            print("    (no layer comes after it)")
    return 0
