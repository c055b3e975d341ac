"""The analysis modules do not import matplotlib unless asked to plot; every command has help with examples."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bertscope.cli.app import main


def test_matplotlib_not_imported_by_analysis_modules():
    code = ("import sys, bertscope, bertscope.understand.trace, bertscope.understand.headstats, bertscope.understand.coref, "
            "bertscope.understand.wsc, bertscope.understand.ablate, bertscope.understand.experiments.claims, "
            "bertscope.understand.experiments.report, bertscope.bench.run, bertscope.fast.embedjob, "
            "bertscope.cli.app; from bertscope.cli.app import build_parser; build_parser(); "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("cmd", ["trace", "heads", "coref", "ablate", "experiments"])
def test_help_has_examples(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"bertscope {cmd}" in out


def _strict_loads(text: str):
    def refuse(const):
        raise ValueError(f"{const} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_outputs_are_strict_json(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\nIt was tired, so it slept.\n")
    for args in (["heads", str(corpus), "--json"],
                 ["trace", "The cat sat", "--token", "cat", "--pad", "2", "--json"],
                 ["ablate", "The cat sat.", "--layer", "0", "--head", "1", "--token", "cat", "--json"],
                 ["ablate", "The cat sat.", "--sweep", "--json"]):
        assert main(args) == 0, args
        _strict_loads(capsys.readouterr().out)


def test_heads_truncation_is_warned_once(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"The cat sat.\n" + b"word " * 600 + b"\n\xff not utf-8\n")
    assert main(["heads", str(corpus), "--json"]) == 0
    cap = capsys.readouterr()
    assert cap.err.count("was truncated") == 1 and "line 2" in cap.err
    warns = json.loads(cap.out)["warnings"]  # the JSON carries both warnings, not the truncation alone
    assert any("line 3 is not UTF-8 text" in w for w in warns) and any("was truncated" in w for w in warns), warns


def test_heads_says_once_which_lines_were_truncated_or_had_no_tokens(tmp_path, capsys):
    """One warning per long line: a corpus of long texts printed one line of warning for each."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat.\n" + ("word " * 600 + "\n") * 3 + "\u200b\n" + "\u200b\u200b\n")
    assert main(["heads", str(corpus), "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bertscope: warning: 3 lines are longer than 512 tokens and were truncated (lines 2, 3, 4)",
                   "bertscope: warning: 2 lines have no tokens (the tokenizer drops every character of them) and "
                   "were skipped (lines 5, 6)"], err


@pytest.mark.parametrize("name, kind", [("c.jsonl", "JSON Lines"), ("c.csv", "CSV"), ("c.JSON", "JSON")])
@pytest.mark.parametrize("engine", [[], ["--engine", "ray", "--workers", "1"]], ids=["local", "ray"])
def test_heads_refuses_a_file_of_records_whose_syntax_it_would_read_as_text(tmp_path, capsys, name, kind, engine):
    """A .jsonl corpus was read line by line: its braces, quotes and field names were analysed as
    the texts ("over 2 texts (22 tokens)" for '{"text":"hi"}' and '{"text":"yo"}')."""
    corpus = tmp_path / name
    corpus.write_text('{"text": "hi"}\n{"text": "yo"}\n')
    assert main(["heads", str(corpus), *engine]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bertscope: error: heads reads a text file, one text per line; {corpus} is {kind} by its name, "
                   "and its syntax would be read as text: write its texts one per line first"
                   + (f" (for JSON Lines: jq -r .text {corpus} > texts.txt)" if kind == "JSON Lines" else "")), err


def test_heads_counts_one_text_in_the_singular(tmp_path, capsys):
    corpus = tmp_path / "in.txt"
    corpus.write_text("The cat sat.\n")
    assert main(["heads", str(corpus), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "heads over 1 text (" in out, out


def test_heads_out_must_be_a_folder(tmp_path, capsys):
    corpus = tmp_path / "in.txt"
    corpus.write_text("The cat sat.\n")
    assert main(["heads", str(corpus), "--out", str(corpus)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and len(err.strip().splitlines()) == 1


def test_ablate_names_each_head_once(capsys):
    args = ["ablate", "The cat sat.", "--layer", "3", "--head", "1", "--layer", "0", "--head", "2",
            "--layer", "3", "--head", "1"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[0] == "Silenced L3 H1, L0 H2"
    assert main(args + ["--json"]) == 0
    assert _strict_loads(capsys.readouterr().out)["heads"] == [[3, 1], [0, 2]]


def test_trace_counts_weights_of_w_o_not_rows(capsys):
    assert main(["trace", "The cat sat", "--token", "cat"]) == 0
    out = capsys.readouterr().out
    assert "rows of W_O" not in out
    assert "12,288 weights of W_O (its 32 input rows x 384)" in out  # all-MiniLM-L6-v2: D = 32, C = 384
    assert main(["trace", "The cat sat", "--token", "cat", "--json"]) == 0
    assert _strict_loads(capsys.readouterr().out)["params"]["one_head_wo"] == 32 * 384


def test_head_stats_raises_the_truncation_warning_the_other_tools_raise(bert):
    """A cut text was only noted in the record's warnings: embed, encode and attend raise a
    TruncationWarning (which a caller can filter, or turn into an error)."""
    import warnings as w

    from bertscope.core.tokenizer import TruncationWarning
    from bertscope.understand.headstats import head_stats

    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always")
        hs = head_stats(bert, ["The cat sat.", "word " * 600, "word " * 700])
    cut = [str(c.message) for c in caught if issubclass(c.category, TruncationWarning)]
    assert cut == ["2 text(s) longer than 512 tokens were truncated (first: line 2)"], cut
    assert caught[0].filename == __file__  # pointed at the caller's line, not bertscope's
    assert any("lines 2, 3" in x for x in hs.warnings)  # the record keeps every line


def test_heads_out_names_the_file_a_folder_is_in_the_way_of(tmp_path, capsys):
    """With DIR/heads.json a folder, the error named DIR ("cannot write 'hdir' (Is a directory)"),
    a writable folder; it names the file now, and DIR keeps nothing of the failed write."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat.\nA dog ran.\n")
    (tmp_path / "hdir" / "heads.json").mkdir(parents=True)
    assert main(["heads", str(corpus), "--out", str(tmp_path / "hdir"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"bertscope: error: --out: cannot write {str(tmp_path / 'hdir' / 'heads.json')!r} (a folder of "
                   "that name is in the way)\n"), err
    assert [p.name for p in (tmp_path / "hdir").iterdir()] == ["heads.json"]


def test_params_columns_stay_apart_for_a_huge_config(tmp_path, capsys):
    """A 65,536-wide config printed "262,14417,180,131,328": the biases and the total ran together."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": 65536, "num_attention_heads": 16, "num_hidden_layers": 200,
        "intermediate_size": 262144, "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522}))
    assert main(["params", "--model", str(tmp_path)]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("per layer"))
    assert row.split() == ["per", "layer", "17,179,869,184", "262,144", "17,180,131,328"], row


def test_heads_json_written_by_out_is_what_json_prints(tmp_path, capsys):
    """heads.json left out the reader's warnings (a line that is not UTF-8) that --json printed."""
    import json

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"The cat sat.\n\xff\xfe broken\nA dog ran.\n")
    assert main(["heads", str(corpus), "--json", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert main(["heads", str(corpus), "--out", str(tmp_path / "h"), "--quiet"]) == 0
    capsys.readouterr()
    written = json.loads((tmp_path / "h" / "heads.json").read_text())
    assert any("line 2" in w and "UTF-8" in w for w in written["warnings"]), written["warnings"]
    assert written == printed
