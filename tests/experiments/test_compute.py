"""Compute accounting of a pretraining step: the analytic count agrees with the measured one, and the
equal-compute MLM row of the ablation config has as many FLOPs as the RTD row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from debertakit.experiments.compute import analytic_forward_flops, measured_step_flops

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "experiments"


@pytest.fixture(scope="module")
def ablation():
    return yaml.safe_load((CONFIGS / "ablation-tiny.yaml").read_text())


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("objective", ["mlm", "rtd"])
@pytest.mark.parametrize("variant", ["full", "no-emd", "no-p2c"])
def test_analytic_forward_matches_measured(ablation, objective, variant):
    opts = ablation["pretrain"]
    measured = measured_step_flops(opts, objective, variant)
    analytic = analytic_forward_flops(opts, objective, variant)
    assert measured["total"] == measured["forward"] + measured["backward"]
    assert measured["backward"] > measured["forward"]
    assert analytic == pytest.approx(measured["forward"], rel=0.05)


def test_rtd_costs_more_than_mlm_and_scales_with_the_generator(ablation):
    opts = ablation["pretrain"]
    mlm = measured_step_flops(opts, "mlm")["total"]
    rtd = measured_step_flops(opts, "rtd")["total"]
    deeper = measured_step_flops({**opts, "generator_layers": 2}, "rtd")["total"]
    assert mlm < rtd < deeper


def test_equal_compute_row_matches_the_rtd_row(ablation):
    runs = {r if isinstance(r, str) else r["name"]: r for r in ablation["runs"]}
    row = runs["full-equal-compute"]
    opts = ablation["pretrain"]
    ratio = measured_step_flops(opts, "rtd")["total"] / measured_step_flops(opts, "mlm")["total"]
    assert row["variant"] == "full" and row.get("objective", "mlm") == "mlm"
    assert row["pretrain"]["max_steps"] == round(opts["max_steps"] * ratio)
    # the same warmup share as the shared schedule
    assert row["pretrain"]["warmup_steps"] / row["pretrain"]["max_steps"] == pytest.approx(
        opts["warmup_steps"] / opts["max_steps"], abs=0.01
    )
    # the subset config trains the same row into the same directory
    subset = yaml.safe_load((CONFIGS / "rtd-vs-mlm-tiny.yaml").read_text())
    assert subset["out"] == ablation["out"] and subset["pretrain"] == opts
    assert [r for r in subset["runs"] if not isinstance(r, str)] == [row]
