"""The command line: exit codes, output, and one-line errors (never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bertscope.cli.app import main

from conftest import IT_ANIMAL


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertscope", *args], capture_output=True, text=True,
                          timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bertscope: error:") and fragment in lines[0], lines[0]


def test_attend_text_output(capsys):
    assert main(["attend", IT_ANIMAL, "--token", "it"]) == 0
    out = capsys.readouterr().out
    assert "L3  H1   animal 0.6" in out and "L5  H11  animal 0.6" in out
    animal_line = next(l for l in out.splitlines() if l.strip().startswith("animal"))
    assert animal_line.split()[1:3] == ["L5", "H11"] or animal_line.split()[1:3] == ["L3", "H1"]


def test_attend_json(capsys):
    assert main(["attend", IT_ANIMAL, "--token", "it", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["token"] == "it" and "animal" in data["words"]
    w = data["weights"]
    assert len(w) == 6 and len(w[0]) == 12 and len(w[0][0]) == len(data["words"])
    a = data["words"].index("animal")
    assert w[3][1][a] > 0.5 and w[5][11][a] > 0.5


def test_params_bert_base_json(capsys):
    assert main(["params", "--preset", "bert-base", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["per_layer_total"] == 2_362_368
    assert data["attention_total"] == 28_348_416
    assert data["model_total"] == 109_482_240
    assert data["attention_share"] == round(28_348_416 / 109_482_240, 6) == 0.258932


def test_params_table(capsys, bundled_path):
    assert main(["params", "--model", str(bundled_path)]) == 0
    out = capsys.readouterr().out
    assert "W_Q" in out and "W_O" in out and "591,360" in out  # 4 x (384 x 384 + 384) per layer
    totals = out.strip().splitlines()[-3:]  # the totals' figures end in one column
    assert [t.split()[-1] for t in totals] == ["3,548,160", "22,713,216", "15.6%"]
    assert len({len(t) for t in totals}) == 1, totals


@pytest.mark.parametrize("args,fragment", [
    (["attend", "", "--token", "it"], "the text is empty"),
    (["attend", "   ", "--token", "it"], "the text is empty"),
    (["attend", IT_ANIMAL, "--token", "zebra"], "'zebra' is not in the text"),
    (["attend", IT_ANIMAL, "--token", ""], "--token word is empty"),
    (["attend", IT_ANIMAL, "--token", "it", "--model", "/nonexistent/model"], "does not exist"),
    (["params", "--preset", "bert-huge"], "unknown preset"),
    (["view", IT_ANIMAL, "--measure", "", "--out", "m.html"], "--measure names no measure"),  # it drew none
    (["view", IT_ANIMAL, "--measure", ",", "--out", "m.html"], "--measure names no measure"),
    (["view", IT_ANIMAL, "--out", "a" * 300 + ".html"], "--out: File name too long: 'aaa"),  # was exit 1, OSError
    (["plot", IT_ANIMAL, "--out", "a" * 300 + ".png"], "--out: File name too long"),
    (["embed", __file__, "--out", "a" * 300], "--out: File name too long"),
    # an empty value: read as the folder "." (--model, a positional file) or as if left out
    (["attend", IT_ANIMAL, "--token", "it", "--model", ""], "--model is empty; give PATH"),
    (["params", "--model", " "], "--model is empty; give PATH"),
    (["params", "--preset", ""], "--preset is empty; give NAME"),
    (["doctor", "--preset", ""], "--preset is empty; give NAME"),
    (["embed", __file__, "--out", "e.emb", "--field", ""], "--field is empty; give NAME"),
    (["heads", ""], "the input file is an empty name"),
    (["coref", ""], "the input file is an empty name"),
    (["predict", "", ""], "the file name is empty"),
])
def test_bad_input_one_line_error(args, fragment, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertscope: error:") and fragment in err[0]


def test_broken_model_folder_in_a_subprocess(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "hidden_size": 10}')
    proc = run_cli("attend", IT_ANIMAL, "--token", "it", "--model", str(tmp_path))
    assert_one_line_error(proc, "bad config")
    proc = run_cli("attend", IT_ANIMAL, "--token", "it", "--model", str(tmp_path / "missing"))
    assert_one_line_error(proc, "does not exist")


def test_long_text_truncated_with_warning(capsys):
    text = IT_ANIMAL + " " + "and then it walked on " * 150
    assert main(["attend", text, "--token", "animal", "--json"]) == 0
    captured = capsys.readouterr()
    assert "bertscope: warning:" in captured.err and "truncated" in captured.err
    assert json.loads(captured.out)["truncated"] is True


def test_token_cut_off_by_truncation_is_an_error(capsys):
    text = "word " * 600 + "zebra"
    assert main(["attend", text, "--token", "zebra"]) == 2
    err = capsys.readouterr().err
    assert "was cut off" in err and "Traceback" not in err


def test_console_script_and_help():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "attend" in proc.stdout and "params" in proc.stdout
    proc = run_cli("attend", "--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout
    proc = run_cli()  # no command: a usage error, so the help goes to stderr (stdout stays clean)
    assert proc.returncode == 2 and proc.stdout == "" and "COMMAND" in proc.stderr


def test_every_module_a_help_page_names_exists():
    """What a --help page tells the reader to import (``import bertscope.x.y``, ``from
    bertscope.x import``) imports."""
    import importlib
    import re

    from bertscope.cli.app import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "attend" in a.choices)
    named = set()
    for cmd, p in sub.choices.items():
        page = p.format_help()
        named |= {(cmd, m) for m in re.findall(r"(?:import|from) (bertscope(?:\.\w+)*)", page)}
    assert named, "no help page names a module: the check would be vacuous"
    for cmd, module in sorted(named):
        importlib.import_module(module)  # ModuleNotFoundError names the page's mistake


@pytest.mark.parametrize("args,fragment", [
    (["attend", "x"], "the following arguments are required: --token"),
    (["nosuchcmd"], "invalid choice: 'nosuchcmd'"),
    (["params", "--preset", "bert-base", "--model", "/tmp"], "not allowed with argument"),
    (["attend", "x", "--token", "x", "--top", "abc"], "invalid int value"),
])
def test_usage_mistakes_are_one_line_too(args, fragment):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert_one_line_error(proc, fragment)
    assert "--help" in proc.stderr


def test_debug_is_accepted_after_the_command():
    proc = run_cli("attend", "the cat sat", "--token", "dog", "--debug")
    assert proc.returncode == 2  # the same status as without --debug: a user error
    assert "Traceback" in proc.stderr and "InputError" in proc.stderr  # --debug shows the traceback
    assert proc.stderr.rstrip().splitlines()[-1].startswith("bertscope: error: ")


def test_multi_line_library_errors_are_collapsed(tmp_path):
    import shutil

    from conftest import IT_ANIMAL as text

    import bertscope

    folder = tmp_path / "m"
    shutil.copytree(bertscope.bundled_model_path(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle\nwith\nmany lines")
    proc = run_cli("attend", text, "--token", "it", "--model", str(folder))
    assert_one_line_error(proc, "could not be read as model weights")


@pytest.mark.parametrize("args", [["heads", "{d}"], ["coref", "{d}"], ["bench", "--quick", "--corpus", "{d}"],
                                  ["experiments", "--wsc", "{d}", "--out", "{d}/out"]])
def test_a_folder_given_as_an_input_file_is_named_as_one(tmp_path, capsys, args):
    code = main([a.format(d=tmp_path) for a in args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{tmp_path} is a folder, not a file" in err, err


def test_an_output_path_under_a_file_says_it_is_a_file(tmp_path, capsys):
    """--out some.txt/page.html: the "folder" is a file; the error says so, not "does not exist"."""
    from bertscope.errors import InputError
    from bertscope.files import write_text_atomic

    f = tmp_path / "texts.txt"
    f.write_text("a text\n")
    assert main(["view", IT_ANIMAL, "--out", str(f / "v.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"'{f}' is a file, not a folder to write 'v.html' in" in err[0], err
    with pytest.raises(InputError, match="is a file, not a folder to write x.json in"):
        write_text_atomic(f / "x.json", "{}")


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED", "buffered"])
def test_output_cut_short_by_the_file_system_is_an_error_not_a_short_file(tmp_path, unbuffered):
    """Under PYTHONUNBUFFERED=1 (many containers set it) Python's stdout ignores a short write: a
    table written to a full disk lost its end and the command exited 0. A file-size limit cuts
    the write as a full disk does (a short write, then an error)."""
    import os
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))

    out = tmp_path / "out.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    with open(out, "wb") as f:
        r = subprocess.run([sys.executable, "-m", "bertscope", "params"], stdout=f, stderr=subprocess.PIPE,
                           env=env, preexec_fn=limit, text=True, timeout=300)
    assert (r.returncode, r.stderr) == (2, "bertscope: error: cannot write standard output: File too large\n")
    assert out.stat().st_size == 300
    with open("/dev/full", "wb") as f:  # a full disk: every write fails
        r = subprocess.run([sys.executable, "-m", "bertscope", "params"], stdout=f, stderr=subprocess.PIPE,
                           env=env, text=True, timeout=300)
    assert (r.returncode, r.stderr) == (2, "bertscope: error: cannot write standard output: no space left on the "
                                           "device\n")


def _page_config(path) -> dict:
    import re

    return json.loads(re.search(r'<script id="bertscope-config" type="application/json">(.*?)</script>',
                                path.read_text(), re.S).group(1))


def test_rollout_is_not_offered_twice_on_the_page(tmp_path, capsys):
    """The rollout measure is the same map as the Attention control's rollout mode: the Measure
    switch offered it a second time. Named on its own, the user is told where it is."""
    out = tmp_path / "a.html"
    assert main(["view", IT_ANIMAL, "--measure", "all", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert [m["name"] for m in _page_config(out)["meta"]["measures"]] == ["norm", "norm-residual", "value-zeroing",
                                                                          "alti"]
    out = tmp_path / "r.html"
    assert main(["view", IT_ANIMAL, "--measure", "rollout,norm", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ("bertscope: note: rollout is always on the page: the Attention control's "
                                       "rollout mode (not offered again as a measure)\n")
    assert [m["name"] for m in _page_config(out)["meta"]["measures"]] == ["norm"]
    out = tmp_path / "o.html"
    assert main(["view", IT_ANIMAL, "--measure", "rollout", "--out", str(out)]) == 0
    assert "measures" not in _page_config(out)["meta"]  # no Measure switch: nothing beside the weights


def test_view_leaves_value_zeroing_out_of_all_for_a_long_text_and_names_the_rest(tmp_path, capsys):
    """`view --measure all` could never work on a text over 128 tokens: value zeroing refused the
    whole page, where explain --compare leaves it out."""
    import re

    long_text = " ".join(["word"] * 200)  # 202 tokens with [CLS] and [SEP]
    out = tmp_path / "l.html"
    assert main(["view", long_text, "--measure", "all", "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    assert err == ("bertscope: warning: value-zeroing is limited to 128 tokens (it reruns every layer once per "
                   "token); this text has 202: left out of the page's measures")
    config = json.loads(re.search(r'<script id="bertscope-config" type="application/json">(.*?)</script>',
                                  out.read_text(), re.S).group(1))
    assert [m["name"] for m in config["meta"]["measures"]] == ["norm", "norm-residual", "alti"]
    # named on its own it is refused, with what to ask for instead
    assert main(["view", long_text, "--measure", "alti,value-zeroing", "--out", str(tmp_path / "m.html")]) == 2
    assert capsys.readouterr().err.strip().endswith("this text has 202: leave it out (--measure alti)")
    assert not (tmp_path / "m.html").exists()
    # a text over the model's positions: said once, where the measures' own encoding said it again
    assert main(["view", " ".join(["word"] * 600), "--measure", "all", "--out", str(tmp_path / "n.html")]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        "bertscope: warning: value-zeroing is limited to 128 tokens (it reruns every layer once per token); this "
        "text has 512 (cut from 602): left out of the page's measures",
        "bertscope: warning: the text is longer than 512 tokens and was truncated"]
