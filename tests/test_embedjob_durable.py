"""The embedding job's folder under stress (issue 14, items 5, 6, 8, 9): an unfinished job is not
readable as a dataset, a full disk is one line and leaves nothing behind, resume checks the
input's content, and one OUTPUT holds one running job."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bertscope.files
from bertscope.cli.app import main
from bertscope.errors import InputError
from bertscope.files import same_file
from bertscope.fast.embedjob import (KILL_HOOK_ENV, LOCK_FILE, JobOptions, prepare_embed_job, read_embeddings,
                                     run_embed_job)

SRC = str(Path(__file__).resolve().parents[1] / "src")
TEXTS = [f"line {i}: " + "a few more words " * (i % 5) for i in range(20)]


def _input(path: Path, texts=TEXTS) -> Path:
    path.write_text("\n".join(texts) + "\n")
    return path


def _cli(args, capsys):
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _no_temporaries(out: Path) -> bool:
    return not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_killed_parquet_job_reads_as_nothing_until_resumed(tmp_path):
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **{KILL_HOOK_ENV: "2"})
    cmd = [sys.executable, "-m", "bertscope", "embed", str(inp), "--out", str(out), "--shard-rows", "4",
           "--format", "parquet", "--quiet"]
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert len(list((out / "_staging").glob("part-*.parquet"))) == 2  # two shards finished...
    try:
        table = pq.read_table(out)
    except Exception:  # ...yet a dataset reader sees no rows: failing is fine too
        table = None
    assert table is None or table.num_rows == 0

    env.pop(KILL_HOOK_ENV)
    resumed = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    table = pq.read_table(out)
    assert table.column("line").to_pylist() == list(range(1, len(TEXTS) + 1))  # every row, in order
    emb = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    import bertscope

    ref = bertscope.load().embed(TEXTS)
    assert np.abs(emb - ref).max() < 1e-5


class _FullDisk:
    """os, except that files opened with fdopen take ``room`` bytes and then fail with ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __getattr__(self, name):
        return getattr(os, name)

    def fdopen(self, fd, *a, **kw):
        f = os.fdopen(fd, *a, **kw)
        disk = self

        class Writer:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                f.close()

            def write(self, data):
                if len(data) > disk.room:
                    f.write(bytes(data[:disk.room]))
                    f.flush()
                    disk.room = 0
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                disk.room -= len(data)
                return f.write(data)

            def __getattr__(self, name):
                return getattr(f, name)

        return Writer()


@pytest.mark.parametrize("fmt", ["npy", "parquet"])
def test_full_disk_is_one_line_naming_the_file_and_leaves_no_temporary(tmp_path, capsys, monkeypatch, fmt):
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    monkeypatch.setattr(bertscope.files, "os", _FullDisk(room=4000))  # room for the job's small files
    code, stdout, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--format", fmt,
                              "--quiet"], capsys)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1, err
    assert "no space left on the device" in lines[0]
    assert lines[0].endswith("; free some space, then rerun the same command with --resume to finish")
    assert str(out / "_staging" / f"part-00000.{fmt}") in lines[0]  # the file it could not write
    assert "Traceback" not in err and _no_temporaries(out)
    monkeypatch.undo()  # space again: the job resumes and completes
    assert _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--format", fmt, "--resume",
                 "--quiet"], capsys)[0] == 0
    assert read_embeddings(out)[0].shape == (len(TEXTS), 384)


