"""Two processes under torchrun (gloo, CPU) train like one process with the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from debertakit.train.checkpoint import list_checkpoints, load_checkpoint
from debertakit.train.pretrain import PretrainConfig, pretrain

ROOT = Path(__file__).resolve().parents[2]
COMMON = dict(
    model="tiny-v3",
    objective="mlm",
    seq_len=32,
    batch_size=2,
    max_steps=4,
    lr=3e-3,
    log_every=1,
    eval_every=0,
    save_every=1000,
    num_threads=1,
    progress=False,
    tensorboard=False,
    model_overrides={"hidden_dropout": 0.0, "attention_dropout": 0.0},  # dropout masks differ per process
)


def train_losses(run):
    rows = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["mlm_loss"], r["tokens_seen"]) for r in rows if r["split"] == "train"]


def test_two_process_ddp_equals_one_process(wikitext_shards, tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    torch.set_num_threads(1)
    # one process, two micro-steps of 2 rows = the two processes' rows of every step
    pretrain(PretrainConfig(data=str(wikitext_shards), out=str(tmp_path / "one"), grad_accum=2, **COMMON))
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "debertakit",
        "pretrain",
        "--data",
        str(wikitext_shards),
        "--out",
        str(tmp_path / "two"),
    ]
    for k, v in COMMON.items():
        args += [
            f"--{k}",
            json.dumps(v) if isinstance(v, dict) else str(v).lower() if isinstance(v, bool) else str(v),
        ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    subprocess.run(args, check=True, env=env, cwd=ROOT, timeout=300)
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert [s for s, _, _ in one] == [s for s, _, _ in two] == [1, 2, 3, 4]
    assert [t for _, _, t in one] == [t for _, _, t in two]  # the same rows were read
    for (_, a, _), (_, b, _) in zip(one, two):
        assert abs(a - b) < 1e-4, (one, two)
    wa = load_checkpoint(list_checkpoints(tmp_path / "one" / "checkpoints")[-1][1])["model"]
    wb = load_checkpoint(list_checkpoints(tmp_path / "two" / "checkpoints")[-1][1])["model"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-4, rtol=1e-4)
    assert not (wa["model.lm_head.bias"] == 0).all()  # training moved the weights
