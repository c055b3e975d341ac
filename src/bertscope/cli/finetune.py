"""bertscope finetune: train the from-scratch BERT as a sequence classifier."""

from __future__ import annotations

import argparse

from .common import MODEL_HELP
from .progress import add_progress_args

HELP = """\
Fine-tune a BERT checkpoint (default: the bundled all-MiniLM-L6-v2) as a sequence classifier
on TRAIN, and write DIR as a Hugging Face-format folder (config.json with architectures,
id2label and label2id; model.safetensors; the tokenizer files) plus metrics.json. DIR loads in
bertscope.load(DIR), `bertscope predict DIR ...` and transformers'
AutoModelForSequenceClassification.from_pretrained(DIR).

TRAIN and DEV are CSV (.csv) or TSV (.tsv) with a header row, or JSON Lines (.jsonl, .ndjson,
.json: one JSON object per line): one record per example, the text in --text-field, an optional
second text (NLI-style pairs, segment ids 0/1) in --text-pair-field, the label (a string or an
integer) in --label-field. The label set comes from TRAIN; DEV may hold no other label. A bad
record refuses the file, with its line.

Training is plain PyTorch on the packed path (no arithmetic on padding): length-grouped batches of
at most --batch-tokens real tokens and --batch-size examples, AdamW with linear warm-up and decay,
gradient clipping at 1.0, dropout wherever the checkpoint puts it (attention dropout included). DEV
is scored each epoch: accuracy beside the majority-label baseline (TRAIN's commonest label for
every example; a warning when every DEV example gets one label), and macro-F1. A checkpoint is
written atomically every --save-every steps and at each epoch end; after an interruption, the same
command with --resume continues exactly from the last one (a run stopped before its first starts
again from the beginning, with a warning). Each epoch's line (and its row in
metrics.json) gives the training tokens per second without a process's first step, its warm-up
(first allocations, kernel plans), whose seconds and tokens are in warmup_seconds and
warmup_tokens (an epoch of that one step alone gives its rate).

examples:
  bertscope finetune train.csv --dev dev.csv --out sentiment/
  bertscope finetune nli.jsonl --text-field premise --text-pair-field hypothesis --out nli/
  bertscope finetune train.csv --dev dev.csv --out sentiment/ --resume    # after an interruption
  bertscope predict sentiment/ reviews.txt
"""


def register(sub) -> None:
    p = sub.add_parser("finetune", help="fine-tune BERT as a sequence classifier", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("train", metavar="TRAIN", help="training data: .csv, .tsv or .jsonl (.ndjson, .json)")
    p.add_argument("--out", metavar="DIR", required=True, help="output folder (must be new or empty, unless --resume)")
    p.add_argument("--dev", metavar="DEV", default=None, help="dev data, scored each epoch (same format)")
    p.add_argument("--model", metavar="PATH", default=None, help="the model to start from: " + MODEL_HELP)
    p.add_argument("--text-field", "--field", dest="text_field", default="text", metavar="NAME", help='the text column or field (default "text")')
    p.add_argument("--text-pair-field", default=None, metavar="NAME",
                   help="a second text per example (segment 1), for text pairs")
    p.add_argument("--label-field", default="label", metavar="NAME", help='the label column or field (default "label")')
    p.add_argument("--max-length", type=int, default=192, metavar="N",
                   help="tokens per example, [CLS] and [SEP] included; longer texts are cut (default 192)")
    p.add_argument("--epochs", type=int, default=3, metavar="N", help="passes over TRAIN (default 3; at most 10,000)")
    p.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (default 5e-5)")
    p.add_argument("--batch-tokens", type=int, default=None, metavar="N",
                   help="real tokens per batch (default 16 x --max-length); an example longer than N is a "
                        "batch of its own, and a warning counts them")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="at most N examples per batch (default 32)")
    p.add_argument("--warmup", type=float, default=0.1, metavar="SHARE",
                   help="share of the steps with a linearly rising learning rate (default 0.1)")
    p.add_argument("--weight-decay", type=float, default=0.01, metavar="W", help="AdamW weight decay (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed for the head, dropout and batch order: 0 to 2**64 - 1 (default 0)")
    p.add_argument("--save-every", type=int, default=200, metavar="STEPS",
                   help="steps between checkpoints (0: only at epoch ends; default 200)")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in DIR (from its last checkpoint; where it has none yet, "
                        "start there)")
    add_progress_args(p)
    p.set_defaults(func=run, resumable=resumable)


