"""Metrics reach TensorBoard when the package is installed (it is in the test extra)."""

from __future__ import annotations

import json

import pytest

from debertakit.train.pretrain import MetricLog

pytest.importorskip("tensorboard")


def test_metric_log_writes_jsonl_and_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricLog(tmp_path, enabled=True, tensorboard=True)
    assert log.tb is not None
    log.write({"split": "train", "step": 1, "loss": 2.5, "lr": 1e-3})
    log.write({"split": "train", "step": 2, "loss": 2.0, "lr": 2e-3})
    log.write({"split": "eval", "step": 2, "mlm_accuracy": 0.25})
    log.close()

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 2]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/lr", "eval/mlm_accuracy"}
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 2.5), (2, 2.0)]
    assert events.Scalars("eval/mlm_accuracy")[0].value == pytest.approx(0.25)


def test_disabled_log_writes_nothing(tmp_path):
    log = MetricLog(tmp_path, enabled=False, tensorboard=True)
    log.write({"split": "train", "step": 1, "loss": 2.5})
    log.close()
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()
