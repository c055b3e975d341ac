"""bertscope serve over real HTTP: limits, path traversal, bad requests, concurrency."""

from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from conftest import IT_ANIMAL
from viewkit import served


@pytest.fixture(scope="module")
def server():
    with served("--max-chars", "2000") as base:
        yield base


def request(base: str, method: str, path: str, body=None, raw: bytes | None = None, timeout=60):
    """One HTTP request with the path sent exactly as given (no client-side normalisation)."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        payload = r.read()
        try:
            return r.status, json.loads(payload)
        except ValueError:
            return r.status, payload
    finally:
        conn.close()


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
    # a short text and a long ignored field: only the byte count can refuse it, not the text check
    body = b'{"text": "ok", "pad": "' + b"x" * (total - 25) + b'"}'

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
    one = sum(rt.attentions.nbytes + rt.rollout.nbytes for rt in Analyzer(bert, max_bytes=0)([texts[0]]))
    a = Analyzer(bert, size=16, max_bytes=int(2.5 * one))
    for t in texts:
        a([t])
        held = sum(rt.attentions.nbytes + rt.rollout.nbytes for v in a._cache.values() for rt in v)
        assert held == a.nbytes <= a.max_bytes
    assert len(a) == 2  # only the last two fit in 2.5 texts' worth
    assert list(a._cache) == [(texts[4],), (texts[5],)]
    assert a([texts[5]]) is a([texts[5]])  # a hit returns the cached analysis
    tiny = Analyzer(bert, max_bytes=one - 1)  # an analysis larger than the bound is not kept
    tiny([texts[0]])
    assert len(tiny) == 0 and tiny.nbytes == 0


def test_port_in_use_and_bad_host_are_one_line_errors(capsys):
    import socket

    from bertscope.cli.main import main

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
