"""bertscope params: how many parameters attention has (SPEC S10)."""

from __future__ import annotations

import argparse

from .common import MODEL_HELP, print_json

HELP = """\
Count the attention parameters of one layer (W_Q, W_K, W_V, W_O, weights and biases), of all
layers, and of the whole model. Counted from the built model, not from a formula. With --model
the model is built from the folder's config.json alone: its weights are not read (their file
may even be missing).

For bert-base: 4 x 768 x 768 = 2,359,296 weights + 4 x 768 biases = 2,362,368 per layer;
x 12 layers = 28,348,416; the whole model with pooler has 109,482,240.

examples:
  bertscope params --preset bert-base
  bertscope params --preset bert-large --json
  bertscope params --model ./my-bert-folder
"""


def register(sub) -> None:
    p = sub.add_parser("params", help="count attention and model parameters", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", metavar="NAME",
                   help="a named size: bert-base, bert-large or minilm-l6 (built on the meta device, no memory)")
    g.add_argument("--model", metavar="PATH", help=MODEL_HELP)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..core.checkpoint import bundled_model_path, check_folder
    from ..core.config import BertConfig, ConfigError
    from ..core.params import count_config
    from ..errors import BertscopeError

    try:
        if args.preset:
            config, source = BertConfig.preset(args.preset), f"preset {args.preset}"
        else:
            folder = Path(args.model) if args.model else bundled_model_path()
            check_folder(folder)
            config, source = BertConfig.from_json(folder / "config.json"), str(folder)
    except ConfigError as e:
        raise BertscopeError(str(e)) from None
    pc = count_config(config)  # built on the meta device: counts without allocating the weights
    if args.json:
        print_json({"source": source, **pc.to_json()})
        return 0
    C, H, D, N = config.hidden_size, config.num_attention_heads, config.head_size, config.num_hidden_layers
    note = "" if args.preset else " (from its config.json; the weights are not read)"
    print(f"{source}{note}: hidden {C} = {H} heads x {D}, {N} layers")
    print()
    biases = pc.per_layer_total - pc.per_layer_weights
    # columns as wide as their largest figure (and two spaces): a huge config's never run together
    ww, wb, wt = (max(min_w, len(f"{n:,}") + 2) for min_w, n in ((14, pc.per_layer_weights), (10, biases),
                                                                  (14, pc.per_layer_total)))
    print(f"{'one layer':<12}{'weights':>{ww}}{'biases':>{wb}}{'total':>{wt}}")
    for label, (w, b) in pc.per_matrix.items():
        print(f"{label:<12}{w:>{ww},}{b:>{wb},}{w + b:>{wt},}    {C} x {C} + {C}")
    print(f"{'per layer':<12}{pc.per_layer_weights:>{ww},}{biases:>{wb},}{pc.per_layer_total:>{wt},}")
    print()
    rows = [(f"attention, all {N} layers:", f"{pc.attention_total:,}"),
            ("whole model (with pooler):", f"{pc.model_total:,}"),
            ("attention share:", f"{pc.attention_share:.1%}")]
    label = max(len(a) for a, _ in rows) + 1
    value = max(len(b) for _, b in rows) + 4
    for a, b in rows:  # labels left, figures right, one column whatever the layer count
        print(f"{a:<{label}}{b:>{value}}")
    return 0
