"""The `chunked` backend: exact disentangled attention in pure PyTorch, memory O(N·block) per head, any device.

Two observations make it fast (REFERENCE.md §1–2):

* **Relative terms are Toeplitz.** When the distance is ``i - j`` (no explicit positions, or a packed row whose
  positions restart per sequence), ``c2p(i, j) = C[i, idx(i - j)]`` with ``C = q·Kr^T`` (N×R, computed once:
  the paper's Algorithm 1), and the (block × band) table of rows ``idx(i - j)`` depends only on the block's
  offset from its band, so consecutive blocks share one small index (never B·H·N·N); p2c is the same on the key
  side (at inference gathered straight into query-major order from the flattened key rows).
* **The index saturates.** Beyond ``rel.saturation`` the table row is constant per side, so far pairs add only
  a per-row term (c2p) plus a per-column term (p2c). Each query block needs gathered terms only on its diagonal
  band; the far field is a rank-one bias. At inference on long inputs the far field goes through PyTorch's fused
  attention kernel with the two terms folded into two extra dimensions of q and k
  (``[q, c2p_i, 1]·[k, 1, p2c_j] = q·k + c2p_i + p2c_j``), one causal call per side; the pieces are merged
  exactly with their log-sum-exp.

Each query block calls ``scaled_dot_product_attention`` with the block's (scaled) relative bias and mask as an
additive float mask, so scores are float32, hidden pairs get the float32 minimum and autograd runs through the
blocks (each block is recomputed in the backward pass for long inputs). Explicit positions that are not
``i - j`` (the Enhanced Mask Decoder's subset of query rows) gather with a (B, block, Nk) index.

On the CPU, distance-``i - j`` calls run the compiled kernel of `debertakit.attention.cpu_kernel` instead
(inference below ``FUSED_MAX_KEYS`` tokens, training while the probabilities can be kept): the same math per
(batch, head) in cache-sized blocks, with no B·H·N·N tensor but the kept probabilities. The pure PyTorch paths
serve everything else, and everything where the kernel cannot be built or a graph is being captured.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import forward_ad
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from debertakit.attention import cpu_kernel
from debertakit.attention.dropout import keep_mask
from debertakit.attention.eager import PositionTerms
from debertakit.attention.geometry import Geometry
from debertakit.attention.precision import own_precision
from debertakit.attention.registry import Backend, Request, register
from debertakit.attention.relative import RelativeIndex

# query rows per block: at most MAX_BLOCK, fewer when B·H·block·Nk would exceed BLOCK_ELEMENTS
MAX_BLOCK = 256
MIN_BLOCK = 32
BLOCK_ELEMENTS = 1 << 22
# one block when the whole B·H·Nq·Nk bias is this small (56 MiB of float32): short inputs, e.g. training at 512
SINGLE_BLOCK_ELEMENTS = 14 << 20
# with several blocks, recompute them in backward (activation checkpointing) for long inputs or a large total
CHECKPOINT_KEYS = 2048
CHECKPOINT_ELEMENTS = 1 << 26
# training with distance i - j: scores per tile. On the CPU one tile's scores and probabilities stay in the caches.
# Elsewhere every operation of a tile is a kernel launch, and larger tiles launch fewer: at B = 32, N = 512, 12
# heads, one call's forward and backward run 16 727 operations (views and allocations not counted) with the CPU's
# tiles and 882 with TRAIN_TILE_ELEMENTS_OFF_CPU (on the meta device: `test_chunked_training_off_the_cpu_...`). On an H100 a training step of the deberta-v3-base shape
# took 2154 ms with the CPU's tiles, bound by its launches (`eager`: 188 ms; benchmarks/results/attention_gpu.json);
# the larger tiles are not timed there yet. The probabilities are kept for the backward pass when there are at
# most STORE_KEYS keys (memory O(N·STORE_KEYS) per head) and B·H·Nq·Nk <= STORE_ELEMENTS, else recomputed tile
# by tile (memory O(N·block))
TRAIN_TILE_ELEMENTS = 1 << 20
TRAIN_TILE_ELEMENTS_OFF_CPU = 1 << 24
INFER_TILE_ELEMENTS = 14 << 20  # inference: up to 56 MiB of scores per tile (one tile at (2, 512))
STORE_KEYS = 1024
STORE_ELEMENTS = 1 << 26
# inference on the CPU: the compiled kernel below this many tokens, the far-field path (where it applies) from it
FUSED_MAX_KEYS = 8192
# query rows per block of the far-field path's band
FAR_BLOCK = 256
# inference uses the fused far-field path when the input is this many saturation distances long
FAR_FIELD_MIN_RATIO = 3.0

_MIN = torch.finfo(torch.float32).min


@own_precision
def chunked_attention(
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
    block_size: int | None = None,
    far_field: bool | None = None,
    fused: bool | None = None,
) -> tuple[Tensor, None]:
    """Same contract as `eager_attention` (without probabilities).

    ``block_size`` overrides the query rows per block; ``far_field`` forces (True) or forbids (False) the fused
    far-field path where it applies (None: when the input is long against the saturation distance). ``fused``
    asks for (True: an error where it cannot run) or forbids (False) the compiled CPU kernel at inference
    (None: wherever it applies and could be built).
    """
    if return_probs:
        raise ValueError("the chunked backend does not return attention probabilities; use backend 'eager'")
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    terms = terms if rel is not None else PositionTerms(False, False, False)
    ctx = _Context(q, k, v, pos_q, pos_k, rel, geom, scale, terms)
    needs_grad = ctx.needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, pos_q, pos_k)
    )
    inference = not needs_grad and dropout_p == 0.0
    if fused and far_field:
        raise ValueError("fused=True and far_field=True ask for two different paths; pass at most one")
    # the far-field path overtakes the compiled kernel on very long inputs (benchmarks/attention_backends.py)
    far_first = far_field is True or (
        fused is None and far_field is None and Nq >= FUSED_MAX_KEYS and ctx.far_field_ok(None)
    )
    if inference and not far_first and _use_fused(ctx, fused):
        return _fused(ctx).to(v.dtype), None
    ctx.with_rows()
    if inference and far_field is not False and ctx.far_field_ok(far_field):
        return _far_field(ctx, block_size).to(v.dtype), None

    if (needs_grad or dropout_p > 0.0) and _use_fused(ctx, fused, training=True):
        return _train_fused(ctx, dropout_p).to(v.dtype), None
    if needs_grad and ctx.toeplitz:
        return _train_toeplitz(ctx, dropout_p, block_size).to(v.dtype), None

    if inference:  # tile by tile into one output
        tiles = ctx.tiles(block_size, INFER_TILE_ELEMENTS)
        if len(tiles) == 1:
            return _block(ctx, 0, Nq, 0.0).to(v.dtype), None
        out = ctx.q.new_empty(B, H, Nq, v.shape[-1])
        for b0, b1, i0, i1, _, _ in tiles:
            out[b0:b1, :, i0:i1] = _block(ctx.batch(b0, b1), i0, i1, 0.0)
        return out.to(v.dtype), None

    bq = block_size or _block_rows(B, H, Nq, Nk)
    blocks = [(i0, min(i0 + bq, Nq)) for i0 in range(0, Nq, bq)]
    recompute = (
        needs_grad and len(blocks) > 1 and (Nk > CHECKPOINT_KEYS or B * H * Nq * Nk > CHECKPOINT_ELEMENTS)
    )
    outs = []
    for i0, i1 in blocks:
        if recompute:
            o = checkpoint(_block, ctx, i0, i1, dropout_p, use_reentrant=False)
        else:
            o = _block(ctx, i0, i1, dropout_p)
        outs.append(o)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.to(v.dtype), None


def _block_rows(B: int, H: int, Nq: int, Nk: int) -> int:
    if B * H * Nq * Nk <= SINGLE_BLOCK_ELEMENTS:
        return max(Nq, 1)
    rows = BLOCK_ELEMENTS // max(B * H * Nk, 1)
    return max(MIN_BLOCK, min(MAX_BLOCK, rows))


class _Context:
    """Per-call tensors shared by the blocks: float32 inputs, the saturated far-field terms, the geometry."""

    def __init__(self, q, k, v, pos_q, pos_k, rel, geom: Geometry, scale: float, terms: PositionTerms):
        # contiguous (B, H, N, D): the projections hand over transposed views; batched matmuls want them plain
        self.q, self.k, self.v = (t.float().contiguous() for t in (q, k, v))
        self.B, self.H, self.Nq, self.D = q.shape
        self.Nk = k.shape[2]
        self.rel, self.geom, self.scale, self.terms = rel, geom, scale, terms
        # position projections with the scale folded in, so the bias comes out scaled
        self.pos_q = pos_q.float() * scale if pos_q is not None and (terms.p2c or terms.p2p) else None
        self.pos_k = pos_k.float() * scale if pos_k is not None and (terms.c2p or terms.p2p) else None
        self.R = (self.pos_q if self.pos_q is not None else self.pos_k).shape[1] if terms.any else 0
        # per-head p2p values of every table row (H, R), scaled
        self.p2p = (pos_q.float() * pos_k.float()).sum(-1) * scale if terms.p2p else None
        # a padding mask that hides nothing is dropped (a cheap check on CPU; a sync elsewhere)
        self.key_mask = geom.key_mask
        if self.key_mask is not None and self.key_mask.device.type == "cpu" and bool(self.key_mask.all()):
            self.key_mask = None
        # distance == i - j (Geometry.distance_is_i_minus_j), with as many queries as keys
        toeplitz = geom.distance_is_i_minus_j() and self.Nq == self.Nk
        packed = (
            toeplitz
            and geom.cu_seqlens is not None
            and geom.q_positions is geom.k_positions
            and geom.q_segments is not None
            and geom.q_segments is geom.k_segments
        )
        self.toeplitz = toeplitz
        # `with_rows` computes them (the compiled CPU kernel does not need them)
        self.c2p_rows = self.p2c_rows = None
        self._index_cache: dict[tuple, Tensor] = {}
        self.packed = packed
        if packed:
            self.cu = [int(x) for x in geom.cu_seqlens.tolist()]
        self.sat = rel.saturation if rel is not None else 0
        self._batches: dict[tuple[int, int], _Context] = {}

    def with_rows(self) -> _Context:
        """Compute c2p (+ p2p) of every query and p2c of every key against every table row, scaled:
        (B|1, H, N, R). N·R, not N²: Algorithm 1 of the paper; blocks gather from them."""
        if self.terms.c2p:
            self.c2p_rows = self.q @ self.pos_k.transpose(-1, -2)
        if self.p2p is not None:
            pp = self.p2p[None, :, None, :]
            self.c2p_rows = pp if self.c2p_rows is None else self.c2p_rows + pp
        self.p2c_rows = self.k @ self.pos_q.transpose(-1, -2) if self.terms.p2c else None
        return self

    # ---- table rows -------------------------------------------------------------------------------------
    def rows(self, delta: Tensor) -> Tensor:
        """Table rows (int64) of distances, clamped into the projected window (hidden pairs may fall outside)."""
        return self.rel.index(delta).clamp_(0, self.R - 1)

    def row_terms(self, qb: Tensor) -> Tensor | None:
        """(B|1, H, bq|1, R) float32: the query-side term of every table row: c2p (+ p2p)."""
        t = qb @ self.pos_k.transpose(-1, -2) if self.terms.c2p else None
        if self.p2p is not None:
            pp = self.p2p[None, :, None, :]
            t = pp if t is None else t + pp
        return t

    def col_terms(self, kb: Tensor) -> Tensor | None:
        """(B, H, nk, R) float32: the key-side term of every table row: p2c."""
        return kb @ self.pos_q.transpose(-1, -2) if self.terms.p2c else None

    def far_field_ok(self, forced: bool | None) -> bool:
        g = self.geom
        long_enough = forced or self.Nq >= FAR_FIELD_MIN_RATIO * max(self.sat, MAX_BLOCK)
        return (
            self.q.device.type == "cpu"  # elsewhere `_flash` has no fused kernel returning the log-sum-exp
            and self.toeplitz
            and not self.packed
            and g.dense is None
            and g.q_segments is None
            and self.terms.any
            and self.Nq > self.sat + 1
            and bool(long_enough)
        )

    # ---- masks ------------------------------------------------------------------------------------------
    def key_range(self, i0: int, i1: int) -> tuple[int, int]:
        """Keys that queries [i0, i1) may see at all: their sequences (packed), up to i1 (causal)."""
        ks, ke = 0, self.Nk
        if self.packed:
            cu = self.cu
            s0 = bisect.bisect_right(cu, i0) - 1
            s1 = bisect.bisect_right(cu, i1 - 1) - 1
            if s0 < len(cu) - 1:  # rows past cu[-1] are row padding: they see no key
                ks = cu[s0]
                ke = cu[min(s1 + 1, len(cu) - 1)] if s1 < len(cu) - 1 else cu[-1]
            else:
                ks, ke = i0, i0
        if self.geom.causal and self.toeplitz:
            ke = min(ke, i1)
        return ks, max(ke, ks)

    def allowed(self, i0: int, i1: int, ks: int, ke: int) -> Tensor | None:
        """(B|1, 1|H, bq, nk) bool for queries [i0, i1) and keys [ks, ke), or None when all are visible."""
        g = self.geom
        allowed = None

        def both(m: Tensor) -> Tensor:
            return m if allowed is None else allowed & m

        if self.key_mask is not None:
            allowed = both(self.key_mask[:, None, None, ks:ke].bool())
        if g.q_segments is not None:
            allowed = both((g.q_segments[:, i0:i1, None] == g.k_segments[:, None, ks:ke])[:, None])
        if g.causal:
            qp, kp = self._positions()
            allowed = both((kp[:, None, ks:ke] <= qp[:, i0:i1, None])[:, None])
        if g.dense is not None:
            allowed = both(g.dense[:, :, i0:i1, ks:ke].bool())
        return allowed

    def key_windows(self) -> tuple[Tensor, Tensor]:
        """(N,) int32 start and end of the keys each query may see at all: its packed sequence (none for row
        padding), cut at the query itself when causal."""
        n = self.Nq
        i = torch.arange(n)
        start, end = torch.zeros(n, dtype=torch.long), torch.full((n,), self.Nk, dtype=torch.long)
        if self.packed:
            cu = torch.tensor(self.cu)
            seg = torch.bucketize(i, cu[1:], right=True).clamp_(max=len(self.cu) - 2)
            real = i < cu[-1]
            start = torch.where(real, cu[seg], i)
            end = torch.where(real, cu[seg + 1], i)
        if self.geom.causal:
            end = torch.minimum(end, i + 1)
        end = end.clamp_(max=self.Nk)  # offsets past the row (unvalidated cu_seqlens) see only its keys
        return start.clamp_(max=self.Nk).int(), torch.maximum(end, start).int()

    def _positions(self) -> tuple[Tensor, Tensor]:
        return self.geom.positions(self.Nq, self.Nk, self.q.device)

    # ---- the scaled relative bias of one block -------------------------------------------------------------
    def bias(self, i0: int, i1: int, ks: int, ke: int) -> Tensor | None:
        """(B|1, H, bq, nk) float32 (c2p + p2c + p2p) · scale for queries [i0, i1) and keys [ks, ke)."""
        if not self.terms.any or ke <= ks:
            return None
        qb = self.q[:, :, i0:i1]
        if self.toeplitz:
            return self._toeplitz_bias(qb, i0, i1, ks, ke)
        return self._gathered_bias(qb, i0, i1, ks, ke)

    def _gathered_bias(self, qb: Tensor, i0: int, i1: int, ks: int, ke: int) -> Tensor:
        """Explicit positions: gather with a (B|1, bq, nk) index (O(N·block), never B·H·N·N)."""
        qp, kp = self._positions()
        idx = self.rows(qp[:, i0:i1, None] - kp[:, None, ks:ke])  # (B|1, bq, nk)
        bq, nk = i1 - i0, ke - ks
        out = 0
        rt = self.row_terms(qb)
        if rt is not None:
            rt = rt.expand(self.B, self.H, bq, self.R)
            out = torch.gather(rt, -1, idx[:, None].expand(self.B, self.H, bq, nk))
        ct = self.col_terms(self.k[:, :, ks:ke])
        if ct is not None:
            it = idx.transpose(-1, -2)[:, None].expand(self.B, self.H, nk, bq)
            out = out + torch.gather(ct, -1, it).transpose(-1, -2)
        return out

    def _toeplitz_bias(self, qb: Tensor, i0: int, i1: int, ks: int, ke: int) -> Tensor:
        """distance = i - j: gathered terms on the block's band, the far field as row + column terms."""
        pieces = [
            self._band(i0, i1, j0, j1) if delta is None else self._far(i0, i1, j0, j1, delta)
            for j0, j1, delta in self._pieces(i0, i1, ks, ke)
        ]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)

    def far_row(self, delta: int) -> int:
        """The table row of the saturated distance ``delta`` (clamped into the projected window, as `rows`),
        looked up on the host (`RelativeIndex.row`): an index tensor made on the GPU was a copy from host memory
        in every call, a wait for the GPU, and an error inside a CUDA graph's capture."""
        return min(max(self.rel.row(delta), 0), self.R - 1)

    def _far(self, i0: int, i1: int, j0: int, j1: int, delta: int) -> Tensor:
        """Saturated pairs: row term + column term, (B, H, bq, nk)."""
        r = self.far_row(delta)
        row = slice(r, r + 1)  # keeps the dim: (..., 1)
        out = torch.zeros((), device=self.q.device)
        if self.c2p_rows is not None:
            c = self.c2p_rows if self.c2p_rows.shape[2] == 1 else self.c2p_rows[:, :, i0:i1]
            out = out + c[..., row]  # (B|1, H, bq|1, 1)
        if self.p2c_rows is not None:
            out = out + self.p2c_rows[:, :, j0:j1, row].transpose(-1, -2)  # (B, H, 1, nk)
        return out.expand(self.B, self.H, i1 - i0, j1 - j0)

    def far_terms(self, delta: int, side: str) -> Tensor | None:
        """(B, H, N, 1): the saturated term at distance ``delta`` of every query (side "q": c2p + p2p) or key
        (side "k": p2c)."""
        rows = self.c2p_rows if side == "q" else self.p2c_rows
        if rows is None:
            return None
        n = self.Nq if side == "q" else self.Nk
        row = self.far_row(delta)
        return rows[..., row : row + 1].expand(self.B, self.H, n, 1)

    def band_index(self, i0: int, i1: int, jb0: int, jb1: int) -> Tensor:
        """(bq, W) int64 table rows of queries [i0, i1) against keys [jb0, jb1); it depends only on i0 - jb0 and
        the block's shape, so interior blocks share one (cached per call)."""
        key = (i0 - jb0, i1 - i0, jb1 - jb0)
        idx = self._index_cache.get(key)
        if idx is None:
            dev = self.q.device
            delta = (
                (i0 - jb0) + torch.arange(i1 - i0, device=dev)[:, None] - torch.arange(jb1 - jb0, device=dev)
            )
            idx = self.rows(delta)
            self._index_cache = {key: idx}  # keep one: consecutive interior blocks share it
        return idx

    def _flat_index(self, idx: Tensor, offset: int) -> Tensor:
        key = (offset, *idx.shape, "flat")
        flat = self._index_cache.get(key)
        if flat is None:
            cols = torch.arange(idx.shape[1], device=idx.device) * self.R
            flat = self._index_cache[key] = idx + cols
        return flat

    def _band(self, i0: int, i1: int, jb0: int, jb1: int) -> Tensor:
        """Exact terms for queries [i0, i1) and keys [jb0, jb1): c2p gathered along the table axis of the query
        rows, p2c along the table axis of the key rows (then transposed)."""
        bq, W = i1 - i0, jb1 - jb0
        idx = self.band_index(i0, i1, jb0, jb1)
        out = None
        if self.c2p_rows is not None:
            c = (
                self.c2p_rows[:, :, i0:i1]
                if self.c2p_rows.shape[2] > 1
                else self.c2p_rows.expand(-1, -1, bq, -1)
            )
            out = torch.gather(c, -1, idx.expand(c.shape[0], self.H, bq, W))
        if self.p2c_rows is not None:
            rows = self.p2c_rows[:, :, jb0:jb1]  # (B, H, W, R)
            if torch.is_grad_enabled() and rows.requires_grad:
                # key-major gather, then transposed (its backward is a scatter into (W, R))
                p2c = torch.gather(rows, -1, idx.t().expand(self.B, self.H, W, bq)).transpose(-1, -2)
            else:
                # query-major in one gather: element (a, c) sits at c * R + idx[a, c] of the flattened rows
                # (twice as fast as the transposed add; its backward would materialise bq·W·R, hence no-grad only)
                flat = self._flat_index(idx, i0 - jb0)
                src = rows.reshape(self.B, self.H, 1, W * self.R).expand(self.B, self.H, bq, W * self.R)
                p2c = torch.gather(src, -1, flat.expand(self.B, self.H, bq, W))
            out = p2c if out is None else (out.add_(p2c) if out.shape[0] == self.B else out + p2c)
        return out.expand(self.B, self.H, bq, W)

    def keys(self, ks: int, ke: int) -> tuple[Tensor, Tensor]:
        return self.k[:, :, ks:ke], self.v[:, :, ks:ke]

    # ---- training: tiles, batch slices, the bias gradient ----------------------------------------------------
    def tiles(self, block_size: int | None, target: int) -> list[tuple[int, int, int, int, int, int]]:
        """(b0, b1, i0, i1, ks, ke) tiles of about ``target`` scores: several batch elements when their whole
        score matrices are that small, else one batch element and a block of query rows (``block_size`` rows
        when given)."""
        per_row = self.H * self.Nk
        if block_size is not None:
            bb, rows = 1, block_size
        elif per_row * self.Nq <= target:
            bb, rows = max(1, target // (per_row * self.Nq)), self.Nq
        else:
            bb, rows = 1, max(MIN_BLOCK, target // per_row)
        tiles = []
        for i0 in range(0, self.Nq, rows):
            i1 = min(i0 + rows, self.Nq)
            ks, ke = self.key_range(i0, i1)
            tiles += [(b0, min(b0 + bb, self.B), i0, i1, ks, ke) for b0 in range(0, self.B, bb)]
        return tiles

    def batch(self, b0: int, b1: int) -> _Context:
        """This context restricted to batch elements [b0, b1) (cached)."""
        if b0 == 0 and b1 == self.B:
            return self
        key = (b0, b1)
        if key not in self._batches:
            sub = copy.copy(self)

            def cut(t: Tensor | None) -> Tensor | None:
                return t if t is None or t.shape[0] == 1 else t[b0:b1]

            sub.q, sub.k, sub.v = self.q[b0:b1], self.k[b0:b1], self.v[b0:b1]
            sub.c2p_rows, sub.p2c_rows, sub.key_mask = map(cut, (self.c2p_rows, self.p2c_rows, self.key_mask))
            g = self.geom
            sub.geom = dataclasses.replace(
                g,
                key_mask=cut(g.key_mask),
                q_segments=cut(g.q_segments),
                k_segments=cut(g.k_segments),
                q_positions=cut(g.q_positions),
                k_positions=cut(g.k_positions),
                dense=cut(g.dense),
            )
            sub.B = b1 - b0
            sub._batches = {}  # its own (empty) cache: sharing this one would make a reference cycle
            self._batches[key] = sub
        return self._batches[key]

    def _pieces(self, i0: int, i1: int, ks: int, ke: int) -> list[tuple[int, int, int | None]]:
        """Key ranges of queries [i0, i1) as (j0, j1, saturated distance or None for the gathered band)."""
        sat = self.sat
        jb0 = min(max(ks, i0 - sat + 1), ke)  # keys before jb0 are at distance >= sat from every row
        jb1 = max(min(ke, i1 - 1 + sat), jb0)  # keys from jb1 on are at distance <= -sat from every row
        pieces = [(ks, jb0, sat), (jb0, jb1, None), (jb1, ke, -sat)]
        return [(j0, j1, d) for j0, j1, d in pieces if j1 > j0]

    def bias_backward(self, grad: Tensor, i0: int, i1: int, ks: int, ke: int, g_c2p, g_p2c) -> None:
        """Accumulate the gradient of one tile's bias (``grad``: (b, H, bq, ke - ks)) into the gradients of
        the row terms (c2p + p2p: (b, H, Nq, R), p2c: (b, H, Nk, R)): the transpose of `_toeplitz_bias`."""
        if g_c2p is None and g_p2c is None:
            return
        b = grad.shape[0]
        for j0, j1, delta in self._pieces(i0, i1, ks, ke):
            g = grad[..., j0 - ks : j1 - ks]
            if delta is not None:  # saturated: one table row per side
                row = self.far_row(delta)
                if g_c2p is not None:
                    g_c2p[:, :, i0:i1, row] += g.sum(-1)
                if g_p2c is not None:
                    g_p2c[:, :, j0:j1, row] += g.sum(-2)
                continue
            idx = self.band_index(i0, i1, j0, j1)  # (bq, W)
            bq, W = idx.shape
            if g_c2p is not None:
                g_c2p[:, :, i0:i1].scatter_add_(-1, idx.expand(b, self.H, bq, W), g)
            if g_p2c is not None:
                g_p2c[:, :, j0:j1].scatter_add_(-1, idx.t().expand(b, self.H, W, bq), g.transpose(-1, -2))


def _reverse(x: Tensor, dim: int = 2) -> Tensor:
    """x in reversed order along ``dim`` (index_select is much faster than flip on CPU)."""
    n = x.shape[dim]
    return x.index_select(dim, torch.arange(n - 1, -1, -1, device=x.device))


def _block(ctx: _Context, i0: int, i1: int, dropout_p: float) -> Tensor:
    """Output rows [i0, i1): (B, H, bq, D) float32."""
    ks, ke = ctx.key_range(i0, i1)
    qb = ctx.q[:, :, i0:i1]
    if ke <= ks:  # no key at all (row padding of a packed batch)
        return qb.new_zeros(ctx.B, ctx.H, i1 - i0, ctx.v.shape[-1]) + 0 * qb.sum()
    mask = ctx.bias(i0, i1, ks, ke)
    allowed = ctx.allowed(i0, i1, ks, ke)
    kb, vb = ctx.keys(ks, ke)
    if dropout_p > 0.0 or ctx.needs_grad:
        return _BlockAttention.apply(qb, kb, vb, mask, allowed, ctx.scale, dropout_p)
    if allowed is not None:
        full = (ctx.B, ctx.H, i1 - i0, ke - ks)
        mask = torch.zeros((), device=qb.device) if mask is None else mask
        mask = mask.masked_fill(~allowed, _MIN).expand(full)
    elif mask is not None:
        mask = mask.expand(ctx.B, ctx.H, i1 - i0, ke - ks)
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, scale=ctx.scale)
    if allowed is not None:
        out = out * allowed.any(-1, keepdim=True)  # rows with no visible key -> zeros
    return out


def _tile_probs(q, k, bias, allowed, scale: float, p: float, generator=None):
    """Probabilities of one tile, (B, H, bq, nk) float32, with their dropout keep mask (None without dropout)
    and the scale of kept values. Scores are ``bias + scale · q·kᵀ`` in one matmul (the bias is its
    accumulator); hidden pairs get the float32 minimum; rows with no visible key get zeros."""
    B, H, bq, D = q.shape
    nk = k.shape[2]
    q3, k3 = q.reshape(B * H, bq, D), k.reshape(B * H, nk, D)
    if bias is not None:
        acc = bias.expand(B, H, bq, nk).reshape(B * H, bq, nk)
        scores = torch.baddbmm(acc, q3, k3.transpose(1, 2), alpha=scale).view(B, H, bq, nk)
    else:
        scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(scale).view(B, H, bq, nk)
    if allowed is not None:
        scores.masked_fill_(~allowed, _MIN)
    probs = torch.softmax(scores, dim=-1)
    del scores
    if allowed is not None:
        probs.mul_(allowed.any(-1, keepdim=True))
    if p == 0.0:
        return probs, None, 1.0
    keep, drop_scale = keep_mask(probs.shape, p, probs.device, generator)
    return probs, keep, drop_scale


def _tile_output(probs: Tensor, keep: Tensor | None, drop_scale: float, v: Tensor) -> Tensor:
    if keep is None:
        return probs @ v
    return (probs.masked_fill(~keep, 0) @ v).mul_(drop_scale)  # scale the (bq, D) output, not (bq, nk)


def _tile_grads(grad_out, q, k, v, probs, keep, drop_scale: float, scale: float):
    """(grad q, grad k, grad v, grad scores) of one tile, from the output gradient (float32)."""
    if keep is not None:
        grad_out = grad_out * drop_scale
        kept = probs.masked_fill(~keep, 0)
    else:
        kept = probs
    grad_v = kept.transpose(-1, -2) @ grad_out
    del kept
    grad_probs = grad_out @ v.transpose(-1, -2)
    if keep is not None:
        grad_probs.masked_fill_(~keep, 0)
    grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)
    del grad_probs
    grad_q = (grad_scores @ k).mul_(scale)
    grad_k = (grad_scores.transpose(-1, -2) @ q).mul_(scale)
    return grad_q, grad_k, grad_v, grad_scores


