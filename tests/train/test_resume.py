"""Exact resume: a run stopped and resumed logs the same losses as an uninterrupted one (bit-identical on CPU
with one thread)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from debertakit.train.checkpoint import list_checkpoints, load_checkpoint
from debertakit.train.pretrain import PretrainConfig, pretrain

ROOT = Path(__file__).resolve().parents[2]


def options(data, out, **kw):
    base = dict(
        data=str(data),
        out=str(out),
        model="tiny-v3",
        seq_len=32,
        batch_size=2,
        max_steps=6,
        lr=3e-3,
        warmup_steps=2,
        log_every=1,
        eval_every=3,
        eval_rows=4,
        save_every=1000,
        num_threads=1,
        progress=False,
        tensorboard=False,
    )
    base.update(kw)
    return PretrainConfig(**base)


def records(run):
    return [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def losses(run):
    keys = ("loss", "mlm_loss", "rtd_loss", "mlm_accuracy", "rtd_accuracy", "lr", "rtd_auc", "tokens_seen")
    return [{k: r[k] for k in ("step", "split", *keys) if k in r} for r in records(run)]


@pytest.mark.parametrize(
    "objective,extra",
    [
        ("rtd", {}),
        ("mlm", {"grad_accum": 2, "padding_free": True}),
        ("rtd", {"optimization": "joint", "sharing": "es"}),
    ],
)
def test_stop_and_resume_equals_uninterrupted(wikitext_shards, tmp_path, objective, extra):
    torch.set_num_threads(1)
    whole = options(wikitext_shards, tmp_path / "whole", objective=objective, **extra)
    pretrain(whole)
    parts = options(wikitext_shards, tmp_path / "parts", objective=objective, stop_after=3, **extra)
    first = pretrain(parts)
    assert first == {"step": 3, "stopped": True}
    pretrain(options(wikitext_shards, tmp_path / "parts", objective=objective, **extra))
    a, b = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    assert len(a) == 6 + 2 and a == b  # exact equality of every logged value
    wa = load_checkpoint(list_checkpoints(tmp_path / "whole" / "checkpoints")[-1][1])["model"]
    wb = load_checkpoint(list_checkpoints(tmp_path / "parts" / "checkpoints")[-1][1])["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_killed_process_resumes_with_the_same_losses(wikitext_shards, tmp_path):
    """SIGKILL a real `debertakit pretrain` process mid-run, run the same command again, compare."""
    args = [
        sys.executable,
        "-m",
        "debertakit",
        "pretrain",
        "--data",
        str(wikitext_shards),
        "--model",
        "tiny-v3",
        "--seq_len",
        "32",
        "--batch_size",
        "2",
        "--max_steps",
        "40",
        "--log_every",
        "1",
        "--save_every",
        "2",
        "--num_threads",
        "1",
        "--progress",
        "false",
        "--tensorboard",
        "false",
        "--eval_every",
        "0",
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(args + ["--out", str(tmp_path / "whole")], check=True, env=env, cwd=ROOT)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(args + ["--out", str(killed)], env=env, cwd=ROOT)
    deadline = time.time() + 120
    while not any(s >= 10 for s, _ in list_checkpoints(killed / "checkpoints")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stopped_at = len(records(killed))
    assert stopped_at < 40, "the run finished before it could be killed"
    subprocess.run(args + ["--out", str(killed)], check=True, env=env, cwd=ROOT)
    assert losses(tmp_path / "whole") == losses(killed)
