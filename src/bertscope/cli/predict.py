"""bertscope predict: a fine-tuned classifier's label and probabilities for every line of a file."""

from __future__ import annotations

import argparse
import re
from glob import escape as glob_escape
from pathlib import Path

from .progress import add_progress_args

HELP = """\
Classify every record of INPUT with the fine-tuned classifier in DIR (a folder written by
`bertscope finetune`, or any Hugging Face BertForSequenceClassification folder), in input order.

INPUT is a text file (one text per line), JSON Lines (.jsonl, .ndjson, .json: the text in
--text-field), or CSV/TSV with a header row (.csv, .tsv). Texts longer than the length the
model was fine-tuned at (--max-length to change) are cut.

Output (stdout, or --out FILE, written atomically): a tab-separated table with a header, one
row per record: line, status, label, then one probability column per label. With --json, JSON
Lines: {"line": 3, "status": "ok", "label": "pos", "probs": {"neg": 0.02, "pos": 0.98}}.
A bad record gets no prediction and a status, as in `bertscope embed`: empty (blank, or only
characters the tokenizer drops, such as U+200B), undecodable (not UTF-8), bad_json, no_field,
not_text, extra_fields (a CSV/TSV row with more fields than its header: a comma in an unquoted
text shifts the columns); a cut text has status truncated (it is predicted). A blank
line is a record of status empty (in a CSV/TSV file too), so the output of a text or JSON Lines
file has one row per input line. If records fail and none holds a text (a blank line fails
nothing), INPUT is refused: the wrong --text-field, or the wrong file. A file of blank lines
gives rows of status empty; an empty file, the header alone. With --out, stderr counts the
predictions written and the records without one.

With --label-field NAME (JSON Lines, CSV, TSV), the gold label of each record is read from that
field and the predictions are scored against it: stderr gets the accuracy and macro-F1 (over the
model's labels) with the baseline that predicts the commonest gold label for every text, the
output a gold column ("gold" in JSON), and --metrics FILE a JSON report: accuracy, macro_f1,
majority_accuracy, per_label precision/recall/f1/support, the confusion counts (gold, then
predicted), and the lines left unscored. A record without a label (missing, empty, null) is
predicted and not scored, and so is one whose label cannot be read (a float such as 1.0, a list:
named, with its line); a gold label the model does not have counts as wrong, and is named.
Integer labels score against a model whose labels are LABEL_0, LABEL_1, ... (Hugging Face's
default names) as those.

With --out, the rows are kept on disk as they are computed, in FILE.partial (every 1,024
records or 50,000 characters), so a run stopped by Ctrl-C, a kill or a crash loses at most the
chunk it was in: the same command with --resume goes on from there and writes the FILE a run
that never stopped would have written. It refuses when INPUT, the model's files or a setting
that changes a row (--max-length, --text-field, --text-pair-field, --batch-tokens: the batches
change a probability's last digits) differ from the run's; a run without --resume refuses to
start over a FILE.partial that holds rows, and any FILE.partial predict did not write. FILE.partial
goes when FILE is written. It also records the kernel choice the run computes with (see
`bertscope doctor`), and a resumed run computes with it again, even where this machine's cached
choice was measured again since.

examples:
  bertscope predict sentiment/ reviews.txt
  bertscope predict sentiment/ reviews.jsonl --text-field body --json --out predictions.jsonl
  bertscope predict nli/ pairs.tsv --text-field premise --text-pair-field hypothesis
  bertscope predict sentiment/ big.jsonl --out big.tsv --resume    # after an interruption
  bertscope predict sentiment/ test.csv --label-field label --metrics test-metrics.json
"""


