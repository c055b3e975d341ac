"""Strict loading: both key layouts load; a removed, extra or mis-shaped key gets a clear error."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertscope
from bertscope.errors import CheckpointError

SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")


def copy_checkpoint(src: Path, dst: Path, state: dict[str, torch.Tensor], fmt: str = "safetensors") -> Path:
    dst.mkdir()
    for name in SMALL_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"))
    else:
        torch.save(state, dst / "pytorch_model.bin")
    return dst


@pytest.fixture(scope="module")
def state(bundled_path):
    return load_file(str(bundled_path / "model.safetensors"))


def same_weights(a: bertscope.Bert, b: bertscope.Bert) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_prefixed_layout_and_task_heads_load(tmp_path, bundled_path, state, bert):
    prefixed = {f"bert.{k}": v for k, v in state.items()}
    prefixed["cls.predictions.bias"] = torch.zeros(30522)  # a pre-training head: set aside
    folder = copy_checkpoint(bundled_path, tmp_path / "prefixed", prefixed)
    assert same_weights(bertscope.load(folder), bert)


def test_pytorch_bin_loads(tmp_path, bundled_path, state, bert):
    folder = copy_checkpoint(bundled_path, tmp_path / "bin", state, fmt="bin")
    assert same_weights(bertscope.load(folder), bert)


def test_legacy_gamma_beta_names_load(tmp_path, bundled_path, state, bert):
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in state.items()}
    folder = copy_checkpoint(bundled_path, tmp_path / "legacy", legacy)
    assert same_weights(bertscope.load(folder), bert)


def test_removed_key(tmp_path, bundled_path, state):
    broken = dict(state)
    del broken["encoder.layer.2.attention.self.key.weight"]
    folder = copy_checkpoint(bundled_path, tmp_path / "missing", broken)
    with pytest.raises(CheckpointError, match=r"missing weight 'encoder\.layer\.2\.attention\.self\.key\.weight' \(expected shape \(384, 384\)\)"):
        bertscope.load(folder)


@pytest.mark.parametrize("key,shape", [
    ("encoder.layer.0.attention.self.rotary.weight", (3,)),  # a weight BERT does not have
    ("encoder.layer.6.output.dense.bias", (384,)),  # a layer beyond the config's 6
])
def test_extra_key(tmp_path, bundled_path, state, key, shape):
    broken = dict(state)
    broken[key] = torch.zeros(shape)
    folder = copy_checkpoint(bundled_path, tmp_path / "extra", broken)
    with pytest.raises(CheckpointError, match=f"unexpected weight {re.escape(repr(key))}"):
        bertscope.load(folder)


def test_wrong_shape_names_key_and_both_shapes(tmp_path, bundled_path, state):
    broken = dict(state)
    broken["encoder.layer.1.intermediate.dense.weight"] = torch.zeros(1000, 384)
    folder = copy_checkpoint(bundled_path, tmp_path / "shape", broken)
    with pytest.raises(CheckpointError) as e:
        bertscope.load(folder)
    msg = str(e.value)
    assert "encoder.layer.1.intermediate.dense.weight" in msg and "(1000, 384)" in msg and "(1536, 384)" in msg


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        bertscope.load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="is not a BERT checkpoint: it has no config.json"):
        bertscope.load(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="is not a folder"):
        bertscope.load(tmp_path / "file.txt")


def test_broken_files(tmp_path, bundled_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="bad config"):
        bertscope.load(folder)
    shutil.copy(bundled_path / "config.json", folder / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        bertscope.load(folder)
    (folder / "model.safetensors").write_bytes(b"\x00" * 100)
    shutil.copy(bundled_path / "tokenizer.json", folder / "tokenizer.json")
    with pytest.raises(CheckpointError, match="could not be read as model weights"):
        bertscope.load(folder)


def test_vocab_txt_only_tokenizes_like_tokenizer_json(tmp_path, bundled_path, state, bert):
    folder = copy_checkpoint(bundled_path, tmp_path / "vocab_only", state)
    (folder / "tokenizer.json").unlink()
    other = bertscope.load(folder)
    texts = ["The animal didn't cross the street", "Ünïcödé façade, naïve café!"]
    assert torch.equal(other.encode(texts).input_ids, bert.encode(texts).input_ids)


def test_a_checkpoint_saved_without_the_pooler_loads_as_hf_loads_it(tmp_path, bundled_path, caplog):
    """HF's BertForMaskedLM (and BertModel(add_pooling_layer=False)) save no pooler weights:
    bertscope refused such a folder ("missing weight 'pooler.dense.weight'"), which HF loads."""
    import logging

    import transformers

    from bertscope.core.classifier import BertForSequenceClassification

    folder = tmp_path / "mlm"
    transformers.BertForMaskedLM.from_pretrained(str(bundled_path)).save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(bundled_path / name, folder / name)
    assert not any(k.startswith("bert.pooler") for k in load_file(str(folder / "model.safetensors")))
    with caplog.at_level(logging.WARNING, logger="bertscope"):
        mlm = bertscope.load(folder)
    assert "has no pooler weights" in caplog.text
    hf = transformers.BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    b = mlm.encode(["The animal didn't cross the street because it was too tired.", "A short one."])
    with torch.no_grad():
        ref = hf(input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids,
                 output_attentions=True)
        ours = mlm.model(b.input_ids, b.attention_mask, b.token_type_ids, output_attentions=True)
        packed = mlm(b.input_ids, b.attention_mask, b.token_type_ids)  # the fast path too
    real = b.attention_mask.bool()
    assert (ours.last_hidden_state - ref.last_hidden_state)[real].abs().max() <= 1e-5
    assert max((a - r).abs().max() for a, r in zip(ours.attentions, ref.attentions)) <= 1e-5
    assert (packed.last_hidden_state - ref.last_hidden_state)[real].abs().max() <= 1e-5
    assert ours.pooler_output is None and packed.pooler_output is None
    # a classifier on it gets a new pooler, as HF's does, and runs
    clf = BertForSequenceClassification(mlm.config, 2, encoder=mlm.model)
    assert clf.bert.pooler is not None
    assert clf(b.input_ids, b.attention_mask, b.token_type_ids).logits.shape == (2, 2)


@pytest.mark.parametrize("settings,text", [
    ({"do_lower_case": True, "strip_accents": False}, "Héllo Café NAÏVE"),
    ({"do_lower_case": False, "strip_accents": True}, "Héllo Café NAÏVE"),
    ({"do_lower_case": True, "tokenize_chinese_chars": False}, "日本語 and 漢字"),
])
def test_a_vocab_txt_folder_tokenizes_as_hf_reads_its_tokenizer_config(tmp_path, bundled_path, state, settings,
                                                                       text):
    """Only do_lower_case was read: strip_accents and tokenize_chinese_chars were ignored, and
    the ids differed from HF's for the same folder."""
    import json

    import transformers

    folder = copy_checkpoint(bundled_path, tmp_path / "vocab_only", state)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    ours = bertscope.load(folder).encode([text]).input_ids[0].tolist()
    hf = transformers.BertTokenizer(str(folder / "vocab.txt"), **settings)(text)["input_ids"]
    assert ours == hf


def test_a_max_seq_length_that_is_not_a_length_is_said_and_ignored(tmp_path, bundled_path, state, caplog):
    import json
    import logging

    folder = copy_checkpoint(bundled_path, tmp_path / "zero", state)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 0}))
    with caplog.at_level(logging.WARNING, logger="bertscope"):
        b = bertscope.load(folder)
    assert b.max_seq_length == 512  # the positions, as when the folder sets none
    assert "max_seq_length 0 (not a positive whole number)" in caplog.text


def test_the_bundled_model_has_one_name_however_it_is_reached(tmp_path, bundled_path, state):
    """load() called it "all-MiniLM-L6-v2" and load(its folder) "model": a view of the one
    checkpoint against itself said "A = all-MiniLM-L6-v2, B = model"."""
    assert bertscope.load(bundled_path).name == bertscope.load().name == "all-MiniLM-L6-v2"
    assert bertscope.load(copy_checkpoint(bundled_path, tmp_path / "mine", state)).name == "mine"  # a copy: its folder
