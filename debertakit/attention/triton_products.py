"""The distance tables' product as one Triton kernel (`triton_backend._distance_tables`, the "distance" road).

A distance table holds, per head and band, the products ``alpha · x_i · T[cells[e]]`` of the band's rows of q
(or k) with the position-table rows its cells stand for, at a row stride of R + 1 cells: the stride that makes
pair (i, j) land at ``i·R + j`` from row 0's cell of distance 0, so that the attention kernels read a near tile as
one strided tile (see `triton_kernels`). R is a multiple of 16, so that stride is odd. cuBLAS's tensor-core kernels
need 16-byte aligned row strides; with an odd one it ran the product on a pre-Hopper kernel for one-element
alignment (``cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_tn_align1``): on an H200 (2026-11-26,
``benchmarks/attention_gpu.py --sections profile``, `benchmarks/results/attention_gpu_h200.json`) 1.69 ms of
the forward's 2.50 ms at N = 2048 and 1.67 of 3.81 at 8192 (batch·N = 16384, 12 heads, d 64), twice that in a
training step (the backward builds the tables again); the attention kernel itself took 0.73 and 2.06 ms.

This kernel writes the table where it lies, at its odd stride (element stores: Triton cannot prove a row's start
aligned), and reads what cuBLAS was given as copies in place: q / k through their strides (no copy into
band-major order, no zero rows for the padding: rows past a batch row's N tokens are stored as zeros) and the
position-table rows through ``cells`` (no gathered copy of the table). One program computes a BLOCK_M × BLOCK_N
block of one (head, band): a single dot over the head dim, scaled by ``alpha`` in float32 and rounded once to
the table's dtype, as the matmul did.
"""

from __future__ import annotations

import triton
import triton.language as tl

from debertakit.attention.triton_kernels import _mm  # a @ b by PREC, as the attention kernels multiply


@triton.jit
def _distance_product_kernel(
    X,  # (H, B·N, D) rows per head: q (ROW) or k (COL), through strides, D contiguous
    T,  # (H, table rows, D) position table (Kr for ROW, Qr for COL), D contiguous
    CELLS,  # (BANDS, WIDTH) int64: the table row each cell of a band's rows stands for
    OUT,  # (H·BANDS, M, WIDTH) contiguous, M = B·LB: the table from its first cell
    alpha,
    stride_xh,
    stride_xr,
    stride_th,
    stride_tr,
    N,  # tokens per batch row
    LB,  # rows per band and batch row (with one band: the padded rows N')
    BANDS,
    WIDTH,  # cells per row (R + 1), the output's row stride
    M,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    hb = tl.program_id(2)  # head · BANDS + band
    h = hb // BANDS
    band = hb % BANDS
    d = tl.arange(0, D)

    # the block's rows: row m of (head, band) is token band·LB + m % LB of batch row m // LB
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    token = band * LB + m % LB
    real = (m < M) & (token < N)  # rows past N (the padding up to whole bands / N') are zeros
    x_rows = (m // LB) * N + token
    x = tl.load(
        X + h.to(tl.int64) * stride_xh + x_rows.to(tl.int64)[:, None] * stride_xr + d[None, :],
        mask=real[:, None],
        other=0.0,
    )  # (BLOCK_M, D)

    # the block's cells and the table rows they stand for
    e = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_row = e < WIDTH
    rows = tl.load(CELLS + band * WIDTH + e, mask=in_row, other=0)
    t = tl.load(
        T + h.to(tl.int64) * stride_th + rows[:, None] * stride_tr + d[None, :],
        mask=in_row[:, None],
        other=0.0,
    )  # (BLOCK_N, D)

    acc = _mm(x, tl.trans(t), PREC) * alpha  # (BLOCK_M, BLOCK_N) float32
    out = OUT + (hb.to(tl.int64) * M + m.to(tl.int64)[:, None]) * WIDTH + e[None, :]
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=(m < M)[:, None] & in_row[None, :])
