"""Read the Winograd Schema Challenge XML format (Levesque, Davis, Morgenstern 2012).

    <schema>
      <text><txt1>The trophy doesn't fit into the brown suitcase because</txt1>
            <pron>it</pron> <txt2>is too large.</txt2></text>
      <answers><answer>The trophy</answer><answer>the brown suitcase</answer></answers>
      <correctAnswer>A</correctAnswer>
      <source>Hector Levesque</source>
    </schema>

Each ``<schema>`` is parsed on its own with the standard library, so one malformed schema is
reported (by its number and line) and skipped while the rest of the file is still read.
Documents with a DTD or entity declarations are refused (no entity expansion, ever).

A candidate is located in the text as a whole-word, case-insensitive match of its answer text
(whitespace normalised); if that fails, without a leading "the"/"a"/"an". Of several matches
the last one before the pronoun is taken (else the first after it).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, InputTypeError
from ..core.words import as_word
from ..files import read_input_bytes

__all__ = ["BUNDLED_SCHEMAS", "Schema", "SchemaWarning", "parse_wsc", "warnings_within", "read_wsc", "schema_spans", "twin_groups"]

# bertscope's own 12 schemas in the WSC format, shipped with the package (`coref --bundled`)
BUNDLED_SCHEMAS = Path(__file__).resolve().parent / "data" / "pronouns.xml"

_DECL = re.compile(rb"<\?xml[^>]*encoding=[\"']([A-Za-z0-9._-]+)[\"']")
# byte-order marks, longest first (UTF-32 LE's begins with UTF-16 LE's); each codec reads its mark
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xef\xbb\xbf", "utf-8-sig"),
         (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))
# An opening or closing <schema> tag. [^<>]* stops at the next "<", so every scan is bounded
# by the distance to the next tag and the whole file is read in one linear pass (a lazy
# "<schema>.*?</schema>" rescans the rest of the file for each unclosed tag: quadratic).
_TAG = re.compile(r"<(/?)schema\b[^<>]*>")
_DET = re.compile(r"^(the|a|an)\s+", re.I)
_NO_SPACE_BEFORE = (",", ".", ";", ":", "!", "?", "'", ")", "’")


@dataclass(frozen=True)
class Schema:
    """One schema, with character spans into ``text``.

    number:          1-based position in the file; ``line`` the line its <schema> starts on.
    pronoun_span:    (start, end) of the pronoun in ``text``.
    candidate_spans: (start, end) of each candidate in ``text``.
    correct:         index of the correct candidate (0 for A, 1 for B).
    """

    number: int
    line: int
    text: str
    pronoun: str
    pronoun_span: tuple[int, int]
    candidates: tuple[str, ...]
    candidate_spans: tuple[tuple[int, int], ...]
    correct: int
    source: str = ""

    @property
    def label(self) -> str:
        return f"schema {self.number} (line {self.line})"


def _norm(s: str | None) -> str:
    return " ".join((s or "").split())


def _locate(text: str, answer: str, pron_start: int) -> tuple[int, int] | None:
    for cand in (answer, _DET.sub("", answer)):
        if not cand:
            continue
        pat = re.compile(as_word(re.escape(cand).replace(r"\ ", r"\s+"), cand), re.I)
        hits = [(m.start(), m.end()) for m in pat.finditer(text)]
        if hits:
            before = [h for h in hits if h[1] <= pron_start]
            return before[-1] if before else hits[0]
    return None


def _schema(elem: ET.Element, number: int, line: int) -> Schema:
    """Build one Schema; raises ValueError with a reason (the caller adds the schema's name)."""
    text_el = elem.find("text")
    if text_el is None:
        raise ValueError("it has no <text>")
    parts = {tag: _norm(text_el.findtext(tag)) for tag in ("txt1", "pron", "txt2")}
    if not parts["pron"]:
        raise ValueError("its <pron> is missing or empty")
    text = parts["txt1"]
    if text:
        text += " "
    start = len(text)
    text += parts["pron"]
    end = len(text)
    if parts["txt2"]:
        text += ("" if parts["txt2"].startswith(_NO_SPACE_BEFORE) else " ") + parts["txt2"]
    answers = [_norm(a.text) for a in elem.findall("answers/answer")]
    if len(answers) < 2 or any(not a for a in answers):
        raise ValueError(f"it needs two non-empty <answer>s, found {len(answers)}")
    raw = _norm(elem.findtext("correctAnswer")).rstrip(".").strip().upper()
    letters = "ABCDEFGH"[: len(answers)]
    if len(raw) != 1 or raw not in letters:
        raise ValueError(f"its <correctAnswer> {raw!r} is not one of {', '.join(letters)}")
    spans = []
    for a in answers:
        span = _locate(text, a, start)
        if span is None:
            raise ValueError(f"its candidate {a!r} is not in the text {text!r}")
        if span[0] < end and start < span[1]:
            raise ValueError(f"its candidate {a!r} overlaps the pronoun")
        for other, same in zip(answers, spans):  # "Bob" / "Bob": one span, a tie on every score
            if span == same:  # (nested spans, "Emma's" / "Emma's mother", are two candidates)
                raise ValueError(f"its candidates {other!r} and {a!r} are the same words of the text")
        spans.append(span)
    return Schema(number=number, line=line, text=text, pronoun=parts["pron"], pronoun_span=(start, end),
                  candidates=tuple(answers), candidate_spans=tuple(spans), correct=letters.index(raw),
                  source=_norm(elem.findtext("source")))


class SchemaWarning(str):
    """A warning about one schema that could not be used: the text, with the schema's number in
    its file (``number``), so that a count of schemas 1..K (WSC273) can leave out the others'."""

    number: int

    def __new__(cls, text: str, number: int) -> "SchemaWarning":
        w = super().__new__(cls, text)
        w.number = number
        return w

    def __reduce__(self):  # pickles and copies as itself, number included
        return (SchemaWarning, (str(self), self.number))


def warnings_within(warnings: list[str], limit: int | None) -> list[str]:
    """The warnings about schemas 1..``limit`` (all of them without a limit); one with no
    number (a plain str) is kept."""
    if limit is None:
        return list(warnings)
    return [w for w in warnings if getattr(w, "number", 0) <= limit]


def parse_wsc(data: bytes, name: str = "the file") -> tuple[list[Schema], list[str]]:
    """Schemas from WSC XML bytes, and one warning per schema that could not be used (a
    :class:`SchemaWarning`: a str that knows the schema's number). The
    encoding is the byte-order mark's (UTF-8, UTF-16 or UTF-32, as XML reads one), else the
    declaration's, else UTF-8."""
    if not isinstance(data, (bytes, bytearray)):
        raise InputTypeError(f"parse_wsc() reads the file's bytes (Path(path).read_bytes(), or read_wsc(path)), "
                             f"not {type(data).__name__}")
    bom = next((codec for mark, codec in _BOMS if data.startswith(mark)), None)
    m = None if bom else _DECL.search(data[:200])
    encoding = bom or (m.group(1).decode("ascii") if m else "utf-8")
    try:
        text = data.decode(encoding)
    except (LookupError, UnicodeDecodeError) as e:
        raise InputError(f"{name} is not readable as {encoding} ({e}); save it as UTF-8") from None
    text = text.removeprefix("\ufeff")
    if re.search(r"<!(DOCTYPE|ENTITY)", text, re.I):  # in the text: a UTF-16 file hid it from a byte search
        raise InputError(f"{name} declares a DTD or entities; bertscope refuses those (remove the <!DOCTYPE>)")
    spans, unclosed = _numbered_spans(text)
    if not spans:
        raise InputError(f"{name} has no <schema>...</schema> elements: is it in the WSC XML format?")
    schemas: list[Schema] = []
    warnings: list[str] = []
    if unclosed:  # one warning for them all (a broken file may hold thousands), numbered by the first
        first, at = unclosed[0]
        warnings.append(SchemaWarning(
            f"{name}: {len(unclosed)} <schema> element(s) are not closed and were skipped (the first: schema "
            f"{first}, line {text.count(chr(10), 0, at) + 1})", first))
    line, counted = 1, 0
    for number, start, end in spans:
        line += text.count("\n", counted, start)  # counted once across the file, not from 0 each time
        counted = start
        try:
            elem = ET.fromstring(text[start:end])
        except ET.ParseError as e:
            warnings.append(SchemaWarning(f"schema {number} (line {line}): malformed XML ({e}); skipped", number))
            continue
        try:
            schemas.append(_schema(elem, number, line))
        except ValueError as e:
            warnings.append(SchemaWarning(f"schema {number} (line {line}): {e}; skipped", number))
    return schemas, warnings


def schema_spans(text: str) -> tuple[list[tuple[int, int]], int]:
    """(start, end) of each closed <schema>...</schema> element, in one linear pass over the
    tags, and how many <schema> tags were opened. An opening tag followed by another opening
    tag before any closing one was never closed; it is counted, not matched."""
    spans, unclosed = _numbered_spans(text)
    return [(start, end) for _, start, end in spans], len(spans) + len(unclosed)


def _numbered_spans(text: str) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """(number, start, end) of each closed <schema> element and (number, start) of each unclosed
    one, numbered by their opening tags' order in the file from 1: a schema's number is its
    position, whatever came before it (WSC273 is the first 273)."""
    spans: list[tuple[int, int, int]] = []
    unclosed: list[tuple[int, int]] = []
    opened = 0
    start: int | None = None
    for m in _TAG.finditer(text):
        if not m.group(1):  # <schema ...>
            if start is not None:  # the one opened before it was never closed
                unclosed.append((opened, start))
            opened += 1
            start = m.start()
        elif start is not None:  # </schema> closing the last one opened
            spans.append((opened, start, m.end()))
            start = None
    if start is not None:
        unclosed.append((opened, start))
    return spans, unclosed


def read_wsc(path: str | Path) -> tuple[list[Schema], list[str]]:
    """Read a WSC XML file from any path; see :func:`parse_wsc`."""
    return parse_wsc(read_input_bytes(path), str(path))


def twin_groups(schemas: list[Schema]) -> list[int]:
    """A group id per schema: consecutive schemas are twins, one group, when they have the same
    candidates or share at least half their words (Jaccard index of their lower-cased word
    sets; "a minnow" / "a shark" below "that duck" are twins with another candidate).

    Twins share almost all their words, so the held-out split keeps each group on one side.
    """
    groups: list[int] = []
    last: tuple[tuple[str, ...], set[str]] | None = None
    g = -1
    for s in schemas:
        key = (tuple(c.lower() for c in s.candidates), set(_WORD.findall(s.text.lower())))
        if last is None or not (key[0] == last[0] or len(key[1] & last[1]) >= 0.5 * len(key[1] | last[1])):
            g += 1
        last = key
        groups.append(g)
    return groups


_WORD = re.compile(r"\w+")