def register(sub) -> None:
    p = sub.add_parser("predict", help="classify every line of a file with a fine-tuned model",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", metavar="DIR", help="a fine-tuned classifier folder")
    p.add_argument("input", metavar="INPUT",
                   help="text file (one per line), JSON Lines (.jsonl, .ndjson, .json), .csv or .tsv")
    p.add_argument("--json", action="store_true", help="JSON Lines instead of a tab-separated table")
    p.add_argument("--out", metavar="FILE", default=None, help="write here instead of stdout (- is stdout)")
    p.add_argument("--text-field", "--field", dest="text_field", default=None, metavar="NAME",
                   help='the text field or column of .jsonl/.csv/.tsv input (default "text")')
    p.add_argument("--text-pair-field", default=None, metavar="NAME",
                   help="the field or column holding the second text of a pair (JSON Lines, CSV, TSV); "
                        "a classifier fine-tuned on pairs needs it, and predict warns when it is left out")
    p.add_argument("--label-field", default=None, metavar="NAME",
                   help="score the predictions against the gold labels in this field or column "
                        "(JSON Lines, CSV, TSV): accuracy and macro-F1 on stderr, a gold column in the output")
    p.add_argument("--metrics", metavar="FILE", default=None,
                   help="with --label-field: write the scores as JSON here (per label, confusion counts; - is "
                        "stdout, with --out FILE)")
    p.add_argument("--max-length", type=int, default=None, metavar="N",
                   help="cut texts to N tokens, 3 at least (5 for pairs: one token of each text), at most "
                        "the model's positions (512 for BERT); default: the length the model was fine-tuned at")
    p.add_argument("--batch-tokens", type=int, default=None, metavar="N",
                   help="real tokens per batch (default: 2048 on CPU, 16384 on a GPU)")
    p.add_argument("--resume", action="store_true",
                   help="finish the run whose rows FILE.partial holds (needs --out); without one, start")
    add_progress_args(p)
    p.set_defaults(func=run, resumable=_resumable)


def _resumable(args: argparse.Namespace) -> bool:
    """Whether a stopped run left rows for --resume (none before its first chunk)."""
    from ..train.progressfile import peek

    done = peek(args.out) if args.out else None
    return bool(done and done[0])


CHUNK = 1024  # records classified per progress update, at most
CHUNK_CHARS = 50_000  # and characters: a chunk of long reviews is a few seconds, not minutes at 0%


def _chunks(records):
    """Runs of consecutive records, each of at most CHUNK records and, past its first record,
    CHUNK_CHARS characters of text: the progress bar moves every few seconds whatever the
    lengths, and the chunks depend on the input alone (so do the results, to the bit)."""
    start = 0
    while start < len(records):
        end, chars = start, 0
        while end < len(records) and end - start < CHUNK and (end == start or chars < CHUNK_CHARS):
            r = records[end]
            chars += len(r.text or "") + len(r.pair or "")
            end += 1
        yield records[start:end]
        start = end


def predictions(bert, records, *, max_length: int | None = None, batch_tokens: int | None = None,
                progress=None, on_chunk=None) -> list[dict]:
    """One dict per record, in order: line, status, label and probs (None for a bad record).
    ``on_chunk(rows)`` gets each chunk's rows as it is done (to keep them on disk)."""
    from ..core.tokenizer import tokenless

    labels = bert.labels
    limit = bert.max_seq_length if max_length is None else max_length
    rows: list[dict] = []
    for chunk in _chunks(records):
        first = len(rows)
        good = [r for r in chunk if r.status == "ok"]
        pairs = [r.pair or "" for r in good] if any(r.pair is not None for r in good) else None
        ids, types, cut = bert.tokenizer.encode_segments([r.text for r in good], pairs, max_length=limit)
        # only characters the tokenizer drops (U+200B...): empty, as a blank line is
        dropped = {k for k, row in enumerate(ids) if tokenless(row, pair=pairs is not None) and not cut[k]}
        empty = {id(good[k]) for k in dropped}
        keep = [k for k in range(len(good)) if k not in dropped]
        ids, types, cut = [ids[k] for k in keep], [types[k] for k in keep], [cut[k] for k in keep]
        probs = bert.classify_ids(ids, types, batch_tokens=batch_tokens) if ids else None
        k = 0
        for r in chunk:
            if r.status != "ok" or id(r) in empty:
                rows.append({"line": r.line, "status": "empty" if id(r) in empty else r.status, "label": None,
                             "probs": None})
                continue
            p = probs[k]
            rows.append({"line": r.line, "status": "truncated" if cut[k] else "ok",
                         "label": labels[int(p.argmax())], "probs": {n: float(v) for n, v in zip(labels, p)}})
            k += 1
        if on_chunk is not None:
            on_chunk(rows[first:])
        if progress is not None:
            progress(len(chunk))
    return rows


def render(rows: list[dict], labels: list[str], as_json: bool, gold: list[str | None] | None = None) -> str:
    """The output: a TSV table or JSON Lines; with ``gold`` (one per row), a gold column after label."""
    if gold is not None and len(gold) != len(rows):
        raise ValueError("one gold label (or None) per row")
    if as_json:
        from .guard import dumps_strict

        if gold is None:
            return "".join(dumps_strict(r) + "\n" for r in rows)
        return "".join(dumps_strict({"line": r["line"], "status": r["status"], "label": r["label"], "gold": g,
                                     "probs": r["probs"]}) + "\n" for r, g in zip(rows, gold))
    gold_head = ["gold"] if gold is not None else []
    lines = ["\t".join(["line", "status", "label"] + gold_head + [f"p_{n}" for n in labels])]
    for k, r in enumerate(rows):
        probs = [f"{r['probs'][n]:.6f}" for n in labels] if r["probs"] else [""] * len(labels)
        cell = [gold[k] or ""] if gold is not None else []
        lines.append("\t".join([str(r["line"]), r["status"], r["label"] or ""] + cell + probs))
    return "\n".join(lines) + "\n"


def gold_labels(records, labels: list[str]) -> tuple[list[str | None], bool]:
    """Each record's gold label as one of the model's names where it can be (None: no label), and
    whether integer labels were read as Hugging Face's default names (3 as LABEL_3)."""
    known = set(labels)
    default_names = all(re.fullmatch(r"LABEL_\d+", n) for n in labels)
    gold: list[str | None] = []
    renamed = False
    for r in records:
        g = r.label
        if g is not None and g not in known and default_names and re.fullmatch(r"\d+", g) \
                and f"LABEL_{int(g)}" in known:
            g, renamed = f"LABEL_{int(g)}", True
        gold.append(g)
    return gold, renamed


def score(rows: list[dict], gold: list[str | None], labels: list[str], label_field: str,
          problems: list[str | None] | None = None) -> dict:
    """The --metrics report: train.metrics.label_report over the rows that have both a prediction
    and a gold label; which lines were left out: no label (``unlabelled_lines``), a label that
    could not be read (``unreadable_labels``: line and why, from ``problems``, one per row: None
    for a label that is not there), no prediction (``unpredicted_lines``); and which gold labels
    the model lacks."""
    from ..train.metrics import label_report

    problems = problems if problems is not None else [None] * len(rows)
    pairs = [(r["label"], g) for r, g in zip(rows, gold) if r["label"] is not None and g is not None]
    report = label_report([p for p, _ in pairs], [g for _, g in pairs], labels)
    unknown: dict[str, int] = {}
    for _, g in pairs:
        if g not in labels:
            unknown[g] = unknown.get(g, 0) + 1
    left = [(r["line"], why) for r, g, why in zip(rows, gold, problems) if r["label"] is not None and g is None]
    return {"label_field": label_field, "labels": list(labels), **report,
            "unknown_labels": unknown,
            "unlabelled_lines": [line for line, why in left if why is None],
            "unreadable_labels": [{"line": line, "problem": why} for line, why in left if why is not None],
            "unpredicted_lines": [r["line"] for r in rows if r["label"] is None]}


def _twin(value: str, labels: list[str]) -> str | None:
    """The model's label that a gold label not among them most likely means: the same name in
    another case ("POS", "pos"), or an integer written as a float ("1.0": how pandas writes an
    integer column with a gap, in CSV too); None when there is none."""
    by_case = {n.casefold(): n for n in labels}
    if value.casefold() in by_case:
        return by_case[value.casefold()]
    if re.fullmatch(r"-?\d+\.0+", value):
        whole = value.split(".")[0]
        for name in (whole, f"LABEL_{whole}"):
            if name in labels:
                return name
    return None


def _short(value: str, width: int = 30) -> str:
    """A value for a message: cut to ``width`` characters, quoted."""
    return repr(value if len(value) <= width else value[:width - 3] + "...")


def _lines(nums: list[int]) -> str:
    """"line 3" / "lines 3, 5, ... (2 more)": at most ten line numbers."""
    shown = ", ".join(map(str, nums[:10])) + (f", ... ({len(nums) - 10} more)" if len(nums) > 10 else "")
    return f"{'line' if len(nums) == 1 else 'lines'} {shown}"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def summary(rows: list[dict]) -> str:
    """"2 predictions, 1 empty record": the predicted rows (ok or truncated), then the rows without
    a prediction, by status."""
    predicted = sum(r["status"] in ("ok", "truncated") for r in rows)
    bad: dict[str, int] = {}
    for r in rows:
        if r["status"] not in ("ok", "truncated"):
            bad[r["status"]] = bad.get(r["status"], 0) + 1
    return ", ".join([_count(predicted, "prediction")] + [_count(n, f"{s} record") for s, n in bad.items()])


def _fine_tuned_pair_field(folder: Path) -> str | None | bool:
    """The pair field a classifier was fine-tuned with, from the metrics.json that
    ``bertscope finetune`` writes beside it: False for single texts, None when it cannot say
    (no such file, or not bertscope's)."""
    import json

    try:
        settings = json.loads((folder / "metrics.json").read_text(encoding="utf-8")).get("settings", {})
        if not isinstance(settings, dict) or "pair_field" not in settings:
            return None
        field = settings["pair_field"]
    except (OSError, ValueError, AttributeError):
        return None
    return field if isinstance(field, str) else False if field is None else None


def _remove_stale_temporaries(out: Path) -> None:
    """The temporaries (".FILE.RANDOM.tmp") a run killed while writing FILE left beside it."""
    from ..files import TEMP_SUFFIX

    for tmp in out.parent.glob(f".{glob_escape(out.name)}.*{TEMP_SUFFIX}"):
        try:
            tmp.unlink()
        except OSError:
            pass


def run(args: argparse.Namespace) -> int:
    import os
    import sys
    from pathlib import Path

    from ..bert import load
    from ..core.tokenizer import least_read_length
    from ..errors import InputError
    from ..files import why_not_a_file, write_text_atomic
    from ..train.data import file_format, read_records
    from .common import check_output_file
    from .guard import writing
    from .progress import progress_enabled

    if not Path(args.input).is_file():
        raise InputError(why_not_a_file(args.input))
    if args.out == "-":  # the shell's name for standard output, where the rows go without --out
        args.out = None
    if args.metrics == "-":  # standard output, when the rows go to a file
        if args.out is None:
            raise InputError("--metrics - and the predictions would both go to standard output; give --metrics a "
                             "file name, or --out one")
        args.metrics = "/dev/stdout"
    if args.resume and args.out is None:
        raise InputError("--resume needs --out: a run to standard output keeps no rows to resume from")
    if args.batch_tokens is not None and args.batch_tokens < 1:
        raise InputError(f"--batch-tokens must be at least 1, not {args.batch_tokens}")
    out = check_output_file(args.out) if args.out is not None else None
    if out is not None and Path(out).exists() and os.path.samefile(out, args.input):
        raise InputError(f"--out {args.out} is INPUT itself: writing there would replace the texts; "
                         "choose another file")
    suffix = Path(args.input).suffix.lower()
    if suffix in (".parquet", ".pq"):
        raise InputError(f"predict reads text, JSON Lines, CSV or TSV files, not Parquet ({args.input}); "
                         "export the text column, e.g. with pyarrow, to .jsonl first")
    if suffix == ".json":  # one JSON document (an array) is not JSON Lines: say so, with the fix
        from ..fast.embedjob import check_json_lines
        from ..fast.jobinput import resolve_inputs

        check_json_lines(resolve_inputs(args.input, args.text_field)[0], who="predict")
    if args.text_field is not None and file_format(args.input, lines_ok=True) == "lines":
        raise InputError(f"--text-field needs JSON Lines (.jsonl) or CSV/TSV input; {args.input} is read as one "
                         "text per line (name it .jsonl if its lines are JSON objects)")
    args.text_field = args.text_field or "text"
    if args.label_field is not None and file_format(args.input, lines_ok=True) == "lines":
        raise InputError(f"--label-field needs JSON Lines (.jsonl) or CSV/TSV input with the label in a field; "
                         f"{args.input} is read as one text per line")
    if args.metrics is not None and args.label_field is None:
        raise InputError("--metrics needs --label-field: the field or column that holds each record's gold label")
    metrics_out = check_output_file(args.metrics, "--metrics") if args.metrics is not None else None
    if metrics_out is not None:
        if Path(metrics_out).exists() and os.path.samefile(metrics_out, args.input):
            raise InputError(f"--metrics {args.metrics} is INPUT itself: writing there would replace the texts; "
                             "choose another file")
        if out is not None and Path(metrics_out).resolve() in (Path(out).resolve(), Path(f"{out}.partial").resolve()):
            what = "--out" if Path(metrics_out).resolve() == Path(out).resolve() else "--out's progress file"
            raise InputError(f"--metrics {args.metrics} is {what} too: give the scores a file of their own")
    if args.label_field is not None and args.label_field in (args.text_field, args.text_pair_field):
        raise InputError(f"--label-field {args.label_field!r} is the field the texts are read from: name the "
                         "field or column that holds the gold labels")
    if args.text_pair_field is not None and file_format(args.input, lines_ok=True) == "lines":
        raise InputError(f"--text-pair-field needs JSON Lines (.jsonl) or CSV/TSV input with the pair in a "
                         f"field; {args.input} is read as one text per line")
    if args.out is not None:  # what a resumed run must find again: the bytes the records are read from
        from ..files import sha256_file

        before_read = (os.stat(args.input).st_mtime_ns, sha256_file(args.input).hexdigest())
    records = read_records(args.input, text_field=args.text_field, pair_field=args.text_pair_field,
                           label_field=args.label_field, lines_ok=True, keep_blank=True)
    if args.out is not None and os.stat(args.input).st_mtime_ns != before_read[0]:
        raise InputError(f"{args.input} changed while it was read; run again once nothing writes to it")
    # as `embed` judges: refused when records fail and none holds a text; a blank line fails
    # nothing, and an empty text field ("") counts as a text
    failed = [r for r in records if not r.blank]
    if failed and not any(r.status in ("ok", "empty") for r in failed):
        first = failed[0]
        keys = ""
        if first.status == "no_field" and file_format(args.input, lines_ok=True) == "jsonl":
            from ..files import fields_note, read_input_bytes, split_lines

            lines = split_lines(read_input_bytes(args.input))
            keys = fields_note(lines[first.line - 1] if first.line <= len(lines) else None, first.line)
        raise InputError(f"no record of {args.input} holds a text (first: line {first.line} is "
                         f"{first.status}{keys}); check --text-field and the file's format")
    if records and file_format(args.input, lines_ok=True) == "lines" and records[0].status == "ok":
        cells = [c.strip().strip('"').lower() for c in re.split(r"[,\t]", records[0].text)]
        if len(cells) > 1 and args.text_field.lower() in cells:  # "text,label": a CSV named .txt
            print(f"bertscope: warning: line 1 of {args.input} looks like a CSV/TSV header ({records[0].text.strip()!r}); "
                  "a file not named .csv or .tsv is read as one text per line, header and all: rename it to read "
                  "its columns", file=sys.stderr)
    bert = load(args.model_dir)
    if not bert.is_classifier:
        raise InputError(f"{args.model_dir} is not a classifier (its config.json does not name "
                         "BertForSequenceClassification); fine-tune one with: bertscope finetune")
    pairs = args.text_pair_field is not None
    low = least_read_length(pairs)  # one token of each text besides [CLS] A [SEP] (B [SEP])
    if args.max_length is not None and not low <= args.max_length <= bert.config.max_position_embeddings:
        raise InputError(f"--max-length must be {low}..{bert.config.max_position_embeddings}"
                         f"{' for text pairs' if pairs else ''} (room for one token of each text), "
                         f"got {args.max_length}")
    gold = None
    if args.label_field is not None:
        gold, renamed = gold_labels(records, bert.labels)
        read = [g for r, g in zip(records, gold) if g is not None and r.status == "ok"]
        if not read:
            first = next((r for r in records if r.status == "ok" and r.label_problem), None)
            why = "no record holds a text" if first is None else \
                f"line {first.line}: the field {args.label_field!r} {first.label_problem}"
            if first is not None and first.label_missing and first.label_problem == "is missing" \
                    and file_format(args.input, lines_ok=True) == "jsonl":
                from ..files import fields_note, read_input_bytes, split_lines

                lines = split_lines(read_input_bytes(args.input))
                why += fields_note(lines[first.line - 1] if first.line <= len(lines) else None, first.line)
            raise InputError(f"no record of {args.input} has a gold label to score against (first: {why}); "
                             "check --label-field")
        if not set(read) & set(bert.labels):
            seen = sorted(set(read))
            shown = ", ".join(_short(g) for g in seen[:6]) + (", ..." if len(seen) > 6 else "")
            twins = [_twin(g, bert.labels) for g in seen]
            case = "" if not all(twins) else " (they differ from the model's only in case: write them as the model " \
                "does)" if all(g.casefold() == t.casefold() for g, t in zip(seen, twins)) else \
                f" (they look like the model's written another way: {_short(seen[0])} for {twins[0]!r})"
            raise InputError(f"none of the labels in {args.label_field!r} ({shown}) is a label of {args.model_dir} "
                             f"({', '.join(bert.labels)}){case}: check --label-field, or that the model is the one "
                             "fine-tuned on these labels")
        if renamed:
            print(f"bertscope: note: the integer labels of {args.label_field!r} are scored as the model's "
                  f"{', '.join(bert.labels[:3])}{', ...' if len(bert.labels) > 3 else ''} (3 as LABEL_3)",
                  file=sys.stderr)
    trained_pair = _fine_tuned_pair_field(Path(args.model_dir))
    if trained_pair is False and args.text_pair_field is not None:
        print(f"bertscope: warning: {args.model_dir} was fine-tuned on single texts (its metrics.json has no "
              f"--text-pair-field); this run gives it pairs ([CLS] A [SEP] B [SEP]), which it never saw in "
              "training", file=sys.stderr)
    if isinstance(trained_pair, str) and args.text_pair_field is None:
        print(f"bertscope: warning: {args.model_dir} was fine-tuned on text pairs (its metrics.json: "
              f"--text-pair-field {trained_pair}); this run reads single texts: give it pairs with "
              "--text-pair-field and a .jsonl, .csv or .tsv input that has the pair in a field", file=sys.stderr)
    from tqdm import tqdm

    kept = None  # the rows on disk as they are done (--out): what --resume goes on from
    from ..files import open_stream_fd

    ordinary = out is not None and open_stream_fd(out) is None and (not Path(out).exists() or Path(out).is_file())
    if args.resume and not ordinary:
        raise InputError(f"--resume needs --out to name a file (not {args.out}): a stream or a device keeps no rows "
                         "to resume from")
    if ordinary:
        from ..train.progressfile import RunProgress, describe_run

        settings = {"max_length": args.max_length if args.max_length is not None else bert.max_seq_length,
                    "text_field": args.text_field if file_format(args.input, lines_ok=True) != "lines" else None,
                    "text_pair_field": args.text_pair_field,
                    "batch_tokens": args.batch_tokens}  # the batches change the last digits of a probability
        header = describe_run(args.input, len(records), bert.path, settings, sha256=before_read[1])
        with writing(f"{out}.partial"):  # the kernel choice: no setting to match, a resumed run takes it on
            kept = RunProgress(out, header, resume=args.resume, more=lambda: {"kernel": bert.kernel_record()})
        if kept.rows:
            bert.use_kernel_record(kept.began.get("kernel"), str(kept.path))
        _remove_stale_temporaries(Path(out))  # a kill while FILE was written left one (the lock is ours now)
    try:
        if kept is not None:
            kept.check_rows([r.line for r in records])
            if kept.rows and len(kept.rows) >= len(records):
                print(f"bertscope: all {len(records):,} records were done in {kept.path}: writing {out}",
                      file=sys.stderr)
            elif kept.rows:
                print(f"bertscope: resuming at record {len(kept.rows) + 1:,} of {len(records):,} "
                      f"({len(kept.rows):,} done in {kept.path})", file=sys.stderr)
            elif args.resume:
                print(f"bertscope: no rows to resume from beside {out}: starting", file=sys.stderr)
        done = kept.rows if kept is not None else []
        with tqdm(total=len(records), initial=len(done), unit="text", file=sys.stderr,
                  disable=not progress_enabled(args), dynamic_ncols=True, desc="predict") as bar:
            with writing(f"{out}.partial"):
                rows = list(done) + predictions(bert, records[len(done):], max_length=args.max_length,
                                                batch_tokens=args.batch_tokens, progress=bar.update,
                                                on_chunk=kept.add if kept is not None else None)
        text = render(rows, bert.labels, args.json, gold)
        if out is None:
            sys.stdout.write(text)
        else:
            with writing(out):
                write_text_atomic(out, text)
            if kept is not None:
                kept.finish()
    finally:
        if kept is not None:
            kept.close()
    bad: dict[str, list[int]] = {}
    for r in rows:
        if r["status"] != "ok":
            bad.setdefault(r["status"], []).append(r["line"])
    if out is not None:
        print(f"wrote {summary(rows)} to {out}", file=sys.stderr)
    for status, nums in bad.items():
        lead = "  " if out is not None else "bertscope: note: "  # under "wrote ...", or a line of its own
        print(f"{lead}{len(nums)} {status} record(s): {_lines(nums)}", file=sys.stderr)
    if gold is not None:
        _report_scores(score(rows, gold, bert.labels, args.label_field,
                             [None if r.label_missing else r.label_problem for r in records]),
                       metrics_out, args.label_field)
    return 0


def _report_scores(report: dict, metrics_out: str | None, label_field: str) -> None:
    """The scores on stderr (and, with --metrics, as JSON in that file, written atomically)."""
    import sys

    from ..files import write_text_atomic
    from .guard import dumps_strict, writing

    n = report["scored"]
    if n:
        print(f"bertscope: accuracy {report['accuracy']:.4f}, macro-F1 {report['macro_f1']:.4f} over {n:,} "
              f"labelled prediction{'' if n == 1 else 's'} (the commonest gold label for all: "
              f"{report['majority_accuracy']:.4f})", file=sys.stderr)
    else:
        print("bertscope: no record has both a prediction and a gold label: nothing scored", file=sys.stderr)
    if report["unknown_labels"]:
        def named(k: str, v: int) -> str:
            twin = _twin(k, report["labels"])
            return f"{_short(k)} ({v}{f'; the model has {twin!r}' if twin else ''})"

        shown = ", ".join(named(k, v) for k, v in sorted(report["unknown_labels"].items())[:6])
        print(f"bertscope: warning: gold labels the model does not have, each scored as wrong: {shown}"
              f"{', ...' if len(report['unknown_labels']) > 6 else ''}", file=sys.stderr)
    if report["unreadable_labels"]:
        bad = report["unreadable_labels"]
        print(f"bertscope: warning: {len(bad)} gold label(s) could not be read, not scored (first: line "
              f"{bad[0]['line']}: the field {label_field!r} {bad[0]['problem']}): "
              f"{_lines([b['line'] for b in bad])}", file=sys.stderr)
    if report["unlabelled_lines"]:
        nums = report["unlabelled_lines"]
        print(f"bertscope: note: {len(nums)} predicted record(s) without a gold label, not scored: {_lines(nums)}",
              file=sys.stderr)
    if metrics_out is not None:
        with writing(metrics_out):
            write_text_atomic(metrics_out, dumps_strict(report, indent=2) + "\n")
        where = "standard output" if str(metrics_out) == "/dev/stdout" else metrics_out  # --metrics -
        print(f"wrote the scores to {where}", file=sys.stderr)