class _BlockAttention(torch.autograd.Function):
    """softmax(q·kᵀ·scale + bias) (hidden pairs masked, dropout) · v for one block with a bias that autograd
    differentiates (explicit positions).

    PyTorch's fused CPU attention has no dropout and no gradient for an additive mask, so training would run
    its math path: an unfused softmax and a `bernoulli_` dropout mask that alone costs more than the two
    matmuls. Here the bias is the matmul's accumulator, the mask comes from 16-bit draws
    (`debertakit.attention.dropout`), the dropout scale is applied to the (bq, D) output instead of the
    (bq, nk) probabilities, and the backward is written out. Saved: q, k, v, probabilities, 1-byte keep mask.
    """

    @staticmethod
    def forward(fctx, q, k, v, bias, allowed, scale: float, p: float):
        probs, keep, drop_scale = _tile_probs(q, k, bias, allowed, scale, p)
        fctx.save_for_backward(q, k, v, probs, keep)
        fctx.scale, fctx.drop_scale = scale, drop_scale
        fctx.bias_shape = None if bias is None else bias.shape
        return _tile_output(probs, keep, drop_scale, v)

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out):
        q, k, v, probs, keep = fctx.saved_tensors
        gq, gk, gv, gs = _tile_grads(grad_out.float(), q, k, v, probs, keep, fctx.drop_scale, fctx.scale)
        grad_bias = None
        if fctx.bias_shape is not None and fctx.needs_input_grad[3]:
            grad_bias = gs.sum_to_size(fctx.bias_shape)
        return gq, gk, gv, grad_bias, None, None, None


