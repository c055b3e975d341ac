"""The trace is the model's computation: equal to the model's layer and to HF's attentions."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bertscope.cli.app import main
from bertscope.errors import InputError
from bertscope.understand.trace import trace

from conftest import IT_ANIMAL


@pytest.mark.parametrize("layer,head", [(0, 0), (3, 1), (5, 11)])
def test_trace_equals_model_and_hf(bert, hf_model, layer, head):
    tr = trace(bert, IT_ANIMAL, "it", layer, head)
    batch = bert.encode([IT_ANIMAL])
    with torch.inference_mode():
        ours = bert.model(batch.input_ids, batch.attention_mask, output_hidden_states=True,
                          output_attentions=True)
        x = ours.hidden_states[layer]
        attn_out, _ = bert.model.layers[layer].attention(x, batch.attention_mask)
        hf = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(tr.head_output, attn_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tr.layer_output, ours.hidden_states[layer + 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tr.layer_output, hf.hidden_states[layer + 1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(tr.probs, hf.attentions[layer], atol=1e-5, rtol=1e-5)
    t = tr.token_index
    torch.testing.assert_close(tr.weights, hf.attentions[layer][0, head, t], atol=1e-5, rtol=1e-5)
    # the scaled scores are the raw scores over sqrt(D), and softmax of them is the row
    torch.testing.assert_close(tr.scores, tr.raw_scores / math.sqrt(tr.head_size), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.softmax(tr.scores, -1), tr.weights, atol=1e-6, rtol=1e-5)
    # the head's vectors: q·k is the raw row, and the weights times the values is the context
    torch.testing.assert_close(tr.keys @ tr.query, tr.raw_scores, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tr.weights @ tr.values, tr.context, atol=1e-5, rtol=1e-5)


def test_trace_shapes_and_params(bert):
    tr = trace(bert, "The cat sat", "cat", 2, 4, pad=2)
    C, H, D = bert.config.hidden_size, bert.config.num_attention_heads, bert.config.head_size
    T = len(tr.tokens)
    assert tr.tokens[-2:] == ["[PAD]", "[PAD]"]
    assert tr.shapes["x"] == (1, T, C) and tr.shapes["Q heads"] == (1, H, T, D)
    assert tr.shapes["scores"] == (1, H, T, T) and tr.shapes["context"] == (1, H, T, D)
    assert tr.shapes["merged"] == (1, T, C) and tr.shapes["output"] == (1, T, C)
    assert tr.weights[-2:].tolist() == [0.0, 0.0]  # PAD gets exactly nothing
    assert tr.params["layer_weights"] == 4 * C * C and tr.params["layer_total"] == 4 * C * C + 4 * C
    # dropout in training: each surviving weight is scaled by 1/(1-p), the others are 0
    kept = tr.dropped != 0
    torch.testing.assert_close(tr.dropped[kept], tr.weights[kept] / (1 - tr.dropout_p))


def test_trace_padding_does_not_change_real_tokens(bert):
    a = trace(bert, "The cat sat", "cat", 1, 3)
    b = trace(bert, "The cat sat", "cat", 1, 3, pad=3)
    n = len(a.tokens)
    torch.testing.assert_close(a.weights, b.weights[:n], atol=1e-6, rtol=1e-5)


def test_a_split_words_word_weights_are_its_sub_tokens_rows_averaged_and_the_repr_says_so(bert):
    """For "ophthalmologist" (op ##ht ##hal ##mo ##logist) the repr named the token 'op' beside
    top words that are the whole word's: the record now says whose rows they are."""
    tr = trace(bert, "The ophthalmologist examined it", "ophthalmologist", 2, 0)
    own = [i for i, w in enumerate(bert.encode(["The ophthalmologist examined it"]).tokens[0])
           if i >= tr.token_index and i < tr.token_index + 5]
    assert len(own) == 5 and tr.tokens[tr.token_index] == "op"
    rows = tr.probs[0, 0][own].double().mean(0)  # (T,): the word's sub-tokens' rows, averaged
    from bertscope.core.words import group_words

    tw = group_words(bert.encode(["The ophthalmologist examined it"]), "The ophthalmologist examined it").token_words
    by_word = torch.zeros(max(tw) + 1, dtype=torch.float64).index_add_(0, torch.tensor(tw), rows)
    assert torch.allclose(tr.word_weights.double(), by_word, atol=1e-6)
    assert not torch.allclose(tr.word_weights.double()[tw[tr.token_index]], tr.weights.double()[own].sum(), atol=1e-3)
    assert tr.word_tokens == 5 and "(token 2 of 10 of the word 'ophthalmologist', 5 tokens)" in repr(tr)
    assert "of the word" not in repr(trace(bert, IT_ANIMAL, "it", 2, 0))
    assert "of the word" not in repr(trace(bert, "The Animal crossed", "Animal", 2, 0))  # lowercased, not split


def test_trace_bad_input(bert):
    with pytest.raises(InputError, match=r"^layer \(--layer\) must be a whole number from 0 to 5 \(or -6 to -1, counted from the "
                                         r"end\), got 99$"):
        trace(bert, "The cat sat", "cat", 99, 0)  # worded as attend's results word it, with the flag
    with pytest.raises(InputError, match=r"^head \(--head\) must be a whole number from 0 to 11 \(or -12 to -1, counted from "
                                         r"the end\), got 12$"):
        trace(bert, "The cat sat", "cat", 0, 12)
    for bad in ("3", 3.0, True):  # a Python caller's mistakes: one line, not a TypeError from inside
        with pytest.raises(InputError, match=r"layer \(--layer\) must be a whole number"):
            trace(bert, "The cat sat", "cat", bad, 0)
    with pytest.raises(InputError, match="pad .* must be a whole number, 0 or more, got '2'"):
        trace(bert, "The cat sat", "cat", 0, 0, pad="2")
    tr = trace(bert, "The cat sat", "cat", -1, -1)  # counted from the end, as in Python
    assert (tr.layer, tr.head) == (5, 11)
    for bad in (-1, "2", 0):
        with pytest.raises(InputError, match="k must be a whole number >= 1"):
            tr.top_tokens(bad)
        with pytest.raises(InputError, match="k must be a whole number >= 1"):
            tr.top_words(bad)
    with pytest.raises(InputError, match="not in the text"):
        trace(bert, "The cat sat", "dog", 0, 0)


def test_trace_cli(capsys):
    assert main(["trace", IT_ANIMAL, "--token", "it", "--layer", "3", "--head", "1"]) == 0
    out = capsys.readouterr().out
    for step in ("[1]", "[2]", "[3]", "[4]", "[5]", "softmax", "dropout", "parameters"):
        assert step in out
    assert main(["trace", "The cat sat", "--token", "cat", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert abs(data["weights_sum"] - 1) < 1e-5 and data["shapes"]["x"][0] == 1
    assert main(["trace", "It was unbelievably good", "--token", "unbelievably"]) == 0  # a split word says so
    out = capsys.readouterr().out
    assert out.startswith('Trace of "un" (token 3, the first of the 5 tokens of "unbelievably"), ')
    # printed under the traced row's top tokens, its top words said whose rows they are only in the help
    assert '    top words ("unbelievably"\'s 5 sub-token rows averaged, each summed by word' in out
    assert main(["trace", "The cat sat", "--token", "cat"]) == 0
    assert "    top words:  " in capsys.readouterr().out  # one token: its own row
    assert main(["trace", "The cat sat", "--token", "dog"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error:") and len(err.strip().splitlines()) == 1
    # the flags as typed, as plot and explain name them (it said "layer", "head", "pad")
    for args, said in ((["--layer", "6"], "--layer must be a whole number from 0 to 5"),
                       (["--head", "12"], "--head must be a whole number from 0 to 11"),
                       (["--pad", "-1"], "--pad, how many [PAD] tokens to add, must be")):
        assert main(["trace", "The cat sat", "--token", "cat", *args]) == 2
        assert capsys.readouterr().err.startswith(f"bertscope: error: {said}")
