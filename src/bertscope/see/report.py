"""An attention report: every layer and head of one or two texts, as one self-contained HTML file.

Shape legend: N layers, H heads, T tokens, W words.

The HTML file carries its own JavaScript and CSS (``bertscope/assets/``) and its numbers, so it
opens from disk with no network. The numbers are stored compactly so that long inputs stay
usable: each attention row is quantised to multiples of 1/2048 by rounding its *cumulative* sum
(so every weight, and every sum of neighbouring weights such as a split word's sub-tokens, is
within 1/2048 of the model's value, and each row still sums to exactly 1), stored as two byte
planes of uint16, deflated and base64-encoded. The browser inflates them with its built-in
DecompressionStream.
"""

from __future__ import annotations

import base64
import html
import json
import os
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .aggregate import attention_rollout
from ..files import write_bytes_atomic
from ..errors import InputError
from ..core.words import group_words
from ..bert import Bert

__all__ = ["QUANT_SCALE", "Report", "ReportText", "build_report", "dequantize", "quantize_rows"]

QUANT_SCALE = 2048  # weights are stored as k / 2048: error below 1/2048 ≈ 4.9e-4


@dataclass(frozen=True)
class ReportText:
    """One text's tokens, words and attention.

    tokens:      T sub-token strings ([CLS] … [SEP]).
    words:       W words; ``token_words`` maps each token to its word (T entries).
    special:     per token, True for [CLS] and [SEP].
    attentions:  (N, H, T, T) float32 attention probabilities, padding stripped.
    rollout:     (N, T, T) float32 attention rollout after each layer.
    """

    text: str
    tokens: list[str]
    words: list[str]
    token_words: list[int]
    special: list[bool]
    attentions: np.ndarray
    rollout: np.ndarray
    truncated: bool = False

    def meta(self) -> dict[str, Any]:
        """Everything about the text except the numbers (JSON-ready)."""
        word_special = [False] * len(self.words)
        for t, w in enumerate(self.token_words):
            if self.special[t]:
                word_special[w] = True
        return {"text": self.text, "tokens": self.tokens, "words": self.words,
                "token_words": self.token_words, "special": self.special,
                "word_special": word_special, "truncated": self.truncated}


