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

Texts over ``max_chars`` characters get HTTP 413, and so does a request body over
8 x max_chars + 4096 bytes: the bytes actually received are counted (a chunked body without a
Content-Length included), and reading stops at the limit. The model runs under a lock (one
forward at a time; PyTorch already uses every core for one), and the last few analyses are
cached: at most ``CACHE_ENTRIES`` (16) of them and at most ``CACHE_BYTES`` (256 MiB) of attention
arrays in all; an analysis larger than that on its own is not cached.
"""

# No "from __future__ import annotations": FastAPI must see the request models defined inside
# create_app as real classes, not as strings it cannot resolve.

import base64
import socket
import threading
from collections import OrderedDict
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BertscopeError, InputError
from ..bert import Bert
from .report import ReportText, analyze, render_page

__all__ = ["Analyzer", "CACHE_BYTES", "CACHE_ENTRIES", "DEFAULT_MAX_CHARS", "bind", "body_limit",
           "create_app", "run"]

DEFAULT_MAX_CHARS = 2000
CACHE_ENTRIES = 16
CACHE_BYTES = 256 * 2**20  # attention arrays kept in the cache, all entries together
_CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                  ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}


def _nbytes(result: list[ReportText]) -> int:
    return sum(rt.attentions.nbytes + rt.rollout.nbytes for rt in result)


class Analyzer:
    """Thread-safe, cached ``analyze``: one forward pass at a time.

    The cache keeps the most recently used analyses, at most ``size`` of them and at most
    ``max_bytes`` bytes of attention arrays in all (float32 (N, H, T, T) per text: 144 MB for a
    512-token text on BERT-base); one analysis over ``max_bytes`` on its own is not cached.
    """

    def __init__(self, bert: Bert, size: int = CACHE_ENTRIES, max_bytes: int = CACHE_BYTES) -> None:
        self.bert = bert
        self.size = size
        self.max_bytes = max_bytes
        self.nbytes = 0  # bytes held by the cache now
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, ...], list[ReportText]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cache)

    def __call__(self, texts: list[str]) -> list[ReportText]:
        key = tuple(texts)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            result = analyze(self.bert, list(texts))
            size = _nbytes(result)
            if size > self.max_bytes or self.size < 1:
                return result  # too large to keep: computed again next time
            self._cache[key] = result
            self.nbytes += size
            while len(self._cache) > self.size or self.nbytes > self.max_bytes:
                _, old = self._cache.popitem(last=False)
                self.nbytes -= _nbytes(old)
            return result


def body_limit(max_chars: int) -> int:
    """Largest request body accepted, in bytes: two texts of max_chars (UTF-8, JSON-escaped) and the rest."""
    return 8 * max_chars + 4096


class _BodyLimit:
    """ASGI middleware: reads the whole request body, counting the bytes as they arrive, and
    answers 413 as soon as they pass ``limit`` (whatever Content-Length says, or without one);
    the application then gets the body already read."""

    def __init__(self, app, limit: int, detail: str) -> None:
        self.app, self.limit, self.detail = app, limit, detail

    async def _too_large(self, send) -> None:
        import json

        body = json.dumps({"detail": self.detail}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._too_large(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._too_large(send)
                return
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay():
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


def _asset_files() -> dict[str, Path]:
    folder = resources.files("bertscope.see").joinpath("assets")
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

    class Texts(BaseModel):
        text: str
        text_b: str | None = None

    class AttentionQuery(Texts):
        layer: int = Field(ge=0)
        heads: list[int] = Field(default_factory=list, max_length=256)
        kind: str = Field(default="attn", pattern="^(attn|rollout)$")

    app = FastAPI(title="bertscope", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_BodyLimit, limit=body_limit(max_chars),
                       detail=f"the request is too large: texts are limited to {max_chars} characters")
    app.state.analyzer = analyzer

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


def bind(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A listening TCP socket on host:port; InputError (one line) if the name does not resolve or
    the address cannot be bound (in use, not this machine's, no permission)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OverflowError) as e:
        raise InputError(f"cannot listen on {where} ({getattr(e, 'strerror', None) or e})") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is fine, a listener is not
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise InputError(f"cannot listen on {where} ({e.strerror or e})") from None
    sock.set_inheritable(True)
    return sock


def run(bert: Bert, host: str = "127.0.0.1", port: int = 8000, max_chars: int = DEFAULT_MAX_CHARS,
        log_level: str = "warning", sock: socket.socket | None = None) -> None:
    """Serve until interrupted, on ``sock`` if given (see :func:`bind`), else on host:port."""
    try:
        import uvicorn
    except ImportError:
        raise BertscopeError("serving needs FastAPI and uvicorn: pip install 'bertscope[serve]'") from None
    if sock is None:
        sock = bind(host, port)
    config = uvicorn.Config(create_app(bert, max_chars=max_chars), log_level=log_level)
    uvicorn.Server(config).run(sockets=[sock])
