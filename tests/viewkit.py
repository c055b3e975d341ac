"""Helpers for the tests of the views: a headless Chromium and a `bertscope serve` subprocess.

Browser tests need Debian's chromium (scripts/install-browser.sh installs it; `make test` runs
that). They run whenever it is installed. A missing browser fails the test with one line saying
how to install it; only an explicit BERTSCOPE_NO_BROWSER=1 leaves them out (reported as skipped).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest

from bertscope.see import launch

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


@contextlib.contextmanager
def served(*extra: str, timeout: float = 90.0):
    """Run `bertscope serve` on a free loopback port; yield its base URL; always stop it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    with launch.served(extra, env=env, timeout=timeout) as running:
        yield running.base


def artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


# ---------------------------------------------------------------------------- self-containment

_DATA_SCRIPT = re.compile(r'<script\b[^>]*\btype\s*=\s*["\']application/(?:json|octet-stream)["\'][^>]*>.*?</script\s*>',
                          re.S | re.I)
_SCRIPT = re.compile(r"(<script\b[^>]*>)(.*?)(</script\s*>)", re.S | re.I)
_STYLE = re.compile(r"(<style\b[^>]*>)(.*?)(</style\s*>)", re.S | re.I)
_TAG = re.compile(r"<[a-z][^>]*>", re.I)
_URL_ATTR = re.compile(r'\b(src|href|srcset|action|formaction|poster|data|background|xlink:href)\s*=\s*'
                       r'(?:"([^"]*)"|\'([^\']*)\'|([^\s>]+))', re.I)
_STYLE_ATTR = re.compile(r'\bstyle\s*=\s*(?:"([^"]*)"|\'([^\']*)\')', re.I)
_CSS_URL = re.compile(r"url\(\s*[\"']?([^\"')]*)", re.I)
_JS_LOAD = re.compile(r"\b(?:fetch|import|importScripts|Worker|SharedWorker|EventSource|WebSocket|sendBeacon|open)"
                      r"\s*\(\s*([\"'`])([^\"'`]*)\1", re.I)
_ABSOLUTE = re.compile(r"(?:\b[a-z][a-z0-9+.-]*:)?//[a-z0-9-]+(?:\.[a-z0-9-]+)+", re.I)
_LOCAL = ("#", "data:", "blob:", "about:", "javascript:")


def _external(url: str) -> bool:
    u = url.strip()
    return bool(u) and not u.lower().startswith(_LOCAL)


def external_references(html: str) -> list[str]:
    """Every reference in a page's markup, scripts and styles that would load something from
    outside the page: a src/href-like attribute that is not a fragment, data: or blob: URL (a
    relative path counts: it reads a file beside the page), a CSS url() or @import, a fetch(),
    import(), Worker(), ... of a literal URL, and any absolute URL ("https://host.tld",
    "//host.tld") written in a script or a style. The data payload -- <script> elements of type
    application/json or application/octet-stream, the numbers and the texts -- is left out: its
    bytes are data, whatever characters they happen to contain."""
    page = _DATA_SCRIPT.sub("", html)
    found: list[str] = []
    code = [m.group(2) for m in _SCRIPT.finditer(page)]
    styles = [m.group(2) for m in _STYLE.finditer(page)]
    markup = _STYLE.sub(r"\1\3", _SCRIPT.sub(r"\1\3", page))  # the tags stay, their contents go
    tags = _TAG.findall(markup)  # attributes live inside tags; text between them is not markup
    for tag in tags:
        for m in _URL_ATTR.finditer(tag):
            value = next(v for v in m.groups()[1:] if v is not None)
            if _external(value):
                found.append(f"{m.group(1)}={value}")
        styles += [next(v for v in m.groups() if v is not None) for m in _STYLE_ATTR.finditer(tag)]
    for css in styles:
        found += [f"url({u})" for u in _CSS_URL.findall(css) if _external(u)]
        if "@import" in css.lower():
            found.append("@import")
        found += [m.group(0) for m in _ABSOLUTE.finditer(css)]
    for js in code:
        found += [f"load({m.group(2)})" for m in _JS_LOAD.finditer(js) if _external(m.group(2))]
        found += [m.group(0) for m in _ABSOLUTE.finditer(js)]
    return found
