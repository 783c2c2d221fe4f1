"""The `triton` backend against `eager`: outputs and the gradients of q, k, v, pos_q and pos_k over a named grid.

Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set below before any kernel is
defined; the backend imports its kernels on first use), at small shapes and 16×16 tiles, so that the far-tile
path (distances beyond the saturation of the index), the near band and partial tiles are all exercised. With CUDA
the same grid runs compiled, and ``@pytest.mark.gpu`` tests repeat it at real sizes.

Tolerances: float32 1e-5 (the kernels run IEEE-precision matmuls and accumulate in float32, like `eager`).
bfloat16 / float16 are compared with `eager` fed the same rounded inputs, with a bound relative to each tensor's
largest magnitude: 2e-2 for bfloat16, 4e-3 for float16 (`python tests/attention/half_precision_sweep.py --grid`:
at most 0.8e-2 and 0.8e-3 over the grid on the tables road, 0.66e-2 and 1.2e-3 on the distance road, the default
since 2026-11-26, whose tables hold the position terms in the inputs' dtype; with the interpreter rounding
float32 to bfloat16 to nearest as the GPU does, `triton_interpreter.round_bfloat16_to_nearest_in_interpreter`). Like FlashAttention, the kernels round
probabilities and score gradients to the input dtype before the matmuls with V, K and Q (and the score gradients
they store for the position tables), which `eager` (all float32) does not; one bfloat16 step is 0.4–0.8%.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import os
import random
import re
import sys
import zlib
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from debertakit.attention import (  # noqa: E402
    Geometry,
    PositionTerms,
    RelativeIndex,
    Request,
    eager,
    eager_attention,
    get_backend,
    packed_geometry,
    scale_for,
    triton_backend,
)
from debertakit.attention.dropout import rounded_p  # noqa: E402
from debertakit.attention.triton_backend import Tiles, dropout_keep_mask, triton_attention  # noqa: E402
from debertakit.attention.triton_kernels import _split  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

BUCKETS = RelativeIndex(span=8, bucket_size=8, max_position=16)  # log buckets; saturates at |i - j| = 16
CLAMP = RelativeIndex(span=8)  # v1 plain clamping; saturates at 8
WIDE = RelativeIndex(span=64)  # never saturates at these lengths


@dataclass(frozen=True)
class Case:
    n: int = 33
    n_k: int | None = None  # keys (default: n)
    batch: int = 1
    heads: int = 1
    dim: int = 16
    rel: RelativeIndex = BUCKETS
    terms: PositionTerms = PositionTerms()
    causal: bool = False
    key_lengths: tuple[int, ...] | None = None  # padding: valid keys per batch row
    cu_seqlens: tuple[int, ...] | None = None  # packing: one row, sequences back to back
    q_offset: int | None = None  # explicit positions: queries at offset + arange(n), keys at arange(n_k)


GRID = {
    "n1": Case(n=1),
    "n7": Case(n=7),
    "n33": Case(n=33),
    "n70_saturating": Case(n=70),
    "v1_clamp_saturating": Case(n=70, rel=CLAMP),
    "wide_span": Case(n=33, rel=WIDE),
    "c2p_only": Case(n=70, terms=PositionTerms(c2p=True, p2c=False)),
    "p2c_only": Case(n=70, terms=PositionTerms(c2p=False, p2c=True)),
    "no_position_terms": Case(n=33, terms=PositionTerms(c2p=False, p2c=False)),
    "p2p": Case(n=33, terms=PositionTerms(c2p=True, p2c=True, p2p=True)),
    "heads2_d32_batch2": Case(n=33, batch=2, heads=2, dim=32),
    "padding": Case(n=70, batch=3, key_lengths=(70, 41, 0)),
    "causal": Case(n=70, causal=True),
    "causal_padding": Case(n=33, batch=2, causal=True, key_lengths=(33, 20)),
    "packed": Case(n=70, cu_seqlens=(0, 5, 38, 40, 66)),
    "packed_causal": Case(n=70, cu_seqlens=(0, 17, 50, 70), causal=True),
    # sequences shorter than the saturation in a row longer than it: no far tile (one near run per program),
    # and near tiles holding hidden pairs 16 or more apart
    "packed_short_sequences": Case(n=70, cu_seqlens=(0, 12, 20, 35, 50, 66)),
    "cross_nq_lt_nk": Case(n=20, n_k=45),
    "cross_nq_gt_nk": Case(n=45, n_k=20, rel=CLAMP),
    "explicit_positions": Case(n=20, n_k=45, q_offset=25, causal=True),
    # loaded positions with hidden pairs only in whole columns: a bias per column, far tiles found at run time
    "explicit_positions_padding": Case(n=20, n_k=45, batch=2, q_offset=25, key_lengths=(45, 30)),
    "d64_heads2": Case(n=20, heads=2, dim=64),
    "d128_v1_padding": Case(n=18, batch=2, dim=128, rel=CLAMP, key_lengths=(18, 7)),
    "d8_zero_padded_to_16": Case(n=33, dim=8),
}
HALF_GRID = list(GRID)
HALF_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _geometry(c: Case, device: str) -> Geometry:
    n_k = c.n_k or c.n
    if c.cu_seqlens is not None:
        geom, _ = packed_geometry(torch.tensor(c.cu_seqlens, device=device), c.n, causal=c.causal)
        return geom
    geom = Geometry(causal=c.causal)
    if c.key_lengths is not None:
        geom.key_mask = (
            torch.arange(n_k, device=device)[None] < torch.tensor(c.key_lengths, device=device)[:, None]
        )
    if c.q_offset is not None:
        geom.q_positions = c.q_offset + torch.arange(c.n, device=device)[None]
        geom.k_positions = torch.arange(n_k, device=device)[None]
    return geom


def _inputs(c: Case, dtype: torch.dtype, device: str):
    g = torch.Generator().manual_seed(zlib.crc32(repr(c).encode()))
    n_k = c.n_k or c.n
    rows = c.rel.table_rows

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_()

    q, k, v = (
        rnd(c.batch, c.heads, c.n, c.dim),
        rnd(c.batch, c.heads, n_k, c.dim),
        rnd(c.batch, c.heads, n_k, c.dim),
    )
    pos_q = rnd(c.heads, rows, c.dim) if (c.terms.p2c or c.terms.p2p) else None
    pos_k = rnd(c.heads, rows, c.dim) if (c.terms.c2p or c.terms.p2p) else None
    return q, k, v, pos_q, pos_k


def _run(fn, c: Case, inputs, geom: Geometry, grad_out: torch.Tensor | None = None, **kw):
    q, k, v, pos_q, pos_k = inputs
    sf = 1 + sum(c.terms)
    out, _ = fn(q, k, v, pos_q, pos_k, c.rel, geom, scale=scale_for(c.dim, sf), terms=c.terms, **kw)
    leaves = [t for t in inputs if t is not None]
    grads = torch.autograd.grad(out, leaves, _grad_out(out) if grad_out is None else grad_out.to(out))
    return out, grads


def _grad_out(out: torch.Tensor) -> torch.Tensor:
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out)


def _reference_inputs(inputs, device: str) -> list:
    """The inputs the reference runs on: the same tensors on CPU; on a GPU float32 copies of them (exact), so
    that 16-bit kernels are held to eager's float32 result at real sizes, not to eager's own 16-bit rounding."""
    return _float32_copies(inputs) if device == "cuda" else list(inputs)


def _float32_copies(inputs) -> list:
    return [None if t is None else t.detach().float().requires_grad_() for t in inputs]


def _projection_layout(t: torch.Tensor) -> torch.Tensor:
    """``t`` (…, H, N, d), a leaf of the same values laid out as `split_heads` gives a projection's: (…, N, H, d)
    memory viewed per head (q, k, v from (B, N, H·d); a position table from (R, H·d))."""
    h = t.dim() - 3
    return t.detach().transpose(h, h + 1).contiguous().transpose(h, h + 1).requires_grad_()


# Float32 at real sizes (the GPU grid), relative to each tensor's largest value: sums over up to 1500 keys, and
# for the tables' gradients over every row of the batch, round differently in any two implementations. The CPU
# grid's 1e-5 absolute is for its small shapes. Seen: dk of `v3_padding` with dropout differed from eager by
# 1.08e-5 at a largest value of 0.82 on an H100 (1.09e-5 in the interpreter on CPU, the same case).
GPU_FLOAT32_TOLERANCE = 1e-4


def _compare(
    c: Case, dtype: torch.dtype, device: str, geom: Geometry | None = None, call_scale: bool = False
) -> None:
    """`triton_attention` against `eager_attention` on case ``c`` (its own geometry unless ``geom`` is given;
    ``call_scale``: `_assert_close`'s)."""
    geom = _geometry(c, device) if geom is None else geom
    inputs = _inputs(c, dtype, device)
    out, grads = _run(triton_attention, c, inputs, geom)
    ref, ref_grads = _run(eager_attention, c, _reference_inputs(inputs, device), geom, _grad_out(out))
    _assert_close(c, inputs, dtype, (out, *grads), (ref, *ref_grads), call_scale)


def _assert_close(c: Case, inputs, dtype: torch.dtype, got, want, call_scale: bool = False) -> None:
    """Output and gradients (out, dq, dk, dv, dpos_q?, dpos_k?) within the grid's tolerance for ``dtype``, against
    a reference of that dtype or (on a GPU, `_reference_inputs`) of float32; in 16 bits relative to each
    tensor's largest value, or with ``call_scale`` the gradients taken from the score gradients (dq, dk and the
    position tables') relative to the largest reference gradient of the call: the backward's rounding of dS
    (rowsum(dO ∘ O) from the 16-bit output, as FlashAttention's; P in 16 bits) is at that scale, and a gradient
    whose terms cancel keeps it (a row whose visible keys all lie beyond the saturation on one side sums its dS
    to a table gradient of 0, a causal row of one visible key its dS to a dq of 0: the random grid's 16-bit
    cases gave up to 5e-3 there where eager's 16-bit autograd gives at most 3e-8; docs/gpu-kernel.md, "Random
    settings over the random grid")."""
    names = ["out", "dq", "dk", "dv", "dpos_q", "dpos_k"]
    names = names[:4] + [n for n, t in zip(names[4:], inputs[3:]) if t is not None]
    largest_grad = max(w.float().abs().max().item() for w in want[1:]) if call_scale else 0.0
    for name, a, b in zip(names, got, want, strict=True):
        assert a.dtype == dtype and a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        if dtype == torch.float32 and a.is_cuda:
            bound = GPU_FLOAT32_TOLERANCE * max(b.abs().max().item(), 0.1)
            torch.testing.assert_close(a, b, atol=bound, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
        elif dtype == torch.float32:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        else:
            err = (a.float() - b.float()).abs().max().item()
            scale = b.float().abs().max().item()
            if call_scale and name not in ("out", "dv"):
                scale = largest_grad
            bound = HALF_TOLERANCE[dtype] * max(scale, 1e-3)
            assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g}"


def _assert_same_bits(got, want) -> None:
    """Two `_run` results, (out, grads), equal bit for bit: output and every gradient."""
    names = ["out", "dq", "dk", "dv", "dpos_q", "dpos_k"]
    for name, a, b in zip(names, (got[0], *got[1]), (want[0], *want[1])):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("name", list(GRID))
def test_matches_eager_float32(name):
    _compare(GRID[name], torch.float32, DEVICE)


@pytest.mark.parametrize("name", HALF_GRID)
def test_matches_eager_bfloat16(name):
    _compare(GRID[name], torch.bfloat16, DEVICE)


@pytest.mark.parametrize(
    "name", ["n70_saturating", "packed", "causal_padding", "d64_heads2", "explicit_positions"]
)
def test_matches_eager_float16(name):
    _compare(GRID[name], torch.float16, DEVICE)


def test_fully_padded_row_outputs_zeros_and_zero_gradients():
    c = GRID["padding"]  # third batch row has no visible key
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)
    out, grads = _run(triton_attention, c, inputs, geom)
    assert out[2].abs().max() == 0
    assert grads[0][2].abs().max() == 0 and grads[2][2].abs().max() == 0  # dq, dv of that row


@pytest.mark.parametrize("near_band", ["tables", "distance", "skew"])
def test_left_padded_keys_match_eager(monkeypatch, near_band):
    """Keys hidden at the start of a row keep the kernels' loops off the first blocks (their ranges start
    later): the distance cells whose partner lies there are never visited, and the kernels write their zeros
    outside the loop (`_zero_unvisited`; the tests start the buffers as NaN, so a missed cell shows)."""
    monkeypatch.setattr(triton_backend, "NEAR_BAND", near_band)
    _compare(Case(n=70, batch=2), torch.float32, DEVICE, _left_padded(70, (40, 3)))


def _left_padded(n: int, starts: tuple[int, ...]) -> Geometry:
    """A geometry whose batch row b masks its first ``starts[b]`` of ``n`` keys."""
    geom = Geometry()
    geom.key_mask = torch.arange(n, device=DEVICE)[None] >= torch.tensor(starts, device=DEVICE)[:, None]
    return geom


TERMS = {
    "c2p_p2c": PositionTerms(),
    "c2p": PositionTerms(c2p=True, p2c=False),
    "p2c": PositionTerms(c2p=False, p2c=True),
}


@pytest.mark.parametrize("near_band", ["tables", "distance", "skew"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("terms", list(TERMS))
def test_key_mask_with_holes_matches_eager(monkeypatch, terms, causal, near_band):
    """Keys masked here and there, not as one run of padding: hidden columns in the near band and in far tiles on
    both sides of every query block (70 keys, tiles of 16: the last key block is partial), for each kind of
    position term (far tiles add a column value with p2c, none without), with and without a causal mask."""
    monkeypatch.setattr(triton_backend, "NEAR_BAND", near_band)
    c = Case(n=70, batch=2, terms=TERMS[terms], causal=causal)
    geom = Geometry(causal=causal)
    geom.key_mask = (torch.rand(2, 70, generator=torch.Generator().manual_seed(3)) > 0.3).to(DEVICE)
    _compare(c, torch.float32, DEVICE, geom)


def test_kernels_get_only_the_table_rows_short_inputs_index(monkeypatch):
    """A whole table for a short input: the op is given the rows that distances up to N index (the tables
    road's ROW and COL are as wide as the table), and gives what the model's pre-cut window gives."""
    c = Case(n=20, rel=WIDE)  # distances -20 … 20 index 41 of the 128 rows
    seen = []
    real = triton_backend._attention

    def op(q, k, v, pos_q, pos_k, aux, *rest):
        lut = triton_backend._Aux(*aux).lut
        seen.append((pos_q.shape[1], pos_k.shape[1], int(lut.min()), int(lut.max())))
        return real(q, k, v, pos_q, pos_k, aux, *rest)

    monkeypatch.setattr(triton_backend, "_attention", op)
    inputs = _inputs(c, torch.float32, DEVICE)
    out, grads = _run(triton_attention, c, inputs, Geometry())
    assert seen == [(41, 41, 0, 40)]
    lo, hi = c.rel.window(c.n)
    assert (lo, hi) == (44, 85)
    window = [t.detach()[:, lo:hi].requires_grad_() for t in inputs[3:]]
    cut = _run(
        triton_attention, dataclasses.replace(c, rel=c.rel.shifted(lo)), [*inputs[:3], *window], Geometry()
    )
    assert seen[1] == (41, 41, 0, 40) and torch.equal(out, cut[0])
    for full, part in zip(grads[3:], cut[1][3:]):
        assert full[:, :lo].abs().max() == 0 and full[:, hi:].abs().max() == 0
        assert torch.equal(full[:, lo:hi], part)


def _set_backend(monkeypatch, settings: dict) -> None:
    """Sets `triton_backend`'s module settings ``settings`` (name: value) for the test."""
    for name, value in settings.items():
        monkeypatch.setattr(triton_backend, name, value)


def _count_calls(monkeypatch, *names: str) -> Counter:
    """Counts the calls of `triton_backend`'s functions ``names`` (by name) from here on, running each."""
    calls = Counter()

    def counting(name):
        real = getattr(triton_backend, name)

        def counted(*args):
            calls[name] += 1
            return real(*args)

        return counted

    for name in names:
        monkeypatch.setattr(triton_backend, name, counting(name))
    return calls


@pytest.mark.parametrize("near_band", ["tables", "distance"])
def test_lookup_tables_are_built_once_across_forwards(monkeypatch, near_band):
    """The LUTs and the distance tables' cells depend on the mapping and the shapes alone: a second forward with
    a new geometry (each forward has one) builds none of them again, and no backward mirrors the LUT; the result
    is the first forward's."""
    monkeypatch.setattr(triton_backend, "NEAR_BAND", near_band)
    c = dataclasses.replace(GRID["n33"], rel=RelativeIndex(span=16, bucket_size=8, max_position=32))
    builds = _count_calls(monkeypatch, "_lut", "_mirrored", "_distance_cells")
    inputs = _inputs(c, torch.float32, DEVICE)
    first = _run(triton_attention, c, inputs, Geometry())
    once = dict(builds)
    second = _run(triton_attention, c, inputs, Geometry())
    assert builds == once
    assert once == {"_lut": 1, "_mirrored": 1, **({"_distance_cells": 1} if near_band == "distance" else {})}
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(first[1], second[1]))


def test_saturated_pairs_reach_the_end_rows_of_the_table():
    """Far pairs only touch the two saturated rows: their gradient must be there, and match eager."""
    c = GRID["n70_saturating"]
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)
    _, grads = _run(triton_attention, c, inputs, geom)
    _, ref = _run(eager_attention, c, inputs, geom)
    far_rows = [int(c.rel.lut[0]), int(c.rel.lut[-1])]
    for got, want in zip(grads[3:], ref[3:]):
        assert want[:, far_rows].abs().min() > 0
        torch.testing.assert_close(got[:, far_rows], want[:, far_rows], atol=1e-5, rtol=1e-5)


@triton.jit
def _split_probe(OUT, OWN_AT, LO, SATS, OWN: tl.constexpr, OTHER: tl.constexpr):
    """`_split` of case ``program_id``: its two bounds into OUT."""
    case = tl.program_id(0)
    first, last = _split(tl.load(OWN_AT + case), tl.load(LO + case), tl.load(SATS + case), OWN, OTHER)
    tl.store(OUT + 2 * case, first)
    tl.store(OUT + 2 * case + 1, last)


def _far_sides(own: int, own_block: int, start: int, other_block: int, sat: int) -> tuple[bool, bool]:
    """Whether every pair (a, t) of a tile, a in the program's block from ``own``, t in the loop's block from
    ``start``, is at least ``sat`` apart with t before a, and with t after a."""
    return own - (start + other_block - 1) >= sat, start - (own + own_block - 1) >= sat


@pytest.mark.parametrize("own_block, other_block", [(16, 16), (32, 16), (16, 64)])
def test_split_cuts_the_loop_exactly_where_tiles_saturate(own_block, other_block):
    """At distance i - j the kernels' loops visit far tiles as a prefix and a suffix, compiled without the near
    band's gathers: `_split` must put every tile whose pairs all saturate on one side there (a near tile counted
    far would lose its position terms) and no other (a far tile counted near costs gathers), for the query-block
    programs (prefix: keys far before) and the key-block ones alike. Saturation distances cover every residue
    modulo the blocks (the bounds' rounding), program blocks every position along a 320-long loop."""
    cases = [
        (own, lo, hi, sat)
        for sat in range(1, 2 * other_block + 3)
        for own in range(0, 320, own_block)
        for lo, hi in ((0, 320), (other_block, 200), (64, 64))  # lo: a block start, as the kernels round it
    ]
    own_at, lo, _, sats = (torch.tensor(col, dtype=torch.int32, device=DEVICE) for col in zip(*cases))
    out = torch.zeros(2 * len(cases), dtype=torch.int32, device=DEVICE)
    _split_probe[(len(cases),)](out, own_at, lo, sats, OWN=own_block, OTHER=other_block)
    for (own, lo, hi, sat), (first, last) in zip(cases, out.view(-1, 2).tolist()):
        first, last = min(first, hi), min(last, hi)  # the kernels clamp both to the loop's end
        tiles = range(lo, hi, other_block)
        # every pair (a, t) of the tile, a in the program's block, t in the loop's: |a - t| >= sat, one side
        far_before = [t for t in tiles if _far_sides(own, own_block, t, other_block, sat)[0]]
        far_after = [t for t in tiles if _far_sides(own, own_block, t, other_block, sat)[1]]
        near = [t for t in tiles if t not in far_before + far_after]
        case = (own, lo, hi, sat)
        assert list(range(lo, first, other_block)) == far_before, case
        assert list(range(first, last, other_block)) == near, case
        assert list(range(last, hi, other_block)) == far_after, case


# Cases with far tiles (where the forward's tables may be cut): both position terms, each alone, v1's clamping,
# padding, a causal mask, packed sequences, several heads and batch rows
FORWARD_REACH_CASES = [
    "n70_saturating", "v1_clamp_saturating", "c2p_only", "p2c_only", "padding", "causal", "packed",
    "heads2_d32_batch2",
]  # fmt: skip


def _table_reaches(launches) -> dict[str, int]:
    """R / 2 of the distance tables each recorded attention kernel read (`triton_access.record_run`'s
    launches)."""
    kernels = triton_backend._kernels()
    return {
        name: args[getattr(kernels, name).arg_names.index("R")] // 2
        for name, (args, _) in launches.items()
        if name in triton_backend.KERNEL_NAMES
    }


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize(
    "name, dtype",
    [(name, "float32") for name in FORWARD_REACH_CASES]
    + [(name, "bfloat16") for name in ("n70_saturating", "padding", "packed")],
)
def test_forward_tables_cut_to_the_saturation_give_the_same_results(monkeypatch, name, dtype):
    """`FORWARD_REACH = "saturation"`: the forward's distance tables reach the saturation rounded up to 16 (here
    16 cells either side, against 48 for the tiles), its near tiles beyond it take the saturated values, and
    output and gradients are those of the uncut tables bit for bit (a pair beyond the saturation reads, uncut,
    a cell equal to its row's end); the backward reads its own, uncut tables."""
    from debertakit.attention.triton_access import record_run

    c = GRID[name]
    geom, inputs = _geometry(c, DEVICE), _inputs(c, getattr(torch, dtype), DEVICE)
    want = _run(triton_attention, c, inputs, geom)
    monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
    with record_run("triton_kernels.py") as (_, launches):
        got = _run(triton_attention, c, inputs, geom)
    assert launches["_fwd_kernel"][1]["EDGES"]
    wide = triton_backend._distance_reach(c.rel.saturation, c.n, c.n, 32)  # the interpreter's 16x16 tiles
    cut = triton_backend._aligned(c.rel.saturation)
    assert _table_reaches(launches) == {"_fwd_kernel": cut, "_dq_kernel": wide, "_dkv_kernel": wide}
    assert cut < wide
    _assert_same_bits(got, want)


def _launch_arg(launches, kernel: str, name: str) -> int:
    """Argument ``name`` of ``kernel``'s recorded launch (`triton_access.record_run`)."""
    args, kwargs = launches[kernel]
    return (
        kwargs[name]
        if name in kwargs
        else args[getattr(triton_backend._kernels(), kernel).arg_names.index(name)]
    )


# tables of one band (far tiles, padding) and, unsaturated at its length (no far tile), of bands: at 140 tokens
# the forward's 16-row bands (161 cells a row) against the one band (289 cells) a 64-key dK/dV tile needs
OWN_LAYOUT_CASES = {
    "one_band": Case(n=150, batch=2, key_lengths=(150, 97)),
    "bands": Case(n=140, batch=2, rel=RelativeIndex(span=256), key_lengths=(140, 101)),
}


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize("name", OWN_LAYOUT_CASES)
def test_forward_reads_tables_laid_out_for_its_own_tiles(monkeypatch, name):
    """The forward's distance tables are laid out for its tiles, the backward's for its two kernels'
    (`_table_layouts`): with dK/dV at 16x64 (the others at the interpreter's 16x16) the backward's tables reach
    further or run in longer bands; the forward's stay as they are without it (reach, bands, and so its output
    bit for bit), and output and gradients match eager; cut to the saturation (`FORWARD_REACH`), the forward's
    own tables are cut. Where the backward reads the forward's tables (`KEEP_TABLES`), one layout serves the
    three kernels."""
    from debertakit.attention.triton_access import record_run

    c = OWN_LAYOUT_CASES[name]
    geom, inputs = _geometry(c, DEVICE), _inputs(c, torch.float32, DEVICE)

    def layouts(launches) -> dict[str, tuple[int, int]]:
        return {
            k: (_launch_arg(launches, k, "R"), _launch_arg(launches, k, "LOG2_BAND"))
            for k in launches
            if k in triton_backend.KERNEL_NAMES
        }

    with record_run("triton_kernels.py") as (_, launches):
        want = _run(triton_attention, c, inputs, geom)
    alike = layouts(launches)
    assert len(set(alike.values())) == 1, alike  # the same tiles: one layout
    monkeypatch.setitem(triton_backend.TILE_OVERRIDES, "_dkv_kernel", Tiles(16, 64, 1, 1))
    with record_run("triton_kernels.py") as (_, launches):
        got = _run(triton_attention, c, inputs, geom)
    wide = layouts(launches)
    assert wide["_fwd_kernel"] == alike["_fwd_kernel"] != wide["_dq_kernel"] == wide["_dkv_kernel"], wide
    if name == "one_band":  # farther: the saturation plus 16 + 64
        assert (
            wide["_dq_kernel"][0] > alike["_dq_kernel"][0] and wide["_dq_kernel"][1] == alike["_dq_kernel"][1]
        )
    else:  # one band of 289 cells a row (LOG2_BAND 30) where the forward reads 16-row bands (4)
        assert (alike["_fwd_kernel"][1], wide["_dq_kernel"][1]) == (4, 30), wide
    assert torch.equal(got[0], want[0])  # the forward's output: its tables' cells the same
    _compare(c, torch.float32, DEVICE)
    if name == "one_band":  # and cut to the saturation (`FORWARD_REACH`) from its own, the output the same
        monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
        with record_run("triton_kernels.py") as (_, launches):
            cut = _run(triton_attention, c, inputs, geom)
        assert layouts(launches)["_fwd_kernel"][0] // 2 == triton_backend._aligned(c.rel.saturation)
        assert launches["_fwd_kernel"][1]["EDGES"] and torch.equal(cut[0], want[0])
        monkeypatch.setattr(triton_backend, "FORWARD_REACH", "tiles")
    monkeypatch.setattr(triton_backend, "KEEP_TABLES", True)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(c, torch.float32, DEVICE)
    assert len(set(layouts(launches).values())) == 1, layouts(launches)


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize(
    "name, keep", [("n7", False), ("packed_short_sequences", False), ("n70_saturating", True)]
)
def test_forward_tables_stay_whole_where_nothing_is_cut(monkeypatch, name, keep):
    """`FORWARD_REACH = "saturation"` cuts nothing where no tile is far (the tables' rows then hold only what
    their pairs read: a short input, a row of short sequences), nor where the forward keeps its tables for the
    backward (`KEEP_TABLES`, which reads them uncut): the forward's kernel is told of no edge tile, and the
    call matches eager."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
    monkeypatch.setattr(triton_backend, "KEEP_TABLES", keep)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(GRID[name], torch.float32, DEVICE)
    assert not launches["_fwd_kernel"][1]["EDGES"]
    reaches = _table_reaches(launches)
    assert reaches["_fwd_kernel"] == reaches["_dq_kernel"] == reaches["_dkv_kernel"]


# Longer than the grid's cases, so that the far-right run holds whole blocks of 64 keys too (from the fifth query
# block on) and one of 128 (the last): one row whole, one padded to a length that is no multiple of 16; and the
# same length padded on the left (keys masked from the start: the programs' first visible key past 0)
WIDE_FAR_CASES = {
    **GRID,
    "n150_padded": Case(n=150, batch=2, key_lengths=(150, 97)),
    "n150_left_padded": Case(n=150, batch=2),  # its geometry: `_wide_far_geometry`
}


def _wide_far_geometry(name: str) -> Geometry | None:
    """The geometry of a `WIDE_FAR_CASES` case (None: the case's own), ``n150_left_padded`` its keys masked from
    the start: 40 in the first row, 77 in the second."""
    return _left_padded(150, (40, 77)) if name == "n150_left_padded" else None


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize(
    "name, dtype, far_keys",
    [(name, "float32", keys) for name in (*FORWARD_REACH_CASES, "n150_padded") for keys in (32, 64)]
    + [("n150_padded", "float32", 128), ("n150_left_padded", "float32", 64)]
    + [(name, "bfloat16", 64) for name in ("n150_padded", "packed")],
)
def test_forward_far_tiles_in_wide_blocks_match_eager(monkeypatch, name, dtype, far_keys):
    """`FORWARD_FAR_KEYS`: the forward's far runs in blocks of 32 or 64 keys (the interpreter's tiles are 16x16:
    runs whose lengths are no multiple of the wide block leave a rest of narrow blocks, before the far-left
    run's first wide block and after the far-right run's last; the far-left run's last wide block passes the
    keys' end), the near run in blocks of 16: output and every gradient match eager, and the forward's
    launch was told the wide blocks."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "FORWARD_FAR_KEYS", far_keys)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(WIDE_FAR_CASES[name], getattr(torch, dtype), DEVICE, _wide_far_geometry(name))
    assert launches["_fwd_kernel"][1]["FAR_N"] == far_keys
    assert launches["_fwd_kernel"][1]["BLOCK_N"] == 16


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's loads")
def test_forward_wide_far_blocks_start_on_multiples_of_their_width(monkeypatch):
    """The forward tells the compiler that a key block starts on a multiple of its width (`_key_block`'s
    ``tl.multiple_of``: aligned vector loads on a GPU, wrong ones where it is false, which no result under the
    interpreter shows), so every wide block must: the K blocks of 64 keys a packed row's forward loads (its
    segments start inside blocks: the programs' first visible keys, floored to 64) start on multiples of 64, and
    the output matches eager's."""
    from debertakit.attention.triton_access import record_run

    c = Case(n=200, cu_seqlens=(0, 37, 190, 200))
    geom, (q, k, v, pos_q, pos_k) = _geometry(c, DEVICE), _inputs(c, torch.float32, DEVICE)
    monkeypatch.setattr(triton_backend, "FORWARD_FAR_KEYS", 64)
    scale = scale_for(c.dim, 1 + sum(c.terms))
    with torch.no_grad(), record_run("triton_kernels.py") as (loads, _):
        out, _ = triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=scale, terms=c.terms)
    want, _ = eager_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=scale, terms=c.terms)
    torch.testing.assert_close(out, want)
    starts = _wide_key_block_starts(loads, "_fwd_kernel", k, c)
    assert starts and all(n % 64 == 0 for n in starts), sorted(set(starts))


def _wide_key_block_starts(loads, kernel: str, k: torch.Tensor, c: Case) -> list[int]:
    """The first key of every block of 64 K rows ``kernel`` loaded from ``k`` (`record_run`'s loads, in
    `_key_block`), as a key index of its sequence."""
    start, itemsize = k.data_ptr(), k.element_size()
    return [
        (addresses[0, 0] - start) // itemsize // c.dim % c.n
        for (name, fn, _), calls in loads.items()
        if name == kernel and fn == "_key_block"
        for addresses, _, _ in calls
        if addresses.shape[0] == 64 and start <= addresses[0, 0] < start + k.untyped_storage().nbytes()
    ]


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize("road", ["distance", "tables", "skew"])
def test_forward_far_tiles_in_wide_blocks_on_the_distance_road_only(monkeypatch, road):
    """The wide far blocks with the forward's tables cut to the saturation (``EDGES``) on the distance road; the
    other roads to the near band's terms, kept for timing (neither compiled nor counted with wide blocks), take
    none. Every road matches eager."""
    from debertakit.attention.triton_access import record_run

    _near_band(monkeypatch, road)
    monkeypatch.setattr(triton_backend, "FORWARD_FAR_KEYS", 64)
    monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
    with record_run("triton_kernels.py") as (_, launches):
        _compare(WIDE_FAR_CASES["n150_padded"], torch.float32, DEVICE)
    kwargs = launches["_fwd_kernel"][1]
    assert kwargs["FAR_N"] == (64 if road == "distance" else kwargs["BLOCK_N"])
    assert kwargs["EDGES"] == (road == "distance")


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize("far_keys", [64, 128])
def test_forward_far_tiles_in_wide_blocks_with_dropout_match_eager(monkeypatch, far_keys):
    """Wide far blocks draw the mask the narrow ones draw (a function of the pair, not of the tile: visible keys
    in every group of eight columns of a wide tile): output and gradients equal eager's probabilities times the
    kernels' mask, which the backward's narrow tiles redraw. With dropout 128 keys are taken as 64
    (`_far_keys`)."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "FORWARD_FAR_KEYS", far_keys)
    with record_run("triton_kernels.py") as (_, launches):
        _compare_with_dropout(monkeypatch, WIDE_FAR_CASES["n150_padded"], torch.float32, DEVICE, 0.3)
    assert launches["_fwd_kernel"][1]["FAR_N"] == 64 and launches["_fwd_kernel"][1]["DROPOUT"]


# (setting, kernel, case): where a kernel takes no wide blocks (`_far_keys`)
NARROW_FAR_CASES = [
    *(
        ("FORWARD_FAR_KEYS", "_fwd_kernel", name)
        for name in ("n7", "packed_short_sequences", "explicit_positions")
    ),
    ("FORWARD_FAR_KEYS", "_fwd_kernel", "packed_d128"),
    *(("DQ_FAR_KEYS", "_dq_kernel", name) for name in ("n7", "packed", "explicit_positions")),
]


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize("setting, kernel, name", NARROW_FAR_CASES)
def test_far_keys_stay_narrow_where_no_run_is_far(monkeypatch, setting, kernel, name):
    """No wide block where a kernel's loop has no far runs: no far tile (a short input, a row of short
    sequences) or positions other than i - j (one run of tiles of any kind); nor, in the forward, at head dim
    128 with packed rows, where it spills registers, nor in dQ with packed rows, where it saves no instruction
    a score for many more registers (`_far_keys`)."""
    from debertakit.attention.triton_access import record_run

    cases = {**GRID, "packed_d128": Case(n=70, dim=128, cu_seqlens=(0, 5, 38, 40, 66))}
    monkeypatch.setattr(triton_backend, setting, 64)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(cases[name], torch.float32, DEVICE)
    assert launches[kernel][1]["FAR_N"] == launches[kernel][1]["BLOCK_N"]


@pytest.mark.parametrize(
    "setting, kernel", [("FORWARD_FAR_KEYS", "_fwd_kernel"), ("DQ_FAR_KEYS", "_dq_kernel")]
)
@pytest.mark.parametrize("value", [48, 256, 0, "64", True])
def test_far_keys_setting_is_checked(monkeypatch, setting, kernel, value):
    """A `FORWARD_FAR_KEYS` / `DQ_FAR_KEYS` that is no power of two dividing FAR_PAD: an error naming it, at
    the kernel's launch (a call raises it too)."""
    with pytest.raises(ValueError, match=f"{setting} .* got {value!r}"):
        triton_backend._far_keys(value, 16, True, 64, False, False, kernel)
    monkeypatch.setattr(triton_backend, setting, value)
    with pytest.raises(ValueError, match=setting):
        _compare(GRID["n7"], torch.float32, DEVICE)


# value, block_n, split (distance road, far tiles), head_dim, segments, dropout -> FAR_N, per kernel
FAR_KEYS_CASES = {
    # no narrower than the tiles' block (None: the default's); none at head dim 128 with packed rows (segments),
    # where they spill; 128 keys taken as 64 at head dim 128, with dropout or with segments (spills, and sm_86's
    # shared memory)
    "_fwd_kernel": [
        (32, 64, True, 64, False, False, 64), (64, 64, True, 64, False, False, 64),
        (None, 32, True, 64, False, False, 32), (128, 32, True, 64, False, False, 128),
        (128, 32, False, 64, False, False, 32), (64, 16, True, 64, True, False, 64),
        (64, 16, True, 128, False, False, 64), (64, 16, True, 128, True, False, 16),
        (128, 16, True, 128, False, False, 64), (128, 16, True, 64, False, True, 64),
        (128, 32, True, 64, True, False, 64), (128, 16, True, 128, True, True, 16),
    ],
    # 64 at most at head dims up to 64 without dropout, 32 at 128 or with dropout, none with segments or at 128
    # with dropout, none where the loop is not split, no less than the tiles' block
    "_dq_kernel": [
        (128, 32, True, 64, False, False, 64), (64, 32, True, 64, False, False, 64),
        (32, 32, True, 64, False, False, 32), (None, 32, True, 64, False, False, 32),
        (64, 32, False, 64, False, False, 32), (64, 32, True, 64, True, False, 32),
        (64, 16, True, 128, False, False, 32), (64, 16, True, 64, False, True, 32),
        (64, 16, True, 128, False, True, 16), (16, 16, True, 128, False, False, 16),
    ],
}  # fmt: skip


@pytest.mark.parametrize("kernel", list(FAR_KEYS_CASES))
def test_far_keys_as_compiled_without_spills(kernel):
    """`_far_keys` per kernel (`FAR_KEYS_CASES`); the backward's dK/dV takes no wide blocks: an error naming it."""
    for *args, want in FAR_KEYS_CASES[kernel]:
        assert triton_backend._far_keys(*args, kernel) == want, args
    with pytest.raises(ValueError, match="not '_dkv_kernel'"):
        triton_backend._far_keys(64, 32, True, 64, False, False, "_dkv_kernel")


