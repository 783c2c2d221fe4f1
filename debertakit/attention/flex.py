"""The `flex` backend: disentangled attention through `torch.nn.attention.flex_attention`.

The position terms are a ``score_mod``: c2p and p2c are precomputed as (B, H, N, R) products with the table
(the paper's N×2k trick, REFERENCE.md §1) and gathered inside the score modification at ``idx(i, j)``, read
from the same lookup table as every other backend (`RelativeIndex`). Padding, packed sequences, causal and dense
masks are a ``mask_mod`` turned into a block mask, so fully hidden blocks are skipped by the compiled kernel.

Compilation: on CUDA the call goes through ``torch.compile(flex_attention)`` (compiled once per process). On CPU it
runs uncompiled by default — PyTorch's reference path, which materialises the scores and is slower than `chunked`
— unless ``DEBERTAKIT_FLEX_COMPILE=1`` asks for inductor's CPU kernel (it needs a C++ compiler and compiles for
a while). Where FlexAttention cannot be imported (torch older than 2.5) the backend declines with the reason.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from debertakit.attention.eager import PositionTerms
from debertakit.attention.geometry import Geometry
from debertakit.attention.precision import own_precision
from debertakit.attention.registry import Backend, Request, register
from debertakit.attention.relative import RelativeIndex

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    IMPORT_ERROR: str | None = None
except ImportError as err:  # torch < 2.5
    create_block_mask = flex_attention = None
    IMPORT_ERROR = (
        f"torch {torch.__version__} has no torch.nn.attention.flex_attention ({err}); needs torch >= 2.5"
    )

_COMPILED: dict[str, object] = {}


def _should_compile(device_type: str) -> bool:
    if device_type == "cuda":
        return os.environ.get("DEBERTAKIT_FLEX_COMPILE", "1") != "0"
    return os.environ.get("DEBERTAKIT_FLEX_COMPILE", "0") == "1"


def _flex_fn(device_type: str):
    """flex_attention, compiled where `_should_compile` says so, for static shapes: each new (batch, length)
    compiles anew, and past dynamo's recompile limit (``torch._dynamo.config.recompile_limit``, 8) flex_attention
    runs unfused, every (B, H, Nq, Nk) score in memory (dynamo warns "hit config.recompile_limit"). The GPU
    benchmark's lengths crossed it at N = 2048 (a forward and a forward+backward per length from N = 128): its
    `flex` rows from there on are of the unfused fallback (forward 17.7 GiB at 2048, out of memory from 8192 on
    forward+backward). Automatic dynamic shapes (``dynamic=None``, one kernel for every length after the second)
    would avoid it, but in PyTorch 2.13 Inductor's CPU template for them does not compile with this backend's
    score_mod (C++ errors: ``cur_qSplitSize4`` undeclared), and on CUDA they are untried."""
    if not _should_compile(device_type):
        return flex_attention
    if device_type not in _COMPILED:
        _COMPILED[device_type] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED[device_type]


@own_precision
def flex_disentangled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    rel: RelativeIndex | None,
    geom: Geometry,
    *,
    scale: float,
    terms: PositionTerms,
    dropout_p: float = 0.0,
    return_probs: bool = False,
) -> tuple[Tensor, None]:
    """Same contract as `eager_attention`, without probabilities or dropout."""
    if IMPORT_ERROR is not None:
        raise RuntimeError(IMPORT_ERROR)
    if return_probs or dropout_p > 0.0:
        raise ValueError(
            f"the flex backend supports neither attention probabilities nor dropout (return_probs={return_probs}, "
            f"dropout_p={dropout_p}); use 'chunked' or 'eager'"
        )
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    device = q.device
    qf, kf, vf = q.float(), k.float(), v.float()  # scores and accumulation in float32 (REFERENCE.md §2)
    terms = terms if rel is not None else PositionTerms(False, False, False)

    score_mod = None
    if terms.any:
        qp, kp = geom.positions(Nq, Nk, device)
        qp = qp.expand(B, Nq).contiguous()
        kp = kp.expand(B, Nk).contiguous()
        sat = rel.saturation
        R = (pos_k if pos_k is not None else pos_q).shape[1]
        lut = rel.lut_on(device).clamp(0, R - 1).contiguous()  # rows of distances -sat..sat
        c2p = (
            (qf @ pos_k.float().transpose(-1, -2) * scale).contiguous() if terms.c2p else None
        )  # (B, H, Nq, R)
        p2c = (
            (kf @ pos_q.float().transpose(-1, -2) * scale).contiguous() if terms.p2c else None
        )  # (B, H, Nk, R)
        p2p = ((pos_q.float() * pos_k.float()).sum(-1) * scale).contiguous() if terms.p2p else None  # (H, R)

        def score_mod(score, b, h, q_idx, kv_idx):
            delta = torch.clamp(qp[b, q_idx] - kp[b, kv_idx], -sat, sat)
            row = lut[delta + sat]
            if c2p is not None:
                score = score + c2p[b, h, q_idx, row]
            if p2c is not None:
                score = score + p2c[b, h, kv_idx, row]
            if p2p is not None:
                score = score + p2p[h, row]
            return score

    mask_mod = _mask_mod(geom, B, H, Nq, Nk, device)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, pos_q, pos_k)
    )
    if device.type == "cpu" and needs_grad:
        # FlexAttention has no backward on CPU: evaluate the very same score_mod / mask_mod densely (autograd)
        out = _dense(qf, kf, vf, score_mod, mask_mod, scale)
    else:
        block_mask = None
        if mask_mod is not None:
            heads = H if geom.dense is not None and geom.dense.shape[1] > 1 else None
            block_mask = geom.cached(  # the same in every layer: built once per forward
                ("flex-block-mask", B, heads, Nq, Nk, device),
                lambda: create_block_mask(mask_mod, B, heads, Nq, Nk, device=device),
            )
        out = _flex_fn(device.type)(qf, kf, vf, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return out.to(v.dtype), None


def _dense(q: Tensor, k: Tensor, v: Tensor, score_mod, mask_mod, scale: float) -> Tensor:
    """score_mod and mask_mod applied by broadcasting index tensors over the full (B, H, Nq, Nk) scores."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    dev = q.device
    b = torch.arange(B, device=dev)[:, None, None, None]
    h = torch.arange(H, device=dev)[None, :, None, None]
    qi = torch.arange(Nq, device=dev)[None, None, :, None]
    ki = torch.arange(Nk, device=dev)[None, None, None, :]
    scores = q @ k.transpose(-1, -2) * scale
    if score_mod is not None:
        scores = score_mod(scores, b, h, qi, ki)
    if mask_mod is None:
        return torch.softmax(scores, -1) @ v
    allowed = mask_mod(b, h, qi, ki)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # rows with no visible key -> zeros, as FlexAttention
    return probs @ v


