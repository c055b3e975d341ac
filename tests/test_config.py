"""BertConfig: presets, config.json reading, and parameter counts against HF's BertModel."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

import bertscope
from bertscope import BertConfig, ConfigError
from bertscope.core.params import BUILT_LAYERS, count_config, count_params


def test_presets_and_head_size():
    base = BertConfig.preset("bert-base")
    assert (base.hidden_size, base.num_attention_heads, base.head_size, base.num_hidden_layers) == (768, 12, 64, 12)
    assert BertConfig.preset("bert-large").head_size == 64
    assert BertConfig.preset("minilm-l6").head_size == 32
    with pytest.raises(ConfigError, match="unknown preset 'bert-huge'"):
        BertConfig.preset("bert-huge")
    with pytest.raises(Exception):
        base.hidden_size = 1  # frozen


def test_from_json_reads_the_bundled_config(bundled_path):
    cfg = BertConfig.from_json(bundled_path / "config.json")
    raw = json.loads((bundled_path / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "vocab_size", "layer_norm_eps"):
        assert getattr(cfg, key) == raw[key]


def test_from_json_rejects_what_it_cannot_build(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ConfigError, match="not 'bert'"):
        BertConfig.from_json(p)
    p.write_text(json.dumps({"hidden_size": 768}))
    with pytest.raises(ConfigError, match=re.escape(f"{p}: the config lacks vocab_size, num_hidden_layers")):
        BertConfig.from_json(p)
    with pytest.raises(ConfigError, match=re.escape("the config lacks vocab_size")):  # no file: none named
        BertConfig.from_dict({"hidden_size": 768})
    p.write_text(json.dumps({**BertConfig().to_dict(), "num_attention_heads": 7}))
    with pytest.raises(ConfigError, match="not divisible"):
        BertConfig.from_json(p)


@pytest.mark.parametrize("preset", ["bert-base", "bert-large", "minilm-l6"])
def test_parameter_counts_equal_hf(preset):
    import transformers

    cfg = BertConfig.preset(preset)
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
    )
    with torch.device("meta"):
        ours = bertscope.BertModel(cfg)
        hf = transformers.BertModel(hf_cfg)
    pc = count_params(ours)
    assert pc.model_total == sum(p.numel() for p in hf.parameters())
    hf_attn = sum(p.numel() for layer in hf.encoder.layer
                  for mod in (layer.attention.self, layer.attention.output.dense) for p in mod.parameters())
    assert pc.attention_total == hf_attn
    assert pc.per_layer_total * cfg.num_hidden_layers == pc.attention_total


def test_a_model_deeper_than_built_layers_is_counted_as_hf_counts_it():
    """count_config builds at most BUILT_LAYERS layers; past that it counts from two, and must
    still give what HF's BertModel, built whole, has."""
    import transformers

    N = BUILT_LAYERS + 3
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=N, num_attention_heads=4,
                     intermediate_size=48, max_position_embeddings=16)
    with torch.device("meta"):
        hf = transformers.BertModel(transformers.BertConfig(
            vocab_size=50, hidden_size=32, num_hidden_layers=N, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=16))
    pc = count_config(cfg)
    assert pc.config.num_hidden_layers == N
    assert pc.model_total == sum(p.numel() for p in hf.parameters())
    assert pc.attention_total == sum(p.numel() for layer in hf.encoder.layer
                                     for mod in (layer.attention.self, layer.attention.output.dense)
                                     for p in mod.parameters())
    shallow = count_config(dataclasses.replace(cfg, num_hidden_layers=BUILT_LAYERS))  # built whole
    assert (pc.per_matrix, pc.per_layer_total) == (shallow.per_matrix, shallow.per_layer_total)


def test_params_of_a_config_with_a_million_layers_is_counted_not_built(tmp_path, capsys):
    """A config.json may say anything: 10**6 layers used to build meta modules until memory ran out."""
    from bertscope.cli.app import main

    config = json.loads((bertscope.bundled_model_path() / "config.json").read_text())
    config["num_hidden_layers"] = 10**6
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["params", "--model", str(folder), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    cfg = BertConfig.from_json(folder / "config.json")
    assert got["attention_total"] == 10**6 * got["per_layer_total"] == 10**6 * 4 * (384 * 384 + 384)
    assert got["model_total"] == cfg.num_parameters  # the config's own formula (the HF check is above)


def test_seed_s10_numbers_for_bert_base():
    """The seed's S10 figures, which are arithmetic on 768 and 12, checked against the built model."""
    with torch.device("meta"):
        pc = count_params(bertscope.BertModel(BertConfig.preset("bert-base")))
    assert pc.per_matrix["W_Q"] == (768 * 768, 768)
    assert pc.per_layer_weights == 4 * 768 * 768 == 2_359_296
    assert pc.per_layer_total == 2_362_368
    assert pc.attention_total == 12 * 2_362_368 == 28_348_416
    assert pc.model_total == 109_482_240  # BERT-base with pooler, as published for bert-base-uncased


@pytest.mark.parametrize("field,value,fragment", [
    ("num_attention_heads", 0, "must be positive"),
    ("hidden_size", None, "whole number"),
    ("hidden_size", [1], "whole number"),
    ("hidden_size", 384.0, "whole number"),
    ("hidden_size", "abc", "whole number"),
    ("vocab_size", True, "whole number"),
    ("layer_norm_eps", "x", "must be a number"),
    ("layer_norm_eps", 0, "in (0, 1)"),
    ("hidden_dropout_prob", 2, "in [0, 1)"),
    ("attention_probs_dropout_prob", -0.1, "in [0, 1)"),
    ("max_position_embeddings", 10 ** 11, "beyond what bertscope supports"),
    ("pad_token_id", 40000, "outside the vocabulary"),
    ("hidden_act", "swish", "not supported"),
])
def test_malformed_config_values_name_the_field(tmp_path, field, value, fragment):
    data = {**BertConfig().to_dict(), field: value}
    data.pop("do_lower_case")
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        BertConfig.from_json(p)
    assert field in str(e.value) and fragment in str(e.value)
    assert isinstance(e.value, bertscope.BertscopeError)  # so the CLI prints one line


def test_malformed_config_through_the_cli(tmp_path, bundled_path, capsys):
    import shutil

    from bertscope.cli.app import main

    folder = tmp_path / "m"
    shutil.copytree(bundled_path, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    data = json.loads((folder / "config.json").read_text())
    data["num_attention_heads"] = 0
    (folder / "config.json").write_text(json.dumps(data))
    for args in (["attend", "the cat sat", "--token", "cat", "--model", str(folder)],
                 ["params", "--model", str(folder)]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "num_attention_heads must be positive" in err[0]
