import random

import numpy as np
import pytest
import torch

from debertakit import DebertaConfig, build_model
from debertakit.train.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from debertakit.train.optim import build_optimizer, warmup_linear


def test_no_weight_decay_on_biases_and_norms():
    model = build_model(DebertaConfig.preset("tiny-v3"), "masked_lm")
    opt = build_optimizer(list(model.parameters()), model, 1e-3)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.dim() >= 2 and "norm" not in names[id(p)] for p in decay["params"])
    assert any(names[id(p)].endswith("bias") for p in no_decay["params"])
    assert any("norm.weight" in names[id(p)] for p in no_decay["params"])
    assert opt.defaults["eps"] == 1e-6 and opt.defaults["betas"] == (0.9, 0.999)


def test_warmup_then_linear_decay():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_linear(opt, warmup_steps=4, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6])
    with pytest.raises(ValueError, match="warmup_steps=11"):
        warmup_linear(opt, 11, 10)


def test_checkpoints_keep_the_last_k_and_restore_every_rng(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, {"step": step, "rng": rng_state()}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert not list(tmp_path.glob(".*"))  # no temporary files left
    state = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1))
    set_rng_state(state)
    assert (random.random(), np.random.rand()) == expected[:2] and torch.equal(torch.rand(1), expected[2])
    assert load_checkpoint(list_checkpoints(tmp_path)[-1][1])["step"] == 4


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, {"x": torch.ones(2)})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(tmp_path, 2, {"x": Unpicklable()})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]
    assert not list(tmp_path.glob(".*"))
