"""The shard plan every engine shares: files, folders, globs, URIs and Parquet, cut into the same
shards whatever the read block size, each shard reading back exactly its records."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pathlib import Path

import pytest

import bertscope.fast.jobinput as ji
from bertscope.cli.app import main
from bertscope.errors import InputError
from bertscope.fast.embedjob import read_embeddings
from bertscope.fast.jobinput import iter_records, plan_input, resolve_inputs


def _reference_lines(data: bytes) -> list[bytes]:
    """Lines as Python's own file iteration gives them, with the line ending removed."""
    import io

    return [raw.rstrip(b"\r\n") if raw.endswith(b"\n") else raw for raw in io.BytesIO(data)]


def _random_bytes(rng: random.Random, n_lines: int, trailing_newline: bool) -> bytes:
    pieces = []
    for _ in range(n_lines):
        kind = rng.random()
        if kind < 0.1:
            pieces.append(b"")
        elif kind < 0.2:
            pieces.append(b"caf\xe9 \xff\r")
        else:
            pieces.append(" ".join("w" * rng.randint(1, 6) for _ in range(rng.randint(1, 8))).encode())
    data = b"\n".join(pieces)
    return data + b"\n" if trailing_newline else data


@pytest.mark.parametrize("trailing_newline", [True, False])
@pytest.mark.parametrize("shard_rows", [1, 3, 10, 1000])
def test_text_plan_matches_brute_force_for_any_block_size(tmp_path, monkeypatch, trailing_newline, shard_rows):
    rng = random.Random(shard_rows * 2 + trailing_newline)
    data = _random_bytes(rng, 57, trailing_newline)
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    ref = _reference_lines(data)
    plan = plan_input(path, shard_rows=shard_rows)
    assert plan.rows == len(ref) and [n for n, _ in iter_records(plan)] == list(range(1, len(ref) + 1))
    assert [raw for _, raw in iter_records(plan)] == ref
    assert [s.rows for s in plan.shards] == [min(shard_rows, len(ref) - k) for k in range(0, len(ref), shard_rows)]
    for block in (1, 2, 7, 64):  # block boundaries inside lines, inside "\r\n", on "\n"
        monkeypatch.setattr(ji, "_BLOCK", block)
        assert plan_input(path, shard_rows=shard_rows) == plan


