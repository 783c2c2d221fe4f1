"""The relative table and its projections are computed once at inference and reused while the weights are
unchanged; any change of the weights, training mode or gradients computes them afresh."""

from __future__ import annotations

import pytest
import torch

import debertakit


def _model(preset: str = "tiny-v3"):
    torch.manual_seed(0)
    return debertakit.build_model(debertakit.DebertaConfig.preset(preset), "base").eval()


def _hidden(model, ids):
    return model(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("preset", ["tiny-v1", "tiny-v3"])
def test_cached_projections_are_reused_and_exact(preset):
    model = _model(preset)
    ids = torch.randint(4, 100, (2, 23))
    with torch.no_grad():
        first = _hidden(model, ids)
        attn = model.deberta.encoder.layers[0].attention
        cached = attn._pos_cache
        assert cached is not None
        second = _hidden(model, ids)
        assert attn._pos_cache is cached  # reused, not recomputed
    with torch.enable_grad():
        fresh = _hidden(model, ids)  # gradients on: no cache involved
    assert torch.equal(first, second)
    torch.testing.assert_close(first, fresh.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "change",
    ["query weight in place", "relative table in place", "load_state_dict", "table LayerNorm"],
)
def test_a_weight_change_invalidates_the_cache(change):
    model = _model()
    other = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(4, 100, (1, 31))
    with torch.no_grad():
        before = _hidden(model, ids)
        layer = model.deberta.encoder.layers[0].attention
        if change == "query weight in place":
            layer.query.weight.mul_(1.5)
        elif change == "relative table in place":
            enc = model.deberta.encoder
            enc.rel_embeddings.weight.add_(0.3 * torch.randn_like(enc.rel_embeddings.weight))
        elif change == "load_state_dict":
            model.load_state_dict(other.state_dict())
        else:
            model.deberta.encoder.rel_norm.weight.mul_(2.0)
        after = _hidden(model, ids)
    with torch.enable_grad():
        expected = _hidden(model, ids).detach()  # computed without any cache
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected, rtol=0, atol=1e-6)


def test_training_mode_does_not_use_the_cache():
    model = _model()
    ids = torch.randint(4, 100, (1, 9))
    model.train()
    with torch.no_grad():
        _hidden(model, ids)
    assert model.deberta.encoder._table_cache is None
    assert all(layer.attention._pos_cache is None for layer in model.deberta.encoder.layers)


def test_inference_mode_runs_and_shares_the_cache_with_no_grad():
    """Tensors made under torch.inference_mode keep no version counter: the cache keys must still work, and
    results equal no_grad's whichever mode filled the cache."""
    model = _model("tiny-v3")
    ids = torch.randint(4, 100, (2, 300))  # long enough for the compiled CPU kernel's blocks
    with torch.inference_mode():
        first = _hidden(model, ids)
        second = _hidden(model, ids)
    with torch.no_grad():
        third = _hidden(model, ids)
    for module in model.modules():  # forget everything cached
        for name in ("_table_cache", "_pos_cache"):
            if hasattr(module, name):
                setattr(module, name, None)
    with torch.no_grad():
        fresh = _hidden(model, ids)
    assert torch.equal(first, second)
    torch.testing.assert_close(first, fresh, rtol=0, atol=1e-6)
    torch.testing.assert_close(third, fresh, rtol=0, atol=1e-6)
