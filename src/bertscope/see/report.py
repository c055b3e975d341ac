"""An attention report: every layer and head of one or two texts, as one self-contained HTML file.

Shape legend: N layers, H heads, T tokens, D head size, W words.

The HTML file carries its own JavaScript and CSS (``bertscope/see/assets/``) and its numbers, so
it opens from disk with no network. The numbers are stored compactly so that long inputs stay
usable: each attention row is quantised to multiples of 1/2048 by rounding its *cumulative* sum
(so every weight, and every sum of neighbouring weights such as a split word's sub-tokens, is
within 1/2048 of the model's value, and each row still sums to exactly 1), stored as two byte
planes of uint16, deflated and base64-encoded. The browser inflates them with its built-in
DecompressionStream.

Other measures than the attention weights (norms, value zeroing, ALTI, ... computed by
``bertscope.explain``, which ranks above this module) come in as plain arrays: ``build_report(...,
measures=provider)`` with ``provider(bert, text, pair) -> {name: (N, H, T, T) or (N, T, T)}``.
Each is stored like the weights, on its own scale: multiples of 1/2048, or coarser when a value
would pass 65535/2048 = 32 (``norm``'s raw vector lengths), so every value is within one step.

The query-key view needs each head's queries, keys and values (the seed's step [3] worked
out in the browser). They are read from the model's own intermediates
(``bert.encoder(..., output_intermediates=True)``), kept exact (float32, as four byte planes,
deflated) and stored when they are small enough (:data:`QK_AUTO_BYTES` per text), or when asked.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import html
import json
import os
import reprlib
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .aggregate import attention_rollout
from ..files import as_path, write_bytes_atomic
from ..errors import InputError, InputTypeError, as_whole_number, setting
from ..core.tokenizer import check_text, check_texts, no_tokens
from ..core.words import group_words
from ..bert import Bert, analysis, check_bert

__all__ = ["ALIGN_MIN_SHARE", "QK_AUTO_BYTES", "QUANT_SCALE", "Report", "ReportText", "align_units", "alignment_meta",
           "MeasureProvider", "analyze", "build_report", "measure_scale", "measures_meta",
           "parse_span", "quantize_rows", "render_page", "with_measures"]

QUANT_SCALE = 2048  # weights are stored as k / 2048: error below 1/2048 ≈ 4.9e-4
QK_AUTO_BYTES = 4 * 2**20  # q, k, v of a text (3·N·T·C float32) are stored by default up to this size
ALIGN_MIN_SHARE = 0.5  # two texts are diffed only if at least this share of their words match


@dataclass(frozen=True)
class ReportText:
    """One text's tokens, words and attention.

    tokens:      T sub-token strings ([CLS] … [SEP]).
    words:       W words; ``token_words`` maps each token to its word (T entries).
    special:     per token, True for [CLS] and [SEP].
    attentions:  (N, H, T, T) float32 attention probabilities, padding stripped.
    rollout:     (N, T, T) float32 attention rollout after each layer.
    segments:    per token its segment id (0 = A, 1 = B) when the text is a sentence pair.
    pair:        the second text of a sentence pair (read as [CLS] text [SEP] pair [SEP]).
    qkv:         (3, N, H, T, D) float32 queries, keys and values of every head, or None.
    measures:    name -> (N, H, T, T) (per head) or (N, T, T) (per layer) float32 maps of other
                 measures (what token i takes from token j), in the order they are offered.
    """

    text: str
    tokens: list[str]
    words: list[str]
    token_words: list[int]
    special: list[bool]
    attentions: np.ndarray
    rollout: np.ndarray
    truncated: bool = False
    segments: list[int] | None = None
    pair: str | None = None
    qkv: np.ndarray | None = None
    measures: dict[str, np.ndarray] = field(default_factory=dict)

    def __repr__(self) -> str:  # a summary: the maps are (N, H, T, T) numbers
        extra = [f"pair {reprlib.repr(self.pair)}"] if self.pair is not None else []
        extra += ["q, k, v"] if self.qkv is not None else []
        extra += [f"measures {', '.join(self.measures)}"] if self.measures else []
        extra += ["truncated"] if self.truncated else []
        return (f"ReportText({reprlib.repr(self.text)}, {len(self.tokens)} tokens, {len(self.words)} words, "
                f"attentions {tuple(self.attentions.shape)}{''.join('; ' + e for e in extra)})")

    def meta(self) -> dict[str, Any]:
        """Everything about the text except the numbers (JSON-ready)."""
        word_special = [False] * len(self.words)
        for t, w in enumerate(self.token_words):
            if self.special[t]:
                word_special[w] = True
        out = {"text": self.text, "tokens": self.tokens, "words": self.words,
               "token_words": self.token_words, "special": self.special,
               "word_special": word_special, "truncated": self.truncated,
               "qk": self.qkv is not None}
        if self.segments is not None:
            out["segments"] = list(self.segments)
            out["pair"] = self.pair
        return out


MeasureProvider = Callable[[Bert, str, "str | None"], "dict[str, np.ndarray]"]


def measures_meta(rt: ReportText) -> list[dict[str, Any]]:
    """What the page needs to know of each measure: its name, whether it has a map per head, and
    whether its rows are shares (sum to 1; else raw sizes, drawn relative to the largest)."""
    out = []
    for name, m in rt.measures.items():
        rows = m.sum(-1)  # (N, [H,] T)
        share = bool(np.all((np.abs(rows - 1) < 1e-3) | (rows == 0)))
        out.append({"name": name, "per_head": m.ndim == 4, "share": share})
    return out


def measure_scale(maps: np.ndarray) -> int:
    """The quantisation scale of a measure: 2048, or less so that its largest value fits uint16."""
    top = float(np.max(maps)) if maps.size else 0.0
    return int(min(QUANT_SCALE, 65535 // max(1.0, np.ceil(top + 1e-6))))


def align_units(a: list[str], b: list[str]) -> list[list[int]]:
    """Pairs [i, j] of units a[i] == b[j] (case-insensitive), by sequence alignment.

    difflib's longest-matching-blocks alignment (Ratcliff/Obershelp), without its "junk"
    heuristic, so frequent words are matched too. Unmatched units have no pair.
    """
    sm = difflib.SequenceMatcher(a=[x.lower() for x in a], b=[x.lower() for x in b], autojunk=False)
    return [[blk.a + k, blk.b + k] for blk in sm.get_matching_blocks() for k in range(blk.size)]


def alignment_meta(a: ReportText, b: ReportText) -> dict[str, Any]:
    """Word and token alignment of two texts, and whether they are close enough to diff."""
    word_pairs = align_units(a.words, b.words)
    ordinary = lambda rt: [w for w in range(len(rt.words))  # noqa: E731
                           if not any(rt.special[t] for t, x in enumerate(rt.token_words) if x == w)]
    oa, ob = ordinary(a), ordinary(b)
    matched = sum(1 for i, _ in word_pairs if i in set(oa))
    share = matched / max(1, len(oa), len(ob))
    return {"word": word_pairs, "token": align_units(a.tokens, b.tokens), "share": share,
            "min_share": ALIGN_MIN_SHARE, "matched_words": matched,
            "words": [len(oa), len(ob)]}


@dataclass(frozen=True)
class Report:
    """Attention of one or two texts through a model; ``to_html()`` makes the explorer page.

    ``options`` sets how the page opens (``{"span": [start, end]}``: a window of tokens).
    In Jupyter the report shows itself inline (``_repr_html_``); ``save(path)`` writes the file.
    """

    model_name: str
    num_layers: int
    num_heads: int
    texts: list[ReportText]
    options: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # a summary: the page holds every map
        texts = ", ".join(reprlib.repr(t.text) for t in self.texts)
        return (f"Report({self.model_name!r}, {self.num_layers} layers x {self.num_heads} heads, "
                f"texts: {texts}; .save('page.html'), or show it in a notebook)")

    def meta(self) -> dict[str, Any]:
        out = {"model": self.model_name, "layers": self.num_layers, "heads": self.num_heads,
               "texts": [t.meta() for t in self.texts], "options": dict(self.options)}
        if len(self.texts) == 2:
            out["alignment"] = alignment_meta(*self.texts)
        if self.texts and self.texts[0].measures:
            out["measures"] = measures_meta(self.texts[0])
        return out

    def to_html(self) -> str:
        """The whole explorer as one HTML document (no external resources)."""
        meta = self.meta()
        planes, layout = [], []
        offset = 0
        names = list(self.texts[0].measures) if self.texts else []
        scales = {f"m:{n}": min(measure_scale(t.measures[n]) for t in self.texts) for n in names}
        for t in self.texts:
            q_att = quantize_rows(t.attentions)  # (N, H, T, T) uint16
            q_roll = quantize_rows(t.rollout)  # (N, T, T) uint16
            where = {"attn": offset, "rollout": offset + q_att.size}
            offset += q_att.size + q_roll.size
            planes += [q_att.ravel(), q_roll.ravel()]
            for n in names:  # (N, H, T, T) or (N, T, T) uint16, each on its own scale
                q_m = quantize_rows(t.measures[n], scales[f"m:{n}"])
                where[f"m:{n}"] = offset
                offset += q_m.size
                planes.append(q_m.ravel())
            layout.append(where)
        q = np.concatenate(planes) if planes else np.zeros(0, np.uint16)
        meta["data"] = {"scale": QUANT_SCALE, "count": int(q.size), "layout": layout}
        if scales:
            meta["data"]["scales"] = scales
        blob = _pack_planes(q)
        qk_parts, qk_layout, qk_off = [], [], 0
        for t in self.texts:
            if t.qkv is None:
                qk_layout.append(None)
                continue
            x = np.ascontiguousarray(t.qkv, dtype="<f4")  # (3, N, H, T, D)
            qk_layout.append({"offset": qk_off, "shape": list(x.shape)})
            qk_off += x.size
            qk_parts.append(x.ravel())
        qk_blob = ""
        if qk_parts:
            qk_blob = _pack_planes(np.concatenate(qk_parts))
            meta["qk"] = {"count": qk_off, "layout": qk_layout}
        return render_page(meta, mode="file", blob=blob, qk_blob=qk_blob)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the HTML file atomically (a temporary file, then a rename). The name must end in
        .html or .htm; its folder must exist."""
        if as_path(path, "the file name").suffix.lower() not in (".html", ".htm"):
            raise InputError(f"{path}: the explorer is an HTML page; give a name ending in .html")
        return write_bytes_atomic(Path(path), self.to_html().encode("utf-8"), make_parents=False)

    def frame_height(self) -> int:
        """A first height in pixels for the page inside a notebook frame (the frame is resizable)."""
        longest = max((len(t.words) for t in self.texts), default=10)
        return int(min(900, max(520, 300 + 18 * longest)))

    def _repr_html_(self) -> str:
        # An iframe keeps the page's scripts and styles apart from the notebook's. Its height is a
        # first guess from the text's length; the frame's box can be dragged taller or shorter.
        doc = html.escape(self.to_html(), quote=True)
        return (f'<div style="resize:vertical;overflow:hidden;height:{self.frame_height()}px;'
                f'min-height:240px;border:1px solid #ddd">'
                f'<iframe srcdoc="{doc}" style="width:100%;height:100%;border:0" '
                f'sandbox="allow-scripts"></iframe></div>')


