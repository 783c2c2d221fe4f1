"""SQuAD scoring and post-processing.

Scoring follows the definitions of the official evaluation scripts (SQuAD v1.1 `evaluate-v1.1.py` and v2.0
`evaluate-v2.0.py`):

- answers are normalised by lower-casing, removing ASCII punctuation (`string.punctuation`), removing the
  articles a / an / the as whole words, and collapsing whitespace, in that order;
- exact match compares normalised strings; F1 is over the bag of normalised whitespace tokens; both take the
  maximum over the gold answers;
- v2.0: gold answers that normalise to nothing are dropped and an unanswerable question's gold is `""`, an empty
  prediction means "no answer", and F1 of two empty token lists is 1 (v1.1: 0);
- v2.0 no-answer thresholding: with a no-answer score per question (`na_probs`), a question whose score exceeds
  the threshold is predicted unanswerable; `best_exact` / `best_f1` sweep the threshold over the sorted scores
  the way the official script does.

Post-processing (`postprocess_qa`) turns per-window start/end logits back into character spans of the context,
through each window's offset mapping, independently of any tokenizer class.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from debertakit.data.tasks.records import QAExample

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)

Version = Literal["1.1", "2.0"]


def normalize_answer(text: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a / an / the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, ground_truth: str) -> int:
    """1 when the normalised strings are equal, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str, *, version: Version = "2.0") -> float:
    """Token-overlap F1 of the normalised answers.

    Args:
        prediction: predicted answer text.
        ground_truth: one gold answer.
        version: "2.0": when either side has no tokens, 1 if both have none else 0 (an empty prediction is the
            right answer to an unanswerable question); "1.1": no overlap is 0, also for two empty strings.
    """
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(ground_truth).split()
    if version == "2.0" and (not pred or not gold):
        return float(pred == gold)
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def gold_answers(example: QAExample, *, version: Version = "2.0") -> list[str]:
    """The gold texts a prediction is scored against (v2.0: empty ones dropped, `[""]` when unanswerable)."""
    texts = [a.text for a in example.answers]
    if version == "1.1":
        return texts
    return [t for t in texts if normalize_answer(t)] or [""]


def score_question(prediction: str, example: QAExample, *, version: Version = "2.0") -> tuple[int, float]:
    """(exact match, F1) of one prediction: the maximum over the example's gold answers."""
    golds = gold_answers(example, version=version)
    if not golds:
        raise ValueError(f"question {example.id} has no gold answers; SQuAD v1.1 expects at least one")
    return (
        max(exact_match(prediction, g) for g in golds),
        max(f1_score(prediction, g, version=version) for g in golds),
    )


def apply_no_answer_threshold(
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
    threshold: float,
) -> dict[str, float]:
    """Questions with `na_probs[qid] > threshold` are predicted unanswerable: 1 if they are, else 0."""
    return {qid: float(not has_answer[qid]) if na_probs[qid] > threshold else s for qid, s in scores.items()}


def best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """Best (score in %, threshold) over no-answer thresholds, as the official v2.0 script searches it.

    Starting from "every question unanswered", questions are answered in increasing order of no-answer score;
    each step adds its raw score (answerable) or loses a point (unanswerable with a non-empty prediction).
    """
    current = best = sum(1 for qid in scores if not has_answer[qid])
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions.get(qid) else 0
        current += diff
        if current > best:
            best, threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), threshold


def _mean(scores: Mapping[str, float], qids: Sequence[str]) -> float:
    return 100.0 * sum(scores[q] for q in qids) / len(qids) if qids else math.nan


