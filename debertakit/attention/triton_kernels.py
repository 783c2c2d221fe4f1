"""Triton kernels of the `triton` backend: fused disentangled attention, forward and backward.

Notation (one batch row ``b``, one head ``h``; see `eager_attention` for the spec):

    s(i, j) = (q_i·k_j + ROW[i, idx(i, j)] + COL[j, idx(i, j)]) · scale

``ROW = Q Krᵀ + p2p bias`` (H, B, Nq, R) and ``COL = K Qrᵀ`` (H, B, Nk, R) are the N×R products of the paper's
Algorithm 1, computed once per call by the caller (matmuls linear in N, on the tensor cores with float32 results).
The kernels scale the values they read (one row / column value per far tile, an FMA per gathered element), so
the tables need no pass of their own to scale them, and they work in base 2: the scale they apply is ``scale ·
log2(e)``, the softmax takes ``exp2`` and LSE holds base-2 log-sum-exps. The probabilities are the same; on
NVIDIA GPUs ``exp(x)`` is ``ex2(x · log2(e))``, so this saves a multiply per score in each kernel (the score
gradients, and so every gradient, stay the natural ones). ``idx(i, j) =
LUT[clamp(pos_q[i] - pos_k[j], -SAT, SAT) + SAT]`` is read from the same lookup table as every other backend
(never recomputed from the log-bucket formula, whose float rounding would not be exact).

Saturation (REFERENCE.md §2): for ``|pos_q[i] - pos_k[j]| >= SAT`` the index is ``LUT[0]`` (left) or ``LUT[2·SAT]``
(right) whatever the pair. A tile whose distances are all on one saturated side therefore needs one ROW value per
query row (loaded once per program) and one value per key column: no gather, the cost of plain attention. The
column values come from FAR (H, B, 2, Nk padded to FAR_PAD), built by the caller: COL's two saturated values of
each key as two contiguous rows (left, right; 0 without p2c), -inf where the key is masked and in the padding
(see `_far_col`).
Only tiles that straddle the band ``|i - j| < SAT`` gather ROW/COL entries element by element. At distance
``i - j`` (``IJ``) a program's far tiles are a prefix and a suffix of its loop (`_split`), so the loop runs in
three parts, each compiled for one kind of tile (`_fwd_keys`, `_dq_keys`, `_dkv_queries` with ``KIND``): the far
parts carry no gather code, and every part's loads (the far tiles' column values, the near tiles' gathers) sit
at the top of its loop, where Triton's software pipeliner prefetches them for the next tile. With one loop and a
branch per tile, the loads inside the branches were issued when the tile was reached and their latency paid
there (the TTGIR shows them as plain loads inside ``scf.if``, the K / V loads as asynchronous copies). Where no
visible pair of the call lies SAT or more apart (``FAR_TILES`` false, `triton_backend._far_tiles`: inputs no
longer than the saturation, v3 at N <= 512, and packed rows of such sequences) the loop is one near run
(``_NEAR_ONLY``): one loop in the binary instead of three, and a backward that sums no saturated pair, every
such pair being hidden (the static report, configured tiles: the dQ and dK/dV near loops 0-29% fewer
instructions a thread, most at head dim 64 without dropout).

``SKEW`` (constexpr, every kernel, at distance ``i - j``): the near band's position terms come from the position
tables themselves instead of ROW / COL, so no N×R table is written or read. A near tile's distances ``i - j`` are the
``BLOCK_M + BLOCK_N - 1`` consecutive values from ``start_m - start_n - BLOCK_N + 1``: their table rows
``Kr[idx]`` / ``Qr[idx]`` (a (WT, d) block, WT = 2·max(BLOCK_M, BLOCK_N)) give ``Q·Krᵀ`` (BLOCK_M, WT) and
``Qr·Kᵀ`` (WT, BLOCK_N) on the tensor cores, and pair (i, j) reads column / row ``(i - start_m) - (j - start_n)
+ BLOCK_N - 1`` of them (``tl.gather``: a skewed read of a tile in registers). ROW / COL then hold only the two
saturated values per query row / key column, (N, 2), for the far tiles. The backward kernels recompute the
scores the same way; their distance-space gradients (below) do not depend on how the scores were formed.

``DIST`` (constexpr, every kernel, at distance ``i - j``): ROW / COL are *distance tables*, the near band's terms
stored by distance instead of by table row: ``ROW[i, R/2 + (j - i)] = q_i·Kr[idx(i, j)] · scale · log2(e)`` and
``COL[j, R/2 + (i - j)] = k_j·Qr[idx(i, j)] · scale · log2(e)`` (rows of R + 1 cells, R / 2 at least the largest
distance in a near tile, in the inputs' dtype, scaled by the caller's matmul). Pair (i, j) then sits at ``i·R + j``
from row 0's cell of distance 0 (and ``j·R + i`` in COL): a near tile's terms are two strided tile loads, where
the gather reads a LUT entry and two table cells per pair at addresses computed per element. The far tiles read
the same tables' ends (`_ends`, and FAR built from COL's). Where no tile is far and the rows of an input shorter
than R / 2 would hold cells no pair reads, the caller lays the tables out in bands of 2**LOG2_BAND rows
(H, bands, B, band, R + 1), each band's rows holding only the distances they reach; a tile's rows lie in one
band, and moving the table's pointer to that band (`_band_shift`) keeps pair (i, j) at ``i·R + j`` from it. With
one band (LOG2_BAND = 30) the pointer never moves.

``FAR_N`` (constexpr, the forward's and dQ's): the far runs' key blocks, BLOCK_N or a multiple of it. A far tile
is plain attention plus a row and a column vector, so its registers do not bound its width as the near band's
loads bound the near tiles'; wider far blocks spread each step's fixed work (the accumulator's rescale, the row
reductions, the loop's own) over more keys (`_wide_and_narrow`, `_fwd_keys`, `_dq_keys`;
`triton_backend.FORWARD_FAR_KEYS`, `DQ_FAR_KEYS`).

Layout: Q, K, V (B, H, N, d) are read, and OUT, DO, DQ, DK, DV read or written, through strides, so the (B, N, H, d)
layout the projections produce (viewed as (B, H, N, d)) needs no copy on the way in, and the output lands in the
layout `merge_heads` wants. Query-side tensors (Q, OUT, DO, DQ) share one set of strides ``SQB, SQH, SQN``,
key-side ones (K, V, DK, DV) another, ``SKB, SKH, SKN``; d is contiguous. The tables ROW / COL and the distance
buffers DQ_DIST / DK_DIST are laid out per head, (H, B, N, ·): the caller's matmuls that build and fold them then
run per head over all B·N rows at once, reading Q and K in the projections' layout as (H, B·N, d) views (no copy)
and summing the table gradients over the batch inside the matmul. Offsets to a program's (b, h) are 64-bit,
offsets inside it 32-bit (the caller checks N · row stride < 2**31).

Where the distance tables come in bands and that makes the rows narrower (at v3's N = 512: 577 cells against
1040), the two gradient buffers take the tables' own layout instead, (H, bands, B, band, ·), row r of a band
holding partner j at cell band + j - r (`_grad_rows`): the kernels store, and the caller's folds read, 44% fewer
cells, the zeros included. Those rows are N' + band + 1 cells, 1 modulo 16, and by default (``GRAD_BANDS``,
`triton_backend.GRADIENT_STORES`) that is their stride too: row i's cell for partner j then lies at
``i·(DW - 1) + OFF + j``, 16-byte aligned at a tile's first partner, and with no pair saturated the stores take
the row mask alone, 16 bytes at a time (`_table_grad`); the caller reads the odd-stride rows by residue classes
modulo 8, each an aligned view (`triton_backend._residue_rows`). With one band (inputs longer than the
saturation, where far tiles occur) the buffers take the tables' rows the same way: 2·(R / 2) + 1 cells, 1 modulo
32, around cell R / 2, which lies beyond every pair of a near tile (`triton_backend._gradient_stride`). A near
tile then stores each pair in its own cell, the saturated ones too (the caller folds those cells as the
table's end rows), 16 bytes at a time under the row mask alone, and sums nothing; the far tiles' sums keep the
rows' end cells, and the cells of partners in far tiles are zeroed before the loop (`_stored_partners`).

``IJ`` (constexpr): every visible pair is at distance ``i - j`` (default positions, padded or packed rows; see
`Geometry.distance_is_i_minus_j`). The kernels then load no positions and classify far tiles from the block
indices alone; otherwise positions are loaded per block and the classification uses their min / max.

Backward, without atomics and without N×N memory. Each pair's score gradient dS(i, j) must reach ROW[i, idx] and
COL[j, idx]. Within one query row the visible keys have distinct positions (one sequence), so in *distance*
space ``(i, pos_q[i] - pos_k[j])`` every visible near pair has its own cell: the dQ kernel (one program per query
block, owning those rows) *stores* dS into ``DQ_DIST[i, SAT - delta]`` and sums the saturated pairs of each side
into the two end cells; the dK/dV kernel (one program per key block) does the same for ``DK_DIST[j, delta + SAT]``.
Each buffer's cells thus run the way its partner index runs (cell SAT + j - i of a query row, SAT + i - j of a key
column): a tile row's cells are consecutive, and ascend along the tile, so that a warp's store covers a run of
them (`_table_grad`); the caller reads the query rows' buffer through the mirrored lookup table.
No cell is written twice, so plain stores suffice. At distance i - j the kernels also write the zeros of the
cells no visible pair lands in (hidden pairs of the tiles they visit and, before their loops, the cells whose
partner lies outside the blocks the loops visit: `_zero_unvisited`), so the caller allocates the buffers
without a fill, which would write them whole once more. The buffers hold the inputs' dtype (one rounding of
each dS, as `eager` rounds its score gradients to that dtype; the two end cells are summed in float32 first).
The caller finishes the chain rule with matmuls in distance space (see `triton_backend`). A buffer row holds
its 2·SAT + 1 cells at the row stride ``DW``, which the caller pads to an aligned width and whose padding
columns the kernels zero (`_store_row_ends`): the caller's matmuls then read rows at an aligned stride.
Both kernels need each query row's ``DELTA = rowsum(P ∘ dP) = dO·O``: the dQ kernel, launched first, computes
it from the rows of dO and O it owns and stores it for the dK/dV kernel (no pass of its own over dO and O).

Dropout on the probabilities (``DROPOUT``): element (i, j) of head ``bh`` is dropped when its 16-bit random
number is below ``DROP_T = round(p · 2**16)`` (the rule of `debertakit.attention.dropout`), kept ones scaled by
``drop_scale = 1 / (1 - DROP_T / 2**16)``. The numbers come from Philox with the counter (j // 8, i, bh, 0): one
call gives the eight 16-bit numbers of columns 8·(j // 8) … +7, so a mask is a function of (seed, bh, i, j)
alone, whatever tiles a kernel uses — the backward kernels redraw exactly the forward's mask, and nothing N×N
is stored. The softmax normaliser counts every pair (dropout comes after the softmax); with O = (P ∘ Z)·V the
backward's rowsum(P ∘ dP) is still dO·O, so the delta term is unchanged. The seed is read from a one-element
int64 tensor (``SEED``) that the caller draws on the kernels' device, not passed as a number: a captured CUDA
graph then replays the draw (a new mask every replay), where a number would be baked into the graph.
"""

