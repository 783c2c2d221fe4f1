"""Reading text files line by line with 1-based line numbers (UTF-8, an optional BOM, LF or CRLF)."""

from __future__ import annotations

from collections.abc import Iterator
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
