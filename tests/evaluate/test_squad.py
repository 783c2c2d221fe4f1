"""SQuAD scoring (official definitions on tricky answers, v2.0 no-answer thresholding) and post-processing of
overflowing windows through offset mappings."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from debertakit.data.tasks import Answer, QAExample, read_squad
from debertakit.evaluate.squad import (
    best_threshold,
    exact_match,
    f1_score,
    normalize_answer,
    postprocess_qa,
    squad_evaluate,
)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

# ---------------------------------------------------------------- normalisation, EM, F1


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("The Denver Broncos", "denver broncos"),
        ("  an   apple\tpie\n", "apple pie"),
        ("Theater of the absurd", "theater of absurd"),  # articles only as whole words
        ("A.B.C.", "abc"),  # punctuation removed before articles are looked for
        ("the-end", "theend"),
        ("a", ""),
        ("$1.8 billion!", "18 billion"),
        ("l'été à Paris", "lété à paris"),  # non-ASCII letters kept, lower-cased
        ("“quoted” — text", "“quoted” — text"),  # typographic quotes and dashes are not ASCII punctuation
        ("non\u00a0breaking space", "non breaking space"),
        ("ANSWER", "answer"),
        ("", ""),
    ],
)
def test_normalize_answer(text, normalised):
    assert normalize_answer(text) == normalised


@pytest.mark.parametrize(
    "prediction, gold, em, f1",
    [
        ("the Denver Broncos", "Denver Broncos", 1, 1.0),
        ("Denver", "Denver Broncos", 0, 2 / 3),  # P = 1, R = 1/2
        ("broncos denver", "Denver Broncos", 0, 1.0),  # bag of tokens
        ("$1.8 billion", "1.8 billion", 1, 1.0),
        ("x x x y", "x y", 0, 2 / 3),  # repeated tokens count once per gold occurrence: P = 2/4, R = 1
        ("Denver Broncos.", "denver broncos", 1, 1.0),
        ("Santa Clara, California", "Levi's Stadium", 0, 0.0),
        ("", "Denver", 0, 0.0),
        ("the", "", 1, 1.0),  # v2.0: both normalise to no tokens
        ("", "", 1, 1.0),
    ],
)
def test_exact_match_and_f1(prediction, gold, em, f1):
    assert exact_match(prediction, gold) == em
    assert f1_score(prediction, gold) == pytest.approx(f1)


def test_v1_f1_of_empty_answers_is_zero():
    assert f1_score("", "", version="1.1") == 0.0 and f1_score("", "") == 1.0
    assert f1_score("Denver", "Denver Broncos", version="1.1") == pytest.approx(2 / 3)


def ex(qid, answers, context="Super Bowl 50 was won by the Denver Broncos at Levi's Stadium."):
    return QAExample(
        qid, "Q?", context, tuple(Answer(a, max(context.find(a), 0)) for a in answers), not answers
    )


def test_squad_v1_max_over_gold_and_missing():
    examples = [
        ex("q1", ["Denver Broncos", "the Denver Broncos", "Broncos"]),
        ex("q2", ["Levi's Stadium"]),
        ex("q3", ["Super Bowl 50"]),
    ]
    preds = {"q1": "Broncos", "q2": "Stadium", "unknown": "ignored"}
    out = squad_evaluate(examples, preds)
    # q1: EM 1 / F1 1 (third gold); q2: EM 0, F1 = 2 * (1 * 1/2) / (3/2) = 2/3 ("levis stadium"); q3 missing.
    assert out == {
        "exact_match": pytest.approx(100 / 3),
        "f1": pytest.approx(100 * (1 + 2 / 3) / 3),
        "total": 3,
        "missing": 1,
    }


def test_squad_v2_keys_and_empty_predictions():
    examples = [ex("a", ["Denver Broncos"]), ex("b", []), ex("c", [])]
    out = squad_evaluate(examples, {"a": "Denver Broncos", "b": "", "c": "Stadium"})
    assert out["exact"] == pytest.approx(200 / 3) and out["exact_match"] == out["exact"]
    assert (out["HasAns_exact"], out["HasAns_total"]) == (100.0, 1)
    assert (out["NoAns_exact"], out["NoAns_f1"], out["NoAns_total"]) == (50.0, 50.0, 2)
    assert "best_exact" not in out  # only with na_probs, like the official script


def test_squad_v2_thresholding_known_answer():
    examples = [ex("q1", ["Denver Broncos"]), ex("q2", []), ex("q3", ["Levi's Stadium"]), ex("q4", [])]
    preds = {"q1": "Denver Broncos", "q2": "Broncos", "q3": "Super Bowl", "q4": ""}
    na = {"q1": 0.1, "q2": 0.9, "q3": 0.5, "q4": 0.2}
    out = squad_evaluate(examples, preds, na_probs=na)
    assert out["exact"] == 50.0  # threshold 1.0: nothing is forced to no-answer; q1 and q4 right
    # Answer questions in order of na prob: start 2 (q2, q4 unanswered = right), q1 +1 -> 3 (best at 0.1),
    # q4 +0, q3 +0 (wrong answer), q2 -1.
    assert (out["best_exact"], out["best_exact_thresh"]) == (75.0, 0.1)
    at_best = squad_evaluate(examples, preds, na_probs=na, na_prob_thresh=0.1)
    assert at_best["exact"] == 75.0 and at_best["NoAns_exact"] == 100.0 and at_best["HasAns_exact"] == 50.0
    with pytest.raises(ValueError, match="na_probs has no score for 1 question"):
        squad_evaluate(examples, preds, na_probs={k: v for k, v in na.items() if k != "q3"})


@pytest.mark.parametrize("seed", range(5))
def test_best_threshold_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 30
    has = {f"q{i}": bool(rng.random() < 0.6) for i in range(n)}
    preds = {q: ("x" if rng.random() < 0.8 else "") for q in has}
    scores = {q: (float(rng.random() < 0.5) if has[q] else float(not preds[q])) for q in has}
    na = {q: float(p) for q, p in zip(has, rng.permutation(n) / n)}  # distinct scores
    best, thresh = best_threshold(preds, scores, na, has)

    def score_at(t):  # answered iff na <= t, otherwise predicted unanswerable
        return sum(scores[q] if na[q] <= t else float(not has[q]) for q in has)

    candidates = [-1.0, *na.values()]
    assert best == pytest.approx(100 * max(score_at(t) for t in candidates) / n)
    if best > 100 * score_at(-1.0) / n:
        assert best == pytest.approx(100 * score_at(thresh) / n)


# ---------------------------------------------------------------- post-processing


CONTEXT = "The quick brown fox jumps over the lazy dog near the river bank."
WORDS = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", CONTEXT)]  # 14 tokens incl. "."


def window(first, last, question_tokens=3):
    """[CLS] q q q [SEP] context tokens first..last-1 [SEP]: offsets, mask and token ids of context words."""
    offsets = [(0, 0)] + [None] * question_tokens + [(0, 0)] + WORDS[first:last] + [(0, 0)]
    mask = [False] * (question_tokens + 2) + [True] * (last - first) + [False]
    return offsets, mask, question_tokens + 2 - first  # position of word i is i + shift


def logits_for(n_tokens, peaks):
    x = np.full(n_tokens, -5.0)
    for pos, value in peaks.items():
        x[pos] = value
    return x


def test_answer_in_second_window():
    (o1, m1, _), (o2, m2, s2) = window(0, 7), window(5, 14)
    start = [logits_for(len(o1), {}), logits_for(len(o2), {7 + s2: 6.0})]  # "lazy" = word 7
    end = [logits_for(len(o1), {}), logits_for(len(o2), {8 + s2: 5.0})]  # "dog" = word 8
    (pred,) = postprocess_qa(start, end, [o1, o2], [m1, m2], [0, 0], [CONTEXT])
    assert (pred.text, pred.start, pred.end) == ("lazy dog", 35, 43)
    assert pred.score == 11.0 and pred.n_best[0].window == 1 and math.isnan(pred.null_score)
    assert sum(c.probability for c in pred.n_best) == pytest.approx(1.0)


def test_answer_spanning_window_boundary_comes_from_the_window_holding_it():
    # "fox jumps over" = words 3..5. Window 0 holds words 0..4 (cut after "jumps"), window 1 words 3..13.
    (o1, m1, s1), (o2, m2, s2) = window(0, 5), window(3, 14)
    start = [logits_for(len(o1), {3 + s1: 4.0}), logits_for(len(o2), {3 + s2: 3.5})]
    end = [logits_for(len(o1), {4 + s1: 1.0}), logits_for(len(o2), {5 + s2: 4.0})]
    (pred,) = postprocess_qa(start, end, [o1, o2], [m1, m2], [0, 0], [CONTEXT])
    assert pred.text == "fox jumps over" and pred.n_best[0].window == 1
    assert [c.text for c in pred.n_best[:2]] == ["fox jumps over", "fox jumps"]


def test_question_tokens_order_and_length_limits():
    offsets, mask, shift = window(0, 14)
    # Question tokens 1 and 2 have the highest logits; the best context end (word 8) precedes the best start
    # (word 9); words 2..4 ("brown fox jumps", 3 tokens) score 3 + 3 = 6.
    start = logits_for(len(offsets), {1: 50.0, 2 + shift: 3.0, 9 + shift: 9.0})
    end = logits_for(len(offsets), {2: 50.0, 4 + shift: 3.0, 8 + shift: 9.0})
    (pred,) = postprocess_qa([start], [end], [offsets], [mask], [0], [CONTEXT], max_answer_length=3)
    assert (pred.text, pred.score) == ("brown fox jumps", 6.0)
    # At most 2 tokens: "brown fox jumps" is out; the best is 4.0 (a -5 logit with a 9 one).
    (short,) = postprocess_qa([start], [end], [offsets], [mask], [0], [CONTEXT], max_answer_length=2)
    assert short.score == 4.0 and short.text in {"near", "dog", "lazy dog", "near the"}
    assert all(len(re.findall(r"\w+|[^\w\s]", c.text)) <= 2 for c in short.n_best)
    assert all(c.start >= WORDS[0][0] for c in short.n_best)


def test_no_answer_and_threshold():
    (o1, m1, s1), (o2, m2, s2) = window(0, 7), window(5, 14)
    start = [logits_for(len(o1), {0: 2.0, 1 + s1: 1.0}), logits_for(len(o2), {0: 1.0, 7 + s2: 2.0})]
    end = [logits_for(len(o1), {0: 2.0, 2 + s1: 1.0}), logits_for(len(o2), {0: 1.5, 8 + s2: 2.0})]
    kwargs = {"window_example": [0, 0], "contexts": [CONTEXT], "null_index": 0}
    (pred,) = postprocess_qa(start, end, [o1, o2], [m1, m2], **kwargs)
    # Null score: min over windows (4.0, 2.5) = 2.5 < best span "lazy dog" 4.0 -> answer.
    assert pred.null_score == 2.5 and pred.null_score_diff == -1.5 and pred.text == "lazy dog"
    (pred,) = postprocess_qa(start, end, [o1, o2], [m1, m2], **kwargs, null_threshold=-2.0)
    assert (pred.text, pred.start, pred.end) == ("", -1, -1) and pred.n_best[0].text == "lazy dog"
    start[1][0] = end[1][0] = 3.0  # null scores 4.0 and 6.0: min 4.0 == best span: not above 0
    (pred,) = postprocess_qa(start, end, [o1, o2], [m1, m2], **kwargs)
    assert pred.text == "lazy dog"
    start[0][0] = 2.5  # null 4.5 > 4.0
    (pred,) = postprocess_qa(start, end, [o1, o2], [m1, m2], **kwargs)
    assert pred.text == "" and pred.null_score_diff == pytest.approx(0.5)


def test_overlap_duplicates_kept_once_and_several_examples():
    (o1, m1, s1), (o2, m2, s2) = window(0, 9), window(5, 14)
    start = [logits_for(len(o1), {7 + s1: 2.0}), logits_for(len(o2), {7 + s2: 3.0})]
    end = [logits_for(len(o1), {8 + s1: 2.0}), logits_for(len(o2), {8 + s2: 3.0})]
    other = "Short one."
    o3 = [(0, 0), (0, 5), (6, 9), (9, 10), (0, 0)]
    m3 = [False, True, True, True, False]
    preds = postprocess_qa(
        [*start, logits_for(5, {2: 1.0})],
        [*end, logits_for(5, {3: 1.0})],
        [o1, o2, o3],
        [m1, m2, m3],
        [0, 0, 1],
        [CONTEXT, other],
    )
    assert [p.text for p in preds] == ["lazy dog", "one."]
    texts = [c.text for c in preds[0].n_best]
    assert texts.count("lazy dog") == 1 and preds[0].n_best[0].score == 6.0


@pytest.mark.parametrize("seed", range(10))
def test_n_best_equals_brute_force_over_all_spans(seed):
    """Random logits over three overlapping windows: the n-best list equals the best spans found by trying every
    (start, end) pair of context tokens in every window, each span counted once at its best score."""
    rng = np.random.default_rng(seed)
    wins = [window(0, 7), window(4, 11), window(8, 14)]
    start = [rng.normal(size=len(o)) for o, _, _ in wins]
    end = [rng.normal(size=len(o)) for o, _, _ in wins]
    n_best, max_len = 5, 4
    (pred,) = postprocess_qa(
        start,
        end,
        [o for o, _, _ in wins],
        [m for _, m, _ in wins],
        [0, 0, 0],
        [CONTEXT],
        n_best=n_best,
        max_answer_length=max_len,
    )
    best = {}
    for w, (o, m, _) in enumerate(wins):
        for i in range(len(o)):
            for j in range(i, min(i + max_len, len(o))):
                if m[i] and m[j]:
                    key = (o[i][0], o[j][1])
                    best[key] = max(best.get(key, -np.inf), start[w][i] + end[w][j])
    expected = sorted(best.values(), reverse=True)[:n_best]
    assert [c.score for c in pred.n_best] == pytest.approx(expected)
    assert all(c.text == CONTEXT[c.start : c.end] for c in pred.n_best)


def test_best_span_may_use_neither_the_best_start_nor_the_best_end():
    # The 4 best start tokens (words 10..13) all come after the 4 best end tokens (words 0..3): no span pairs
    # them. The best span is words 5..6 ("over the", 1 + 1), every other one scores -30 or less.
    offsets, mask, shift = window(0, 14)
    start = np.full(len(offsets), -50.0)
    end = np.full(len(offsets), -50.0)
    start[[shift + w for w in (10, 11, 12, 13)]] = 20.0
    end[[shift + w for w in (0, 1, 2, 3)]] = 20.0
    start[shift + 5] = end[shift + 6] = 1.0
    (pred,) = postprocess_qa([start], [end], [offsets], [mask], [0], [CONTEXT], n_best=4, max_answer_length=5)
    assert (pred.text, pred.score) == ("over the", 2.0)


def test_postprocess_input_errors():
    offsets, mask, _ = window(0, 5)
    start = end = logits_for(len(offsets), {})
    with pytest.raises(ValueError, match="end_logits has 2 windows; expected 1"):
        postprocess_qa([start], [end, end], [offsets], [mask], [0], [CONTEXT])
    with pytest.raises(ValueError, match="window 0 belongs to example 3; expected an index below 1"):
        postprocess_qa([start], [end], [offsets], [mask], [3], [CONTEXT])
    with pytest.raises(ValueError, match="window 0: 11 start logits, 11 end logits, 10 mask entries"):
        postprocess_qa([start], [end], [offsets], [mask[:-1]], [0], [CONTEXT])
    with pytest.raises(ValueError, match="outside the context of 5 characters"):
        postprocess_qa([start], [end], [offsets], [mask], [0], ["short"])


@pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data folder {DATA} not present")
def test_round_trip_on_real_squad_windows():
    """Logits peaked on the gold answer's tokens, windows of 48 tokens with stride 24: post-processing gives
    back the gold text (for answers on token boundaries), and the score is 100."""
    examples = read_squad(DATA / "squad/dev-v1.1-part1.json").examples[:300]
    starts, ends, offsets, masks, owner = [], [], [], [], []
    aligned = {}
    for i, e in enumerate(examples):
        toks = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", e.context)]
        gold = e.answers[0]
        first = next((t for t, (s, _) in enumerate(toks) if s == gold.start), None)
        last = next((t for t, (_, x) in enumerate(toks) if x == gold.end), None)
        if first is None or last is None:
            continue
        aligned[e.id] = gold.text
        for w0 in range(0, max(len(toks) - 24, 1), 24):
            span = toks[w0 : w0 + 48]
            o = [(0, 0), None, None, (0, 0), *span, (0, 0)]
            s, x = np.zeros(len(o)), np.zeros(len(o))
            if w0 <= first < w0 + 48 and w0 <= last < w0 + 48:
                s[first - w0 + 4], x[last - w0 + 4] = 10.0, 10.0
            starts.append(s), ends.append(x), offsets.append(o), owner.append(i)
            masks.append([False] * 4 + [True] * len(span) + [False])
    assert len(aligned) > 250
    preds = postprocess_qa(
        starts, ends, offsets, masks, owner, [e.context for e in examples], max_answer_length=40
    )
    texts = {examples[p.example].id: p.text for p in preds}
    assert all(texts[q] == gold for q, gold in aligned.items())
    scored = squad_evaluate([e for e in examples if e.id in aligned], texts)
    assert scored["exact_match"] == 100.0 and scored["f1"] == 100.0
