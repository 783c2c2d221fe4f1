"""`triton_access`: which lanes of a warp read which elements under a Triton layout, how many 32-byte sectors a
warp's request touches, and where the compiler's listings put each load (no compiler needed: the listings are
the printers' real lines, Triton 3.6 / 3.9)."""

from __future__ import annotations

import numpy as np
import pytest

from debertakit.attention.triton_access import (
    Blocked,
    Site,
    access_bytes,
    blocked_layouts,
    load_sites,
    load_widths,
    sectors,
    store_widths,
    traffic,
    warp_requests,
)

# the tables road's gather layout (lanes down the rows of one column) and the K / V tiles' (8 elements a thread
# along the rows' fastest dimension), as Triton 3.6 printed them for the forward at 64x32 with 4 warps
TTGIR = """\
#blocked = #ttg.blocked<{sizePerThread = [1, 8], threadsPerWarp = [4, 8], warpsPerCTA = [4, 1], order = [1, 0]}>
#blocked2 = #ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [32, 1], warpsPerCTA = [2, 2], order = [0, 1]}>
#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 1], instrShape = [16, 32, 16]}>
module {
    %k_145 = ttg.async_copy_global_to_local %k_140, %k_142 mask %l other %c {contiguity = 8 : i32} : tensor<32x64x!tt.ptr<bf16>, #blocked> -> <32x64xbf16, #shared, #smem, mutable> loc(#loc464)
    %ridx_217 = tt.load %ridx_215, %l_i_216 : tensor<64x32x!tt.ptr<i32>, #blocked2> loc(#loc538)
    %s_221 = ttg.async_copy_global_to_local %s_219, %s_220 mask %l_i_216 : tensor<64x32x!tt.ptr<f32>, #blocked2> -> <64x32xf32, #shared3, #smem, mutable> loc(#loc534)
    %row = tt.load %p, %m, %c : tensor<64x!tt.ptr<f32>, #ttg.slice<{dim = 1, parent = #mma}>> loc(#loc600)
    %lse = tt.load %p2, %m2 : tensor<32x!tt.ptr<f32>, #ttg.slice<{dim = 0, parent = #blocked2}>> loc(#loc601)
}
#loc100 = loc("/src/debertakit/attention/triton_kernels.py":561:16)
#loc101 = loc("/src/debertakit/attention/triton_kernels.py":587:112)
#loc376 = loc("/src/debertakit/attention/triton_kernels.py":384:36)
#loc380 = loc("/src/debertakit/attention/triton_kernels.py":381:29)
#loc463 = loc("/src/debertakit/attention/triton_kernels.py":709:21)
#loc464 = loc("k"(#loc465))
#loc465 = loc(callsite(#loc100 at #loc101))
#loc534 = loc(callsite(#loc376 at #loc463))
#loc538 = loc(callsite(#loc380 at #loc463))
#loc600 = loc("/src/debertakit/attention/triton_kernels.py":541:24)
#loc601 = loc("/elsewhere/other.py":12:3)
"""

PTX = """\
	.loc	1 381 29                        // triton_kernels.py:381:29 @[ triton_kernels.py:709:21 ]
	ld.global.b32 { %r59 }, [ %rd31 + 0 ];
	.loc	1 528 16                        // triton_kernels.py:528:16
	@%p2 ld.global.v4.b32 { %r61, %r62, %r63, %r64 }, [ %rd33 + 0 ];
	.loc	1 561 16
	cp.async.cg.shared.global [ %r944 + 0 ], [ %rd43 + 0 ], 0x10, %r91;
	.loc	1 384 36
	@%p1 cp.async.ca.shared.global [ %r31 + 0 ], [ %rd47 + 0 ], 0x4, %r93;
	.loc	1 390 5
	ld.global.nc.L1::evict_last.b16 { %rs1 }, [ %rd50 + 0 ];
	.loc	2 40 1
	ld.global.v2.b32 { %r1, %r2 }, [ %rd51 + 0 ];
	.file	1 "/src/debertakit/attention/triton_kernels.py"
	.file	2 "/site-packages/triton/language/standard.py"
"""

GATHER = Blocked((1, 1), (32, 1), (2, 2), (0, 1))
ROWS = Blocked((1, 8), (4, 8), (4, 1), (1, 0))


def test_layouts_are_read_from_the_ir():
    layouts = blocked_layouts(TTGIR)
    assert layouts == {"#blocked": ROWS, "#blocked2": GATHER}


def test_loads_are_placed_at_their_innermost_source_line():
    sites = load_sites(TTGIR, "triton_kernels.py")
    # through a name and a call site to the helper's line; the gather through a call site
    assert sites[561] == Site("ttg.async_copy_global_to_local", ROWS)
    assert sites[381] == Site("tt.load", GATHER)
    assert sites[384] == Site("ttg.async_copy_global_to_local", GATHER)
    # a slice of a tensor-core layout is not modelled; a load of another file is not this file's
    assert 541 not in sites and 12 not in sites
    assert set(sites) == {561, 381, 384}


def test_slice_layouts_keep_the_dimension_they_remove():
    text = TTGIR.replace(
        '("/elsewhere/other.py":12:3)', '("/src/debertakit/attention/triton_kernels.py":12:3)'
    )
    assert load_sites(text, "triton_kernels.py")[12] == Site("tt.load", GATHER, sliced=0)


