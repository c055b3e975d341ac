"""``bertscope serve``: the attention explorer as a local web app. Needs the ``serve`` extra.

FastAPI is imported only inside :func:`create_app`, so ``import bertscope`` stays free of it.

Routes:
    GET  /                 the explorer page (server mode: it asks for numbers on demand)
    GET  /assets/NAME      a file of the package's asset folder, by exact name (an allow-list:
                           nothing outside the folder can be named, ``..`` included)
    GET  /api/health       {"status": "ok", "model": ...}: readiness
    POST /api/analyze      {"text", "text_b"?, "pair"?, "measures"?} -> tokens and words of each text,
                           the measures offered ({name, per_head, share}), and with "measures": [NAME,
                           ...] those measures' whole maps per text ("maps": shape + float32, base64)
    POST /api/attention    {"text", "text_b"?, "pair"?, "layer", "heads", "kind": "attn"|"rollout"|"measure",
                           "measure"?} -> only that layer's requested heads (float32, base64); a
                           per-layer measure's one map (and the rollout's) has head -1, and takes
                           no "heads" (ignored); "attn" needs at least one
    POST /api/qk           {"text", "text_b"?, "pair"?, "which", "layer", "head"} -> that head's
                           q, k and v (T x D each, float32, base64) for the query-key view

``text_b`` is a second text to compare; ``pair`` the second half of a sentence pair
([CLS] text [SEP] pair [SEP]). A text that is not a string, or not valid Unicode (a lone
surrogate), gets HTTP 422 with a one-line message; so do a key the route does not take (a
misspelt "heads" is not left to its default) and a whole number given as a string, a boolean or
a float (1.0; JSON.stringify writes whole numbers without a point). A blank
``text_b`` or ``pair`` is refused (400); null, or leaving the key out, means none.

Every request's Host header must name this server: a loopback name (localhost, 127.0.0.1,
[::1]), the address it was bound to, or a name given with ``allowed_hosts``; when bound to every
interface, also this machine's own names and any IP address. Anything else gets HTTP 421, so a
web page elsewhere cannot reach the server through DNS rebinding (a hostname of the attacker's
that resolves to 127.0.0.1).

Texts over ``max_chars`` characters get HTTP 413, and so does a request body over
24 x max_chars + 4096 bytes (two texts, every character JSON-escaped): the bytes actually
received are counted (a chunked body without a Content-Length included), and reading stops at
the limit. The model runs one computation at a time (PyTorch already uses every core for one),
on one thread, first come first served (in the order requests reach its queue, once a look in
the cache has found them missing there): a request waiting for it holds none of the
server's threads, so health, the page, its assets and cached answers are answered at once
however many wait. The last few analyses are cached: at most ``CACHE_ENTRIES`` (16) of them
and at most ``CACHE_BYTES`` (256 MiB) of attention arrays in all; an analysis larger than that
on its own is not cached. A request whose client goes away while it waits for the model (the
page aborts what it no longer wants: another measure's maps once a new one is shown, everything
of a text once another is asked for) computes nothing: it is dropped (logged at INFO) and
answered 499. A computation that has begun runs to its end and is cached (a comparison's
second text is not begun once its client has gone).

An answer of 500 bytes or more is gzip-compressed for a client that accepts it (Accept-Encoding:
gzip; every browser does): an analysis with every measure's maps is about 100 MB of JSON, whose
base64 floats compress by about a quarter (level 1: the higher levels gain under 2% for 40% more
time). A request target (path and query) over ``MAX_TARGET`` bytes gets HTTP 414, and headers over
``MAX_HEADERS`` bytes in all HTTP 431, both in the usual JSON shape; a request head over
``MAX_HEAD`` bytes arriving in pieces never reaches the application: uvicorn (h11) answers a
plain-text 400 and closes the connection, which a client still sending sees as a reset.

A request cut short because the server stops at once (a second Ctrl-C, or the graceful stop's
``stop_timeout`` passed) gets HTTP 503 in the usual JSON shape if its answer had not begun; one
whose answer had begun can only have its connection closed.

Measures other than the attention weights (norm, ALTI, ...) are computed by a function the caller
passes (``create_app(..., measures=compute, measure_info=[...])``; ``bertscope serve`` passes
``bertscope.explain``'s), one measure at a time when the page asks for it, and cached the same way.
"""

# No "from __future__ import annotations": FastAPI must see the request models defined inside
# create_app as real classes, not as strings it cannot resolve.

import asyncio
import base64
import contextlib
import contextvars
import ipaddress
import json
import logging
import re
import signal
import socket
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import BertscopeError, InputError

log = logging.getLogger(__name__)
from ..bert import Bert
from .report import ReportText, alignment_meta, analyze, render_page

__all__ = ["Analyzer", "MeasureFunction", "CACHE_BYTES", "CACHE_ENTRIES", "DEFAULT_MAX_CHARS", "LOOPBACK_NAMES",
           "allowed_host",
           "bind", "body_limit", "create_app", "is_all_interfaces", "require_serve_extra", "run"]

