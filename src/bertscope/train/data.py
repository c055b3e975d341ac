"""Labelled texts from CSV, TSV or JSON Lines files, with the line number of every record.

A file's format is its suffix: ``.csv`` (comma-separated, a header row naming the columns),
``.tsv`` / ``.tab`` (tab-separated, a header row), ``.jsonl`` / ``.ndjson`` / ``.json`` (JSON
Lines: one JSON object per line). Text lines (``.txt`` or anything else) are accepted where no
labels are needed (:func:`read_records` for ``bertscope predict``).

Every record gets a status, as ``bertscope embed`` gives its lines:

    ok           a text (and its label, when one is read)
    empty        an empty or whitespace-only text
    undecodable  bytes that are not UTF-8
    bad_json     (JSON Lines) not valid JSON
    no_field     no text field (a JSON line that is not an object, or lacks the field;
                 a CSV row that is too short)
    not_text     the text field holds no string (a number, null, a list...)
    extra_fields (CSV/TSV) a row with more fields than the header names, not all of them
                 empty: most often a comma (or tab) in an unquoted text, which shifts the
                 columns, so no field of the row can be trusted

Training data must be clean: :func:`read_examples` refuses a file with any bad record, naming
the first ones by line number, in order (one line of text, as the CLI prints errors).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from ..files import read_input_bytes, refuse_binary, split_lines, why_not_a_file

__all__ = ["Example", "LabelSet", "Record", "STATUSES", "read_examples", "read_records", "file_format"]

log = logging.getLogger(__name__)

STATUSES = ("ok", "empty", "undecodable", "bad_json", "no_field", "not_text", "extra_fields")
FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}


@dataclass(frozen=True)
class Record:
    """One record of an input file. ``line`` is 1-based (a CSV record spanning several lines:
    its first). ``label`` is None when not read or missing; ``label_problem`` says why a label
    could not be read (None when fine)."""

    line: int
    text: str
    pair: str | None
    status: str
    label: str | None = None
    label_problem: str | None = None
    label_missing: bool = False  # the label is not there (no field, empty, null, "nan"), not unreadable
    field: str | None = None  # the field a no_field / not_text status is about
    blank: bool = False  # an empty or whitespace-only line (status "empty"), not an empty field


@dataclass(frozen=True)
class Example:
    """A clean training or evaluation example: its line, text (and pair) and label name."""

    line: int
    text: str
    pair: str | None
    label: str


def file_format(path: str | Path, *, lines_ok: bool = False) -> str:
    """"csv", "tsv" or "jsonl" from the suffix; "lines" for anything else when ``lines_ok``."""
    if str(path) == "-":  # standard input: said so, not "a file without a suffix"
        raise InputError(why_not_a_file(path))
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        if lines_ok:
            return "lines"
        raise InputError(f"{path}: the file must be .csv, .tsv or JSON Lines (.jsonl, .ndjson, .json), "
                         f"not {Path(path).suffix or 'a file without a suffix'}")
    return fmt


MISSING_LABELS = {"nan", "<na>", "nat"}  # how pandas' astype(str) writes NaN, pd.NA and NaT


def _label_value(value: object) -> tuple[str | None, str | None, bool]:
    """(label name, None, False) for a string or an int; (None, problem, missing) for anything
    else, ``missing`` when the value stands for no label (null, empty, "nan") rather than one
    that cannot be read (a float, a list, a boolean, a tab)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        kind = "null" if value is None else type(value).__name__
        return None, f"is {kind} ({json.dumps(value)[:40]}), not a string or an integer", value is None
    name = str(value).strip()
    if not name:
        return None, "is empty", True
    if name.lower() in MISSING_LABELS:  # pandas writes a missing value as "nan" (astype(str), to_csv of None: "")
        return None, f"is {name!r}, a missing value written as text; fill or drop the record", True
    if any(c in name for c in "\t\r\n"):  # predict writes labels as TSV cells
        return None, f"holds a tab or a line break ({json.dumps(name)[:40]}); a label is one line without tabs", False
    return name, None, False