class _StopAfter:
    """A progress callback that interrupts the job once ``n`` rows are done."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, 0

    def __call__(self, k: int) -> None:
        self.done += k
        if self.done > self.n:
            raise KeyboardInterrupt


def _edit_keeping_size_and_mtime(path: Path, old: str, new: str) -> None:
    assert len(old) == len(new)
    st = path.stat()
    path.write_text(path.read_text().replace(old, new, 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_resume_recomputes_a_shard_whose_lines_changed_with_the_same_size_and_mtime(tmp_path, bert, capsys):
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):  # shards 0 and 1 finish, shard 2 does not
        run_embed_job(bert, inp, out, JobOptions(shard_rows=4), progress=_StopAfter(8))
    assert sorted(p.name for p in (out / "_staging").glob("part-*")) == ["part-00000.npy", "part-00001.npy"]
    _edit_keeping_size_and_mtime(inp, "line 1: a few", "line 1: x few")  # in shard 0
    code, stdout, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--resume",
                              "--quiet"], capsys)
    assert code == 0, err
    assert "recomputed shard(s) 0" in err and "1 already done" in stdout
    emb, _ = read_embeddings(out)
    texts = inp.read_text().splitlines()
    assert np.abs(emb - bert.embed(texts)).max() < 1e-5  # the edited line has its new embedding
    assert np.abs(emb[1] - bert.embed([TEXTS[1]])[0]).max() > 1e-3

    # a complete job whose input changed: refused with one line, nothing rewritten
    _edit_keeping_size_and_mtime(inp, "line 6: a few", "line 6: x few")
    code, _, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--resume"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is complete, but input records 5..8" in err
    assert np.array_equal(read_embeddings(out)[0], emb)


def test_a_second_job_on_the_same_output_is_refused_and_its_files_kept(tmp_path, bert, capsys):
    import fcntl

    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_embed_job(bert, inp, out, JobOptions(shard_rows=4), progress=_StopAfter(4))
    # another job is running on OUTPUT: it holds the lock and is writing a temporary
    fd = os.open(out / LOCK_FILE, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, b"4242\n")
    live = out / "_staging" / ".part-00003.npy.live.tmp"
    live.write_bytes(b"half a shard")
    try:
        code, _, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--resume"], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "in use by another running job (pid 4242)" in err
        # without --resume too: "pass --resume to finish it" would only lead to the lock
        code, _, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "4"], capsys)
        assert code == 2 and "in use by another running job (pid 4242)" in err and "--resume" not in err, err
        assert live.read_bytes() == b"half a shard"  # the live job's file is untouched
    finally:
        os.close(fd)  # the other job ends
    assert _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--resume", "--quiet"], capsys)[0] == 0
    assert not live.exists() and read_embeddings(out)[0].shape == (len(TEXTS), 384)


def test_lock_refusal_from_the_library(tmp_path, bert):
    import fcntl

    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(InputError, match="in use by another running job"):
            run_embed_job(bert, inp, out)
    finally:
        os.close(fd)
    assert json.loads((run_embed_job(bert, inp, out).out_dir / "_manifest.json").read_text())["rows"] == len(TEXTS)


def test_a_finished_job_removes_its_lock_file_and_a_resume_still_locks(tmp_path, bert):
    """A finished folder holds the job's files, not the lock; a resume of it locks afresh."""
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    run_embed_job(bert, inp, out, JobOptions(shard_rows=8))
    assert not (out / LOCK_FILE).exists()
    job = prepare_embed_job(bert, inp, out, JobOptions(shard_rows=8, resume=True))
    try:
        assert job.complete and (out / LOCK_FILE).is_file()
        with pytest.raises(InputError, match="in use by another running job"):
            prepare_embed_job(bert, inp, out, JobOptions(shard_rows=8, resume=True))
    finally:
        job.close()
    assert (out / LOCK_FILE).is_file()  # an unfinished close (Ctrl-C, an error) keeps the file: harmless


