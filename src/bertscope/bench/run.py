"""The whole benchmark run: machine, matmul peak, the two workloads side by side, and S13.

Shape legend: T tokens, C hidden size, N layers.

Workloads: (a) equal-length texts of T = 128 tokens on a BERT-base-size model (random weights)
unless a model or preset says otherwise; (b) a mixed-length corpus (5 to 256 tokens, or a
user's file) on the bundled model. Each system's outputs are compared with bertscope's before
any time is reported (:mod:`bertscope.bench.timing`); competitors are adapters in
:mod:`bertscope.bench.systems`; S13 is :mod:`bertscope.bench.scaling`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..bert import bundled_model_path, load
from ..core.config import BertConfig
from ..errors import InputError
from ..fast.heap import keep_heap
from ..fast.tuning import BUSY_SHARE, cpu_ticks, others_share
from .corpus import make_texts, mixed_lengths, read_corpus, save_random_checkpoint
from .machine import cpu_label, machine, matmul_peak, onednn_matmul_peak
from .report import PLOT_SUFFIXES, plot_scaling
from .scaling import scaling
from .quality import contract_verdict
from .systems import build_systems, reduced_systems
from .timing import compare_and_time, paired_speedups

__all__ = ["run_bench"]

log = logging.getLogger(__name__)


def run_bench(*, model: str | None = None, preset: str | None = None,
              corpus: str | Path | Sequence[str] | None = None,
              quick: bool = False, threads: int | None = None, rounds: int = 3,
              device: str = "cpu", dtype: torch.dtype | None = None,
              systems: Sequence[str] | None = None, scaling_lengths: Sequence[int] | None = None,
              memory: bool = True, plot: str | Path | None = None,
              progress: Callable[[str], None] | None = None) -> dict:
    """Run every part of the benchmark and return one JSON-able dict.

    Workloads: (a) equal-length texts of T = 128 tokens on a BERT-base-size model (random
    weights) unless ``model``/``preset`` says otherwise; (b) a mixed-length corpus (5 to 256
    tokens, or ``corpus``: a file's non-blank lines, or a list of texts) on the bundled model
    unless ``model``/``preset`` says otherwise. ``quick`` shrinks everything (for tests and
    smoke runs): then the equal-length texts have T = 32 (the workload keeps its key
    ``equal_T128``; its ``label`` gives the true T). ``plot`` (.png, .svg or .pdf) is written at
    the end; if that fails, the results still come back, with ``scaling.plot_error``.
    Arguments and the corpus are checked before any measurement. ``progress(step)`` is called
    as each step of the run begins, with a line saying what it measures.
    """
    say = progress or (lambda step: None)

    if model and preset:
        raise InputError("give --model or --preset, not both")
    if plot and Path(plot).suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot must end in {' or '.join(PLOT_SUFFIXES)}, got {str(plot)!r}")
    corpus_texts: list[str] | None = None
    corpus_warnings: list[str] = []
    if corpus is not None and isinstance(corpus, (str, Path)):
        corpus_texts, corpus_warnings = read_corpus(corpus)
        for w in corpus_warnings:
            log.warning("%s", w)
    elif corpus is not None:
        corpus_texts = [t for t in corpus if t.strip()]
        if not corpus_texts:
            raise InputError("the corpus has no non-empty texts")
    if threads is not None:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    started = time.perf_counter()
    ticks = cpu_ticks()  # how much of the CPUs others take during the run: it is in every time below
    result: dict = {"machine": machine(), "quick": quick, "device": device,
                    "dtype": str(dtype or torch.float32).replace("torch.", "")}
    # bertscope's first CPU run fixes glibc's thresholds for the whole process (bertscope.fast.heap);
    # fixing them before any system loads puts every system under the same ones from the start
    if device == "cpu":
        result["machine"]["heap"] = keep_heap().to_json()
    if corpus_warnings:
        result["warnings"] = corpus_warnings
    work = Path(tempfile.mkdtemp(prefix="bertscope-bench-"))
    try:
        bundled = bundled_model_path() if model is None else Path(model)
        cfg_eq = BertConfig.preset(preset or "bert-base") if model is None else None
        cfg_mix = BertConfig.preset(preset) if preset else None
        if quick and model is None:
            tiny = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
            cfg_eq = cfg_mix = tiny if preset is None else BertConfig.preset(preset)

        def folder_for(cfg: BertConfig | None, name: str) -> Path:
            if cfg is None:
                return bundled
            return save_random_checkpoint(cfg, work / name, bundled_model_path() if model is None else bundled)

        say("the fp32 matmul peak (torch.mm" + (" and oneDNN)" if device == "cpu" else ")"))
        result["matmul_peak_gflops"] = matmul_peak(256 if quick else None, 0.3 if quick else 3.0,
                                                   device=device if device == "cpu" else "cuda")
        result["matmul_peak_shapes"] = "256³" if quick else "1024³, 2048³, 4096×768×3072"
        if device == "cpu":  # the GEMM library the packed path uses on CPU; the higher one is the bar
            result["matmul_peak_onednn_gflops"] = onednn_matmul_peak(256 if quick else None, 0.3 if quick else 3.0)
        bar = max(result["matmul_peak_gflops"], result.get("matmul_peak_onednn_gflops") or 0.0)
        workloads = {}
        eq_folder = folder_for(cfg_eq, "equal")
        mix_folder = eq_folder if cfg_mix is not None and cfg_mix == cfg_eq else folder_for(cfg_mix, "mixed")
        for wname, folder in (("equal_T128", eq_folder), ("mixed", mix_folder)):
            bert = load(folder, device=device, dtype=dtype)
            tok = bert.tokenizer
            label = wname
            if wname == "equal_T128":
                T = 32 if quick else 128
                n = 8 if quick else 32
                texts = make_texts(tok, [T] * n, seed=2)
                label = f"equal_T{T}"  # the key stays equal_T128 for JSON consumers
            elif corpus_texts is not None:
                texts = corpus_texts
            else:
                hi = min(64 if quick else 256, bert.max_seq_length)
                texts = make_texts(tok, mixed_lengths(24 if quick else 256, 5, hi), seed=3)
            ids, _ = tok.encode_ids(texts, max_length=bert.max_seq_length)
            lengths = [len(t) for t in ids]
            say(f"{label}: {len(texts)} texts, {sum(lengths):,} real tokens: building the systems (bertscope's "
                "kernel choice and int8 calibration, ONNX Runtime's export and quantization)")
            built, skipped = build_systems(folder, bert, work / wname, threads, device, dtype, systems, quick=quick)
            say(f"{label}: comparing {len(built)} systems' outputs, then timing {1 if quick else rounds} round(s)")
            log.info("workload %s: %d texts, %d real tokens; systems %s", wname, len(texts), sum(lengths), list(built))
            entry = compare_and_time(built, texts, sum(lengths), bert.config.flops(lengths),
                                     1 if quick else rounds, device, reduced=reduced_systems())
            for name, f in built.items():  # what each bertscope system measured and decided
                b = getattr(f, "bert", None)
                if b is None:
                    continue
                info = {"precision": b.precision, "note": b.precision_note,
                        "kernel_choice": b.fast.choice.to_json() if b.fast.choice is not None else None}
                if b.int8_plan is not None:
                    info["int8_calibration"] = b.int8_plan.to_json()
                entry.setdefault("bertscope_setup", {})[name] = info
            verdicts = {name: contract_verdict(entry["quality_vs_fp32"][name], paired_speedups(entry, name))
                        for name in entry["quality_vs_fp32"] if name.startswith("bertscope int8")}
            if verdicts:  # every bertscope int8 system is held to the contract
                entry["int8_contracts"] = verdicts
            if "bertscope int8" in verdicts:
                entry["int8_contract"] = verdicts["bertscope int8"]
            entry["label"] = label
            entry["model"] = (("bundled all-MiniLM-L6-v2" if model is None else str(folder)) if folder == bundled else
                              f"random weights, {bert.config.hidden_size}/{bert.config.num_hidden_layers} layers/"
                              f"{bert.config.num_attention_heads} heads")
            entry["config"] = bert.config.to_dict()
            entry["length_range"] = [min(lengths), max(lengths)]
            entry["skipped"] = skipped
            entry["bertscope_fraction_of_matmul_peak"] = entry["systems"]["bertscope"]["useful_gflops"] / bar
            workloads[wname] = entry
            del built
        result["workloads"] = workloads

        s_cfg = cfg_eq or load(bundled).config
        Ls = list(scaling_lengths or ([16, 32, 64] if quick else [64, 128, 192, 256, 384, 512]))
        say(f"S13: attention alone and the whole model against T = {', '.join(map(str, Ls))}")
        result["scaling"] = scaling(s_cfg, Ls, threads, device, memory=memory)
        result["scaling"]["config"] = s_cfg.to_dict()
        where = cpu_label(result["machine"]) if device == "cpu" else device
        result["scaling"]["machine"] = f"{where}, {threads} thread(s)"  # the plot names it
        if plot:
            try:
                result["scaling"]["plot"] = str(plot_scaling(result["scaling"], Path(plot)))
            except Exception as e:  # the measurements are worth more than the figure
                result["scaling"]["plot_error"] = f"{type(e).__name__}: {e}"
                log.warning("could not write the plot %s: %s", plot, e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["wall_s"] = time.perf_counter() - started
    share = others_share(ticks, cpu_ticks(), threads) if device == "cpu" else None
    result["others_share"] = share
    if share is not None and share > BUSY_SHARE:  # not BERTSCOPE_BUSY_SHARE: that says what may be cached
        note = (f"other processes took {share:.0%} of the CPUs this run's {threads} thread(s) need: every "
                "time here measures them too, so the figures are not this machine's; rerun on a quiet "
                "machine (or with --threads 1 beside one other job)")
        result.setdefault("warnings", []).insert(0, note)  # the CLI prints it; the tables carry it
        log.info("%s", note)
    return result
