"""Metric functions: hand-checked cases, and agreement with independent numpy formulas and the libraries."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from debertakit.data.tasks import Answer, QAExample
from debertakit.evaluate.metrics import (
    accuracy,
    f1,
    glue_metrics,
    matthews_corrcoef,
    mean_of,
    ner_metrics,
    pearson,
    spearman,
    task_metrics,
)

# ---------------------------------------------------------------- hand-checked


def test_hand_checked_classification():
    # TP = 2 (idx 0, 4), FP = 1 (idx 1), FN = 1 (idx 3), TN = 1 (idx 2).
    pred, gold = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    assert accuracy(pred, gold) == pytest.approx(3 / 5)
    assert f1(pred, gold) == pytest.approx(2 / 3)  # P = R = 2/3
    assert f1(pred, gold, pos_label=0) == pytest.approx(0.5)  # class 0: TP 1, FP 1, FN 1
    assert matthews_corrcoef(pred, gold) == pytest.approx((2 * 1 - 1 * 1) / math.sqrt(3 * 3 * 2 * 2))
    # Macro F1 over 3 classes: class 0 F1 1, class 1 F1 2/3 (TP 1, FP 0, FN 1), class 2 F1 2/3 (TP 1, FP 1).
    assert f1([0, 1, 2, 2], [0, 1, 1, 2], average="macro") == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)


def test_hand_checked_correlations():
    assert pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / math.sqrt(84))
    assert spearman([1, 2, 3], [1, 2, 4]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 1, 2]) == pytest.approx(-0.5)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1, 2], [5, 5]))
    assert matthews_corrcoef([1, 1, 1], [0, 1, 1]) == 0.0


def test_length_checks():
    with pytest.raises(ValueError, match="3 predictions for 2 references"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="no predictions"):
        f1([], [])
    with pytest.raises(ValueError, match=r"shape \(2, 2\)"):
        pearson([[1, 2], [3, 4]], [1, 2])


# ---------------------------------------------------------------- against formulas and libraries


@pytest.mark.parametrize("seed", range(5))
def test_against_numpy_formulas_and_libraries(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 200)
    pred = np.where(rng.random(200) < 0.7, gold, 1 - gold)
    tp = np.sum((pred == 1) & (gold == 1))
    tn = np.sum((pred == 0) & (gold == 0))
    fp = np.sum((pred == 1) & (gold == 0))
    fn = np.sum((pred == 0) & (gold == 1))
    assert accuracy(pred, gold) == pytest.approx(np.mean(pred == gold))
    assert f1(pred, gold) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert matthews_corrcoef(pred, gold) == pytest.approx(mcc)
    assert matthews_corrcoef(pred, gold) == pytest.approx(skm.matthews_corrcoef(gold, pred))
    multi_gold, multi_pred = rng.integers(0, 4, 300), rng.integers(0, 4, 300)
    assert f1(multi_pred, multi_gold, average="macro") == pytest.approx(
        skm.f1_score(multi_gold, multi_pred, average="macro")
    )
    x, y = rng.normal(size=100), rng.normal(size=100)
    y = 0.5 * x + y
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert spearman(x, y) == pytest.approx(np.corrcoef(stats.rankdata(x), stats.rankdata(y))[0, 1])


# ---------------------------------------------------------------- GLUE bundles and task dispatch


def test_glue_bundles():
    pred, gold = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    assert set(glue_metrics("CoLA", pred, gold)) == {"mcc"}
    assert glue_metrics("MRPC", pred, gold) == {"f1": pytest.approx(2 / 3), "accuracy": pytest.approx(0.6)}
    assert set(glue_metrics("qqp", pred, gold)) == {"f1", "accuracy"}
    assert set(glue_metrics("STS-B", [0.1, 2.0, 3.5], [0.0, 2.5, 5.0])) == {"pearson", "spearman"}
    for task in ("sst2", "mnli", "mnli-mm", "qnli", "rte", "wnli"):
        assert set(glue_metrics(task, pred, gold)) == {"accuracy"}
    with pytest.raises(ValueError, match="unknown GLUE task 'sst5'"):
        glue_metrics("sst5", pred, gold)
    assert mean_of({"f1": 0.8, "accuracy": 0.6}) == pytest.approx(0.7)


def test_task_metrics_takes_logits_and_dispatches():
    logits = np.array([[0.1, 2.0], [3.0, -1.0], [0.0, 0.5]])
    assert task_metrics("rte", logits, [1, 0, 0]) == {"accuracy": pytest.approx(2 / 3)}
    out = task_metrics("stsb", np.array([[1.0], [2.0], [3.5]]), [1.0, 2.5, 3.0])
    assert out["spearman"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"shape \(3, 2\); expected \(N,\) or \(N, 1\)"):
        task_metrics("stsb", logits, [1.0, 2.0, 3.0])
    ner = task_metrics("conll2003", [["B-PER", "O"]], [["B-PER", "O"]])
    assert ner == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "accuracy": 1.0}
    squad = task_metrics(
        "squad", {"q": "the cat"}, [QAExample("q", "Who?", "The cat sat.", (Answer("The cat", 0),))]
    )
    assert squad == {"exact_match": 100.0, "f1": 100.0}


# ---------------------------------------------------------------- NER


def spans(tags):
    """Entities (type, start, end) of a valid IOB2 sequence, written independently of seqeval."""
    out, start = [], None
    for i, tag in enumerate([*tags, "O"]):
        if start is not None and not (tag.startswith("I-") and tag[2:] == tags[start][2:]):
            out.append((tags[start][2:], start, i))
            start = None
        if tag.startswith("B-"):
            start = i
    return set(out)


def test_ner_hand_checked():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    out = ner_metrics(pred, gold, per_type=True)
    # gold entities: PER, LOC, ORG; predicted: PER, ORG (wrong type at LOC's place), ORG.
    assert out["precision"] == pytest.approx(2 / 3) and out["recall"] == pytest.approx(2 / 3)
    assert out["accuracy"] == pytest.approx(5 / 6)
    assert out["LOC_recall"] == 0.0 and out["PER_f1"] == 1.0 and out["ORG_precision"] == 0.5
    # conlleval counts an entity starting with I-; strict IOB2 does not.
    loose = ner_metrics([["I-PER", "I-PER"]], [["B-PER", "I-PER"]])
    strict = ner_metrics([["I-PER", "I-PER"]], [["B-PER", "I-PER"]], strict=True)
    assert loose["f1"] == 1.0 and strict["f1"] == 0.0
    with pytest.raises(ValueError, match="sentence 0: 1 predicted tags for 2 gold tags"):
        ner_metrics([["O"]], [["O", "O"]])


def random_iob2(rng, n):
    tags, prev = [], "O"
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            tag = "O"
        elif r < 0.8 or prev == "O":
            tag = "B-" + rng.choice(["PER", "LOC", "ORG"])
        else:
            tag = "I-" + prev[2:]
        tags.append(tag)
        prev = tag
    return tags


@pytest.mark.parametrize("seed", range(3))
def test_ner_against_independent_span_counting(seed):
    rng = np.random.default_rng(seed)
    gold = [random_iob2(rng, int(rng.integers(1, 15))) for _ in range(40)]
    pred = [[t if rng.random() < 0.8 else g for t, g in zip(random_iob2(rng, len(s)), s)] for s in gold]
    pred = [p if rng.random() < 0.5 else list(g) for p, g in zip(pred, gold)]
    # Keep predictions valid IOB2 so that strict and conlleval modes agree with the span counting.
    pred = [p if _valid(p) else list(g) for p, g in zip(pred, gold)]
    g_spans = {(i, *s) for i, tags in enumerate(gold) for s in spans(tags)}
    p_spans = {(i, *s) for i, tags in enumerate(pred) for s in spans(tags)}
    tp = len(g_spans & p_spans)
    out = ner_metrics(pred, gold, strict=True)
    assert out["precision"] == pytest.approx(tp / len(p_spans))
    assert out["recall"] == pytest.approx(tp / len(g_spans))
    assert out["f1"] == pytest.approx(2 * tp / (len(p_spans) + len(g_spans)))
    assert ner_metrics(pred, gold)["f1"] == pytest.approx(out["f1"])


def _valid(tags):
    prev = "O"
    for t in tags:
        if t.startswith("I-") and prev[2:] != t[2:]:
            return False
        prev = t
    return True