def test_a_lock_taken_on_a_file_a_finished_job_just_removed_is_taken_again(tmp_path, monkeypatch):
    """The race removing the lock file opens: job B opens .lock, job A finishes and removes it,
    then B's flock succeeds on a file no longer there. B must lock the file now at the path, or a
    job C that creates a new .lock would hold OUTPUT beside B."""
    from bertscope.fast import embedjob

    first = embedjob._Lock(tmp_path)
    real_open, opened = os.open, []

    def open_then_removed(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if not opened and Path(path).name == LOCK_FILE:  # B has opened; now A finishes
            opened.append(path)
            first.close(remove=True)
        return fd

    monkeypatch.setattr(embedjob.os, "open", open_then_removed)
    second = embedjob._Lock(tmp_path)
    monkeypatch.undo()
    try:
        assert opened and same_file(second.fd, tmp_path / LOCK_FILE)
        with pytest.raises(InputError, match=rf"in use by another running job \(pid {os.getpid()}\)"):
            embedjob._Lock(tmp_path)  # job C
    finally:
        second.close()


def test_job_options_are_checked_before_anything_is_written(tmp_path, bert):
    """The library call: options of the wrong kind are a TypeError naming JobOptions; bad values
    in them are the CLI's one-line InputErrors; OUTPUT is not created in either case."""
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out"
    with pytest.raises(TypeError, match="options must be a JobOptions, got dict"):
        run_embed_job(bert, inp, out, {"shard_rows": 4})
    with pytest.raises(InputError, match="unknown format 'csv'"):
        run_embed_job(bert, inp, out, JobOptions(fmt="csv"))
    with pytest.raises(InputError, match=r"shard size \(--shard-rows\) must be at least 1, not 0"):
        run_embed_job(bert, inp, out, JobOptions(shard_rows=0))
    assert not out.exists()
    res = run_embed_job(bert, inp, out, JobOptions(shard_rows=2, field_name=None))
    assert res.rows == len(TEXTS) and res.shards == -(-len(TEXTS) // 2)


def _truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def test_resume_recomputes_a_truncated_shard_of_a_finished_job(tmp_path, bert, capsys):
    """A finished job whose shard file was cut short: the reader names the file in one line
    (not numpy's ValueError), and --resume checks each shard against the size and SHA-256 the
    manifest records, recomputes the bad one (saying which and why) and keeps the rest."""
    texts = TEXTS[:6] + [""] + TEXTS[7:]  # an empty line in shard 1: its problems must survive
    inp = _input(tmp_path / "in.txt", texts)
    out = tmp_path / "out"
    args = ["embed", str(inp), "--out", str(out), "--shard-rows", "5", "--quiet"]
    assert _cli(args, capsys)[0] == 0
    manifest = json.loads((out / "_manifest.json").read_text())
    shard1 = manifest["shards"][1]
    assert shard1["file_bytes"] == (out / "part-00001.npy").stat().st_size and len(shard1["file_sha256"]) == 64
    ref = read_embeddings(out)[0]
    _truncate(out / "part-00001.npy", 1000)
    with pytest.raises(InputError, match=r"part-00001\.npy is truncated or corrupt: it has 1000 bytes, not the "
                                         f"{shard1['file_bytes']} its manifest records") as e:
        read_embeddings(out)
    assert "\n" not in str(e.value)
    code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 0, err
    assert "(3 already done)" in stdout and stdout.startswith("wrote ")  # one shard was written again
    assert f"recomputed shard 1: part-00001.npy has 1000 bytes, not the {shard1['file_bytes']} recorded" in err
    assert "1 empty line(s), zero vectors: line 7" in err
    emb, status = read_embeddings(out)
    assert np.array_equal(emb, ref) and status[6] == "empty" and status.count("empty") == 1
    again = json.loads((out / "_manifest.json").read_text())
    assert again["problems"] == manifest["problems"] and again["shards"][1]["file_sha256"] == shard1["file_sha256"]
    assert [s["run"] for s in again["shards"]] == [1, 2, 1, 1] and not (out / "_staging").exists()
    # the same size, other bytes: the SHA-256 tells
    data = bytearray((out / "part-00003.npy").read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"  # the last value: +inf
    (out / "part-00003.npy").write_bytes(bytes(data))
    code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 0 and "recomputed shard 3: part-00003.npy does not match the SHA-256 recorded for it" in err
    assert np.array_equal(read_embeddings(out)[0], ref)
    # a sound job resumes with nothing to do, and says nothing about shards
    code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 0 and "(4 already done)" in stdout and "recomputed" not in err
    assert stdout.startswith("nothing to do: ") and "nothing written" in stdout  # it said "wrote 8 rows"
    assert "wrote" not in stdout


def test_resume_checks_the_staged_shards_of_an_unfinished_job(tmp_path, bert, capsys):
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):  # shards 0 and 1 finish, shard 2 does not
        run_embed_job(bert, inp, out, JobOptions(shard_rows=4), progress=_StopAfter(8))
    staged = out / "_staging" / "part-00000.npy"
    _truncate(staged, 200)
    res = run_embed_job(bert, inp, out, JobOptions(shard_rows=4, resume=True))
    assert res.shards_skipped == 1 and list(res.shards_repaired) == [0]
    assert res.shards_repaired[0].startswith("part-00000.npy has 200 bytes, not the ")
    assert np.abs(read_embeddings(out)[0] - bert.embed(TEXTS)).max() < 1e-5


def _finished_older_job(tmp_path: Path, capsys, *flags: str) -> tuple[list[str], Path, np.ndarray]:
    """A finished job of TEXTS (shards of 8) whose manifest lacks the files' sizes and SHA-256s,
    as jobs from before files were hashed: (its command, OUTPUT, its embeddings)."""
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    args = ["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--quiet", *flags]
    assert _cli(args, capsys)[0] == 0
    ref = read_embeddings(out)[0]
    _as_older_job(out)
    return args, out, ref


def _as_older_job(out: Path) -> None:
    manifest = json.loads((out / "_manifest.json").read_text())
    for s in manifest["shards"]:
        del s["file_bytes"], s["file_sha256"]
    (out / "_manifest.json").write_text(json.dumps(manifest))


def test_shards_of_jobs_from_before_files_were_hashed_are_checked_by_shape(tmp_path, bert, capsys):
    """A manifest without file sizes and SHA-256s (older jobs): the reader still names a
    corrupt file in one line, and --resume still recomputes it (its shape does not fit)."""
    args, out, ref = _finished_older_job(tmp_path, capsys)
    _truncate(out / "part-00002.npy", 1000)
    with pytest.raises(InputError, match=r"part-00002\.npy is truncated or corrupt \(") as e:
        read_embeddings(out)
    assert "\n" not in str(e.value) and "--resume" in str(e.value)
    code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 0 and "(2 already done)" in stdout, err
    assert "recomputed shard 2: part-00002.npy is truncated or corrupt (" in err
    assert np.array_equal(read_embeddings(out)[0], ref)


@pytest.mark.parametrize("swap", ["narrower", "no_embedding"])
def test_parquet_shards_of_older_jobs_are_checked_by_width_as_well_as_rows(tmp_path, capsys, swap):
    """An older job's parquet shard replaced by a readable file with the right number of rows but
    embeddings of the wrong width, or none: --resume finds it from the footer and recomputes it."""
    import pyarrow as pa

    args, out, ref = _finished_older_job(tmp_path, capsys, "--format", "parquet")
    victim = out / "part-00001.parquet"
    table = pq.read_table(victim)
    rows = table.num_rows
    if swap == "narrower":
        flat = pa.array(np.zeros(rows * 3, np.float32))
        table = table.set_column(2, "embedding", pa.FixedSizeListArray.from_arrays(flat, 3))
        why = f"part-00001.parquet holds {rows} x 3 values, not the {rows} x {ref.shape[1]} recorded"
    else:
        table = table.drop_columns(["embedding"])
        why = "part-00001.parquet is truncated or corrupt ("
    pq.write_table(table, victim)
    code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 0 and "(2 already done)" in stdout, err
    assert f"recomputed shard 1: {why}" in err
    assert np.array_equal(read_embeddings(out)[0], ref)


def test_read_embeddings_names_a_corrupt_parquet_shard(tmp_path, capsys):
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    assert _cli(["embed", str(inp), "--out", str(out), "--format", "parquet", "--quiet"], capsys)[0] == 0
    _truncate(out / "part-00000.parquet", 100)
    with pytest.raises(InputError, match=r"part-00000\.parquet is truncated or corrupt"):
        read_embeddings(out)
    (out / "part-00000.parquet").unlink()
    with pytest.raises(InputError, match=r"part-00000\.parquet is missing; run the embed job again with --resume"):
        read_embeddings(out)


def test_read_embeddings_checks_each_shard_against_its_sha256(tmp_path, capsys):
    """Four bytes changed in a shard (its size kept) were read back as embeddings without a word,
    though the manifest holds each file's SHA-256 (and --resume did catch it)."""
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    assert _cli(["embed", str(inp), "--out", str(out), "--quiet"], capsys)[0] == 0
    good = read_embeddings(out)[0]
    victim = out / "part-00000.npy"
    raw = bytearray(victim.read_bytes())
    raw[-4:] = b"\x00\x00\xc0\x7f"  # the last value becomes NaN; the size stays
    victim.write_bytes(bytes(raw))
    with pytest.raises(InputError, match=re.escape(f"{victim} is corrupt: it does not match the SHA-256 its "
                                                   "manifest records; run the embed job again with --resume")):
        read_embeddings(out)
    unchecked = read_embeddings(out, verify=False)[0]  # what it read before: the damage, unseen
    assert unchecked.shape == good.shape and np.isnan(unchecked[-1, -1])


def test_resume_refusal_names_each_change_with_its_old_and_new_value(tmp_path, capsys):
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    assert _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--quiet"], capsys)[0] == 0
    with inp.open("a") as f:
        f.write("one more line\n")
    code, _, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--resume"], capsys)
    assert code == 2 and err.strip() == (
        f"bertscope: error: cannot resume: the input now has {len(TEXTS) + 1} lines, not the {len(TEXTS)} the "
        "job began with; start a new job with another --out (or restore the input)")
    _input(inp)  # restored
    code, _, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "5", "--format", "parquet",
                         "--resume"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert ("cannot resume: --format is now parquet, not the npy the job began with; --shard-rows is now 5, "
            "not the 8 the job began with; start a new job with another --out (or rerun with the settings "
            "the job began with)") in err
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS))
    code, _, err = _cli(["embed", str(other), "--out", str(out), "--shard-rows", "8", "--field", "body",
                         "--resume"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (f"cannot resume: the input is now {other.resolve()}, not {inp.resolve()} as when the job began; "
            "the input is now read as jsonl, not the text the job began with; --field is now 'body', not "
            "the none the job began with; start a new job with another --out (or restore the input and rerun "
            "with the settings the job began with)") in err
    # the job's own text file with a --field: read so, it holds no JSON, which hid the change (a review)
    code, _, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--field", "body", "--resume"],
                        capsys)
    assert code == 2 and err.strip() == (
        "bertscope: error: cannot resume: the input is now read as jsonl, not the text the job began with; --field "
        "is now 'body', not the none the job began with; start a new job with another --out (or restore the "
        "input and rerun with the settings the job began with)")
    code, _, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "5", "--field", "body", "--resume"],
                        capsys)  # every change named, not only the reading's
    assert code == 2 and "--field is now 'body', not the none" in err and "--shard-rows is now 5, not the 8" in err
    assert _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--resume", "--quiet"], capsys)[0] == 0
    table = tmp_path / "in.parquet"  # Parquet: a column that is not there fails before the input's check
    pq.write_table(pa.table({"text": TEXTS}), table)
    pout = tmp_path / "pout"
    assert _cli(["embed", str(table), "--out", str(pout), "--quiet"], capsys)[0] == 0
    code, _, err = _cli(["embed", str(table), "--out", str(pout), "--field", "body", "--resume"], capsys)
    assert code == 2 and err.strip() == (
        "bertscope: error: cannot resume: --field is now 'body', not the 'text' the job began with; start a new "
        "job with another --out (or rerun with the settings the job began with)")


