"""int8 mode: the quality contract on a fixed mixed-length corpus, the int8 GEMM against a
brute-force float64 evaluation of the same quantization, the calibration rule on a model with a
planted activation outlier, attentions computed exactly on the fp32 path, and determinism."""

from __future__ import annotations

import copy
import json
import pickle
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import bertscope
from bertscope.bench.corpus import review_corpus
from bertscope.bert import Bert
from bertscope.cli.app import main
from bertscope.fast.encoder import PackedEncoder
from bertscope.fast.gemm import GemmBackend
from bertscope.fast.quant import (CASTS, COMPILED_KERNEL, ERROR_LIMIT, FP32_CHANNELS, INT8_KERNELS, Int8Linear,
                                  Scratch, calibrate, fp32_channels, int8_kernel_available)

IT = "The animal didn't cross the street because it was too tired"


@pytest.fixture(scope="module")
def int8(bundled_path):
    return bertscope.load(bundled_path, precision="int8", keep_precision=True)


def test_an_int8_model_pickles_with_its_plan_and_computes_the_same(int8):
    """The copy keeps int8 and each linear's plan (which stay fp32, which channels): the plan is
    held per model, weakly, so it must travel with the copy's own model."""
    texts = [IT, "a short one", "words " * 40]
    before = int8.embed(texts)
    twin = pickle.loads(pickle.dumps(int8))
    assert twin.precision == "int8" and twin.encoder is not int8.encoder
    assert twin.fast.gemm.int8_channels.get(twin.encoder) is not None
    np.testing.assert_array_equal(twin.embed(texts), before)


@pytest.fixture(scope="module")
def reviews(bert):
    """The contract's corpus and bertscope fp32's embeddings of it (read-only), computed once."""
    texts = review_corpus()
    ref = bert.embed(texts)
    ref.flags.writeable = False
    return texts, ref


def brute_force(x: np.ndarray, w: np.ndarray, b: np.ndarray, levels: int = 255,
                channels: tuple[int, ...] = ()) -> np.ndarray:
    """The int8 scheme written out in float64: per-channel weights, per-token asymmetric inputs
    on the grid 0..levels (255: 8 bits; 127: the 7 bits of a CPU whose int8 GEMM saturates);
    the input ``channels`` left out of both and multiplied exactly (LLM.int8()'s decomposition)."""
    S = list(channels)
    xm, wm = x.copy(), w.copy()
    xm[:, S], wm[:, S] = 0, 0
    s = np.maximum(np.abs(wm).max(1), 1e-12) / 127  # (M,)
    wq = np.clip(np.round(wm / s[:, None]), -127, 127)  # (M, K)
    lo, hi = xm.min(1, keepdims=True), xm.max(1, keepdims=True)  # (N, 1)
    step = np.maximum(hi - lo, 1e-12) / levels
    q = np.round((xm - lo) / step)  # (N, K) in [0, levels]
    xd = lo + step * q  # the dequantized input
    return xd @ (wq * s[:, None]).T + x[:, S] @ w[:, S].T + b  # (N, M)


def test_int8_contract_on_a_fixed_mixed_length_corpus(reviews, int8):
    """Cosine to fp32: mean >= 0.99, min >= 0.97; top-10 neighbours (each text against all the
    others, brute force): overlap >= 0.9."""
    texts, ref = reviews
    got = int8.embed(texts)
    cos = (ref * got).sum(1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.97, (cos.mean(), cos.min())
    sims = []
    for e in (ref, got):
        e64 = e.astype(np.float64)  # similarities in float64, one buffer times its transpose,
        s = e64 @ e64.T  # as the library computes them, so near-ties round alike
        np.fill_diagonal(s, -np.inf)
        sims.append(np.argsort(-s, axis=1)[:, :10])
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(sims[0], sims[1])])
    assert overlap >= 0.9, overlap
    # and the benchmark's own measure agrees with the brute force above
    from bertscope.bench.quality import embedding_agreement

    a = embedding_agreement(ref, got)
    assert abs(a["top10_overlap"] - overlap) < 1e-9 and abs(a["cosine_min"] - cos.min()) < 1e-6


@pytest.mark.parametrize("channels", [(), (3, 10)])
@pytest.mark.parametrize("levels", ["this machine's", 127])
@pytest.mark.parametrize("kernel", INT8_KERNELS + (COMPILED_KERNEL,))
def test_int8_linear_equals_the_quantization_scheme_in_float64(kernel, levels, channels):
    """Each kernel, with the activation grid this machine uses (8 bits where its int8 GEMM is
    exact on them, else 7) and with 7 bits (exact on every CPU), without and with fp32 input
    channels (one of them the outlier channel), against float64."""
    if not int8_kernel_available(kernel):
        # this CPU cannot run it exactly (torch._int_mm without VNNI, or a compiler that emits
        # wrong code for this CPU): bertscope never uses it, and the refusal is right
        assert kernel != "onednn", "oneDNN's int8 GEMM is the one every supported CPU must run"
        try:
            lin = Int8Linear(torch.ones(8, 64), torch.zeros(8), kernel=kernel, levels=127)
        except RuntimeError:
            return  # the compiled steps refused themselves
        x = torch.rand(64, 64) * 4
        assert not torch.allclose(lin(x), x @ torch.ones(64, 8), rtol=1e-2)
        return
    if levels != 127:
        levels = GemmBackend().int8_levels(kernel)
    g = torch.Generator().manual_seed(0)
    for N, K, M in [(130, 64, 96), (64, 384, 1152), (7, 32, 8)]:
        x = torch.randn(N, K, generator=g)
        x[:, 3] *= 30  # an outlier channel
        x[5] *= 50  # an outlier token
        w = torch.randn(M, K, generator=g) * 0.05
        b = torch.randn(M, generator=g)
        x_before = x.clone()
        got = Int8Linear(w, b, kernel=kernel, levels=levels, channels=channels)(x).double().numpy()
        assert torch.equal(x, x_before)  # the caller's input is left as it was
        xd, wd = x.double().numpy(), w.double().numpy()
        ref = brute_force(xd, wd, b.double().numpy(), levels, channels)
        err = np.abs(got - ref)
        # fp32 arithmetic may put an input a hair across a rounding boundary that float64 does
        # not: such an input is off by one level (its row's step) times its weight
        xm = xd.copy()
        xm[:, list(channels)] = 0
        step = (xm.max(1) - xm.min(1)) / levels  # (N,)
        one_level = step[:, None] * np.abs(wd).max(1)[None, :]  # (N, M)
        assert (err <= 1e-4 * (1 + np.abs(ref).max()) + 2 * one_level).all()
        assert np.mean(err <= 1e-4 * (1 + np.abs(ref).max())) > 0.99
        # and it approximates the fp32 product; with the outlier channel in fp32, more closely
        exact = (x @ w.T + b).double().numpy()
        rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
        assert rel < 0.05
        if channels:
            plain = Int8Linear(w, b, kernel=kernel, levels=levels)(x).double().numpy()
            assert rel < 0.95 * np.linalg.norm(plain - exact) / np.linalg.norm(exact)