# ---- training with distance i - j: one function over all tiles, written-out backward -----------------------


class _ToeplitzAttention(torch.autograd.Function):
    """Training path when the distance is i - j (plain, padded, packed, causal rows): the whole attention over
    tiles of (one batch element, a block of query rows), so that each tile's scores, probabilities and mask
    stay in the CPU's caches. The bias gradient goes straight from each tile into the (N, R) row terms
    (`_Context.bias_backward`): no per-tile zero-filled copies as autograd through slices would make.

    Probabilities are kept for short inputs (``STORE_KEYS``, ``STORE_ELEMENTS``), else recomputed tile by tile in the
    backward pass (memory O(N·block)); dropout masks come from a per-call seed, so recomputed tiles draw the
    same masks.
    """

    @staticmethod
    def forward(fctx, ctx: _Context, tiles: list, p: float, q, k, v, c2p_rows, p2c_rows):
        store = ctx.Nk <= STORE_KEYS and ctx.B * ctx.H * ctx.Nq * ctx.Nk <= STORE_ELEMENTS
        seed = _call_seed() if p > 0.0 else 0
        out = q.new_zeros(ctx.B, ctx.H, ctx.Nq, v.shape[-1])
        saved = []
        for t, tile in enumerate(tiles):
            probs, keep, drop_scale = _toeplitz_tile(ctx, tile, p, seed + t)
            b0, b1, i0, i1, ks, ke = tile
            if probs is not None:
                out[b0:b1, :, i0:i1] = _tile_output(probs, keep, drop_scale, v[b0:b1, :, ks:ke])
            saved.append((probs, keep, drop_scale) if store else None)
        fctx.ctx, fctx.p, fctx.seed, fctx.tiles, fctx.saved = ctx, p, seed, tiles, saved
        fctx.rows_shapes = _rows_shapes(c2p_rows, p2c_rows)
        return out

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out):
        ctx: _Context = fctx.ctx
        grad_out = grad_out.float()
        gq, gk, gv = torch.zeros_like(ctx.q), torch.zeros_like(ctx.k), torch.zeros_like(ctx.v)
        c_shape, p_shape = fctx.rows_shapes
        want_c = c_shape is not None and fctx.needs_input_grad[6]
        want_p = p_shape is not None and fctx.needs_input_grad[7]
        g_c2p = ctx.q.new_zeros(ctx.B, ctx.H, ctx.Nq, ctx.R) if want_c else None
        g_p2c = ctx.q.new_zeros(ctx.B, ctx.H, ctx.Nk, ctx.R) if want_p else None
        for t, tile in enumerate(fctx.tiles):
            saved = fctx.saved[t]
            probs, keep, drop_scale = (
                saved if saved is not None else _toeplitz_tile(ctx, tile, fctx.p, fctx.seed + t)
            )
            if probs is None:
                continue
            fctx.saved[t] = None  # free as we go
            b0, b1, i0, i1, ks, ke = tile
            sub = ctx.batch(b0, b1)
            qb, (kb, vb) = sub.q[:, :, i0:i1], sub.keys(ks, ke)
            dq, dk, dv, ds = _tile_grads(
                grad_out[b0:b1, :, i0:i1], qb, kb, vb, probs, keep, drop_scale, ctx.scale
            )
            gq[b0:b1, :, i0:i1] += dq
            gk[b0:b1, :, ks:ke] += dk
            gv[b0:b1, :, ks:ke] += dv
            del probs, keep, dq, dk, dv
            sub.bias_backward(
                ds,
                i0,
                i1,
                ks,
                ke,
                None if g_c2p is None else g_c2p[b0:b1],
                None if g_p2c is None else g_p2c[b0:b1],
            )
        g_c2p = None if g_c2p is None else g_c2p.sum_to_size(c_shape)
        g_p2c = None if g_p2c is None else g_p2c.sum_to_size(p_shape)
        return None, None, None, gq, gk, gv, g_c2p, g_p2c


