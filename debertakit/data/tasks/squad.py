"""SQuAD v1.1 / v2.0 reader (the official JSON layout: data -> paragraphs -> qas -> answers).

JSON records have no line numbers of their own, so problems are located by their path in the document
(`data[3].paragraphs[1].qas[0]`) and the question id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from debertakit.data.tasks.records import Answer, BadRows, MalformedRowError, QAExample, TaskData


def read_squad(path: str | Path, *, skip_bad: bool = False) -> TaskData[QAExample]:
    """Read a SQuAD v1.1 or v2.0 JSON file.

    Every answer is checked against its context: `context[answer_start:answer_start + len(text)]` must equal the
    answer text. Questions marked `is_impossible` (v2.0) must have no answers; the others at least one.

    Args:
        path: the JSON file (e.g. `squad/dev-v1.1-part1.json`).
        skip_bad: skip malformed questions (counted in `TaskData.skipped`) instead of raising.

    Returns:
        One `QAExample` per question, in file order.

    Raises:
        MalformedRowError: the file is not the SQuAD layout, or a question is malformed (naming where), unless
            `skip_bad` (a file that is not JSON or has no `data` list always raises).
    """
    bad = BadRows(path, skip_bad)
    try:
        with open(path, encoding="utf-8-sig") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise MalformedRowError(path, e.lineno, f"not valid JSON ({e.msg}, column {e.colno})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise MalformedRowError(path, 0, 'expected a JSON object with a "data" list (the SQuAD layout)')
    examples: list[QAExample] = []
    for i, article in enumerate(doc["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            bad.report(0, 'expected an object with a "paragraphs" list', f"data[{i}]")
            continue
        for j, paragraph in enumerate(paragraphs):
            where = f"data[{i}].paragraphs[{j}]"
            if not (isinstance(paragraph, dict) and isinstance(paragraph.get("context"), str)):
                bad.report(0, 'expected an object with a "context" string and a "qas" list', where)
                continue
            for k, qa in enumerate(paragraph.get("qas", [])):
                example = _question(qa, paragraph["context"], str(article.get("title", "")))
                if isinstance(example, str):
                    qid = qa.get("id") if isinstance(qa, dict) else None
                    bad.report(0, example, f"{where}.qas[{k}]" + (f", id {qid}" if qid else ""))
                    continue
                examples.append(example)
    return bad.finish(examples)


def _question(qa: Any, context: str, title: str) -> QAExample | str:
    """Build one example, or return the reason the question is malformed."""
    if not isinstance(qa, dict):
        return f"expected a question object, got {type(qa).__name__}"
    for key in ("id", "question"):
        if not isinstance(qa.get(key), str) or not qa[key].strip():
            return f'missing or empty "{key}"; expected a non-empty string'
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        return f'"is_impossible" is {impossible!r}; expected true or false'
    raw_answers = qa.get("answers", [])
    if not isinstance(raw_answers, list):
        return f'"answers" is {type(raw_answers).__name__}; expected a list'
    answers = []
    for a in raw_answers:
        if not (
            isinstance(a, dict) and isinstance(a.get("text"), str) and isinstance(a.get("answer_start"), int)
        ):
            return f'answer {a!r}; expected {{"text": str, "answer_start": int}}'
        text, start = a["text"], a["answer_start"]
        if start < 0 or context[start : start + len(text)] != text:
            found = context[max(start, 0) : max(start, 0) + len(text)]
            return f"answer {text!r} at char {start} does not match the context there ({found!r})"
        answers.append(Answer(text, start))
    if impossible and answers:
        return f"is_impossible is true but {len(answers)} answer(s) are given; expected none"
    if not impossible and not answers:
        return "no answers; expected at least one (or is_impossible: true for SQuAD v2.0)"
    return QAExample(qa["id"], qa["question"].strip(), context, tuple(answers), impossible, title)