def test_both_8bit_casts_give_the_same_integers_and_the_same_outputs():
    """Scratch.narrow's two routes (one fp32 -> 8-bit copy, or through int32 in place) truncate
    toward zero as torch.trunc does, at the ends of both 8-bit ranges too; int8 linears give
    bit-identical outputs whichever route their scratch takes."""
    g = torch.Generator().manual_seed(0)
    for dtype, lo, hi in ((torch.uint8, 0.0, 255.0), (torch.int8, -128.0, 127.0)):
        vals = torch.rand(300, 77, generator=g) * (hi + 1 - lo) * 0.99999 + lo  # (300, 77) in [lo, hi + 1)
        vals[0, :6] = torch.tensor([lo, hi, hi + 0.999, lo + 0.5, 0.0, 0.9999])  # the ends, and values below 1
        want = torch.trunc(vals).to(torch.int64)  # the independent reference
        for cast in CASTS:
            scratch = Scratch(cast)
            t = vals.clone()
            got = scratch.narrow(t, torch.empty(vals.shape, dtype=dtype))
            assert got.dtype == dtype and torch.equal(got.to(torch.int64), want), (cast, dtype)
    with pytest.raises(ValueError, match="unknown cast"):
        Scratch("float16")
    with pytest.raises(ValueError, match="unknown cast"):
        GemmBackend(precision="int8").use_int8_cast("float16")
    x = torch.randn(130, 64, generator=g)
    x[:, 3] *= 30  # an outlier channel
    w, b = torch.randn(96, 64, generator=g) * 0.05, torch.randn(96, generator=g)
    routes = []
    narrow = Scratch.narrow

    def spy(self, t, out):
        routes.append((self.cast, out.dtype))
        return narrow(self, t, out)

    for kernel, dtype in zip(INT8_KERNELS, (torch.uint8, torch.int8)):
        if not int8_kernel_available(kernel):
            continue
        outs = []
        for cast in CASTS:
            routes.clear()
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(Scratch, "narrow", spy)
                outs.append(Int8Linear(w, b, kernel=kernel, scratch=Scratch(cast), channels=(3,))(x))
            assert routes == [(cast, dtype)], (kernel, routes)  # the linear converts through its scratch's route
        assert all(torch.equal(outs[0], o) for o in outs[1:]), kernel


@pytest.mark.parametrize("kernel", INT8_KERNELS)
def test_the_8bit_range_probe_finds_the_saturation_it_looks_for(kernel, monkeypatch):
    """int8_range_exact multiplies the largest products there are. 7 bits are exact on every CPU
    (127·127·2 < 2^15); a GEMM that adds pairs of products in 16 bits, as x86 without VNNI does,
    fails it at 8 bits: played here by a GEMM that clamps its pairs to 16 bits."""
    from bertscope.fast.quant import REDUCED_LEVELS, int8_range_exact

    if kernel == "onednn":  # 7 bits cannot saturate oneDNN's pairs: 127·127·2 < 2^15
        assert int8_range_exact(kernel, REDUCED_LEVELS)
    else:  # torch._int_mm may shift its int8 input to uint8 and saturate even then: then unused
        assert int8_range_exact(kernel, REDUCED_LEVELS) == int8_kernel_available(kernel)

    def saturating(self, q):  # u8·s8 pairs summed in int16, as vpmaddubsw does without VNNI
        wq = torch.round(torch.ones(8, 64) * 127).float()  # the probe's weights, quantized
        pairs = (q.float().view(q.shape[0], -1, 2)[:, None] * wq.view(1, 8, -1, 2)).sum(-1)  # (N, M, K/2)
        return pairs.clamp(-32768, 32767).sum(-1) * self.w_scale  # (N, M)

    monkeypatch.setattr(Int8Linear, "int8_mm", saturating)
    assert int8_range_exact("onednn", REDUCED_LEVELS) and not int8_range_exact("onednn", 255)