def _call_seed() -> int:
    """One draw from the default generator per call; tile t then draws its dropout mask from seed + t, so a
    recomputed tile (or the other path) redraws the same mask."""
    return int(torch.randint(0, 2**62, (), device="cpu"))


def _tile_generator(ctx: _Context, seed: int) -> torch.Generator:
    generator = torch.Generator(device=ctx.q.device)
    generator.manual_seed(seed)
    return generator


def _rows_shapes(c2p_rows: Tensor | None, p2c_rows: Tensor | None) -> tuple:
    """Shapes of the row terms (None where absent): their gradients are summed back to them."""
    return tuple(None if t is None else t.shape for t in (c2p_rows, p2c_rows))


def _train_toeplitz(ctx: _Context, p: float, block_size: int | None) -> Tensor:
    inputs = (ctx.q, ctx.k, ctx.v, ctx.c2p_rows, ctx.p2c_rows)
    ctx.q, ctx.k, ctx.v = (t.detach() for t in inputs[:3])
    ctx.c2p_rows, ctx.p2c_rows = (None if t is None else t.detach() for t in inputs[3:])
    return _ToeplitzAttention.apply(
        ctx, ctx.tiles(block_size, _train_tile_elements(ctx.q.device)), p, *inputs
    )


def _train_tile_elements(device: torch.device) -> int:
    """Scores per training tile: `TRAIN_TILE_ELEMENTS` on the CPU, `TRAIN_TILE_ELEMENTS_OFF_CPU` elsewhere."""
    return TRAIN_TILE_ELEMENTS if device.type == "cpu" else TRAIN_TILE_ELEMENTS_OFF_CPU


