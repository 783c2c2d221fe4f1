"""The `debertakit` command line: one entry point, subcommands generated from typed functions.

Each subcommand is a plain function with type hints and a Google-style docstring; jsonargparse turns it into a
parser. Parameters before `*` are positional, keyword-only parameters are `--options`. Options may be written
with dashes or underscores (`--vocab-size` or `--vocab_size`).

To add a subcommand, add one entry to `_commands()` (imports stay inside it so that `debertakit --help` is fast
and a broken optional feature cannot break the others).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable


def _commands() -> dict[str, Callable | dict[str, Callable]]:
    from debertakit.convert.commands import convert
    from debertakit.data.shards import prepare
    from debertakit.demo import demo
    from debertakit.evaluate.significance import compare
    from debertakit.inference.fill_mask import fill_mask_command
    from debertakit.tokenization.commands import tokenizer_commands
    from debertakit.train.commands import plot, pretrain

    return {
        "compare": compare,
        "convert": convert,
        "demo": demo,
        "fill-mask": fill_mask_command,
        "plot": plot,
        "prepare": prepare,
        "pretrain": pretrain,
        "tokenizer": tokenizer_commands(),
    }


def _normalise_option_names(argv: list[str]) -> list[str]:
    """`--vocab-size 8` -> `--vocab_size 8` (jsonargparse names options after the Python parameters)."""
    out = []
    for arg in argv:
        m = re.match(r"^--([A-Za-z][A-Za-z0-9-]*)(=.*)?$", arg)
        out.append("--" + m.group(1).replace("-", "_") + (m.group(2) or "") if m else arg)
    return out


def main(argv: list[str] | None = None) -> None:
    from jsonargparse import CLI

    argv = _normalise_option_names(list(sys.argv[1:] if argv is None else argv))
    CLI(_commands(), args=argv, as_positional=True, prog="debertakit")
