"""bertscope attend: where one word looks, in every layer and head."""

from __future__ import annotations

import argparse

from .common import add_model_arg, load_model, print_json

HELP = """\
Show, for every layer and head, the words that WORD attends to most, and rank the heads by the
attention from WORD to each other word. Word level (Clark et al. 2019): attention to a word is
the sum over its sub-tokens; attention from a word is the mean over its sub-tokens. [CLS] and
[SEP] are shown as words: many heads park their attention there. A word is what BERT's
tokenizer splits at spaces and punctuation, so "didn't" is three words: didn ' t. WORD is
matched ignoring case.

Layers and heads are numbered from 0.

examples:
  bertscope attend "The animal didn't cross the street because it was too tired" --token it
  bertscope attend "The trophy doesn't fit in the suitcase because it is too big" --token it --json
"""


def register(sub) -> None:
    p = sub.add_parser("attend", help="where one word looks, per layer and head", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", metavar="TEXT", help="the text to run through the model")
    p.add_argument("--token", metavar="WORD", required=True, help="the word whose attention to show (matched ignoring case)")
    p.add_argument("--occurrence", type=int, default=1, metavar="K",
                   help="which occurrence of WORD, if it appears more than once (default 1)")
    p.add_argument("--top", type=int, default=3, metavar="K", help="words per head and heads per word to list (default 3)")
    add_model_arg(p)
    p.add_argument("--json", action="store_true",
                   help='print JSON: {"words", "token", "token_index", "truncated", "weights": [layer][head][word]}')
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..understand.inspect import attend

    if not args.text.strip():
        raise InputError("the text is empty")
    if not args.token.strip():
        raise InputError("the --token word is empty")
    if args.top < 1:
        raise InputError("--top must be at least 1")
    bert = load_model(args)
    res = attend(bert, args.text, args.token, args.occurrence)
    if args.json:
        print_json(res.to_json())
        return 0
    N, H, W = res.weights.shape
    print(f'Where "{res.token}" (word {res.index}) looks: {N} layers x {H} heads, {W} words'
          + (" (text truncated)" if res.truncated else ""))
    print("Top words per head:")
    for layer in range(N):
        for head in range(H):
            tops = "  ".join(f"{w} {v:.2f}" for w, v in res.top_words(layer, head, args.top))
            print(f"  L{layer:<2} H{head:<2}  {tops}")
    print()
    print(f'Heads that send the most attention from "{res.token}" to each word:')
    for j, word in enumerate(res.words):
        if j == res.index:
            continue
        heads = "  ".join(f"L{l} H{h} {v:.2f}" for l, h, v in res.heads_for(j, args.top))
        print(f"  {word:<14} {heads}")
    return 0
