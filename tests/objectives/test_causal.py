"""Causal LM, DeBERTa-MT and perplexity: no look-ahead, the loss is next-token cross-entropy, every token is
scored once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import debertakit
from debertakit.objectives.causal import (
    causal_lm_logits,
    causal_lm_loss,
    mt_loss,
    next_token_labels,
    perplexity,
    sliding_windows,
)


def _model(**kw):
    cfg = debertakit.DebertaConfig.preset("tiny-v3", hidden_dropout=0.0, attention_dropout=0.0, **kw)
    return debertakit.build_model(cfg, "masked_lm").eval()


@pytest.mark.parametrize(
    "kw", [{}, {"use_emd": False}, {"position_biased_input": True, "relative_attention": False}]
)
def test_no_position_sees_a_later_one(kw):
    """Gradient test through the whole causal path (backbone and, when on, the EMD): the prediction made at
    position i depends on the embeddings of positions <= i only."""
    model = _model(**kw)
    ids = torch.randint(4, 128, (1, 14))
    emb = {}

    def keep(_module, _inputs, output):
        output.retain_grad()
        emb["x"] = output

    handle = model.deberta.embeddings.word.register_forward_hook(keep)
    for i in (0, 6, 13):
        model.zero_grad()
        logits = causal_lm_logits(model, ids)  # (1, N, V)
        (logits[0, i] * torch.randn(logits.shape[-1])).sum().backward()
        g = emb["x"].grad[0].abs().sum(-1)  # (N,)
        assert g[i + 1 :].sum() == 0, (
            f"position {i} sees later positions {g[i + 1 :].nonzero().flatten().tolist()}"
        )
        assert g[: i + 1].min() > 0
    handle.remove()


def test_selected_decoding_equals_full_decoding():
    model = _model()
    ids = torch.randint(4, 128, (2, 11))
    select = torch.rand(2, 11) < 0.5
    select[0, 0] = True
    full = causal_lm_logits(model, ids)
    torch.testing.assert_close(
        causal_lm_logits(model, ids, select=select), full[select], atol=1e-5, rtol=1e-5
    )


def test_loss_is_next_token_cross_entropy_over_real_tokens():
    model = _model()
    ids = torch.randint(4, 128, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    labels = next_token_labels(ids, mask)
    assert labels[0, :-1].tolist() == ids[0, 1:].tolist() and labels[0, -1] == -100
    assert (labels[1, 4:] == -100).all() and labels[1, :4].tolist() == ids[1, 1:5].tolist()
    loss, logs = causal_lm_loss(model, ids, mask)
    logits = causal_lm_logits(model, ids, mask)
    want = F.cross_entropy(logits[labels != -100], labels[labels != -100])
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    assert logs["lm_tokens"] == 8 + 4


def test_mt_schedules():
    model = _model()
    ids = torch.randint(5, 120, (2, 10))
    labels = torch.full_like(ids, -100)
    masked = ids.clone()
    masked[:, 3] = 127
    labels[:, 3] = ids[:, 3]
    mlm = {"input_ids": masked, "labels": labels}
    lm = {"input_ids": ids}
    a, la = mt_loss(model, mlm, lm, step=0)
    b, lb = mt_loss(model, mlm, lm, step=1)
    assert "mlm_loss" in la and "lm_loss" not in la and "lm_loss" in lb and "mlm_loss" not in lb
    c, _ = mt_loss(model, mlm, lm, step=0, schedule="mix", lm_weight=0.5)
    torch.testing.assert_close(c, a + 0.5 * b)
    with pytest.raises(ValueError, match="unknown DeBERTa-MT schedule"):
        mt_loss(model, mlm, lm, step=0, schedule="both")


def test_a_few_steps_of_causal_training_fit_a_sequence():
    model = _model().train()
    ids = torch.randint(4, 128, (4, 12))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(12):
        loss, _ = causal_lm_loss(model, ids)
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first


@pytest.mark.parametrize(
    "n,window,stride", [(10, 4, 2), (10, 4, 4), (3, 4, 2), (9, 4, 3), (37, 8, 5), (1, 1, 1)]
)
def test_sliding_windows_score_every_token_once_with_enough_context(n, window, stride):
    scored = []
    for begin, end, first in sliding_windows(n, window, stride):
        assert end - begin <= window and begin <= first <= end
        if first > 0:
            assert first - begin >= min(window - stride, first)  # context kept before the first scored token
        scored += range(first, end)
    assert scored == list(range(n))


def test_perplexity_of_one_window_is_exp_of_the_loss():
    model = _model()
    text = torch.randint(4, 120, (20,))
    res = perplexity(model, text, cls_token_id=1, window=32)
    ids = torch.cat([torch.tensor([1]), text])[None]
    loss, _ = causal_lm_loss(model, ids)
    assert res.tokens == 20 and res.windows == 1
    assert math.isclose(res.ppl, math.exp(float(loss.detach())), rel_tol=1e-4)
    many = perplexity(model, text, cls_token_id=1, window=6, stride=2, batch_size=3)
    assert many.tokens == 20 and many.windows > 1
    with pytest.raises(ValueError, match="empty text"):
        perplexity(model, [], cls_token_id=1)
