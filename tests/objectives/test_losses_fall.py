"""A tiny model's MLM and RTD losses fall over 100 steps on real text (WikiText-2)."""

import json
from pathlib import Path

import pytest
import torch

from debertakit.train.pretrain import PretrainConfig, pretrain


def mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
def test_losses_fall_over_100_steps(wikitext_shards, tmp_path, objective):
    torch.set_num_threads(1)
    cfg = PretrainConfig(
        data=str(wikitext_shards),
        out=str(tmp_path),
        objective=objective,
        model="tiny-v3",
        model_overrides={"hidden_size": 64, "intermediate_size": 128},
        seq_len=64,
        batch_size=4,
        max_steps=100,
        lr=3e-3,
        warmup_steps=10,
        log_every=1,
        eval_every=0,
        save_every=1000,
        progress=False,
        tensorboard=False,
    )
    result = pretrain(cfg)
    rows = [json.loads(x) for x in (Path(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert len(train) == 100
    mlm = [r["mlm_loss"] for r in train]
    assert mean(mlm[-10:]) < mean(mlm[:10]) - 0.5, (mean(mlm[:10]), mean(mlm[-10:]))
    if objective == "rtd":
        rtd = [r["rtd_loss"] for r in train]
        assert mean(rtd[-10:]) < mean(rtd[:10]) - 0.1, (mean(rtd[:10]), mean(rtd[-10:]))
        assert result["eval"]["rtd_auc"] > 0.55
    assert result["eval"]["mlm_loss"] < mean(mlm[:10]) - 0.3