@pytest.mark.parametrize("where", ["stat", "sha256", "shape"])
def test_resume_refuses_a_shard_it_cannot_read_and_keeps_it(tmp_path, capsys, monkeypatch, where):
    """A finished shard that cannot be read (permission denied, an I/O error) is not a damaged
    one: --resume says so in one line naming the file, and neither deletes nor recomputes it.
    The read is made to fail by a stand-in, since chmod 000 blocks no read for root."""
    from bertscope.fast import embedjob

    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    args = ["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--quiet"]
    assert _cli(args, capsys)[0] == 0
    victim = out / "part-00001.npy"
    data = victim.read_bytes()
    if where == "shape":  # a job from before files were hashed: its shards are checked by shape
        _as_older_job(out)

    def denied(path):
        if Path(path).name == victim.name:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))

    with monkeypatch.context() as m:
        if where == "stat":
            real_stat = Path.stat

            def stat(self, *a, **k):
                denied(self)
                return real_stat(self, *a, **k)
            m.setattr(Path, "stat", stat)
        elif where == "sha256":
            real_sha = embedjob._file_sha256
            m.setattr(embedjob, "_file_sha256", lambda path: denied(path) or real_sha(path))
        else:
            real_load = np.load
            m.setattr(np, "load", lambda path, *a, **k: denied(path) or real_load(path, *a, **k))
        code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 2 and stdout == ""
    assert err == (f"bertscope: error: cannot read {victim} (Permission denied); fix its "
                   "permissions, or remove it to have --resume recompute it\n")
    assert victim.read_bytes() == data and (out / "_manifest.json").is_file()
    code, stdout, err = _cli(args + ["--resume"], capsys)  # readable again: nothing to do
    assert code == 0 and "(3 already done)" in stdout and "recomputed" not in err


