"""bertscope explain: what a word takes from the others, by attention and by the measures that
account for value norms, residuals and LayerNorm."""

from __future__ import annotations

import argparse
import sys

from .common import add_model_arg, load_model, print_json

HELP = """\
Say where WORD draws from, ranked, by one method (--method) or by every method side by side
(--compare). Raw attention weights alone mislead: a weight on a token whose value vector is
short moves little, and the residual and LayerNorm carry most of a token's own information.

methods (maps[i][j]: what word i takes from word j):
  attention             softmax weights, per head
  norm                  ||weight x f(x_j)||, per head (Kobayashi et al. 2020); a length, not a share
  norm-residual         attention + residual + LayerNorm, per layer (Kobayashi et al. 2021)
  value-zeroing         output change when j's value vector is zeroed, per layer (Mohebbi et al. 2023; ≤ 128 tokens)
  alti                  L1-distance contributions, rolled out through the layers (Ferrando et al. 2022)
  rollout               (A + I) / 2 rolled out through the layers (Abnar & Zuidema 2020)
  grad-input            gradient x input of one output: the cosine similarity of TEXT's embedding
  integrated-gradients  to --similar-to's, or, with a fine-tuned classifier as --model, the
                        probability of its predicted class (or of --label)
                        (integrated gradients: Sundararajan et al. 2017, from an all-zero
                        word-embedding baseline, 50-point Gauss-Legendre along the path)

Word level: what a word receives from another sums over that word's sub-tokens, what a word
takes averages over its own; gradient attributions sum over sub-tokens. Layers and heads are
numbered from 0; --layer defaults to the last layer (for alti and rollout: the whole model),
and per-head methods average their heads unless --head is given. In --compare, norm is shown
as each head's share of its row, averaged over the heads, so that columns compare; a text over
128 tokens leaves out value-zeroing (it reruns every layer once per token), with a note.

examples:
  bertscope explain "The animal didn't cross the street because it was too tired" --method alti --token it
  bertscope explain "The animal didn't cross the street because it was too tired" --method norm --token it --layer 3 --head 1
  bertscope explain "The animal didn't cross the street because it was too tired" --compare --token it
  bertscope explain "A dog sleeps on the sofa" --method integrated-gradients --similar-to "A sleeping puppy" --json
  bertscope explain "a gorgeous, witty film" --method grad-input --model sentiment/   # after bertscope finetune
"""


