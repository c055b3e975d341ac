"""Every bad input the adversarial pass found, at every entry point: the library raises one
plain InputError (or CheckpointError) sentence; the CLI prints one line, exits non-zero, shows
no traceback and leaves nothing half-written."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import bertscope
from bertscope.bench.corpus import save_random_checkpoint
from bertscope.bert import Bert
from bertscope.cli.app import main
from bertscope.core.checkpoint import check_fits_in_memory
from bertscope.errors import CheckpointError, InputError, InputTypeError
from bertscope.understand.ablate import ablate, sweep
from bertscope.understand.trace import trace
from bertscope.understand.wsc import parse_wsc

from conftest import IT_ANIMAL, ROOT

TINY = bertscope.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def one_line_error(code: int, err: str, fragment: str = "") -> str:
    """The CLI's contract for bad input: non-zero, one line on stderr, no traceback."""
    assert code != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("bertscope: error:"), lines[0]
    assert fragment in lines[0], lines[0]
    return lines[0]


def cli_error(capsys, args: list[str], fragment: str = "") -> str:
    code = main(args)
    captured = capsys.readouterr()
    return one_line_error(code, captured.err, fragment)


def tiny_folder(tmp_path: Path, bundled_path: Path, name: str = "tiny", **changes) -> Path:
    return save_random_checkpoint(TINY.replace(**changes), tmp_path / name, bundled_path)


# ---------------------------------------------------------------- token types, T = 0, shapes

@pytest.mark.parametrize("make_types, fragment", [
    (lambda ids: torch.full_like(ids, 2), "token_type_ids must lie in 0..1"),
    (lambda ids: torch.full_like(ids, -1), "token_type_ids must lie in 0..1"),
    (lambda ids: torch.zeros(ids.shape[0], ids.shape[1] + 1, dtype=torch.long), "shape of input_ids"),
    (lambda ids: torch.zeros(ids.shape[1], dtype=torch.long), "shape of input_ids"),
    (lambda ids: torch.zeros(ids.shape, dtype=torch.float32), "integer segment ids"),
])
@pytest.mark.parametrize("path", ["packed", "reference"])
def test_token_type_ids_checked_on_both_paths(bert, make_types, fragment, path):
    batch = bert.encode(["a short text", "another"])
    types = make_types(batch.input_ids)
    run = bert if path == "packed" else bert.model
    with pytest.raises(InputError, match=fragment) as e:
        run(batch.input_ids, batch.attention_mask, types)
    assert "\n" not in str(e.value)