def test_describe_model_folder_says_what_the_loaded_model_records(tmp_path, bert, bundled_path):
    """The description read from a folder's JSON files is the one a job records from the loaded
    model: for the bundled model, and for a folder whose length limit its config caps."""
    import bertscope
    from bertscope.fast.embedjob import _describe_model, describe_model_folder
    from trainkit import tiny_checkpoint

    assert describe_model_folder(None) == _describe_model(bert)
    folder = tiny_checkpoint(tmp_path / "tiny", bundled_path, positions=64)  # 64 positions, 512 in its tokenizer
    loaded = bertscope.load(folder)
    assert describe_model_folder(folder) == _describe_model(loaded) and loaded.max_seq_length == 64
    assert describe_model_folder(folder, "int8")["precision"] == "int8"


def test_resuming_a_finished_job_loads_no_model_unless_it_must(tmp_path, bert):
    """A finished job whose record, input and files match the described model is complete
    without loading the model (for int8 that saves its calibration); a damaged shard, a
    description that differs from the job's, or a folder that cannot be described loads it,
    and the loaded model decides as before."""
    from bertscope.fast.embedjob import describe_model_folder

    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    opts = JobOptions(shard_rows=8, resume=True)
    run_embed_job(bert, inp, out, JobOptions(shard_rows=8))
    ref, runs = read_embeddings(out)[0], (out / "_runs.json").read_text()
    loads = []

    def loader():
        loads.append(1)
        return bert

    res = run_embed_job(loader, inp, out, opts, describe=lambda: describe_model_folder(None))
    assert loads == [] and res.shards_skipped == 3 and (out / "_runs.json").read_text() == runs
    assert not (out / LOCK_FILE).exists()

    _truncate(out / "part-00001.npy", 200)
    res = run_embed_job(loader, inp, out, opts, describe=lambda: describe_model_folder(None))
    assert loads == [1] and list(res.shards_repaired) == [1] and np.array_equal(read_embeddings(out)[0], ref)

    res = run_embed_job(loader, inp, out, opts, describe=lambda: describe_model_folder(None, "int8"))
    assert loads == [1, 1] and res.shards_skipped == 3  # the fp32 model loaded matches the fp32 job

    def cannot():
        raise OSError("no such folder")

    run_embed_job(loader, inp, out, opts, describe=cannot)
    assert loads == [1, 1, 1]


