"""Multiple-choice readers: SWAG-like CSV and RACE-like JSON / JSON lines.

CSV (header required): the context in `sent1` or `context`, an optional shared ending start / question in `sent2`
or `question`, the candidates in `ending0`, `ending1`, ... or `choice0`, `choice1`, ..., and an optional `label`
(index or letter). JSON: either RACE records `{"article", "questions", "options", "answers"}` (one example per
question) or plain records `{"context", "question", "choices", "label"}`; a `.json` file holds one record or a
list of them, a `.jsonl` file one record per line.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from debertakit.data.tasks._lines import csv_records, numbered_lines
from debertakit.data.tasks.records import BadRows, ChoiceExample, MalformedRowError, TaskData


def parse_choice_label(raw: Any, n_choices: int) -> int | str:
    """A label given as an index (int or digits) or a letter (`A` = 0); returns the index or an error message."""
    if isinstance(raw, str) and re.fullmatch(r"\s*[A-Za-z]\s*", raw):
        index = ord(raw.strip().upper()) - ord("A")
    elif isinstance(raw, int) and not isinstance(raw, bool):
        index = raw
    elif isinstance(raw, str) and re.fullmatch(r"\s*\d+\s*", raw):
        index = int(raw)
    else:
        return f"label {raw!r}; expected a choice index (0, 1, ...) or letter (A, B, ...)"
    if not 0 <= index < n_choices:
        return f"label {raw!r} points to choice {index}; expected one of the {n_choices} choices"
    return index


def read_multiple_choice(path: str | Path, *, skip_bad: bool = False) -> TaskData[ChoiceExample]:
    """Read a multiple-choice file (`.csv`, `.json` or `.jsonl`).

    Args:
        path: the file.
        skip_bad: skip malformed rows / records (counted in `TaskData.skipped`) instead of raising.

    Returns:
        One `ChoiceExample` per question.

    Raises:
        MalformedRowError: a row without choices, with an empty choice or a label out of range (naming file and
            line), unless `skip_bad`.
        ValueError: an unsupported file suffix.
    """
    suffix = Path(path).suffix.lower()
    bad = BadRows(path, skip_bad)
    if suffix == ".csv":
        examples = _read_csv(path, bad)
    elif suffix == ".jsonl":
        examples = []
        for number, line in numbered_lines(path, bad):
            if line.strip():
                examples += _from_json_line(line, number, bad, f"{Path(path).name}-{number}")
    elif suffix == ".json":
        examples = _read_json(path, bad)
    else:
        raise ValueError(f"multiple-choice file {path}: suffix {suffix!r}; expected .csv, .json or .jsonl")
    return bad.finish(examples)


def _choice_columns(header: list[str]) -> list[int]:
    for prefix in ("ending", "choice"):
        cols = [c for c in header if re.fullmatch(prefix + r"\d+", c)]
        if cols:
            return [header.index(c) for c in sorted(cols, key=lambda c: int(c[len(prefix) :]))]
    return []


def _column(header: list[str], *names: str) -> int | None:
    return next((header.index(n) for n in names if n in header), None)


def _read_csv(path: str | Path, bad: BadRows) -> list[ChoiceExample]:
    examples: list[ChoiceExample] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = [h.strip().lower() for h in next(reader, [])]
        choices = _choice_columns(header)
        context = _column(header, "sent1", "context")
        if not choices or context is None:
            raise MalformedRowError(
                path,
                1,
                f"header {header}; expected a `sent1` or `context` column and `ending0`/`choice0`, ...",
            )
        question, label = _column(header, "sent2", "question"), _column(header, "label")
        ident = _column(header, "id", "video-id")
        for number, row in csv_records(reader, header, bad):
            guid = row[ident] if ident is not None and row[ident] else f"{Path(path).name}-{number}"
            record = {
                "context": row[context],
                "question": row[question] if question is not None else "",
                "choices": [row[i] for i in choices],
                "label": row[label] if label is not None and row[label].strip() else None,
            }
            example = _example(record, guid)
            if isinstance(example, str):
                bad.report(number, example)
            else:
                examples.append(example)
    return examples


def _example(record: dict[str, Any], guid: str) -> ChoiceExample | str:
    choices = record.get("choices")
    if not isinstance(choices, list) or len(choices) < 2:
        return f"choices {choices!r}; expected a list of at least two strings"
    if not all(isinstance(c, str) and c.strip() for c in choices):
        return f"choices {choices!r}; expected non-empty strings"
    context, question = record.get("context", ""), record.get("question", "")
    if not isinstance(context, str) or not isinstance(question, str):
        return "context and question must be strings"
    label = None
    if record.get("label") is not None:
        label = parse_choice_label(record["label"], len(choices))
        if isinstance(label, str):
            return label
    return ChoiceExample(guid, context.strip(), question.strip(), tuple(c.strip() for c in choices), label)


def _from_record(record: Any, guid: str) -> list[ChoiceExample] | str:
    """Examples of one JSON record (RACE: one per question), or the reason it is malformed."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    guid = str(record.get("id", guid))
    if "article" in record:
        questions, options = record.get("questions"), record.get("options")
        answers = record.get("answers", [None] * len(questions or []))
        if not (isinstance(questions, list) and isinstance(options, list) and isinstance(answers, list)):
            return 'RACE record; expected "questions", "options" and "answers" lists'
        if not len(questions) == len(options) == len(answers):
            return f"{len(questions)} questions, {len(options)} option lists, {len(answers)} answers; expected equal"
        out = []
        for i, (q, opts, a) in enumerate(zip(questions, options, answers)):
            example = _example(
                {"context": record["article"], "question": q, "choices": opts, "label": a}, f"{guid}-{i}"
            )
            if isinstance(example, str):
                return f"question {i}: {example}"
            out.append(example)
        return out
    example = _example(record, guid)
    return example if isinstance(example, str) else [example]


def _from_json_line(line: str, number: int, bad: BadRows, guid: str) -> list[ChoiceExample]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        bad.report(number, f"not valid JSON ({e.msg}, column {e.colno})")
        return []
    examples = _from_record(record, guid)
    if isinstance(examples, str):
        bad.report(number, examples)
        return []
    return examples


def _read_json(path: str | Path, bad: BadRows) -> list[ChoiceExample]:
    try:
        with open(path, encoding="utf-8-sig") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise MalformedRowError(path, e.lineno, f"not valid JSON ({e.msg}, column {e.colno})") from e
    records = doc if isinstance(doc, list) else [doc]
    examples: list[ChoiceExample] = []
    for i, record in enumerate(records):
        out = _from_record(record, f"{Path(path).name}-{i}")
        if isinstance(out, str):
            bad.report(0, out, f"record {i}")
        else:
            examples += out
    return examples
