"""Guards for the commands' outputs: strict JSON on stdout, and output paths that are really writable.

cli.common's check_output_file / check_output_dir judge a path by its permission bits; as root
those say yes to folders such as /proc where no file can be created. :func:`check_writable` goes
one step further and creates (and removes) an empty file there, before any work is done.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ..errors import InputError, os_reason


def dumps_strict(obj: Any, **kw: Any) -> str:
    """JSON text that any parser accepts: NaN and ±Infinity (not JSON) raise ValueError.

    A non-finite number reaching here is a bug in bertscope, not bad input: the library should
    have written ``null`` (with a note saying why).
    """
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, **kw)


def null_non_finite(obj: Any, where: str = "") -> tuple[Any, list[str]]:
    """A copy of a JSON-able value with every NaN and ±Infinity replaced by None (JSON null),
    and the dotted paths where that happened (for a note beside the output)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None, [where or "(top level)"]
    if isinstance(obj, dict):
        out, paths = {}, []
        for k, v in obj.items():
            out[k], p = null_non_finite(v, f"{where}.{k}" if where else str(k))
            paths += p
        return out, paths
    if isinstance(obj, (list, tuple)):
        items, paths = [], []
        for i, v in enumerate(obj):
            item, p = null_non_finite(v, f"{where}[{i}]")
            items.append(item)
            paths += p
        return items, paths
    return obj, []


def print_json_strict(obj: Any) -> None:
    text = dumps_strict(obj)  # before writing anything, so a failure leaves stdout empty
    sys.stdout.write(text + "\n")


def check_writable(path: Path, flag: str = "--out", *, folder: bool = False) -> Path:
    """Create and remove an empty file where ``path`` will be written (in ``path`` itself if
    ``folder``, else in its parent; for a folder not made yet, in its nearest existing ancestor).
    Raises InputError (one line) if that fails."""
    where = path if folder else (path.parent if str(path.parent) else Path("."))
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=".bertscope-probe-", dir=where)
    except OSError as e:
        raise InputError(f"{flag}: cannot write in {str(where)!r} ({e.strerror or e})") from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def writing(path: str | os.PathLike, flag: str = "--out") -> Iterator[None]:
    """Turn an OSError while writing ``path`` into one InputError line naming the path, not a temp name."""
    try:
        yield
    except OSError as e:
        name, inner = str(path), str(getattr(e, "filename", "") or "")
        if inner.startswith(name.rstrip(os.sep) + os.sep):  # a file of an output folder: that file
            name = inner
        raise InputError(f"{flag}: cannot write {name!r} ({os_reason(e)})") from None
