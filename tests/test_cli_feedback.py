"""Feedback on long work and missing extras: progress bars on a terminal (and only there), extras
checked before any work, `coref --bundled`, and `ablate`'s lines for the silenced heads' layer."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from bertscope.cli.app import main

from conftest import IT_ANIMAL

ROOT = Path(__file__).resolve().parents[1]
SHORT = "The cat sat on the mat"


def _env() -> dict:
    return {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
            "COLUMNS": "100", "TERM": "xterm"}


def _on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run `bertscope ARGS` with stderr on a pseudo-terminal (stdout on a pipe); return the exit
    status, stdout, and everything written to the terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 x 100, as a terminal
    proc = subprocess.Popen([sys.executable, "-m", "bertscope", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=_env())
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            piece = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not piece:
            break
        seen += piece
    os.close(master)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return proc.wait(timeout=60), out, seen.decode("utf-8", "replace")


def _bar_drawn(text: str) -> bool:
    return "ablate --sweep" in text and "/72 [" in text  # tqdm: "ablate --sweep:  40%|...| 29/72 [00:01<..."


def test_progress_bar_on_a_terminal_and_not_with_quiet():
    code, out, tty = _on_a_terminal("ablate", SHORT, "--sweep", "--top", "2")
    assert code == 0 and "L" in out
    assert _bar_drawn(tty), tty[-500:]
    code, out, tty = _on_a_terminal("ablate", SHORT, "--sweep", "--top", "2", "--quiet")
    assert code == 0 and "L" in out
    assert tty == "", tty[-500:]


def test_no_progress_bar_in_a_pipe_unless_asked():
    run = lambda *extra: subprocess.run([sys.executable, "-m", "bertscope", "ablate", SHORT, "--sweep", "--top", "1",  # noqa: E731
                                         *extra], capture_output=True, text=True, env=_env(), timeout=180)
    r = run()
    assert r.returncode == 0 and r.stderr == ""
    r = run("--progress")
    assert r.returncode == 0 and _bar_drawn(r.stderr)
    # the log keeps the bar's last state: it was erased at the end, leaving "29/72" or a blank line
    assert "72/72 [" in r.stderr.split("\r")[-1] and r.stderr.endswith("\n"), r.stderr[-300:]


def test_library_progress_callbacks_count_the_work(bert):
    from bertscope.understand.ablate import sweep
    from bertscope.understand.coref import evaluate
    from bertscope.understand.headstats import head_stats
    from bertscope.understand.wsc import BUNDLED_SCHEMAS, read_wsc

    calls: list[tuple[int, int]] = []
    sweep(bert, SHORT, progress=lambda d, t: calls.append((d, t)))
    assert calls[0] == (0, 72) and calls[-1] == (72, 72) and [d for d, _ in calls] == list(range(73))
    calls.clear()
    head_stats(bert, ["one text", "two texts", "three"], progress=lambda d, t: calls.append((d, t)))
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    calls.clear()
    schemas, _ = read_wsc(BUNDLED_SCHEMAS)
    evaluate(bert, schemas[:4], progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (4, 4) and len(calls) == 5


def test_embed_counts_texts_batch_by_batch(bert):
    """The bar moves with every packed batch, not once per 2,048 texts."""
    texts = [f"text number {i} " + "word " * (i % 17) for i in range(300)]
    ids, _ = bert.tokenizer.encode_ids(texts)
    steps: list[int] = []
    out = bert.embed_ids(ids, batch_tokens=256, progress=steps.append)
    assert sum(steps) == 300 and len(steps) >= 10 and max(steps) < 100
    np.testing.assert_allclose(out, bert.embed_ids(ids, batch_tokens=256), atol=1e-6)


def _without_matplotlib(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`bertscope ARGS` with matplotlib unimportable and the model loader replaced by a tripwire."""
    code = ("import sys\nsys.modules['matplotlib'] = None\n"
            "import bertscope.bert as b\n"
            "def tripwire(*a, **k):\n    raise SystemExit('WORK STARTED: the model was loaded')\n"
            "b.load = tripwire\n"
            "from bertscope.cli.app import main\nsys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(),
                          timeout=120, cwd=cwd)