DQ_WIDE_CASES = [name for name in FORWARD_REACH_CASES if name != "packed"] + ["n150_padded"]


def _far_blocks(monkeypatch) -> dict[str, list[tuple[int, int]]]:
    """The far blocks the backend gives each kernel in the calls that follow: {kernel: [(its loop's block, FAR_N),
    ...]}, one entry per launch, from `triton_backend._far_keys` (the launch's FAR_N argument). Any device: on a
    GPU the interpreter's record of the launches (`record_run`) is not there to say it. A spy patched in is a
    new settings snapshot (`_plan_settings`): the next call is made, not replayed from a plan."""
    seen: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    real = triton_backend._far_keys

    def spy(wide, block, split, head_dim, segments, dropout, kernel="_fwd_kernel"):
        far = real(wide, block, split, head_dim, segments, dropout, kernel)
        seen[kernel].append((block, far))
        return far

    monkeypatch.setattr(triton_backend, "_far_keys", spy)
    return seen


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize(
    "name, dtype, far_keys",
    [(name, "float32", keys) for name in DQ_WIDE_CASES for keys in (32, 64)]
    + [("n150_padded", "float32", 128), ("n150_left_padded", "float32", 64), ("n150_padded", "bfloat16", 64)],
)
def test_dq_far_tiles_in_wide_blocks_match_eager(monkeypatch, name, dtype, far_keys):
    """`DQ_FAR_KEYS`: dQ's far runs in blocks of 32 or 64 keys, split as the forward's (a narrow rest before the
    far-left run's first wide block and after the far-right run's last; the far-left run's last wide block
    passing the keys' end; keys masked from the start: the programs' first visible key floored to the wide
    block), the near run in blocks of 16: output and every gradient match eager (dQ, and the position tables'
    gradients through its row sums), and dQ's launch was told the wide blocks (128 keys taken as 64:
    `_far_keys`)."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "DQ_FAR_KEYS", far_keys)
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)  # a cell left unwritten shows
    blocks = _far_blocks(monkeypatch)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(WIDE_FAR_CASES[name], getattr(torch, dtype), DEVICE, _wide_far_geometry(name))
    assert launches["_dq_kernel"][1]["FAR_N"] == min(far_keys, 64)
    assert launches["_dq_kernel"][1]["BLOCK_N"] == 16
    assert launches["_fwd_kernel"][1]["FAR_N"] == 16  # (the forward's own setting: None)
    # what the GPU tests read instead of the launches (`_far_blocks`)
    assert blocks == {"_fwd_kernel": [(16, 16)], "_dq_kernel": [(16, min(far_keys, 64))]}, blocks


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize("stores", ["cells", "aligned"])
def test_dq_far_tiles_in_wide_blocks_with_both_gradient_layouts_match_eager(monkeypatch, stores):
    """dQ's wide far blocks with its gradients stored by cell (`GRADIENT_STORES` "cells": saturated pairs of a
    near tile summed, the rows 2·sat + 1 cells) and, the default, in the tables' one band at their odd stride,
    16 bytes at a time, with the keys padded on the left (the programs' first visible keys floored to 64):
    every cell its far runs leave is zeroed or summed as with narrow blocks (the buffers poisoned with NaN),
    and the call matches eager."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "DQ_FAR_KEYS", 64)
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    monkeypatch.setattr(triton_backend, "GRADIENT_STORES", stores)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(
            WIDE_FAR_CASES["n150_left_padded"], torch.float32, DEVICE, _wide_far_geometry("n150_left_padded")
        )
    assert launches["_dq_kernel"][1]["FAR_N"] == 64
    assert launches["_dq_kernel"][1]["GRAD_BANDS"] == (stores != "cells")


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
def test_forward_and_dq_far_tiles_in_wide_blocks_together_match_eager(monkeypatch):
    """Both settings at once (the benchmark's row "triton (forward and dQ far tiles of 64 keys)"): each kernel
    takes its own, and the call matches eager."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "FORWARD_FAR_KEYS", 64)
    monkeypatch.setattr(triton_backend, "DQ_FAR_KEYS", 32)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(WIDE_FAR_CASES["n150_padded"], torch.float32, DEVICE)
    assert (launches["_fwd_kernel"][1]["FAR_N"], launches["_dq_kernel"][1]["FAR_N"]) == (64, 32)


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's loads")
def test_dq_wide_far_blocks_start_on_multiples_of_their_width(monkeypatch):
    """As the forward's (`test_forward_wide_far_blocks_start_on_multiples_of_their_width`): the K blocks of 64
    keys dQ loads start on multiples of 64 where the rows' first visible keys do not (keys masked from the
    start, 40 and 77 of 150), and dQ matches eager's."""
    from debertakit.attention.triton_access import record_run

    c = WIDE_FAR_CASES["n150_left_padded"]
    geom, (q, k, v, pos_q, pos_k) = _wide_far_geometry("n150_left_padded"), _inputs(c, torch.float32, DEVICE)
    q.requires_grad_(True)
    monkeypatch.setattr(triton_backend, "DQ_FAR_KEYS", 64)
    scale = scale_for(c.dim, 1 + sum(c.terms))
    with record_run("triton_kernels.py") as (loads, _):
        out, _ = triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=scale, terms=c.terms)
        (got,) = torch.autograd.grad(out.square().sum(), q)
    ref, _ = eager_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=scale, terms=c.terms)
    (want,) = torch.autograd.grad(ref.square().sum(), q)
    torch.testing.assert_close(got, want)
    starts = _wide_key_block_starts(loads, "_dq_kernel", k, c)
    assert starts and all(n % 64 == 0 for n in starts), sorted(set(starts))


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize("far_keys", [64, 128])
def test_dq_far_tiles_in_wide_blocks_with_dropout_match_eager(monkeypatch, far_keys):
    """dQ's wide far blocks redraw the mask the forward's narrow ones drew (a function of the pair, not of the
    tile): output and gradients equal eager's with the kernels' mask. With dropout dQ takes 32 keys
    (`_far_keys`)."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "DQ_FAR_KEYS", far_keys)
    with record_run("triton_kernels.py") as (_, launches):
        _compare_with_dropout(monkeypatch, WIDE_FAR_CASES["n150_padded"], torch.float32, DEVICE, 0.3)
    assert launches["_dq_kernel"][1]["FAR_N"] == 32 and launches["_dq_kernel"][1]["DROPOUT"]


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_loaded_positions_path_matches_index_path(packed):
    """Distance i - j geometries skip the position loads (IJ); the same positions given explicitly take the
    general path (positions loaded, far tiles found from them): both must give the same result."""
    c = Case(n=70, cu_seqlens=(0, 5, 38, 40, 66) if packed else None, causal=True)
    geom = _geometry(c, DEVICE)
    assert geom.distance_is_i_minus_j()
    qp, kp = geom.positions(c.n, c.n, DEVICE)
    general = Geometry(
        key_mask=geom.key_mask,
        q_segments=geom.q_segments,
        k_segments=None if geom.k_segments is None else geom.k_segments.clone(),
        q_positions=qp.clone(),
        k_positions=kp.clone(),
        causal=True,
        cu_seqlens=geom.cu_seqlens,
        max_seqlen=geom.max_seqlen,
    )
    assert not general.distance_is_i_minus_j()
    inputs = _inputs(c, torch.float32, DEVICE)
    out, grads = _run(triton_attention, c, inputs, geom)
    ref, ref_grads = _run(triton_attention, c, inputs, general)
    for a, b in zip((out, *grads), (ref, *ref_grads)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_repeated_explicit_positions_are_refused():
    c = Case(n=8)
    geom = Geometry(q_positions=torch.zeros(1, 8, dtype=torch.long, device=DEVICE))
    geom.k_positions = geom.q_positions
    q, k, v, pos_q, pos_k = _inputs(c, torch.float32, DEVICE)
    with pytest.raises(ValueError, match="distinct key positions|distinct query positions"):
        triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=0.1, terms=c.terms)


def _attention_with_dropout(c: Case):
    """(inputs, a function of them running `triton_attention` with dropout 0.3): what the compile tests trace."""
    geom = _geometry(c, DEVICE)

    def fn(q, k, v, pos_q, pos_k):
        out, _ = triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=0.2, terms=c.terms, dropout_p=0.3)
        return out

    return _inputs(c, torch.float32, DEVICE), fn


def test_torch_compile_with_dropout_draws_what_eager_draws():
    """Under torch.compile (aot_eager) the seed is drawn inside the graph from the same generator: the same
    torch seed gives the uncompiled call's output and gradients, and the next call draws a new mask."""
    c = GRID["packed_causal"]
    inputs, fn = _attention_with_dropout(c)
    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        torch.manual_seed(21)
        out = f(*inputs)
        results.append([out, *torch.autograd.grad(out.square().sum(), inputs)])
    plain = triton_attention(*inputs, c.rel, _geometry(c, DEVICE), scale=0.2, terms=c.terms)[0]
    assert not torch.allclose(results[1][0], plain)  # dropout was applied
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    # no reseed: the compiled call draws a new seed (it is not baked in as a constant)
    again = torch.compile(fn, backend="aot_eager", fullgraph=True)(*inputs)
    assert not torch.equal(again, results[1][0])


def test_torch_compile_inductor_with_dropout_is_seeded():
    """Inductor lowers the seed's draw with its own random numbers (not eager's), so a compiled run is
    reproducible under torch.manual_seed and redraws per call, but does not repeat an eager run's masks."""
    inputs, fn = _attention_with_dropout(GRID["packed_causal"])
    compiled = torch.compile(fn, backend="inductor", fullgraph=True)
    outs = []
    for seed in (5, 5, None):
        if seed is not None:
            torch.manual_seed(seed)
        outs.append(compiled(*inputs))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])


def test_torch_compile_custom_op_forward_and_backward():
    c = GRID["packed_causal"]
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)

    def fn(q, k, v, pos_q, pos_k):
        return triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=0.2, terms=c.terms)[0]

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    out = compiled(*inputs)
    (out * out).sum().backward()
    got = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    ref = eager_attention(*inputs, c.rel, geom, scale=0.2, terms=c.terms)[0]
    (ref * ref).sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, t in zip(got, inputs):
        torch.testing.assert_close(a, t.grad, atol=1e-5, rtol=1e-5)


def test_kernel_stand_ins_are_made_once_per_device_and_dtype_and_not_while_a_graph_is_captured(monkeypatch):
    """The one-element stand-ins for the arguments a kernel's flags keep it from reading (`_or_unused`) are
    kept per device and dtype (normal tensors, even where the first call ran under inference mode); while a
    CUDA graph is captured a new one is made and not kept (it would live in the graph's memory pool)."""
    monkeypatch.setattr(triton_backend, "_STAND_INS", {})
    given = torch.ones(2, dtype=torch.int32)
    assert triton_backend._or_unused(given, torch.device("cpu")) is given
    with torch.inference_mode():
        first = triton_backend._or_unused(None, torch.device("cpu"))
    assert not first.is_inference() and first.dtype == torch.int32 and first.numel() == 1
    assert triton_backend._or_unused(None, torch.device("cpu")) is first
    other = triton_backend._or_unused(None, torch.device("cpu"), torch.float32)
    assert other is not first and other.dtype == torch.float32
    monkeypatch.setattr(triton_backend, "_STAND_INS", {})
    monkeypatch.setattr(triton_backend, "capturing_cuda_graph", lambda: True)
    captured = triton_backend._or_unused(None, torch.device("cpu"))
    assert (
        triton_backend._or_unused(None, torch.device("cpu")) is not captured and not triton_backend._STAND_INS
    )


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_eager_calls_run_the_ops_bodies_without_their_dispatch(monkeypatch, dropout_p):
    """Outside ``torch.compile`` a call runs the custom ops' bodies under a plain autograd node, without
    dispatching the ops; the ops themselves (what a compiled graph runs) give the same output and gradients,
    bit for bit, on the same arguments (the dropout seed is one of them)."""
    c = GRID["causal_padding"]
    captured, dispatched = [], Counter()
    real = triton_backend._attention
    monkeypatch.setattr(triton_backend, "_attention", lambda *a: captured.append(a) or real(*a))
    for name in ("_fwd_op", "_bwd_op"):
        op = getattr(triton_backend, name)
        monkeypatch.setattr(
            triton_backend, name, lambda *a, _op=op, _n=name: dispatched.update([_n]) or _op(*a)
        )
    inputs = _inputs(c, torch.float32, DEVICE)
    _run(triton_attention, c, inputs, _geometry(c, DEVICE), dropout_p=dropout_p)
    assert dispatched == Counter()
    q, k, v, pos_q, pos_k = captured[0][:5]
    wrt = [t for t in (q, k, v, pos_q, pos_k) if t is not None]
    results = []
    for run in (real, triton_backend._fwd_op):
        out, _ = run(*captured[0])
        results.append((out, torch.autograd.grad(out, wrt, _grad_out(out))))
    assert dispatched == Counter(_fwd_op=1, _bwd_op=1)
    (eager_out, eager_grads), (op_out, op_grads) = results
    assert torch.equal(eager_out, op_out)
    assert all(torch.equal(a, b) for a, b in zip(eager_grads, op_grads))


def test_calls_without_gradients_build_no_autograd_node(monkeypatch):
    """Where no gradient is wanted (``torch.no_grad()``, or inputs that require none) an eager call runs the
    forward's body without `_EagerAttention`, whose node costs host time in every layer
    (`benchmarks/triton_dispatch.py`), and returns the node's output bit for bit; with grad it builds the node."""
    c = GRID["causal_padding"]
    nodes = []
    real = triton_backend._EagerAttention.apply
    monkeypatch.setattr(triton_backend._EagerAttention, "apply", lambda *a: nodes.append(1) or real(*a))
    inputs, geom = _inputs(c, torch.float32, DEVICE), _geometry(c, DEVICE)

    def call(*tensors):
        return triton_attention(*tensors, c.rel, geom, scale=0.2, terms=c.terms)[0]

    with_node = call(*inputs)
    assert nodes == [1] and with_node.requires_grad
    with torch.no_grad():
        no_grad = call(*inputs)
    detached = call(*(None if t is None else t.detach() for t in inputs))
    assert nodes == [1]  # no node for either
    for out in (no_grad, detached):
        assert not out.requires_grad and torch.equal(out, with_node.detach())


@pytest.mark.parametrize(
    "dropout_p, near_band, model_layout",
    [(0.0, "tables", False), (0.2, "tables", False), (0.0, "distance", False), (0.0, "distance", True)],
    ids=["no_dropout", "dropout", "distance", "model_layout"],
)
def test_custom_op_registration_passes_opcheck(monkeypatch, dropout_p, near_band, model_layout):
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch with dynamic shapes (with
    dropout the seed is an input, so repeated runs agree; on the distance road the cells are one too). With
    ``model_layout`` the position tables come as the model's are, (R, H, d) viewed per head: the op takes them
    so, and the fake and the real backward give their gradients the same strides."""
    monkeypatch.setattr(triton_backend, "NEAR_BAND", near_band)
    c = Case(n=20, heads=2) if model_layout else GRID["packed_causal"]  # (two heads: a view per head)
    captured = []
    real = triton_backend._attention

    def spy(*args):
        captured.append(args)
        return real(*args)

    monkeypatch.setattr(triton_backend, "_attention", spy)
    q, k, v, pos_q, pos_k = _inputs(c, torch.float32, DEVICE)
    if model_layout:
        pos_q, pos_k = _projection_layout(pos_q), _projection_layout(pos_k)
    triton_attention(
        q,
        k,
        v,
        pos_q,
        pos_k,
        c.rel,
        _geometry(c, DEVICE),
        scale=0.2,
        terms=c.terms,
        dropout_p=dropout_p,
    )
    aux = triton_backend._Aux(*captured[0][5])
    assert (aux.seed is None) == (dropout_p == 0.0)
    assert (aux.cells is None) == (near_band == "tables")  # the distance tables' cells
    assert captured[0][4].is_contiguous() != model_layout  # the tables as given (`_table_layout`)
    torch.library.opcheck(torch.ops.debertakit.disentangled_attention_fwd.default, captured[0])
    if model_layout:  # the real backward gives the tables' gradients the fake's strides, the tables' own
        op, *inputs = torch.ops.debertakit.disentangled_attention_fwd.default, *captured[0]
        out, _ = op(*inputs)
        strides = [g.stride() for g in torch.autograd.grad(out, [pos_q, pos_k], torch.ones_like(out))]
        assert strides == [t.stride() for t in (pos_q, pos_k)], strides


def test_autocast_keeps_float32_scores():
    """Under autocast the op's own matmuls (the N×R position tables) stay float32: same result as without it."""
    c = GRID["n33"]
    geom = _geometry(c, DEVICE)
    q, k, v, pos_q, pos_k = _inputs(c, torch.bfloat16, DEVICE)
    pos_q, pos_k = pos_q.float(), pos_k.float()  # what a float32 table projection outside autocast gives
    plain, _ = triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=0.2, terms=c.terms)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        auto, _ = triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=0.2, terms=c.terms)
    assert auto.dtype == torch.bfloat16
    assert torch.equal(auto, plain)


def test_registry_declines_what_it_cannot_serve():
    base = dict(device_type=DEVICE, dtype=torch.bfloat16, seq_len=128, head_dim=64)
    assert get_backend("triton", Request(**base)).name == "triton"
    assert get_backend("triton", Request(**base, dropout=True)).name == "triton"
    for extra, words in [
        (dict(needs_probs=True), "probabilities"),
        (dict(dense_mask=True), "dense"),
        (dict(head_dim=160), "head dim"),
        (dict(dtype=torch.float64), "dtype"),
    ]:
        with pytest.raises(ValueError, match=words):
            get_backend("triton", Request(**{**base, **extra}))
    # on CPU it only runs interpreted: `auto` keeps choosing another backend there
    assert get_backend("auto", Request(**{**base, "device_type": "cpu"})).name != "triton"
    assert get_backend("auto", Request(**{**base, "device_type": "cuda"})).name == "triton"
    # training with attention dropout on CUDA: the kernels draw the mask themselves
    assert get_backend("auto", Request(**{**base, "device_type": "cuda", "dropout": True})).name == "triton"


def test_registry_refuses_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        get_backend("triton", Request(device_type="cpu", dtype=torch.float32, seq_len=8, head_dim=16))


