"""CoNLL-2003 style column files: one token per line, columns separated by whitespace, sentences separated by
blank lines, optional `-DOCSTART-` lines between documents."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from debertakit.data.tasks._lines import numbered_lines
from debertakit.data.tasks.records import BadRows, TaskData, TokenExample

CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
_TAG = re.compile(r"^(O|[BI]-\S+)$")


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """Convert IOB1 tags (an entity may start with I-) to IOB2 (every entity starts with B-)."""
    out: list[str] = []
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            tag = "B-" + tag[2:]
        out.append(tag)
        prev = tag
    return out


def _iob2_error(tags: list[str]) -> tuple[int, str] | None:
    """Index and message of the first I- tag that does not continue an entity of its type, if any."""
    prev = "O"
    for i, tag in enumerate(tags):
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            return i, (
                f"tag {tag} follows {prev}; IOB2 starts every entity with B-{tag[2:]} "
                "(read IOB1 files with scheme='IOB1')"
            )
        prev = tag
    return None


def read_conll(
    path: str | Path,
    *,
    labels: Sequence[str] | None = None,
    scheme: Literal["IOB2", "IOB1"] = "IOB2",
    token_column: int = 0,
    tag_column: int = -1,
    skip_bad: bool = False,
) -> TaskData[TokenExample]:
    """Read a CoNLL-style column file into sentences of (tokens, tags).

    Args:
        path: the file (e.g. `conll2003/eng.train`).
        labels: the allowed tags, in label-id order; by default the tags found, `O` first then sorted.
        scheme: tagging scheme of the file; IOB1 files are converted to IOB2 while reading, IOB2 files are
            checked (an I-X must continue an X entity).
        token_column: column holding the word.
        tag_column: column holding the tag (the last by default).
        skip_bad: skip sentences with a malformed line (counted in `TaskData.skipped`) instead of raising.

    Returns:
        One `TokenExample` per sentence, tags in IOB2; `TaskData.labels` is the tag list.

    Raises:
        MalformedRowError: a line with too few or inconsistent columns, a tag that is not O / B-X / I-X or not in
            `labels`, or an IOB2 violation (naming file and line), unless `skip_bad`.
    """
    if scheme not in ("IOB2", "IOB1"):
        raise ValueError(f"scheme {scheme!r}; expected 'IOB2' or 'IOB1'")
    bad = BadRows(path, skip_bad)
    allowed = set(labels) if labels is not None else None
    name = Path(path).name
    examples: list[TokenExample] = []
    ncols = 0
    rows: list[tuple[int, str, str]] = []  # (line, token, tag) of the current sentence
    broken = False

    def flush() -> None:
        nonlocal rows, broken
        if rows and not broken:
            tokens = [r[1] for r in rows]
            tags = [r[2] for r in rows]
            if scheme == "IOB1":
                tags = iob1_to_iob2(tags)
            error = _iob2_error(tags)
            if error:
                bad.report(rows[error[0]][0], error[1])
            else:
                examples.append(TokenExample(f"{name}-{rows[0][0]}", tuple(tokens), tuple(tags)))
        rows, broken = [], False

    for number, line in numbered_lines(path, bad):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            flush()
            continue
        if broken:
            continue
        reason = ""
        if len(fields) < 2:
            reason = f"{len(fields)} column; expected a token and a tag separated by whitespace"
        elif ncols and len(fields) != ncols:
            reason = f"{len(fields)} columns; expected {ncols} like the first token line"
        else:
            ncols = ncols or len(fields)
            tag = fields[tag_column]
            if not _TAG.match(tag):
                reason = f"tag {tag!r}; expected O, B-<type> or I-<type>"
            elif allowed is not None and tag not in allowed:
                reason = f"tag {tag!r} is not one of {list(labels or [])}"
        if reason:
            bad.report(number, reason)
            broken = True
            continue
        rows.append((number, fields[token_column], fields[tag_column]))
    flush()
    if labels is None:
        found = {t for e in examples for t in e.tags} - {"O"}
        labels = ["O", *sorted(found, key=lambda t: (t[2:], t[0]))]
    return bad.finish(examples, tuple(labels))
