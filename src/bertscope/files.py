"""Reading user files and writing output files atomically (a temporary file, then a rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import InputError

__all__ = ["read_input_bytes", "read_lines", "write_bytes_atomic", "write_text_atomic"]


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, make_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` so a reader never sees a half-written file.

    The bytes go to a temporary file in the same folder, then ``os.replace`` renames it over
    ``path`` in one step. With ``make_parents=False`` a missing folder is an InputError.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if make_parents:
        folder.mkdir(parents=True, exist_ok=True)
    elif not folder.is_dir():
        raise InputError(f"the folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def read_lines(path: str | os.PathLike) -> tuple[list[tuple[int, str]], list[str]]:
    """Non-blank lines of a UTF-8 text file as (line number, text), and warnings for lines skipped.

    A line that is not UTF-8 is skipped with a warning naming it; the rest are kept.
    """
    p = Path(path)
    raw = read_input_bytes(p)
    lines: list[tuple[int, str]] = []
    warnings: list[str] = []
    for n, chunk in enumerate(raw.splitlines(), start=1):
        try:
            text = chunk.decode("utf-8").strip()
        except UnicodeDecodeError:
            warnings.append(f"{p}: line {n} is not UTF-8 text; skipped")
            continue
        if text:
            lines.append((n, text))
    return lines, warnings


def read_input_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a user's input file; a missing or unreadable file is a one-line InputError."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p} does not exist or is not a file")
    try:
        return p.read_bytes()
    except OSError as e:
        raise InputError(f"{p} cannot be read ({e.strerror})") from None
