"""Folders of outputs are written all at once or not at all (bertscope.files.write_folder_atomic),
and `heads --out` and `experiments --out` use it: a failure leaves the old folder as it was."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from bertscope.cli.app import main
from bertscope.errors import InputError
from bertscope.files import TEMP_SUFFIX, write_folder_atomic, write_text_atomic


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fill_with(files: dict[str, str], fail_after: int | None = None):
    def fill(stage: Path) -> list[Path]:
        written = []
        for i, (name, text) in enumerate(files.items()):
            if fail_after is not None and i == fail_after:
                raise RuntimeError("the plotting library exploded")
            written.append(write_text_atomic(stage / name, text))
        return written
    return fill


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_an_output_keeps_the_mode_of_the_file_it_replaces_and_a_new_one_follows_the_umask(tmp_path):
    private = tmp_path / "private.html"
    private.write_text("old")
    private.chmod(0o600)
    write_text_atomic(private, "new")
    assert private.read_text() == "new" and oct(private.stat().st_mode & 0o777) == oct(0o600)
    old = os.umask(0o027)
    try:
        fresh = write_text_atomic(tmp_path / "fresh.json", "{}")
        folder = write_folder_atomic(tmp_path / "folder", fill_with({"a.json": "A"}))[0].parent
    finally:
        os.umask(old)
    assert oct(fresh.stat().st_mode & 0o777) == oct(0o640)  # 0666 less the umask, as open() gives
    assert oct(folder.stat().st_mode & 0o777) == oct(0o750)
    (folder / "a.json").chmod(0o600)  # a folder of outputs written again: its private file stays so
    write_folder_atomic(folder, fill_with({"a.json": "A2", "b.json": "B"}))
    assert (folder / "a.json").read_text() == "A2" and oct((folder / "a.json").stat().st_mode & 0o777) == oct(0o600)


def test_a_link_a_pipe_and_a_device_are_written_through_not_replaced(tmp_path, monkeypatch, caplog):
    """The rename replaced whatever the name was: a symbolic link became a file (its target kept
    the old bytes), a named pipe became a file (its reader got nothing), and as root `--out
    /dev/full` replaced the device with a file."""
    import stat

    target = tmp_path / "target.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"

    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # a reader, open without waiting for a writer
    try:
        write_text_atomic(pipe, "through the pipe")  # fits the pipe's buffer: no wait
        os.set_blocking(reader, True)
        got = [os.read(reader, 100)]  # replaced by a file instead, the pipe would read as empty
    finally:
        os.close(reader)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(pipe).st_mode)
    # nothing reads it yet: the write says so and waits, as a shell's redirection does (the work
    # done is not thrown away because the reader starts late)
    import threading
    import time

    caplog.set_level("WARNING", logger="bertscope.files")
    writer = threading.Thread(target=lambda: write_text_atomic(pipe, "a late reader"), daemon=True)
    writer.start()
    deadline = time.monotonic() + 60
    while not any("nothing reads the named pipe" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "no warning: the pipe was not waited on"
        time.sleep(0.02)
    with open(pipe, "rb") as f:
        late = f.read()
    writer.join(timeout=30)
    assert late == b"a late reader" and stat.S_ISFIFO(os.stat(pipe).st_mode)

    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    with pytest.raises(InputError, match="Too many levels of symbolic links"):
        write_text_atomic(loop, "x")
    assert loop.is_symlink()

    def no_rename(src, dst):  # were the fix undone, this test must not replace a device itself
        raise AssertionError(f"renamed over {dst}")

    monkeypatch.setattr("bertscope.files.os.replace", no_rename)
    write_text_atomic(os.devnull, "discarded")  # an ordinary use: --out /dev/null
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    if os.path.exists("/dev/full"):  # a device that refuses: its error, and it is still the device
        with pytest.raises(OSError, match="No space left"):
            write_text_atomic("/dev/full", "x" * 100_000)
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_dev_stdout_is_written_on_where_it_stands(tmp_path):
    """/dev/stdout is written through the process's own stdout: after `>>` the file keeps what it
    held (a rename replaced it), after `>` what the process prints later follows it (a second
    handle of its own wrote over it), and through a pipe it is the pipe."""
    import subprocess
    import sys

    code = ("from bertscope.files import write_text_atomic; print('before'); "
            "write_text_atomic('/dev/stdout', 'written\\n'); print('after')")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    out = tmp_path / "log.txt"
    out.write_text("first\n")
    with open(out, "ab") as f:  # >>
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True, timeout=120, env=env)
    assert out.read_text() == "first\nbefore\nwritten\nafter\n"
    with open(out, "wb") as f:  # >: what the process prints after it does not write over it
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True, timeout=120, env=env)
    assert out.read_text() == "before\nwritten\nafter\n"
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=120, env=env)
    assert piped.stdout == b"before\nwritten\nafter\n"


def test_the_cli_checks_a_links_target_folder_and_takes_a_device(tmp_path):
    from bertscope.cli.common import check_output_file

    link = tmp_path / "out.txt"
    link.symlink_to(tmp_path / "gone" / "out.txt")  # its target's folder does not exist
    with pytest.raises(InputError, match=f"the folder '{tmp_path / 'gone'}' does not exist"):
        check_output_file(str(link))
    assert check_output_file(os.devnull) == Path(os.devnull)  # not "the folder '/dev' is not writable"
    import socket

    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:  # refused before any work, and by the writer itself
        sock.bind(str(sock_path))
        with pytest.raises(InputError, match="is a socket, not a file"):
            check_output_file(str(sock_path))
        with pytest.raises(InputError, match=f"^cannot write {sock_path}: it is a socket, not a file$"):
            write_text_atomic(sock_path, "x")


def test_an_unwritable_folder_names_the_file_asked_for_not_the_temporary():
    with pytest.raises(OSError) as e:  # Linux's /proc refuses new files, even to root
        write_text_atomic("/proc/bertscope-out.json", "{}")
    assert e.value.filename == "/proc/bertscope-out.json" and TEMP_SUFFIX not in str(e.value), e.value
    assert e.value.strerror and e.value.strerror in str(e.value)  # the system's reason, untouched


def _disk_full(f) -> None:
    f.write(b"part of it")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # what a write to a full disk raises: no file name


@pytest.mark.parametrize("existing", [False, True], ids=["new-folder", "existing-folder"])
def test_a_full_disk_names_the_file_asked_for_alone_or_in_a_folder(tmp_path, existing):
    """A full disk's error carries no file name, and the CLI said "OSError: [Errno 28] No space
    left on device" naming nothing (`finetune`, `experiments`). It now names the file the write
    was for: not the temporary, not the staging folder."""
    from bertscope.files import write_atomic

    with pytest.raises(OSError) as e:
        write_atomic(tmp_path / "one.json", _disk_full)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "one.json")
    out = tmp_path / "report"
    if existing:
        out.mkdir()

    def fill(stage: Path) -> list[Path]:
        return [write_text_atomic(stage / "a.json", "{}"), write_atomic(stage / "img" / "b.png", _disk_full)]

    with pytest.raises(OSError) as e:
        write_folder_atomic(out, fill)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(out / "img" / "b.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == (["report"] if existing else [])
    assert not existing or not any(out.iterdir())


def test_a_new_folder_appears_whole(tmp_path):
    out = tmp_path / "new" / "report"
    seen = []
    paths = write_folder_atomic(out, fill_with({"a.json": "A", "img/b.png": "B"}),
                                before_commit=lambda: seen.append(out.exists()))
    assert seen == [False]  # nothing at OUT until everything was written
    assert paths == [out / "a.json", out / "img" / "b.png"]
    assert snapshot(out) == {"a.json": b"A", "img/b.png": b"B"}
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~current_umask())  # as mkdir would make it
    assert [p.name for p in out.parent.iterdir()] == ["report"]  # no staging folder left


def test_an_existing_folder_keeps_other_files_and_gets_every_output(tmp_path):
    out = tmp_path / "out"
    (out / "img").mkdir(parents=True)
    (out / "a.json").write_text("old A")
    (out / "img" / "b.png").write_text("old B")
    (out / "notes.txt").write_text("the user's own file")
    seen = []
    write_folder_atomic(out, fill_with({"a.json": "A", "img/b.png": "B", "c.md": "C"}),
                        before_commit=lambda: seen.append(snapshot(out)))
    outside_stage = {k: v for k, v in seen[0].items() if not k.startswith(".bertscope-stage-")}
    assert outside_stage == {"a.json": b"old A", "img/b.png": b"old B", "notes.txt": b"the user's own file"}
    assert snapshot(out) == {"a.json": b"A", "img/b.png": b"B", "c.md": b"C", "notes.txt": b"the user's own file"}


@pytest.mark.parametrize("exists", [False, True])
def test_a_failure_while_filling_changes_nothing(tmp_path, exists):
    out = tmp_path / "out"
    if exists:
        out.mkdir()
        (out / "a.json").write_text("old A")
        (out / "b.png").write_text("old B")
    before = snapshot(out) if exists else None
    with pytest.raises(RuntimeError, match="exploded"):
        write_folder_atomic(out, fill_with({"a.json": "A", "b.png": "B", "c": "C"}, fail_after=2))
    if exists:
        assert snapshot(out) == before
    else:
        assert not out.exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(TEMP_SUFFIX)]


def test_a_failure_while_committing_is_undone(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.json").write_text("old A")
    (out / "z.png").write_text("old Z")
    before = snapshot(out)
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(Path(dst).name)
        if Path(dst).name == "z.png" and Path(src).parent.name != ".old":  # the third output's commit
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        write_folder_atomic(out, fill_with({"a.json": "A", "new/b.txt": "B", "z.png": "Z"}))
    monkeypatch.undo()
    assert calls[:3] == ["a.json", "b.txt", "z.png"]  # two outputs were in place, then undone
    assert snapshot(out) == before
    assert not (out / "new").exists()


def test_heads_out_failure_leaves_the_old_folder(tmp_path, capsys, monkeypatch):
    import bertscope.see.figures as figures

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\n")
    out = tmp_path / "heads"
    out.mkdir()
    (out / "heads.json").write_text('{"old": true}')
    (out / "heads_entropy.png").write_bytes(b"old png")
    (out / "heads_cls.png").write_bytes(b"old png")
    before = snapshot(out)
    real_save, calls = figures.save_heatmap, []

    def third_heatmap_fails(path, *args, **kw):  # two new PNGs are written, then a failure
        calls.append(Path(path).name)
        if len(calls) == 3:
            raise RuntimeError("matplotlib: cannot draw the heatmap")
        return real_save(path, *args, **kw)

    monkeypatch.setattr(figures, "save_heatmap", third_heatmap_fails)
    code = main(["heads", str(corpus), "--out", str(out)])
    err = capsys.readouterr().err
    assert len(calls) == 3
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "cannot draw the heatmap" in err
    assert snapshot(out) == before  # not a mix of new PNGs and the old heads.json


def test_experiments_out_failure_leaves_the_old_files(tmp_path, capsys, monkeypatch):
    import bertscope.understand.experiments.report as report

    out = tmp_path / "docs"
    (out / "experiments").mkdir(parents=True)
    (out / "EXPERIMENTS.md").write_text("# old\n")
    (out / "BENCHMARKS.md").write_text("# someone else's\n")
    (out / "experiments" / "results.json").write_text("{}")
    (out / "experiments" / "s1_self_match.png").write_bytes(b"old png")
    before = snapshot(out)

    def half_the_plots(r, img):
        write_text_atomic(img / "s1_self_match.png", "new png")
        raise RuntimeError("matplotlib: out of fonts")

    monkeypatch.setattr(report, "save_plots", half_the_plots)
    code = main(["experiments", "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert snapshot(out) == before


def test_a_link_to_a_folder_not_made_yet_is_written_through(tmp_path):
    """A dangling link as OUT failed in the rename with "Not a directory: '.out.32wpm6ea.tmp' ->
    'out'", naming the staging folder. It is written through, as a file's link is."""
    (tmp_path / "out").symlink_to(tmp_path / "target")
    paths = write_folder_atomic(tmp_path / "out", fill_with({"a.json": "A"}))
    assert paths == [tmp_path / "target" / "a.json"] and (tmp_path / "out").is_symlink()
    write_folder_atomic(tmp_path / "out", fill_with({"b.json": "B"}))  # now a link to a folder
    assert snapshot(tmp_path / "out") == {"a.json": b"A", "b.json": b"B"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "target"]