def test_embed_resume_of_a_finished_job_does_not_load_the_model(tmp_path, capsys, monkeypatch):
    """From the command line, in int8 too: nothing to do, said without loading the model."""
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    args = ["embed", str(inp), "--out", str(out), "--shard-rows", "8", "--quiet"]
    assert _cli(args, capsys)[0] == 0

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("bertscope.bert.load", no_load)
    code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 0 and "(3 already done)" in stdout, err
    job = json.loads((out / "_job.json").read_text())
    job["precision"] = "int8"  # as if it had been an int8 job
    (out / "_job.json").write_text(json.dumps(job))
    code, stdout, err = _cli(args + ["--resume", "--precision", "int8"], capsys)
    assert code == 0 and "(3 already done)" in stdout, err


def test_an_input_without_texts_is_embedded_with_a_warning(tmp_path, capsys):
    """An empty file gives a job of no rows, a file of blank lines zero vectors: both are valid
    jobs (exit 0), and both say so on stderr, where before they passed in silence."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n")
    code, out, err = _cli(["embed", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "e"), "--quiet"], capsys)
    assert code == 0 and "wrote 0 rows" in out
    assert f"bertscope: warning: {tmp_path / 'empty.txt'} holds no lines: the job has no rows" in err
    code, out, err = _cli(["embed", str(tmp_path / "blank.txt"), "--out", str(tmp_path / "b"), "--quiet"], capsys)
    assert code == 0 and "wrote 2 rows" in out and "every row is a zero vector" in err
    assert not read_embeddings(tmp_path / "b")[0].any()


def test_resume_takes_the_jobs_format_shard_rows_and_field(tmp_path, bert, capsys):
    """`embed IN --out OUT --resume` alone finishes a job begun with --format parquet
    --shard-rows 4 --field body, where before each had to be repeated; a flag given that
    differs from the job's is still refused, naming it."""
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXTS))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_embed_job(bert, inp, out, JobOptions(field_name="body", fmt="parquet", shard_rows=4),
                      progress=_StopAfter(4))
    code, stdout, err = _cli(["embed", str(inp), "--out", str(out), "--resume", "--quiet"], capsys)
    assert code == 0 and "in 5 shard(s) (1 already done)" in stdout, err
    assert read_embeddings(out)[0].shape == (len(TEXTS), 384) and (out / "part-00004.parquet").is_file()
    code, _, err = _cli(["embed", str(inp), "--out", str(out), "--resume", "--shard-rows", "5", "--quiet"], capsys)
    assert code == 2 and "--shard-rows is now 5, not the 4 the job began with" in err


