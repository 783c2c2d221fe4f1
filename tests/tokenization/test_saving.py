"""save_pretrained / load_tokenizer round trips, and Hugging Face's AutoTokenizer reading our directories."""

from __future__ import annotations

import json
import warnings

import pytest

from debertakit.tokenization import load_tokenizer

TEXTS = ["Hello world, this is a test.", "Paris is the [MASK] of France.", "", "numbers 12 345"]


def _auto(path):
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("kind", ["spm", "bpe"])
def test_round_trip_and_hf_auto_tokenizer(kind, spm_tok, bpe_tok, tmp_path):
    tok = spm_tok if kind == "spm" else bpe_tok
    written = tok.save_pretrained(tmp_path)
    names = sorted(p.name for p in written)
    expected = ["spm.model"] if kind == "spm" else ["merges.txt", "vocab.json"]
    assert names == sorted(expected + ["special_tokens_map.json", "tokenizer_config.json"])
    again = load_tokenizer(tmp_path)
    assert again.kind == kind and again.vocab_size == tok.vocab_size
    pairs = ["a pair"] * len(TEXTS)
    assert again(TEXTS, pairs)["input_ids"] == tok(TEXTS, pairs)["input_ids"]
    hf = _auto(tmp_path)
    assert len(hf) == tok.vocab_size
    assert (hf.pad_token_id, hf.cls_token_id, hf.sep_token_id, hf.unk_token_id, hf.mask_token_id) == (
        0,
        1,
        2,
        3,
        tok.mask_token_id,
    )
    assert hf(TEXTS)["input_ids"] == tok(TEXTS)["input_ids"]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 512 and config["vocab_type"] == kind


def test_load_from_file_paths(spm_dir, bpe_dir):
    assert load_tokenizer(spm_dir / "spm.model").kind == "spm"
    assert load_tokenizer(bpe_dir / "vocab.json").kind == "bpe"


def test_missing_or_wrong_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="expected spm.model"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "spm.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="SentencePiece model"):
        load_tokenizer(bad)


def test_model_max_length_from_config(spm_dir, tmp_path):
    tok = load_tokenizer(spm_dir, model_max_length=128)
    tok.save_pretrained(tmp_path)
    assert load_tokenizer(tmp_path).model_max_length == 128
    assert len(load_tokenizer(tmp_path)("word " * 400, truncation=True)["input_ids"]) == 128
