"""The `triton` backend: fused disentangled attention (forward and backward) as a PyTorch custom op.

What it serves (anything else is declined through the registry, so ``auto`` picks another backend):

* CUDA tensors in bfloat16, float16 or float32 (float32 runs the matmuls in IEEE precision); head dims 16, 32, 64,
  128 natively, other dims up to 128 zero-padded to the next of these (tiny test models). On CPU only under ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests), and then ``auto`` never picks it.
* c2p, p2c and p2p in any combination; v1 clamping and v2/v3 log buckets (both are just a `RelativeIndex` table).
* Padding masks, packed sequences (segments / ``cu_seqlens`` with positions inside each sequence), causal,
  Nq != Nk with default or explicit positions.
* Dropout on the probabilities, drawn inside the kernels (16-bit Philox numbers; see `triton_kernels`): the
  backward redraws the forward's mask from the call's seed, drawn on the device from its default generator as the
  other backends' masks are: ``torch.manual_seed`` reproduces a run, activation checkpointing (which restores the
  device's RNG state) replays it, and a captured CUDA graph draws a new seed at every replay.
* Declined: attention probabilities (``return_probs``) and dense masks.

Explicit positions must be distinct inside a sequence (they are for every geometry the model builds); the
backward relies on it (see `triton_kernels`) and the call checks it.

The forward and the backward are registered as `torch.library.custom_op`s, with fake (meta) implementations and
an autograd formula, so they run under ``torch.compile`` without graph breaks; eager calls run the same bodies
under a plain `torch.autograd.Function` (`_attention`: the ops' dispatch costs host time in every layer). They
run their own matmuls with autocast off, so autocast callers get the same float32 score arithmetic as without
it. The kernels of a call are launched through `triton_launch.launcher`, a shorter path than Triton's own, and
a forward without gradients is replayed from its call signature's plan where it has one (`triton_plan`).
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import Tensor

from debertakit.attention import triton_interpreter, triton_launch, triton_plan
from debertakit.attention.dropout import drop_threshold, kept_scale
from debertakit.attention.eager import PositionTerms
from debertakit.attention.geometry import Geometry
from debertakit.attention.registry import Backend, Request, capability_str, register
from debertakit.attention.relative import RelativeIndex, capturing_cuda_graph, kept
from debertakit.attention.triton_aot import Tiles
from debertakit.attention.triton_interpreter import interpreter_enabled
from debertakit.attention.triton_launch import launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
# From compute capability 8.0 (Ampere) on, Triton compiles `tl.dot` to tensor-core instructions. For older NVIDIA
# GPUs (Turing's T4, Volta's V100) Triton 3.9 emits float32 FMAs instead, for float16 inputs too (the forward
# kernel compiled for sm_75 has no HMMA, for sm_80 it has: tests/attention/compile_triton_kernels.py checks it),
# while cuBLAS, under the PyTorch backends, keeps the tensor cores: the backend declines them. Devices of unknown
# capability (ROCm's) are let through.
TRITON_TENSOR_CORES = (8, 0)


@functools.cache
def _kernels():
    # imported on first use: Triton decides at decoration time whether kernels are compiled or interpreted, so
    # TRITON_INTERPRET only needs to be set before the first call, not before `import debertakit`
    triton_interpreter.prepare()
    from debertakit.attention import triton_kernels

    return triton_kernels


@functools.cache
def _products():
    _kernels()  # the interpreter's checks and patches first, as for the attention kernels
    from debertakit.attention import triton_products

    return triton_products


KERNEL_NAMES = ("_fwd_kernel", "_dq_kernel", "_dkv_kernel")
# Tiles per kernel on CUDA, by head dim (<= 64, 128). Where a GPU timed candidates (`GPU_TIMED`), the fastest
# (`python benchmarks/attention_gpu.py --sections tiles`, rows in benchmarks/results/attention_gpu.json).
# Elsewhere the static report's choice: the largest tile that compiles for sm_90 without register spills in
# every feature set under every Triton version the report was run with (3.6, which PyTorch 2.11 pins, and 3.9),
# preferring tiles whose warps repeat no product (`triton_aot.replication`), then warpgroup tensor-core (HGMMA)
# code (`benchmarks/triton_static.py`, table in
# benchmarks/results/triton_static.md). DROPOUT_TILES: the choice for the kernels with dropout, where it differs.
GPU_TILES = {
    # timed on an H100 (bf16, v3 shape, batch·N = 16384): 64x32 with 4 warps for all three kernels against the
    # static choice of the time (forward and dQ 64x64 w8, whose two warpgroups both computed every score, dK/dV
    # 32x64 w8), forward+backward 72 against 55 TFLOP/s at N = 8192
    # and 101 against 67 at 16384, forward 133 against 76 at 16384 (the forward at 64x32 w4 takes 163 registers
    # a thread under Triton 3.6: three programs fit an SM's registers, where one 64x64 w8 program did).
    # dK/dV at 64x32 w4 spills in the static report (24 bytes under Triton 3.9 in the v3 set, more in the rarer
    # feature sets): timed faster anyway
    64: {
        "_fwd_kernel": Tiles(64, 32, 4, 2),
        "_dq_kernel": Tiles(64, 32, 4, 2),
        "_dkv_kernel": Tiles(64, 32, 4, 2),
    },
    128: {
        "_fwd_kernel": Tiles(128, 16, 8, 2),
        "_dq_kernel": Tiles(128, 16, 8, 2),
        "_dkv_kernel": Tiles(16, 32, 4, 2),
    },
}
# the entries of GPU_TILES chosen by timing on a GPU, not by the static report (inference: without dropout)
GPU_TIMED = {64: KERNEL_NAMES}
DROPOUT_TILES = {
    64: {
        "_fwd_kernel": Tiles(128, 16, 8, 2),  # the static choice: the timed tiles were not timed with dropout
        "_dq_kernel": Tiles(128, 16, 8, 2),
        "_dkv_kernel": Tiles(32, 32, 4, 2),
    },
    128: {},
}
# set by the benchmark's tile sweep: kernel name -> Tiles, used instead of GPU_TILES
TILE_OVERRIDES: dict[str, Tiles] = {}
# How the kernels get the near band's position terms. "tables" gathers them from the precomputed N×R products;
# "distance" reads them from the same products laid out by distance (`_distance_tables`: two strided tile
# loads per near tile instead of three gathered cells per pair), at distance i - j without p2p, in both
# directions, with or without dropout; "skew" computes them inside the kernels from the position tables (no
# N×R table in memory; see `triton_kernels`) in the forward and in the backward, "skew-forward" in the forward
# only. The skewed kernels run only at distance i - j, without p2p, with tables in the inputs' dtype, and
# where SKEW_TILES (with dropout: SKEW_DROPOUT_TILES) has tiles for them (the backward needs both of its
# kernels); other calls use "tables" (as do calls with p2p, or not at distance i - j, on the distance road).
# Which is fastest is for a GPU to say: `benchmarks/attention_gpu.py` times them in one run ("triton", "triton
# tables", "triton distance", "triton skew-forward", "triton skew"), without and with dropout. On an H200
# (2026-11-26, bf16, v3 shape, batch·N = 16384, 12 heads, d 64; `benchmarks/results/attention_gpu_h200_targets.json`)
# the distance road's forward+backward was the fastest at every N timed (512: 5.74 ms against the tables road's
# 6.23; 2048: 10.59 against 11.44; 8192: 16.50 against 18.00; 16384: 24.53 against 25.65), and so was its forward
# at 512, 8192 and 16384; at 2048 its forward was the slower (3.64 against 2.89 ms), 1.69 ms of it the tables'
# matmul on a one-element-aligned cuBLAS kernel, which `triton_products` replaces (`DISTANCE_PRODUCT`; not yet
# timed on a GPU).
NEAR_BAND_MODES = ("tables", "distance", "skew-forward", "skew")
NEAR_BAND = "distance"
# Where no far tile may occur (`_far_tiles`: v3 inputs of N <= 512, packed rows of such sequences) the kernels
# run each program's loop as one near run (`triton_kernels._NEAR_ONLY`); False compiles the three runs of longer
# inputs there too (two of them empty), as before: `benchmarks/attention_gpu.py`'s row "triton (three runs)"
# times the difference.
ONE_NEAR_RUN = True
# The skewed kernels' tiles per head dim, from the static report (largest spill-free under every Triton version),
# without and with dropout; a kernel missing from a table is not served skewed there.
SKEW_TILES = {
    64: {
        "_fwd_kernel": Tiles(32, 32, 4, 2),
        # spill-free at 32x32 under both Triton releases since dQ's cells ascend with the keys (16x32 before)
        "_dq_kernel": Tiles(32, 32, 4, 2),
        "_dkv_kernel": Tiles(16, 32, 4, 2),
    },
    # head dim 128: no dQ or dK/dV tile compiles without spills under both Triton releases, so the skewed road
    # serves the forward only there (with 8 warps before the report with the distance tables: spill-free too)
    128: {
        "_fwd_kernel": Tiles(16, 32, 4, 2),
    },
}
SKEW_DROPOUT_TILES = {
    64: {
        "_fwd_kernel": Tiles(32, 32, 4, 2),
        "_dq_kernel": Tiles(16, 32, 4, 2),
        "_dkv_kernel": Tiles(16, 32, 4, 2),
    },
    128: {
        "_fwd_kernel": Tiles(16, 32, 4, 2),
    },
}
FORWARD = ("_fwd_kernel",)
BACKWARD = ("_dq_kernel", "_dkv_kernel")
# FAR's rows (`_far_columns`) are padded to a multiple of this, which every tile side divides (the kernels
# read it as `triton_kernels.FAR_PAD` and check their key blocks against it)
FAR_PAD = 128
# log2(e): the kernels' scores are in base 2 (`triton_kernels`); the distance tables are scaled to match
LOG2E = 1.4426950408889634


def _tile_width(head_dim: int) -> int:
    """The key of the tile tables for ``head_dim``: 64 (head dims up to 64) or 128."""
    return 64 if head_dim <= 64 else 128


def tiles_for(
    device: torch.device, head_dim: int, kernel: str, dropout: bool = False, skew: bool = False
) -> Tiles:
    """Tiles of one kernel: the benchmark's override if set; small tiles under the interpreter (so short test
    inputs cross tile edges and the saturation); on GPU the tables above."""
    if kernel in TILE_OVERRIDES:
        return TILE_OVERRIDES[kernel]
    if device.type != "cuda":
        return Tiles(16, 16, 1, 1)
    width = _tile_width(head_dim)
    if skew:
        return _skew_tiles(dropout)[width][kernel]
    if dropout and kernel in DROPOUT_TILES[width]:
        return DROPOUT_TILES[width][kernel]
    return GPU_TILES[width][kernel]


def _launch(t: Tiles) -> dict:
    return dict(BLOCK_M=t.block_m, BLOCK_N=t.block_n, **t.options)


def _skew_tiles(dropout: bool) -> dict[int, dict[str, Tiles]]:
    return SKEW_DROPOUT_TILES if dropout else SKEW_TILES


def skew_served(head_dim: int, kernels: tuple[str, ...], dropout: bool = False) -> bool:
    """Whether `SKEW_TILES` (with ``dropout``, `SKEW_DROPOUT_TILES`) has tiles for all of ``kernels``
    (`FORWARD` or `BACKWARD`) at ``head_dim``."""
    return all(name in _skew_tiles(dropout)[_tile_width(head_dim)] for name in kernels)


def _check_mode(name: str, value: str, modes: tuple[str, ...]) -> None:
    """A module setting (``NEAR_BAND``, ``DISTANCE_PRODUCT``, ...) that is not one of its ``modes``: an error
    naming it, before a kernel runs on a value no branch expects."""
    if value not in modes:
        raise ValueError(f"triton_backend.{name} must be one of {modes}, got {value!r}")


def _uses_skew(
    q: Tensor,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    ij: bool,
    p2p: bool,
    dropout: bool,
    kernels: tuple[str, ...] = FORWARD,
) -> bool:
    """Whether ``kernels`` (`FORWARD` or `BACKWARD`) compute the near band's terms from the position tables
    (`NEAR_BAND`): distance i - j, no p2p, skew tiles for the head dim (with or without dropout), tables in the
    inputs' dtype (the products run on the tensor cores in that dtype)."""
    _check_mode("NEAR_BAND", NEAR_BAND, NEAR_BAND_MODES)
    wanted = NEAR_BAND == "skew" or (NEAR_BAND == "skew-forward" and kernels == FORWARD)
    tables = [t for t in (pos_q, pos_k) if t is not None]
    same_dtype = bool(tables) and all(t.dtype == q.dtype for t in tables)
    served = skew_served(q.shape[-1], kernels, dropout)
    return wanted and ij and not p2p and served and same_dtype


def _uses_distance(ij: bool, p2p: bool) -> bool:
    """Whether the kernels read the near band from distance tables (`NEAR_BAND` = "distance", `_distance_tables`):
    at distance i - j, without p2p; with or without dropout (at `DROPOUT_TILES`' tiles where they differ)."""
    return NEAR_BAND == "distance" and ij and not p2p


def _aligned(n: int) -> int:
    """``n`` rounded up to a multiple of `DIST_ALIGN`."""
    return triton_cdiv(n, DIST_ALIGN) * DIST_ALIGN


def _padded_rows(n: int) -> int:
    """The rows per (b, h) of a distance table for ``n`` tokens: a multiple of `DIST_ALIGN`, so that each (b, h)'s
    rows start aligned for the kernels' vector loads (`triton_kernels._table_offset`)."""
    return _aligned(n)


_ONE_BAND = 30  # the kernels' LOG2_BAND for a table of one band per (b, h) (`triton_kernels._band_rows`)


def _distance_reach(sat: int, nq: int, nk: int, span: int) -> int:
    """R / 2, the distances either side of 0 a distance table holds: the largest |i - j| of a pair of the
    sequences in a near tile, rounded up to `DIST_ALIGN` (so R, the kernels' row step, is a multiple of 16:
    aligned vector loads). A near tile of the loops' middle run (`triton_kernels._split`) holds pairs less than
    ``sat`` + BLOCK_M + BLOCK_N apart (``span``: the largest BLOCK_M + BLOCK_N of the kernels that read the
    tables), and no two tokens are further apart than the longer side's padded rows."""
    return _aligned(min(max(_padded_rows(nq), _padded_rows(nk)) - 1, sat + span))


