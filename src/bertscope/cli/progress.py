"""Progress bars for long commands: tqdm on stderr, on when stderr is a terminal.

The library never prints: its long functions take a ``progress(done, total)`` callback. A
command passes :func:`bar`'s callable, which draws a tqdm bar on stderr when stderr is a
terminal, and draws nothing with ``--quiet``, or when stderr is a file or a pipe (a log would
fill with carriage returns) unless ``--progress`` asks for it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["Bar", "add_progress_args", "bar", "progress_enabled"]


def add_progress_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--progress", action="store_true",
                   help="show the progress bar on stderr even when it is not a terminal")


def progress_enabled(args: argparse.Namespace) -> bool:
    if getattr(args, "quiet", False):
        return False
    if getattr(args, "progress", False):
        return True
    return _isatty()


def _isatty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Bar:
    """A tqdm bar driven by ``bar(done, total)`` calls (cumulative counts); a no-op when off.
    Use it as a context manager so the bar is closed (and its line ended) whatever happens."""

    def __init__(self, enabled: bool, desc: str, unit: str) -> None:
        self.enabled, self.desc, self.unit = enabled, desc, unit
        self._tqdm: Any = None

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        if self._tqdm is None:
            from tqdm import tqdm

            # a terminal's bar is erased when done; a log (--progress) keeps its last state, n/n
            self._tqdm = tqdm(total=total, desc=self.desc, unit=self.unit, file=sys.stderr,
                              dynamic_ncols=True, leave=not _isatty(), mininterval=0.2)
        t = self._tqdm
        if total is not None and t.total != total:
            t.total = total
        t.update(done - t.n)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bar(args: argparse.Namespace, desc: str, unit: str = "it") -> Bar:
    """The progress callable for a command (see the module docstring)."""
    return Bar(progress_enabled(args), desc, unit)
