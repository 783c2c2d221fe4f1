"""Users' own sentence / sentence-pair data: CSV or TSV with a header, or JSON lines.

Columns (or keys): `text`, optional `text_pair`, optional `label` (names configurable). Class labels are
names; without a given label list the classes are the distinct labels of the file, sorted (numerically when
they are all integers).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from debertakit.data.tasks._lines import csv_records, numbered_lines
from debertakit.data.tasks.records import BadRows, MalformedRowError, TaskData, TextExample

# (line, text, text_pair, raw label)
_Row = tuple[int, str, str | None, Any]


def read_text_pairs(
    path: str | Path,
    *,
    labels: Sequence[str] | None = None,
    regression: bool = False,
    text_column: str = "text",
    pair_column: str = "text_pair",
    label_column: str = "label",
    skip_bad: bool = False,
) -> TaskData[TextExample]:
    """Read a generic classification / regression file (`.csv`, `.tsv`, `.jsonl` or `.json` lines).

    Args:
        path: the file.
        labels: class names in label-id order; by default inferred from the file.
        regression: labels are floats (no classes).
        text_column: column / key of the first text.
        pair_column: column / key of the optional second text.
        label_column: column / key of the optional label.
        skip_bad: skip malformed rows (counted in `TaskData.skipped`) instead of raising.

    Returns:
        The examples; `TaskData.labels` holds the class names (None for regression).

    Raises:
        MalformedRowError: a row with a missing or empty text, a wrong number of columns, a label that is not in
            `labels` or not a number (regression), naming file and line, unless `skip_bad`.
        ValueError: an unsupported file suffix.
    """
    suffix = Path(path).suffix.lower()
    bad = BadRows(path, skip_bad)
    columns = (text_column, pair_column, label_column)
    if suffix in (".csv", ".tsv"):
        rows = _csv_rows(path, "\t" if suffix == ".tsv" else ",", columns, bad)
    elif suffix in (".jsonl", ".json"):
        rows = _json_rows(path, columns, bad)
    else:
        raise ValueError(
            f"text file {path}: suffix {suffix!r}; expected .csv, .tsv, .jsonl or .json (JSON lines)"
        )
    if regression:
        names = None
    elif labels is not None:
        names = tuple(labels)
    else:
        names = _infer_labels([r[3] for r in rows if r[3] is not None])
    name = Path(path).name
    examples = []
    for number, text, pair, raw in rows:
        label, error = _label(raw, names, regression)
        if error:
            bad.report(number, error)
            continue
        examples.append(TextExample(f"{name}-{number}", text, pair, label))
    return bad.finish(examples, names)


def _infer_labels(raw: list[Any]) -> tuple[str, ...]:
    values = {str(v).strip() for v in raw}
    if all(v.lstrip("-").isdigit() for v in values):
        return tuple(sorted(values, key=int))
    return tuple(sorted(values))


def _label(raw: Any, names: tuple[str, ...] | None, regression: bool) -> tuple[int | float | None, str]:
    if raw is None:
        return None, ""
    if regression:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return None, f"label {raw!r} is not a number; expected a float (regression)"
        return (value, "") if math.isfinite(value) else (None, f"label {raw!r}; expected a finite number")
    key = str(raw).strip()
    if names is None or key not in names:
        return None, f"label {raw!r} is not one of {list(names or [])}"
    return names.index(key), ""


def _text(value: Any, column: str) -> tuple[str | None, str]:
    if not isinstance(value, str) or not value.strip():
        return None, f"{column} {value!r}; expected a non-empty string"
    return value.strip(), ""


def _csv_rows(path: str | Path, delimiter: str, columns: tuple[str, str, str], bad: BadRows) -> list[_Row]:
    text_c, pair_c, label_c = columns
    rows: list[_Row] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = [h.strip() for h in next(reader, [])]
        if text_c not in header:
            raise MalformedRowError(path, 1, f"header {header} has no {text_c!r} column")
        ti = header.index(text_c)
        pi = header.index(pair_c) if pair_c in header else None
        li = header.index(label_c) if label_c in header else None
        for number, row in csv_records(reader, header, bad):
            text, error = _text(row[ti], text_c)
            pair, pair_error = _text(row[pi], pair_c) if pi is not None else (None, "")
            if error or pair_error:
                bad.report(number, error or pair_error)
                continue
            label = row[li] if li is not None and row[li].strip() else None
            rows.append((number, text, pair, label))
    return rows


def _json_rows(path: str | Path, columns: tuple[str, str, str], bad: BadRows) -> list[_Row]:
    text_c, pair_c, label_c = columns
    rows: list[_Row] = []
    for number, line in numbered_lines(path, bad):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            bad.report(number, f"not valid JSON ({e.msg}, column {e.colno}); expected one object per line")
            continue
        if not isinstance(record, dict):
            bad.report(number, f"{type(record).__name__}; expected a JSON object per line")
            continue
        text, error = _text(record.get(text_c), text_c)
        pair, pair_error = _text(record[pair_c], pair_c) if record.get(pair_c) is not None else (None, "")
        if error or pair_error:
            bad.report(number, error or pair_error)
            continue
        rows.append((number, text, pair, record.get(label_c)))
    return rows
