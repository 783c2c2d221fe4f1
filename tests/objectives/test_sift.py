"""SiFT: the perturbation sits on the normalised embeddings, and the added term is the documented formula."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from debertakit import DebertaConfig, build_model
from debertakit.objectives.sift import SiFT, divergence, perturb_embeddings, symmetric_kl, task_logits


def _model(head: str, **kw):
    cfg = DebertaConfig.preset("tiny-v3", hidden_dropout=0.0, attention_dropout=0.0, **kw)
    return build_model(cfg, head).eval()


def _batch(b: int = 3, n: int = 7, pad_last: int = 2):
    ids = torch.randint(5, 128, (b, n))
    mask = torch.ones(b, n, dtype=torch.long)
    mask[-1, n - pad_last :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_perturbation_is_added_after_the_layer_norm_and_before_the_mask():
    model = _model("sequence_classification")
    batch = _batch()
    emb = model.deberta.embeddings
    clean = model.deberta(**batch, output_hidden_states=True).hidden_states[0]
    delta = torch.randn(*batch["input_ids"].shape, 32) * 0.3
    with perturb_embeddings(model, delta):
        pert = model.deberta(**batch, output_hidden_states=True).hidden_states[0]
    real = batch["attention_mask"].bool()
    normed = emb.norm(emb.word(batch["input_ids"]))  # LayerNorm output, before the mask
    # real tokens: LayerNorm(x) + delta, not LayerNorm(x + delta) (the perturbation is not re-normalised)
    torch.testing.assert_close(pert[real], (normed + delta)[real])
    torch.testing.assert_close(clean[real], normed[real])
    assert not torch.allclose(pert[real], emb.norm(emb.word(batch["input_ids"]) + delta)[real], atol=1e-3)
    # padded tokens: the mask comes after the perturbation and zeroes it
    assert torch.count_nonzero(pert[~real]) == 0
    # the hook is gone once the context closes
    after = model.deberta(**batch, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(after, clean)


def test_symmetric_kl_by_hand():
    clean = torch.tensor([[0.0, 0.0]])
    pert = torch.tensor([[0.0, math.log(3.0)]])  # q = (1/4, 3/4)
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    expected += 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert symmetric_kl(clean, pert).item() == pytest.approx(expected, rel=1e-6)
    assert symmetric_kl(clean, clean).item() == 0.0
    # equals KL(p||q) + KL(q||p) from torch's kl_div
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    lp, lq = F.log_softmax(a, -1), F.log_softmax(b, -1)
    ref = F.kl_div(lq, lp, log_target=True, reduction="batchmean") + F.kl_div(
        lp, lq, log_target=True, reduction="batchmean"
    )
    torch.testing.assert_close(symmetric_kl(a, b), ref)


def _by_formula(model, batch, kind, sift: SiFT, seed: int):
    """The documented recipe written out step by step."""
    torch.manual_seed(seed)
    clean = task_logits(model, batch)
    ids = batch["input_ids"]
    shape = (ids.reshape(-1, ids.shape[-1]).shape[0], ids.shape[-1], 32)
    d0 = (torch.randn(shape) * sift.init_std).clamp(-2 * sift.init_std, 2 * sift.init_std).requires_grad_()
    mask = batch["attention_mask"] if kind in ("ner", "qa") else None
    with perturb_embeddings(model, d0):
        adv = divergence(_detach(clean), task_logits(model, batch), kind, mask)
    (g,) = torch.autograd.grad(adv, d0)
    d1 = d0.detach() + sift.step_size * g / (g.abs().amax(-1, keepdim=True) + 1e-6)
    with perturb_embeddings(model, d1):
        pert = task_logits(model, batch)
    return clean, sift.weight * divergence(clean, pert, kind, mask)


def _detach(x):
    return tuple(t.detach() for t in x) if isinstance(x, tuple) else x.detach()


@pytest.mark.parametrize(
    "head,kind,labels",
    [
        ("sequence_classification", "classification", 3),
        ("sequence_classification", "regression", 1),
        ("token_classification", "ner", 5),
        ("question_answering", "qa", 2),
    ],
)
def test_added_term_equals_the_formula(head, kind, labels):
    model = _model(head, num_labels=labels)
    batch = _batch()
    sift = SiFT(weight=5.0, init_std=0.5, step_size=0.3)  # large enough to move the logits visibly
    clean, expected = _by_formula(model, batch, kind, sift, seed=11)
    torch.manual_seed(11)
    clean2 = task_logits(model, batch)
    got = sift.loss(model, batch, clean2, kind)
    torch.testing.assert_close(got, expected)
    assert got.item() > 0
    got.backward()  # gradients reach the parameters
    assert model.deberta.embeddings.word.weight.grad.abs().sum() > 0


def test_regression_term_is_the_squared_difference():
    clean, pert = torch.tensor([[1.0], [2.0]]), torch.tensor([[1.5], [1.0]])
    assert divergence(clean, pert, "regression").item() == pytest.approx((0.25 + 1.0) / 2)


def test_multiple_choice_perturbs_every_choice():
    model = _model("multiple_choice")
    ids = torch.randint(5, 128, (2, 3, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    clean = task_logits(model, batch)
    loss = SiFT(init_std=0.5, step_size=0.3).loss(model, batch, clean, "multiple_choice")
    assert loss.item() > 0


def test_no_perturbation_adds_nothing():
    model = _model("sequence_classification")
    batch = _batch()
    clean = task_logits(model, batch)
    assert SiFT(init_std=0.0).loss(model, batch, clean, "classification").item() == 0.0


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="step_size=-1"):
        SiFT(step_size=-1)
