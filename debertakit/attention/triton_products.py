"""The distance tables' product as one Triton kernel (`triton_backend._distance_tables`, the "distance" road).

A distance table holds, per head and band, the products ``alpha · x_i · T[cells[e]]`` of the band's rows of q
(or k) with the position-table rows its cells stand for, at a row stride of R + 1 cells: the stride that makes
pair (i, j) land at ``i·R + j`` from row 0's cell of distance 0, so that the attention kernels read a near tile as
one strided tile (see `triton_kernels`). R is a multiple of 16, so that stride is odd. cuBLAS's tensor-core kernels
need 16-byte aligned row strides; with an odd one it ran the product on a pre-Hopper kernel for one-element
alignment (``cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_tn_align1``): 1.62 ms for the two tables at N = 2048
and 8192 on an H100, 1.69 ms on an H200 (batch·N = 16384, 12 heads, d 64; ``benchmarks/attention_gpu.py
--sections profile``, `benchmarks/results/attention_gpu_h100.json`, `attention_gpu_h200.json`), twice that in a
training step (the backward builds the tables again).

This kernel writes the table where it lies, at its odd stride, and reads what cuBLAS was given as copies in
place: q / k through their strides (no copy into band-major order, no zero rows for the padding: rows past a
batch row's N tokens are stored as zeros) and the position-table rows through ``cells`` (no gathered copy of the
table). One program computes BLOCK_M rows by BLOCK_N cells of one (head, band): a single dot over the head dim,
scaled by ``alpha`` in float32 and rounded once to the table's dtype, as the matmul did.

The stores. Row m's cell e lies at ``m·(R + 1) + e``, which is ``m + e`` modulo 16: rows start on every element
in turn. A block of consecutive rows and the same cells (the first version of this kernel) therefore stored
element by element, each with its own 64-bit address: on an H100 the two tables took 0.951 ms at N = 2048 and
8192, 1.0 TB/s of the memory's 3.35, with issue slots 51–63% busy and the stalls on integer multiply-adds
(`benchmarks/results/attention_ncu_h100.md`). Here a program's rows instead share their residue s modulo VEC (the
elements in 16 bytes): rows ``group + s + VEC·i``, each starting at cell ``pid_n·BLOCK_N - s``. Every row's
first element then lies at ``m·R + group + VEC·i + pid_n·BLOCK_N`` from the table's start, a multiple of VEC
that Triton can see, and the block's inner tiles (no cell outside 0 … R) store 16 bytes at a time (a block
reaches up to VEC - 1 cells left of 0, so there are ``cdiv(R + VEC, BLOCK_N)`` blocks a row). The column blocks
run fastest in the launch grid, so that the programs writing one row's cells run together.

The rows' ends (``WRAP``, `triton_backend.PRODUCT_EDGES` "wrap"). The first and last block of a row reach cells
outside it. Masking those cells leaves a mask that changes within 16 bytes, so those blocks stored element by
element ("masked"): 10% of the blocks at N = 2048, 20% at 512. But the table has no gaps: row m's cell -1 is
row m - 1's cell R. So the flat table is cut at multiples of VEC instead: row m (residue s) owns its block
columns s + e below R, or below R + VEC for the last residue. Those are cells -s … R - s - 1, or -s … R, and
the next row's part starts where that ends. Every cut is a multiple of VEC from the table's start, so each
block's store mask is constant along 16 bytes. A row's first block computes its cells -s … -1 for the row they
belong to: the products of row m - 1 with the table rows of cells R + 1 - s … R. Row m - 1 is token - 1 of
the same batch row, as rows per band are a multiple of VEC. These products go into the same accumulator: each
column's table rows are zeros in one of the two dots. No cell is written twice, and each is the same dot over
the head dim that the row's own program would compute.

Tensor-memory stores (``TMA``, `triton_backend.PRODUCT_STORES` "tma", Hopper and later). A pointer store
computes an address per 16 bytes, and integer work is much of what the kernel waits on: at N = 512 on an H100
ncu put 21% of its stall samples on IMAD (code of 9b811db, `benchmarks/results/attention_ncu_h100_9b811db.md`).
The rows of one residue s are one strided
2-D tensor: row ``s + VEC·i`` at ``s·R + VEC·(R + 1)·i`` from the table's start, its cell e in column s + e,
and every stride a multiple of 16 bytes (R is a multiple of 16; (R + 1)·VEC elements are 16·(R + 1) bytes).
So the table is the 4-D tensor (head·band, residue, i, column) that ``OUT_DESC`` describes, and an inner block
is one box of it, [hb, s, group / VEC, pid_n·BLOCK_N], stored by the tensor-memory unit from shared memory in
one instruction; the descriptor's row count (M / VEC: M is a multiple of VEC) stops rows past M. The first and
last block of each row keep the pointer stores, as above: their cells outside 0 … R belong to the rows beside
theirs.

Row loops (``ROW_LOOP``, `triton_backend.PRODUCT_PROGRAMS` "rows"). A program of one block loads its rows of q /
k, the cells and the table rows, multiplies once and stores: nothing hides the loads' latency but other
programs, and the same ncu run put the top stall on waiting for global loads (long_scoreboard, 4.2 cycles per
issued instruction, 48% of issue slots busy). With ``ROW_LOOP`` a program takes a row block and runs over its
column blocks: its rows of q / k and their indices are computed and loaded once, and at two or more stages
the next block's cells and table rows load while this one is multiplied and stored (compiled for sm_90 the
loop's body is 368 instructions a block at 64×64 with three stages, 328 with two, against 672 for a whole
one-block program; d 64, bf16, Triton 3.9). On an H200 it was slower than one block a program.

Column loops (``COL_LOOP``, `triton_backend.PRODUCT_PROGRAMS` "columns"). The row loop gathers its cells' table
rows in every iteration: a load whose address waits on another (the cells'). But within a band every row meets
the same table rows in a column block. So here a program takes a column block and one residue s, gathers
those table rows once (and, with ``WRAP``, those of the cells -s … -1 that its first block computes for the
row before), and runs over ``GROUPS`` row blocks of that residue: the loop loads only rows of q / k, at
addresses computed from the loop index, which two or more stages fetch ahead (compiled for sm_90 the loop's
body is 425 instructions a block at 64×64 with three stages, 128 registers; d 64, bf16, Triton 3.9). The
default since an H200 timed it the fastest of the three (`triton_backend.PRODUCT_PROGRAMS`).

Both tables in one launch (``PAIR``, `triton_backend.PRODUCT_LAUNCHES` "one"). ROW is q's rows against Kr, COL
k's against Qr: the same work on other operands, at the same shapes where the two lengths agree. So the grid's
second axis runs over the (head, band) pairs of both, and a program of its second half takes k (X2), Qr (T2),
COL's cells (after ROW's in CELLS) and writes OFF2 elements further on, where the caller's one buffer holds COL
(`triton_backend._product_buffers`). A call then pays one launch, one allocation and one fill of zeros for
both tables, host time that a short input pays in every layer; the programs are those of two launches, and
compiled for sm_90 the column loop's body is the same (460 instructions at 64×256 w8 s3, bf16, d 64, Triton
3.9), with 8 more outside it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from debertakit.attention.triton_kernels import (
    _mm_add,
)  # acc + a @ b by PREC, as the attention kernels multiply


@triton.jit
def _distance_product_kernel(
    X,  # (H, B·N, D) rows per head: q (ROW) or k (COL), through strides, D contiguous
    T,  # (H, table rows, D) position table (Kr for ROW, Qr for COL), D contiguous
    CELLS,  # (BANDS, R + 1) int64: the table row each cell of a band's rows stands for
    OUT,  # (H·BANDS, M, R + 1) contiguous, M = B·LB: the table from its first cell
    OUT_DESC,  # with TMA: OUT as (H·BANDS, VEC, M / VEC, R + VEC) rows by residue (see above); else None
    alpha,
    stride_xh,
    stride_xr,
    stride_th,
    stride_tr,
    N,  # tokens per batch row
    LB,  # rows per band and batch row (with one band: the padded rows N')
    BANDS,
    R,  # cells per row less one, a multiple of 16; R + 1 is the output's row stride
    M,
    X2,  # with PAIR: k (COL's rows), as X is q, at X's strides
    T2,  # with PAIR: Qr, as T is Kr, at T's strides
    OFF2,  # with PAIR: where COL starts in OUT, a multiple of 16 elements
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VEC: tl.constexpr,  # elements in 16 bytes
    PREC: tl.constexpr,
    TMA: tl.constexpr,  # inner blocks stored through OUT_DESC
    ROW_LOOP: tl.constexpr,  # a program per row block, its column blocks in a loop (see below)
    WRAP: tl.constexpr,  # every cell stored 16 bytes at a time, the row ends by the rows they belong to (above)
    COL_LOOP: tl.constexpr = False,  # a program per column block and residue, its row blocks in a loop (see above)
    GROUPS: tl.constexpr = 1,  # with COL_LOOP: the row blocks of one residue a program runs over
    PAIR: tl.constexpr = False,  # both tables in one launch: the grid's second half builds COL (see above)
):
    # one axis for the row and column blocks, the column blocks fastest (the grid's second axis is short); with
    # ROW_LOOP one program per row block, which reads its rows of q / k once and runs over the row's column
    # blocks (the next block's cells and table rows loaded while this one is stored, at num_stages > 1)
    col_blocks = tl.cdiv(R + VEC, BLOCK_N)
    hb = tl.program_id(1)  # head · BANDS + band
    if PAIR:  # the second half of the grid's second axis: COL, from k, Qr and COL's cells, written at OFF2
        half = tl.num_programs(1) // 2
        second = hb >= half
        hb -= second * half
        X = tl.where(second, X2, X)
        T = tl.where(second, T2, T)
        CELLS += second * (BANDS * (R + 1))
        OUT += second.to(tl.int64) * OFF2
    h = hb // BANDS
    band = hb % BANDS
    d = tl.arange(0, D)
    if COL_LOOP:
        # (column block, residue, run of GROUPS row blocks) fastest to slowest: the programs writing the same
        # rows run together. The block's table rows are gathered once, the rows of q / k load per block (the
        # next block's while this one is multiplied and stored, at num_stages > 1)
        pid_n = tl.program_id(0) % col_blocks
        s = (tl.program_id(0) // col_blocks) % VEC
        run = tl.program_id(0) // (col_blocks * VEC)
        T += h.to(tl.int64) * stride_th
        CELLS += band * (R + 1)
        e = pid_n * BLOCK_N - s + tl.arange(0, BLOCK_N)
        t_prev = _table_rows(T, CELLS + (R + 1) + e, WRAP & (e < 0), stride_tr, d)  # (`_block`)
        t_cur = _table_rows(T, CELLS + e, (e >= 0) & (e <= R), stride_tr, d)
        blocks = tl.cdiv(M, VEC * BLOCK_M)
        for g in tl.range(run * GROUPS, tl.minimum(run * GROUPS + GROUPS, blocks)):
            x, xp, prev_in, group, m, step = _rows(X, h, band, s, g, stride_xh, stride_xr, N, LB, M, d,
                                                    BLOCK_M, VEC)  # fmt: skip
            _block(x, xp, prev_in, T, CELLS, OUT, OUT_DESC, alpha, stride_tr, R, M, hb, s, group, m, step, pid_n,
                   d, t_prev, t_cur, BLOCK_M, BLOCK_N, VEC, PREC, TMA, WRAP, True)  # fmt: skip
    else:
        pid_m = tl.program_id(0) if ROW_LOOP else tl.program_id(0) // col_blocks
        s = pid_m % VEC
        x, xp, prev_in, group, m, step = _rows(X, h, band, s, pid_m // VEC, stride_xh, stride_xr, N, LB, M, d,
                                                BLOCK_M, VEC)  # fmt: skip
        T += h.to(tl.int64) * stride_th
        CELLS += band * (R + 1)
        if ROW_LOOP:
            for pid_n in tl.range(0, col_blocks):
                _block(x, xp, prev_in, T, CELLS, OUT, OUT_DESC, alpha, stride_tr, R, M, hb, s, group, m, step,
                       pid_n, d, None, None, BLOCK_M, BLOCK_N, VEC, PREC, TMA, WRAP, False)  # fmt: skip
        else:
            _block(x, xp, prev_in, T, CELLS, OUT, OUT_DESC, alpha, stride_tr, R, M, hb, s, group, m, step,
                   tl.program_id(0) % col_blocks, d, None, None, BLOCK_M, BLOCK_N, VEC, PREC, TMA, WRAP,
                   False)  # fmt: skip


@triton.jit
def _rows(
    X, h, band, s, g, stride_xh, stride_xr, N, LB, M, d, BLOCK_M: tl.constexpr, VEC: tl.constexpr
):  # fmt: skip
    """Row block ``g`` of residue ``s``: its rows of q / k (BLOCK_M, D), and with WRAP's first column block in
    mind the pointers and mask of rows m - 1; (x, XP, prev_in, group, m, step)."""
    # the block's rows, all of residue s modulo VEC: m = group + s + VEC·i; row m is token band·LB + m % LB of
    # batch row m // LB
    group = g * (VEC * BLOCK_M)
    step = VEC * tl.arange(0, BLOCK_M)
    m = group + s + step
    token = band * LB + m % LB
    real = (m < M) & (token < N)  # rows past N (the padding up to whole bands / N') are zeros
    xs = (
        X
        + h.to(tl.int64) * stride_xh
        + ((m // LB) * N + token).to(tl.int64)[:, None] * stride_xr
        + d[None, :]
    )
    x = tl.load(xs, mask=real[:, None], other=0.0)  # (BLOCK_M, D)
    # with WRAP, rows m - 1 for the first column block when s > 0 (as LB is a multiple of VEC, row m - 1 is
    # token - 1 of the same batch row): loaded there, and only there
    return x, xs - stride_xr, (m <= M) & (token <= N), group, m, step


@triton.jit
def _block(
    x, XP, prev_in, T, CELLS, OUT, OUT_DESC, alpha, stride_tr, R, M, hb, s, group, m, step, pid_n, d, t_prev, t_cur,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr, PREC: tl.constexpr, TMA: tl.constexpr,
    WRAP: tl.constexpr, LOADED: tl.constexpr,
):  # fmt: skip
    """Column block ``pid_n`` of the rows ``m`` (residue ``s``, rows of q / k ``x``; ``XP``, ``prev_in``: the pointers
    and mask of rows m - 1): the products with the table rows its cells stand for (T and CELLS at the head's and the
    band's start), stored. With ``LOADED`` those table rows are given, ``t_prev`` for cells -s … -1 (zeros
    elsewhere) and ``t_cur`` for the row's own (`COL_LOOP`: gathered once for all the program's row blocks)."""
    # the block's cells, shifted by the residue, and the table rows they stand for
    first = pid_n * BLOCK_N - s
    j = tl.arange(0, BLOCK_N)
    e = first + j
    in_row = (e >= 0) & (e <= R)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if WRAP:
        if first < 0:  # cells -s … -1 are row m - 1's cells R + 1 - s … R: its products with those table rows
            if LOADED:
                t = t_prev
            else:
                t = _table_rows(T, CELLS + (R + 1) + e, e < 0, stride_tr, d)
            x_prev = tl.load(XP, mask=prev_in[:, None], other=0.0)
            acc = _mm_add(x_prev, tl.trans(t), acc, PREC)
    # into the same accumulator (one live in registers): each column's products are zeros in one of the two
    # dots (its table rows loaded as zeros), and adding zeros leaves a sum as it was
    if LOADED:
        t = t_cur
    else:
        t = _table_rows(T, CELLS + e, in_row, stride_tr, d)
    acc = _mm_add(x, tl.trans(t), acc, PREC)  # (BLOCK_M, BLOCK_N)
    # no cell outside the row (and so, R and BLOCK_N being multiples of 16, none in another row's part)
    whole = (first >= 0) & (first + BLOCK_N - 1 <= R)
    # with WRAP, the cells row m owns: columns s + e below R, or R + VEC for the last residue (s // (VEC - 1) = 1)
    if WRAP:
        owned = j < R + VEC * (s // (VEC - 1)) - pid_n * BLOCK_N
    else:
        owned = in_row
    acc = (acc * alpha).to(OUT.dtype.element_ty)
    # m·(R + 1) + e = m·R + (group + VEC·i) + pid_n·BLOCK_N + j: all but j multiples of VEC
    start = hb.to(tl.int64) * M * (R + 1) + group + pid_n * BLOCK_N
    out = OUT + start + (m.to(tl.int64) * R + step)[:, None] + j[None, :]
    rows_in = (m < M)[:, None]
    if TMA:  # decided at compile time: without it the kernel has no descriptor to name
        if whole:  # one box of rows of residue s (the descriptor's row count stops those past M)
            OUT_DESC.store([hb, s, group // VEC, pid_n * BLOCK_N], acc.reshape(1, 1, BLOCK_M, BLOCK_N))
        else:
            tl.store(out, acc, mask=rows_in & owned[None, :])
    elif WRAP:  # 16-byte stores: the mask is constant along VEC cells
        tl.store(out, acc, mask=rows_in & owned[None, :])
    elif whole:  # 16-byte stores
        tl.store(out, acc, mask=rows_in)
    else:
        tl.store(out, acc, mask=rows_in & in_row[None, :])


@triton.jit
def _table_rows(T, CELLS, cells_in, stride_tr, d):
    """(cells, D): the position-table rows that the cells at ``CELLS`` (those of ``cells_in``) stand for, zeros
    for the others."""
    rows = tl.load(CELLS, mask=cells_in, other=0)
    return tl.load(T + rows[:, None] * stride_tr + d[None, :], mask=cells_in[:, None], other=0.0)


# ------------------------------------------------------------------------------------------- the fold's product
@triton.jit
def _fold_product_kernel(
    DIST,  # (G, M, DW) a gradient buffer at an odd row stride DW ≡ 1 (mod 16): row m's cell c at m·DW + c
    T,  # (G, W, D) contiguous: the position-table row each of a row's W cells stands for
    GRAD,  # (B, H, N, D) float32 through strides: dQ or dK, D contiguous
    OUT,  # (B, H, N, D) through the same strides: GRAD + alpha · DIST @ T, in the inputs' dtype (may be GRAD)
    alpha,
    DW1,  # DW - 1, a multiple of 16
    GROUP,  # M·DW: one group's buffer
    stride_gb,
    stride_gh,
    stride_gn,
    N,  # tokens per batch row
    LB,  # rows per band and batch row, a multiple of 16 (with one band: the padded rows)
    BANDS,
    M,  # rows per group, B·LB
    W,
    DIST2,  # with PAIR: the second side's buffer (dK's, as DIST is dQ's), at DIST's shapes and strides
    T2,  # with PAIR: its table rows (Qr's, as T holds Kr's)
    GRAD2,  # with PAIR: dK, at GRAD's strides
    OUT2,  # with PAIR: where dK's sum goes
    D: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAIR: tl.constexpr = False,  # both sides in one launch: the grid's second half folds the second (below)
):
    """One program: BLOCK_M rows of one residue s modulo 8 (rows s + 8·i) of group g = (head, band), their
    product with the table rows over all W cells, added to GRAD and stored to OUT. Row m of a group is token
    band·LB + m mod LB of batch row m // LB (the tables' layout, (H, bands, B, LB, DW)); rows of padding tokens
    (at or past N) are not stored. A row s + 8·i is read from s cells before its first, 16-byte aligned
    (`_class_reads`). Column c of that read is the row's cell c - s; the table rows meet it through that shift,
    zeros outside 0 … W - 1 (the cells there are the rows beside it, or past the row's own). The column blocks
    run to W + 7 (no cell past the buffer: its last row, residue 7, M being a multiple of 8, ends at its cell
    W - 1); the whole blocks load under the row mask alone, 16 bytes at a time, the last one masked by column
    too. With PAIR the grid's second axis runs over both sides' groups, the second half folding DIST2 with T2
    into GRAD2 / OUT2 (`_side`)."""
    pid = tl.program_id(0)
    g = tl.program_id(1)
    if PAIR:
        g, second = _side(g)
        DIST = tl.where(second, DIST2, DIST)
        T = tl.where(second, T2, T)
        GRAD = tl.where(second, GRAD2, GRAD)
        OUT = tl.where(second, OUT2, OUT)
    s = pid % 8
    i = (pid // 8) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = s + 8 * i
    row_ok = rows < M
    base = DIST + _class_reads(g, GROUP, s, DW1, i)  # (BLOCK_M, 1): column 0 of each row's read
    dims = tl.arange(0, D)
    tab = T + g.to(tl.int64) * W * D + dims[None, :]
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    wide = W + 7  # columns read per row
    whole = wide // BLOCK_N * BLOCK_N
    for c0 in range(0, whole, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        x = tl.load(base + cols[None, :], mask=row_ok[:, None], other=0.0)
        acc = _fold_step(x, tab, cols - s, W, D, acc, PREC)
    if whole < wide:
        cols = whole + tl.arange(0, BLOCK_N)
        x = tl.load(base + cols[None, :], mask=row_ok[:, None] & (cols < wide)[None, :], other=0.0)
        acc = _fold_step(x, tab, cols - s, W, D, acc, PREC)
    h, band = g // BANDS, g % BANDS
    b = rows // LB
    token = band * LB + rows - b * LB
    ok = (row_ok & (token < N))[:, None]
    at = (
        h.to(tl.int64) * stride_gh
        + b.to(tl.int64)[:, None] * stride_gb
        + token.to(tl.int64)[:, None] * stride_gn
        + dims[None, :]
    )
    grad = tl.load(GRAD + at, mask=ok, other=0.0)
    tl.store(OUT + at, (grad + alpha * acc).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _side(g):
    """(group, second) of a program in a paired launch: the grid's second axis holds the first side's groups,
    then as many of the second's."""
    half = tl.num_programs(1) // 2
    second = g >= half
    return g - second * half, second


@triton.jit
def _class_reads(g, GROUP, s, DW1, i):
    """(BLOCK, 1) offsets, 64-bit, of column 0 of the reads of rows s + 8·i of group g in a buffer at the odd
    row stride DW1 + 1: s cells before each row's first, at s·(DW - 1) + 8·i·DW, a multiple of 8 elements (16
    bytes in bfloat16) that Triton can see, as `triton_backend._residue_rows` gives cuBLAS."""
    return g.to(tl.int64) * GROUP + s * DW1 + (8 * i).to(tl.int64)[:, None] * (DW1 + 1)


@triton.jit
def _fold_step(x, tab, cells, W, D: tl.constexpr, acc, PREC: tl.constexpr):
    """acc + x @ (the table rows of ``cells``, zero rows for cells outside 0 … W - 1)."""
    ok = (cells >= 0) & (cells < W)
    t = tl.load(tab + cells[:, None] * D, mask=ok[:, None], other=0.0)
    return _mm_add(x, t, acc, PREC)


# ------------------------------------------------------------------------------------------ the fold's sums
@triton.jit
def _fold_sums_kernel(
    DIST,  # (G, M, DW) a gradient buffer at an odd row stride DW ≡ 1 (mod 16), as `_fold_product_kernel` reads
    CONTENT,  # q (or k) rows, D contiguous: with BANDED (B, H, N, D) as they lie, else (G, M, D) in DIST's order
    PER_CLASS,  # (G, W + 7, 8, D) float32 contiguous (with PAIR 2·G): column c's sums over residue s at [g, c, s]
    DW1,  # DW - 1, a multiple of 16
    GROUP,  # M·DW: one group's buffer
    stride_cg,  # CONTENT's strides: with BANDED per head, else per group (one band: group g is head g)
    stride_cm,  # with BANDED per token, else per row
    stride_cb,  # with BANDED per batch row
    N,  # with BANDED: tokens per batch row
    LOG2_LB,  # with BANDED: log2 of the rows per band and batch row
    BANDS,
    M,  # rows per group (with BANDED: B·LB)
    W,
    DIST2,  # with PAIR: the second side's buffer (dK's, as DIST is dQ's), at DIST's shapes and strides
    CONTENT2,  # with PAIR: its content rows (k, as CONTENT is q), at CONTENT's strides
    D: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAIR: tl.constexpr = False,  # both sides in one launch: the grid's second half sums the second (below)
    BANDED: tl.constexpr = False,  # the content read where q / k lie, in bands (below)
):
    """One program: BLOCK_N columns of the rows of one residue s modulo 8 of group g = (head, band), read as
    `_fold_product_kernel` reads them (column c is the row's cell c - s), summed over those rows against their
    content rows: PER_CLASS[g, c, s] = Σ_i DIST[row s + 8·i, c - s] · CONTENT[row s + 8·i]. The classes are
    summed into cells after (`triton_backend._class_sums`: cell x is column x + s of class s), so nothing is
    summed by two programs. A whole column block loads under the row mask alone, 16 bytes at a time; the last,
    past W + 7, is masked by column too (a branch per program).

    With BANDED (the tables in bands of LB = 2**LOG2_LB rows) the content rows are read where q / k lie, in
    the buffer's row order: row m of group (h, band) is token band·LB + m mod LB of batch row m // LB (a shift
    and a mask: a division per row made the loop's body 40% longer, compiled for sm_90), rows of padding
    tokens (at or past N) zeros, as the buffer's are; no band-major copy of q / k. Without, one band, they are
    given in the buffer's order (q / k per head: a view where the projections' layout has one).

    With PAIR the grid's second axis runs over both sides' groups, the second half summing DIST2 against
    CONTENT2 into PER_CLASS's second half (`_side`)."""
    pid = tl.program_id(0)
    g = tl.program_id(1)
    sums = (
        g.to(tl.int64) * (W + 7) * 8 * D
    )  # this program's sums: the grid's second axis runs over PER_CLASS's
    if PAIR:
        g, second = _side(g)
        DIST = tl.where(second, DIST2, DIST)
        CONTENT = tl.where(second, CONTENT2, CONTENT)
    h, band = g // BANDS, g % BANDS
    s = pid % 8
    cols = (pid // 8) * BLOCK_N + tl.arange(0, BLOCK_N)
    wide = W + 7  # columns read per row
    content = CONTENT + h.to(tl.int64) * stride_cg + tl.arange(0, D)[None, :]
    if (pid // 8) * BLOCK_N + BLOCK_N <= wide:
        acc = _class_sums(
            DIST, g, GROUP, DW1, content, s, cols, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, False, BLOCK_M,
            BLOCK_N, D, PREC, BANDED,
        )  # fmt: skip
    else:
        acc = _class_sums(
            DIST, g, GROUP, DW1, content, s, cols, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, True, BLOCK_M,
            BLOCK_N, D, PREC, BANDED,
        )  # fmt: skip
    out = PER_CLASS + sums + (cols[:, None] * 8 + s) * D + tl.arange(0, D)[None, :]
    tl.store(out, acc, mask=(cols < wide)[:, None])


@triton.jit
def _class_sums(
    DIST, g, GROUP, DW1, content, s, cols, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, MASK_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, BANDED: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N, D) float32: the columns ``cols`` of class s's rows, summed against their content rows, in one
    loop over the class's rows (`_sums_step`, pipelined)."""
    acc = tl.zeros((BLOCK_N, D), dtype=tl.float32)
    for i0 in range(0, tl.cdiv(M, 8), BLOCK_M):
        acc = _sums_step(
            DIST, g, GROUP, DW1, content, i0, s, cols, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, MASK_COLS,
            acc, BLOCK_M, PREC, BANDED,
        )  # fmt: skip
    return acc


@triton.jit
def _sums_step(
    DIST, g, GROUP, DW1, content, i0, s, cols, stride_cm, stride_cb, N, LOG2_LB, band, M, wide,
    MASK_COLS: tl.constexpr, acc, BLOCK_M: tl.constexpr, PREC: tl.constexpr, BANDED: tl.constexpr,
):  # fmt: skip
    """acc + (BLOCK_M rows of residue s from i0 on, their columns ``cols``)ᵀ @ their content rows; with
    MASK_COLS the columns at or past ``wide`` are left out."""
    i = i0 + tl.arange(0, BLOCK_M)
    rows = s + 8 * i
    ok = rows < M
    mask = ok[:, None] & (cols < wide)[None, :] if MASK_COLS else ok[:, None]
    x = tl.load(DIST + _class_reads(g, GROUP, s, DW1, i) + cols[None, :], mask=mask, other=0.0)
    if BANDED:  # row m: token band·LB + m mod LB of batch row m // LB
        token = (band << LOG2_LB) + (rows & ((1 << LOG2_LB) - 1))
        at = (
            rows >> LOG2_LB
        ) * stride_cb + token * stride_cm  # (32-bit: the caller checks the content's size)
        c = tl.load(content + at[:, None], mask=(ok & (token < N))[:, None], other=0.0)
    else:
        c = tl.load(content + rows.to(tl.int64)[:, None] * stride_cm, mask=ok[:, None], other=0.0)
    return _mm_add(tl.trans(x), c, acc, PREC)


# -------------------------------------------------------------------------------- the fold's sums, by cell
@triton.jit
def _fold_cell_sums_kernel(
    DIST,  # (G, M, DW) as `_fold_sums_kernel` reads it
    CONTENT,  # as `_fold_sums_kernel`'s, with the same strides and BANDED
    SUMS,  # (G, W, D) float32 contiguous (with PAIR 2·G): cell x's sum over the group's rows at [g, x]
    DW1,
    GROUP,
    stride_cg,
    stride_cm,
    stride_cb,
    N,
    LOG2_LB,
    BANDS,
    M,
    W,
    DIST2,
    CONTENT2,
    D: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAIR: tl.constexpr = False,
    BANDED: tl.constexpr = False,
):
    """`_fold_sums_kernel`'s sums, each cell's whole: SUMS[g, x] = Σ_m DIST[m, x] · CONTENT[m], with no
    per-class sums to write and reduce after (`triton_backend.FOLD_SUMS_CLASSES` "in the kernel").

    One program: the cells x0 … x0 + BLOCK_N - 9 of group g, x0 = pid · (BLOCK_N - 8), over all the group's rows,
    class by class (rows s + 8·i). Class s is read as `_fold_sums_kernel` reads it, the columns x0 … x0 +
    BLOCK_N - 1 from s cells before each row's first (16-byte aligned loads): column c is cell c - s. So cell
    x0 + r is the class's product row r + s, which one gather moves to row r before the class's sums are added
    to the program's (rows past BLOCK_N - 9 are left over: a program computes 8 columns it does not own, 1/8 of
    its work at BLOCK_N = 64). Every cell is one program's: no atomics."""
    pid = tl.program_id(0)
    g = tl.program_id(1)
    # this program's group's sums: the grid's second axis runs over SUMS's groups
    sums = g.to(tl.int64) * W * D
    if PAIR:
        g, second = _side(g)
        DIST = tl.where(second, DIST2, DIST)
        CONTENT = tl.where(second, CONTENT2, CONTENT)
    h, band = g // BANDS, g % BANDS
    x0 = pid * (BLOCK_N - 8)
    cols = x0 + tl.arange(0, BLOCK_N)
    wide = W + 7  # columns read per row
    content = CONTENT + h.to(tl.int64) * stride_cg + tl.arange(0, D)[None, :]
    r = tl.arange(0, BLOCK_N)
    if x0 + BLOCK_N <= wide:
        total = _cells_of_classes(
            DIST, g, GROUP, DW1, content, cols, r, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, False, BLOCK_M,
            BLOCK_N, D, PREC, BANDED,
        )  # fmt: skip
    else:
        total = _cells_of_classes(
            DIST, g, GROUP, DW1, content, cols, r, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, True, BLOCK_M,
            BLOCK_N, D, PREC, BANDED,
        )  # fmt: skip
    cells = x0 + r
    out = SUMS + sums + cells[:, None] * D + tl.arange(0, D)[None, :]
    tl.store(out, total, mask=((r < BLOCK_N - 8) & (cells < W))[:, None])


@triton.jit
def _cells_of_classes(
    DIST, g, GROUP, DW1, content, cols, r, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, MASK_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, BANDED: tl.constexpr,
):  # fmt: skip
    """(BLOCK_N, D) float32: row r the sum of cell ``cols[0]`` + r over every class's rows (rows past BLOCK_N - 9
    incomplete): each class's sums of the columns ``cols`` (`_class_sums`) moved up by its residue."""
    total = tl.zeros((BLOCK_N, D), dtype=tl.float32)
    for s in range(8):
        acc = _class_sums(
            DIST, g, GROUP, DW1, content, s, cols, stride_cm, stride_cb, N, LOG2_LB, band, M, wide, MASK_COLS,
            BLOCK_M, BLOCK_N, D, PREC, BANDED,
        )  # fmt: skip
        total += _shifted_rows(acc, r, s, BLOCK_N)
    return total


@triton.jit
def _shifted_rows(acc, r, s, BLOCK_N: tl.constexpr):
    """``acc``'s rows moved up by ``s``: row r takes row r + s (the last rows, past BLOCK_N - 1 - s, repeat the
    last one; no cell is stored from them)."""
    rows = tl.minimum(r + s, BLOCK_N - 1)
    return tl.gather(acc, tl.broadcast_to(rows[:, None], acc.shape), 0)
