"""bertscope embed: rows in input order, bad lines reported, atomic shards, kill and --resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertscope.cli.app import main
from bertscope.fast.embedjob import KILL_HOOK_ENV, read_embeddings

SRC = str(Path(__file__).resolve().parents[1] / "src")

TEXTS = [
    "The animal didn't cross the street because it was too tired",
    "",  # empty
    None,  # undecodable bytes go here
    "a short one",
    "word " * 400,  # longer than the bundled model's 256 tokens
    "   ",  # whitespace only: empty
    "the last line, without a newline",
]


def _write_input(path: Path, texts=TEXTS) -> Path:
    raw = b"\n".join(b"\xff\xfe caf\xe9" if t is None else t.encode() for t in texts)
    path.write_bytes(raw)
    return path


def _run_cli(args, capsys):
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_embed_rows_in_order_with_bad_lines_reported(tmp_path, bert, capsys):
    inp = _write_input(tmp_path / "in.txt")
    out = tmp_path / "out"
    code, stdout, err = _run_cli(["embed", str(inp), "--out", str(out), "--shard-rows", "3", "--quiet"], capsys)
    assert code == 0, err
    assert "1 undecodable line(s)" in err and "line 3" in err
    assert "2 empty line(s), zero vectors: line 2, 6" in err
    assert "truncated: line 5" in err
    emb, status = read_embeddings(out)
    assert emb.shape == (len(TEXTS), bert.config.hidden_size)
    assert status == ["ok", "empty", "undecodable", "ok", "truncated", "empty", "ok"]
    for i in (1, 2, 5):
        assert not emb[i].any()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in (0, 3, 4, 6):  # each row is that line's own embedding: nothing shuffled
            assert np.abs(emb[i] - bert.embed([TEXTS[i]])[0]).max() < 1e-5
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["problems"] == {"truncated": [5], "empty": [2, 6], "undecodable": [3],
                                    "bad_json": [], "no_field": [], "not_text": []}
    assert not list(out.glob(".*.tmp"))


def test_parquet_input_without_pyarrow_names_the_install(tmp_path, capsys, monkeypatch):
    """It was "ModuleNotFoundError: No module named 'pyarrow'", exit 1, from a file, a folder or a glob."""
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["one", "two"]}), tmp_path / "in.parquet")
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import pyarrow` now fails, as without the extra
    for spec in (tmp_path / "in.parquet", tmp_path, tmp_path / "*.parquet"):
        code, _, err = _run_cli(["embed", str(spec), "--out", str(tmp_path / "o.emb")], capsys)
        assert code == 2 and err == (f"bertscope: error: reading Parquet input ({tmp_path / 'in.parquet'}) needs "
                                     "pyarrow: pip install 'bertscope[parquet]'\n"), err
    assert not (tmp_path / "o.emb").exists()


def test_embed_parquet_reads_back_equal_to_npy(tmp_path, capsys):
    import pyarrow.parquet as pq  # a test dependency: missing, it fails (see conftest)
    inp = _write_input(tmp_path / "in.txt")
    assert _run_cli(["embed", str(inp), "--out", str(tmp_path / "n"), "--quiet"], capsys)[0] == 0
    assert _run_cli(["embed", str(inp), "--out", str(tmp_path / "p"), "--format", "parquet",
                     "--shard-rows", "4", "--quiet"], capsys)[0] == 0
    a, sa = read_embeddings(tmp_path / "n")
    b, sb = read_embeddings(tmp_path / "p")
    # Shards of 4 and of 10,000 rows batch the texts differently, and a GEMM's rounding may
    # depend on its shape and the CPU: equal within fp32 noise, not necessarily bit for bit.
    assert sa == sb and a.shape == b.shape and np.abs(a - b).max() <= 1e-5
    table = pq.read_table(tmp_path / "p")  # the folder reads as one dataset
    assert table.column("line").to_pylist() == list(range(1, len(TEXTS) + 1))
    assert table.column("status").to_pylist() == sa


def test_embed_jsonl_field(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(["one", "", "two"])))
    code, _, err = _run_cli(["embed", str(inp), "--field", "body", "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 0, err
    _, status = read_embeddings(tmp_path / "o")
    assert status == ["ok", "empty", "ok"]


def _subprocess_embed(inp: Path, out: Path, *extra: str, env_extra: dict | None = None):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "bertscope", "embed", str(inp), "--out", str(out),
                           "--shard-rows", "4", "--quiet", *extra],
                          env=env, capture_output=True, text=True, timeout=300)


def test_killed_run_leaves_no_partial_output_and_resume_completes_it(tmp_path):
    texts = [f"sentence number {i} " + "and more words " * (i % 9) for i in range(18)]
    inp = _write_input(tmp_path / "in.txt", texts)
    whole = _subprocess_embed(inp, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "killed"
    killed = _subprocess_embed(inp, out, env_extra={KILL_HOOK_ENV: "2"})
    assert killed.returncode == -signal.SIGKILL  # really killed, mid-write of the third shard
    assert not list(out.glob("part-*"))  # nothing in OUTPUT itself until the job is done
    staged = sorted(p.name for p in (out / "_staging").glob("part-*"))
    assert staged == ["part-00000.npy", "part-00001.npy"]  # two whole shards, nothing half-written
    assert list((out / "_staging").glob(".*.tmp"))  # the third shard died as a temporary
    assert not (out / "_manifest.json").exists()
    for f in staged:
        assert np.load(out / "_staging" / f).shape == (4, 384)
    with pytest.raises(Exception):
        read_embeddings(out)

    again = _subprocess_embed(inp, out)  # without --resume: refused, one line, no traceback
    assert again.returncode == 2 and "--resume" in again.stderr and "Traceback" not in again.stderr

    mtime0 = (out / "_staging" / "part-00000.npy").stat().st_mtime_ns
    resumed = _subprocess_embed(inp, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "2 already done" in resumed.stdout
    assert (out / "part-00000.npy").stat().st_mtime_ns == mtime0  # moved into place, not redone
    assert not list(out.glob(".*.tmp")) and not (out / "_staging").exists()
    a, sa = read_embeddings(tmp_path / "whole")
    b, sb = read_embeddings(out)
    assert sa == sb and a.shape == (18, 384)
    assert np.abs(a - b).max() < 1e-5  # two processes: each may hold its own kernel choice
    runs = [s["run"] for s in json.loads((out / "_manifest.json").read_text())["shards"]]
    assert runs == [1, 1, 2, 2, 2]  # the manifest says which run computed each shard: none twice


def test_embed_jsonl_bad_lines_are_zero_rows_in_order(tmp_path, bert, capsys):
    """Issue #3: one bad line never aborts the job; every line gets its row and its status."""
    lines = ['{"text": "fine"}', '{"text": broken', '{"text": 5}', '{"text": null}', "[1, 2]",
             '{"body": "no text field"}', "", '{"text": ""}', '"just a string"', '{"text": "last"}']
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    code, _, err = _run_cli(["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--quiet"], capsys)
    assert code == 0, err
    emb, status = read_embeddings(out)
    assert status == ["ok", "bad_json", "not_text", "not_text", "no_field", "no_field", "empty",
                      "empty", "no_field", "ok"]
    assert emb.shape == (len(lines), bert.config.hidden_size)
    for i, s in enumerate(status):
        assert bool(emb[i].any()) == (s == "ok")
    assert np.abs(emb[0] - bert.embed(["fine"])[0]).max() < 1e-5
    assert np.abs(emb[9] - bert.embed(["last"])[0]).max() < 1e-5
    assert "1 line(s) not valid JSON, zero vectors: line 2" in err
    assert "2 line(s) whose field 'text' is not a string, zero vectors: line 3, 4" in err
    assert "3 line(s) not a JSON object with a field 'text', zero vectors: line 5, 6, 9" in err
    assert "2 empty line(s), zero vectors: line 7, 8" in err
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["problems"]["bad_json"] == [2]
    assert manifest["problems"]["not_text"] == [3, 4]
    assert manifest["problems"]["no_field"] == [5, 6, 9]
    assert manifest["status_counts"]["no_field"] == 3 and manifest["rows"] == len(lines)
    # every row counted once, "ok" too, from the statuses read back; and the precision that ran
    assert {k: n for k, n in manifest["status_counts"].items() if n} == {s: status.count(s) for s in set(status)}
    assert (manifest["precision"], manifest["max_seq_length"], manifest["dim"]) == ("fp32", 256, 384)