def _toeplitz_tile(ctx: _Context, tile, p: float, seed: int):
    b0, b1, i0, i1, ks, ke = tile
    if ke <= ks:  # no key at all (row padding of a packed batch): output zeros
        return None, None, 1.0
    sub = ctx.batch(b0, b1)
    generator = None
    if p > 0.0:
        generator = _tile_generator(ctx, seed)
    kb, _ = sub.keys(ks, ke)
    return _tile_probs(
        sub.q[:, :, i0:i1], kb, sub.bias(i0, i1, ks, ke), sub.allowed(i0, i1, ks, ke), ctx.scale, p, generator
    )


# ---- inference on long inputs: the far field through the fused kernel ------------------------------------


def _fused_reason(ctx: _Context, training: bool) -> str | None:
    """Why the compiled CPU kernel cannot run this call (None when it can)."""
    g = ctx.geom
    if ctx.q.device.type != "cpu":
        return f"it runs on the CPU, not {ctx.q.device.type}"
    if not ctx.toeplitz:
        return "it needs distance i - j (no explicit positions or query subsets)"
    if g.dense is not None:
        return "it takes no dense attention mask"
    if g.q_segments is not None and not ctx.packed:
        return "it takes segments only as a packed batch (cu_seqlens)"
    if not all(_plain(t) for t in (ctx.q, ctx.k, ctx.v, ctx.pos_q, ctx.pos_k)):
        return "it takes plain tensors (no torch.func transforms, forward-mode tangents or tensor subclasses)"
    if training and not _store_probs(ctx):
        return (
            f"in training it keeps the probabilities: at most {STORE_KEYS} keys and {STORE_ELEMENTS} scores "
            f"(got {ctx.Nk} keys, {ctx.B * ctx.H * ctx.Nq * ctx.Nk} scores)"
        )
    if not cpu_kernel.enabled():
        return "it is disabled by DEBERTAKIT_CPU_KERNEL"
    if cpu_kernel.load() is None:
        return f"it could not be built: {cpu_kernel.error()}"
    return None


