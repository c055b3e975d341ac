"""The input of a batch job, split into deterministic shards: one plan, whichever engine runs it.

An input is one file, a folder (every file in it, recursively, in sorted order; names starting
with ``.`` or ``_`` are skipped) or a glob (``data/*.jsonl``, ``s3://bucket/crawl/**/*.parquet``).
A plain path is read with Python's own file functions; a URI with a scheme (``s3://``,
``gs://``, ``hdfs://``, ``file://``) is read through the pyarrow filesystem it names, so any
filesystem pyarrow knows works (pyarrow is needed only then, and for Parquet).

Each file is one of three kinds, from its name:

    parquet   .parquet, .pq: one record per row; the text is the column ``field`` (a string column)
    jsonl     .jsonl, .ndjson, .json, or any file when a field name is given: one JSON object per line
    text      anything else: one text per line

All files of one input must be of one kind. Records are numbered from 1 across the files in
order (for one text file, the record number is the line number). Lines end at ``\\n``; a
trailing ``\\r`` is dropped, and a last line without ``\\n`` is a line.

The plan cuts the records into shards of ``shard_rows`` consecutive records: shard k holds
records k·S + 1 .. (k+1)·S. A shard is a list of pieces, (file, start, stop) byte ranges of text
files or row ranges of Parquet files, so any process that can open the files reads exactly its
shard's records and nothing else. Each shard carries a SHA-256 of its content (the bytes of its
lines; for Parquet, each value's length and bytes), so a resumed job can tell whether the
records behind a finished shard are still the same (see :mod:`bertscope.fast.embedjob`).
"""

from __future__ import annotations

import bisect
import functools
import glob
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import InputError, InputTypeError
from ..files import refuse_binary, split_lines, why_not_a_file

log = logging.getLogger(__name__)

__all__ = ["JOB_FILE", "InputFile", "InputPlan", "Piece", "Shard", "iter_records", "plan_input", "read_shard",
           "read_shard_bytes", "require_pyarrow", "resolve_inputs", "where"]

_BLOCK = 8 << 20  # bytes read at a time while planning a text file
JOB_FILE = "_job.json"  # what marks an embedding job's OUTPUT folder (bertscope.fast.embedjob)
_GLOB_CHARS = "*?["
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass(frozen=True)
class InputFile:
    """One file of an input: where it is, its kind, and (for a URI) the pyarrow filesystem's URI."""

    path: str  # a local path, or the path inside ``fs_uri``'s filesystem
    kind: str  # "text", "jsonl" or "parquet"
    fs_uri: str | None = None  # a URI of the filesystem holding it (a folder or file; None: local)

    @property
    def name(self) -> str:
        """The file as a person would name it (a path, or scheme://path)."""
        return self.path if self.fs_uri is None else self.fs_uri.split("://", 1)[0] + "://" + self.path.lstrip("/")

    def open(self):
        """A binary file object with seek() and read(n)."""
        if self.fs_uri is None:
            return open(self.path, "rb")
        fs, _ = _pyarrow_fs(self.fs_uri)
        return fs.open_input_file(self.path)


@dataclass(frozen=True)
class Piece:
    """Part of a shard inside one file: bytes [start, stop) of a text file, rows of a Parquet file."""

    file: int
    start: int
    stop: int


@dataclass(frozen=True)
class Shard:
    """Records first_row .. first_row + rows - 1 (1-based), where they are, and their SHA-256."""

    index: int
    first_row: int
    rows: int
    pieces: tuple[Piece, ...]
    sha256: str


@dataclass(frozen=True)
class InputPlan:
    """An input cut into shards (see the module doc). Picklable: workers get it as it is."""

    spec: str
    files: tuple[InputFile, ...]
    kind: str
    field: str | None  # the JSON or Parquet field holding the text; None for plain text
    shard_rows: int
    rows: int
    shards: tuple[Shard, ...]
    first_rows: tuple[int, ...] = ()  # the first record number of each file (1-based), in order

    def describe(self) -> dict:
        """What a job records about its input (and a resume compares)."""
        return {"files": [f.name if f.fs_uri else os.path.abspath(f.path) for f in self.files],
                "kind": self.kind, "rows": self.rows}

    def where(self, record: int) -> str:
        """Where record ``record`` (1-based, counted across the files) is: "line N" for one file,
        "NAME:N" (the file as it was named, its own line or row N) for several."""
        return where(record, [f.name for f in self.files], self.first_rows)


