"""Side-by-side throughput benchmark and the S13 cost-against-length measurement.

Shape legend: B batch, T tokens, H heads, D head size, C = H·D hidden, I feed-forward width,
N layers, L one sequence's length.

Everything runs in ONE process, on the same texts, with the same thread count. The competitors
(sentence-transformers, HF transformers, ONNX Runtime) are imported only inside the functions
that build them; a missing one is reported and skipped. Outputs are compared (max abs diff of
the normalised mean-pooled embeddings, against bertscope) before any time is reported.
Timings are medians over rounds that visit every system in turn (round-robin), so a burst of
load from elsewhere on the machine hits all systems alike.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from .config import BertConfig

__all__ = ["matmul_peak", "make_texts", "plot_scaling", "read_corpus", "render_scaling_plot", "run_bench",
           "useful_flops", "scaling", "write_markdown"]

log = logging.getLogger(__name__)

Embedder = Callable[[Sequence[str]], np.ndarray]


# ---------------------------------------------------------------------------------------------
# arithmetic and machine


def useful_flops(config: BertConfig, lengths: Sequence[int]) -> float:
    """FLOPs that real tokens need (2 per multiply-add; no padding, no embeddings, no softmax).

    Per layer and sequence of L tokens: projections Q, K, V, O: 2·L·4C²; feed-forward: 2·L·2CI;
    scores QKᵀ and context P·V: 2·2·L²·C.
    """
    C, I, N = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    linear = sum(lengths) * 2 * (4 * C * C + 2 * C * I)
    quadratic = sum(L * L for L in lengths) * 4 * C
    return float(N * (linear + quadratic))


PEAK_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 768, 3072))  # (M, K, N)


def _best_rate(run: Callable[[], object], flop: float, seconds: float, device: str) -> float:
    run()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - t)
    return flop / sorted(times)[len(times) // 10] / 1e9  # 10th percentile: load only slows


def matmul_peak(n: int | None = None, seconds: float = 1.0, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> float:
    """The machine's measured matmul peak in GFLOP/s through torch.mm: the best over square
    1024³ and 2048³ and BERT-base's feed-forward shape (4096, 768) x (768, 3072), each rated at
    its 10th-percentile time (load from elsewhere only ever slows a product down).
    ``n`` measures one n x n x n product instead."""
    shapes = PEAK_SHAPES if n is None else ((n, n, n),)
    best = 0.0
    for M, K, N in shapes:
        a = torch.randn(M, K, device=device, dtype=dtype)
        b = torch.randn(K, N, device=device, dtype=dtype)
        best = max(best, _best_rate(lambda: torch.mm(a, b), 2 * M * K * N, seconds / len(shapes), device))
    return best


def onednn_matmul_peak(n: int | None = None, seconds: float = 1.0) -> float | None:
    """The same products through oneDNN, as the packed path runs them on CPU (None if absent)."""
    from .packed import _onednn_pointwise_available

    if not (torch.backends.mkldnn.is_available() and _onednn_pointwise_available()):
        return None
    shapes = PEAK_SHAPES if n is None else ((n, n, n),)
    best = 0.0
    for M, K, N in shapes:
        x = torch.randn(M, K)
        w = torch.ops.mkldnn._reorder_linear_weight(torch.randn(N, K), M)
        bias = torch.zeros(N)
        run = lambda: torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")  # noqa: E731
        best = max(best, _best_rate(run, 2 * M * K * N, seconds / len(shapes), "cpu"))
    return best


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for mod in ("transformers", "sentence_transformers", "onnxruntime", "numpy"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    info = {"cpu": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "versions": versions}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


# ---------------------------------------------------------------------------------------------
# inputs


def _vocab_words(tokenizer) -> list[str]:
    """Whole, lower-case ASCII words that the vocabulary holds as one token each."""
    vocab = tokenizer._tok.get_vocab()
    return sorted(w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) > 2)


def make_texts(tokenizer, lengths: Sequence[int], seed: int = 0) -> list[str]:
    """Texts of exactly the given token counts ([CLS] and [SEP] included): L - 2 vocabulary words."""
    rng = random.Random(seed)
    words = _vocab_words(tokenizer)
    return [" ".join(rng.choice(words) for _ in range(max(L - 2, 1))) for L in lengths]


def mixed_lengths(n: int, low: int, high: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# models and systems


def save_random_checkpoint(config: BertConfig, folder: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A random-weight checkpoint of ``config`` in HF format (for the size presets)."""
    from safetensors.torch import save_file

    from .model import BertModel
    from .weights import to_checkpoint_name

    torch.manual_seed(seed)
    model = BertModel(config)
    folder.mkdir(parents=True, exist_ok=True)
    state = {to_checkpoint_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    cfg = {k: v for k, v in config.to_dict().items() if k != "do_lower_case"}
    cfg.update(model_type="bert", architectures=["BertModel"], position_embedding_type="absolute")
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, folder / name)
    return folder


