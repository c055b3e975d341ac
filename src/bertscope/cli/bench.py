"""bertscope bench: bertscope against sentence-transformers, HF transformers and ONNX Runtime."""

from __future__ import annotations

import argparse
import sys

from .progress import add_progress_args, progress_enabled

HELP = """\
Measure, in one run with the same texts and the same thread count, the real tokens per second
of bertscope (packed path), sentence-transformers' encode, HF transformers used naively (sdpa,
batches of 32 in input order, padded) and ONNX Runtime (the HF model exported and optimised
with onnxruntime's transformer optimizer), on (a) equal-length texts of T = 128 tokens and
(b) a mixed-length corpus of 5 to 256 tokens. Every system's output is compared with
bertscope's (max abs diff of the normalised mean-pooled embeddings) before any time is shown.
Also: useful GFLOP/s against the machine's measured fp32 matmul peak, and the cost against length
("S13" in the output: the explainer's O(L^2) claim): time and peak memory of attention alone and
of the whole model for T = 64 ... 512, with the 512-vs-192 ratio set against the explainer's 7x
claim. A competitor that is not installed is reported and skipped.

bertscope itself runs in fp32, and on CPU also in int8 (eager, and with its steps compiled by
torch.compile: about 30 s to compile on a cold cache, left out of --quick) and in bf16 where
the CPU runs it natively; every bertscope int8 row is held to the int8 quality contract
(cosine to fp32, top-10 neighbour overlap, speed against sentence-transformers and ONNX Runtime
int8), and the verdict is printed.

By default (a) runs on a BERT-base-size model with random weights and (b) on the bundled
all-MiniLM-L6-v2; --model or --preset runs both on that model.

--quick uses T = 32 for (a) (its JSON key stays "equal_T128"; "label" says "equal_T32") and
a tiny model whose times and peak-memory values are too small for an exponent (shown as n/a:
a time exponent is fitted only when the longest input takes at least 1.5x the shortest's time).
--corpus lines that are not UTF-8 are skipped with a warning naming them. --plot (.png, .svg or
.pdf) is checked before the run and written, atomically, after the results are printed.
A full run takes minutes: each step is named on stderr as it begins (on a terminal, or with
--progress; --quiet says nothing).

examples:
  bertscope bench
  bertscope bench --json > bench.json
  bertscope bench --preset minilm-l6 --corpus my_texts.txt --plot s13.png
  bertscope bench --quick --json          # a smoke run (about a minute on 2 cores), tiny sizes
"""


MAX_ROUNDS = 1000  # a benchmark of days is a typo, not a measurement


def register(sub) -> None:
    p = sub.add_parser("bench", help="throughput against sentence-transformers, transformers, onnxruntime; cost against length",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", metavar="NAME", default=None, help="bert-base, bert-large or minilm-l6 (random weights)")
    g.add_argument("--model", metavar="PATH", default=None, help="a local checkpoint folder")
    p.add_argument("--corpus", metavar="FILE", default=None, help="texts for the mixed workload, one per line")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch/ORT threads, at most the CPUs this process can use (default: torch's)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help=f"timed rounds per system (default 3, at most {MAX_ROUNDS}; --quick runs one)")
    p.add_argument("--plot", metavar="FILE", default=None, help="write the S13 plot here (.png, .svg or .pdf)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, not a measurement")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    add_progress_args(p)  # the run takes minutes: each step is said on stderr as it begins
    p.set_defaults(func=run)


def check_settings(preset: str | None, rounds: int, threads: int | None) -> None:
    """--preset, --rounds and --threads, as bench (and benchmarks/run_bench.py) takes them: an
    InputError (one line) before any work."""
    from ..errors import InputError
    from .common import check_preset

    check_preset(preset)
    if not 1 <= rounds <= MAX_ROUNDS:
        raise InputError(f"--rounds must be 1 to {MAX_ROUNDS:,}, not {rounds:,}")
    from ..fast.tuning import usable_cpus

    cpus = usable_cpus()
    if threads is not None and not 1 <= threads <= cpus:
        raise InputError(f"--threads must be 1 to {cpus} (the CPUs this process can use), not {threads:,}")


def run(args: argparse.Namespace) -> int:
    from .. import bench
    from ..bench.corpus import read_corpus
    from ..bench.report import PLOT_SUFFIXES, render_scaling_plot, write_markdown
    from ..errors import InputError, os_reason
    from ..files import write_bytes_atomic
    from .common import check_output_file
    from .guard import dumps_strict, null_non_finite

    if args.quick and args.rounds is not None:
        raise InputError("--quick runs one round of each system (a smoke run); leave out --rounds, or --quick")
    rounds = 3 if args.rounds is None else args.rounds
    check_settings(args.preset, rounds, args.threads)
    plot = None
    if args.plot:  # checked now: a bad path must not cost a finished run
        plot = check_output_file(args.plot, flag="--plot", suffixes=PLOT_SUFFIXES)
        import tempfile

        try:  # a real write, for what permission bits do not tell (root, /proc, a full disk)
            with tempfile.TemporaryFile(dir=plot.parent if str(plot.parent) else "."):
                pass
        except OSError as e:
            raise InputError(f"--plot: cannot write in {str(plot.parent)!r} ({os_reason(e)})") from None
        from ..see.figures import require_matplotlib

        require_matplotlib("--plot")
    corpus = None
    if args.corpus:
        corpus, warns = read_corpus(args.corpus)
        for w in warns:
            print(f"bertscope: warning: {w}", file=sys.stderr)
    step = None
    if progress_enabled(args):
        def step(what: str) -> None:
            print(f"bench: {what}", file=sys.stderr, flush=True)
    res = bench.run_bench(model=args.model, preset=args.preset, corpus=corpus, quick=args.quick,
                          threads=args.threads, rounds=rounds, plot=None, progress=step)
    if args.corpus:
        res["corpus"] = args.corpus
    figure, failed = None, None
    if plot is not None:
        try:
            figure = render_scaling_plot(res["scaling"], plot.suffix.lower()[1:])
            res["scaling"]["plot"] = str(plot)
        except Exception as e:  # reported after the results, which come first
            failed = f"could not draw --plot {plot} ({type(e).__name__}: {e})"
    for note in res.get("warnings", []):
        if note.startswith("other processes took"):
            print(f"bertscope: warning: {note}", file=sys.stderr)
    skipped = {(name, why): None for w in res["workloads"].values() for name, why in w["skipped"].items()}
    for name, why in skipped:  # once, though every workload skips it
        print(f"bertscope: note: skipped {name}: {why}", file=sys.stderr)
    if args.json:  # the results first: a failure to write the plot must not lose them
        res, non_finite = null_non_finite(res)  # strict JSON: a NaN measurement becomes null
        if non_finite:
            res["non_finite"] = non_finite
            print(f"bertscope: warning: {len(non_finite)} measurement(s) were NaN or infinite and are "
                  f"null in the JSON (first: {non_finite[0]})", file=sys.stderr)
        sys.stdout.write(dumps_strict(res, indent=1) + "\n")
    else:
        sys.stdout.write(write_markdown(res))
    sys.stdout.flush()
    if failed:
        raise InputError(f"{failed}; the results above are complete")
    if figure is not None:
        try:
            write_bytes_atomic(plot, figure, make_parents=False)
        except OSError as e:
            raise InputError(f"could not write --plot {plot} ({os_reason(e)}); "
                             "the results above are complete") from None
    return 0