def _pack_planes(values: np.ndarray) -> str:
    """Little-endian values as byte planes (all first bytes, then all second bytes, ...), deflated,
    base64: the planes of similar bytes deflate far better than the interleaved values."""
    le = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    raw = le.view(np.uint8).reshape(-1, le.dtype.itemsize)  # (count, bytes per value)
    return base64.b64encode(zlib.compress(raw.T.tobytes(), 1)).decode("ascii")


def quantize_rows(probs: np.ndarray, scale: int = QUANT_SCALE) -> np.ndarray:
    """Attention rows (..., T) -> uint16 multiples of 1/scale, by rounding cumulative sums.

    For every run of neighbouring keys a..b, |sum(q[a..b])/scale - sum(p[a..b])| <= 1/scale
    (the rounding error of two cumulative sums), and each row of q sums to round(scale·Σp).
    """
    p = np.asarray(probs, dtype=np.float64)
    cum = np.rint(np.cumsum(p, axis=-1) * scale)  # (..., T)
    q = np.diff(cum, axis=-1, prepend=0.0)
    return np.clip(q, 0, 65535).astype(np.uint16)


def parse_span(span: str | tuple[int, int] | None, T: int | None) -> tuple[int, int] | None:
    """A window of tokens "START:END" (END excluded, either may be left out; negative counts from
    the end, as Python slices) -> (start, end) within 0..T. InputError for an empty window.

    ``T`` None (the text not tokenized yet) checks what can be checked without it: the form, and
    an END that is not after START when both count from the same end; it returns None."""
    if span is None:
        return None
    if isinstance(span, str):
        parts = span.split(":")
        if len(parts) != 2:
            raise InputError(f"{setting('span', '--span')} must be START:END (token positions, e.g. 10:60), got {span!r}")
        try:
            lo = int(parts[0]) if parts[0].strip() else None
            hi = int(parts[1]) if parts[1].strip() else None
        except ValueError:
            raise InputError(f"{setting('span', '--span')} must be START:END with whole numbers, got {span!r}") from None
    else:
        try:
            lo, hi = span
        except (TypeError, ValueError):
            raise InputError(f"span must be \"START:END\" or a pair (START, END) of token positions, got {span!r}") from None
        for v in (lo, hi):
            if v is not None and as_whole_number(v) is None:
                raise InputError(f"span must be \"START:END\" or a pair (START, END) of token positions, got {span!r}")
    if T is None:
        if lo is not None and hi is not None and (lo < 0) == (hi < 0) and hi <= lo:
            raise InputError(f"{setting('span', '--span')} {span if isinstance(span, str) else f'{lo}:{hi}'} selects no token "
                             "(END must be after START)")
        return None
    start, end, _ = slice(lo, hi).indices(T)
    if end <= start:
        raise InputError(f"{setting('span', '--span')} {span if isinstance(span, str) else f'{lo}:{hi}'} selects no token "
                         f"(the text has {T} tokens, 0..{T - 1})")
    return start, end


