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
    from debertakit.experiments.runner import experiment_commands
    from debertakit.export.onnx import export
    from debertakit.inference.fill_mask import fill_mask_command
    from debertakit.nlg import generate_command, perplexity_command
    from debertakit.predict import predict
    from debertakit.tokenization.commands import tokenizer_commands
    from debertakit.train.commands import _finetune_command, plot, pretrain
    from debertakit.viz.attention import attention_map

    return {
        "attention-map": attention_map,
        "compare": compare,
        "convert": convert,
        "demo": demo,
        "experiment": experiment_commands(),
        "export": export,
        "fill-mask": fill_mask_command,
        "finetune": _finetune_command(),
        "generate": generate_command,
        "perplexity": perplexity_command,
        "plot": plot,
        "predict": predict,
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


def _bool_options(command: Callable) -> set[str]:
    import inspect

    return {
        name
        for name, p in inspect.signature(command).parameters.items()
        if p.annotation in (bool, "bool") and p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _expand_switches(argv: list[str], commands: dict) -> list[str]:
    """A boolean option given alone is a switch: `finetune --sift --lr 1e-4` -> `--sift true --lr 1e-4`."""
    command = commands.get(argv[0]) if argv else None
    if not callable(command):
        return argv
    flags = _bool_options(command)
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("--") and arg[2:] in flags and (nxt is None or nxt.startswith("--")):
            out.append("true")
    return out


def main(argv: list[str] | None = None) -> None:
    from jsonargparse import CLI

    commands = _commands()
    argv = _normalise_option_names(list(sys.argv[1:] if argv is None else argv))
    argv = _expand_switches(argv, commands)
    CLI(commands, args=argv, as_positional=True, prog="debertakit")
