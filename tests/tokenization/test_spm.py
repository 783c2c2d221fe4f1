"""SentencePiece tokenizer: parity with the sentencepiece library and with Hugging Face's DebertaV2TokenizerFast."""

from __future__ import annotations

import unicodedata

import pytest
from conftest import EDGE_CASES, glue_pairs, nfkc_stable, squad_examples


def _invisible(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")


def covered(text: str, offsets) -> list[str]:
    """The characters each token covers, without surrounding whitespace or removed control characters (the
    conventions differ only in where those go)."""
    out = []
    for s, e in offsets:
        while s < e and _invisible(text[s]):
            s += 1
        while e > s and _invisible(text[e - 1]):
            e -= 1
        out.append(text[s:e])
    return out


def covered_by_tokens(text: str, offsets, tokens: list[str]) -> list[str | None]:
    """`covered`, with None for a lone "▁" piece (the dummy prefix or a space: it covers no character of its own,
    and each implementation attaches it to a different neighbour)."""
    return [None if t == "▁" else c for c, t in zip(covered(text, offsets), tokens)]


def test_special_ids_and_vocab_size(spm_tok, sp):
    n = sp.get_piece_size()
    assert (spm_tok.pad_token_id, spm_tok.cls_token_id, spm_tok.sep_token_id, spm_tok.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert spm_tok.mask_token_id == n and spm_tok.vocab_size == n + 1 == len(spm_tok)
    assert spm_tok.convert_ids_to_tokens([0, 1, 2, 3, n]) == ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    assert spm_tok.model_max_length == 512


def test_ids_match_sentencepiece_on_real_lines_and_edge_cases(spm_tok, sp, real_lines):
    texts = real_lines + EDGE_CASES
    assert len(texts) > 5000
    ours = spm_tok(texts, add_special_tokens=False)["input_ids"]
    ref = sp.encode(texts)
    mismatches = [(t, a, b) for t, a, b in zip(texts, ours, ref) if a != b]
    assert not mismatches, mismatches[:3]


def test_special_tokens_wrap_sentencepiece_ids(spm_tok, sp):
    a, b = "The first sentence.", "And the second one."
    enc = spm_tok(a, b)
    ids_a, ids_b = sp.encode(a), sp.encode(b)
    assert enc["input_ids"] == [1, *ids_a, 2, *ids_b, 2]
    assert enc["token_type_ids"] == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
    assert enc["attention_mask"] == [1] * len(enc["input_ids"])


def test_offsets_match_sentencepiece(spm_tok, sp, real_lines):
    """sentencepiece's own piece offsets (bytes -> characters) cover the same characters as ours."""
    checked = 0
    for text in real_lines[:1500] + EDGE_CASES:
        if not nfkc_stable(text):
            continue  # sentencepiece gives expanded characters an empty span; we give the source character
        proto = sp.encode(text, return_type="proto")
        byte_to_char = {}
        pos = 0
        for i, ch in enumerate(text):
            byte_to_char[pos] = i
            pos += len(ch.encode("utf-8"))
        byte_to_char[pos] = len(text)
        ref = [(byte_to_char[p.begin], byte_to_char[p.end]) for p in proto.pieces]
        ours = spm_tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        # A piece that is a lone "▁" (the dummy prefix) has an empty span in sentencepiece.
        keep = [i for i, p in enumerate(proto.pieces) if p.piece != "▁"]
        got, want = covered(text, ours), covered(text, ref)
        assert [got[i] for i in keep] == [want[i] for i in keep], text
        checked += 1
    assert checked > 1400


def _hf_lists(enc, keys=("input_ids", "token_type_ids", "attention_mask")):
    return {k: enc[k] for k in keys}


def same_normalisation(spm_tok, hf_spm, *texts: str) -> bool:
    """Whether transformers 5.x's normaliser (NFC + whitespace rules) and sentencepiece's character map (ours)
    give the same text; only there can the two tokenizers agree."""
    hf, ours = hf_spm.backend_tokenizer.normalizer, spm_tok.backend.normalizer
    return all(hf.normalize_str(t).strip(" ") == ours.normalize_str(t) for t in texts)


def test_matches_hf_fast_on_real_lines(spm_tok, hf_spm, real_lines):
    assert all(same_normalisation(spm_tok, hf_spm, t) for t in real_lines if nfkc_stable(t))
    texts = [t for t in real_lines + EDGE_CASES if same_normalisation(spm_tok, hf_spm, t)]
    assert len(texts) > 4500
    ours = spm_tok(texts, return_offsets_mapping=True)
    ref = hf_spm(texts, return_offsets_mapping=True)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[key] == ref[key], key
    for i, (text, a, b) in enumerate(zip(texts, ours["offset_mapping"], ref["offset_mapping"])):
        tokens = ours.tokens(i)
        assert covered_by_tokens(text, a, tokens) == covered_by_tokens(text, b, tokens), text


@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
def test_pair_truncation_matches_hf(spm_tok, hf_spm, strategy):
    pairs = [(a, b) for a, b in glue_pairs(800) if same_normalisation(spm_tok, hf_spm, a, b)]
    first, second = [a for a, _ in pairs], [b for _, b in pairs]
    max_length = 64 if strategy == "longest_first" else 96
    kw = dict(truncation=strategy, max_length=max_length, padding="max_length")
    if strategy == "longest_first":
        ours, ref = spm_tok(first, second, **kw), hf_spm(first, second, **kw)
    else:
        # only_first / only_second fail when the other text alone is too long: keep the pairs where it fits
        other = second if strategy == "only_first" else first
        keep = [i for i, t in enumerate(other) if len(spm_tok.tokenize(t)) < max_length - 30]
        a, b = [first[i] for i in keep], [second[i] for i in keep]
        ours, ref = spm_tok(a, b, **kw), hf_spm(a, b, **kw)
    assert len(ours["input_ids"]) > 300
    assert _hf_lists(ours) == _hf_lists(ref)
    assert all(len(row) == max_length for row in ours["input_ids"])


def test_overflow_windows_with_stride_match_hf_and_sentencepiece(spm_tok, hf_spm, sp):
    examples = [(q, c) for q, c in squad_examples(400) if same_normalisation(spm_tok, hf_spm, q, c)]
    questions, contexts = [q for q, _ in examples], [c for _, c in examples]
    kw = dict(
        truncation="only_second",
        max_length=96,
        stride=24,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )
    ours, ref = spm_tok(questions, contexts, **kw), hf_spm(questions, contexts, **kw)
    assert ours["overflow_to_sample_mapping"] == ref["overflow_to_sample_mapping"]
    assert _hf_lists(ours) == _hf_lists(ref)
    assert len(ours["input_ids"]) > len(examples)  # some contexts do overflow
    for row, (a, b) in enumerate(zip(ours["offset_mapping"], ref["offset_mapping"])):
        context = contexts[ours["overflow_to_sample_mapping"][row]]
        seq = ours.sequence_ids(row)
        a_ctx = [o for o, s in zip(a, seq) if s == 1]
        b_ctx = [tuple(o) for o, s in zip(b, seq) if s == 1]
        tokens = [t for t, s in zip(ours.tokens(row), seq) if s == 1]
        assert covered_by_tokens(context, a_ctx, tokens) == covered_by_tokens(context, b_ctx, tokens)

    # Independent check against sentencepiece: windows are consecutive slices overlapping by `stride`.
    by_sample: dict[int, list[list[int]]] = {}
    for row, sample in enumerate(ours["overflow_to_sample_mapping"]):
        seq = ours.sequence_ids(row)
        by_sample.setdefault(sample, []).append([i for i, s in zip(ours["input_ids"][row], seq) if s == 1])
    for sample, windows in by_sample.items():
        full = sp.encode(contexts[sample])
        start = 0
        for k, window in enumerate(windows):
            assert window == full[start : start + len(window)]
            start += len(window) - 24
            if k == len(windows) - 1:
                assert start + 24 == len(full)


def test_batch_padding_and_tensors_match_hf(spm_tok, hf_spm):
    texts = ["short", "a somewhat longer sentence with more pieces in it", ""]
    ours = spm_tok(texts, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    ref = hf_spm(texts, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    for key in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask"):
        assert ours[key].tolist() == ref[key].tolist(), key
    assert ours["input_ids"].dtype.is_floating_point is False
    assert spm_tok(texts, padding=True, pad_to_multiple_of=8)["input_ids"][0].__len__() % 8 == 0


def test_nfkc_is_applied_as_sentencepiece_does_unlike_transformers_5(spm_tok, sp, hf_spm):
    """The released vocabularies normalise with NFKC (sentencepiece's nmt_nfkc): "ﬁ" -> "fi"."""
    for text in ["ﬁnance", "ＡＢＣ１２３", "½ ™"]:
        ours = spm_tok.encode(text, add_special_tokens=False)
        assert ours == sp.encode(text)
        assert ours == sp.encode(__import__("unicodedata").normalize("NFKC", text))
    # transformers 5.x does not apply the character map (REFERENCE.md §2): its ids differ here
    assert hf_spm.encode("ﬁnance", add_special_tokens=False) != sp.encode("ﬁnance")


def test_decode_round_trip_matches_sentencepiece(spm_tok, sp, real_lines):
    checked = 0
    for text in real_lines[:2000] + EDGE_CASES:
        ids = spm_tok.encode(text)
        if spm_tok.unk_token_id in ids:
            continue  # sentencepiece writes " ⁇ " for an unknown piece, we write [UNK] (or nothing when skipping)
        assert spm_tok.decode(ids, skip_special_tokens=True) == sp.decode(sp.encode(text)), text
        checked += 1
    assert checked > 1000
    assert spm_tok.decode(spm_tok.encode("日本", add_special_tokens=False)) == "[UNK]"
    ids = spm_tok.encode("Hello world")
    assert spm_tok.decode(ids) == "[CLS] Hello world[SEP]"
    assert spm_tok.batch_decode([ids, ids], skip_special_tokens=True) == ["Hello world"] * 2


def test_mask_token_in_text(spm_tok, hf_spm):
    enc = spm_tok("Paris is the [MASK] of France.")
    assert enc["input_ids"].count(spm_tok.mask_token_id) == 1
    assert enc["input_ids"] == hf_spm("Paris is the [MASK] of France.")["input_ids"]
    assert spm_tok.tokenize("the [MASK] of") == ["▁the", "[MASK]", "▁of"]


def test_word_ids_and_pretokenized_words(spm_tok, hf_spm):
    words = ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."]
    ours = spm_tok(words, is_split_into_words=True)
    ref = hf_spm(words, is_split_into_words=True)
    assert ours["input_ids"] == ref["input_ids"]
    assert ours.word_ids() == ref.word_ids()
    assert ours["input_ids"] == spm_tok(" ".join(words))["input_ids"]
    assert ours.word_ids()[0] is None and ours.word_ids()[-1] is None
    assert sorted({w for w in ours.word_ids() if w is not None}) == list(range(len(words)))


def test_convert_tokens_and_ids(spm_tok):
    assert spm_tok.convert_tokens_to_ids("[MASK]") == spm_tok.mask_token_id
    assert spm_tok.convert_tokens_to_ids(["▁the", "no-such-piece"]) == [spm_tok.get_vocab()["▁the"], 3]
    assert spm_tok.convert_ids_to_tokens(1) == "[CLS]"