def test_int8_uses_7bit_activations_where_8_bits_saturate_and_keeps_the_contract(bundled_path, reviews, monkeypatch):
    """Where the probe finds the 8-bit grid inexact (an AVX2 CPU without VNNI), int8 quantizes
    activations to 7 bits, says so in its note, and still meets the quality contract."""
    from bertscope.fast import quant

    real = quant.int8_range_exact
    monkeypatch.setattr(quant, "int8_range_exact", lambda k, levels=255: levels < 255 and real(k, levels))
    b = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    assert "7-bit activations" in b.precision_note
    with torch.inference_mode():
        lins = b.fast.gemm.linears(b.model, torch.zeros(1, b.config.hidden_size))
    assert {lin.levels for layer in lins for lin in (layer.qkv, layer.output, layer.ff_in, layer.ff_out)
            if isinstance(lin, Int8Linear)} == {127}
    texts, ref = reviews
    got = b.embed(texts)
    cos = (ref * got).sum(1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.97, (cos.mean(), cos.min())
    from bertscope.bench.quality import embedding_agreement

    assert embedding_agreement(ref, got)["top10_overlap"] >= 0.9


def test_a_resumed_int8_job_is_calibrated_again_for_the_int8_kernel_it_began_with(bundled_path, monkeypatch):
    """Which linears stay fp32 depends on the int8 kernel's grid (a 7-bit one doubles the error
    limit): a job resumed with its recorded kernel, where this machine's choice is another, gets
    that kernel's calibration, not the one made at load for the other kernel."""
    from bertscope.fast import encoder, quant, tuning

    # stand-in grids, whatever this CPU's GEMMs do: oneDNN's saturates on 8 bits, torch._int_mm's not
    monkeypatch.setattr(quant, "int8_range_exact",
                        lambda k, levels=quant.FULL_LEVELS: levels < quant.FULL_LEVELS or k == "int_mm")
    monkeypatch.setattr(encoder, "choose", lambda *a, **k: tuning.KernelChoice(int8_kernel="onednn"))
    b = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    seven_bit = quant.ERROR_LIMIT * quant.FULL_LEVELS / quant.REDUCED_LEVELS
    assert b.fast.gemm.int8_kernel == "onednn" and b.int8_plan.error_limit == pytest.approx(seven_bit)
    b.use_kernel_record({**b.kernel_record(), "int8_kernel": "int_mm"}, "job.json")
    assert b.fast.gemm.int8_kernel == "int_mm" and b.int8_plan.error_limit == pytest.approx(quant.ERROR_LIMIT)
    assert b.fast.gemm.int8_keep_fp32[b.encoder] == b.int8_plan.keep_fp32


FIRST_CALL_PROBE = """
import sys, torch
from bertscope.fast import quant

plain = lambda y, step, lo, w_sum, bias: quant._rescale(y, step, lo, w_sum, bias)
f = quant._compile(plain) if sys.argv[1] == "bertscope" else torch.compile(plain, dynamic=True, fullgraph=True)
def args(n, m):
    return torch.randn(n, m), torch.rand(n, 1), torch.randn(n, 1), torch.randn(m), torch.randn(m)
f(*args(7, 8))  # the first call, on a few rows, gives inductor its size hints
big = args(2048, 768)
assert torch.allclose(f(*big), quant._rescale(*big), rtol=1e-5, atol=1e-5)
"""


def test_compiled_steps_are_parallel_loops_whatever_size_they_were_first_called_with(tmp_path):
    """Inductor writes a one-thread loop when the first call is small, and dynamic=True reuses
    it for every size (the compiled int8 steps were once single-threaded on 2048-row batches
    after a test or a short batch compiled them). Every kernel that bertscope's compile
    (quant._compile, here of the epilogue) generates has a parallel region; plain torch.compile,
    the control, writes one without: so the check below can fail. Each in a fresh process with
    its own inductor cache, and inductor's own thread settings left to their defaults."""
    import os
    import subprocess
    import sys
    from pathlib import Path as P

    def start(how: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items()  # inductor's thread settings at their defaults
               if k not in ("TORCHINDUCTOR_CPP_DYNAMIC_THREADS", "TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE")}
        env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / how),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(P(__file__).resolve().parents[1] / "src"),
                                                            os.environ.get("PYTHONPATH")])))
        return subprocess.Popen([sys.executable, "-c", FIRST_CALL_PROBE, how], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def kernels(how: str, proc: subprocess.Popen) -> list[str] | None:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            # no working compiler here: then bertscope never uses compiled steps (the race records
            # the refusal), and there is nothing more to check
            assert not int8_kernel_available(COMPILED_KERNEL), err[-2000:]
            return None
        # inductor keeps each compiled graph's source, its C++ kernel inline, under its cache folder
        cache = tmp_path / how
        codes = [f.read_text() for f in cache.rglob("*.py") if "cpp_pybinding" in f.read_text()]
        assert codes, sorted(str(f) for f in cache.rglob("*"))[:20]
        return codes

    # both compiles at once (each mostly one compiler process): the check reads their files only
    procs = {how: start(how) for how in ("bertscope", "plain")}
    ours, plain = (kernels(how, proc) for how, proc in procs.items())
    if ours is None:
        return
    assert all(c.count("#pragma omp parallel") >= c.count("cpp_pybinding(") for c in ours)
    assert plain is not None and not all("#pragma omp parallel" in c for c in plain)


def test_compiled_steps_that_disagree_with_the_eager_steps_are_refused(monkeypatch):
    """A compiler that emits wrong code (here: a stand-in for torch.compile whose quantize step
    is one level high everywhere) makes CompiledSteps raise when made, so the compiled kernel is
    reported unavailable and never used; the eager steps are untouched."""
    from bertscope.fast import quant

    def wrong_compile(fn, **kw):
        def run(*args):
            out = fn(*args)
            if isinstance(out, tuple) and len(out) == 3 and out[0].dtype == torch.uint8:
                return (out[0] + 1, *out[1:])  # every 8-bit entry one level off
            return out
        return run

    monkeypatch.setattr(torch, "compile", wrong_compile)
    with pytest.raises(RuntimeError, match="disagree with the eager steps"):
        quant.CompiledSteps()
    assert not int8_kernel_available(COMPILED_KERNEL)
    assert int8_kernel_available("onednn")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # right code (eager): accepted
    quant.CompiledSteps()


@pytest.fixture(scope="module")
def compiled(bundled_path):
    """The bundled model in int8 with compile=True (about 30 s to compile on a cold cache), its
    int8 kernel forced to the compiled one whatever the race picked here -- where the compiled
    steps pass their check on this CPU; else the model as loaded."""
    b = bertscope.load(bundled_path, precision="int8", compile=True, keep_precision=True)
    if int8_kernel_available(COMPILED_KERNEL):
        b.fast.gemm.int8_kernel = COMPILED_KERNEL
    return b


def compiled_refused_here(b) -> bool:
    """Where this CPU's compiled steps fail their check: the race recorded the error and the
    model runs another kernel. True then (the caller has nothing more to test), else False."""
    if b.fast.gemm.int8_kernel == COMPILED_KERNEL:
        return False
    assert str(b.fast.choice.timings["int8_kernel"][COMPILED_KERNEL]).startswith("error")
    assert b.fast.choice.int8_kernel != COMPILED_KERNEL and b.int8_plan is not None
    return True


def test_compiled_int8_steps_compute_what_the_eager_steps_do(compiled, bert):
    """load(compile=True) races the torch.compile'd int8 steps. Forced on, each linear gives the
    eager steps' output on the same input (the same arithmetic, fused: within 1e-5, but for a
    rare input rounded to the neighbouring level), and the model meets the quality contract. (Whole-model embeddings of the two paths are compared with fp32, not with
    each other: a 1e-6 difference anywhere moves a few inputs of the next linear across a
    rounding boundary, so two correct int8 paths differ from each other about as much as each
    differs from fp32.)"""
    raced = compiled.fast.choice.timings["int8_kernel"]
    assert COMPILED_KERNEL in raced and set(INT8_KERNELS) <= set(raced)
    assert compiled.fast.choice.key.get("compile") is True
    if compiled_refused_here(compiled):
        return
    from bertscope.fast.gemm import LayerLinears, layer_weights

    class Both:  # runs the compiled linear, and checks the eager one on the very same input
        row_multiple = 64

        def __init__(self, w, b, a):
            self.eager = Int8Linear(w, b, a, kernel="onednn", levels=compiled.fast.gemm.int8_levels())
            self.compiled = compiled.fast.gemm.int8_linear(w, b, a)
            self.w_max = w.detach().abs().amax(1)  # (M,)
            self.checked = self.beyond_one_level = self.exact = 0

        def __call__(self, x):
            y = self.compiled(x)
            ref = self.eager(x)
            err = (y - ref).abs()
            tol = 1e-5 * (1 + float(ref.abs().max()))
            # Another CPU's vector code may round x/Δ a hair differently and put an input on the
            # other side of a rounding boundary: one level (Δ of its row) times its weight.
            step = (x.amax(1) - x.amin(1)) / self.eager.levels  # (N,)
            self.beyond_one_level += int((err > tol + 2 * step[:, None] * self.w_max[None, :]).sum())
            self.exact += int((err <= tol).sum())
            self.checked += err.numel()
            return y

    texts = review_corpus(300)
    ids, _ = compiled.tokenizer.encode_ids(texts[:40])
    both = [{n: Both(*wba) for n, wba in lw.items()} for lw in layer_weights(compiled.model)]
    with torch.inference_mode():
        compiled.fast.encode(compiled.model, bertscope.fast.packing.pack_ids(ids),
                             linears=[LayerLinears(**d) for d in both])
    assert all(lin.compiled.steps is not None for d in both for lin in d.values())
    lins = [lin for d in both for lin in d.values()]
    assert sum(lin.beyond_one_level for lin in lins) == 0
    assert sum(lin.exact for lin in lins) / sum(lin.checked for lin in lins) > 0.99
    got, ref = compiled.embed(texts), bert.embed(texts)
    cos = (got * ref).sum(1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.97, (cos.mean(), cos.min())
    from bertscope.bench.quality import embedding_agreement

    assert embedding_agreement(ref, got)["top10_overlap"] >= 0.9


def test_both_activation_placements_on_the_compiled_steps_agree(compiled):
    """W1's epilogue on the compiled steps with GELU fused into the compiled loop, and with
    PyTorch's GELU applied after it (the two places the kernel choice races), agree within fp32
    rounding: on the same 8-bit rows only where erf is computed differs. Each stays within the
    calibration's error limit of the fp32 linear."""
    if compiled_refused_here(compiled):
        return
    from bertscope.fast.gemm import layer_weights
    from bertscope.fast.quant import ACT_PLACEMENTS

    w, b, act = layer_weights(compiled.model)[0]["ff_in"]
    assert act == "gelu"
    lin = compiled.fast.gemm.int8_linear(w, b, act)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, w.shape[1], generator=g)  # (N, C)
    x[:, 5] *= 20  # an outlier channel
    ref = torch.nn.functional.gelu(x @ w.detach().T + b.detach())  # (N, I) fp32
    was = lin.steps.act_placement
    got = {}
    try:
        for placement in ACT_PLACEMENTS:
            lin.steps.act_placement = placement
            with torch.inference_mode():
                got[placement] = lin(x).clone()
    finally:
        lin.steps.act_placement = was
    fused, apart = got["fused"], got["apart"]
    assert torch.allclose(fused, apart, rtol=1e-5, atol=1e-5 * float(fused.abs().max())), \
        float((fused - apart).abs().max())
    for y in got.values():
        assert float((y - ref).norm() / ref.norm()) < ERROR_LIMIT


def test_fused_int8_layers_follow_the_layer_recipe(compiled, bert, monkeypatch):
    """With all four linears of a layer int8 on compiled steps, the encoder runs
    CompiledSteps.run_layer: BertLayer.run's recipe with the steps between the integer GEMMs
    fused across linears. Layer by layer, from the same input, it gives layer.run's output with
    the same linears within 1e-3 relative, and within a tenth of those linears' own int8 error
    against fp32 (what can separate the two is LayerNorm's output rounded a hair differently,
    moving a rare input of the next linear by one level); the 8-bit rows it carries to the next
    layer are its output's quantization; and the encoder uses it for every layer."""
    from bertscope.fast.gemm import LayerLinears
    from bertscope.fast.kernels import attention_plan
    from bertscope.fast.packing import pack_ids
    from bertscope.fast.quant import CompiledSteps, compiled_steps_of

    if compiled_refused_here(compiled):
        return
    model, fp32_model = compiled.model, bert.model
    H = model.config.num_attention_heads
    ids, _ = compiled.tokenizer.encode_ids(review_corpus(300)[:40])
    packed = pack_ids(ids)
    calls = []
    real_run_layer = CompiledSteps.run_layer

    def spy(self, layer, lin, x, carried, attend, quantize_next, next_keep=None):
        calls.append((carried is not None, quantize_next))
        return real_run_layer(self, layer, lin, x, carried, attend, quantize_next, next_keep)

    monkeypatch.setattr(CompiledSteps, "run_layer", spy)
    with torch.inference_mode():
        compiled.fast.encode(model, packed)
    # every layer whose four linears are int8 runs fused (all of them, unless the calibration
    # kept some linear fp32: as on a 7-bit grid), 8-bit rows carried between fused neighbours
    from bertscope.fast.gemm import LINEAR_NAMES

    keep = compiled.int8_plan.keep_fp32
    fusable = [all((i, name) not in keep for name in LINEAR_NAMES) for i in range(len(model.layers))]
    n = len(fusable)
    assert calls == [(i > 0 and fusable[i - 1], i < n - 1 and fusable[i + 1]) for i in range(n) if fusable[i]]
    if not keep:
        assert len(calls) == n
    monkeypatch.setattr(CompiledSteps, "run_layer", real_run_layer)

    with torch.inference_mode():
        x = model.embeddings(packed.input_ids, packed.token_type_ids, packed.position_ids)  # (N, C)
        N = x.shape[0]
        x = torch.nn.functional.pad(x, (0, 0, 0, -(-N // 64) * 64 - N))  # (N', C) as the encoder pads
        lins = compiled.fast.gemm.linears(model, x)
        fp32_lins = GemmBackend(prefer="blas").build(fp32_model, "blas")
        plan = attention_plan(packed, 0.0)
        att = lambda qkv: compiled.fast.kernels.attend(qkv, packed, H, plan=plan)  # noqa: E731
        rel = lambda a, b: float((a[:N] - b[:N]).norm() / b[:N].norm())  # noqa: E731
        for i, (layer, lin, lin32) in enumerate(zip(model.layers, lins, fp32_lins)):
            steps = compiled_steps_of(lin)

            def unfused(h, lins: LayerLinears):
                return layer.run(h, lambda g: (lins.output(att(lins.qkv(g))), None), lins.feed_forward)[0]

            per_linear, exact = unfused(x, lin), unfused(x, lin32)
            assert (steps is not None) == fusable[i], i
            if steps is None:  # a layer with an fp32 linear runs the per-linear recipe
                x = per_linear
                continue
            # the 8-bit rows handed on leave out the next W_QKV's fp32 channels (here: this
            # layer's own, as a stand-in for any layer's)
            next_keep = lin.qkv.keep
            assert next_keep is not None and int((next_keep == 0).sum()) == FP32_CHANNELS
            fused, carried = steps.run_layer(layer, lin, x, None, att, quantize_next=True, next_keep=next_keep)
            assert rel(fused, per_linear) < 1e-3, i
            assert rel(fused, per_linear) < 0.1 * rel(per_linear, exact), i
            q, lo, step = steps.quantize(fused, next_keep)
            flips = (carried[0].int() - q.int()).abs()
            assert int(flips.max()) <= 1 and float((flips > 0).float().mean()) < 0.01, i
            assert torch.allclose(carried[1], lo, atol=1e-6) and torch.allclose(carried[2], step, rtol=1e-5), i
            x = per_linear  # the next layer starts from the per-linear path's output


def test_fp32_channels_work_on_inputs_that_cannot_be_written_and_are_checked():
    """The eager steps zero the fp32 channels in place and restore them; an input that cannot be
    written in place (an inference tensor outside inference mode) gets a copy instead, with the
    same result, and is left as it was. Channels outside the input are a ValueError."""
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(48, 32, generator=g) * 0.1, torch.randn(48, generator=g)
    lin = Int8Linear(w, b, channels=(3, 7))
    x = torch.randn(64, 32, generator=g)
    x[:, 3] *= 40
    with torch.inference_mode():
        frozen = x.clone()  # an inference tensor
        inside = lin(frozen)
    outside = lin(frozen)  # in-place writes to it are refused out here
    assert torch.equal(inside, outside) and torch.equal(frozen, x)
    assert torch.equal(lin(x), inside) and torch.equal(x, frozen)  # written in place and put back
    with pytest.raises(ValueError, match="input channels 0..31"):
        Int8Linear(w, b, channels=(32,))


def test_gelu_layer_of_int8_matches_fp32_activation_order():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(64, 32, generator=g), torch.randn(48, 32, generator=g) * 0.1, torch.randn(48, generator=g)
    lin, plain = Int8Linear(w, b, "gelu"), Int8Linear(w, b)
    assert torch.allclose(lin(x), torch.nn.functional.gelu(plain(x)), atol=1e-6)
    # the epilogue applies activations in place on its own output: the same values as torch's
    from bertscope.core.config import ACTIVATION_NAMES
    from bertscope.core.layer import activation

    for name in ACTIVATION_NAMES:
        y = torch.randn(64, 48, generator=g) * 4
        want = {"gelu": torch.nn.functional.gelu(y), "relu": torch.relu(y)}.get(
            name, torch.nn.functional.gelu(y, approximate="tanh"))
        assert torch.allclose(activation(name)(y), want, rtol=1e-6, atol=1e-7), name
        z = y.clone()
        assert activation(name, in_place=True)(z) is z and torch.allclose(z, want, rtol=1e-6, atol=1e-7), name


PLANTED = (1, 2, 3)  # layers whose W_O input gets an outlier channel


def planted_outlier(bert, channels: tuple[int, ...] = (5,), factor: float = 1000.0) -> Bert:
    """A copy of the model whose W_O inputs (the attention context) in layers PLANTED have
    ``channels`` ``factor`` times larger: V's rows scaled up, W_O's columns scaled down by the same
    factor, so the fp32 function is unchanged but those channels dwarf the others."""
    model = copy.deepcopy(bert.model)
    with torch.no_grad():
        for layer in PLANTED:
            att = model.layers[layer].attention
            for k, channel in enumerate(channels):
                f = factor * (1 + k)  # unequal, so that which are the largest is well defined
                att.value.weight[channel] *= f
                att.value.bias[channel] *= f
                att.output.weight[:, channel] /= f
    return Bert(config=bert.config, model=model, tokenizer=bert.tokenizer, path=bert.path,
                max_seq_length=bert.max_seq_length, name="planted",
                fast=PackedEncoder(gemm=GemmBackend(precision="int8")))


def test_an_outlier_channel_goes_through_fp32_and_its_linear_stays_int8(bert):
    """One planted 1000x channel is what the fp32 channels are for: the calibration finds it (the
    largest |x| of that input), the linear stays int8, and the contract holds. Without the fp32
    channels the same linear is far off."""
    b = planted_outlier(bert, channels=(5,))
    texts = review_corpus(80, seed=3)
    ref = bert.embed(texts)
    from bertscope.bert import _calibration_batch

    plan = calibrate(b.fast, b.model, _calibration_batch(b))
    planted = {(layer, "output") for layer in PLANTED}
    assert all(5 in plan.channels[k] and len(plan.channels[k]) == FP32_CHANNELS for k in planted)
    assert not planted & plan.keep_fp32 and all(plan.errors[k] < plan.error_limit for k in planted)
    got = b.embed(texts)
    cos = (got * ref).sum(1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.97
    # the same linear without its fp32 channels, on the same inputs
    att = b.model.layers[PLANTED[0]].attention
    g = torch.Generator().manual_seed(0)
    ctx = torch.randn(256, att.output.weight.shape[1], generator=g)
    ctx[:, 5] *= 1000.0
    exact = torch.nn.functional.linear(ctx, att.output.weight, att.output.bias)
    levels = b.fast.gemm.int8_levels()
    errs = [float((Int8Linear(att.output.weight, att.output.bias, levels=levels, channels=c)(ctx) - exact).norm()
                  / exact.norm()) for c in ((), fp32_channels(ctx))]
    assert errs[0] > ERROR_LIMIT and errs[1] < 0.1 * errs[0], errs


def test_calibration_keeps_a_linear_with_an_activation_outlier_in_fp32(bert):
    """More outlier channels than the fp32 channels take: the error rule keeps the linear fp32."""
    b = planted_outlier(bert, channels=tuple(range(5, 5 + FP32_CHANNELS + 1)))
    texts = review_corpus(80, seed=3)
    ref = bert.embed(texts)
    assert np.abs(b.embed(texts, batch_size=None) - ref).max() > 0  # int8 (nothing calibrated yet)
    b32 = Bert(config=b.config, model=b.model, tokenizer=b.tokenizer, fast=PackedEncoder())
    assert np.abs(b32.embed(texts) - ref).max() < 1e-4  # the plant leaves fp32 unchanged
    all_int8 = b.embed(texts)
    from bertscope.bert import _calibration_batch

    plan = calibrate(b.fast, b.model, _calibration_batch(b))
    planted = {(layer, "output") for layer in PLANTED}
    assert plan.error_limit == pytest.approx(ERROR_LIMIT * 255 / b.fast.gemm.int8_levels())
    assert planted <= plan.keep_fp32 and all(plan.errors[k] > plan.error_limit for k in planted)
    # the outliers' linears, not everything: two more at most on the 8-bit grid; a 7-bit grid (a
    # CPU whose int8 GEMM saturates on 8 bits) doubles every error and needs a few more for the
    # calibration floor, still well under half of the model's 24
    assert len(plan.keep_fp32) <= len(planted) + (2 if b.fast.gemm.int8_levels() == 255 else 8)
    kept = b.embed(texts)
    cos_all, cos_kept = (all_int8 * ref).sum(1), (kept * ref).sum(1)
    assert cos_all.min() < 0.97  # the outlier breaks the contract when quantized ...
    assert cos_kept.mean() >= 0.99 and cos_kept.min() >= 0.97  # ... and the rule restores it


def test_int8_attentions_are_computed_exactly_on_the_fp32_path(bert, int8):
    batch = bert.encode([IT, "a short one"])
    with torch.inference_mode():
        ref = bert.model(batch.input_ids, batch.attention_mask, output_attentions=True)
        got = int8(batch.input_ids, batch.attention_mask, output_attentions=True)
        plain8 = int8(batch.input_ids, batch.attention_mask).last_hidden_state  # packed, int8
    assert all(torch.equal(a, b) for a, b in zip(ref.attentions, got.attentions))
    assert torch.equal(ref.last_hidden_state, got.last_hidden_state)
    real = batch.attention_mask.bool()
    assert (plain8 - ref.last_hidden_state)[real].abs().max() > 1e-4  # the plain forward is int8
    # what view / attend show on an int8 load is the fp32 model's attention, exactly
    r32, r8 = bertscope.attend(bert, IT, "it"), bertscope.attend(int8, IT, "it")
    assert torch.equal(r32.weights, r8.weights)


def test_int8_under_autograd_is_the_exact_fp32_model(bert, int8):
    batch = bert.encode([IT, "hi"])
    out = int8(batch.input_ids, batch.attention_mask).last_hidden_state  # grad enabled: fp32
    with torch.inference_mode():
        ref = bert.model(batch.input_ids, batch.attention_mask).last_hidden_state
    real = batch.attention_mask.bool()
    assert out.requires_grad and (out.detach() - ref)[real].abs().max() < 1e-5


def test_gradient_explanations_of_an_int8_load_are_the_fp32_models_both_texts_included(bert, int8):
    """explain(..., text_b=B) took B's embedding from int8's packed path and A's gradients from
    the fp32 reference: two precisions in one number."""
    for method in ("grad-input", "integrated-gradients"):
        ref = bertscope.explain(bert, IT, method, text_b="A tired dog")
        got = bertscope.explain(int8, IT, method, text_b="A tired dog")
        np.testing.assert_array_equal(got.maps, ref.maps, err_msg=method)


def test_loading_int8_twice_gives_identical_outputs(bundled_path):
    """Two loads, one after the other, read the same cached kernel choice and calibrate alike:
    the same bits. (Compared with the module's int8 model, loaded earlier, this failed twice in
    full runs on a busy machine: a test between had measured the choice again, and its int8_cast
    route differs from the other where a value rounds past the grid's end, as quant.Scratch.narrow
    says.)"""
    texts = review_corpus(40, seed=7)
    first = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    again = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    assert again.int8_plan.to_json() == first.int8_plan.to_json()  # the same calibration: linears, channels
    routes = lambda c: (c.key, c.gemm, c.batch_tokens, c.slack, c.int8_kernel, c.int8_cast, c.int8_act)  # noqa: E731
    assert routes(again.fast.choice) == routes(first.fast.choice), (again.fast.choice, first.fast.choice)
    assert np.array_equal(again.embed(texts), first.embed(texts))


def slowed(monkeypatch, cls, seconds: float) -> None:
    """Make every call of ``cls`` (a linear) take ``seconds`` longer: a stand-in for a CPU where
    that kind of GEMM is slow, whatever this CPU is."""
    inner = cls.__call__

    def call(self, x):
        time.sleep(seconds)
        return inner(self, x)
    monkeypatch.setattr(cls, "__call__", call)


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A fresh cache folder, and tuning on: each load measures its kernel choice anew."""
    monkeypatch.setenv("BERTSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BERTSCOPE_TUNE", raising=False)


def test_int8_is_declined_where_its_plan_is_no_faster_than_fp32(bundled_path, bert, monkeypatch, own_cache):
    from bertscope.fast import tuning
    from bertscope.fast.quant import Int8Linear

    slowed(monkeypatch, Int8Linear, 0.02)  # int8 GEMMs slower than fp32 ones, on any CPU
    with pytest.warns(RuntimeWarning, match=r"int8 is off: measured \d\.\d\dx the speed of fp32 here "
                      r"\(int8 \(\w+ kernel.*\); \d+ of 24 linears kept fp32, and 2 input channels of each int8 one\)"):
        b = bertscope.load(bundled_path, precision="int8")
    assert b.precision == "fp32" and b.fast.gemm.precision == "fp32"
    assert "(keep_precision=True (--keep-precision) keeps int8)" in b.precision_note
    from bertscope.errors import as_typed

    assert "(--keep-precision keeps int8)" in as_typed(b.precision_note)  # as the command line prints it
    (speedup,) = b.fast.choice.int8_speedup.values()  # measured, and cached with the kernel choice
    assert speedup < 1 + tuning.NOISE_MARGIN
    texts = ["one", IT, "a third text, a little longer than the others"]
    assert np.abs(b.embed(texts) - bert.embed(texts)).max() < 1e-5  # the fp32 model's embeddings

    calls = []
    monkeypatch.setattr(tuning, "measured_speedup", lambda *a, **k: calls.append(a) or 2.0)
    with pytest.warns(RuntimeWarning, match="int8 is off"):
        again = bertscope.load(bundled_path, precision="int8")  # the cached verdict, not measured again
    assert again.precision == "fp32" and calls == []
    kept = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    assert kept.precision == "int8" and calls == []
    assert "no faster: kept as asked, keep_precision=True" in kept.precision_note
    cos = (kept.embed(texts) * bert.embed(texts)).sum(1)
    assert cos.min() > 0.97 and cos.min() < 1 - 1e-6  # int8's embeddings: close, not the fp32 ones


def test_int8_speed_measured_on_a_busy_machine_is_not_cached(bundled_path, monkeypatch, own_cache):
    """Another job taking half the CPUs while int8 is timed against fp32: the verdict holds for this
    load only, the note says why, and the next load measures it again."""
    from bertscope.fast import tuning

    monkeypatch.delenv("BERTSCOPE_BUSY_SHARE", raising=False)  # conftest's, for the CLI's subprocesses

    b = bertscope.load(bundled_path, precision="int8", keep_precision=True)  # a quiet machine
    path = Path(b.fast.choice.path)
    stored = json.loads(path.read_text())
    assert len(stored["int8_speedup"]) == 1
    stored["int8_speedup"] = {}  # as if the cached kernel choice had been measured without it
    path.write_text(json.dumps(stored))
    k = [0]

    def busy():  # others take half of every 200 ticks
        k[0] += 1
        return (k[0] * 150, k[0] * 200, k[0] * 50, 1)

    monkeypatch.setattr(tuning, "cpu_ticks", busy)
    again = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    assert again.fast.choice.source == "cache"  # the kernel choice itself was measured quietly
    assert "other processes took 50% of the CPUs while the speed verdict was measured, so the speed verdict is not cached" in again.precision_note
    assert json.loads(path.read_text())["int8_speedup"] == {}  # nothing cached from the busy run
    # a choice cached with a busy reading (under BERTSCOPE_BUSY_SHARE=1) does not make a quiet
    # verdict look busy: only a choice measured in this process speaks for this run
    stored = json.loads(path.read_text())
    stored["busy"] = 0.9
    path.write_text(json.dumps(stored))
    monkeypatch.setattr(tuning, "cpu_ticks", lambda: None)
    quiet = bertscope.load(bundled_path, precision="int8", keep_precision=True)
    assert quiet.fast.choice.source == "cache" and "not cached" not in quiet.precision_note
    assert len(json.loads(path.read_text())["int8_speedup"]) == 1


def test_int8_stays_on_where_its_plan_is_faster_than_fp32(bundled_path, monkeypatch, own_cache):
    from bertscope.fast.gemm import Linear

    slowed(monkeypatch, Linear, 0.02)  # fp32 GEMMs slower than int8 ones, on any CPU
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "int8 is off" warning
        b = bertscope.load(bundled_path, precision="int8")
    assert b.precision == "int8" and b.fast.gemm.precision == "int8"
    (speedup,) = b.fast.choice.int8_speedup.values()
    assert speedup >= 1.05 and f"{speedup:.2f}x the speed of fp32 on the calibration texts" in b.precision_note


def test_the_int8_note_gives_the_speedup_as_cached(bundled_path, monkeypatch, own_cache):
    """The note and the cache hold the same rounded figure: 10.32502 is cached as 10.325, which
    prints as 10.32, where the unrounded figure printed 10.33 (a CI run met that boundary)."""
    from bertscope.fast import tuning

    monkeypatch.setattr(tuning, "measured_speedup", lambda *a, **k: 10.32502)
    b = bertscope.load(bundled_path, precision="int8")
    (speedup,) = b.fast.choice.int8_speedup.values()
    assert speedup == 10.325 and f"{speedup:.2f}x the speed of fp32" in b.precision_note


def test_bf16_is_off_with_a_warning_where_the_cpu_lacks_it(bundled_path, bert, monkeypatch):
    import bertscope.bert as facade

    monkeypatch.setattr(facade, "cpu_flags", lambda: ["avx2"])
    with pytest.warns(RuntimeWarning, match="bf16 is off: this CPU has neither AVX512-BF16 nor AMX"):
        b = bertscope.load(bundled_path, precision="bf16")
    assert b.precision == "fp32"
    texts = ["one", IT]
    assert np.abs(b.embed(texts) - bert.embed(texts)).max() < 1e-5


def test_bf16_where_it_runs_stays_within_its_bound(bundled_path, bert):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        b = bertscope.load(bundled_path, precision="bf16")
    texts = review_corpus(60, seed=11)
    cos = (b.embed(texts) * bert.embed(texts)).sum(1)
    if b.precision == "bf16":  # this CPU runs bf16 natively and measured it faster
        assert cos.mean() >= 0.999 and cos.min() >= 0.995
    else:
        assert b.precision_note.startswith("bf16 is off") and cos.min() > 1 - 1e-6


def test_precision_is_checked(bundled_path):
    with pytest.raises(bertscope.InputError, match="precision must be one of"):
        bertscope.load(bundled_path, precision="fp8")
    with pytest.raises(bertscope.InputError, match="CPU mode"):
        bertscope.load(bundled_path, precision="int8", device="meta")
    with pytest.raises(bertscope.InputError, match="compile=True applies to precision='int8' only"):
        bertscope.load(bundled_path, compile=True)
    with pytest.raises(bertscope.InputError, match="keep_precision=True applies to precision='int8' or 'bf16'"):
        bertscope.load(bundled_path, keep_precision=True)


def test_embed_cli_int8_records_its_precision_and_resume_refuses_another(tmp_path, capsys, bert):
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(["a first line", IT, "", "last"]) + "\n")
    out = tmp_path / "out"
    assert main(["embed", str(inp), "--out", str(out), "--precision", "int8", "--keep-precision", "--quiet"]) == 0
    assert json.loads((out / "_job.json").read_text())["precision"] == "int8"
    from bertscope.fast.embedjob import read_embeddings

    emb, status = read_embeddings(out)
    ref = bert.embed(["a first line", IT, "", "last"])
    cos = (emb * ref).sum(1)
    assert status[2] == "empty" and cos[[0, 1, 3]].min() > 0.97
    (out / "_manifest.json").unlink()  # pretend the job was interrupted
    capsys.readouterr()
    assert main(["embed", str(inp), "--out", str(out), "--resume", "--precision", "fp32", "--quiet"]) == 2
    assert "cannot resume: precision changed" in capsys.readouterr().err
