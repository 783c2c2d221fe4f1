import numpy as np
import pytest

from debertakit.data.masking import (
    IGNORE_INDEX,
    MaskingConfig,
    Vocabulary,
    mask_row,
    select_spans,
    select_targets,
)

V = 1000
SPECIAL = (0, 1, 2, 3, 4)
VOCAB = Vocabulary.build(V, mask_id=4, special_ids=SPECIAL)


def rows(n_rows=400, n=128, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n_rows):
        tokens = rng.integers(5, V, size=n)
        tokens[0], tokens[-1] = 1, 2
        tokens[rng.integers(1, n - 1, size=3)] = 2  # separators inside the row
        tokens[n - 10 :] = 0  # padding
        yield tokens, np.isin(tokens, SPECIAL)


def test_mlm_statistics_15_percent_and_80_10_10():
    rng = np.random.default_rng(1)
    counts = dict(candidates=0, selected=0, masked=0, random=0, kept=0)
    for tokens, special in rows():
        inputs, labels = mask_row(tokens, special, MaskingConfig(), VOCAB, rng)
        sel = labels != IGNORE_INDEX
        assert not sel[special].any(), "a special token was selected"
        assert (labels[sel] == tokens[sel]).all()
        assert (inputs[~sel] == tokens[~sel]).all()
        counts["candidates"] += int((~special).sum())
        counts["selected"] += int(sel.sum())
        counts["masked"] += int((inputs[sel] == 4).sum())
        counts["kept"] += int((inputs[sel] == tokens[sel]).sum())
        replaced = sel & (inputs != 4) & (inputs != tokens)
        counts["random"] += int(replaced.sum())
        assert not np.isin(inputs[replaced], SPECIAL).any(), "a random replacement is a special token"
    assert abs(counts["selected"] / counts["candidates"] - 0.15) < 0.005
    s = counts["selected"]
    assert abs(counts["masked"] / s - 0.8) < 0.015
    assert abs(counts["random"] / s - 0.1) < 0.015
    assert abs(counts["kept"] / s - 0.1) < 0.015


def test_rtd_masking_replaces_every_target_with_mask():
    rng = np.random.default_rng(2)
    cfg = MaskingConfig().for_rtd()
    for tokens, special in rows(50):
        inputs, labels = mask_row(tokens, special, cfg, VOCAB, rng)
        sel = labels != IGNORE_INDEX
        assert sel.any() and (inputs[sel] == 4).all() and (inputs[~sel] == tokens[~sel]).all()


def test_span_masking_spans_of_at_most_3_contiguous_units():
    rng = np.random.default_rng(3)
    cfg = MaskingConfig(max_span=3)
    lengths, total, cand = [], 0, 0
    for tokens, special in rows(200):
        spans = select_spans(tokens, special, cfg, rng)
        covered = np.zeros(tokens.size, dtype=int)
        for b, e in spans:
            assert 1 <= e - b <= 3
            assert not special[b:e].any()
            covered[b:e] += 1
            lengths.append(e - b)
        assert covered.max() <= 1, "spans overlap"
        total += covered.sum()
        cand += (~special).sum()
    assert set(lengths) == {1, 2, 3}
    assert abs(total / cand - 0.15) < 0.01
    # lengths drawn with probability ∝ 1/n: shorter spans are the most common
    assert lengths.count(1) > lengths.count(2) > lengths.count(3)


def test_whole_word_masking_selects_complete_words():
    rng = np.random.default_rng(4)
    word_start = np.random.default_rng(5).random(V) < 0.5
    word_start[list(SPECIAL)] = True
    cfg = MaskingConfig(whole_word=True)
    for tokens, special in rows(100):
        sel = select_targets(tokens, special, cfg, rng, word_start)
        starts = word_start[tokens] | special
        word = np.cumsum(starts)  # word id of every position
        for w in np.unique(word[sel]):
            members = (word == w) & ~special
            assert sel[members].all(), "part of a word was left unmasked"


def test_masking_options_are_validated():
    with pytest.raises(ValueError, match="mask_prob=1.5"):
        MaskingConfig(mask_prob=1.5)
    with pytest.raises(ValueError, match="max_span=0"):
        MaskingConfig(max_span=0)
    with pytest.raises(ValueError, match="word-start"):
        tokens, special = next(rows(1))
        select_targets(tokens, special, MaskingConfig(whole_word=True), np.random.default_rng(0), None)