def register(sub) -> None:
    p = sub.add_parser("explain", help="what a word takes from the others, by attention, norms, ALTI, ...",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", metavar="TEXT", help="the text to explain")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--method", metavar="M", help="one method (see the list above)")
    mode.add_argument("--compare", action="store_true", help="every method's top words side by side (needs --token)")
    p.add_argument("--token", metavar="WORD", help="the word whose sources to rank")
    p.add_argument("--occurrence", type=int, default=None, metavar="K",
                   help="which occurrence of WORD, if it appears more than once (default 1)")
    p.add_argument("--layer", type=int, metavar="L", help="layer, from 0; -1 is the last (default: the last)")
    p.add_argument("--head", type=int, metavar="H",
                   help="head, for per-head methods, from 0; -1 is the last (default: mean over heads)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="words to list (default 5)")
    p.add_argument("--similar-to", metavar="TEXT_B",
                   help="for grad-input / integrated-gradients: explain the similarity to this text")
    p.add_argument("--label", metavar="NAME",
                   help="with a classifier: explain this class's probability (default: the predicted class)")
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON (word-level maps and the ranking)")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    """Every mistake that needs no model, before the model is loaded."""
    from ..errors import InputError
    from ..explain import check_method, method_kind

    if not args.text.strip():
        raise InputError("the text is empty")
    if args.token is not None and not args.token.strip():
        raise InputError("the --token word is empty")
    if args.top < 1:
        raise InputError("--top must be at least 1")
    if args.occurrence is not None and args.token is None:
        raise InputError("--occurrence picks one of the places --token WORD appears: give --token")
    if args.occurrence is not None and args.occurrence < 1:
        raise InputError("--occurrence must be at least 1")
    if args.similar_to is not None and not args.similar_to.strip():
        raise InputError("--similar-to is empty")
    if args.compare:
        if args.token is None:
            raise InputError("--compare ranks the sources of one word: give --token WORD")
        if args.head is not None:
            raise InputError("--head does not apply to --compare (per-head methods average their heads there)")
        return
    kind = method_kind(check_method(args.method))
    if kind == "layer" and args.head is not None:
        raise InputError(f"--head applies to the per-head methods (attention, norm); {args.method} "
                         "gives one map per layer")
    if kind == "input":
        if args.similar_to is not None and args.label is not None:
            raise InputError("give --similar-to or --label, not both")
        for flag, value in (("--token", args.token), ("--layer", args.layer), ("--head", args.head)):
            if value is not None:
                raise InputError(f"{flag} does not apply to {args.method}: it attributes one output to "
                                 "every word of the input")
    else:
        for flag, value in (("--similar-to", args.similar_to), ("--label", args.label)):
            if value is not None:
                raise InputError(f"{flag} is for grad-input and integrated-gradients; {args.method} maps "
                                 "the text's words onto each other")


def _target_kwargs(args: argparse.Namespace, method: str) -> dict:
    """What the gradient methods explain: --similar-to, or a classifier's class (--label or predicted)."""
    from ..explain import method_kind

    if method_kind(method) != "input":
        return {}
    return {"text_b": args.similar_to, "target": args.label}


def _ranked_json(ranked) -> list[dict]:
    return [{"index": j, "word": w, "value": round(v, 6)} for j, w, v in ranked]


def _nested(a) -> list:
    import numpy as np

    return np.round(a.astype(np.float64), 6).tolist()


def _locate(bert, exp, args) -> int | None:
    """The index of --token among the explanation's words (or None), with truncation explained."""
    from ..core.words import find_word

    if args.token is None:
        return None
    return find_word(exp.words, args.token, args.occurrence or 1, cut_text=args.text if exp.truncated else None,
                     positions=len(exp.tokens))


def _explain_and_locate(bert, args, method: str, shown: set[str] | None = None):
    """The explanation and --token's index in it; a warning the explanation gave (a text cut to
    the model's positions) is shown only if the word is found: else the error says it all.
    ``shown``: the warnings' texts already shown, each shown once (and added to it)."""
    import warnings

    from ..explain import explain

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exp = explain(bert, args.text, method, **_target_kwargs(args, method))
        index = _locate(bert, exp, args)
    _show_once(caught, set() if shown is None else shown)
    return exp, index


def _show_once(caught, shown: set[str]) -> None:
    """Show each caught warning whose text is not in ``shown`` yet (and add it)."""
    import warnings

    for w in caught:
        if str(w.message) not in shown:
            shown.add(str(w.message))
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _check_ranges(bert, args) -> None:
    """Mistakes that need the model: layers and heads out of range, a gradient method without
    an output to explain."""
    from ..errors import InputError
    from ..explain import method_kind

    L, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    if args.layer is not None and not -L <= args.layer < L:
        raise InputError(f"--layer {args.layer} does not exist (the model has layers 0..{L - 1}, or -{L}..-1 "
                         "from the end)")
    if args.head is not None and not -H <= args.head < H:
        raise InputError(f"--head {args.head} does not exist (each layer has heads 0..{H - 1}, or -{H}..-1 "
                         "from the end)")
    if args.layer is not None:
        args.layer %= L  # -1: the last, named as such in what is printed
    if args.head is not None:
        args.head %= H
    if args.label is not None and not bert.is_classifier:
        raise InputError("--label needs a fine-tuned classifier as --model (this model has no classification head)")
    if not args.compare and method_kind(args.method) == "input" and args.similar_to is None and not bert.is_classifier:
        raise InputError(f"{args.method} explains one output: give --similar-to TEXT_B (the similarity of "
                         "TEXT's embedding to TEXT_B's), or a fine-tuned classifier as --model")


def run(args: argparse.Namespace) -> int:
    _check(args)
    bert = load_model(args)
    _check_ranges(bert, args)
    return _compare(bert, args) if args.compare else _one(bert, args)


def _one(bert, args) -> int:
    from ..explain import METHOD_INFO

    exp, index = _explain_and_locate(bert, args, args.method)
    layer = None if exp.kind == "input" else (bert.config.num_hidden_layers - 1 if args.layer is None else args.layer)
    ranked = None
    if exp.kind == "input":
        ranked = exp.ranked(k=args.top)
    elif index is not None:
        ranked = exp.ranked(index, layer, args.head, k=args.top)
    who, unit = METHOD_INFO[exp.method]
    if args.json:
        wm = exp.word_maps()
        print_json({
            "method": exp.method, "kind": exp.kind, "source": who, "value": unit,
            "tokens": exp.tokens, "words": exp.words, "token_words": exp.token_words,
            "token": None if index is None else exp.words[index], "token_index": index,
            "layer": layer, "head": args.head, "target": exp.target, "truncated": exp.truncated,
            "shape": list(wm.shape), "maps": _nested(wm),
            "ranked": None if ranked is None else _ranked_json(ranked),
        })
        return 0
    note = " (text truncated)" if exp.truncated else ""
    if exp.kind == "input":
        print(f"{exp.method} ({who}): attribution of the {exp.target} to each word, largest |value| first "
              f"(+ raises it, - lowers it){note}")
        for r, (_, w, v) in enumerate(ranked, 1):
            print(f"  {r:>2}. {w:<16} {v:+.3g}")
        return 0
    where = f"layer {layer}" + ("" if exp.kind == "layer" else
                                (f" head {args.head}" if args.head is not None else " (mean over heads)"))
    if index is not None:
        print(f'What "{exp.words[index]}" (word {index}) takes, by {exp.method} ({who}; {unit}), {where}{note}:')
        for r, (_, w, v) in enumerate(ranked, 1):
            print(f"  {r:>2}. {w:<16} {v:.4f}")
        return 0
    print(f"By {exp.method} ({who}; {unit}), {where}: each word's top {args.top} sources{note}")
    for i, word in enumerate(exp.words):
        tops = "  ".join(f"{w} {v:.2f}" for _, w, v in exp.ranked(i, layer, args.head, k=args.top))
        print(f"  {word:<16} {tops}")
    return 0


def _value(v: float) -> str:
    """Two decimals, or two significant digits where two decimals would show 0.00 (a classifier's
    gradient attributions are often about 1e-4)."""
    return f"{v:.2f}" if v == 0 or abs(v) >= 0.005 else f"{v:.1e}"


def _compare(bert, args) -> int:
    import warnings

    import numpy as np

    from ..core.tokenizer import TruncationWarning

    from ..explain import METHOD_INFO, METHODS, VALUE_ZEROING_MAX_TOKENS, explain, method_kind, method_tokens

    layer = bert.config.num_hidden_layers - 1 if args.layer is None else args.layer
    explains_output = args.similar_to is not None or bert.is_classifier
    methods = [m for m in METHODS if method_kind(m) != "input" or explains_output]
    left_out: dict[str, str] = {}
    with warnings.catch_warnings():  # a count: the explain() calls below say where the text was cut
        warnings.simplefilter("ignore", TruncationWarning)
        T = method_tokens(bert, args.text, "value-zeroing")  # as explain() will cut it
    if T > VALUE_ZEROING_MAX_TOKENS:  # it would be refused after the other columns' work
        methods.remove("value-zeroing")
        left_out["value-zeroing"] = (f"limited to {VALUE_ZEROING_MAX_TOKENS} tokens (it reruns every layer once "
                                     f"per token); this text has {T}")
        print(f"bertscope: note: value-zeroing left out: {left_out['value-zeroing']}", file=sys.stderr)
    columns: dict[str, list[tuple[int, str, float]]] = {}
    index = None
    first = None
    target = None
    shown: set[str] = set()  # a text cut alike for several methods is said once; a gradient
    # method's cut at max_seq_length, shorter than the maps', is said too
    for m in methods:
        if first is None:
            exp, index = _explain_and_locate(bert, args, m, shown)
            first = exp
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                exp = explain(bert, args.text, m, **_target_kwargs(args, m))
            _show_once(caught, shown)
        if exp.kind == "input":
            target = exp.target
            columns[m] = exp.ranked(k=args.top)
            continue
        if m == "norm":  # each head's lengths -> shares of its row, then their mean over heads, so
            # that the columns compare (as docs/EXPERIMENTS.md's re-read computes them)
            rows = np.stack([exp.sources(index, layer, h) for h in range(bert.config.num_attention_heads)])
            row = (rows / np.maximum(rows.sum(-1, keepdims=True), np.finfo(np.float32).tiny)).mean(0)
        else:
            row = exp.sources(index, layer)
        order = np.argsort(-row, kind="stable")[: args.top]
        columns[m] = [(int(j), exp.words[j], float(row[j])) for j in order]
    word = first.words[index]
    if args.json:
        print_json({"token": word, "token_index": index, "words": first.words, "layer": layer,
                    "target": target, "truncated": first.truncated,
                    "methods": {m: {"kind": method_kind(m), "source": METHOD_INFO[m][0],
                                    "ranked": _ranked_json(r)} for m, r in columns.items()},
                    "left_out": left_out})
        return 0
    print(f'What "{word}" (word {index}) takes, layer {layer}: per-head methods averaged over heads, '
          "norm as each head's share of its row" + (" (text truncated)" if first.truncated else ""))
    width = max(max(len(m) for m in columns) + 2, max(len(w) for w in first.words) + 10)
    print("rank  " + "".join(f"{m:<{width}}" for m in columns))
    for r in range(args.top):
        cells = []
        for m, ranked in columns.items():
            cells.append(f"{ranked[r][1]} {_value(ranked[r][2])}" if r < len(ranked) else "")
        print(f"{r + 1:<6}" + "".join(f"{c:<{width}}" for c in cells))
    if target is not None:
        print(f"grad-input and integrated-gradients: attribution of the {target}, not a row of \"{word}\"")
    return 0