def _distance_layout(
    sat: int, nq: int, nk: int, tiles: list[Tiles], far_tiles: bool, head_dim: int, batch: int
) -> tuple[int, int, int]:
    """(band, bands, cells) of the distance tables for the ``tiles`` of the kernels that read them: rows per
    band (0: one band, each (b, h)'s rows padded to `DIST_ALIGN`), bands per (b, h) and cells per row (R + 1).

    One band: every row holds the distances -reach … reach (`_distance_reach`), 2·reach + 1 cells, of which a
    row of an input shorter than the reach reads N. Where no tile is far (`_far_tiles`) and the two sides are
    one length, bands of the longest tile side's rows (every tile then lies in one band) hold instead only what
    their rows read: row r of a band, cell e = j - r + band for key j (for ROW; COL likewise with the roles
    swapped), N' + band + 1 cells for N' tokens padded to whole bands. At v3's N = 512 and 64-row bands that is
    577 cells against 1025: the tables' matmuls do 44% less. Bands are used only where they move fewer bytes:
    the cells written, plus, for more than one batch row, the copy of q / k into band-major order
    (`_band_product`: a row of ``head_dim`` read and written). At N = 128, 64-row bands write 193 cells a row
    against 257, but with the copy move more."""
    span, band = _layout_sides(tiles)  # tile sides are powers of two, 16 or more
    one = (0, 1, 2 * _distance_reach(sat, nq, nk, span) + 1)
    if far_tiles or nq != nk:
        return one
    rows = triton_cdiv(nq, band) * band
    banded = (band, rows // band, rows + band + 1)
    copy = 2 * head_dim if batch > 1 else 0
    if rows < 2 * band or rows * (banded[2] + copy) >= _padded_rows(nq) * one[2]:
        return one
    return banded


def _table_layouts(
    sat: int, nq: int, nk: int, far_tiles: bool, head_dim: int, batch: int, device, dropout: bool
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The layouts (`_distance_layout`) of the backward's distance tables and of the forward's, each for the tiles
    of the kernels that read it (those they run with ``dropout``); where the backward reads the forward's tables
    (`KEEP_TABLES`), one for the three kernels. A kernel whose tiles have smaller sides than another's reads a
    narrower near band (one band: the saturation plus its own BLOCK_M + BLOCK_N) or shorter bands (its own
    longest side): the forward at 64x32 with dK/dV at 32x128 (the GPU suite's `tiles-dkv` sweep) reads 1217
    cells a row at N = 2048 where the backward's tables need 1345, and 64-row bands at 512 (577 cells) where they
    need 128 (641): what the product kernel writes in every forward. With the three kernels' tiles alike (the
    GPU's now, with and without dropout) the two layouts are one."""
    tiles = [tiles_for(device, head_dim, name, dropout=dropout) for name in KERNEL_NAMES]  # forward first
    forward, backward = (tiles, tiles) if KEEP_TABLES else (tiles[:1], tiles[1:])
    layout = _distance_layout(sat, nq, nk, backward, far_tiles, head_dim, batch)
    if _layout_sides(forward) == _layout_sides(backward):  # (every call: a layout computed once where it can)
        return layout, layout
    return layout, _distance_layout(sat, nq, nk, forward, far_tiles, head_dim, batch)


def _layout_sides(tiles: list[Tiles]) -> tuple[int, int]:
    """What `_distance_layout` reads of ``tiles``: the largest BLOCK_M + BLOCK_N (the reach) and longest side (the
    bands)."""
    return max(t.block_m + t.block_n for t in tiles), max(max(t.block_m, t.block_n) for t in tiles)


# How far the forward's distance tables reach on either side of distance 0 where far tiles occur (one band):
# "tiles", as its tiles need (`_distance_reach`: beyond the farthest pair of a near tile, the saturation plus its
# BLOCK_M + BLOCK_N, `_table_layouts`; 608 at v3's sat = 512 with the GPU's tiles: 1217 cells a row),
# or "saturation", the saturation rounded up to `DIST_ALIGN` (512: 1025 cells, 16% fewer bytes written by the
# product kernel per forward). Past the saturation every cell repeats a row's end, so a near tile's pairs beyond
# the cut take the ends instead, as a far tile does: the forward's near tiles select per pair (``EDGES``,
# `triton_kernels._beyond_reach`; at v3's tiles for head dim 64 on sm_90, 168 / 167 registers a thread under
# Triton 3.9 / 3.6 against 166 / 148, and 92 / 110 more instructions in the near loop:
# `benchmarks/triton_static.py`, the ``+edges`` sets). The forward's output is the same (the tests: bit for bit
# against the uncut tables, and against `eager`); the backward builds its own tables, uncut. Untimed on a GPU:
# the benchmark's row "triton (forward tables to the saturation)" times it beside the default.
FORWARD_REACH_MODES = ("tiles", "saturation")
FORWARD_REACH = "tiles"

# The forward's far tiles in blocks of this many keys (None: its tiles' BLOCK_N, as before), on the distance road
# where far tiles occur (`triton_kernels._fwd_keys`; the near tiles keep BLOCK_N; the other roads, kept for
# timing, take none: the static report and the compile check measured the distance road's). A far tile is plain attention
# plus a row and a column vector, and wider ones spread a step's fixed work over more keys: at the head-dim-64
# forward's 64x32 (4 warps, distance road, sm_90) blocks of 64 keys take 406 instructions a thread a tile under
# Triton 3.6 against 255 for 32 keys (12.7 against 15.9 a score) at 164 registers against 148, still three
# programs an SM; 128 keys take 228 registers, two programs (`benchmarks/triton_static.py`, the ``+far64``
# sets). The output differs from the default's by rounding only (the online softmax's steps fall elsewhere).
# Not taken at head dims above 64 with packed rows, where the wide forward spills registers under Triton 3.9 (8
# to 56 bytes at 128x16 with 8 warps; none under 3.6); blocks of 128 keys only at head dims up to 64 without
# dropout or packed rows (elsewhere they spill, 352-408 bytes with segments at head dim 64 under Triton 3.9, and
# with dropout need more shared memory than an sm_86 block may use: 115 KB at head dim 64; 64 keys are taken
# there instead). Untimed on a GPU: the benchmark's rows "triton (forward far tiles of 64 keys)" and "... 128
# keys".
FORWARD_FAR_KEYS: int | None = None
# The same for the dQ kernel's far tiles (`triton_kernels._dq_keys`; its loop runs over key blocks as the
# forward's does): plain attention's backward plus a row sum of dS a far tile. At the head-dim-64 dQ's 64x32
# (4 warps, distance road, sm_90) blocks of 64 keys take 12.6 instructions a far score under Triton 3.6 against
# 14.8 for 32 keys (13.6 against 18.3 under 3.9) at 224 registers against 139 (three programs an SM to two); at
# head dim 128 (128x16, 8 warps: one program either way) 32 keys take 19.1 against 23.5 (3.6; 19.8 against 29.2
# under 3.9), and with dropout at head dim 64 (128x16, 8 warps) 32.5 against 37.1 (`benchmarks/triton_static.py`,
# the ``+far64`` / ``+far32`` sets; trial compiles). Blocks of 64 keys only at head dims up to 64 without
# dropout (elsewhere they spill: 8 bytes with dropout under 3.9, 16 at head dim 128 on sm_86; 32 keys are taken
# there instead), 128 nowhere (8 bytes under 3.9 at head dim 64, 416 with segments); none with packed rows
# (segments: at head dim 64, 28.4 instructions a score against 28.7 under 3.6, at 254 registers against 176;
# at 128, 32 keys spill with dropout) nor at head dim 128 with dropout (32 keys spill on sm_86, 8-16 bytes).
# Untimed on a GPU: the benchmark's row "triton (forward and dQ far tiles of 64 keys)".
DQ_FAR_KEYS: int | None = None
# the kernels that take wide far blocks, and the setting of each
FAR_KEY_SETTINGS = {"_fwd_kernel": "FORWARD_FAR_KEYS", "_dq_kernel": "DQ_FAR_KEYS"}


def _far_keys(
    wide: int | None,
    block_n: int,
    split: bool,
    head_dim: int,
    segments: bool,
    dropout: bool,
    kernel: str = "_fwd_kernel",
) -> int:
    """FAR_N of ``kernel`` (the forward, or dQ) for its tiles' ``block_n``, its setting (`FORWARD_FAR_KEYS`,
    `DQ_FAR_KEYS`) being ``wide``: ``wide`` where the loop runs in far and near parts on the distance road
    (``split``: distance tables and far tiles), no wider than compiles without spills or excess shared memory
    (the forward: none at a ``head_dim`` above 64 with ``segments``, 128 keys only at head dims up to 64 without
    ``dropout`` or ``segments``, else 64; dQ: none with ``segments`` or at a head dim above 64 with
    ``dropout``, 64 at head dims up to 64 without ``dropout``, else 32), no less than ``block_n``; else
    ``block_n``."""
    if kernel not in FAR_KEY_SETTINGS:
        raise ValueError(f"wide far blocks are the forward's and dQ's, not {kernel!r}'s")
    setting = FAR_KEY_SETTINGS[kernel]
    if wide is not None and (type(wide) is not int or wide < 1 or FAR_PAD % wide):
        raise ValueError(
            f"triton_backend.{setting} must be None or a power of two dividing FAR_PAD ({FAR_PAD}), got {wide!r}"
        )
    if wide is None or not split:
        return block_n
    if kernel == "_fwd_kernel":
        if head_dim > 64 and segments:
            return block_n
        widest = 64 if head_dim > 64 or dropout or segments else 128
    else:
        if segments or (head_dim > 64 and dropout):
            return block_n
        widest = 32 if head_dim > 64 or dropout else 64
    return max(min(wide, widest), block_n)


def _cuts_forward_tables(layout: tuple[int, int, int], far_tiles: bool, sat: int) -> bool:
    """Whether the forward reads distance tables of its own, cut to the saturation (`FORWARD_REACH`): one band
    (``layout``: `_distance_layout`) wider than that where far tiles occur, and the forward's tables not kept
    for the backward (`KEEP_TABLES`), which reads the uncut ones."""
    _check_mode("FORWARD_REACH", FORWARD_REACH, FORWARD_REACH_MODES)
    band, _, cells = layout
    return (
        FORWARD_REACH == "saturation"
        and far_tiles
        and band == 0
        and not KEEP_TABLES
        and _aligned(sat) < cells // 2
    )


def _forward_cells(cells: Tensor, sat: int) -> Tensor:
    """One band's (2, 1, 2·reach + 1) cells (`_distance_cells`) cut to the distances -t … t, t the saturation
    rounded up to `DIST_ALIGN` (`FORWARD_REACH`): the middle 2·t + 1, contiguous (the product kernel reads them
    as rows)."""
    reach, t = cells.shape[2] // 2, _aligned(sat)
    return cells[..., reach - t : reach + t + 1].contiguous()


def _distance_offset(band: int, cells: int) -> int:
    """The cell of distance 0 in a band's first row, where the kernels' ROW / COL pointers start: the reach with
    one band, the band's rows with bands (`_distance_layout`)."""
    return band if band else cells // 2


def _log2_band(band: int) -> int:
    """The kernels' LOG2_BAND (`triton_kernels._band_rows`)."""
    return _ONE_BAND if band == 0 else band.bit_length() - 1


def _product_buffer(
    heads: int, m: int, n: int, dtype: torch.dtype, device, slack: int, lead: bool
) -> tuple[Tensor, Tensor]:
    """A buffer for (heads, m, n) products followed by ``slack`` zeros and, with ``lead``, preceded by as many
    (one fill for both): the products and the zeros after them, flat, and the products' (heads, m, n) view
    (`_product_buffers` of one table)."""
    (flat,), (out,) = _product_buffers(1, heads, m, n, dtype, device, slack, lead)
    return flat, out


def _product_buffers(
    count: int, heads: int, m: int, n: int, dtype: torch.dtype, device, slack: int, lead: bool
) -> tuple[list[Tensor], list[Tensor]]:
    """One buffer for ``count`` tables of (heads, m, n) products, each followed by ``slack`` zeros or more and,
    with ``lead``, preceded by as many (one allocation and one fill for all): per table its products and the
    zeros after them, flat, and the products' (heads, m, n) view. Two tables lie a whole number of
    `LEAD_ALIGN` elements apart, the zeros after the first being those before the second (at least ``slack``:
    one launch of `triton_products` writes both, `_kernel_band_product`).

    With ``lead`` the products start `LEAD_ALIGN` elements into the buffer or a multiple of that (the
    allocator's 16-byte alignment kept): Triton specialises a launch on each pointer's 16-byte alignment, and a
    banded distance table that started on an odd element (its lead, `_distance_slack`, is odd) had the attention
    kernels compiled with element loads: ncu counted 4.5–5.3 sectors per load request in the three kernels at
    N = 512, against 10.8–13.5 at 8192 with one (aligned) band (H100, `benchmarks/results/attention_ncu_h100.md`).
    The product kernel's 16-byte stores need the same. The elements before the zeros are never read."""
    size = heads * m * n
    # the zeros after each table: with a second table, as many as put its start on LEAD_ALIGN
    zeros = slack if count == 1 else triton_cdiv(size + slack, LEAD_ALIGN) * LEAD_ALIGN - size
    step = size + zeros  # from one table's start to the next one's
    start = triton_cdiv(zeros, LEAD_ALIGN) * LEAD_ALIGN if lead else 0
    flat = torch.empty(start + count * step, dtype=dtype, device=device)
    # the zero runs lie `step` apart: one strided fill for all of them
    runs = count + 1 if lead else count
    flat.as_strided((runs, zeros), (step, 1), start - zeros if lead else size).zero_()
    firsts = [start + t * step for t in range(count)]
    return [flat[a : a + step] for a in firsts], [flat[a : a + size].view(heads, m, n) for a in firsts]


# Elements before a product buffer's products (`_product_buffer`): 128 bytes of 16-bit values.
LEAD_ALIGN = 64


def _scaled_product(
    a: Tensor, b: Tensor, alpha: float, dtype: torch.dtype, slack: int, lead: bool = False
) -> Tensor:
    """``alpha · a @ b`` in ``dtype``, a (H, M, K), b (H, K, N), flat, followed by ``slack`` zeros and with
    ``lead`` as many (or more) before it (`_product_buffer`): on a GPU one matmul whose float32 accumulator is
    scaled and rounded once (``baddbmm`` with beta 0: its input is not read); on the CPU (the interpreter), or
    with operands of another dtype, in float32, then rounded. Scaling here costs no pass of its own, and a scaled
    table holds what the scores add (float16 ones stay far from overflow)."""
    heads, m, n = a.shape[0], a.shape[1], b.shape[2]
    flat, out = _product_buffer(heads, m, n, dtype, a.device, slack, lead)
    if a.device.type != "cpu" and a.dtype == b.dtype == dtype:
        unused = a.new_empty((1, 1, 1)).expand(heads, m, n)
        torch.baddbmm(unused, a, b, beta=0.0, alpha=alpha, out=out)
    else:
        out.copy_(torch.bmm(a.float(), b.float()).mul_(alpha))
    return flat


def _band_major(heads: Tensor, batch: int, n: int, band: int, bands: int) -> Tensor:
    """(H, B·N, d) rows per head as (H·bands, B·band, d): each band's rows of the whole batch together, the
    batch rows padded with zero rows to whole bands (with one band, ``band`` 0, to `_distance_padded_rows`).
    A copy unless one band of one batch row needs no padding."""
    H, d = heads.shape[0], heads.shape[2]
    rows = _pad_rows(heads, batch, n, _distance_padded_rows(n, band))
    return rows.view(H, batch, bands, -1, d).transpose(1, 2).reshape(H * bands, -1, d)


def _cell_rows(table: Tensor, cells: Tensor) -> Tensor:
    """The (H, R, d) position table's rows that each band's cells stand for, (H·bands, cells, d): what a
    band's distance-table row (or gradient row) meets in its matmul."""
    return table[:, cells].flatten(0, 1)


def _pad_rows(heads: Tensor, batch: int, n: int, padded: int) -> Tensor:
    """(H, B·N, d) rows per head as (H, B·N', d), each batch row's N rows followed by zero rows up to
    N' = ``padded`` (a copy only when N' > N)."""
    if padded == n:
        return heads
    per_row = heads.unflatten(1, (batch, n))
    return torch.nn.functional.pad(per_row, (0, 0, 0, padded - n)).flatten(1, 2)


def _distance_cells(lut: Tensor, sat: int, band: int, bands: int, cells: int) -> Tensor:
    """(2, bands, cells) int64: the table row each cell of a distance table's rows reads, per band, ROW's then
    COL's (`_distance_layout`). In band b, ROW's cell e stands for distance i - j = offset + b·band - e, COL's
    for its negative (offset: `_distance_offset`; clamped to ±sat: the saturated cells repeat the ends). Depends
    on the geometry alone (`triton_attention` caches it)."""
    first = _distance_offset(band, cells) + band * torch.arange(bands, device=lut.device)
    dist = first[:, None] - torch.arange(cells, device=lut.device)  # (bands, cells): i - j of ROW's cells
    lut = lut.long()
    return torch.stack([lut[dist.clamp(-sat, sat) + sat], lut[(-dist).clamp(-sat, sat) + sat]])


def _cells(rel, lut: Tensor, sat: int, rows: int, layout: tuple[int, int, int], device) -> Tensor:
    """`_distance_cells` of ``layout``, kept with the mapping ``rel`` (it depends on the geometry alone)."""
    return rel.cached(("triton-cells", sat, rows, layout, device), lambda: _distance_cells(lut, sat, *layout))


def _distance_tables(
    q_heads: Tensor | None,
    k_heads: Tensor | None,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    cells: Tensor,
    alpha: float,
    shape: tuple[int, int, int],
    band: int = 0,
) -> tuple[Tensor | None, Tensor | None]:
    """ROW and COL laid out by distance (the kernels' ``DIST``) in ``band``s (`_distance_layout`): with one band
    ``ROW[i, reach + (j - i)] = alpha · q_i · Kr[idx(i, j)]``, ``COL[j, reach + (i - j)] = alpha · k_j ·
    Qr[idx(i, j)]``, (H, B·N', 2·reach + 1) per head; with bands (H, bands, B, band, cells), ROW's row r of band
    b holding pair (b·band + r, j) at cell band + j - r, COL's likewise. In q's dtype, N' the padded rows
    (`_distance_padded_rows`), for ``shape`` = (B, Nq, Nk), each flat and followed by `_distance_slack` zeros
    (with bands, preceded by as many: `_band_product`; `_distance_rows` views one band's products). Each is the
    product per band with the table rows its ``cells`` index (`_distance_cells`; one matmul, or for 16-bit
    tables `triton_products`' kernel, both tables from one launch where they pair: `_paired_products`),
    ``alpha`` = scale · log2(e): the kernels add the cells as they are. Same products as `_tables`, their
    columns repeated by distance and rounded to the inputs' dtype: at v3's sat = 512 and 64×64 tiles, 1281
    bfloat16 cells per row against 512 float32 ones."""
    batch, nq, nk = shape
    slack = _distance_slack(cells.shape[2], nq, nk, band)
    if _paired_products(q_heads, k_heads, pos_k, pos_q, cells, nq, nk):
        row, col = _kernel_band_product(
            q_heads, pos_k, cells, batch, nq, band, alpha, slack, (k_heads, pos_q)
        )
        return row, col
    row = col = None
    if q_heads is not None:
        row = _band_product(q_heads, pos_k, cells[0], batch, nq, band, alpha, slack)
    if k_heads is not None:
        col = _band_product(k_heads, pos_q, cells[1], batch, nk, band, alpha, slack)
    return row, col


# How many launches of `triton_products` build a call's two distance tables: "one", both in one grid and one
# buffer (one launch, allocation and fill fewer per forward, and per backward that builds them again), where
# their shapes and strides agree (`_paired_products`); "two", one launch each. The benchmark's row "triton
# (tables in two launches)" times the second beside the first.
PRODUCT_LAUNCHES_MODES = ("one", "two")
PRODUCT_LAUNCHES = "one"


def _paired_products(
    q_heads: Tensor | None,
    k_heads: Tensor | None,
    pos_k: Tensor | None,
    pos_q: Tensor | None,
    cells: Tensor,
    nq: int,
    nk: int,
) -> bool:
    """Whether one launch builds both distance tables (`PRODUCT_LAUNCHES`): both wanted, both served by the
    kernel (`_product_kernel_serves`; the grid's second axis then twice as long), of one length, q and k at one
    set of strides, Kr and Qr at another, and stored through pointers (`PRODUCT_STORES`: a descriptor
    describes one table)."""
    _check_mode("PRODUCT_LAUNCHES", PRODUCT_LAUNCHES, PRODUCT_LAUNCHES_MODES)
    if PRODUCT_LAUNCHES != "one" or q_heads is None or k_heads is None or nq != nk:
        return False
    both = cells.flatten(0, 1)  # (2·bands, cells): the grid's second axis runs over heads × both
    served = _product_kernel_serves(q_heads, pos_k, both) and _product_kernel_serves(k_heads, pos_q, both)
    same = (
        q_heads.dtype == k_heads.dtype
        and q_heads.stride() == k_heads.stride()
        and pos_k.stride() == pos_q.stride()
    )
    return served and same and q_heads.stride(-1) == pos_k.stride(-1) == 1 and PRODUCT_STORES != "tma"


def _distance_padded_rows(n: int, band: int) -> int:
    """A distance table's rows per (b, h) for ``n`` tokens: whole bands, or with one band a multiple of
    `DIST_ALIGN` (so that each (b, h)'s rows start aligned for the kernels' vector loads:
    `triton_kernels._table_offset`)."""
    return triton_cdiv(n, band) * band if band else _padded_rows(n)


def _band_product(
    heads: Tensor,
    table: Tensor,
    cells: Tensor,
    batch: int,
    n: int,
    band: int,
    alpha: float,
    slack: int,
) -> Tensor:
    """One distance table, flat from its first cell (`_distance_tables`): the (H, B·N, d) rows per head against
    the (H, R, d) position table's rows that ``cells`` (bands, cells) index, one matmul per (head, band). With
    bands the rows are first copied band-major, (H, bands, B·band, d) (with one band a view), so that each
    band's rows of the whole batch meet its table rows in one product; the copy is that of q or k, small
    against the cells it saves. With bands the zeros of the slack lie before the table too: the kernels load
    the two saturated cells of each row of a program's block, distance ±min(sat, R / 2) from its cell of
    distance 0, in every call; far tiles alone use them, and with bands there are none (`_distance_layout`), but
    in the first band the left one lies before the table. With one band every row holds both. 16-bit tables
    come from `triton_products` instead (`DISTANCE_PRODUCT`): the same table without the copies, written at its
    odd row stride where cuBLAS ran a one-element-aligned kernel."""
    if _product_kernel_serves(heads, table, cells):
        return _kernel_band_product(heads, table, cells, batch, n, band, alpha, slack)
    a = _band_major(heads, batch, n, band, cells.shape[0])
    b = _cell_rows(table, cells).transpose(-1, -2)
    return _scaled_product(a, b, alpha, heads.dtype, slack, lead=band > 0)


# How the distance tables' products run: "triton", one kernel writing each table in place at its odd row stride
# R + 1 (`triton_products`); "cublas", one batched matmul per table, which cuBLAS runs on a one-element-aligned
# kernel at that stride (1.69 ms of the forward's 2.50 at N = 2048 on an H200: `triton_products`' docstring).
# The benchmark's row "triton (cuBLAS tables)" times the second beside the first: on an H100 the kernel's first
# version made the forward 1.37× as fast at N = 2048, 1.61× at 512
# (`benchmarks/results/attention_gpu_h100_targets.json`).
DISTANCE_PRODUCT_MODES = ("triton", "cublas")
DISTANCE_PRODUCT = "triton"
# The product kernel's tiles: one dot over the head dim per block, BLOCK_M rows of q / k by BLOCK_N cells. 64×64
# with 4 warps compiles for sm_90 without spills at every head dim, with 16-byte stores
# (tests/attention/compile_triton_kernels.py), and was the fastest of five spill-free shapes on an H200 (forward
# at N = 2048: 80.5 TFLOP/s against 79.6 for 128×64 w8 and 60.5 for 64×256 w8;
# `benchmarks/results/attention_gpu_h200_7974afd_tiles_product.json`).
PRODUCT_TILES = Tiles(64, 64, 4, 1)
# How the product kernel stores its inner blocks (`triton_products`): "pointers", an address per element
# (16-byte vector stores), or "tma", one tensor-memory store per block through a descriptor (Hopper and later;
# elsewhere, and where the table's rows are not a multiple of 16 bytes' elements, the pointers). Both write the
# same cells. On an H200 the two tables took as long either way (0.295 ms with TMA against 0.298 at N = 512,
# 0.521 against 0.505 at 2048; `benchmarks/results/attention_gpu_h200_996fc93_profile.json`), so the first stays
# the default.
PRODUCT_STORES_MODES = ("pointers", "tma")
PRODUCT_STORES = "pointers"
# Which programs the product kernel runs (`triton_products`): "blocks", one per block of rows and cells, or
# "rows", one per block of rows, reading its rows of q / k once and running over their column blocks in a loop
# (pipelined at `PRODUCT_ROW_TILES`' stages: the next block's cells and table rows load while this one is
# stored).
# One tile a program left its loads' latency exposed: at N = 512 on an H100 ncu put the kernel's top stall on
# waiting for global loads (long_scoreboard, 4.2 cycles per issued instruction) with 48% of issue slots busy
# (`benchmarks/results/attention_ncu_h100_9b811db.md`). The loop was slower on an H200 (the two tables in 0.367
# ms against 0.298 at N = 512, 0.671 against 0.505 at 2048; `attention_gpu_h200_996fc93_profile.json`):
# "blocks" stays the default.
# "columns", one per column block and residue, gathering its cells' table rows once and running over GROUPS
# row blocks (`PRODUCT_COLUMN_TILES`' stages pipelining the next block's rows of q / k): with one band every row
# of a column block meets the same table rows, and a program's loads are then its rows of q / k alone, read
# in order. The default since an H200 timed it the fastest of the three (GPU time of the kernel per call,
# forward and backward together, the setting held through both: 0.451 ms against 0.505 for "blocks" at
# N = 512, 0.843 against 0.955 at 2048; the calls 2.498 against 2.551 ms and 4.871 against 4.981;
# `benchmarks/results/attention_gpu_h200_a4b1134_profile.json`; forward alone at 8192 0.454 against 0.477,
# `attention_gpu_h200_16dabb5_profile.json`). Head dims other than 64 are compiled, not timed.
PRODUCT_PROGRAMS_MODES = ("blocks", "rows", "columns")
PRODUCT_PROGRAMS = "columns"
# The column loop's tiles (its shape and the stages of its loop over row blocks), by the table's row width:
# wider blocks store more bytes a loop step, and ncu found the kernel issue-bound (64.7% of issue slots busy at
# 64x64 w4 s3, integer address arithmetic the top stall: IMAD 30% of the samples; N = 2048, H200,
# `benchmarks/results/attention_ncu_h200_6ac7b47.md`), but a row's last block is padded to the block's width.
# Timed by kernel on an H200 (GPU time of a forward's two tables; `benchmarks/results/
# attention_gpu_h200_6ac7b47_tiles_product_columns.json`): at N = 2048 (one band, 1217 cells a row) 64x256 w8
# s3 0.369 ms against 0.439 for 64x64 w4 s3 and 0.381 for 64x128 w4 s3; at 512 (64-row bands, 577 cells)
# 64x128 w4 s3 0.199 against 0.226 and 0.221 for 64x256 w8 s3, whose blocks pad a row's 584 columns to 768.
# Both compile for sm_90 without spills at every head dim (tests/attention/compile_triton_kernels.py). At 64x256
# the issue rate no longer bounds it: a variant with a tenth fewer loop instructions took as long
# (docs/gpu-kernel.md, "Measured on an H200 (2026-11-27, sixth lease)").
PRODUCT_COLUMN_TILES = Tiles(64, 256, 8, 3)  # tables of PRODUCT_WIDE_CELLS cells a row or more
PRODUCT_NARROW_COLUMN_TILES = Tiles(64, 128, 4, 3)  # narrower ones
PRODUCT_WIDE_CELLS = 1024
PRODUCT_COLUMN_GROUPS = 8  # row blocks per "columns" program: at v3's N = 2048 1920 programs of 8 blocks
# How the product kernel stores the ends of each row (`triton_products`): "wrap", 16 bytes at a time like the
# rest, the cells a block reaches outside its row computed for the row they belong to (each cell written once),
# or "masked", element by element, the cells outside the row left out. A table is contiguous, so row m's cells
# -s … -1 are row m - 1's last ones; with "masked" the first and last block of every row stored element by
# element: 10% of the blocks at N = 2048, 20% at 512, 40% at 64×256 tiles, which ran the forward at 2048 in 1.70
# ms against 1.28 at 64×64 (H200, `benchmarks/results/attention_gpu_h200_7974afd_tiles_product.json`).
PRODUCT_EDGES_MODES = ("wrap", "masked")
PRODUCT_EDGES = "wrap"
# the tiles of "rows": PRODUCT_TILES' shape with three stages (one would leave the loop's loads unpipelined;
# with three Triton loads the table rows by asynchronous copies). Compiles for sm_90 without spills at head dims
# 16 to 128 under Triton 3.6 and 3.9 (tests/attention/compile_triton_kernels.py)
PRODUCT_ROW_TILES = Tiles(64, 64, 4, 3)


def _product_tiles(width: int) -> Tiles:
    """The product kernel's tiles for its programs (`PRODUCT_PROGRAMS`) and a table of ``width`` cells a row."""
    if PRODUCT_PROGRAMS == "rows":
        return PRODUCT_ROW_TILES
    if PRODUCT_PROGRAMS == "blocks":
        return PRODUCT_TILES
    return PRODUCT_COLUMN_TILES if width >= PRODUCT_WIDE_CELLS else PRODUCT_NARROW_COLUMN_TILES


def _tma_stores(heads: Tensor, m: int, vec: int) -> bool:
    """Whether the product kernel stores its inner blocks through a tensor descriptor (`PRODUCT_STORES`): on a
    GPU with the tensor-memory unit (compute capability 9 and later) or in the interpreter, where Triton has
    descriptors, with M a multiple of the elements in 16 bytes (the descriptor's strides and rows)."""
    if PRODUCT_STORES != "tma" or m % vec or _TensorDescriptor() is None:
        return False
    dev = heads.device
    return dev.type == "cpu" or (dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9)


@functools.cache
def _TensorDescriptor():  # noqa: N802 (a class)
    """Triton's host-side tensor descriptor class, or None where this Triton has none."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def _residue_descriptor(out: Tensor, vec: int, block: Tiles):
    """``out`` (H·BANDS, M, R + 1) as the product kernel's ``OUT_DESC``: (H·BANDS, VEC, M / VEC, R + VEC), rows
    of residue s modulo VEC at s·R + VEC·(R + 1)·i, a row's cell e in column s + e (`triton_products`)."""
    hb, m, width = out.shape
    return _TensorDescriptor()(
        out,
        shape=[hb, vec, m // vec, width - 1 + vec],
        strides=[m * width, width - 1, vec * width, 1],
        block_shape=[1, 1, block.block_m, block.block_n],
    )


def _product_kernel_serves(heads: Tensor, table: Tensor, cells: Tensor) -> bool:
    """Whether `DISTANCE_PRODUCT` has the kernel build this table: 16-bit operands of one dtype, (head, band)
    pairs within the launch grid's second axis. float32 tables stay with the matmul: IEEE float32 products run
    on the CUDA cores either way (cuBLAS's float32 kernels ask for 4-byte alignment only), and the kernel
    compiled for them spills registers at head dim 64 and 128 (tests/attention/compile_triton_kernels.py)."""
    _check_mode("DISTANCE_PRODUCT", DISTANCE_PRODUCT, DISTANCE_PRODUCT_MODES)
    half = heads.dtype in (torch.bfloat16, torch.float16) and table.dtype == heads.dtype
    return DISTANCE_PRODUCT == "triton" and half and heads.shape[0] * cells.shape[0] < 2**16


def _kernel_band_product(
    heads: Tensor,
    table: Tensor,
    cells: Tensor,
    batch: int,
    n: int,
    band: int,
    alpha: float,
    slack: int,
    pair: tuple[Tensor, Tensor] | None = None,
) -> Tensor | list[Tensor]:
    """`_band_product` by `triton_products`: the same table, laid out the same way, from q / k and the
    position table read in place. With ``pair`` (k and Qr, at the strides of ``heads`` and ``table``) both
    tables in one launch, ``cells`` their (2, bands, cells) (`_paired_products`): [ROW, COL], in one buffer."""
    H, d = heads.shape[0], heads.shape[2]
    bands, width = cells.shape[-2:]
    per_band = band if band else _distance_padded_rows(n, band)  # rows per band of each batch row
    m = batch * per_band
    count = 1 if pair is None else 2
    flats, outs = _product_buffers(count, H * bands, m, width, heads.dtype, heads.device, slack, band > 0)
    if POISON_DISTANCE_BUFFERS:  # (the tests) a cell the kernel misses stays NaN
        for out in outs:
            out.fill_(float("nan"))
    heads, table = (t if t.stride(-1) == 1 else t.contiguous() for t in (heads, table))
    cells = cells.contiguous()  # the kernel reads it as (bands, WIDTH) rows, COL's after ROW's
    _check_mode("PRODUCT_PROGRAMS", PRODUCT_PROGRAMS, PRODUCT_PROGRAMS_MODES)
    _check_mode("PRODUCT_STORES", PRODUCT_STORES, PRODUCT_STORES_MODES)
    _check_mode("PRODUCT_EDGES", PRODUCT_EDGES, PRODUCT_EDGES_MODES)
    row_loop, col_loop = PRODUCT_PROGRAMS == "rows", PRODUCT_PROGRAMS == "columns"
    t = _product_tiles(width)
    vec = 16 // heads.element_size()  # a program's rows share their residue modulo vec (`triton_products`)
    tma = pair is None and _tma_stores(heads, m, vec)
    # "wrap" reads row m - 1 as the token before row m's: rows per band a multiple of vec (always, as laid out)
    wrap = PRODUCT_EDGES == "wrap" and per_band % vec == 0
    blocks = triton_cdiv(m, vec * t.block_m) * vec  # row blocks, each of one residue
    if col_loop:  # runs of PRODUCT_COLUMN_GROUPS row blocks of one residue
        blocks = triton_cdiv(blocks // vec, PRODUCT_COLUMN_GROUPS) * vec
    if not row_loop:
        blocks *= triton_cdiv(width - 1 + vec, t.block_n)  # and column blocks
    grid = (blocks, count * H * bands)
    launcher(_products()._distance_product_kernel)[grid](
        heads,
        table,
        cells,
        outs[0],
        _residue_descriptor(outs[0], vec, t) if tma else None,
        alpha,
        heads.stride(0),
        heads.stride(1),
        table.stride(0),
        table.stride(1),
        n,
        per_band,
        bands,
        width - 1,
        m,
        heads if pair is None else pair[0],
        table if pair is None else pair[1],
        0 if pair is None else flats[1].storage_offset() - flats[0].storage_offset(),  # OFF2
        D=d,
        VEC=vec,
        PREC=_precision(heads),
        TMA=tma,
        ROW_LOOP=row_loop,
        WRAP=wrap,
        COL_LOOP=col_loop,
        GROUPS=PRODUCT_COLUMN_GROUPS,
        PAIR=pair is not None,
        **_launch(t),
    )
    return flats[0] if pair is None else flats


def _distance_slack(cells: int, nq: int, nk: int, band: int = 0) -> int:
    """Zeros after a distance table's last (b, h): what a tile whose rows or columns run past the end reads
    beyond it, at most `FAR_PAD` (the largest tile side) rows of ``cells`` and the other side's padded length
    (`triton_kernels._distance_terms`)."""
    return (
        (FAR_PAD + 1) * cells
        + max(_distance_padded_rows(nq, band), _distance_padded_rows(nk, band))
        + FAR_PAD
    )


def _distance_rows(flat: Tensor, heads: int, batch: int, n: int, cells: int) -> Tensor:
    """A distance table of one band as (H, B, N', cells), N' = `_padded_rows` (n): a view of ``flat``."""
    rows = _padded_rows(n)
    return flat[: heads * batch * rows * cells].view(heads, batch, rows, cells)


def _end_rows(lut: Tensor) -> Tensor:
    """The table rows of the two saturated ends, left and right: the first and last LUT entry (the kernels'
    `_ends`; the LUT's padding repeats its right end, `_lut`). A view: int32 indexes as well as int64."""
    return lut[:: lut.numel() - 1]


def _skew_ends(lut: Tensor, skew: bool) -> Tensor | None:
    """The table rows a skewed call still needs from ROW / COL: the two saturated ends; None (every row)
    otherwise."""
    return _end_rows(lut) if skew else None


def _far_columns(
    col: Tensor | None,
    lut: Tensor,
    ends_only: bool,
    k_mask: Tensor | None,
    shape: tuple[int, int, int],
    device,
) -> Tensor:
    """FAR (H, B, 2, Nk padded to `FAR_PAD`) float32 for ``shape`` = (H, B, Nk): the far tiles'
    value of each key column on the left and on the right (`triton_kernels._far_col`), COL's two saturated
    entries (0 without p2c; with ``ends_only`` COL holds only them, (H, B·Nk, 2): a skewed call's, or (H, B,
    Nk, 2), the two cells a distance table's row holds them in: `_distance_ends`), -inf where the key is masked
    and in the padding, so that a far tile hides those keys without a mask of its own. Two contiguous rows per
    (h, b): one unmasked vector load per far tile instead of COL's strided entries and the key mask (see
    docs/gpu-kernel.md, "What it declines, and how it works")."""
    heads, batch, nk = shape
    width = triton_cdiv(nk, FAR_PAD) * FAR_PAD
    far = torch.empty((heads, batch, 2, width), dtype=torch.float32, device=device)
    if width > nk:  # (a launch per call saved where Nk is a multiple of FAR_PAD)
        far[..., nk:].fill_(float("-inf"))
    if col is None:
        far[..., :nk].fill_(0.0)
    else:
        ends = col if ends_only else col[..., _end_rows(lut)]  # (H, B·Nk, 2)
        far[..., :nk] = ends.view(heads, batch, nk, 2).transpose(-1, -2)
    if k_mask is not None:
        far[..., :nk].masked_fill_((k_mask == 0)[None, :, None, :], float("-inf"))
    return far


def _position_args(pos_q: Tensor | None, pos_k: Tensor | None, skew: bool, fallback: Tensor) -> tuple:
    """PQ, PK, TR of the kernels: the position tables a skewed kernel reads (``fallback`` where unused)."""
    table = pos_k if pos_k is not None else pos_q
    return (
        pos_q if skew and pos_q is not None else fallback,
        pos_k if skew and pos_k is not None else fallback,
        table.shape[1] if table is not None else 1,
    )


def _precision(t: Tensor) -> int:
    """The kernels' PREC for operands like ``t`` (`triton_kernels._mm`): tensor cores for 16-bit inputs on a GPU,
    IEEE float32 for float32 ones, and on the CPU (the interpreter) 16-bit operands widened first."""
    return 2 if t.device.type != "cuda" else (1 if t.dtype == torch.float32 else 0)


def _flags(
    q: Tensor,
    row: Tensor | None,
    col: Tensor | None,
    q_seg,
    k_mask,
    causal: bool,
    ij: bool,
    dropout: bool,
    far_tiles: bool,
) -> dict:
    """The kernels' feature flags (constexprs). FAR_TILES (`_far_tiles`): without it a program's loop is one near
    run, whose backward sums no saturated pair (`triton_kernels._NEAR_ONLY`; `ONE_NEAR_RUN`)."""
    return dict(
        IJ=ij,
        FAR_TILES=far_tiles or not ONE_NEAR_RUN,
        DROPOUT=dropout,
        HAS_ROW=row is not None,
        HAS_COL=col is not None,
        HAS_SEG=q_seg is not None,
        HAS_KMASK=k_mask is not None,
        CAUSAL=causal,
        PREC=_precision(q),
    )


_BMM_OUT_DTYPE = "dtype" in torch.ops.aten.bmm.overloads()  # bmm(..., out_dtype=): PyTorch 2.8 and later
# baddbmm(..., out_dtype=, out=): likewise
_BADDBMM_OUT_DTYPE = "dtype_out" in torch.ops.aten.baddbmm.overloads()


def _on_tensor_cores(a: Tensor, b: Tensor, out_dtype: bool) -> bool:
    """Whether a float32 product of ``a`` and ``b`` runs on their 16-bit operands (``out_dtype``: the PyTorch
    at hand has the op's float32-result overload). On a GPU with 16-bit operands the product runs on the tensor
    cores with a float32 result (exact products, float32 accumulation: what the kernels compute from the same
    operands); float32 operands on CUDA cores would be an order of magnitude slower for the same numbers.
    Elsewhere (the CPU interpreter, float32 inputs) the operands are widened to float32: CPU has no 16-bit ->
    float32 bmm."""
    half = a.dtype in (torch.float16, torch.bfloat16) and b.dtype == a.dtype
    return half and a.device.type != "cpu" and out_dtype


def _matmul_f32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` as float32 per head, a (H, M, K), b (H, K, N) (`_on_tensor_cores`). Operands with a unit
    stride in either of their last two dims are read in place (cuBLAS takes any row stride and batch stride),
    so `_per_head` views cost no copy."""
    if _on_tensor_cores(a, b, _BMM_OUT_DTYPE):
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


def _add_matmul_f32(out: Tensor, a: Tensor, b: Tensor, alpha: float, beta: float = 1.0) -> None:
    """``out = beta · out + alpha · a @ b`` per head, ``out`` (H, M, N) float32, in place, as `_matmul_f32`
    multiplies. The sum is the product's epilogue (cuBLAS's beta = 1): no float32 (H, M, N) product in memory and
    no separate kernel to add it; with ``beta`` 0 ``out`` is written only (not read: NaN in it stays out).
    ``out`` may be a strided view with a unit stride in its last dim (cuBLAS writes it through its row and batch
    strides: a `_per_head` view of a gradient)."""
    if _on_tensor_cores(a, b, _BADDBMM_OUT_DTYPE):
        torch.baddbmm(out, a, b, out_dtype=torch.float32, beta=beta, alpha=alpha, out=out)
    else:
        out.baddbmm_(a.float(), b.float(), beta=beta, alpha=alpha)


def _per_head(t: Tensor) -> Tensor:
    """(B, H, N, c) ``t`` as (H, B·N, c): the rows of each head across the batch, the layout of the tables and
    distance buffers (see `triton_kernels`). A view when ``t`` is a (B, N, H, c) tensor viewed as (B, H, N, c)
    (what the projections give), a copy otherwise."""
    B, H, N, C = t.shape
    return t.permute(1, 0, 2, 3).reshape(H, B * N, C)


def _per_head_view(t: Tensor) -> Tensor | None:
    """(B, H, N, c) ``t`` as an (H, B·N, c) view that writes through to it (`_per_head`'s layout), or None
    where its strides admit none: a (B, N, H, c) tensor viewed as (B, H, N, c) has one, a contiguous (B, H, N,
    c) one only at B = 1."""
    B, H, N, C = t.shape
    t = t.permute(1, 0, 2, 3)
    return t.reshape(H, B * N, C) if B == 1 or t.stride(1) == N * t.stride(2) else None


def _tables(
    q_heads: Tensor | None,
    k_heads: Tensor | None,
    query_rows: int,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    p2p: bool,
    rows: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """ROW = Q·Krᵀ + p2p (H, B·Nq, R) and COL = K·Qrᵀ (H, B·Nk, R), float32, unscaled (the kernels scale each
    score once: see `triton_kernels`), from q and k per head (`_per_head`; given where c2p / p2c are used);
    ``query_rows`` = B·Nq. With ``rows``, only those rows of the tables (the skewed kernels need the two
    saturated ends)."""
    if rows is not None:
        pos_q = None if pos_q is None else pos_q[:, rows]
        pos_k = None if pos_k is None else pos_k[:, rows]
    row = col = None
    if q_heads is not None:  # c2p
        row = _matmul_f32(q_heads, pos_k.transpose(-1, -2))
    if p2p:
        bias = (pos_q.float() * pos_k.float()).sum(-1)[:, None, :]  # (H, 1, R)
        row = bias.expand(-1, query_rows, -1) if row is None else row.add_(bias)
    if k_heads is not None:  # p2c
        col = _matmul_f32(k_heads, pos_q.transpose(-1, -2))
    return (None if row is None else row.contiguous()), (None if col is None else col.contiguous())


class _PositionInputs(NamedTuple):
    """What a call's kernels need of the position terms, built the same way in both directions (the backward
    rebuilds the tables: nothing N×R is saved)."""

    skew: bool  # the near band from the position tables (`_uses_skew`)
    dist: bool  # ROW and COL laid out by distance (`_uses_distance`, `_distance_tables`)
    row: Tensor | None  # ROW, float32 per head; skewed: its two saturated ends only; by distance: see there
    col: Tensor | None  # COL, likewise
    far: Tensor | None  # FAR (`_far_columns`), where ROW or COL is and far tiles can occur
    R: int  # their width (by distance: the row step, one less than the rows' cells)
    PQ: Tensor  # the kernels' position-table arguments (`_position_args`)
    PK: Tensor
    TR: int
    q_heads: Tensor | None  # q per head (`_per_head`) where c2p is used, k where p2c is: made once per call
    k_heads: Tensor | None


def _position_inputs(
    q: Tensor,
    k: Tensor,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    lut: Tensor,
    c2p: bool,
    p2c: bool,
    p2p: bool,
    ij: bool,
    dropout: bool,
    k_mask: Tensor | None,
    far_tiles: bool,
    kernels: tuple[str, ...],
    cells: Tensor | None,
    sat: int,
    scale: float,
    band: int,
    kept: tuple[Tensor | None, Tensor | None, Tensor | None] | None = None,
) -> _PositionInputs:
    """What the kernels of ``kernels`` read of the position terms. With ``kept``, ROW, COL and FAR as the
    forward built them on the distance road (`KEEP_TABLES`): not built again."""
    skew = _uses_skew(q, pos_q, pos_k, ij, p2p, dropout, kernels)
    dist = cells is not None  # (given where `_uses_distance`: never with skew)
    q_heads = _per_head(q) if c2p else None
    k_heads = _per_head(k) if p2c else None
    (B, H, NQ, _), NK = q.shape, k.shape[2]
    PQ, PK, TR = _position_args(pos_q, pos_k, skew, q)
    if dist and kept is not None:
        row, col, far = kept
        return _PositionInputs(skew, dist, row, col, far, cells.shape[2] - 1, PQ, PK, TR, q_heads, k_heads)
    if dist:
        reach = cells.shape[2] // 2
        row, col = _distance_tables(q_heads, k_heads, pos_q, pos_k, cells, scale * LOG2E, (B, NQ, NK), band)
        R = cells.shape[2] - 1
    else:
        row, col = _tables(q_heads, k_heads, B * NQ, pos_q, pos_k, p2p, rows=_skew_ends(lut, skew))
        R = _table_rows(row, col)
    # FAR only where a far tile may read it (`_far_tiles`): most calls launch nothing for it
    far = None
    if (row is not None or col is not None) and far_tiles:  # (with one band: `_distance_layout`)
        ends = col if col is None or not dist else _distance_ends(col, H, B, NK, reach, sat)
        far = _far_columns(ends, lut, skew or dist, k_mask, (H, B, NK), q.device)
    if dist:  # the kernels read ROW / COL from row 0's cell of distance 0 (`triton_kernels._distance_terms`)
        first = _distance_offset(band, cells.shape[2])
        row, col = (None if t is None else t[first:] for t in (row, col))
    return _PositionInputs(skew, dist, row, col, far, R, PQ, PK, TR, q_heads, k_heads)


def _distance_ends(col: Tensor, heads: int, batch: int, nk: int, reach: int, sat: int) -> Tensor:
    """COL's two saturated values per key, left and right, from its distance table: the cells of distance
    i - j = -sat and +sat, (H, B, Nk, 2), a view (the two cells lie 2·sat apart in each row): `_far_columns`
    copies them into FAR in its one copy. Neither a list index, which would copy itself from host memory in
    every call, waiting for the GPU (and failing inside a CUDA graph's capture), nor a stack of the two columns,
    a kernel of its own (0.018 ms of the forward at N = 2048 on an H200, `CatArrayBatchedCopy` in
    `benchmarks/results/attention_gpu_h200_3896d8b_profile.json`)."""
    per_row = _distance_rows(col, heads, batch, nk, 2 * reach + 1)[:, :, :nk]
    return per_row[..., reach - sat : reach + sat + 1 : 2 * sat]


def _table_rows(row: Tensor | None, col: Tensor | None) -> int:
    table = row if row is not None else col
    return 1 if table is None else table.shape[-1]


def _kernel_layout(t: Tensor) -> Tensor:
    """(B, H, N, d) ``t`` as the kernels read it: itself when it is contiguous, or a contiguous (B, N, H, d)
    tensor viewed as (B, H, N, d) (what `split_heads` gives: no copy), else a contiguous copy. Both layouts are
    dense, so ``empty_like`` gives the output and the gradients the same strides (see `triton_kernels`)."""
    return t if t.is_contiguous() or t.transpose(1, 2).is_contiguous() else t.contiguous()


def _like(t: Tensor, ref: Tensor) -> Tensor:
    """``t`` with the strides of ``ref`` (the kernels read both through one set of strides): a copy only when
    they differ."""
    return t if t.stride() == ref.stride() else torch.empty_like(ref, dtype=t.dtype).copy_(t)


def _strides(q: Tensor, k: Tensor) -> tuple[int, ...]:
    """SQB, SQH, SQN, SKB, SKH, SKN: the kernels' strides of the query side (Q, OUT, DO, DQ) and of the key side
    (K, V, DK, DV)."""
    return (*q.stride()[:3], *k.stride()[:3])


def _or_unused(t: Tensor | None, device: torch.device, dtype: torch.dtype = torch.int32) -> Tensor:
    """``t``, or where it is absent a one-element stand-in for a kernel argument that the kernel's flags keep
    it from reading (nor does any kernel write it). Uninitialised (``empty``: ``zeros`` would launch a GPU
    kernel to fill it) and kept per device and dtype (`_STAND_INS`; not one made while a CUDA graph is
    captured, which would live in the graph's memory pool: see `relative.kept`): a forward passes up to seven,
    a backward more, each an allocation per call otherwise."""
    if t is not None:
        return t
    stand_in = _STAND_INS.get((device, dtype))
    if stand_in is None:
        with torch.inference_mode(False):  # a normal tensor, whatever mode the first call ran in
            stand_in = torch.empty(1, dtype=dtype, device=device)
        if not capturing_cuda_graph():
            _STAND_INS[device, dtype] = stand_in
    return stand_in


# (a plain dict, never dropped: unlike `relative.kept`'s entries, which a graph captured with them could outlive,
# one made before a capture may serve inside it)
_STAND_INS: dict[tuple[torch.device, torch.dtype], Tensor] = {}


def _draw_seed(device: torch.device) -> Tensor:
    """A dropout seed: one int64 drawn on ``device`` from its default generator (as the other backends' masks
    are), which the kernels read from memory. A number passed as a kernel argument would be baked into a
    captured CUDA graph (``mode="reduce-overhead"``): the same mask at every replay. Drawn on the device, the
    draw is part of the graph and every replay gets a new seed; nothing waits for the GPU."""
    return torch.randint(0, 1 << 62, (1,), dtype=torch.int64, device=device)


def _dropout_args(seed: Tensor | None, threshold: int, device: torch.device) -> dict:
    """Kernel arguments of the dropout: seed tensor, 16-bit threshold, scale of the kept probabilities (the
    scale of `dropout.keep_mask`: 1 / (1 - rounded p))."""
    if seed is None or threshold == 0:
        return dict(SEED=_or_unused(None, device, torch.int64), DROP_T=0, drop_scale=1.0)
    return dict(SEED=seed, DROP_T=threshold, drop_scale=kept_scale(threshold))


class _Aux(NamedTuple):
    """The ops' tensor inputs that take no gradient, passed as one list (``aux``; see `_Config`)."""

    lut: Tensor  # the lookup table, cut to the rows the call indexes (`_lut`)
    q_pos: Tensor  # int32 position, segment and key-mask rows (`_geometry_inputs`)
    k_pos: Tensor
    q_seg: Tensor | None
    k_seg: Tensor | None
    k_mask: Tensor | None
    kv_lo: Tensor  # the key blocks each query block visits, and the converse (`_key_ranges`)
    kv_hi: Tensor
    q_lo: Tensor
    q_hi: Tensor
    seed: Tensor | None  # the dropout seed (`_draw_seed`)
    cells: Tensor | None  # the distance tables' cells (`_distance_cells`)
    q_lut: Tensor | None  # the query rows' distance buffer's lookup table (`_mirrored`), where ROW is read
    fwd_cells: Tensor | None  # the forward's cells where they differ (`_table_layouts`, `_forward_cells`)


AUX_COUNT = len(_Aux._fields)  # `_Aux`'s tensors; the backward's ``aux`` may hold the kept tables after them


class _Config(NamedTuple):
    """The ops' integer and boolean settings, passed as one ``list[int]`` (``config``). The ops take their inputs
    in groups because `torch.library.custom_op`'s autograd wrapper rebuilds the schema's arguments once per
    argument in every forward with grad (``torch._library.utils.fill_defaults``: each ``schema.arguments``
    access builds every argument anew), a cost quadratic in their number: with the 27 arguments the forward had
    it took 155 µs a call on the CPU here, against 16 µs now (`benchmarks/triton_dispatch.py`), in every layer of
    a training step."""

    sat: int
    c2p: bool
    p2c: bool
    p2p: bool
    causal: bool
    ij: bool
    far_tiles: bool
    drop_t: int
    band: int  # the distance tables' rows per band (`_distance_layout`), the backward's
    fwd_band: int  # and the forward's (`_table_layouts`)
    edges: bool  # the forward's tables cut to the saturation (`FORWARD_REACH`, `_cuts_forward_tables`)

    def values(self) -> list[int]:
        """The op's ``config`` list (booleans travel as 0 / 1)."""
        return [int(x) for x in self]

    @classmethod
    def of(cls, values: list[int]) -> _Config:
        """The settings from the op's ``config`` list."""
        sat, c2p, p2c, p2p, causal, ij, far_tiles, drop_t, band, fwd_band, edges = values
        flags = (c2p, p2c, p2p, causal, ij, far_tiles)
        return cls(sat, *(x == 1 for x in flags), drop_t, band, fwd_band, edges == 1)


def _fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    aux: list[Tensor | None],
    scale: float,
    config: list[int],
) -> tuple[Tensor, Tensor]:
    """(out (B, H, Nq, D) in q's dtype, float32 with dropout (`_out_dtype`), logsumexp (B, H, Nq) float32 in
    base 2 (see `triton_kernels`); +inf on rows with no visible key). ``aux``: `_Aux`'s tensors, ``config``:
    `_Config`'s values."""
    with _on_device(q.device):  # (the custom op's body, which a compiled graph calls)
        out, lse, _ = _forward(q, k, v, pos_q, pos_k, aux, scale, config)
    return out, lse


def _forward(q, k, v, pos_q, pos_k, aux, scale, config) -> tuple[Tensor, Tensor, _PositionInputs]:
    """`_fwd` (the same arguments): its out and lse, and the position inputs its kernel read (the tables a
    backward may keep)."""
    dev = q.device
    lut, q_pos, k_pos, q_seg, k_seg, k_mask, kv_lo, kv_hi, _, _, seed, cells, _, fwd_cells = _Aux(*aux)
    sat, c2p, p2c, p2p, causal, ij, far_tiles, drop_t, _, band, edges = _Config.of(config)
    with _autocast_off(dev.type):
        B, H, NQ, D = q.shape
        NK = k.shape[2]
        inputs = _position_inputs(
            q, k, pos_q, pos_k, lut, c2p, p2c, p2p, ij, drop_t > 0, k_mask, far_tiles, FORWARD,
            cells if fwd_cells is None else fwd_cells, sat, scale, band,
        )  # fmt: skip
        skew, dist, row, col, far, R, PQ, PK, TR, _, _ = inputs
        out = torch.empty_like(q, dtype=_out_dtype(q, drop_t))
        lse = torch.empty((B, H, NQ), dtype=torch.float32, device=dev)
        t = tiles_for(dev, D, "_fwd_kernel", drop_t > 0, skew)
        grid = (triton_cdiv(NQ, t.block_m) * B * H,)
        launcher(_kernels()._fwd_kernel)[grid](
            q, k, v,
            _or_unused(row, dev, torch.float32), _or_unused(col, dev, torch.float32),
            _or_unused(far, dev, torch.float32), lut, PQ, PK,
            q_pos, k_pos, _or_unused(q_seg, dev), _or_unused(k_seg, dev), _or_unused(k_mask, dev),
            kv_lo, kv_hi, out, lse, *_strides(q, k),
            H, B, NQ, NK, R, _log2_band(band), sat, TR, scale, **_dropout_args(seed, drop_t, dev),
            HEAD_DIM=D, **_launch(t), **_flags(q, row, col, q_seg, k_mask, causal, ij, drop_t > 0, far_tiles),
            SKEW=skew, DIST=dist, WT=t.skew_width, EDGES=dist and edges,
            FAR_N=_far_keys(FORWARD_FAR_KEYS, t.block_n, dist and far_tiles, D, q_seg is not None, drop_t > 0),
        )  # fmt: skip
    return out, lse, inputs


def _autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Autocast off for the ops around the kernels (products, folds: in the inputs' dtype, as without autocast)
    where the caller has it on; where it is off, or autocast does not know the device (``meta``, on which
    `benchmarks/triton_host_cost.py` records a call's ops), no context: entering and leaving ``torch.autocast``
    costs host time in every call of every layer."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """``device`` made the current CUDA device for a call's launches where another is: Triton launches on the
    current device (its driver's ``get_current_device``, as the shorter path does), so a call on ``cuda:1``
    made while ``cuda:0`` is current would launch its kernels on the other device. No context where it is
    current already, or off CUDA (entering one costs host time in every call of every layer)."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


_fwd_op = torch.library.custom_op("debertakit::disentangled_attention_fwd", _fwd, mutates_args=())


def _out_dtype(q: Tensor, drop_t: int) -> torch.dtype:
    """The forward's output dtype: q's, or float32 with dropout. The backward's DELTA = dO·O per row stands for
    Σ_j P·dP, exactly only with the exact O. With dropout a row's O is not a convex combination of the values
    but 1/(1 - p) times a part of one, rounded: in 16 bits that rounding passes into every dS of the row, and
    dK sums it over the rows (`test_bfloat16_dropout_gradients_are_as_close_to_float32_as_without_dropout`:
    bfloat16, N = 64, padded rows, against float32 eager, dK off by 1.8% of its largest value with a 16-bit O,
    0.4% with this one). So the forward writes O in float32 there, the caller rounds the copy it returns, and
    the backward reads the exact one."""
    return torch.float32 if drop_t > 0 else q.dtype


@_fwd_op.register_fake
def _(q, k, v, pos_q, pos_k, aux, scale, config):
    drop_t = config[_Config._fields.index("drop_t")]
    return torch.empty_like(q, dtype=_out_dtype(q, drop_t)), q.new_empty(q.shape[:3], dtype=torch.float32)


# Set by the tests: the distance buffers that the kernels write whole, and the distance tables that
# `triton_products` writes, are filled with NaN before the kernels run instead of left as the allocator hands
# them out, so that a cell the kernels miss poisons the results.
POISON_DISTANCE_BUFFERS = False


# The distance buffers' rows are padded to a multiple of this many cells. cuBLAS's tensor-core kernels read
# 16-byte vectors and ask for operands, row strides and dimensions aligned to them (its documentation's tensor
# core restrictions); at v3's 2·512 + 1 = 1025 cells, an odd row stride, the folds' four products ran on a
# one-element-aligned kernel (`cutlass_75_..._align1`), 1.9 ms of the backward at every N on an H100
# (`benchmarks/attention_gpu.py --sections profile`; docs/gpu-kernel.md, "Measured on an H100"). Sixteen cells
# also let Triton specialise the kernels' row stride ``DW`` as divisible by 16, as it does the activations'
# strides.
DIST_ALIGN = 16


def _distance_stride(sat: int) -> int:
    """The distance buffers' row stride: their 2·sat + 1 cells rounded up to `DIST_ALIGN`."""
    return _aligned(2 * sat + 1)


def _distance_buffer(heads: int, rows: int, stride: int, dtype: torch.dtype, dev, ij: bool) -> Tensor:
    """A distance-space gradient buffer (H, B·N, W'): each row's W = 2·sat + 1 cells, then zero columns up to
    W' (``stride``: the kernels' row stride ``DW``, `_distance_stride`). At distance i - j the
    backward kernels write every cell, zeros included (`triton_kernels._table_grad`, `_zero_unvisited`, the
    padding in `_store_row_ends`): the buffer is allocated without a fill, which would write it whole once more
    (at v3-base sizes a fifth to a quarter of the backward's traffic outside the kernels:
    `benchmarks/triton_host_cost.py`). With explicit positions they store visible pairs only: zero-filled."""
    if not ij:
        return torch.zeros((heads, rows, stride), dtype=dtype, device=dev)
    buffer = torch.empty((heads, rows, stride), dtype=dtype, device=dev)
    if POISON_DISTANCE_BUFFERS:
        buffer.fill_(float("nan"))
    return buffer


# The backward's distance-space gradients in the tables' bands where that narrows their rows
# (`_gradient_stride`); False keeps one band's rows always, as before 2026-11-26 (the benchmark's row "triton
# (gradients in one band)" times the two side by side)
GRADIENT_BANDS = True

# How the backward kernels store the distance-space gradients on the distance road. "aligned": in the distance
# tables' own rows at their odd row stride DW ≡ 1 (mod 16), in bands or in one band (`_gradient_stride`), where
# a row's cells for a tile's partners start 16-byte aligned and every pair of a near tile has its cell, so the
# kernels store 16 bytes at a time under the row mask alone (`triton_kernels._table_grad`, ``GRAD_BANDS``),
# and the folds read the buffer by residue classes of rows (`_residue_rows`). "cells": banded rows at their
# stride rounded up to 16 and one band's 2·sat + 1 cells rounded up, each tile row's first cell one element
# further than the last row's, stored element by element, the saturated pairs of a near tile summed (as before
# 2026-11-27; the benchmark's row "triton (gradient stores by cell)"). Compiled for sm_90 at the GPU tiles
# (bf16, d 64: `benchmarks/triton_store_cost.py`) "aligned" takes dQ's near loop from 587 instructions a
# thread to 447 and 149 registers to 128, dK/dV's from 673 to 537 and 246 registers to 187 without far tiles
# (Triton 3.6; with them: docs/gpu-kernel.md, "One band's gradients stored 16 bytes at a time").
GRADIENT_STORES_MODES = ("aligned", "cells")
GRADIENT_STORES = "aligned"
RESIDUES = 8  # rows per residue class of an "aligned" buffer: its row stride is 8 cells modulo 16
# Whether an eager forward on the distance road keeps its tables (ROW, COL and FAR) for the backward, which
# otherwise builds them again (`_position_inputs`): memory for speed. The backward's product is about 9% of a
# forward+backward at v3's N = 2048 (half of the two products' 0.843 ms in 4.871 on an H200, the column loop's
# row of `benchmarks/results/attention_gpu_h200_a4b1134_profile.json`), and the tables stay in memory from the
# forward to the backward: two of H · B·N · (2·reach + 1) 16-bit cells a layer (0.96 GB at v3's N = 2048 with
# 12 heads and batch·N = 16384: `benchmarks/triton_host_cost.py`, the rows "distance, tables kept"). Off by
# default: timed once per call on an H200 it was slower at 2048 (5.632 ms against 5.036 forward+backward,
# `benchmarks/results/attention_gpu_h200_6305bd1_kept.json`), not yet profiled. Compiled graphs run the custom
# ops, whose backward builds them again either way.
KEEP_TABLES = False


def _by_residues(stride: int) -> bool:
    """Whether gradient buffers at this row stride are "aligned" ones (`GRADIENT_STORES`): 1 modulo 16, so
    that the kernels store them 16 bytes at a time (``GRAD_BANDS``) and the folds read them by residue classes
    (`_residue_rows`); "cells" strides are multiples of 16."""
    return stride % DIST_ALIGN == 1


def _stored_reach(nq: int, nk: int, t_dq: Tiles, t_dkv: Tiles, sat: int, far_tiles: bool) -> int:
    """The largest |i - j| of a pair whose dS the backward kernels may store in a cell of its own (one band's
    rows with the stores 16 bytes wide: `_gradient_stride`): any pair of the blocks their loops visit, the
    partners' blocks running past the end to whole tiles; with far tiles, any pair of a near run
    (`triton_kernels._split`: less than sat + BLOCK_M + BLOCK_N - 2 apart), the far tiles only summing."""
    farthest = max(
        triton_cdiv(nk, t_dq.block_n) * t_dq.block_n, triton_cdiv(nq, t_dkv.block_m) * t_dkv.block_m
    )
    if far_tiles:
        return min(farthest - 1, sat + max(t.block_m + t.block_n for t in (t_dq, t_dkv)) - 3)
    return farthest - 1


def _gradient_stride(sat: int, band: int, cells: Tensor | None, farthest: int) -> int:
    """The row stride of the backward's distance-space gradient buffers: one band's 2·sat + 1 cells rounded up
    (`_distance_stride`: the "classic" layout), or the distance tables' own rows (the buffers then take the
    tables' layout, `_gradient_buffer`, and the kernels store a row's cells by partner, ``GRAD_BANDS``):

    - where the tables are in bands (``band`` > 0) and their rows are narrower: theirs rounded up
      (`GRADIENT_STORES` "cells") or as they are, 1 modulo 16 ("aligned": a band's N' + band + 1 cells are that
      already). At v3's N = 512, 577 cells a row against 1040: the kernels store and the folds read 44% fewer.
      A packed row longer than the saturation, of shorter sequences, has banded tables (no far tile) whose
      rows may be the wider: the classic layout then.
    - with one band ("aligned"): the tables' 2·reach + 1 cells, 1 modulo 32, where reach is beyond every pair
      the kernels store (``farthest``, `_stored_reach`): every pair of a near tile then has its cell, the
      saturated ones too (they fold as the table's end rows), so the kernels store 16 bytes at a time under
      the row mask alone and sum no saturated pair of a near tile; the far tiles' sums keep the end cells.
      At v3 with far tiles (N > 512) 1217 cells a row against 1040 at 64×32 tiles; at N = 128, 257.

    The kernels tell the layouts apart by this stride, LOG2_BAND and ``GRAD_BANDS``
    (`triton_kernels._grad_rows`)."""
    _check_mode("GRADIENT_STORES", GRADIENT_STORES, GRADIENT_STORES_MODES)
    one = _distance_stride(sat)
    if cells is None:
        return one
    width = cells.shape[2]
    if band == 0:
        aligned = GRADIENT_STORES == "aligned" and width // 2 > farthest
        return width if aligned else one
    if not (GRADIENT_BANDS and _aligned(width) < one):
        return one
    if GRADIENT_STORES == "aligned":
        return _aligned(width - 1) + 1
    return _aligned(width)


def _gradient_buffer(
    heads: int, batch: int, n: int, band: int, stride: int, dtype: torch.dtype, dev, ij: bool
) -> Tensor:
    """A distance-space gradient buffer for ``n`` rows per (b, h): (H, B·N, stride) in the classic layout
    (``band`` 0, `_distance_buffer`); in the tables' layout (H, bands, B, band, stride) flat as (H, B·N',
    stride), N' the rows padded to whole bands (one band of `_padded_rows` (n) where the tables have one). The
    kernels write every cell of the rows they own (`triton_kernels._grad_rows`); the padding rows, which no
    program owns, are zeroed here (a strided view of the last band)."""
    if not band:
        return _distance_buffer(heads, batch * n, stride, dtype, dev, ij)
    padded = _distance_padded_rows(n, band)
    buffer = _distance_buffer(heads, batch * padded, stride, dtype, dev, ij)
    if padded > n:
        per_band = buffer.view(heads, padded // band, batch, band, stride)
        per_band[:, -1, :, n - (padded - band) :].zero_()
    return buffer


class _FoldSide(NamedTuple):
    """One side of the backward's folds on the distance road (`_fold_bands`): dQ's (ROW's cells, Kr's rows, q)
    or dK's (COL's, Qr's, k)."""

    dist: Tensor  # the distance-space gradient buffer in the tables' layout (`_gradient_buffer`)
    table: Tensor  # the position table (H, R, d) its cells stand for: Kr for dQ's side, Qr for dK's
    x: Tensor  # the content (B, H, N, d): q for dQ's side, k for dK's, through its strides
    heads: Tensor  # ``x`` per head (`_per_head`), which the cuBLAS folds read band-major
    cells: Tensor  # (bands, cells) the table row each cell stands for (`_distance_cells`)
    grad: Tensor  # dQ or dK (B, H, N, d), float32, the kernels' part
    n: int  # tokens per batch row
    band: int  # rows per band and batch row (with one band: the padded rows)


def _fold_bands(side: _FoldSide, batch: int, scale: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """`_fold_into_content` and `_fold_into_table` for a gradient buffer in bands (`_gradient_buffer`): per
    (head, band) its (B·band, cells) rows against the position-table rows its ``cells`` (bands, cells) index
    (`_distance_cells`, the tables' own: a band's cell e stands for the same distance in the gradient as in the
    table), added to ``grad`` (B, H, N, d, float32) from a float32 (H, B·N', d) product read in place (no copy
    into ``grad``'s order: `_add_bands`, which writes the sum in ``dtype``; with one band of unpadded rows in
    ``grad``'s per-head view, `_per_head_view`, the products add into it in their epilogue), and against the
    content rows, folded into the table's rows through the cells. Returns ``grad`` with the product added (in
    ``dtype`` where `_add_bands` or the fold kernel wrote it, else ``grad`` itself) and the table's gradient (H,
    R, d), float32. With `FOLD_PRODUCT` or `FOLD_SUMS` "triton" the product or the sums of a buffer at an odd
    row stride are the fold kernels' (`_kernel_fold_product`, `_kernel_fold_sums`, which reads q / k where they
    lie), the other fold cuBLAS's as before (its content rows copied band-major)."""
    H, d = side.table.shape[0], side.table.shape[2]
    bands, width = side.cells.shape
    per_band = _per_band(side)
    rows = _cell_rows(side.table, side.cells)
    grad = side.grad
    if _by_residues(per_band.shape[-1]):
        by_kernel, sums_by_kernel = _fold_kernels_serve(per_band)
        # one band of unpadded rows is grad's per-head layout: the products add into it (a float32 (H, B·N, d)
        # product neither written nor read back: 0.1 GB a fold at batch·N = 16384, `triton_host_cost.py`)
        one = bands == 1 and side.band == side.n and not by_kernel
        target = _per_head_view(grad) if one else None
        content = None if sums_by_kernel else _band_major(side.heads, batch, side.n, side.band, bands)
        product, per_cell = _residue_folds(
            per_band, None if by_kernel else rows, content, width, target, scale
        )
        if sums_by_kernel:
            per_cell = _kernel_fold_sums([per_band], [_fold_content(side, batch)], width, side.band)[0]
        if by_kernel:  # writes grad + product in dtype
            grad = _kernel_fold_product([per_band], [rows], [grad], side.band, scale, dtype)[0]
        elif target is None:  # the product, read in grad's order and added
            grad = _add_bands(grad, product.view(H, bands, batch, side.band, d), side.n, scale, dtype)
    else:  # the rows' cells at their aligned stride: cuBLAS reads them in place
        per_band = per_band[..., :width]
        content = _band_major(side.heads, batch, side.n, side.band, bands)
        product = _matmul_f32(per_band, rows)  # (H·bands, B·band, d)
        per_cell = _matmul_f32(per_band.transpose(-1, -2), content)  # (H·bands, cells, d)
        grad = _add_bands(grad, product.view(H, bands, batch, side.band, d), side.n, scale, dtype)
    return grad, _into_rows(
        per_cell.reshape(H, bands * width, d), side.cells.flatten(), side.table.shape[1], scale
    )


def _per_band(side: _FoldSide) -> Tensor:
    """A side's gradient buffer as (H·bands, B·band, DW): one group per (head, band)."""
    return side.dist.view(side.table.shape[0] * side.cells.shape[0], -1, side.dist.shape[-1])


# How many launches of each fold kernel fold a backward's two sides (dQ's and dK's): "one", both sides in one
# grid (`triton_products`' ``PAIR``: a launch fewer of each kernel, one reduction of the classes' sums, one
# allocation of the tables' gradients), where the two agree in shapes, strides and dtypes (`_paired_folds`);
# "two", one launch a side. The benchmark's row "triton (folds in two launches)" times the second beside the
# first.
FOLD_LAUNCHES_MODES = ("one", "two")
FOLD_LAUNCHES = "one"


def _paired_folds(a: _FoldSide, b: _FoldSide) -> bool:
    """Whether one launch of each fold kernel folds both sides (`FOLD_LAUNCHES`): both kernels serve both
    buffers at their odd row stride (`_fold_kernels_serve`), the buffers, contents, gradients and tables alike
    in shape and strides, and the tables in the buffers' dtype (so that each side's gradient is converted into
    a tensor of its own, `_position_grad`)."""
    _check_mode("FOLD_LAUNCHES", FOLD_LAUNCHES, FOLD_LAUNCHES_MODES)
    if FOLD_LAUNCHES != "one" or not _by_residues(a.dist.shape[-1]):
        return False
    if not all(_fold_kernels_serve(a.dist)) or a.n != b.n or a.band != b.band:
        return False
    alike = all(
        getattr(a, f).shape == getattr(b, f).shape and getattr(a, f).stride() == getattr(b, f).stride()
        for f in ("dist", "table", "x", "cells", "grad")
    )
    return alike and a.dist.dtype == b.dist.dtype == a.x.dtype == b.x.dtype == a.table.dtype == b.table.dtype


def _fold_pair(
    a: _FoldSide, b: _FoldSide, batch: int, scale: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`_fold_bands` of both sides (`_paired_folds`), each fold kernel launched once for both: (a's gradient
    plus its product, b's, a's table's gradient, b's), the gradients in ``dtype`` and the tables' (2, H, R, d)
    float32 in one buffer (one allocation; the classes' sums reduced once for both)."""
    H, R, d = a.table.shape
    bands, width = a.cells.shape
    dists = [_per_band(a), _per_band(b)]
    rows = [_cell_rows(a.table, a.cells), _cell_rows(b.table, b.cells)]
    grads = _kernel_fold_product(dists, rows, [a.grad, b.grad], a.band, scale, dtype)
    contents = [_fold_content(a, batch), _fold_content(b, batch)]
    per_cell = _kernel_fold_sums(dists, contents, width, a.band)  # (2, H·bands, width, d)
    tables = per_cell.new_zeros((2, H, R, d))
    for table, sums, side in zip(tables, per_cell, (a, b)):
        _into_rows(sums.view(H, bands * width, d), side.cells.flatten(), R, scale, out=table)
    return *grads, *tables


def _sum_output(grad: Tensor, dtype: torch.dtype) -> Tensor:
    """Where a fold writes ``grad`` plus its product in ``dtype`` (`_add_bands`, `_kernel_fold_product`):
    ``grad`` itself in float32 (the sum in place), else a new tensor with ``grad``'s strides."""
    return grad if dtype == grad.dtype else torch.empty_like(grad, dtype=dtype)


def _add_bands(grad: Tensor, product: Tensor, n: int, scale: float, dtype: torch.dtype) -> Tensor:
    """``grad`` (B, H, N, d) float32 plus ``scale`` times ``product`` (H, bands, B, band, d), the bands' rows
    of real tokens only (the last band's padding rows are not added), as a new tensor in ``dtype``, ``grad``'s
    strides (in place where ``dtype`` is float32). One pass that rounds the float32 sum once, as adding into
    ``grad`` and converting it after would, without writing ``grad`` and reading it back: at v3's N = 512 the
    two folds' adds and conversions moved 0.45 GB, this 0.25 (`benchmarks/triton_host_cost.py`)."""
    out = _sum_output(grad, dtype)
    band = product.shape[3]
    into = product.permute(2, 0, 1, 3, 4)  # (B, H, bands, band, d): grad's order
    whole = n // band
    rows = (slice(None), slice(None), slice(0, whole * band))
    torch.add(
        grad[rows].unflatten(2, (whole, band)),
        into[:, :, :whole],
        alpha=scale,
        out=out[rows].unflatten(2, (whole, band)),
    )
    if whole * band < n:
        rows = (slice(None), slice(None), slice(whole * band, n))
        torch.add(grad[rows], into[:, :, whole, : n - whole * band], alpha=scale, out=out[rows])
    return out


# How the backward's folds add their product into dQ / dK where the gradients lie at an odd row stride in the
# tables' layout (`_by_residues`: `GRADIENT_STORES` "aligned", in bands at v3's N <= 512 and in one band above):
# "cublas", eight matmuls per fold, one per residue class of rows (`_residue_folds`), into the float32 gradient
# (in their epilogue where it is one band of whole rows, else added by `_add_bands`), which is converted to the
# inputs' dtype; or "triton", one kernel (`triton_products._fold_product_kernel`) that reads the buffer by the
# same classes, 16 bytes at a time, and writes gradient plus product in the inputs' dtype, the padding rows
# left out. On an H200 (fifth lease, `benchmarks/results/attention_gpu_h200_f3c1fc3_profile.json`, GPU time of
# a forward+backward) the kernel took 0.326 ms at N = 2048 where the matmuls took 0.362, and the call 4.801 ms
# against 4.866; at 512 2.321 against 2.519 (the product kernel replaces `_add_bands` there too), so it is the
# default since 2026-11-27; the benchmark's row "triton (fold matmuls)" times the matmuls. The sums: `FOLD_SUMS`.
FOLD_PRODUCT_MODES = ("cublas", "triton")
FOLD_PRODUCT = "triton"
FOLD_TILES = Tiles(64, 64, 4, 3)  # rows of one residue by cells a step; the loop over cells pipelined
# And the folds' per-cell sums (the position tables' gradients before `_into_rows`): "cublas", eight matmuls
# per fold, one per residue class (at N = 2048 each a small output, 1224 × 64 per head, over 2048 rows; the
# sixteen took 0.344 ms, `nvjet_..._bz_NTT` in the profile above), or "triton", one kernel
# (`triton_products._fold_sums_kernel`): a program per column block and class, 1920 at N = 2048, running over
# the class's rows, writing the per-class sums that `_class_sums` adds into cells (no atomics: every sum has one
# program). On the H200 (the profile above) the kernel took 0.371 ms at 2048 where the matmuls took 0.344, yet the
# call with both kernels 4.791 ms against 4.801 with the product kernel alone (its per-class sums need no
# conversion), and at 512 2.248 against 2.321: the default since 2026-11-27; the benchmark's row
# "triton (fold sums by matmul)" times the matmuls beside the product kernel.
FOLD_SUMS_MODES = ("cublas", "triton")
FOLD_SUMS = "triton"
FOLD_SUMS_TILES = Tiles(64, 64, 4, 3)  # rows of one residue by columns a step; the loop over rows pipelined
# How the sums kernel's classes become cells: "classes", a program per column block and class writes that
# class's sums, which one strided reduction adds into cells after (`_class_sums`: at v3's N = 512 it reads 0.26
# GB of per-class sums that the kernel wrote, `benchmarks/triton_host_cost.py`); or "cells", a program per
# block of cells runs over every class and adds each class's sums into its own, shifted into place by a gather
# (`triton_products._fold_cell_sums_kernel`): nothing per class written or read back, one launch fewer, a
# seventh more products (each block of 64 columns owns 56 cells) and about a seventh as many programs. Not yet timed
# on a GPU: the benchmark's row "triton (fold sums by cell)" times it beside the default.
FOLD_SUMS_REDUCTION_MODES = ("classes", "cells")
FOLD_SUMS_REDUCTION = "classes"


def _fold_kernels_serve(dist: Tensor) -> tuple[bool, bool]:
    """Whether the fold kernels compute the product (`FOLD_PRODUCT`) and the sums (`FOLD_SUMS`): for 16-bit
    buffers, the GPU's (float32 ones at head dim 128 would spill registers at `FOLD_TILES`:
    `tests/attention/compile_triton_kernels.py`)."""
    _check_mode("FOLD_PRODUCT", FOLD_PRODUCT, FOLD_PRODUCT_MODES)
    _check_mode("FOLD_SUMS", FOLD_SUMS, FOLD_SUMS_MODES)
    half = dist.dtype in (torch.bfloat16, torch.float16)
    return half and FOLD_PRODUCT == "triton", half and FOLD_SUMS == "triton"


def _kernel_fold_product(
    dists: list[Tensor],
    rows: list[Tensor],
    grads: list[Tensor],
    band: int,
    alpha: float,
    dtype: torch.dtype,
) -> list[Tensor]:
    """Per side (one, or two in one launch: `FOLD_LAUNCHES`), ``grad`` (B, H, N, d) float32 plus ``alpha`` times
    the product of ``dist`` (H·bands, B·band, DW), a gradient buffer at an odd row stride in the tables'
    layout, with the (H·bands, W, d) table rows its cells stand for, by `triton_products`' fold kernel: a
    tensor in ``dtype`` with ``grad``'s strides (``grad`` itself where ``dtype`` is float32), the padding rows
    left out. ``band`` (rows per band and batch row, or one band's padded rows) is a multiple of 16, so no read
    of the kernel's passes the buffer's end. The sides agree in shapes and strides (`_paired_folds`)."""
    outs = [_sum_output(grad, dtype) for grad in grads]
    dist, grad = dists[0], grads[0]
    _, H, n, d = grad.shape
    groups, m, dw = dist.shape
    assert band % RESIDUES == 0 and _by_residues(dw) and outs[0].stride() == grad.stride(), (band, dw)
    t = FOLD_TILES
    grid = (RESIDUES * triton_cdiv(m // RESIDUES, t.block_m), groups * len(dists))
    second = [dists[-1], rows[-1].contiguous(), grads[-1], outs[-1]]  # (the first side's, unpaired: unused)
    launcher(_products()._fold_product_kernel)[grid](
        dist, rows[0].contiguous(), grad, outs[0], alpha, dw - 1, m * dw, *grad.stride()[:3], n, band,
        groups // H, m, rows[0].shape[1], *second, D=d, PREC=_precision(dist), PAIR=len(dists) == 2,
        **_launch(t),
    )  # fmt: skip
    return outs


def _residue_rows(dist: Tensor, width: int, s: int) -> Tensor:
    """Rows s, s + 8, … of each (G, M, DW) block of ``dist``, a gradient buffer at an odd row stride DW ≡ 1
    (mod 16), read from ``s`` cells before each row's first: (G, M / 8, width + 7), column c holding the row's
    cell c - s (`RESIDUES` = 8). Row s + 8·k starts at (s + 8·k)·DW - s = s·(DW - 1) + 8·k·DW, so the view
    starts 16-element aligned and its rows lie 8·DW apart, a multiple of 8 elements (16 bytes in bfloat16):
    aligned as cuBLAS's vectorised kernels want, where on the buffer itself at its odd stride it ran a
    one-element-aligned one (four folds 2.042 ms against 0.656 at an aligned stride on an H200:
    docs/gpu-kernel.md, "Measured on an H200"). The cells the view reads outside a row's ``width`` (the rows
    beside it) meet zeros in the folds. None lies past the buffer: class 7's last view row, the buffer's last row, ends at that row's
    ``width`` - 1, and the other classes' end before it."""
    groups, rows, dw = dist.shape
    shape = (groups, rows // RESIDUES, width + RESIDUES - 1)
    strides = (rows * dw, RESIDUES * dw, 1)
    return dist.as_strided(shape, strides, dist.storage_offset() + s * (dw - 1))


def _residue_folds(
    dist: Tensor,
    rows: Tensor | None,
    content: Tensor | None,
    width: int,
    into: Tensor | None = None,
    alpha: float = 1.0,
) -> tuple[Tensor | None, Tensor | None]:
    """The two folds of `_fold_bands` for a buffer at an odd row stride, (G, M, DW) against the (G, width, d)
    table rows its cells stand for and the (G, M, d) content rows, one residue class of rows at a time
    (`_residue_rows`): the product (G, M, d) and the per-cell sums (G, width, d), float32; with ``into`` (G, M,
    d) float32 the product times ``alpha`` is added into it instead (in the matmuls' epilogue; ``alpha``
    scales only such a product). Without ``rows`` (None) no product, without ``content`` no sums (None in their
    place: the fold kernels compute them, `FOLD_PRODUCT`, `FOLD_SUMS`). Class s's column c
    is cell c - s. It meets table row c - s: the rows padded with 7 zero rows either side and sliced from 7 -
    s (a view). Its per-cell sums are written apart, class beside class, and summed into cells after
    (`_class_sums`): accumulating the classes into one float32 output would read and write it eight times."""
    if rows is None and content is None:  # both folds by the kernels: no class to read here
        return None, None
    groups, m, _ = dist.shape
    pad = RESIDUES - 1
    if rows is not None:
        d = rows.shape[2]
        padded = torch.nn.functional.pad(rows, (0, 0, pad, pad))  # (G, width + 14, d)
        if into is None:  # (each class writes its rows once)
            into, alpha, beta = rows.new_empty((groups, m, d), dtype=torch.float32), 1.0, 0.0
        else:
            beta = 1.0
    if content is not None:
        per_class = content.new_empty((groups, width + pad, RESIDUES, content.shape[2]), dtype=torch.float32)
    for s in range(RESIDUES):
        view = _residue_rows(dist, width, s)  # (G, M / 8, width + 7)
        if rows is not None:
            table_rows = padded[:, pad - s : pad - s + width + pad]
            _add_matmul_f32(into[:, s::RESIDUES], view, table_rows, alpha, beta=beta)
        if content is not None:
            _add_matmul_f32(
                per_class[:, :, s], view.transpose(-1, -2), content[:, s::RESIDUES], 1.0, beta=0.0
            )
    return into, None if content is None else _class_sums(per_class, width)


def _class_sums(per_class: Tensor, width: int) -> Tensor:
    """(G, width, d) per-cell sums from the per-class sums (G, width + 7, 8, d) of `_residue_folds` or of the
    fold kernel (`_kernel_fold_sums`): cell x sums column x + s of each class s (one strided reduction)."""
    groups, _, classes, d = per_class.shape
    g, c = per_class.stride(0), per_class.stride(1)
    diagonal = per_class.as_strided((groups, width, classes, d), (g, c, c + d, 1))  # [g, x, s]: column x + s
    return diagonal.sum(2)


def _kernel_fold_sums(dists: list[Tensor], contents: list[Tensor], width: int, band: int) -> Tensor:
    """The per-cell sums of `_residue_folds` per side (one, or two in one launch: `FOLD_LAUNCHES`), (sides,
    H·bands, width, d), float32, by `triton_products`' sums kernel: one launch that writes the per-class sums,
    which `_class_sums` adds into cells (once for both sides). Each ``dist`` (H·bands, B·band, DW) a gradient
    buffer at an odd row stride in the tables' layout, its ``content`` (`_fold_content`) the rows of q / k:
    (B, H, N, d) where they lie, the kernel finding each buffer row's token (bands of ``band`` rows, a power of
    two; 32-bit offsets within a head), or (H·bands, B·band, d) in the buffer's row order; d contiguous."""
    dist, content = dists[0], contents[0]
    groups, m, dw = dist.shape
    d = content.shape[-1]
    banded = content.dim() == 4
    assert m % RESIDUES == 0 and _by_residues(dw) and content.stride(-1) == 1, (m, dw)
    assert all(c.shape == content.shape and c.stride() == content.stride() for c in contents), "sides differ"
    if banded:  # (B, H, N, d): head, token and batch strides
        _, H, n, _ = content.shape
        strides, log2 = (content.stride(1), content.stride(2), content.stride(0)), _log2_band(band)
        assert band == 1 << log2 and m % band == 0, (band, m)
        bands = groups // H
    else:  # (G, M, d) in the buffer's order: group g's rows at g·stride(0), one group a "band" (N, LB unused)
        n, log2, bands = band, 0, 1
        strides = (content.stride(0), content.stride(1), 0)
    t = FOLD_SUMS_TILES
    args = (dw - 1, m * dw, *strides, n, log2, bands, m, width, dists[-1], contents[-1])
    flags = dict(D=d, PREC=_precision(dist), PAIR=len(dists) == 2, BANDED=banded, **_launch(t))
    _check_mode("FOLD_SUMS_REDUCTION", FOLD_SUMS_REDUCTION, FOLD_SUMS_REDUCTION_MODES)
    if FOLD_SUMS_REDUCTION == "cells":  # each cell's sum whole, from the kernel
        assert t.block_n > 2 * RESIDUES, t
        sums = dist.new_empty((len(dists) * groups, width, d), dtype=torch.float32)
        grid = (triton_cdiv(width, t.block_n - RESIDUES), len(dists) * groups)
        launcher(_products()._fold_cell_sums_kernel)[grid](dist, content, sums, *args, **flags)
        return sums.view(len(dists), groups, width, d)
    per_class = dist.new_empty((len(dists) * groups, width + RESIDUES - 1, RESIDUES, d), dtype=torch.float32)
    grid = (RESIDUES * triton_cdiv(width + RESIDUES - 1, t.block_n), len(dists) * groups)
    launcher(_products()._fold_sums_kernel)[grid](dist, content, per_class, *args, **flags)
    return _class_sums(per_class, width).view(len(dists), groups, width, d)


def _fold_content(side: _FoldSide, batch: int) -> Tensor:
    """What the fold sums kernel reads of a side's content rows (`_kernel_fold_sums`): in bands q / k where they
    lie, (B, H, N, d), without a band-major copy (at v3's N = 512, 25 MB read and written a side, in two
    launches a backward: `benchmarks/triton_host_cost.py`); with one band, or where a head's offsets pass 32
    bits (`CONTENT_OFFSETS`), q / k per head in the buffer's row order (`_band_major`: with one band a view
    where N needs no padding rows and q / k have a per-head view)."""
    bands = side.cells.shape[0]
    head = side.x.select(1, 0)  # (the kernel adds the head's offset in 64 bits)
    if bands > 1 and sum((n - 1) * st for n, st in zip(head.shape, head.stride())) < CONTENT_OFFSETS:
        return side.x
    return _band_major(side.heads, batch, side.n, side.band, bands)


# The offsets within a head that the fold sums kernel computes in 32 bits, where it reads q / k in place
# (`_fold_content`): shorter integer work per row in its loop than 64-bit offsets (compiled for sm_90, d 64:
# 273 instructions a step against 313).
CONTENT_OFFSETS = 2**31


def _fold_into_content(dist: Tensor, table: Tensor, lut: Tensor, grad: Tensor, scale: float) -> None:
    """Adds Σ over distances of dist(n, δ) · table[idx(δ)] · scale to ``grad`` (B, H, N, d): what ROW / COL's
    cells pass to Q / K, as one matmul per head in distance space, dist (H, B·N, W') against the table rows
    gathered through the LUT, (H, W', d) (the padding's cells are zeros and its LUT entries a real row: `_lut`).
    No (N, R) buffer: folding the distances into table rows first would write and read one (the index_add), and
    its matmul would run on float32 operands. Where ``grad`` has a per-head view (the projections' layout) the
    matmul adds into it directly (`_add_matmul_f32`); otherwise its (H, B·N, d) product is added after."""
    rows = table[:, lut]  # (H, W', d)
    into = _per_head_view(grad)
    if into is not None:
        _add_matmul_f32(into, dist, rows, scale)
        return
    B, H, N, _ = grad.shape
    grad.add_(_matmul_f32(dist, rows).unflatten(1, (B, N)).transpose(0, 1), alpha=scale)


def _fold_into_table(dist: Tensor, content: Tensor, lut: Tensor, rows: int, scale: float) -> Tensor:
    """Σ over (b, n) of dist(n, δ) · content_n · scale, folded into table rows: the gradient (H, R, d) of the
    position table. One matmul per head, dist (H, B·N, W') against the content rows per head (H, B·N, d,
    `_per_head`), sums over the batch too; the (H, W', d) products are added into their rows through the LUT
    (exact: each distance has one row; the padding's products are zeros)."""
    return _into_rows(_matmul_f32(dist.transpose(-1, -2), content), lut, rows, scale)


def _into_rows(
    per_distance: Tensor, lut: Tensor, rows: int, scale: float, out: Tensor | None = None
) -> Tensor:
    """(H, W, ...) values per distance, times ``scale``, added into the table rows they index through the LUT:
    (H, R, ...), into ``out`` where given (zeros: `_fold_pair` allocates both sides' at once).

    Several distances share a row past the log buckets' exact range, and CUDA's `index_add_` adds them by atomics
    in the order the threads arrive: two backwards on the same inputs give the tables' gradients a rounding apart
    (seen on an H200). Under `torch.use_deterministic_algorithms` the rows are summed in a fixed order instead
    (`index_put_` with ``accumulate`` sorts the indices and adds each row's values one after another), as PyTorch's
    own ops do there (the branch is ours, not left to `index_add_`'s handling of the mode, so that the CPU's tests
    see it); not by default, where it cost a forward+backward 0.09-0.11 ms at N = 512 and 0.13-0.18 ms
    at 2048, 4-5% (H200, `benchmarks/attention_gpu.py`, against two other machines of the same lease)."""
    if out is None:
        out = per_distance.new_zeros((per_distance.shape[0], rows, *per_distance.shape[2:]))
    if torch.are_deterministic_algorithms_enabled():
        return torch.ops.aten.index_put_(out, [None, lut], per_distance * scale, True)
    return out.index_add_(1, lut, per_distance, alpha=scale)


def _bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    pos_q: Tensor | None,
    pos_k: Tensor | None,
    aux: list[Tensor | None],
    scale: float,
    config: list[int],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dpos_q, dpos_k); a position gradient is an empty tensor when its table is absent. ``aux`` and
    ``config`` as the forward's (`_Aux`, `_Config`); after `_Aux`'s tensors ``aux`` may hold ROW, COL and FAR
    as an eager forward kept them (`KEEP_TABLES`), which the backward then reads instead of building them."""
    dev = q.device
    kept = tuple(aux[AUX_COUNT:]) or None
    lut, q_pos, k_pos, q_seg, k_seg, k_mask, kv_lo, kv_hi, q_lo, q_hi, seed, cells, q_lut, _ = _Aux(
        *aux[:AUX_COUNT]
    )
    sat, c2p, p2c, p2p, causal, ij, far_tiles, drop_t, band, _, _ = _Config.of(config)
    with _autocast_off(dev.type), _on_device(dev):  # (the custom op's body too, which a compiled graph calls)
        B, H, NQ, D = q.shape
        NK = k.shape[2]
        skew, dist, row, col, far, R, PQ, PK, TR, q_heads, k_heads = _position_inputs(
            q, k, pos_q, pos_k, lut, c2p, p2c, p2p, ij, drop_t > 0, k_mask, far_tiles, BACKWARD, cells, sat,
            scale, band, kept,
        )  # fmt: skip
        t_dq = tiles_for(dev, D, "_dq_kernel", drop_t > 0, skew)
        t_dkv = tiles_for(dev, D, "_dkv_kernel", drop_t > 0, skew)
        farthest = _stored_reach(NQ, NK, t_dq, t_dkv, sat, far_tiles)
        DW = _gradient_stride(sat, band, cells if dist else None, farthest)
        # the gradient buffers in the tables' layout (`_gradient_stride`): their rows per band, or 0
        like_tables = DW != _distance_stride(sat)
        q_band, k_band = (band or _padded_rows(NQ), band or _padded_rows(NK)) if like_tables else (0, 0)
        grad_bands = like_tables and _by_residues(DW)  # stored 16 bytes at a time
        # read through q's strides; dO in q's dtype (float32 when the forward's O was, `_out_dtype`)
        dout, out = _like(dout.to(q.dtype), q), _like(out, q)
        delta = torch.empty((B, H, NQ), dtype=torch.float32, device=dev)  # dO·O per row: the dQ kernel
        dq = torch.empty_like(q, dtype=torch.float32)  # written through q's strides, dk and dv through k's
        dk = torch.empty_like(k, dtype=torch.float32)  # float32: the position terms' part is added below
        dv = torch.empty_like(k, dtype=v.dtype)  # final as the kernel writes it
        # distance-space gradients of ROW / COL: (N, 2·sat + 1) per (b, h) at the row stride DW, laid out per head
        # as the tables are, zero where no pair lands; with bands (H, bands, B, band, DW), ROW's and COL's layout
        dq_dist = dk_dist = None
        if row is not None:
            dq_dist = _gradient_buffer(H, B, NQ, q_band, DW, q.dtype, dev, ij)
        if col is not None:
            dk_dist = _gradient_buffer(H, B, NK, k_band, DW, q.dtype, dev, ij)
        flags = dict(HEAD_DIM=D, **_flags(q, row, col, q_seg, k_mask, causal, ij, drop_t > 0, far_tiles))
        flags.update(_dropout_args(seed, drop_t, dev))
        tables = (
            _or_unused(row, dev, torch.float32),
            _or_unused(col, dev, torch.float32),
            _or_unused(far, dev, torch.float32),
            lut,
            PQ,
            PK,
            q_pos,
            k_pos,
            _or_unused(q_seg, dev),
            _or_unused(k_seg, dev),
            _or_unused(k_mask, dev),
        )
        kern = _kernels()
        launcher(kern._dq_kernel)[(triton_cdiv(NQ, t_dq.block_m) * B * H,)](
            q, k, v, out, dout, lse, delta, *tables, kv_lo, kv_hi,
            dq, _or_unused(dq_dist, dev, q.dtype), *_strides(q, k),
            H, B, NQ, NK, R, _log2_band(band), sat, DW, TR, scale, **flags, **_launch(t_dq), SKEW=skew,
            DIST=dist, GRAD_BANDS=grad_bands, WT=t_dq.skew_width,
            FAR_N=_far_keys(
                DQ_FAR_KEYS, t_dq.block_n, dist and far_tiles, D, q_seg is not None, drop_t > 0, "_dq_kernel"
            ),
        )  # fmt: skip
        launcher(kern._dkv_kernel)[(triton_cdiv(NK, t_dkv.block_n) * B * H,)](
            q, k, v, dout, lse, delta, *tables, q_lo, q_hi,
            dk, dv, _or_unused(dk_dist, dev, q.dtype), *_strides(q, k),
            H, B, NQ, NK, R, _log2_band(band), sat, DW, TR, scale, **flags, **_launch(t_dkv), SKEW=skew,
            DIST=dist, GRAD_BANDS=grad_bands,
            WT=t_dkv.skew_width,
        )  # fmt: skip
        del row, col, far, tables  # free the N×R tables before the fold
        # the position tables' gradients in float32, each the sum of its terms (rounded once, at the end)
        dpos_q = dpos_k = None
        if like_tables:  # (the distance road: no p2p)
            q_side = k_side = None
            if dq_dist is not None:
                q_side = _FoldSide(dq_dist, pos_k, q, q_heads, cells[0], dq, NQ, q_band)
            if dk_dist is not None:
                k_side = _FoldSide(dk_dist, pos_q, k, k_heads, cells[1], dk, NK, k_band)
            if q_side is not None and k_side is not None and _paired_folds(q_side, k_side):
                dq, dk, dpos_k, dpos_q = _fold_pair(q_side, k_side, B, scale, q.dtype)
            else:
                if q_side is not None:
                    dq, dpos_k = _fold_bands(q_side, B, scale, q.dtype)
                if k_side is not None:
                    dk, dpos_q = _fold_bands(k_side, B, scale, k.dtype)
        elif dq_dist is not None:  # ROW = Q·Krᵀ + p2p, scores (… + ROW) · scale
            if c2p:
                _fold_into_content(dq_dist, pos_k, q_lut, dq, scale)
                dpos_k = _fold_into_table(dq_dist, q_heads, q_lut, pos_k.shape[1], scale)
            if p2p:
                per_distance = dq_dist.sum(1, dtype=torch.float32)  # (H, W')
                g = _into_rows(per_distance, q_lut, pos_k.shape[1], scale)[..., None]  # (H, R, 1)
                dpos_q = _plus(dpos_q, g * pos_k.float())
                dpos_k = _plus(dpos_k, g * pos_q.float())
        if dk_dist is not None and not like_tables:  # COL = K·Qrᵀ
            _fold_into_content(dk_dist, pos_q, lut, dk, scale)
            dpos_q = _plus(dpos_q, _fold_into_table(dk_dist, k_heads, lut, pos_q.shape[1], scale))
    return (
        dq.to(q.dtype),
        dk.to(k.dtype),
        dv,
        _position_grad(dpos_q, pos_q, q),
        _position_grad(dpos_k, pos_k, q),
    )


_bwd_op = torch.library.custom_op("debertakit::disentangled_attention_bwd", _bwd, mutates_args=())


def _mirrored(lut: Tensor, sat: int) -> Tensor:
    """The lookup table of a distance buffer whose row holds distance -δ in cell δ + sat (the query rows': their
    cells run by j - i, `triton_kernels._table_grad`): the 2·sat + 1 entries reversed, the padding's as they
    are. Made with the LUT (`_luts`, kept with the mapping: `RelativeIndex.cached`), not in every backward: two
    launches."""
    return torch.cat([lut[: 2 * sat + 1].flip(0), lut[2 * sat + 1 :]])


def _plus(total: Tensor | None, term: Tensor) -> Tensor:
    return term if total is None else total.add_(term)


def _position_grad(grad: Tensor | None, table: Tensor | None, q: Tensor) -> Tensor:
    """A position table's gradient in its dtype and layout (``empty_like``'s strides, the fake's: the model's
    tables, (R, H, d) projections viewed per head, take theirs back without a copy): the float32 sum itself
    where it already is both, else a copy; an empty tensor when the table is absent."""
    if table is None:
        return q.new_empty(0)
    if grad is None:
        return torch.zeros_like(table)
    if grad.dtype == table.dtype and grad.stride() == table.stride():
        return grad
    return torch.empty_like(table).copy_(grad)


@_bwd_op.register_fake
def _(dout, q, k, v, out, lse, pos_q, pos_k, *args):
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        torch.empty_like(pos_q) if pos_q is not None else q.new_empty(0),
        torch.empty_like(pos_k) if pos_k is not None else q.new_empty(0),
    )


def _setup_context(ctx, inputs, output, kept: tuple = ()):
    """Saves what the backward reads: the inputs, out and lse, and ``kept``, the forward's ROW, COL and FAR
    where it keeps them (`KEEP_TABLES`; eager calls only)."""
    q, k, v, pos_q, pos_k, aux, scale, config = inputs
    ctx.scale, ctx.config = scale, config
    ctx.has_pos = (pos_q is not None, pos_k is not None)
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, pos_q, pos_k, *aux, *kept)


def _gradients(ctx, saved: tuple, dout: Tensor, bwd) -> tuple[Tensor | None, ...]:
    """(dq, dk, dv, dpos_q, dpos_k) by ``bwd`` (the op or its body) from ``saved``, the tensors `_setup_context`
    saved (``ctx.saved_tensors``, read once: activation checkpointing lets a backward unpack them only once):
    ``aux`` and the tables kept after it, if any."""
    q, k, v, out, lse, pos_q, pos_k, *aux = saved
    dq, dk, dv, dpos_q, dpos_k = bwd(dout, q, k, v, out, lse, pos_q, pos_k, aux, ctx.scale, ctx.config)
    return dq, dk, dv, dpos_q if ctx.has_pos[0] else None, dpos_k if ctx.has_pos[1] else None


def _backward(ctx, dout, dlse):
    saved = ctx.saved_tensors
    # aux, scale and config take none; `custom_op` takes a list argument of tensors only as that many inputs and
    # one holding a None as one input, and wants aux's gradient in the same form
    # (`torch._library.autograd.supports_tensorlist`)
    aux = saved[7 : 7 + AUX_COUNT]
    aux_grad = None if any(t is None for t in aux) else [None] * len(aux)
    return (*_gradients(ctx, saved, dout, _bwd_op), aux_grad, None, None)


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The ops' bodies as a plain autograd node, for calls outside ``torch.compile``. `custom_op`'s own autograd
    wrapper (its inputs flattened and rebuilt as pytrees, the schema's defaults filled, the op dispatched twice)
    cost about as much host time as the forward's body, in every layer: a forward with grad took 154 µs without
    position terms and 269 µs on the distance road through the op, 62 and 162 µs through this node (the host
    side alone, kernels not launched, on a CPU: `benchmarks/triton_dispatch.py`, medians of three runs). A
    compiled graph takes the custom ops (`_attention`), which `torch.library.opcheck` checks."""

    @staticmethod
    def forward(ctx, q, k, v, pos_q, pos_k, scale, config, *aux):
        out, lse, inputs = _planned_forward(q, k, v, pos_q, pos_k, list(aux), scale, config)
        # (with KEEP_TABLES the forward's tables are never cut: `_cuts_forward_tables`)
        keep = KEEP_TABLES and inputs.dist and any(ctx.needs_input_grad[:5])
        kept = (inputs.row, inputs.col, inputs.far) if keep else ()
        _setup_context(ctx, (q, k, v, pos_q, pos_k, aux, scale, config), (out, lse), kept)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        saved = ctx.saved_tensors
        return (*_gradients(ctx, saved, dout, _planned_bwd), None, None, *(None for _ in range(AUX_COUNT)))


def _attention(q, k, v, pos_q, pos_k, aux, scale, config) -> tuple[Tensor, Tensor]:
    """`_fwd` (same arguments) with its backward: the custom op under ``torch.compile`` (no graph break), else
    the same bodies without the op's dispatch (`_EagerAttention`), and where no gradient is wanted (inference,
    ``torch.no_grad``) the forward's body alone: an autograd node costs host time in every layer even when
    nothing will run backward (`benchmarks/triton_dispatch.py`, "forward, no grad")."""
    if torch.compiler.is_compiling():
        return _fwd_op(q, k, v, pos_q, pos_k, aux, scale, config)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, pos_q, pos_k)):
        return _EagerAttention.apply(q, k, v, pos_q, pos_k, scale, config, *aux)
    out, lse, _ = _planned_forward(q, k, v, pos_q, pos_k, aux, scale, config)
    return out, lse


def _planned_forward(q, k, v, pos_q, pos_k, aux, scale, config) -> tuple[Tensor, Tensor, _PositionInputs]:
    """`_forward`, replayed from its signature's plan where it has one (`triton_plan`): an eager forward with
    grad, or one without whose call was not planned as a whole (dropout: the seed is among the body's inputs
    here)."""

    def call():
        return _forward(q, k, v, pos_q, pos_k, aux, scale, config)

    inputs = (q, k, v, pos_q, pos_k, *aux)
    key = _body_key("forward", inputs, scale, config)
    return call() if key is None else _PLANS.call(key, inputs, call, timed=q.is_cuda)


def _planned_bwd(dout, q, k, v, out, lse, pos_q, pos_k, aux, scale, config) -> tuple[Tensor, ...]:
    """`_bwd`, replayed from its signature's plan where it has one (`triton_plan`): an eager backward."""

    def call():
        return _bwd(dout, q, k, v, out, lse, pos_q, pos_k, aux, scale, config)

    inputs = (dout, q, k, v, out, lse, pos_q, pos_k, *aux)
    key = _body_key("backward", inputs, scale, config)
    # (autograd runs a CUDA backward on its device already; a direct caller may not)
    with _on_device(q.device):
        return call() if key is None else _PLANS.call(key, inputs, call, timed=q.is_cuda)


def _body_key(body: str, inputs: tuple, scale: float, config: list[int]) -> tuple | None:
    """The signature of a call of an op's body (``body``: "forward" or "backward") for `triton_plan`, or None where
    it is not planned (see `_planned_call`; every tensor it reads is among ``inputs``, the geometry's too)."""
    if not _plannable(inputs):
        return None
    return (body, inputs[0].device, float(scale), tuple(config), *map(triton_plan.tensor_key, inputs))


def _plannable(inputs: tuple) -> bool:
    """Whether a call on ``inputs`` (tensors and None, the first a tensor) may be planned: its launches go through
    `triton_launch.launcher` (through one patched in they would not reach the recorder), `triton_plan.serves` its
    device in `CALL_PLANS`' mode, no input is of a tensor subclass, and no gradient would be recorded."""
    if launcher is not triton_launch.launcher or not triton_plan.serves(inputs[0].device, _plan_mode()):
        return False
    present = [t for t in inputs if t is not None]
    if any(type(t) is not Tensor for t in present):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in present))


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rows(x: Tensor | None, batch: int, n: int) -> Tensor | None:
    """(B|1, N) -> (B, N) int32 contiguous (what the kernels index as ``b * N + i``)."""
    if x is None:
        return None
    return x.to(torch.int32).expand(batch, n).contiguous()


def _check_distinct(pos: Tensor, seg: Tensor | None, mask: Tensor | None, side: str) -> None:
    """Explicit positions must differ inside each sequence (the backward stores one cell per distance)."""
    key = pos.long()
    if seg is not None:
        key = key + seg.long() * (1 << 32)
    if mask is not None:  # hidden tokens may repeat positions: give each its own key
        filler = -(1 << 62) + torch.arange(key.shape[-1], device=key.device)
        key = torch.where(mask.bool(), key, filler)
    sorted_key = key.sort(-1).values
    if bool((sorted_key[..., 1:] == sorted_key[..., :-1]).any()):
        raise ValueError(
            f"the triton backend needs distinct {side} positions inside each sequence; got repeated positions "
            "(use another attention backend for such inputs)"
        )


def _key_ranges(geom: Geometry, B: int, NQ: int, NK: int, device: torch.device) -> tuple[Tensor, ...]:
    """Per query row the keys [kv_lo, kv_hi) it may see, per key column the queries [q_lo, q_hi) that may see
    it: whole blocks outside these ranges are skipped (causal prefix, packed segments, key padding)."""
    # int32, the kernels' type: without masks nothing more to launch (a step below that mixes in int64 values
    # gives int64, converted at the end)
    kv_lo = torch.zeros((B, NQ), dtype=torch.int32, device=device)
    kv_hi = torch.full((B, NQ), NK, dtype=torch.int32, device=device)
    q_lo = torch.zeros((B, NK), dtype=torch.int32, device=device)
    q_hi = torch.full((B, NK), NQ, dtype=torch.int32, device=device)
    packed = geom.cu_seqlens is not None and NQ == NK
    if packed:
        cu = geom.cu_seqlens.to(device=device, dtype=torch.int64)
        seg = geom.q_segments.to(torch.int64).expand(B, NQ)
        real = seg >= 0
        s = seg.clamp(min=0)
        # padding tokens of the packed row see nothing and are seen by nothing: empty ranges [N, 0), which
        # also leave the block-wide min / max of their neighbours alone
        kv_lo, kv_hi = torch.where(real, cu[s], NK), torch.where(real, cu[s + 1], 0)
        q_lo, q_hi = torch.where(real, cu[s], NQ), torch.where(real, cu[s + 1], 0)
    default_positions = not geom.explicit_positions()
    if geom.causal and NQ == NK and (packed or default_positions):
        idx = torch.arange(NQ, device=device)[None]
        kv_hi = torch.minimum(kv_hi, idx + 1)
        q_lo = torch.maximum(q_lo, idx)
    if geom.key_mask is not None:
        km = geom.key_mask.bool().expand(B, NK)
        col = torch.arange(NK, device=device)[None].expand(B, NK)
        first = torch.where(km, col, NK).min(-1, keepdim=True).values
        last = torch.where(km, col, -1).max(-1, keepdim=True).values + 1
        kv_lo = torch.maximum(kv_lo, first)
        kv_hi = torch.minimum(kv_hi, last)
        q_lo = torch.where(km, q_lo, NQ)  # hidden keys: no query block to visit
        q_hi = torch.where(km, q_hi, 0)
    return tuple(x.to(torch.int32).contiguous() for x in (kv_lo, kv_hi, q_lo, q_hi))


# The geometry inputs of geometries without masks, segments or explicit positions depend on the shapes (and
# causality) alone (`Geometry.depends_on_shapes_alone`): every such geometry shares them, kept across forwards
# for the SHAPE_KEPT latest shapes (`_geometry_inputs`). A forward's first layer (and the benchmark's calls, each with a new geometry) then runs
# none of the eight small ops that build them (int32 positions, block ranges), each a launch on a GPU; they are a
# few (B, N) int32 rows per shape.
SHAPE_KEPT = 16
_SHAPE_INPUTS: OrderedDict = OrderedDict()


def _geometry_inputs(
    geom: Geometry, B: int, NQ: int, NK: int, device: torch.device
) -> tuple[Tensor | None, ...]:
    """The kernels' inputs that depend on the geometry alone, the same in every layer (`Geometry.cached`): int32
    (B, N) positions, segments and key mask, then the block ranges of `_key_ranges`; shared by the geometries
    whose inputs depend on the shapes alone (`Geometry.depends_on_shapes_alone`, `SHAPE_KEPT`)."""
    if geom.depends_on_shapes_alone():
        key = (B, NQ, NK, device, bool(geom.causal))
        return kept(_SHAPE_INPUTS, key, lambda: _build_geometry_inputs(geom, B, NQ, NK, device), SHAPE_KEPT)
    return _build_geometry_inputs(geom, B, NQ, NK, device)


def _geometry_tensors(
    geom: Geometry, B: int, NQ: int, NK: int, device: torch.device
) -> tuple[Tensor | None, ...]:
    """`_geometry_inputs`, built once per geometry (`Geometry.cached`): a forward's layers after the first share
    them."""
    return geom.cached(("triton", B, NQ, NK, device), lambda: _geometry_inputs(geom, B, NQ, NK, device))


def _build_geometry_inputs(
    geom: Geometry, B: int, NQ: int, NK: int, device: torch.device
) -> tuple[Tensor | None, ...]:
    """`_geometry_inputs`, built. Explicit positions are checked here, once per geometry (the check reads a flag
    from the device)."""
    # default positions made int32 (`_rows` then converts nothing): `Geometry.positions` gives int64
    default = functools.partial(torch.arange, dtype=torch.int32, device=device)
    q_pos = _rows(geom.q_positions if geom.q_positions is not None else default(NQ), B, NQ)
    k_pos = _rows(geom.k_positions if geom.k_positions is not None else default(NK), B, NK)
    q_seg = _rows(geom.q_segments, B, NQ)
    k_seg = _rows(geom.k_segments, B, NK)
    k_mask = _rows(geom.key_mask, B, NK)
    explicit = geom.explicit_positions()
    if explicit and geom.cu_seqlens is None:
        _check_distinct(q_pos, q_seg, None, "query")
        _check_distinct(k_pos, k_seg, k_mask, "key")
    return (q_pos, k_pos, q_seg, k_seg, k_mask, *_key_ranges(geom, B, NQ, NK, device))


def _lut(rel: RelativeIndex, sat: int, rows: int, device: torch.device) -> tuple[int, int, Tensor]:
    """(lo, hi, lut): the rows [lo, hi) of a ``rows``-row position table that distances -sat … sat index, and
    their int32 lookup table, relative to ``lo``: 2·sat + 1 entries, then the last repeated up to the distance
    buffers' row stride (`_distance_stride`), so that the backward's folds take the padded buffers whole (the
    padding's cells are zeros: they add nothing to that row). The kernels are given only those rows: the
    tables road's products ROW and COL are as wide as the table (at N = 128 a v3 table's 512 rows hold 257
    used ones; a v1 table's 1024, 257). The model already projects only this window (`RelativeIndex.window`);
    direct callers may pass the whole table. The index is monotone: the range is that of the table's two end
    entries, read on the host. Under ``torch.compile`` every row (the distance may be symbolic there, as in
    `Encoder.relative_table`)."""
    span = slice(rel.saturation - sat, rel.saturation + sat + 1)
    lo, hi = 0, rows
    if not torch.compiler.is_compiling():
        first, last = (min(max(rel.row(d), 0), rows - 1) for d in (-sat, sat))
        lo, hi = first, last + 1
    lut = rel.lut_on(device)[span].clamp(0, rows - 1) - lo
    lut = torch.cat([lut, lut[-1:].expand(_distance_stride(sat) - lut.numel())])
    return lo, hi, lut.to(torch.int32)


def _luts(rel: RelativeIndex, sat: int, rows: int, device: torch.device) -> tuple[int, int, Tensor, Tensor]:
    """`_lut`'s (lo, hi, lut) and the LUT's mirror for the query rows' distance buffer (`_mirrored`)."""
    lo, hi, lut = _lut(rel, sat, rows, device)
    return lo, hi, lut, _mirrored(lut, sat)


def _table_layout(table: Tensor | None) -> Tensor | None:
    """A (H, R, d) position table as the kernels take it: contiguous for the skewed roads (`NEAR_BAND`), whose
    kernels index its rows as ``row · HEAD_DIM``; as it is for the others, which read it through its strides.
    The model's tables are (R, H, d) projections viewed per head (`split_heads`), and a direct caller's may be
    cut to the rows a short input indexes (`_lut`): a copy of each in every layer's forward otherwise."""
    if table is None or NEAR_BAND not in ("skew-forward", "skew"):
        return table
    return table.contiguous()


def _far_tiles(geom: Geometry, ij: bool, sat: int, NQ: int, NK: int) -> bool:
    """Whether a far tile (every pair ``sat`` or more apart) may occur, so that the kernels read FAR
    (`_far_columns`). At distance i - j none does when no visible pair is that far apart: neither side longer
    than ``sat`` (512 for DeBERTa-v3 base), or a packed row, however long, whose sequences are no longer. There
    every block a program's loop visits holds a key of a sequence one of its rows belongs to (`_key_ranges`), a
    pair less than ``sat`` apart, so the block's tile is not far. Elsewhere FAR costs 2-4 launches per direction."""
    return not ij or geom.max_distance(NQ, NK) >= sat


def triton_attention(
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
    """Disentangled attention with the fused Triton kernels; same signature and result as `eager_attention`
    (with dropout, the mask is the kernels' own: see `dropout_keep_mask`). Calls are replayed from their
    signatures' plans where they have them (`triton_plan`): a whole forward without gradients
    (`_planned_call`), the forward's and the backward's bodies otherwise (`_planned_forward`)."""

    def call() -> tuple[Tensor, None]:
        return _made(q, k, v, pos_q, pos_k, rel, geom, scale, terms, dropout_p, return_probs)

    with _on_device(q.device):
        planned = _planned_call((q, k, v, pos_q, pos_k), rel, geom, scale, terms, dropout_p, return_probs)
        if planned is None:
            return call()
        key, inputs = planned
        return _PLANS.call(key, inputs, call, timed=q.is_cuda)


def _planned_call(
    inputs: tuple[Tensor | None, ...],
    rel: RelativeIndex | None,
    geom: Geometry,
    scale: float,
    terms: PositionTerms,
    dropout_p: float,
    return_probs: bool,
) -> tuple[tuple, tuple] | None:
    """A whole call's signature for `triton_plan` (see there) and the plan's inputs, or None where it is not
    planned as a whole: dropout (a seed drawn per call: its bodies are planned then, `_planned_forward`),
    attention probabilities or a dense mask (refused by the call), or not `_plannable`. The relative mapping by
    value (what the cached lookup tables are built from).

    The key holds what the call decides from the geometry on the host: causality, distance ``i - j``, explicit
    positions, packing and the longest distance (the cut of the tables, far tiles). A geometry whose inputs are
    the shapes' alone has its tensors the same for every call of the shapes (kept by the plan); any other (a key
    mask, packed segments, explicit positions) adds the tensors the kernels read of it (`_geometry_tensors`) to
    the plan's inputs, built here, before the plan (a geometry's first call would otherwise be recorded building
    them, and one recorded later would keep another geometry's)."""
    if dropout_p != 0 or return_probs or geom.dense is not None or not _plannable(inputs):
        return None
    q, k = inputs[0], inputs[1]
    key = (q.device, float(scale), terms, rel, bool(geom.causal), geom.distance_is_i_minus_j())
    key += (geom.explicit_positions(),)
    # (a geometry of shapes alone may still say how long its sequences are: ``max_seqlen``)
    key += (geom.cu_seqlens is not None, geom.max_distance(q.shape[2], k.shape[2]))
    if not geom.depends_on_shapes_alone():
        inputs += _geometry_tensors(geom, q.shape[0], q.shape[2], k.shape[2], q.device)
    return (*key, *map(triton_plan.tensor_key, inputs)), inputs


# Where a call's host work is planned (`triton_plan`): "cuda" (CUDA tensors), "always" (the interpreter too),
# "off". The benchmark's row "triton (no call plans)" times "off" beside the default.
CALL_PLANS = "cuda"


def _plan_mode() -> str:
    _check_mode("CALL_PLANS", CALL_PLANS, triton_plan.MODES)
    return CALL_PLANS


def _plan_settings() -> tuple:
    """What `_PLANS` compares at every call: this module's globals (a setting or function patched in is seen) and
    the tile overrides' entries (a dict the benchmark may fill in place), and whether PyTorch's deterministic
    algorithms are asked for (`_into_rows` records other ops then)."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    return tuple(_GLOBALS.values()), tuple(TILE_OVERRIDES.items()), deterministic


_GLOBALS = globals()
_PLANS = triton_plan.Plans(_plan_settings)


def _made(q, k, v, pos_q, pos_k, rel, geom, scale, terms, dropout_p, return_probs) -> tuple[Tensor, None]:
    """`triton_attention` (its arguments, in its order) made, not replayed from a plan."""
    drop_t = drop_threshold(dropout_p)  # checks 0 <= p < 1
    if return_probs:
        raise ValueError("the triton backend does not return attention probabilities")
    if geom.dense is not None:
        raise ValueError("the triton backend does not take dense (B, H, Nq, Nk) masks")
    B, H, NQ, D = q.shape
    NK = k.shape[2]
    if D not in SUPPORTED_HEAD_DIMS:
        if D > SUPPORTED_HEAD_DIMS[-1]:
            raise ValueError(
                f"the triton backend supports head dims up to {SUPPORTED_HEAD_DIMS[-1]}; got {D}"
            )
        # zero columns add nothing to any dot product: run at the next kernel width and cut the output back
        width = next(w for w in SUPPORTED_HEAD_DIMS if w > D)

        def pad(t: Tensor | None) -> Tensor | None:
            return None if t is None else torch.nn.functional.pad(t, (0, width - D))

        out, _ = triton_attention(
            pad(q),
            pad(k),
            pad(v),
            pad(pos_q),
            pad(pos_k),
            rel,
            geom,
            scale=scale,
            terms=terms,
            dropout_p=dropout_p,
        )
        return out[..., :D], None
    device = q.device
    ij = geom.distance_is_i_minus_j()
    q_pos, k_pos, q_seg, k_seg, k_mask, kv_lo, kv_hi, q_lo, q_hi = _geometry_tensors(geom, B, NQ, NK, device)
    explicit = geom.explicit_positions()

    c2p, p2c, p2p = (terms.c2p, terms.p2c, terms.p2p) if terms.any and rel is not None else (False,) * 3
    cells, band, q_lut = None, 0, None  # the distance tables' cells (`_distance_cells`), the query rows' LUT
    fwd_cells, fwd_band, edges = None, 0, False  # the forward's, where they differ (`_table_layouts`)
    if c2p or p2c or p2p:
        # distances beyond the longest possible one never occur: cut the table there (smaller backward buffers)
        sat = rel.saturation
        if not explicit or geom.cu_seqlens is not None:
            sat = max(1, min(sat, geom.max_distance(NQ, NK) + 1))
        far_tiles = _far_tiles(geom, ij, sat, NQ, NK)
        rows = (pos_k if pos_k is not None else pos_q).shape[1]
        # the lookup tables depend on the mapping and the shapes alone: kept with the mapping across forwards,
        # the LUT with its mirror (the backward folds the query rows' distance buffer of ROW through it)
        lo, hi, lut, mirrored = rel.cached(
            ("triton-lut", sat, rows, device), lambda: _luts(rel, sat, rows, device)
        )
        q_lut = mirrored if c2p or p2p else None
        if (c2p or p2c) and _uses_distance(ij, p2p):
            # the layouts of the backward's tables and of the forward's (`_table_layouts`)
            layout, fwd_layout = _table_layouts(sat, NQ, NK, far_tiles, D, B, device, drop_t > 0)
            band, fwd_band = layout[0], fwd_layout[0]
            cells = _cells(rel, lut, sat, rows, layout, device)
            edges = _cuts_forward_tables(fwd_layout, far_tiles, sat)
            if edges:
                key = ("triton-cells-forward", sat, rows, fwd_layout, device)
                fwd_cells = rel.cached(
                    key, lambda: _forward_cells(_cells(rel, lut, sat, rows, fwd_layout, device), sat)
                )
            elif fwd_layout != layout:
                fwd_cells = _cells(rel, lut, sat, rows, fwd_layout, device)
        if hi - lo < rows:
            pos_q, pos_k = (None if t is None else t[:, lo:hi] for t in (pos_q, pos_k))
    else:
        sat = 1
        lut = geom.cached(("triton-no-lut", device), lambda: torch.zeros(3, dtype=torch.int32, device=device))
        far_tiles = _far_tiles(geom, ij, sat, NQ, NK)
    rows = (pos_k if pos_k is not None else pos_q).shape[1] if (pos_q is not None or pos_k is not None) else 1
    q = _kernel_layout(q)
    k = _kernel_layout(k.to(q.dtype))
    v = _like(v.to(q.dtype), k)
    tokens = max(NQ, NK)
    row_stride = max(D, rows, _distance_stride(sat), q.stride(2), k.stride(2))
    if cells is not None:  # the distance tables (the backward's, the forward's): padded rows of R + 1 cells
        tokens = max(_distance_padded_rows(tokens, b) for b in (band, fwd_band))
        row_stride = max(row_stride, *(c.shape[2] for c in (cells, fwd_cells) if c is not None))
    if tokens * row_stride >= 2**31:
        raise ValueError(
            f"the triton backend indexes one (batch, head) with 32-bit offsets; {tokens} tokens × "
            f"{row_stride} elements per row is too large"
        )
    seed = _draw_seed(device) if drop_t > 0 else None
    aux = _Aux(
        lut, q_pos, k_pos, q_seg, k_seg, k_mask, kv_lo, kv_hi, q_lo, q_hi, seed, cells, q_lut, fwd_cells
    )
    config = _Config(int(sat), c2p, p2c, p2p, bool(geom.causal), ij, far_tiles, drop_t, band, fwd_band, edges)
    out, _ = _attention(
        q,
        k,
        v,
        _table_layout(pos_q) if p2c or p2p else None,
        _table_layout(pos_k) if c2p or p2p else None,
        list(aux),
        float(scale),
        config.values(),
    )
    return out.to(v.dtype), None


def dropout_keep_mask(seed: int, batch: int, heads: int, nq: int, nk: int, p: float, device) -> Tensor:
    """(B, H, Nq, Nk) bool: the dropout mask the kernels apply for ``seed`` (True where kept), materialised for
    tests and inspection. It depends only on (seed, b·H + h, i, j), not on tiles."""
    seed_t = torch.tensor([seed], dtype=torch.int64, device=device)
    out = torch.empty((batch * heads, nq, nk), dtype=torch.uint8, device=device)
    t = Tiles(16, 16, 1, 1) if torch.device(device).type != "cuda" else Tiles(64, 64, 4, 1)
    grid = (batch * heads, triton_cdiv(nq, t.block_m), triton_cdiv(nk, t.block_n))
    _kernels()._keep_mask_kernel[grid](out, seed_t, nq, nk, drop_threshold(p), **_launch(t))
    return out.view(batch, heads, nq, nk).bool()


def _unsupported(r: Request) -> str | None:
    if r.device_type != "cuda" and not (r.device_type == "cpu" and interpreter_enabled()):
        return "needs a CUDA device (or TRITON_INTERPRET=1 on CPU, for tests)"
    if r.capability is not None and r.capability < TRITON_TENSOR_CORES:
        # besides the speed, the head-dim-128 dQ kernel compiled for sm_75 needs 139 264 bytes of shared memory,
        # where a Turing GPU's block may use 64 KB
        return (
            f"needs an NVIDIA GPU of compute capability {capability_str(TRITON_TENSOR_CORES)} or newer, this "
            f"one is {capability_str(r.capability)}: for older GPUs Triton compiles the kernels' matrix "
            f"products without tensor cores"
        )
    if r.needs_probs:
        return "it does not return attention probabilities"
    if r.dense_mask:
        return "it does not take dense attention masks"
    if r.dtype not in SUPPORTED_DTYPES:
        return f"dtype {r.dtype} is not one of {SUPPORTED_DTYPES}"
    if r.head_dim > SUPPORTED_HEAD_DIMS[-1]:
        return f"head dim {r.head_dim} is above {SUPPORTED_HEAD_DIMS[-1]}"
    return None


def _priority(r: Request) -> float:
    # first choice on CUDA; below every other backend on CPU, where it only runs interpreted
    return 100.0 if r.device_type == "cuda" else -1.0


register(Backend("triton", triton_attention, unsupported=_unsupported, priority=_priority))
