"""Helpers for the tests of the views: a headless Chromium and a `bertscope serve` subprocess.

Browser tests need Debian's chromium (scripts/install-browser.sh installs it; `make test` runs
that). They run whenever it is installed. A missing browser fails the test with one line saying
how to install it; only an explicit BERTSCOPE_NO_BROWSER=1 leaves them out (reported as skipped).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("BERTSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"


NO_BROWSER_ENV = "BERTSCOPE_NO_BROWSER"


def _missing(reason: str) -> None:
    """A browser test cannot run: fail (the default), or skip when the user asked for no browser."""
    if os.environ.get(NO_BROWSER_ENV, "") == "1":
        pytest.skip(f"{NO_BROWSER_ENV}=1: browser tests left out as asked ({reason})")  # skip-policy: explicit opt-out
    pytest.fail(f"{reason}; run scripts/install-browser.sh as root (or set {NO_BROWSER_ENV}=1 "
                "to leave the browser tests out)", pytrace=False)


@contextlib.contextmanager
def chromium():
    """A headless Chromium (Debian's), driven by Playwright. Never downloads a browser."""
    if not Path(CHROMIUM).exists():
        _missing(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright  # a test dependency (conftest checks it)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(*extra: str, timeout: float = 90.0):
    """Run `bertscope serve` on a free loopback port; yield its base URL; always stop it."""
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "bertscope", "serve", "--port", str(port), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"bertscope serve exited with {proc.returncode}: {proc.stdout.read()}")
            try:
                with urllib.request.urlopen(base + "/api/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("bertscope serve did not become ready")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name