@dataclass(frozen=True)
class Report:
    """Attention of one or two texts through a model; ``to_html()`` makes the explorer page.

    In Jupyter the report shows itself inline (``_repr_html_``).
    """

    model_name: str
    num_layers: int
    num_heads: int
    texts: list[ReportText]

    def meta(self) -> dict[str, Any]:
        return {"model": self.model_name, "layers": self.num_layers, "heads": self.num_heads,
                "texts": [t.meta() for t in self.texts]}

    def to_html(self) -> str:
        """The whole explorer as one HTML document (no external resources)."""
        meta = self.meta()
        planes, layout = [], []
        offset = 0
        for t in self.texts:
            q_att = quantize_rows(t.attentions)  # (N, H, T, T) uint16
            q_roll = quantize_rows(t.rollout)  # (N, T, T) uint16
            layout.append({"attn": offset, "rollout": offset + q_att.size})
            offset += q_att.size + q_roll.size
            planes += [q_att.ravel(), q_roll.ravel()]
        q = np.concatenate(planes) if planes else np.zeros(0, np.uint16)
        lo_hi = np.concatenate([(q & 0xFF).astype(np.uint8), (q >> 8).astype(np.uint8)])
        blob = base64.b64encode(zlib.compress(lo_hi.tobytes(), 1)).decode("ascii")
        meta["data"] = {"scale": QUANT_SCALE, "count": int(q.size), "layout": layout}
        return render_page(meta, mode="file", blob=blob)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the HTML file atomically (a temporary file, then a rename)."""
        return write_bytes_atomic(Path(path), self.to_html().encode("utf-8"), make_parents=False)

    def _repr_html_(self) -> str:
        # An iframe keeps the page's scripts and styles apart from the notebook's.
        doc = html.escape(self.to_html(), quote=True)
        return (f'<iframe srcdoc="{doc}" style="width:100%;height:720px;border:1px solid #ddd" '
                f'sandbox="allow-scripts"></iframe>')


def quantize_rows(probs: np.ndarray, scale: int = QUANT_SCALE) -> np.ndarray:
    """Attention rows (..., T) -> uint16 multiples of 1/scale, by rounding cumulative sums.

    For every run of neighbouring keys a..b, |sum(q[a..b])/scale - sum(p[a..b])| <= 1/scale
    (the rounding error of two cumulative sums), and each row of q sums to round(scale·Σp).
    """
    p = np.asarray(probs, dtype=np.float64)
    cum = np.rint(np.cumsum(p, axis=-1) * scale)  # (..., T)
    q = np.diff(cum, axis=-1, prepend=0.0)
    return np.clip(q, 0, 65535).astype(np.uint16)


def dequantize(q: np.ndarray, scale: int = QUANT_SCALE) -> np.ndarray:
    return q.astype(np.float32) / scale


def _asset(name: str) -> str:
    return resources.files("bertscope.see").joinpath("assets", name).read_text(encoding="utf-8")


def _json_for_script(obj: Any) -> str:
    # Inside <script>, "</script>" or "<!--" in a text would end the element: escape "<".
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_page(meta: dict[str, Any] | None, mode: str, blob: str = "") -> str:
    """Fill the page template. mode "file": one self-contained file; "server": assets by URL."""
    page = _asset("page.html")
    if mode == "file":
        head = f"<style>\n{_asset('bertscope.css')}\n</style>"
        script = f"<script>\n{_asset('bertscope.js')}\n</script>"
    else:
        head = '<link rel="stylesheet" href="assets/bertscope.css">'
        script = '<script src="assets/bertscope.js"></script>'
    config = {"mode": mode, "meta": meta}
    title = "bertscope"
    if meta and meta.get("texts"):
        title = "bertscope: " + meta["texts"][0]["text"][:60]
    return (page.replace("{{TITLE}}", html.escape(title))
                .replace("{{HEAD}}", head)
                .replace("{{CONFIG}}", _json_for_script(config))
                .replace("{{BLOB}}", blob)
                .replace("{{SCRIPT}}", script))


@torch.inference_mode()
def analyze(bert: Bert, texts: list[str]) -> list[ReportText]:
    """Run the texts through the model as one padded batch; strip the padding per text."""
    for i, text in enumerate(texts):
        if not text.strip():
            raise InputError("the text is empty" if i == 0 else "the second text is empty")
    batch = bert.encode(texts)
    dev = bert.device
    out = bert.encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev),
                     batch.token_type_ids.to(dev), output_attentions=True)
    probs = torch.stack(out.attentions, dim=1).float().cpu()  # (B, N, H, T, T)
    result = []
    for b, text in enumerate(texts):
        T = batch.lengths[b]
        att = probs[b, :, :, :T, :T].contiguous()  # (N, H, T, T); PAD columns were exactly 0
        words = group_words(batch, text, b)
        result.append(ReportText(
            text=text, tokens=list(batch.tokens[b]), words=words.words,
            token_words=words.token_words,
            special=[wid is None for wid in batch.word_ids[b]],
            attentions=att.numpy(), rollout=attention_rollout(att).numpy(),
            truncated=batch.truncated[b]))
    return result


def build_report(bert: Bert, text: str, text_b: str | None = None, *, bert_b: Bert | None = None) -> Report:
    """Attention of ``text`` (and ``text_b``, shown side by side with the difference).

    With ``bert_b`` instead of ``text_b``: ``text`` through two models (A = ``bert``, B =
    ``bert_b``, e.g. a base model and its fine-tuned classifier), side by side with the
    difference A - B. The two must have the same shape (layers and heads).
    """
    cfg = bert.config
    name = bert.name or (bert.path.name if bert.path else "BERT")
    if bert_b is None:
        texts = [text] if text_b is None else [text, text_b]
        return Report(model_name=name, num_layers=cfg.num_hidden_layers,
                      num_heads=cfg.num_attention_heads, texts=analyze(bert, texts))
    if text_b is not None:
        raise InputError("give a second text or a second model, not both")
    cb = bert_b.config
    if (cb.num_hidden_layers, cb.num_attention_heads) != (cfg.num_hidden_layers, cfg.num_attention_heads):
        raise InputError(f"the two models differ in shape ({cfg.num_hidden_layers}x{cfg.num_attention_heads} and "
                         f"{cb.num_hidden_layers}x{cb.num_attention_heads} layers x heads)")
    name_b = bert_b.name or (bert_b.path.name if bert_b.path else "BERT")
    return Report(model_name=f"A = {name}, B = {name_b}", num_layers=cfg.num_hidden_layers,
                  num_heads=cfg.num_attention_heads, texts=analyze(bert, [text]) + analyze(bert_b, [text]))
