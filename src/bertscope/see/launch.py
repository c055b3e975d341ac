"""`bertscope serve` in a child process, for what drives the server from outside: the browser
tests and the soak script start it on a free loopback port, wait until ``/api/health`` answers,
use it, and stop it. Nothing here imports the web framework; the child does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Iterator, Sequence

__all__ = ["Served", "free_port", "served"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Served:
    """A running server: its base URL (``http://127.0.0.1:PORT``) and its process."""

    base: str
    proc: subprocess.Popen


def _output(log) -> str:
    log.seek(0)
    return log.read().decode("utf-8", "replace").strip()


@contextlib.contextmanager
def served(args: Sequence[str] = (), *, env: dict[str, str] | None = None, timeout: float = 90.0,
           python: str = sys.executable) -> Iterator[Served]:
    """Run ``python -m bertscope serve --port P *args`` on a free port and yield it once
    ``/api/health`` answers 200; stop it (terminate, then kill) on the way out.

    The server's output goes to a temporary file, not a pipe, so a long run that logs a lot can
    never block on a full pipe. RuntimeError, with that output, if the server exits before it is
    ready; RuntimeError after ``timeout`` seconds without an answer. The port is free when it is
    picked, but another process can take it before the server binds it: then another port is
    tried, up to ``PORT_TRIES`` in all.
    """
    for attempt in range(1, PORT_TRIES + 1):
        try:
            with _served_on(free_port(), args, env, timeout, python) as srv:
                yield srv
            return
        except _PortTaken:
            if attempt == PORT_TRIES:
                raise RuntimeError(f"bertscope serve found its port taken {PORT_TRIES} times in a row") from None


PORT_TRIES = 3


class _PortTaken(Exception):
    """The port picked for the server was taken before it could bind it."""


@contextlib.contextmanager
def _served_on(port: int, args: Sequence[str], env: dict[str, str] | None, timeout: float,
               python: str) -> Iterator[Served]:
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([python, "-m", "bertscope", "serve", "--port", str(port), *args],
                                env=env if env is not None else dict(os.environ), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    said = _output(log)
                    if f"cannot listen on 127.0.0.1:{port} ({os.strerror(errno.EADDRINUSE)})" in said:
                        raise _PortTaken
                    raise RuntimeError(f"bertscope serve exited with {proc.returncode}: {said}")
                try:
                    with urllib.request.urlopen(base + "/api/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bertscope serve did not answer /api/health within {timeout:.0f} s")
                time.sleep(0.2)
            yield Served(base, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