def where(record: int, names: list[str], first_rows: list[int] | tuple[int, ...]) -> str:
    """Record ``record`` of an input of the files ``names``, whose records begin at ``first_rows``
    (1-based, counted across the files): "line N" for one file, "NAME:N" for several."""
    if len(names) < 2 or len(first_rows) != len(names):
        return f"line {record}"
    i = max(bisect.bisect_right(first_rows, record) - 1, 0)
    return f"{names[i]}:{record - first_rows[i] + 1}"


def _has_scheme(spec: str) -> bool:
    head, sep, _ = spec.partition("://")
    return bool(sep) and head.isalnum() and len(head) > 1  # "C://" is not a scheme


@functools.lru_cache(maxsize=64)
def _pyarrow_fs(uri: str):
    """(filesystem, path) for a URI; one filesystem object per URI and process."""
    try:
        import pyarrow.fs as pafs
    except ImportError:
        raise InputError(f"reading {uri} needs pyarrow: pip install 'bertscope[parquet]'") from None
    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as e:  # pyarrow.ArrowInvalid is a ValueError
        raise InputError(f"cannot open {uri}: {str(e).splitlines()[0]}") from None


def _kind(name: str, field_name: str | None) -> str:
    suffix = os.path.splitext(name)[1].lower()
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if field_name is not None or suffix in JSONL_SUFFIXES:
        return "jsonl"
    return "text"


def _visible(rel: str) -> bool:
    return not any(part.startswith((".", "_")) for part in Path(rel).parts)


def _without_job_folders(names: list[str], root: Path, spec: str) -> list[str]:
    """``names`` less the files inside an embedding job's OUTPUT folder (one holding
    :data:`JOB_FILE`) at or under ``root``: an OUTPUT written inside its own INPUT folder is not
    read back as input. InputError when that leaves nothing."""
    root = root.resolve()
    is_job: dict[Path, bool] = {}

    def in_job(name: str) -> bool:
        for parent in Path(name).resolve().parents:
            if parent != root and root not in parent.parents:
                return False  # above the input's root: not ours to judge
            if parent not in is_job:
                is_job[parent] = (parent / JOB_FILE).is_file()
            if is_job[parent]:
                return True
        return False

    kept = [n for n in names if not in_job(n)]
    jobs = sorted(str(p) for p, j in is_job.items() if j)
    if names and not kept:
        raise InputError(f"{spec} holds only an embedding job's output ({jobs[0]}: embeddings, not text); "
                         "give the texts it was made from")
    if len(kept) < len(names):
        log.info("left out %d file(s) of embedding job folders (%s)", len(names) - len(kept), ", ".join(jobs))
    return kept