def _pool_np(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)  # (B, T, 1)
    pooled = (h * m).sum(1) / np.clip(m.sum(1), 1e-9, None)  # (B, C)
    return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


def _bertscope(bert) -> Embedder:
    return lambda texts: bert.embed(texts)


def _sentence_transformers(folder: Path, max_len: int, device: str, dtype) -> Embedder:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device=device)
    st.max_seq_length = max_len
    if dtype is not None:
        st.to(dtype)
    def run(texts):
        out = st.encode(list(texts), batch_size=32, convert_to_tensor=True,
                        normalize_embeddings=True, show_progress_bar=False)
        return out.float().cpu().numpy()  # (N, C); via float so bf16 converts too

    return run


def _transformers(folder: Path, max_len: int, device: str, dtype) -> Embedder:
    """HF transformers used naively: batches of 32 in input order, padded to their longest."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="sdpa").eval().to(device)
    if dtype is not None:
        model.to(dtype)

    @torch.inference_mode()
    def run(texts):
        out = []
        for a in range(0, len(texts), 32):
            enc = tok(list(texts[a:a + 32]), padding=True, truncation=True, max_length=max_len,
                      return_tensors="pt").to(device)
            h = model(**enc).last_hidden_state  # (B, T, C)
            m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)  # (B, T, 1)
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, C)
            out.append(torch.nn.functional.normalize(pooled.float(), dim=1).cpu().numpy())
        return np.concatenate(out)

    return run


def _onnxruntime(folder: Path, max_len: int, workdir: Path, threads: int) -> Embedder:
    """HF's model exported to ONNX, optimised by onnxruntime's transformer optimizer.

    Batches of 32 texts sorted by length (the favourable batching, as sentence-transformers does).
    """
    import onnxruntime as ort
    import transformers
    from onnxruntime.transformers import optimizer

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    workdir.mkdir(parents=True, exist_ok=True)
    raw, opt = workdir / "model.onnx", workdir / "model.opt.onnx"
    enc = tok(["a sample text", "another"], padding=True, return_tensors="pt")
    dyn = {n: {0: "batch", 1: "tokens"} for n in ("input_ids", "attention_mask", "token_type_ids")}
    args = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])

    class Wrapper(torch.nn.Module):  # a plain 3-tensor signature for the exporter
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapper(model), args, str(raw), input_names=list(dyn),
                          output_names=["last_hidden_state"], dynamic_axes=dict(dyn, last_hidden_state={0: "batch", 1: "tokens"}),
                          opset_version=17, dynamo=False)
    cfg = model.config
    optimized = optimizer.optimize_model(str(raw), model_type="bert", num_heads=cfg.num_attention_heads,
                                         hidden_size=cfg.hidden_size)
    optimized.save_model_to_file(str(opt))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(opt), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}

    def run(texts):
        texts = list(texts)
        counts = [len(e) for e in tok(texts, truncation=True, max_length=max_len)["input_ids"]]
        order = sorted(range(len(texts)), key=lambda i: -counts[i])
        out = np.zeros((len(texts), cfg.hidden_size), np.float32)
        for a in range(0, len(order), 32):
            idx = order[a:a + 32]
            e = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=max_len,
                    return_tensors="np")
            feed = {k: e[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids") if k in names}
            h = sess.run(["last_hidden_state"], feed)[0]  # (B, T, C)
            out[idx] = _pool_np(h, e["attention_mask"])
        return out

    return run


@contextlib.contextmanager
def _quiet_hub_progress() -> Iterator[None]:
    """No "Loading weights" / download progress bars from transformers and huggingface_hub while
    the competitors are built; the previous settings come back afterwards."""
    key = "HF_HUB_DISABLE_PROGRESS_BARS"
    env_before = os.environ.get(key)
    os.environ[key] = "1"
    hf_logging = None
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        pass
    was_on = hf_logging.is_progress_bar_enabled() if hf_logging is not None else False
    if hf_logging is not None:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if env_before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = env_before
        if hf_logging is not None and was_on:
            hf_logging.enable_progress_bar()


def build_systems(folder: Path, bert, workdir: Path, threads: int, device: str = "cpu",
                  dtype=None, only: Sequence[str] | None = None) -> tuple[dict[str, Embedder], dict[str, str]]:
    """{name: embed function} for every system that can be built, and {name: why not} for the rest."""
    systems: dict[str, Embedder] = {"bertscope": _bertscope(bert)}
    skipped: dict[str, str] = {}
    builders = {
        "sentence-transformers": lambda: _sentence_transformers(folder, bert.max_seq_length, device, dtype),
        "transformers": lambda: _transformers(folder, bert.max_seq_length, device, dtype),
        "onnxruntime": lambda: _onnxruntime(folder, bert.max_seq_length, workdir, threads),
    }
    if device != "cpu":
        builders.pop("onnxruntime")
        skipped["onnxruntime"] = "CPU only in this benchmark"
    for name, build in builders.items():
        if only is not None and name not in only:
            continue
        try:
            with _quiet_hub_progress():
                systems[name] = build()
        except ImportError as e:
            skipped[name] = f"not installed ({e.name or e})"
            log.warning("%s is not installed; skipping it", name)
        except Exception as e:  # a competitor that fails to build is reported, not fatal
            skipped[name] = f"failed to build: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("%s failed to build: %s", name, e)
    return systems, skipped


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def compare_and_time(systems: dict[str, Embedder], texts: list[str], real_tokens: int, flops: float,
                     rounds: int, device: str = "cpu") -> dict:
    """Check every system's output against bertscope's, then time them round-robin."""
    outputs = {name: f(texts) for name, f in systems.items()}  # also the warm-up run
    ref = outputs["bertscope"]
    diffs = {name: float(np.abs(o - ref).max()) for name, o in outputs.items() if name != "bertscope"}
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, f in systems.items():
            _sync(device)
            t = time.perf_counter()
            f(texts)
            _sync(device)
            times[name].append(time.perf_counter() - t)
    result = {"texts": len(texts), "real_tokens": real_tokens, "useful_gflop": flops / 1e9,
              "max_abs_diff_vs_bertscope": diffs, "systems": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        result["systems"][name] = {"median_s": med, "tokens_per_s": real_tokens / med,
                                   "useful_gflops": flops / med / 1e9, "times_s": ts}
    base = result["systems"]["bertscope"]["tokens_per_s"]
    result["bertscope_speedup"] = {n: base / s["tokens_per_s"] for n, s in result["systems"].items()
                                   if n != "bertscope"}
    return result


# ---------------------------------------------------------------------------------------------
# S13: cost against length


def _median_time(fn: Callable[[], object], min_rounds: int = 3, min_seconds: float = 0.3,
                 device: str = "cpu") -> float:
    fn()
    times = []
    end = time.perf_counter() + min_seconds
    while len(times) < min_rounds or time.perf_counter() < end:
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _scaling_fns(config: BertConfig, kind: str, T: int, device: str = "cpu"):
    """A no-argument function running one measured unit at T tokens (batch of 1)."""
    from .attention import attention_reference
    from .model import BertModel

    torch.manual_seed(0)
    H, D = config.num_attention_heads, config.head_size
    if kind == "attention":  # the L x L part: scores, softmax, context (reference path)
        q, k, v = (torch.randn(1, H, T, D, device=device) for _ in range(3))  # (1, H, T, D)
        return lambda: attention_reference(q, k, v)
    model = _scaling_fns.models.get((config, device))
    if model is None:
        model = _scaling_fns.models[(config, device)] = BertModel(config).eval().to(device)
    ids = torch.randint(1000, 2000, (1, T), device=device)  # (1, T)
    def run():
        with torch.inference_mode():
            return model(ids).last_hidden_state
    return run


_scaling_fns.models = {}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory_worker(config: dict, kind: str, lengths: list[int]) -> list[float]:
    """Run in a fresh process: peak resident memory growth (MiB) while running each T.

    The parent starts this process with MALLOC_MMAP_THRESHOLD_ set low, so every large tensor
    is mapped on allocation and unmapped on free: resident memory then follows live tensors.
    A thread samples /proc/self/statm while the measured function runs.
    """
    import threading

    cfg = BertConfig(**config)
    out = []
    for T in lengths:
        fn = _scaling_fns(cfg, kind, T)
        with torch.inference_mode():
            fn()  # warm-up: lazily created buffers are not the peak we want
        peak = 0
        for _ in range(3):
            base = _rss_bytes()
            samples = [base]
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    samples.append(_rss_bytes())
                    time.sleep(0.0002)

            th = threading.Thread(target=sample)
            th.start()
            with torch.inference_mode():
                res = fn()
            samples.append(_rss_bytes())
            stop.set()
            th.join()
            del res
            peak = max(peak, max(samples) - base)
        out.append(peak / 2 ** 20)
    return out


def _memory_main() -> None:  # entry point of the worker process
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    print(json.dumps(_memory_worker(spec["config"], spec["kind"], spec["lengths"])))


def _peak_memory(config: BertConfig, kind: str, lengths: list[int], threads: int) -> list[float] | None:
    src = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    spec = json.dumps({"config": config.to_dict(), "kind": kind, "lengths": lengths, "threads": threads})
    try:
        r = subprocess.run([sys.executable, "-c", "from bertscope.bench import _memory_main; _memory_main()", spec],
                           capture_output=True, text=True, env=env, timeout=600)
        return json.loads(r.stdout.strip().splitlines()[-1])
    except Exception as e:  # memory is reported as missing rather than failing the benchmark
        log.warning("peak-memory worker failed: %s", e)
        return None


MIN_FIT_MIB = 0.05  # peak-memory values at or below this are noise: no exponent is fitted


def _memory_fit(entry: dict, lengths: list[int], mem: list[float] | None) -> None:
    """Add the memory exponent (and 512-vs-192 ratio) to ``entry`` when every value is large
    enough to fit; otherwise ``memory_exponent`` is None, with a note saying why."""
    if not mem:
        return
    if min(mem) <= MIN_FIT_MIB:
        entry["memory_exponent"] = None
        entry["memory_exponent_note"] = f"n/a: some peaks are at most {MIN_FIT_MIB} MiB, too small to fit"
        return
    entry["memory_exponent"] = _fit_exponent(lengths, mem)
    if "ratio_512_vs_192" in entry:
        entry["memory_ratio_512_vs_192"] = mem[lengths.index(512)] / mem[lengths.index(192)]


def _fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def scaling(config: BertConfig, lengths: Sequence[int], threads: int, device: str = "cpu",
            memory: bool = True) -> dict:
    """S13: time (and peak memory) of attention alone and of the whole model against T."""
    lengths = sorted(lengths)
    out: dict = {"lengths": list(lengths), "seed_claim_512_vs_192": (512 / 192) ** 2}
    for kind in ("attention", "model"):
        times = [_median_time(_scaling_fns(config, kind, T, device), device=device) for T in lengths]
        entry: dict = {"time_s": times, "time_exponent": _fit_exponent(lengths, times)}
        if 192 in lengths and 512 in lengths:
            entry["ratio_512_vs_192"] = times[lengths.index(512)] / times[lengths.index(192)]
        if memory and device != "cpu":  # CUDA: the allocator's own peak, per T
            mem = []
            for T in lengths:
                fn = _scaling_fns(config, kind, T, device)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                fn()
                torch.cuda.synchronize()
                mem.append((torch.cuda.max_memory_allocated() - base) / 2 ** 20)
            entry["peak_mib"] = mem
            _memory_fit(entry, lengths, mem)
        if memory and device == "cpu":
            mem = _peak_memory(config, kind, list(lengths), threads)
            entry["peak_mib"] = mem
            _memory_fit(entry, lengths, mem)
        out[kind] = entry
    _scaling_fns.models.clear()
    return out


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def render_scaling_plot(result: dict, fmt: str = "png") -> bytes:
    """The S13 plot of ``result`` (:func:`scaling`'s dict) as the bytes of a png, svg or pdf."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Ls = result["lengths"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    try:
        for kind, label in (("attention", "attention alone (QKᵀ, softmax, ·V)"), ("model", "whole model")):
            e = result[kind]
            axes[0].loglog(Ls, [t * 1e3 for t in e["time_s"]], "o-", label=f"{label}: T^{e['time_exponent']:.2f}")
            if e.get("peak_mib"):
                axes[1].plot(Ls, e["peak_mib"], "o-", label=label)
        axes[0].set(xlabel="tokens T", ylabel="ms (median)", title="time against length")
        axes[1].set(xlabel="tokens T", ylabel="peak memory growth (MiB)", title="peak memory against length")
        for ax in axes:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=110)
    finally:
        plt.close(fig)
    return buf.getvalue()