def _plain(t: Tensor | None) -> bool:
    return t is None or (
        type(t) is torch.Tensor
        and not torch._C._functorch.is_functorch_wrapped_tensor(t)
        and forward_ad.unpack_dual(t).tangent is None
    )


def _observed() -> bool:
    """A graph being captured (torch.compile, tracing) or a dispatch mode watching the operations (FLOP
    counting, say): they would not see inside the compiled kernel."""
    return (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or torch.utils._python_dispatch._get_current_dispatch_mode() is not None
    )


def _use_fused(ctx: _Context, fused: bool | None, training: bool = False) -> bool:
    if fused is False:
        return False
    if fused is None and (ctx.q.device.type != "cpu" or _observed()):
        return False  # no build attempt off the CPU; observed calls keep to PyTorch operations
    reason = _fused_reason(ctx, training)
    if reason is not None and fused:
        raise ValueError(f"fused=True, but the compiled CPU kernel cannot run this call: {reason}")
    return reason is None


def _layout(ctx: _Context, need_index: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's view of the geometry: table row of every distance -(N-1)..N-1 (int32, empty when no
    position term), and each query's key window."""
    N = ctx.Nq
    index = (
        ctx.rows(torch.arange(-(N - 1), N)).int() if need_index and N > 0 else torch.empty(0, dtype=torch.int)
    )
    return (index, *ctx.key_windows())