def squad_evaluate(
    examples: Sequence[QAExample],
    predictions: Mapping[str, str],
    *,
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
    version: Literal["auto", "1.1", "2.0"] = "auto",
) -> dict[str, float]:
    """Score predictions against SQuAD examples (percentages, like the official scripts).

    Args:
        examples: the gold questions (`read_squad`).
        predictions: `{question id: answer text}`; `""` is "no answer" (v2.0). Ids not in `examples` are
            ignored. A missing prediction scores 0 in v1.1 and counts as "no answer" in v2.0; `missing` says how
            many there were.
        na_probs: v2.0 no-answer score per question id (e.g. `QAPrediction.null_score_diff`); enables
            thresholding and the `best_*` entries. Default: 0 for every question.
        na_prob_thresh: questions with a no-answer score above this are predicted unanswerable.
        version: "1.1", "2.0", or "auto" (2.0 when a question is unanswerable or `na_probs` is given).

    Returns:
        v1.1: `exact_match`, `f1`, `total`, `missing`. v2.0: the official keys `exact`, `f1`, `total`,
        `HasAns_exact`, `HasAns_f1`, `HasAns_total`, `NoAns_exact`, `NoAns_f1`, `NoAns_total` (`HasAns_*` /
        `NoAns_*` only when such questions exist), `best_exact`, `best_exact_thresh`, `best_f1`,
        `best_f1_thresh` (with `na_probs`), plus `exact_match` (= `exact`) and `missing`.
    """
    if not examples:
        raise ValueError("no examples to score; expected at least one question")
    if version == "auto":
        version = "2.0" if na_probs is not None or any(e.is_impossible for e in examples) else "1.1"
    if version not in ("1.1", "2.0"):
        raise ValueError(f"version {version!r}; expected '1.1', '2.0' or 'auto'")
    missing = [e.id for e in examples if e.id not in predictions]
    if version == "1.1":
        exact = f1 = 0.0
        for e in examples:
            if e.id in predictions:
                em, f = score_question(predictions[e.id], e, version="1.1")
                exact, f1 = exact + em, f1 + f
        n = len(examples)
        return {"exact_match": 100.0 * exact / n, "f1": 100.0 * f1 / n, "total": n, "missing": len(missing)}

    preds = {e.id: predictions.get(e.id, "") for e in examples}
    exact_raw, f1_raw = {}, {}
    for e in examples:
        exact_raw[e.id], f1_raw[e.id] = score_question(preds[e.id], e, version="2.0")
    has_answer = {e.id: bool(e.answers) for e in examples}
    probs = {qid: 0.0 for qid in preds} if na_probs is None else dict(na_probs)
    absent = [qid for qid in preds if qid not in probs]
    if absent:
        raise ValueError(f"na_probs has no score for {len(absent)} question(s), e.g. {absent[0]!r}")
    exact_t = apply_no_answer_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1_t = apply_no_answer_threshold(f1_raw, probs, has_answer, na_prob_thresh)
    qids = list(preds)
    out: dict[str, float] = {"exact": _mean(exact_t, qids), "f1": _mean(f1_t, qids), "total": len(qids)}
    for name, subset in (
        ("HasAns", [q for q in qids if has_answer[q]]),
        ("NoAns", [q for q in qids if not has_answer[q]]),
    ):
        if subset:
            out |= {
                f"{name}_exact": _mean(exact_t, subset),
                f"{name}_f1": _mean(f1_t, subset),
                f"{name}_total": len(subset),
            }
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = best_threshold(preds, exact_raw, probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = best_threshold(preds, f1_raw, probs, has_answer)
    out["exact_match"] = out["exact"]
    out["missing"] = len(missing)
    return out


# ---------------------------------------------------------------- post-processing


@dataclass(frozen=True)
class SpanCandidate:
    """One candidate answer span.

    Attributes:
        text: `context[start:end]`.
        start: character offset of the span in the context.
        end: character offset one past the span.
        score: start logit + end logit.
        start_logit: logit of the start token.
        end_logit: logit of the end token.
        probability: softmax of `score` over the n-best list.
        window: index of the window the span was found in.
    """

    text: str
    start: int
    end: int
    score: float
    start_logit: float
    end_logit: float
    probability: float
    window: int


@dataclass(frozen=True)
class QAPrediction:
    """The answer chosen for one example.

    Attributes:
        example: index of the example (as in `window_example`).
        text: the answer, `""` for "no answer".
        start: character offset of the answer in the context (-1 for no answer).
        end: character offset one past the answer (-1 for no answer).
        score: score of the best span (-inf when no span was possible).
        null_score: lowest no-answer score over the example's windows (NaN without `null_index`).
        null_score_diff: `null_score - score`: the no-answer score to threshold in v2.0 scoring.
        n_best: best spans, highest score first.
    """

    example: int
    text: str
    start: int
    end: int
    score: float
    null_score: float
    null_score_diff: float
    n_best: tuple[SpanCandidate, ...]


def _window_candidates(
    w: int,
    start: np.ndarray,
    end: np.ndarray,
    offsets: Sequence[Any],
    mask: np.ndarray,
    context: str,
    n_best: int,
    max_answer_length: int,
) -> list[SpanCandidate]:
    """The `n_best` best spans of one window among all spans of 1..max_answer_length context tokens.

    Every such span is scored (a band of the start x end score matrix, one diagonal per length), so the result
    is exact, not limited to the best start and end tokens. Keeping only a window's own `n_best` loses nothing:
    a span in an example's final n-best is also in the n-best of the window where it scores highest.
    """
    valid = mask & np.array([o is not None for o in offsets], dtype=bool)
    n = len(start)
    band = np.full((max_answer_length, n), -np.inf)  # band[d, i]: span of tokens i..i+d
    for d in range(min(max_answer_length, n)):
        ok = valid[: n - d] & valid[d:]
        band[d, : n - d] = np.where(ok, start[: n - d] + end[d:], -np.inf)
    flat = band.ravel()
    top = np.argsort(-flat, kind="stable")[:n_best]
    top = top[np.isfinite(flat[top])]
    lengths, starts = np.divmod(top, n)
    out = []
    for i, j in zip(starts.tolist(), (starts + lengths).tolist()):
        char_start, char_end = int(offsets[i][0]), int(offsets[j][1])
        if not 0 <= char_start <= char_end <= len(context):
            raise ValueError(
                f"window {w}: offsets ({char_start}, {char_end}) of tokens {i}..{j} outside the context of "
                f"{len(context)} characters; expected offsets into the example's context"
            )
        text = context[char_start:char_end]
        score = float(start[i] + end[j])
        out.append(SpanCandidate(text, char_start, char_end, score, float(start[i]), float(end[j]), 0.0, w))
    return out


def _check_windows(n: int, **lists: Sequence[Any]) -> None:
    for name, values in lists.items():
        if len(values) != n:
            raise ValueError(f"{name} has {len(values)} windows; expected {n} like start_logits")


def postprocess_qa(
    start_logits: Sequence[Sequence[float]],
    end_logits: Sequence[Sequence[float]],
    offset_mapping: Sequence[Sequence[Any]],
    context_mask: Sequence[Sequence[bool]],
    window_example: Sequence[int],
    contexts: Sequence[str],
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    null_index: int | None = None,
    null_threshold: float = 0.0,
) -> list[QAPrediction]:
    """Map start/end logits of (overflowing) windows back to answer spans in the contexts.

    A long context is split into overlapping windows; each window has its own logits and an offset mapping
    (token -> (char_start, char_end) in the context). For every example, spans are collected over all its
    windows: every span of 1 to `max_answer_length` context tokens is scored by start logit + end logit (exactly,
    not only the best start and end tokens), and the `n_best` best are kept. Spans found in several windows
    (overlap) are kept once, with their best score.

    Args:
        start_logits: per window, a (L,) sequence of start logits (windows may differ in length).
        end_logits: per window, (L,) end logits.
        offset_mapping: per window, (L,) entries `(char_start, char_end)` into the example's context, or None.
        context_mask: per window, (L,) booleans: True for tokens of the context (question and special tokens
            False); only these can start or end an answer.
        window_example: per window, the index of its example in `contexts`.
        contexts: the context string of each example.
        n_best: number of candidate spans kept per example.
        max_answer_length: longest answer, in tokens.
        null_index: token whose start + end logits score "no answer" (the [CLS] token, usually 0), for SQuAD
            v2.0; None never predicts "no answer" (v1.1).
        null_threshold: with `null_index`, answer "" when `null_score - best span score > null_threshold`.

    Returns:
        One `QAPrediction` per example, in example order.
    """
    n = len(start_logits)
    _check_windows(
        n,
        end_logits=end_logits,
        offset_mapping=offset_mapping,
        context_mask=context_mask,
        window_example=window_example,
    )
    if n_best < 1 or max_answer_length < 1:
        raise ValueError(f"n_best {n_best} and max_answer_length {max_answer_length}; expected both >= 1")
    windows: dict[int, list[int]] = collections.defaultdict(list)
    for w, ex in enumerate(window_example):
        if not 0 <= ex < len(contexts):
            raise ValueError(f"window {w} belongs to example {ex}; expected an index below {len(contexts)}")
        windows[int(ex)].append(w)
    return [
        _predict_example(
            ex,
            windows.get(ex, []),
            start_logits,
            end_logits,
            offset_mapping,
            context_mask,
            contexts[ex],
            n_best,
            max_answer_length,
            null_index,
            null_threshold,
        )
        for ex in range(len(contexts))
    ]


def _predict_example(
    ex: int,
    windows: list[int],
    start_logits: Sequence[Sequence[float]],
    end_logits: Sequence[Sequence[float]],
    offset_mapping: Sequence[Sequence[Any]],
    context_mask: Sequence[Sequence[bool]],
    context: str,
    n_best: int,
    max_answer_length: int,
    null_index: int | None,
    null_threshold: float,
) -> QAPrediction:
    best: dict[tuple[int, int], SpanCandidate] = {}
    null_score = math.inf if null_index is not None else math.nan
    for w in windows:
        start = np.asarray(start_logits[w], dtype=np.float64)
        end = np.asarray(end_logits[w], dtype=np.float64)
        mask = np.asarray(context_mask[w], dtype=bool)
        offsets = offset_mapping[w]
        if not (len(start) == len(end) == len(mask) == len(offsets)):
            raise ValueError(
                f"window {w}: {len(start)} start logits, {len(end)} end logits, {len(mask)} mask entries and "
                f"{len(offsets)} offsets; expected one of each per token"
            )
        if null_index is not None:
            null_score = min(null_score, float(start[null_index] + end[null_index]))
        for c in _window_candidates(w, start, end, offsets, mask, context, n_best, max_answer_length):
            key = (c.start, c.end)
            if key not in best or c.score > best[key].score:
                best[key] = c
    ranked = sorted(best.values(), key=lambda c: -c.score)[:n_best]
    if ranked:
        scores = np.array([c.score for c in ranked])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        ranked = [SpanCandidate(**{**c.__dict__, "probability": float(p)}) for c, p in zip(ranked, probs)]
    top_score = ranked[0].score if ranked else -math.inf
    diff = null_score - top_score if null_index is not None else math.nan
    if not ranked or (null_index is not None and diff > null_threshold):
        return QAPrediction(ex, "", -1, -1, top_score, null_score, diff, tuple(ranked))
    top = ranked[0]
    return QAPrediction(ex, top.text, top.start, top.end, top.score, null_score, diff, tuple(ranked))
