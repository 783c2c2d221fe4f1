"""Checkpoints: Hugging Face -> ours -> Hugging Face round trips (bit-exact), transformers loading our
directories with the same outputs, the official v1 layout, and clear errors for checkpoints that do not fit."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

import debertakit
from debertakit.convert import CheckpointError, read_state_dict
from debertakit.convert.keys import merge_v1_in_proj, split_v1_in_proj
from tests.hf_oracle import hf_model, transformers

HEADS = [
    "base",
    "masked_lm",
    "sequence_classification",
    "token_classification",
    "question_answering",
    "multiple_choice",
]


def _ids(vocab=96, n=21):
    ids = torch.randint(5, vocab, (2, n))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    return ids, mask


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("variant", ["v1", "v2-conv", "v3"])
def test_round_trip_is_bit_exact(variant, head, safe, tmp_path):
    if head == "multiple_choice" and variant == "v1":
        pytest.skip("transformers has no DebertaForMultipleChoice (v1)")
    extra = {"num_labels": 2} if head == "question_answering" else {}
    hf = hf_model(variant, head, **extra)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=safe)
    ours = debertakit.load_pretrained(tmp_path / "hf")
    assert ours.head_kind == head
    debertakit.save_pretrained(ours, tmp_path / "ours", safe_serialization=safe)
    original = read_state_dict(tmp_path / "hf")
    written = read_state_dict(tmp_path / "ours")
    if head == "masked_lm":
        # transformers drops the absolute table of MLM models; we write the EMD's table, which it ignores
        written.pop("deberta.embeddings.position_embeddings.weight")
    assert set(written) == set(original)
    for k, v in original.items():
        assert torch.equal(written[k], v), k
    # and transformers reads our directory back into the same model
    auto = getattr(transformers, type(hf).__name__).from_pretrained(tmp_path / "ours").eval()
    for k, v in hf.state_dict().items():
        assert torch.equal(auto.state_dict()[k], v), k


@pytest.mark.parametrize("head", ["base", "masked_lm", "sequence_classification"])
@pytest.mark.parametrize("variant", ["v1", "v2-conv", "v3"])
def test_transformers_loads_our_model_with_same_outputs(variant, head, tmp_path):
    layout = "v1" if variant == "v1" else "v2"
    preset = {"v1": "tiny-v1", "v2-conv": "tiny-v2", "v3": "tiny-v3"}[variant]
    cfg = debertakit.DebertaConfig.preset(
        preset, hidden_dropout=0.0, attention_dropout=0.0, use_emd=False, num_labels=3
    )
    assert cfg.attention_layout == layout
    ours = debertakit.build_model(cfg, head).eval()
    debertakit.save_pretrained(ours, tmp_path)
    auto_cls = {
        "base": "AutoModel",
        "masked_lm": "AutoModelForMaskedLM",
        "sequence_classification": "AutoModelForSequenceClassification",
    }[head]
    hf = getattr(transformers, auto_cls).from_pretrained(tmp_path).eval()
    ids, mask = _ids(cfg.vocab_size)
    a, b = ours(input_ids=ids, attention_mask=mask), hf(input_ids=ids, attention_mask=mask)
    if head == "base":
        a, b = a.last_hidden_state[mask.bool()], b.last_hidden_state[mask.bool()]
    elif head == "masked_lm":
        a, b = a.logits[mask.bool()], b.logits[mask.bool()]
    else:
        a, b = a.logits, b.logits
    assert (a - b).abs().max().item() < 1e-5


def test_mlm_with_emd_keeps_the_absolute_table(tmp_path):
    cfg = debertakit.DebertaConfig.preset("tiny-v3")
    model = debertakit.build_model(cfg, "masked_lm").eval()
    debertakit.save_pretrained(model, tmp_path)
    keys = load_file(tmp_path / "model.safetensors")
    assert "deberta.embeddings.position_embeddings.weight" in keys
    again = debertakit.load_pretrained(tmp_path)
    assert again.cfg.emd_enabled
    ids, mask = _ids(cfg.vocab_size)
    assert torch.equal(
        model(input_ids=ids, attention_mask=mask).logits, again(input_ids=ids, attention_mask=mask).logits
    )


def test_mlm_without_absolute_table_disables_emd_with_warning(tmp_path, caplog):
    hf_model("v3", "masked_lm").save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="debertakit.checkpoint"):
        model = debertakit.load_pretrained(tmp_path)
    assert not model.cfg.emd_enabled
    assert "position_embeddings" in caplog.text and "use_emd=False" in caplog.text


def test_legacy_mlm_head_loads_as_released_layout(tmp_path):
    hf = hf_model("v3", "masked_lm", legacy=True)
    hf.save_pretrained(tmp_path)
    ours = debertakit.load_pretrained(tmp_path)
    ids, mask = _ids()
    a = ours(input_ids=ids, attention_mask=mask, decode_all=True).logits
    b = hf(input_ids=ids, attention_mask=mask).logits
    assert (a - b)[mask.bool()].abs().max().item() < 1e-5


def test_missing_head_warns_with_names(tmp_path, caplog):
    hf_model("v3", "base").save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="debertakit.checkpoint"):
        model = debertakit.load_pretrained(tmp_path, "sequence_classification")
    assert model.head_kind == "sequence_classification"
    assert "classification_head.classifier.weight" in caplog.text and "randomly initialised" in caplog.text


def test_other_heads_are_left_out_not_errors(tmp_path):
    hf_model("v3", "masked_lm").save_pretrained(tmp_path)
    model = debertakit.load_pretrained(tmp_path, "token_classification")
    assert model.head_kind == "token_classification"


def test_missing_backbone_weight_is_an_error(tmp_path):
    hf_model("v3", "base").save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state.pop("encoder.layer.1.output.dense.weight")
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"missing backbone weights: \['deberta.encoder.layers.1.ffn_out.weight'\]"
    ):
        debertakit.load_pretrained(tmp_path)


def test_unexpected_and_mismatched_keys_are_listed(tmp_path):
    hf_model("v3", "sequence_classification").save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["deberta.encoder.layer.0.attention.self.mystery.weight"] = torch.zeros(2)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="unexpected keys.*mystery"):
        debertakit.load_pretrained(tmp_path)
    state.pop("deberta.encoder.layer.0.attention.self.mystery.weight")
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"shape mismatches.*classifier.weight \(3, 32\) vs \(5, 32\)"):
        debertakit.load_pretrained(tmp_path, num_labels=5)
    model = debertakit.load_pretrained(tmp_path, num_labels=5, ignore_mismatched_head=True)
    assert model.classification_head.classifier.weight.shape == (5, 32)


def test_official_v1_layout_without_config(tmp_path):
    """The official repository's checkpoints: pickled, no config.json, fused in_proj with q_bias / v_bias."""
    hf = hf_model("v1", "base")
    state = {"deberta." + k: v for k, v in hf.state_dict().items()}
    torch.save(state, tmp_path / "pytorch.model.bin")
    cfg = debertakit.convert.from_hf_config(hf.config.to_dict())
    ours = debertakit.load_pretrained(tmp_path / "pytorch.model.bin", "base", config=cfg)
    ids, mask = _ids()
    a = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    b = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (a - b)[mask.bool()].abs().max().item() < 1e-5