def test_pairs_on_a_model_with_one_segment_type(tmp_path, bundled_path):
    """bert.encode(texts, pairs) makes segment B (type 1); a model with type_vocab_size 1 has
    none: one clear sentence, not an IndexError. Its plain inputs still work, CLI included."""
    folder = tiny_folder(tmp_path, bundled_path, type_vocab_size=1)
    b = bertscope.load(folder)
    batch = b.encode(["a question"], pairs=["an answer"])
    assert int(batch.token_type_ids.max()) == 1
    with pytest.raises(InputError, match="the model has 1 segment types"):
        b(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    with pytest.raises(InputError, match="the model has 1 segment types"):
        b.model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    single = b.encode(["a question"])
    b(single.input_ids, single.attention_mask, single.token_type_ids)  # segment A only: fine
    r = subprocess.run([sys.executable, "-m", "bertscope", "attend", "the cat sat", "--token", "cat",
                        "--model", str(folder), "--json"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["token"] == "cat"


@pytest.mark.parametrize("shape", [(1, 0), (0, 0), (3, 0)])
def test_no_tokens_is_refused_on_both_paths(bert, shape):
    ids = torch.zeros(shape, dtype=torch.long)
    for run in (bert, bert.model):
        with pytest.raises(InputError, match="T = 0"):
            run(ids)


def test_empty_batch_with_tokens_is_fine(bert):
    out = bert(torch.zeros(0, 4, dtype=torch.long))
    assert out.last_hidden_state.shape == (0, 4, bert.config.hidden_size)


@pytest.mark.parametrize("args, fragment", [
    ((12, -3), "num_heads must be a positive whole number"),
    ((12, 0), "num_heads must be a positive whole number"),
    ((0, 1), "hidden_size must be a positive whole number"),
    ((12, 5), "not divisible"),
    ((12.0, 3), "hidden_size must be a positive whole number"),
    ((12, True), "num_heads must be a positive whole number"),
    ((12, 3, 1.0), "dropout must be a probability"),
    ((12, 3, -0.1), "dropout must be a probability"),
])
def test_attention_module_checks_its_sizes(args, fragment):
    with pytest.raises(ValueError, match=fragment) as e:
        bertscope.MultiHeadSelfAttention(*args)
    assert "\n" not in str(e.value)


def test_saving_over_a_folder_names_the_folder_not_a_temporary(bert, tmp_path):
    """IsADirectoryError named the hidden temporary file: '.d.html.zng0yusu.tmp' -> 'd.html'."""
    (tmp_path / "d.html").mkdir()
    with pytest.raises(InputError, match=re.escape(f"cannot write {tmp_path / 'd.html'}: it is a folder")):
        bertscope.build_report(bert, "a cat sat").save(tmp_path / "d.html")
    assert [p.name for p in tmp_path.iterdir()] == ["d.html"] and not any((tmp_path / "d.html").iterdir())


# ---------------------------------------------------------------- embed: modes, empty text

def test_embed_in_training_mode_runs_eval_and_restores_the_mode(bert):
    want = bert.embed([IT_ANIMAL, "a b c"])
    bert.model.train()
    try:
        got = bert.embed([IT_ANIMAL, "a b c"])
        again = bert.embed([IT_ANIMAL, "a b c"])
        assert bert.model.training  # restored
        assert all(m.training for m in bert.model.modules())
    finally:
        bert.model.eval()
    assert np.abs(got - want).max() < 1e-6 and np.abs(again - want).max() < 1e-6  # no dropout


# texts the tokenizer leaves nothing of but [CLS] [SEP]: each was embedded as that pair, so they
# all got one and the same vector (cosine 1.0 to each other), which polluted nearest neighbours
TOKENLESS = ["\u200b", "\u200b\u200b \u200b", "\u0301", "\x07\x01"]


def test_embed_empty_text_is_a_zero_vector_in_the_library_and_the_cli(bert, tmp_path, capsys):
    texts = ["", "   ", *TOKENLESS, IT_ANIMAL]
    assert all(bert.encode([t]).lengths[0] == 2 for t in TOKENLESS)  # what the tokenizer makes of them
    lib = bert.embed(texts)
    assert not lib[:-1].any()
    assert abs(float(np.linalg.norm(lib[-1])) - 1.0) < 1e-5
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["embed", str(inp), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    capsys.readouterr()
    from bertscope.fast.embedjob import read_embeddings

    emb, status = read_embeddings(tmp_path / "out")
    assert status == ["empty"] * (len(texts) - 1) + ["ok"]
    assert np.array_equal(emb[:-1], lib[:-1])
    assert np.abs(emb[-1] - lib[-1]).max() < 1e-5


# ---------------------------------------------------------------- ablate: one path for both runs

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ablating_a_dead_head_changes_nothing(bert, dtype):
    """A head whose W_O input columns are zero contributes nothing, so silencing it must give
    cosine 1. In bf16 a baseline from another path (packed) than the ablation (padded) would
    differ by far more than the tolerance."""
    layer, head = 2, 5
    model = copy.deepcopy(bert.model).to(dtype)
    D = bert.config.head_size
    with torch.no_grad():
        model.layers[layer].attention.output.weight[:, head * D:(head + 1) * D] = 0
    dead = Bert(config=bert.config, model=model, tokenizer=bert.tokenizer, max_seq_length=bert.max_seq_length)
    res = ablate(dead, IT_ANIMAL, [(layer, head)], word="it")
    assert float(res.token_cosine.min()) > 1 - 1e-6
    assert res.embedding_cosine > 1 - 1e-6
    assert float(res.word_shift.abs().max()) < 1e-6
    if dtype == torch.float32:
        effects = sweep(dead, "The cat sat on the mat.")
        assert float(effects.token_effect[layer, head]) < 1e-6
        assert float(effects.token_effect.max()) > 1e-4  # other heads do matter


# ---------------------------------------------------------------- texts that are not text

@pytest.mark.parametrize("texts, error, fragment", [
    (None, InputTypeError, "texts must be a list of strings"),
    ("one string", InputTypeError, "not one str"),
    ([None], InputTypeError, "texts[0] is NoneType"),
    (["fine", 3], InputTypeError, "texts[1] is int"),
    ([b"bytes"], InputTypeError, "texts[0] is bytes"),
    (["\ud800"], InputError, "not valid Unicode"),
    (["caf\udce9"], InputError, "lone surrogate U+DCE9"),
])
def test_embed_refuses_what_is_not_text(bert, texts, error, fragment):
    with pytest.raises(error) as e:
        bert.embed(texts)
    assert fragment in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, InputError)


@pytest.mark.parametrize("call", [
    lambda b: b.encode([None]),
    lambda b: b.encode(["a"], pairs=["\ud800"]),
    lambda b: b.tokenizer.encode_ids([1.5]),
    lambda b: bertscope.attend(b, None, "it"),
    lambda b: bertscope.attend(b, "it is", None),
    lambda b: bertscope.attend(b, "it \ud800", "it"),
    lambda b: bertscope.build_report(b, 42),
    lambda b: bertscope.build_report(b, "fine", "\udcff"),
    lambda b: trace(b, None, "it"),
    lambda b: ablate(b, "the cat", [(0, 0)], word=7),
    lambda b: sweep(b, None),
], ids=["encode", "encode-pairs", "encode_ids", "attend-text", "attend-word", "attend-surrogate",
        "report", "report-b", "trace", "ablate-word", "sweep"])
def test_every_library_entry_point_checks_its_text(bert, call):
    with pytest.raises(InputError) as e:
        call(bert)
    assert "\n" not in str(e.value)


def test_heads_statistics_check_their_texts(bert):
    from bertscope.understand.headstats import head_stats

    with pytest.raises(InputTypeError, match="line 2 is NoneType"):
        head_stats(bert, ["fine", None])


@pytest.mark.parametrize("args, fragment", [
    # named as typed: the flag, or the positional's name in the usage line
    (["attend", "caf\udce9 au lait", "--token", "it"], "TEXT holds byte 0xe9, which is not UTF-8"),
    (["attend", IT_ANIMAL, "--token", "\ud800"], "--token holds a lone surrogate U+D800"),
    (["embed", "\udcff.txt", "--out", "x"], "INPUT holds byte 0xff"),
    (["heads", "corpus.txt", "--out", "d\udcc3"], "--out holds byte 0xc3"),
    (["trace", "ok", "--token", "ok", "--model", "m\udc80"], "--model holds byte 0x80"),
    (["explain", "ok", "--method", "grad-input", "--similar-to", "b\udcff"], "--similar-to holds byte 0xff"),
    (["view", "ok", "caf\udce9"], "TEXT_B holds byte 0xe9"),
])
def test_cli_refuses_arguments_that_are_not_utf8(capsys, tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    cli_error(capsys, args, fragment)
    assert not list(tmp_path.iterdir())  # nothing written


def test_cli_refuses_non_utf8_bytes_in_argv_for_real():
    """The bytes as a terminal sends them: Python turns them into surrogates (surrogateescape)."""
    r = subprocess.run([sys.executable.encode(), b"-m", b"bertscope", b"attend", b"caf\xe9", b"--token", b"it"],
                       capture_output=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    one_line_error(r.returncode, r.stderr.decode("utf-8", "replace"), "byte 0xe9, which is not UTF-8")


# ---------------------------------------------------------------- NaN and infinite weights

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_weights_are_refused_at_load(tmp_path, bundled_path, capsys, value):
    folder = tiny_folder(tmp_path, bundled_path)
    state = load_file(str(folder / "model.safetensors"))
    key = "encoder.layer.1.attention.self.key.weight"
    state[key][3, 4] = value
    state[key][0, 1] = value
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"'{key}' holds 2 NaN or infinite value"):
        bertscope.load(folder)
    cli_error(capsys, ["attend", "the cat sat", "--token", "cat", "--model", str(folder)], key)
    cli_error(capsys, ["attend", "the cat sat", "--token", "cat", "--model", str(folder), "--json"], key)
    out = tmp_path / "emb"
    inp = tmp_path / "in.txt"
    inp.write_text("the cat sat\n")
    cli_error(capsys, ["embed", str(inp), "--out", str(out), "--quiet", "--model", str(folder)], key)
    assert not out.exists() or not [p for p in out.iterdir() if p.name != "_job.json"]
    cli_error(capsys, ["bench", "--model", str(folder), "--quick", "--json"], key)


def test_a_weight_that_overflows_float16_is_refused(tmp_path, bundled_path):
    folder = tiny_folder(tmp_path, bundled_path)
    state = load_file(str(folder / "model.safetensors"))
    state["pooler.dense.bias"][0] = 1e6  # finite in fp32, infinite in fp16
    save_file(state, str(folder / "model.safetensors"))
    bertscope.load(folder)  # fine in float32
    with pytest.raises(CheckpointError, match="'pooler.dense.bias' does not fit in torch.float16"):
        bertscope.load(folder, dtype=torch.float16)


@pytest.mark.parametrize("weight, said", [
    # a NaN the output shows: embed's own check of what it returns
    ("feed_forward.dense_in.bias", "the model computed NaN or infinite values for 2 text"),
    # a query, key or value weight: refused before computing (torch's attention could hide it)
    ("attention.value.bias", "the model's weight layers.0.attention.value.bias holds 1 NaN or infinite value(s)"),
])
def test_embed_never_returns_non_finite_rows(bert, weight, said):
    broken = copy.deepcopy(bert.model)
    with torch.no_grad():
        broken.layers[0].get_parameter(weight)[0] = math.nan  # after loading: a library user's edit
    b = Bert(config=bert.config, model=broken, tokenizer=bert.tokenizer, max_seq_length=bert.max_seq_length)
    with pytest.raises(bertscope.errors.NonFiniteError, match=re.escape(said)):
        b.embed(["one", "two"])


def test_bench_json_is_strict_even_with_a_nan_measurement(monkeypatch, capsys):
    import bertscope.bench as bench

    def fake_run_bench(**kw):
        return {"machine": {}, "workloads": {"mixed": {"skipped": {}, "systems": {
            "bertscope": {"texts_per_s": 10.0, "max_abs_diff_vs_bertscope": math.nan},
            "onnxruntime": {"texts_per_s": math.inf}}}}, "scaling": {"ratio": [1.0, -math.inf]}}

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    assert main(["bench", "--quick", "--json"]) == 0
    captured = capsys.readouterr()

    def refuse(name):
        raise AssertionError(f"not JSON: {name}")

    data = json.loads(captured.out, parse_constant=refuse)
    systems = data["workloads"]["mixed"]["systems"]
    assert systems["bertscope"]["max_abs_diff_vs_bertscope"] is None
    assert systems["onnxruntime"]["texts_per_s"] is None and systems["bertscope"]["texts_per_s"] == 10.0
    assert data["scaling"]["ratio"] == [1.0, None]
    assert data["non_finite"] == ["workloads.mixed.systems.bertscope.max_abs_diff_vs_bertscope",
                                  "workloads.mixed.systems.onnxruntime.texts_per_s", "scaling.ratio[1]"]
    assert "3 measurement(s) were NaN or infinite" in captured.err


# ---------------------------------------------------------------- absurd sizes, seeds

def test_absurd_config_is_refused_before_allocating(tmp_path, bundled_path, capsys, monkeypatch):
    folder = tiny_folder(tmp_path, bundled_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(hidden_size=12_000_000, num_attention_heads=12)
    (folder / "config.json").write_text(json.dumps(cfg))

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was built: the size check came too late")

    # refused, not attempted: no model is ever built and no weights read (a tripwire, not a clock)
    monkeypatch.setattr(bertscope.BertModel, "__init__", tripwire)
    monkeypatch.setattr("safetensors.torch.load_file", tripwire)
    with pytest.raises(CheckpointError) as e:
        bertscope.load(folder)
    msg = str(e.value)
    n = bertscope.BertConfig.from_json(folder / "config.json").num_parameters
    assert f"{n:,} parameters" in msg and "memory available" in msg
    assert re.search(r"\(\d+\.\d [KMGTP]iB in float32\)", msg), msg
    cli_error(capsys, ["attend", "the cat", "--token", "cat", "--model", str(folder)], "parameters")


def test_memory_check_compares_the_float32_size_with_what_is_available():
    base = bertscope.BertConfig.preset("bert-base")
    need = 4 * base.num_parameters
    check_fits_in_memory(base, available=need)  # exactly fits
    with pytest.raises(CheckpointError, match="109,482,240 parameters"):
        check_fits_in_memory(base, available=need - 1)


@pytest.mark.parametrize("preset", ["minilm-l6", "tiny"])
def test_parameter_formula_counts_the_built_model(preset):
    cfg = TINY.replace(type_vocab_size=3, vocab_size=999) if preset == "tiny" else bertscope.BertConfig.preset(preset)
    assert cfg.num_parameters == bertscope.count_params(bertscope.BertModel(cfg)).model_total


@pytest.mark.parametrize("seed", [str(2 ** 70), str(2 ** 64), "-1"])
def test_trace_seed_out_of_torch_range(capsys, seed):
    cli_error(capsys, ["trace", "The cat sat", "--token", "cat", "--seed", seed], "--seed must be a whole number")


def test_trace_seed_at_the_edges_of_the_range(bert):
    for seed in (0, 2 ** 64 - 1):
        assert trace(bert, "The cat sat", "cat", seed=seed).dropped.shape[0] > 0
    # from Python, the argument by its name, the flag after it (it said "--seed must be ...")
    with pytest.raises(InputError, match=re.escape("seed (--seed) must be a whole number from 0 to 2**64 - 1")):
        trace(bert, "The cat sat", "cat", seed=-1)
    with pytest.raises(InputError, match=re.escape("pad (--pad), how many [PAD] tokens to add, must be")):
        trace(bert, "The cat sat", "cat", pad=-1)


# ---------------------------------------------------------------- WSC files: bounded parse

VALID_SCHEMA = ("<schema><text><txt1>The trophy doesn't fit into the suitcase because</txt1>"
                "<pron>it</pron><txt2>is too large.</txt2></text><answers><answer>The trophy</answer>"
                "<answer>the suitcase</answer></answers><correctAnswer>A</correctAnswer></schema>")


@pytest.mark.parametrize("junk", ["<schema>", "<schema ", "<schema>\n"], ids=["tags", "unclosed-tags", "lines"])
def test_wsc_parse_is_linear_in_unclosed_tags(junk):
    """50,000 unclosed tags took 125 s with a lazy regex (quadratic). The check is of growth, not
    of speed: 8 times the tags must cost well under 64 times the time (a quadratic parse) on
    whatever CPU runs it; a linear one costs about 8 (best of 3 each, in the same process, in CPU
    time rather than wall-clock time)."""
    def cost(n: int) -> float:
        data = (junk * n + VALID_SCHEMA).encode()
        best = float("inf")
        for _ in range(3):
            started = time.process_time()  # this process's CPU time: other processes' load does not count
            parse_wsc(data)
            best = min(best, time.process_time() - started)
        return best

    growth = cost(200_000) / cost(25_000)
    assert growth < 24, growth  # between linear (8) and quadratic (64)
    data = (junk * 200_000 + VALID_SCHEMA).encode()
    schemas, warnings = parse_wsc(data)
    assert len(schemas) == 1 and schemas[0].pronoun == "it"
    if junk != "<schema ":
        assert warnings == ["the file: 200000 <schema> element(s) are not closed and were skipped "
                            "(the first: schema 1, line 1)"]
        assert schemas[0].number == 200_001  # its position in the file, the unclosed ones counted


def test_wsc_line_numbers_still_right():
    data = ("<root>\n" + VALID_SCHEMA + "\n\n" + VALID_SCHEMA.replace("<pron>it</pron>", "<pron></pron>")
            + "\n</root>").encode()
    schemas, warnings = parse_wsc(data)
    assert schemas[0].line == 2 and warnings == ["schema 2 (line 4): its <pron> is missing or empty; skipped"]


def test_coref_cli_on_unclosed_tags(tmp_path, capsys):
    f = tmp_path / "hostile.xml"
    f.write_text("<schema>" * 50_000)
    cli_error(capsys, ["coref", str(f)], "has no <schema>...</schema> elements")


# ---------------------------------------------------------------- the library, as a new user calls it

class _Table:
    """Stands in for a pandas DataFrame: iterating it gives its column names."""

    columns = ["text"]

    def __iter__(self):
        return iter(self.columns)


@pytest.mark.parametrize("texts, fragment", [
    (_Table(), "not a _Table (its column names would be read as the texts); pass one column"),
    ({"id1": "a text", "id2": "another"}, "not a dict (its keys would be read as the texts)"),
    ({"b", "a"}, "not a set: its order is arbitrary"),
    (frozenset({"a"}), "not a frozenset"),
])
def test_containers_whose_items_are_not_the_texts_are_refused(bert, texts, fragment):
    """Before, a table's column names, a dict's keys, a set in arbitrary order were embedded."""
    for call in (bert.embed, bert.encode):
        with pytest.raises(InputTypeError, match=re.escape(fragment)):
            call(texts)


def test_sequences_of_strings_of_any_kind_still_embed(bert):
    """What iterates to the texts themselves is fine: a tuple, a numpy array of str, a generator."""
    ref = bert.embed(["a short text", "another one"])
    assert np.array_equal(bert.embed(("a short text", "another one")), ref)
    assert np.array_equal(bert.embed(np.array(["a short text", "another one"])), ref)
    assert np.array_equal(bert.embed(t for t in ["a short text", "another one"]), ref)


@pytest.mark.parametrize("max_length", [0, 1, 513, 10_000, 2.5, "8", True])
def test_encode_max_length_out_of_range_is_refused(bert, max_length):
    """Before, 0 meant "the default" and 1 or 10,000 were silently ignored by the tokenizer."""
    with pytest.raises(InputError, match=r"max_length must be a whole number from 2 .* to 512"):
        bert.encode(["a b c"], max_length=max_length)


def test_encode_max_length_cuts_and_pools_as_embed_does(bert):
    """encode cuts at the model's positions (512), embed at max_seq_length (256 here), as their
    docs say; encoding with max_length=bert.max_seq_length pools to embed's vector."""
    long = "word " * 400
    assert bert.encode([long]).input_ids.shape[1] == 402
    with pytest.warns(bertscope.TruncationWarning, match="longer than 256 tokens"):
        batch = bert.encode([long], max_length=np.int64(bert.max_seq_length))
    assert batch.input_ids.shape[1] == bert.max_seq_length == 256 and batch.truncated == [True]
    with pytest.warns(bertscope.TruncationWarning):
        ref = bert.embed([long])
    with torch.inference_mode():
        pooled = bert.pool(batch.input_ids, batch.attention_mask).numpy()
    np.testing.assert_allclose(pooled, ref, atol=1e-5)
    assert torch.equal(bert.pool(batch.input_ids), bert.pool(batch.input_ids, batch.attention_mask))


@pytest.mark.parametrize("ids, error, fragment", [
    ([[101, 999_999, 102]], InputError, "ids[0] holds ids 101..999999; they must lie in 0..30521"),
    ([[101, 2000, 102], [101, -5, 102]], InputError, "ids[1] holds ids -5..102"),
    ([[101] + [1000] * 600 + [102]], InputError, "ids[0] has 602 tokens; the model takes 1 to 512"),
    ([[]], InputError, "ids[0] has 0 tokens"),
    (["a b"], InputTypeError, "ids[0] must be a list of token ids, got str"),
    ([[101, 2.5, 102]], InputTypeError, "ids[0] must hold whole-number token ids, found 2.5"),
    ("101 102", InputTypeError, "ids must be a list of token-id lists, got str"),
])
def test_embed_ids_checks_the_ids_before_torch_sees_them(bert, ids, error, fragment):
    """Before, these were IndexErrors from inside torch's embedding lookup."""
    with pytest.raises(error, match=re.escape(fragment)) as e:
        bert.embed_ids(ids)
    assert "\n" not in str(e.value)


def test_embed_ids_takes_ids_as_lists_tensors_or_arrays(bert):
    """Rows as lists, 1-D tensors or arrays, or the whole batch as a 2-D tensor or array: the
    same embeddings (the check once refused tensor rows, "found tensor(101)")."""
    ids = [[101, 2000, 2001, 102], [101, 2003, 2004, 102]]
    ref = bert.embed_ids(ids)
    ragged = np.empty(2, dtype=object)  # rows of unequal length, as pandas holds them
    ragged[:] = [ids[0], ids[1][:3]]
    for form in ([np.array(t) for t in ids], [torch.tensor(t) for t in ids], np.array(ids), torch.tensor(ids),
                 [np.array(t, dtype=np.int32) for t in ids], np.array(ids, dtype=object)):
        assert np.array_equal(bert.embed_ids(form), ref)
    assert np.array_equal(bert.embed_ids(ragged), bert.embed_ids([ids[0], ids[1][:3]]))
    with pytest.raises(InputTypeError, match=r"ids\[0\] must hold whole-number token ids, not torch\.float32"):
        bert.embed_ids(torch.tensor(ids, dtype=torch.float32))
    with pytest.raises(InputTypeError, match=r"ids must be a list of token-id lists, got Tensor of shape \(4,\)"):
        bert.embed_ids(torch.tensor(ids[0]))


@pytest.mark.parametrize("kwargs, fragment", [
    ({"batch_size": 0}, "batch_size must be a whole number >= 1, got 0"),
    ({"batch_size": "8"}, "batch_size must be a whole number >= 1, got '8'"),
    ({"batch_size": 2.5}, "got 2.5"),
    ({"batch_tokens": 0}, "batch_tokens must be a whole number >= 1, got 0"),
])
def test_embed_counts_are_checked_as_input_errors(bert, kwargs, fragment):
    """Before: a builtins ValueError naming an internal parameter, a TypeError, or 2.5 accepted."""
    for call in (lambda: bert.embed(["a", "b", "c"], **kwargs), lambda: bert.embed_ids([[101, 102]], **kwargs)):
        with pytest.raises(InputError, match=re.escape(fragment)):
            call()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"device": "gpu"}, "device must be 'cpu' or 'cuda' (or 'cuda:N'), not 'gpu'"),
    ({"device": 3.5}, "device must be 'cpu' or 'cuda'"),
    ({"device": "meta"}, "device must be 'cpu' or 'cuda'"),
    ({"dtype": "float16"}, "dtype must be None, torch.float32, torch.bfloat16 or torch.float16, not 'float16'"),
    ({"dtype": torch.int8}, "dtype must be None"),
])
def test_load_checks_device_and_dtype(kwargs, fragment):
    with pytest.raises(InputError, match=re.escape(fragment)):
        bertscope.load(**kwargs)


def test_load_on_a_cuda_device_that_is_not_there_says_so():
    if torch.cuda.is_available():  # a GPU machine: a device index past its devices
        with pytest.raises(InputError, match=r"device 'cuda:99': there are \d+ CUDA device\(s\)"):
            bertscope.load(device="cuda:99")
    else:
        with pytest.raises(InputError, match=r"device 'cuda': this torch has no CUDA device .*use device='cpu'"):
            bertscope.load(device="cuda")


def test_a_hub_name_is_told_that_only_local_folders_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="loads local folders only; it downloads nothing"):
        bertscope.load("sentence-transformers/all-MiniLM-L6-v2")
    with pytest.raises(CheckpointError, match=r"does not exist$"):
        bertscope.load(tmp_path / "no-such-model")