def _from_fields(line: int, get, text_field: str, pair_field: str | None,
                 label_field: str | None) -> Record:
    """A Record from a mapping-like ``get(name) -> value | KeyError``."""
    try:
        text = get(text_field)
    except KeyError:
        return Record(line, "", None, "no_field", field=text_field)
    if not isinstance(text, str):
        return Record(line, "", None, "not_text", field=text_field)
    pair = None
    if pair_field is not None:
        try:
            pair = get(pair_field)
        except KeyError:
            return Record(line, "", None, "no_field", field=pair_field)
        if not isinstance(pair, str):
            return Record(line, "", None, "not_text", field=pair_field)
    label = problem = None
    missing = False
    if label_field is not None:
        try:
            label, problem, missing = _label_value(get(label_field))
        except KeyError:
            problem, missing = "is missing", True
    status = "ok" if text.strip() or (pair is not None and pair.strip()) else "empty"
    return Record(line, text, pair, status, label, problem, label_missing=missing)


def _jsonl(data: bytes, text_field: str, pair_field: str | None, label_field: str | None,
           keep_blank: bool) -> Iterator[Record]:
    for n, raw in enumerate(split_lines(data), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            yield Record(n, "", None, "undecodable")
            continue
        if not line.strip():
            if keep_blank:
                yield Record(n, "", None, "empty", blank=True)
            continue  # else blank lines are not records
        try:
            obj = json.loads(line.lstrip("\ufeff"))
        except ValueError:
            yield Record(n, "", None, "bad_json")
            continue
        if not isinstance(obj, dict):
            yield Record(n, "", None, "no_field", field=text_field)
            continue
        yield _from_fields(n, obj.__getitem__, text_field, pair_field, label_field)


_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_UNDECODABLE = re.compile("[\udc80-\udcff]")


def _field_spans(raw: str, delimiter: str) -> list[tuple[int, int, bool]]:
    """(start, end, malformed) of each field of one line, split as Python's csv module splits it
    when not strict: a quote opens a quoted field only as a field's first character; in one, a
    doubled quote is a quote and a quote before the delimiter (or the line's end) closes it; a
    quote before anything else closes it too, and the field goes on unquoted: that field is
    malformed."""
    spans: list[tuple[int, int, bool]] = []
    start, i, quoted, bad = 0, 0, False, False
    while i < len(raw):
        c = raw[i]
        if quoted:
            if c == '"':
                if raw[i + 1:i + 2] == '"':
                    i += 2
                    continue
                quoted = False
                if i + 1 < len(raw) and raw[i + 1] != delimiter:
                    bad = True
        elif c == delimiter:
            spans.append((start, i, bad))
            start, bad = i + 1, False
        elif c == '"' and i == start:
            quoted = True
        i += 1
    spans.append((start, len(raw), bad))
    return spans


def _delimited(path: Path, data: bytes, delimiter: str, text_field: str, pair_field: str | None,
               label_field: str | None, keep_blank: bool) -> Iterator[Record]:
    # bytes that are not UTF-8 become lone surrogates (U+DC80..U+DCFF), which no UTF-8 text
    # holds: a row with one in a column read is a record of status "undecodable", as a text
    # file's line is (other columns are not read)
    text = data.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    # no field is longer than its file: the csv module's own limit (131,072 characters) refused
    # a whole file for one long review, which is read and cut as a long line of a .jsonl is.
    # The limit is the process's: raised while this file is read, then given back.
    kept_limit = csv.field_size_limit()
    csv.field_size_limit(min(max(kept_limit, len(text) + 1), 2**31 - 1))
    try:
        yield from _delimited_rows(path, text, delimiter, text_field, pair_field, label_field, keep_blank)
    finally:
        csv.field_size_limit(kept_limit)


def _delimited_rows(path: Path, text: str, delimiter: str, text_field: str, pair_field: str | None,
                    label_field: str | None, keep_blank: bool) -> Iterator[Record]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    kind = "CSV" if delimiter == "," else "TSV"
    lines: list[str] = []  # the file's lines, read only when a record must be checked

    def check_quotes(first: int, last: int, *, is_last: bool) -> None:
        """A record over several lines, or the file's last, read again strictly: a quoted field
        that runs over lines and does not end where a field ends (a quote never closed, read to
        the end of the file or to the next stray quote), or a quote on the last line that never
        closes, is refused rather than merged into one text. An unclosed quote that happens to
        close, lines later, right before a delimiter is valid CSV and cannot be told apart."""
        if last == first and not is_last:
            return  # one line: read by one_line()
        if not lines:
            lines.extend(io.StringIO(text, newline="").readlines())
        raw = "".join(lines[first - 1:last])
        try:
            list(csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter, strict=True))
        except csv.Error as e:
            if last > first or "unexpected end of data" in str(e):
                span = "" if last == first else f", so lines {first}-{last} would be read as one field"
                raise InputError(f"{path}: a quoted field (\") opens on line {first} and does not end where "
                                 f"a {kind} field ends (its quote never closes, or text follows it){span}; "
                                 "close the quote, or double a quote inside a quoted field (\"\")") from None

    def one_line(n: int, row: list[str]) -> list[str]:
        """A one-line record with a quote, read again strictly. A field that opens with a quote
        and goes on after it closes ("Great" movie, really) is not valid CSV or TSV, and the
        lenient reader dropped its quotes: such a field is taken as written, quotes and all.
        The fields around it, and where the fields end, are as the lenient reader found them."""
        raw = lines[n - 1].rstrip("\r\n")
        try:
            list(csv.reader([raw], delimiter=delimiter, strict=True))
        except csv.Error as e:
            if "unexpected end of data" in str(e):
                return row  # a quote never closed on the file's last line: check_quotes says so
            spans = _field_spans(raw, delimiter)
            if len(spans) == len(row):
                return [raw[a:b] if bad else cell for (a, b, bad), cell in zip(spans, row)]
        return row

    quoted = '"' in text
    if quoted:  # the lines are read again where a quote is
        lines.extend(io.StringIO(text, newline="").readlines())
    start = 1  # the line the record being read begins on
    try:
        header = next(reader, None)
        if header is None:
            return
        header_end = reader.line_num
        check_quotes(1, header_end, is_last=False)
        if _UNDECODABLE.search("".join(header)):
            raise InputError(f"{path}: line 1 (the header) is not UTF-8 text")
        columns = [c.strip() for c in header]
        wanted = [f for f in (text_field, pair_field, label_field) if f is not None]
        missing = [f for f in wanted if f not in columns]
        if missing:
            raise InputError(f"{path} has no column {missing[0]!r} (its header names: {', '.join(columns)})")
        where = {name: columns.index(name) for name in wanted}
        start = reader.line_num + 1
        pending = None  # the record read last: checked once it is known whether it is the file's last
        for row in reader:
            n, start = start, reader.line_num + 1
            if pending is not None:
                check_quotes(*pending, is_last=False)
            pending = (n, reader.line_num)
            if quoted and n == reader.line_num and '"' in lines[n - 1]:
                row = one_line(n, row)
            if not any(cell.strip() for cell in row):
                if keep_blank:
                    yield Record(n, "", None, "empty", blank=True)
                continue  # else blank lines are not records

            if any(_UNDECODABLE.search(row[i]) for i in where.values() if i < len(row)):  # the cells read
                yield Record(n, "", None, "undecodable")
                continue
            if any(cell.strip() for cell in row[len(columns):]):  # "Great movie, really,pos": shifted
                yield Record(n, "", None, "extra_fields")
                continue

            def get(name: str, row=row):
                i = where[name]
                if i >= len(row):
                    raise KeyError(name)
                return row[i]

            yield _from_fields(n, get, text_field, pair_field, label_field)
        check_quotes(*(pending or (1, header_end)), is_last=True)
    except csv.Error as e:
        raise InputError(f"{path}: line {reader.line_num} is not valid {kind} ({e})") from None