def test_a_loaded_model_is_trusted_over_a_description(tmp_path, bert):
    """run_embed_job given a loaded model checks the job against that model, whatever
    ``describe`` says (a description is for a loader function only)."""
    import dataclasses

    from bertscope.fast.embedjob import describe_model_folder

    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    run_embed_job(bert, inp, out, JobOptions(shard_rows=8))
    shorter = dataclasses.replace(bert, max_seq_length=128)
    with pytest.raises(InputError, match="max_seq_length is now 128, not the 256"):
        run_embed_job(shorter, inp, out, JobOptions(shard_rows=8, resume=True),
                      describe=lambda: describe_model_folder(None))


def test_a_refused_resume_leaves_a_finished_folder_without_a_lock_file(tmp_path, bert):
    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    run_embed_job(bert, inp, out, JobOptions(shard_rows=8))
    _edit_keeping_size_and_mtime(inp, "line 6: a few", "line 6: x few")
    for describe in (None, lambda: _describe(bert)):
        with pytest.raises(InputError, match="is complete, but input records 1..8 changed"):
            run_embed_job(bert if describe is None else (lambda: bert), inp, out,
                          JobOptions(shard_rows=8, resume=True), describe=describe)
        assert not (out / LOCK_FILE).exists()


def _describe(bert) -> dict:
    from bertscope.fast.embedjob import _describe_model

    return _describe_model(bert)


def test_a_resume_that_only_moves_staged_shards_says_it_wrote_them(tmp_path, bert, capsys, monkeypatch):
    """Every shard computed, then a crash while moving them out of _staging: the resume computes
    nothing yet writes the shards and the manifest, so it must not say "nothing written"."""
    from bertscope.fast import embedjob

    inp = _input(tmp_path / "in.txt")
    out = tmp_path / "out"
    args = ["embed", str(inp), "--out", str(out), "--shard-rows", "4", "--quiet"]
    real = embedjob.move_into_place

    def crash(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(embedjob, "move_into_place", crash)
    code, stdout, err = _cli(args, capsys)
    assert code != 0 and not (out / "_manifest.json").exists()
    monkeypatch.setattr(embedjob, "move_into_place", real)
    code, stdout, err = _cli(args + ["--resume"], capsys)
    assert code == 0, err
    assert stdout.startswith("wrote ") and "nothing" not in stdout, stdout
    assert (out / "_manifest.json").is_file()
    code, stdout, err = _cli(args + ["--resume"], capsys)  # now it is finished: nothing to do
    assert code == 0 and stdout.startswith("nothing to do: ") and "nothing written" in stdout