@pytest.mark.parametrize("call", [
    lambda b: b([[101, 2000, 102]]),
    lambda b: b(np.array([[101, 2000, 102]])),
    lambda b: b.model(np.array([[101, 2000, 102]])),
    lambda b: b(torch.tensor([[101, 2000, 102]]), [[1, 1, 1]]),
    lambda b: b.pool(np.array([[101, 2000, 102]])),
])
def test_tensor_entry_points_name_a_wrong_argument_type(bert, call):
    """Before: AttributeError: 'list' object has no attribute 'to'."""
    with pytest.raises(InputTypeError, match=r"(input_ids|attention_mask) must be a torch tensor \(B, T\), got "):
        call(bert)


def test_read_embeddings_names_what_is_wrong_with_the_folder(tmp_path):
    from bertscope.fast.embedjob import read_embeddings

    with pytest.raises(InputError, match="does not exist$"):
        read_embeddings(tmp_path / "nothing")
    (tmp_path / "a.txt").write_text("hi\n")
    with pytest.raises(InputError, match="is a file, not an embed job's folder"):
        read_embeddings(tmp_path / "a.txt")
    folder = tmp_path / "job"
    folder.mkdir()
    with pytest.raises(InputError, match="is not an embed job's folder"):
        read_embeddings(folder)
    (folder / "_job.json").write_text("{}")
    with pytest.raises(InputError, match="the job is not finished"):
        read_embeddings(folder)
    (folder / "_manifest.json").write_text("{not json")
    with pytest.raises(InputError, match=r"cannot read .*_manifest\.json \("):
        read_embeddings(folder)
    (folder / "_manifest.json").write_text("{}")
    with pytest.raises(InputError, match=r"_manifest\.json is damaged \(KeyError"):
        read_embeddings(folder)


