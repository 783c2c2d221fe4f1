"""Task metrics, computed by scikit-learn, scipy and seqeval.

Classification metrics take class ids (or logits of shape (N, C), reduced by argmax in `task_metrics`);
regression metrics take floats. Every function checks that predictions and references have the same, non-zero
length. Correlations of a constant input are undefined and returned as NaN.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from scipy import stats
from sklearn import metrics as skm


def _pair(predictions: Any, references: Any) -> tuple[np.ndarray, np.ndarray]:
    p, r = np.asarray(predictions), np.asarray(references)
    if p.ndim != 1 or r.ndim != 1:
        raise ValueError(
            f"predictions shape {p.shape} and references shape {r.shape}; expected 1-D sequences"
        )
    if len(p) != len(r):
        raise ValueError(f"{len(p)} predictions for {len(r)} references; expected the same number")
    if len(p) == 0:
        raise ValueError("no predictions; expected at least one")
    return p, r


def accuracy(predictions: Sequence[int], references: Sequence[int]) -> float:
    """Fraction of predictions equal to the reference."""
    p, r = _pair(predictions, references)
    return float(skm.accuracy_score(r, p))


def f1(
    predictions: Sequence[int],
    references: Sequence[int],
    *,
    average: Literal["binary", "macro", "micro", "weighted"] = "binary",
    pos_label: int = 1,
) -> float:
    """F1 score: of the positive class `pos_label` (binary, GLUE MRPC / QQP) or averaged over classes.

    A class never predicted nor present contributes 0 (scikit-learn's `zero_division=0`).
    """
    p, r = _pair(predictions, references)
    return float(skm.f1_score(r, p, average=average, pos_label=pos_label, zero_division=0))


def matthews_corrcoef(predictions: Sequence[int], references: Sequence[int]) -> float:
    """Matthews correlation coefficient (GLUE CoLA); 0 when either side is constant."""
    p, r = _pair(predictions, references)
    return float(skm.matthews_corrcoef(r, p))


def _correlation(fn: Callable[..., Any], predictions: Sequence[float], references: Sequence[float]) -> float:
    p, r = _pair(predictions, references)
    if len(p) < 2 or np.all(p == p[0]) or np.all(r == r[0]):
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn(p.astype(np.float64), r.astype(np.float64))[0])


def pearson(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Pearson correlation (GLUE STS-B); NaN when an input is constant or has fewer than two values."""
    return _correlation(stats.pearsonr, predictions, references)


def spearman(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Spearman rank correlation (GLUE STS-B); NaN when an input is constant or has fewer than two values."""
    return _correlation(stats.spearmanr, predictions, references)


METRICS: dict[str, Callable[[Any, Any], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": functools.partial(f1, average="macro"),
    "micro_f1": functools.partial(f1, average="micro"),
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}

_GLUE = {
    "cola": ("mcc",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("f1", "accuracy"),
    "mnli": ("accuracy",),
    "mnli-mm": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}


def glue_metrics(task: str, predictions: Sequence[Any], references: Sequence[Any]) -> dict[str, float]:
    """The metrics GLUE reports for `task`: CoLA MCC, STS-B Pearson/Spearman, MRPC/QQP F1 and accuracy, others
    accuracy.

    Args:
        task: GLUE task name (`cola`, `sst2`, `mrpc`, `stsb`, `qqp`, `mnli`, `mnli-mm`, `qnli`, `rte`, `wnli`).
        predictions: class ids (scores for STS-B).
        references: gold class ids (scores for STS-B).
    """
    key = task.lower().replace("_", "-").replace("sst-2", "sst2").replace("sts-b", "stsb")
    if key not in _GLUE:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {sorted(_GLUE)}")
    return {name: METRICS[name](predictions, references) for name in _GLUE[key]}


def ner_metrics(
    predictions: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    strict: bool = False,
    per_type: bool = False,
) -> dict[str, float]:
    """Entity-level precision, recall and F1 (and token accuracy) of IOB2 tag sequences, by seqeval.

    Args:
        predictions: predicted tags, one list per sentence.
        references: gold tags, same shapes.
        strict: seqeval's strict IOB2 mode (an entity must start with B-); the default matches conlleval, the
            CoNLL-2003 shared-task script, which also accepts an entity starting with I-.
        per_type: also report `<TYPE>_precision`, `<TYPE>_recall`, `<TYPE>_f1` for each entity type.

    Returns:
        `precision`, `recall`, `f1`, `accuracy` (+ per-type entries).
    """
    from seqeval import metrics as sq
    from seqeval.scheme import IOB2

    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predicted sentences for {len(references)} references")
    for i, (p, r) in enumerate(zip(predictions, references)):
        if len(p) != len(r):
            raise ValueError(
                f"sentence {i}: {len(p)} predicted tags for {len(r)} gold tags; expected the same"
            )
    y_pred, y_true = [list(p) for p in predictions], [list(r) for r in references]
    kwargs: dict[str, Any] = {"mode": "strict", "scheme": IOB2} if strict else {}
    out = {
        "precision": float(sq.precision_score(y_true, y_pred, zero_division=0, **kwargs)),
        "recall": float(sq.recall_score(y_true, y_pred, zero_division=0, **kwargs)),
        "f1": float(sq.f1_score(y_true, y_pred, zero_division=0, **kwargs)),
        "accuracy": float(sq.accuracy_score(y_true, y_pred)),
    }
    if per_type:
        report = sq.classification_report(y_true, y_pred, output_dict=True, zero_division=0, **kwargs)
        for name, row in report.items():
            if not name.endswith(" avg"):
                out |= {
                    f"{name}_precision": row["precision"],
                    f"{name}_recall": row["recall"],
                    f"{name}_f1": row["f1-score"],
                }
    return out


def task_metrics(task: str, predictions: Any, references: Any) -> dict[str, float]:
    """All metrics of a registered task (`debertakit.data.tasks.TASKS`), by its kind.

    Args:
        task: task name.
        predictions: classification / multiple choice: class ids or logits (N, C); regression: scores (N,) or
            (N, 1); ner: tag sequences; qa: `{question id: answer text}`.
        references: classification / regression / multiple choice: gold labels; ner: gold tag sequences;
            qa: `QAExample`s.

    Returns:
        `{metric name: value}` for the task's `metrics`.
    """
    from debertakit.data.tasks import get_task

    spec = get_task(task)
    if spec.kind == "ner":
        return {k: v for k, v in ner_metrics(predictions, references).items() if k in spec.metrics}
    if spec.kind == "qa":
        from debertakit.evaluate.squad import squad_evaluate

        scores = squad_evaluate(references, predictions)
        return {k: v for k, v in scores.items() if k in spec.metrics}
    p = np.asarray(predictions)
    if spec.kind == "regression" and p.ndim == 2:
        if p.shape[1] != 1:
            raise ValueError(f"regression predictions of shape {p.shape}; expected (N,) or (N, 1)")
        p = p[:, 0]
    elif p.ndim == 2:
        p = p.argmax(-1)
    return {name: METRICS[name](p, references) for name in spec.metrics}


def mean_of(scores: Mapping[str, float]) -> float:
    """Average of several metrics (GLUE's score of a task with two metrics, e.g. MRPC (F1 + acc) / 2)."""
    if not scores:
        raise ValueError("no scores to average")
    return float(np.mean(list(scores.values())))