def resumable(args: argparse.Namespace) -> bool:
    """Whether DIR holds a checkpoint for --resume to continue from (none before the first)."""
    from pathlib import Path

    from ..train.loop import STATE_FILE

    return (Path(args.out) / STATE_FILE).is_file()


def run(args: argparse.Namespace) -> int:
    import sys

    from ..train.loop import FinetuneConfig, finetune
    from .common import check_output_dir
    from .progress import progress_enabled

    show = progress_enabled(args)  # a bar on a terminal (or with --progress), never into a log
    cfg = FinetuneConfig(
        train=args.train, dev=args.dev, model=args.model, text_field=args.text_field,
        pair_field=args.text_pair_field, label_field=args.label_field, max_length=args.max_length,
        epochs=args.epochs, lr=args.lr, batch_tokens=args.batch_tokens, batch_size=args.batch_size,
        warmup=args.warmup, weight_decay=args.weight_decay, seed=args.seed, save_every=args.save_every)
    cfg.check()
    out = check_output_dir(args.out)
    from tqdm import tqdm

    bar = None

    def on_start(total: int, done: int) -> None:
        nonlocal bar
        if done:  # said now: a resumed run that is stopped again showed no sign that it had resumed
            print(f"bertscope: resuming at step {done:,} of {total:,}", file=sys.stderr)
        bar = tqdm(total=total, initial=done, unit="step", file=sys.stderr, disable=not show,
                   dynamic_ncols=True, desc="finetune")

    def on_step(info) -> None:
        if bar is not None:
            bar.set_postfix(epoch=info.epoch + 1, loss=f"{info.loss:.4f}", tok_s=f"{info.tokens_per_s:,.0f}",
                            refresh=False)
            bar.update(1)

    def on_epoch(row: dict) -> None:
        dev = (f", dev accuracy {row['dev_accuracy']:.4f} (majority-label baseline {row['dev_majority_accuracy']:.4f}), "
               f"macro-F1 {row['dev_macro_f1']:.4f}" if "dev_accuracy" in row else "")
        line = (f"epoch {row['epoch']}: loss {row['train_loss']:.4f}{dev}, "
                f"{row['tokens_per_s']:,.0f} tokens/s, {row['wall_seconds']:.1f} s")
        lines = [line]
        if row.get("dev_labels_predicted") == 1 and row.get("dev_accuracy", 1.0) < 1.0:  # DEV of one label: no sign
            steps = row.get("steps")
            few = (f"an epoch of {steps:,} steps is few: smaller batches (--batch-size, --batch-tokens) give more, "
                   "or train for more epochs"
                   if isinstance(steps, int) and steps < 200 else "train for more epochs, or with another --lr")
            lines.append(f"bertscope: warning: epoch {row['epoch']} gave every DEV example the same label: so far "
                         f"the model does no better than the majority-label baseline ({few})")
        for text in lines:
            if bar is not None and show:
                bar.write(text, file=sys.stderr)
            else:
                print(text, file=sys.stderr)

    try:
        res = finetune(cfg, out, resume=args.resume, on_step=on_step, on_epoch=on_epoch, on_start=on_start)
    finally:
        if bar is not None:
            bar.close()
    if res.resumed_from_step:
        print(f"resumed at step {res.resumed_from_step}")
    if res.truncated:
        print(f"bertscope: warning: {res.truncated} training text(s) longer than {cfg.max_length} tokens were cut",
              file=sys.stderr)
    last = res.metrics["epochs"][-1] if res.metrics["epochs"] else {}
    dev = f"; dev accuracy {last['dev_accuracy']:.4f}" if "dev_accuracy" in last else ""
    print(f"wrote {res.out_dir} ({len(res.labels)} labels: {', '.join(res.labels)}){dev}")
    return 0
