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


def _run_finetune(cfg) -> None:
    from debertakit.train.finetune import finetune, finetune_seeds

    if cfg.seeds is None:
        result = finetune(cfg)
        if result.get("stopped"):
            print(f"stopped at step {result['step']}; run the same command again to resume")
            return
        print(
            f"best dev ({result['main_metric']} at step {result['best_step']}): "
            + json.dumps(_rounded(result["metrics"]))
        )
        print(f"model: {result['best_model']}")
        return
    result = finetune_seeds(cfg)
    if result.get("stopped"):
        print(
            f"stopped at step {result['step']} of seed {result['seed']}; run the same command again to resume"
        )
        return
    for r in result["runs"]:
        print(f"seed {r['seed']}: " + json.dumps(_rounded(r["metrics"])))
    print(result["table"])
    print(f"run files: {cfg.out}/runs (compare two sets with `debertakit compare A/runs B/runs`)")


def _rounded(metrics: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}


def _finetune_command():
    from debertakit.train.finetune import FinetuneConfig

    return _flat_command(
        FinetuneConfig,
        _run_finetune,
        "Fine-tune a DeBERTa model on a task (GLUE, SQuAD, NER, multiple choice, your own CSV/JSONL) with the "
        "paper's recipe; keeps the best dev checkpoint; resumes from the run's latest checkpoint; --seeds 1,2,3 "
        "runs several seeds and summarises them.",
    )
