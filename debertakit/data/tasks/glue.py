"""GLUE readers: tab-separated files with or without a header, including the raw CoLA and MSR paraphrase layouts.

Fields are split on tabs only (no CSV quoting: the GLUE files contain unbalanced quotes). A file has a header
when its first line names the task's text column (e.g. `sentence`, `sentence1`, `#1 String`, `question1`);
columns are then found by name and a file without the label column is read as unlabelled (test sets).
A file without a header is read by position, the layout chosen by its number of columns (see `GLUE_FORMATS`).
Blank lines are not rows and are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from debertakit.data.tasks._lines import numbered_lines
from debertakit.data.tasks.records import BadRows, MalformedRowError, TaskData, TextExample

# (text column, pair column, label column, id column); None = absent.
Layout = tuple[int, int | None, int | None, int | None]


@dataclass(frozen=True)
class GlueFormat:
    """How one GLUE task's files look.

    Attributes:
        name: task name.
        text: header names accepted for the first sentence (lower case).
        pair: header names accepted for the second sentence, or None for single-sentence tasks.
        label: header names accepted for the label (the first one present wins).
        ident: header names accepted for an example id.
        layouts: header-less layouts by number of columns.
        labels: class names (index = label id), or None for regression.
        label_values: raw label strings accepted in files and the class index each one means.
        score_range: (low, high) allowed for regression labels.
    """

    name: str
    text: tuple[str, ...]
    pair: tuple[str, ...] | None
    label: tuple[str, ...]
    ident: tuple[str, ...]
    layouts: dict[int, Layout]
    labels: tuple[str, ...] | None
    label_values: dict[str, int] = field(default_factory=dict)
    score_range: tuple[float, float] | None = None


def _values(labels: tuple[str, ...], numeric: bool = True, names: bool = True) -> dict[str, int]:
    out: dict[str, int] = {}
    if numeric:
        out.update({str(i): i for i in range(len(labels))})
    if names:
        out.update({name: i for i, name in enumerate(labels)})
    return out


_NLI2 = ("entailment", "not_entailment")
_MNLI = ("entailment", "neutral", "contradiction")

GLUE_FORMATS: dict[str, GlueFormat] = {
    f.name: f
    for f in [
        # Raw CoLA: source, label, original annotation, sentence (no header). GLUE's test.tsv: index, sentence.
        GlueFormat(
            "cola",
            ("sentence",),
            None,
            ("label",),
            ("index", "idx"),
            {4: (3, None, 1, None)},
            ("unacceptable", "acceptable"),
            _values(("unacceptable", "acceptable"), names=False),
        ),
        GlueFormat(
            "sst2",
            ("sentence",),
            None,
            ("label",),
            ("index", "idx"),
            {2: (0, None, 1, None)},
            ("negative", "positive"),
            _values(("negative", "positive"), names=False),
        ),
        # msr_paraphrase_*.txt and GLUE's MRPC tsv: Quality, #1 ID, #2 ID, #1 String, #2 String.
        GlueFormat(
            "mrpc",
            ("#1 string", "sentence1"),
            ("#2 string", "sentence2"),
            ("quality", "label"),
            ("index", "idx"),
            {5: (3, 4, 0, None)},
            ("not_equivalent", "equivalent"),
            _values(("not_equivalent", "equivalent"), names=False),
        ),
        GlueFormat(
            "stsb",
            ("sentence1",),
            ("sentence2",),
            ("score", "label"),
            ("index", "idx"),
            {10: (7, 8, 9, 0), 9: (7, 8, None, 0)},
            None,
            score_range=(0.0, 5.0),
        ),
        GlueFormat(
            "qqp",
            ("question1",),
            ("question2",),
            ("is_duplicate", "label"),
            ("id", "idx"),
            {6: (3, 4, 5, 0), 3: (1, 2, None, 0)},
            ("not_duplicate", "duplicate"),
            _values(("not_duplicate", "duplicate"), names=False),
        ),
        # MNLI train has 12 columns (label1, gold_label), dev 16 (label1..label5, gold_label), test 10.
        GlueFormat(
            "mnli",
            ("sentence1", "premise"),
            ("sentence2", "hypothesis"),
            ("gold_label", "label"),
            ("index", "idx"),
            {12: (8, 9, 11, 0), 16: (8, 9, 15, 0), 10: (8, 9, None, 0)},
            _MNLI,
            _values(_MNLI),
        ),
        GlueFormat(
            "qnli",
            ("question",),
            ("sentence",),
            ("label",),
            ("index", "idx"),
            {4: (1, 2, 3, 0), 3: (1, 2, None, 0)},
            _NLI2,
            _values(_NLI2),
        ),
        # GLUE's RTE tsv: index, sentence1, sentence2, label (names); other copies use 0 = entailment.
        GlueFormat(
            "rte",
            ("sentence1",),
            ("sentence2",),
            ("label",),
            ("index", "idx"),
            {4: (1, 2, 3, 0), 3: (1, 2, None, 0)},
            _NLI2,
            _values(_NLI2),
        ),
        # WNLI's labels are 0 = not_entailment, 1 = entailment (the reverse of RTE).
        GlueFormat(
            "wnli",
            ("sentence1",),
            ("sentence2",),
            ("label",),
            ("index", "idx"),
            {4: (1, 2, 3, 0), 3: (1, 2, None, 0)},
            ("not_entailment", "entailment"),
            _values(("not_entailment", "entailment")),
        ),
    ]
}


def _find(header: list[str], names: tuple[str, ...]) -> int | None:
    for name in names:
        if name in header:
            return header.index(name)
    return None


def _header_layout(fmt: GlueFormat, header: list[str], path: str | Path, number: int) -> Layout:
    """Column positions from a header; a header without the needed columns stops the read (even when skipping)."""
    text = _find(header, fmt.text)
    pair = _find(header, fmt.pair) if fmt.pair else None
    if fmt.pair and pair is None:
        raise MalformedRowError(
            path,
            number,
            f"header {header} has no column for the second sentence; expected one of {list(fmt.pair)}",
        )
    assert text is not None
    return (text, pair, _find(header, fmt.label), _find(header, fmt.ident))


def _describe_layouts(fmt: GlueFormat) -> str:
    return " or ".join(str(n) for n in sorted(fmt.layouts))


def _parse_label(fmt: GlueFormat, raw: str) -> tuple[int | float | None, str]:
    """Return (label, error message); the message is empty when the label is valid."""
    if fmt.labels is None:
        try:
            score = float(raw)
        except ValueError:
            return None, f"score {raw!r} is not a number; expected a float"
        low, high = fmt.score_range or (-math.inf, math.inf)
        if not (math.isfinite(score) and low <= score <= high):
            return None, f"score {raw!r} outside [{low}, {high}]"
        return score, ""
    if raw not in fmt.label_values:
        return None, f"label {raw!r} is not one of {sorted(fmt.label_values)}"
    return fmt.label_values[raw], ""


def read_glue(path: str | Path, task: str, *, skip_bad: bool = False) -> TaskData[TextExample]:
    """Read one GLUE file (train, dev or test; with or without header).

    Args:
        path: the tsv file (e.g. `glue/CoLA/train.tsv`, `glue/MRPC/msr_paraphrase_train.txt`).
        task: one of `GLUE_FORMATS` (`cola`, `sst2`, `mrpc`, `stsb`, `qqp`, `mnli`, `qnli`, `rte`, `wnli`).
        skip_bad: skip malformed rows (counted in `TaskData.skipped`) instead of raising.

    Returns:
        The examples; labels are class indices into `TaskData.labels` (floats for STS-B), None when the file
        has no label column.

    Raises:
        MalformedRowError: a row with the wrong number of columns, an unknown label or an empty sentence
            (naming the file and line), unless `skip_bad`.
        ValueError: an unknown task name.
    """
    if task not in GLUE_FORMATS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {sorted(GLUE_FORMATS)}")
    fmt = GLUE_FORMATS[task]
    bad = BadRows(path, skip_bad)
    name = Path(path).name
    layout: Layout | None = None
    ncols = 0
    first = True
    examples: list[TextExample] = []
    for number, line in numbered_lines(path, bad):
        if not line.strip():
            continue
        fields = line.split("\t")
        if first:
            first = False
            header = [f.strip().lower() for f in fields]
            if _find(header, fmt.text) is not None:
                layout, ncols = _header_layout(fmt, header, path, number), len(fields)
                continue
        if layout is None:
            if len(fields) not in fmt.layouts:
                bad.report(
                    number,
                    f"{len(fields)} tab-separated columns; expected {_describe_layouts(fmt)} for {task}",
                )
                continue
            layout, ncols = fmt.layouts[len(fields)], len(fields)
        if len(fields) != ncols:
            bad.report(number, f"{len(fields)} tab-separated columns; expected {ncols} like the first row")
            continue
        example = _example(fmt, layout, fields, f"{name}-{number}")
        if isinstance(example, str):
            bad.report(number, example)
            continue
        examples.append(example)
    return bad.finish(examples, fmt.labels)


def _example(fmt: GlueFormat, layout: Layout, fields: list[str], default_id: str) -> TextExample | str:
    """Build one example, or return the reason the row is malformed."""
    text_i, pair_i, label_i, id_i = layout
    text = fields[text_i].strip()
    pair = fields[pair_i].strip() if pair_i is not None else None
    if not text or pair == "":
        return "empty sentence; expected text in the sentence column(s)"
    label = None
    if label_i is not None:
        label, error = _parse_label(fmt, fields[label_i].strip())
        if error:
            return error
    guid = fields[id_i].strip() if id_i is not None and fields[id_i].strip() else default_id
    return TextExample(guid, text, pair, label)
