"""Who may attend to whom, and at which relative distance: one object built per forward, shared by all layers.

Padded batches, packed (padding-free) batches and explicit masks all become a `Geometry`:

* ``key_mask`` (B, Nk) bool: keys that may be attended at all (padding is False).
* ``q_segments`` / ``k_segments`` (B, N) int: packed sequence ids; a query sees only keys of its own segment.
* ``q_positions`` / ``k_positions`` (B, N) int64: position of each token inside its own sequence; relative
  distances are ``q_positions[i] - k_positions[j]``. None means ``arange(N)``.
* ``dense`` (B, 1 or H, Nq, Nk) bool: an explicit attention mask given by the caller (3-D / 4-D masks).
* ``causal``: keys after the query (by position, within its sequence) are hidden.

Queries whose every key is hidden (padding rows of a packed batch, say) produce zeros.

Backends derive kernel inputs from a geometry (int32 position rows, block ranges, block masks) that are the same
in every layer: `Geometry.cached` keeps them for the geometry's lifetime (one forward), so the layers after the
first launch none of that work again. Assigning a field drops them; the tensors themselves are not changed in
place once a forward has started.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Geometry:
    key_mask: Tensor | None = None
    q_segments: Tensor | None = None
    k_segments: Tensor | None = None
    q_positions: Tensor | None = None
    k_positions: Tensor | None = None
    dense: Tensor | None = None
    causal: bool = False
    cu_seqlens: Tensor | None = None  # packed batches: (S + 1,) int32 offsets into the single row
    max_seqlen: int | None = None  # packed batches: the longest sequence
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name != "_derived":
            self.__dict__["_derived"] = {}  # inputs derived from the old value are stale

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per ``key`` for this geometry (see the module docstring). Under
        ``torch.compile`` it is always built: the graph computes it once per forward anyway."""
        if torch.compiler.is_compiling():
            return build()
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    def positions(self, n_q: int, n_k: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """(Bq|1, Nq) and (Bk|1, Nk) int64 positions."""
        qp = self.q_positions if self.q_positions is not None else torch.arange(n_q, device=device)[None]
        kp = self.k_positions if self.k_positions is not None else torch.arange(n_k, device=device)[None]
        return qp, kp

    def relative_distance(self, n_q: int, n_k: int, device: torch.device) -> Tensor:
        """(B|1, Nq, Nk) int64 distances ``i - j``."""
        qp, kp = self.positions(n_q, n_k, device)
        return qp[:, :, None] - kp[:, None, :]

    def allowed(self, n_q: int, n_k: int, device: torch.device) -> Tensor | None:
        """(B|1, 1|H, Nq, Nk) bool: True where query i may attend key j; None when everything is allowed."""
        allowed = None

        def both(m: Tensor) -> Tensor:
            return m if allowed is None else allowed & m

        if self.key_mask is not None:
            allowed = both(self.key_mask[:, None, None, :].bool())
        if self.q_segments is not None:
            allowed = both((self.q_segments[:, :, None] == self.k_segments[:, None, :])[:, None])
        if self.causal:
            qp, kp = self.positions(n_q, n_k, device)
            allowed = both((kp[:, None, :] <= qp[:, :, None])[:, None])
        if self.dense is not None:
            allowed = both(self.dense.bool())
        return allowed

    def explicit_positions(self) -> bool:
        """Whether the caller gave positions (of the queries, the keys or both) rather than ``arange(N)``."""
        return self.q_positions is not None or self.k_positions is not None

    def distance_is_i_minus_j(self) -> bool:
        """Whether every visible pair is at distance ``i - j`` (row indices): default positions, or a packed row
        (positions restart with each sequence and cross-sequence pairs are hidden, so within a sequence
        ``pos_i - pos_j == i - j``). Fast backends then need no position loads and treat the relative terms
        as Toeplitz."""
        if not self.explicit_positions():
            return True
        return (
            self.cu_seqlens is not None
            and self.q_positions is self.k_positions
            and self.q_segments is not None
            and self.q_segments is self.k_segments
        )

    def depends_on_shapes_alone(self) -> bool:
        """Whether who attends to whom follows from the shapes (and ``causal``) alone: no key mask, segments,
        packing, explicit positions or dense mask. Inputs a backend derives from such a geometry are the same
        for every geometry of those shapes, and may be kept across forwards."""
        masks = (
            self.key_mask,
            self.q_segments,
            self.k_segments,
            self.q_positions,
            self.k_positions,
            self.dense,
        )
        return self.cu_seqlens is None and all(m is None for m in masks)

    def max_distance(self, n_q: int, n_k: int) -> int:
        """An upper bound of |i - j| over all pairs that may attend each other."""
        if self.max_seqlen is not None:
            return self.max_seqlen - 1
        return max(n_q, n_k) - 1


def packed_geometry(cu_seqlens: Tensor, total: int, causal: bool = False) -> tuple[Geometry, Tensor]:
    """Geometry of one row holding sequences back to back, ``cu_seqlens = [0, n0, n0 + n1, ...]``.

    Tokens after ``cu_seqlens[-1]`` (row padding) get segment -1 and are masked as keys.

    Returns:
        The geometry and the (1, T) positions inside each sequence (for absolute position embeddings).
    """
    cu = cu_seqlens.to(torch.long)
    device = cu.device
    lengths = cu[1:] - cu[:-1]
    t = torch.arange(total, device=device)
    seg = torch.bucketize(t, cu[1:], right=True)  # index of the sequence each token belongs to
    real = t < cu[-1]
    seg = torch.where(real, seg, torch.full_like(seg, -1))
    pos = t - cu[torch.clamp(seg, min=0)]
    pos = torch.where(real, pos, torch.zeros_like(pos))
    seg, pos = seg[None], pos[None]
    geom = Geometry(  # queries and keys share one tensor each: backends recognise distance i - j by identity
        key_mask=real[None],
        q_segments=seg,
        k_segments=seg,
        q_positions=pos,
        k_positions=pos,
        causal=causal,
        cu_seqlens=cu_seqlens.to(torch.int32),
        max_seqlen=int(lengths.max()) if lengths.numel() else 0,
    )
    return geom, pos


def validate_cu_seqlens(cu_seqlens: Tensor, total: int) -> None:
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be a 1-D tensor [0, n0, n0 + n1, ...] with at least 2 entries; got shape "
            f"{tuple(cu_seqlens.shape)}"
        )
    if int(cu_seqlens[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0; got {int(cu_seqlens[0])}")
    diffs = cu_seqlens[1:] - cu_seqlens[:-1]
    if bool((diffs <= 0).any()):
        bad = int((diffs <= 0).nonzero()[0])
        raise ValueError(
            f"cu_seqlens must be strictly increasing; entry {bad + 1} ({int(cu_seqlens[bad + 1])}) is not"
        )
    if int(cu_seqlens[-1]) > total:
        raise ValueError(f"cu_seqlens[-1]={int(cu_seqlens[-1])} exceeds the {total} tokens of the packed row")
