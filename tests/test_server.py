"""bertscope serve over real HTTP: limits, path traversal, bad requests, concurrency."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import urllib.parse
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from conftest import IT_ANIMAL
from viewkit import served

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server():
    with served("--max-chars", "2000") as base:
        yield base


def request(base: str, method: str, path: str, body=None, raw: bytes | None = None, timeout=60,
            host: str | None = None, content_type: str = "application/json"):
    """One HTTP request with the path sent exactly as given (no client-side normalisation);
    ``host``: the Host header to send instead of the server's address."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Content-Type": content_type}
        if host is not None:
            headers["Host"] = host
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        payload = r.read()
        try:
            return r.status, json.loads(payload)
        except ValueError:
            return r.status, payload
    finally:
        conn.close()


def exchange(base: str, method: str, path: str, body=None, headers: dict | None = None, timeout=60):
    """One HTTP request: (status, headers with lower-case names, the body's bytes as sent)."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


SAFE = {"x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


def test_binds_loopback_and_serves_the_page(server):
    assert server.startswith("http://127.0.0.1:")
    status, page = request(server, "GET", "/")
    assert status == 200 and b'"mode":"server"' in page and b"assets/bertscope.js" in page
    assert request(server, "GET", "/assets/bertscope.js")[0] == 200
    assert request(server, "GET", "/assets/bertscope.css")[0] == 200


@pytest.mark.parametrize("path", [
    "/assets/../pyproject.toml", "/assets/../../etc/passwd", "/assets/%2e%2e%2fserver.py",
    "/assets/%2e%2e/%2e%2e/etc/passwd", "/assets/..%2f..%2fetc%2fpasswd", "/assets//etc/passwd",
    "/assets/%2Fetc%2Fpasswd", "/../etc/passwd", "/assets/nothing.js", "/assets/",
])
def test_no_path_traversal(server, path):
    status, body = request(server, "GET", path)
    assert status == 404, (path, status)
    assert b"root:" not in (body if isinstance(body, bytes) else json.dumps(body).encode())


def test_oversize_text_gets_413(server):
    status, body = request(server, "POST", "/api/analyze", {"text": "a " * 1001})
    assert status == 413 and "2,000" in body["detail"]
    status, _ = request(server, "POST", "/api/attention", {"text": "ok", "text_b": "b" * 2001, "layer": 0, "heads": [0]})
    assert status == 413
    status, _ = request(server, "POST", "/api/analyze", raw=b'{"text": "' + b"x" * 100_000 + b'"}')
    assert status == 413


def test_texts_within_the_limit_pass_however_json_escapes_them(server):
    """json.dumps (and requests' json=) escapes every non-ASCII character: 6 bytes each, 12 for
    one outside the BMP. The body limit was 8 bytes per character, so these got 413."""
    assert request(server, "POST", "/api/analyze", {"text": "\U0001F600" * 1700})[0] == 200
    status, body = request(server, "POST", "/api/analyze", {"text": "\u00e9" * 1800, "text_b": "\u00e8" * 1800})
    assert status == 200 and len(body["texts"]) == 2
    assert request(server, "POST", "/api/analyze", {"text": "\U0001F600" * 2001})[0] == 413  # the limit holds


@pytest.mark.parametrize("method, path, kwargs, status, detail", [
    ("POST", "/api/analyze", {"raw": b""}, 422, 'the request has no body: send a JSON object such as {"text": "..."}'),
    ("POST", "/api/analyze", {"raw": b'{"text": "hi"}', "content_type": "application/x-www-form-urlencoded"}, 415,
     "send the request body as JSON, with Content-Type: application/json (it was application/x-www-form-urlencoded)"),
    ("POST", "/api/attention", {"body": {"text": "hi", "layer": 0, "kind": "measure"}}, 400,
     'kind "measure" needs "measure": one of norm, norm-residual, value-zeroing, alti'),
    ("POST", "/api/attention", {"body": {"text": "hi", "layer": 0, "heads": [0], "measure": "norm"}}, 400,
     '"measure" goes with kind "measure", not "attn"'),
    ("POST", "/api/attention", {"raw": b'{"text": "hi", "layer": ' + b"1" * 5001 + b"}"}, 422,
     "the request body is not valid JSON (a number with too many digits)"),
    ("POST", "/api/qk", {"raw": b"[" * 5000 + b"]" * 5000}, 422, "the request body is not valid JSON (nested too deeply)"),
    ("POST", "/api/analyze", {"raw": b'["hi"]'}, 422, 'the request body is an array; send a JSON object such as {"text": "..."}'),
    ("POST", "/api/analyze", {"raw": b'"hi"'}, 422, 'the request body is a string; send a JSON object such as {"text": "..."}'),
    ("POST", "/api/analyze", {"raw": b"null"}, 422, 'the request body is null; send a JSON object such as {"text": "..."}'),
    ("POST", "/api/analyze", {"raw": b"3"}, 422, 'the request body is a number; send a JSON object such as {"text": "..."}'),
    ("POST", "/api/attention", {"body": {"text": "hi", "layer": 0}}, 400,
     'kind "attn" needs "heads": the heads to return, a list of 0..11'),
    ("POST", "/api/analyze/", {"body": {"text": "hi"}}, 404, "Not Found"),  # not a 307 with no body
    ("GET", "/assets/page.html", {}, 404, "no such asset"),  # the page's template, not an asset
])
def test_requests_the_api_cannot_read_say_why(server, method, path, kwargs, status, detail):
    """Before: "Field required", "Input should be a valid dictionary", "There was an error parsing
    the body" (HTTP 400), "unknown measure None", and a measure silently ignored."""
    assert request(server, method, path, **kwargs) == (status, {"detail": detail})


def test_head_is_answered_where_get_is_and_post_elsewhere_is_405(server):
    for path in ("/", "/api/health", "/assets/bertscope.js"):
        assert request(server, "HEAD", path)[0] == 200, path  # was 405
    assert request(server, "POST", "/", raw=b"")[0] == 405  # not "the request has no body"
    for kind in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.bertscope+json"):
        assert request(server, "POST", "/api/analyze", {"text": "hi"}, content_type=kind)[0] == 200, kind


def test_bad_requests_do_not_take_it_down(server):
    assert request(server, "POST", "/api/analyze", raw=b"not json")[0] == 422
    assert request(server, "POST", "/api/analyze", {"txt": "x"})[0] == 422
    assert request(server, "POST", "/api/analyze", {"text": "   "})[0] == 400
    assert request(server, "POST", "/api/attention", {"text": "x", "layer": 99, "heads": [0]})[0] == 400
    assert request(server, "POST", "/api/attention", {"text": "x", "layer": 0, "heads": [-1]})[0] == 400
    assert request(server, "POST", "/api/attention", {"text": "x", "layer": -1, "heads": [0]})[0] == 422
    assert request(server, "POST", "/api/attention", {"text": "x", "layer": 0, "kind": "evil"})[0] == 422
    assert request(server, "GET", "/api/health")[0] == 200


def _decode(b64: str, T: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4").reshape(T, T)


def test_fifty_concurrent_requests_all_correct(server, bert, hf_model):
    texts = [f"{IT_ANIMAL} ({k % 10} times)" for k in range(50)]  # 10 distinct texts, each asked 5 times
    refs = {}
    for t in set(texts):
        b = bert.encode([t])
        with torch.inference_mode():
            out = hf_model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_attentions=True)
        refs[t] = [a[0].numpy() for a in out.attentions]

    def ask(k: int):
        layer, head = k % 6, (7 * k) % 12
        status, body = request(server, "POST", "/api/attention",
                               {"text": texts[k], "layer": layer, "heads": [head]}, timeout=120)
        return k, layer, head, status, body

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(ask, range(50)))
    for k, layer, head, status, body in results:
        assert status == 200, body
        [m] = body["matrices"]
        assert m["head"] == head and body["layer"] == layer
        T = body["tokens"][0]
        np.testing.assert_allclose(_decode(m["data"], T), refs[texts[k]][layer][head], atol=1e-5)
    assert request(server, "GET", "/api/health")[0] == 200


