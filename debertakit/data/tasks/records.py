"""Plain typed records produced by the task readers, and the container that carries them.

Every reader returns a `TaskData`: the examples, the label names (when the task has classes), and how many
malformed rows were skipped. Records are frozen dataclasses of Python strings and numbers, independent of any
tokenizer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

logger = logging.getLogger("debertakit.data")


class MalformedRowError(ValueError):
    """A row of an input file that cannot be read.

    Attributes:
        path: the file.
        line: 1-based line number of the row (for JSON files without lines: the line where the record starts,
            or 0 when unknown; `where` then says which record).
        where: a location inside the file when lines do not identify the record (e.g. `data[3].paragraphs[1]`).
        reason: what is wrong and what was expected.
    """

    def __init__(self, path: str | Path, line: int, reason: str, where: str = "") -> None:
        self.path = str(path)
        self.line = line
        self.where = where
        self.reason = reason
        loc = f"{self.path}:{line}" if line else self.path
        if where:
            loc += f" ({where})"
        super().__init__(f"{loc}: {reason}")


@dataclass(frozen=True)
class TextExample:
    """One sentence or sentence pair (classification or regression).

    Attributes:
        guid: identifier, `<file name>-<line>` unless the file carries ids.
        text: first sentence.
        text_pair: second sentence, or None for single-sentence tasks.
        label: class index into `TaskData.labels` (classification), a float (regression), or None when the file
            has no labels (test sets).
    """

    guid: str
    text: str
    text_pair: str | None = None
    label: int | float | None = None


@dataclass(frozen=True)
class Answer:
    """One gold answer of a QA example: its text and the character offset where it starts in the context."""

    text: str
    start: int

    @property
    def end(self) -> int:
        """Character offset one past the answer's last character."""
        return self.start + len(self.text)


@dataclass(frozen=True)
class QAExample:
    """One extractive question (SQuAD v1.1 / v2.0).

    Attributes:
        id: the question id.
        question: the question text.
        context: the paragraph the answer is taken from.
        answers: gold answers (several in dev sets, possibly repeated); empty when `is_impossible`.
        is_impossible: True for SQuAD v2.0 questions without an answer in the context.
        title: title of the article the paragraph comes from.
    """

    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]
    is_impossible: bool = False
    title: str = ""


@dataclass(frozen=True)
class TokenExample:
    """One sentence of a token-classification (NER) file: words and one tag per word (IOB2)."""

    guid: str
    tokens: tuple[str, ...]
    tags: tuple[str, ...]


@dataclass(frozen=True)
class ChoiceExample:
    """One multiple-choice question (SWAG / RACE style).

    Attributes:
        guid: identifier.
        context: the passage or first sentence (may be empty).
        question: the question or the start of the ending shared by all choices (may be empty).
        choices: the candidate answers / endings.
        label: index of the correct choice, or None when the file has no labels.
    """

    guid: str
    context: str
    question: str
    choices: tuple[str, ...]
    label: int | None = None


E = TypeVar("E")


@dataclass
class TaskData(Generic[E]):
    """What a reader returns: the examples of one file and what was learnt while reading it.

    Attributes:
        examples: the records, in file order.
        path: the file read.
        labels: class names (index = label id) for classification and tagging tasks, else None.
        skipped: number of malformed rows skipped (only non-zero with `skip_bad=True`).
        problems: one message per skipped row (`file:line: reason`).
    """

    examples: list[E]
    path: Path
    labels: tuple[str, ...] | None = None
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[E]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> E:
        return self.examples[i]


class BadRows:
    """Collects malformed rows of one file: raises on the first by default, or counts them when skipping."""

    def __init__(self, path: str | Path, skip_bad: bool) -> None:
        self.path = Path(path)
        self.skip_bad = skip_bad
        self.problems: list[str] = []

    def report(self, line: int, reason: str, where: str = "") -> None:
        """Raise `MalformedRowError`, or record the row as skipped when `skip_bad` is set."""
        err = MalformedRowError(self.path, line, reason, where)
        if not self.skip_bad:
            raise err
        self.problems.append(str(err))

    def finish(self, examples: list[E], labels: tuple[str, ...] | None = None) -> TaskData[E]:
        """Build the `TaskData`, logging a warning with the count when rows were skipped."""
        if self.problems:
            logger.warning(
                "%s: skipped %d malformed row(s); first: %s", self.path, len(self.problems), self.problems[0]
            )
        return TaskData(examples, self.path, labels, len(self.problems), list(self.problems))
