"""Generation: greedy is deterministic and follows the argmax, the length limit holds, sampling draws only the
tokens its filter allows."""

from __future__ import annotations

import pytest
import torch

import debertakit
from debertakit.generate import filter_logits, generate, next_token
from debertakit.objectives.causal import causal_lm_logits


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = debertakit.DebertaConfig.preset("tiny-v3", hidden_dropout=0.0, attention_dropout=0.0)
    return debertakit.build_model(cfg, "masked_lm").eval()


def test_greedy_is_deterministic_follows_the_argmax_and_respects_the_limit(model):
    prompt = torch.randint(4, 128, (2, 5))
    a = generate(model, prompt, max_new_tokens=7)
    b = generate(model, prompt, max_new_tokens=7, seed=123)
    assert a.shape == (2, 12) and torch.equal(a, b) and torch.equal(a[:, :5], prompt)
    for t in range(5, 12):
        want = causal_lm_logits(model, a[:, :t])[:, -1].argmax(-1)
        assert torch.equal(a[:, t], want)
    assert generate(model, prompt, max_new_tokens=0).shape == (2, 5)


def test_eos_stops_and_banned_tokens_never_appear(model):
    prompt = torch.randint(4, 128, (1, 4))
    first = int(generate(model, prompt, max_new_tokens=1)[0, -1])
    out = generate(model, prompt, max_new_tokens=9, eos_token_id=first)
    assert out.shape == (1, 5)  # stopped right after the end token
    out = generate(
        model, prompt, max_new_tokens=9, banned_token_ids=[first], strategy="top_k", top_k=3, seed=1
    )
    assert out.shape[1] <= 4 + 9 and first not in out[0, 4:].tolist()


def test_context_is_cut_for_models_with_absolute_positions():
    cfg = debertakit.DebertaConfig.preset("tiny-v3", max_position_embeddings=8)
    model = debertakit.build_model(cfg, "masked_lm").eval()
    out = generate(model, torch.randint(4, 128, (1, 6)), max_new_tokens=6)  # grows past 8 positions
    assert out.shape == (1, 12)


@pytest.mark.parametrize(
    "strategy,kw", [("top_k", {"top_k": 4}), ("top_p", {"top_p": 0.3}), ("top_p", {"top_p": 0.05})]
)
def test_sampling_draws_only_allowed_tokens(model, strategy, kw):
    prompt = torch.randint(4, 128, (1, 6))
    logits = causal_lm_logits(model, prompt)[:, -1].float()  # (1, V)
    probs = logits.softmax(-1)[0]
    order = probs.argsort(descending=True)
    if strategy == "top_k":
        allowed = set(order[: kw["top_k"]].tolist())
    else:
        mass_before = probs[order].cumsum(0) - probs[order]
        allowed = set(order[mass_before < kw["top_p"]].tolist())
    rows = generate(model, prompt.expand(64, -1), max_new_tokens=1, strategy=strategy, seed=3, **kw)
    drawn = set(rows[:, -1].tolist())
    assert drawn <= allowed
    if len(allowed) > 1:
        assert len(drawn) > 1  # it does sample
    same = [generate(model, prompt, max_new_tokens=5, strategy=strategy, seed=7, **kw) for _ in range(2)]
    assert torch.equal(*same)


def test_filters_on_a_known_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    keep = lambda out: torch.isfinite(out[0]).nonzero().flatten().tolist()  # noqa: E731
    assert keep(filter_logits(logits, top_k=2)) == [0, 1]
    assert keep(filter_logits(logits, top_p=0.5)) == [0]
    assert keep(filter_logits(logits, top_p=0.6)) == [0, 1]
    assert keep(filter_logits(logits, top_p=0.84)) == [0, 1, 2]
    assert keep(filter_logits(logits, top_p=0.9)) == [0, 1, 2, 3]
    assert keep(filter_logits(logits.flip(-1), top_k=1)) == [4]
    g = torch.Generator().manual_seed(0)
    draws = {int(next_token(logits, "top_k", top_k=3, generator=g)) for _ in range(200)}
    assert draws == {0, 1, 2}
    with pytest.raises(ValueError, match="top_p=1.5"):
        filter_logits(logits, top_p=1.5)
    with pytest.raises(ValueError, match="temperature=0"):
        next_token(logits, "top_p", temperature=0)