def resolve_inputs(spec: str | os.PathLike, field_name: str | None = None) -> list[InputFile]:
    """The files of an input spec (one file, a folder or a glob), sorted, each with its kind.

    Raises InputError (one line) when nothing matches, or when the files are of mixed kinds.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise InputTypeError(f"the input must be a file, folder or glob (a str or a path), not a "
                             f"{type(spec).__name__}; to embed texts held in memory use bert.embed(texts)")
    spec = os.fspath(spec)
    if not spec.strip():  # "" would be the working folder, read recursively: an unset variable
        raise InputError("the input is an empty name; give a file, a folder or a glob")
    names: list[str]
    fs_uri = None
    if _has_scheme(spec):
        fs_uri, names = _remote_names(spec)
    else:
        p = Path(spec).expanduser()
        if any(c in spec for c in _GLOB_CHARS) and not p.exists():
            head = str(p)[:min(str(p).index(c) for c in _GLOB_CHARS if c in str(p))]
            names = _without_job_folders(sorted(n for n in glob.glob(str(p), recursive=True) if os.path.isfile(n)),
                                         Path(head) if head.endswith(os.sep) else Path(head).parent, spec)
            if not names:
                raise InputError(f"no input file matches {spec}")
        elif p.is_dir():
            names = sorted(str(q) for q in p.rglob("*") if q.is_file() and _visible(str(q.relative_to(p))))
            names = _without_job_folders(names, p, spec)
            if not names:
                raise InputError(f"the input folder {spec} holds no file")
        elif p.is_file():
            names = [str(p)]
        else:
            raise InputError(f"input file {spec} does not exist" if not p.exists() and os.fspath(spec) != "-"
                             else why_not_a_file(spec))
    files = [InputFile(n, _kind(n, field_name), fs_uri) for n in names]
    if field_name is not None and len(files) > 1:  # --field reads any file as JSON Lines: not strays beside them
        named = [f.name for f in files if os.path.splitext(f.name)[1].lower() in JSONL_SUFFIXES]
        other = [f.name for f in files if f.kind == "jsonl" and f.name not in named]
        if named and other:
            raise InputError(f"{spec} holds JSON Lines files ({os.path.basename(named[0])}) and others "
                             f"({os.path.basename(other[0])}{f' and {len(other) - 1} more' if len(other) > 1 else ''}) "
                             "that --field would read as JSON Lines too; name the files with a glob "
                             "such as 'FOLDER/**/*.jsonl'")
    kinds = sorted({f.kind for f in files})
    if "parquet" in kinds:
        require_pyarrow(f"reading Parquet input ({next(f.name for f in files if f.kind == 'parquet')})")
    if len(kinds) > 1:
        first = {k: next(f.name for f in files if f.kind == k) for k in kinds}
        raise InputError(f"{spec} mixes kinds of input ({', '.join(f'{k}: {first[k]}' for k in kinds)}); "
                         "give one kind at a time")
    return files


def _glob_regex(pattern: str) -> "re.Pattern[str]":
    """A glob as a regular expression: ``*`` and ``?`` stay inside one folder, ``**`` crosses them."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:j]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _remote_names(spec: str) -> tuple[str, list[str]]:
    """The files a URI names: one file, a folder's files (recursively) or a glob's matches."""
    import pyarrow.fs as pafs

    globbed = any(c in spec for c in _GLOB_CHARS)
    if not globbed:
        fs, path = _pyarrow_fs(spec)
        info = _file_info(fs, spec, path)
        if info.type == pafs.FileType.File:
            return spec, [path]
        if info.type != pafs.FileType.Directory:
            raise InputError(f"input file {spec} does not exist")
        base, match, root = path.rstrip("/"), None, spec
    else:
        head = spec[:min(spec.index(c) for c in _GLOB_CHARS if c in spec)]
        folder = head[:head.rindex("/") + 1] if "/" in head.split("://", 1)[1] else head
        fs, base = _pyarrow_fs(folder)
        base, root = base.rstrip("/"), folder
        match = _glob_regex(base + "/" + spec[len(folder):].lstrip("/"))
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as e:
        raise InputError(f"cannot list {spec}: {str(e).splitlines()[0]}") from None
    files = [i.path for i in infos if i.type == pafs.FileType.File]
    if match is None:
        names = sorted(n for n in files if _visible(n[len(base):].lstrip("/")))
        if not names:
            raise InputError(f"the input folder {spec} holds no file")
    else:
        names = sorted(n for n in files if match.match(n)  # like glob.glob: hidden names only if asked
                       and not any(p.startswith(".") for p in n[len(base):].split("/")))
        if not names:
            raise InputError(f"no input file matches {spec}")
    return root, names


def _file_info(fs, spec: str, path: str):
    try:
        return fs.get_file_info(path)
    except OSError as e:
        raise InputError(f"cannot open {spec}: {str(e).splitlines()[0]}") from None


class _ShardCutter:
    """Cuts a stream of records (fed piece by piece) into shards of ``S`` records and hashes them."""

    def __init__(self, S: int) -> None:
        self.S = S
        self.shards: list[Shard] = []
        self.rows = 0
        self._pieces: list[Piece] = []
        self._in = 0
        self._hash = hashlib.sha256()

    @property
    def need(self) -> int:
        return self.S - self._in

    def add(self, piece: Piece, records: int, content: bytes | None = None) -> None:
        """Add a piece of one file holding ``records`` record ends (at most ``need``) to the open
        shard; a piece may also hold the start of a record not yet ended (0 records)."""
        if records == 0 and piece.start == piece.stop:
            return
        if self._pieces and self._pieces[-1].file == piece.file and self._pieces[-1].stop == piece.start:
            last = self._pieces.pop()  # continues the last piece: one piece, one file prefix
            piece = Piece(piece.file, last.start, piece.stop)
        else:
            self._hash.update(f"{piece.file}:".encode())
        if content is not None:
            self._hash.update(content)
        self._pieces.append(piece)
        self._in += records
        self.rows += records
        if self._in == self.S:
            self.close()

    def close(self) -> None:
        if self._in:
            self.shards.append(Shard(len(self.shards), self.rows - self._in + 1, self._in,
                                     tuple(self._pieces), self._hash.hexdigest()))
        self._pieces, self._in, self._hash = [], 0, hashlib.sha256()


