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
