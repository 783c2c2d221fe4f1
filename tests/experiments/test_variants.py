"""Each ablation switch removes exactly its term: on the same weights, a variant's score decomposition equals the
full model's with that term zeroed (scores compared per unit of scale, since the scale 1/sqrt(d·sf) depends on
the number of terms)."""

from __future__ import annotations

import pytest
import torch

import debertakit
from debertakit.experiments import TABLE4, VARIANTS, variant_config
from debertakit.viz import layer_scores


def _base(preset="tiny-v3"):
    return debertakit.DebertaConfig.preset(preset, hidden_dropout=0.0, attention_dropout=0.0)


def _pair(name, preset="tiny-v3"):
    base = _base(preset)
    full = debertakit.build_model(base, "masked_lm").eval()
    variant = debertakit.build_model(variant_config(base, name), "masked_lm").eval()
    missing, unexpected = variant.load_state_dict(full.state_dict(), strict=False)
    return full, variant, missing, unexpected


def _batch():
    ids = torch.randint(4, 128, (2, 19))
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    return ids, mask


def _scale(model):
    return model.deberta.encoder.layers[0].attention.scale


@pytest.mark.parametrize(
    "name,removed",
    [("no-c2p", {"c2p"}), ("no-p2c", {"p2c"}), ("no-emd-c2p", {"c2p"}), ("no-emd-p2c", {"p2c"})],
)
@pytest.mark.parametrize("preset", ["tiny-v3", "tiny-v1"])
def test_removing_a_term_zeroes_exactly_that_term(name, removed, preset):
    full, variant, missing, unexpected = _pair(name, preset)
    assert not missing  # every weight of the variant comes from the full model
    if preset == "tiny-v3":
        assert not unexpected  # shared position projections: the very same parameters
    else:
        # v1 layout: only the projection of the removed term is left over
        proj = {"c2p": "pos_key", "p2c": "pos_query"}[next(iter(removed))]
        assert unexpected and all(f".{proj}." in k for k in unexpected)
    ids, mask = _batch()
    f = layer_scores(full, ids, mask, layer=0)
    v = layer_scores(variant, ids, mask, layer=0)
    assert set(f.components) == {"c2c", "c2p", "p2c"}
    assert set(v.components) == set(f.components) - removed
    sf, sv = _scale(full), _scale(variant)
    assert sf != sv  # 1/sqrt(3d) against 1/sqrt(2d)
    for term in v.components:
        torch.testing.assert_close(v.components[term] / sv, f.components[term] / sf, rtol=1e-5, atol=1e-5)
    zeroed = sum(t for k, t in f.components.items() if k not in removed)
    torch.testing.assert_close(v.scores / sv, zeroed / sf, rtol=1e-5, atol=1e-5)
    # and the removed term was not zero to begin with
    assert all(f.components[k].abs().max() > 1e-4 for k in removed)


def test_no_emd_removes_only_the_decoder():
    full, variant, missing, unexpected = _pair("no-emd")
    assert not missing and not unexpected
    assert full.cfg.emd_enabled and not variant.cfg.emd_enabled
    ids, mask = _batch()
    f = layer_scores(full, ids, mask, layer=-1)
    v = layer_scores(variant, ids, mask, layer=-1)
    for term in f.components:
        torch.testing.assert_close(v.components[term], f.components[term])
    with torch.no_grad():
        got = variant(input_ids=ids, attention_mask=mask).logits
        want = full(input_ids=ids, attention_mask=mask, use_emd=False).logits
        with_emd = full(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want)
    assert (got - with_emd).abs().max() > 1e-3


def test_roberta_baseline_is_content_only_attention_with_absolute_inputs():
    base = _base()
    cfg = variant_config(base, "roberta")
    assert cfg.position_biased_input and not cfg.relative_attention and not cfg.emd_enabled
    full = debertakit.build_model(base, "masked_lm").eval()
    rob = debertakit.build_model(cfg, "masked_lm").eval()
    missing, unexpected = rob.load_state_dict(full.state_dict(), strict=False)
    assert missing == ["deberta.embeddings.position.weight"]
    assert all("rel_" in k or k.startswith("emd.") for k in unexpected)
    ids, mask = _batch()
    with torch.no_grad():
        rob.deberta.embeddings.position.weight.zero_()  # same inputs as the full model at layer 0
    f = layer_scores(full, ids, mask, layer=0)
    v = layer_scores(rob, ids, mask, layer=0)
    assert set(v.components) == {"c2c"}
    torch.testing.assert_close(
        v.scores / _scale(rob), f.components["c2c"] / _scale(full), rtol=1e-5, atol=1e-5
    )
    with torch.no_grad():
        rob.deberta.embeddings.position.weight.normal_()  # absolute positions now change the inputs
    assert (layer_scores(rob, ids, mask, layer=0).scores - v.scores).abs().max() > 1e-3


def test_registry_covers_table4_and_rtd_is_an_objective_only():
    assert set(TABLE4) <= set(VARIANTS)
    base = _base()
    assert variant_config(base, "full") == base
    assert variant_config(base, "rtd") == base and VARIANTS["rtd"].objective == "rtd"
    assert variant_config(base, "no-emd-c2p").position_terms == ("p2c",)
    with pytest.raises(ValueError, match="unknown ablation variant 'no-c2c'"):
        variant_config(base, "no-c2c")