def _tree(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_bytes(b"a1\na2\n")
    (tmp_path / "d" / "b.txt").write_bytes(b"b1\nb2\nb3")  # no final newline: still three lines
    (tmp_path / "d" / "sub" / "c.txt").write_bytes(b"c1\n")
    (tmp_path / "d" / "_SUCCESS").write_bytes(b"")
    (tmp_path / "d" / ".hidden.txt").write_bytes(b"h\n")
    return tmp_path / "d"


def test_folder_glob_and_file_uri_number_records_across_files(tmp_path):
    d = _tree(tmp_path)
    records = lambda spec: [raw for _, raw in iter_records(plan_input(spec, shard_rows=2))]  # noqa: E731
    everything = [b"a1", b"a2", b"b1", b"b2", b"b3", b"c1"]
    assert records(d) == everything  # sorted, recursive, hidden and _ names skipped
    assert records(f"{d}/*.txt") == everything[:5]  # * stays in its folder
    assert records(f"{d}/**/*.txt") == everything
    assert records(f"file://{d}") == everything  # a URI goes through pyarrow's filesystem
    assert records(f"file://{d}/*.txt") == everything[:5]
    plan = plan_input(d, shard_rows=2)
    assert [s.first_row for s in plan.shards] == [1, 3, 5]
    assert [len(s.pieces) for s in plan.shards] == [1, 1, 2]  # the last shard spans two files


def test_a_record_number_is_placed_in_its_file_and_line(tmp_path):
    """Records are numbered across the files; where() names the file and that file's own line (an
    empty file between two others holds none), so a bad record can be found in the file."""
    d = _tree(tmp_path)
    (d / "a_empty.txt").write_bytes(b"")  # sorts between a.txt and b.txt
    plan = plan_input(d, shard_rows=2)
    assert [Path(f.name).name for f in plan.files] == ["a.txt", "a_empty.txt", "b.txt", "c.txt"]
    assert plan.first_rows == (1, 3, 3, 6)
    for n, raw in iter_records(plan):  # each record's text is its file's letter and its own line
        name, line = plan.where(n).rsplit(":", 1)
        assert Path(name).name == f"{raw[:1].decode()}.txt" and line == raw[1:].decode()
    single = plan_input(d / "b.txt")
    assert [single.where(n) for n in (1, 3)] == ["line 1", "line 3"]  # one file: its own numbers


@pytest.mark.parametrize("spec, message", [
    ("d/*.csv", "no input file matches"),
    ("missing.txt", "does not exist"),
    ("mixed", "mixes kinds of input"),
    ("file://{tmp}/d/*.nope", "no input file matches"),
])
def test_bad_input_specs(tmp_path, spec, message):
    _tree(tmp_path)
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.txt").write_text("x\n")
    (tmp_path / "mixed" / "b.jsonl").write_text('{"text": "x"}\n')
    spec = spec.format(tmp=tmp_path)
    with pytest.raises(InputError, match=message):
        resolve_inputs(spec if "://" in spec else str(tmp_path / spec))


def test_field_does_not_take_stray_files_beside_json_lines_ones(tmp_path):
    """Before, a README beside the .jsonl files was read as JSON Lines under --field, shifting
    every row by its lines; now it is refused, naming both kinds. All-.txt files with --field (JSON
    in text files) and a glob of just the JSON Lines files still resolve."""
    d = tmp_path / "jl"
    (d / "sub").mkdir(parents=True)
    (d / "a.jsonl").write_text('{"body": "x"}\n')
    (d / "sub" / "b.ndjson").write_text('{"body": "y"}\n')
    (d / "README.md").write_text("# notes\n")
    with pytest.raises(InputError, match=r"holds JSON Lines files \(a\.jsonl\) and others \(README\.md\) that "
                                         "--field would read as JSON Lines too"):
        resolve_inputs(str(d), "body")
    assert [Path(f.name).name for f in resolve_inputs(f"{d}/**/*.*json*", "body")] == ["a.jsonl", "b.ndjson"]
    t = tmp_path / "txt"
    t.mkdir()
    for name in ("a.txt", "b.txt"):
        (t / name).write_text('{"body": "x"}\n')
    assert {f.kind for f in resolve_inputs(str(t), "body")} == {"jsonl"}


def test_parquet_input_by_row_groups_embeds_like_the_texts(tmp_path, bert, capsys):
    texts = [f"parquet text number {i} " + "more " * (i % 4) for i in range(23)]
    values = list(texts)
    values[4], values[9] = None, "  "
    (tmp_path / "pq").mkdir()
    for part, (a, b) in enumerate([(0, 15), (15, 23)]):
        table = pa.table({"id": list(range(a, b)), "body": values[a:b]})
        pq.write_table(table, tmp_path / "pq" / f"part-{part}.parquet", row_group_size=4)
    plan = plan_input(tmp_path / "pq", field_name="body", shard_rows=6)
    assert plan.kind == "parquet" and plan.rows == 23
    assert [raw for _, raw in iter_records(plan)] == [None if v is None else v.encode() for v in values]

    out = tmp_path / "out"
    assert main(["embed", str(tmp_path / "pq"), "--field", "body", "--out", str(out), "--shard-rows", "6",
                 "--quiet"]) == 0
    emb, status = read_embeddings(out)
    assert status[4] == "not_text" and status[9] == "empty" and status.count("ok") == 21
    ok = [i for i, s in enumerate(status) if s == "ok"]
    assert np.abs(emb[ok] - bert.embed([texts[i] for i in ok])).max() < 1e-5
    capsys.readouterr()

    pq.write_table(pa.table({"n": [1, 2]}), tmp_path / "numbers.parquet")
    with pytest.raises(InputError, match="has no column 'text'; its columns are 'n'"):
        plan_input(tmp_path / "numbers.parquet")
    with pytest.raises(InputError, match="holds int64, not text"):
        plan_input(tmp_path / "numbers.parquet", field_name="n")


def test_every_command_numbers_lines_as_embed_does(tmp_path):
    """bench and heads read their corpus with bytes.splitlines, which also splits at a lone "\\r":
    the same file's line 5 was another line to embed. One rule now (split_lines), and one warning
    for many bad lines (a binary file gave one per line)."""
    from bertscope.fast.embedjob import decode_record
    from bertscope.files import read_lines, split_lines

    data = b"one\rstill one\r\ntwo\n\xff\xfe\n\xe9t\xe9\n\nlast"
    path = tmp_path / "c.txt"
    path.write_bytes(data)
    lines, warns = read_lines(path)
    embed_view = [(n, decode_record(raw, "text", None)) for n, raw in enumerate(split_lines(data), start=1)]
    assert lines == [(n, text.strip()) for n, (text, status) in embed_view if status == "ok"]
    assert [n for n, (_, s) in embed_view if s == "undecodable"] == [3, 4]
    assert warns == [f"{path}: 2 lines are not UTF-8 text (lines 3, 4); skipped"]
    assert len(data.splitlines()) == 7 and len(split_lines(data)) == 6  # what differed: the lone "\r"
    # NUL bytes: a binary file, refused by both (embed's plan and read_lines), as git judges one
    path.write_bytes(b"text\n\x00\x01 data\n")
    with pytest.raises(InputError, match="looks like a binary file, not text \\(a NUL byte on line 2, byte 5\\)"):
        read_lines(path)
    with pytest.raises(InputError, match="looks like a binary file"):
        ji.plan_input(path)
    assert decode_record(b"\x00\x01 data", "text", None) == ("", "undecodable")  # past the sniff: one bad row
