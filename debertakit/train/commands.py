"""Command-line entries of pretraining: ``debertakit pretrain`` and ``debertakit plot``."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing

from debertakit.train.pretrain import PretrainConfig


def _flat_command(cls, run, summary: str):
    """A function whose keyword-only parameters are the dataclass's fields (so that a YAML file given with
    ``--config`` holds the fields at its top level and ``--max_steps 10`` overrides one)."""
    hints = typing.get_type_hints(cls)
    params = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = inspect.Parameter.empty
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name]
            )
        )

    def command(**kwargs):
        return run(cls(**kwargs))

    args_doc = cls.__doc__.split("Args:", 1)[1]
    command.__signature__ = inspect.Signature(params)
    command.__doc__ = f"{summary}\n\nArgs:{args_doc}"
    command.__name__ = run.__name__
    return command


def _run_pretrain(cfg: PretrainConfig) -> None:
    from debertakit.train.pretrain import pretrain

    result = pretrain(cfg)
    if result.get("stopped"):
        print(f"stopped at step {result['step']}; run the same command again to resume")
        return
    if "eval" in result:
        print("held-out: " + json.dumps({k: round(v, 4) for k, v in result["eval"].items()}))
    for name, path in result.get("models", {}).items():
        print(f"{name}: {path}")


pretrain = _flat_command(
    PretrainConfig,
    _run_pretrain,
    "Pretrain a DeBERTa model (MLM, or RTD with a generator); resumes from the run's latest checkpoint. "
    "Under torchrun it trains with DistributedDataParallel.",
)


def plot(run_dir: str, *, out: str | None = None) -> None:
    """Draw a run's loss and accuracy curves to a PNG.

    Args:
        run_dir: a pretraining run directory (holding metrics.jsonl).
        out: PNG path (default: RUN_DIR/curves.png).
    """
    from debertakit.viz.curves import plot_curves

    print(plot_curves(run_dir, out))
