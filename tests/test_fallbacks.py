"""The fast path's fallbacks: a kernel or GEMM op that refuses real input costs speed, never a
result. Each is provoked with a fake that raises, and the output is compared with the padded
reference model."""

from __future__ import annotations

import logging

import pytest
import torch

import bertscope
from bertscope.fast import kernels as kernels_mod
from bertscope.fast.encoder import PackedEncoder
from bertscope.fast.gemm import GemmBackend
from bertscope.fast.kernels import AttentionKernels, attention_plan
from bertscope.fast.packing import pack

TOL = 1e-5


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(7)
    cfg = bertscope.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=128)
    model = bertscope.BertModel(cfg).eval()
    lengths = [70, 3, 70, 1, 40]
    T = max(lengths)
    ids = torch.randint(1, cfg.vocab_size, (len(lengths), T))
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    return model, ids, mask


@pytest.mark.parametrize("error", [RuntimeError, NotImplementedError, ValueError, TypeError])
def test_onednn_op_failing_on_real_shapes_falls_back_to_blas(small, monkeypatch, caplog, error):
    model, ids, mask = small
    gemm = GemmBackend(prefer="onednn")
    if not gemm.onednn_usable():  # a torch or CPU without oneDNN's linear: BLAS from the start
        assert gemm.backend_for(ids.float()) == "blas"
        with torch.inference_mode():
            fast, ref = PackedEncoder(gemm=gemm).forward(model, ids, mask), model(ids, mask)
        assert (fast.last_hidden_state - ref.last_hidden_state)[mask.bool()].abs().max() < TOL
        return
    real_op = torch.ops.mkldnn._linear_pointwise
    calls = []

    def refuses_real_shapes(x, *args):  # the probe's 3 x 2 call works; real shapes do not
        calls.append(tuple(x.shape))
        if x.shape[0] > 3:
            raise error("oneDNN: could not create a primitive descriptor")
        return real_op(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", refuses_real_shapes)
    encoder = PackedEncoder(gemm=gemm)
    with caplog.at_level(logging.WARNING, logger="bertscope.fast.gemm"), torch.inference_mode():
        fast = encoder.forward(model, ids, mask)
        ref = model(ids, mask)
    real = mask.bool()
    assert calls, "the oneDNN op was never tried"
    assert (fast.last_hidden_state - ref.last_hidden_state)[real].abs().max() < TOL
    assert gemm.failures and error.__name__ in gemm.failures[0]
    assert "oneDNN linear failed" in caplog.text
    n = len(calls)
    with torch.inference_mode():  # from now on this object uses BLAS and does not try again
        again = encoder.forward(model, ids, mask)
    assert len(calls) == n
    assert gemm.backend_for(ids.float()) == "blas"
    assert (again.last_hidden_state - ref.last_hidden_state)[real].abs().max() < TOL


@pytest.mark.parametrize("error", [ValueError, RuntimeError, TypeError, NotImplementedError])
def test_varlen_kernel_refusal_falls_back_per_object(small, monkeypatch, caplog, error):
    model, ids, mask = small
    H = model.config.num_attention_heads
    C = model.config.hidden_size
    calls = []

    def fake_varlen(*args, **kwargs):
        calls.append(1)
        raise error("varlen_attn: head size not supported")

    monkeypatch.setattr(kernels_mod, "varlen_kernel", lambda: fake_varlen)
    # Pretend the inputs qualify (the real test is CUDA + fp16/bf16); keep the refused-set rule.
    monkeypatch.setattr(AttentionKernels, "_varlen_usable",
                        lambda self, qkv, D, p: (qkv.dtype, D) not in self.varlen_refused)
    packed = pack(ids, mask, None)
    qkv = torch.randn(packed.num_tokens, 3 * C)  # (N, 3C)
    want = AttentionKernels().attend(qkv, packed, H, impl="groups", plan=attention_plan(packed))
    first = AttentionKernels()
    with caplog.at_level(logging.WARNING, logger="bertscope.fast.kernels"):
        got = first.attend(qkv, packed, H)  # "auto": tries varlen, which refuses
    assert torch.equal(got, want)
    assert len(calls) == 1 and first.varlen_refused == {(torch.float32, C // H)}
    assert "varlen attention refused" in caplog.text
    first.attend(qkv, packed, H)
    assert len(calls) == 1  # this object remembers the refusal
    second = AttentionKernels()
    assert torch.equal(second.attend(qkv, packed, H), want)
    assert len(calls) == 2  # another object is not affected (no process-wide switch)


def test_an_unexpected_kernel_error_is_not_swallowed(small, monkeypatch):
    """Only a refusal falls back; a bug (say a KeyError) still surfaces."""
    model, ids, mask = small
    monkeypatch.setattr(kernels_mod, "varlen_kernel", lambda: (lambda *a, **k: {}["missing"]))
    monkeypatch.setattr(AttentionKernels, "_varlen_usable", lambda self, qkv, D, p: True)
    packed = pack(ids, mask, None)
    qkv = torch.randn(packed.num_tokens, 3 * model.config.hidden_size)
    with pytest.raises(KeyError):
        AttentionKernels().attend(qkv, packed, model.config.num_attention_heads)
