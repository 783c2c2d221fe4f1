"""Bad input raises a ValueError naming the value and what was expected, before any heavy work runs."""

from __future__ import annotations

import pytest
import torch

import debertakit


@pytest.fixture(scope="module")
def model():
    return debertakit.build_model(debertakit.DebertaConfig.preset("tiny-v3"), "masked_lm").eval()


def test_token_id_outside_vocabulary(model):
    ids = torch.randint(4, 100, (2, 20))
    ids[1, 17] = 130
    with pytest.raises(ValueError, match=r"token id 130 >= vocab_size 128 at batch 1, position 17"):
        model(input_ids=ids)


def test_negative_token_id(model):
    ids = torch.randint(4, 100, (2, 5))
    ids[0, 2] = -1
    with pytest.raises(ValueError, match=r"token id -1 < 0 at batch 0, position 2"):
        model(input_ids=ids)


@pytest.mark.parametrize("shape", [(2, 19), (3, 20), (2, 20, 19), (2, 3, 20, 20), (20,)])
def test_mask_shape_mismatch(model, shape):
    with pytest.raises(ValueError, match=r"attention_mask has shape .* expected \(2, 20\), \(2, 20, 20\)"):
        model(input_ids=torch.randint(4, 100, (2, 20)), attention_mask=torch.ones(shape))


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_empty_batch(model, shape):
    with pytest.raises(ValueError, match=r"empty batch: inputs have shape"):
        model(input_ids=torch.zeros(shape, dtype=torch.long))


def test_both_or_neither_inputs(model):
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model()
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long), inputs_embeds=torch.zeros(1, 3, 32))


def test_float_ids(model):
    with pytest.raises(ValueError, match="integer token ids; got dtype torch.float32"):
        model(input_ids=torch.ones(1, 3))


def test_wrong_embedding_width(model):
    with pytest.raises(ValueError, match=r"inputs_embeds must be \(batch, length, 32\); got \(1, 3, 16\)"):
        model(inputs_embeds=torch.zeros(1, 3, 16))


def test_token_types_out_of_range():
    m = debertakit.build_model(debertakit.DebertaConfig.preset("tiny-v3", type_vocab_size=2), "base")
    with pytest.raises(ValueError, match=r"token type id 2 >= type_vocab_size 2 at batch 0, position 1"):
        m(input_ids=torch.ones(1, 3, dtype=torch.long), token_type_ids=torch.tensor([[0, 2, 1]]))


def test_too_long_for_absolute_positions():
    cfg = debertakit.DebertaConfig.preset("tiny-v3", position_biased_input=True, max_position_embeddings=8)
    m = debertakit.build_model(cfg, "base")
    with pytest.raises(ValueError, match="input length 9 exceeds max_position_embeddings=8"):
        m(input_ids=torch.ones(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    "cu, message",
    [
        ([0, 5, 5, 9], "strictly increasing; entry 2"),
        ([1, 5], "must start at 0"),
        ([0, 12], r"cu_seqlens\[-1\]=12 exceeds the 10 tokens"),
    ],
)
def test_bad_cu_seqlens(model, cu, message):
    with pytest.raises(ValueError, match=message):
        model(input_ids=torch.ones(1, 10, dtype=torch.long), cu_seqlens=torch.tensor(cu))


def test_packed_batch_must_be_one_row(model):
    with pytest.raises(ValueError, match="one row of shape \\(1, T\\); got batch size 2"):
        model(input_ids=torch.ones(2, 10, dtype=torch.long), cu_seqlens=torch.tensor([0, 10]))


def test_unknown_backend_named():
    m = debertakit.build_model(debertakit.DebertaConfig.preset("tiny-v3", attention_backend="nope"), "base")
    with pytest.raises(ValueError, match="unknown attention backend 'nope'; expected 'auto' or one of"):
        m(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_unknown_head():
    with pytest.raises(ValueError, match="unknown head 'ner'"):
        debertakit.build_model(debertakit.DebertaConfig.preset("tiny-v3"), "ner")
