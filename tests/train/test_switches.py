"""The training-loop switches of `PretrainConfig`, run in real (tiny) pretraining runs on CPU.

Gradient checkpointing recomputes each encoder layer in the backward pass; with dropout on, the recomputation
must draw the same dropout masks as the forward pass, so a checkpointed run logs the same losses and ends with
the same weights as the plain run.
"""

import pytest
import torch

import debertakit.model.backbone as backbone
from debertakit.train.checkpoint import list_checkpoints, load_checkpoint
from debertakit.train.pretrain import pretrain
from tests.train.test_resume import losses, options


def final_weights(run):
    return load_checkpoint(list_checkpoints(run / "checkpoints")[-1][1])["model"]


@pytest.mark.parametrize(
    "objective,extra",
    [("mlm", {}), ("rtd", {}), ("mlm", {"grad_accum": 2, "padding_free": True})],
)
def test_gradient_checkpointing_gives_the_same_run(wikitext_shards, tmp_path, monkeypatch, objective, extra):
    torch.set_num_threads(1)
    calls = []

    def counting_checkpoint(*args, **kwargs):
        calls.append(1)
        return torch.utils.checkpoint.checkpoint(*args, **kwargs)

    monkeypatch.setattr(backbone, "checkpoint", counting_checkpoint)
    kw = dict(objective=objective, max_steps=3, eval_every=0, **extra)
    pretrain(options(wikitext_shards, tmp_path / "plain", **kw))
    assert not calls
    pretrain(options(wikitext_shards, tmp_path / "ckpt", gradient_checkpointing=True, **kw))
    assert calls  # the layers really went through torch.utils.checkpoint
    plain, ckpt = losses(tmp_path / "plain"), losses(tmp_path / "ckpt")
    assert len(plain) == 3 + 1 and [r.keys() for r in plain] == [r.keys() for r in ckpt]
    for a, b in zip(plain, ckpt):
        assert (a["step"], a["split"]) == (b["step"], b["split"])
        for k in a.keys() - {"step", "split"}:
            assert b[k] == pytest.approx(a[k], rel=0, abs=1e-6), (a["step"], k)
    wa, wb = final_weights(tmp_path / "plain"), final_weights(tmp_path / "ckpt")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-6, msg=k)


# torch.compile: "aot_eager" traces the model with Dynamo and AOTAutograd and runs the traced graphs with eager
# kernels (seconds); "inductor" generates C++ kernels (over a minute on a 2-core machine, so not in the default
# run). Inductor draws dropout masks with its own generator; `fallback_random` makes it use torch's, so that
# both runs see the same masks and the losses compare within floating-point reassociation: 1e-5 relative.
@pytest.mark.parametrize(
    "backend,objective,extra",
    [
        ("aot_eager", "mlm", {}),
        pytest.param("aot_eager", "rtd", {}, marks=pytest.mark.slow),
        pytest.param("aot_eager", "mlm", {"gradient_checkpointing": True}, marks=pytest.mark.slow),
        pytest.param("inductor", "mlm", {}, marks=pytest.mark.slow),
    ],
)
def test_compiled_run_gives_the_same_losses(wikitext_shards, tmp_path, backend, objective, extra):
    import torch._dynamo
    import torch._inductor.config

    torch.set_num_threads(1)
    kw = dict(objective=objective, max_steps=3, eval_every=0, **extra)
    pretrain(options(wikitext_shards, tmp_path / "eager", **kw))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        with torch._inductor.config.patch(fallback_random=True):
            pretrain(
                options(wikitext_shards, tmp_path / "compiled", compile=True, compile_backend=backend, **kw)
            )
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert graphs > 0  # the training forward really went through torch.compile
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert len(eager) == 3 + 1 and [r.keys() for r in eager] == [r.keys() for r in compiled]
    for a, b in zip(eager, compiled):
        assert (a["step"], a["split"]) == (b["step"], b["split"])
        for k in a.keys() - {"step", "split"}:
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6), (a["step"], k)
