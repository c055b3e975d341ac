"""bertscope trace: the seed's steps [1]-[5] on real numbers, for one layer, head and token."""

from __future__ import annotations

import argparse
import math

from .common import add_model_arg, load_model
from .guard import print_json_strict

HELP = """\
Walk through one layer's self-attention on real numbers, the way the seed (the explainer of
BERT's attention that bertscope grew from; see the README) explains it:
[1] project x to Q, K, V; [2] split into heads; [3] scores Q·Kᵀ, ÷√d_head, the PAD mask,
softmax, dropout; [4] merge heads; [5] output projection W_O. For the chosen token and head it
prints the raw scores, the scaled scores, the mask, the softmax row (top tokens and words),
what dropout would do in training, the shape at every step and the layer's parameter count.

The trace calls the model's own modules, so its numbers are the model's numbers. A word split into
several sub-tokens is traced at its first sub-token; its "top words" (and the JSON's word_weights
and top_words) are the word's row at word level, as attend gives it: all its sub-tokens' rows
averaged, each summed by word. --pad N appends N [PAD] tokens to show the mask.
Layers and heads are numbered from 0.

examples:
  bertscope trace "The animal didn't cross the street because it was too tired" --token it --layer 3 --head 1
  bertscope trace "The cat sat" --token cat --pad 2          # append 2 [PAD] tokens to see the mask work
  bertscope trace "The cat sat" --token sat --json
"""


def register(sub) -> None:
    p = sub.add_parser("trace", help="step-by-step attention for one token, layer and head",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", metavar="TEXT", help="the text to run through the model")
    p.add_argument("--token", metavar="WORD", required=True, help="the word whose query to trace")
    p.add_argument("--occurrence", type=int, default=1, metavar="K", help="which occurrence of WORD (default 1)")
    p.add_argument("--layer", type=int, default=0, metavar="L", help="layer, from 0; -1 is the last (default 0)")
    p.add_argument("--head", type=int, default=0, metavar="H", help="head, from 0; -1 is the last (default 0)")
    p.add_argument("--pad", type=int, default=0, metavar="N", help="append N [PAD] tokens (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the dropout sample (default 0)")
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print the trace as JSON")
    p.set_defaults(func=run)


def _row(tokens: list[str], values, fmt: str = "{:+.3f}") -> str:
    return "  ".join(f"{tok}={fmt.format(float(v))}" for tok, v in zip(tokens, values))


def run(args: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..understand.trace import trace

    if not args.text.strip():
        raise InputError("the text is empty")
    bert = load_model(args)
    tr = trace(bert, args.text, args.token, args.layer, args.head,
               occurrence=args.occurrence, pad=args.pad, seed=args.seed)
    if args.json:
        print_json_strict(tr.to_json())
        return 0
    H, D, C = tr.num_heads, tr.head_size, tr.hidden_size
    tok = tr.tokens[tr.token_index]
    s = tr.shapes
    of_word = (f', the first of the {tr.word_tokens} tokens of "{tr.words[tr.word_index]}"'
               if tr.word_tokens > 1 else "")  # a split word: the steps are its first token's
    print(f'Trace of "{tok}" (token {tr.token_index}{of_word}), layer {tr.layer} (of 0..{tr.num_layers - 1}), '
          f"head {tr.head} (of 0..{H - 1}); C = {C} = {H} heads x D = {D}")
    print(f"tokens: {' '.join(tr.tokens)}")
    print()
    print(f"[0] input x (this layer's input hidden states): {s['x']}  (B, T, C)")
    print(f"[1] Q = x·W_Q + b, K = x·W_K + b, V = x·W_V + b, each {C}->{C}: "
          f"Q {s['Q']}, K {s['K']}, V {s['V']}  (B, T, C)")
    print(f"[2] split into {H} heads of {D}: Q/K/V -> {s['Q heads']}  (B, H, T, D)")
    print(f"[3] scores = Q·Kᵀ / √{D} -> {s['scores']}  (B, H, T, T)")
    print(f'    raw scores q("{tok}")·k_j (head {tr.head}):')
    print("      " + _row(tr.tokens, tr.raw_scores))
    print(f"    ÷ √{D} = {math.sqrt(D):.3f}:")
    print("      " + _row(tr.tokens, tr.scores))
    n_pad = int((tr.mask == 0).sum())
    print(f"    mask (1 = token, 0 = PAD): {' '.join(str(int(m)) for m in tr.mask.tolist())}"
          + (f"  -> {n_pad} PAD key(s) get {float(tr.bias.min()):.3g} added" if n_pad else "  (no PAD: nothing added)"))
    print(f"    weights = softmax(scores) -> {s['weights']}  (row sums to {float(tr.weights.sum()):.6f})")
    print("      " + _row(tr.tokens, tr.weights, "{:.3f}"))
    print("    top tokens: " + "  ".join(f"{t} {v:.3f}" for t, v in tr.top_tokens()))
    if tr.word_tokens > 1:  # not this row: the word-level row, as attend and the explorer give it
        print(f'    top words ("{tr.words[tr.word_index]}"\'s {tr.word_tokens} sub-token rows averaged, '
              f"each summed by word, as attend gives it):")
        print("                " + "  ".join(f"{w} {v:.3f}" for w, v in tr.top_words()))
    else:
        print("    top words:  " + "  ".join(f"{w} {v:.3f}" for w, v in tr.top_words()))
    live = tr.weights != 0
    kept = int((tr.dropped[live] != 0).sum())
    print(f"    dropout p = {tr.dropout_p} (training only; off here): one sample keeps {kept} of "
          f"{int(live.sum())} weights, scaled by 1/(1-p) = {1 / (1 - tr.dropout_p) if tr.dropout_p < 1 else float('inf'):.3f};"
          f" the row then sums to {float(tr.dropped.sum()):.3f} (1 on average)")
    print("      " + _row(tr.tokens, tr.dropped, "{:.3f}"))
    print(f"    context = weights·V -> {s['context']}  (B, H, T, D)")
    print(f"[4] merge heads -> {s['merged']}  (B, T, C), {H} x {D} = {C}")
    print(f"[5] output = context·W_O + b -> {s['output']}  (B, T, C)")
    print(f"    then residual + LayerNorm + feed-forward + residual + LayerNorm -> {s['layer output']}")
    print()
    pr = tr.params
    print(f"parameters of this layer's attention: W_Q {pr['W_Q']:,}  W_K {pr['W_K']:,}  "
          f"W_V {pr['W_V']:,}  W_O {pr['W_O']:,}  ({C} x {C} + {C} each)")
    print(f"  {pr['layer_weights']:,} weights, {pr['layer_total']:,} with biases; head {tr.head}'s share: "
          f"{pr['one_head_qkv']:,} weights and biases in W_Q/W_K/W_V and {pr['one_head_wo']:,} weights "
          f"of W_O (its {D} input rows x {C})")
    return 0
