"""The components of a layer add up to the scores the model itself used."""

from __future__ import annotations

import pytest
import torch

import debertakit
from debertakit.viz import layer_scores


@pytest.mark.parametrize("preset,terms", [("tiny-v3", ("c2p", "p2c")), ("tiny-v1", ("c2p", "p2c", "p2p"))])
@pytest.mark.parametrize("causal", [False, True])
def test_components_sum_to_the_models_probabilities(preset, terms, causal):
    cfg = debertakit.DebertaConfig.preset(preset, position_terms=terms)
    model = debertakit.build_model(cfg, "masked_lm").train()  # layer_scores turns dropout off itself
    ids = torch.randint(4, 128, (2, 17))
    mask = torch.ones_like(ids)
    mask[0, 11:] = 0
    for layer in (0, -1):
        s = layer_scores(model, ids, mask, layer=layer, causal=causal)
        assert set(s.components) == {"c2c", *terms}
        real = mask.bool()
        torch.testing.assert_close(
            s.softmax()[real[:, None, :, None].expand_as(s.probs)],
            s.probs[real[:, None, :, None].expand_as(s.probs)],
            rtol=1e-5,
            atol=1e-6,
        )
        if causal:
            assert s.probs[0, :, 3, 4:].abs().max() == 0
    assert model.training


def test_bad_layer_is_named():
    model = debertakit.build_model(debertakit.DebertaConfig.preset("tiny-v3"), "base")
    with pytest.raises(ValueError, match="layer 5 out of range"):
        layer_scores(model, torch.randint(4, 128, (1, 5)), layer=5)
