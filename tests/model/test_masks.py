"""Mask semantics of the backbone: explicit 3-D / 4-D masks, the causal switch, packed (padding-free) rows,
the v2 conv branch on packed rows, and the p2p term."""

from __future__ import annotations

import pytest
import torch

import debertakit


def _model(preset="tiny-v2", **kw):
    cfg = debertakit.DebertaConfig.preset(preset, hidden_dropout=0.0, attention_dropout=0.0, **kw)
    return debertakit.build_model(cfg, "base").eval()


def _batch(n=23):
    ids = torch.randint(4, 128, (2, n))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    return ids, mask


@pytest.mark.parametrize("preset", ["tiny-v1", "tiny-v2", "tiny-v3"])
def test_3d_and_4d_masks_equal_padding_mask(preset):
    model = _model(preset)
    ids, mask = _batch()
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m3 = mask[:, :, None] * mask[:, None, :]
    for dense in (m3, m3[:, None], m3[:, None].expand(-1, 4, -1, -1)):
        out = model(input_ids=ids, attention_mask=dense).last_hidden_state
        assert (out - ref)[mask.bool()].abs().max() < 1e-5


def test_causal_switch_equals_lower_triangular_mask():
    model = _model()
    ids, _ = _batch()
    tri = torch.tril(torch.ones(23, 23, dtype=torch.long))[None].expand(2, -1, -1)
    a = model(input_ids=ids, causal=True).last_hidden_state
    b = model(input_ids=ids, attention_mask=tri).last_hidden_state
    assert (a - b).abs().max() < 1e-5


@pytest.mark.parametrize("preset", ["tiny-v3", "tiny-v1"])
def test_causal_no_position_sees_a_later_one(preset):
    model = _model(preset)
    x = torch.randn(1, 12, 32, requires_grad=True)
    out = model(inputs_embeds=x, causal=True).last_hidden_state
    (out[0, 5] * torch.randn(32)).sum().backward()  # a plain sum of a LayerNorm output is constant
    assert x.grad[0, 6:].abs().max() == 0 and x.grad[0, :6].abs().max() > 0


@pytest.mark.parametrize("preset", ["tiny-v1", "tiny-v2", "tiny-v3"])
def test_packed_equals_each_sequence_alone(preset):
    model = _model(preset)
    lengths = [7, 30, 1, 12]
    seqs = [torch.randint(4, 128, (1, n)) for n in lengths]
    packed = torch.cat(seqs, dim=1)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    out = model(input_ids=packed, cu_seqlens=cu).last_hidden_state
    for s, (a, b) in zip(seqs, zip(cu[:-1], cu[1:])):
        alone = model(input_ids=s).last_hidden_state
        assert (out[:, a:b] - alone).abs().max() < 1e-5


def test_packed_row_padding_is_ignored():
    model = _model()
    seqs = [torch.randint(4, 128, (1, n)) for n in (5, 9)]
    packed = torch.cat([*seqs, torch.zeros(1, 4, dtype=torch.long)], dim=1)  # 4 padding tokens at the end
    out = model(input_ids=packed, cu_seqlens=torch.tensor([0, 5, 14])).last_hidden_state
    assert (out[:, 5:14] - model(input_ids=seqs[1]).last_hidden_state).abs().max() < 1e-5
    assert torch.isfinite(out).all()


def test_p2p_term_adds_a_position_bias():
    """p2p(i, j) = Qr[idx]·Kr[idx]: with the term on, scores change by exactly that bias."""
    from debertakit.attention import Geometry, PositionTerms, RelativeIndex, score_components

    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
    rel = RelativeIndex(span=4, bucket_size=4, max_position=8)
    lo, hi = rel.window(8)
    pos_q, pos_k = torch.randn(2, hi - lo, 4), torch.randn(2, hi - lo, 4)
    rel = rel.shifted(lo)
    parts = score_components(
        q, k, pos_q, pos_k, rel, Geometry(), scale=0.5, terms=PositionTerms(True, True, True)
    )
    idx = rel.index(torch.arange(9)[:, None] - torch.arange(9)[None, :])
    expected = torch.stack([(pos_q[h][idx] * pos_k[h][idx]).sum(-1) for h in range(2)])[None] * 0.5
    assert torch.allclose(parts["p2p"], expected, atol=1e-6)
    model = _model("tiny-v3", position_terms=("c2p", "p2c", "p2p"))
    assert model.cfg.score_scale_factor == 4
    assert torch.isfinite(model(input_ids=torch.randint(4, 128, (1, 6))).last_hidden_state).all()


def test_output_attentions():
    model = _model()
    ids, mask = _batch()
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 23, 23)
    row_sums = out.attentions[0][1, :, :15].sum(-1)
    assert torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-5)
    assert out.attentions[0][1, :, :, 15:].abs().max() == 0  # padding is never attended


def test_gradient_checkpointing_same_gradients():
    torch.manual_seed(0)
    a = _model("tiny-v3")
    b = _model("tiny-v3", gradient_checkpointing=True)
    b.load_state_dict(a.state_dict())
    a.train(), b.train()
    ids, mask = _batch()
    w = torch.randn(2, 23, 32)
    for m in (a, b):
        (m(input_ids=ids, attention_mask=mask).last_hidden_state * w).sum().backward()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), n


def test_position_dropout_does_not_depend_on_the_table_window():
    """Training draws the relative-table dropout mask for the whole table, so the run is the same whether the
    length-dependent window (eager) or the whole table (compiled / exported code) is projected."""
    from debertakit.attention import RelativeIndex

    cfg = debertakit.DebertaConfig.preset("tiny-v3")
    att = debertakit.build_model(cfg, "base").deberta.encoder.layers[0].attention.train()
    full_table = torch.randn(2 * cfg.rel_span, cfg.hidden_size)
    rel = RelativeIndex.from_config(cfg)
    lo, hi = rel.window(5)
    torch.manual_seed(3)
    q_full, k_full = att.position_projections(full_table, rel)
    torch.manual_seed(3)
    q_win, k_win = att.position_projections(full_table[lo:hi], rel.shifted(lo))
    assert torch.allclose(q_win, q_full[:, lo:hi], atol=1e-6) and torch.allclose(
        k_win, k_full[:, lo:hi], atol=1e-6
    )
    assert not torch.allclose(q_full, att.eval().position_projections(full_table, rel)[0])  # dropout was on