DEFAULT_MAX_CHARS = 2000
CACHE_ENTRIES = 16
CACHE_BYTES = 256 * 2**20  # attention arrays kept in the cache, all entries together
STOP_TIMEOUT = 10.0  # seconds a Ctrl-C waits for the requests running before it stops them
# a request target (path and query) and all header lines, in bytes: over these, 414 and 431. The
# page's own address keeps its query to 8,000 characters. A whole request head over MAX_HEAD is
# refused by uvicorn's parser (h11) before the application sees it (its default is 16 KiB, and
# a head that arrived in one read passed it whatever its size).
MAX_TARGET = 16 * 1024
MAX_HEADERS = 32 * 1024
MAX_HEAD = 64 * 1024
GZIP_MINIMUM = 500  # bytes: a smaller answer goes uncompressed
GZIP_LEVEL = 1
_CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                  ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain", "ip6-localhost"})
SERVE_HINT = "serving needs FastAPI and uvicorn: pip install 'bertscope[serve]'"


def threaded_gzip(middleware) -> bool:
    """Whether Starlette's GZipMiddleware compresses large answers in a worker thread (1.4.0
    added that, with its ``thread_minimum_size``; bertscope asks for 1.4.1, whose fix to that
    release's default the middleware does not need); before, it compressed on the event loop."""
    import inspect

    return "thread_minimum_size" in inspect.signature(middleware.__init__).parameters


def require_serve_extra() -> None:
    """Raise BertscopeError (one line, with the pip hint) unless FastAPI and uvicorn import."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise BertscopeError(SERVE_HINT) from None


def is_all_interfaces(host: str) -> bool:
    """True for an address that listens on every network interface (0.0.0.0, ::, empty)."""
    h = host.strip().strip("[]")
    if not h:
        return True
    try:
        return ipaddress.ip_address(h).is_unspecified
    except ValueError:
        return False


# a Host header: a name or an IPv4 address, or an IPv6 address in brackets, then an optional port
_HOST_HEADER = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+(?:%[\w.-]+)?)\]|(?P<name>[\w.-]+))(?::\d{0,5})?", re.ASCII)


def _host_name(header: str) -> str | None:
    """The name of a Host header, lower case, without its port or IPv6 brackets; None for a
    header that is not a host and port ("localhost:80@evil.example", "[::1" unclosed)."""
    m = _HOST_HEADER.fullmatch(header.strip().lower().replace("%25", "%"))  # a zone id, as URLs escape it
    if m is None:
        return None
    return m.group("v6") or m.group("name").rstrip(".")


def _bound_name(host: str) -> str:
    """An address or name given to bind or allow, as _host_name reads a header's."""
    return host.strip().strip("[]").lower().rstrip(".")