def _plan_text_file(cut: _ShardCutter, index: int, f, name: str = "") -> None:
    """Feed one text/JSONL file to the cutter, block by block: a shard ends just after a ``\n``.

    The bytes of a line not yet ended belong to the open shard already (that line will be its
    next record), so they are hashed as they come and no block is ever read twice.
    """
    pos = 0  # file offset of the first byte not yet given to the cutter
    ended = True  # whether the bytes so far end with "\n"
    while True:
        block = f.read(_BLOCK)
        if not block:
            break
        if pos == 0:
            refuse_binary(name, block)
        nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)  # positions of "\n"
        i, used = 0, 0  # newlines of the block given to the cutter; bytes of the block given
        while len(nl) - i >= cut.need:  # enough newlines to close the open shard
            n = cut.need
            j = int(nl[i + n - 1]) + 1  # just after the n-th newline
            cut.add(Piece(index, pos, pos + j - used), n, block[used:j])
            pos, used, i = pos + j - used, j, i + n
        if used < len(block):  # fewer lines than the shard needs, and maybe a line not yet ended
            cut.add(Piece(index, pos, pos + len(block) - used), len(nl) - i, block[used:])
            pos += len(block) - used
        ended = block.endswith(b"\n")
    if not ended:  # a last line without "\n" is a line
        cut.add(Piece(index, pos, pos), 1, b"")


def _text_column(pf, file: InputFile, field_name: str):
    import pyarrow as pa

    schema = pf.schema_arrow
    if field_name not in schema.names:
        shown = ", ".join(repr(n) for n in schema.names[:6]) + (", ..." if len(schema.names) > 6 else "")
        hint = " (choose it with --field)" if schema.names else ""
        raise InputError(f"{file.name} has no column {field_name!r}; its columns are {shown}{hint}")
    t = schema.field(field_name).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        raise InputError(f"{file.name}: the column {field_name!r} holds {t}, not text")


def _parquet_values(col) -> list[bytes | None]:
    import pyarrow as pa

    return col.cast(pa.large_binary()).to_pylist()


def _hash_values(values: list[bytes | None]) -> bytes:
    parts = []
    for v in values:
        parts.append(b"\xff" * 8 if v is None else len(v).to_bytes(8, "little") + v)
    return b"".join(parts)