def _mask_mod(geom: Geometry, B: int, H: int, Nq: int, Nk: int, device: torch.device):
    """The geometry as a mask_mod (None when everything is visible)."""
    allowed_parts = []
    key_mask = geom.key_mask.bool().expand(B, Nk).contiguous() if geom.key_mask is not None else None
    if key_mask is not None:
        allowed_parts.append(lambda b, h, q, kv: key_mask[b, kv])
    if geom.q_segments is not None:
        qs = geom.q_segments.expand(B, Nq).contiguous()
        ks = geom.k_segments.expand(B, Nk).contiguous()
        allowed_parts.append(lambda b, h, q, kv: qs[b, q] == ks[b, kv])
    if geom.causal:
        qp, kp = geom.positions(Nq, Nk, device)
        qp, kp = qp.expand(B, Nq).contiguous(), kp.expand(B, Nk).contiguous()
        allowed_parts.append(lambda b, h, q, kv: kp[b, kv] <= qp[b, q])
    if geom.dense is not None:
        dense = geom.dense.bool().expand(B, H, Nq, Nk).contiguous()
        allowed_parts.append(lambda b, h, q, kv: dense[b, h, q, kv])
    if not allowed_parts:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        ok = allowed_parts[0](b, h, q_idx, kv_idx)
        for part in allowed_parts[1:]:
            ok = ok & part(b, h, q_idx, kv_idx)
        return ok

    return mask_mod


def _unsupported(request: Request) -> str | None:
    if IMPORT_ERROR is not None:
        return IMPORT_ERROR
    if request.needs_probs:
        return "it does not return attention probabilities (output_attentions); use 'eager'"
    if request.dropout:
        return "FlexAttention has no attention dropout; use 'chunked' or 'eager' for training with dropout"
    return None


def _priority(request: Request) -> float:
    """Below `eager` everywhere, so `auto` never picks it (it runs when named). Uncompiled on CPU it is a
    reference path; compiled on one H100 (benchmarks/results/attention_gpu.json, section ``attention``: bf16, v3
    positions, batch·N = 16384) it was slower than `eager` at every length it ran compiled, N = 128 … 1024,
    forward (6.9 against 6.1 ms at N = 512, 11.5 against 10.2 at 1024) and forward+backward (27.5 against 12.8
    ms at 512, 50.2 against 22.2 at 1024), though in less memory (forward 1.3 against 3.9 GiB at 1024). Longer
    inputs ran unfused there (see `_flex_fn`): no measurement of them yet."""
    return -1.0


register(Backend("flex", flex_disentangled_attention, unsupported=_unsupported, priority=_priority))
