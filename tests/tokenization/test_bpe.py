"""GPT-2 BPE (v1) tokenizer: DeBERTa v1 id layout, parity with Hugging Face's DebertaTokenizerFast."""

from __future__ import annotations

import json

import pytest
from conftest import EDGE_CASES, glue_pairs, squad_examples

from debertakit.tokenization import load_tokenizer


def test_layout_from_gpt2_files(bpe_tok, data_dir):
    encoder = json.loads((data_dir / "bpe-gpt2/encoder.json").read_text(encoding="utf-8"))
    assert bpe_tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    assert bpe_tok.mask_token_id == len(encoder) + 4 == bpe_tok.vocab_size - 1
    for token in ["Hello", "Ġworld", "!"]:  # GPT-2's order is kept after the four special tokens
        assert bpe_tok.convert_tokens_to_ids(token) == encoder[token] + 4


def test_single_texts_match_hf(bpe_tok, hf_bpe, real_lines):
    texts = real_lines + EDGE_CASES
    ours = bpe_tok(texts, return_offsets_mapping=True)
    ref = hf_bpe(texts, return_offsets_mapping=True)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[key] == ref[key], key
    assert ours["offset_mapping"] == [[tuple(o) for o in row] for row in ref["offset_mapping"]]


def test_pairs_follow_the_released_layout(bpe_tok, hf_bpe):
    """[CLS] A [SEP] B [SEP] with types 0/1 (official code, transformers 4.x); 5.x adds a second [SEP]."""
    pairs = glue_pairs(300)
    first, second = [a for a, _ in pairs], [b for _, b in pairs]
    ours, ref = bpe_tok(first, second), hf_bpe(first, second)
    for a, b, ids, ref_ids, types in zip(
        first, second, ours["input_ids"], ref["input_ids"], ours["token_type_ids"]
    ):
        ids_a = bpe_tok.encode(a, add_special_tokens=False)
        ids_b = bpe_tok.encode(b, add_special_tokens=False)
        assert ids == [1, *ids_a, 2, *ids_b, 2]
        assert types == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
        cut = len(ids_a) + 2
        assert ref_ids[:cut] + ref_ids[cut + 1 :] == ids and ref_ids[cut] == 2


def test_overflow_windows_match_hf(bpe_tok, hf_bpe):
    examples = squad_examples(200)
    contexts = [c for _, c in examples]
    kw = dict(
        truncation=True, max_length=64, stride=16, return_overflowing_tokens=True, return_offsets_mapping=True
    )
    ours, ref = bpe_tok(contexts, **kw), hf_bpe(contexts, **kw)
    assert ours["overflow_to_sample_mapping"] == ref["overflow_to_sample_mapping"]
    assert len(ours["input_ids"]) > 2 * len(contexts)
    for key in ("input_ids", "attention_mask"):
        assert ours[key] == ref[key]
    assert ours["offset_mapping"] == [[tuple(o) for o in row] for row in ref["offset_mapping"]]


def test_round_trip_is_lossless(bpe_tok, real_lines):
    for text in real_lines[:1000] + EDGE_CASES:
        assert bpe_tok.decode(bpe_tok.encode(text), skip_special_tokens=True) == text


def test_mask_takes_the_space_before_it(bpe_tok, hf_bpe):
    text = "The capital of France is [MASK]."
    ids = bpe_tok.encode(text)
    assert ids == hf_bpe(text)["input_ids"]
    assert bpe_tok.convert_ids_to_tokens(ids)[-4:] == ["Ġis", "[MASK]", ".", "[SEP]"]


def test_pretokenized_words_get_the_word_start_marker(bpe_tok):
    words = ["EU", "rejects", "Germanic", "call"]
    enc = bpe_tok(words, is_split_into_words=True)
    assert enc.tokens()[1:-1] == bpe_tok.tokenize(" EU rejects Germanic call")
    assert enc.tokens()[1] == "ĠEU"
    assert enc.word_ids() == [None, 0, 1, 2, 2, 3, None]


def test_fairseq_dict_orders_the_vocabulary(tmp_path, data_dir):
    """With a fairseq dict.txt (as the released checkpoints were built), ids follow its order."""
    for name in ("encoder.json", "vocab.bpe"):
        (tmp_path / name).symlink_to(data_dir / "bpe-gpt2" / name)
    encoder = json.loads((data_dir / "bpe-gpt2/encoder.json").read_text(encoding="utf-8"))
    order = [encoder["Ġworld"], encoder["Hello"], encoder["!"]]
    (tmp_path / "dict.txt").write_text("".join(f"{i} 100\n" for i in order) + "madeupword0000 0\n")
    tok = load_tokenizer(tmp_path)
    assert tok.encode("Hello world!") == [1, 5, 4, 6, 2]
    assert tok.convert_tokens_to_ids("madeupword0000") == 7
    assert tok.vocab_size == len(encoder) + 5 + 1  # specials, one extra entry, [MASK]


def test_rejects_a_vocabulary_with_a_wrong_layout(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"[PAD]": 0, "[CLS]": 2, "[SEP]": 1, "[UNK]": 3, "a": 4}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match=r"special tokens"):
        load_tokenizer(tmp_path)