def test_only_the_requested_heads_travel(server):
    status, body = request(server, "POST", "/api/attention", {"text": IT_ANIMAL, "layer": 2, "heads": [4, 9]})
    assert status == 200 and sorted(m["head"] for m in body["matrices"]) == [4, 9]
    status, body = request(server, "POST", "/api/attention", {"text": IT_ANIMAL, "layer": 2, "kind": "rollout"})
    assert status == 200 and [m["head"] for m in body["matrices"]] == [-1]


def _chunked_post(base: str, path: str, total: int, chunk: int = 65536) -> tuple[int, bytes]:
    """POST ``total`` bytes with Transfer-Encoding: chunked (no Content-Length), sending from a
    thread while this one reads the answer (a server that stops reading must still answer)."""
    import socket
    import threading

    u = urllib.parse.urlsplit(base)
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    head = (f"POST {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    # a short text and long JSON whitespace: only the byte count can refuse it, not the text check
    body = b'{"text": "ok"' + b" " * (total - 14) + b'}'

    def send():
        try:
            sock.sendall(head)
            for i in range(0, len(body), chunk):
                part = body[i:i + chunk]
                sock.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed before the rest arrived: fine

    t = threading.Thread(target=send, daemon=True)
    t.start()
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    finally:
        t.join(timeout=60)
        sock.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data


def test_chunked_oversize_body_gets_413(server):
    status, data = _chunked_post(server, "/api/analyze", 5_000_000)
    assert status == 413, data[:200]
    # a small chunked body is still read and answered
    status, data = _chunked_post(server, "/api/analyze", 1000)
    assert status == 200, data[:200]
    assert request(server, "GET", "/api/health")[0] == 200


def test_analyzer_cache_is_bounded_by_bytes(bert):
    from bertscope.see.server import CACHE_BYTES, Analyzer

    assert CACHE_BYTES == 256 * 2**20
    texts = [f"{IT_ANIMAL} ({k} times)" for k in range(6)]
    size = lambda rt: rt.attentions.nbytes + rt.rollout.nbytes + rt.qkv.nbytes  # noqa: E731  (q, k, v kept for /api/qk)
    one = sum(size(rt) for rt in Analyzer(bert, max_bytes=0)([texts[0]]))
    a = Analyzer(bert, size=16, max_bytes=int(2.5 * one))
    for t in texts:
        a([t])
        held = sum(size(rt) for v in a._cache.values() for rt in v)
        assert held == a.nbytes <= a.max_bytes
    assert len(a) == 2  # only the last two fit in 2.5 texts' worth
    assert list(a._cache) == [(texts[4],), (texts[5],)]
    assert a([texts[5]]) is a([texts[5]])  # a hit returns the cached analysis
    tiny = Analyzer(bert, max_bytes=one - 1)  # an analysis larger than the bound is not kept
    tiny([texts[0]])
    assert len(tiny) == 0 and tiny.nbytes == 0


def test_a_cached_answer_does_not_wait_for_another_requests_computation(bert):
    """The cache was read inside the computation's lock: a cached text's attention took 7.8 s
    instead of 0.01 while another request's ALTI map was computed."""
    import threading

    from bertscope.see.server import Analyzer

    a = Analyzer(bert)
    started, release = threading.Event(), threading.Event()

    def slow(b, text, pair, names):
        started.set()
        assert release.wait(600)  # longer than the reader's guard below: only the test releases it
        return {names[0]: np.zeros((1, 2, 2), np.float32)}

    cached = a([IT_ANIMAL])
    busy = threading.Thread(target=a.measure, args=(slow, "alti", [IT_ANIMAL]))
    busy.start()
    try:
        assert started.wait(60)
        answers = []
        reader = threading.Thread(target=lambda: answers.append(a([IT_ANIMAL])))
        reader.start()
        reader.join(30)  # a guard against a hang, not a timing: it returns while `slow` still waits
        assert not reader.is_alive() and busy.is_alive() and not release.is_set()
        assert answers[0] is cached
    finally:
        release.set()
        busy.join(60)
    # a request that waited for the same computation takes its result, computing nothing again
    calls = []
    a.measure(lambda b, t, p, n: calls.append(t) or {n[0]: np.ones((1, 2, 2), np.float32)}, "norm", ["x"])
    a.measure(lambda b, t, p, n: calls.append(t) or {n[0]: np.ones((1, 2, 2), np.float32)}, "norm", ["x"])
    assert calls == ["x"]


def test_a_request_whose_client_left_while_it_waited_computes_nothing(bert):
    """Requests wait for the model one at a time. One whose client has gone (gone() true) stops
    waiting and computes nothing; one still wanted computes as before."""
    import threading

    from bertscope.see.server import Analyzer, Gone

    a = Analyzer(bert)
    started, release, calls = threading.Event(), threading.Event(), []

    def measure(b, text, pair, names):
        calls.append(names[0])
        if names[0] == "alti":
            started.set()
            assert release.wait(600)
        return {names[0]: np.zeros((1, 2, 2), np.float32)}

    busy = threading.Thread(target=a.measure, args=(measure, "alti", [IT_ANIMAL]))
    busy.start()
    try:
        assert started.wait(60)
        left = threading.Event()
        errors = []
        waiting = threading.Thread(target=lambda: _catch(errors, a.measure, measure, "norm", [IT_ANIMAL], None,
                                                         left.is_set))
        waiting.start()
        left.set()  # its client goes while "alti" still runs
        waiting.join(60)
        assert not waiting.is_alive() and [type(e) for e in errors] == [Gone]
    finally:
        release.set()
        busy.join(60)
    assert calls == ["alti"]
    a.measure(measure, "norm", [IT_ANIMAL], None, lambda: False)  # a client still there: computed
    assert calls == ["alti", "norm"]
    with pytest.raises(Gone):  # a comparison stops between its two texts
        a.measure(measure, "value-zeroing", ["one", "two"], None, lambda: bool(calls.count("value-zeroing")))
    assert calls == ["alti", "norm", "value-zeroing"]


def _catch(errors: list, f, *args):
    try:
        f(*args)
    except Exception as e:  # noqa: BLE001 -- handed to the test thread to check
        errors.append(e)


def _serve_measuring(tmp_path, measure: str, *args: str):
    """`bertscope serve ARGS` in a subprocess whose explain.map_measures is ``measure`` (Python
    source defining ``measure(b, text, wanted, pair=None)``). Returns (process, stderr file,
    base URL) once it listens; the caller stops the process."""
    import os
    import re
    import time

    code = ("import importlib, pathlib, sys, time\n"
            "import numpy as np\n"
            "ex = importlib.import_module('bertscope.explain')  # the package, not bertscope.explain()\n"
            f"{measure}\n"
            "ex.map_measures = measure\n"
            "from bertscope.cli.app import main\n"
            f"sys.exit(main(['serve', '--port', '0', *{list(args)!r}]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    err_path = tmp_path / "err.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stderr=err, stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while not (m := re.search(r"on (http://\S+?)/ ", err_path.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the server did not start: {err_path.read_text()}")
        time.sleep(0.1)
    return proc, err_path, m.group(1)


def test_a_measure_request_dropped_by_its_page_is_not_computed(tmp_path):
    """The page moves on (another measure, another text) and aborts its fetch; the request it
    left kept its place in the queue for the model and computed a map nobody would read (an ALTI
    map of 512 tokens takes seconds), and every later request waited behind it."""
    import socket
    import time

    calls, release = tmp_path / "calls.txt", tmp_path / "release"
    proc, err_path, base = _serve_measuring(tmp_path, (
        "def measure(b, text, wanted, pair=None):\n"
        f"    with open({str(calls)!r}, 'a') as f: f.write(wanted[0] + '\\n')\n"
        f"    while wanted[0] == 'alti' and not pathlib.Path({str(release)!r}).exists():\n"
        "        time.sleep(0.02)\n"
        "    return {wanted[0]: np.zeros((6, 4, 4), np.float32)}"), "--debug")
    try:
        deadline = time.monotonic() + 120

        def wait_for(check, what: str) -> None:  # a guard against a hang, not a timing
            while not check():
                assert proc.poll() is None and time.monotonic() < deadline, (what, err_path.read_text())
                time.sleep(0.05)

        ask = lambda m: {"text": IT_ANIMAL, "layer": 0, "heads": [0], "kind": "measure", "measure": m}  # noqa: E731
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(request, base, "POST", "/api/attention", ask("alti"), None, 120)
            wait_for(lambda: calls.exists() and "alti" in calls.read_text(), "the first computation")
            u = urllib.parse.urlsplit(base)
            body = json.dumps(ask("norm-residual")).encode()
            with socket.create_connection((u.hostname, u.port), timeout=60) as sock:  # sent, then left
                sock.sendall(f"POST /api/attention HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json"
                             f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                # answered after the request above was read: it is waiting for the model, not unread
                assert request(base, "GET", "/api/health")[0] == 200
            wait_for(lambda: "the client went away before its computation began; dropped" in err_path.read_text(),
                     "the dropped request")
            release.write_text("x")
            assert first.result(60)[0] == 200
        assert request(base, "POST", "/api/attention", ask("value-zeroing"))[0] == 200
        assert calls.read_text().split() == ["alti", "value-zeroing"]  # nothing for the request left behind
    finally:
        proc.kill()
        proc.wait(60)


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_says_what_the_stop_waits_for_and_a_second_stops_without_tracebacks(tmp_path, stop):
    """A Ctrl-C during a long request waited silently; a second printed two uvicorn tracebacks
    and then waited for the computation anyway. A second SIGTERM was ignored: the server waited
    for the computation. The request it cut short got uvicorn's plain-text 500 ("Internal Server
    Error"), without nosniff and no-referrer: now a 503 that says the server is stopping."""
    import signal
    import time

    sig = getattr(signal, stop)

    marker = tmp_path / "started"
    proc, err_path, base = _serve_measuring(tmp_path, (
        "def measure(b, text, wanted, pair=None):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('x')\n"
        "    time.sleep(120)"), "--measure", "alti")
    try:
        deadline = time.monotonic() + 120
        # over 512 tokens: the page says it was cut; the terminal said so per request and measure
        body = {"text": "b " * 600, "layer": 0, "heads": [0], "kind": "measure", "measure": "alti"}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(exchange, base, "POST", "/api/attention", body, None, 120)
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert marker.exists(), err_path.read_text()
            proc.send_signal(sig)
            while "stopping: waiting" not in err_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert proc.poll() is None  # the first Ctrl-C waits for the request
            proc.send_signal(sig)
            assert proc.wait(60) == (130 if stop == "SIGINT" else 143)  # the measure sleeps 120 s
            status, headers, answer = pending.result(60)
            # cut short, as a stop at once must, and said so in the API's own shape
            assert status == 503, (status, answer)
            assert json.loads(answer) == {"detail": STOPPING}
            assert headers["content-type"] == "application/json" and SAFE.items() <= headers.items()
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err_path.read_text().strip().splitlines()
    assert lines[1:] == ["bertscope: warning: stopping: waiting up to 10 s for 1 request(s) to finish (Ctrl-C "
                         "again stops at once)", "bertscope: warning: stopped with 1 request(s) unfinished",
                         f"bertscope: {'interrupted' if stop == 'SIGINT' else 'terminated'}"], lines


STOPPING = "the server is stopping: this request was cut short; send it again once it runs"


def test_a_stop_held_by_a_client_that_does_not_read_says_so_and_ends_in_time(tmp_path):
    """A client that never reads a large answer held a Ctrl-C's stop for as long as it kept its
    connection, and nothing was said: the answer was written (its task done), its bytes waited
    in the connection's buffer. The stop now counts it, says so, and waits at most 10 s (the
    default --stop-timeout); a request still computing then is cut short with a 503."""
    import signal
    import socket
    import time

    marker = tmp_path / "started"
    proc, err_path, base = _serve_measuring(tmp_path, (
        "def measure(b, text, wanted, pair=None):\n"
        "    if text == 'slow':\n"
        f"        pathlib.Path({str(marker)!r}).write_text('x')\n"
        "        time.sleep(120)\n"
        "    return {wanted[0]: np.zeros((6, 12, 320, 320), np.float32)}  # 40 MB of JSON"), "--measure", "alti")
    u = urllib.parse.urlsplit(base)
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # set before connecting
    try:
        deadline = time.monotonic() + 120
        reader.settimeout(60)
        reader.connect((u.hostname, u.port))
        body = json.dumps({"text": "big", "measures": ["alti"]}).encode()
        reader.sendall(f"POST /api/analyze HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = b""
        while b"\r\n" not in head:  # the answer has begun, written whole: read no more
            piece = reader.recv(256)
            assert piece, head
            head += piece
        assert head.startswith(b"HTTP/1.1 200"), head
        slow = {"text": "slow", "layer": 0, "heads": [0], "kind": "measure", "measure": "alti"}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(exchange, base, "POST", "/api/attention", slow, None, 120)
            while not marker.exists():
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            while "stopping: waiting" not in err_path.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.05)
            assert proc.wait(60) == 130  # 10 s: the measure sleeps 120 s and the reader never reads
            status, headers, answer = pending.result(60)
        assert status == 503, (status, answer)
        assert json.loads(answer) == {"detail": STOPPING}
        assert SAFE.items() <= headers.items()
    finally:
        reader.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    lines = err_path.read_text().strip().splitlines()
    assert lines[1:] == ["bertscope: warning: stopping: waiting up to 10 s for 2 request(s) to finish (Ctrl-C "
                         "again stops at once)", "bertscope: warning: stopped after 10 s with 2 request(s) unfinished",
                         "bertscope: interrupted"], lines


def test_a_stop_at_once_cancels_the_requests_still_running():
    """From Python 3.12.1 uvicorn's stop waits in asyncio.Server.wait_closed for every connection
    to close: a request left computing held a second Ctrl-C (or the stop time running out) until
    its computation ended, and got 200, not 503. The stop at once now cancels the requests still
    running (their 503 closes their connections) and aborts the answered ones not yet taken."""
    import asyncio
    from types import SimpleNamespace
    from unittest import mock

    from bertscope.see.server import _drop_unsent

    async def stop_at_once() -> None:
        running = asyncio.create_task(asyncio.sleep(60))
        answered = SimpleNamespace(cycle=SimpleNamespace(response_complete=True), transport=mock.Mock())
        computing = SimpleNamespace(cycle=SimpleNamespace(response_complete=False), transport=mock.Mock())
        await asyncio.sleep(0)  # the request has begun
        _drop_unsent(SimpleNamespace(connections=[answered, computing], tasks={running}))
        with pytest.raises(asyncio.CancelledError):
            await running
        answered.transport.abort.assert_called_once_with()
        computing.transport.abort.assert_not_called()  # kept for its 503

    asyncio.run(stop_at_once())


def test_stop_timeout_must_be_seconds():
    for bad in ("-1", "nan", "inf"):
        r = _serve_cli("--port", "0", "--stop-timeout", bad)
        assert r.returncode == 2 and r.stderr.startswith("bertscope: error: --stop-timeout must be"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "LOADED" not in r.stderr + r.stdout


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGINT, --stop-timeout 0"])
def test_a_stop_while_idle_is_one_line_and_the_status_of_its_signal(tmp_path, stop):
    """A Ctrl-C stopped an idle server with status 0 and no word, where SIGTERM said
    "terminated" with 143: the signal uvicorn raises again once stopped fell into asyncio's
    handler and was lost. Both now end as every command's stop does. A stop time shorter than
    uvicorn's own pause in its stop (0.1 s) cut short nothing, and said it had: "stopped after 0 s
    with 0 request(s) unfinished"."""
    import signal

    stop, _, extra = stop.partition(", ")
    proc, err_path, base = _serve_measuring(tmp_path, "def measure(b, text, wanted, pair=None):\n    pass",
                                            "--measure", "alti", *extra.split())
    try:
        assert request(base, "GET", "/api/health")[0] == 200
        proc.send_signal(getattr(signal, stop))
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err_path.read_text().strip().splitlines()
    assert (code, lines[-1]) == ((130, "bertscope: interrupted") if stop == "SIGINT"
                                 else (143, "bertscope: terminated")), lines
    # the health request's task may not have ended yet when the signal comes: then the stop says
    # it waits for it, and nothing else
    if not extra:
        assert all(x.startswith("bertscope: warning: stopping: waiting up to 10 s for 1 request(s)")
                   for x in lines[1:-1]), lines
    assert not any("with 0 request(s)" in x for x in lines), lines


def test_uvicorn_speaks_in_the_command_lines_own_format(tmp_path):
    """A malformed request's warning came in uvicorn's own format ("WARNING:  Invalid HTTP
    request received."), unlike every other line the command prints."""
    import socket

    proc, err_path, base = _serve_measuring(tmp_path, "def measure(b, text, wanted, pair=None):\n    pass",
                                            "--measure", "alti")
    try:
        u = urllib.parse.urlsplit(base)
        with socket.create_connection((u.hostname, u.port), timeout=60) as sock:
            sock.sendall(b"GARBAGE\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 400")
        assert request(base, "GET", "/api/health")[0] == 200  # the warning is written by now
    finally:
        proc.kill()
        proc.wait(60)
    lines = err_path.read_text().strip().splitlines()
    assert lines[1:] == ["bertscope: warning: Invalid HTTP request received."], lines


def test_port_in_use_and_bad_host_are_one_line_errors(capsys):
    import socket

    from bertscope.cli.app import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert err == f"bertscope: error: cannot listen on 127.0.0.1:{port} (Address already in use)\n"
    assert main(["serve", "--host", "999.1.1.1", "--port", "0"]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith("bertscope: error: cannot listen on 999.1.1.1:0 (") and cap.err.count("\n") == 1
    assert "serving" not in cap.err + cap.out
    for args, line in (
        (["--host", ""], "--host is empty; give an address: 127.0.0.1 (this machine only, the default) or 0.0.0.0 "
                         "(every interface)"),  # it warned of every interface, then failed to resolve ""
        (["--host", "http://127.0.0.1"], "--host takes an address or host name (127.0.0.1, ::1, 0.0.0.0), not a URL: "
                                         "'http://127.0.0.1'"),
        (["--allow-host", ""], "--allow-host takes a host name such as bert.example.org, got ''"),
        (["--host", "127.0.0.1:18702"], "--host takes no port: use --host 127.0.0.1 --port 18702"),
        (["--host", "[::1]:8000"], "--host takes no port: use --host ::1 --port 8000"),
        (["--host", "localhost:8000"], "--host takes no port: use --host localhost --port 8000"),
    ):
        assert main(["serve", *args, "--port", "0"]) == 2
        assert capsys.readouterr().err == f"bertscope: error: {line}\n"


def test_host_is_taken_as_the_banner_prints_it():
    """"[::1]" (the banner's form) and " 127.0.0.1" were refused as names that do not resolve."""
    from bertscope.cli.serve import _check_host

    assert _check_host("[::1]") == "::1" and _check_host(" 127.0.0.1 ") == "127.0.0.1"
    assert _check_host("0.0.0.0") == "0.0.0.0" and _check_host("localhost") == "localhost"


# ---------------------------------------------------------------------------- DNS rebinding, bad text


def test_host_header_must_name_this_server(server):
    port = urllib.parse.urlsplit(server).port
    # the last three are not a host and port at all: read loosely, they passed as "localhost"
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example:80",
                 f"localhost:{port}@evil.example", "[::1", "localhost evil.example"):
        status, body = request(server, "GET", "/api/health", host=host)
        assert status == 421, (host, status)
        assert "DNS rebinding" in body["detail"]
        status, _ = request(server, "POST", "/api/analyze", {"text": IT_ANIMAL}, host=host)
        assert status == 421
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert request(server, "GET", "/api/health", host=host)[0] == 200, host


def test_every_answer_says_nosniff_and_no_referrer(server):
    """A body's type is never guessed from its bytes, and the page's address (its text in
    ?text=) is not sent on with a request: on the page, an asset, an API answer and a refusal."""
    u = urllib.parse.urlsplit(server)
    for path, host in [("/", None), ("/assets/bertscope.js", None), ("/api/health", None),
                       ("/api/health", "evil.example"), ("/no-such-page", None)]:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        try:
            conn.request("GET", path, headers={} if host is None else {"Host": host})
            r = conn.getresponse()
            r.read()
            assert (r.getheader("X-Content-Type-Options"), r.getheader("Referrer-Policy")) == \
                ("nosniff", "no-referrer"), (path, host, r.status, r.getheaders())
        finally:
            conn.close()


def test_a_large_answer_is_gzipped_for_a_client_that_accepts_it(server):
    """An analysis with every measure's maps was about 109 MB of JSON, sent as it was to a
    browser that accepts gzip. The compressed answer keeps nosniff and no-referrer."""
    import gzip

    ask = {"text": f"{IT_ANIMAL} {IT_ANIMAL}", "measures": ["norm"]}
    status, plain_headers, plain = exchange(server, "POST", "/api/analyze", ask)  # computed and cached
    assert status == 200 and "content-encoding" not in plain_headers and len(plain) > 200_000
    status, headers, packed = exchange(server, "POST", "/api/analyze", ask, {"Accept-Encoding": "gzip, deflate"})
    assert status == 200 and headers["content-encoding"] == "gzip", headers
    assert "accept-encoding" in headers["vary"].lower() and SAFE.items() <= headers.items()
    assert int(headers["content-length"]) == len(packed) < len(plain)
    assert gzip.decompress(packed) == plain  # the same cached analysis: the same bytes
    assert json.loads(gzip.decompress(packed))["maps"][0]["measure"] == "norm"
    status, headers, _ = exchange(server, "GET", "/api/health", None, {"Accept-Encoding": "gzip"})
    assert status == 200 and "content-encoding" not in headers  # a small answer goes as it is


def _compress_spy(monkeypatch) -> list[tuple[int, bool]]:
    """Every zlib compression from now on, as (bytes given, whether on a thread running an event
    loop). Starlette's gzip, old (gzip.GzipFile) and new, compresses through zlib.compressobj."""
    import asyncio
    import zlib

    made, seen = zlib.compressobj, []

    def on_loop() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    class Spy:
        def __init__(self, *a, **k):
            self.inner = made(*a, **k)

        def compress(self, data):
            seen.append((len(data), on_loop()))
            return self.inner.compress(data)

        def flush(self, *a):
            return self.inner.flush(*a)

    monkeypatch.setattr(zlib, "compressobj", Spy)
    return seen


def test_a_large_answer_is_compressed_off_the_event_loop(bert, monkeypatch):
    """Starlette before 1.4 gzipped on the event loop: seconds for a large analysis, with every
    other request of the server waiting. bertscope needs 1.4.1+, which compresses in a thread."""
    from starlette.testclient import TestClient

    from bertscope.see.server import create_app

    seen = _compress_spy(monkeypatch)
    # about 260 tokens: 12 maps of 260 x 260, a few MB of JSON
    ask = {"text": " ".join([IT_ANIMAL] * 20), "layer": 0, "heads": list(range(12))}
    with TestClient(create_app(bert), base_url="http://127.0.0.1") as client:
        r = client.post("/api/attention", json=ask, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
    assert len(r.content) > 1_000_000 and len(json.loads(r.content)["matrices"]) == 12  # httpx undid the gzip
    large = [on_loop for n, on_loop in seen if n > 200_000]
    assert large and not any(large), seen


def test_a_starlette_that_would_gzip_on_the_event_loop_sends_answers_as_they_are(bert, monkeypatch, caplog):
    import starlette.middleware.gzip as gz
    from starlette.testclient import TestClient

    from bertscope.see.server import create_app, threaded_gzip

    class OldGZip:  # Starlette 1.3's signature: no thread_minimum_size
        def __init__(self, app, minimum_size: int = 500, compresslevel: int = 9) -> None:
            raise AssertionError("not to be used")

    assert threaded_gzip(gz.GZipMiddleware) and not threaded_gzip(OldGZip)
    monkeypatch.setattr(gz, "GZipMiddleware", OldGZip)
    seen = _compress_spy(monkeypatch)
    with caplog.at_level("WARNING", logger="bertscope.see.server"):
        app = create_app(bert)
    assert "answers go uncompressed" in caplog.text and "starlette>=1.4.1" in caplog.text
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.post("/api/analyze", json={"text": IT_ANIMAL}, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and "content-encoding" not in r.headers and not seen
    assert SAFE.items() <= {k.lower(): v for k, v in r.headers.items()}.items()


def test_an_overlong_address_gets_414_and_overlarge_headers_431(server):
    """A 40 kB address was answered 200, or 400 with the connection reset, depending on how its
    bytes arrived (uvicorn's parser, h11, checks its 16 KiB limit only while a head is
    incomplete); the same for 40 kB of headers. Now 414 and 431 in the API's JSON shape."""
    status, headers, body = exchange(server, "GET", "/api/health?" + "a" * 40_000)
    assert status == 414, (status, body[:200])
    assert json.loads(body) == {"detail": "the request's address is too long: 40,012 bytes; the limit is 16,384"}
    assert SAFE.items() <= headers.items()
    status, headers, body = exchange(server, "GET", "/api/health", None, {"X-Big": "b" * 40_000})
    assert status == 431, (status, body[:200])
    detail = json.loads(body)["detail"]
    assert detail.startswith("the request's headers are too large: 40,") and detail.endswith("the limit is 32,768")
    assert SAFE.items() <= headers.items()
    # the page's longest own address (a query of 8,000 characters) still opens
    assert exchange(server, "GET", "/?text=" + "%E2" * 2664)[0] == 200
    assert request(server, "GET", "/api/health")[0] == 200


def test_an_unexpected_failure_is_a_500_with_the_same_headers(tmp_path):
    """Starlette's error middleware sits outside the middleware an app adds: its 500 went out
    without nosniff and no-referrer."""
    proc, err_path, base = _serve_measuring(tmp_path, (
        "def measure(b, text, wanted, pair=None):\n"
        "    raise RuntimeError('a bug in a measure')"), "--measure", "alti")
    try:
        u = urllib.parse.urlsplit(base)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        body = json.dumps({"text": IT_ANIMAL, "layer": 0, "heads": [0], "kind": "measure", "measure": "alti"})
        conn.request("POST", "/api/attention", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        conn.close()
        assert r.status == 500
        assert (r.getheader("X-Content-Type-Options"), r.getheader("Referrer-Policy")) == ("nosniff", "no-referrer")
    finally:
        proc.kill()
        proc.wait(60)


def test_allowed_hosts_rules():
    import socket

    from bertscope.see.server import allowed_host, is_all_interfaces

    assert allowed_host("127.0.0.1:8000", "127.0.0.1") and allowed_host("[::1]:8000", "127.0.0.1")
    assert not allowed_host("192.168.1.7:8000", "127.0.0.1")  # bound to loopback: only loopback names
    assert allowed_host("192.168.1.7:8000", "192.168.1.7")
    assert allowed_host("bert.example.org", "127.0.0.1", frozenset({"bert.example.org"}))
    # bound to every interface: any address literal and this machine's own name, never other names
    assert is_all_interfaces("0.0.0.0") and is_all_interfaces("::") and not is_all_interfaces("127.0.0.1")
    assert allowed_host("10.0.0.5:8000", "0.0.0.0") and allowed_host("[fe80::1]:8000", "::")
    assert allowed_host(socket.gethostname(), "0.0.0.0")
    assert not allowed_host("evil.example", "0.0.0.0") and not allowed_host("evil.example", "::")
    # as a browser writes them: an empty port, a zone id escaped in the URL (%25), a trailing dot
    # on either side; and what is not a host and port at all
    assert allowed_host("localhost:", "127.0.0.1") and allowed_host("[fe80::1%25eth0]:80", "fe80::1%eth0")
    assert allowed_host("myhost", "myhost.") and allowed_host("Example.ORG.:443", "127.0.0.1",
                                                               frozenset({"example.org."}))
    assert not allowed_host("localhost:80@evil.example", "127.0.0.1") and not allowed_host("[::1", "127.0.0.1")


@pytest.mark.parametrize("raw", [
    b'{"text": 5}', b'{"text": null}', b'{"text": ["a"]}', b'{"text": {"a": 1}}',
    b'{"text": "\\ud800"}', b'{"text": "ok", "text_b": "\\udfff x"}', b'{"text": "ok", "pair": 3}',
    b'{"text": "\xff\xfe not utf-8"}', b'\xff\xfe',
])
def test_text_that_is_not_unicode_or_not_a_string_gets_422(server, raw):
    rest = {"/api/analyze": b"", "/api/attention": b', "layer": 0, "heads": [0]', "/api/qk": b', "layer": 0, "head": 0'}
    for path, more in rest.items():
        body = raw[:-1] + more + b"}" if raw.endswith(b"}") else raw
        status, answer = request(server, "POST", path, raw=body)
        assert status == 422, (path, raw, status, answer)
        assert isinstance(answer, dict) and isinstance(answer["detail"], str), answer  # one line for the page
        assert "\n" not in answer["detail"]
    status, answer = request(server, "POST", "/api/analyze", raw=b'{"text": "\\ud800"}')
    assert "not valid Unicode" in answer["detail"] or "valid string" in answer["detail"]
    assert request(server, "GET", "/api/health")[0] == 200


def test_qk_route_gives_the_models_q_k_v_and_pairs_have_segments(server, bert):
    status, body = request(server, "POST", "/api/qk", {"text": IT_ANIMAL, "layer": 3, "head": 1})
    assert status == 200, body
    T, D = body["tokens"], body["head_size"]
    b = bert.encode([IT_ANIMAL])
    with torch.inference_mode():
        att = bert.model(b.input_ids, b.attention_mask, b.token_type_ids, output_intermediates=True).intermediates[3].attention
    for name, ref in (("q", att.q), ("k", att.k), ("v", att.v)):
        got = np.frombuffer(base64.b64decode(body[name]), dtype="<f4").reshape(T, D)
        # the server is another process, whose BLAS may use another thread count (and so sum in
        # another order): within 1e-5, as every cross-process check, not bit for bit
        np.testing.assert_allclose(got, ref[0, 1].numpy(), atol=1e-5, rtol=1e-5)
    status, meta = request(server, "POST", "/api/analyze", {"text": "Where is it?", "pair": "It is here."})
    assert status == 200 and len(meta["texts"]) == 1 and set(meta["texts"][0]["segments"]) == {0, 1}
    assert request(server, "POST", "/api/qk", {"text": "x", "layer": 0, "head": 99})[0] == 400
    assert request(server, "POST", "/api/qk", {"text": "x", "layer": 0, "head": 0, "which": 1})[0] == 400


def _serve_cli(*args: str, block: str = "") -> subprocess.CompletedProcess:
    """`bertscope serve ...` in a fresh interpreter; ``block`` names modules made unimportable."""
    code = (f"import sys\nfor m in {block.split()!r}: sys.modules[m] = None\n"
            "import bertscope.bert as b\n"
            "def nope(*a, **k):\n    raise SystemExit('LOADED THE MODEL')\n"
            "b.load = nope\n"
            "from bertscope.cli.app import main\nsys.exit(main(sys.argv[1:]))\n")
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code, "serve", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_serve_warns_when_listening_on_every_interface():
    import socket

    with socket.socket() as taken:  # a port in use: the command warns, then fails to bind, never serves
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _serve_cli("--host", "0.0.0.0", "--port", str(port))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert lines[0].startswith("bertscope: warning: --host 0.0.0.0 listens on every network interface")
    assert lines[1].startswith("bertscope: error: cannot listen on 0.0.0.0:")
    r = _serve_cli("--host", "127.0.0.1", "--port", str(port))  # no warning for loopback
    assert "warning" not in r.stderr


def test_the_banner_names_an_address_a_browser_opens():
    """With --host 0.0.0.0 it printed http://0.0.0.0:PORT/, which not every browser opens."""
    from bertscope.cli.serve import where

    assert where("127.0.0.1", 8000) == "http://127.0.0.1:8000/"
    assert where("::1", 8000) == "http://[::1]:8000/"
    assert where("0.0.0.0", 8000) == "http://127.0.0.1:8000/ and this machine's other addresses"
    assert where("::", 80) == "http://[::1]:80/ and this machine's other addresses"
    assert where("bert.example.org", 8000) == "http://bert.example.org:8000/"


def test_serve_without_fastapi_fails_before_anything():
    r = _serve_cli("--port", "0", block="fastapi uvicorn")
    assert r.returncode == 2, r.stderr
    assert r.stderr == "bertscope: error: serving needs FastAPI and uvicorn: pip install 'bertscope[serve]'\n"
    assert r.stdout == "" and "LOADED" not in r.stderr + r.stdout


def _floats(b64: str, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), dtype="<f4").reshape(shape)


def test_measures_over_http_equal_the_library(server, bert):
    """serve offers the explain measures: /api/analyze with "measures" returns their whole maps,
    /api/attention one layer of them; both equal bertscope.explain's maps."""
    from bertscope import explain

    alti, norm = explain(bert, IT_ANIMAL, "alti").maps, explain(bert, IT_ANIMAL, "norm").maps
    status, meta = request(server, "POST", "/api/analyze", {"text": IT_ANIMAL, "measures": ["alti", "norm"]})
    assert status == 200, meta
    offered = {m["name"]: m for m in meta["measures"]}
    assert set(offered) == {"norm", "norm-residual", "value-zeroing", "alti"}  # rollout: the page's own mode
    assert offered["norm"]["per_head"] and not offered["alti"]["per_head"] and not offered["norm"]["share"]
    # what a value is, and whose method: the page had only the names to go on
    assert offered["alti"]["about"] == "share of the input token in this token, rolled out to this layer (Ferrando et al. 2022)"
    maps = {m["measure"]: m for m in meta["maps"]}
    assert maps["alti"]["shape"] == list(alti.shape) and len(alti.shape) == 3  # (N, T, T)
    assert maps["norm"]["shape"] == list(norm.shape) and len(norm.shape) == 4  # (N, H, T, T)
    np.testing.assert_allclose(_floats(maps["alti"]["data"], alti.shape), alti, atol=1e-4)
    np.testing.assert_allclose(_floats(maps["norm"]["data"], norm.shape), norm, atol=1e-4)

    T = alti.shape[-1]
    status, body = request(server, "POST", "/api/attention", {"text": IT_ANIMAL, "layer": 2, "kind": "measure", "measure": "alti"})
    assert status == 200 and [m["head"] for m in body["matrices"]] == [-1]
    np.testing.assert_allclose(_floats(body["matrices"][0]["data"], (T, T)), alti[2], atol=1e-4)
    status, body = request(server, "POST", "/api/attention",
                           {"text": IT_ANIMAL, "layer": 2, "heads": [1], "kind": "measure", "measure": "norm"})
    assert status == 200 and [m["head"] for m in body["matrices"]] == [1]
    np.testing.assert_allclose(_floats(body["matrices"][0]["data"], (T, T)), norm[2, 1], atol=1e-4)

    status, body = request(server, "POST", "/api/analyze", {"text": IT_ANIMAL, "measures": ["nope"]})
    assert status == 400 and "unknown measure 'nope'" in body["detail"] and "\n" not in body["detail"]
    status, body = request(server, "POST", "/api/attention", {"text": "word " * 150, "layer": 0, "kind": "measure",
                                                             "measure": "value-zeroing"})
    assert status == 400 and "128 tokens" in body["detail"]
    status, body = request(server, "POST", "/api/attention", {"text": "a word", "text_b": "word " * 150, "layer": 0,
                                                             "kind": "measure", "measure": "value-zeroing"})
    assert status == 400 and body["detail"].startswith("text_b: ") and "128 tokens" in body["detail"]  # which text


def test_launch_reports_a_server_that_exits_before_it_is_ready(tmp_path):
    """bertscope.see.launch (what the browser tests and the soak script start servers with): a
    server that exits at start-up is an error that carries the server's own message, at once,
    not a wait until the timeout."""
    missing = tmp_path / "no-such-model"
    with pytest.raises(RuntimeError, match="exited with 2") as err:
        with served("--model", str(missing), timeout=60):
            pass
    assert f"model folder {missing} does not exist" in str(err.value)


def test_launch_tries_another_port_when_its_port_is_taken_first(monkeypatch):
    """The port is free when launch picks it, but another process can bind it before the server
    does (the server starts in seconds): the server then says so and exits, and launch tries
    another port, instead of failing the browser tests and the soak script."""
    import socket

    from bertscope.see import launch

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    picked, real = [], launch.free_port

    def first_the_taken_one() -> int:  # the first pick is taken by the time the server binds it
        picked.append(real() if picked else port)
        return picked[-1]

    monkeypatch.setattr(launch, "free_port", first_the_taken_one)
    try:
        with served("--max-chars", "100", timeout=90) as base:
            assert len(picked) == 2 and base.endswith(f":{picked[1]}") and picked[1] != port
            status, body = request(base, "GET", "/api/health")
            assert status == 200
    finally:
        taken.close()


@pytest.mark.parametrize("body, fragment", [
    ({"text": "The cat sat", "layer": 2, "head": 3}, "head: Extra inputs are not permitted"),  # "heads" misspelt
    ({"text": "The cat sat", "layer": True, "heads": [0]}, "layer: Input should be a valid integer"),
    ({"text": "The cat sat", "layer": "3", "heads": [0]}, "layer: Input should be a valid integer"),
    ({"text": "The cat sat", "layer": 0, "heads": [True]}, "heads.0: Input should be a valid integer"),
])
def test_a_request_the_server_would_misread_is_refused(server, body, fragment):
    """Before: a misspelt key fell back to its default (200 with no matrices), true was read as 1
    and "3" as 3."""
    status, answer = request(server, "POST", "/api/attention", body)
    assert status == 422 and fragment in answer["detail"], (status, answer)


def test_a_blank_pair_or_second_text_is_refused_not_dropped(server):
    for key in ("pair", "text_b"):
        status, answer = request(server, "POST", "/api/analyze", {"text": "The cat sat", key: "   "})
        assert status == 400 and f"the {key} is empty" in answer["detail"], answer
    status, _ = request(server, "POST", "/api/analyze", {"text": "The cat sat", "pair": None, "text_b": None})
    assert status == 200


def test_gzip_refused_with_q_0_is_not_sent(server):
    """Starlette compressed for any Accept-Encoding containing "gzip", "gzip;q=0" (refused) too."""
    body = {"text": IT_ANIMAL, "layer": 0, "heads": list(range(12))}
    for accept, gzipped in [("gzip", True), ("gzip;q=0", False), ("br, gzip;q=0.0", False), ("gzip;q=0.5", True),
                            ("identity", False)]:
        status, headers, raw = exchange(server, "POST", "/api/attention", body, {"Accept-Encoding": accept})
        assert status == 200 and (headers.get("content-encoding") == "gzip") == gzipped, (accept, headers)
        if not gzipped:
            assert json.loads(raw)["layer"] == 0


def test_a_content_type_is_judged_by_its_first_header(server):
    """Two Content-Type headers: FastAPI reads the first; the check read the last, and let a
    text/plain body through to FastAPI's "Input should be a valid dictionary"."""
    u = urllib.parse.urlsplit(server)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.putrequest("POST", "/api/analyze")
        body = b'{"text": "hi"}'
        for k, v in [("Content-Type", "text/plain"), ("Content-Type", "application/json"),
                     ("Content-Length", str(len(body)))]:
            conn.putheader(k, v)
        conn.endheaders(body)
        r = conn.getresponse()
        assert r.status == 415 and "it was text/plain" in json.loads(r.read())["detail"]
    finally:
        conn.close()


def test_health_the_page_and_cached_answers_never_wait_behind_requests_for_the_model(tmp_path):
    """45 requests waiting for the model each held a thread of the server's pool (40): health,
    the page, its assets and a cached answer waited for one (14-18 s, and 42 s for the cached
    answer, in a review). Now a request waits its turn without a thread, every computation runs
    on one thread (the model's memory in one heap), and a client that leaves is dropped at once."""
    import time

    calls, release = tmp_path / "calls.txt", tmp_path / "release"
    proc, err_path, base = _serve_measuring(tmp_path, (
        "import threading\n"
        "def measure(b, text, wanted, pair=None):\n"
        f"    with open({str(calls)!r}, 'a') as f: f.write(threading.current_thread().name + '\\n')\n"
        f"    while not pathlib.Path({str(release)!r}).exists():\n"
        "        time.sleep(0.02)\n"
        "    return {wanted[0]: np.zeros((6, 4, 4), np.float32)}"))
    try:
        assert request(base, "POST", "/api/analyze", {"text": "a cached text"})[0] == 200
        ask = lambda k: {"text": f"text number {k}", "layer": 0, "heads": [0], "kind": "measure",  # noqa: E731
                         "measure": "norm"}
        with ThreadPoolExecutor(45) as pool:
            waiting = [pool.submit(request, base, "POST", "/api/attention", ask(k), None, 300) for k in range(45)]
            deadline = time.monotonic() + 120
            while not calls.exists():  # the first computation has begun (a guard against a hang, not a timing)
                assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()
                time.sleep(0.05)
            # with every request waiting: a client's timeout here is a guard, not a timing
            assert request(base, "GET", "/api/health", timeout=60)[0] == 200
            assert request(base, "GET", "/", timeout=60)[0] == 200
            assert request(base, "GET", "/assets/bertscope.css", timeout=60)[0] == 200
            status, body = request(base, "POST", "/api/analyze", {"text": "a cached text"}, timeout=60)
            assert status == 200 and body["texts"][0]["tokens"][1] == "a"
            release.write_text("x")
            assert [f.result(300)[0] for f in waiting] == [200] * 45
        names = calls.read_text().split()
        assert len(names) == 45 and set(names) == {"bertscope-model_0"}  # one thread computed them all
    finally:
        proc.kill()
        proc.wait(60)