def allowed_host(header: str | None, bound: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether a request's Host header names this server (see the module docstring)."""
    if header is None:
        return True  # HTTP/1.0 without Host: not something a browser sends
    name = _host_name(header)
    if name is None:
        return False
    if name in LOOPBACK_NAMES or name == _bound_name(bound) or name in {_bound_name(x) for x in extra}:
        return True
    if is_all_interfaces(bound):
        try:
            ipaddress.ip_address(name)  # an address literal cannot be rebound to another origin
            return True
        except ValueError:
            pass
        own = {socket.gethostname().lower(), socket.getfqdn().lower()}
        return name in own
    return False


class _HostCheck:
    """ASGI middleware: answer 421 to a request whose Host header does not name this server."""

    def __init__(self, app, bound: str, extra: frozenset[str]) -> None:
        self.app, self.bound, self.extra = app, bound, extra

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            raw = dict(scope.get("headers") or []).get(b"host")
            header = None if raw is None else raw.decode("latin-1")
            if not allowed_host(header, self.bound, self.extra):
                names = ", ".join(sorted({"localhost", "127.0.0.1", "[::1]", self.bound, *self.extra}))
                body = json.dumps({"detail": f"this server answers only to {names}, not to Host {header!r} "
                                             "(a guard against DNS rebinding; bertscope serve --allow-host NAME "
                                             "adds a name)"}).encode()
                await send({"type": "http.response.start", "status": 421,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


# on every response: no type is guessed from a body, and no address of the page (with its text
# in ?text=) leaves with a request. Framing stays allowed: an editor's preview pane (VS Code's
# Simple Browser) shows a forwarded port in a frame, and nothing on the page changes state.
SAFE_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]


class _SafeHeaders:
    """ASGI middleware: adds SAFE_HEADERS to every HTTP response (421, 413 and 500 answers too)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_safe(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SAFE_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_safe)


async def _refuse(send, status: int, detail: str) -> None:
    """A JSON answer {"detail": ...} that closes the connection."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _refuses_gzip(accept: str) -> bool:
    """Whether an Accept-Encoding value names gzip with q=0 ("not acceptable", RFC 9110)."""
    for part in accept.split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip"):
            continue
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    return float(value) == 0
                except ValueError:
                    return False
    return False


class _GzipRefused:
    """ASGI middleware, outside Starlette's GZipMiddleware: that one compresses for any
    Accept-Encoding that contains "gzip", "gzip;q=0" (gzip refused) included. Such a request
    reaches it without the gzip entries."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = scope.get("headers") or []
            if any(k.lower() == b"accept-encoding" and _refuses_gzip(v.decode("latin-1")) for k, v in headers):
                kept = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"]
                others = [part for k, v in headers if k.lower() == b"accept-encoding"
                          for part in v.decode("latin-1").split(",") if "gzip" not in part.lower()]
                if others:
                    kept.append((b"accept-encoding", ",".join(others).encode("latin-1")))
                scope = {**scope, "headers": kept}
        await self.app(scope, receive, send)


class _HeadLimit:
    """ASGI middleware: 414 to a request target (path and query) over ``MAX_TARGET`` bytes, 431 to
    header lines over ``MAX_HEADERS`` bytes in all (as sent: name, ": ", value, CRLF)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope.get("path", "").encode("utf-8")
            query = scope.get("query_string") or b""
            target = len(raw) + (len(query) + 1 if query else 0)
            if target > MAX_TARGET:
                await _refuse(send, 414, f"the request's address is too long: {target:,} bytes; "
                                         f"the limit is {MAX_TARGET:,}")
                return
            size = sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or [])
            if size > MAX_HEADERS:
                await _refuse(send, 431, f"the request's headers are too large: {size:,} bytes; "
                                         f"the limit is {MAX_HEADERS:,}")
                return
        await self.app(scope, receive, send)


STOPPING_DETAIL = "the server is stopping: this request was cut short; send it again once it runs"


class _CutShort:
    """ASGI middleware: a request cancelled before its answer began gets HTTP 503 with a one-line
    ``detail``, not uvicorn's plain-text 500. Only a stop cancels a request here: a second
    Ctrl-C, or the graceful stop's time running out (see :func:`run`). An answer already begun
    cannot be replaced: uvicorn closes its connection. The cancellation goes on up either way."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        began = False

        async def send_noting(message) -> None:
            nonlocal began
            if message["type"] == "http.response.start":
                began = True
            await send(message)

        try:
            await self.app(scope, receive, send_noting)
        except asyncio.CancelledError:
            if not began:
                await _refuse(send, 503, STOPPING_DETAIL)
            raise


def _nbytes(result: list) -> int:
    return sum(x.nbytes if isinstance(x, np.ndarray) else
               x.attentions.nbytes + x.rollout.nbytes + (0 if x.qkv is None else x.qkv.nbytes) for x in result)


# compute(bert, text, pair, names) -> {name: (N, H, T, T) or (N, T, T) float32}
MeasureFunction = Callable[[Bert, str, "str | None", list], dict]


_GONE_POLL_S = 0.05  # how often a waiting request asks whether its client is still there


class Gone(Exception):
    """The client of a request went away before its computation began: nothing was computed."""


class Miss(Exception):
    """Asked for cached answers only (:meth:`Analyzer.only_cached`), and one was not cached."""


class Analyzer:
    """Thread-safe, cached ``analyze``: one forward pass at a time.

    The cache keeps the most recently used analyses, at most ``size`` of them and at most
    ``max_bytes`` bytes of attention arrays in all (float32 (N, H, T, T) per text: 144 MB for a
    512-token text on BERT-base); one analysis over ``max_bytes`` on its own is not cached. A
    cached result is answered at once, even while another request's computation runs (an ALTI
    map of 512 tokens takes seconds): only computations wait for each other.
    """

    def __init__(self, bert: Bert, size: int = CACHE_ENTRIES, max_bytes: int = CACHE_BYTES) -> None:
        self.bert = bert
        self.size = size
        self.max_bytes = max_bytes
        self.nbytes = 0  # bytes held by the cache now
        self._compute = threading.Lock()  # one computation at a time
        self._guard = threading.Lock()  # the cache's dict and byte count, held only briefly
        self._cache: OrderedDict[tuple, list] = OrderedDict()
        self._local = threading.local()  # .only: this thread takes cached answers only

    @contextlib.contextmanager
    def only_cached(self):
        """Within the block, on this thread, an analysis or measure not in the cache raises
        :class:`Miss` instead of being computed (the server answers from the cache without
        waiting for the model, and queues the rest)."""
        before = getattr(self._local, "only", False)
        self._local.only = True
        try:
            yield
        finally:
            self._local.only = before

    def __len__(self) -> int:
        return len(self._cache)

    def __call__(self, texts: list[str], pair: str | None = None,
                 gone: Callable[[], bool] | None = None) -> list[ReportText]:
        """The analyses of ``texts``, cached. ``gone()`` true (the client left) while this waits
        for another computation: :class:`Gone` is raised and nothing is computed."""
        key = (*texts, "\x00pair", pair) if pair is not None else tuple(texts)
        return self._cached(key, lambda: analyze(self.bert, list(texts), pair=pair, qk=True), gone)

    def measure(self, compute: MeasureFunction, name: str, texts: list[str],
                pair: str | None = None, gone: Callable[[], bool] | None = None) -> list[np.ndarray]:
        """One measure's maps of each text, ``compute(bert, text, pair, [name])[name]``, cached;
        ``gone`` as for a call (also asked between the texts of a comparison)."""
        key = (*texts, "\x00pair", pair, "\x00measure", name)

        def make() -> list[np.ndarray]:
            maps = []
            for i, t in enumerate(texts):
                if maps and gone is not None and gone():
                    raise Gone
                try:
                    maps.append(np.ascontiguousarray(compute(self.bert, t, pair, [name])[name], dtype=np.float32))
                except InputError as e:  # "this text has 202 tokens": say which, by the API's name for it
                    if len(texts) < 2:
                        raise
                    raise InputError(f"{'text_b' if i else 'text'}: {e}") from None
            return maps

        return self._cached(key, make, gone)

    def _hit(self, key: tuple) -> list | None:
        with self._guard:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def _cached(self, key: tuple, make: Callable[[], list], gone: Callable[[], bool] | None = None) -> list:
        hit = self._hit(key)
        if hit is not None:
            return hit
        if getattr(self._local, "only", False):
            raise Miss
        if gone is None:
            self._compute.acquire()
        else:  # wait for the computation running, asking now and then whether anyone still waits
            while not self._compute.acquire(timeout=_GONE_POLL_S):
                if gone():
                    raise Gone
        try:
            hit = self._hit(key)  # computed by the request this one waited for
            if hit is not None:
                return hit
            if gone is not None and gone():
                raise Gone
            result = make()
            size = _nbytes(result)
            if size > self.max_bytes or self.size < 1:
                return result  # too large to keep: computed again next time
            with self._guard:
                self._cache[key] = result
                self.nbytes += size
                while len(self._cache) > self.size or self.nbytes > self.max_bytes:
                    _, old = self._cache.popitem(last=False)
                    self.nbytes -= _nbytes(old)
            return result
        finally:
            self._compute.release()


def body_limit(max_chars: int) -> int:
    """Largest request body accepted, in bytes: two texts of max_chars and the rest. A character
    takes at most 12 bytes as JSON may escape it: one outside the BMP is two \\uXXXX escapes
    (Python's json.dumps escapes every non-ASCII character)."""
    return 2 * 12 * max_chars + 4096


class _BodyLimit:
    """ASGI middleware: reads the whole request body, counting the bytes as they arrive, and
    answers 413 as soon as they pass ``limit`` (whatever Content-Length says, or without one),
    and 422 to a body that is not UTF-8 (JSON over HTTP is UTF-8; texts must be Unicode); the
    application then gets the body already read."""

    def __init__(self, app, limit: int, detail: str) -> None:
        self.app, self.limit, self.detail = app, limit, detail

    async def _refuse(self, send, status: int = 413, detail: str | None = None) -> None:
        body = json.dumps({"detail": detail or self.detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError as e:
            await self._refuse(send, 422, f"the request is not UTF-8 text (byte 0x{body[e.start]:02x} at "
                                             f"position {e.start}): texts must be valid Unicode, sent as UTF-8")
            return
        why = _not_json(scope, bytes(body))
        if why is not None:
            await self._refuse(send, *why)
            return
        pending = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay():
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


POST_ROUTES = frozenset({"/api/analyze", "/api/attention", "/api/qk"})


def _not_json(scope, body: bytes) -> tuple[int, str] | None:
    """(status, why) for a POST whose body the API cannot read as JSON, else None. Said here, in
    one line: FastAPI would answer a body that is JSON but not labelled so with "Input should be
    a valid dictionary", and one nested too deep (or a number too long) with "There was an error
    parsing the body" (HTTP 400)."""
    if scope.get("method") != "POST" or scope.get("path") not in POST_ROUTES:  # 404 or 405 from the router
        return None
    if not body.strip():
        return 422, 'the request has no body: send a JSON object such as {"text": "..."}'
    # the first Content-Type, as FastAPI reads it (dict() would keep the last of two)
    kind = next((v for k, v in scope.get("headers") or [] if k.lower() == b"content-type"), b"")
    kind = kind.split(b";")[0].strip().lower()
    if kind != b"application/json" and not (kind.startswith(b"application/") and kind.endswith(b"+json")):
        shown = kind.decode("latin-1") or "none"
        return 415, f"send the request body as JSON, with Content-Type: application/json (it was {shown})"
    try:
        value = json.loads(body)
    except RecursionError:
        return 422, "the request body is not valid JSON (nested too deeply)"
    except ValueError as e:
        why = "a number with too many digits" if "digits" in str(e) else str(e)  # Python's limit, 4300
        return 422, f"the request body is not valid JSON ({why})"
    if not isinstance(value, dict):  # FastAPI: "Input should be a valid dictionary or object to extract fields from"
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        return 422, f'the request body is {kind}; send a JSON object such as {{"text": "..."}}'
    return None


def _asset_files() -> dict[str, Path]:
    folder = resources.files("bertscope.see").joinpath("assets")
    return {p.name: Path(str(p)) for p in folder.iterdir() if p.is_file()}


def create_app(bert: Bert, max_chars: int = DEFAULT_MAX_CHARS, *, host: str = "127.0.0.1",
               allowed_hosts: tuple[str, ...] = (), measures: MeasureFunction | None = None,
               measure_info: list[dict[str, Any]] | tuple = ()):
    """The FastAPI application serving ``bert``, answering to requests for ``host`` (the address
    it is bound to), the loopback names, and ``allowed_hosts``.

    ``measures`` and ``measure_info``: measures offered beside the attention, computed on demand
    by ``measures(bert, text, pair, names)``; ``measure_info`` lists them for the page
    ({"name", "per_head", "share"}).
    """
    try:
        from fastapi import FastAPI, HTTPException, Request
        from fastapi.concurrency import run_in_threadpool
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import HTMLResponse, JSONResponse, Response
        from pydantic import BaseModel, ConfigDict, Field
        from starlette.middleware.gzip import GZipMiddleware
    except ImportError:
        raise BertscopeError(SERVE_HINT) from None

    analyzer = Analyzer(bert)
    # every computation on one thread, first come first served: a request waiting for the model holds
    # no thread of the server's pool (health, the page and cached answers need one), waits its
    # turn rather than racing the others for the lock, and the model's memory stays in one heap
    # (glibc gives each thread that allocates its own: 40 requests on 40 threads held 3.8 GB)
    computing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertscope-model")
    # read once: the routes that serve them never wait for a thread or the disk (the page's
    # template, page.html, is not one of them)
    assets = {n: (p.read_bytes(), _CONTENT_TYPES.get(p.suffix, "application/octet-stream"))
              for n, p in _asset_files().items() if p.suffix != ".html"}
    page = render_page(None, mode="server")
    N, H = bert.config.num_hidden_layers, bert.config.num_attention_heads
    name = bert.name or (bert.path.name if bert.path else "BERT")

    class Texts(BaseModel):
        # a misspelt key is an error, not a default; true is not 1, nor "3" 3
        model_config = ConfigDict(extra="forbid", strict=True)

        text: str
        text_b: str | None = None
        pair: str | None = None

    class AnalyzeQuery(Texts):
        measures: list[str] = Field(default_factory=list, max_length=16)

    class AttentionQuery(Texts):
        layer: int = Field(ge=0)
        heads: list[int] = Field(default_factory=list, max_length=256)
        kind: str = Field(default="attn", pattern="^(attn|rollout|measure)$")
        measure: str | None = None

    class QKQuery(Texts):
        which: int = Field(default=0, ge=0, le=1)
        layer: int = Field(ge=0)
        head: int = Field(ge=0)

    # no redirect for a trailing slash: a script's POST to /api/analyze/ gets a 404 that says so
    app = FastAPI(title="bertscope", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    app.add_middleware(_BodyLimit, limit=body_limit(max_chars),
                       detail=f"the request is too large: texts are limited to {max_chars} characters")
    app.add_middleware(_HostCheck, bound=host, extra=frozenset(h.lower() for h in allowed_hosts))
    app.add_middleware(_HeadLimit)
    # around the whole stack, Starlette's own error middleware too (add_middleware puts one inside
    # it): a 500 for an unexpected failure gets the headers as well, and so do a compressed answer
    # and the 503 of a request cut short (inside _SafeHeaders; outside the compression, which
    # holds an answer's start until its body is compressed: a request cancelled meanwhile has
    # sent nothing yet)
    build_stack = app.build_middleware_stack
    if threaded_gzip(GZipMiddleware):
        app.build_middleware_stack = lambda: _SafeHeaders(_CutShort(_GzipRefused(
            GZipMiddleware(build_stack(), minimum_size=GZIP_MINIMUM, compresslevel=GZIP_LEVEL))))
    else:  # an older Starlette would compress on the event loop: every other request would wait
        log.warning("answers go uncompressed: this Starlette compresses on the server's event loop; "
                    "pip install 'starlette>=1.4.1' compresses large answers in a worker thread")
        app.build_middleware_stack = lambda: _SafeHeaders(_CutShort(build_stack()))
    app.state.analyzer = analyzer
    app.state.computing = computing

    @app.exception_handler(BertscopeError)
    async def user_error(request: Request, exc: BertscopeError):
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        # one line for the page to show: where, and what is wrong ("text: Input should be a valid string")
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "the request"
        msg = first.get("msg", "is not valid")
        if first.get("type") == "json_invalid":
            msg = "the request body is not valid JSON (" + str(first.get("ctx", {}).get("error", "")) + ")"
            where = ""
        return JSONResponse({"detail": f"{where}: {msg}" if where else msg}, status_code=422)

    def texts_of(q: Texts) -> tuple[list[str], str | None]:
        for what, t in (("text_b", q.text_b), ("pair", q.pair)):
            if t is not None and not t.strip():  # given, and blank: say so (null leaves it out)
                raise HTTPException(400, f"the {what} is empty (send null, or leave it out, for none)")
        if q.pair is not None and q.text_b is not None:
            raise HTTPException(400, "give text_b (a text to compare) or pair (a sentence pair), not both")
        pair = q.pair
        texts = [q.text] if q.text_b is None else [q.text, q.text_b]
        named = [("text", q.text)] + ([("text_b", texts[1])] if len(texts) > 1 else []) + ([("pair", pair)] if pair else [])
        for what, t in named:
            if len(t) > max_chars:
                raise HTTPException(413, f"the {what} has {len(t):,} characters; the limit is {max_chars:,}")
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:
                raise HTTPException(422, f"{what} is not valid Unicode text ({e.reason} at character {e.start})") from None
            if not t.strip():
                raise HTTPException(400, f"the {what} is empty")
        return texts, pair

    # these four answer on the event loop (async, nothing to compute): never behind the requests
    # that wait for the model or a worker thread
    @app.api_route("/", response_class=HTMLResponse, methods=["GET", "HEAD"])
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.api_route("/assets/{name:path}", methods=["GET", "HEAD"])
    async def asset(name: str) -> Response:
        found = assets.get(name)  # exact names only: "../x", "a/b" and "%2e%2e%2f" are not keys
        if found is None:
            raise HTTPException(404, "no such asset")
        return Response(found[0], media_type=found[1])

    @app.api_route("/favicon.ico", methods=["GET", "HEAD"])
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.api_route("/api/health", methods=["GET", "HEAD"])
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": name, "layers": N, "heads": H, "max_chars": max_chars}

    offered = {m["name"]: dict(m) for m in measure_info} if measures is not None else {}

    def measure_of(m: str | None) -> dict[str, Any]:
        if m not in offered:
            names = ", ".join(offered) or "none (only the attention weights)"
            raise HTTPException(400, f"unknown measure {m!r}; this server offers: {names}")
        return offered[m]

    async def for_client(request: Request, work: Callable[[Callable[[], bool]], Any]) -> Any:
        """``work(gone)``'s answer: first from the cache alone, in a worker thread (at once, even
        while the model computes for another request); if it needs the model, on the one thread
        that computes, first come first served (see ``computing``). ``gone()`` turns true once the
        client has gone (a page that moved on aborts its fetch), so a request still waiting for
        the model when its page no longer wants it computes nothing (an ALTI map of 512 tokens
        takes seconds, and every request queued behind it waited too). The answer is made JSON
        in that thread too: 100 MB of it took the event loop for a quarter of a second."""
        left = threading.Event()

        def answer(gone: Callable[[], bool]) -> JSONResponse:
            return JSONResponse(work(gone))

        def from_cache(gone: Callable[[], bool]) -> JSONResponse:
            with analyzer.only_cached():
                return answer(gone)

        async def watch() -> None:
            try:
                while not await request.is_disconnected():
                    await asyncio.sleep(_GONE_POLL_S)
            except Exception:  # noqa: BLE001 -- cannot tell: the request is taken as still wanted
                log.debug("%s: could not watch the client", request.url.path, exc_info=True)
                return
            left.set()

        watcher = asyncio.ensure_future(watch())  # not a task group: it would wrap the route's own errors
        try:
            try:
                return await run_in_threadpool(from_cache, left.is_set)
            except Miss:
                pass
            queued = computing.submit(contextvars.copy_context().run, answer, left.is_set)
            try:
                done = asyncio.wrap_future(queued)
                await asyncio.wait({done, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if not done.done() and left.is_set() and queued.cancel():  # its client left while it waited its turn
                    raise Gone
                return await done  # begun: it computes to its end (or says Gone itself, not begun)
            except asyncio.CancelledError:  # a stop at once: one not begun never begins
                queued.cancel()
                raise
        except Gone:
            log.info("%s: the client went away before its computation began; dropped", request.url.path)
            return Response(status_code=499)  # nginx's "client closed request": no one reads it
        finally:
            watcher.cancel()

    @app.post("/api/analyze")
    async def analyze_route(q: AnalyzeQuery, request: Request) -> Any:
        return await for_client(request, lambda gone: analyze_answer(q, gone))

    def analyze_answer(q: AnalyzeQuery, gone: Callable[[], bool]) -> dict[str, Any]:
        texts, pair = texts_of(q)
        wanted = [measure_of(m)["name"] for m in dict.fromkeys(q.measures)]
        result = analyzer(texts, pair, gone)
        meta = {"model": name, "layers": N, "heads": H, "texts": [t.meta() for t in result]}
        if len(result) == 2:
            meta["alignment"] = alignment_meta(*result)
        if offered:
            meta["measures"] = list(offered.values())
        if wanted:
            meta["maps"] = [{"text": t, "measure": m, "shape": list(M.shape), "data": _b64(M)}
                            for m in wanted for t, M in enumerate(analyzer.measure(measures, m, texts, pair, gone))]
        return meta

    @app.post("/api/attention")
    async def attention_route(q: AttentionQuery, request: Request) -> Any:
        return await for_client(request, lambda gone: attention_answer(q, gone))

    def attention_answer(q: AttentionQuery, gone: Callable[[], bool]) -> dict[str, Any]:
        texts, pair = texts_of(q)
        if q.layer >= N:
            raise HTTPException(400, f"layer must be 0..{N - 1}, got {q.layer}")
        bad = [h for h in q.heads if not 0 <= h < H]
        if bad:
            raise HTTPException(400, f"heads must be 0..{H - 1}, got {bad[0]}")
        if not q.heads and q.kind == "attn":  # an answer with no matrices would look like a result
            raise HTTPException(400, f'kind "attn" needs "heads": the heads to return, a list of 0..{H - 1}')
        if q.kind == "measure" and q.measure is None:
            raise HTTPException(400, 'kind "measure" needs "measure": one of '
                                     + (", ".join(offered) or "none (this server offers no measures)"))
        if q.kind != "measure" and q.measure is not None:
            raise HTTPException(400, f'"measure" goes with kind "measure", not "{q.kind}"')
        result = analyzer(texts, pair, gone)
        out = []
        if q.kind == "measure":
            info = measure_of(q.measure)
            for t, M in enumerate(analyzer.measure(measures, info["name"], texts, pair, gone)):
                if info["per_head"]:
                    out += [{"text": t, "head": h, "data": _b64(M[q.layer, h])} for h in dict.fromkeys(q.heads)]
                else:
                    out.append({"text": t, "head": -1, "data": _b64(M[q.layer])})
            return {"layer": q.layer, "kind": q.kind, "measure": info["name"],
                    "tokens": [len(rt.tokens) for rt in result], "matrices": out}
        for t, rt in enumerate(result):
            if q.kind == "rollout":
                out.append({"text": t, "head": -1, "data": _b64(rt.rollout[q.layer])})
            else:
                for h in dict.fromkeys(q.heads):
                    out.append({"text": t, "head": h, "data": _b64(rt.attentions[q.layer, h])})
        return {"layer": q.layer, "kind": q.kind,
                "tokens": [len(rt.tokens) for rt in result], "matrices": out}

    @app.post("/api/qk")
    async def qk_route(q: QKQuery, request: Request) -> Any:
        return await for_client(request, lambda gone: qk_answer(q, gone))

    def qk_answer(q: QKQuery, gone: Callable[[], bool]) -> dict[str, Any]:
        texts, pair = texts_of(q)
        if q.layer >= N:
            raise HTTPException(400, f"layer must be 0..{N - 1}, got {q.layer}")
        if q.head >= H:
            raise HTTPException(400, f"head must be 0..{H - 1}, got {q.head}")
        result = analyzer(texts, pair, gone)
        if q.which >= len(result):
            raise HTTPException(400, f"which must be 0..{len(result) - 1}, got {q.which}")
        qkv = result[q.which].qkv  # (3, N, H, T, D)
        return {"layer": q.layer, "head": q.head, "tokens": int(qkv.shape[3]), "head_size": int(qkv.shape[4]),
                "q": _b64(qkv[0, q.layer, q.head]), "k": _b64(qkv[1, q.layer, q.head]),
                "v": _b64(qkv[2, q.layer, q.head])}

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
        log_level: str = "warning", sock: socket.socket | None = None,
        allowed_hosts: tuple[str, ...] = (), measures: MeasureFunction | None = None,
        measure_info: list[dict[str, Any]] | tuple = (), stop_timeout: float | None = STOP_TIMEOUT) -> None:
    """Serve until interrupted, on ``sock`` if given (see :func:`bind`; ``host`` is then the
    address it is bound to), else on host:port.

    A Ctrl-C (or SIGTERM) stops it once the requests open are done (computing, or sending an
    answer their client has not yet taken), waiting at most ``stop_timeout`` seconds (None: as
    long as they take); the call then raises KeyboardInterrupt (SIGTERM: whatever its handler
    does; Python's default ends the process). A second one, or the time running out, stops it at
    once, raising :class:`StoppedAtOnce` (``.signal`` says which): leave with ``os._exit`` then,
    not to wait for the computations it cut short. A stop that waits for requests, or cuts them
    short, says so in one line (a warning)."""
    try:
        import uvicorn
    except ImportError:
        raise BertscopeError(SERVE_HINT) from None
    if sock is None:
        sock = bind(host, port)
    app = create_app(bert, max_chars=max_chars, host=host, allowed_hosts=allowed_hosts,
                     measures=measures, measure_info=measure_info)
    # a caller whose logging is set up (the CLI's "bertscope: warning: ..." lines) gets uvicorn's
    # records there (a malformed request's warning); one without keeps uvicorn's own format, and
    # its "Uvicorn running on ..." at log_level "info"
    own = uvicorn.config.LOGGING_CONFIG if not logging.getLogger().handlers else None
    # h11, not httptools where it is installed: the head limit below is h11's setting
    config = uvicorn.Config(app, log_level=log_level, log_config=own, http="h11",
                            h11_max_incomplete_event_size=MAX_HEAD)
    quiet = _QuietWhenForced()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(quiet)
    server = _stopping_server(uvicorn, quiet, stop_timeout)(config)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        if quiet.forced:
            raise StoppedAtOnce(quiet.forced_by) from None
        raise
    finally:
        uvicorn_log.removeFilter(quiet)
    # uvicorn raises the signal that stopped it again once it is done, for the caller to act on;
    # a SIGINT can land in asyncio's own handler then and be lost: the server returned as if
    # nothing had stopped it, a second Ctrl-C's stop exited 0 after waiting for what it cut short
    if quiet.forced:
        raise StoppedAtOnce(quiet.forced_by)
    if server.stopped_by == signal.SIGINT:
        raise KeyboardInterrupt


class StoppedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C (or SIGTERM) stopped the server without waiting for the requests running.
    Their computations go on in worker threads that the interpreter would wait for at exit: a
    process that ends here should leave with ``os._exit`` (``bertscope serve`` does; it has
    nothing unwritten). ``signal``: the signal that stopped it at once."""

    def __init__(self, sig: int = signal.SIGINT) -> None:
        super().__init__()
        self.signal = sig


class _QuietWhenForced(logging.Filter):
    """Once a second Ctrl-C has stopped the server at once, what it cut short is not a failure
    to report: uvicorn logs each request's CancelledError, and the app's lifespan's, as errors
    with tracebacks. The stop itself is said once (see :func:`_stopping_server`)."""

    def __init__(self) -> None:
        super().__init__()
        self.forced = False
        self.forced_by = signal.SIGINT

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.forced or record.levelno < logging.ERROR


def _open_requests(state) -> int:
    """The requests a graceful stop waits for: those being read or computed, and those answered
    but not yet taken by their client (the answer waits in the connection's buffer: a client that
    does not read a large answer holds the stop as long as it keeps its connection). An idle
    keep-alive connection is not one: the stop closes it at once."""
    n = 0
    for conn in state.connections:
        cycle, transport = getattr(conn, "cycle", None), getattr(conn, "transport", None)
        try:
            unsent = transport is not None and transport.get_write_buffer_size() > 0
        except (AttributeError, NotImplementedError, RuntimeError):
            unsent = False
        if unsent or (cycle is not None and not getattr(cycle, "response_complete", True)):
            n += 1
    return max(n, len(state.tasks))  # a request's task runs on its connection: never more tasks


def _drop_unsent(state) -> None:
    """A stop at once: close the connections whose answers are complete but not yet taken (it
    does not wait for a client that does not read), and cancel the requests still running, whose
    503 (_CutShort) then closes their connections. From Python 3.12.1, uvicorn's stop waits in
    ``asyncio.Server.wait_closed`` for every connection to close: a request left computing held
    it to the end of its computation, whatever the second Ctrl-C or the time limit said."""
    for conn in list(state.connections):
        cycle, transport = getattr(conn, "cycle", None), getattr(conn, "transport", None)
        if transport is not None and cycle is not None and getattr(cycle, "response_complete", False):
            transport.abort()
    for task in list(state.tasks):
        task.cancel()


def _seconds(s: float) -> str:
    return f"{s:g} s"


def _stopping_server(uvicorn, quiet: _QuietWhenForced, stop_timeout: float | None = STOP_TIMEOUT):
    """uvicorn's Server, saying what a stop waits for: on the first Ctrl-C (or SIGTERM) it
    finishes the requests open, which can take seconds (an ALTI map of 512 tokens), and said
    nothing meanwhile; a second Ctrl-C stops it at once, and so does ``stop_timeout`` seconds
    passing (None: no limit). uvicorn's own timeout_graceful_shutdown is not used: it cancels the
    requests, logging each as an error with its traceback, and returns as if the stop were a
    graceful one, so that the process then waits at exit for the computations it cut short."""

    class StoppingServer(uvicorn.Server):
        stopped_by: int | None = None  # the signal that began the stop

        def handle_exit(self, sig: int, frame) -> None:
            running = _open_requests(self.server_state)
            if self.should_exit:  # a second Ctrl-C, or SIGTERM (uvicorn forces on SIGINT only)
                self._force(sig)
                if running:
                    log.warning("stopped with %d request(s) unfinished", running)
            else:
                self.stopped_by = sig
                if running:
                    within = "" if stop_timeout is None else f"up to {_seconds(stop_timeout)} "
                    log.warning("stopping: waiting %sfor %d request(s) to finish (Ctrl-C again stops at once)",
                                within, running)
            super().handle_exit(sig, frame)

        def _force(self, sig: int) -> None:
            quiet.forced, quiet.forced_by = True, sig
            self.force_exit = True
            try:  # from a signal handler too: the loop closes them, not the handler
                asyncio.get_running_loop().call_soon_threadsafe(_drop_unsent, self.server_state)
            except RuntimeError:
                pass  # no loop running: nothing to close

        def _time_up(self) -> None:
            running = _open_requests(self.server_state)
            if self.force_exit or not running:  # none left: the graceful stop ends on its own
                return
            self._force(self.stopped_by or signal.SIGINT)
            log.warning("stopped after %s with %d request(s) unfinished", _seconds(stop_timeout), running)

        async def shutdown(self, sockets=None) -> None:
            timer = None
            if stop_timeout is not None and not self.force_exit:
                timer = asyncio.get_running_loop().call_later(stop_timeout, self._time_up)
            try:
                await super().shutdown(sockets=sockets)
            finally:
                if timer is not None:
                    timer.cancel()

    return StoppingServer