def test_v1_in_proj_deinterleaving():
    h, d = 3, 2
    w = torch.arange(3 * h * d * 5, dtype=torch.float).view(3 * h * d, 5)
    q, k, v = split_v1_in_proj(w, h)
    # rows of head 1's query are rows [6, 8) of the fused matrix (q, k, v of head 0 come first)
    assert torch.equal(q[2:4], w[6:8]) and torch.equal(k[0:2], w[2:4]) and torch.equal(v[4:6], w[16:18])
    assert torch.equal(merge_v1_in_proj(q, k, v, h), w)


def test_convert_command(tmp_path, capsys):
    from debertakit.cli import main

    hf_model("v3", "masked_lm").save_pretrained(tmp_path / "hf", safe_serialization=False)
    main(["convert", str(tmp_path / "hf"), str(tmp_path / "out")])
    assert (tmp_path / "out" / "model.safetensors").exists()
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["DebertaV2ForMaskedLM"] and cfg["legacy"] is False
    assert "wrote" in capsys.readouterr().out


def test_interrupted_save_leaves_old_file(tmp_path, monkeypatch):
    cfg = debertakit.DebertaConfig.preset("tiny-v3")
    model = debertakit.build_model(cfg, "base")
    debertakit.save_pretrained(model, tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    import safetensors.torch

    def broken(state, path, metadata=None):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with torch.no_grad():
        model.deberta.embeddings.word.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        debertakit.save_pretrained(model, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_saved_files_take_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    import os
    import stat

    from debertakit.convert.checkpoint import atomic_write_text

    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "new.json", "{}")
        (tmp_path / "kept.json").write_text("old")
        os.chmod(tmp_path / "kept.json", 0o604)
        atomic_write_text(tmp_path / "kept.json", "new")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "kept.json").stat().st_mode) == 0o604
    assert (tmp_path / "kept.json").read_text() == "new"