def test_model_with_triton_backend_matches_eager():
    from debertakit.config import DebertaConfig
    from debertakit.model.backbone import DebertaModel

    cfg = DebertaConfig.preset("tiny-v3", hidden_size=32, num_heads=2, num_layers=1)
    torch.manual_seed(0)
    model = DebertaModel(cfg).to(DEVICE).eval()
    ids = torch.randint(4, cfg.vocab_size, (2, 21), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
    for layer in model.encoder.layers:
        layer.attention.backend_name = "triton"
    got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------- skewed near band (forward and backward)
SKEW_GRID = [name for name, c in GRID.items() if c.q_offset is None and c.terms.any and not c.terms.p2p]
SKEW_HALF = ["n70_saturating", "packed_causal", "padding", "cross_nq_gt_nk", "d64_heads2"]


def _near_band(monkeypatch, mode: str) -> None:
    monkeypatch.setattr(triton_backend, "NEAR_BAND", mode)


def _table_widths(monkeypatch) -> list[int]:
    """The width R of the ROW / COL tables every `_tables` call builds, in call order (forward, backward)."""
    widths = []
    real = triton_backend._tables

    def spy(*args, **kwargs):
        row, col = real(*args, **kwargs)
        widths.append(triton_backend._table_rows(row, col))
        return row, col

    monkeypatch.setattr(triton_backend, "_tables", spy)
    return widths


def _compare_skewed(monkeypatch, c: Case, dtype: torch.dtype, device: str, mode: str = "skew") -> None:
    """`_compare` under ``NEAR_BAND = mode``, checking which kernels took the skewed road: a skewed forward or
    backward builds tables of the two saturated ends only (R = 2), the others the whole table."""
    _near_band(monkeypatch, mode)
    widths = _table_widths(monkeypatch)
    _compare(c, dtype, device)
    full = c.rel.table_rows
    backward_skewed = mode == "skew" and triton_backend.skew_served(c.dim, triton_backend.BACKWARD)
    assert widths == [2, 2 if backward_skewed else full], widths


@pytest.mark.parametrize("name", SKEW_GRID)
def test_skewed_kernels_match_eager_float32(monkeypatch, name):
    """Forward and backward with the near band computed from the position tables (no N×R table), against
    eager: outputs and every gradient."""
    _compare_skewed(monkeypatch, GRID[name], torch.float32, DEVICE)


@pytest.mark.parametrize("name", SKEW_HALF)
def test_skewed_kernels_match_eager_bfloat16(monkeypatch, name):
    _compare_skewed(monkeypatch, GRID[name], torch.bfloat16, DEVICE)


@pytest.mark.parametrize("name", ["n70_saturating", "packed_causal", "d128_v1_padding"])
def test_skewed_forward_with_table_backward_matches_eager(monkeypatch, name):
    """``NEAR_BAND = "skew-forward"``: the skewed forward, the backward from the tables (mixed roads: the
    backward recomputes the scores its own way against the forward's log-sum-exp)."""
    _compare_skewed(monkeypatch, GRID[name], torch.float32, DEVICE, mode="skew-forward")


@pytest.mark.parametrize("road", ["skew", "distance"])
@pytest.mark.parametrize("name", ["n70_saturating", "packed_causal"])
def test_near_band_roads_agree_with_the_tables(monkeypatch, name, road):
    """Each road computes the tables road's function, forward and gradients (they differ in the last bits, which
    shows the road was taken: the skewed kernels form the terms in registers, the distance tables are scaled
    before the kernels add them)."""
    c = GRID[name]
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)
    results = {}
    for mode in ("tables", road):
        _near_band(monkeypatch, mode)
        out, grads = _run(triton_attention, c, inputs, geom)
        results[mode] = (out, *grads)
    for name_, a, b in zip(["out", "dq", "dk", "dv", "dpos_q", "dpos_k"], results[road], results["tables"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, n=name_: f"{n}: {m}")
    assert not torch.equal(results[road][0], results["tables"][0])
    assert not torch.equal(results[road][1], results["tables"][1])  # dq: the backward's scores differ too


def test_skewed_kernels_only_where_they_apply(monkeypatch):
    q, table = torch.zeros(1, 1, 4, 16), torch.zeros(1, 8, 16)
    uses = triton_backend._uses_skew
    fwd, bwd = triton_backend.FORWARD, triton_backend.BACKWARD
    _near_band(monkeypatch, "skew")
    assert uses(q, table, table, True, False, False, fwd)
    assert uses(q, table, table, True, False, False, bwd)
    assert uses(q, None, table, True, False, False)  # c2p only (the forward by default)
    assert not uses(q, table, table, False, False, False)  # explicit positions
    assert not uses(q, table, table, True, True, False)  # p2p
    assert uses(q, table, table, True, False, True, fwd)  # dropout (`SKEW_DROPOUT_TILES`)
    assert uses(q, table, table, True, False, True, bwd)
    assert not uses(q.bfloat16(), table, table, True, False, False)  # float32 tables under bfloat16 inputs
    assert not uses(q, None, None, True, False, False)  # no position terms
    wide, wide_table = torch.zeros(1, 1, 4, 128), torch.zeros(1, 8, 128)
    assert uses(wide, wide_table, wide_table, True, False, False, fwd)  # head dim 128 too (`SKEW_TILES`)
    assert not uses(wide, wide_table, wide_table, True, False, False, bwd)  # no backward tiles there
    assert uses(wide, wide_table, wide_table, True, False, True, fwd)  # the forward with dropout too
    monkeypatch.setitem(triton_backend.SKEW_TILES, 128, dict(triton_backend.SKEW_TILES[64]))
    assert uses(
        wide, wide_table, wide_table, True, False, False, bwd
    )  # given tiles for both backward kernels
    monkeypatch.delitem(triton_backend.SKEW_TILES[128], "_dkv_kernel")  # no dK/dV tile: the forward only
    assert uses(wide, wide_table, wide_table, True, False, False, fwd)
    assert not uses(wide, wide_table, wide_table, True, False, False, bwd)
    # the tables with dropout are separate: a dK/dV tile there serves the backward with dropout
    monkeypatch.setitem(triton_backend.SKEW_DROPOUT_TILES, 128, dict(triton_backend.SKEW_DROPOUT_TILES[64]))
    assert uses(wide, wide_table, wide_table, True, False, True, bwd)
    # no skewed forward tile with dropout: that forward takes the tables road, the one without dropout does not
    monkeypatch.delitem(triton_backend.SKEW_DROPOUT_TILES[64], "_fwd_kernel")
    assert not uses(q, table, table, True, False, True, fwd)
    assert uses(q, table, table, True, False, True, bwd)
    assert uses(q, table, table, True, False, False, fwd)
    _near_band(monkeypatch, "skew-forward")
    assert uses(q, table, table, True, False, False, fwd)
    assert not uses(q, table, table, True, False, False, bwd)
    _near_band(monkeypatch, "tables")
    assert not uses(q, table, table, True, False, False, fwd)
    _near_band(monkeypatch, "skewed")
    with pytest.raises(ValueError, match="NEAR_BAND must be one of .*got 'skewed'"):
        uses(q, table, table, True, False, False)


# ------------------------------------------------------------------ distance tables (NEAR_BAND = "distance")
DIST_GRID = SKEW_GRID  # where the road applies: distance i - j, position terms, no p2p


def _distance_reaches(monkeypatch) -> list[int]:
    """The reach (R / 2) of every `_distance_tables` call, in call order (forward, backward)."""
    reaches = []
    real = triton_backend._distance_tables

    def spy(*args):
        reaches.append(args[4].shape[2] // 2)  # the cells: 2·reach + 1 per row (one band)
        return real(*args)

    monkeypatch.setattr(triton_backend, "_distance_tables", spy)
    return reaches


def _on_road(monkeypatch, road: str):
    """Selects ``NEAR_BAND = road`` ("skew" or "distance") and returns a check that the call's forward and
    backward both took it: the skewed kernels build tables of the two saturated ends only (R = 2), the distance
    road builds its tables once per direction, at one reach."""
    _near_band(monkeypatch, road)
    if road == "skew":
        widths = _table_widths(monkeypatch)

        def check():
            assert widths == [2, 2], widths

    else:
        reaches = _distance_reaches(monkeypatch)

        def check():
            assert len(reaches) == 2 and reaches[0] == reaches[1], reaches

    return check


def _took(road: str, reaches: list[int]) -> None:
    """The call took ``road``: distance tables built once per direction at one reach, or none (tables)."""
    if road == "distance":
        assert len(reaches) == 2 and reaches[0] == reaches[1], reaches  # one reach for both directions
    else:
        assert reaches == [], reaches


# The two roads of the cases where the distance road applies: the distance road (the default since 2026-11-26,
# which the grid's tests above take there too) and the tables road (the default before; the grid's tests took it)
ROADS_AT_I_MINUS_J = ["distance", "tables"]


@pytest.mark.parametrize("road", ROADS_AT_I_MINUS_J)
@pytest.mark.parametrize("name", DIST_GRID)
def test_near_band_roads_match_eager_float32(monkeypatch, name, road):
    """Forward and backward reading the near band from distance tables (two strided tile loads per near tile,
    no gather) or gathering it from the tables, against eager: outputs and every gradient; both directions
    took that road."""
    _near_band(monkeypatch, road)
    reaches = _distance_reaches(monkeypatch)
    _compare(GRID[name], torch.float32, DEVICE)
    _took(road, reaches)


@pytest.mark.parametrize("road", ROADS_AT_I_MINUS_J)
@pytest.mark.parametrize(
    "name", ["n70_saturating", "packed_causal", "padding", "cross_nq_gt_nk", "d64_heads2"]
)
def test_near_band_roads_match_eager_bfloat16(monkeypatch, name, road):
    """bfloat16: the distance tables hold the position terms rounded to bfloat16 (as 16-bit eager
    implementations round them), within the grid's tolerance of eager's float32 terms."""
    _near_band(monkeypatch, road)
    reaches = _distance_reaches(monkeypatch)
    _compare(GRID[name], torch.bfloat16, DEVICE)
    _took(road, reaches)


@pytest.mark.parametrize("road", ROADS_AT_I_MINUS_J)
def test_near_band_roads_match_eager_float16(monkeypatch, road):
    _near_band(monkeypatch, road)
    _compare(GRID["packed"], torch.float16, DEVICE)


def test_bfloat16_distance_tables_are_as_close_to_float32_as_the_gathered_tables(monkeypatch):
    """Rounding the tables to bfloat16 costs little against float32 eager: N = 96 with log buckets saturating
    at 16 (near and far tiles), head dim 64, padded rows; output and every gradient within 1.5% of the tensor's
    largest value, and not more than 1.5 times the tables road's errors, from float32 tables (measured: 0.25% to
    0.44% against 0.23% to 0.59%)."""
    c = Case(n=96, batch=2, dim=64, key_lengths=(96, 41))
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.bfloat16, DEVICE)
    ref = _run(eager_attention, c, _float32_copies(inputs), geom)
    errors = {}
    for mode in ("tables", "distance"):
        _near_band(monkeypatch, mode)
        out, grads = _run(triton_attention, c, inputs, geom, grad_out=_grad_out(ref[0]))
        errors[mode] = [
            (a.float() - b).abs().max().item() / b.abs().max().item()
            for a, b in zip((out, *grads), (ref[0], *ref[1]))
        ]
    assert max(errors["distance"]) < 1.5e-2, errors
    for got, gathered in zip(errors["distance"], errors["tables"]):
        assert got <= 1.5 * gathered + 1e-3, errors


def test_distance_tables_hold_each_pairs_terms_by_distance():
    """`_distance_tables`: pair (i, j)'s c2p sits in ROW's row i at cell reach + (j - i), its p2c in COL's row j
    at cell reach + (i - j), each eager's term (scale included) times log2(e), for every pair within the reach
    (saturated ones too); the rows past N of each batch row's padded block are zeros."""
    from debertakit.attention.eager import score_components

    c = Case(n=70, batch=2, heads=2, dim=16)
    B, H, N = c.batch, c.heads, c.n
    q, k, _, pos_q, pos_k = (t.detach() for t in _inputs(c, torch.float32, DEVICE))
    scale = 0.3
    parts = score_components(q, k, pos_q, pos_k, c.rel, Geometry(), scale=scale, terms=c.terms)
    sat = c.rel.saturation
    lo, hi, lut = triton_backend._lut(c.rel, sat, pos_k.shape[1], DEVICE)
    reach = triton_backend._distance_reach(sat, N, N, 32)
    assert reach % triton_backend.DIST_ALIGN == 0 and sat + 32 <= reach < N
    cells = triton_backend._distance_cells(lut, sat, 0, 1, 2 * reach + 1)
    row, col = triton_backend._distance_tables(
        triton_backend._per_head(q), triton_backend._per_head(k), pos_q[:, lo:hi], pos_k[:, lo:hi], cells,
        scale * triton_backend.LOG2E, (B, N, N),
    )  # fmt: skip
    padded = triton_backend._padded_rows(N)
    assert padded == 80  # 70 rows padded to a multiple of 16, then zeros past the last (b, h)
    slack = triton_backend._distance_slack(2 * reach + 1, N, N)
    assert row.numel() == H * B * padded * (2 * reach + 1) + slack and bool((row[-slack:] == 0).all())
    row, col = (triton_backend._distance_rows(t, H, B, N, 2 * reach + 1) for t in (row, col))
    i, j = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
    near = (j - i).abs() <= reach
    i, j = i[near], j[near]
    for b in range(B):
        for h in range(H):
            c2p, p2c = (parts[t][b, h][i, j] * triton_backend.LOG2E for t in ("c2p", "p2c"))
            torch.testing.assert_close(row[h, b, i, reach + j - i], c2p, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(col[h, b, j, reach + i - j], p2c, atol=1e-5, rtol=1e-5)
    assert not (near.all()) and bool((row[:, :, N:] == 0).all()) and bool((col[:, :, N:] == 0).all())


def test_distance_reach_covers_every_near_tile():
    """`_distance_reach` against the tiles the kernels' near runs visit: those not far on either side (exactly
    `_split`'s middle run, `test_split_cuts_the_loop_exactly_where_tiles_saturate`). Every pair of the sequences
    in a near tile lies within the reach, in its own table row; the pairs past the end read elsewhere, and every
    cell any tile reads, ROW's at i·R + j and COL's at j·R + i from the last (b, h)'s row 0, lies inside the
    table and the zeros after it (`_distance_slack`)."""
    shapes = [
        (16, 70, 70, 16, 16),
        (16, 200, 200, 64, 32),
        (512, 2048, 2048, 64, 64),
        (512, 300, 300, 128, 64),
    ]
    shapes += [
        (16, 20, 45, 16, 16),
        (512, 16, 4096, 128, 128),
        (512, 4000, 33, 64, 128),
        (64, 1, 1, 128, 128),
    ]
    for sat, nq, nk, bm, bn in shapes:
        reach = triton_backend._distance_reach(sat, nq, nk, bm + bn)
        assert reach % triton_backend.DIST_ALIGN == 0
        rows_q, rows_k = -(-nq // bm) * bm, -(-nk // bn) * bn  # the tiles' extents
        for own in range(0, rows_q, bm):  # query blocks; the key-block programs visit the same tiles
            for start in range(0, rows_k, bn):
                if any(_far_sides(own, bm, start, bn, sat)):
                    continue  # far
                widest = max(min(own + bm, nq) - 1 - start, min(start + bn, nk) - 1 - own)
                assert widest <= reach, (sat, nq, nk, bm, bn, own, start, reach)
        R, cells = 2 * reach, 2 * reach + 1
        for n_own, rows_own, rows_other in ((nq, rows_q, rows_k), (nk, rows_k, rows_q)):
            size = 3 * triton_backend._padded_rows(n_own) * cells + triton_backend._distance_slack(
                cells, nq, nk
            )
            last = 2 * triton_backend._padded_rows(n_own) * (R + 1)  # the last of 3 (b, h)s
            assert reach + last + (rows_own - 1) * R + rows_other - 1 < size, (sat, nq, nk, bm, bn)


# inputs shorter than the saturation (WIDE: 64), where no tile is far: the distance tables come in bands
BANDED_GRID = {
    "wide_n64": Case(n=64, rel=WIDE),
    "wide_padding": Case(n=50, batch=3, heads=2, rel=WIDE, key_lengths=(50, 23, 0)),
    "wide_packed_causal": Case(n=60, rel=WIDE, cu_seqlens=(0, 17, 50, 60), causal=True),
    "wide_c2p_only": Case(n=45, rel=WIDE, terms=PositionTerms(c2p=True, p2c=False)),
    "wide_p2c_only": Case(n=45, rel=WIDE, terms=PositionTerms(c2p=False, p2c=True)),
    "wide_d64_heads2": Case(n=40, heads=2, dim=64, rel=WIDE),
    "wide_d128_causal": Case(n=34, dim=128, rel=WIDE, causal=True),
    # a packed row longer than the saturation (8) of sequences shorter than it: no visible pair is far, hidden
    # ones are; in the bands' gradient buffers their cells lie inside the rows and must hold zeros
    "clamp_packed_past_saturation": Case(n=48, rel=CLAMP, cu_seqlens=(0, 8, 15, 23, 30, 38, 46, 48)),
}


# the kernels' tiles per band: 16-row bands at the interpreter's 16×16 tiles; 32-row bands where one kernel's
# tile has a side of 32, the others' tiles two to a band
BAND_TILES = {
    16: {},
    32: {"_fwd_kernel": triton_backend.Tiles(16, 32, 1, 1), "_dq_kernel": triton_backend.Tiles(32, 16, 1, 1)},
}


def _distance_bands(monkeypatch, band: int) -> list[int]:
    """Sets the tiles of `BAND_TILES` [band] and returns the band of every `_distance_tables` call, in call
    order."""
    tiles = BAND_TILES[band]
    monkeypatch.setattr(triton_backend, "TILE_OVERRIDES", dict(tiles))
    bands = []
    real = triton_backend._distance_tables

    def spy(*args):
        bands.append(args[7])
        return real(*args)

    monkeypatch.setattr(triton_backend, "_distance_tables", spy)
    return bands


@pytest.mark.parametrize("band", [16, 32])
@pytest.mark.parametrize("name", BANDED_GRID)
def test_banded_distance_tables_match_eager_float32(monkeypatch, name, band):
    """The distance tables in bands of 16 and 32 rows (one or two of the interpreter's 16-row tiles per band),
    each band holding only the distances its rows reach: forward and backward against eager, outputs and every
    gradient; both directions read the layout `_distance_layout` chose, bands in every case at 16 rows."""
    c = BANDED_GRID[name]
    _near_band(monkeypatch, "distance")
    bands = _distance_bands(monkeypatch, band)
    _compare(c, torch.float32, DEVICE)
    tiles = [
        triton_backend.tiles_for(torch.device(DEVICE), c.dim, name) for name in triton_backend.KERNEL_NAMES
    ]
    chosen = triton_backend._distance_layout(c.rel.saturation, c.n, c.n, tiles, False, c.dim, c.batch)[0]
    assert bands == [chosen] * 2 and (chosen == band or band > 16), bands


@pytest.mark.parametrize("name", ["wide_padding", "wide_packed_causal", "wide_d64_heads2"])
def test_banded_distance_tables_match_eager_bfloat16(monkeypatch, name):
    _near_band(monkeypatch, "distance")
    bands = _distance_bands(monkeypatch, 16)
    _compare(BANDED_GRID[name], torch.bfloat16, DEVICE)
    assert bands == [16, 16], bands


# whether the case's gradient buffers come in bands: the sequences' reach (its saturation as cut to the
# longest sequence, `_lut`) against the band's rows
GRADIENT_BANDS = {
    "wide_n64": True,
    "wide_padding": True,
    "wide_packed_causal": False,
    "clamp_packed_past_saturation": False,
}


# every case with the default stores; the banded ones also by cell (with one band the mode changes nothing)
GRADIENT_CASES = [(name, "aligned") for name in GRADIENT_BANDS] + [
    (name, "cells") for name, banded in GRADIENT_BANDS.items() if banded
]


@pytest.mark.parametrize(("name", "stores"), GRADIENT_CASES)
def test_banded_tables_take_their_gradients_in_bands(monkeypatch, name, stores):
    """Where the distance tables are in bands the backward's distance-space gradients are too, if that makes
    their rows narrower than one band's 2·sat + 1 cells: each buffer (H, bands, B, band, DW) in its table's
    layout, DW the band's cells themselves, 1 modulo 16 (`GRADIENT_STORES` "aligned"; at v3's N = 512, 577
    against 1040), or rounded up to `DIST_ALIGN` ("cells", 592), folded per band through the tables' own cells;
    no cell of a row left unwritten (the buffers start as NaN in the tests) and the gradients eager's. Rows of
    a packed row whose sequences are short stay in one band: at a saturation of 8 (CLAMP) 32 cells against the
    bands' 80; at WIDE's cut to the longest sequence (33), 80 against 96."""
    c = BANDED_GRID[name]
    _near_band(monkeypatch, "distance")
    monkeypatch.setattr(triton_backend, "GRADIENT_STORES", stores)
    bands = _distance_bands(monkeypatch, 16)
    buffers, folds, strides = [], [], []
    real_buffer, real_fold = triton_backend._distance_buffer, triton_backend._fold_bands
    real_stride = triton_backend._gradient_stride

    def buffer(heads, rows, stride, *args):
        buffers.append((heads, rows, stride))
        return real_buffer(heads, rows, stride, *args)

    def fold(side, *args):
        folds.append(tuple(side.cells.shape))
        return real_fold(side, *args)

    def stride(sat, band, cells, farthest):
        strides.append((sat, band, cells.shape[2]))
        return real_stride(sat, band, cells, farthest)

    monkeypatch.setattr(triton_backend, "_distance_buffer", buffer)
    monkeypatch.setattr(triton_backend, "_fold_bands", fold)
    monkeypatch.setattr(triton_backend, "_gradient_stride", stride)
    _compare(c, torch.float32, DEVICE)
    band = bands[0]
    padded = triton_backend.triton_cdiv(c.n, band) * band
    [(sat, told, cells)] = strides
    assert band == told == 16 and cells == padded + band + 1 and cells % 16 == 1
    banded, one = triton_backend._aligned(cells), triton_backend._distance_stride(sat)
    assert (banded < one) == GRADIENT_BANDS[name]
    if GRADIENT_BANDS[name]:
        assert buffers == [(c.heads, c.batch * padded, cells if stores == "aligned" else banded)] * 2
        assert folds == [(padded // band, cells)] * 2
    else:
        assert buffers == [(c.heads, c.batch * c.n, one)] * 2 and folds == []


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize(
    ("name", "stores"), [("wide_n64", "aligned"), ("wide_n64", "cells"), ("wide_packed_causal", "aligned")]
)
def test_backward_kernels_are_told_the_gradient_layout(monkeypatch, name, stores):
    """The backward kernels' ``GRAD_BANDS``: true only for gradients in bands at an odd row stride
    (`GRADIENT_STORES` "aligned"), where they store a row's cells at ``i·(DW - 1) + OFF + j`` under the row mask
    alone; their gradient buffers' pointers 16-byte aligned (what lets the compiler store 16 bytes at a time)."""
    from debertakit.attention.triton_access import record_run

    _near_band(monkeypatch, "distance")
    monkeypatch.setattr(triton_backend, "GRADIENT_STORES", stores)
    _distance_bands(monkeypatch, 16)
    c = BANDED_GRID[name]
    with record_run("triton_kernels.py") as (_, launches):
        _compare(c, torch.float32, DEVICE)
    told = {kernel: launches[kernel][1]["GRAD_BANDS"] for kernel in triton_backend.BACKWARD}
    assert told == dict.fromkeys(triton_backend.BACKWARD, GRADIENT_BANDS[name] and stores == "aligned")
    # the gradient buffers' pointers ("D": divisible by 16 bytes)
    assert launches["_dq_kernel"][0][21] == launches["_dkv_kernel"][0][21] == ("tensor", "*fp32", "D")


def test_gradients_in_one_band_when_asked(monkeypatch):
    """`GRADIENT_BANDS` off (the benchmark's row "triton (gradients in one band)"): banded tables, gradient
    buffers of one band's rows at 2·sat + 1 cells rounded up, the gradients eager's all the same."""
    c = BANDED_GRID["wide_padding"]
    _near_band(monkeypatch, "distance")
    bands = _distance_bands(monkeypatch, 16)
    monkeypatch.setattr(triton_backend, "GRADIENT_BANDS", False)
    strides = []
    real = triton_backend._distance_buffer

    def buffer(heads, rows, stride, *args):
        strides.append(stride)
        return real(heads, rows, stride, *args)

    monkeypatch.setattr(triton_backend, "_distance_buffer", buffer)
    _compare(c, torch.float32, DEVICE)
    assert bands == [16, 16] and len(strides) == 2
    assert (
        strides[0] == strides[1] > triton_backend._aligned(64 + 16 + 1)
    )  # one band's: wider than the bands'


def test_v3_gradient_rows_in_bands_at_512():
    """At v3's N = 512 with the GPU's tiles (64-row bands) a banded gradient row is 577 cells (592 rounded up,
    `GRADIENT_STORES` "cells") against 1040."""
    tiles = [triton_backend.Tiles(64, 32, 4, 2)] * 3
    band, bands, cells = triton_backend._distance_layout(512, 512, 512, tiles, False, 64, 32)
    assert (band, bands, cells) == (64, 8, 577)
    assert triton_backend._aligned(cells) == 592 and triton_backend._distance_stride(512) == 1040
    assert triton_backend._gradient_stride(512, band, torch.empty(2, bands, cells), 511) == 577


@pytest.mark.parametrize("dw", [33, 49, 577])
def test_residue_folds_match_the_folds_at_an_aligned_stride(dw):
    """`_residue_folds` (a buffer at an odd row stride, read as 8 classes of rows, each view starting s cells
    before its rows) against the folds of the same cells read directly: the product with the table rows and
    the per-cell sums with the content rows. Every cell the views read outside a row holds a random value,
    as the rows beside it may: they must meet zeros. No view reads past the buffer (`as_strided` would refuse
    one): the buffer needs no zeros after it."""
    g, m, d = 3, 64, 8
    width = dw - 16 if dw > 33 else dw  # rows with padding cells, and rows without
    gen = torch.Generator().manual_seed(dw)
    dist = torch.randn(g * m * dw, generator=gen).view(g, m, dw)
    rows = torch.randn(g, width, d, generator=gen)
    content = torch.randn(g, m, d, generator=gen)
    product, per_cell = triton_backend._residue_folds(dist, rows, content, width)
    cells = dist[..., :width].double()
    torch.testing.assert_close(product.double(), cells @ rows.double(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        per_cell.double(), cells.transpose(1, 2) @ content.double(), rtol=1e-5, atol=1e-4
    )
    view = triton_backend._residue_rows(dist, width, 3)  # rows 3, 11, ... from 3 cells before their first
    assert view.shape == (g, m // 8, width + 7) and view.storage_offset() % 16 == 0
    assert torch.equal(view[:, :, 3 : 3 + width], dist[:, 3::8, :width])


def test_banded_distance_tables_with_dropout(monkeypatch):
    _near_band(monkeypatch, "distance")
    bands = _distance_bands(monkeypatch, 16)
    _compare_with_dropout(monkeypatch, BANDED_GRID["wide_padding"], torch.float32, DEVICE, 0.3)
    assert bands == [16, 16], bands


def test_distance_tables_in_one_band_where_tiles_are_far_or_sides_differ(monkeypatch):
    """Bands only where no tile is far and queries and keys are one length: a saturating input and a cross
    call keep one band (and still match eager)."""
    _near_band(monkeypatch, "distance")
    bands = _distance_bands(monkeypatch, 16)
    for name in ("n70_saturating", "cross_nq_lt_nk"):
        _compare(GRID[name], torch.float32, DEVICE)
    assert bands == [0] * 4, bands


def test_distance_layout_bands_only_where_the_tables_shrink():
    """`_distance_layout`: bands of the longest tile side's rows. At v3's saturation (512) and N = 512, 64-row
    bands (the head-dim-64 GPU tiles) make rows of 577 cells against 1025, 128-row bands 641; none where a tile
    may be far, where the sides differ, where fewer than two bands would fill the rows, or where the banded
    table and the copy of q / k into band order would move more than one band (batch 1 copies nothing)."""

    def layout(sat, nq, nk, tiles, far, head_dim=64, batch=2):
        return triton_backend._distance_layout(sat, nq, nk, tiles, far, head_dim, batch)

    small = [triton_backend.Tiles(64, 32, 4, 2)] * 3  # span 96, band 64
    large = [triton_backend.Tiles(128, 64, 8, 2), triton_backend.Tiles(32, 128, 8, 2)]  # span 192, band 128
    assert layout(512, 512, 512, small, False) == (64, 8, 577)
    assert layout(512, 512, 512, large, False) == (128, 4, 641)
    assert layout(512, 512, 512, large, True) == (0, 1, 1025)  # far tiles: one band
    assert layout(512, 512, 256, small, False)[0] == 0  # cross
    assert layout(512, 129, 129, large, False)[0] == 0  # 256 rows padded for 129, one of 144: larger
    assert layout(512, 100, 100, large, False) == (
        0,
        1,
        2 * 112 + 1,
    )  # one band of 128 rows would be one band
    assert layout(512, 200, 200, small, False) == (0, 1, 417)  # 256 rows of 321 + 128 against 208 of 417
    assert layout(512, 200, 200, small, False, batch=1) == (64, 4, 321)  # no copy
    assert layout(512, 128, 128, small, False)[0] == 0  # 128 rows of 193 + 128 against 257
    assert layout(512, 256, 256, small, False) == (64, 4, 321)  # 256 rows of 321 + 128 against 513
    band, bands, cells = layout(512, 1000, 1000, large, False)
    assert (band, bands, cells) == (128, 8, 1024 + 128 + 1)
    assert 1024 * cells < triton_backend._padded_rows(1000) * layout(512, 1000, 1000, large, True)[2]


# Random cases: the named grids above hold the shapes we thought of; these are drawn. Each seed gives one case
# (`_random_case`): a length from both sides of the interpreter's tile edges (1 … 97), batch, heads, head dim
# (8 is zero-padded to 16), a position table (log buckets and clamped, saturating at 3 … 16 or not at all), the
# position terms, a geometry (padding with any key length, 0 included; packing, with or without padding after
# the last sequence; queries and keys of different lengths; explicit positions), causal or not, a near-band road,
# and under the interpreter tiles of 16 or 32 rows and columns for any of the three kernels. Seeded: every run
# draws the same cases. On a GPU the configured tiles.
RANDOM_TABLES = (
    BUCKETS,
    CLAMP,
    WIDE,
    RelativeIndex(span=4, bucket_size=4, max_position=8),
    RelativeIndex(span=3),
)
RANDOM_TERMS = (
    PositionTerms(),
    PositionTerms(c2p=True, p2c=False),
    PositionTerms(c2p=False, p2c=True),
    PositionTerms(c2p=True, p2c=True, p2p=True),
)
RANDOM_LENGTHS = (1, 2, 5, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 80, 97)
RANDOM_DIMS = (8, 16, 32, 64)
RANDOM_CASES = 24  # in the default run (about half a minute in the interpreter)
RANDOM_SLOW_CASES = 400  # `pytest -m slow`
# with dropout 0.3: in the default run, and with `pytest -m slow`
RANDOM_DROPOUT_CASES = 8
RANDOM_SLOW_DROPOUT_CASES = 150


def _random_case(
    seed: int, lengths: tuple[int, ...] = RANDOM_LENGTHS, dims: tuple[int, ...] = RANDOM_DIMS
) -> tuple[Case, str, dict[str, Tiles]]:
    """Case ``seed`` of the random grid: the case, its near-band road and the tiles it overrides; its length
    one of ``lengths``, its head dim one of ``dims``."""
    rng = random.Random(seed)
    n = rng.choice(lengths)
    batch = rng.choice([1, 1, 2, 3])
    kw = dict(n=n, batch=batch, heads=rng.choice([1, 2]), dim=rng.choice(dims))
    kw.update(rel=rng.choice(RANDOM_TABLES), terms=rng.choice(RANDOM_TERMS), causal=rng.random() < 0.3)
    kind = rng.choice(["plain", "padding", "padding", "packed", "cross", "explicit"])
    if kind == "padding":
        kw["key_lengths"] = tuple(rng.randint(0, n) for _ in range(batch))
    elif kind == "packed":
        cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, 4)))) if n > 1 else []
        end = n if rng.random() < 0.6 else rng.randint(max(cuts[-1], 1) if cuts else 1, n)
        kw.update(cu_seqlens=(0, *(c for c in cuts if c < end), end), batch=1)
    elif kind == "cross":
        kw["n_k"] = rng.choice([1, 7, 16, 20, 33, 50, 70])
        if rng.random() < 0.5:
            kw["key_lengths"] = tuple(rng.randint(0, kw["n_k"]) for _ in range(batch))
    elif kind == "explicit":
        kw.update(n_k=rng.choice([7, 20, 45]), q_offset=rng.randint(0, 30))
    road = rng.choice(triton_backend.NEAR_BAND_MODES)
    sides = (16, 32)
    tiles = {
        name: Tiles(rng.choice(sides), rng.choice(sides), 1, 1)
        for name in triton_backend.KERNEL_NAMES
        if rng.random() < 0.5
    }
    return Case(**kw), road, tiles if DEVICE == "cpu" else {}


def _compare_random(
    monkeypatch,
    seed: int,
    dropout: float = 0.0,
    settings: bool = False,
    lengths: tuple[int, ...] = RANDOM_LENGTHS,
) -> None:
    """Case ``seed`` of the random grid (of one of ``lengths``) against `eager` in float32 (with ``dropout``,
    eager's probabilities times the kernels' mask), or with ``settings`` under settings ``seed``
    (`_compare_under_random_settings`; head dims up to 128, `RANDOM_SETTINGS_DIMS`)."""
    c, road, tiles = _random_case(seed, lengths, RANDOM_SETTINGS_DIMS if settings else RANDOM_DIMS)
    _near_band(monkeypatch, road)
    monkeypatch.setattr(triton_backend, "TILE_OVERRIDES", tiles)
    if settings:
        _compare_under_random_settings(monkeypatch, seed, c, DEVICE)
    elif dropout:
        _compare_with_dropout(monkeypatch, c, torch.float32, DEVICE, dropout, check_rate=False)
    else:
        _compare(c, torch.float32, DEVICE)


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
def test_random_cases_match_eager_float32(monkeypatch, seed):
    _compare_random(monkeypatch, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(RANDOM_CASES, RANDOM_SLOW_CASES))
def test_random_cases_match_eager_float32_slow(monkeypatch, seed):
    _compare_random(monkeypatch, seed)


@pytest.mark.parametrize("seed", range(RANDOM_DROPOUT_CASES))
def test_random_cases_with_dropout_match_eager_float32(monkeypatch, seed):
    """The random cases with dropout 0.3: eager's probabilities times the kernels' mask."""
    _compare_random(monkeypatch, seed, dropout=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(RANDOM_DROPOUT_CASES, RANDOM_SLOW_DROPOUT_CASES))
def test_random_cases_with_dropout_match_eager_float32_slow(monkeypatch, seed):
    _compare_random(monkeypatch, seed, dropout=0.3)


# Random settings: beside each random case, one value of each of the backend's settings below, drawn per seed
# (`_random_settings`): the opt-in ones that the GPU suite times against the defaults and a lease may make the
# defaults (the forward's and dQ's wide far blocks, the forward's tables cut to the saturation, the folds' sums by
# cell), and the alternatives kept for timing (the tables' and folds' launches and kernels, the gradients'
# stores and bands, the tables kept for the backward, one near run or three). A setting is built and tested over
# the named cases it was made for; drawn here it also meets the shapes no one thought of, in every dtype (several
# take effect in 16 bits only: the tables' product kernel, the folds' kernels), with dropout or without. The
# distance buffers are poisoned (`POISON_DISTANCE_BUFFERS`): a cell the kernels should write and miss is NaN in a
# gradient. PyTorch's deterministic algorithms are drawn too (`_into_rows`' fixed order). In 16 bits the
# gradients taken from dS are compared at the call's scale (`_assert_close`).
RANDOM_SETTINGS = {
    "FORWARD_FAR_KEYS": (None, 32, 64, 128),
    "DQ_FAR_KEYS": (None, 32, 64),
    "FORWARD_REACH": triton_backend.FORWARD_REACH_MODES,
    "FOLD_SUMS_REDUCTION": triton_backend.FOLD_SUMS_REDUCTION_MODES,
    "KEEP_TABLES": (False, True),
    "ONE_NEAR_RUN": (True, False),
    "DISTANCE_PRODUCT": triton_backend.DISTANCE_PRODUCT_MODES,
    "PRODUCT_LAUNCHES": triton_backend.PRODUCT_LAUNCHES_MODES,
    "PRODUCT_PROGRAMS": triton_backend.PRODUCT_PROGRAMS_MODES,
    "PRODUCT_EDGES": triton_backend.PRODUCT_EDGES_MODES,
    "PRODUCT_STORES": triton_backend.PRODUCT_STORES_MODES,
    "GRADIENT_BANDS": (True, False),
    "GRADIENT_STORES": triton_backend.GRADIENT_STORES_MODES,
    "FOLD_LAUNCHES": triton_backend.FOLD_LAUNCHES_MODES,
    "FOLD_PRODUCT": triton_backend.FOLD_PRODUCT_MODES,
    "FOLD_SUMS": triton_backend.FOLD_SUMS_MODES,
}
RANDOM_SETTINGS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# and head dims up to 128, where the wide far blocks narrow (`triton_backend._far_keys`) and float32 folds take
# the matmuls (`_fold_kernels_serve`)
RANDOM_SETTINGS_DIMS = (8, 16, 32, 64, 128)
RANDOM_SETTINGS_CASES = 16  # in the default run
RANDOM_SLOW_SETTINGS_CASES = 300  # `pytest -m slow`


def _random_settings(seed: int) -> tuple[dict, torch.dtype, bool, float]:
    """Settings ``seed`` of the random grid: a value of each of `RANDOM_SETTINGS`, the inputs' dtype, whether
    PyTorch's deterministic algorithms are on, and the dropout (0 or 0.3). Drawn apart from `_random_case` (a
    stream of its own), so that the random cases stay those they were."""
    rng = random.Random(f"settings {seed}")
    settings = {name: rng.choice(values) for name, values in RANDOM_SETTINGS.items()}
    return settings, rng.choice(RANDOM_SETTINGS_DTYPES), rng.random() < 0.25, 0.3 * (rng.random() < 0.25)


@pytest.mark.parametrize("seed", range(RANDOM_SETTINGS_CASES))
def test_random_cases_under_random_settings_match_eager(monkeypatch, seed):
    _compare_random(monkeypatch, seed, settings=True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(RANDOM_SETTINGS_CASES, RANDOM_SLOW_SETTINGS_CASES))
def test_random_cases_under_random_settings_match_eager_slow(monkeypatch, seed):
    _compare_random(monkeypatch, seed, settings=True)


# The random grid's lengths stop at 97, where a far run of the random tables (saturating at 3 to 16) holds at
# most one block of 64 keys and none of 128: these lengths give the wide far blocks whole runs of them, and the
# distance tables rows of more cells than a fold-sums program owns (56). Seeds of their own, so that their
# settings are other draws than the short cases'.
RANDOM_LONG_LENGTHS = (129, 150, 200, 257, 320)
RANDOM_LONG_SEEDS = range(10_000, 10_002)  # in the default run (about 10 s in the interpreter)
RANDOM_SLOW_LONG_SEEDS = range(10_002, 10_040)  # `pytest -m slow`


@pytest.mark.parametrize("seed", RANDOM_LONG_SEEDS)
def test_long_random_cases_under_random_settings_match_eager(monkeypatch, seed):
    _compare_random(monkeypatch, seed, settings=True, lengths=RANDOM_LONG_LENGTHS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", RANDOM_SLOW_LONG_SEEDS)
def test_long_random_cases_under_random_settings_match_eager_slow(monkeypatch, seed):
    _compare_random(monkeypatch, seed, settings=True, lengths=RANDOM_LONG_LENGTHS)


def _compare_under_random_settings(monkeypatch, seed: int, c: Case, device: str) -> None:
    """Case ``c`` under settings ``seed`` (`_random_settings`: the settings, the dtype, the deterministic
    algorithms, the dropout) against `eager` (with dropout, eager's probabilities times the kernels' mask), the
    distance buffers poisoned, in 16 bits at the call's scale (`_assert_close`)."""
    values, dtype, deterministic, dropout = _random_settings(seed)
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    for name, value in values.items():
        monkeypatch.setattr(triton_backend, name, value)
    with deterministic_algorithms(monkeypatch) if deterministic else contextlib.nullcontext():
        if dropout:
            _compare_with_dropout(monkeypatch, c, dtype, device, dropout, check_rate=False, call_scale=True)
        else:
            _compare(c, dtype, device, call_scale=True)


def test_random_settings_cover_every_value():
    """Within the default run's seeds every value of every setting is drawn, in every dtype, with and without
    deterministic algorithms and dropout, and every head dim of `RANDOM_SETTINGS_DIMS`; and the settings are the
    backend's (a renamed one fails here, not silently)."""
    drawn = [_random_settings(seed) for seed in range(RANDOM_SETTINGS_CASES)]
    for name, values in RANDOM_SETTINGS.items():
        assert hasattr(triton_backend, name), name
        assert {settings[name] for settings, _, _, _ in drawn} == set(values), name
    assert {dtype for _, dtype, _, _ in drawn} == set(RANDOM_SETTINGS_DTYPES)
    assert {deterministic for _, _, deterministic, _ in drawn} == {False, True}
    assert {dropout for _, _, _, dropout in drawn} == {0.0, 0.3}
    cases = [_random_case(seed, dims=RANDOM_SETTINGS_DIMS)[0] for seed in range(RANDOM_SETTINGS_CASES)]
    assert {c.dim for c in cases} == set(RANDOM_SETTINGS_DIMS)


def test_random_cases_cover_the_grid():
    """The random grid draws every road, kind of geometry and tile side, and cases whose tables saturate and
    cases whose tables do not, within the default run's cases."""
    drawn = [_random_case(seed) for seed in range(RANDOM_CASES)]
    cases = [c for c, _, _ in drawn]
    assert {road for _, road, _ in drawn} == set(triton_backend.NEAR_BAND_MODES)
    assert any(c.key_lengths and 0 in c.key_lengths for c in cases)
    assert any(c.cu_seqlens for c in cases) and any(c.q_offset is not None for c in cases)
    assert any(c.n_k is not None and c.q_offset is None for c in cases) and any(c.causal for c in cases)
    assert any(max(c.n, c.n_k or c.n) > c.rel.saturation for c in cases)
    if DEVICE == "cpu":
        sides = {s for _, _, tiles in drawn for t in tiles.values() for s in (t.block_m, t.block_n)}
        assert sides == {16, 32}


def test_banded_distance_tables_hold_each_pairs_terms():
    """`_distance_tables` in bands: ROW's row r of band b holds pair (b·band + r, j)'s c2p at cell band + j - r
    for every key j, COL's row r of band b pair (i, b·band + r)'s p2c at cell band + i - r, each eager's term
    times log2(e) (scale included), laid out (H, bands, B, band, cells); the padding rows past N are zeros, and
    `_distance_slack` zeros lie after the table and before it."""
    from debertakit.attention.eager import score_components

    c = Case(n=40, batch=2, heads=2, dim=16, rel=WIDE)
    B, H, N, band = c.batch, c.heads, c.n, 16
    q, k, _, pos_q, pos_k = (t.detach() for t in _inputs(c, torch.float32, DEVICE))
    scale = 0.3
    parts = score_components(q, k, pos_q, pos_k, c.rel, Geometry(), scale=scale, terms=c.terms)
    sat = c.rel.saturation
    lo, hi, lut = triton_backend._lut(c.rel, sat, pos_k.shape[1], DEVICE)
    rows = 48
    cells = rows + band + 1
    index = triton_backend._distance_cells(lut, sat, band, rows // band, cells)
    assert index.shape == (2, rows // band, cells)
    row, col = triton_backend._distance_tables(
        triton_backend._per_head(q), triton_backend._per_head(k), pos_q[:, lo:hi], pos_k[:, lo:hi], index,
        scale * triton_backend.LOG2E, (B, N, N), band,
    )  # fmt: skip
    slack = triton_backend._distance_slack(cells, N, N, band)
    size = H * B * rows * cells
    assert slack >= cells and row.numel() == size + slack and bool((row[size:] == 0).all())
    before = torch.as_strided(row, (slack,), (1,), row.storage_offset() - slack)  # the zeros before the table
    assert row.storage_offset() >= slack and bool((before == 0).all())
    assert (
        row.storage_offset() % triton_backend.LEAD_ALIGN == 0 and row.data_ptr() % 16 == 0
    )  # `_product_buffer`
    i, j = torch.meshgrid(torch.arange(N), torch.arange(N), indexing="ij")
    i, j = i.flatten(), j.flatten()
    for name, table, own, other in (("c2p", row, i, j), ("p2c", col, j, i)):
        laid = table[:size].view(H, rows // band, B, band, cells)
        for b in range(B):
            for h in range(H):
                got = laid[h, own // band, b, own % band, band + other - own % band]
                want = parts[name][b, h][i, j] * triton_backend.LOG2E
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        padding = laid.permute(0, 2, 1, 3, 4).reshape(H, B, rows, cells)[:, :, N:]
        assert bool((padding == 0).all()), name


# The distance tables' products (`_band_product`) over shapes: one band and bands, one batch row and several,
# rows not filling the last band, every head dim the kernels take, rows for more than one of the product
# kernel's row groups (VEC·BLOCK_M = 512 at 16 bits), a row shorter than one column block
PRODUCT_GRID = {
    "one_band": dict(batch=2, n=70, heads=3, dim=16, band=0),
    "one_band_groups": dict(batch=3, n=200, heads=1, dim=16, band=0),
    "short_rows": dict(batch=2, n=5, heads=2, dim=32, band=0),
    "one_band_d64_b1": dict(batch=1, n=33, heads=2, dim=64, band=0),
    "bands": dict(batch=3, n=100, heads=2, dim=32, band=64),
    "bands_d128": dict(batch=2, n=40, heads=1, dim=128, band=16),
}


def _band_product_inputs(case: dict, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, n, H, d, band = (case[k] for k in ("batch", "n", "heads", "dim", "band"))
    # q as the projections give it: (B, N, H, d) memory seen per head (`_per_head`: a strided view)
    heads = triton_backend._per_head(torch.randn(B, n, H, d, generator=g).to(dtype).transpose(1, 2))
    table = torch.randn(H, 40, d, generator=g).to(dtype)
    if band:
        bands = triton_backend.triton_cdiv(n, band)
        width = bands * band + band + 1
    else:
        bands, width = 1, 2 * triton_backend._aligned(n) + 1
    cells = torch.randint(0, 40, (bands, width), generator=g)
    return heads, table, cells, B, n, band


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernel in the interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(PRODUCT_GRID))
@pytest.mark.parametrize("stores", triton_backend.PRODUCT_STORES_MODES)
@pytest.mark.parametrize("programs", triton_backend.PRODUCT_PROGRAMS_MODES)
def test_distance_product_kernel_builds_the_matmuls_table(monkeypatch, name, dtype, stores, programs):
    """`triton_products` against the batched matmul it replaces (``DISTANCE_PRODUCT`` "cublas": on the CPU the
    float32 product, rounded once): the same table, element for element, with the same zeros after it and, with
    bands, before it; q read through its strides, the table rows through the cells, the padding rows as zeros.
    The kernel ran (its launch recorded) for 16-bit operands of one dtype only: float32 ones, and a table of
    another dtype, take the matmul. Both ways of storing the inner blocks (`PRODUCT_STORES`; with "tma" the
    launch carries the descriptor: every case's rows are a multiple of 8) and the three kinds of programs
    (`PRODUCT_PROGRAMS`: a block each, a row block each with a loop over its columns, or a column block and
    residue each with a loop over row blocks) write the same table."""
    from debertakit.attention.triton_access import record_run

    heads, table, cells, B, n, band = _band_product_inputs(PRODUCT_GRID[name], dtype)
    slack = 37
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)  # a cell the kernel misses stays NaN
    monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", "cublas")
    want = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, slack)
    monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", "triton")
    monkeypatch.setattr(triton_backend, "PRODUCT_STORES", stores)
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", programs)
    with record_run("triton_products.py") as (_, launches):
        got = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, slack)
    assert list(launches) == ([] if dtype == torch.float32 else ["_distance_product_kernel"])
    for args, kwargs in launches.values():
        assert kwargs["TMA"] == (stores == "tma")
        assert (args[4] is None) == (stores != "tma")  # OUT_DESC
        assert kwargs["ROW_LOOP"] == (programs == "rows") and kwargs["COL_LOOP"] == (programs == "columns")
        assert kwargs["WRAP"]  # the default `PRODUCT_EDGES`: the rows' ends stored 16 bytes at a time
    # with bands the zeros before the table end where it starts, LEAD_ALIGN-aligned: its pointer is 16-byte
    # aligned, as the kernels' vector loads and stores need (`_product_buffer`)
    lead = (
        triton_backend.triton_cdiv(slack, triton_backend.LEAD_ALIGN) * triton_backend.LEAD_ALIGN
        if band
        else 0
    )
    assert got.shape == want.shape and got.storage_offset() == want.storage_offset() == lead
    assert got.data_ptr() % 16 == want.data_ptr() % 16 == 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert bool((got[-slack:] == 0).all())
    if band:
        before = torch.as_strided(got, (slack,), (1,), lead - slack)
        assert bool((before == 0).all())
    with record_run("triton_products.py") as (_, launches):  # a table of another dtype: the matmul's fallback
        other = torch.float32 if dtype != torch.float32 else torch.bfloat16
        triton_backend._band_product(heads, table.to(other), cells, B, n, band, 0.7, slack)
    assert launches == {}


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernel in the interpreter")
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("name", ["one_band_groups", "bands"])
def test_column_programs_split_their_row_blocks_into_runs(monkeypatch, name, groups):
    """`PRODUCT_PROGRAMS` "columns" with `PRODUCT_COLUMN_GROUPS` row blocks a program: where a residue's row
    blocks (two in "one_band_groups", 624 rows at 64 × 8 a block) take more than one run, the runs together
    write the table of one program per block, bit for bit, every cell (the poison)."""
    from debertakit.attention.triton_access import record_run

    heads, table, cells, B, n, band = _band_product_inputs(PRODUCT_GRID[name], torch.bfloat16)
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    want = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", "columns")
    monkeypatch.setattr(triton_backend, "PRODUCT_COLUMN_GROUPS", groups)
    with record_run("triton_products.py") as (_, launches):
        got = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)
    assert launches["_distance_product_kernel"][1]["GROUPS"] == groups
    assert not got.isnan().any() and torch.equal(got, want)


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernel in the interpreter")
@pytest.mark.parametrize("name", list(PRODUCT_GRID))
def test_wide_column_tiles_write_the_matmuls_table(monkeypatch, name):
    """The column loop's tiles of wide tables (`PRODUCT_COLUMN_TILES`, for rows of `PRODUCT_WIDE_CELLS` cells or
    more, which the grid's short inputs do not reach) given to every case's table write the matmul's table, bit
    for bit, every cell (the poison)."""
    from debertakit.attention.triton_access import record_run

    heads, table, cells, B, n, band = _band_product_inputs(PRODUCT_GRID[name], torch.bfloat16)
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", "cublas")
    want = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)
    monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", "triton")
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", "columns")
    monkeypatch.setattr(triton_backend, "PRODUCT_WIDE_CELLS", 0)
    with record_run("triton_products.py") as (_, launches):
        got = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)
    kwargs = launches["_distance_product_kernel"][1]
    wide = triton_backend.PRODUCT_COLUMN_TILES
    assert (kwargs["BLOCK_M"], kwargs["BLOCK_N"]) == (wide.block_m, wide.block_n)
    assert not got.isnan().any() and torch.equal(got, want)


def test_product_tiles_follow_the_tables_width(monkeypatch):
    """The column loop takes `PRODUCT_COLUMN_TILES` for rows of `PRODUCT_WIDE_CELLS` cells or more and the
    narrower blocks below: at v3's buckets on a GPU (64x32 attention tiles, sat 512) the one band of N = 2048
    (1217 cells) the wide ones, the 64-row bands of 512 (577 cells) the narrow; the other programs keep their
    one shape."""
    wide, narrow = triton_backend.PRODUCT_COLUMN_TILES, triton_backend.PRODUCT_NARROW_COLUMN_TILES
    assert wide.block_n > narrow.block_n
    edge = triton_backend.PRODUCT_WIDE_CELLS
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", "columns")
    assert triton_backend._product_tiles(edge) == wide
    assert triton_backend._product_tiles(edge - 1) == narrow
    tiles = [Tiles(64, 32, 4, 2)] * 3
    for n, far, served in ((2048, True, wide), (512, False, narrow)):
        band, bands, width = triton_backend._distance_layout(512, n, n, tiles, far, 64, 16384 // n)
        assert (band > 0) == (not far) and triton_backend._product_tiles(width) == served
    for programs, own in (("rows", "PRODUCT_ROW_TILES"), ("blocks", "PRODUCT_TILES")):
        monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", programs)
        assert (
            triton_backend._product_tiles(edge)
            == triton_backend._product_tiles(1)
            == getattr(triton_backend, own)
        )


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernel in the interpreter")
@pytest.mark.parametrize("name", list(PRODUCT_GRID))
@pytest.mark.parametrize("programs", triton_backend.PRODUCT_PROGRAMS_MODES)
def test_product_edges_masked_write_the_wrapped_table(monkeypatch, name, programs):
    """`PRODUCT_EDGES` "masked" (each row's first and last block stored element by element, the cells outside
    the row left out) and the default "wrap" (those cells computed for the row they belong to: row m's cells
    -s … -1 are row m - 1's last, every store 16 bytes) write the same table, bit for bit, every cell written
    (the poison). The launch says which it ran."""
    from debertakit.attention.triton_access import record_run

    heads, table, cells, B, n, band = _band_product_inputs(PRODUCT_GRID[name], torch.bfloat16)
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", programs)
    tables = {}
    for edges in triton_backend.PRODUCT_EDGES_MODES:
        monkeypatch.setattr(triton_backend, "PRODUCT_EDGES", edges)
        with record_run("triton_products.py") as (_, launches):
            tables[edges] = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)
        assert launches["_distance_product_kernel"][1]["WRAP"] == (edges == "wrap")
    assert not tables["wrap"].isnan().any()
    assert torch.equal(tables["wrap"], tables["masked"])


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernel in the interpreter")
@pytest.mark.parametrize("programs", triton_backend.PRODUCT_PROGRAMS_MODES)
def test_tma_stores_write_inner_blocks_and_leave_the_edges_to_the_pointers(monkeypatch, programs):
    """With `PRODUCT_STORES` "tma" the inner blocks go through the descriptor and nothing else does: with the
    descriptor pointed at another buffer, exactly the cells of inner blocks (no cell outside 0 … R, per row of
    residue s the blocks from cell 64·j - s) stay NaN in the table (the poison) and land in that buffer, at the
    same places; the first and last block of each row are written by the pointers. A table whose rows are not a
    multiple of 8 is stored by the pointers alone."""
    heads, table, cells, B, n, band = _band_product_inputs(PRODUCT_GRID["one_band"], torch.bfloat16)
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    monkeypatch.setattr(triton_backend, "PRODUCT_STORES", "tma")
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", programs)
    full = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)
    H, (_, width), rows = heads.shape[0], cells.shape, B * triton_backend._padded_rows(n)
    elsewhere = torch.zeros(H, rows, width, dtype=torch.bfloat16)
    real = triton_backend._residue_descriptor
    monkeypatch.setattr(triton_backend, "_residue_descriptor", lambda out, *a: real(elsewhere, *a))
    split = triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)

    R, block = width - 1, triton_backend._product_tiles(width).block_n
    inner = torch.zeros(rows, width, dtype=torch.bool)
    for m in range(rows):
        s = m % 8
        for j in range(triton_backend.triton_cdiv(R + 8, block)):
            first = j * block - s
            if first >= 0 and first + block - 1 <= R:
                inner[m, first : first + block] = True
    assert 0 < inner.sum() < inner.numel()
    table_cells = split[: H * rows * width].view(H, rows, width)
    assert torch.equal(torch.isnan(table_cells), inner.expand(H, -1, -1))
    full_cells = full[: H * rows * width].view(H, rows, width)
    assert torch.equal(elsewhere[:, inner], full_cells[:, inner])
    assert torch.equal(table_cells[:, ~inner], full_cells[:, ~inner])
    assert not elsewhere[:, ~inner].any()
    assert not triton_backend._tma_stores(heads, rows - 4, 8)  # rows not a multiple of 8: the pointers