def require_pyarrow(what: str) -> None:
    """InputError (one line, with the pip command) unless pyarrow is installed."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise InputError(f"{what} needs pyarrow: pip install 'bertscope[parquet]'") from None


def _open_parquet(file: InputFile):
    require_pyarrow(f"reading {file.name}")
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file.open())
    except (OSError, ValueError) as e:  # pyarrow.ArrowInvalid (not Parquet, damaged) is a ValueError
        raise InputError(f"cannot read {file.name} as Parquet ({str(e).splitlines()[0]})") from None


def _plan_parquet_file(cut: _ShardCutter, index: int, file: InputFile, field_name: str) -> None:
    pf = _open_parquet(file)
    _text_column(pf, file, field_name)
    row = 0
    try:
        batches = list(pf.iter_batches(columns=[field_name], batch_size=65536))
    except (OSError, ValueError) as e:  # a damaged page, a column chunk that does not decode
        raise InputError(f"cannot read {file.name} as Parquet ({str(e).splitlines()[0]})") from None
    for batch in batches:
        values = _parquet_values(batch.column(0))
        i = 0
        while i < len(values):
            n = min(cut.need, len(values) - i)
            cut.add(Piece(index, row, row + n), n, _hash_values(values[i:i + n]))
            row, i = row + n, i + n


def plan_input(spec: str | os.PathLike, *, field_name: str | None = None, shard_rows: int = 10_000,
               files: list[InputFile] | None = None) -> InputPlan:
    """Read the input once, count its records and cut them into hashed shards (module doc).

    ``field_name`` is the JSON or Parquet field with the text (default "text"; plain text
    files have none). Bad input raises InputError, before any work.
    """
    if shard_rows < 1:
        raise InputError("the shard size must be at least 1")
    files = files if files is not None else resolve_inputs(spec, field_name)
    kind = files[0].kind
    field = (field_name or "text") if kind != "text" else None
    cut = _ShardCutter(shard_rows)
    first_rows = []
    for i, f in enumerate(files):
        first_rows.append(cut.rows + 1)
        if kind == "parquet":
            _plan_parquet_file(cut, i, f, field)  # type: ignore[arg-type]
            continue
        try:
            with f.open() as fh:
                _plan_text_file(cut, i, fh, f.name)
        except OSError as e:
            raise InputError(f"cannot read {f.name} ({getattr(e, 'strerror', None) or e})") from None
    cut.close()
    return InputPlan(spec=os.fspath(spec), files=tuple(files), kind=kind, field=field,
                     shard_rows=shard_rows, rows=cut.rows, shards=tuple(cut.shards), first_rows=tuple(first_rows))


def read_piece(plan: InputPlan, piece: Piece, h=None) -> list[bytes | None]:
    """The raw records of one piece of a shard (see :func:`read_shard`), its content added to
    the hash ``h`` when given."""
    f = plan.files[piece.file]
    if plan.kind == "parquet":
        values = _read_parquet_rows(f, plan.field, piece.start, piece.stop)  # type: ignore[arg-type]
        if h is not None:
            h.update(_hash_values(values))
        return values
    with f.open() as fh:
        fh.seek(piece.start)
        data = fh.read(piece.stop - piece.start)
    if h is not None:
        h.update(data)
    return split_lines(data)  # a byte range that ends after a "\n" or at the end


def read_shard(plan: InputPlan, shard: Shard, *, verify: bool = True) -> list[bytes | None]:
    """The raw records of one shard, in order: bytes of each line (without its line ending),
    or each Parquet value's bytes (None for a null). With ``verify``, the content must still
    hash to the plan's SHA-256, else InputError: the input changed after it was planned."""
    h = hashlib.sha256()
    out: list[bytes | None] = []
    for piece in shard.pieces:
        h.update(f"{piece.file}:".encode())
        out.extend(read_piece(plan, piece, h))
    if len(out) != shard.rows or (verify and h.hexdigest() != shard.sha256):
        raise InputError(f"the input changed while the job ran: records {shard.first_row}.."
                         f"{shard.first_row + shard.rows - 1} differ from when it was planned")
    return out


def read_shard_bytes(plan: InputPlan, shard: Shard, *, verify: bool = True) -> bytes:
    """The bytes of a text shard's pieces, joined (lines and their endings, as in the file)."""
    if plan.kind == "parquet":
        raise ValueError("read_shard_bytes reads text shards only")
    h = hashlib.sha256()
    parts = []
    for piece in shard.pieces:
        with plan.files[piece.file].open() as fh:
            fh.seek(piece.start)
            data = fh.read(piece.stop - piece.start)
        h.update(f"{piece.file}:".encode())
        h.update(data)
        parts.append(data)
    if verify and h.hexdigest() != shard.sha256:
        raise InputError(f"the input changed while the job ran: records {shard.first_row}.."
                         f"{shard.first_row + shard.rows - 1} differ from when it was planned")
    return b"".join(parts)


def _read_parquet_rows(file: InputFile, field_name: str, start: int, stop: int) -> list[bytes | None]:
    import pyarrow as pa

    pf = _open_parquet(file)
    groups, first, row = [], None, 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if row + n > start and row < stop:
            groups.append(g)
            first = row if first is None else first
        row += n
    if not groups:
        return []
    table = pf.read_row_groups(groups, columns=[field_name])
    col = pa.concat_arrays(table.column(0).chunks) if table.num_rows else table.column(0)
    return _parquet_values(col.slice(start - first, stop - start))


def iter_records(plan: InputPlan, *, verify: bool = True) -> Iterator[tuple[int, bytes | None]]:
    """(record number, raw record) over the whole plan, shard by shard."""
    for shard in plan.shards:
        for i, raw in enumerate(read_shard(plan, shard, verify=verify)):
            yield shard.first_row + i, raw