def read_records(path: str | Path, *, text_field: str = "text", pair_field: str | None = None,
                 label_field: str | None = None, lines_ok: bool = False, keep_blank: bool = False) -> list[Record]:
    """Every record of a CSV, TSV or JSON Lines file (or, with ``lines_ok``, a text file: one
    text per line), each with its line number and status, in file order. Blank lines are skipped,
    except in a text file, where every line is a record, and with ``keep_blank``: a blank line
    is then a record with status "empty" and ``blank`` set (as `bertscope embed` counts lines).

    A missing or unreadable file, a binary or UTF-16 one (a NUL byte near its start), or a CSV/TSV
    header without the named columns, is an InputError.
    """
    path = Path(path)
    fmt = file_format(path, lines_ok=lines_ok)
    data = read_input_bytes(path)
    refuse_binary(str(path), data)  # UTF-16 or binary: refused as embed refuses it, not read as lines
    if fmt == "jsonl":
        if data.lstrip().removeprefix(b"\xef\xbb\xbf").startswith(b"["):
            raise InputError(f"{path} is one JSON document (an array), not JSON Lines, one JSON object per "
                             f"line (convert with: jq -c '.[]' {path})")
        return list(_jsonl(data, text_field, pair_field, label_field, keep_blank))
    if fmt in ("csv", "tsv"):
        return list(_delimited(path, data, "," if fmt == "csv" else "\t", text_field, pair_field, label_field,
                               keep_blank))
    out = []
    for n, raw in enumerate(split_lines(data), start=1):
        try:
            line = raw.decode("utf-8").lstrip("\ufeff") if n == 1 else raw.decode("utf-8")
        except UnicodeDecodeError:
            out.append(Record(n, "", None, "undecodable"))
            continue
        blank = not line.strip()
        out.append(Record(n, line, None, "empty" if blank else "ok", blank=blank))
    return out