def _asset(name: str) -> str:
    return resources.files("bertscope.see").joinpath("assets", name).read_text(encoding="utf-8")


def _json_for_script(obj: Any) -> str:
    # Inside <script>, "</script>" or "<!--" in a text would end the element: escape "<".
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def _title_of(texts: list[str], room: int = 60) -> str:
    """The page's title for its texts: the text, or for a comparison both, each cut short where
    the two differ (they often share their start: "... too tired" and "... too wide")."""
    if len(texts) == 1:
        return texts[0][:room]
    a, b = texts[0], texts[1]
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    each = max(12, (room - 8) // 2)
    # a shared start longer than a third of the room: each from a word or two before they differ
    start = a.rfind(" ", 0, max(0, common - 12)) + 1 if common > each // 3 else 0

    def short(x: str) -> str:
        x = ("…" if start else "") + x[start:]
        return x if len(x) <= each else x[:each - 1] + "…"
    return f"A: {short(a)} | B: {short(b)}"


def render_page(meta: dict[str, Any] | None, mode: str, blob: str = "", qk_blob: str = "") -> str:
    """Fill the page template. mode "file": one self-contained file; "server": assets by URL."""
    page = _asset("page.html")
    if mode == "file":
        head = f"<style>\n{_asset('bertscope.css')}\n</style>"
        script = f"<script>\n{_asset('bertscope.js')}\n</script>"
    else:
        head = '<link rel="stylesheet" href="assets/bertscope.css">'
        script = '<script src="assets/bertscope.js"></script>'
    config: dict[str, Any] = {"mode": mode, "meta": meta}
    if mode == "server":
        config["api"] = "api/"  # the only place the page learns where to ask; a file never asks
    title = "bertscope"
    if meta and meta.get("texts"):
        title = "bertscope: " + _title_of([x["text"] for x in meta["texts"]])
    return (page.replace("{{TITLE}}", html.escape(title))
                .replace("{{HEAD}}", head)
                .replace("{{CONFIG}}", _json_for_script(config))
                .replace("{{BLOB}}", blob)
                .replace("{{QKBLOB}}", qk_blob)
                .replace("{{SCRIPT}}", script))


def _want_qk(qk: bool | None, n_layers: int, hidden: int, T: int) -> bool:
    if qk is not None:
        return bool(qk)
    return 3 * n_layers * T * hidden * 4 <= QK_AUTO_BYTES


@analysis
def analyze(bert: Bert, texts: list[str], *, pair: str | None = None,
            qk: bool | None = None) -> list[ReportText]:
    """Run the texts through the model as one padded batch; strip the padding per text.

    ``pair``: read the one text and ``pair`` as a sentence pair, [CLS] text [SEP] pair [SEP],
    with segment ids 0 and 1 (as BERT reads pairs). ``qk``: keep every head's q, k and v
    (None: when they fit in :data:`QK_AUTO_BYTES`).
    """
    texts = check_texts(texts)
    for i, text in enumerate(texts):
        if not text.strip():
            raise InputError("the text is empty" if i == 0 else "the second text is empty")
    if pair is not None:
        [pair] = check_texts([pair], "the pair text")
        if len(texts) != 1:
            raise InputError("a sentence pair is one input: give one text and its pair")
        if not pair.strip():
            raise InputError("the pair text is empty")
    batch = bert.encode(texts, pairs=None if pair is None else [pair])
    for b in range(len(texts)):  # a text of characters the tokenizer drops (U+200B...) has no tokens
        for seg, what in ((0, "the text" if b == 0 else "the second text"), (1, "the pair text")):
            if (seg == 0 or pair is not None) and not any(
                    w is not None and int(batch.token_type_ids[b, t]) == seg for t, w in enumerate(batch.word_ids[b])):
                raise no_tokens(what)
    dev = bert.device
    cfg = bert.config
    want_qk = _want_qk(qk, cfg.num_hidden_layers, cfg.hidden_size, max(batch.lengths))
    out = bert.encoder(batch.input_ids.to(dev), batch.attention_mask.to(dev),
                       batch.token_type_ids.to(dev), output_attentions=True,
                       output_intermediates=want_qk)
    probs = torch.stack(out.attentions, dim=1).float().cpu()  # (B, N, H, T, T)
    qkv = None
    if want_qk:  # the model's own q, k, v of every layer (step [2]): (3, B, N, H, T, D)
        qkv = torch.stack([torch.stack([getattr(rec.attention, n) for rec in out.intermediates], dim=1)
                           for n in ("q", "k", "v")]).float().cpu()
    result = []
    for b, text in enumerate(texts):
        T = batch.lengths[b]
        att = probs[b, :, :, :T, :T].contiguous()  # (N, H, T, T); PAD columns were exactly 0
        words = group_words(batch, text, b, pair=pair)
        result.append(ReportText(
            text=text, tokens=list(batch.tokens[b]), words=words.words,
            token_words=words.token_words,
            special=[wid is None for wid in batch.word_ids[b]],
            attentions=att.numpy(), rollout=attention_rollout(att).numpy(),
            truncated=batch.truncated[b],
            segments=None if pair is None else batch.token_type_ids[b, :T].tolist(),
            pair=pair,
            qkv=None if qkv is None else qkv[:, b, :, :, :T].contiguous().numpy()))  # (3, N, H, T, D)
    return result


def with_measures(rt: ReportText, maps: dict[str, np.ndarray]) -> ReportText:
    """``rt`` with measure maps attached; InputError if one does not match its layers and tokens."""
    if not isinstance(maps, Mapping):
        raise InputTypeError(f"a measures function must return {{name: maps}}, a dict; it returned "
                             f"{type(maps).__name__}")
    N, H, T = rt.attentions.shape[:3]
    checked = {}
    for name, m in maps.items():
        m = np.ascontiguousarray(m, dtype=np.float32)
        if m.shape not in ((N, H, T, T), (N, T, T)):
            raise InputError(f"measure {name!r} has shape {m.shape}; expected {(N, H, T, T)} or {(N, T, T)}")
        checked[name] = m
    return dataclasses.replace(rt, measures=checked)


def build_report(bert: Bert, text: str, text_b: str | None = None, *, pair: str | None = None,
                 span: str | tuple[int, int] | None = None, qk: bool | None = None,
                 bert_b: Bert | None = None, measures: MeasureProvider | None = None) -> Report:
    """Attention of ``text`` (and ``text_b``, shown side by side with the difference).

    ``pair``: read ``text`` and ``pair`` as one sentence pair instead (segments A and B).
    ``span``: open the page on a window of tokens, "START:END" (the whole text stays available).
    ``qk``: store every head's q, k, v for the query-key view (None: if they are small enough).
    ``bert_b`` instead of ``text_b``: ``text`` through two models (A = ``bert``, B = ``bert_b``,
    e.g. a base model and its fine-tuned classifier), side by side with the difference A - B.
    The two must have the same shape (layers and heads).
    ``measures``: ``provider(bert, text, pair) -> {name: maps}`` (e.g. from ``bertscope.explain``),
    called once per text and model; the page then offers each measure beside the attention.
    """
    check_bert(bert, "build_report()")
    if qk is not None and not isinstance(qk, (bool, np.bool_)):  # "no" would have counted as true
        raise InputTypeError(f"qk must be True, False or None (if small enough), got {qk!r}")
    if measures is not None and not callable(measures):
        raise InputTypeError(f"measures must be a function (bert, text, pair) -> {{name: maps}}, e.g. lambda b, "
                             f"t, p: map_measures(b, t, ['alti'], pair=p); got {type(measures).__name__}")
    if text_b is not None and pair is not None:
        raise InputError("give a second text to compare, or a pair text, not both")
    check_text(text)
    if text_b is not None:
        check_text(text_b, "the second text")
    cfg = bert.config
    name = bert.name or (bert.path.name if bert.path else "BERT")
    if bert_b is None:
        texts = [text] if text_b is None else [text, text_b]
        analysed = analyze(bert, texts, pair=pair, qk=qk)
    else:
        if text_b is not None:
            raise InputError("give a second text or a second model, not both")
        cb = check_bert(bert_b, "build_report()'s bert_b").config
        if (cb.num_hidden_layers, cb.num_attention_heads) != (cfg.num_hidden_layers, cfg.num_attention_heads):
            raise InputError(f"the two models differ in shape ({cfg.num_hidden_layers}x{cfg.num_attention_heads} and "
                             f"{cb.num_hidden_layers}x{cb.num_attention_heads} layers x heads)")
        name_b = bert_b.name or (bert_b.path.name if bert_b.path else "BERT")
        name = f"A = {name}, B = {name_b}"
        analysed = analyze(bert, [text], pair=pair, qk=qk) + analyze(bert_b, [text], pair=pair, qk=qk)
    if measures is not None:
        models = [bert, bert] if bert_b is None else [bert, bert_b]
        analysed = [with_measures(rt, measures(m, rt.text, rt.pair)) for rt, m in zip(analysed, models)]
    options: dict[str, Any] = {}
    if span is not None:
        options["span"] = list(parse_span(span, max(len(t.tokens) for t in analysed)))
    return Report(model_name=name, num_layers=cfg.num_hidden_layers,
                  num_heads=cfg.num_attention_heads, texts=analysed, options=options)