def _paired_inputs(case: dict, dtype: torch.dtype = torch.bfloat16):
    """q and k per head, Kr and Qr, both tables' cells (2, bands, cells), B, n, band: `_distance_tables`'
    operands, each drawn apart (a table built from the other side's operands would differ)."""
    q_heads, kr, row_cells, B, n, band = _band_product_inputs(case, dtype)
    k_heads, qr, col_cells, *_ = _band_product_inputs(case, dtype, seed=1)
    return q_heads, k_heads, qr, kr, torch.stack([row_cells, col_cells]), B, n, band


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernel in the interpreter")
@pytest.mark.parametrize("programs", triton_backend.PRODUCT_PROGRAMS_MODES)
@pytest.mark.parametrize("name", list(PRODUCT_GRID))
def test_one_launch_writes_both_distance_tables(monkeypatch, name, programs):
    """`PRODUCT_LAUNCHES` "one": ROW and COL from one launch of the product kernel (``PAIR``: the grid's second
    half builds COL) into one buffer, each equal to the matmul's table bit for bit (every cell written: the
    poison), each followed by at least the slack's zeros and, with bands, preceded by as many (COL's lead being
    ROW's trailing zeros), each 16-byte aligned; "two" launches the kernel once a table, as before (checked with
    the default's programs only: the single tables' own test covers every kind)."""
    from debertakit.attention.triton_access import record_run

    q_heads, k_heads, qr, kr, cells, B, n, band = _paired_inputs(PRODUCT_GRID[name])
    slack = triton_backend._distance_slack(cells.shape[2], n, n, band)

    def tables():
        return triton_backend._distance_tables(q_heads, k_heads, qr, kr, cells, 0.7, (B, n, n), band)

    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", "cublas")
    want = tables()
    monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", "triton")
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", programs)
    calls, real = [], triton_backend._kernel_band_product

    def spy(*args):
        calls.append(len(args) == 9)  # with the pair
        return real(*args)

    monkeypatch.setattr(triton_backend, "_kernel_band_product", spy)
    size = want[0].numel() - slack  # the cells of one table
    for launches in ("one", "two") if programs == "columns" else ("one",):
        monkeypatch.setattr(triton_backend, "PRODUCT_LAUNCHES", launches)
        calls.clear()
        with record_run("triton_products.py") as (_, recorded):
            got = tables()
        assert calls == ([True] if launches == "one" else [False, False])
        assert recorded["_distance_product_kernel"][1]["PAIR"] == (launches == "one")
        for table, wanted in zip(got, want):
            assert not table.isnan().any() and torch.equal(table[:size], wanted[:size])
            assert table.numel() - size >= slack and bool((table[size:] == 0).all())
            assert table.data_ptr() % 16 == 0
            if band:  # the zeros before it
                before = torch.as_strided(table, (slack,), (1,), table.storage_offset() - slack)
                assert bool((before == 0).all())
        shared = got[0].untyped_storage().data_ptr() == got[1].untyped_storage().data_ptr()
        assert shared == (launches == "one")


def test_distance_tables_take_one_launch_where_their_operands_agree(monkeypatch):
    """`_paired_products`: one launch for both tables by default; two where only one is wanted, the lengths
    differ, k's strides are not q's, the tables are float32 (the matmul's), the stores go through a descriptor
    (`PRODUCT_STORES` "tma"), or `PRODUCT_LAUNCHES` says "two"; a mode it does not know is refused."""
    q_heads, k_heads, qr, kr, cells, B, n, band = _paired_inputs(PRODUCT_GRID["one_band"])
    paired = triton_backend._paired_products
    assert paired(q_heads, k_heads, kr, qr, cells, n, n)
    assert not paired(q_heads, None, kr, None, cells, n, n)
    assert not paired(None, k_heads, None, qr, cells, n, n)
    assert not paired(q_heads, k_heads, kr, qr, cells, n, n + 1)
    assert not paired(q_heads, k_heads.contiguous(), kr, qr, cells, n, n)  # (q is a strided view)
    assert not paired(q_heads.float(), k_heads.float(), kr.float(), qr.float(), cells, n, n)
    monkeypatch.setattr(triton_backend, "PRODUCT_STORES", "tma")
    assert not paired(q_heads, k_heads, kr, qr, cells, n, n)
    monkeypatch.setattr(triton_backend, "PRODUCT_STORES", "pointers")
    monkeypatch.setattr(triton_backend, "PRODUCT_LAUNCHES", "two")
    assert not paired(q_heads, k_heads, kr, qr, cells, n, n)
    monkeypatch.setattr(triton_backend, "PRODUCT_LAUNCHES", "1")
    with pytest.raises(ValueError, match=r"PRODUCT_LAUNCHES must be one of \('one', 'two'\), got '1'"):
        paired(q_heads, k_heads, kr, qr, cells, n, n)


def test_distance_product_mode_is_checked(monkeypatch):
    heads, table, cells, B, n, band = _band_product_inputs(PRODUCT_GRID["one_band"], torch.float32)
    monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", "cuBLAS")
    with pytest.raises(
        ValueError, match=r"DISTANCE_PRODUCT must be one of \('triton', 'cublas'\), got 'cuBLAS'"
    ):
        triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernels in the interpreter")
@pytest.mark.parametrize("name", ["n70_saturating", "packed"])
def test_product_kernel_variants_leave_the_attention_unchanged(monkeypatch, name):
    """A bfloat16 call on the distance road (its tables from the product kernel, forward and backward) with
    every variant on (`PRODUCT_PROGRAMS` "rows" or "columns", `PRODUCT_STORES` "tma", the descriptor passed,
    `PRODUCT_EDGES` "masked", `PRODUCT_LAUNCHES` "two": the tables in two launches, as with the descriptor)
    gives the output and gradients of one launch for both bit for bit."""
    from debertakit.attention.triton_access import record_run

    _near_band(monkeypatch, "distance")
    c = GRID[name]
    results = []
    variants = (
        ("blocks", "pointers", "wrap", "one"),
        ("rows", "tma", "masked", "one"),
        ("columns", "tma", "masked", "one"),
        ("columns", "pointers", "wrap", "two"),
    )
    for programs, stores, edges, tables in variants:
        monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", programs)
        monkeypatch.setattr(triton_backend, "PRODUCT_STORES", stores)
        monkeypatch.setattr(triton_backend, "PRODUCT_EDGES", edges)
        monkeypatch.setattr(triton_backend, "PRODUCT_LAUNCHES", tables)
        with record_run("triton_products.py") as (_, launches):
            results.append(
                _run(triton_attention, c, _inputs(c, torch.bfloat16, DEVICE), _geometry(c, DEVICE))
            )
        args, kwargs = launches["_distance_product_kernel"]  # the last launch: COL's table in the backward
        assert kwargs["ROW_LOOP"] == (programs == "rows") and (args[4] is not None) == (stores == "tma")
        assert kwargs["COL_LOOP"] == (programs == "columns") and kwargs["WRAP"] == (edges == "wrap")
        assert kwargs["PAIR"] == (stores == "pointers" and tables == "one")
    (out, grads), *others = results
    for out_v, grads_v in others:
        assert torch.equal(out, out_v)
        for g, g_v in zip(grads, grads_v):
            assert torch.equal(g, g_v)


@pytest.mark.skipif(DEVICE != "cpu", reason="runs the kernels in the interpreter")
@pytest.mark.parametrize("road", triton_backend.NEAR_BAND_MODES)
def test_position_tables_in_the_models_layout_are_read_in_place(monkeypatch, road):
    """The model's position tables are (R, H, d) projections viewed per head (`split_heads`: not contiguous). Every
    road but the skewed ones reads them through their strides, so a forward copies neither table (it copied both,
    in every layer); the skewed kernels, which index a table's rows as row · HEAD_DIM, get contiguous copies
    (`_table_layout`). The output and every gradient are those of contiguous tables, bit for bit (bfloat16: on
    the distance road the tables' product kernel reads them). q, k and v come as the model's too, read in place
    (`test_projection_layout_is_read_and_written_in_place`), so a copy counted is a table's."""
    _near_band(monkeypatch, road)
    c = Case(n=20, heads=2, batch=2)  # two heads: a view per head; two batch rows
    q, k, v, pos_q, pos_k = _inputs(c, torch.bfloat16, DEVICE)
    q, k, v = (_projection_layout(t) for t in (q, k, v))
    viewed = [_projection_layout(pos_q), _projection_layout(pos_k)]
    assert not viewed[0].is_contiguous() and torch.equal(viewed[0], pos_q)
    out, grads = _run(triton_attention, c, (q, k, v, pos_q, pos_k), _geometry(c, DEVICE))
    out_v, grads_v = _run(triton_attention, c, (q, k, v, *viewed), _geometry(c, DEVICE))
    assert torch.equal(out, out_v)
    for g, g_v in zip(grads, grads_v):
        assert torch.equal(g, g_v)
    with torch.no_grad(), _Ops() as probe:
        triton_attention(q, k, v, *viewed, c.rel, _geometry(c, DEVICE), scale=0.1, terms=c.terms)
    assert probe.ops["aten.clone.default"] == (2 if road.startswith("skew") else 0), probe.ops


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("PRODUCT_STORES", "TMA", r"PRODUCT_STORES must be one of \('pointers', 'tma'\), got 'TMA'"),
        (
            "PRODUCT_PROGRAMS",
            "row",
            r"PRODUCT_PROGRAMS must be one of \('blocks', 'rows', 'columns'\), got 'row'",
        ),
        ("PRODUCT_EDGES", "wrapped", r"PRODUCT_EDGES must be one of \('wrap', 'masked'\), got 'wrapped'"),
    ],
)
def test_product_kernel_modes_are_checked(monkeypatch, setting, value, message):
    heads, table, cells, B, n, band = _band_product_inputs(PRODUCT_GRID["one_band"], torch.bfloat16)
    monkeypatch.setattr(triton_backend, setting, value)
    with pytest.raises(ValueError, match=message):
        triton_backend._band_product(heads, table, cells, B, n, band, 0.7, 8)


def test_distance_tables_only_where_they_apply(monkeypatch):
    uses = triton_backend._uses_distance
    _near_band(monkeypatch, "distance")
    assert uses(True, False)
    assert not uses(False, False)  # explicit positions
    assert not uses(True, True)  # p2p
    _near_band(monkeypatch, "tables")
    assert not uses(True, False)


def test_distance_reach_spans_the_tiles_the_kernels_run_with_dropout(monkeypatch):
    """The reach counts the largest tiles of the kernels that read the tables as they run: with dropout, those
    of `DROPOUT_TILES`. Here the dK/dV kernel runs a dropout tile larger than every inference tile: the
    backward's reach widens, the forward's stays its tiles' (`_table_layouts`), and the gradients it gives
    (its near tiles reach farther) still equal eager's with the kernels' mask."""
    c = GRID["n70_saturating"]
    _near_band(monkeypatch, "distance")
    reaches = _distance_reaches(monkeypatch)
    small, large = triton_backend.Tiles(16, 16, 1, 1), triton_backend.Tiles(32, 64, 1, 1)
    monkeypatch.setattr(triton_backend, "tiles_for", lambda device, d, name, dropout=False, skew=False: (
        large if dropout and name == "_dkv_kernel" else small
    ))  # fmt: skip
    _run(triton_attention, c, _inputs(c, torch.float32, DEVICE), _geometry(c, DEVICE))
    _compare_with_dropout(monkeypatch, c, torch.float32, DEVICE, 0.3)
    # forward and backward without dropout, then with: only the backward with dropout reads farther
    assert len(reaches) == 4 and reaches[0] == reaches[1] == reaches[2] < reaches[3], reaches


# ------------------------------------------------------------------------------------------------- dropout
DROPOUT_GRID = [
    "n70_saturating",
    "p2c_only",
    "heads2_d32_batch2",
    "padding",
    "packed_causal",
    "cross_nq_gt_nk",
    "explicit_positions",
    "d8_zero_padded_to_16",
]


def _record_seeds(monkeypatch) -> list[torch.Tensor]:
    drawn = []
    real = triton_backend._draw_seed

    def record(device):
        drawn.append(real(device))
        return drawn[-1]

    monkeypatch.setattr(triton_backend, "_draw_seed", record)
    return drawn


def _eager_with_mask(c: Case, inputs, geom: Geometry, keep: torch.Tensor, p: float, grad_out=None):
    """eager's probabilities times a given keep mask and 1 / (1 - rounded p), then · v; with gradients."""
    q, k, v, pos_q, pos_k = inputs
    scale = scale_for(c.dim, 1 + sum(c.terms))
    _, probs = eager_attention(
        q, k, v, pos_q, pos_k, c.rel, geom, scale=scale, terms=c.terms, return_probs=True
    )
    out = ((probs * keep / (1.0 - rounded_p(p))) @ v.float()).to(v.dtype)
    leaves = [t for t in inputs if t is not None]
    return out, torch.autograd.grad(out, leaves, _grad_out(out) if grad_out is None else grad_out.to(out))


def _compare_with_dropout(
    monkeypatch,
    c: Case,
    dtype: torch.dtype,
    device: str,
    p: float,
    check_rate: bool = True,
    call_scale: bool = False,
) -> None:
    """The kernels' forward and backward with dropout ``p`` against eager times the mask `dropout_keep_mask`
    materialises for the call's seed: output and every gradient (and, with ``check_rate``, that the mask keeps
    about 1 - p: not for the random grid's cases of a handful of pairs; ``call_scale``: `_assert_close`'s)."""
    seeds = _record_seeds(monkeypatch)
    geom = _geometry(c, device)
    inputs = _inputs(c, dtype, device)
    got = _run(triton_attention, c, inputs, geom, dropout_p=p)
    assert len(seeds) == 1
    keep = dropout_keep_mask(int(seeds[0]), c.batch, c.heads, c.n, c.n_k or c.n, p, device)
    if check_rate:
        assert abs(keep.float().mean().item() - (1 - p)) < 0.15
    want = _eager_with_mask(c, _reference_inputs(inputs, device), geom, keep, p, _grad_out(got[0]))
    _assert_close(c, inputs, dtype, (got[0], *got[1]), (want[0], *want[1]), call_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", DROPOUT_GRID)
def test_dropout_equals_eager_with_the_kernels_mask(monkeypatch, name, dtype):
    """Forward and backward kernels apply one mask, the one `dropout_keep_mask` materialises for the call's
    seed: output and every gradient equal eager's probabilities times that mask."""
    _compare_with_dropout(monkeypatch, GRID[name], dtype, DEVICE, 0.3)


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
def test_forward_tables_cut_to_the_saturation_with_dropout_match_eager(monkeypatch):
    """`FORWARD_REACH = "saturation"` with dropout (the forward's dropout tiles size the uncut tables): the
    forward's tables cut, output and gradients equal eager's probabilities times the kernels' mask."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
    with record_run("triton_kernels.py") as (_, launches):
        _compare_with_dropout(monkeypatch, GRID["n70_saturating"], torch.float32, DEVICE, 0.3)
    assert launches["_fwd_kernel"][1]["EDGES"] and launches["_fwd_kernel"][1]["DROPOUT"]


def test_bfloat16_dropout_gradients_are_as_close_to_float32_as_without_dropout(monkeypatch):
    """With dropout the backward's DELTA = dO·O needs O unrounded (`triton_backend._out_dtype`): a row's O is
    1/(1 - p) times part of a convex combination, and its 16-bit rounding would pass into every dS of the row.
    bfloat16 gradients against eager in float32 on the same values, padded rows down to one key, N = 64: within
    1% of each tensor's largest value (with O rounded to bfloat16, dK was off by 1.8% and dQ by 1.5%)."""
    torch.manual_seed(0)
    c = Case(n=64, batch=3, heads=2, dim=64, rel=V3, key_lengths=(64, 21, 1))
    seeds = _record_seeds(monkeypatch)
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.bfloat16, DEVICE)
    out, grads = _run(triton_attention, c, inputs, geom, dropout_p=0.1)
    keep = dropout_keep_mask(int(seeds[0]), c.batch, c.heads, c.n, c.n, 0.1, DEVICE)
    ref, ref_grads = _eager_with_mask(c, _float32_copies(inputs), geom, keep, 0.1, _grad_out(out))
    for name, a, b in zip(["out", "dq", "dk", "dv", "dpos_q", "dpos_k"], (out, *grads), (ref, *ref_grads)):
        err = (a.float() - b).abs().max().item() / b.abs().max().item()
        assert err < 1e-2, (name, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "road, name",
    [("skew", n) for n in ("n70_saturating", "p2c_only", "packed_causal", "cross_nq_gt_nk")]
    + [("distance", n) for n in ("n70_saturating", "padding", "packed_causal", "cross_nq_gt_nk")],
)
def test_near_band_roads_with_dropout_equal_eager_with_the_kernels_mask(monkeypatch, road, name, dtype):
    """The skewed kernels and the distance road draw the tables road's mask (it depends on (seed, b·H + h, i, j)
    only, not on the road or the tiles): output and every gradient equal eager's probabilities times it;
    forward and backward took the road (`_on_road`)."""
    took_road = _on_road(monkeypatch, road)
    _compare_with_dropout(monkeypatch, GRID[name], dtype, DEVICE, 0.3)
    took_road()


class _Ops(TorchDispatchMode):
    """Counts the torch ops a call runs (a custom op counts once: its own work runs below the mode)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def deterministic_algorithms(monkeypatch, warn_only: bool = False):
    """PyTorch's deterministic algorithms asked for (`torch.use_deterministic_algorithms`; cuBLAS's workspace set
    as they require on CUDA), the previous setting restored after."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# The ops whose CUDA kernels add by atomics in the order the threads arrive, so that two runs on the same inputs
# may round apart (PyTorch's notes on reproducibility): none belongs on the backend's path under PyTorch's
# deterministic algorithms (`_into_rows`).
_ADDS_IN_THREAD_ORDER = (
    "aten.index_add",
    "aten.scatter_add",
    "aten.scatter_reduce",
    "aten.index_reduce",
    "aten.put",
)


@pytest.mark.parametrize(
    "road, name, band, dtype",
    [
        ("distance", "n70_saturating", None, torch.float32),
        ("distance", "packed_causal", None, torch.bfloat16),
        ("distance", "wide_padding", 16, torch.bfloat16),
        ("distance", "wide_d64_heads2", 32, torch.float32),
        ("tables", "n70_saturating", None, torch.float32),
        ("skew", "padding", None, torch.float32),
        ("skew-forward", "n70_saturating", None, torch.bfloat16),
    ],
)
def test_forward_backward_adds_in_a_fixed_order(monkeypatch, road, name, band, dtype):
    """Under PyTorch's deterministic algorithms no op of a forward+backward adds by atomics on CUDA
    (`_ADDS_IN_THREAD_ORDER`) on any road, in bands or not, 16-bit (the fold kernels) or float32, and none refuses
    to run: a training step on the same inputs gives the same gradients bit for bit
    (`test_backward_is_the_same_bit_for_bit_gpu` checks it on CUDA)."""
    _near_band(monkeypatch, road)
    if band is not None:
        _distance_bands(monkeypatch, band)
    c = BANDED_GRID[name] if band is not None else GRID[name]
    with deterministic_algorithms(monkeypatch), _Ops() as probe:
        _run(triton_attention, c, _inputs(c, dtype, DEVICE), _geometry(c, DEVICE))
    found = [op for op in probe.ops if op.startswith(_ADDS_IN_THREAD_ORDER)]
    assert sum(probe.ops.values()) > 20 and not found, found


def _through_the_custom_op(monkeypatch) -> None:
    """Calls run the custom op (as compiled graphs do; eager calls run its body without it: `_attention`), so that
    `_Ops` counts the op's work as one op and what the call does around it op by op."""
    monkeypatch.setattr(triton_backend, "_attention", triton_backend._fwd_op)


def test_geometries_without_masks_share_their_inputs(monkeypatch):
    """The kernels' geometry inputs of a geometry without masks, segments or explicit positions depend on the
    shapes and causality alone: two such geometries of one shape get the same tensors (built once, kept across
    forwards), equal to a fresh build; a causal one or another shape gets its own, a geometry with a key mask
    its own and unkept; the `SHAPE_KEPT` latest shapes are kept; while a CUDA graph is captured they are built
    and not kept."""
    from collections import OrderedDict

    from debertakit.attention import relative

    kept = OrderedDict()
    monkeypatch.setattr(triton_backend, "_SHAPE_INPUTS", kept)
    dev = torch.device(DEVICE)

    def inputs(geom, batch=2):
        return triton_backend._geometry_inputs(geom, batch, 8, 8, dev)

    first, again = inputs(Geometry()), inputs(Geometry())
    assert all(a is b for a, b in zip(first, again)) and len(kept) == 1
    fresh = triton_backend._build_geometry_inputs(Geometry(), 2, 8, 8, dev)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(first, fresh))
    causal = inputs(Geometry(causal=True))  # (q_pos, k_pos, q_seg, k_seg, k_mask, kv_lo, kv_hi, q_lo, q_hi)
    assert not torch.equal(causal[6], first[6]) and len(kept) == 2
    masked = inputs(Geometry(key_mask=torch.ones(2, 8, dtype=torch.bool, device=dev)))
    assert masked[4] is not None and len(kept) == 2
    monkeypatch.setattr(triton_backend, "SHAPE_KEPT", 2)
    inputs(Geometry(), batch=3)  # a third shape: the least recently used one leaves
    assert list(kept) == [(2, 8, 8, dev, True), (3, 8, 8, dev, False)]
    monkeypatch.setattr(relative, "capturing_cuda_graph", lambda: True)
    captured = inputs(Geometry(), batch=4)
    assert captured[0].shape == (4, 8) and len(kept) == 2 and (4, 8, 8, dev, False) not in kept


def test_a_captured_call_runs_the_ops_of_a_call_outside_the_capture(monkeypatch):
    """After a warm-up call, a call while a CUDA graph is captured (stood in for) runs the same torch ops as one
    outside it, and gives the same output: the lookup tables, distance cells and geometry inputs kept by the
    warm-up serve the capture (`relative.kept`). Built again there, they were more ops, kernels the
    graph would run at every replay."""
    from debertakit.attention import relative, triton_plan

    monkeypatch.setattr(relative, "_CAPTURED", {})
    c = GRID["n70_saturating"]
    geom = _geometry(c, DEVICE)
    inputs = [t.detach() for t in _inputs(c, torch.bfloat16, DEVICE)]

    def call():
        with _Ops() as probe:
            out, _ = triton_attention(*inputs, c.rel, geom, scale=0.2, terms=c.terms)
        return out, probe.ops

    call()  # the warm-up
    want, outside = call()
    for module in (relative, triton_backend, triton_plan):
        monkeypatch.setattr(module, "capturing_cuda_graph", lambda: True)
    got, captured = call()
    assert captured == outside and sum(outside.values()) > 5, captured - outside
    assert torch.equal(got, want) and relative._CAPTURED


def test_layers_after_the_first_reuse_the_geometrys_inputs(monkeypatch):
    """Positions, segments, key mask and block ranges are the same in every layer: built on the first call with a
    geometry, then reused (one forward of a base model calls the backend 12 times with one geometry)."""
    _through_the_custom_op(monkeypatch)
    c = GRID["packed_causal"]
    geom = _geometry(c, DEVICE)
    inputs = [t.detach() if t is not None else None for t in _inputs(c, torch.float32, DEVICE)]
    counts, outs = [], []
    for _ in range(2):
        with _Ops() as probe:
            outs.append(triton_attention(*inputs, c.rel, geom, scale=0.2, terms=c.terms)[0])
        counts.append(probe.ops)
    assert sum(counts[0].values()) > 20  # int32 rows, segment and block ranges, the lookup table
    assert set(counts[1]) == {"debertakit.disentangled_attention_fwd.default"}, counts[1]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("name", ["n70_saturating", "packed_causal", "cross_nq_gt_nk", "heads2_d32_batch2"])
def test_projection_layout_is_read_and_written_in_place(monkeypatch, name):
    """q, k, v as `split_heads` gives them, (B, N, H, d) memory viewed as (B, H, N, d): the kernels read them
    through strides (no copy) and write the output and the gradients in that layout (so `merge_heads` is a view);
    results equal those of contiguous inputs."""
    c = dataclasses.replace(GRID[name], heads=max(3, GRID[name].heads))  # several heads: layouts differ
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)
    q, k, v, pos_q, pos_k = (t.detach() if t is not None else None for t in inputs)
    split = [_projection_layout(t) for t in (q, k, v)]
    assert not split[0].is_contiguous()  # the layout under test
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    want = _run(triton_attention, c, inputs, geom, grad_out)
    leaves = [*split, *(t for t in inputs[3:] if t is not None)]
    out = triton_attention(
        *split, *inputs[3:], c.rel, geom, scale=scale_for(c.dim, 1 + sum(c.terms)), terms=c.terms
    )[0]
    grads = torch.autograd.grad(out, leaves, grad_out)
    assert out.transpose(1, 2).is_contiguous()
    assert all(g.stride() == t.stride() for g, t in zip(grads[:3], split))
    torch.testing.assert_close(out, want[0], atol=1e-6, rtol=1e-6)
    for a, b in zip(grads, want[1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    _through_the_custom_op(monkeypatch)
    with torch.no_grad(), _Ops() as probe:  # geometry inputs cached by now: the fused op and views, no copy
        triton_attention(*split, *inputs[3:], c.rel, geom, scale=0.2, terms=c.terms)
    assert set(probe.ops) <= {"debertakit.disentangled_attention_fwd.default", "aten.transpose.int"}, (
        probe.ops
    )


def test_dropout_mask_does_not_depend_on_tiles(monkeypatch):
    """The three kernels use different tiles on a GPU: the mask must be a function of (seed, b·h, i, j) alone."""
    c = GRID["packed_causal"]
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)
    seed = torch.tensor([(1 << 62) + 12345])
    monkeypatch.setattr(triton_backend, "_draw_seed", lambda device: seed.to(device))
    ref = _run(triton_attention, c, inputs, geom, dropout_p=0.2)
    other = {
        "_fwd_kernel": Tiles(32, 16, 1, 1),
        "_dq_kernel": Tiles(16, 32, 1, 1),
        "_dkv_kernel": Tiles(32, 32, 1, 1),
    }
    monkeypatch.setattr(triton_backend, "TILE_OVERRIDES", other)
    got = _run(triton_attention, c, inputs, geom, dropout_p=0.2)
    for a, b in zip((got[0], *got[1]), (ref[0], *ref[1])):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_dropout_mask_statistics():
    """Keep rate 1 - p in every (b, h), every column of a Philox group of eight and every row; heads and seeds
    draw different masks."""
    p = 0.1
    keep = dropout_keep_mask((1 << 62) + 7, 2, 3, 96, 160, p, DEVICE).float()  # 92160 draws
    assert abs(keep.mean().item() - (1 - p)) < 0.005  # 5 standard deviations
    per_head = keep.mean((2, 3)).flatten()
    assert (per_head - (1 - p)).abs().max() < 0.02
    per_lane = keep.view(2, 3, 96, 20, 8).mean((0, 1, 2, 3))  # column j % 8 within its Philox group
    assert (per_lane - (1 - p)).abs().max() < 0.02
    per_row = keep.mean((0, 1, 3))  # 960 draws a row: 5 standard deviations is 0.048
    assert (per_row - (1 - p)).abs().max() < 0.05
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])
    again = dropout_keep_mask((1 << 62) + 7, 2, 3, 96, 160, p, DEVICE).float()
    other = dropout_keep_mask((1 << 62) + 8, 2, 3, 96, 160, p, DEVICE).float()
    assert torch.equal(keep, again) and not torch.equal(keep, other)


def test_dropout_follows_the_torch_seed_and_checks_p():
    c = GRID["n33"]
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)
    outs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        outs.append(_run(triton_attention, c, inputs, geom, dropout_p=0.5)[0])
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    # p below 2**-17 rounds to no dropout at all (the 16-bit rule of every backend)
    plain = _run(triton_attention, c, inputs, geom)[0]
    assert torch.equal(_run(triton_attention, c, inputs, geom, dropout_p=1e-6)[0], plain)
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.0"):
        _run(triton_attention, c, inputs, geom, dropout_p=1.0)


def test_dropout_seed_is_one_int64_drawn_on_the_inputs_device(monkeypatch):
    """The kernels read the seed from memory (a CUDA graph replays the draw, not a number); no seed is drawn
    without dropout."""
    c = GRID["n33"]
    seeds = _record_seeds(monkeypatch)
    inputs = _inputs(c, torch.float32, DEVICE)
    _run(triton_attention, c, inputs, _geometry(c, DEVICE))
    assert seeds == []
    _run(triton_attention, c, inputs, _geometry(c, DEVICE), dropout_p=0.1)
    (seed,) = seeds
    assert seed.shape == (1,) and seed.dtype == torch.int64 and seed.device == inputs[0].device


def test_dropout_replays_under_activation_checkpointing():
    """Checkpointing recomputes the forward with the device's RNG state restored: same seed, same mask, so the
    gradients equal those of an uncheckpointed call."""
    from torch.utils.checkpoint import checkpoint

    c = GRID["padding"]
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)

    def attend(*xs):
        return triton_attention(*xs, c.rel, geom, scale=0.2, terms=c.terms, dropout_p=0.25)[0]

    results = []
    for wrap in (False, True):
        torch.manual_seed(0)
        out = checkpoint(attend, *inputs, use_reentrant=False) if wrap else attend(*inputs)
        results.append([out, *torch.autograd.grad(out.square().sum(), [t for t in inputs if t is not None])])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_model_trains_with_triton_attention_dropout():
    """The model passes its attention dropout to the backend in training mode only."""
    from debertakit.config import DebertaConfig
    from debertakit.model.backbone import DebertaModel

    cfg = DebertaConfig.preset(
        "tiny-v3", hidden_size=32, num_heads=2, num_layers=1, hidden_dropout=0.0, attention_dropout=0.3,
        attention_backend="triton",
    )  # fmt: skip
    torch.manual_seed(0)
    model = DebertaModel(cfg).to(DEVICE)
    ids = torch.randint(4, cfg.vocab_size, (2, 21), device=DEVICE)
    evaluated = model.eval()(input_ids=ids).last_hidden_state
    model.train()
    runs = []
    for seed in (1, 1):
        torch.manual_seed(seed)
        runs.append(model(input_ids=ids).last_hidden_state)
    assert torch.equal(runs[0], runs[1]) and not torch.allclose(runs[0], evaluated)
    runs[0].sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _compile_for_gpu(*args: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("compile_triton_kernels.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "compiled" in done.stdout


def _results(name: str) -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / name).read_text())


def test_gpu_tiles_are_the_static_reports_choice():
    """`GPU_TILES`, `DROPOUT_TILES` and `SKEW_TILES` hold what the committed static report chose (no hand edits
    in between), except the entries a GPU timed (`GPU_TIMED`: see the next test)."""
    report = _results("triton_static.json")
    # every kernel compiled from its code as it is now, under more than one Triton release
    sources = _benchmark_module("triton_static").kernel_sources()
    assert {v: e["sources"] for v, e in report["versions"].items()} == dict.fromkeys(
        report["versions"], sources
    )
    assert len(report["versions"]) >= 2 and {r["triton"] for r in report["rows"]} == set(report["versions"])
    chosen = report["chosen"]
    cuda = torch.device("cuda")
    for head_dim in (64, 128):
        for name in triton_backend.KERNEL_NAMES:
            for use, dropout in (("inference", False), ("dropout", True)):
                if not dropout and name in triton_backend.GPU_TIMED.get(head_dim, ()):
                    continue
                tiles = triton_backend.tiles_for(cuda, head_dim, name, dropout)
                assert str(tiles) == chosen[f"{name} d{head_dim} {use}"], (name, head_dim, use)
        # the skewed kernels: where the report found tiles for the forward, for both backward kernels
        for kernels in (triton_backend.FORWARD, triton_backend.BACKWARD):
            for use, dropout in (("skew", False), ("skew+dropout", True)):
                found = [chosen.get(f"{name} d{head_dim} {use}") for name in kernels]
                served = triton_backend.skew_served(head_dim, kernels, dropout)
                assert served == all(found), (head_dim, kernels, use, found)
                if all(found):
                    got = [
                        str(triton_backend.tiles_for(cuda, head_dim, n, dropout, skew=True)) for n in kernels
                    ]
                    assert got == found, (head_dim, kernels, use)


def test_gpu_timed_tiles_beat_the_static_choice_in_the_committed_timings():
    """The tiles a GPU timed (`GPU_TIMED`) were, in the committed run (benchmarks/results/attention_gpu.json),
    at least as fast as the tiles the run's `triton` rows used (the static report's choice then, recorded in its
    environment) at every length swept, forward and forward+backward, and as fast as the report's choice now
    wherever the sweep timed that tile for its kernel alone; and attention_gpu_defaults.json was measured at the
    tiles configured now for the head dims it ran (a tile changed without a new measurement fails here)."""
    static = _results("triton_static.json")["chosen"]
    run = _results("attention_gpu.json")

    def by_length(section: str, impl: str) -> dict:
        return {r["n"]: r for r in run["rows"] if r["section"] == section and r["impl"] == impl}

    for head_dim, kernels in triton_backend.GPU_TIMED.items():
        timed = {str(triton_backend.GPU_TILES[head_dim][name]) for name in kernels}
        assert len(timed) == 1, "the sweep gives one tile to all the kernels it times"
        tile = timed.pop()
        # the run's `triton` rows used other tiles for these kernels (the static choice of the time)
        assert all(run["environment"]["gpu_tiles"][f"d{head_dim} {name}"] != tile for name in kernels)
        swept = by_length("tiles", f"triton {tile}")
        before = by_length("attention", "triton")
        assert len(swept) >= 3 and set(swept) <= set(before), sorted(swept)
        for n, r in swept.items():
            for rate in ("fwd_tflops", "fwd_bwd_tflops"):
                assert r[rate] >= before[n][rate], (n, rate, r[rate], before[n][rate])
        for name in kernels:
            now = static[f"{name} d{head_dim} inference"]
            alone = by_length("tiles", f"triton {now} ({name})")
            mine = by_length("tiles", f"triton {tile} ({name})")
            rate = "fwd_tflops" if name == "_fwd_kernel" else "fwd_bwd_tflops"  # what the kernel runs in
            for n in set(alone) & set(mine):
                assert mine[n][rate] >= alone[n][rate], (name, now, n, mine[n][rate], alone[n][rate])
    defaults = _results("attention_gpu_defaults.json")
    measured = {f"d{r['head_dim']}" for r in defaults["rows"]}

    def at_measured(tiles: dict) -> dict:  # "d64 _fwd_kernel" -> tiles, for the head dims the file ran
        return {k: v for k, v in tiles.items() if k.split()[0] in measured}

    assert measured
    assert at_measured(defaults["environment"]["gpu_tiles"]) == at_measured(_benchmark_module().gpu_tiles())


def test_static_report_source_hash_sees_the_code_not_its_comments():
    """The report's rows stay valid across edits that compile to nothing (docstrings, comments, blank lines,
    line endings) and go stale at any change of code."""
    from pathlib import Path

    from debertakit.attention import triton_kernels

    code_hash = _benchmark_module("triton_static").code_hash
    base = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    same = [
        base.replace("Doc.", "Another doc."),
        base.replace("# one", "# two"),
        base.replace("\n", "\r\n"),
        base.replace("def f", "\n\ndef f"),
    ]
    assert {code_hash(s) for s in same} == {code_hash(base)}
    for changed in (
        base.replace("x + 1", "x + 2"),
        base.replace("x + 1", "1 + x"),
        base.replace("f(x)", "g(x)"),
    ):
        assert code_hash(changed) != code_hash(base), changed
    kernels = Path(triton_kernels.__file__).read_text()
    first = kernels.index('"""', kernels.index("@triton.jit")) + 3
    assert code_hash(kernels[:first] + "Edited. " + kernels[first:]) == code_hash(kernels)
    assert code_hash(kernels.replace("tl.float32", "tl.float16", 1)) != code_hash(kernels)


def test_static_report_rows_go_stale_with_their_own_kernels_code_only(capsys):
    """`triton_static.kernel_sources`: an edit to a function only the forward kernel runs changes the forward's
    hash alone, one to a helper of both backward kernels changes theirs, a docstring none; `current_rows` then
    drops the rows of the kernels whose code changed and keeps the others'."""
    from pathlib import Path

    from debertakit.attention import triton_kernels

    static = _benchmark_module("triton_static")
    text = Path(triton_kernels.__file__).read_text()
    now = static.kernel_sources(text)
    assert now == static.kernel_sources() and len(set(now.values())) == 3

    def edited(function: str, old: str, new: str) -> dict[str, str]:
        start = text.index(f"def {function}(")
        body = text[start:].replace(old, new, 1)
        return static.kernel_sources(text[:start] + body)

    fwd_only = edited("_fwd_keys", "m_i", "m_i2")
    assert fwd_only["_fwd_kernel"] != now["_fwd_kernel"]
    assert {k: fwd_only[k] for k in ("_dq_kernel", "_dkv_kernel")} == {
        k: now[k] for k in ("_dq_kernel", "_dkv_kernel")
    }
    backward = edited("_table_grad", "acc_r += ", "acc_r -= ")
    assert backward["_fwd_kernel"] == now["_fwd_kernel"]
    assert backward["_dq_kernel"] != now["_dq_kernel"] and backward["_dkv_kernel"] != now["_dkv_kernel"]
    assert edited("_table_grad", "Distance-space", "Distance space") == now

    rows = [dict(kernel=k, triton="3.9.0", tiles="64x32 w4 s2", replication=1) for k in static.KERNELS]
    report = dict(versions={"3.9.0": dict(torch="t", date="d", sources=fwd_only)}, rows=rows)
    versions, kept = static.current_rows(report, now)
    assert [r["kernel"] for r in kept] == ["_dq_kernel", "_dkv_kernel"]
    assert versions["3.9.0"]["sources"] == {k: now[k] for k in ("_dq_kernel", "_dkv_kernel")}
    assert "dropping the rows of _fwd_kernel under Triton 3.9.0" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--kernels _bwd_kernel: expected some of"):
        static.main(["--kernels", "_bwd_kernel", "--no-compile", "--no-write"])