def _key_mask(ctx: _Context) -> Tensor:
    none = torch.empty(0, dtype=torch.bool)
    return none if ctx.key_mask is None else ctx.key_mask.bool().expand(ctx.B, ctx.Nk).contiguous()


def _fused(ctx: _Context) -> Tensor:
    """The whole inference call in the compiled CPU kernel (`debertakit.attention.cpu_kernel`)."""
    t = ctx.terms
    none = ctx.q.new_empty(0)
    index, start, end = _layout(ctx, t.any)
    return cpu_kernel.load().forward(
        ctx.q,
        ctx.k,
        ctx.v,
        ctx.pos_k.contiguous() if t.c2p else none,
        ctx.pos_q.contiguous() if t.p2c else none,
        ctx.p2p.contiguous() if t.p2p else none,
        index,
        _key_mask(ctx),
        start,
        end,
        max(ctx.sat, 1),
        ctx.scale,
    )


def _store_probs(ctx: _Context) -> bool:
    return ctx.Nk <= STORE_KEYS and ctx.B * ctx.H * ctx.Nq * ctx.Nk <= STORE_ELEMENTS


class _CompiledToeplitz(torch.autograd.Function):
    """Training with distance i - j in the compiled CPU kernel: one pass per (batch, head) for the forward
    (probabilities kept, as `_ToeplitzAttention` keeps them for short inputs) and one for the backward, which
    scatters the bias gradient straight into the (N, R) row terms. The dropout mask is drawn here, whole."""

    @staticmethod
    def forward(fctx, ctx: _Context, p: float, q, k, v, c2p_rows, p2c_rows):
        B, H, N = ctx.B, ctx.H, ctx.Nq
        keep, drop_scale = _tile_masks(ctx, p) if p > 0.0 else (q.new_empty(0).bool(), 1.0)
        layout = _layout(ctx, c2p_rows is not None or p2c_rows is not None)

        def full(rows: Tensor | None) -> Tensor:  # (B|1, H, N|1, R) -> (B, H, N, R) contiguous
            return q.new_empty(0) if rows is None else rows.expand(B, H, N, ctx.R).contiguous()

        out, probs = cpu_kernel.load().train_forward(
            q, k, v, full(c2p_rows), full(p2c_rows), layout[0], _key_mask(ctx), *layout[1:], max(ctx.sat, 1),
            ctx.scale, keep, drop_scale,
        )  # fmt: skip
        fctx.save_for_backward(q, k, v, probs, keep)
        # scalars only: holding the context would keep the N×R row terms alive until the backward pass
        fctx.layout, fctx.drop_scale, fctx.meta = layout, drop_scale, (max(ctx.sat, 1), ctx.scale, ctx.R)
        fctx.shapes = _rows_shapes(c2p_rows, p2c_rows)
        return out

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_out):
        q, k, v, probs, keep = fctx.saved_tensors
        sat, scale, R = fctx.meta
        c_shape, p_shape = fctx.shapes
        want_c = c_shape is not None and fctx.needs_input_grad[5]
        want_p = p_shape is not None and fctx.needs_input_grad[6]
        index, start, end = fctx.layout
        gq, gk, gv, gc, gp = cpu_kernel.load().train_backward(
            grad_out.float().contiguous(), q, k, v, probs, keep, fctx.drop_scale, index, start, end, sat,
            scale, R, want_c, want_p,
        )  # fmt: skip
        gc = gc.sum_to_size(c_shape) if want_c else None
        gp = gp.sum_to_size(p_shape) if want_p else None
        return None, None, gq, gk, gv, gc, gp


def _tile_masks(ctx: _Context, p: float) -> tuple[Tensor, float]:
    """The (B, H, N, N) dropout keep mask, drawn tile by tile exactly as `_ToeplitzAttention` draws it, so the
    compiled and the pure PyTorch paths (taken under torch.compile) drop the same probabilities."""
    seed = _call_seed()
    keep = torch.zeros(ctx.B, ctx.H, ctx.Nq, ctx.Nk, dtype=torch.bool)
    scale = 1.0
    for t, (b0, b1, i0, i1, ks, ke) in enumerate(ctx.tiles(None, _train_tile_elements(ctx.q.device))):
        if ke > ks:
            shape = (b1 - b0, ctx.H, i1 - i0, ke - ks)
            tile, scale = keep_mask(shape, p, ctx.q.device, _tile_generator(ctx, seed + t))
            keep[b0:b1, :, i0:i1, ks:ke] = tile
    return keep, scale