def test_bytes_per_lane_come_from_the_ptx_of_this_file():
    # 4-byte loads, 16-byte vectors, 16- and 4-byte asynchronous copies, a 2-byte load with cache qualifiers;
    # the standard library's (file 2) line 40 is not the kernel file's
    assert access_bytes(PTX, "triton_kernels.py") == {381: 4, 528: 16, 561: 16, 384: 4, 390: 2}


def test_load_widths_count_every_global_load_of_the_ptx():
    # the same listing, every file's loads counted by bytes per lane (instructions, not executions)
    assert load_widths(PTX) == {2: 1, 4: 2, 8: 1, 16: 2}
    stores = "\tst.global.v4.b32 [ %rd1 + 0 ], { %r1, %r2, %r3, %r4 };\n\t@%p3 st.global.b16 [ %rd2 + 0 ], { %rs1 };"
    assert load_widths(stores) == {}  # stores are not loads
    assert store_widths(stores) == {2: 1, 16: 1} and store_widths(PTX) == {}


def test_gather_layout_puts_a_warp_down_one_column():
    req = warp_requests(GATHER, (64, 32))
    assert req.shape == (64, 32)  # 2048 elements, 32 a request
    assert sorted(req.ravel().tolist()) == list(range(64 * 32))  # each element read once
    rows, cols = np.unravel_index(req[0], (64, 32))
    assert rows.tolist() == list(range(32)) and set(cols.tolist()) == {0}


def test_vector_layout_reads_eight_consecutive_elements_a_lane():
    req = warp_requests(ROWS, (32, 64), vec=8)
    assert req.shape == (8, 32)  # 2048 elements, 8 a lane, 32 lanes a request
    starts = sorted(req.ravel().tolist())
    assert starts == list(range(0, 32 * 64, 8))
    rows, cols = np.unravel_index(req[0], (32, 64))
    assert rows.tolist() == [r for r in range(4) for _ in range(8)] and cols.tolist()[:8] == list(
        range(0, 64, 8)
    )
    with pytest.raises(ValueError, match="do not divide"):
        warp_requests(ROWS, (32, 64), vec=3)


def test_a_tensor_smaller_than_the_layout_is_read_by_lanes_holding_copies():
    req = warp_requests(ROWS, (8, 64), vec=8)  # the layout covers 16 rows: warps 2 and 3 repeat warps 0 and 1
    assert req.shape == (4, 32)
    assert (req[:2] == req[2:]).all()


def test_a_slice_layout_maps_lanes_along_the_removed_dimension_to_copies():
    # a row of 32 columns: the 32 lanes of a warp, and the two warps along the rows, read one column together
    req = warp_requests(GATHER, (32,), sliced=0)
    assert req.shape == (64, 32)  # 4 warps, 16 columns each (the layout spans 2 columns, repeated 16 times)
    assert all(len(set(r.tolist())) == 1 for r in req)
    assert (req[:16] == req[16:32]).all() and (req[32:48] == req[48:]).all()
    assert sorted({r[0] for r in req.tolist()}) == list(range(32))


def test_sectors_count_what_each_request_touches():
    lanes = np.arange(32)
    live = np.ones((1, 32), dtype=bool)
    assert sectors((lanes * 4)[None], live, 4) == (1, 4)  # 128 consecutive bytes
    assert sectors((lanes * 2048)[None], live, 4) == (1, 32)  # one row each
    assert sectors((lanes * 16)[None], live, 16) == (1, 16)  # 512 consecutive bytes in 16-byte vectors
    assert sectors((4 + lanes * 16)[None], live, 16) == (1, 17)  # the same, misaligned by 4 bytes
    assert sectors(np.zeros((1, 32), dtype=np.int64), live, 4) == (1, 1)  # a broadcast
    half = np.arange(32) < 16
    assert sectors((lanes * 2048)[None], half[None], 4) == (1, 16)  # masked lanes read nothing
    assert sectors(np.stack([lanes * 4, lanes * 4]), np.stack([live[0], ~live[0]]), 4) == (1, 4)  # not issued


def test_traffic_compares_each_site_with_the_sectors_its_elements_need():
    # a (64, 32) float32 tile, rows 2 KB apart, read by the gather layout (lanes down a column) and by rows
    addresses = (np.arange(64)[:, None] * 2048 + np.arange(32)[None, :] * 4).astype(np.int64)
    live = np.ones((64, 32), dtype=bool)
    records = {("k", "_tile", 384): [(addresses, live, 4)] * 3, ("k", "_tile", 999): [(addresses, live, 4)]}
    rows_layout = Blocked((1, 4), (8, 4), (4, 1), (1, 0))
    sites = {384: Site("ttg.async_copy_global_to_local", GATHER)}
    rows, skipped = traffic(records, sites | {385: Site("tt.load", rows_layout)}, {384: 4, 385: 16})
    assert skipped == ["_tile:999 (no tensor load of a blocked layout there in the compiled kernel)"]
    (site,) = rows
    assert (site.calls, site.requests, site.sectors, site.needed) == (3, 64, 2048, 256)  # 32 rows a request
    assert site.excess == 8
    records = {("k", "_tile", 385): [(addresses, live, 4)]}
    (site,), _ = traffic(records, {385: Site("tt.load", rows_layout)}, {385: 16})
    assert (site.requests, site.sectors, site.needed) == (16, 256, 256)  # coalesced: what the tile needs