def test_embed_json_lines_in_a_json_file(tmp_path, capsys):
    inp = tmp_path / "in.json"
    inp.write_text('{"text": "one"}\n{"text": "two"}\n')
    code, _, err = _run_cli(["embed", str(inp), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 0, err
    emb, status = read_embeddings(tmp_path / "o")
    assert status == ["ok", "ok"]
    import bertscope
    ref = bertscope.load().embed(["one", "two"])  # the texts, not the raw JSON lines
    assert np.abs(emb - ref).max() < 1e-5


def test_embed_refuses_bad_out_before_any_work(tmp_path, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("hello\n")
    (tmp_path / "afile").write_text("x")
    for out in ("/proc/e7", str(tmp_path / "afile"), str(tmp_path / "afile" / "sub")):
        code, stdout, err = _run_cli(["embed", str(inp), "--out", out], capsys)  # no --quiet
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("bertscope: error:"), err
        assert "embed:" not in err and "%" not in err  # no progress bar before the error
    assert not Path("/proc/e7").exists()


def test_a_model_that_does_not_load_leaves_no_empty_output_behind(tmp_path, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("hello\n")
    out = tmp_path / "new" / "emb"
    code, _, err = _run_cli(["embed", str(inp), "--out", str(out), "--model", str(tmp_path / "nomodel")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nomodel" in err, err
    assert not (tmp_path / "new").exists()  # the folders the job made for OUTPUT are gone again
    kept = tmp_path / "kept"
    kept.mkdir()  # an OUTPUT folder that was there before stays
    assert _run_cli(["embed", str(inp), "--out", str(kept), "--model", str(tmp_path / "nomodel")], capsys)[0] == 2
    assert kept.is_dir() and not any(kept.iterdir())


def test_embed_bad_input_shows_no_progress_bar(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "a"}\n')
    out = tmp_path / "o"
    assert _run_cli(["embed", str(inp), "--out", str(out), "--quiet"], capsys)[0] == 0
    code, _, err = _run_cli(["embed", str(inp), "--out", str(out)], capsys)  # already a job there
    assert code == 2 and err.strip().splitlines() == [err.strip()] and "--resume" in err
    assert "embed:" not in err
    assert "already holds a finished job; pass --resume to check it" in err  # not "to finish it"
    (out / "_manifest.json").unlink()  # as a job stopped before its end leaves it
    code, _, err = _run_cli(["embed", str(inp), "--out", str(out)], capsys)
    assert code == 2 and "already holds an unfinished job; pass --resume to finish it, or choose a new --out" in err
    assert "Python" not in err  # it said "(from Python JobOptions(resume=True))" on the command line
    # standard input, as "-": said so, where it read as a file named "-" that does not exist
    for args in (["embed", "-", "--out", str(tmp_path / "s")], ["predict", str(tmp_path), "-"],
                 ["finetune", "-", "--out", str(tmp_path / "f")]):
        code, _, err = _run_cli(args, capsys)
        assert (code, err) == (2, "bertscope: error: - (standard input) is not read; write the texts to a file and "
                                  "give its name\n")


@pytest.mark.parametrize("make_input, extra, message", [
    (None, [], "does not exist"),
    ("ok.txt", ["--format", "csv"], "--format"),
    ("ok.txt", ["--shard-rows", "0"], "--shard-rows must be at least 1, not 0"),  # names the flag
    ("ok.txt", ["--batch-tokens", "-5"], "--batch-tokens must be at least 1, not -5"),
    ("ok.txt", ["--compile"], "--compile applies to --precision int8 only"),
    ("ok.txt", ["--keep-precision"], "--keep-precision applies to --precision int8 or bf16 only"),
    # every line fails the same way: a usage mistake, refused rather than all zero rows
    ("bad.jsonl", [], "no line is valid JSON (line 1:"),
    ("nofield.jsonl", ["--field", "body"], "no line holds a text in the field 'body'"),
    ("nofield.jsonl", ["--field", "body"], "line 1 has 'text'"),
    ("mixedbad.jsonl", [], "no line holds a text in the field 'text'"),
    ("nottext.jsonl", [], "2 line(s) where it is not a string"),
    ("plain.txt", ["--field", "text"], "no line is valid JSON"),
    ("array.json", [], "one JSON document (an array), not JSON Lines"),
    ("pretty.json", [], "not JSON Lines"),
    # a NUL byte near the start: binary data (git's rule), not thousands of garbage "lines"
    ("binary.txt", [], "binary.txt looks like a binary file, not text (a NUL byte on line 2, byte 6)"),
    ("utf16.txt", [], "it is UTF-16 text: convert it to UTF-8 first"),
    ("damaged.parquet", [], "damaged.parquet as Parquet"),  # pyarrow's ArrowInvalid: exit 1, no name
])
def test_embed_bad_input_is_one_line_error(tmp_path, capsys, make_input, extra, message):
    files = {"ok.txt": "hello\n", "bad.jsonl": '{"text": broken\nnot json either\n\n',
             "nofield.jsonl": '{"text": "no body here"}\n',
             "mixedbad.jsonl": 'oops\n{"body": "x"}\n[1]\n{"text": 3}\n',
             "nottext.jsonl": '{"text": 1}\n{"text": null}\n',
             "plain.txt": "a plain text\nanother\n",
             "array.json": '[{"text": "a"},\n {"text": "b"}]\n',
             "pretty.json": '{\n  "text": "one document"\n}\n',
             "binary.txt": b"hello\n\x00\x01\x02 data\nmore\n", "utf16.txt": "hello\n".encode("utf-16"),
             "damaged.parquet": "not parquet at all\n"}
    inp = tmp_path / (make_input or "missing.txt")
    if make_input:
        data = files[make_input]
        inp.write_bytes(data if isinstance(data, bytes) else data.encode())
    code, stdout, err = _run_cli(["embed", str(inp), "--out", str(tmp_path / "o"), *extra], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertscope: error:") and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()  # refused before any output was made


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_each_shard_hands_the_allocators_free_memory_back(tmp_path, capsys, monkeypatch):
    """What a long job's resident memory grew by (glibc keeping freed heap) is returned per shard.
    (Linux with glibc, as the CI machine: resident memory is read from /proc.)"""
    from bertscope.fast import embedjob

    # the mechanism: a fragmented heap (every 8th block kept alive) holds its free pages until
    # trimmed; release_free_memory gives them back
    blocks = [bytearray(64 * 1024) for _ in range(3200)]  # 200 MiB in heap-sized blocks
    keep = blocks[::8]
    del blocks
    before = _rss_mib()
    assert embedjob.release_free_memory() is True  # this is glibc (the CI machine's Debian)
    after = _rss_mib()
    assert before - after > 100, (before, after)  # most of the 175 MiB freed is returned
    del keep
    # and the job calls it once per shard
    calls = []
    real = embedjob.release_free_memory
    monkeypatch.setattr(embedjob, "release_free_memory", lambda: calls.append(1) or real())
    inp = _write_input(tmp_path / "in.txt", TEXTS * 3)
    assert main(["embed", str(inp), "--out", str(tmp_path / "out"), "--shard-rows", "4", "--quiet"]) == 0
    capsys.readouterr()
    assert len(calls) == -(-len(TEXTS * 3) // 4)


def test_a_json_line_no_text_can_be_read_from_is_its_own_row(tmp_path, bert, capsys):
    """A JSON string with an escaped lone surrogate ("\\udcff", valid JSON, found in scraped data)
    stopped the whole job, and every --resume, with "texts[6] is not valid Unicode"; nesting
    deeper than Python's recursion limit stopped it with a RecursionError. Each is one row now."""
    lines = ['{"text": "fine"}', '{"text": "bad \\udcff x"}',
             '{"text": "x", "meta": ' + "[" * 5000 + "]" * 5000 + "}", '{"text": "after"}']
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    assert json.loads(lines[1])["text"] == "bad \udcff x"  # what Python's own json reads there
    out = tmp_path / "o"
    code, _, err = _run_cli(["embed", str(inp), "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    emb, status = read_embeddings(out)
    assert status == ["ok", "undecodable", "bad_json", "ok"]
    assert not emb[1].any() and not emb[2].any()
    assert np.abs(emb[3] - bert.embed(["after"])[0]).max() < 1e-5
    assert "undecodable line(s) (not UTF-8 text), zero vectors: line 2" in err


def test_bad_lines_of_a_folder_are_named_by_file_and_line(tmp_path, capsys):
    """A folder's lines are numbered across its files; embed printed "line 4" for the second
    line of the second file. It names the file and its own line, and the manifest says where
    each file begins, so a reader can do the same."""
    folder = tmp_path / "crawl"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    (folder / "b.jsonl").write_text('{"text": "three"}\nnot json\n{"body": "x"}\n')
    code, _, err = _run_cli(["embed", str(folder), "--out", str(tmp_path / "o.emb"), "--quiet"], capsys)
    assert code == 0, err
    b = folder / "b.jsonl"
    assert f"1 line(s) not valid JSON, zero vectors: {b}:2\n" in err, err
    assert f"not a JSON object with a field 'text', zero vectors: {b}:3\n" in err, err
    manifest = json.loads((tmp_path / "o.emb" / "_manifest.json").read_text())
    assert manifest["problems"]["bad_json"] == [4]  # numbered across the files, as before
    assert manifest["input"]["first_lines"] == [1, 3]
    assert read_embeddings(tmp_path / "o.emb")[1] == ["ok", "ok", "ok", "bad_json", "no_field"]


def test_an_output_inside_its_input_folder_is_not_read_as_input(tmp_path, capsys):
    """embed DIR --out DIR/x.emb: the resume saw the job's own shard as a new input file and was
    refused, and a second job embedded the .npy shard as 244 undecodable lines of text."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("one\ntwo\nthree\n")
    for args in (["--out", str(folder / "out.emb")], ["--out", str(folder / "out.emb"), "--resume"],
                 ["--out", str(folder / "out2.emb")]):
        code, _, err = _run_cli(["embed", str(folder), *args, "--quiet"], capsys)
        assert code == 0, err
    for name in ("out.emb", "out2.emb"):
        emb, status = read_embeddings(folder / name)
        assert status == ["ok"] * 3
    code, _, err = _run_cli(["embed", str(folder / "**" / "*"), "--out", str(tmp_path / "g.emb"), "--quiet"], capsys)
    assert code == 0, err
    assert read_embeddings(tmp_path / "g.emb")[1] == ["ok"] * 3  # a glob leaves the job folders out too
    for given in (folder / "out.emb", folder / "out.emb" / "*"):  # the job folder itself: said, not "no file"
        code, _, err = _run_cli(["embed", str(given), "--out", str(tmp_path / "x.emb")], capsys)
        assert code == 2 and "holds only an embedding job's output" in err, err
    # a folder above the input's own root holding a job file does not hide the input
    (tmp_path / "_job.json").write_text("{}")
    code, _, err = _run_cli(["embed", str(folder / "a.txt"), "--out", str(tmp_path / "y.emb"), "--quiet"], capsys)
    assert code == 0, err
    code, _, err = _run_cli(["embed", str(folder), "--out", str(tmp_path / "z.emb"), "--quiet"], capsys)
    assert code == 0 and read_embeddings(tmp_path / "z.emb")[1] == ["ok"] * 3, err


@pytest.mark.parametrize("args,message", [
    (["", "--out", "o.emb"], "the input is an empty name"),  # an unset "$FILE": not the working folder
    (["in.txt", "--out", ""], "--out is an empty name; give a folder"),
])
def test_empty_names_are_refused(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("hello\n")
    code, _, err = _run_cli(["embed", *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_python_api_checks_job_options(tmp_path, bert):
    from bertscope.errors import InputError
    from bertscope.fast.embedjob import JobOptions, run_embed_job

    (tmp_path / "in.txt").write_text("hello\n")
    for opts, message in ((JobOptions(shard_rows="5"), "shard_rows must be a whole number"),
                          (JobOptions(batch_tokens=2.5), "batch_tokens must be a whole number"),
                          (JobOptions(field_name=3), "field_name"),
                          (JobOptions(shard_rows=None), "shard_rows must be a whole number")):
        with pytest.raises(InputError, match=message):
            run_embed_job(bert, tmp_path / "in.txt", tmp_path / "o", opts)
    assert not (tmp_path / "o").exists()
    res = run_embed_job(bert, tmp_path / "in.txt", tmp_path / "o", JobOptions(shard_rows=np.int64(2)))
    assert res.rows == 1  # a numpy int is a whole number (it was refused by the JSON record)


def test_a_damaged_shard_record_is_recomputed_not_fatal(tmp_path):
    """One unreadable _staging/_part-N.json made --resume say "remove OUTPUT and start again",
    throwing away every finished shard; that one shard is now recomputed, the rest kept."""
    texts = [f"sentence number {i}" for i in range(12)]
    inp = _write_input(tmp_path / "in.txt", texts)
    whole = _subprocess_embed(inp, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "killed"
    killed = _subprocess_embed(inp, out, env_extra={KILL_HOOK_ENV: "2"})
    assert killed.returncode == -signal.SIGKILL
    (out / "_staging" / "_part-00001.json").write_text("garbage")
    resumed = _subprocess_embed(inp, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a, sa = read_embeddings(tmp_path / "whole")
    b, sb = read_embeddings(out)
    assert sa == sb and np.abs(a - b).max() < 1e-5  # two processes, as above
    runs = [s["run"] for s in json.loads((out / "_manifest.json").read_text())["shards"]]
    assert runs == [1, 2, 2]  # shard 0 kept from the killed run; shard 1 (damaged record) redone


def test_a_resumed_job_computes_with_the_kernel_choice_it_began_with(tmp_path, capsys, monkeypatch, caplog):
    """_job.json records the kernel choice the job computes with, and a resume in another process
    computes its shards with it, whatever this machine's choice is by then (the cache measured
    again: a week later, a busy machine): the rows are then the bytes an unstopped job writes.
    The first runs compute with the plain choice (BERTSCOPE_TUNE=0); the resume's own is another."""
    import dataclasses

    import torch

    from bertscope.fast import encoder, tuning

    texts = [f"sentence number {i} " + "and more words " * (i % 9) for i in range(18)]
    inp = _write_input(tmp_path / "in.txt", texts)
    plain = {"BERTSCOPE_TUNE": "0", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    whole = _subprocess_embed(inp, tmp_path / "whole", env_extra=plain)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "killed"
    killed = _subprocess_embed(inp, out, env_extra={KILL_HOOK_ENV: "2", **plain})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert json.loads((out / "_job.json").read_text())["kernel"] == tuning.KernelChoice().applied()
    other = dataclasses.replace(tuning.KernelChoice(source="measured"), gemm="onednn", batch_tokens=512, slack=0.3)
    monkeypatch.setattr(encoder, "choose", lambda *a, **k: other)
    with caplog.at_level("INFO", logger="bertscope.fast.encoder"):
        code, _, err = _run_cli(["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--resume", "--quiet"],
                                capsys)
    assert code == 0, err
    assert "computing with the kernel choice the job began with" in caplog.text
    a, sa = read_embeddings(tmp_path / "whole")
    b, sb = read_embeddings(out)
    assert sa == sb and a.shape == (18, 384) and a.tobytes() == b.tobytes()


def test_a_damaged_kernel_record_is_refused_in_one_line_and_another_versions_is_a_warning(tmp_path, capsys,
                                                                                          caplog):
    texts = [f"sentence number {i}" for i in range(18)]
    inp = _write_input(tmp_path / "in.txt", texts)
    out = tmp_path / "out"
    killed = _subprocess_embed(inp, out, env_extra={KILL_HOOK_ENV: "2", "BERTSCOPE_TUNE": "0"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    job_file = out / "_job.json"
    job = json.loads(job_file.read_text())
    resume = ["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--resume", "--quiet"]
    job_file.write_text(json.dumps({**job, "kernel": {**job["kernel"], "batch_tokens": "2048"}}))
    code, _, err = _run_cli(resume, capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{job_file}: the kernel choice recorded there is damaged (its 'batch_tokens' is '2048')" in err
    job_file.write_text(json.dumps({**job, "kernel": {"gemm": "blas"}}))  # another version's fields
    with caplog.at_level("WARNING", logger="bertscope.fast.encoder"):
        code, _, err = _run_cli(resume, capsys)
    assert code == 0, err
    assert "its kernel choice is not recorded as this version of bertscope records one" in caplog.text
    assert read_embeddings(out)[0].shape == (18, 384)


def test_the_kernel_record_names_the_gemm_library_in_use(bundled_path, monkeypatch):
    """BERTSCOPE_ONEDNN=0 keeps BLAS whatever the choice says: the record says BLAS, the library
    the rows were computed with, so a resume without the variable computes with it too."""
    import bertscope
    from bertscope.fast import encoder, tuning

    monkeypatch.setattr(encoder, "choose", lambda *a, **k: tuning.KernelChoice(gemm="onednn", source="measured"))
    assert bertscope.load(bundled_path).kernel_record()["gemm"] == "onednn"
    monkeypatch.setenv("BERTSCOPE_ONEDNN", "0")
    b = bertscope.load(bundled_path)
    assert b.kernel_record()["gemm"] == "blas" and b.fast.gemm.prefer == "blas"


def test_resume_of_an_output_that_does_not_exist_says_it_starts_a_new_job(tmp_path, capsys):
    """A typo in --out with --resume started a new job without a word."""
    (tmp_path / "in.txt").write_text("hello\n")
    code, _, err = _run_cli(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "typo.emb"),
                             "--resume", "--quiet"], capsys)
    assert code == 0 and f"--resume: {tmp_path / 'typo.emb'} does not exist yet; starting a new job" in err
    assert read_embeddings(tmp_path / "typo.emb")[1] == ["ok"]
    # a run killed while it loaded the model leaves an empty folder (and its lock file): the resume
    # started a new job with its own flags (fp32, not the killed run's int8) and said nothing
    (tmp_path / "early.emb").mkdir()
    (tmp_path / "early.emb" / ".lock").write_text("")
    code, _, err = _run_cli(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "early.emb"),
                             "--resume", "--quiet"], capsys)
    assert code == 0 and (f"--resume: {tmp_path / 'early.emb'} holds no job yet (a run stopped, or is still "
                          "loading its model, before it began one); starting a new job there with this command's "
                          "settings") in err
    assert read_embeddings(tmp_path / "early.emb")[1] == ["ok"]


def test_resume_refuses_other_weights_in_the_same_folder_and_takes_the_same_weights_moved(tmp_path, bundled_path,
                                                                                         capsys):
    """A job knew its model by the path as typed: new weights copied into the model's folder were
    resumed (rows from two models in one output), and `--model m` from another working folder
    named another folder. A job now keeps the fingerprint of the model's files."""
    from trainkit import tiny_checkpoint

    inp = tmp_path / "in.txt"
    inp.write_text("".join(f"line number {i}\n" for i in range(30)))
    model, out = tiny_checkpoint(tmp_path / "m", bundled_path, seed=0), tmp_path / "out"
    args = ["embed", str(inp), "--out", str(out), "--shard-rows", "10", "--quiet"]
    assert _run_cli(args + ["--model", str(model)], capsys)[0] == 0
    before = read_embeddings(out)[0]
    kept = (model / "model.safetensors").read_bytes()
    tiny_checkpoint(tmp_path / "m", bundled_path, seed=1)  # other weights, same folder
    code, _, err = _run_cli(args + ["--model", str(model), "--resume"], capsys)
    assert code == 2 and err.startswith(f"bertscope: error: cannot resume: the model's files in {model.resolve()} "
                                        "(config.json, weights, tokenizer) are not those the job began with")
    (model / "model.safetensors").write_bytes(kept)
    moved = model.rename(tmp_path / "moved")  # the same files elsewhere: the same model
    code, _, err = _run_cli(args + ["--model", str(moved), "--resume"], capsys)
    assert (code, err) == (0, "")
    assert np.array_equal(read_embeddings(out)[0], before)
    elsewhere = tmp_path / "other"
    tiny_checkpoint(elsewhere / "moved", bundled_path, seed=2)
    cwd = os.getcwd()
    os.chdir(elsewhere)  # "moved" is now another folder, with other weights
    try:
        code, _, err = _run_cli(args + ["--model", "moved", "--resume"], capsys)
    finally:
        os.chdir(cwd)
    assert code == 2 and err.startswith("bertscope: error: cannot resume: the model is now "
                                        f"{(elsewhere / 'moved').resolve()}, not the {model.resolve()} the job began with")


def test_a_file_of_several_with_no_text_in_the_field_is_refused(tmp_path, capsys):
    """Of two JSON Lines files, one with its text under another key became 500 zero vectors,
    exit 0: the refusal of a wrong --field held only for the input as a whole."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(3)))
    (folder / "b.jsonl").write_text("\n" + "".join(json.dumps({"body": f"line {i}"}) + "\n" for i in range(4)))
    code, _, err = _run_cli(["embed", str(folder / "*.jsonl"), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert (code, err) == (2, f"bertscope: error: {folder / 'b.jsonl'}: no line holds a text in the field 'text': "
                              "4 line(s) without it (first: line 2); line 2 has 'body' (choose the field with "
                              "--field) (the input's other files hold texts)\n")
    assert not (tmp_path / "o").exists()
    (folder / "b.jsonl").write_text(json.dumps({"body": "x"}) + "\n" + json.dumps({"text": "late"}) + "\n")
    code, _, err = _run_cli(["embed", str(folder / "*.jsonl"), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 0, err  # a file with one text is read, its other lines reported as bad lines are
    assert read_embeddings(tmp_path / "o")[1] == ["ok"] * 3 + ["no_field", "ok"]
    (folder / "b.jsonl").write_text(json.dumps({"text": None}) + "\n")  # a file of nulls is data: zero vectors
    code, _, err = _run_cli(["embed", str(folder / "*.jsonl"), "--out", str(tmp_path / "o2"), "--quiet"], capsys)
    assert code == 0, err
    assert read_embeddings(tmp_path / "o2")[1] == ["ok"] * 3 + ["not_text"]


def test_the_text_check_reads_each_file_only_up_to_its_first_text(tmp_path, monkeypatch):
    """Per file, the check read every record of the input before any work (0.38 s for 90 MB):
    now each file up to its first text; an empty file, or one of blank lines, does not make it
    read the others to their ends."""
    import bertscope.fast.embedjob as job
    from bertscope.fast.jobinput import plan_input

    folder = tmp_path / "in"
    folder.mkdir()
    for k in range(3):
        (folder / f"f{k}.txt").write_text(f"text of file {k}\n" * 5000)
    (folder / "f3.txt").write_text("\n\n")
    plan = plan_input(folder, shard_rows=1000)
    seen = []
    real = job.read_piece
    monkeypatch.setattr(job, "read_piece", lambda plan, piece, h=None: seen.append(piece) or real(plan, piece, h))
    job.check_has_text(plan)
    assert sorted(p.file for p in seen) == [0, 1, 2, 3]  # one piece of each file: its first


def test_embed_help_names_every_field_of_the_manifest(tmp_path, capsys):
    """The manifest's fields were documented nowhere but in the module's source."""
    from bertscope.cli.embed import HELP

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("one\n\n")
    (folder / "b.txt").write_text("two\n")
    assert _run_cli(["embed", str(folder), "--out", str(tmp_path / "o"), "--quiet"], capsys)[0] == 0
    manifest = json.loads((tmp_path / "o" / "_manifest.json").read_text())
    named = re.sub(r"\s+", " ", HELP.split("OUTPUT/_manifest.json, written last")[1].split("\n\n")[0])
    for keys in (manifest, manifest["input"], manifest["shards"][0], manifest["runs"][0]):
        for key in keys:
            assert re.search(rf"\b{re.escape(key)}\b", named), key
    assert set(manifest["status_counts"]) == {"ok", "truncated", "empty", "undecodable", "bad_json", "no_field",
                                              "not_text"}


def test_a_job_inside_another_jobs_folder_is_refused(tmp_path, capsys):
    """A new job inside a finished parquet job's folder added its rows to that job's dataset
    (pyarrow read 512 rows of a 500-row job), which --resume still called complete."""
    import pyarrow.parquet as pq

    (tmp_path / "in.txt").write_text("one\ntwo\n")
    out = tmp_path / "out"
    assert _run_cli(["embed", str(tmp_path / "in.txt"), "--out", str(out), "--format", "parquet", "--quiet"],
                    capsys)[0] == 0
    for inner in (out / "sub", out / "_staging" / "deeper"):
        code, _, err = _run_cli(["embed", str(tmp_path / "in.txt"), "--out", str(inner), "--format", "parquet",
                                 "--quiet"], capsys)
        assert (code, err) == (2, f"bertscope: error: {inner} is inside the embedding job's folder {out.resolve()}, "
                                  "whose readers would take its files for rows of that job; choose a --out "
                                  "outside it\n")
        assert not inner.exists()
    assert pq.read_table(out).num_rows == 2


@pytest.mark.parametrize("damage", ["[]", '{"shards": 3}', '{"shards": [1]}'])
def test_a_damaged_manifest_is_one_line_not_an_internal_error(tmp_path, capsys, damage):
    """'[]' in _manifest.json gave "AttributeError: 'list' object has no attribute 'get'", exit 1."""
    (tmp_path / "in.txt").write_text("hello\n")
    out = tmp_path / "out"
    assert _run_cli(["embed", str(tmp_path / "in.txt"), "--out", str(out), "--quiet"], capsys)[0] == 0
    (out / "_manifest.json").write_text(damage)
    code, _, err = _run_cli(["embed", str(tmp_path / "in.txt"), "--out", str(out), "--resume", "--quiet"], capsys)
    assert (code, err) == (2, f"bertscope: error: {out / '_manifest.json'} is damaged (not the JSON object a job "
                              f"writes); remove {out} and start again\n")


def test_json_nested_too_deep_is_a_row_or_a_one_line_refusal(tmp_path, capsys):
    """The checks before the job (is it JSON Lines? does any line hold a text?) parse lines too:
    a RecursionError there was an internal error (exit 1)."""
    deep = '{"a": ' + "[" * 5000 + "]" * 5000 + ', "text": "x"}'
    (tmp_path / "two.json").write_text(deep + '\n{"text": "y"}\n')  # a .json file: its kind is checked
    code, _, err = _run_cli(["embed", str(tmp_path / "two.json"), "--out", str(tmp_path / "a"), "--quiet"], capsys)
    assert code == 0, err
    assert read_embeddings(tmp_path / "a")[1] == ["bad_json", "ok"]
    (tmp_path / "one.jsonl").write_text(deep + "\n")
    code, _, err = _run_cli(["embed", str(tmp_path / "one.jsonl"), "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "no line is valid JSON (line 1: nested too deep to read)" in err and "Traceback" not in err


def test_an_undone_job_is_not_made_again_by_a_worker_still_running(tmp_path, bert):
    """A Ray actor the cluster had not stopped yet, finishing its shard after the job was undone,
    made _staging again: the folder then held shards and no job, and was refused next time."""
    from bertscope.errors import InputError
    from bertscope.fast.embedjob import compute_shard, prepare_embed_job

    inp = _write_input(tmp_path / "in.txt")
    out = tmp_path / "made" / "o"
    job = prepare_embed_job(bert, inp, out)
    assert (out / "_staging").is_dir() and job.new
    assert job.undo() and not (tmp_path / "made").exists()
    with pytest.raises(InputError, match="does not exist"):
        compute_shard(bert, job.plan, job.plan.shards[0], out, fmt="npy")
    assert not (tmp_path / "made").exists()
    kept = prepare_embed_job(bert, inp, out)  # a shard done: undo keeps the job
    compute_shard(bert, kept.plan, kept.plan.shards[0], out, fmt="npy")
    assert not kept.undo() and (out / "_job.json").is_file()
