"""Property tests: never crashing on arbitrary unicode, round trips, agreement with sentencepiece."""

from __future__ import annotations

import unicodedata

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
any_text = st.text(st.characters(), max_size=60)  # surrogates included
SPECIAL_STRINGS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")


def _grapheme_safe(ch: str) -> bool:
    # The tokenizers library's precompiled normaliser drops a combining mark that follows a character the
    # character map expands ("ﬁ\u0301"); sentencepiece keeps it (a documented gap, see tokenization/spm.py).
    # Marks and format characters are left out of the sentencepiece comparison for that reason.
    return unicodedata.category(ch) not in ("Mn", "Mc", "Me", "Cf", "Cs", "Co", "Cn") and not (
        "\uff9e" <= ch <= "\uff9f" or "\U0001f3fb" <= ch <= "\U0001f3ff"
    )


spm_comparable = st.text(st.characters(exclude_categories=("Cs",)).filter(_grapheme_safe), max_size=60)


@SETTINGS
@given(
    text=any_text,
    pair=st.one_of(st.none(), any_text),
    max_length=st.integers(8, 40),
    stride=st.integers(0, 4),
)
def test_never_crashes(spm_tok, bpe_tok, text, pair, max_length, stride):
    for tok in (spm_tok, bpe_tok):
        try:
            enc = tok(
                text,
                pair,
                truncation=True,
                max_length=max_length,
                stride=stride,
                return_overflowing_tokens=True,
                return_offsets_mapping=True,
                padding=True,
            )
        except ValueError as e:
            # the one defined refusal: windows of a pair whose truncated part is not longer than the stride
            assert pair is not None and f"stride {stride} is too large" in str(e)
            continue
        assert all(len(row) == len(enc["input_ids"][0]) <= max_length for row in enc["input_ids"])
        assert all(0 <= s <= e for row in enc["offset_mapping"] for s, e in row)
        for row in enc["input_ids"]:
            tok.decode(row)


@SETTINGS
@given(text=spm_comparable)
def test_spm_ids_equal_sentencepiece(spm_tok, sp, text):
    """Equal ids, except where two segmentations have exactly the same model score: sentencepiece then picks
    by the float32 rounding of its Viterbi sums ("lll" -> ll+l), the `tokenizers` library by its float64 sums
    (l+ll). Such a tie must cover the same text with the same total score; any other difference fails."""
    assume(
        not any(s in text for s in SPECIAL_STRINGS)
        and not any(s in unicodedata.normalize("NFKC", text) for s in SPECIAL_STRINGS)
    )
    ours, theirs = spm_tok.encode(text, add_special_tokens=False), sp.encode(text)
    if ours != theirs:
        assert "".join(sp.id_to_piece(i) for i in ours) == "".join(sp.id_to_piece(i) for i in theirs)
        score_ours, score_theirs = sum(sp.get_score(i) for i in ours), sum(sp.get_score(i) for i in theirs)
        assert abs(score_ours - score_theirs) <= 1e-5 * max(1.0, abs(score_theirs)), (ours, theirs)


def test_spm_score_ties_are_the_only_difference(spm_tok, sp):
    """Runs of one character are where exact ties occur; the tie rule above is what separates the two."""
    for text in ("lll", "lllll", "00000", "aaaa", "----"):
        ours, theirs = spm_tok.encode(text, add_special_tokens=False), sp.encode(text)
        assert "".join(sp.id_to_piece(i) for i in ours) == "".join(sp.id_to_piece(i) for i in theirs)
        assert abs(sum(map(sp.get_score, ours)) - sum(map(sp.get_score, theirs))) <= 1e-5 * len(ours)


# random unicode meets the small test vocabulary's unknown token often: on some seeds most draws are filtered
# out, which Hypothesis's health check treated as an error (a flaky failure); the examples that remain are checked
@settings(SETTINGS, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(text=spm_comparable)
def test_spm_round_trip_gives_the_normalised_text(spm_tok, sp, text):
    assume(not any(s in unicodedata.normalize("NFKC", text) for s in SPECIAL_STRINGS))
    ids = spm_tok.encode(text)
    assume(spm_tok.unk_token_id not in ids)
    assert spm_tok.decode(ids, skip_special_tokens=True) == sp.decode(sp.encode(text))


@SETTINGS
@given(text=st.text(st.characters(exclude_categories=("Cs",)), max_size=60))
def test_bpe_round_trip_is_exact(bpe_tok, text):
    assume(not any(s in text for s in SPECIAL_STRINGS))
    assert bpe_tok.decode(bpe_tok.encode(text), skip_special_tokens=True) == text
