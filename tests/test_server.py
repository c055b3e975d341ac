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