def plot_scaling(result: dict, path: Path) -> Path:
    """Write the S13 plot to ``path`` (.png, .svg or .pdf) atomically: rendered in memory, then
    a temporary file renamed into place."""
    from .errors import InputError
    from .files import write_bytes_atomic

    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"the plot must end in {' or '.join(PLOT_SUFFIXES)}, got {str(path)!r}")
    return write_bytes_atomic(path, render_scaling_plot(result, path.suffix.lower()[1:]))


def read_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """The non-blank lines of a --corpus file, and warnings for lines skipped (not UTF-8)."""
    from .errors import InputError
    from .files import read_lines

    if not Path(path).is_file():
        raise InputError(f"--corpus {path} does not exist or is not a file")
    lines, warns = read_lines(path)
    if not lines:
        raise InputError(f"--corpus {path} has no non-empty UTF-8 lines")
    return [text for _, text in lines], warns


# ---------------------------------------------------------------------------------------------
# the whole run


def run_bench(*, model: str | None = None, preset: str | None = None,
              corpus: str | Path | Sequence[str] | None = None,
              quick: bool = False, threads: int | None = None, rounds: int = 3,
              device: str = "cpu", dtype: torch.dtype | None = None,
              systems: Sequence[str] | None = None, scaling_lengths: Sequence[int] | None = None,
              memory: bool = True, plot: str | Path | None = None) -> dict:
    """Run every part of the benchmark and return one JSON-able dict.

    Workloads: (a) equal-length texts of T = 128 tokens on a BERT-base-size model (random
    weights) unless ``model``/``preset`` says otherwise; (b) a mixed-length corpus (5 to 256
    tokens, or ``corpus``: a file's non-blank lines, or a list of texts) on the bundled model
    unless ``model``/``preset`` says otherwise. ``quick`` shrinks everything (for tests and
    smoke runs): then the equal-length texts have T = 32 (the workload keeps its key
    ``equal_T128``; its ``label`` gives the true T). ``plot`` (.png, .svg or .pdf) is written at
    the end; if that fails, the results still come back, with ``scaling.plot_error``.
    Arguments and the corpus are checked before any measurement.
    """
    from .errors import InputError
    from .loading import bundled_model_path, load

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
    result: dict = {"machine": machine(), "quick": quick, "device": device,
                    "dtype": str(dtype or torch.float32).replace("torch.", "")}
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

        result["matmul_peak_gflops"] = matmul_peak(256 if quick else None, 0.3 if quick else 3.0,
                                                   device=device if device == "cpu" else "cuda")
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
            built, skipped = build_systems(folder, bert, work / wname, threads, device, dtype, systems)
            log.info("workload %s: %d texts, %d real tokens; systems %s", wname, len(texts), sum(lengths), list(built))
            entry = compare_and_time(built, texts, sum(lengths), useful_flops(bert.config, lengths),
                                     1 if quick else rounds, device)
            entry["label"] = label
            entry["model"] = str(folder if folder == bundled else f"random weights, {bert.config.hidden_size}"
                                 f"/{bert.config.num_hidden_layers} layers/{bert.config.num_attention_heads} heads")
            entry["config"] = bert.config.to_dict()
            entry["length_range"] = [min(lengths), max(lengths)]
            entry["skipped"] = skipped
            entry["bertscope_fraction_of_matmul_peak"] = entry["systems"]["bertscope"]["useful_gflops"] / bar
            workloads[wname] = entry
            del built
        result["workloads"] = workloads

        s_cfg = cfg_eq or load(bundled).config
        Ls = list(scaling_lengths or ([16, 32, 64] if quick else [64, 128, 192, 256, 384, 512]))
        result["scaling"] = scaling(s_cfg, Ls, threads, device, memory=memory)
        result["scaling"]["config"] = s_cfg.to_dict()
        if plot:
            try:
                result["scaling"]["plot"] = str(plot_scaling(result["scaling"], Path(plot)))
            except Exception as e:  # the measurements are worth more than the figure
                result["scaling"]["plot_error"] = f"{type(e).__name__}: {e}"
                log.warning("could not write the plot %s: %s", plot, e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["wall_s"] = time.perf_counter() - started
    return result


def systems_table(w: dict, seconds: str = ".3f", gflops: str = ".1f") -> list[str]:
    """Markdown rows comparing the systems of one timed workload (as compare_and_time returns it)."""
    lines = ["| system | median s | real tokens/s | useful GFLOP/s | bertscope speed-up | max abs diff vs bertscope |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, s in w["systems"].items():
        sp = w["bertscope_speedup"].get(name)
        diff = w["max_abs_diff_vs_bertscope"].get(name)
        lines.append(f"| {name} | {s['median_s']:{seconds}} | {s['tokens_per_s']:,.0f} | {s['useful_gflops']:{gflops}} | "
                     f"{'—' if sp is None else f'{sp:.2f}×'} | {'—' if diff is None else f'{diff:.1e}'} |")
    return lines


def write_markdown(r: dict) -> str:
    """The results as markdown tables (for docs/BENCHMARKS.md)."""
    m = r["machine"]
    lines = [f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, {m['torch_threads']} torch threads; "
             f"{m.get('gpu', 'no GPU used') if r['device'] != 'cpu' else 'CPU'}; dtype {r['dtype']}; "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
             "", f"Measured fp32 matmul peak (best of 1024³, 2048³, 4096×768×3072; torch.mm): **{r['matmul_peak_gflops']:.1f} GFLOP/s**"
             + (f"; through oneDNN: **{r['matmul_peak_onednn_gflops']:.1f} GFLOP/s**"
                if r.get("matmul_peak_onednn_gflops") else "") + ".", ""]
    for wname, w in r["workloads"].items():
        lines += [f"### {w.get('label', wname)}: {w['texts']} texts, {w['real_tokens']} real tokens "
                  f"(lengths {w['length_range'][0]}–{w['length_range'][1]}), {w['model']}", "",
                  ] + systems_table(w)
        lines.append(f"\nbertscope's useful GFLOP/s are {100 * w['bertscope_fraction_of_matmul_peak']:.0f}% of the "
                     "higher measured matmul peak.")
        for name, why in w["skipped"].items():
            lines.append(f"Skipped {name}: {why}.")
        lines.append("")
    s = r["scaling"]
    lines += [f"### S13: cost against length (batch of 1, {s['config']['hidden_size']} hidden, "
              f"{s['config']['num_hidden_layers']} layers)", "",
              "| T | attention alone ms | whole model ms | attention peak MiB | model peak MiB |", "|---:|---:|---:|---:|---:|"]
    am, mm = s["attention"].get("peak_mib") or [], s["model"].get("peak_mib") or []
    for i, T in enumerate(s["lengths"]):
        lines.append(f"| {T} | {1e3 * s['attention']['time_s'][i]:.2f} | {1e3 * s['model']['time_s'][i]:.1f} | "
                     f"{am[i] if i < len(am) else float('nan'):.1f} | {mm[i] if i < len(mm) else float('nan'):.1f} |")
    lines.append("")
    for kind in ("attention", "model"):
        e = s[kind]
        txt = f"- {kind}: time grows as T^{e['time_exponent']:.2f}"
        if e.get("memory_exponent") is not None:
            txt += f", peak memory as T^{e['memory_exponent']:.2f}"
        elif "memory_exponent" in e:
            txt += f", peak memory exponent n/a (some peaks ≤ {MIN_FIT_MIB} MiB, too small to fit)"
        if "ratio_512_vs_192" in e:
            txt += f"; 512 vs 192 tokens: **{e['ratio_512_vs_192']:.1f}×** the time (seed claims {s['seed_claim_512_vs_192']:.1f}×)"
        if "memory_ratio_512_vs_192" in e:
            txt += f", {e['memory_ratio_512_vs_192']:.1f}× the memory"
        lines.append(txt)
    return "\n".join(lines) + "\n"