def _train_fused(ctx: _Context, p: float) -> Tensor:
    inputs = (ctx.q, ctx.k, ctx.v, ctx.c2p_rows, ctx.p2c_rows)
    return _CompiledToeplitz.apply(ctx, p, *inputs)


def _flash(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool = False, mask: Tensor | None = None):
    """(out, logsumexp) of softmax(q·kᵀ·scale + mask) v, fused (flash) on CPU, math elsewhere."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=causal, attn_mask=mask, scale=scale
        )
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def _far_field(ctx: _Context, block_size: int | None) -> Tensor:
    """No grad, no dropout, distance i - j, N ≫ saturation: band pairs per block, far pairs by two fused calls."""
    B, H, N, D = ctx.q.shape
    sat, scale = ctx.sat, ctx.scale
    q, k, v = ctx.q, ctx.k, ctx.v
    out = q.new_empty(B, H, N, D)
    lse = q.new_empty(B, H, N)

    # the band |i - j| < sat, block by block, with the exact bias
    bq = block_size or FAR_BLOCK
    hidden_cache: dict[tuple[int, int, int], Tensor] = {}
    for i0 in range(0, N, bq):
        i1 = min(i0 + bq, N)
        jb0, jb1 = max(0, i0 - sat + 1), min(N, i1 - 1 + sat)
        if ctx.geom.causal:
            jb1 = min(jb1, i1)
        bias = ctx._band(i0, i1, jb0, jb1)
        key = (i0 - jb0, i1 - i0, jb1 - jb0)
        hidden = hidden_cache.get(key)
        if hidden is None:  # pairs that belong to the far field (and, causal, the future); shared by blocks
            d = (
                (i0 - jb0)
                + torch.arange(i1 - i0, device=q.device)[:, None]
                - torch.arange(jb1 - jb0, device=q.device)
            )
            hidden = d.abs() >= sat
            if ctx.geom.causal:
                hidden = hidden | (d < 0)
            hidden_cache.clear()  # keep one: consecutive interior blocks share it
            hidden = hidden_cache[key] = hidden[None, None]
        if ctx.key_mask is not None:
            hidden = hidden | ~ctx.key_mask[:, None, None, jb0:jb1].bool()
        if bias.is_contiguous():
            bias = bias.masked_fill_(hidden, _MIN)
        else:
            bias = bias.masked_fill(hidden, _MIN).expand(B, H, i1 - i0, jb1 - jb0)
        o, ls = _flash(q[:, :, i0:i1], k[:, :, jb0:jb1], v[:, :, jb0:jb1], scale, mask=bias)
        out[:, :, i0:i1] = o
        lse[:, :, i0:i1] = ls
        del bias, o, ls

    # far pairs: [q, row term, 1]·[k, 1, column term] = q·k + c2p (+ p2p) + p2c; the kernel scales the whole
    # product, so the extra columns are divided by the scale. Padding is a column term too.
    key_bias = None
    if ctx.key_mask is not None:
        key_bias = (~ctx.key_mask.bool())[:, None, :].to(q.dtype) * -1e30  # (B, 1, N)
    qa = q.new_ones(B, H, N, D + 2)
    ka = k.new_ones(B, H, N, D + 2)
    va = v.new_zeros(B, H, N, D + 2)
    qa[..., :D] = q
    ka[..., :D] = k
    va[..., :D] = v

    def set_side(delta: int) -> None:
        r, c = ctx.far_terms(delta, "q"), ctx.far_terms(delta, "k")
        qa[..., D] = 0.0 if r is None else r[..., 0] / scale
        ka[..., D + 1] = 0.0 if c is None else c[..., 0] / scale
        if key_bias is not None:
            ka[..., D + 1] += key_bias

    # left far field (i - j >= sat): rows sat.., keys ..N-sat, causal
    set_side(sat)
    o, ls = _flash(qa[:, :, sat:], ka[:, :, : N - sat], va[:, :, : N - sat], scale, causal=True)
    _merge(out[:, :, sat:], lse[:, :, sat:], o[..., :D], ls)
    del o, ls
    if not ctx.geom.causal:  # right far field (j - i >= sat): the same on reversed sequences
        set_side(-sat)
        rq, rk, rv = (_reverse(t) for t in (qa[:, :, : N - sat], ka[:, :, sat:], va[:, :, sat:]))
        del qa, ka, va
        o, ls = _flash(rq, rk, rv, scale, causal=True)
        del rq, rk, rv
        _merge(out[:, :, : N - sat], lse[:, :, : N - sat], _reverse(o[..., :D]), _reverse(ls, -1))
    if ctx.key_mask is not None:
        out *= ctx.key_mask.bool().any(-1)[:, None, None, None]
    return out


def _merge(out: Tensor, lse: Tensor, o: Tensor, lse_o: Tensor) -> None:
    """In place: (out, lse) <- the softmax over both key sets, from each one's output and log-sum-exp."""
    m = torch.maximum(lse, lse_o)
    w_a, w_b = torch.exp(lse - m), torch.exp(lse_o - m)
    total = w_a + w_b
    out.mul_((w_a / total)[..., None]).add_(o * (w_b / total)[..., None])
    lse.copy_(m + torch.log(total))


def _unsupported(request: Request) -> str | None:
    if request.needs_probs:
        return "it does not materialise attention probabilities (output_attentions); use 'eager'"
    return None


def _priority(request: Request) -> float:
    """Faster than `eager` on the CPU (benchmarks/attention_cpu.py); below fused kernels on GPUs, and below
    `eager` there in training: with tiles sized for a CPU's caches a GPU ran its training path as thousands of
    small launches per layer (one H100, deberta-v3-base shape, 32 × 512 tokens: a training step took 2154 ms
    against `eager`'s 188, the forward 74.6 against 79.2 ms; benchmarks/results/attention_gpu.json, section
    ``model``). Its tiles off the CPU are larger now (`TRAIN_TILE_ELEMENTS_OFF_CPU`), not yet timed on a GPU."""
    if request.grad and request.device_type != "cpu":
        return -0.5
    return 10.0


register(Backend("chunked", chunked_attention, unsupported=_unsupported, priority=_priority))
