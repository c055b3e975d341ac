"""``bertscope serve``: the attention explorer as a local web app. Needs the ``serve`` extra.

FastAPI is imported only inside :func:`create_app`, so ``import bertscope`` stays free of it.

Routes:
    GET  /                 the explorer page (server mode: it asks for numbers on demand)
    GET  /assets/NAME      a file of the package's asset folder, by exact name (an allow-list:
                           nothing outside the folder can be named, ``..`` included)
    GET  /api/health       {"status": "ok", "model": ...}: readiness
    POST /api/analyze      {"text", "text_b"?} -> tokens and words of each text (no numbers)
    POST /api/attention    {"text", "text_b"?, "layer", "heads", "kind": "attn"|"rollout"}
                           -> only that layer's requested heads (float32, base64)

Texts over ``max_chars`` characters get HTTP 413. The model runs under a lock (one forward at a
time; PyTorch already uses every core for one), and the last few analyses are cached.
"""

# No "from __future__ import annotations": FastAPI must see the request models defined inside
# create_app as real classes, not as strings it cannot resolve.

import base64
import threading
from collections import OrderedDict
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BertscopeError
from .loading import Bert
from .report import ReportText, analyze, render_page

__all__ = ["Analyzer", "DEFAULT_MAX_CHARS", "create_app", "run"]

DEFAULT_MAX_CHARS = 2000
_CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                  ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}


class Analyzer:
    """Thread-safe, cached ``analyze``: one forward pass at a time, the last ``size`` kept."""

    def __init__(self, bert: Bert, size: int = 16) -> None:
        self.bert = bert
        self.size = size
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, ...], list[ReportText]] = OrderedDict()

    def __call__(self, texts: list[str]) -> list[ReportText]:
        key = tuple(texts)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            result = analyze(self.bert, list(texts))
            self._cache[key] = result
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
            return result


def _asset_files() -> dict[str, Path]:
    folder = resources.files("bertscope").joinpath("assets")
    return {p.name: Path(str(p)) for p in folder.iterdir() if p.is_file()}


def create_app(bert: Bert, max_chars: int = DEFAULT_MAX_CHARS):
    """The FastAPI application serving ``bert``."""
    try:
        from fastapi import FastAPI, HTTPException, Request
        from fastapi.responses import HTMLResponse, JSONResponse, Response
        from pydantic import BaseModel, Field
    except ImportError:
        raise BertscopeError("serving needs FastAPI and uvicorn: pip install 'bertscope[serve]'") from None

    analyzer = Analyzer(bert)
    assets = _asset_files()
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    name = bert.name or (bert.path.name if bert.path else "BERT")
    body_limit = 8 * max_chars + 4096  # bytes: two texts of max_chars (UTF-8, JSON-escaped) and the rest

    class Texts(BaseModel):
        text: str
        text_b: str | None = None

    class AttentionQuery(Texts):
        layer: int = Field(ge=0)
        heads: list[int] = Field(default_factory=list, max_length=256)
        kind: str = Field(default="attn", pattern="^(attn|rollout)$")

    app = FastAPI(title="bertscope", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > body_limit):
            return JSONResponse({"detail": f"the request is too large: texts are limited to {max_chars} characters"},
                                status_code=413)
        return await call_next(request)

    @app.exception_handler(BertscopeError)
    async def user_error(request: Request, exc: BertscopeError):
        return JSONResponse({"detail": str(exc)}, status_code=400)

    def texts_of(q: Texts) -> list[str]:
        texts = [q.text] if q.text_b is None or not q.text_b.strip() else [q.text, q.text_b]
        for t in texts:
            if len(t) > max_chars:
                raise HTTPException(413, f"the text has {len(t):,} characters; the limit is {max_chars:,}")
            if not t.strip():
                raise HTTPException(400, "the text is empty")
        return texts

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        return HTMLResponse(render_page(None, mode="server"))

    @app.get("/assets/{name:path}")
    def asset(name: str) -> Response:
        path = assets.get(name)  # exact names only: "../x", "a/b" and "%2e%2e%2f" are not keys
        if path is None:
            raise HTTPException(404, "no such asset")
        return Response(path.read_bytes(), media_type=_CONTENT_TYPES.get(path.suffix, "application/octet-stream"))

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": name, "layers": N, "heads": H, "max_chars": max_chars}

    @app.post("/api/analyze")
    def analyze_route(q: Texts) -> dict[str, Any]:
        result = analyzer(texts_of(q))
        return {"model": name, "layers": N, "heads": H, "texts": [t.meta() for t in result]}

    @app.post("/api/attention")
    def attention_route(q: AttentionQuery) -> dict[str, Any]:
        texts = texts_of(q)
        if q.layer >= N:
            raise HTTPException(400, f"layer must be 0..{N - 1}, got {q.layer}")
        bad = [h for h in q.heads if not 0 <= h < H]
        if bad:
            raise HTTPException(400, f"heads must be 0..{H - 1}, got {bad[0]}")
        result = analyzer(texts)
        out = []
        for t, rt in enumerate(result):
            if q.kind == "rollout":
                out.append({"text": t, "head": -1, "data": _b64(rt.rollout[q.layer])})
            else:
                for h in dict.fromkeys(q.heads):
                    out.append({"text": t, "head": h, "data": _b64(rt.attentions[q.layer, h])})
        return {"layer": q.layer, "kind": q.kind,
                "tokens": [len(rt.tokens) for rt in result], "matrices": out}

    return app


def _b64(M: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(M, dtype="<f4").tobytes()).decode("ascii")


def run(bert: Bert, host: str = "127.0.0.1", port: int = 8000, max_chars: int = DEFAULT_MAX_CHARS,
        log_level: str = "warning") -> None:
    """Serve until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise BertscopeError("serving needs FastAPI and uvicorn: pip install 'bertscope[serve]'") from None
    uvicorn.run(create_app(bert, max_chars=max_chars), host=host, port=port, log_level=log_level)