_PROBLEM = {"undecodable": "is not UTF-8 text", "bad_json": "is not valid JSON",
            "no_field": "has no field {field!r}", "not_text": "has a {field!r} that is not a string",
            "empty": "has an empty text",
            "extra_fields": "has more fields than the header names (a comma or tab in a text? quote that field)"}


def read_examples(path: str | Path, *, text_field: str = "text", pair_field: str | None = None,
                  label_field: str = "label", what: str = "TRAIN") -> list[Example]:
    """The labelled examples of a training or dev file; a file with any bad record is refused.

    Raises InputError (one line) for: an empty file; records that are not valid, lack the text
    or label field, or hold a label that is not a string or an integer (the first few are named
    by line number, in order).
    """
    records = read_records(path, text_field=text_field, pair_field=pair_field, label_field=label_field)
    if not records:
        try:
            empty = Path(path).stat().st_size == 0
        except OSError:
            empty = True
        raise InputError(f"{what} {path} holds no examples ("
                         + ("it is empty)" if empty else "no record: only a header, or blank lines)"))
    problems: list[str] = []
    for r in records:
        if r.status != "ok":
            problems.append(f"line {r.line} " + _PROBLEM[r.status].format(field=r.field or text_field))
        elif r.label is None:
            problems.append(f"line {r.line}: the label field {label_field!r} {r.label_problem}")
    if problems:
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InputError(f"{what} {path}: {len(problems)} bad record(s): {shown}{more}")
    return [Example(r.line, r.text, r.pair, r.label) for r in records]  # type: ignore[arg-type]


@dataclass(frozen=True)
class LabelSet:
    """The classes, in index order: integer names first, in numeric order, then the other names
    sorted (``2, 10, neg, pos``)."""

    names: tuple[str, ...]

    @classmethod
    def from_examples(cls, examples: list[Example], path: str | Path = "TRAIN") -> "LabelSet":
        names = set(e.label for e in examples)
        if len(names) < 2:
            only = next(iter(names)) if names else None
            raise InputError(f"{path} has only one class ({only!r}); a classifier needs at least 2")

        def key(name: str):
            try:
                return (0, int(name), "")
            except ValueError:
                return (1, 0, name)

        numbers: dict[float, str] = {}
        for name in sorted(names, key=key):
            if not _DECIMAL.fullmatch(name):  # plain decimals only: not "nan", "inf" or "1_0"
                continue
            value = float(name)
            if value in numbers:  # "1" and "1.0": one class written two ways would become two
                raise InputError(f"{path} has the labels {numbers[value]!r} and {name!r}, one number written "
                                 "two ways, which would be two classes: write each label one way")
            numbers[value] = name
        ordered = tuple(sorted(names, key=key))
        words = [n for n in ordered if n not in numbers.values()]
        if numbers and words:
            log.warning("%s mixes number and word labels (%s): each is a class of its own", path,
                        ", ".join(ordered[:6]) + (", ..." if len(ordered) > 6 else ""))
        folded: dict[str, str] = {}
        for name in ordered:  # "neg" and "Neg": most likely one class, written two ways
            if name.casefold() in folded:
                log.warning("%s has the labels %r and %r, which differ only in case: each is a class of its own "
                            "(write each label one way if they are one class)", path, folded[name.casefold()], name)
            folded.setdefault(name.casefold(), name)
        return cls(ordered)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))

    @property
    def label2id(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def ids(self, examples: list[Example], path: str | Path = "DEV") -> list[int]:
        """Class indices of the examples; a label this set lacks is an InputError naming its line."""
        table = self.label2id
        unknown = [e for e in examples if e.label not in table]
        if unknown:
            e = unknown[0]
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise InputError(f"{path} line {e.line} has the label {e.label!r}, which TRAIN does not have "
                             f"(labels: {', '.join(self.names)}){more}")
        return [table[e.label] for e in examples]
