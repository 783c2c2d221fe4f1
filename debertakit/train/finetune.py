"""Fine-tuning: one readable function, `finetune(FinetuneConfig(...))`, and `finetune_seeds` for several seeds.

The recipe is the paper's (DeBERTa, Table 9): AdamW (β 0.9/0.999, ε 1e-6, weight decay 0.01 except biases and
norms), linear warmup then linear decay, gradient clipping at 1.0, learning rates by model size (`LR_BY_SIZE`),
optionally layer-wise learning-rate decay and SiFT (`debertakit.objectives.sift`). Batches are padded to their
longest row (dynamic padding), optionally grouped by length. The dev set is evaluated every epoch (or every
`eval_every` steps) with the task's metrics; the best evaluation on the task's main metric is kept as a
Hugging Face-format model directory with the tokenizer and `task.json`; early stopping ends the run after
`patience` evaluations without improvement.

Resume is exact: a training checkpoint (model, optimizer, scheduler, random states, step, best score, early
stopping counter) is written atomically at every evaluation (`debertakit.train.checkpoint`); the order of the
batches is a pure function of the seed and the step, so a resumed run continues as if never stopped.

Run directory::

    config.json         the options of the run
    metrics.jsonl       train log lines and dev evaluations (``split`` = "train" / "dev")
    checkpoints/        training checkpoints (last ``keep_checkpoints``)
    best/               the best model: config.json, model.safetensors, tokenizer files, task.json
    predictions.jsonl   dev predictions of the best model (written with it)
    result.json         {"metrics": best dev metrics, ...}: a run file for `debertakit compare`
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from debertakit.convert.checkpoint import atomic_write_text, load_pretrained, save_pretrained
from debertakit.data.features import Collator, Features, batch_indices, featurize
from debertakit.data.tasks import TaskSpec, get_task
from debertakit.objectives.sift import SiFT
from debertakit.predict import HEADS, TaskInfo, decode, run_model, score_predictions, write_predictions
from debertakit.train import checkpoint as ckpt
from debertakit.train.distributed import pick_device
from debertakit.train.optim import decay_groups, warmup_linear
from debertakit.train.pretrain import MetricLog, seed_process

# Table 9 of the DeBERTa paper (and the DeBERTa-v3 fine-tuning scripts for the small sizes): learning-rate
# ranges searched per model size, and the default taken when --lr is not given.
LR_BY_SIZE: tuple[tuple[int, tuple[float, ...], float], ...] = (
    # (hidden size up to, range searched, default)
    (256, (5e-5, 1e-4, 2e-4), 1e-4),  # tiny / small test sizes (not in the paper)
    (384, (3e-5, 4.5e-5, 5e-5, 6e-5), 4.5e-5),  # v3-xsmall
    (768, (1.5e-5, 2e-5, 3e-5, 4e-5), 2e-5),  # base, v3-small
    (1024, (5e-6, 8e-6, 9e-6, 1e-5), 8e-6),  # large
    (10**9, (3e-6, 5e-6, 6e-6, 8e-6), 5e-6),  # v2 xlarge / xxlarge
)


def default_lr(hidden_size: int) -> float:
    """The default peak learning rate of a model of this hidden size (`LR_BY_SIZE`)."""
    return next(lr for limit, _, lr in LR_BY_SIZE if hidden_size <= limit)


@dataclass
class FinetuneConfig:
    """Options of a fine-tuning run.

    Args:
        task: task name (sst2, cola, mrpc, stsb, rte, mnli, squad, squad_v2, conll2003, ner,
            multiple_choice, text_classification, text_regression, ...).
        model: a Hugging Face-format DeBERTa directory (a pretrained or converted checkpoint), or a preset name
            (e.g. small-v3) for a randomly initialised model.
        train: training file in the task's format.
        dev: dev file in the task's format.
        out: run directory.
        tokenizer: tokenizer directory (default: the model directory).
        train_limit: use only the first N training examples.
        dev_limit: use only the first N dev examples (after dev_offset).
        dev_offset: skip the first N dev examples (e.g. to score on other questions than those trained on when
            train and dev are one file).
        max_length: tokens per row (default 128 for sentences, 384 for QA, 256 for NER / multiple choice).
        doc_stride: QA: context tokens shared by consecutive windows.
        epochs: passes over the training data (ignored when max_steps is given).
        max_steps: optimizer steps of the run.
        batch_size: rows per micro-batch.
        grad_accum: micro-batches per optimizer step.
        eval_batch_size: rows per forward pass in evaluation.
        lr: peak learning rate (default by model size, see LR_BY_SIZE).
        layer_decay: layer-wise learning-rate decay: layer l of L gets lr·decay^(L+1-l), the embeddings
            lr·decay^(L+1), the head lr (1.0 = off).
        warmup_ratio: warmup steps as a fraction of all steps (used when warmup_steps is not given).
        warmup_steps: linear warmup steps.
        weight_decay: AdamW weight decay (not on biases and norms).
        adam_eps: AdamW ε.
        max_grad_norm: gradient clipping (0 = off).
        hidden_dropout: dropout of the backbone and head (default: the checkpoint's).
        sift: add the SiFT adversarial term.
        sift_weight: λ of SiFT.
        sift_init_std: σ of SiFT's initial perturbation.
        sift_step_size: η of SiFT's ascent step.
        eval_every: steps between dev evaluations (0: at the end of every epoch).
        patience: early stopping: stop after this many evaluations without improvement (0 = never).
        group_by_length: batch rows of similar length together.
        seed: seed of the head initialisation, data order, dropout and SiFT noise.
        seeds: several seeds separated by commas (e.g. 1,2,3): one run per seed under OUT/seed-N, a summary
            in OUT/summary.json and the run files in OUT/runs/ for `debertakit compare`.
        precision: "auto" (bf16 autocast on GPU, fp32 on CPU), "fp32" or "bf16".
        device: "auto", "cpu", "cuda", ...
        num_threads: torch CPU threads (None: torch's default).
        log_every: steps between train log lines.
        keep_checkpoints: training checkpoints kept.
        resume: continue from the latest checkpoint in OUT/checkpoints when there is one.
        stop_after: stop after this many steps of this invocation (saving a checkpoint); resume later.
        skip_bad: skip malformed rows of the data files (counted) instead of stopping.
        progress: show progress bars.
    """

    task: str
    model: str
    train: str
    dev: str
    out: str = "runs/finetune"
    tokenizer: str | None = None
    train_limit: int | None = None
    dev_limit: int | None = None
    dev_offset: int = 0
    max_length: int | None = None
    doc_stride: int = 128
    epochs: float = 3.0
    max_steps: int | None = None
    batch_size: int = 32
    grad_accum: int = 1
    eval_batch_size: int = 64
    lr: float | None = None
    layer_decay: float = 1.0
    warmup_ratio: float = 0.1
    warmup_steps: int | None = None
    weight_decay: float = 0.01
    adam_eps: float = 1e-6
    max_grad_norm: float = 1.0
    hidden_dropout: float | None = None
    sift: bool = False
    sift_weight: float = 5.0
    sift_init_std: float = 1e-2
    sift_step_size: float = 1e-4
    eval_every: int = 0
    patience: int = 0
    group_by_length: bool = False
    seed: int = 42
    seeds: str | None = None
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    device: str = "auto"
    num_threads: int | None = None
    log_every: int = 10
    keep_checkpoints: int = 2
    resume: bool = True
    stop_after: int | None = None
    skip_bad: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        get_task(self.task)  # names the known tasks when unknown
        for name in ("batch_size", "grad_accum", "eval_batch_size", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; expected >= 1")
        for name in ("train_limit", "dev_limit", "max_steps", "stop_after"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}; expected >= 1 or None")
        if self.epochs <= 0:
            raise ValueError(f"epochs={self.epochs}; expected > 0")
        if not 0 < self.layer_decay <= 1:
            raise ValueError(f"layer_decay={self.layer_decay}; expected in (0, 1]")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio={self.warmup_ratio}; expected in [0, 1)")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"lr={self.lr}; expected > 0")
        if self.dev_offset < 0:
            raise ValueError(f"dev_offset={self.dev_offset}; expected >= 0")
        if self.eval_every < 0 or self.patience < 0:
            raise ValueError(f"eval_every={self.eval_every}, patience={self.patience}; expected >= 0")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision={self.precision!r}; expected auto, fp32 or bf16")
        if self.seeds is not None:
            parse_seeds(self.seeds)


def parse_seeds(text: str | int | tuple | list) -> list[int]:
    """`"1,2,3"` -> [1, 2, 3]."""
    if isinstance(text, int):
        return [text]
    parts = text if isinstance(text, (list, tuple)) else str(text).split(",")
    try:
        seeds = [int(str(p).strip()) for p in parts if str(p).strip()]
    except ValueError:
        raise ValueError(f"seeds {text!r}; expected integers separated by commas, e.g. 1,2,3") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {text!r}; expected distinct integers separated by commas, e.g. 1,2,3")
    return seeds


# ---------------------------------------------------------------------------------------------------- set-up
@dataclass
class TaskData:
    """The featurised train and dev sets of a run."""

    spec: TaskSpec
    labels: list[str] | None
    train: Features
    dev: Features
    dev_examples: list[Any]


def load_data(cfg: FinetuneConfig, tokenizer: Any) -> TaskData:
    spec = get_task(cfg.task)
    train = spec.read(cfg.train, skip_bad=cfg.skip_bad)
    dev = spec.read(cfg.dev, skip_bad=cfg.skip_bad)
    labels = list(spec.labels or train.labels or []) or None
    if spec.kind == "classification" and labels is None:
        raise ValueError(f"{cfg.train}: no label names for task {spec.name}")
    if dev.labels and labels and spec.labels is None and set(dev.labels) - set(labels):
        raise ValueError(
            f"{cfg.dev}: labels {sorted(set(dev.labels) - set(labels))} do not occur in {cfg.train}"
        )
    train_ex = train.examples[: cfg.train_limit]
    end = None if cfg.dev_limit is None else cfg.dev_offset + cfg.dev_limit
    dev_ex = dev.examples[cfg.dev_offset : end]
    if not train_ex or not dev_ex:
        raise ValueError(f"no examples: {len(train_ex)} in {cfg.train}, {len(dev_ex)} in {cfg.dev}")
    kw = dict(labels=labels, max_length=cfg.max_length, stride=cfg.doc_stride)
    return TaskData(
        spec,
        labels,
        featurize(spec.kind, train_ex, tokenizer, **kw),
        featurize(spec.kind, dev_ex, tokenizer, **kw),
        dev_ex,
    )


def build_task_model(cfg: FinetuneConfig, data: TaskData, tokenizer: Any) -> nn.Module:
    """The pretrained backbone with a fresh head for the task (or a random model from a preset name)."""
    from debertakit.config import PRESETS, DebertaConfig
    from debertakit.model import build_model

    head = HEADS[data.spec.kind]
    overrides: dict[str, Any] = {}
    if data.spec.kind in ("classification", "ner"):
        overrides |= {"num_labels": len(data.labels), "label_names": tuple(data.labels)}
    elif data.spec.kind == "regression":
        overrides |= {"num_labels": 1, "label_names": None}
    if cfg.hidden_dropout is not None:
        overrides["hidden_dropout"] = cfg.hidden_dropout
    if Path(cfg.model).is_dir():
        model = load_pretrained(cfg.model, head, ignore_mismatched_head=True, **overrides)
    elif cfg.model in PRESETS:
        mcfg = DebertaConfig.preset(
            cfg.model, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id, **overrides
        )
        model = build_model(mcfg, head)
    else:
        raise FileNotFoundError(f"model {cfg.model!r}: no such directory and not a preset name")
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is {model.cfg.vocab_size}"
        )
    return model


def parameter_groups(model: nn.Module, lr: float, layer_decay: float, weight_decay: float) -> list[dict]:
    """AdamW groups: no decay on biases and norms (`decay_groups`), and with layer-wise LR decay the embeddings at
    depth 0, encoder layer i (and the relative table, the conv branch, shared by the layers: depth 1) at i + 1,
    the head at L + 1 with the full rate."""
    n_layers = len(model.deberta.encoder.layers)
    depth_of: dict[int, int] = {}
    for name, p in model.named_parameters():
        if name.startswith("deberta.embeddings."):
            depth = 0
        elif name.startswith("deberta.encoder.layers."):
            depth = int(name.split(".")[3]) + 1
        elif name.startswith("deberta."):
            depth = 1
        else:
            depth = n_layers + 1
        depth_of[id(p)] = depth
    groups = []
    for depth in sorted(set(depth_of.values())):
        params = [p for p in model.parameters() if depth_of[id(p)] == depth]
        scale = layer_decay ** (n_layers + 1 - depth)
        for g in decay_groups(params, model, weight_decay):
            if g["params"]:
                groups.append({**g, "lr": lr * scale, "depth": depth})
    return groups


def _amp(cfg: FinetuneConfig, device: torch.device) -> torch.dtype | None:
    if cfg.precision == "fp32" or (cfg.precision == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


# ------------------------------------------------------------------------------------------------ evaluation
def evaluate(
    model: nn.Module, data: TaskData, cfg: FinetuneConfig, tokenizer: Any, device, amp
) -> tuple[dict[str, float], list[dict]]:
    """The task's metrics on the dev set, and the decoded predictions."""
    logits = run_model(
        model,
        data.dev,
        batch_size=cfg.eval_batch_size,
        pad_token_id=tokenizer.pad_token_id,
        device=device,
        amp=amp,
        progress=cfg.progress,
        desc="dev",
    )
    preds = decode(
        data.spec.kind,
        logits,
        data.dev,
        data.dev_examples,
        data.labels,
        version_2=data.spec.name == "squad_v2",
    )
    metrics = score_predictions(data.spec.name, data.spec.kind, preds, data.dev_examples, data.labels)
    return metrics, preds


# ---------------------------------------------------------------------------------------------------- the run
def finetune(cfg: FinetuneConfig) -> dict[str, Any]:
    """Run (or resume) one fine-tuning run. Returns the best dev metrics, the step they were reached at and the
    path of the best model."""
    from debertakit.tokenization import load_tokenizer

    # ---- set-up: data, model, optimizer
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    out = Path(cfg.out)
    device = pick_device(cfg.device)
    amp = _amp(cfg, device)
    tok_dir = cfg.tokenizer or cfg.model
    if not Path(tok_dir).is_dir():
        raise FileNotFoundError(f"tokenizer directory {tok_dir!r} not found; pass --tokenizer DIR")
    tokenizer = load_tokenizer(tok_dir)
    data = load_data(cfg, tokenizer)
    seed_process(cfg.seed)  # the head's initialisation depends on the seed
    model = build_task_model(cfg, data, tokenizer).to(device)
    lr = cfg.lr or default_lr(model.cfg.hidden_size)

    collate = Collator(tokenizer.pad_token_id)
    lengths = data.train.lengths()
    micro_per_epoch = math.ceil(len(data.train) / cfg.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / cfg.grad_accum)
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * micro_per_epoch / cfg.grad_accum))
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * total)
    optimizer = torch.optim.AdamW(
        parameter_groups(model, lr, cfg.layer_decay, cfg.weight_decay),
        lr=lr,
        betas=(0.9, 0.999),
        eps=cfg.adam_eps,
    )
    scheduler = warmup_linear(optimizer, min(warmup, total), total)
    sift = SiFT(cfg.sift_weight, cfg.sift_init_std, cfg.sift_step_size) if cfg.sift else None
    eval_every = cfg.eval_every or steps_per_epoch
    main = data.spec.main_metric

    @functools.lru_cache(maxsize=4)
    def epoch_batches(epoch: int) -> list[list[int]]:
        return batch_indices(
            lengths, cfg.batch_size, seed=cfg.seed * 1000 + epoch, group_by_length=cfg.group_by_length
        )

    def micro_batch(m: int) -> dict[str, torch.Tensor]:
        """Micro-batch m of the run: a pure function of the seed and m (exact resume)."""
        rows = epoch_batches(m // micro_per_epoch)[m % micro_per_epoch]
        return {k: v.to(device) for k, v in collate([data.train.inputs[i] for i in rows]).items()}

    # ---- state, or the state of the latest checkpoint
    log = MetricLog(out, True, tensorboard=False)
    state: dict[str, Any] = {"step": 0, "best": None, "best_step": 0, "bad_evals": 0, "acc": {}}
    latest = ckpt.latest_checkpoint(out / "checkpoints") if cfg.resume else None
    if latest is not None:
        saved = ckpt.load_checkpoint(latest)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        ckpt.set_rng_state(saved["rng"])
        state = saved["state"]
        log.truncate(state["step"])
        print(f"resumed from {latest} (step {state['step']})")
    else:
        log.truncate(-1)
        shutil.rmtree(out / "best", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.json", json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")

    def save_checkpoint() -> None:
        ckpt.save_checkpoint(
            out / "checkpoints",
            state["step"],
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": ckpt.rng_state(),
                "state": state,
                "config": dataclasses.asdict(cfg),
            },
            keep=cfg.keep_checkpoints,
        )

    def save_best() -> None:
        best = out / "best"
        save_pretrained(model, best)
        tokenizer.save_pretrained(best)
        TaskInfo(data.spec.name, data.spec.kind, data.labels, cfg.max_length, cfg.doc_stride).save(best)

    # ---- one optimizer step
    def train_step(step: int) -> dict[str, float]:
        optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "sift_loss": 0.0}
        for micro in range(cfg.grad_accum):
            batch = micro_batch(step * cfg.grad_accum + micro)
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                out_ = model(**batch)
                loss = out_.loss
                if sift is not None:
                    logits = (
                        (out_.start_logits, out_.end_logits) if hasattr(out_, "start_logits") else out_.logits
                    )
                    adv = sift.loss(model, batch, logits, data.spec.kind)
                    loss = loss + adv
                    sums["sift_loss"] += float(adv.detach()) / cfg.grad_accum
            (loss / cfg.grad_accum).backward()
            sums["loss"] += float(loss.detach()) / cfg.grad_accum
        if cfg.max_grad_norm > 0:
            sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
        optimizer.step()
        scheduler.step()
        if sift is None:
            del sums["sift_loss"]
        return sums

    # ---- the loop
    from tqdm.auto import tqdm

    bar = tqdm(
        total=total, initial=state["step"], desc=f"finetune {data.spec.name}", disable=not cfg.progress
    )
    started, tick = state["step"], time.perf_counter()
    model.train()
    stopped_early = False
    while state["step"] < total:
        metrics = train_step(state["step"])
        state["step"] += 1
        step = state["step"]
        acc = state["acc"]
        for k, v in metrics.items():
            acc[k] = acc.get(k, 0.0) + v
        acc["n"] = acc.get("n", 0) + 1
        bar.update(1)
        if step % cfg.log_every == 0 or step == total:
            n = acc.pop("n")
            record = {"step": step, "split": "train", "epoch": step / steps_per_epoch}
            record |= {k: acc.pop(k) / n for k in list(acc)}
            record["lr"] = scheduler.get_last_lr()[-1]
            log.write(record)
            bar.set_postfix(loss=f"{record['loss']:.4f}")
        if step % eval_every == 0 or step == total:
            scores, preds = evaluate(model, data, cfg, tokenizer, device, amp)
            model.train()
            improved = state["best"] is None or scores[main] > state["best"][main]
            if improved:
                state["best"], state["best_step"], state["bad_evals"] = scores, step, 0
                save_best()
                write_predictions(out / "predictions.jsonl", _ids(preds, data.dev_examples))
            else:
                state["bad_evals"] += 1
            log.write(
                {"step": step, "split": "dev", "epoch": step / steps_per_epoch, **scores, "best": improved}
            )
            stopped_early = cfg.patience > 0 and state["bad_evals"] >= cfg.patience
            save_checkpoint()
            if stopped_early:
                break
        if cfg.stop_after is not None and step - started >= cfg.stop_after and step < total:
            save_checkpoint()
            bar.close()
            log.close()
            return {"step": step, "stopped": True}
    bar.close()
    log.close()

    # ---- the run file (the best model's dev predictions were written when it was evaluated)
    scores = state["best"]
    result = {
        "task": data.spec.name,
        "seed": cfg.seed,
        "sift": cfg.sift,
        "main_metric": main,
        "metrics": scores,
        "best_step": state["best_step"],
        "steps": state["step"],
        "stopped_early": stopped_early,
        "lr": lr,
        "train_examples": data.train.num_examples,
        "train_rows": len(data.train),
        "dev_examples": data.dev.num_examples,
        "seconds": round(time.perf_counter() - tick, 1),
        "model": str(cfg.model),
        "best_model": str(out / "best"),
    }
    atomic_write_text(out / "result.json", json.dumps(result, indent=2) + "\n")
    return result


