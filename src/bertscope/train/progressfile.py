"""A ``predict`` run's rows on disk as it goes, so that a run stopped by Ctrl-C, a kill or a
crash resumes where it stopped instead of starting over.

Beside the output FILE, ``FILE.partial`` (JSON Lines) holds:

1. a header: what the run reads and how (the input's size and SHA-256, the model's folder and
   the SHA-256 of its files, the settings that change a row), and the kernel choice it computes
   with (``kernel``: a resumed run uses it again, whatever this machine's cache holds now);
2. for each finished chunk of records, its rows, then ``{"done": N}`` (N records so far).

A resumed run checks the header against itself, keeps the rows up to the last ``done`` (a chunk
cut off by a kill is computed again) and appends. The chunks are cut from the input alone, so a
resumed run computes the same chunks, and gives the same rows, as one that never stopped. The
finished run writes FILE atomically and removes ``FILE.partial``. While a run holds the file
(an exclusive ``flock``), a second run on the same FILE is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from ..errors import InputError, os_reason
from ..files import same_file, sha256_file

SUFFIX = ".partial"
KIND = "bertscope predict progress"
HEADER_START = b'{"kind": "bertscope predict progress"'  # how the file begins (json.dumps of the header)
KILL_HOOK_ENV = "BERTSCOPE_PREDICT_KILL_AFTER_CHUNKS"  # tests: SIGKILL once N chunks are on disk


def partial_path(out: str | os.PathLike) -> Path:
    return Path(f"{out}{SUFFIX}")


def describe_run(input_path: str | os.PathLike, records: int, model_folder: str | os.PathLike | None,
                 settings: dict, sha256: str | None = None) -> dict:
    """The header of a run: a resumed run must match it. ``sha256``: the input's, taken when
    its records were read (else now)."""
    from ..core.checkpoint import fingerprint

    folder = Path(model_folder).expanduser().resolve() if model_folder is not None else None
    return {"kind": KIND, "version": 1, "input": str(Path(input_path).resolve()),
            "input_bytes": os.path.getsize(input_path),
            "input_sha256": sha256 or sha256_file(input_path).hexdigest(),
            "records": records, "model": str(folder) if folder else None,
            "weights": fingerprint(folder) if folder else None, "settings": settings}


def _parse(data: bytes, path: Path) -> tuple[dict, list[dict], int]:
    """(header, rows of the finished chunks, bytes up to the last ``done``)."""
    lines = data.split(b"\n")
    try:
        header = json.loads(lines[0])
        if not isinstance(header, dict) or header.get("kind") != KIND:
            raise ValueError
    except ValueError:
        raise InputError(f"{path} is not a predict run's progress (its first line is not the header "
                         "predict writes); delete it to start over") from None
    rows: list[dict] = []
    pending: list[dict] = []
    kept = len(lines[0]) + 1
    at = kept
    for line in lines[1:-1]:  # the last piece has no newline after it: cut off, or empty
        at += len(line) + 1
        try:
            item = json.loads(line)
        except ValueError:
            break  # a line cut off by a kill: the chunk it belongs to is computed again
        if isinstance(item, dict) and set(item) == {"done"}:
            if item["done"] != len(rows) + len(pending):
                break
            rows += pending
            pending = []
            kept = at
        elif isinstance(item, dict) and "line" in item and "status" in item:
            pending.append(item)
        else:
            break
    return header, rows, min(kept, len(data))


def peek(out: str | os.PathLike) -> tuple[int, int] | None:
    """(records done, records in all) of the unfinished run whose progress is beside ``out``;
    None when there is none (or it cannot be read)."""
    path = partial_path(out)
    try:
        header, rows, _ = _parse(path.read_bytes(), path)
    except (OSError, InputError):
        return None
    return len(rows), int(header.get("records", 0))


def _difference(before: dict, now: dict) -> str | None:
    """What changed since the run began, in one phrase; None when nothing that matters did."""
    if (before.get("input_bytes"), before.get("input_sha256")) != (now["input_bytes"], now["input_sha256"]):
        return f"INPUT {now['input']} changed since the run began (its bytes differ)"
    if before.get("records") != now["records"]:
        return f"INPUT is read as {now['records']} records, and was {before.get('records')}"
    if before.get("weights") != now["weights"] or (now["weights"] is None and before.get("model") != now["model"]):
        return (f"the model differs: the run began with {before.get('model')}, this one loads {now['model']}, "
                "whose files are not the same")
    old, new = before.get("settings") or {}, now["settings"]
    for key in new:
        if old.get(key) != new[key]:
            shown = lambda v: "not given" if v is None else repr(v)  # noqa: E731
            return f"{key.replace('_', '-')} was {shown(old.get(key))} when the run began, now {shown(new[key])}"
    return None


class RunProgress:
    """The open ``FILE.partial`` of a run: :attr:`rows` are the rows already done; :meth:`add`
    appends a finished chunk; :meth:`finish` removes the file once FILE is written."""

    def __init__(self, out: str | os.PathLike, header: dict, *, resume: bool,
                 more: Callable[[], dict] | None = None) -> None:
        """``more()`` adds to the header of a run that starts (not one resumed): what costs time to
        know (the kernel choice) is asked for once the file is this run's."""
        self.fd: int | None = None
        self.path = partial_path(out)
        self.chunks = 0
        self.began: dict = header  # the header of the run resumed (this one's, when starting)
        self._kill_after = int(os.environ.get(KILL_HOOK_ENV, "0") or 0)
        for _ in range(100):  # again only while another run removes the file under us
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise InputError(f"cannot write {self.path} ({os_reason(e)})") from None
            try:
                self._lock()
            except BaseException:
                self._let_go()
                raise
            if same_file(self.fd, self.path):
                break
            self._let_go()  # locked a file another run had just removed: lock the one there now
        else:
            raise InputError(f"cannot lock {self.path}: it keeps being removed")
        try:
            data = b""
            while chunk := os.read(self.fd, 1 << 24):
                data += chunk
            try:
                before, self.rows, keep = _parse(data, self.path)
                self.began = before
            except InputError:
                if data and not HEADER_START.startswith(data[:len(HEADER_START)]):
                    # a file predict did not write (a user's, INPUT itself): never emptied
                    raise InputError(f"{self.path} exists and is not a predict run's progress: move it away, "
                                     "or choose another --out") from None
                before, self.rows, keep = {}, [], 0  # empty, or a header cut off by a kill: nothing was done
            if self.rows:
                if not resume:
                    raise InputError(f"{self.path} holds an unfinished predict run ({len(self.rows)} of "
                                     f"{before.get('records')} records done); pass --resume to finish it, or "
                                     "delete it to start over")
                why = _difference(before, header)
                if why is not None:
                    raise InputError(f"cannot resume: {why}; delete {self.path} to start over")
            else:  # nothing done yet: this run's header, whatever was there
                keep = 0
                self.began = header
            os.ftruncate(self.fd, keep)
            os.lseek(self.fd, keep, os.SEEK_SET)
            if not self.rows:
                if more is not None:
                    header = self.began = {**header, **more()}
                self._write((json.dumps(header) + "\n").encode())
        except BaseException:
            self._let_go()
            raise

    def _let_go(self) -> None:
        os.close(self.fd)
        self.fd = None

    def _remove(self) -> None:
        """Remove the file, if the path still names the one this run holds (while still
        holding its lock: no other run is between its open and its lock on it)."""
        if same_file(self.fd, self.path):
            self.path.unlink(missing_ok=True)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        os.fsync(self.fd)

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise InputError(f"another predict run is writing {self.path} now; wait for it to finish") from None

    def check_rows(self, lines: list[int]) -> None:
        """Refuse progress whose rows are not the first records' (a damaged file)."""
        if [r.get("line") for r in self.rows] != lines[:len(self.rows)]:
            raise InputError(f"{self.path} holds rows for other lines than INPUT's first {len(self.rows)} "
                             "records; delete it to start over")

    def add(self, rows: list[dict]) -> None:
        """Appends one finished chunk's rows and its ``done`` mark, on disk before this returns."""
        done = len(self.rows) + len(rows)
        data = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)
        self._write((data + json.dumps({"done": done}) + "\n").encode())
        self.rows += rows  # once on disk: a write that failed leaves rows = what the file holds
        self.chunks += 1
        if self._kill_after and self.chunks >= self._kill_after:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)

    def finish(self) -> None:
        """FILE is written: the progress goes."""
        if self.fd is not None:
            self._remove()
            self._let_go()

    def close(self) -> None:
        """Let the file go; one that holds no rows goes too (a run that failed or was stopped
        before its first chunk leaves nothing to resume from)."""
        if self.fd is not None:
            if not self.rows:
                self._remove()
            self._let_go()
