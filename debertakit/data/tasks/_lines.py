"""Reading text and CSV files with 1-based line numbers (UTF-8, an optional BOM, LF or CRLF)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from debertakit.data.tasks.records import BadRows


def numbered_lines(path: str | Path, bad: BadRows) -> Iterator[tuple[int, str]]:
    """Yield `(line_number, line)` without the line ending; undecodable lines go to `bad`.

    The UTF-8 byte-order mark that some files start with (e.g. the MSR paraphrase corpus) is removed.
    """
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad.report(number, f"not valid UTF-8 ({e.reason} at byte {e.start}); expected UTF-8 text")
                continue
            yield number, line.rstrip("\r\n")


def csv_records(
    reader: Iterable[list[str]], header: list[str], bad: BadRows
) -> Iterator[tuple[int, list[str]]]:
    """Yield `(line_number, row)` for the rows after the header of a `csv.reader`; blank rows are skipped and
    rows with another number of columns than the header go to `bad`. Line numbers follow the reader, so a
    quoted cell spanning several lines is reported at the line it starts on."""
    last = reader.line_num
    for row in reader:
        number, last = last + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            bad.report(number, f"{len(row)} columns; expected {len(header)} like the header")
            continue
        yield number, row