def test_run_embed_job_names_wrong_arguments(tmp_path, bert):
    from bertscope.fast.embedjob import run_embed_job

    (tmp_path / "in.txt").write_text("hi\n")
    with pytest.raises(InputTypeError, match="bert must be a model from bertscope.load"):
        run_embed_job(None, tmp_path / "in.txt", tmp_path / "out")
    with pytest.raises(InputTypeError, match=r"not a list; to embed texts held in memory use bert\.embed"):
        run_embed_job(bert, ["a text"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_error_types_the_api_raises_are_exported():
    assert issubclass(bertscope.InputTypeError, bertscope.InputError)
    assert issubclass(bertscope.NonFiniteError, bertscope.BertscopeError)


@pytest.mark.parametrize("dtype, name", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_a_model_loaded_in_a_reduced_dtype_says_so(bert, dtype, name):
    """Before, load(dtype=torch.float16) reported precision "fp32" (and no note) for a model that
    computes in fp16. Its embeddings stay near fp32's."""
    b = bertscope.load(dtype=dtype)
    assert b.precision == name and str(dtype) in b.precision_note
    texts = ["The animal didn't cross the street", "a short one"]
    assert (b.embed(texts) * bert.embed(texts)).sum(1).min() > 0.99


def test_attend_result_names_an_index_out_of_range(bert):
    """Before: a raw IndexError from the tensor."""
    res = bertscope.attend(bert, "The cat sat on the mat", "cat")
    with pytest.raises(InputError, match=r"target \(an index into words\) must be a whole number from 0 to \d+ \(or -\d+ to -1, counted "
                       r"from the end\), got 99"):
        res.heads_for(99)
    with pytest.raises(InputError, match=r"layer must be a whole number from 0 to 5 \(or -6 to -1, counted from the end\), got 50"):
        res.top_words(50, 0)
    with pytest.raises(InputError, match=r"head must be a whole number from 0 to 11 \(or -12 to -1, counted from the end\), got 12"):
        res.top_words(0, 12)
    assert len(res.top_words(5, 11, k=2)) == 2 and res.heads_for(-1, k=1)
    assert res.heads_for(torch.tensor(2)) == res.heads_for(2)  # a 0-d tensor, as argmax gives one
    assert res.top_words(np.int64(3), torch.tensor(1)) == res.top_words(3, 1)
    # k < 1: a raw RuntimeError from topk, and heads_for(k=-1) returned all heads but one
    for call in (lambda: res.top_words(3, 1, k=-1), lambda: res.heads_for(2, k=-1), lambda: res.heads_for(2, k=1.5)):
        with pytest.raises(InputError, match="k must be a whole number >= 1"):
            call()
    for bad in ("1", 0, -1):  # 0 said "the word 'cat' occurs 1 time(s); occurrence 0 does not exist"
        with pytest.raises(InputError, match=r"occurrence \(--occurrence\) must be a whole number >= 1 \(the first is 1\)"):
            bertscope.attend(bert, "The cat sat on the mat", "cat", occurrence=bad)
    assert bertscope.attend(bert, "the cat and the dog", "the", occurrence=np.int64(2)).index == 4
    res = bertscope.attend(bert, "the cat and the dog", "dog")
    the = [i for i, w in enumerate(res.words) if w == "the"]
    assert len(the) == 2 and res.heads_for("the") == res.heads_for(the[0])
    assert res.heads_for("the", occurrence=2) == res.heads_for(the[1]) != res.heads_for(the[0])
    with pytest.raises(InputError, match="occurrence goes with a word"):
        res.heads_for(2, occurrence=2)
    with pytest.raises(InputError, match=r"got tensor\(\[2\]\)"):  # torch would index with it: not a whole number
        res.heads_for(torch.tensor([2]))


@pytest.mark.parametrize("command", ["attend", "trace", "ablate", "explain"])
def test_a_word_in_the_part_cut_off_is_said_to_be_cut_off(command, capsys):
    """trace and ablate said "not in the text", listing some 500 words in one line; and the
    error came after a truncation warning, two lines where the error says it all."""
    from bertscope.cli.app import main

    text = "the cat sat on the mat . " * 90 + "zebra"  # over 512 tokens, zebra last
    extra = {"ablate": ["--layer", "0", "--head", "0"], "explain": ["--method", "norm"]}.get(command, [])
    assert main([command, text, "--token", "zebra", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # the error alone
    last = err[-1]
    assert last.startswith("bertscope: error: the word 'zebra' was cut off") and len(last) < 300, last
    assert main([command, text, "--token", "cat", *extra]) == 0  # found: the warning is still given
    assert "bertscope: warning: the text is longer than 512 tokens and was truncated" in capsys.readouterr().err
    if command == "explain":
        return
    # an occurrence past the part kept is cut off too; a piece of a word ("at" in "cat") is not a word
    if command != "ablate":  # (ablate takes a word's first occurrence)
        assert main([command, text, "--token", "mat", "--occurrence", "90", *extra]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "occurrence 90 of 'mat' was cut off" in last, last
        # one the whole text never had was not cut off: it does not exist
        assert main([command, text, "--token", "mat", "--occurrence", "91", *extra]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "'mat' occurs 90 times in the text; occurrence 91 does not exist (and " in last, last
    assert main([command, text, "--token", "at", *extra]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "'at' is not in the text" in last and "cut off" not in last, last


@pytest.mark.parametrize("args", [["view", "\u200b", "--out", "{tmp}/v.html"], ["plot", "\u200b", "--out", "{tmp}/p.png"],
                                  ["ablate", "\u200b", "--sweep"], ["ablate", "\u200b", "--layer", "0", "--head", "0"],
                                  ["attend", "\u200b", "--token", "x"], ["view", "ok", "--pair", "\u200b\u200b",
                                                                         "--out", "{tmp}/w.html"]])
def test_a_text_of_characters_the_tokenizer_drops_has_no_tokens_everywhere(args, tmp_path, capsys):
    """view, plot and ablate ran on [CLS] [SEP] alone, while attend and trace refused it."""
    from bertscope.cli.app import main

    assert main([a.replace("{tmp}", str(tmp_path)) for a in args] + ["--quiet"] * (args[0] == "ablate")) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "has no tokens" in last, last
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- the Python API's mistakes
# A notebook user's natural mistakes, found by a new-user review: each used to surface as a
# TypeError, AttributeError or IndexError from deep inside torch or pathlib, or (the head list)
# was silently rounded. Each is now one bertscope error sentence.

def _tiny_classifier(bert) -> Bert:
    from bertscope.core.classifier import BertForSequenceClassification

    return Bert(config=TINY, model=BertForSequenceClassification(TINY, 2).eval(), tokenizer=bert.tokenizer)


def _ids(bert):
    """(input_ids, attention_mask) of one short text."""
    b = bert.encode(["a cat sat"])
    return b.input_ids, b.attention_mask


@pytest.mark.parametrize("call,kind,fragment", [
    (lambda b: ablate(b, IT_ANIMAL, (3, 1)), InputError, r"list of \(layer, head\) pairs, e\.g\. \[\(3, 1\)\]"),
    (lambda b: ablate(b, IT_ANIMAL, [(3.7, 1.2)]), InputError, "pairs of whole numbers"),
    (lambda b: ablate(b, IT_ANIMAL, [("3", "1")]), InputError, "pairs of whole numbers"),
    (lambda b: __import__("bertscope.understand.headstats", fromlist=["x"]).head_stats(b, "The cat sat."),
     InputTypeError, "texts must be a list of strings, not one str"),
    (lambda b: bertscope.mean_heads(5), InputTypeError, "attentions must be a tensor"),
    (lambda b: bertscope.attention_rollout(torch.rand(6, 2, 12, 5, 5)), InputError, "hold 2 texts"),
    (lambda b: bertscope.attention_rollout(torch.rand(12, 5, 5)), InputError, r"must be \(N, H, T, T\)"),
    (lambda b: bertscope.word_attention(torch.rand(15, 15), [0, 1, 2]), InputError, "3 entries .* for 15 tokens"),
    (lambda b: bertscope.word_attention([[1.0]], [0]), InputError, "probs must be a tensor"),
    # a tokenizer's word_ids (None at [CLS]/[SEP]) raised TypeError; gaps gave NaN rows; -1 took the last word
    (lambda b: bertscope.word_attention(torch.rand(4, 4), b.encode(["hello world"]).word_ids[0]), InputError,
     re.escape("token_words[0] is None: word indices are whole numbers >= 0 (a tokenizer's word_ids?")),
    (lambda b: bertscope.word_attention(torch.rand(6, 6), [0, 2, 2, 5, 5, 5]), InputError,
     re.escape("token_words never names word 1 of 0..5")),
    (lambda b: bertscope.word_attention(torch.rand(2, 2), [0, 10**9]), InputError,  # at once, not a set of 10^9
     re.escape("token_words names word 1000000000 for 2 tokens")),
    (lambda b: bertscope.word_attention(torch.rand(4, 4), [-1, 0, 1, 2]), InputError,
     re.escape("token_words[0] is -1")),
    (lambda b: bertscope.word_attention(torch.rand(4, 4), "abcd"), InputError, "a list of word indices"),
    (lambda b: bertscope.MultiHeadSelfAttention(hidden_size=100, num_heads=12), bertscope.ConfigError,
     "not divisible"),
    (lambda b: bertscope.MultiHeadSelfAttention(64, 4)(torch.randn(2, 5, 32)), InputError, r"x must be \(B, T, 64\)"),
    (lambda b: bertscope.build_report(b, IT_ANIMAL, span=3), InputError, "span must be"),
    (lambda b: bertscope.build_report(b, "The cat").save(5), InputTypeError, "must be a str or a Path"),
    (lambda b: bertscope.load(5), InputTypeError, "the model folder must be a str or a Path"),
    (lambda b: bertscope.count_params(5), InputTypeError, "counts a BERT model"),
    (lambda b: bertscope.explain(b, IT_ANIMAL, "grad-input", text_b=5), InputTypeError, r"text_b\) is int"),
    (lambda b: bertscope.explain(b, "\u200b", "alti"), InputError, "has no tokens"),
    (lambda b: bertscope.explain(b, "A dog.", "grad-input", text_b="\u200b"), InputError, r"text_b\) has no tokens"),
    (lambda b: bertscope.explain(b, " ".join(["word"] * 200), "value-zeroing"), InputError,
     "limited to 128 tokens"),
    (lambda b: _tiny_classifier(b).classify(["a"], max_length="5"), InputError, "max_length must be a whole number"),
    # these raised Python's or torch's own error (AttributeError, TypeError, RuntimeError, IndexError)
    # from deep inside, or were accepted in silence: a misspelt option given False, normalize="no"
    # read as true, a mask value 2 read as a token, a tokenizer max_length of 0 that turned
    # truncation off
    (lambda b: bertscope.head_stats(b, None), InputTypeError,
     re.escape("texts must be a list of strings, got NoneType")),
    (lambda b: bertscope.head_stats(b, 5), InputTypeError, re.escape("texts must be a list of strings, got int")),
    (lambda b: b(None, _ids(b)[1]), InputTypeError, re.escape("input_ids is required")),
    (lambda b: b(*_ids(b), bogus=False), InputTypeError, re.escape("bert() got unknown argument(s) bogus")),
    (lambda b: b(*_ids(b), head_mask=[[1.0] * 12] * 6), InputTypeError,
     re.escape("head_mask must be a torch tensor (layers, heads), got list")),
    (lambda b: b.embed(["a"], normalize="no"), InputTypeError, re.escape("normalize must be True or False, got 'no'")),
    (lambda b: b.embed_ids([[101, 102]], normalize=None), InputTypeError, re.escape("normalize must be True or False")),
    (lambda b: b.pool(_ids(b)[0], normalize=1), InputTypeError, re.escape("normalize must be True or False, got 1")),
    (lambda b: bertscope.mask_to_bias([[1, 0]], torch.float32), InputTypeError,
     re.escape("attention_mask must be a torch.Tensor (B, T) of 1 (token) and 0 (PAD), got list")),
    (lambda b: bertscope.mask_to_bias(torch.tensor([[2, 0]]), torch.float32), InputError,
     re.escape("attention_mask must hold only 1 (token) and 0 (PAD)")),
    (lambda b: bertscope.mask_to_bias(torch.tensor([1, 0]), torch.float32), InputError,
     re.escape("attention_mask must have shape (B, T), got (2,)")),
    (lambda b: bertscope.mask_to_bias(torch.tensor([[1, 0]]), torch.int64), InputError,
     re.escape("dtype must be a floating-point torch.dtype")),
    (lambda b: bertscope.to_key_padding_mask(None), InputTypeError, re.escape("attention_mask must be a torch.Tensor")),
    (lambda b: bertscope.MultiHeadSelfAttention(64, 4)(torch.zeros(1, 3, 64), head_mask=torch.ones(2)),
     InputError, re.escape("head_mask must be (H,) = (4,) or (B, H) = (1, 4), got (2,)")),
    # a value_mask of another batch was broadcast into an output of the wrong shape, in silence;
    # a list as the mask raised AttributeError from inside the check
    (lambda b: bertscope.MultiHeadSelfAttention(64, 4)(torch.zeros(1, 3, 64), value_mask=torch.ones(2, 3)),
     InputError, re.escape("value_mask must be (B, T) = (1, 3), got (2, 3)")),
    (lambda b: bertscope.MultiHeadSelfAttention(64, 4)(torch.zeros(1, 3, 64), value_mask=[[1, 1, 0]]),
     InputTypeError, re.escape("value_mask must be a torch tensor (B, T), got list")),
    (lambda b: bertscope.MultiHeadSelfAttention(64, 4)(torch.zeros(1, 3, 64), [[1, 1, 0]]),
     InputTypeError, re.escape("attention_mask must be a torch.Tensor (B, T) of 1 (token) and 0 (PAD), got list")),
    (lambda b: bertscope.MultiHeadSelfAttention(64, 4)(torch.zeros(1, 3, 64), torch.ones(1, 1, 1, 3)),  # HF's extended
     InputError, re.escape("attention_mask must have shape (B, T) = (1, 3), got (1, 1, 1, 3)")),
    (lambda b: bertscope.MultiHeadSelfAttention(64, 4)(torch.zeros(1, 3, 64, dtype=torch.long)),
     InputError, re.escape("x must hold floating-point hidden states, got torch.int64")),
    (lambda b: bertscope.BertConfig.from_dict(None), InputTypeError, re.escape("a config must be a dict")),
    (lambda b: bertscope.BertConfig.from_json(None), InputTypeError,
     re.escape("path must be a str or a Path, got NoneType")),
    (lambda b: bertscope.BertTokenizer.from_folder(None), InputTypeError, re.escape("folder must be a str or a Path")),
    (lambda b: bertscope.BertTokenizer.from_folder("/no/such/folder"), CheckpointError,
     re.escape("/no/such/folder does not exist")),
    (lambda b: bertscope.BertTokenizer.from_folder(b.path, 0), InputError,
     re.escape("max_length must be a whole number >= 2 ([CLS] and [SEP]), got 0")),
    (lambda b: bertscope.BertTokenizer.from_folder(b.path, "x"), InputError,
     re.escape("max_length must be a whole number")),
])
def test_python_api_mistakes_are_one_bertscope_error(bert, call, kind, fragment):
    with pytest.raises(kind, match=fragment) as err:
        call(bert)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("labels,fragment", [
    (torch.tensor([5, 0]), r"classes 0\.\.1 \(or -100 to skip a text\), got 5"),
    (torch.tensor([-1, 0]), "got -1"),
    (torch.tensor([1]), r"shape \(2,\), got \(1,\)"),
    (["pos", "neg"], "a tensor of class indices"),
    (torch.tensor([0.0, 1.0]), r"float labels are class probabilities, shape \(2, 2\)"),
    (torch.tensor([True, False]), "integer class indices"),
])
def test_classifier_labels_are_checked(bert, labels, fragment):
    """torch's own errors here were an IndexError ("Target 5 is out of bounds"), a batch-size
    ValueError and an AttributeError. What torch's cross-entropy takes still works, and gives
    torch's own loss: -100 (its ignore_index) skips a text, (B, K) floats are soft targets, and
    any integer dtype is a class index (int32 was torch's "expected Long")."""
    import torch.nn.functional as F

    clf = _tiny_classifier(bert).model
    b = bert.encode(["a cat", "a dog sat"])
    run = lambda y: clf(b.input_ids, b.attention_mask, b.token_type_ids, labels=y)  # noqa: E731
    with pytest.raises(InputError, match=fragment):
        run(labels)
    out = run(torch.tensor([1, 0]))
    for y in (torch.tensor([1, -100]), torch.tensor([[0.3, 0.7], [1.0, 0.0]]), torch.tensor([1, 0], dtype=torch.int32)):
        want = F.cross_entropy(out.logits, y.long() if not y.is_floating_point() else y)
        assert torch.allclose(run(y).loss, want), y


def test_rollout_and_mean_take_a_models_attentions_tuple(bert, hf_model):
    """HF's ``out.attentions`` (a tuple of (1, H, T, T)) goes straight in; the mean over heads is
    numpy's mean of HF's maps, and the rollout equals the one of the stacked (N, H, T, T)."""
    b = bert.encode([IT_ANIMAL])
    with torch.no_grad():
        hf = hf_model(input_ids=b.input_ids, attention_mask=b.attention_mask, output_attentions=True).attentions
    want = np.stack([a[0].numpy() for a in hf]).mean(axis=1)  # (N, T, T)
    assert np.abs(bertscope.mean_heads(hf).numpy() - want).max() < 1e-6
    assert np.abs(bertscope.mean_heads(np.stack([a[0].numpy() for a in hf])).numpy() - want).max() < 1e-6
    assert torch.equal(bertscope.attention_rollout(hf), bertscope.attention_rollout(torch.stack(hf)[:, 0]))


def test_results_have_short_reprs(bert):
    """A notebook cell ending in a result showed its whole tensors (Trace: 22k characters,
    Report: 31k); each now says what it holds in one line."""
    from bertscope.understand.headstats import head_stats

    shown = [bert, bertscope.attend(bert, IT_ANIMAL, "it"), bertscope.explain(bert, IT_ANIMAL, "alti"),
             trace(bert, IT_ANIMAL, "it", 3, 1), head_stats(bert, [IT_ANIMAL]),
             ablate(bert, IT_ANIMAL, [(3, 1)], "it"), bertscope.build_report(bert, IT_ANIMAL)]
    for obj in shown:
        r = repr(obj)
        assert len(r) < 300 and "\n" not in r and "tensor(" not in r and "array(" not in r, r
        assert r.startswith(type(obj).__name__ + "("), r
    assert "'it' (token 10 of 15), layer 3, head 1" in repr(shown[3])
    assert "6 layers x 12 heads" in repr(shown[0])


def test_heads_for_takes_the_word_and_build_report_names_the_text(bert):
    res = bertscope.attend(bert, IT_ANIMAL, "it")
    assert res.heads_for("animal", k=3) == res.heads_for(res.words.index("animal"), k=3)
    assert res.heads_for("Animal", k=1) == res.heads_for(res.words.index("animal"), k=1)  # as attend matches
    with pytest.raises(InputError, match="not in the text"):
        res.heads_for("zebra")
    with pytest.raises(InputTypeError, match="^the text is int, not a string$"):
        bertscope.build_report(bert, 3)  # it said "texts[0]", a name the caller never used
    with pytest.raises(InputTypeError, match="^the second text is int, not a string$"):
        bertscope.build_report(bert, IT_ANIMAL, 3)


def test_a_batch_passed_whole_is_told_which_tensors_to_pass(bert):
    b = bert.encode(["a cat"])
    with pytest.raises(InputTypeError, match="pass batch.input_ids, batch.attention_mask, batch.token_type_ids"):
        bert.model(b)


def test_negative_layers_and_heads_count_from_the_end_everywhere(bert, capsys):
    """trace took -1 and explain's results did; ablate said "head L-1 H0 does not exist" and
    explain's CLI "--layer must be 0 or more"."""
    assert ablate(bert, IT_ANIMAL, [(-1, -1)]).heads == [(5, 11)]
    assert torch.equal(ablate(bert, IT_ANIMAL, [(-1, -1)]).token_cosine, ablate(bert, IT_ANIMAL, [(5, 11)]).token_cosine)
    outs = []
    for layer, head in (("-1", "-1"), ("5", "11")):
        assert main(["explain", IT_ANIMAL, "--method", "norm", "--token", "it", "--layer", layer,
                     "--head", head, "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]
    assert main(["explain", IT_ANIMAL, "--method", "norm", "--token", "it", "--layer", "-7"]) == 2
    assert "--layer -7 does not exist (the model has layers 0..5, or -6..-1" in capsys.readouterr().err


def test_a_classifier_reads_one_token_of_each_text_at_least(bert):
    """The rule for texts of only dropped characters looked at the ids after truncation, so at
    max_length 2 every text was called one "with no tokens (only characters the tokenizer drops)".
    At 2 a classifier reads [CLS] [SEP] only, nothing of the text: refused, as finetune refuses it."""
    clf = _tiny_classifier(bert)
    with pytest.raises(InputError, match=re.escape("max_length must be a whole number 3..512 (room for one")):
        clf.classify(["hello world", "a cat"], max_length=2)
    with pytest.raises(InputError, match=re.escape("max_length must be a whole number 5..512 for pairs")):
        clf.classify(["hello world"], pairs=["a cat"], max_length=4)
    with pytest.warns(bertscope.TruncationWarning, match="1 text"):  # cut to [CLS] hello [SEP]: read
        probs = clf.classify(["hello world", "cat"], max_length=3)
    assert probs.shape == (2, 2)
    with pytest.warns(bertscope.TruncationWarning):
        assert clf.classify(["hello world"], pairs=["a black cat"], max_length=5).shape == (1, 2)
    with pytest.raises(InputError, match=re.escape("texts[1] has no tokens")):  # the rule itself still holds
        _tiny_classifier(bert).classify(["hello world", "\u200b"])


def test_inputs_embeds_of_another_dtype_than_the_weights_is_one_line(bert):
    """float64 embeddings raised torch's "mixed dtype (CPU)" from inside the LayerNorm."""
    E = torch.randn(1, 4, bert.config.hidden_size, dtype=torch.float64)
    for call in (lambda: bert(None, inputs_embeds=E), lambda: bert.model(None, inputs_embeds=E)):
        with pytest.raises(InputError, match=re.escape("inputs_embeds must be torch.float32, as the model's "
                                                       "weights are (or narrower), got torch.float64")):
            call()
    out = bert.model(None, inputs_embeds=E.float())  # the cast it names works
    assert out.last_hidden_state.shape == (1, 4, bert.config.hidden_size)
    with pytest.raises(InputError, match="got torch.float8_e4m3fn"):  # torch cannot promote it: refused, one line
        bert.model(None, inputs_embeds=E.to(torch.float8_e4m3fn))
    # narrower than the weights is promoted at the first addition, as it always was
    half = bert.model(None, inputs_embeds=E.to(torch.bfloat16)).last_hidden_state
    assert half.dtype == torch.float32
    assert (half - bert.model(None, inputs_embeds=E.to(torch.bfloat16).float()).last_hidden_state).abs().max() == 0


def test_the_summary_says_when_the_weights_were_cast_after_loading(bert):
    """After bert.model.to(torch.bfloat16) the summary still said "fp32"."""
    assert "fp32 on cpu" in repr(bert)
    cast = copy.deepcopy(bert)
    cast.model.to(torch.bfloat16)
    assert "bfloat16 weights on cpu" in repr(cast) and "fp32" not in repr(cast).split("path=")[0]


def test_a_number_of_the_wrong_kind_is_a_type_error_and_one_out_of_range_a_value_error(bert):
    """``embed(batch_size=2.0)`` was a ValueError, where Python's own ``[2.0]`` is a TypeError:
    a caller's ``except TypeError`` missed it. Out of range stays a ValueError."""
    from bertscope.core.words import find_word
    from bertscope.errors import as_count, as_index, check_seed
    from bertscope.train.loop import FinetuneConfig

    wrong_kind = [lambda: bert.embed(["a b"], batch_size=2.0), lambda: bert.embed(["a b"], batch_size="3"),
                  lambda: as_count(1.5, "k"),
                  lambda: bert.tokenizer.encode(["a b"], max_length=True), lambda: as_index("layer", 1.0, 6),
                  lambda: check_seed(0.5), lambda: check_seed(True),
                  lambda: trace(bert, "the cat sat", "cat", pad=1.0),
                  lambda: trace(bert, "the cat sat", "cat", layer="1"),
                  lambda: find_word(["the", "cat"], "cat", occurrence=1.0),
                  lambda: FinetuneConfig(train="t.jsonl", epochs=2.0).check(),
                  lambda: FinetuneConfig(train="t.jsonl", lr="1e-5").check()]
    for i, call in enumerate(wrong_kind):
        with pytest.raises(InputTypeError) as e:
            call()
        assert isinstance(e.value, TypeError) and isinstance(e.value, InputError), i
    out_of_range = [lambda: bert.embed(["a b"], batch_size=0), lambda: bert.tokenizer.encode(["a b"], max_length=1),
                    lambda: as_index("layer", 6, 6), lambda: check_seed(-1), lambda: check_seed(2 ** 64),
                    lambda: trace(bert, "the cat sat", "cat", pad=-1),
                    lambda: find_word(["the", "cat"], "cat", occurrence=0),
                    lambda: FinetuneConfig(train="t.jsonl", epochs=0).check(),
                    lambda: FinetuneConfig(train="t.jsonl", lr=float("nan")).check()]
    for i, call in enumerate(out_of_range):
        with pytest.raises(InputError) as e:
            call()
        assert not isinstance(e.value, TypeError), (i, e.value)


@pytest.mark.parametrize("args, said", [
    (["view", "hello world", "--out", "-"], "--out -: standard output is not written here"),
    (["plot", "hello world", "--out", "-"], "--out -: standard output is not written here"),
    (["bench", "--quick", "--plot", "-"], "--plot -: standard output is not written here"),
    (["heads", "TEXTS", "--out", "-"], "--out -: standard output is not a folder"),
    (["embed", "TEXTS", "--out", "-"], "--out -: standard output is not a folder"),
    (["finetune", "TEXTS", "--out", "-"], "--out -: standard output is not a folder"),
    (["experiments", "--out", "-"], "--out -: standard output is not a folder"),
    (["explain-experiments", "--out", "-"], "--out -: standard output is not a folder"),
])
def test_a_dash_for_an_output_file_or_folder_is_refused_not_made(args, said, tmp_path, monkeypatch, capsys):
    """"-" is the shell's name for standard output: a command that writes a file or a folder
    refuses it in one line (it made a folder named "-" in the working folder), before any work."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts.txt").write_text("a fine film\nan awful one\n")
    args = ["texts.txt" if a == "TEXTS" else a for a in args]
    one_line_error(main(args), capsys.readouterr().err, said)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt"]  # nothing named "-" was made