def test_static_report_chooses_tiles_spill_free_under_every_triton_version(capsys):
    static = _benchmark_module("triton_static")

    def row(triton, tiles, stack, hgmma=4, replication=1):
        return dict(kernel="_fwd_kernel", head_dim=64, tiles=tiles, features="v3", triton=triton,
                    stack_bytes=stack, ops=dict(HGMMA=hgmma), replication=replication)  # fmt: skip

    # inference needs three feature sets; give each tile the same result in all of them
    def rows(triton, tiles, stack, hgmma=4, replication=1):
        return [
            {**row(triton, tiles, stack, hgmma, replication), "features": f} for f in static.USES["inference"]
        ]

    big, small = "64x64 w8 s2", "64x32 w8 s2"
    old, new = (
        rows("3.6.0", big, 16) + rows("3.6.0", small, 0),
        rows("3.9.0", big, 0) + rows("3.9.0", small, 0),
    )
    both = old + new
    assert static.choose(both)[("_fwd_kernel", 64, "inference")] == small  # big spills under 3.6
    assert static.choose(new)[("_fwd_kernel", 64, "inference")] == big  # 3.9 alone: the larger tile
    # a larger tile whose warps repeat a product in one set under one version loses to a smaller one that does not,
    # and to one without HGMMA
    repeats = rows("3.6.0", big, 0) + rows("3.9.0", big, 0)
    repeats[-1]["replication"] = 2

    def pick(rows):
        return static.choose(rows)[("_fwd_kernel", 64, "inference")]

    assert pick(repeats + rows("3.6.0", small, 0) + rows("3.9.0", small, 0)) == small
    assert pick(repeats + rows("3.6.0", small, 0, hgmma=0) + rows("3.9.0", small, 0, hgmma=0)) == small
    assert pick(repeats) == big  # replicated, yet the only one
    # a tile one version did not compile cannot qualify
    assert static.choose(rows("3.6.0", small, 0) + rows("3.9.0", big, 0)) == {}

    def entry(source: str) -> dict:
        return dict(torch="t", date="d", sources=dict(_fwd_kernel=source))

    report = dict(versions={"3.6.0": entry("old"), "3.9.0": entry("new")}, rows=both)
    versions, kept = static.current_rows(report, dict(_fwd_kernel="new"))
    assert set(versions) == {"3.9.0"} and {r["triton"] for r in kept} == {"3.9.0"}
    assert "dropping the rows of _fwd_kernel under Triton 3.6.0" in capsys.readouterr().out
    # and the rows read before a field the report reads was added (the same source)
    unread = [{k: v for k, v in r.items() if k != "replication"} for r in old]
    report = dict(versions={"3.6.0": entry("new"), "3.9.0": entry("new")}, rows=unread + new)
    versions, kept = static.current_rows(report, dict(_fwd_kernel="new"))
    assert set(versions) == {"3.9.0"} and {r["triton"] for r in kept} == {"3.9.0"}
    assert "read without one of ('replication',)" in capsys.readouterr().out


def test_store_cost_variants_apply_to_the_kernels_source(tmp_path):
    """`benchmarks/triton_store_cost.py` builds its variants of the backward's dS store by replacing lines of
    `triton_kernels`' source: each edit applies once to the current source, the variant's `_table_grad` stores
    as the variant says (no store; the row mask at aligned cells; the kernels as they are), and a source without
    the lines is refused."""
    import inspect

    cost = _benchmark_module("triton_store_cost")
    grads = {}
    for variant, edits in cost.VARIANTS.items():
        module = cost.kernels_module(edits, tmp_path)
        grads[variant] = inspect.getsource(module._table_grad.fn)
        assert hasattr(module, "_dq_kernel") and hasattr(module, "_dkv_kernel")
    assert "mask=near" in grads["now"] and "mask=near" not in grads["no dS store"]
    # the kernels as they are, compiled with GRAD_BANDS
    assert grads["odd stride (GRAD_BANDS)"] == grads["now"]
    aligned = grads["aligned rows, mask per row"]
    assert "mask=owned" in aligned and "(own * DW)[:, None] + kpos[None, :]" in aligned
    with pytest.raises(SystemExit, match="no longer holds"):
        cost.kernels_module([("this line is in no kernel\n", "")], tmp_path)


def test_static_report_costs_a_tile_per_thread_and_per_score():
    """`triton_static.tile_costs`: each loop's body at the tiles chosen for inference, per score (threads over
    scores), and for the forward the costlier far loop over plain attention's loop at the same tile."""
    static = _benchmark_module("triton_static")

    def row(kernel, tiles, features, loops):
        return dict(
            kernel=kernel, head_dim=64, tiles=tiles, features=features, triton="3.9.0", tile_loops=loops
        )

    rows = [
        row("_fwd_kernel", "64x64 w8 s2", "plain", [400]),
        row("_fwd_kernel", "64x64 w8 s2", "v3", [500, 1000, 520]),
        row("_fwd_kernel", "32x32 w4 s2", "v3", [1, 2, 3]),  # not the chosen tile
        row("_dq_kernel", "64x32 w8 s2", "v3", [384, 768, 384]),
        # dQ's far runs in blocks of 64 keys: each far run's wide loop over 64 keys, its narrow one over 32
        row("_dq_kernel", "64x32 w8 s2", "v3+dist+far64", [512, 384, 768, 512, 384]),
    ]
    chosen = {("_fwd_kernel", 64, "inference"): "64x64 w8 s2", ("_dq_kernel", 64, "inference"): "64x32 w8 s2"}
    lines = static.tile_costs(rows, chosen).splitlines()
    assert len(lines) == 2 + 4
    assert "| v3+dist+far64 | 512 · 384 · 768 · 512 · 384 | 32.0 · 48.0 · 96.0 · 32.0 · 48.0 |  |" in lines[3]
    # 256 threads over 4096 scores; the far loop after the block costs more: 520 / 400
    assert "| plain | 400 | 25.0 |  |" in lines[4]
    assert "| v3 | 500 · 1000 · 520 | 31.2 · 62.5 · 32.5 | 1.30 |" in lines[5]
    assert (
        "| _dq_kernel | 64 | 64x32 w8 s2 | 3.9.0 | v3 | 384 · 768 · 384 | 48.0 · 96.0 · 48.0 |  |" in lines[2]
    )


def test_static_report_compiles_the_wide_far_sets_for_the_kernels_that_take_them():
    """`triton_static.compiled_for`: the forward's wide far sets for the forward, dQ's (64 keys; 32 with
    dropout) for dQ, ``v3+dist+far64`` for both, none for dK/dV; the forward's own sets (plain attention, the
    tables cut) for it alone; every other set for all three."""
    static = _benchmark_module("triton_static")

    def kernels(feature):
        return {k for k in ("_fwd_kernel", "_dq_kernel", "_dkv_kernel") if static.compiled_for(feature, k)}

    assert kernels("v3+dist+far64") == {"_fwd_kernel", "_dq_kernel"}
    assert kernels("v3+dist+dropout+far32") == {"_dq_kernel"}
    assert kernels("packed+dist+far64") == kernels("plain") == kernels("v3+dist+edges") == {"_fwd_kernel"}
    assert kernels("v3+dist") == kernels("short+dist+dropout") == {"_fwd_kernel", "_dq_kernel", "_dkv_kernel"}
    assert static.FEATURES["v3+dist+dropout+far32"]["FAR_N"] == 32


@pytest.mark.long
@pytest.mark.parametrize("part", ["forward", "dq", "dkv", "tables"])
def test_kernels_compile_for_sm90(part):
    """The interpreter does not check what only the compiler does: build real cubins (no GPU needed). In four
    parts (the attention kernels' forward, their backward's two kernels, the product and fold kernels) that two
    workers share."""
    _compile_for_gpu("--part", part)


@pytest.mark.parametrize("setting", ["FORWARD_FAR_KEYS", "DQ_FAR_KEYS"])
def test_the_default_compile_check_builds_the_wide_far_blocks_each_kernel_runs(monkeypatch, setting):
    """With one kernel's far blocks widened (64 keys), the default compile check builds at head dim 128 the
    wide kernel that kernel runs (the forward 64 keys, dQ 32) and none of the other's, whose setting is off;
    with neither, no wide build there at all."""
    from pathlib import Path

    script = _script_module(Path(__file__).with_name("compile_triton_kernels.py"))

    def wide_builds():
        return {
            (name, flags["FAR_N"])
            for _, dim, name, _, flags, _, _ in script.builds(triton_backend.KERNEL_NAMES, False)
            if dim == 128 and "FAR_N" in flags
        }

    assert wide_builds() == set()
    monkeypatch.setattr(triton_backend, setting, 64)
    want = {"FORWARD_FAR_KEYS": ("_fwd_kernel", 64), "DQ_FAR_KEYS": ("_dq_kernel", 32)}[setting]
    assert wide_builds() == {want}


def test_the_default_compile_check_builds_what_the_backend_runs_by_default():
    """The default run's compile check builds at head dim 128 the default road's kernels (with and without
    dropout, long and short inputs), at head dim 64 every road the backend may take (with dropout the distance
    road's), and of the product and fold kernels the defaults at both; `--all` (the slow test) builds all of
    that and the rest."""
    from pathlib import Path

    script = _script_module(Path(__file__).with_name("compile_triton_kernels.py"))
    default, every = list(script.configurations(False)), list(script.configurations(True))
    assert all(c in every for c in default) and len(default) < len(every)
    wide = [flags for _, dim, flags, _, _ in default if dim == 128]
    assert {(f["DROPOUT"], f["FAR_TILES"]) for f in wide} == {
        (a, b) for a in (False, True) for b in (False, True)
    }
    assert all(f["DIST"] and f["GRAD_BANDS"] and not f["SKEW"] for f in wide)
    released = [flags for _, dim, flags, _, _ in default if dim == 64]
    assert {(f["IJ"], f["DIST"]) for f in released} == {(False, False), (True, False), (True, True)}
    assert not any(f["SKEW"] for f in released)
    assert {f["GRAD_BANDS"] for f in released if f["DROPOUT"] and f["DIST"]} == {False, True}
    assert all(f["DIST"] for f in released if f["DROPOUT"])
    assert script._default_product("columns", tma=False, wrap=True)
    assert not script._default_product("rows", tma=False, wrap=True)
    assert not script._default_product("columns", tma=True, wrap=True)
    assert script._default_fold(sums=True, pair=True, cells=False)
    assert not script._default_fold(sums=True, pair=False, cells=False)
    assert not script._default_fold(sums=True, pair=True, cells=True)


# ------------------------------------------------------------------------------------------------ slow / GPU
SLOW_GRID = {
    "n130_d64_heads2": Case(n=130, heads=2, dim=64),
    "packed_many": Case(n=130, cu_seqlens=(0, 1, 9, 40, 41, 100, 128)),
    "d128": Case(n=40, dim=128, rel=CLAMP),
}


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("part", ["dkv", "dq", "forward", "tables"])  # the longest first
def test_kernels_compile_for_gpu_all_configurations(part):
    """Every variant (`compile_triton_kernels.py --all`), in the default run's four parts: one process compiled
    them all in 16-24 minutes here, the slow run's longest test by far, with the other worker idle after its
    share; its parts run on both."""
    _compile_for_gpu("--all", "--part", part)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_GRID))
def test_matches_eager_slow(name):
    _compare(SLOW_GRID[name], torch.float32, DEVICE)


V3 = RelativeIndex(span=256, bucket_size=256, max_position=512)
V1 = RelativeIndex(span=512)
GPU_GRID = {
    "v3_n1100_d64": Case(n=1100, batch=2, heads=4, dim=64, rel=V3),
    "v3_padding": Case(n=777, batch=3, heads=2, dim=64, rel=V3, key_lengths=(777, 300, 1)),
    "v3_packed_causal": Case(n=1500, heads=2, dim=64, rel=V3, cu_seqlens=(0, 100, 700, 1400), causal=True),
    "v1_d128": Case(n=1100, heads=2, dim=128, rel=V1),
    "v3_d32_p2c_only": Case(n=600, heads=2, dim=32, rel=V3, terms=PositionTerms(c2p=False, p2c=True)),
    "v3_cross": Case(n=300, n_k=1200, heads=2, dim=64, rel=V3),
    # batch × heads above 65535, CUDA's limit on a grid's second axis: the kernels' grid is flat (short rows:
    # eager's float32 reference for 66 000 heads fits beside the other GPU tests' memory)
    "v3_batch_heads_66000": Case(n=16, batch=5500, heads=12, dim=64, rel=V3),
}


def _record_compiled(monkeypatch, loader: str = "_products") -> list:
    """The compiled kernels `triton_products`' launches return (``loader`` "_kernels": the attention kernels';
    a GPU's: the interpreter returns none), in launch order, from here on."""
    compiled = []
    products = getattr(triton_backend, loader)()

    class Launches:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: compiled.append(self.kernel[grid](*args, **kwargs)) or compiled[-1]

    class Recording:
        def __getattr__(self, name):
            return Launches(getattr(products, name))

    monkeypatch.setattr(triton_backend, loader, Recording)
    return compiled


# first of the GPU tests: a lease's `gpu-tests` step may be stopped before the end of the file
@pytest.mark.gpu
@pytest.mark.parametrize("launches", triton_backend.PRODUCT_LAUNCHES_MODES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [512, 2048])
def test_distance_product_kernel_builds_the_matmuls_table_gpu(monkeypatch, n, dtype, launches):
    """The distance tables at v3's size (batch·N = 4096, 12 heads, d 64; banded at 512, one band of 1217 cells
    at 2048: reach 512 + 96, the GPU's tiles' sides) from the product kernel (which ran: 16-bit tables; both in
    one launch with `PRODUCT_LAUNCHES` "one", one each with "two") and from cuBLAS's matmul: the same rounded
    values (float32 accumulation in either; the sums' order may differ in the last bit) and the zeros after
    them (one launch's buffer may hold more: `_product_buffers`), no cell left unwritten; the kernel as each
    launch compiled it stores 16 bytes at a time (``st.global.v4.b32``: the launch's pointers and integers
    aligned as `triton_products` needs)."""
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    monkeypatch.setattr(triton_backend, "PRODUCT_LAUNCHES", launches)
    compiled = _record_compiled(monkeypatch)
    c = Case(n=n, batch=4096 // n, heads=12, dim=64, rel=V3)
    q, k, _, pos_q, pos_k = (t.detach() for t in _inputs(c, dtype, "cuda"))
    sat = c.rel.saturation
    lo, hi, lut = triton_backend._lut(c.rel, sat, pos_k.shape[1], "cuda")
    tiles = [triton_backend.tiles_for(torch.device("cuda"), 64, name) for name in triton_backend.KERNEL_NAMES]
    layout = triton_backend._distance_layout(sat, n, n, tiles, n > sat, 64, c.batch)
    cells = triton_backend._distance_cells(lut, sat, *layout)
    tables = {}
    for product in triton_backend.DISTANCE_PRODUCT_MODES:
        monkeypatch.setattr(triton_backend, "DISTANCE_PRODUCT", product)
        tables[product] = triton_backend._distance_tables(
            triton_backend._per_head(q), triton_backend._per_head(k), pos_q[:, lo:hi], pos_k[:, lo:hi], cells,
            0.125 * triton_backend.LOG2E, (c.batch, n, n), layout[0],
        )  # fmt: skip
    # ROW and COL by the kernel, in one launch or two; the matmul's pass launched none
    assert len(compiled) == (1 if launches == "one" else 2)
    assert all("st.global.v4.b32" in kernel.asm["ptx"] for kernel in compiled)
    for got, want in zip(tables["triton"], tables["cublas"]):
        assert got.numel() >= want.numel() and not got.isnan().any()
        torch.testing.assert_close(got[: want.numel()].float(), want.float(), rtol=2**-7, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [512, 2048])
def test_gradient_stores_are_16_bytes_wide_gpu(monkeypatch, n):
    """v3 at N = 512 (batch·N = 4096, 12 heads, d 64, bfloat16: the tables and the gradients in 64-row bands)
    and 2048 (one band, far tiles) with `GRADIENT_STORES` "aligned" and "cells": both within the grid's
    bfloat16 tolerance of float32 eager, every cell written (the buffers start as NaN). Not bit for bit, nor
    to each other's rounding: "cells" sums a near tile's saturated dS in float32 before its one 16-bit store,
    "aligned" stores each pair's dS and the fold sums them (on an H200 at 2048, 2 of 3.1 million gradient
    values one bfloat16 step apart, 0.002 at a largest value of 0.63); the dQ and dK/dV kernels as these
    launches compiled them store more 16-byte vectors (``st.global.v4.b32``) with "aligned", and fewer 2-byte
    elements (``st.global.b16``): the dS stores go 16 bytes at a time."""
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    c = Case(n=n, batch=4096 // n, heads=12, dim=64, rel=V3)
    inputs = _inputs(c, torch.bfloat16, "cuda")
    outs, grads, stores, compiled = {}, {}, {}, _record_compiled(monkeypatch, "_kernels")
    for mode in triton_backend.GRADIENT_STORES_MODES:
        monkeypatch.setattr(triton_backend, "GRADIENT_STORES", mode)
        before = len(compiled)
        outs[mode], grads[mode] = _run(triton_attention, c, inputs, _geometry(c, "cuda"))
        assert len(compiled) == before + 3  # the forward, dQ, dK/dV
        ptx = [kernel.asm["ptx"] for kernel in compiled[-2:]]
        stores[mode] = [(p.count("st.global.v4.b32"), p.count("st.global.b16")) for p in ptx]
    grad_out = _grad_out(outs["cells"])
    ref = _run(eager_attention, c, _reference_inputs(inputs, "cuda"), _geometry(c, "cuda"), grad_out)
    for mode in triton_backend.GRADIENT_STORES_MODES:
        _assert_close(c, inputs, torch.bfloat16, (outs[mode], *grads[mode]), (ref[0], *ref[1]))
    for (wide, narrow), (wide_cells, narrow_cells) in zip(stores["aligned"], stores["cells"]):
        assert wide > wide_cells and narrow < narrow_cells, stores


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["both", "both, two launches", "both, sums by cell"])
@pytest.mark.parametrize("n", [512, 2048])
def test_fold_kernel_gives_the_gradients_of_the_matmul_folds_gpu(monkeypatch, n, kernels):
    """`FOLD_PRODUCT` and `FOLD_SUMS` "triton" at v3's N = 512 and 2048 (batch·N = 4096, 12 heads, d 64,
    bfloat16: 64-row bands, the sums reading q / k in place, and one band with far tiles): each fold kernel
    launched once for both sides (`FOLD_LAUNCHES` "one") or once a side ("two"), the sums by class or by cell
    (`FOLD_SUMS_REDUCTION`), reading the buffers 16 bytes at a time as these launches compiled them
    (``cp.async`` of 16 bytes or ``ld.global.v4``), and the call within the grid's bfloat16 tolerance of
    float32 eager, as the matmul folds are."""
    c = Case(n=n, batch=4096 // n, heads=12, dim=64, rel=V3)
    inputs = _inputs(c, torch.bfloat16, "cuda")
    _set_backend(monkeypatch, FOLD_MATMULS)
    want_out, want = _run(triton_attention, c, inputs, _geometry(c, "cuda"))
    _set_backend(monkeypatch, FOLD_KERNELS[kernels])
    compiled = _record_compiled(monkeypatch)  # the tables' product kernel's launches and the fold kernels'
    out, got = _run(triton_attention, c, inputs, _geometry(c, "cuda"))
    folds = [k.asm["ptx"] for k in compiled if "_fold_" in k.asm["ptx"]]
    assert len(folds) == (4 if kernels == "both, two launches" else 2), len(compiled)
    assert all("ld.global.v4" in p or re.search(r"cp\.async\.\w+\.shared\.global .*, 0x10", p) for p in folds)
    ref = _run(eager_attention, c, _reference_inputs(inputs, "cuda"), _geometry(c, "cuda"), _grad_out(out))
    _assert_close(c, inputs, torch.bfloat16, (out, *got), (ref[0], *ref[1]))
    _assert_close(c, inputs, torch.bfloat16, (want_out, *want), (ref[0], *ref[1]))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [512, 2048])
def test_product_kernel_variants_write_the_same_tables_gpu(monkeypatch, n):
    """The product kernel's variants at v3's size (as above, bfloat16), `PRODUCT_STORES` × `PRODUCT_PROGRAMS`
    × `PRODUCT_EDGES`: the tables of the default (pointers, a block a program, the rows' ends wrapped) bit for
    bit, no cell left unwritten; with "tma" on a GPU with the tensor-memory unit the inner blocks are stored
    through the descriptor (``cp.async.bulk.tensor`` in the launch's PTX), elsewhere the pointers serve; with
    "masked" the rows' ends are stored element by element (``st.global.b16``), with "wrap" never. With the
    pointers both tables come from one launch (`PRODUCT_LAUNCHES` "one"), with "tma" from one each; compared
    over the products and the zeros after them (one launch's buffer may hold more zeros)."""
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", True)
    c = Case(n=n, batch=4096 // n, heads=12, dim=64, rel=V3)
    q, k, _, pos_q, pos_k = (t.detach() for t in _inputs(c, torch.bfloat16, "cuda"))
    sat = c.rel.saturation
    lo, hi, lut = triton_backend._lut(c.rel, sat, pos_k.shape[1], "cuda")
    tiles = [triton_backend.tiles_for(torch.device("cuda"), 64, name) for name in triton_backend.KERNEL_NAMES]
    layout = triton_backend._distance_layout(sat, n, n, tiles, n > sat, 64, c.batch)
    cells = triton_backend._distance_cells(lut, sat, *layout)
    tables, compiled = {}, _record_compiled(monkeypatch)
    hopper = torch.cuda.get_device_capability()[0] >= 9
    variants = list(
        itertools.product(
            triton_backend.PRODUCT_STORES_MODES,
            triton_backend.PRODUCT_PROGRAMS_MODES,
            triton_backend.PRODUCT_EDGES_MODES,
        )
    )
    for stores, programs, edges in variants:
        monkeypatch.setattr(triton_backend, "PRODUCT_STORES", stores)
        monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", programs)
        monkeypatch.setattr(triton_backend, "PRODUCT_EDGES", edges)
        before = len(compiled)
        tables[stores, programs, edges] = triton_backend._distance_tables(
            triton_backend._per_head(q), triton_backend._per_head(k), pos_q[:, lo:hi], pos_k[:, lo:hi], cells,
            0.125 * triton_backend.LOG2E, (c.batch, n, n), layout[0],
        )  # fmt: skip
        launched = 1 if stores == "pointers" else 2  # ROW and COL, paired where they can be
        assert len(compiled) == before + launched
        tma = ["cp.async.bulk.tensor" in kernel.asm["ptx"] for kernel in compiled[before:]]
        assert tma == [stores == "tma" and hopper] * launched
        elements = ["st.global.b16" in kernel.asm["ptx"] for kernel in compiled[before:]]
        assert elements == [edges == "masked"] * launched
    default = tables["pointers", "blocks", "wrap"]
    for variant in variants[1:]:
        for got, want in zip(tables[variant], default):
            assert not got.isnan().any(), variant
            common = min(got.numel(), want.numel())  # the products and at least the slack's zeros
            assert torch.equal(got[:common], want[:common]), variant


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(GPU_GRID))
def test_matches_eager_gpu(name, dtype):
    _compare(GPU_GRID[name], dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("road", ROADS_AT_I_MINUS_J)
@pytest.mark.parametrize("n, batch", [(512, 4), (2048, 2)])
def test_backward_is_the_same_bit_for_bit_gpu(monkeypatch, n, batch, road):
    """Under PyTorch's deterministic algorithms (nothing on the path refuses them), three forward+backward passes
    on the same inputs (v3-base positions, 12 heads, bfloat16, no call plans) give the same output and gradients
    bit for bit. Without them CUDA's `index_add_` folds the tables' gradients into their rows (`_into_rows`), and
    two passes gave gradients a rounding apart on an H200."""
    monkeypatch.setattr(triton_backend, "CALL_PLANS", "off")
    _near_band(monkeypatch, road)
    c = Case(n=n, batch=batch, heads=12, dim=64, rel=V3)
    inputs, geom = _inputs(c, torch.bfloat16, "cuda"), _geometry(c, "cuda")
    with deterministic_algorithms(monkeypatch):
        first, *others = [_run(triton_attention, c, inputs, geom) for _ in range(3)]
    for other in others:
        _assert_same_bits(other, first)


# Real sizes with far tiles, for the forward-only settings' GPU tests: v3 at N = 2048, padded, packed and causal,
# head dim 128
GPU_FAR_CASES = {
    "v3_n2048": Case(n=2048, batch=2, heads=12, dim=64, rel=V3),
    "v3_padding": GPU_GRID["v3_padding"],
    "v3_packed_causal": GPU_GRID["v3_packed_causal"],
    "v3_d128": Case(n=1100, batch=2, heads=4, dim=128, rel=V3),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_FAR_CASES.values(), ids=GPU_FAR_CASES.keys())
def test_forward_tables_cut_to_the_saturation_give_the_same_results_gpu(monkeypatch, case):
    """`FORWARD_REACH = "saturation"` at real sizes (bfloat16, the GPU's tiles and product kernel): output and
    gradients those of the uncut tables bit for bit (PyTorch's deterministic algorithms on: the backward's
    folds otherwise add in the order CUDA's threads arrive), and within the grid's tolerance of eager."""
    inputs, geom = _inputs(case, torch.bfloat16, "cuda"), _geometry(case, "cuda")
    with deterministic_algorithms(monkeypatch):
        want = _run(triton_attention, case, inputs, geom)
        monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
        got = _run(triton_attention, case, inputs, geom)
    _assert_same_bits(got, want)
    _compare(case, torch.bfloat16, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("far_keys", [64, 128])
@pytest.mark.parametrize("case", GPU_FAR_CASES.values(), ids=GPU_FAR_CASES.keys())
def test_forward_far_tiles_in_wide_blocks_match_eager_gpu(monkeypatch, case, far_keys):
    """`FORWARD_FAR_KEYS` at real sizes (bfloat16, the GPU's tiles, whose vector loads take the wide blocks'
    alignment on trust): within the grid's tolerance of eager, with and without dropout, and with the forward's
    tables cut to the saturation too."""
    monkeypatch.setattr(triton_backend, "FORWARD_FAR_KEYS", far_keys)
    blocks = _far_blocks(monkeypatch)
    _compare(case, torch.bfloat16, "cuda")
    _compare_with_dropout(monkeypatch, case, torch.bfloat16, "cuda", 0.1)
    monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
    _compare(case, torch.bfloat16, "cuda")
    # every forward took wide blocks (none at head dim 128 with packed rows: not among the cases)
    wide = [far > block for block, far in blocks["_fwd_kernel"]]
    assert wide == [True, True, True], blocks


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_FAR_CASES.values(), ids=GPU_FAR_CASES.keys())
def test_dq_far_tiles_in_wide_blocks_match_eager_gpu(monkeypatch, case):
    """`DQ_FAR_KEYS` = 64 at real sizes (bfloat16, the GPU's tiles: 64 keys at head dim 64, 32 at 128; none with
    packed rows), with the forward's too: within the grid's tolerance of eager, with and without dropout."""
    monkeypatch.setattr(triton_backend, "DQ_FAR_KEYS", 64)
    blocks = _far_blocks(monkeypatch)
    _compare(case, torch.bfloat16, "cuda")
    _compare_with_dropout(monkeypatch, case, torch.bfloat16, "cuda", 0.1)
    monkeypatch.setattr(triton_backend, "FORWARD_FAR_KEYS", 64)
    _compare(case, torch.bfloat16, "cuda")
    # dQ took wide blocks but with packed rows, and with dropout at head dim 128 (`_far_keys`)
    wide = [far > block for block, far in blocks["_dq_kernel"]]
    packed = case.cu_seqlens is not None
    assert wide == [not packed, not packed and case.dim <= 64, not packed], blocks


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(20_000, 20_006))
def test_random_settings_at_real_sizes_match_eager_gpu(monkeypatch, seed):
    """The random settings (`_random_settings`, seeds of their own) at real sizes: one of `GPU_FAR_CASES` a seed
    (v3 tables and far tiles, padded, packed and causal, head dim 128), the GPU's tiles and compiled kernels
    (the product kernel's tensor-memory stores among the draws), against eager. What a lease runs before it
    makes an opt-in setting the default."""
    case = list(GPU_FAR_CASES.values())[seed % len(GPU_FAR_CASES)]
    _compare_under_random_settings(monkeypatch, seed, case, "cuda")


GPU_DISTANCE_I_MINUS_J = [name for name, c in GPU_GRID.items() if c.q_offset is None]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["v3_padding", "v3_packed_causal", "v1_d128", "v3_cross"])
def test_dropout_matches_eager_gpu(monkeypatch, name, dtype):
    """Compiled kernels at real sizes and their tiles (which differ per kernel): the mask the forward draws is
    the one the backward redraws."""
    _compare_with_dropout(monkeypatch, GPU_GRID[name], dtype, "cuda", 0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["v3_padding", "v3_packed_causal", "v3_cross"])
@pytest.mark.parametrize("road", ["skew", "distance"])
def test_near_band_roads_with_dropout_match_eager_gpu(monkeypatch, road, name, dtype):
    """The skewed kernels' own tiles (`SKEW_DROPOUT_TILES`), and the distance road at `DROPOUT_TILES`' (its
    reach sized for them), draw the mask the other kernels draw."""
    took_road = _on_road(monkeypatch, road)
    _compare_with_dropout(monkeypatch, GPU_GRID[name], dtype, "cuda", 0.1)
    took_road()


def _attend_v3(c: Case, geom: Geometry, *tensors, p: float = 0.1) -> torch.Tensor:
    return triton_attention(*tensors, c.rel, geom, scale=0.1, terms=c.terms, dropout_p=p)[0]


@pytest.mark.gpu
def test_dropout_follows_the_cuda_generator_gpu():
    """The seed is drawn from the CUDA generator, as the other backends' masks are: ``torch.cuda.manual_seed``
    alone (the CPU generator left running) reproduces a mask and another CUDA seed changes it."""
    c = GPU_GRID["v3_padding"]
    geom = _geometry(c, "cuda")
    inputs = _inputs(c, torch.bfloat16, "cuda")
    outs = []
    for seed in (5, 5, 6):
        torch.cuda.manual_seed(seed)
        with torch.no_grad():
            outs.append(_attend_v3(c, geom, *inputs))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


@pytest.mark.gpu
def test_dropout_draws_a_new_mask_at_every_cuda_graph_replay_gpu():
    """Under ``mode="reduce-overhead"`` the compiled call is captured in a CUDA graph and replayed: the seed,
    drawn into device memory inside the graph and read by the kernels, must differ at every replay (a seed
    passed as a number would be baked in: one mask for the whole run). Inductor must not skip the capture."""
    from torch._dynamo.utils import counters

    c = GPU_GRID["v3_padding"]
    geom = _geometry(c, "cuda")
    inputs = [t.detach() for t in _inputs(c, torch.bfloat16, "cuda")]  # v3: both position tables

    @torch.compile(mode="reduce-overhead")
    def attend(*tensors):
        return _attend_v3(c, geom, *tensors)

    skips = counters["inductor"]["cudagraph_skips"]
    outs = [attend(*inputs).clone() for _ in range(5)]  # warm-up, record, then replays
    assert counters["inductor"]["cudagraph_skips"] == skips, "Inductor did not capture a CUDA graph"
    plain = _attend_v3(c, geom, *inputs, p=0.0)
    for i in range(len(outs)):
        assert not torch.equal(outs[i], plain)
        for j in range(i):
            assert not torch.equal(outs[i], outs[j]), f"calls {j} and {i} drew the same dropout mask"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["v3_padding", "v3_packed_causal"])
