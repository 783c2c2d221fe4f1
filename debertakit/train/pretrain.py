"""Pretraining: MLM (DeBERTa v1/v2, with the Enhanced Mask Decoder) or RTD + GDES (DeBERTa-v3).

`pretrain(PretrainConfig(...))` is one readable function: set up, then for every step read the step's batches
(a pure function of the step), forward, backward, clip, step the optimizer(s); log, evaluate and save on
schedule. Resuming loads the latest checkpoint of the run directory and continues with the same losses as an
uninterrupted run (bit-identical on CPU with a fixed number of threads). Under torchrun the same function runs
DistributedDataParallel; each process reads its own rows and only process 0 writes.

Run directory::

    config.json              the options of the run
    metrics.jsonl            one JSON object per log / evaluation (``split`` = "train" or "eval")
    checkpoints/step-*.pt    training checkpoints (last ``keep_checkpoints``)
    final/generator|discriminator|model   Hugging Face-loadable models (``save_pretrained``), with tokenizer
    tensorboard/             when the tensorboard package is installed
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from debertakit.config import DebertaConfig
from debertakit.convert.checkpoint import atomic_write_text, save_pretrained
from debertakit.data.masking import MaskingConfig
from debertakit.data.packing import PackedDataset, RowBatcher, vocabulary_of
from debertakit.data.shards import ShardSet
from debertakit.model.tasks import DebertaForMaskedLM, DebertaForReplacedTokenDetection
from debertakit.objectives.causal import CausalLMObjective, MTObjective
from debertakit.objectives.mlm import MaskedLMObjective
from debertakit.objectives.rtd import ReplacedTokenDetectionObjective, generator_config
from debertakit.train import checkpoint as ckpt
from debertakit.train import distributed
from debertakit.train.optim import build_optimizer, warmup_linear


@dataclass
class PretrainConfig:
    """Options of a pretraining run (YAML files in configs/pretrain/ set them; the command line overrides).

    Args:
        data: directory written by `debertakit prepare` (train shards, and valid shards for evaluation).
        out: run directory (checkpoints, metrics, final models).
        objective: "rtd" (DeBERTa-v3: generator + discriminator), "mlm" (DeBERTa v1/v2), "causal" (next-token
            prediction with the triangular mask) or "mt" (DeBERTa-MT: MLM + causal LM, UniLM style).
        model: a DebertaConfig preset name (e.g. deberta-v3-base, small-v3, tiny-v3) or a DebertaConfig JSON.
        variant: an ablation of the paper's Table 4 applied to the model (debertakit.experiments.VARIANTS:
            full, no-emd, no-c2p, no-p2c, no-emd-c2p, no-emd-p2c, roberta); None = the model as given.
        mt_schedule: DeBERTa-MT: "alternate" (MLM and LM batches in turn) or "mix" (both losses every batch).
        lm_weight: DeBERTa-MT: weight of the LM loss with mt_schedule "mix".
        model_overrides: DebertaConfig fields to change; vocab_size and pad_token_id follow the tokenizer
            unless given here.
        generator_layers: generator depth (RTD); default half the discriminator's.
        generator_overrides: other DebertaConfig fields of the generator (e.g. hidden_size).
        sharing: RTD embedding sharing: "gdes" (gradient-disentangled), "es" (plain) or "none".
        rtd_weight: λ, the weight of the discriminator loss (10 official DeBERTa-v3, 50 ELECTRA).
        optimization: "decoupled" (generator and discriminator each have an optimizer, both step every batch:
            the official default) or "joint" (one optimizer over both).
        seq_len: tokens per row.
        batch_size: rows per process per micro-step (global batch = batch_size x grad_accum x processes).
        grad_accum: micro-steps per optimizer step.
        padding_free: feed rows as one packed sequence with cu_seqlens (documents do not attend each other).
        mask_prob: fraction of tokens selected as targets.
        max_span: span masking: spans of up to this many units (1 = off; 3 in the DeBERTa recipe).
        whole_word: mask whole words.
        lr: peak learning rate (discriminator's, or the model's for MLM).
        generator_lr: the generator's peak learning rate when decoupled (default: lr).
        warmup_steps: linear warmup steps.
        max_steps: optimizer steps of the whole run (the schedule decays to 0 there).
        weight_decay: AdamW weight decay (not on biases and norms).
        adam_beta1: AdamW β1.
        adam_beta2: AdamW β2.
        adam_eps: AdamW ε.
        max_grad_norm: gradient clipping (0 = off).
        precision: "auto" (bf16 autocast on GPU, fp32 on CPU), "fp32", "bf16" or "fp16" (with loss scaling).
        gradient_checkpointing: recompute layer activations in the backward pass to save memory.
        compile: run the training forward through torch.compile.
        compile_backend: the torch.compile backend ("inductor"; "aot_eager" traces without generating code).
        device: "auto", "cpu", "cuda", "cuda:1", ...
        seed: seed of initialisation, data order, masking and sampling.
        num_threads: torch CPU threads (None: torch's default).
        log_every: steps between train log lines (means over the interval).
        eval_every: steps between evaluations (0: only at the end).
        eval_rows: held-out rows evaluated (the first ones, fixed masks).
        save_every: steps between checkpoints (and one at the end).
        keep_checkpoints: checkpoints kept.
        resume: continue from the latest checkpoint in out/checkpoints when there is one.
        stop_after: stop after this many steps of this invocation (saving a checkpoint); resume later.
        progress: show a progress bar.
        tensorboard: also log to TensorBoard when the package is installed.
    """

    data: str
    out: str = "runs/pretrain"
    objective: Literal["rtd", "mlm", "causal", "mt"] = "rtd"
    model: str = "tiny-v3"
    variant: str | None = None
    mt_schedule: Literal["alternate", "mix"] = "alternate"
    lm_weight: float = 1.0
    model_overrides: dict[str, Any] = field(default_factory=dict)
    generator_layers: int | None = None
    generator_overrides: dict[str, Any] = field(default_factory=dict)
    sharing: Literal["gdes", "es", "none"] = "gdes"
    rtd_weight: float = 10.0
    optimization: Literal["decoupled", "joint"] = "decoupled"
    seq_len: int = 128
    batch_size: int = 8
    grad_accum: int = 1
    padding_free: bool = False
    mask_prob: float = 0.15
    max_span: int = 1
    whole_word: bool = False
    lr: float = 5e-4
    generator_lr: float | None = None
    warmup_steps: int = 0
    max_steps: int = 1000
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    max_grad_norm: float = 1.0
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    gradient_checkpointing: bool = False
    compile: bool = False
    compile_backend: str = "inductor"
    device: str = "auto"
    seed: int = 0
    num_threads: int | None = None
    log_every: int = 10
    eval_every: int = 0
    eval_rows: int = 64
    save_every: int = 500
    keep_checkpoints: int = 3
    resume: bool = True
    stop_after: int | None = None
    progress: bool = True
    tensorboard: bool = True

    def __post_init__(self) -> None:
        positive = ("seq_len", "batch_size", "grad_accum", "max_steps", "log_every", "save_every")
        for name in positive + ("keep_checkpoints",):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("eval_every", "eval_rows", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.warmup_steps > self.max_steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} exceeds max_steps={self.max_steps}")
        if self.stop_after is not None and self.stop_after < 1:
            raise ValueError(f"stop_after={self.stop_after} must be >= 1 or None")
        for name, allowed in (
            ("objective", ("rtd", "mlm", "causal", "mt")),
            ("mt_schedule", ("alternate", "mix")),
            ("sharing", ("gdes", "es", "none")),
            ("optimization", ("decoupled", "joint")),
            ("precision", ("auto", "fp32", "bf16", "fp16")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {list(allowed)}")
        MaskingConfig(self.mask_prob, max_span=self.max_span, whole_word=self.whole_word)  # validates
        if self.variant is not None:
            from debertakit.experiments.variants import get_variant

            get_variant(self.variant)  # validates the name


# ---------------------------------------------------------------------------------------------------- set-up
def model_config(cfg: PretrainConfig, tokenizer: dict) -> DebertaConfig:
    if cfg.model.endswith(".json"):
        base = DebertaConfig.load(cfg.model)
    else:
        base = DebertaConfig.preset(cfg.model)
    changes = {"vocab_size": tokenizer["vocab_size"], "pad_token_id": tokenizer["pad_id"]}
    changes.update(cfg.model_overrides)
    if cfg.gradient_checkpointing:
        changes["gradient_checkpointing"] = True
    mcfg = base.replace(**changes)
    if cfg.variant is not None:
        from debertakit.experiments.variants import variant_config

        mcfg = variant_config(mcfg, cfg.variant)
    if mcfg.vocab_size < tokenizer["vocab_size"]:
        raise ValueError(
            f"model vocab_size={mcfg.vocab_size} is smaller than the tokenizer's {tokenizer['vocab_size']}"
        )
    if mcfg.emd_enabled and cfg.seq_len > mcfg.max_position_embeddings:
        raise ValueError(
            f"seq_len={cfg.seq_len} exceeds max_position_embeddings={mcfg.max_position_embeddings} "
            "(the Enhanced Mask Decoder adds absolute positions)"
        )
    return mcfg


def build_objective(cfg: PretrainConfig, mcfg: DebertaConfig) -> nn.Module:
    if cfg.objective == "mlm":
        return MaskedLMObjective(DebertaForMaskedLM(mcfg))
    if cfg.objective == "causal":
        return CausalLMObjective(DebertaForMaskedLM(mcfg))
    if cfg.objective == "mt":
        return MTObjective(DebertaForMaskedLM(mcfg), cfg.mt_schedule, cfg.lm_weight)
    gcfg = generator_config(mcfg, cfg.generator_layers, **cfg.generator_overrides)
    return ReplacedTokenDetectionObjective(
        DebertaForMaskedLM(gcfg), DebertaForReplacedTokenDetection(mcfg), cfg.sharing, cfg.rtd_weight
    )


def build_optimizers(cfg: PretrainConfig, objective: nn.Module):
    """One optimizer per parameter group when decoupled, one in all when joint; warmup + linear decay."""
    groups = objective.parameter_groups()
    lrs = [cfg.lr] if len(groups) == 1 else [cfg.generator_lr or cfg.lr, cfg.lr]
    if cfg.optimization == "joint" and len(groups) > 1:
        groups, lrs = [[p for g in groups for p in g]], [cfg.lr]
    kw = dict(weight_decay=cfg.weight_decay, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    optimizers = [build_optimizer(g, objective, lr, **kw) for g, lr in zip(groups, lrs)]
    schedulers = [warmup_linear(o, cfg.warmup_steps, cfg.max_steps) for o in optimizers]
    return groups, optimizers, schedulers


def autocast_dtype(cfg: PretrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.precision == "fp32" or (cfg.precision == "auto" and device.type != "cuda"):
        return None
    if cfg.precision in ("auto", "bf16"):
        return torch.bfloat16
    return torch.float16


class MetricLog:
    """metrics.jsonl (+ TensorBoard): written by process 0 only."""

    def __init__(self, out: Path, enabled: bool, tensorboard: bool):
        self.path, self.enabled, self.tb = out / "metrics.jsonl", enabled, None
        if enabled and tensorboard:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"))

    def truncate(self, step: int, drop_eval_at: int | None = None) -> None:
        """Forget records after ``step`` (a resumed run writes them again), and the evaluation at
        ``drop_eval_at`` (the final one, which is written again)."""
        if self.enabled and self.path.exists():
            keep = []
            for line in self.path.read_text().splitlines():
                r = json.loads(line)
                if r["step"] <= step and not (r["split"] == "eval" and r["step"] == drop_eval_at):
                    keep.append(line)
            atomic_write_text(self.path, "".join(line + "\n" for line in keep))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(f"{record['split']}/{k}", v, record["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _num_tokens(batch: dict[str, torch.Tensor]) -> int:
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return int(batch["cu_seqlens"][-1])


SCALARS = (
    "loss",
    "mlm_loss",
    "mlm_accuracy",
    "rtd_loss",
    "rtd_accuracy",
    "replaced_fraction",
    "lm_loss",
    "lm_accuracy",
)


# ---------------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(objective: nn.Module, batcher: RowBatcher, cfg: PretrainConfig, device, amp) -> dict[str, float]:
    """Held-out MLM loss/accuracy (per target), causal-LM loss/accuracy/perplexity (per next-token target) and,
    for RTD, discriminator loss/accuracy/AUC (per token)."""
    from sklearn.metrics import roc_auc_score

    was_training = objective.training
    objective.eval()
    rows = min(cfg.eval_rows, len(batcher.data))
    sampler = torch.Generator(device=device).manual_seed(cfg.seed)  # evaluation never touches training RNG
    sums = {
        "mlm_loss": 0.0,
        "mlm_correct": 0.0,
        "targets": 0.0,
        "lm_loss": 0.0,
        "lm_correct": 0.0,
        "lm_targets": 0.0,
    }
    scores, labels = [], []
    for start in range(0, rows, cfg.batch_size):
        batch = _to(batcher.batch(list(range(start, min(rows, start + cfg.batch_size)))), device)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            out = objective(batch, generator=sampler)
        if "mlm_targets" in out:
            n = float(out["mlm_targets"])
            sums["mlm_loss"] += float(out["mlm_loss"]) * n
            sums["mlm_correct"] += float(out["mlm_accuracy"]) * n
            sums["targets"] += n
        if "lm_targets" in out:
            n = float(out["lm_targets"])
            sums["lm_loss"] += float(out["lm_loss"]) * n
            sums["lm_correct"] += float(out["lm_accuracy"]) * n
            sums["lm_targets"] += n
        if "rtd_logits" in out:
            scores.append(out["rtd_logits"].float().cpu())
            labels.append(out["rtd_labels"].cpu())
    objective.train(was_training)
    result = {}
    if sums["targets"]:
        result["mlm_loss"] = sums["mlm_loss"] / sums["targets"]
        result["mlm_accuracy"] = sums["mlm_correct"] / sums["targets"]
    if sums["lm_targets"]:
        result["lm_loss"] = sums["lm_loss"] / sums["lm_targets"]
        result["lm_accuracy"] = sums["lm_correct"] / sums["lm_targets"]
        result["lm_perplexity"] = math.exp(result["lm_loss"])
    if scores:
        s, y = torch.cat(scores), torch.cat(labels)
        result["rtd_loss"] = float(torch.nn.functional.binary_cross_entropy_with_logits(s, y.float()))
        result["rtd_accuracy"] = float(((s > 0).long() == y).float().mean())
        result["rtd_auc"] = (
            float(roc_auc_score(y.numpy(), s.numpy())) if 0 < int(y.sum()) < y.numel() else math.nan
        )
    return result


# ---------------------------------------------------------------------------------------------------- the run
def pretrain(cfg: PretrainConfig) -> dict[str, Any]:
    """Run (or resume) pretraining. Returns the final evaluation and the paths of the saved models."""
    dist = distributed.setup(cfg.device)
    try:
        return _pretrain(cfg, dist)
    finally:
        distributed.cleanup(dist)


def _pretrain(cfg: PretrainConfig, dist: distributed.Dist) -> dict[str, Any]:
    # ---- set-up: data, model, optimizers
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    out = Path(cfg.out)
    device = dist.device
    amp = autocast_dtype(cfg, device)
    train_shards = ShardSet(cfg.data, "train")
    masking = MaskingConfig(cfg.mask_prob, max_span=cfg.max_span, whole_word=cfg.whole_word)
    if cfg.objective == "rtd":
        masking = masking.for_rtd()
    vocab = vocabulary_of(train_shards)
    train = RowBatcher(
        PackedDataset(train_shards, cfg.seq_len), masking, vocab, seed=cfg.seed, padding_free=cfg.padding_free
    )
    valid_shards = ShardSet(cfg.data, "valid")
    valid = None
    if valid_shards.num_documents:
        valid = RowBatcher(
            PackedDataset(valid_shards, cfg.seq_len),
            masking,
            vocab,
            seed=cfg.seed + 1,
            shuffle=False,
            padding_free=cfg.padding_free,
        )

    torch.manual_seed(cfg.seed)  # the same initial weights in every process
    mcfg = model_config(cfg, train_shards.tokenizer)
    objective = build_objective(cfg, mcfg).to(device)
    groups, optimizers, schedulers = build_optimizers(cfg, objective)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)
    seed_process(cfg.seed + 1000 * dist.rank)

    log = MetricLog(out, dist.is_main, cfg.tensorboard)
    step, acc = 0, {}
    latest = ckpt.latest_checkpoint(out / "checkpoints") if cfg.resume else None
    if latest is not None:
        state = ckpt.load_checkpoint(latest)
        objective.load_state_dict(state["model"])
        for o, s in zip(optimizers, state["optimizers"]):
            o.load_state_dict(s)
        for sch, s in zip(schedulers, state["schedulers"]):
            sch.load_state_dict(s)
        scaler.load_state_dict(state["scaler"])
        rngs = state["rng"]
        ckpt.set_rng_state(rngs[dist.rank] if len(rngs) == dist.world_size else rngs[0])
        step, acc = state["step"], state["accumulators"]
        log.truncate(step)
        if dist.is_main:
            print(f"resumed from {latest} (step {step})")
    elif dist.is_main:
        log.truncate(-1)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "config.json", json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")

    runner: nn.Module = objective
    if dist.enabled:
        ids = [device.index] if device.type == "cuda" else None
        runner = torch.nn.parallel.DistributedDataParallel(objective, device_ids=ids)
    if cfg.compile:
        runner = torch.compile(runner, backend=cfg.compile_backend)

    def save() -> None:
        rng = distributed.all_gather_object(dist, ckpt.rng_state())
        if dist.is_main:
            state = {
                "step": step,
                "model": objective.state_dict(),
                "optimizers": [o.state_dict() for o in optimizers],
                "schedulers": [s.state_dict() for s in schedulers],
                "scaler": scaler.state_dict(),
                "rng": rng,
                "accumulators": acc,
                "data": {"samples_per_step": cfg.batch_size * cfg.grad_accum * dist.world_size},
                "config": dataclasses.asdict(cfg),
            }
            ckpt.save_checkpoint(out / "checkpoints", step, state, keep=cfg.keep_checkpoints)

    def rows_of(step: int, micro: int) -> list[int]:
        """Global sample indices of this process's rows: the global micro-batch is cut by process."""
        per_micro = cfg.batch_size * dist.world_size
        first = (step * cfg.grad_accum + micro) * per_micro + dist.rank * cfg.batch_size
        return list(range(first, first + cfg.batch_size))

    # ---- one optimizer step
    def train_step(step: int) -> dict[str, float]:
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        sums = torch.zeros(len(SCALARS) + 1, dtype=torch.float64)
        for micro in range(cfg.grad_accum):
            batch = _to(train.batch(rows_of(step, micro)), device)
            sync = micro == cfg.grad_accum - 1 or not dist.enabled
            with contextlib.nullcontext() if sync else runner.no_sync():
                with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                    out = runner(batch)
                scaler.scale(out["loss"] / cfg.grad_accum).backward()
            sums[: len(SCALARS)] += torch.tensor(
                [float(out[k].detach()) if k in out else math.nan for k in SCALARS]
            )
            sums[-1] += _num_tokens(batch)
        for o, params in zip(optimizers, groups):
            scaler.unscale_(o)
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        for o in optimizers:
            scaler.step(o)
        scaler.update()
        for s in schedulers:
            s.step()
        sums[: len(SCALARS)] /= cfg.grad_accum
        sums = distributed.all_reduce_sum(dist, sums)
        sums[: len(SCALARS)] /= dist.world_size
        metrics = {k: float(v) for k, v in zip(SCALARS, sums[: len(SCALARS)]) if not math.isnan(v)}
        metrics["tokens"] = float(sums[-1])
        return metrics

    # ---- the loop
    from tqdm.auto import tqdm

    bar = tqdm(
        total=cfg.max_steps, initial=step, desc="pretrain", disable=not (cfg.progress and dist.is_main)
    )
    started, busy = step, 0.0
    objective.train()
    while step < cfg.max_steps:
        tick = time.perf_counter()
        metrics = train_step(step)
        busy += time.perf_counter() - tick
        step += 1
        for k, v in metrics.items():
            acc[k] = acc.get(k, 0.0) + v
        acc["steps"] = acc.get("steps", 0) + 1
        acc["total_tokens"] = acc.get("total_tokens", 0.0) + metrics["tokens"]
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            n = acc.pop("steps")
            tokens = acc.pop("tokens")
            record = {"step": step, "split": "train"}
            record.update({k: acc.pop(k) / n for k in SCALARS if k in acc})
            record["lr"] = schedulers[-1].get_last_lr()[0]
            record["tokens_seen"] = int(acc["total_tokens"])
            record["tokens_per_s"] = tokens / max(busy, 1e-9)
            log.write(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            busy = 0.0
        bar.update(1)
        if valid is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
            if dist.is_main:
                log.write({"step": step, "split": "eval", **evaluate(objective, valid, cfg, device, amp)})
            distributed.barrier(dist)
        stopping = cfg.stop_after is not None and step - started >= cfg.stop_after
        if step % cfg.save_every == 0 or step == cfg.max_steps or stopping:
            save()
        if stopping and step < cfg.max_steps:
            bar.close()
            log.close()
            return {"step": step, "stopped": True}
    bar.close()

    # ---- final evaluation and export
    result: dict[str, Any] = {"step": step, "stopped": False, "models": {}}
    if dist.is_main:
        if valid is not None:
            log.truncate(step, drop_eval_at=step)  # a finished run started again evaluates again
            result["eval"] = evaluate(objective, valid, cfg, device, amp)
            log.write({"step": step, "split": "eval", **result["eval"]})
        tokenizer_dir = Path(train_shards.tokenizer["path"])
        for name, model in objective.export().items():
            path = save_pretrained(model, out / "final" / name)
            if tokenizer_dir.is_dir():
                for f in tokenizer_dir.iterdir():
                    if f.is_file():
                        shutil.copy2(f, path / f.name)
            result["models"][name] = str(path)
    log.close()
    distributed.barrier(dist)
    return result


def seed_process(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
