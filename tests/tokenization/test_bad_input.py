"""Bad input: defined results where one exists, a ValueError naming the value where none does."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["spm", "bpe"])
def tok(request, spm_tok, bpe_tok):
    return spm_tok if request.param == "spm" else bpe_tok


@pytest.mark.parametrize("text", ["", " ", "\t\n  \r\n", "\x00\x01\x1f\x7f"])
def test_empty_whitespace_and_control_texts(tok, text):
    enc = tok(text, return_offsets_mapping=True)
    assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"][-1] == tok.sep_token_id
    assert len(enc["input_ids"]) == len(enc["attention_mask"]) == len(enc["offset_mapping"])
    assert all(0 <= s <= e <= len(text) for s, e in enc["offset_mapping"])
    if tok.kind == "spm":  # sentencepiece drops whitespace and these control characters entirely
        assert enc["input_ids"] == [1, 2] or text.startswith("\x00")


def test_empty_pair(tok):
    assert tok("", "")["input_ids"] == [1, 2, 2]
    assert tok("", "")["token_type_ids"] == [0, 0, 1]


def test_lone_surrogates_become_replacement_characters(tok):
    text = "bad \ud800 and \udfff end"
    enc = tok(text, return_offsets_mapping=True)
    clean = text.replace("\ud800", "\ufffd").replace("\udfff", "\ufffd")
    assert enc["input_ids"] == tok(clean)["input_ids"]
    assert enc["offset_mapping"] == tok(clean, return_offsets_mapping=True)["offset_mapping"]
    assert tok(["\ud83d\ude00", "ok"], padding=True)["input_ids"][1][:2] == [1, tok.encode("ok")[1]]


def test_text_far_longer_than_the_window(tok):
    text = "word " * 20_000
    full = tok(text)["input_ids"]
    assert len(full) > tok.model_max_length  # no truncation asked: every token is returned
    assert len(tok(text, truncation=True)["input_ids"]) == tok.model_max_length
    windows = tok(text, truncation=True, max_length=512, stride=128, return_overflowing_tokens=True)
    assert all(len(row) <= 512 for row in windows["input_ids"])
    assert set(windows["overflow_to_sample_mapping"]) == {0}
    n_inner = len(full) - 2
    assert len(windows["input_ids"]) == 1 + -(-(n_inner - 510) // (510 - 128))


def test_errors_name_the_value(tok):
    with pytest.raises(ValueError, match=r"stride 600 must be smaller than max_length 512"):
        tok("x " * 1000, truncation=True, max_length=512, stride=600, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match=r"max_length 2 leaves no room"):
        tok("hello", truncation=True, max_length=2)
    with pytest.raises(ValueError, match=r"truncation must be .* got 'shortest'"):
        tok("hello", truncation="shortest")
    with pytest.raises(ValueError, match=r"padding must be .* got 'left'"):
        tok("hello", padding="left")
    with pytest.raises(ValueError, match=r"text must be a str or a list of str, got NoneType None"):
        tok(None)
    with pytest.raises(ValueError, match=r"got int 5"):
        tok(5)
    with pytest.raises(ValueError, match=r"return_tensors='pt' needs rows of equal length"):
        tok(["a", "a b c d e f"], return_tensors="pt")
    with pytest.raises(ValueError, match=r"return_tensors must be None or 'pt', got 'np'"):
        tok("a", return_tensors="np")
    with pytest.raises(ValueError, match=r"got 2 text\(s\) in a batch and 1 text_pair"):
        tok(["a", "b"], ["c"])
    with pytest.raises(ValueError, match=rf"token id {tok.vocab_size} at position 1 is outside"):
        tok.decode([1, tok.vocab_size])
    with pytest.raises(ValueError, match=r"token id -1 at position 0"):
        tok.decode([-1])


def test_only_first_cannot_truncate_a_short_first_text(tok):
    with pytest.raises(ValueError, match=r"cannot truncate with strategy 'only_first' to max_length 8"):
        tok("a", "b " * 50, truncation="only_first", max_length=8)


def test_max_length_without_truncation_truncates_with_a_warning(tok):
    with pytest.warns(UserWarning, match="truncating"):
        ids = tok("word " * 100, max_length=10)["input_ids"]
    assert len(ids) == 10


def test_pair_windows_with_a_stride_larger_than_the_room_left(tok):
    with pytest.raises(ValueError, match=r"stride 4 is too large for max_length 10"):
        tok(
            "one two three four five six",
            "seven eight nine ten eleven",
            truncation=True,
            max_length=10,
            stride=4,
            return_overflowing_tokens=True,
        )
    # the tokenizer stays usable afterwards
    assert tok("a b")["input_ids"] == tok.encode("a b")
