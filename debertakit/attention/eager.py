"""The `eager` backend: disentangled attention written out plainly. It is the specification every fast backend
is tested against (outputs and gradients), so it favours clarity over speed and memory.

    score(i, j) = [ q_i·k_j                       (c2c)
                  + q_i·Kr[idx(i, j)]             (c2p)
                  + k_j·Qr[idx(i, j)]             (p2c)
                  + Qr[idx(i, j)]·Kr[idx(i, j)]   (p2p, optional) ] · scale

with ``idx`` from `RelativeIndex` (REFERENCE.md §1–2). Scores are computed in float32 whatever the input dtype
(the fix for fp16 overflow, REFERENCE.md §2); hidden pairs get the float32 minimum; rows with no visible key
output zeros.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from debertakit.attention.geometry import Geometry
from debertakit.attention.relative import RelativeIndex


class PositionTerms(NamedTuple):
    c2p: bool = True
    p2c: bool = True
    p2p: bool = False

    @classmethod
    def from_config(cls, cfg) -> PositionTerms:
        return cls(cfg.c2p, cfg.p2c, cfg.p2p)

    @property
    def any(self) -> bool:
        return self.c2p or self.p2c or self.p2p


def score_components(
    q: Tensor,
    k: Tensor,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    rel: RelativeIndex,
    geom: Geometry,
    *,
    scale: float,
    terms: PositionTerms,
) -> dict[str, Tensor]:
    """Each score term separately, scaled, float32, (B, H, Nq, Nk). Used by `eager` and by attention maps."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    qf, kf = q.float(), k.float()
    parts = {"c2c": qf @ kf.transpose(-1, -2) * scale}
    if not terms.any:
        return parts
    idx = rel.index(geom.relative_distance(Nq, Nk, q.device))  # (B|1, Nq, Nk) rows of the table window
    idx = idx[:, None].expand(B, H, Nq, Nk)
    if terms.c2p:
        c2p = qf @ pos_k.float().transpose(-1, -2)  # (B, H, Nq, R): every query against every table row
        parts["c2p"] = torch.gather(c2p, -1, idx) * scale
    if terms.p2c:
        p2c = kf @ pos_q.float().transpose(-1, -2)  # (B, H, Nk, R): every key against every table row
        # p2c(i, j) = p2c[j, idx(i, j)]: gather along the table axis with the transposed index, then transpose
        parts["p2c"] = torch.gather(p2c, -1, idx.transpose(-1, -2)).transpose(-1, -2) * scale
    if terms.p2p:
        bias = (pos_q.float() * pos_k.float()).sum(-1)  # (H, R): one value per head and table row
        parts["p2p"] = torch.gather(bias[None, :, None, :].expand(B, H, Nq, bias.shape[-1]), -1, idx) * scale
    return parts


def eager_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    rel: RelativeIndex,
    geom: Geometry,
    *,
    scale: float,
    terms: PositionTerms,
    dropout_p: float = 0.0,
    return_probs: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Disentangled attention.

    Args:
        q: (B, H, Nq, D) projected queries (biases added, not scaled).
        k, v: (B, H, Nk, D) projected keys and values.
        pos_q: (H, R, D) relative table projected by the query-side projection (p2c, p2p) or None.
        pos_k: (H, R, D) relative table projected by the key-side projection (c2p, p2p) or None.
        rel: maps distances to rows of the R-row table window.
        geom: masks, segments, positions.
        scale: 1 / sqrt(D * (1 + number of terms)).
        terms: which position terms are on.
        dropout_p: dropout on the attention probabilities (0 at evaluation).
        return_probs: also return the (B, H, Nq, Nk) probabilities.

    Returns:
        (B, H, Nq, D) output in v's dtype, and the probabilities or None.
    """
    Nq, Nk = q.shape[2], k.shape[2]
    scores = sum(score_components(q, k, pos_q, pos_k, rel, geom, scale=scale, terms=terms).values())
    allowed = geom.allowed(Nq, Nk, q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    if allowed is not None:
        probs = probs * allowed.any(-1, keepdim=True)  # rows with no visible key -> zeros
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    out = (probs @ v.float()).to(v.dtype)
    return out, (probs if return_probs else None)