def test_experiments_without_matplotlib_fails_before_any_work(tmp_path):
    out = tmp_path / "exp"
    r = _without_matplotlib("experiments", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "WORK STARTED" not in r.stderr
    assert "matplotlib" in r.stderr and "pip install 'bertscope[plot]'" in r.stderr and "--no-plots" in r.stderr
    assert not out.exists() or not any(out.iterdir())
    # --no-plots needs no matplotlib: it goes on to the work (here: the tripwire)
    r = _without_matplotlib("experiments", "--out", str(out), "--no-plots", cwd=tmp_path)
    assert "WORK STARTED" in r.stderr


def test_heads_out_and_plot_without_matplotlib_fail_before_any_work(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\nanother line\n")
    r = _without_matplotlib("heads", str(corpus), "--out", str(tmp_path / "maps"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "matplotlib" in r.stderr, r.stderr
    r = _without_matplotlib("plot", SHORT, "--out", str(tmp_path / "x.png"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "matplotlib" in r.stderr, r.stderr
    r = _without_matplotlib("heads", str(corpus), cwd=tmp_path)  # no --out: no figure, no need
    assert "WORK STARTED" in r.stderr


def test_coref_bundled_by_name(capsys):
    assert main(["coref", "--bundled", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "12 schemas scored" in out and "MAS" in out
    assert main(["coref"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--bundled" in err
    assert main(["coref", "x.xml", "--bundled"]) == 2
    capsys.readouterr()


def test_ablate_says_what_its_own_layer_shows(capsys):
    assert main(["ablate", IT_ANIMAL, "--layer", "3", "--head", "1", "--token", "it"]) == 0
    out = capsys.readouterr().out
    lines = [l.strip() for l in out.splitlines() if l.strip().startswith("L")]
    assert lines[0].startswith("L3: the silenced heads' own layer: largest move 0.000")
    assert [l.split(":")[0] for l in lines[1:]] == ["L4", "L5"]
    assert all("most moved" in l for l in lines[1:])


def test_ablate_counts_layers_after_a_head_named_from_the_end(capsys):
    """--layer -1 is the last layer: no layer comes after it (the layers were listed from L0,
    as if they followed the silenced head, each with a move of 0.000)."""
    assert main(["ablate", IT_ANIMAL, "--layer", "-1", "--head", "0", "--token", "it"]) == 0
    out = capsys.readouterr().out
    lines = [l.strip() for l in out.splitlines() if l.strip().startswith("L")]
    assert len(lines) == 1 and lines[0].startswith("L5: the silenced heads' own layer")
    assert "(no layer comes after it)" in out


def test_benchmark_scripts_end_a_bertscope_error_with_one_line_and_status_2(capsys):
    """cli.common.run_script, the end of the benchmark scripts: a BertscopeError becomes one
    line on stderr and exit status 2, like the bertscope command; any other status passes through."""
    import pytest

    from bertscope.cli.common import run_script
    from bertscope.errors import InputError

    def bad() -> int:
        raise InputError("not a checkpoint:\n  no config.json")

    with pytest.raises(SystemExit) as e:
        run_script(bad)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: not a checkpoint: no config.json\n"
    for status in (0, 1):
        with pytest.raises(SystemExit) as e:
            run_script(lambda status=status: status)
        assert e.value.code == status

    def broken() -> int:
        raise ValueError("a bug, not bad input")

    with pytest.raises(ValueError):  # a bug keeps its traceback
        run_script(broken)


def test_library_warnings_and_log_records_print_as_one_kind_of_line(capsys):
    """A library warning names bertscope itself (for Python users): the CLI prints it once, on one
    line; a log record reads the same way ("warning", not "WARNING")."""
    import logging

    from bertscope.cli.app import _LogLine, _warning_line

    import bertscope.bert  # noqa: F401  (its settings are named as typed: keep_precision=True is --keep-precision)

    _warning_line("bertscope: int8 is off: measured 0.47x the speed of fp32 here\n(keep_precision=True "
                  "(--keep-precision) keeps int8)", RuntimeWarning, "bert.py", 1)
    assert capsys.readouterr().err == ("bertscope: warning: int8 is off: measured 0.47x the speed of fp32 here "
                                       "(--keep-precision keeps int8)\n")
    _warning_line("3 text(s) were truncated", UserWarning, "bert.py", 1)
    assert capsys.readouterr().err == "bertscope: warning: 3 text(s) were truncated\n"
    rec = logging.LogRecord("bertscope.fast.tuning", logging.WARNING, "tuning.py", 1,
                            "the rate is %.1f GFLOP/s", (43.14,), None)
    assert _LogLine().format(rec) == "bertscope: warning: the rate is 43.1 GFLOP/s"
    try:  # a record logged with its exception (log.exception, exc_info=True) keeps it, in brief
        raise OSError("disk full\nwhile writing")
    except OSError:
        import sys

        rec = logging.LogRecord("x", logging.ERROR, "x.py", 1, "could not save", None, sys.exc_info())
    assert _LogLine().format(rec) == "bertscope: error: could not save (OSError: disk full while writing)"


def test_sigterm_stops_a_command_as_ctrl_c_does_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    """A scheduler's SIGTERM: one line, exit 143, the command's cleanup run (as for Ctrl-C, exit
    130), a hint to --resume only where there is something to resume (an embed job's _job.json, a
    finetune's checkpoint: before them --resume would only fail); the handler before it is
    restored, and a second SIGTERM while the first is reported goes to it, not up as a traceback."""
    import signal

    from bertscope.cli import embed, finetune, params
    from bertscope.fast.embedjob import JOB_FILE
    from bertscope.train.loop import STATE_FILE

    def killed(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal arrives first
        raise AssertionError("SIGTERM did not stop the command")

    def interrupted(args):
        raise KeyboardInterrupt

    hint = "; rerun the same command with --resume to finish"
    before = signal.getsignal(signal.SIGTERM)
    texts = tmp_path / "t.txt"
    texts.write_text("one\ntwo\n")
    out = tmp_path / "t.emb"
    monkeypatch.setattr(embed, "run", killed)
    assert main(["embed", str(texts), "--out", str(out)]) == 143  # stopped before its job file
    assert capsys.readouterr().err == "bertscope: terminated\n"
    assert signal.getsignal(signal.SIGTERM) is before
    out.mkdir()
    (out / JOB_FILE).write_text("{}")
    assert main(["embed", str(texts), "--out", str(out)]) == 143
    assert capsys.readouterr().err == f"bertscope: terminated{hint}\n"
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.setattr(embed, "run", interrupted)
    assert main(["embed", str(texts), "--out", str(out), "--resume"]) == 130
    assert capsys.readouterr().err == f"bertscope: interrupted{hint}\n"

    train = tmp_path / "train.csv"
    train.write_text("text,label\ngood,pos\nbad,neg\n")
    run_dir = tmp_path / "run"
    monkeypatch.setattr(finetune, "run", killed)
    assert main(["finetune", str(train), "--out", str(run_dir)]) == 143  # before a checkpoint
    assert capsys.readouterr().err == "bertscope: terminated\n"
    run_dir.mkdir()
    (run_dir / STATE_FILE).write_bytes(b"")
    assert main(["finetune", str(train), "--out", str(run_dir)]) == 143
    assert capsys.readouterr().err == f"bertscope: terminated{hint}\n"

    monkeypatch.setattr(params, "run", killed)  # a command with nothing to resume: no hint
    assert main(["params", "--preset", "bert-base"]) == 143
    assert capsys.readouterr().err == "bertscope: terminated\n"

    got = []

    def second(args):  # called while the first SIGTERM is reported
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(500):
            if got:
                break
            time.sleep(0.01)
        return True

    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        monkeypatch.setattr(embed, "run", killed)
        monkeypatch.setattr(embed, "resumable", second)
        try:
            code = main(["embed", str(texts), "--out", str(out)])
        except KeyboardInterrupt:
            raise AssertionError("a second SIGTERM escaped main()") from None
        assert code == 143 and got == [signal.SIGTERM]
        assert capsys.readouterr().err == f"bertscope: terminated{hint}\n"
    finally:
        signal.signal(signal.SIGTERM, before)


def test_explain_experiments_takes_the_same_progress_flags_as_every_command(tmp_path, capsys):
    """--quiet and --progress, one or the other (its bars followed --quiet alone, and were drawn
    into a pipe or a log)."""
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["explain-experiments", "--out", str(tmp_path), "--quiet", "--progress"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["explain-experiments", "--help"])
    assert "--progress" in capsys.readouterr().out


@pytest.mark.parametrize("argv, hint", [
    (["embed", "in.txt", "--out", "o", "--bogus"], "(see bertscope embed --help)"),
    (["doctor", "--bogus", "x"], "(see bertscope doctor --help)"),
    (["--bogus"], "(see bertscope --help)"),
])
def test_an_unknown_flag_points_to_the_help_of_its_command(capsys, argv, hint):
    from bertscope.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("bertscope: error: unrecognized arguments: --bogus") and err.rstrip().endswith(hint)


def test_a_library_setting_is_named_by_its_flag_on_the_command_line(tmp_path, capsys):
    """The library names a setting both ways, "max_length (--max-length)"; the command line said
    that too, where the user had typed only the flag. Only settings the library named so are
    shortened: a path or word the user wrote that looks like "x (X)" stays as written."""
    from bertscope.errors import as_typed, setting

    train = tmp_path / "t.jsonl"
    train.write_text('{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n')
    assert main(["finetune", str(train), "--out", str(tmp_path / "o"), "--max-length", "2", "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == "bertscope: error: --max-length must be a whole number >= 3, got 2"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a run")
    assert main(["finetune", str(train), "--out", str(tmp_path / "other"), "--resume", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().startswith("bertscope: error: --resume: ")
    odd = tmp_path / "old data (DATA).txt"  # the user's own words, shaped like a setting
    assert main(["embed", str(odd), "--out", str(tmp_path / "x.npy")]) == 2
    assert str(odd) in capsys.readouterr().err
    assert main(["attend", "hello world", "--token", "total (TOTAL)"]) == 2
    assert "'total (TOTAL)' is not in the text" in capsys.readouterr().err
    assert as_typed(f"{setting('pair_field', '--text-pair-field')} x; {setting('train', 'TRAIN')} y; "
                    "total (TOTAL), the output folder (--out)") == \
        "--text-pair-field x; TRAIN y; total (TOTAL), the output folder (--out)"