def test_calls_never_wait_for_the_gpu_gpu(name):
    """After a first call (which compiles the kernels and copies the distance table to the GPU once), forward
    and backward queue their work without synchronising with the host (no ``.item()``, no copy from pageable
    host memory), so the host runs ahead of the GPU layer after layer."""
    c = GPU_GRID[name]
    geom = _geometry(c, "cuda")
    inputs = _inputs(c, torch.bfloat16, "cuda")
    grad_out = torch.randn(inputs[0].shape, device="cuda", dtype=torch.bfloat16)
    _run(triton_attention, c, inputs, geom, grad_out, dropout_p=0.1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, grads = _run(triton_attention, c, inputs, geom, grad_out, dropout_p=0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", GPU_DISTANCE_I_MINUS_J)
def test_skewed_kernels_match_eager_gpu(monkeypatch, name, dtype):
    _compare_skewed(monkeypatch, GPU_GRID[name], dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", GPU_DISTANCE_I_MINUS_J)
def test_tables_road_matches_eager_gpu(monkeypatch, name, dtype):
    """The tables road at real sizes and tiles, where the distance road applies: the default before 2026-11-26,
    which `test_matches_eager_gpu` took there then (it takes the distance road now); no distance table built."""
    _near_band(monkeypatch, "tables")
    reaches = _distance_reaches(monkeypatch)
    _compare(GPU_GRID[name], dtype, "cuda")
    assert reaches == [], reaches


# v3 inputs no longer than the saturation (512): no tile is far, the distance tables come in bands of the
# longest tile side (64 rows at head dim 64, 128 at 128)
GPU_BANDED_GRID = {
    "v3_n512_d64": Case(n=512, batch=4, heads=2, dim=64, rel=V3),
    "v3_padding_n480": Case(n=480, batch=3, heads=2, dim=64, rel=V3, key_lengths=(480, 200, 1)),
    "v3_packed_causal_n500": Case(n=500, heads=2, dim=64, rel=V3, cu_seqlens=(0, 100, 420, 500), causal=True),
    "v3_d128_n500": Case(n=500, heads=2, dim=128, rel=V3),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(GPU_BANDED_GRID))
def test_banded_distance_tables_match_eager_gpu(monkeypatch, name, dtype, dropout):
    """The banded distance tables at real sizes and the GPU's tiles, against eager (with dropout: times the
    kernels' mask); both directions read bands."""
    c = GPU_BANDED_GRID[name]
    _near_band(monkeypatch, "distance")
    bands = []
    real = triton_backend._distance_tables
    monkeypatch.setattr(triton_backend, "_distance_tables", lambda *a: bands.append(a[7]) or real(*a))
    if dropout:
        _compare_with_dropout(monkeypatch, c, dtype, "cuda", dropout)
    else:
        _compare(c, dtype, "cuda")
    assert len(bands) == 2 and bands[0] == bands[1] > 0, bands


@pytest.mark.gpu
def test_long_sequence_runs_gpu():
    """N = 65536 at batch 1 (v3 shape, bf16): forward and backward run, memory stays linear in N."""
    c = Case(n=65536, heads=12, dim=64, rel=V3)
    q, k, v, pos_q, pos_k = _inputs(c, torch.bfloat16, "cuda")
    torch.cuda.reset_peak_memory_stats()
    out, _ = triton_attention(q, k, v, pos_q, pos_k, c.rel, Geometry(), scale=scale_for(64, 3), terms=c.terms)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    assert torch.cuda.max_memory_allocated() < 16 * 2**30  # an N×N fp32 score matrix alone would be 192 GiB


# ------------------------------------------------------------------------------------------ GPU benchmark
def _benchmark_module(name: str = "attention_gpu"):
    from pathlib import Path

    return _script_module(Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py")


def _script_module(path):
    """The script at ``path`` (a benchmark, the compile check) imported as a module, its ``main`` not run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_gpu_benchmark_refuses_to_run_without_cuda(tmp_path, capsys):
    out = tmp_path / "attention_gpu.json"
    assert _benchmark_module().main(["--out", str(out)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    assert not out.exists()


def test_gpu_benchmark_rows_keep_their_settings_through_the_backward(monkeypatch):
    """A row that changes a setting of `triton_backend` has it in force for the whole timed call: autograd runs
    the backward after the forward has returned, and the backward reads `GRADIENT_STORES` (and the product and
    band settings) itself. Until 2026-11-27 the forward alone ran under the row's setting, so that rows of
    backward settings timed the default's backward."""
    bench = _benchmark_module()
    stores = _seen_in_a_rows_call(
        monkeypatch, bench.CELL_STORES_ROW, "_gradient_stride", lambda: triton_backend.GRADIENT_STORES
    )
    assert stores == ["cells"]  # the forward+backward call's backward, under the row's setting
    assert triton_backend.GRADIENT_STORES == "aligned"  # restored after it


def test_gpu_benchmark_deterministic_row_runs_its_backward_under_them(monkeypatch):
    """The row `triton (deterministic algorithms)` runs its whole forward+backward under PyTorch's deterministic
    algorithms (the backward's `_into_rows` sees them), and the setting is restored after it."""
    bench = _benchmark_module()
    modes = _seen_in_a_rows_call(
        monkeypatch, bench.DETERMINISTIC_ROW, "_into_rows", torch.are_deterministic_algorithms_enabled
    )
    assert modes and all(modes), modes
    assert not torch.are_deterministic_algorithms_enabled()


def test_gpu_benchmark_forward_reach_row_cuts_the_forward_tables(monkeypatch):
    """The row `triton (forward tables to the saturation)` makes its calls with `FORWARD_REACH` "saturation",
    and the setting is restored after it."""
    bench = _benchmark_module()
    modes = _seen_in_a_rows_call(
        monkeypatch, bench.FORWARD_REACH_ROW, "_cuts_forward_tables", lambda: triton_backend.FORWARD_REACH
    )
    assert modes and set(modes) == {"saturation"}, modes
    assert triton_backend.FORWARD_REACH == "tiles"


@pytest.mark.parametrize("keys", [64, 128, "reach"])
def test_gpu_benchmark_far_keys_rows_widen_the_forward_far_tiles(monkeypatch, keys):
    """The rows `triton (forward far tiles of 64 / 128 keys)` make their calls with `FORWARD_FAR_KEYS` set to
    that, the row with the tables cut too with 64 and `FORWARD_REACH` "saturation"; both restored after."""
    bench = _benchmark_module()
    row = bench.FAR_KEYS_REACH_ROW if keys == "reach" else bench.FAR_KEYS_ROWS[keys]
    settings = _seen_in_a_rows_call(
        monkeypatch,
        row,
        "_far_keys",
        lambda: (triton_backend.FORWARD_FAR_KEYS, triton_backend.FORWARD_REACH),
    )
    want = (64, "saturation") if keys == "reach" else (keys, "tiles")
    assert settings and set(settings) == {want}, settings
    assert (triton_backend.FORWARD_FAR_KEYS, triton_backend.FORWARD_REACH) == (None, "tiles")


def test_gpu_benchmark_wide_far_row_widens_the_forward_and_dq_far_tiles(monkeypatch):
    """The row `triton (forward and dQ far tiles of 64 keys)` makes its calls with `FORWARD_FAR_KEYS` and
    `DQ_FAR_KEYS` both 64 (its forward+backward asks for dQ's too), both restored after."""
    bench = _benchmark_module()
    settings = _seen_in_a_rows_call(
        monkeypatch,
        bench.WIDE_FAR_ROW,
        "_far_keys",
        lambda: (triton_backend.FORWARD_FAR_KEYS, triton_backend.DQ_FAR_KEYS),
    )
    assert settings and set(settings) == {(64, 64)}, settings
    assert (triton_backend.FORWARD_FAR_KEYS, triton_backend.DQ_FAR_KEYS) == (None, None)


def _seen_in_a_rows_call(monkeypatch, row: str, spied: str, observe) -> list:
    """What ``observe()`` gave at each call of `triton_backend`'s ``spied`` while the GPU benchmark timed its
    attention row ``row`` once (a forward, then a forward+backward; tiny shapes on the CPU)."""
    bench = _benchmark_module()
    args = bench.parse_args(["--smoke", "--sections", "attention"])
    args.tokens, args.heads, args.head_dim = 16, 2, 16
    seen, real = [], getattr(triton_backend, spied)

    def spy(*a, **kw):
        seen.append(observe())
        return real(*a, **kw)

    def once(fn, device):  # the timer: one call
        fn()
        return {"ms": 1.0, "peak_gib": None}

    monkeypatch.setattr(triton_backend, spied, spy)
    rows = bench._attention_rows(args, 16, "cpu", torch.float32, only=(row,), timer=once)
    assert [r["impl"] for r in rows] == [row]
    return seen


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
def test_dkv_kernel_at_the_gpu_suites_sweep_shapes_matches_eager(monkeypatch):
    """The GPU suite's dK/dV sweep (`gpu_suite.DKV_SWEEP_TILES`, the kernel alone at each shape) times shapes
    no test runs otherwise: at each, under the interpreter, a padded batch of 150 (saturation 16: at every shape
    far tiles before or after some program's keys, near ones, keys past the second row's end) on the default
    road gives eager's output and gradients, the position tables' too, and the dK/dV launch took the shape."""
    import importlib
    from pathlib import Path

    from debertakit.attention.triton_access import record_run

    # imported by name, as the scripts import each other (its dataclass needs its module in sys.modules)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    shapes = importlib.import_module("gpu_suite").DKV_SWEEP_TILES
    assert shapes[0] == "64x32w4s2" == str(triton_backend.GPU_TILES[64]["_dkv_kernel"]).replace(" ", "")
    for spec in shapes:
        tiles = Tiles.parse(spec)
        monkeypatch.setitem(triton_backend.TILE_OVERRIDES, "_dkv_kernel", tiles)
        with record_run("triton_kernels.py") as (_, launches):
            _compare(WIDE_FAR_CASES["n150_padded"], torch.float32, DEVICE)
        kwargs = launches["_dkv_kernel"][1]
        assert (kwargs["BLOCK_M"], kwargs["BLOCK_N"]) == (tiles.block_m, tiles.block_n), spec
        assert launches["_dq_kernel"][1]["BLOCK_N"] == 16  # the others keep theirs


def test_gpu_benchmark_tile_sweep_runs_each_shape(tmp_path):
    """The `tiles` section times the triton backend once per tile shape, with that shape in force."""
    import json

    out = tmp_path / "tiles.json"
    args = ["--smoke", "--sections", "tiles", "--lengths", "16", "--tiles", "32x16w4s1", "16x32w4s1"]
    bench = _benchmark_module()
    seen = []
    real = triton_backend.tiles_for

    def spy(*args):
        seen.append(real(*args))
        return seen[-1]

    triton_backend.tiles_for = spy
    try:
        assert bench.main([*args, "--out", str(out)]) == 0
    finally:
        triton_backend.tiles_for = real
    rows = json.loads(out.read_text())["rows"]
    plain = "triton (no position terms)"
    assert [r["impl"] for r in rows] == [
        "triton 32x16 w4 s1 tables",
        f"{plain} 32x16 w4 s1 tables",
        "triton 16x32 w4 s1 tables",
        f"{plain} 16x32 w4 s1 tables",
    ]  # fmt: skip
    assert all("fwd_ms" in r and "fwd_bwd_ms" in r for r in rows)
    # the swept shapes, and the default (16x16 off CUDA) that each row's output is checked against
    assert {(t.block_m, t.block_n) for t in seen} == {(32, 16), (16, 32), (16, 16)}
    assert all(r["max_diff_vs_triton"] < 2e-2 for r in rows[::2])
    assert all(r["max_diff_vs_sdpa"] < 2e-2 for r in rows[1::2])  # the plain rows: sdpa's function
    assert not triton_backend.TILE_OVERRIDES  # restored
    with pytest.raises(SystemExit, match="bad tile spec"):
        bench.parse_tiles("64x32")
    for bad in (["--tile-kernels", "_fwd"], ["--near-band", "near"]):  # named as the backend names them
        with pytest.raises(SystemExit, match="expected kernels of .*_dkv_kernel.* a road of .*skew-forward"):
            bench.main([*args, *bad, "--out", str(out)])


def test_gpu_benchmark_tile_sweep_of_one_kernel_on_the_skewed_road(tmp_path, monkeypatch):
    """``--tile-kernels`` gives the swept shape to those kernels only; ``--near-band skew`` sweeps the skewed
    kernels' tiles."""
    import json

    bench = _benchmark_module()
    road = triton_backend.NEAR_BAND  # the default, restored after the sweep
    seen = []
    real = triton_backend.tiles_for

    def spy(device, head_dim, kernel, dropout=False, skew=False):
        seen.append((kernel, skew, real(device, head_dim, kernel, dropout, skew)))
        return seen[-1][-1]

    monkeypatch.setattr(triton_backend, "tiles_for", spy)
    out = tmp_path / "tiles.json"
    args = ["--smoke", "--sections", "tiles", "--lengths", "16", "--tiles", "32x16w4s1"]
    args += ["--tile-kernels", "_dq_kernel", "--near-band", "skew", "--out", str(out)]
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    assert [r["impl"] for r in result["rows"]] == [
        "triton 32x16 w4 s1 skew (_dq_kernel)", "triton (no position terms) 32x16 w4 s1 skew (_dq_kernel)"
    ]  # fmt: skip
    assert result["units"] == ["tiles 32x16w4s1 skew (_dq_kernel) N=16"]
    swept = {(kernel, skew, (t.block_m, t.block_n)) for kernel, skew, t in seen}
    # the skewed road in both directions; the swept shape for the dQ kernel only (the default 16x16 off CUDA)
    assert ("_dq_kernel", True, (32, 16)) in swept and ("_dkv_kernel", True, (16, 16)) in swept
    assert ("_fwd_kernel", True, (16, 16)) in swept
    assert not any(kernel != "_dq_kernel" and shape == (32, 16) for kernel, _, shape in swept)
    # the triton row wholly on the skewed road, then the plain row, which has no near band, at the swept shape
    split = next(i for i, (_, skew, _) in enumerate(seen) if not skew)
    assert all(skew for _, skew, _ in seen[:split]) and not any(skew for _, skew, _ in seen[split:])
    assert ("_dq_kernel", False, (32, 16)) in swept
    assert triton_backend.NEAR_BAND == road and not triton_backend.TILE_OVERRIDES  # restored


def test_gpu_benchmark_tile_sweep_of_the_distance_tables_product(tmp_path, monkeypatch):
    """``--tile-kernels _distance_product_kernel`` gives the swept shape to the distance tables' product kernel
    only, on the distance road, as the tiles of the programs it runs (`triton_backend.PRODUCT_PROGRAMS`, set
    for the whole run by ``--product-programs``): `PRODUCT_COLUMN_TILES` and `PRODUCT_NARROW_COLUMN_TILES` (the
    swept shape at every table width) for the default's column loop,
    `PRODUCT_TILES` for a block a program, `PRODUCT_ROW_TILES` for the row loop; on another road it is
    refused."""
    import json

    bench = _benchmark_module()
    seen, real = [], triton_backend._kernel_band_product
    out = tmp_path / "tiles.json"
    args = ["--smoke", "--sections", "tiles", "--lengths", "16", "--tiles", "32x128w4s1", "--out", str(out)]
    args += ["--tile-kernels", "_distance_product_kernel", "--near-band", "distance"]
    monkeypatch.setattr(triton_backend, "PRODUCT_PROGRAMS", triton_backend.PRODUCT_PROGRAMS)  # restored after
    for programs, names in (
        (None, ("PRODUCT_COLUMN_TILES", "PRODUCT_NARROW_COLUMN_TILES")),
        ("blocks", ("PRODUCT_TILES",)),
        ("rows", ("PRODUCT_ROW_TILES",)),
    ):
        seen.clear()
        defaults = [getattr(triton_backend, name) for name in names]

        def spy(heads, table, cells, *a):
            # the tiles the kernel is launched with, at this table's width
            seen.append(triton_backend._product_tiles(cells.shape[1]))
            return real(heads, table, cells, *a)

        monkeypatch.setattr(triton_backend, "_kernel_band_product", spy)
        assert bench.main(args if programs is None else [*args, "--product-programs", programs]) == 0
        result = json.loads(out.read_text())
        assert [r["impl"] for r in result["rows"]] == [
            "triton 32x128 w4 s1 distance (_distance_product_kernel)"
        ]
        assert "fwd_ms" in result["rows"][0]
        assert result["environment"]["product_programs"] == (programs or "columns")
        assert seen and set(seen) == {Tiles(32, 128, 4, 1)}  # both tables, forward and backward
        assert [getattr(triton_backend, name) for name in names] == defaults  # restored
        assert not triton_backend.TILE_OVERRIDES
    bad = [*args[:-1], "tables"]
    with pytest.raises(SystemExit, match="kernels of the distance road, not of 'tables'"):
        bench.main(bad)


def test_gpu_benchmark_tile_sweep_of_the_fold_kernels(tmp_path, monkeypatch, capsys):
    """``--tile-kernels _fold_product_kernel _fold_sums_kernel`` gives the swept shape to the backward's fold
    kernels alone (`triton_backend.FOLD_TILES`, `FOLD_SUMS_TILES`), on the distance road at v3's buckets in
    bfloat16 (N = 64: tables and gradients in bands, at the odd row stride the fold kernels serve), restored
    after; the attention kernels keep their tiles; with ``--tile-timer profile`` the row's time is split by
    kernel (printed as the profile's); on another road it is refused."""
    import json

    bench = _benchmark_module()
    monkeypatch.setattr(bench, "PROFILE_CALLS", 1)  # one profiled call shows the split
    seen = []
    for name, tiles in (("_kernel_fold_product", "FOLD_TILES"), ("_kernel_fold_sums", "FOLD_SUMS_TILES")):
        real = getattr(triton_backend, name)

        def spy(*a, real=real, tiles=tiles):
            seen.append((tiles, getattr(triton_backend, tiles), dict(triton_backend.TILE_OVERRIDES)))
            return real(*a)

        monkeypatch.setattr(triton_backend, name, spy)
    defaults = triton_backend.FOLD_TILES, triton_backend.FOLD_SUMS_TILES
    out = tmp_path / "tiles.json"
    args = ["--smoke", "--sections", "tiles", "--lengths", "64", "--tiles", "32x128w4s3", "--out", str(out)]
    args += ["--tile-timer", "profile"]
    args += ["--tile-kernels", "_fold_product_kernel", "_fold_sums_kernel", "--near-band", "distance"]
    assert bench.main(args) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["impl"] == "triton 32x128 w4 s3 distance (_fold_product_kernel, _fold_sums_kernel)"
    assert row["fwd_bwd_kernels_ms"] and "fwd_bwd_queued_ms" not in row, row
    assert "kernel time per call" in capsys.readouterr().out
    # each kernel once for both tables (c2p, p2c: `FOLD_LAUNCHES` "one") in each profiled forward+backward, at
    # the swept shape, the attention kernels at theirs
    assert {(t, tiles) for t, tiles, _ in seen} == {
        (t, Tiles(32, 128, 4, 3)) for t in ("FOLD_TILES", "FOLD_SUMS_TILES")
    }
    assert not any(overrides for *_, overrides in seen)
    launches = collections.Counter(t for t, *_ in seen)
    assert launches == {"FOLD_TILES": 1, "FOLD_SUMS_TILES": 1}  # both tables' folds in one launch each
    assert (triton_backend.FOLD_TILES, triton_backend.FOLD_SUMS_TILES) == defaults  # restored
    with pytest.raises(SystemExit, match="kernels of the distance road, not of 'tables'"):
        bench.main([*args[:-1], "tables"])


def test_gpu_benchmark_graph_row_runs_its_calls_off_cuda():
    """The row ``triton (CUDA graph)`` (`attention_gpu._Replayed`): off CUDA, in smoke form, every call runs the
    function itself."""
    calls = []
    replayed = _benchmark_module()._Replayed(lambda: calls.append(1), "cpu")
    for _ in range(3):
        replayed()
    assert len(calls) == 3 and replayed.graph is None


@pytest.mark.gpu
def test_gpu_benchmark_graph_row_replays_one_capture_gpu():
    """On CUDA `attention_gpu._Replayed` warms the function up three times on a side stream, captures it once
    at the first call and replays the graph at every call: the host runs the function four times however many
    calls follow, and every replay does its work on the GPU (three warm-up adds, then one per call)."""
    x = torch.zeros(4, device="cuda")
    calls = []

    def fn():
        calls.append(1)
        x.add_(1)

    replayed = _benchmark_module()._Replayed(fn, "cuda")
    for _ in range(5):
        replayed()
    torch.cuda.synchronize()
    assert len(calls) == 4 and x.tolist() == [8.0] * 4


def test_gpu_benchmark_dropout_section_rows(tmp_path):
    """The `dropout` section times the backends that have dropout, with it on (sdpa as the ceiling), of the rows
    ``--impls`` names (here not the backend's settings' rows, each seconds under the interpreter)."""
    import json

    out = tmp_path / "dropout.json"
    args = ["--smoke", "--sections", "dropout", "--lengths", "16", "--dropout", "0.2", "--out", str(out)]
    named = ["triton", "eager", "flex", "triton skew", "triton skew-forward", "sdpa (no position terms)"]
    named += ["triton (no position terms)", "triton (tables kept)"]
    assert _benchmark_module().main([*args, "--impls", *named]) == 0
    rows = json.loads(out.read_text())["rows"]
    impls = {r["impl"] for r in rows}
    assert {"triton +dropout 0.2", "eager +dropout 0.2", "sdpa (no position terms) +dropout 0.2"} <= impls
    assert {"triton skew +dropout 0.2", "triton skew-forward +dropout 0.2"} <= impls  # both skewed roads
    assert "triton (tables kept) +dropout 0.2" in impls  # a setting's row, as the others
    assert "chunked +dropout 0.2" not in impls  # not named
    assert not any(r["impl"].startswith("flex") for r in rows)  # flex has no dropout: not timed
    # the plain row runs in the targets' setting only
    assert not any(r["impl"].startswith("triton (no position terms)") for r in rows)
    assert all(r["section"] == "dropout" and "fwd_bwd_ms" in r for r in rows)


def _fake_flashdeberta(monkeypatch, swap_tables: bool) -> None:
    """A stand-in for flashdeberta 0.0.8's entry point with its documented meaning (pos_key_layer: the c2p
    table, (1, H, 2·buckets, D)), computed by `eager`; ``swap_tables`` reads the two tables the other way."""
    import types

    def flash_attention_with_disentangled(
        q, k, v, seq_lengths, pos_key_layer, pos_query_layer, causal=False, sm_scale=None,
        position_buckets=0, max_relative_distance=0,
    ):  # fmt: skip
        rel = RelativeIndex(
            span=position_buckets, bucket_size=position_buckets, max_position=max_relative_distance
        )
        pos_q, pos_k = pos_query_layer[0], pos_key_layer[0]
        if swap_tables:
            pos_q, pos_k = pos_k, pos_q
        return eager_attention(q, k, v, pos_q, pos_k, rel, Geometry(), scale=sm_scale, terms=PositionTerms())[
            0
        ]

    leaf = types.ModuleType("flashdeberta.ops.flash_attention")
    leaf.flash_attention_with_disentangled = flash_attention_with_disentangled
    monkeypatch.setitem(sys.modules, "flashdeberta", types.ModuleType("flashdeberta"))
    monkeypatch.setitem(sys.modules, "flashdeberta.ops", types.ModuleType("flashdeberta.ops"))
    monkeypatch.setitem(sys.modules, "flashdeberta.ops.flash_attention", leaf)


def test_flashdeberta_through_the_benchmark_adapter_matches_eager(monkeypatch):
    """The real package where it is installed (not a dependency): the adapter's call computes eager's function."""
    pytest.importorskip("flashdeberta")
    if DEVICE == "cpu":  # its launch wraps `torch.cuda.device`; under the interpreter there is none
        import contextlib

        monkeypatch.setattr(torch.cuda, "device", lambda *a, **k: contextlib.nullcontext())
    c = Case(n=300, heads=2, dim=16, rel=V3)
    q, k, v, pos_q, pos_k = _inputs(c, torch.float32, DEVICE)
    scale = scale_for(16, 3)
    with torch.no_grad():
        got = _benchmark_module()._flashdeberta(q, k, v, pos_q, pos_k, scale)()
        want, _ = eager_attention(q, k, v, pos_q, pos_k, c.rel, Geometry(), scale=scale, terms=c.terms)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("swap_tables", [False, True])
def test_gpu_benchmark_checks_each_row_against_triton(monkeypatch, swap_tables):
    """Rows computing the same function carry their largest difference from `triton`: the flashdeberta adapter
    passes the arguments as documented, and a competitor that computes something else shows it."""
    bench = _benchmark_module()
    _fake_flashdeberta(monkeypatch, swap_tables)
    args = bench.parse_args(["--smoke"])
    args.tokens, args.heads, args.head_dim = 40, 2, 16
    only = ("triton", "eager", "flashdeberta", "sdpa (no position terms)", bench.PLAIN_ROW)
    rows = {r["impl"]: r for r in bench._attention_rows(args, 40, "cpu", torch.float32, only=only)}
    assert set(rows) == set(only)
    assert rows["triton"]["max_diff_vs_triton"] == 0.0 and rows["eager"]["max_diff_vs_triton"] < 1e-5
    assert "max_diff_vs_triton" not in rows["sdpa (no position terms)"]  # another function
    assert (rows["flashdeberta"]["max_diff_vs_triton"] > 2e-2) == swap_tables
    flagged = [v for v in bench.verdicts(list(rows.values())) if "output differs from triton's" in v]
    assert [v.split()[0] for v in flagged] == (["flashdeberta"] if swap_tables else [])
    # our kernels without position terms compute sdpa's function, and are checked against it
    plain = rows[bench.PLAIN_ROW]
    assert "max_diff_vs_triton" not in plain and plain["max_diff_vs_sdpa"] < 1e-5
    assert plain["max_diff_vs_sdpa"] < rows["triton"].get(
        "max_diff_vs_sdpa", 1.0
    )  # (triton is not checked so)
    off = {**plain, "max_diff_vs_sdpa": 0.5}
    assert any("output differs from sdpa's" in v for v in bench.verdicts([off]))


def test_gpu_benchmark_times_calls_queued_back_to_back(monkeypatch, capsys):
    """The queued time: batches of calls with no wait between them, timed by events around each batch (here
    a clock each call advances by 2 ms), the median per call; fewer calls a batch for longer calls, none over
    `QUEUED_UP_TO_MS`. It becomes the rows' queued TFLOP/s, printed beside the per-call rate and the verdicts'
    (which judge the per-call one). Beside it the host's time to issue a call (here 0.5 ms a call on the host's
    clock), in the rows and the table."""
    bench = _benchmark_module()
    clock, calls, host = [0.0], [], [0.0]

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.at = clock[0]

        def elapsed_time(self, end):
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def call():
        calls.append(True)
        clock[0] += 2.0 + 0.5 * (len(calls) == 1)  # the first call is slower: the median leaves it out
        host[0] += 5e-4  # seconds

    def host_clock():
        return host[0]

    assert bench.queued_ms(call, per_call_ms=0.1, clock=host_clock) == pytest.approx((2.0, 0.5))
    assert len(calls) == bench.QUEUED_REPEATS * bench.QUEUED_CALLS
    calls.clear()
    assert bench.queued_ms(call, 40.0, host_clock) == pytest.approx((2.0, 0.5))
    assert len(calls) == bench.QUEUED_REPEATS * 2
    calls.clear()
    assert bench.queued_ms(call, per_call_ms=bench.QUEUED_UP_TO_MS + 1) is None and not calls

    flops = 3.5 * bench.attention_flops(8, 12, 2048, 64)
    rate = bench._rate("fwd_bwd", {"ms": 5.0, "queued_ms": 4.5, "host_ms": 0.8, "peak_gib": 1.0}, flops)
    assert rate["fwd_bwd_tflops"] == round(flops / 5e-3 / 1e12, 2) and rate["fwd_bwd_queued_ms"] == 4.5
    assert rate["fwd_bwd_queued_tflops"] == round(flops / 4.5e-3 / 1e12, 2) and rate["fwd_bwd_host_ms"] == 0.8
    assert "fwd_bwd_queued_tflops" not in bench._rate(
        "fwd_bwd", {"ms": 5.0, "queued_ms": None, "host_ms": None, "peak_gib": None}, 1
    )
    row = dict(section="attention", impl="triton", n=2048, batch=8, fwd_tflops=80.0, fwd_queued_tflops=90.0)
    row.update(rate)
    lines = bench.verdicts([row])
    assert "triton N=2048: forward 80.0 TFLOP/s per call, 90.0 queued (target >= 100): MISSED" in lines
    assert any(f"forward+backward {rate['fwd_bwd_tflops']} TFLOP/s per call, " in v for v in lines)
    bench.print_table([row])
    printed = capsys.readouterr().out
    assert f"90.0 / {rate['fwd_bwd_queued_tflops']}" in printed and " / 0.8 " in printed


def test_gpu_benchmark_starts_each_length_with_an_empty_compile_cache(monkeypatch):
    """Compiled `flex` compiles every shape anew: the lengths before would use up dynamo's recompile limit, after
    which it runs unfused (`flex._flex_fn`), so each length's rows start from an empty cache."""
    bench = _benchmark_module()
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(True))
    args = bench.parse_args(["--smoke"])
    args.tokens, args.heads, args.head_dim = 32, 2, 16
    for n in (16, 32):
        bench._attention_rows(args, n, "cpu", torch.float32, only=("sdpa (no position terms)",))
    assert len(resets) == 2


def test_gpu_benchmark_records_a_row_that_cannot_run_and_goes_on():
    """A kernel that does not compile here or needs more shared memory than the GPU has is that row's error,
    not the end of the run."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    bench = _benchmark_module()

    def fails(error):
        def run():
            raise error

        return run

    too_big = OutOfResources(262144, 232448, "shared memory")
    assert bench.bench(fails(too_big), "cpu")["error"].startswith("OutOfResources: out of resource: shared")
    assert bench._max_diff(fails(CompilationError("", None, "unsupported")), torch.ones(2)) is None
    with pytest.raises(KeyboardInterrupt):  # not a row's failure
        bench.bench(fails(KeyboardInterrupt()), "cpu")


def test_gpu_benchmark_records_the_versions_of_what_it_compares():
    import importlib.metadata

    pytest.importorskip("flashdeberta")  # a package without __version__
    env = _benchmark_module().environment("cpu")
    assert env["flashdeberta"] == importlib.metadata.version("flashdeberta")
    assert env["triton"] == pytest.importorskip("triton").__version__ and env["torch"] == torch.__version__


def test_gpu_benchmark_output_check_names_what_it_cannot_compare():
    bench = _benchmark_module()
    ref = torch.ones(2, 3)
    assert bench._max_diff(lambda: torch.full((2, 3), float("nan")), ref) == "not finite"
    assert bench._max_diff(lambda: torch.ones(3, 2), ref) == "shape (3, 2), expected (2, 3)"
    assert bench._max_diff(lambda: torch.ones(2, 3) * 1.5, 2 * ref) == 0.25
    assert bench._max_diff(lambda: (_ for _ in ()).throw(RuntimeError("no kernel")), ref) is None


def test_gpu_benchmark_combines_sections_measured_apart(tmp_path, capsys):
    import json

    bench = _benchmark_module()
    env = dict(date="d", device="NVIDIA H100", torch="2.11", triton="3.6.0", cuda="13.0", python="3.12.3")

    def part(name, env, rows):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(dict(environment=env, smoke=False, targets="t", verdicts=[], rows=rows)))
        return path

    triton = dict(section="attention", impl="triton", n=2048, batch=8, fwd_tflops=120.0, fwd_bwd_tflops=70.0)
    sdpa = dict(section="attention", impl="sdpa (no position terms)", n=2048, batch=8, fwd_tflops=400.0)
    long = dict(section="long", impl="triton", n=65536, batch=1, fwd_bwd_ms=1.0)
    a, b = part("a", env, [triton, sdpa]), part("b", {**env, "date": "e"}, [long])
    out = tmp_path / "all.json"
    assert bench.main(["--combine", str(a), str(b), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["rows"] == [triton, sdpa, long] and result["environment"]["combined_from"] == ["d", "e"]
    assert "triton N=2048: forward 120.0 TFLOP/s (target >= 100): met" in result["verdicts"]
    assert "triton N=2048: forward+backward 70.0 TFLOP/s (target >= 75): MISSED" in result["verdicts"]
    assert "triton N=2048: forward 30% of sdpa (target >= 40%): MISSED" in result["verdicts"]
    assert "triton long N=65536 batch 1: runs" in result["verdicts"]
    with pytest.raises(
        SystemExit, match="measurement .*'attention', 'impl': 'triton', 'n': 2048.* is in both"
    ):
        bench.main(["--combine", str(a), str(a), "--out", str(out)])
    longer = part("d", env, [{**long, "n": 32768}])  # one section split by length joins
    assert bench.main(["--combine", str(a), str(b), str(longer), "--out", str(out)]) == 0
    assert "triton long N=32768 batch 1: runs" in json.loads(out.read_text())["verdicts"]
    elsewhere = part("c", {**env, "device": "NVIDIA H200"}, [long])
    with pytest.raises(SystemExit, match="measured elsewhere.*'NVIDIA H100', 'NVIDIA H200'"):
        bench.main(["--combine", str(a), str(elsewhere), "--out", str(out)])


def _unit_rows(calls: list, clock: list | None = None, stop_at: int | None = None):
    """A stand-in for `_attention_rows`: one row per length, recorded in ``calls``; each advances ``clock``
    by 10 s; ``stop_at``: the length at which the run is interrupted."""

    def rows(args, n, device, dtype, only=None, dropout_p=0.0):
        if n == stop_at:
            raise KeyboardInterrupt
        calls.append(n)
        if clock is not None:
            clock[0] += 10.0
        return [dict(section="attention", impl="triton", n=n, batch=1, fwd_ms=1.0, fwd_bwd_ms=2.0)]

    return rows


def test_gpu_benchmark_stops_at_its_budget_and_resumes(tmp_path, monkeypatch):
    """``--budget-s`` starts no unit after the budget and leaves the rest pending (exit 3); ``--resume`` measures
    only those, keeping the earlier rows."""
    import json
    import types

    bench = _benchmark_module()
    calls, clock = [], [0.0]
    monkeypatch.setattr(bench, "_attention_rows", _unit_rows(calls, clock))
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    out = tmp_path / "a.json"
    args = ["--smoke", "--sections", "attention", "--lengths", "16", "33", "--out", str(out)]
    assert bench.main([*args, "--budget-s", "5"]) == 3  # N=16 starts at 0 s and ends at 10 s: N=33 waits
    part = json.loads(out.read_text())
    assert calls == [16] and [r["n"] for r in part["rows"]] == [16]
    assert (part["complete"], part["units"], part["pending"]) == (
        False,
        ["attention N=16"],
        ["attention N=33"],
    )
    narrower = tmp_path / "narrower.json"  # a continuation that leaves out what is pending leaves it pending
    narrow = ["--smoke", "--sections", "attention", "--lengths", "16", "--out", str(narrower)]
    assert bench.main([*narrow, "--resume", str(out)]) == 3
    assert json.loads(narrower.read_text())["pending"] == ["attention N=33"] and calls == [16]
    assert bench.main([*args, "--resume", str(out)]) == 0
    whole = json.loads(out.read_text())
    assert calls == [16, 33] and [r["n"] for r in whole["rows"]] == [16, 33]
    assert (whole["complete"], whole["units"], whole["pending"]) == (
        True,
        ["attention N=16", "attention N=33"],
        [],
    )
    assert whole["environment"]["resumed_from"] == part["environment"]["date"]
    assert bench.main([*args, "--budget-s", "0"]) == 3  # nothing starts, everything pending
    assert json.loads(out.read_text())["pending"] == ["attention N=16", "attention N=33"]
    assert calls == [16, 33]


def test_gpu_benchmark_keeps_what_it_measured_when_interrupted(tmp_path, monkeypatch):
    import json

    bench = _benchmark_module()
    calls = []
    monkeypatch.setattr(bench, "_attention_rows", _unit_rows(calls, stop_at=33))
    out = tmp_path / "a.json"
    args = ["--smoke", "--sections", "attention", "--lengths", "16", "33", "64", "--out", str(out)]
    with pytest.raises(KeyboardInterrupt):
        bench.main(args)
    part = json.loads(out.read_text())
    assert [r["n"] for r in part["rows"]] == [16] and part["units"] == ["attention N=16"]
    assert part["complete"] is False and part["pending"] == ["attention N=33", "attention N=64"]
    part["environment"]["device"] = "NVIDIA H200"  # measured elsewhere: not continued here
    out.write_text(json.dumps(part))
    with pytest.raises(SystemExit, match="measured elsewhere than this run.*NVIDIA H200"):
        bench.main([*args, "--resume", str(out)])
    with pytest.raises(SystemExit, match="no such results file"):
        bench.main([*args, "--resume", str(tmp_path / "missing.json")])
    del part["units"]
    out.write_text(json.dumps(part))
    with pytest.raises(SystemExit, match="records no units"):
        bench.main([*args, "--resume", str(out)])


def test_gpu_benchmark_relates_long_lengths_and_pending_units_across_files(tmp_path):
    """Peak memory per token is relative to the shortest length in all rows (resumed or combined), and a unit
    left pending by one part but measured by another is not pending in the whole."""
    import json

    bench = _benchmark_module()
    env = dict(date="d", device="NVIDIA H100", torch="2.11", triton="3.6.0", cuda="13.0", python="3.12.3")

    def long(n, peak):
        return dict(section="long", impl="triton", n=n, batch=1, fwd_bwd_ms=1.0, fwd_bwd_peak_gib=peak)

    def part(name, rows, units, pending):
        path = tmp_path / f"{name}.json"
        path.write_text(
            json.dumps(dict(environment=env, smoke=False, rows=rows, units=units, pending=pending))
        )
        return path

    a = part("a", [long(32768, 2.2)], ["long N=32768"], ["long N=16384"])
    b = part("b", [long(16384, 1.0)], ["long N=16384"], [])
    out = tmp_path / "all.json"
    assert bench.main(["--combine", str(a), "--out", str(out)]) == 0
    alone = json.loads(out.read_text())
    assert (alone["complete"], alone["pending"]) == (False, ["long N=16384"])
    assert "peak_per_token_vs_shortest" not in alone["rows"][0]
    assert bench.main(["--combine", str(a), str(b), "--out", str(out)]) == 0
    whole = json.loads(out.read_text())
    assert (whole["complete"], whole["pending"]) == (True, [])
    assert whole["rows"][0]["peak_per_token_vs_shortest"] == 1.1  # (2.2 / 32768) / (1.0 / 16384)
    assert "peak_per_token_vs_shortest" not in whole["rows"][1]
    assert (
        "triton long N=32768 batch 1: runs; peak memory per token 1.1x that of the shortest length"
        in (whole["verdicts"])
    )


@pytest.mark.slow
def test_gpu_benchmark_smoke_mode_writes_its_table(tmp_path):
    import json

    out = tmp_path / "smoke.json"
    args = ["--smoke", "--sections", "attention", "long", "--lengths", "16", "--long-lengths", "16", "32"]
    assert _benchmark_module().main([*args, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    impls = {r["impl"] for r in rows if r["section"] == "attention"}
    assert {"triton", "triton skew-forward", "triton skew", "eager", "sdpa (no position terms)"} <= impls
    assert "triton (no position terms)" in impls
    timed = ("triton", "triton skew-forward", "triton skew", "eager", "triton (no position terms)")
    assert all("fwd_ms" in r and "fwd_bwd_ms" in r for r in rows if r["impl"] in timed)
    long = [r for r in rows if r["section"] == "long" and r["impl"] == "triton"]
    assert [r["batch"] for r in long] == [1, 1] and "peak_per_token_vs_shortest" not in long[0]
    assert any(v.startswith("triton long N=32 batch 1: runs") for v in result["verdicts"])
    assert any(v.startswith("triton skew-forward long N=32 batch 1: runs") for v in result["verdicts"])
    assert any(v.startswith("triton skew long N=32 batch 1: runs") for v in result["verdicts"])


def test_gpu_benchmark_profile_splits_time_by_kernel_and_impls_picks_rows(tmp_path, capsys, monkeypatch):
    """``--sections profile``: each road's `triton` row, the default road with cuBLAS's distance tables, with
    the product kernel's two variants, with its rows' ends masked, with its gradients in one band and stored by
    cell, and the kernels without position terms, with its time split by kernel (summing to the row's time);
    ``--impls`` keeps only the named rows of ``attention``. Three of the profile's rows are profiled here, one
    of each kind the split meets (the default, a setting of the backend changed for the call, the kernels
    without position terms): under the interpreter each row takes seconds, and the split is one code for all."""
    import json

    out = tmp_path / "profile.json"
    args = ["--smoke", "--sections", "attention", "profile", "--lengths", "16", "--impls", "triton"]
    bench = _benchmark_module()
    bench.PROFILE_CALLS = 1  # the split is what is checked; one profiled call (after the warm-up) shows it
    here = ("triton", bench.ONE_BAND_GRADIENTS_ROW, bench.PLAIN_ROW)
    asked, rows_of = [], bench._attention_rows

    def three_of_the_profiles_rows(*a, **kw):
        if kw.get("timer") is bench.profile_kernels:
            asked.extend(kw["only"])
            kw["only"] = tuple(row for row in kw["only"] if row in here)
        return rows_of(*a, **kw)

    monkeypatch.setattr(bench, "_attention_rows", three_of_the_profiles_rows)
    assert bench.main([*args, "--out", str(out)]) == 0
    assert asked == [
        "triton",  # the default road (distance): its twin row "triton distance" is not run again
        "triton tables",
        "triton skew-forward",
        "triton skew",
        "triton (cuBLAS tables)",
        "triton (product TMA stores)",
        "triton (product row loop)",
        "triton (product block programs)",
        "triton (product edges masked)",
        "triton (tables in two launches)",
        "triton (folds in two launches)",
        "triton (fold sums by cell)",
        "triton (gradients in one band)",
        "triton (gradient stores by cell)",
        "triton (tables kept)",
        "triton (fold matmuls)",
        "triton (fold sums by matmul)",
        "triton (no position terms)",
    ]
    assert set(asked) <= set(bench.attention_row_names())  # each a row the section builds
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows if r["section"] == "attention"] == ["triton"]
    profiled = [r for r in rows if r["section"] == "profile"]
    assert [r["impl"] for r in profiled] == list(here)
    for r in profiled:
        for prefix in ("fwd", "fwd_bwd"):
            kernels = r[f"{prefix}_kernels_ms"]
            assert kernels and all(ms > 0 for ms in kernels.values())
            assert abs(sum(kernels.values()) - r[f"{prefix}_ms"]) < 1e-3 * len(kernels)
    assert "kernel time per call" in capsys.readouterr().out


def _benchmark_with_two_models(monkeypatch):
    """The GPU benchmark with two of its models, ours on `eager` and Hugging Face's (the interpreted triton
    model takes half a minute here; the machinery is the same)."""
    bench = _benchmark_module()
    every = bench._models
    monkeypatch.setattr(
        bench, "_models", lambda *a, **k: [m for m in every(*a, **k) if m[0] in ("ours/eager", "hf eager")]
    )
    return bench


def test_gpu_benchmark_latency_section_splits_a_batch_1_forward_by_operator(tmp_path, monkeypatch, capsys):
    """``--sections latency``: each model's batch-1 forward under torch.profiler, its host time per call summed
    over the operators and the operators of most host time (on CPU no GPU columns)."""
    import json

    bench = _benchmark_with_two_models(monkeypatch)
    layer_lengths = []  # the attention layer's unit, at the smoke run's length (its rows: the test below)
    monkeypatch.setattr(bench, "_layer_latency", lambda args, n, device, dtype: layer_lengths.append(n) or [])
    out = tmp_path / "latency.json"
    assert bench.main(["--smoke", "--sections", "latency", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ["ours/eager", "hf eager"] and layer_lengths == [16]
    for r in rows:
        assert r["section"] == "latency" and r["batch"] == 1 and r["gpu_ms"] is None
        assert r["host_ms"] >= max(r["host_ops"].values()) > 0
        assert any("addmm" in op or "linear" in op for op in r["host_ops"])  # the projections
        assert r["python_ms"] >= sum(r["python_funcs"].values()) > 0
        assert list(r["python_funcs"].values()) == sorted(r["python_funcs"].values(), reverse=True)
        assert any("linear" in name for name in r["python_funcs"])  # torch's builtin, by its name
        assert r["syncs"] is None  # counted on CUDA only
    ours, hf = (list(r["python_funcs"]) for r in rows)  # each model's own Python among the largest
    assert any(f.startswith(("layers.py", "eager.py")) for f in ours)
    assert any(f.startswith("modeling_deberta_v2.py") for f in hf)
    assert "host time by operator" in capsys.readouterr().out


def test_gpu_benchmark_latency_section_splits_the_attention_layers_training_call(monkeypatch):
    """``--sections latency`` also profiles the attention layer's `triton` row (`LATENCY_LAYER`): its forward, then
    its forward+backward, the backward's work among the operators (the eager calls' autograd function) and more
    host time than the forward's, each split by Python function too."""
    bench = _benchmark_module()
    monkeypatch.setattr(bench, "PROFILE_CALLS", 1)  # (the interpreter runs the kernels)
    args = bench.parse_args(["--smoke", "--sections", "latency"])
    args.tokens, args.heads, args.head_dim = 32, 2, 16
    rows = bench._layer_latency(args, 16, "cpu", torch.float32)
    assert [(r["impl"], r["mode"], r["n"], r["batch"]) for r in rows] == [
        (bench.LATENCY_LAYER, "forward", 16, 2),
        (bench.LATENCY_LAYER, "forward+backward", 16, 2),
    ]
    forward, training = rows
    assert any("Backward" in op for op in training["host_ops"]) and training["host_ms"] > forward["host_ms"]
    assert not any("Backward" in op for op in forward["host_ops"])
    assert all(r["python_ms"] >= sum(r["python_funcs"].values()) > 0 for r in rows)
    assert all(r["gpu_ms"] is None and r["syncs"] is None for r in rows)  # (CUDA only)


def test_gpu_benchmark_model_section_times_our_batch_1_forward_as_a_cuda_graph_too(tmp_path, monkeypatch):
    """``--sections model``: our model's rows add the batch-1 forward through `CudaGraphModel` (on the CPU its
    padded bucket without a graph), Hugging Face's do not."""
    import json

    bench = _benchmark_with_two_models(monkeypatch)
    out = tmp_path / "model.json"
    assert bench.main(["--smoke", "--sections", "model", "--out", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["dropout"] == 0]
    modes = {(r["impl"], r["mode"]) for r in rows}
    assert ("ours/eager", bench.GRAPHS_MODE) in modes and ("hf eager", bench.GRAPHS_MODE) not in modes
    graphed = next(r for r in rows if r["mode"] == bench.GRAPHS_MODE)
    assert graphed["batch"] == 1 and graphed["tokens_per_s"] > 0


def test_gpu_benchmark_model_section_measures_only_the_models_named(tmp_path, monkeypatch):
    """``--models`` keeps the model and packed sections to the models it names (a GPU lease times the default
    road against Hugging Face's, not every backend)."""
    import json

    bench = _benchmark_with_two_models(monkeypatch)
    out = tmp_path / "model.json"
    assert (
        bench.main(["--smoke", "--sections", "model", "packed", "--models", "hf eager", "--out", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert {r["section"] for r in rows} == {"model", "packed"}
    assert {r["impl"] for r in rows} == {"hf eager"}


@pytest.mark.gpu
def test_gpu_benchmark_counts_the_syncs_of_a_call():
    """The latency section's sync count: a call that reads a GPU value on the host syncs once per read, one that
    only launches work none; the debug mode is restored after."""
    bench = _benchmark_module()
    x = torch.ones(4, device="cuda")
    assert bench.count_syncs(lambda: [float(x.sum()) for _ in range(3)], "cuda") == 3
    assert bench.count_syncs(lambda: x * 2, "cuda") == 0
    assert torch.cuda.get_sync_debug_mode() == 0


def test_gpu_benchmark_folds_section_times_both_row_strides(tmp_path, capsys):
    """``--sections folds``: the backward's four fold products alone, once at the unpadded row stride 2·sat + 1
    and once at the padded one (`triton_backend._distance_stride`), with the kernels that ran them."""
    import json

    out = tmp_path / "folds.json"
    assert (
        _benchmark_module().main(["--smoke", "--sections", "folds", "--lengths", "16", "--out", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["row_stride"] for r in rows] == [33, triton_backend._distance_stride(16)] == [33, 48]
    for r in rows:
        assert r["section"] == "folds" and r["ms"] > 0
        assert r["kernels_ms"] and all(ms > 0 for ms in r["kernels_ms"].values())
    assert "fold products alone" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ work around the kernels
def test_host_work_of_16bit_inputs_runs_on_the_tensor_cores(tmp_path):
    """Around its kernels a call computes the N×R tables and folds the backward's distance buffers. On a GPU
    (PyTorch's ``meta`` device stands for one; the launches are no-ops) with bfloat16 inputs none of those
    matmuls has float32 operands, which run an order of magnitude slower; the script writes its table."""
    import json

    bench = _benchmark_module("triton_host_cost")
    out = tmp_path / "cost.json"
    bench.main(["--lengths", "64", "--tokens", "128", "--heads", "2", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    kept = "distance, tables kept"  # the forward's tables kept for the backward (`KEEP_TABLES`)
    fold = "distance, fold kernels"  # the folds' products and sums by the fold kernels (`FOLD_PRODUCT`, `FOLD_SUMS`)
    default = "distance, default kernels"  # and the tables' products by `triton_products`' kernel
    by_cell = "distance, default kernels, sums by cell"  # and the fold sums by cell (`FOLD_SUMS_REDUCTION`)
    cut = "distance, forward tables to the saturation"  # `FORWARD_REACH`: nothing to cut at N = 64 (no far tile)
    bands = {"tables", "distance", "skew-forward", "skew", kept, fold, default, by_cell, cut}
    assert {r["near_band"] for r in rows} == bands
    for r in rows:
        if r["near_band"] in (default, by_cell):  # no matmul around the kernels at all
            assert r["forward"]["half_flops"] == r["backward"]["half_flops"] == 0
            continue
        for phase in ("forward", "backward"):
            assert r[phase]["fp32_flops"] == 0, (r["near_band"], phase)
            assert r[phase]["half_flops"] > 0, (r["near_band"], phase)
    moved = {(r["near_band"], phase): r[phase]["bytes"] for r in rows for phase in ("forward", "backward")}
    # the skewed kernels build no N×R table: less to move than the tables' road, in their direction only
    assert moved["skew", "forward"] == moved["skew-forward", "forward"] < moved["tables", "forward"]
    assert moved["skew", "backward"] < moved["skew-forward", "backward"] == moved["tables", "backward"]
    # kept tables: the forward as before, the backward without their product; what they hold, counted
    launched = {r["near_band"]: sum(r["backward"]["launches"].values()) for r in rows}
    assert moved[kept, "forward"] == moved["distance", "forward"] and launched[kept] < launched["distance"]
    assert moved[kept, "backward"] < moved["distance", "backward"]
    # the fold kernels: the forward as before; the backward without the sixteen matmuls a fold (eight products,
    # eight sums), without the pads of the table rows they read, and without converting dQ / dK (the kernel
    # writes them): the only copies left are the position tables' gradients, into the tables' layout
    assert moved[fold, "forward"] == moved["distance", "forward"]
    assert moved[fold, "backward"] < moved["distance", "backward"]
    launches = {r["near_band"]: r["backward"]["launches"] for r in rows}
    assert launches[fold]["baddbmm"] == launches["distance"]["baddbmm"] - 32
    assert "constant_pad_nd" not in launches[fold] and "_to_copy" not in launches[fold]
    assert launches[fold]["copy_"] == 2
    # the default's kernels: the tables from one launch, each fold kernel once for both sides (`FOLD_LAUNCHES`)
    kernels = {r["near_band"]: r["backward"]["kernels"] for r in rows}
    assert kernels[default] == {
        "_distance_product_kernel": 1,
        "_dq_kernel": 1,
        "_dkv_kernel": 1,
        "_fold_product_kernel": 1,
        "_fold_sums_kernel": 1,
    }
    assert kernels[fold]["_fold_sums_kernel"] == 1 and "_distance_product_kernel" not in kernels[fold]
    assert sum(launches[default].values()) < sum(launches[fold].values())
    # by cell: the cell sums kernel instead, and no reduction of the per-class sums after it
    del kernels[default]["_fold_sums_kernel"]
    assert kernels[by_cell] == {**kernels[default], "_fold_cell_sums_kernel": 1}
    assert launches[default].pop("sum") == 1 and launches[by_cell] == launches[default]
    held = {r["near_band"]: r["kept_bytes"] for r in rows}
    assert held[kept] >= 2 * 2 * 64 * 2 * 2 and not any(v for band, v in held.items() if band != kept)
    assert all(moved[cut, phase] == moved["distance", phase] for phase in ("forward", "backward"))


def test_host_cost_counts_the_forward_tables_cut_to_the_saturation():
    """`triton_host_cost`'s rows with `FORWARD_REACH` "saturation", where far tiles occur (v3 base, N = 1024):
    the forward's tables' products (by the matmul) over 2·512 + 1 cells a row instead of the 2·reach + 1 of the
    GPU's tiles (`_distance_reach`), so in that ratio, and fewer bytes; the backward's, uncut, as before."""
    bench = _benchmark_module("triton_host_cost")
    wide, cut = (bench.measure(1024, 1024, 2, 64, "distance", reach=r) for r in ("tiles", "saturation"))
    assert cut["near_band"] == "distance, forward tables to the saturation"
    tiles = [triton_backend.tiles_for(torch.device("cuda"), 64, name) for name in triton_backend.KERNEL_NAMES]
    reach = triton_backend._distance_reach(512, 1024, 1024, max(t.block_m + t.block_n for t in tiles))
    assert reach > 512
    flops = cut["forward"]["half_flops"], wide["forward"]["half_flops"]
    assert flops[0] * (2 * reach + 1) == flops[1] * (2 * 512 + 1)
    assert cut["forward"]["bytes"] < wide["forward"]["bytes"]
    assert cut["backward"] == wide["backward"]


def test_bounds_count_the_table_cells_and_near_tiles_of_the_pairs():
    """`benchmarks/triton_bounds.py` counts the table sectors a (b, h)'s near pairs read and the near tiles per
    row; here the same counts straight from the pairs, at v3's buckets scaled down (log buckets from 16, no
    saturation inside the input for one length, saturating for the other)."""
    import math

    bounds = _benchmark_module("triton_bounds")
    rel = RelativeIndex(span=16, bucket_size=16, max_position=32)
    lut = rel.lut.tolist()
    for n in (40, 100):
        sat = min(rel.saturation, n)
        pairs = [(i, j) for i in range(n) for j in range(n) if abs(i - j) < sat]
        first = min(lut[rel.saturation - sat : rel.saturation + sat + 1])
        cell = {(i, j): lut[i - j + rel.saturation] - first for i, j in pairs}
        rows = {(i, cell[i, j] * 4 // 32) for i, j in pairs}  # float32 cells, 32-byte sectors
        cols = {(j, cell[i, j] * 4 // 32) for i, j in pairs}
        assert len(rows) == len(cols)  # at distance i - j the two sides read one pattern
        assert bounds.table_cells_bytes("tables", n, rel) == (len(rows) + len(cols)) * 32
        per_row = [sum(abs(i - j) < sat for j in range(n)) for i in range(n)]  # bfloat16, by distance
        assert (
            bounds.table_cells_bytes("distance", n, rel)
            == 2 * sum(math.ceil(c * 2 / 32) for c in per_row) * 32
        )
        assert bounds.table_cells_bytes("skew", n, rel) == 0
    for n, sat, bm, bn in itertools.product((40, 100), (1, 16, 17, 33), (16, 32), (16, 32)):
        near = sum(  # a tile's pairs over its whole block extents, as the kernels' test bounds them
            any(abs(i - j) < sat for i in range(m, m + bm) for j in range(k, k + bn))
            for m in range(0, n, bm)
            for k in range(0, n, bn)
        )
        assert bounds._near_tiles(n, sat, bm, bn) == near, (n, sat, bm, bn)


def test_bounds_cap_what_the_roads_can_reach(tmp_path):
    """The caps fall as bytes grow and rise with bandwidth; a launch that fits twice in L2 counts no bytes; the
    script writes one row per GPU, length and road, and refuses a length that does not divide the tokens."""
    import json

    bounds = _benchmark_module("triton_bounds")
    gpu = bounds.GPUS["h100"]
    assert bounds._memory_bytes(2 * gpu.l2, gpu) == 0 and bounds._memory_bytes(2 * gpu.l2 + 7, gpu) == 7
    out = tmp_path / "bounds.json"
    assert bounds.main(["--lengths", "64", "128", "--tokens", "256", "--heads", "2", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 4 and (tmp_path / "bounds.md").exists()
    caps = {(r["gpu"][:4], r["n"], r["road"]): r for r in rows}
    for (name, n, road), r in caps.items():
        assert r["forward_ms"] >= r["forward_host_ms"] >= 0 and r["backward_ms"] >= r["backward_host_ms"] >= 0
        assert r["forward_tflops_cap"] > 0 and r["fwd_bwd_tflops_cap"] > 0
        if name == "H100":  # more bandwidth, same peak: never a lower cap
            assert caps["H200", n, road]["forward_tflops_cap"] >= r["forward_tflops_cap"]
    # a road's cap with its bytes doubled is lower, unless the tensor cores bound it
    wide = bounds.Gpu("narrow", gpu.bandwidth / 100, gpu.peak, 0)
    narrow = bounds.bound("tables", 128, wide, 1024, 2, 64)
    assert narrow["forward_tflops_cap"] < bounds.bound("tables", 128, gpu, 1024, 2, 64)["forward_tflops_cap"]
    with pytest.raises(SystemExit, match="--lengths 100: expected a positive divisor of --tokens 256"):
        bounds.main(["--lengths", "100", "--tokens", "256", "--out", str(out)])


def test_gpu_plot_draws_the_measured_points_the_caps_of_that_gpu_and_the_targets(tmp_path):
    """`benchmarks/plot_attention_gpu.py`: per panel a line per implementation through its measured points (a
    failed measurement left out), each road's caps from the bounds of the results' GPU model only (H100 here,
    not H200), timed or not, and the targets where the issue sets them."""
    import json

    plot = _benchmark_module("plot_attention_gpu")

    def row(impl, n, fwd, fwd_bwd):
        r = dict(section="attention", impl=impl, n=n, batch=16384 // n, heads=12, head_dim=64, fwd_tflops=fwd)
        return r | (dict(fwd_bwd_tflops=fwd_bwd) if fwd_bwd else dict(fwd_bwd_error="out of memory"))

    rows = [
        dict(section="model", impl="ours/triton", mode="forward", n=512, batch=32, ms=1.0),
        row("triton", 2048, 30.0, 25.0),
        row("triton", 512, 10.0, 8.0),
        row("sdpa (no position terms)", 512, 300.0, 200.0),
        row("sdpa (no position terms)", 2048, 400.0, 350.0),
        row("eager", 512, 5.0, None),
        dict(row("triton", 4096, 50.0, 40.0), section="tiles"),
    ]
    results = dict(environment=dict(device="NVIDIA H100 80GB HBM3", date="2026-11-25"), rows=rows)
    bounds = dict(
        gpus={"h100": dict(name="H100 SXM"), "h200": dict(name="H200 SXM")},
        rows=[
            dict(gpu="H100 SXM", road="tables", n=512, forward_tflops_cap=70.0, fwd_bwd_tflops_cap=50.0),
            dict(gpu="H200 SXM", road="tables", n=512, forward_tflops_cap=99.0, fwd_bwd_tflops_cap=77.0),
            dict(gpu="H100 SXM", road="distance", n=2048, forward_tflops_cap=180.0, fwd_bwd_tflops_cap=170.0),
        ],
    )

    def lines(ax):
        return {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in ax.lines}

    forward, both = (lines(ax) for ax in plot.figure(results, bounds).axes)
    assert forward["triton"] == [(512, 10.0), (2048, 30.0)]  # by N, the attention section's only
    assert forward["eager"] == [(512, 5.0)] and "eager" not in both  # its forward+backward failed
    assert forward["cap: tables"] == [(512, 70.0)] and both["cap: tables"] == [(512, 50.0)]
    assert forward["cap: distance"] == [(2048, 180.0)]  # a road with no measured row
    assert forward["target"] == [(512, 60), (2048, 100)] and both["target"] == [(2048, 75)]
    assert forward["target: 40% of sdpa"] == [(2048, 160.0)]

    def colour(impl):
        drawn = plot.figure(results, bounds).axes[0].lines
        return next(line.get_color() for line in drawn if line.get_label() == impl)

    # the plain `triton` row is drawn as the road its run took: "tables" in files that do not say (the default
    # before the environment recorded it), else the environment's near_band
    assert colour("triton") == plot.ROAD_COLOURS["tables"] != plot.ROAD_COLOURS["distance"]
    results["environment"]["near_band"] = "distance"
    assert colour("triton") == plot.ROAD_COLOURS["distance"]
    # the road row of the default road runs what `triton` runs: drawn dashed beside it
    results["rows"].append(row("triton distance", 512, 11.0, 9.0))
    styles = {line.get_label(): line.get_linestyle() for line in plot.figure(results, bounds).axes[0].lines}
    assert styles["triton distance"] == "--" and styles["triton"] == "-"
    assert colour("triton distance") == colour("triton")
    results["rows"].pop()
    results["environment"]["device"] = "NVIDIA A100-SXM4-80GB"  # a GPU the bounds do not know: no caps
    assert not any(label.startswith("cap") for label in lines(plot.figure(results, bounds).axes[0]))

    (tmp_path / "results.json").write_text(json.dumps(results))
    out = tmp_path / "plot.png"
    args = [
        "--results",
        str(tmp_path / "results.json"),
        "--bounds",
        str(tmp_path / "none.json"),
        "--out",
        str(out),
    ]
    assert plot.main(args) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "results.json").write_text(json.dumps(dict(results, rows=rows[-1:])))
    with pytest.raises(ValueError, match="no 'fwd_tflops' in their attention section"):
        plot.main(args)


def test_absent_arguments_launch_nothing(monkeypatch):
    """A call without segments, key mask or dropout passes stand-ins for those kernel arguments: allocations,
    not filled tensors (each fill a GPU launch per call, in every layer). The forward then launches only the
    tables' matmuls around its kernel: they read q and k in the projections' layout per head, without copies
    (`_per_head`). The backward fills nothing: at distance i - j its kernels write the distance buffers whole."""
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", False)  # what runs outside the tests
    bench = _benchmark_module("triton_host_cost")
    row = bench.measure(64, 128, 2, 64, "tables")
    assert row["forward"]["launches"] == {"bmm": 2}, row["forward"]["launches"]
    # the skewed forward: the two end rows of each table (indexed through the int32 LUT, no cast) and the same
    skewed = bench.measure(64, 128, 2, 64, "skew")
    assert skewed["forward"]["launches"] == {"index": 2, "bmm": 2}, skewed["forward"]["launches"]
    # the distance tables: the table rows their cells read (the cells cached with the geometry), two matmuls
    # that scale as they write (`_scaled_product`: no pass of their own to scale the tables) and the zeros
    # after each table (`_distance_slack`); a length that is not a multiple of DIST_ALIGN pads q and k first
    dist = bench.measure(128, 256, 2, 64, "distance")
    tables = {"index": 2, "baddbmm": 2, "zero_": 2}
    assert dist["forward"]["launches"] == tables, dist["forward"]["launches"]
    padded = bench.measure(72, 144, 2, 64, "distance")["forward"]["launches"]
    assert padded == {"constant_pad_nd": 2, **tables}, padded
    for r in (row, skewed, dist):
        launches = r["backward"]["launches"]
        # no N-sized fills: the kernels write the distance buffers' cells that no pair lands in (zeros). Fills
        # only of the two position tables' gradients, (H, R, d), which their per-distance sums are added into
        # (`_into_rows`), and of the distance tables' zeros after their last row
        fills = {"new_zeros": 2, **({"zero_": 2} if r is dist else {})}
        assert {n: c for n, c in launches.items() if n in bench.FILLS} == fills, launches
        # folds per head, over the batch: no copy, and no sum but the residue folds' one per table at the
        # distance road's odd row stride (`_residue_folds`, `GRADIENT_STORES` "aligned")
        assert "clone" not in launches and launches.get("sum", 0) == (2 if r is dist else 0), launches


def test_banded_folds_write_the_gradients_in_one_pass():
    """In bands the folds' products are added to dQ / dK in float32 and the sums written in the inputs' dtype by
    one operation each (`_add_bands`), not added into the float32 gradients and converted after: no in-place
    add, and the only conversions left are the two position tables' gradients (copied into the tables' layout,
    `_position_grad`). With one band (N = 128 here) the products add into dQ / dK in their epilogue, and dQ / dK
    are converted as before."""
    bench = _benchmark_module("triton_host_cost")
    banded = bench.measure(512, 1024, 2, 64, "distance")["backward"]["launches"]
    assert banded.get("add") == 2 and "add_" not in banded and "_to_copy" not in banded, banded
    assert banded["copy_"] == 2, banded
    one = bench.measure(128, 256, 2, 64, "distance")["backward"]["launches"]
    assert "add" not in one and "add_" not in one and one["_to_copy"] == 2 and one["copy_"] == 2, one


def _bands_added_by_row(grad: torch.Tensor, product: torch.Tensor, n: int, scale: float) -> torch.Tensor:
    """``grad`` (B, H, N, d) plus ``scale`` times the band-major ``product`` (H, bands, B, band, d), row by row:
    token t of batch row b gets row t mod band of band t // band (the padding rows meet no token)."""
    H, _, B, band, _ = product.shape
    out = grad.clone()
    for h, b, t in itertools.product(range(H), range(B), range(n)):
        out[b, h, t] += scale * product[h, t // band, b, t % band]
    return out


def test_adding_the_bands_rounds_the_float32_sum_once():
    """`_add_bands`: the bands' products added to a float32 gradient in the projections' layout and written in
    bfloat16 are bit for bit the sum added in float32 and converted after, the last band's padding rows left
    out, in the gradient's strides; in float32 the sum is added into the gradient itself."""
    B, H, N, d, band = 2, 3, 21, 8, 8  # three bands, the last with 5 real rows of 8
    bands = triton_backend.triton_cdiv(N, band)
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(B, N, H, d, generator=g).transpose(1, 2)  # (B, H, N, d) over (B, N, H, d) memory
    product = torch.randn(H, bands, B, band, d, generator=g)
    scale = 0.3
    # as before: added into the float32 gradient in place, band by band (then converted)
    want, into, whole = grad.clone(), product.permute(2, 0, 1, 3, 4), N // band
    want[:, :, : whole * band].unflatten(2, (whole, band)).add_(into[:, :, :whole], alpha=scale)
    want[:, :, whole * band :].add_(into[:, :, whole, : N - whole * band], alpha=scale)
    torch.testing.assert_close(want, _bands_added_by_row(grad, product, N, scale), rtol=0, atol=1e-6)
    got = triton_backend._add_bands(grad, product, N, scale, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.stride() == grad.stride()
    assert torch.equal(got, want.to(torch.bfloat16))
    same = triton_backend._add_bands(grad, product, N, scale, torch.float32)
    assert same is grad and torch.equal(grad, want)


@pytest.mark.parametrize(("bands", "sides"), [(1, 1), (3, 1), (3, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_product_kernel_adds_the_buffers_product_to_the_gradient(dtype, bands, sides):
    """`triton_products._fold_product_kernel` (`FOLD_PRODUCT` "triton"): a gradient buffer at an odd row stride
    (DW = 97 ≡ 1 mod 16) in the tables' layout (H, bands, B, band, DW), read by residue classes of rows from
    16-byte aligned starts, times each band's table rows, added to the float32 gradient in the projections'
    layout and written in ``dtype``, the padding tokens' rows (past N in the last band) left out: the matmul's
    sum. Every cell random, so a class read one cell off meets the wrong table row; a whole and a masked column
    block; in one band 70 rows a class (two row blocks, the second partial). With two sides in one launch
    (`FOLD_LAUNCHES` "one") each side's buffer, table rows and gradient its own: a program of the grid's
    second half that read the first side's would give the first side's sum."""
    B, H, d, W = 2, 2, 16, 97
    band = 280 if bands == 1 else 32
    N = band * bands - (0 if bands == 1 else 13)  # bands: the last one 19 tokens and 13 padding rows
    g = torch.Generator().manual_seed(0)
    dists = [torch.randn(H * bands, B * band, W, generator=g).to(dtype) for _ in range(sides)]
    rows = [torch.randn(H * bands, W, d, generator=g).to(dtype) for _ in range(sides)]
    # (B, H, N, d) over (B, N, H, d) memory
    grads = [torch.randn(B, N, H, d, generator=g).transpose(1, 2) for _ in range(sides)]
    wants = [
        _bands_added_by_row(grad, torch.bmm(dist.float(), r.float()).view(H, bands, B, band, d), N, 0.7)
        for dist, r, grad in zip(dists, rows, grads, strict=True)
    ]
    gots = triton_backend._kernel_fold_product(dists, rows, grads, band, 0.7, dtype)
    for got, want, grad in zip(gots, wants, grads, strict=True):
        assert got.dtype == dtype and got.stride() == grad.stride()
        if dtype == torch.float32:
            assert got is grad  # added in place
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:  # the float32 sum rounded once: at most a bfloat16 step from the matmul's, rounded
            torch.testing.assert_close(got.float(), want.to(dtype).float(), rtol=2**-7, atol=1e-6)


FOLD_CASES = {
    # one band (beyond the saturation, 16): whole rows, padded rows, one side's table
    "n64": Case(n=64),
    "n70_padding": Case(n=70, batch=2, key_lengths=(70, 30)),
    "n48_c2p_heads2": Case(n=48, heads=2, terms=PositionTerms(c2p=True, p2c=False)),
    "n40_p2c": Case(n=40, terms=PositionTerms(c2p=False, p2c=True)),
    # 16-row bands (no pair saturates)
    "banded_wide_n64": BANDED_GRID["wide_n64"],
    "banded_wide_padding": Case(n=50, batch=2, rel=WIDE, key_lengths=(50, 23)),  # 14 padding rows
    "banded_wide_c2p_only": BANDED_GRID["wide_c2p_only"],
    "banded_wide_p2c_only": BANDED_GRID["wide_p2c_only"],
}


FOLD_MATMULS = dict(FOLD_PRODUCT="cublas", FOLD_SUMS="cublas")  # the reference: both folds by cuBLAS
FOLD_KERNELS = {
    "product": dict(FOLD_PRODUCT="triton", FOLD_SUMS="cublas"),
    "sums": dict(FOLD_PRODUCT="cublas", FOLD_SUMS="triton"),
    "both": dict(FOLD_PRODUCT="triton", FOLD_SUMS="triton"),  # (both sides in one launch each: the default)
    "both, two launches": dict(FOLD_PRODUCT="triton", FOLD_SUMS="triton", FOLD_LAUNCHES="two"),
    # the sums' content copied band-major, as where a head's offsets pass 32 bits (`_fold_content`)
    "both, content copied": dict(FOLD_PRODUCT="triton", FOLD_SUMS="triton", CONTENT_OFFSETS=1),
    # each cell's sum whole from the sums kernel (`FOLD_SUMS_REDUCTION`)
    "both, sums by cell": dict(FOLD_PRODUCT="triton", FOLD_SUMS="triton", FOLD_SUMS_REDUCTION="cells"),
}


# both kernels over every case (both sides in one launch where both tables are wanted, a side alone in the
# one-table cases); each alone (the other fold on cuBLAS) in one band and in bands; the other settings once,
# where they change the path: both tables a launch a side, and in bands with padding rows the sums by cell
# (the unit test runs the cell kernel in one band) and the content copied (with one band a view either way)
FOLD_PARAMS = [
    *((name, "both") for name in FOLD_CASES),
    *((name, kernels) for name in ("n64", "banded_wide_n64") for kernels in ("product", "sums")),
    ("n64", "both, two launches"),
    ("banded_wide_padding", "both, sums by cell"),
    ("banded_wide_padding", "both, content copied"),
]


@pytest.mark.parametrize(("name", "kernels"), FOLD_PARAMS)
def test_fold_kernel_gives_the_gradients_of_the_matmul_folds(monkeypatch, name, kernels):
    """`FOLD_PRODUCT` and `FOLD_SUMS` "triton", both and each alone, on the distance road with "aligned"
    gradient stores, in one band (N beyond the saturation: v3 from N = 1024) and in 16-row bands (as v3 at
    N <= 512 has 64-row ones), whole rows or padded: each kernel runs once for both tables where both kernels
    fold both (`FOLD_LAUNCHES` "one"), else once per table, and the call's output and gradients are those of
    the cuBLAS folds in bfloat16, each gradient within a bfloat16 step (their float32 sums differ in order
    only). In bands the sums kernel reads q / k where they lie (no band-major copy), unless told their offsets
    pass 32 bits. Float32 inputs keep the matmuls (checked once)."""
    case = FOLD_CASES[name]
    bands = _distance_bands(monkeypatch, 16)
    inputs = _inputs(case, torch.bfloat16, DEVICE)
    _set_backend(monkeypatch, FOLD_MATMULS)
    want_out, want = _run(triton_attention, case, inputs, _geometry(case, DEVICE))
    assert all(bands) == name.startswith("banded")
    launched = _count_calls(monkeypatch, "_kernel_fold_product", "_kernel_fold_sums", "_band_major")
    _set_backend(monkeypatch, FOLD_KERNELS[kernels])
    out, got = _run(triton_attention, case, inputs, _geometry(case, DEVICE))
    tables = case.terms.c2p + case.terms.p2c
    paired = ("both", "both, content copied", "both, sums by cell")
    per_kernel = 1 if kernels in paired else tables  # (one table: one launch)
    assert launched["_kernel_fold_product"] == (per_kernel if kernels != "sums" else 0)
    assert launched["_kernel_fold_sums"] == (per_kernel if kernels != "product" else 0)
    in_place = all(bands) and kernels in ("sums", "both", "both, two launches", "both, sums by cell")
    assert launched["_band_major"] == (0 if in_place else tables)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)  # the forward does not fold
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-6)
    if (name, kernels) == ("n64", "both"):
        launched.clear()
        _run(triton_attention, case, _inputs(case, torch.float32, DEVICE), _geometry(case, DEVICE))
        assert not launched["_kernel_fold_product"] and not launched["_kernel_fold_sums"]


def _band_major_by_row(x: torch.Tensor, band: int, bands: int) -> torch.Tensor:
    """(B, H, N, d) rows as the tables' layout orders them, row by row: (H·bands, B·band, d), row m of group
    (h, b') token b'·band + m mod band of batch row m // band, zeros past N."""
    B, H, N, d = x.shape
    out = x.new_zeros(H * bands, B * band, d)
    for h, b_, m in itertools.product(range(H), range(bands), range(B * band)):
        token = b_ * band + m % band
        if token < N:
            out[h * bands + b_, m] = x[m // band, h, token]
    return out


@pytest.mark.parametrize("reduction", triton_backend.FOLD_SUMS_REDUCTION_MODES)
@pytest.mark.parametrize(("bands", "sides"), [(1, 1), (3, 1), (3, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_sums_kernel_sums_each_cell_over_the_rows(monkeypatch, dtype, bands, sides, reduction):
    """`triton_products._fold_sums_kernel` (`FOLD_SUMS` "triton"): per cell x of a buffer at an odd row stride
    (DW = 97) in the tables' layout, Σ over rows m of DIST[m, x] · CONTENT[m], in float32: the matmul's sums,
    and the residue-class matmuls' (`_residue_folds`). In bands the content rows are read where q / k lie,
    (B, H, N, d) over the projections' (B, N, H, d) memory, in the buffer's row order: each group's rows are
    its band's tokens of every batch row, the last band's 13 padding rows zeros (a garbage content row there
    would show: their buffer rows are random here). In one band they come per head (a strided view), 96 rows a
    class (two row blocks of 64, the second partial). 104 columns a row (a whole column block and a masked
    one). Every cell random: a class read one cell off sums the wrong cell. Two sides in one launch: each its
    own buffer and content. Both reductions of the classes (`FOLD_SUMS_REDUCTION`): per-class sums added after,
    and each cell's sum whole from the kernel (two blocks of 56 cells, the second masked: a class shifted one
    row off in the gather sums its neighbour's cell)."""
    monkeypatch.setattr(triton_backend, "FOLD_SUMS_REDUCTION", reduction)
    B, H, d, W = 2, 2, 16, 97
    band = 384 if bands == 1 else 32
    N = band * bands - (0 if bands == 1 else 13)
    g = torch.Generator().manual_seed(1)
    dists = [torch.randn(H * bands, B * band, W, generator=g).to(dtype) for _ in range(sides)]
    xs = [torch.randn(B, N, H, d, generator=g).to(dtype).transpose(1, 2) for _ in range(sides)]
    contents = xs if bands > 1 else [triton_backend._per_head(x) for x in xs]
    got = triton_backend._kernel_fold_sums(dists, contents, W, band)
    assert got.dtype == torch.float32 and got.shape == (sides, H * bands, W, d)
    for dist, x, sums in zip(dists, xs, got, strict=True):
        content = _band_major_by_row(x, band, bands)
        want = torch.bmm(dist.float().transpose(1, 2), content.float())
        torch.testing.assert_close(sums, want, rtol=1e-5, atol=1e-4)
        _, by_classes = triton_backend._residue_folds(dist, None, content, W)
        torch.testing.assert_close(sums, by_classes, rtol=1e-5, atol=1e-4)


def test_fold_cell_sums_programs_store_only_their_cells():
    """`_fold_cell_sums_kernel` (`FOLD_SUMS_REDUCTION` "cells"): a program stores the BLOCK_N - 8 cells it owns
    and no others. It reads 8 columns more (a class's rows are read from s cells before their first) and sums
    them, but those cells are the next program's; stored by both, which program's store lands last would be up
    to the GPU. Launched alone, the first program leaves the cells after its own as they were (NaN), and its
    own are the matmul's."""
    G, M, d, W = 2, 64, 16, 97
    g = torch.Generator().manual_seed(2)
    dist, content = torch.randn(G, M, W, generator=g), torch.randn(G, M, d, generator=g)
    sums = torch.full((G, W, d), float("nan"))
    t = triton_backend.FOLD_SUMS_TILES
    triton_backend._products()._fold_cell_sums_kernel[(1, G)](
        dist, content, sums, W - 1, M * W, content.stride(0), content.stride(1), 0, M, 0, 1, M, W, dist, content,
        D=d, PREC=triton_backend._precision(dist), **triton_backend._launch(t),
    )  # fmt: skip
    owned = t.block_n - triton_backend.RESIDUES
    want = torch.bmm(dist.transpose(1, 2), content)
    torch.testing.assert_close(sums[:, :owned], want[:, :owned], rtol=1e-5, atol=1e-4)
    assert torch.isnan(sums[:, owned:]).all()


def _folded_buffers(monkeypatch) -> list:
    """Copies of the distance buffers the backward folds into dQ / dK (`_fold_into_content`), in call order."""
    seen = []
    fold = triton_backend._fold_into_content
    monkeypatch.setattr(
        triton_backend, "_fold_into_content", lambda dist, *a: seen.append(dist.clone()) or fold(dist, *a)
    )
    return seen


def test_distance_buffers_cells_run_with_the_partner_index(monkeypatch):
    """The backward's distance buffers, cell by cell: a query row i holds dS(i, j) in cell sat + j - i, a key
    column j holds it in cell sat + i - j (each cell runs the way its partner index runs, so that a warp's store
    covers consecutive cells: `triton_kernels._table_grad`), and the end cells the sums of the saturated pairs
    on either side; dS from autograd through eager's scores. The folds read the query rows' buffer through the
    mirrored lookup table: a layout that disagreed with it would fail the grid, not this test alone."""
    c = GRID["n70_saturating"]
    monkeypatch.setattr(triton_backend, "GRADIENT_STORES", "cells")  # (with "aligned": the next test)
    seen = _folded_buffers(monkeypatch)
    inputs = _inputs(c, torch.float32, DEVICE)
    out, _ = _run(triton_attention, c, inputs, _geometry(c, DEVICE))
    ds = _eager_score_grads(c, out, inputs)[0, 0]  # (N, N): one batch row, one head
    sat = min(c.rel.saturation, c.n)
    i, j = torch.meshgrid(torch.arange(c.n), torch.arange(c.n), indexing="ij")
    near = (i - j).abs() < sat
    dq_dist, dk_dist = (d[0, : c.n] for d in seen)  # c2p's buffer (query rows), then p2c's (key columns)
    torch.testing.assert_close(dq_dist[i[near], sat + j[near] - i[near]], ds[near], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dk_dist[j[near], sat + i[near] - j[near]], ds[near], atol=1e-6, rtol=1e-5)
    # the end cells: a query row's cell 0 sums its pairs i - j >= sat, a key column's its pairs i - j <= -sat
    right, left = ds.double() * (i - j >= sat), ds.double() * (i - j <= -sat)
    for cells, first, last in ((dq_dist, right.sum(1), left.sum(1)), (dk_dist, left.sum(0), right.sum(0))):
        torch.testing.assert_close(cells[:, 0].double(), first, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(cells[:, 2 * sat].double(), last, atol=1e-6, rtol=1e-5)


def _eager_score_grads(c: Case, out: torch.Tensor, inputs) -> torch.Tensor:
    """dS (B, H, N, N) of eager's scores for the gradient ``_grad_out(out)``."""
    q, k, v, pos_q, pos_k = (t.detach() for t in inputs)
    parts = eager.score_components(
        q, k, pos_q, pos_k, c.rel, _geometry(c, DEVICE), scale=scale_for(c.dim, 3), terms=c.terms
    )
    scores = sum(parts.values()).requires_grad_()
    (torch.softmax(scores, -1) @ v).backward(_grad_out(out))
    return scores.grad


# the one-band cases: (saturation as `_lut` cuts it, far tiles occur)
ONE_BAND_GRADIENTS = {"n70_saturating": (16, True), "heads2_d32_batch2": (16, True), "n7": (7, False)}


@pytest.mark.parametrize("name", ONE_BAND_GRADIENTS)
def test_one_band_gradients_hold_every_near_pair_in_its_cell(monkeypatch, name):
    """With one band and `GRADIENT_STORES` "aligned" the backward's distance buffers take the distance tables'
    rows, 2·reach + 1 cells (1 modulo 32) around cell reach, and a cell for every pair of a near tile, the
    saturated ones too: a query row i holds dS(i, j) in cell reach + j - i, a key column j in cell reach +
    i - j (`triton_kernels._table_grad` under ``GRAD_BANDS``, stored 16 bytes at a time). Pairs closer than the
    saturation each in their cell; beyond it a near tile's in theirs and a far tile's summed into the end cell
    of their side, so that the end cell and the saturated cells of a side add up to that side's dS; cells whose
    partner lies outside the sequence zero (written by the kernels: the buffers start as NaN). Without far
    tiles the end cells are zeros. Every (b, h)."""
    c = GRID[name]
    sat, far = ONE_BAND_GRADIENTS[name]
    seen = []
    fold = triton_backend._fold_bands
    monkeypatch.setattr(
        triton_backend, "_fold_bands", lambda side, *a: seen.append(side.dist.clone()) or fold(side, *a)
    )
    inputs = _inputs(c, torch.float32, DEVICE)
    out, _ = _run(triton_attention, c, inputs, _geometry(c, DEVICE))
    ds = _eager_score_grads(c, out, inputs).double().transpose(0, 1)  # (H, B, N, N)
    padded = triton_backend._padded_rows(c.n)
    # c2p's buffer (query rows), then p2c's (key columns), each (H, B, N, cells)
    dq_dist, dk_dist = (d.view(c.heads, c.batch, padded, -1)[:, :, : c.n].double() for d in seen)
    width = dq_dist.shape[-1]
    off = width // 2
    assert width % 32 == 1 and off > sat and (far or off >= c.n)  # (far tiles: the near runs' reach)
    assert torch.isfinite(dq_dist).all() and torch.isfinite(dk_dist).all()
    i, j = torch.meshgrid(torch.arange(c.n), torch.arange(c.n), indexing="ij")
    near = (i - j).abs() < sat
    torch.testing.assert_close(
        dq_dist[..., i[near], off + j[near] - i[near]], ds[..., near], atol=1e-6, rtol=1e-5
    )
    torch.testing.assert_close(
        dk_dist[..., j[near], off + i[near] - j[near]], ds[..., near], atol=1e-6, rtol=1e-5
    )
    right, left = ds * (i - j >= sat), ds * (i - j <= -sat)
    partner = torch.arange(c.n)[:, None] + torch.arange(width)[None, :] - off
    outside = (partner < 0) | (partner >= c.n)
    outside[:, [0, -1]] = False  # (the end cells)
    # a query row's cells run by j - i: its right side (i - j >= sat) from cell 0 to off - sat
    for cells, low, high in ((dq_dist, right.sum(-1), left.sum(-1)), (dk_dist, left.sum(-2), right.sum(-2))):
        torch.testing.assert_close(cells[..., : off - sat + 1].sum(-1), low, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(cells[..., off + sat :].sum(-1), high, atol=1e-6, rtol=1e-5)
        assert (cells[..., outside] == 0).all()
        if not far:
            assert (cells[..., [0, -1]] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["n70_saturating", "c2p_only", "p2c_only", "packed", "causal_padding"])
def test_kept_tables_give_the_same_gradients_without_building_them_again(monkeypatch, name, dtype):
    """`KEEP_TABLES`: an eager call on the distance road saves its forward's ROW, COL and FAR for the backward,
    which builds no table of its own (one `_distance_tables` and one `_far_columns` per call, the forward's,
    where each call builds two of each without it) and gives the gradients of the call that builds them again,
    bit for bit. ``n70_saturating`` has far tiles (FAR kept), the others one side's table or a packed / causal
    geometry."""
    c = GRID[name]
    inputs = _inputs(c, dtype, DEVICE)
    built = _count_calls(monkeypatch, "_distance_tables", "_far_columns")
    want_out, want = _run(triton_attention, c, inputs, _geometry(c, DEVICE))
    rebuilt = Counter(built)
    built.clear()
    monkeypatch.setattr(triton_backend, "KEEP_TABLES", True)
    out, got = _run(triton_attention, c, inputs, _geometry(c, DEVICE))
    assert rebuilt["_distance_tables"] == 2 and built["_distance_tables"] == 1
    assert built["_far_columns"] == rebuilt["_far_columns"] // 2
    if name == "n70_saturating":
        assert rebuilt["_far_columns"] == 2
    for a, b in zip((out, *got), (want_out, *want), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_kept_tables_are_saved_with_the_graph_and_freed_by_its_backward(monkeypatch):
    """The tables a forward keeps (`KEEP_TABLES`) are saved tensors of its autograd node, three more than
    without (ROW, COL, FAR), freed with the others once the backward has run; a forward without gradients
    has no node and keeps nothing."""
    c = GRID["n70_saturating"]
    q, k, v, pos_q, pos_k = _inputs(c, torch.float32, DEVICE)
    geom, sf = _geometry(c, DEVICE), scale_for(c.dim, 3)

    def call():
        return triton_attention(q, k, v, pos_q, pos_k, c.rel, geom, scale=sf, terms=c.terms)[0]

    def node(out):  # the attention's own autograd node, under the views and casts after it
        todo = [out.grad_fn]
        while todo:
            fn = todo.pop()
            if type(fn).__name__.startswith("_EagerAttention"):
                return fn
            todo += [f for f, _ in fn.next_functions if f is not None]

    saved = {}
    for keep in (False, True):
        monkeypatch.setattr(triton_backend, "KEEP_TABLES", keep)
        out = call()
        saved[keep] = node(out).saved_tensors
    kept = saved[True][len(saved[False]) :]
    assert len(kept) == 3 and all(t is not None and t.dtype == torch.float32 for t in kept)
    out.sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        _ = node(out).saved_tensors
    with torch.no_grad():
        assert call().grad_fn is None


@pytest.mark.parametrize(
    ("layout", "batch", "in_place"),
    [("contiguous", 1, True), ("projections", 2, True), ("contiguous", 2, False)],
)
def test_one_band_folds_add_into_the_gradients_in_place(monkeypatch, layout, batch, in_place):
    """One band of unpadded rows (N = 48, a multiple of 16, past a saturation of 16) is dQ's and dK's per-head
    layout where they have one (`_per_head_view`: the projections' (B, N, H, d) layout viewed as (B, H, N,
    d), or a contiguous one at B = 1): the residue folds' products add into them in the matmuls' epilogue
    (`_residue_folds`' ``into``), with no float32 product between; elsewhere they are added after. The
    results eager's either way."""
    c = Case(n=48, batch=batch, heads=2)
    seen = []
    real = triton_backend._residue_folds
    monkeypatch.setattr(
        triton_backend, "_residue_folds", lambda *a: seen.append(a[4] is not None) or real(*a)
    )
    geom = _geometry(c, DEVICE)
    inputs = _inputs(c, torch.float32, DEVICE)
    if layout == "projections":
        split = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in inputs[:3]]
        inputs = (*split, *inputs[3:])
    out, grads = _run(triton_attention, c, inputs, geom)
    ref, ref_grads = _run(eager_attention, c, _reference_inputs(inputs, DEVICE), geom, _grad_out(out))
    _assert_close(c, inputs, torch.float32, (out, *grads), (ref, *ref_grads))
    assert seen == [in_place] * 2


@pytest.mark.parametrize("name", ["n70_saturating", "explicit_positions_padding"])
def test_folds_read_distance_buffers_at_an_aligned_row_stride(monkeypatch, name):
    """The backward's distance buffers hold each row's 2·sat + 1 cells at a row stride padded to a multiple of
    `DIST_ALIGN` (cuBLAS's vectorised kernels need aligned strides: `triton_backend._distance_stride`); the
    padding reaches the folds' matmuls as zeros. The buffers start as NaN (tests/conftest.py), so at distance
    i - j the kernels zero the padding themselves; with explicit positions the buffer is zero-filled."""
    c = GRID[name]
    monkeypatch.setattr(triton_backend, "GRADIENT_STORES", "cells")  # (the distance road's with "aligned")
    seen = _folded_buffers(monkeypatch)
    _run(triton_attention, c, _inputs(c, torch.float32, DEVICE), _geometry(c, DEVICE))
    sat = min(c.rel.saturation, max(c.n, c.n_k or c.n)) if c.q_offset is None else c.rel.saturation
    assert len(seen) == 2  # c2p's (dq_dist) and p2c's (dk_dist)
    for dist in seen:
        assert dist.shape[-1] == triton_backend._distance_stride(sat) > 2 * sat + 1
        assert dist.shape[-1] % triton_backend.DIST_ALIGN == 0 and dist.stride(-2) == dist.shape[-1]
        assert (dist[..., 2 * sat + 1 :] == 0).all()
        assert torch.isfinite(dist[..., : 2 * sat + 1]).all()  # every cell written


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("layout", ["projections", "contiguous"])
def test_fold_into_content_adds_the_product_into_the_gradient(layout, batch):
    """`triton_backend._fold_into_content` adds Σ over δ of dist(n, δ) · table[lut(δ)] · scale into a gradient
    of either kernel layout. Where the gradient has a per-head view (the projections' (B, N, H, d) layout, or
    a contiguous one at B = 1) the matmul adds into that view itself (`_add_matmul_f32`): no product tensor
    and no separate add; otherwise the product is added after."""
    H, N, D, W, R, scale = 3, 20, 8, 16, 7, 0.3
    g = torch.Generator().manual_seed(0)
    dist = torch.randn(H, batch * N, W, generator=g)
    table = torch.randn(H, R, D, generator=g)
    lut = torch.randint(0, R, (W,), generator=g)
    if layout == "projections":
        grad = torch.randn(batch, N, H, D, generator=g).transpose(1, 2)
    else:
        grad = torch.randn(batch, H, N, D, generator=g)
    product = torch.einsum("hbnw,hwd->bhnd", dist.view(H, batch, N, W).double(), table[:, lut].double())
    want = grad.double() + scale * product
    with _Ops() as probe:
        triton_backend._fold_into_content(dist, table, lut, grad, scale)
    torch.testing.assert_close(grad.double(), want, atol=1e-5, rtol=1e-5)
    in_place = layout == "projections" or batch == 1
    assert (probe.ops["aten.baddbmm_.default"] == 1) == in_place, probe.ops
    assert (probe.ops["aten.add_.Tensor"] == 0) == in_place, probe.ops


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fold_into_content_adds_on_the_tensor_cores_gpu(dtype):
    """On CUDA with 16-bit buffers the fold's matmul adds its float32 result into the gradient's per-head view
    through cuBLAS's strides (``baddbmm(..., out_dtype=float32, out=view)``): the sum of the float32 products of
    the same operands, written where the gradient lies and nowhere else."""
    H, B, N, D, W, R = 3, 2, 300, 64, 160, 90
    g = torch.Generator(device="cuda").manual_seed(0)
    dist = torch.randn(H, B * N, W, device="cuda", generator=g).to(dtype)
    table = torch.randn(H, R, D, device="cuda", generator=g).to(dtype)
    lut = torch.randint(0, R, (W,), device="cuda", generator=g)
    store = torch.randn(B, N, H + 1, D, device="cuda", generator=g)  # one head more: cells it must not touch
    grad = store[:, :, :H].transpose(1, 2)
    before = store.clone()
    product = torch.einsum("hbnw,hwd->bhnd", dist.view(H, B, N, W).double(), table[:, lut].double())
    triton_backend._fold_into_content(dist, table, lut, grad, 0.5)
    torch.testing.assert_close(grad.double(), before[:, :, :H].transpose(1, 2).double() + 0.5 * product,
                               atol=1e-3, rtol=1e-4)  # fmt: skip
    assert torch.equal(store[:, :, H], before[:, :, H])


def test_distance_ends_are_cols_saturated_cells_without_an_index_tensor():
    """`triton_backend._distance_ends`: per key COL's cells of distance -sat and +sat, (H, B, Nk, 2), one view
    of the table: nothing copied, by no index tensor and no stack. A list index copied itself from host memory
    in every call with far tiles: on a GPU a wait for it, and inside a CUDA graph's capture an error (the GPU
    tests `test_calls_never_wait_for_the_gpu_gpu` and `test_dropout_draws_a_new_mask_at_every_cuda_graph_replay_gpu`
    failed on it, on an H200); a stack was a kernel of its own. FAR built from it holds those cells."""
    H, B, NK, reach, sat = 2, 3, 20, 9, 6
    cells = 2 * reach + 1
    rows = triton_backend._padded_rows(NK)
    col = torch.randn(H * B * rows * cells + 5)  # the table and the zeros after it
    with _Ops() as probe:
        ends = triton_backend._distance_ends(col, H, B, NK, reach, sat)
    per_key = col[: H * B * rows * cells].view(H, B, rows, cells)[:, :, :NK]
    want = torch.stack((per_key[..., reach - sat], per_key[..., reach + sat]), -1)
    assert torch.equal(ends, want) and ends.untyped_storage().data_ptr() == col.untyped_storage().data_ptr()
    copies = ("index", "lift_fresh", "stack", "cat", "copy", "clone")
    assert not [op for op in probe.ops if any(word in op for word in copies)], probe.ops
    lut = torch.arange(2 * sat + 1, dtype=torch.int32)
    far = triton_backend._far_columns(ends, lut, True, None, (H, B, NK), "cpu")
    assert torch.equal(far[..., :NK], want.transpose(-1, -2))


def test_far_columns_hold_cols_saturated_values_and_hide_masked_keys():
    """FAR (`triton_backend._far_columns`), the far tiles' column values: per (h, b) COL's left and right
    saturated entries (the rows of the LUT's first and last entry) as two rows padded with -inf to FAR_PAD,
    -inf at masked keys; a skewed call's COL holds only the two ends; zeros without COL (c2p only)."""
    H, B, NK, R = 2, 3, 130, 9
    lut = torch.tensor([2, 2, 3, 4, 5, 6, 7], dtype=torch.int32)  # saturated ends: table rows 2 and 7
    col = torch.randn(H, B * NK, R)
    k_mask = (torch.rand(B, NK) > 0.3).to(torch.int32)
    hidden = (k_mask == 0)[None, :, None, :]
    ends = col.view(H, B, NK, R)[..., [2, 7]].transpose(-1, -2)  # (H, B, 2, NK)
    far = triton_backend._far_columns(col, lut, False, k_mask, (H, B, NK), "cpu")
    assert far.shape == (H, B, 2, 2 * triton_backend.FAR_PAD) and far.is_contiguous()
    torch.testing.assert_close(far[..., :NK], ends.masked_fill(hidden, float("-inf")))
    assert torch.isneginf(far[..., NK:]).all()
    skewed = triton_backend._far_columns(col.view(H, B, NK, R)[..., [2, 7]].reshape(H, B * NK, 2), lut, True,
                                         None, (H, B, NK), "cpu")  # fmt: skip
    torch.testing.assert_close(skewed[..., :NK], ends)
    c2p_only = triton_backend._far_columns(None, lut, False, k_mask, (H, B, NK), "cpu")
    torch.testing.assert_close(c2p_only[..., :NK], torch.zeros_like(ends).masked_fill(hidden, float("-inf")))
    exact = triton_backend._far_columns(col[:, : B * 128], lut, False, None, (H, B, 128), "cpu")
    assert exact.shape[-1] == 128 and not torch.isinf(exact).any()  # no padding where Nk is a multiple


def _record_far_builds(monkeypatch) -> list[tuple[int, int, int]]:
    """The (H, B, Nk) of every FAR the op builds from now on (`triton_backend._far_columns` still runs)."""
    built = []
    far_columns = triton_backend._far_columns
    monkeypatch.setattr(triton_backend, "_far_columns", lambda *a: built.append(a[-2]) or far_columns(*a))
    return built


def test_far_columns_are_built_only_where_far_tiles_can_occur(monkeypatch):
    """At distance i - j no pair is saturated when neither side is longer than the saturation distance (512 for
    DeBERTa-v3 base): such calls, most of them, build no FAR and launch nothing for it. Longer ones pay two
    launches per direction (gathering COL's two end columns, writing them), one more where Nk is not a multiple
    of FAR_PAD (the padding's fill)."""
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", False)
    bench = _benchmark_module("triton_host_cost")
    built = _record_far_builds(monkeypatch)
    short = bench.measure(512, 1024, 2, 64, "tables")
    assert built == [] and short["forward"]["launches"] == {"bmm": 2}
    long = bench.measure(1024, 2048, 2, 64, "tables")
    assert built == [(2, 2, 1024)] * 2  # forward, backward
    assert long["forward"]["launches"] == {"bmm": 2, "index": 1, "copy_": 1}, long["forward"]["launches"]
    ragged = bench.measure(1000, 2000, 2, 64, "skew")
    assert ragged["forward"]["launches"] == {"bmm": 2, "index": 2, "fill_": 1, "copy_": 1}


@pytest.mark.parametrize(
    "cu_seqlens, built",
    [((0, 12, 28, 35, 51, 66), 0), ((0, 5, 38, 40, 66), 2)],
    ids=["sequences_within_sat", "a_sequence_beyond_sat"],
)
def test_packed_rows_build_far_columns_only_for_sequences_longer_than_sat(monkeypatch, cu_seqlens, built):
    """A packed row longer than the saturation distance (16 here) holds no far tile when none of its sequences
    is longer (the loops visit only blocks of their rows' sequences): no FAR, forward or backward; one of 33
    tokens needs it in both. The results match eager either way (a far tile reading the absent FAR would not)."""
    calls = _record_far_builds(monkeypatch)
    c = Case(n=70, cu_seqlens=cu_seqlens)
    lengths = [b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])]
    assert c.rel.saturation == 16 and max(lengths) == (16 if built == 0 else 33)
    _compare(c, torch.float32, DEVICE)
    assert len(calls) == built


def test_host_cost_counts_what_each_operation_must_read():
    """`triton_host_cost` counts a gather's reads as the elements it gathers and its indices, not its whole
    source: FAR's two end columns of an N×R table (`_far_columns`) read 2 of each row's R cells. Counting the
    source made the forward's host part at N = 2048 move 1.27 GB instead of 0.87, and `triton_bounds`' caps
    there 18-20% too low. A copy does not read its destination, nor ``new_zeros`` the tensor it is called on
    (the fold's zeros, `_into_rows`); other operations read their whole inputs."""
    bench = _benchmark_module("triton_host_cost")
    table = torch.empty(2, 4096, 512, device="meta")  # (H, B·N, R) float32
    ends = torch.empty(2, dtype=torch.int64, device="meta")
    size = table.numel() * 4
    with bench.Recorder() as rec:
        table[..., ends]
        torch.index_select(table, 2, ends)
        table + 1
        table.copy_(table + 0)
        table.new_zeros((2, 4096, 2))
    gathered = 2 * 4096 * 2 * 4
    assert rec.launch_bytes == [2 * gathered + 16, 2 * gathered + 16, 2 * size, 2 * size, 2 * size, gathered]


def test_backward_writes_no_float32_gradient_of_table_size(monkeypatch):
    """The backward's float32 buffers the size of an N×R table are the two recomputed tables, ROW and COL, and
    nothing else: the distance buffers hold the inputs' dtype and are folded by matmuls, not into (N, R) row
    gradients (before: the distance buffers, both row gradients and their scaled copies, in float32)."""
    monkeypatch.setattr(triton_backend, "POISON_DISTANCE_BUFFERS", False)
    bench = _benchmark_module("triton_host_cost")
    seen = []

    class Sizes(bench.Recorder):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if not func.is_view and func.overloadpacket.__name__ not in bench.VIEWS:
                seen.extend((func.__name__, t.dtype, t.numel()) for t in torch.utils._pytree.tree_leaves(out)
                            if isinstance(t, torch.Tensor))  # fmt: skip
            return out

    real = bench.Recorder
    bench.Recorder = Sizes
    try:
        row = bench.measure(512, 1024, 2, 64, "tables")
    finally:
        bench.Recorder = real
    assert row["backward"]["fp32_flops"] == 0
    table = 2 * 2 * 512 * 512  # B · H · N · R (N = 512 uses every row of the v3 table)
    big = [(name, dtype) for name, dtype, n in seen if n >= table]
    f32 = [name for name, dtype in big if dtype == torch.float32]
    # forward: ROW and COL; backward: ROW and COL again. bfloat16: the two distance buffers (allocated)
    assert len(f32) == 4, big
    assert sum(dtype == torch.bfloat16 for _, dtype in big) == 2, big


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tensor_core_tables_equal_float32_products_gpu(dtype):
    """The tables' 16-bit products with float32 results give the float32 products of the same (exactly
    widened) operands, up to the order of float32 accumulation."""
    g = torch.Generator(device="cuda").manual_seed(0)
    # q in the projections' layout, read per head as (H, B·N, d) without a copy
    q = torch.randn(2, 300, 3, 64, device="cuda", generator=g).to(dtype).transpose(1, 2)
    table = torch.randn(3, 64, 512, device="cuda", generator=g).to(dtype)
    per_head = triton_backend._matmul_f32(triton_backend._per_head(q), table)  # (H, B·N, R)
    got = per_head.unflatten(1, (2, 300)).transpose(0, 1)
    want = torch.matmul(q.double(), table.double()).float()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize(
    "name, far_tiles",
    [
        ("n7", False),  # shorter than the saturation (16)
        ("packed_short_sequences", False),  # a longer row, its sequences shorter
        ("n70_saturating", True),
        ("packed", True),  # a sequence of 33
        ("explicit_positions", True),  # not at distance i - j: tiles classified as they come
    ],
)
def test_kernels_are_told_whether_a_far_tile_may_occur(name, far_tiles):
    """Every kernel's launch carries FAR_TILES (`triton_backend._far_tiles`): false where no visible pair lies
    the saturation or more apart, where each program's loop is then one near run whose backward sums no
    saturated pair (`triton_kernels._NEAR_ONLY`); the grid's comparisons with eager run both kinds."""
    from debertakit.attention.triton_access import record_run

    c = GRID[name]
    with record_run("triton_kernels.py") as (_, launches):
        _run(triton_attention, c, _inputs(c, torch.float32, DEVICE), _geometry(c, DEVICE))
    told = {kernel: kwargs["FAR_TILES"] for kernel, (_, kwargs) in launches.items()}
    assert told == dict.fromkeys(triton_backend.KERNEL_NAMES, far_tiles)


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize("name", ["n7", "packed_short_sequences"])
def test_three_runs_where_no_far_tile_occurs_match_eager(monkeypatch, name):
    """`ONE_NEAR_RUN` off (the benchmark's "triton (three runs)" row): inputs without far tiles run the three
    runs of longer ones, two of them empty, as before the one near run; against eager."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "ONE_NEAR_RUN", False)
    with record_run("triton_kernels.py") as (_, launches):
        _compare(GRID[name], torch.float32, DEVICE)
    assert all(kwargs["FAR_TILES"] for _, kwargs in launches.values())


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's loads")
def test_record_run_sees_every_tile_load_at_the_addresses_of_its_tensors(monkeypatch):
    """`triton_access.record_run` (what `benchmarks/triton_memory.py` reads) under the interpreter: each kernel's
    first launch, and per tile the K block's addresses inside k's storage and the near band's gathers (on the
    tables road, whatever the default road)."""
    from debertakit.attention.triton_access import record_run

    monkeypatch.setattr(triton_backend, "NEAR_BAND", "tables")
    c = GRID["n70_saturating"]
    geom = _geometry(c, DEVICE)
    q, k, v, pos_q, pos_k = _inputs(c, torch.bfloat16, DEVICE)
    with record_run("triton_kernels.py") as (loads, launches):
        _run(triton_attention, c, (q, k, v, pos_q, pos_k), geom)
    assert {"_fwd_kernel", "_dq_kernel", "_dkv_kernel"} <= set(launches)
    args, kwargs = launches["_fwd_kernel"]
    assert kwargs["BLOCK_M"] == 16 and kwargs["num_warps"] == 1
    assert args[0][:2] == ("tensor", "*bf16")  # q, described by its Triton type
    tiles_per_program = -(-c.n // 16)
    programs = tiles_per_program * q.shape[0] * q.shape[1]
    blocks = [
        calls for (kernel, fn, _), calls in loads.items() if kernel == "_fwd_kernel" and fn == "_key_block"
    ]
    assert [len(calls) for calls in blocks] == [programs * tiles_per_program] * 2  # K and V, every tile
    start = k.untyped_storage().data_ptr()
    end = start + k.untyped_storage().nbytes()
    for addresses, live, itemsize in blocks[0]:
        assert itemsize == 2 and addresses.shape == (16, q.shape[-1])
        assert ((addresses[live] >= start) & (addresses[live] < end)).all()
    # n70 saturates: some tiles are near and gather their table cells (float32, one per pair)
    gathers = [calls for (kernel, fn, _), calls in loads.items() if kernel == "_fwd_kernel" and fn == "_tile"]
    assert gathers and all(calls[0][0].shape == (16, 16) for calls in gathers)
    assert 0 < len(gathers[0]) < programs * tiles_per_program


def test_custom_ops_take_their_inputs_in_few_arguments():
    """`torch.library.custom_op`'s autograd wrapper rebuilds the schema's arguments once per argument in every
    forward with grad (``fill_defaults``), a cost quadratic in their number: 152 µs a call at the forward's 27
    arguments before they were grouped (`_Aux`, `_Config`), 16 µs at 8 (`benchmarks/triton_dispatch.py`). The
    groups hold every field the ops read, in the order the call passes them."""
    for name in ("disentangled_attention_fwd", "disentangled_attention_bwd"):
        schema = getattr(torch.ops.debertakit, name).default._schema
        assert len(schema.arguments) <= 11, (name, len(schema.arguments))
    assert triton_backend._Config.of([512, 1, 0, 1, 0, 1, 1, 7, 64, 32, 1]) == (
        512,
        True,
        False,
        True,
        False,
        True,
        True,
        7,
        64,
        32,
        True,
    )
    with pytest.raises(ValueError):  # a config of another length
        triton_backend._Config.of([512, 1, 0])
    assert len(triton_backend._Aux._fields) == 14


def test_a_call_with_every_auxiliary_input_trains(monkeypatch):
    """Packed sequences with padding (segments and a key mask), dropout (a seed) and the distance road (its
    cells, and the forward's cut to the saturation: `FORWARD_REACH`): every field of `_Aux` is a tensor, so
    `custom_op` takes the list as that many inputs and the backward returns a list of as many gradients
    (`_backward`); against eager times the kernels' mask. The call runs through the custom op, as a compiled graph
    does (eager calls do not dispatch it: `_attention`)."""
    c = Case(n=60, heads=2, cu_seqlens=(0, 20, 50), terms=PositionTerms(c2p=True, p2c=True))
    monkeypatch.setattr(triton_backend, "NEAR_BAND", "distance")
    monkeypatch.setattr(triton_backend, "FORWARD_REACH", "saturation")
    captured = []
    op = triton_backend._fwd_op
    monkeypatch.setattr(triton_backend, "_attention", lambda *a: captured.append(a[5]) or op(*a))
    _compare_with_dropout(monkeypatch, c, torch.float32, DEVICE, 0.2, check_rate=False)
    assert captured and all(t is not None for t in captured[0]), [
        name for name, t in zip(triton_backend._Aux._fields, captured[0]) if t is None
    ]


def test_dispatch_benchmark_times_the_host_side_of_a_call(tmp_path, capsys):
    import json

    bench = _benchmark_module("triton_dispatch")
    out = tmp_path / "dispatch.json"
    assert bench.main(["--reps", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["op"] for r in result["custom_ops"]] == [
        "disentangled_attention_fwd",
        "disentangled_attention_bwd",
    ]
    assert [r["road"] for r in result["calls"]] == [*bench.ROADS, bench.MODEL_TABLES, bench.KEY_MASK]
    for r in result["calls"]:
        assert 0 < r["forward_no_grad_us"] and 0 < r["forward_with_grad_us"] < r["forward_backward_us"]
        assert r["forward_new_geometry_us"] > 0 and r["forward_planned_us"] > 0
        assert r["forward_backward_planned_us"] > 0
    # a masked geometry's inputs are built once per geometry: ops on a new one, none on the same
    masked = result["calls"][-1]
    assert masked["ops_new_geometry"] > 0 and masked["ops_same_geometry"] == 0
    assert "| custom op | schema arguments |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--reps 0: expected a positive count"):
        bench.main(["--reps", "0", "--out", str(out)])


@pytest.mark.skipif(DEVICE != "cpu", reason="records the interpreter's launches")
@pytest.mark.parametrize(
    "name, road",
    [("wide_padding", "distance"), ("n70_saturating", "distance"), ("n70_saturating", "tables")],
)
def test_every_pointer_a_launch_passes_is_16_byte_aligned(monkeypatch, name, road):
    """What the compiled kernels assume (`triton_aot.attributes`, from which the static report compiles them, and
    `PRODUCT_ALIGNED`): every pointer a launch passes 16-byte aligned, as Triton's launch then specialises it,
    and the integers said to be multiples of 16 such multiples (and DW one more than one with ``GRAD_BANDS``),
    forward and backward, distance tables in bands (`wide_padding`) and in one band, and the tables road; the
    backward's fold kernels (bfloat16: the default) launched on the distance road, their pointers aligned and
    DW - 1 a multiple of 16 (`FOLD_ALIGNED`). Banded tables once started on an odd element (their
    lead of zeros, `_distance_slack`, is odd), and a GPU compiled the kernels there with element loads
    (`_product_buffer`)."""
    from debertakit.attention import triton_kernels, triton_products
    from debertakit.attention.triton_access import record_run
    from debertakit.attention.triton_aot import PRODUCT_ALIGNED, aligned_ints

    _near_band(monkeypatch, road)
    bands = _distance_bands(monkeypatch, 16) if road == "distance" else []
    c = BANDED_GRID[name] if name in BANDED_GRID else GRID[name]
    with record_run("triton_kernels.py") as (_, launches):
        _run(triton_attention, c, _inputs(c, torch.bfloat16, DEVICE), _geometry(c, DEVICE))
    assert set(triton_backend.KERNEL_NAMES) <= set(launches)
    assert bands == ([16, 16] if name == "wide_padding" else [0, 0] if road == "distance" else [])

    def ints(kernel: str, kwargs: dict) -> set[str]:
        # the fold kernels' other integers of `FOLD_ALIGNED` are multiples of 16 at real shapes only
        if kernel.startswith("_fold_"):
            return {"DW1"}
        return PRODUCT_ALIGNED if kernel == "_distance_product_kernel" else aligned_ints(kwargs)

    unaligned = []
    for kernel, (args, kwargs) in launches.items():
        fn = getattr(triton_kernels, kernel, None) or getattr(triton_products, kernel)
        for name, arg in zip(fn.arg_names, args):
            if isinstance(arg, tuple) and arg[0] == "tensor":
                bad = arg[2] != "D"
            elif name == "DW" and kwargs.get("GRAD_BANDS"):  # (`_table_grad` says DW - 1 a multiple of 16)
                bad = arg % 16 != 1
            else:
                bad = name in ints(kernel, kwargs) and arg % 16 != 0
            if bad:
                unaligned.append((kernel, name, arg))
    assert not unaligned
    assert road == "tables" or {
        "_distance_product_kernel",
        "_fold_product_kernel",
        "_fold_sums_kernel",
    } <= set(launches)


def test_a_call_makes_its_tensors_cuda_device_current(monkeypatch):
    """Triton launches on the current CUDA device: a call on another device's tensors makes theirs current
    (`triton_backend._on_device`), and none where it is current already or off CUDA."""
    entered = []

    class Device:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Device)
    for device in ("cuda:1", "cuda:0", "cpu"):
        with triton_backend._on_device(torch.device(device)):
            pass
    assert entered == [torch.device("cuda:1")]


def test_every_entry_of_a_call_takes_its_tensors_device(monkeypatch):
    """The call (its whole plan's replays and the eager forward included), the eager backward, and the custom
    ops' bodies (what a compiled graph calls) each make q's device current for their launches."""
    seen, captured = [], []
    real_on_device, real_attention = triton_backend._on_device, triton_backend._attention
    monkeypatch.setattr(
        triton_backend, "_on_device", lambda device: seen.append(device) or real_on_device(device)
    )
    monkeypatch.setattr(
        triton_backend, "_attention", lambda *args: captured.append(args) or real_attention(*args)
    )
    c = Case(n=16, terms=PositionTerms(c2p=True, p2c=False))
    inputs = _inputs(c, torch.float32, DEVICE)
    _run(triton_attention, c, inputs, Geometry())
    # the call, the backward's body (through `_planned_bwd`, and `_bwd` itself)
    assert len(seen) == 3 and set(seen) == {inputs[0].device}
    del seen[:]
    q, k, v, pos_q, pos_k, aux, scale, config = captured[0]
    out, lse = torch.ops.debertakit.disentangled_attention_fwd(q, k, v, pos_q, pos_k, aux, scale, config)
    torch.ops.debertakit.disentangled_attention_bwd(out, q, k, v, out, lse, pos_q, pos_k, aux, scale, config)
    assert seen == [q.device, q.device]


@pytest.mark.gpu
def test_a_call_on_another_cuda_device_than_the_current_one_gpu():
    """On a machine with two GPUs: a call on ``cuda:1`` while ``cuda:0`` is current, forward and backward,
    against `eager` on the same inputs."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices; this machine has {torch.cuda.device_count()}")
    c = GRID["padding"]
    with torch.cuda.device(0):
        geom = _geometry(c, "cuda:1")
        inputs = _inputs(c, torch.float32, "cuda:1")
        out, grads = _run(triton_attention, c, inputs, geom)
        ref, ref_grads = _run(eager_attention, c, list(inputs), geom, _grad_out(out))
    _assert_close(c, inputs, torch.float32, (out, *grads), (ref, *ref_grads))


def test_a_training_step_after_an_inference_mode_call(monkeypatch):
    """What the backend keeps across calls (the mapping's lookup tables and cells, the rows of geometries of
    shapes alone) is made of normal tensors even when the first call ran under `torch.inference_mode`: a
    forward with grad saves them for its backward, which inference tensors cannot be. (A mapping and a store of
    the shapes' rows of the test's own: nothing kept by an earlier test.)"""
    monkeypatch.setattr(triton_backend, "_SHAPE_INPUTS", type(triton_backend._SHAPE_INPUTS)())
    c = Case(n=16, rel=RelativeIndex(span=6, bucket_size=6, max_position=12))
    inputs = _inputs(c, torch.float32, DEVICE)
    with torch.inference_mode():
        triton_attention(*inputs, c.rel, Geometry(), scale=0.3, terms=c.terms)
    out, grads = _run(triton_attention, c, inputs, Geometry())
    ref, ref_grads = _run(eager_attention, c, list(inputs), Geometry(), _grad_out(out))
    _assert_close(c, inputs, torch.float32, (out, *grads), (ref, *ref_grads))
