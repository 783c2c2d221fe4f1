"""Task registry: name -> how to read the files, what kind of head the task needs, labels and metrics."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from debertakit.data.tasks.choice import read_multiple_choice
from debertakit.data.tasks.conll import CONLL2003_LABELS, read_conll
from debertakit.data.tasks.generic import read_text_pairs
from debertakit.data.tasks.glue import GLUE_FORMATS, read_glue
from debertakit.data.tasks.records import TaskData
from debertakit.data.tasks.squad import read_squad

TaskKind = Literal["classification", "regression", "qa", "ner", "multiple_choice"]


@dataclass(frozen=True)
class TaskSpec:
    """One task.

    Attributes:
        name: registry name.
        kind: which head / loss / post-processing the task needs.
        reader: `reader(path, *, skip_bad=False) -> TaskData`.
        labels: class names in label-id order; None for regression, QA, multiple choice, and for generic tasks
            whose labels come from the data (`TaskData.labels`).
        metrics: metric names reported (see `debertakit.evaluate.metrics.task_metrics`).
        main_metric: the metric used to pick the best checkpoint.
    """

    name: str
    kind: TaskKind
    reader: Callable[..., TaskData[Any]]
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str

    def read(self, path: str | Path, *, skip_bad: bool = False) -> TaskData[Any]:
        """Read one file of this task (see the reader for the formats accepted)."""
        return self.reader(path, skip_bad=skip_bad)


def _glue(name: str, registry_name: str | None = None) -> TaskSpec:
    fmt = GLUE_FORMATS[name]
    metrics: dict[str, tuple[tuple[str, ...], str]] = {
        "cola": (("mcc", "accuracy"), "mcc"),
        "stsb": (("pearson", "spearman"), "pearson"),
        "mrpc": (("f1", "accuracy"), "accuracy"),
        "qqp": (("f1", "accuracy"), "accuracy"),
    }
    names, main = metrics.get(name, (("accuracy",), "accuracy"))
    kind: TaskKind = "regression" if fmt.labels is None else "classification"
    reader = functools.partial(read_glue, task=name)
    return TaskSpec(registry_name or name, kind, reader, fmt.labels, names, main)


_NER = (("precision", "recall", "f1", "accuracy"), "f1")

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        *(_glue(name) for name in GLUE_FORMATS),
        _glue("mnli", "mnli-mm"),
        TaskSpec("squad", "qa", read_squad, None, ("exact_match", "f1"), "f1"),
        TaskSpec(
            "squad_v2",
            "qa",
            read_squad,
            None,
            ("exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "best_exact", "best_f1"),
            "f1",
        ),
        TaskSpec(
            "conll2003",
            "ner",
            functools.partial(read_conll, labels=CONLL2003_LABELS),
            CONLL2003_LABELS,
            *_NER,
        ),
        TaskSpec("ner", "ner", read_conll, None, *_NER),
        TaskSpec("multiple_choice", "multiple_choice", read_multiple_choice, None, ("accuracy",), "accuracy"),
        TaskSpec(
            "text_classification",
            "classification",
            read_text_pairs,
            None,
            ("accuracy", "macro_f1"),
            "accuracy",
        ),
        TaskSpec(
            "text_regression",
            "regression",
            functools.partial(read_text_pairs, regression=True),
            None,
            ("pearson", "spearman"),
            "pearson",
        ),
    ]
}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


_BY_KEY = {_key(name): spec for name, spec in TASKS.items()} | {
    "mnlim": TASKS["mnli"],
    "mnlimatched": TASKS["mnli"],
    "mnlimismatched": TASKS["mnli-mm"],
    "swag": TASKS["multiple_choice"],
    "race": TASKS["multiple_choice"],
}


def get_task(name: str) -> TaskSpec:
    """Look a task up by name (case, `-` and `_` are ignored: `SST-2`, `sst2`, `STS_B`, `mnli-mm` all work).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    spec = _BY_KEY.get(_key(name))
    if spec is None:
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return spec


def read_task(name: str, path: str | Path, *, skip_bad: bool = False) -> TaskData[Any]:
    """Read one file of the task `name` (see `get_task`)."""
    return get_task(name).read(path, skip_bad=skip_bad)