from __future__ import annotations

import triton
import triton.language as tl

from debertakit.attention import triton_backend  # constants only (the backend imports these kernels lazily)

_BIG = tl.constexpr(1 << 30)  # "no position" sentinel for min / max over partial blocks
_LOG2E = tl.constexpr(triton_backend.LOG2E)  # log2(e): the kernels' scores are in base 2
# FAR's rows are padded with -inf to a multiple of this (every tile side divides it), so that a far tile reads
# its column values without a mask (`_far_col`): the caller's padding (`triton_backend._far_columns`)
FAR_PAD = tl.constexpr(triton_backend.FAR_PAD)
# the distance buffers' row stride DW is their 2·SAT + 1 cells rounded up to a multiple of this
# (`triton_backend._distance_stride`): fewer than DIST_ALIGN padding cells per row, which `_store_row_ends` zeroes
DIST_ALIGN = tl.constexpr(triton_backend.DIST_ALIGN)
# the kernels' LOG2_BAND for distance tables of one band per (b, h) (`triton_backend._distance_layout`)
_ONE_BAND = tl.constexpr(triton_backend._ONE_BAND)

# KIND, the tiles a loop visits: any (each classified at run time), only far ones on one side, or only near ones
# (at distance i - j a program's loop runs in three parts: see the module docstring); _NEAR_ONLY: the loop's one
# run where no visible pair of the call lies SAT or more apart (``FAR_TILES`` false: `triton_backend._far_tiles`),
# so that no tile is far and every saturated pair is hidden, its dS zero: the backward sums none
_ANY = tl.constexpr(0)
_FAR_RIGHT = tl.constexpr(1)
_NEAR = tl.constexpr(2)
_FAR_LEFT = tl.constexpr(3)
_NEAR_ONLY = tl.constexpr(4)
# _NEAR_CUT: the forward's near tiles where its distance tables stop short of the farthest pairs of some
# (``EDGES``, `_runs`): those pairs take the saturated values, as in a far tile (`_beyond_reach`)
_NEAR_CUT = tl.constexpr(5)


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    """a @ b, float32 result. PREC 0: tensor cores (16-bit inputs); 1: IEEE float32; 2: operands widened to
    float32 first, for Triton's CPU interpreter, whose ``tl.dot`` gives wrong bfloat16 products (widening exact
    16-bit values gives the products a tensor core computes, accumulated in float32)."""
    if PREC == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif PREC == 1:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _mm_add(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b into the float32 ``acc``, by PREC as `_mm` multiplies (the distance tables' product kernel,
    `triton_products`, adds two products into one accumulator)."""
    if PREC == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif PREC == 1:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _block_and_head(N, BLOCK: tl.constexpr):
    """(block index along the kernel's rows, batch · heads index) of this program. The launch grid is flat,
    block index fastest: the order the programs start in is that of a 2-D grid (blocks, batch · heads), without
    the 65535 limit of a grid's second axis on batch × heads."""
    n_blocks = tl.cdiv(N, BLOCK)
    pid = tl.program_id(0)
    bh = pid // n_blocks
    return pid - bh * n_blocks, bh


@triton.jit
def _head_major(bh, H, B, N):
    """Offset (64-bit, in rows) of the N rows of program (b, h) (``bh = b·H + h``) in a buffer laid out per
    head, (H, B, N, ·): the tables ROW / COL and the distance buffers (see the layout note above)."""
    return ((bh % H) * B + bh // H).to(tl.int64) * N


@triton.jit
def _positions(POS, offs, inside, IJ: tl.constexpr):
    """Positions of a block of rows or columns; with ``IJ`` (distance i - j) the indices themselves."""
    if IJ:
        return offs
    return tl.load(POS + offs, mask=inside, other=0)


@triton.jit
def _far(
    start_m, start_n, qpos_min, qpos_max, kpos, n_in, SAT,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IJ: tl.constexpr, KIND: tl.constexpr,
):  # fmt: skip
    """Whether every pair of the tile lies beyond the saturation on the left / on the right (two scalars; known
    at compile time when the loop visits one kind of tile)."""
    if KIND != _ANY:
        far_left = KIND == _FAR_LEFT
        far_right = KIND == _FAR_RIGHT
    elif IJ:
        # bounds from the block indices alone: rows / columns past the end only widen the range
        far_right = start_m - (start_n + BLOCK_N - 1) >= SAT
        far_left = (start_m + BLOCK_M - 1) - start_n <= -SAT
    else:
        kpos_min = tl.min(tl.where(n_in, kpos, _BIG), 0)
        kpos_max = tl.max(tl.where(n_in, kpos, -_BIG), 0)
        far_right = qpos_min - kpos_max >= SAT
        far_left = qpos_max - kpos_min <= -SAT
    return far_left, far_right


@triton.jit
def _split(own, lo, SAT, OWN: tl.constexpr, OTHER: tl.constexpr):
    """At distance i - j: where the far tiles of a program's loop end and begin. The program owns the OWN rows
    (or columns) from ``own``; its loop visits blocks of OTHER from ``lo``. By `_far`'s bounds a tile is beyond
    the saturation on the side before the program's block when the loop's block starts at or below
    ``own - OTHER + 1 - SAT`` (a prefix of the loop) and on the side after it when it starts at or above
    ``own + OWN - 1 + SAT`` (a suffix): returns the first block past the prefix and the first of the suffix, in
    that order (SAT >= 1), either of them possibly past the loop's end: the caller clamps both to it. The same
    bounds serve the query-block programs (prefix: far right) and the key-block ones (prefix: far left)."""
    first = lo + tl.maximum(own + 1 - SAT - lo, 0) // OTHER * OTHER
    last = lo + tl.cdiv(tl.maximum(own + OWN - 1 + SAT - lo, 0), OTHER) * OTHER
    return first, last


@triton.jit
def _runs(
    own, lo, hi, SAT, OWN: tl.constexpr, OTHER: tl.constexpr, SPLIT: tl.constexpr, BEFORE: tl.constexpr,
    AFTER: tl.constexpr, FAR_TILES: tl.constexpr, EDGES: tl.constexpr,
):  # fmt: skip
    """A program's loop over blocks ``[lo, hi)`` as runs of one kind of tile each: ``(kinds, bounds)``, run ``r``
    visiting ``[bounds[r], bounds[r + 1])``. With SPLIT (distance i - j with position terms) three runs cut by
    `_split`: BEFORE (far tiles of blocks before the program's), near, AFTER; or, without FAR_TILES, one near
    run (`_NEAR_ONLY`: the binary holds one loop, not three of which two never run); otherwise one run of any
    kind. With EDGES (the forward, its distance tables cut short of its near tiles' farthest pairs:
    `triton_backend.FORWARD_REACH`) the near run is of `_NEAR_CUT` tiles."""
    if SPLIT and not FAR_TILES:
        kinds = (_NEAR_ONLY,)
        bounds = (lo, hi)
    elif SPLIT:
        first, last = _split(own, lo, SAT, OWN, OTHER)
        kinds = (BEFORE, _NEAR_CUT if EDGES else _NEAR, AFTER)
        bounds = (lo, tl.minimum(first, hi), tl.minimum(last, hi), hi)
    else:
        kinds = (_ANY,)
        bounds = (lo, hi)
    return kinds, bounds


@triton.jit
def _shown_keys(n_in, offs_n, KMASK, HAS_KMASK: tl.constexpr):
    """(BLOCK_N,) bool: the tile's keys inside the sequence and not masked."""
    if HAS_KMASK:
        return n_in & (tl.load(KMASK + offs_n, mask=n_in, other=0) != 0)
    return n_in


@triton.jit
def _visible(
    m_in, n_in, shown, qpos, kpos, qseg, offs_n, KSEG, before, HAS_SEG: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """(BLOCK_M, BLOCK_N) bool: query i may attend key j (``shown``: `_shown_keys`). ``before``: every key of the
    tile lies before every query (a far-right tile at distance i - j), so a causal mask hides nothing there."""
    allowed = m_in[:, None] & shown[None, :]
    if HAS_SEG:
        kseg = tl.load(KSEG + offs_n, mask=n_in, other=-1)
        allowed = allowed & (qseg[:, None] == kseg[None, :])
    if CAUSAL and not before:
        allowed = allowed & (kpos[None, :] <= qpos[:, None])
    return allowed


@triton.jit
def _skew_terms(
    q, k, PQ, PK, LUT, start_m, start_n, SAT, log2_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WT: tl.constexpr,
    HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """c2p + p2c (BLOCK_M, BLOCK_N) of a near tile at distance i - j, scaled, from the position tables (see the
    module docstring): two small matmuls against the WT table rows of the tile's distances, read skewed."""
    base = start_m - start_n - (BLOCK_N - 1)  # the tile's smallest distance
    rows = tl.load(LUT + (tl.minimum(tl.maximum(base + tl.arange(0, WT), -SAT), SAT) + SAT))  # (WT,)
    table = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]  # (WT, D) offsets of those rows
    # the column of pair (i, j) in the (.., WT) products: its distance minus the tile's smallest
    skew = tl.arange(0, BLOCK_M)[:, None] - tl.arange(0, BLOCK_N)[None, :] + (BLOCK_N - 1)
    terms = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if HAS_ROW:  # c2p(i, j) = q_i · Kr[idx(i - j)]
        terms += tl.gather(_mm(q, tl.trans(tl.load(PK + table)), PREC), skew, 1)
    if HAS_COL:  # p2c(i, j) = k_j · Qr[idx(i - j)]
        terms += tl.gather(_mm(tl.load(PQ + table), tl.trans(k), PREC), skew, 0)
    return terms * log2_scale


@triton.jit
def _distance_terms(
    ROW, COL, offs_m, offs_n, R, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr, KEYS_OWNED: tl.constexpr
):
    """c2p + p2c (BLOCK_M, BLOCK_N) of a near tile at distance i - j from the distance tables, scaled (see the
    module docstring). ROW / COL point at the cell of distance 0 of the program's first row: pair (i, j) sits at
    i·(R + 1) + (j - i) = i·R + j in ROW and j·R + i in COL, so a tile is a strided block of each, rows of
    consecutive cells: two plain tile loads, as for K and V. No mask: a near tile's pairs within the sequences
    lie within R / 2 of distance 0, in their own row; a pair with a row or column past the end reads a cell of
    a neighbouring row, of the next (b, h) or of the zeros the caller leaves after the last one (finite values,
    and the pair's score is discarded: see `_tile`).
    The table of the side the program owns (ROW: query rows, COL: key rows; ``KEYS_OWNED`` for the dK/dV kernel)
    loads first. The order is the source's only, yet it decides what Triton's pipeliner makes of the two loads:
    with the other table first, the static report's near loops grow (dK/dV at 32x64: 475 -> 669 instructions a
    thread under Triton 3.9; the forward at 64x32 with 4 warps: 439 -> 705). There the dK/dV kernel's ROW tile
    is prefetched into registers and converted through shared memory, and the saturated sums follow it into a
    layout that splits the queries across warps."""
    terms = tl.zeros((offs_m.shape[0], offs_n.shape[0]), dtype=tl.float32)
    if HAS_COL and KEYS_OWNED:
        terms += tl.load(COL + (offs_m[:, None] + offs_n[None, :] * R)).to(tl.float32)
    if HAS_ROW:
        terms += tl.load(ROW + (offs_m[:, None] * R + offs_n[None, :])).to(tl.float32)
    if HAS_COL and not KEYS_OWNED:
        terms += tl.load(COL + (offs_m[:, None] + offs_n[None, :] * R)).to(tl.float32)
    return terms


@triton.jit
def _beyond_reach(terms, offs_m, offs_n, reach, row_l, row_r, FARL, FARR):
    """The position terms of a near tile of the forward (`_NEAR_CUT`) whose distance tables are cut to
    ``reach`` (R / 2, at least SAT): the tile's pairs more than ``reach`` apart read a neighbouring row's cells
    (`_distance_terms`: finite values, the loads unmasked) and take instead their side's saturated values, the
    row's plus the column's, as a far tile adds them. Each is the cell the uncut table holds there, so the sum
    is the same. Every near tile selects, though only a few at each end of the near run hold such a pair: a
    branch around the selects took the forward to 178 registers a thread (two programs an SM at 4 warps, where
    166 and this code's 168 fit three; sm_90, Triton 3.9, 64x32 w4 s2, d 64), and a loop of its own for those
    tiles (five runs) to 200."""
    delta = offs_m[:, None] - offs_n[None, :]
    right = row_r[:, None] + _far_col(FARR, offs_n)[None, :]  # i - j > reach: keys well before
    terms = tl.where(delta > reach, right, terms)
    return tl.where(delta < -reach, row_l[:, None] + _far_col(FARL, offs_n)[None, :], terms)


@triton.jit
def _ends(LUT, SAT, R, SKEW: tl.constexpr, DIST: tl.constexpr):
    """Columns of ROW holding the saturated values on the left and on the right: the LUT's first and last
    entries, or 0 and 1 for the skewed kernels, whose ROW / COL hold only the two ends, (N, 2). Read once per
    program (inside the loops, a load that the next load's address waits on). For the distance tables offsets
    from a row's cell of distance 0: j - i = SAT (left) and -SAT (right), cut to the row's R / 2 cells on either
    side (where the rows are shorter no tile is far, and the values read are not used)."""
    if DIST:
        reach = tl.minimum(SAT, R // 2)
        return reach, -reach
    if SKEW:
        return 0, 1
    return tl.load(LUT), tl.load(LUT + 2 * SAT)


@triton.jit
def _table_stride(R, DIST: tl.constexpr):
    """The row stride of ROW / COL: R, or R + 1 for the distance tables (R + 1 cells per row)."""
    if DIST:
        return R + 1
    return R


@triton.jit
def _band_rows(N, LOG2_BAND):
    """Rows per band of a distance table of N rows per (b, h): 2**LOG2_BAND, or one band of all the (b, h)'s
    rows, N rounded up to DIST_ALIGN, where that is fewer (the caller passes LOG2_BAND = 30 for one band)."""
    return tl.minimum(1 << LOG2_BAND, tl.cdiv(N, DIST_ALIGN) * DIST_ALIGN)


@triton.jit
def _table_offset(bh, H, B, N, R, LOG2_BAND, DIST: tl.constexpr):
    """Offset (64-bit, in elements) of program (b, h)'s rows of ROW / COL. A distance table is laid out
    (H, bands, B, band rows, R + 1) (see the module docstring), each (b, h)'s N rows padded to whole bands, so
    that with bands and R multiples of 16 every band's rows start 16-element aligned: their tiles load as
    aligned vectors. This is the offset of the (b, h)'s first band; `_band_step` moves to the others."""
    if DIST:
        band = _band_rows(N, LOG2_BAND)
        rows = tl.cdiv(N, band) * band
        # a multiple of 16, which Triton cannot see through the minimum in `_band_rows` (see `_band_shift`)
        return tl.multiple_of(((bh % H).to(tl.int64) * B * rows + (bh // H) * band) * (R + 1), 16)
    return _head_major(bh, H, B, N) * R


@triton.jit
def _band_step(N, B, R, LOG2_BAND):
    """How far (64-bit) a distance table's pointer moves from one band to the next, so that pair (i, j) stays at
    ``i·R + j`` from it: the B bands before it hold ``B·band·(R + 1)`` cells, less the ``band·R`` that i grew by.
    A tile's rows lie in one band: its pointer is moved ``start >> LOG2_BAND`` steps (none with one band)."""
    band = _band_rows(N, LOG2_BAND)
    return band.to(tl.int64) * (B * (R + 1) - R)


@triton.jit
def _band_shift(start, LOG2_BAND, step):
    """How far a distance table's pointer moves to the band of the block from ``start`` (`_band_step`). Said to
    be a multiple of 16 (bands and R are: `triton_backend._distance_layout`): without it Triton no longer knows
    the moved pointer aligned, and the near tiles' loads lose their vectors (the static report's near loops
    grew by half)."""
    return tl.multiple_of((start >> LOG2_BAND) * step, 16)


@triton.jit
def _far_col(FAR, offs_n):
    """The far tiles' value per key column on one saturated side (FARL / FARR: one row of the caller's FAR):
    COL's saturated value (0 without p2c), -inf where the key is masked and past the sequence's end (the row's
    padding to FAR_PAD, a multiple of every tile side: no load mask). Hidden keys thus hide themselves, and a
    far tile whose hidden pairs are whole columns applies no mask of its own (`_tile`)."""
    return tl.load(FAR + offs_n)


@triton.jit
def _far_rows(FAR, bh, H, B, NK):
    """FARL, FARR: program (b, h)'s two rows of FAR (H, B, 2, NK padded to FAR_PAD)."""
    width = tl.cdiv(NK, FAR_PAD) * FAR_PAD
    left = FAR + _head_major(bh, H, B, 2 * width)
    return left, left + width


@triton.jit
def _tile(
    q, k, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_n, n_in, start_n,
    ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, R, SAT, end_l, end_r, log2_scale, PQ, PK,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, IJ: tl.constexpr,
    SKEW: tl.constexpr, DIST: tl.constexpr, HEAD_DIM: tl.constexpr, WT: tl.constexpr, KIND: tl.constexpr,
    KEYS_OWNED: tl.constexpr,
):  # fmt: skip
    """Scores (BLOCK_M, BLOCK_N) float32 of one tile, -inf where hidden; the visibility mask; the key positions;
    whether the whole tile lies beyond the saturation on the left / on the right. Pointers are already offset to
    the program's (b, h) (tensors) or b (positions, masks); offsets inside are 32-bit.

    Without segments or a causal mask, and in the far-right tiles at distance i - j with a causal one (their keys
    lie at least SAT before their queries), the hidden pairs are whole columns: keys past the sequence's end or
    masked. The tile then applies no mask per pair: a far tile's column value (`_far_col`) is -inf there, and
    other tiles add a bias per column, 0 or -inf. Rows past the queries' end keep their scores: the forward and
    dQ kernels never store them, and the dK/dV kernel reads ``lse = inf`` for them, so their probabilities are
    0. In every tile the near band's gathers load without a mask: rows and columns past the end read row /
    column 0, and what hidden pairs read is discarded."""
    tl.static_assert(FAR_PAD % BLOCK_N == 0, "FAR's rows are padded for key blocks dividing FAR_PAD")
    kpos = _positions(KPOS, offs_n, n_in, IJ)
    # KIND is known at compile time; under Triton 3.6 it arrives as a constant scalar, not a constexpr, so the
    # flags below are plain booleans there, their branches folded all the same
    before = KIND == _FAR_RIGHT
    shown = _shown_keys(n_in, offs_n, KMASK, HAS_KMASK)
    allowed = _visible(m_in, n_in, shown, qpos, kpos, qseg, offs_n, KSEG, before, HAS_SEG, CAUSAL)
    far_left, far_right = _far(
        start_m, start_n, qpos_min, qpos_max, kpos, n_in, SAT, BLOCK_M, BLOCK_N, IJ, KIND
    )
    by_columns = not HAS_SEG and (before or not CAUSAL)  # the hidden pairs are whole columns (see above)
    s = _mm(q, tl.trans(k), PREC) * log2_scale
    table_scale = log2_scale
    if DIST:
        table_scale = 1.0  # the distance tables hold scaled values (and so FAR, taken from them)
    if HAS_ROW or HAS_COL:
        if far_right:
            # a row vector plus a column vector: the cost of plain attention
            if HAS_ROW:
                s += (row_r * table_scale)[:, None]
            s += (_far_col(FARR, offs_n) * table_scale)[None, :]
        elif far_left:
            if HAS_ROW:
                s += (row_l * table_scale)[:, None]
            s += (_far_col(FARL, offs_n) * table_scale)[None, :]
        elif DIST:
            terms = _distance_terms(ROW, COL, offs_m, offs_n, R, HAS_ROW, HAS_COL, KEYS_OWNED)
            if KIND == _NEAR_CUT:
                terms = _beyond_reach(terms, offs_m, offs_n, R // 2, row_l, row_r, FARL, FARR)
            s += terms
        elif SKEW:
            s += _skew_terms(
                q, k, PQ, PK, LUT, start_m, start_n, SAT, log2_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, WT, HAS_ROW, HAS_COL, PREC,
            )  # fmt: skip
        else:
            # the near band: gather through the lookup table (distances built here only, not kept live)
            delta = qpos[:, None] - kpos[None, :]
            ridx = tl.load(LUT + tl.minimum(tl.maximum(delta, -SAT), SAT) + SAT)
            if HAS_ROW:
                rows = tl.where(m_in, offs_m, 0)  # in bounds: no load mask (see above)
                s += tl.load(ROW + (rows[:, None] * R + ridx)) * log2_scale
            if HAS_COL:
                cols = tl.where(n_in, offs_n, 0)
                s += tl.load(COL + (cols[None, :] * R + ridx)) * log2_scale
    if not by_columns:
        s = tl.where(allowed, s, float("-inf"))
    elif not (before or KIND == _FAR_LEFT):  # (far tiles: FAR's -inf)
        s += tl.where(shown, 0.0, float("-inf"))[None, :]
    return s, allowed, kpos, far_left, far_right


@triton.jit
def _keep(seed, bh, offs_m, start_n, DROP_T, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool dropout mask of the tile whose first column is ``start_n`` (a multiple of 8):
    True where kept. One Philox call per eight columns (see the module docstring)."""
    tl.static_assert(BLOCK_N % 8 == 0, "dropout draws eight columns per Philox call")
    G: tl.constexpr = BLOCK_N // 8
    groups = start_n // 8 + tl.arange(0, G)
    c0 = tl.broadcast_to(groups[None, :], (BLOCK_M, G))
    c1 = tl.broadcast_to(offs_m[:, None], (BLOCK_M, G))
    zero = tl.zeros((BLOCK_M, G), dtype=tl.int32)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, zero + bh, zero)
    # eight 16-bit numbers per call, laid out as the eight columns of the group (the same layout everywhere)
    lo = tl.join(tl.join(r0 & 0xFFFF, r0 >> 16), tl.join(r1 & 0xFFFF, r1 >> 16))
    hi = tl.join(tl.join(r2 & 0xFFFF, r2 >> 16), tl.join(r3 & 0xFFFF, r3 >> 16))
    bits = tl.reshape(tl.join(lo, hi), (BLOCK_M, BLOCK_N))
    return bits >= DROP_T


@triton.jit(do_not_specialize=["DROP_T"])
def _keep_mask_kernel(OUT, SEED, NQ, NK, DROP_T, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The dropout mask as uint8 (B·H, NQ, NK): what the attention kernels draw, for tests and inspection.
    Grid (B·H, query blocks, key blocks); 64-bit offsets (NQ·NK may pass 2**31)."""
    bh = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    start_n = tl.program_id(2) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    keep = _keep(tl.load(SEED), bh, offs_m, start_n, DROP_T, BLOCK_M, BLOCK_N)
    inside = (offs_m[:, None] < NQ) & (offs_n[None, :] < NK)
    OUT += bh.to(tl.int64) * NQ * NK
    tl.store(OUT + (offs_m.to(tl.int64)[:, None] * NK + offs_n[None, :]), keep.to(tl.uint8), mask=inside)


@triton.jit
def _table_grad(
    DIST, own, own_in, ds, allowed, qpos, kpos, far_left, far_right, acc_l, acc_r, SAT, OFF, DW,
    AXIS: tl.constexpr, IJ: tl.constexpr, KIND: tl.constexpr, GRAD_BANDS: tl.constexpr,
):  # fmt: skip
    """Distance-space gradient of one tile's table entries, for the rows (AXIS 1, ``own`` = the query indices)
    or the columns (AXIS 0, the key indices) a program owns: saturated pairs summed into ``acc_l`` / ``acc_r``
    (the two end cells), near pairs stored, one cell per (own index, distance): no cell is written twice.
    At distance i - j (``IJ``) hidden pairs store their zero ``ds`` too: each (own index, distance) names one
    partner, so no visible pair shares their cell, and with `_zero_unvisited` the kernel writes every cell of
    its rows (the caller allocates the buffer without filling it). With explicit positions a hidden pair may
    repeat a visible one's distance: only visible pairs are stored, into a buffer the caller zero-fills.
    In a `_NEAR_ONLY` run no saturated pair is visible: their dS are zeros, and the two sums are skipped (the
    mask still keeps such pairs from being stored: their cells would lie outside their row's 2·SAT + 1).

    A query row's cell is SAT - delta (SAT + j - i), a key column's SAT + delta (SAT + i - j): both ascend
    along the partner block, so that Triton sees each row (column) of the tile store consecutive cells and
    spreads a warp along them, 32 cells a store. With cell SAT + delta for the query rows too, their cells ran
    down along the keys, which Triton's pointer analysis does not follow: the warp went down the tile's rows,
    a cell of another row per thread (Nsight Compute on an H100 at N = 512: 112 M store sectors against
    14.6 M ideal; dQ took 2.03 ms of the training step's 4.65 ms of GPU time, waiting on its stores; 1.07 ms
    with the cells ascending, on an H200: docs/gpu-kernel.md, "Measured on an H100 and an H200").

    ``OFF``: the cell of distance 0 in row 0's frame (SAT + j - i above is OFF + j - i), and ``SAT`` the
    saturation that sends a pair to the end cells; `_grad_rows` gives both (banded buffers: no end cells).

    ``GRAD_BANDS`` (a buffer in the distance tables' layout at their odd row stride, `_grad_rows`): every pair
    of a near tile has its cell in the owned rows (in bands no pair is saturated; one band's rows reach beyond
    every pair of a near run, the saturated ones stored like the others and folded by the caller as the
    table's end rows), so the store takes the row mask alone and sums nothing; and with DW - 1 a multiple of
    16, a row's cell OFF + j - i lies at ``i·(DW - 1) + OFF + j``, 16-byte aligned at the tile's first partner.
    Each tile row then stores 16 bytes at a time, where at an aligned DW its first cell moves by one element
    from row to row and the store goes element by element (`benchmarks/triton_store_cost.py`). Far tiles still
    sum."""
    if far_right:  # one table entry for the whole tile: a plain sum (zero on hidden pairs)
        acc_r += tl.sum(ds, AXIS)
    elif far_left:
        acc_l += tl.sum(ds, AXIS)
    elif GRAD_BANDS:  # every pair its own cell, the saturated ones too: no sum
        dw1 = tl.multiple_of(DW - 1, 16)
        if AXIS == 1:
            cells = (own * dw1 + OFF)[:, None] + kpos[None, :]
            owned = own_in[:, None]
        else:
            cells = (own * dw1 + OFF)[None, :] + qpos[:, None]
            owned = own_in[None, :]
        tl.store(DIST + cells, ds.to(DIST.dtype.element_ty), mask=owned)
    else:
        delta = qpos[:, None] - kpos[None, :]
        left = delta <= -SAT
        right = delta >= SAT
        if KIND != _NEAR_ONLY:  # (there every saturated pair is hidden: its dS is zero)
            acc_l += tl.sum(tl.where(left, ds, 0.0), AXIS)
            acc_r += tl.sum(tl.where(right, ds, 0.0), AXIS)
        if AXIS == 1:
            # a row term plus the keys' positions: Triton sees the cells run along the row (at distance i - j)
            cells = (own * DW + OFF - qpos)[:, None] + kpos[None, :]
            owned = own_in[:, None]
        else:
            cells = own[None, :] * DW + delta + OFF
            owned = own_in[None, :]
        if IJ:  # every near cell of the owned rows
            near = owned & (~left) & (~right)
        else:  # visible pairs only
            near = allowed & (~left) & (~right)
        tl.store(DIST + cells, ds.to(DIST.dtype.element_ty), mask=near)
    return acc_l, acc_r


@triton.jit
def _store_row_ends(DIST, own, own_in, first, last, OFF, DW, OWN: tl.constexpr):
    """The end cells of the owned rows, 0 (``first``) and 2·OFF (``last``): the far (or saturated) pairs' sums;
    and the zeros of the rows' padding, from cell 2·OFF + 1 to the row stride DW (fewer than DIST_ALIGN cells;
    none where DW is the row's cells, ``GRAD_BANDS``). OFF: the cell of distance 0 (`_grad_rows`)."""
    tl.store(DIST + own * DW, first.to(DIST.dtype.element_ty), mask=own_in)
    tl.store(DIST + (own * DW + 2 * OFF), last.to(DIST.dtype.element_ty), mask=own_in)
    pad = 2 * OFF + 1 + tl.arange(0, DIST_ALIGN)
    zero = tl.zeros((OWN, DIST_ALIGN), dtype=DIST.dtype.element_ty)
    tl.store(DIST + (own[:, None] * DW + pad[None, :]), zero, mask=own_in[:, None] & (pad < DW)[None, :])


@triton.jit
def _zero_cells(
    DIST, own, own_in, lo, end, first, last, OFF, DW, OWN: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Zeros into the cells [first, last] of the owned rows whose partner (the index at the other end of the
    pair, ``own + cell - OFF``: see `_table_grad`) lies outside [lo, end), in chunks of BLOCK cells."""
    zero = tl.zeros((OWN, BLOCK), dtype=DIST.dtype.element_ty)
    for c0 in range(first, last + 1, BLOCK):
        cells = c0 + tl.arange(0, BLOCK)
        partner = own[:, None] + (cells - OFF)[None, :]
        outside = (partner < lo) | (partner >= end)
        mask = own_in[:, None] & (cells <= last)[None, :] & outside
        tl.store(DIST + (own[:, None] * DW + cells[None, :]), zero, mask=mask)


@triton.jit
def _stored_partners(own, lo, hi, SAT, OWN: tl.constexpr, OTHER: tl.constexpr, NEAR_RUN: tl.constexpr):
    """At distance i - j: the blocks of partners whose cells the loop of the program owning OWN rows from
    ``own`` stores, from the first returned to past the second: those it visits, ``lo`` to ``hi``; or its near
    run's alone (`_runs`), where its far tiles only sum and its rows hold cells of partners beyond the
    saturation (``NEAR_RUN``: one band stored 16 bytes at a time, `_grad_rows`): `_zero_unvisited` zeroes
    those the far tiles leave."""
    if NEAR_RUN:
        first, last = _split(own, lo, SAT, OWN, OTHER)
        return tl.minimum(first, hi), tl.minimum(last, hi)
    return lo, hi


@triton.jit
def _zero_unvisited(
    DIST, start, N, lo, hi, OFF, FIRST, LAST, DW, OWN: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """At distance i - j: zeros into the cells [FIRST, LAST] (`_grad_rows`) of the program's OWN rows starting
    at ``start`` (of N) whose partner lies outside the blocks of BLOCK the program's loop visits, from ``lo`` to
    past ``hi`` (nothing else writes them: see `_table_grad`). Such cells form two runs per row, at the low and
    the high distances; only chunks that reach them are visited (at N well above the saturation, a few blocks
    near the sequence ends)."""
    own = start + tl.arange(0, OWN)
    own_in = own < N
    end = tl.maximum(lo + tl.cdiv(hi - lo, BLOCK) * BLOCK, lo)  # where the loop's last block ends
    # partner = own + cell - OFF is below lo at low cells, at or above end at high ones; the bounds below hold
    # for every own index in [start, start + OWN)
    low_last = tl.minimum(lo - start + OFF - 1, LAST)
    high_first = end - (start + OWN - 1) + OFF
    high_first = tl.maximum(tl.maximum(high_first, low_last + 1), FIRST)
    _zero_cells(DIST, own, own_in, lo, end, FIRST, low_last, OFF, DW, OWN, BLOCK)
    _zero_cells(DIST, own, own_in, lo, end, high_first, LAST, OFF, DW, OWN, BLOCK)


@triton.jit
def _grad_rows(bh, H, B, N, SAT, DW, LOG2_BAND, start, DIST: tl.constexpr, GRAD_BANDS: tl.constexpr):
    """Where a program's rows of a distance-space gradient buffer lie, and how their cells run: (offset, SAT,
    OFF, FIRST, LAST, ENDS). ``offset`` (64-bit, elements) moves the buffer's pointer so that own row i's
    cells start at i·DW from it; a pair's cell is OFF + j - i of a query row (OFF + i - j of a key column: see
    `_table_grad`), SAT the distance from which a pair is summed into an end cell, and the cells [FIRST, LAST]
    those `_zero_unvisited` zeroes where the loop leaves them; rows below ENDS have end cells
    (`_store_row_ends`).

    One band (the default): rows per (b, h) at the row stride DW, a row's 2·SAT + 1 cells around cell SAT,
    its end cells 0 and 2·SAT and its padding written by `_store_row_ends`. Where the distance tables are in
    bands (``DIST``, LOG2_BAND below `_ONE_BAND`: no far tile) and their rows are narrower than one band's (the
    caller's choice, `triton_backend._gradient_stride`), the buffer takes the tables' own layout, (H, bands, B,
    band, DW): row r of a band holds partner j at cell band + j - r, every cell of it written here or by the
    loop (no end cells: no visible pair is saturated, and a hidden one stores its zero like any other). DW is
    the band's N' + band + 1 cells themselves, odd (``GRAD_BANDS``: the stores 16 bytes wide, `_table_grad`),
    or rounded up to 16 (DW below 2·SAT + 1 rounded up tells the kernel). At v3's N = 512 and 64-row bands that
    is 577 or 592 cells a row where one band needs 1040. With ``GRAD_BANDS`` and one band (LOG2_BAND =
    `_ONE_BAND`) the buffer takes the tables' one band instead, each (b, h)'s rows padded to DIST_ALIGN, DW the
    tables' 2·OFF + 1 cells (OFF = DW // 2 beyond every pair the kernels store: no per-pair mask), the far
    tiles' sums in the end cells 0 and 2·OFF. The offsets inside a program's rows stay 32-bit
    (``band`` int32): with a 64-bit one the cells' addresses went 64-bit and dQ took 217 registers a thread
    for 168 (sm_90, 64×32 w4, Triton 3.9)."""
    offset = _head_major(bh, H, B, N) * DW
    sat = SAT
    off = SAT
    first = 1
    last = 2 * SAT - 1
    ends = N
    if DIST:
        # in the tables' layout where the caller chose it (`triton_backend._gradient_stride`), which GRAD_BANDS
        # or the row stride it passed tells
        band = _band_rows(N, LOG2_BAND)  # (int32: the cells' offsets stay 32-bit)
        index = start >> tl.minimum(LOG2_BAND, _ONE_BAND - 1)  # the band of the program's block
        band_start = index * band
        rows = (((bh % H) * tl.cdiv(N, band) + index) * B + bh // H).to(tl.int64) * band - band_start
        in_bands = rows * DW
        if GRAD_BANDS:  # whole bands of rows at DW each: 16-element aligned (`_table_grad`)
            # one band: cells 1 … DW - 2 around OFF = DW // 2, the far tiles' sums in the end cells
            one = LOG2_BAND >= _ONE_BAND
            offset = tl.multiple_of(in_bands, 16)
            off = tl.multiple_of(tl.where(one, DW // 2, band + band_start), 16)
            first = tl.where(one, 1, 0)
            last = tl.where(one, DW - 2, DW - 1)
            ends = tl.where(one, N, 0)
        else:  # in bands if the tables are and a banded row is narrower than one band's
            banded = (LOG2_BAND < _ONE_BAND) & (DW < tl.cdiv(2 * SAT + 1, DIST_ALIGN) * DIST_ALIGN)
            offset = tl.where(banded, in_bands, offset)
            sat = tl.where(banded, _BIG, SAT)
            off = tl.where(banded, band + band_start, SAT)
            first = tl.where(banded, 0, 1)
            last = tl.where(banded, DW - 1, 2 * SAT - 1)
            ends = tl.where(banded, 0, N)
    return offset, sat, off, first, last, ends


@triton.jit
def _query_block(
    Q, QPOS, QSEG, ROW, pid_m, NQ, R, SQN, end_l, end_r,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HAS_ROW: tl.constexpr, HAS_SEG: tl.constexpr, IJ: tl.constexpr,
    DIST: tl.constexpr,
):  # fmt: skip
    """What a program needs about its block of query rows (pointers offset to the program's b / (b, h))."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_in = offs_m < NQ
    q = tl.load(Q + (offs_m[:, None] * SQN + offs_d[None, :]), mask=m_in[:, None], other=0.0)
    qpos = _positions(QPOS, offs_m, m_in, IJ)
    qpos_min = tl.min(tl.where(m_in, qpos, _BIG), 0)
    qpos_max = tl.max(tl.where(m_in, qpos, -_BIG), 0)
    if HAS_SEG:
        qseg = tl.load(QSEG + offs_m, mask=m_in, other=-2)
    else:
        qseg = qpos
    row_l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    row_r = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if HAS_ROW:
        # the two saturated values of each row, once per query block (far tiles need nothing else)
        stride = _table_stride(R, DIST)
        row_l = tl.load(ROW + (offs_m * stride + end_l), mask=m_in, other=0.0).to(tl.float32)
        row_r = tl.load(ROW + (offs_m * stride + end_r), mask=m_in, other=0.0).to(tl.float32)
    return offs_m, offs_d, m_in, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r


@triton.jit
def _key_block(
    start_n, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_d,
    K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r, log2_scale, PQ, PK,
    LOG2_BAND, col_step,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, IJ: tl.constexpr,
    SKEW: tl.constexpr, DIST: tl.constexpr, HEAD_DIM: tl.constexpr, WT: tl.constexpr, KIND: tl.constexpr,
):  # fmt: skip
    """For the query-block programs (forward, dQ): the K and V rows of the key block from ``start_n`` and the
    tile's scores, visibility, key positions and far sides (`_tile`). ``col_step``: COL's `_band_step`."""
    # start_n is a multiple of BLOCK_N: every run of a loop starts at one or is empty (`_runs`; a wide far
    # block's BLOCK_N is FAR_N: `_wide_and_narrow`, from a start floored to FAR_N). Said to Triton,
    # the near band's ROW tiles (`_distance_terms`) and the far tiles' FAR rows load as aligned vectors
    offs_n = tl.max_contiguous(tl.multiple_of(start_n + tl.arange(0, BLOCK_N), BLOCK_N), BLOCK_N)
    n_in = offs_n < NK
    kv_ptrs = offs_n[:, None] * SKN + offs_d[None, :]
    k = tl.load(K + kv_ptrs, mask=n_in[:, None], other=0.0)
    v = tl.load(V + kv_ptrs, mask=n_in[:, None], other=0.0)
    if DIST and not (KIND == _FAR_LEFT or KIND == _FAR_RIGHT):  # to the band of the key block (far: no bands)
        COL += _band_shift(start_n, LOG2_BAND, col_step)
    s, allowed, kpos, far_left, far_right = _tile(
        q, k, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_n, n_in, start_n,
        ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, R, SAT, end_l, end_r, log2_scale, PQ, PK,
        BLOCK_M, BLOCK_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT, KIND,
        False,
    )  # fmt: skip
    return k, v, s, allowed, kpos, far_left, far_right


@triton.jit
def _wide_and_narrow(start, end, BLOCK_N: tl.constexpr, FAR_N: tl.constexpr, KIND: tl.constexpr):
    """A far run ``[start, end)`` of a query-block program's loop (forward, dQ) as blocks of FAR_N keys over
    ``[wide_lo, wide_hi)`` and blocks of BLOCK_N over ``[narrow_lo, narrow_hi)`` (fewer than FAR_N keys): the
    far-right run wide from its start (a multiple of FAR_N: the program's ``lo``), narrow up to its end (the near
    run's start, or the loop's end, which its last narrow block may pass);
    the far-left run narrow up to its first multiple of FAR_N, wide from there, its last wide block possibly
    past ``end`` (keys there are hidden: past the sequence, masked, or hidden per pair; FAR's rows are padded
    to a multiple of FAR_N). Every block starts on a multiple of its width, as `_key_block` tells the compiler."""
    tl.static_assert(FAR_N % BLOCK_N == 0, "a wide far block is a whole number of key blocks")
    if KIND == _FAR_RIGHT:
        mid = start + (end - start) // FAR_N * FAR_N
        wide_lo, wide_hi, narrow_lo, narrow_hi = start, mid, mid, end
    else:
        mid = tl.minimum(tl.cdiv(start, FAR_N) * FAR_N, end)
        wide_lo, wide_hi, narrow_lo, narrow_hi = mid, end, start, mid
    return wide_lo, wide_hi, narrow_lo, narrow_hi


@triton.jit
def _fwd_blocks(
    acc, m_i, l_i, start, end, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_d,
    K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r, log2_scale, PQ, PK,
    LOG2_BAND, col_step, seed, bh, DROP_T,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, IJ: tl.constexpr,
    SKEW: tl.constexpr, DIST: tl.constexpr, HEAD_DIM: tl.constexpr, WT: tl.constexpr, DROPOUT: tl.constexpr,
    KIND: tl.constexpr,
):  # fmt: skip
    """The forward's online softmax over the key blocks of BLOCK_N keys from ``start`` (a multiple of BLOCK_N)
    to ``end`` (tiles of one KIND)."""
    for start_n in range(start, end, BLOCK_N):
        k, v, s, allowed, kpos, far_left, far_right = _key_block(
            start_n, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_d,
            K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r, log2_scale, PQ, PK,
            LOG2_BAND, col_step,
            BLOCK_M, BLOCK_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT, KIND,
        )  # fmt: skip
        # online softmax; a row that has seen no visible key yet keeps m = -inf (and p = 0, never NaN)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)  # the normaliser counts dropped pairs too
        if DROPOUT:
            # a product with the mask as 0 / 1, not a select on it: with SKEW, Triton (3.6, 3.9) moves the
            # boolean mask between layouts through shared memory, which cannot hold 1-bit elements (the compile
            # fails); the float mask moves
            p = p * _keep(seed, bh, offs_m, start_n, DROP_T, BLOCK_M, BLOCK_N).to(tl.float32)
        acc = acc * alpha[:, None] + _mm(p.to(v.dtype), v, PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _fwd_keys(
    acc, m_i, l_i, start, end, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_d,
    K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r, log2_scale, PQ, PK,
    LOG2_BAND, col_step, seed, bh, DROP_T,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FAR_N: tl.constexpr, HAS_ROW: tl.constexpr,
    HAS_COL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, CAUSAL: tl.constexpr,
    PREC: tl.constexpr, IJ: tl.constexpr, SKEW: tl.constexpr, DIST: tl.constexpr, HEAD_DIM: tl.constexpr,
    WT: tl.constexpr, DROPOUT: tl.constexpr, KIND: tl.constexpr,
):  # fmt: skip
    """The forward's online softmax over the key blocks from ``start`` to ``end`` (tiles of one KIND). Far runs
    take blocks of FAR_N keys where FAR_N > BLOCK_N (`triton_backend.FORWARD_FAR_KEYS`), split by
    `_wide_and_narrow`. A far tile costs what plain attention costs, and wide ones spread each step's fixed work
    (the online softmax's rescale of the accumulator, the row reductions, the loop's own) over more keys; near
    tiles keep BLOCK_N, which the near band's loads and registers set."""
    narrow_lo, narrow_hi = start, end
    if FAR_N != BLOCK_N and (KIND == _FAR_RIGHT or KIND == _FAR_LEFT):
        wide_lo, wide_hi, narrow_lo, narrow_hi = _wide_and_narrow(start, end, BLOCK_N, FAR_N, KIND)
        acc, m_i, l_i = _fwd_blocks(
            acc, m_i, l_i, wide_lo, wide_hi, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in,
            start_m, offs_d, K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r,
            log2_scale, PQ, PK, LOG2_BAND, col_step, seed, bh, DROP_T,
            BLOCK_M, FAR_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT,
            DROPOUT, KIND,
        )  # fmt: skip
    acc, m_i, l_i = _fwd_blocks(
        acc, m_i, l_i, narrow_lo, narrow_hi, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in,
        start_m, offs_d, K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r,
        log2_scale, PQ, PK, LOG2_BAND, col_step, seed, bh, DROP_T,
        BLOCK_M, BLOCK_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT,
        DROPOUT, KIND,
    )  # fmt: skip
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["DROP_T"])
def _fwd_kernel(
    Q,
    K,
    V,
    ROW,
    COL,
    FAR,
    LUT,
    PQ,
    PK,
    QPOS,
    KPOS,
    QSEG,
    KSEG,
    KMASK,
    KV_LO,
    KV_HI,
    OUT,
    LSE,
    SQB,
    SQH,
    SQN,
    SKB,
    SKH,
    SKN,
    H,
    B,
    NQ,
    NK,
    R,
    LOG2_BAND,
    SAT,
    TR,
    scale,
    SEED,
    DROP_T,
    drop_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_ROW: tl.constexpr,
    HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_KMASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
    IJ: tl.constexpr,
    DROPOUT: tl.constexpr,
    SKEW: tl.constexpr,
    DIST: tl.constexpr,
    WT: tl.constexpr,
    FAR_TILES: tl.constexpr,
    EDGES: tl.constexpr,
    FAR_N: tl.constexpr,
):
    pid_m, bh = _block_and_head(NQ, BLOCK_M)
    b = bh // H
    # 64-bit offsets once per program, to this (b, h) or b; 32-bit offsets inside
    q_off = bh.to(tl.int64) * NQ
    q_base = b.to(tl.int64) * SQB + (bh % H).to(tl.int64) * SQH  # this (b, h)'s rows of the query side
    k_base = b.to(tl.int64) * SKB + (bh % H).to(tl.int64) * SKH  # and of the key side
    Q += q_base
    OUT += q_base
    LSE += q_off
    ROW += _table_offset(bh, H, B, NQ, R, LOG2_BAND, DIST)
    K += k_base
    V += k_base
    COL += _table_offset(bh, H, B, NK, R, LOG2_BAND, DIST)
    FARL, FARR = _far_rows(FAR, bh, H, B, NK)
    QPOS += b * NQ
    QSEG += b * NQ
    KV_LO += b * NQ
    KV_HI += b * NQ
    KPOS += b * NK
    KSEG += b * NK
    KMASK += b * NK
    PQ += (bh % H) * TR * HEAD_DIM  # this head's (TR, D) position tables
    PK += (bh % H) * TR * HEAD_DIM

    if DIST:  # to the band of this program's query block
        ROW += _band_shift(pid_m * BLOCK_M, LOG2_BAND, _band_step(NQ, B, R, LOG2_BAND))
    col_step = _band_step(NK, B, R, LOG2_BAND)
    end_l, end_r = _ends(LUT, SAT, R, SKEW, DIST)
    offs_m, offs_d, m_in, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r = _query_block(
        Q, QPOS, QSEG, ROW, pid_m, NQ, R, SQN, end_l, end_r, HEAD_DIM, BLOCK_M, HAS_ROW, HAS_SEG, IJ, DIST
    )
    # key blocks any row of this block may see (whole sequence, causal prefix, packed segment)
    lo = tl.min(tl.load(KV_LO + offs_m, mask=m_in, other=_BIG), 0)
    hi = tl.max(tl.load(KV_HI + offs_m, mask=m_in, other=0), 0)
    # a multiple of the widest block a run starts with (`_fwd_keys`); the keys below the block's own ``lo``
    # are hidden from all its rows (masked keys or other segments), so the tiles that visit them add nothing
    lo = (lo // FAR_N) * FAR_N

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)  # once per program (see the module docstring)
    start_m = pid_m * BLOCK_M
    log2_scale = scale * _LOG2E  # the scores in base 2 (see the module docstring)
    # at distance i - j three runs: far right (keys well before), near, far left
    kinds, bounds = _runs(
        start_m, lo, hi, SAT, BLOCK_M, BLOCK_N, IJ and (HAS_ROW or HAS_COL), _FAR_RIGHT, _FAR_LEFT, FAR_TILES,
        EDGES and DIST,
    )  # fmt: skip
    for run in tl.static_range(len(kinds)):
        acc, m_i, l_i = _fwd_keys(
            acc, m_i, l_i, bounds[run], bounds[run + 1], q, qpos, qpos_min, qpos_max, qseg, row_l, row_r,
            offs_m, m_in, start_m, offs_d,
            K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r, log2_scale, PQ, PK,
            LOG2_BAND, col_step, seed, bh, DROP_T,
            BLOCK_M, BLOCK_N, FAR_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM,
            WT, DROPOUT, kinds[run],
        )  # fmt: skip

    visible = l_i > 0.0
    if DROPOUT:
        acc *= drop_scale
    out = acc / tl.where(visible, l_i, 1.0)[:, None]  # rows with no visible key: zeros
    out_ptrs = offs_m[:, None] * SQN + offs_d[None, :]
    tl.store(OUT + out_ptrs, out.to(OUT.dtype.element_ty), mask=m_in[:, None])
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    lse = tl.where(visible, m_safe + tl.log2(tl.where(visible, l_i, 1.0)), float("inf"))  # base 2
    tl.store(LSE + offs_m, lse, mask=m_in)


@triton.jit
def _dq_blocks(
    dq, far_l, far_r, start, end, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_d,
    do, lse, dlt, K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, DQ_DIST, NK, R, SAT, DW, SKN, end_l, end_r,
    log2_scale, PQ, PK, LOG2_BAND, col_step, seed, bh, DROP_T, drop_scale, gsat, goff,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, IJ: tl.constexpr,
    SKEW: tl.constexpr, DIST: tl.constexpr, HEAD_DIM: tl.constexpr, WT: tl.constexpr, DROPOUT: tl.constexpr,
    KIND: tl.constexpr, GRAD_BANDS: tl.constexpr,
):  # fmt: skip
    """dQ's content part and the rows' table gradients over the key blocks of BLOCK_N keys from ``start`` (a
    multiple of BLOCK_N) to ``end`` (tiles of one KIND). ``gsat``, ``goff``: the rows' gradient cells
    (`_grad_rows`)."""
    for start_n in range(start, end, BLOCK_N):
        k, v, s, allowed, kpos, far_left, far_right = _key_block(
            start_n, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_d,
            K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, NK, R, SAT, SKN, end_l, end_r, log2_scale, PQ, PK,
            LOG2_BAND, col_step,
            BLOCK_M, BLOCK_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT, KIND,
        )  # fmt: skip
        p = tl.exp2(s - lse[:, None])  # hidden pairs and empty rows: exp2(-inf) = 0
        dp = _mm(do, tl.trans(v), PREC)
        if DROPOUT:  # d loss / d P through the dropped, rescaled probabilities
            dp = tl.where(_keep(seed, bh, offs_m, start_n, DROP_T, BLOCK_M, BLOCK_N), dp * drop_scale, 0.0)
        ds = p * (dp - dlt[:, None])  # d loss / d s, zero on hidden pairs
        dq += _mm(ds.to(k.dtype), k, PREC)
        if HAS_ROW:
            far_l, far_r = _table_grad(
                DQ_DIST, offs_m, m_in, ds, allowed, qpos, kpos, far_left, far_right, far_l, far_r, gsat, goff,
                DW, 1, IJ, KIND, GRAD_BANDS,
            )  # fmt: skip
    return dq, far_l, far_r


@triton.jit
def _dq_keys(
    dq, far_l, far_r, start, end, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_d,
    do, lse, dlt, K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, DQ_DIST, NK, R, SAT, DW, SKN, end_l, end_r,
    log2_scale, PQ, PK, LOG2_BAND, col_step, seed, bh, DROP_T, drop_scale, gsat, goff,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FAR_N: tl.constexpr, HAS_ROW: tl.constexpr,
    HAS_COL: tl.constexpr, HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, CAUSAL: tl.constexpr,
    PREC: tl.constexpr, IJ: tl.constexpr, SKEW: tl.constexpr, DIST: tl.constexpr, HEAD_DIM: tl.constexpr,
    WT: tl.constexpr, DROPOUT: tl.constexpr, KIND: tl.constexpr, GRAD_BANDS: tl.constexpr,
):  # fmt: skip
    """`_dq_blocks` over the key blocks from ``start`` to ``end`` (tiles of one KIND), far runs in blocks of
    FAR_N keys where FAR_N > BLOCK_N (`triton_backend.DQ_FAR_KEYS`; split as the forward's, `_wide_and_narrow`).
    A far tile of dQ is plain attention's backward plus a row sum of dS (`_table_grad`): wide ones spread a
    step's fixed work (the loop's own, the K and V pointers, the row sums' reductions) over more keys."""
    narrow_lo, narrow_hi = start, end
    if FAR_N != BLOCK_N and (KIND == _FAR_RIGHT or KIND == _FAR_LEFT):
        wide_lo, wide_hi, narrow_lo, narrow_hi = _wide_and_narrow(start, end, BLOCK_N, FAR_N, KIND)
        dq, far_l, far_r = _dq_blocks(
            dq, far_l, far_r, wide_lo, wide_hi, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in,
            start_m, offs_d, do, lse, dlt, K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, DQ_DIST, NK, R,
            SAT, DW, SKN, end_l, end_r, log2_scale, PQ, PK, LOG2_BAND, col_step, seed, bh, DROP_T, drop_scale,
            gsat, goff,
            BLOCK_M, FAR_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT,
            DROPOUT, KIND, GRAD_BANDS,
        )  # fmt: skip
    dq, far_l, far_r = _dq_blocks(
        dq, far_l, far_r, narrow_lo, narrow_hi, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in,
        start_m, offs_d, do, lse, dlt, K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, DQ_DIST, NK, R,
        SAT, DW, SKN, end_l, end_r, log2_scale, PQ, PK, LOG2_BAND, col_step, seed, bh, DROP_T, drop_scale,
        gsat, goff,
        BLOCK_M, BLOCK_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT,
        DROPOUT, KIND, GRAD_BANDS,
    )  # fmt: skip
    return dq, far_l, far_r


@triton.jit(do_not_specialize=["DROP_T"])
def _dq_kernel(
    Q,
    K,
    V,
    OUT,
    DO,
    LSE,
    DELTA,
    ROW,
    COL,
    FAR,
    LUT,
    PQ,
    PK,
    QPOS,
    KPOS,
    QSEG,
    KSEG,
    KMASK,
    KV_LO,
    KV_HI,
    DQ,
    DQ_DIST,
    SQB,
    SQH,
    SQN,
    SKB,
    SKH,
    SKN,
    H,
    B,
    NQ,
    NK,
    R,
    LOG2_BAND,
    SAT,
    DW,
    TR,
    scale,
    SEED,
    DROP_T,
    drop_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_ROW: tl.constexpr,
    HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_KMASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
    IJ: tl.constexpr,
    DROPOUT: tl.constexpr,
    SKEW: tl.constexpr,
    DIST: tl.constexpr,
    WT: tl.constexpr,
    FAR_TILES: tl.constexpr,
    GRAD_BANDS: tl.constexpr,
    FAR_N: tl.constexpr,
):
    """One program per query block: DELTA (dO·O per row), dQ (content part) and, if ROW is used, dS stored into
    DQ_DIST."""
    pid_m, bh = _block_and_head(NQ, BLOCK_M)
    b = bh // H
    q_off = bh.to(tl.int64) * NQ
    q_base = b.to(tl.int64) * SQB + (bh % H).to(tl.int64) * SQH  # this (b, h)'s rows of the query side
    k_base = b.to(tl.int64) * SKB + (bh % H).to(tl.int64) * SKH  # and of the key side
    Q += q_base
    OUT += q_base
    DO += q_base
    DQ += q_base
    LSE += q_off
    DELTA += q_off
    ROW += _table_offset(bh, H, B, NQ, R, LOG2_BAND, DIST)
    q_grad, gsat, goff, first, last, ends = _grad_rows(
        bh, H, B, NQ, SAT, DW, LOG2_BAND, pid_m * BLOCK_M, DIST, GRAD_BANDS
    )
    DQ_DIST += q_grad
    K += k_base
    V += k_base
    COL += _table_offset(bh, H, B, NK, R, LOG2_BAND, DIST)
    FARL, FARR = _far_rows(FAR, bh, H, B, NK)
    QPOS += b * NQ
    QSEG += b * NQ
    KV_LO += b * NQ
    KV_HI += b * NQ
    KPOS += b * NK
    KSEG += b * NK
    KMASK += b * NK
    PQ += (bh % H) * TR * HEAD_DIM
    PK += (bh % H) * TR * HEAD_DIM

    if DIST:  # to the band of this program's query block
        ROW += _band_shift(pid_m * BLOCK_M, LOG2_BAND, _band_step(NQ, B, R, LOG2_BAND))
    col_step = _band_step(NK, B, R, LOG2_BAND)
    end_l, end_r = _ends(LUT, SAT, R, SKEW, DIST)
    offs_m, offs_d, m_in, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r = _query_block(
        Q, QPOS, QSEG, ROW, pid_m, NQ, R, SQN, end_l, end_r, HEAD_DIM, BLOCK_M, HAS_ROW, HAS_SEG, IJ, DIST
    )
    q_ptrs = offs_m[:, None] * SQN + offs_d[None, :]
    do = tl.load(DO + q_ptrs, mask=m_in[:, None], other=0.0)
    lse = tl.load(LSE + offs_m, mask=m_in, other=float("inf"))
    # rowsum(P ∘ dP) = dO·O, computed here for these rows and stored for the dK/dV kernel, launched after this one
    o = tl.load(OUT + q_ptrs, mask=m_in[:, None], other=0.0)
    dlt = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(DELTA + offs_m, dlt, mask=m_in)
    lo = tl.min(tl.load(KV_LO + offs_m, mask=m_in, other=_BIG), 0)
    hi = tl.max(tl.load(KV_HI + offs_m, mask=m_in, other=0), 0)
    lo = (lo // FAR_N) * FAR_N  # as the forward's (`_wide_and_narrow`)
    if HAS_ROW and IJ:
        # before the loop (its cells are disjoint from the loop's): after it, lo and hi would stay live through
        # the loop, registers the skewed kernels are short of (the skewed dK/dV at head dim 128 spilled)
        z_lo, z_hi = _stored_partners(
            pid_m * BLOCK_M, lo, hi, SAT, BLOCK_M, BLOCK_N, GRAD_BANDS and FAR_TILES
        )
        _zero_unvisited(DQ_DIST, pid_m * BLOCK_M, NQ, z_lo, z_hi, goff, first, last, DW, BLOCK_M, BLOCK_N)

    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    far_l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    far_r = tl.zeros((BLOCK_M,), dtype=tl.float32)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)  # once per program (see the module docstring)
    start_m = pid_m * BLOCK_M
    log2_scale = scale * _LOG2E
    # three runs, as in the forward
    kinds, bounds = _runs(
        start_m, lo, hi, SAT, BLOCK_M, BLOCK_N, IJ and (HAS_ROW or HAS_COL), _FAR_RIGHT, _FAR_LEFT, FAR_TILES,
        False,
    )  # fmt: skip
    for run in tl.static_range(len(kinds)):
        dq, far_l, far_r = _dq_keys(
            dq, far_l, far_r, bounds[run], bounds[run + 1], q, qpos, qpos_min, qpos_max, qseg, row_l, row_r,
            offs_m, m_in, start_m, offs_d, do, lse, dlt,
            K, V, ROW, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, DQ_DIST, NK, R, SAT, DW, SKN, end_l, end_r,
            log2_scale, PQ, PK, LOG2_BAND, col_step, seed, bh, DROP_T, drop_scale, gsat, goff,
            BLOCK_M, BLOCK_N, FAR_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM,
            WT, DROPOUT, kinds[run], GRAD_BANDS,
        )  # fmt: skip
    tl.store(DQ + q_ptrs, dq * scale, mask=m_in[:, None])
    if HAS_ROW:
        # a query row's cells run by j - i: its right side (i - j >= SAT) is cell 0 (none in bands: `_grad_rows`)
        _store_row_ends(DQ_DIST, offs_m, offs_m < ends, far_r, far_l, goff, DW, BLOCK_M)


@triton.jit
def _dkv_queries(
    dk, dv, far_l, far_r, start, end, k, v, offs_n, n_in, start_n, offs_d,
    Q, DO, LSE, DELTA, ROW, COL, FARL, FARR, LUT, QPOS, KPOS, QSEG, KSEG, KMASK, DK_DIST, NQ, R, SAT, DW, SQN,
    end_l, end_r, log2_scale, PQ, PK, LOG2_BAND, row_step, seed, bh, DROP_T, drop_scale, gsat, goff,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROW: tl.constexpr, HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_KMASK: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, IJ: tl.constexpr,
    SKEW: tl.constexpr, DIST: tl.constexpr, HEAD_DIM: tl.constexpr, WT: tl.constexpr, DROPOUT: tl.constexpr,
    KIND: tl.constexpr, GRAD_BANDS: tl.constexpr,
):  # fmt: skip
    """dK's content part, dV and the columns' table gradients over the query blocks from ``start`` to ``end``
    (tiles of one KIND). ``row_step``: ROW's `_band_step`; ``gsat``, ``goff``: the columns' gradient cells
    (`_grad_rows`)."""
    # a far run's dS, summed over the queries at its end
    far_ds = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start_m in range(start, end, BLOCK_M):
        rows = ROW
        if DIST and not (
            KIND == _FAR_LEFT or KIND == _FAR_RIGHT
        ):  # to the query block's band (far: no bands)
            rows += _band_shift(start_m, LOG2_BAND, row_step)
        offs_m, offs_d, m_in, q, qpos, qpos_min, qpos_max, qseg, row_l, row_r = _query_block(
            Q, QPOS, QSEG, rows, start_m // BLOCK_M, NQ, R, SQN, end_l, end_r,
            HEAD_DIM, BLOCK_M, HAS_ROW, HAS_SEG, IJ, DIST,
        )  # fmt: skip
        do = tl.load(DO + (offs_m[:, None] * SQN + offs_d[None, :]), mask=m_in[:, None], other=0.0)
        lse = tl.load(LSE + offs_m, mask=m_in, other=float("inf"))
        dlt = tl.load(DELTA + offs_m, mask=m_in, other=0.0)
        s, allowed, kpos, far_left, far_right = _tile(
            q, k, qpos, qpos_min, qpos_max, qseg, row_l, row_r, offs_m, m_in, start_m, offs_n, n_in, start_n,
            rows, COL, FARL, FARR, LUT, KPOS, KSEG, KMASK, R, SAT, end_l, end_r, log2_scale, PQ, PK,
            BLOCK_M, BLOCK_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT, KIND,
            True,
        )  # fmt: skip
        p = tl.exp2(s - lse[:, None])
        dp = _mm(do, tl.trans(v), PREC)
        if DROPOUT:
            keep = _keep(seed, bh, offs_m, start_n, DROP_T, BLOCK_M, BLOCK_N)
            dv += _mm(tl.trans(tl.where(keep, p * drop_scale, 0.0).to(do.dtype)), do, PREC)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        else:
            dv += _mm(tl.trans(p.to(do.dtype)), do, PREC)
        ds = p * (dp - dlt[:, None])
        dk += _mm(tl.trans(ds.to(q.dtype)), q, PREC)
        if HAS_COL:
            if KIND == _FAR_LEFT or KIND == _FAR_RIGHT:  # known at compile time
                # one table entry per key for the whole run: an addition per element here, and one sum over
                # the queries when the run ends. A sum per tile (`_table_grad`) crosses the warps, which split
                # the queries: shuffles and barriers in the loop that dominates long inputs
                far_ds += ds
            else:
                far_l, far_r = _table_grad(
                    DK_DIST, offs_n, n_in, ds, allowed, qpos, kpos, far_left, far_right, far_l, far_r, gsat, goff,
                    DW, 0, IJ, KIND, GRAD_BANDS,
                )  # fmt: skip
    if HAS_COL:
        if KIND == _FAR_LEFT:
            far_l += tl.sum(far_ds, 0)
        elif KIND == _FAR_RIGHT:
            far_r += tl.sum(far_ds, 0)
    return dk, dv, far_l, far_r


@triton.jit(do_not_specialize=["DROP_T"])
def _dkv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    ROW,
    COL,
    FAR,
    LUT,
    PQ,
    PK,
    QPOS,
    KPOS,
    QSEG,
    KSEG,
    KMASK,
    Q_LO,
    Q_HI,
    DK,
    DV,
    DK_DIST,
    SQB,
    SQH,
    SQN,
    SKB,
    SKH,
    SKN,
    H,
    B,
    NQ,
    NK,
    R,
    LOG2_BAND,
    SAT,
    DW,
    TR,
    scale,
    SEED,
    DROP_T,
    drop_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_ROW: tl.constexpr,
    HAS_COL: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_KMASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    PREC: tl.constexpr,
    IJ: tl.constexpr,
    DROPOUT: tl.constexpr,
    SKEW: tl.constexpr,
    DIST: tl.constexpr,
    WT: tl.constexpr,
    FAR_TILES: tl.constexpr,
    GRAD_BANDS: tl.constexpr,
):
    """One program per key block: dK (content part), dV and, if COL is used, dS stored into DK_DIST."""
    pid_n, bh = _block_and_head(NK, BLOCK_N)
    b = bh // H
    q_off = bh.to(tl.int64) * NQ
    q_base = b.to(tl.int64) * SQB + (bh % H).to(tl.int64) * SQH  # this (b, h)'s rows of the query side
    k_base = b.to(tl.int64) * SKB + (bh % H).to(tl.int64) * SKH  # and of the key side
    Q += q_base
    DO += q_base
    LSE += q_off
    DELTA += q_off
    ROW += _table_offset(bh, H, B, NQ, R, LOG2_BAND, DIST)
    K += k_base
    V += k_base
    DK += k_base
    DV += k_base
    COL += _table_offset(bh, H, B, NK, R, LOG2_BAND, DIST)
    FARL, FARR = _far_rows(FAR, bh, H, B, NK)
    k_grad, gsat, goff, first, last, ends = _grad_rows(
        bh, H, B, NK, SAT, DW, LOG2_BAND, pid_n * BLOCK_N, DIST, GRAD_BANDS
    )
    DK_DIST += k_grad
    QPOS += b * NQ
    QSEG += b * NQ
    KPOS += b * NK
    KSEG += b * NK
    KMASK += b * NK
    Q_LO += b * NK
    Q_HI += b * NK
    PQ += (bh % H) * TR * HEAD_DIM
    PK += (bh % H) * TR * HEAD_DIM

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    n_in = offs_n < NK
    kv_ptrs = offs_n[:, None] * SKN + offs_d[None, :]
    k = tl.load(K + kv_ptrs, mask=n_in[:, None], other=0.0)
    v = tl.load(V + kv_ptrs, mask=n_in[:, None], other=0.0)
    lo = tl.min(tl.load(Q_LO + offs_n, mask=n_in, other=_BIG), 0)
    hi = tl.max(tl.load(Q_HI + offs_n, mask=n_in, other=0), 0)
    lo = (lo // BLOCK_M) * BLOCK_M
    if HAS_COL and IJ:  # before the loop, as in the dQ kernel
        z_lo, z_hi = _stored_partners(
            pid_n * BLOCK_N, lo, hi, SAT, BLOCK_N, BLOCK_M, GRAD_BANDS and FAR_TILES
        )
        _zero_unvisited(DK_DIST, pid_n * BLOCK_N, NK, z_lo, z_hi, goff, first, last, DW, BLOCK_N, BLOCK_M)

    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    far_l = tl.zeros((BLOCK_N,), dtype=tl.float32)
    far_r = tl.zeros((BLOCK_N,), dtype=tl.float32)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)  # once per program (see the module docstring)
    if DIST:  # to the band of this program's key block
        COL += _band_shift(pid_n * BLOCK_N, LOG2_BAND, _band_step(NK, B, R, LOG2_BAND))
    row_step = _band_step(NQ, B, R, LOG2_BAND)
    end_l, end_r = _ends(LUT, SAT, R, SKEW, DIST)
    start_n = pid_n * BLOCK_N
    log2_scale = scale * _LOG2E
    # at distance i - j three runs: far left (queries well before), near, far right
    kinds, bounds = _runs(
        start_n, lo, hi, SAT, BLOCK_N, BLOCK_M, IJ and (HAS_ROW or HAS_COL), _FAR_LEFT, _FAR_RIGHT, FAR_TILES,
        False,
    )  # fmt: skip
    for run in tl.static_range(len(kinds)):
        dk, dv, far_l, far_r = _dkv_queries(
            dk, dv, far_l, far_r, bounds[run], bounds[run + 1], k, v, offs_n, n_in, start_n, offs_d,
            Q, DO, LSE, DELTA, ROW, COL, FARL, FARR, LUT, QPOS, KPOS, QSEG, KSEG, KMASK, DK_DIST, NQ, R, SAT, DW, SQN,
            end_l, end_r, log2_scale, PQ, PK, LOG2_BAND, row_step, seed, bh, DROP_T, drop_scale, gsat, goff,
            BLOCK_M, BLOCK_N, HAS_ROW, HAS_COL, HAS_SEG, HAS_KMASK, CAUSAL, PREC, IJ, SKEW, DIST, HEAD_DIM, WT,
            DROPOUT, kinds[run], GRAD_BANDS,
        )  # fmt: skip
    tl.store(DK + kv_ptrs, dk * scale, mask=n_in[:, None])
    tl.store(DV + kv_ptrs, dv.to(DV.dtype.element_ty), mask=n_in[:, None])  # final: in the inputs' dtype
    if HAS_COL:
        _store_row_ends(DK_DIST, offs_n, offs_n < ends, far_l, far_r, goff, DW, BLOCK_N)