def _ids(preds: list[dict], examples: list[Any]) -> list[dict]:
    out = []
    for ex, p in zip(examples, preds):
        key = getattr(ex, "guid", None) or getattr(ex, "id", None)
        out.append({"id": key, **{k: v for k, v in p.items() if k != "id"}})
    return out


# ---------------------------------------------------------------------------------------------------- seeds
def finetune_seeds(cfg: FinetuneConfig) -> dict[str, Any]:
    """One run per seed of `cfg.seeds` under OUT/seed-N; OUT/runs/seed-N.json are the run files that
    `debertakit compare` reads; OUT/summary.json holds min / max / mean / std of every metric."""
    from debertakit.evaluate.significance import format_summary, summarise

    seeds = parse_seeds(cfg.seeds) if cfg.seeds is not None else [cfg.seed]
    out = Path(cfg.out)
    results = []
    for seed in seeds:
        run = dataclasses.replace(cfg, seed=seed, seeds=None, out=str(out / f"seed-{seed}"))
        result = finetune(run)
        if result.get("stopped"):
            return {"stopped": True, "seed": seed, "step": result["step"]}
        results.append(result)
        atomic_write_text(out / "runs" / f"seed-{seed}.json", json.dumps(result, indent=2) + "\n")
    summary = summarise([r["metrics"] for r in results])
    doc = {
        "task": results[0]["task"],
        "sift": cfg.sift,
        "seeds": seeds,
        "summary": {k: dataclasses.asdict(s) for k, s in summary.items()},
    }
    atomic_write_text(out / "summary.json", json.dumps(_nan_to_none(doc), indent=2) + "\n")
    text = format_summary(summary)
    atomic_write_text(out / "summary.md", text + "\n")
    return {"stopped": False, "runs": results, "summary": summary, "table": text}


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value
