"""Dropout masks from 16-bit draws (`debertakit.attention.dropout`)."""

from __future__ import annotations

import pytest
import torch

from debertakit.attention.dropout import Dropout, dropout, keep_mask, rounded_p


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_matches_p_in_every_16_bit_lane(p):
    """Each 64-bit draw gives three 16-bit numbers (elements 3t, 3t+1, 3t+2); each lane must drop at rate p
    (the top 16 bits of a draw are not uniform and must not be used)."""
    torch.manual_seed(0)
    keep, _ = keep_mask((3, 400_000), p, "cpu")
    lanes = keep.view(-1)[: 3 * 400_000].view(-1, 3).float()
    sigma = (p * (1 - p) / lanes.shape[0]) ** 0.5
    for lane in range(3):
        rate = lanes[:, lane].mean().item()
        assert abs(rate - (1 - rounded_p(p))) < 6 * sigma, f"lane {lane}: keep rate {rate} for p={p}"


def test_rounded_p_and_scale():
    assert rounded_p(0.1) == round(0.1 * 65536) / 65536
    assert abs(rounded_p(0.1) - 0.1) < 2**-17
    _, scale = keep_mask((10,), 0.1, "cpu")
    assert scale == 1 / (1 - rounded_p(0.1))


@pytest.mark.parametrize("shape", [(1,), (2,), (7, 5), (2, 3, 4, 5)])
def test_any_shape(shape):
    keep, _ = keep_mask(shape, 0.3, "cpu")
    assert keep.shape == shape and keep.dtype == torch.bool


def test_p_zero_keeps_everything_and_bad_p_is_rejected():
    keep, scale = keep_mask((1000,), 0.0, "cpu")
    assert bool(keep.all()) and scale == 1.0
    for bad in (1.0, -0.1, 1.5, 1 - 2**-18):  # the last rounds to 1 at 16-bit resolution
        with pytest.raises(ValueError, match=str(bad)):
            keep_mask((3,), bad, "cpu")
        with pytest.raises(ValueError, match=str(bad)):
            Dropout(bad)


def test_seeded_masks_repeat():
    torch.manual_seed(3)
    a, _ = keep_mask((999,), 0.2, "cpu")
    torch.manual_seed(3)
    b, _ = keep_mask((999,), 0.2, "cpu")
    c, _ = keep_mask((999,), 0.2, "cpu")
    assert torch.equal(a, b) and not torch.equal(a, c)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(keep_mask((999,), 0.2, "cpu", g1)[0], keep_mask((999,), 0.2, "cpu", g2)[0])


def test_dropout_module_forward_and_backward():
    x = torch.randn(64, 300, requires_grad=True)
    layer = Dropout(0.25)
    layer.eval()
    assert layer(x) is x
    layer.train()
    y = layer(x)
    dropped = y == 0
    scale = 1 / (1 - rounded_p(0.25))
    assert 0.2 < dropped.float().mean().item() < 0.3
    torch.testing.assert_close(y[~dropped], x[~dropped] * scale)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert bool((g[dropped] == 0).all())
    torch.testing.assert_close(g[~dropped], torch.full_like(g[~dropped], scale))
    assert dropout(x, 0.5, training=False) is x
