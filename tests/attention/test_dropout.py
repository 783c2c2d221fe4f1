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


def test_accelerators_use_pytorchs_fused_dropout_at_the_rounded_probability(monkeypatch):
    """Off the CPU the 16-bit rule in PyTorch operations would be about seven kernels (random words, lanes,
    compare, invert, fill, scale, and again backward): there `dropout` calls PyTorch's dropout, which on CUDA is
    one fused kernel each way, with the probability the CPU rule applies. PyTorch's ``meta`` device stands for
    the accelerator."""
    calls = []

    def spy(x, p, training):
        calls.append((p, training))
        return x

    monkeypatch.setattr(torch.nn.functional, "dropout", spy)
    monkeypatch.setattr("debertakit.attention.dropout.keep_mask", lambda *a, **k: pytest.fail("16-bit rule"))
    x = torch.empty(8, 16, device="meta")
    assert Dropout(0.1).train()(x) is x
    assert calls == [(rounded_p(0.1), True)]
    assert Dropout(0.1).eval()(x) is x and len(calls) == 1  # no dropout at inference


@pytest.mark.gpu
def test_cuda_dropout_keeps_one_minus_p_and_follows_the_cuda_seed_gpu():
    x = torch.ones(1000, 1000, device="cuda", dtype=torch.bfloat16)
    torch.cuda.manual_seed(5)
    a = dropout(x, 0.1)
    torch.cuda.manual_seed(5)
    b = dropout(x, 0.1)
    assert torch.equal(a, b)
    kept = (a != 0).float().mean().item()
    assert abs(kept - (1 - rounded_p(0.1))) < 0.003
    torch.testing.assert_close(
        a[a != 0].float(), torch.full_like(a[a != 0].float(), 1 / (1 - rounded_p(0.1))), rtol=4e-3, atol=0
    )
