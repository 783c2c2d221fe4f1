"""`triton_aot`'s reading of compiled kernels that needs no compiler: the loads left inside branches of a TTGIR,
the loops over tiles of a SASS listing, the replicated matrix products of a TTGIR."""

from __future__ import annotations

import pytest

from debertakit.attention.triton_aot import branch_loads, replication, straight_path, tile_loops

# the printer's layout (Triton 3.6 / 3.9): a loop whose K tile arrives by asynchronous copy, a two-level branch
# with a load on each of its three paths, a reduction region (braces inside types and around the region) and a
# load at the top of the loop body
LOOP = """\
    %acc:2 = scf.for %i = %lo to %hi step %c64_i32 iter_args(%a = %cst) -> (tensor<64xf32, #ttg.slice<{dim = 1, parent = #mma}>>)  : i32 {
      %k = ttg.async_copy_global_to_local %kp, %buf mask %m : tensor<64x64x!tt.ptr<bf16>, #blocked> -> <64x64xbf16, #shared1, #smem, mutable> loc(#loc1)
      %lo_1 = "tt.reduce"(%x) <{axis = 0 : i32}> ({
      ^bb0(%l: i32, %r: i32):
        %min = arith.minsi %l, %r : i32 loc(#loc2)
        tt.reduce.return %min : i32 loc(#loc2)
      }) : (tensor<64xi32, #blocked2>) -> i32 loc(#loc3)
      %s:1 = scf.if %far_right -> (tensor<64x64xf32, #mma>) {
        %c = tt.load %cp, %n_in, %cst_3 : tensor<64x!tt.ptr<f32>, #ttg.slice<{dim = 0, parent = #mma}>> loc(#loc4)
        scf.yield %c : tensor<64x64xf32, #mma> loc(#loc4)
      } else {
        %t = scf.if %far_left -> (tensor<64x64xf32, #mma>) {
          %d = tt.load %dp, %n_in, %cst_3 : tensor<64x!tt.ptr<f32>, #ttg.slice<{dim = 0, parent = #mma}>> loc(#loc5)
          scf.yield %d : tensor<64x64xf32, #mma> loc(#loc5)
        } else {
          %e = tt.load %ep, %allowed, %cst : tensor<64x64x!tt.ptr<f32>, #blocked> loc(#loc6)
          scf.yield %e : tensor<64x64xf32, #mma> loc(#loc6)
        } loc(#loc7)
        scf.yield %t : tensor<64x64xf32, #mma> loc(#loc7)
      } loc(#loc8)
      %z = tt.load %zp : !tt.ptr<i32> loc(#loc9)
      scf.yield %s, %z : tensor<64x64xf32, #mma>, i32 loc(#loc9)
    } loc(#loc10)
    %after = tt.load %ap : !tt.ptr<i32> loc(#loc11)
"""


def test_branch_loads_counts_loads_on_every_path_of_nested_branches():
    assert branch_loads(LOOP) == 3


def test_loads_at_the_top_of_a_loop_or_after_it_are_not_counted():
    without_branch = LOOP.replace(" scf.if ", " scf.execute_region ")  # the same nesting, no branch
    assert branch_loads(without_branch) == 0


# cuobjdump's layout: a branch over a loop whose body (0x20 .. 0x50) holds a tensor-core product, a loop without
# one (zeroing a buffer), a forward branch inside the first loop, and the listing's closing self-branch
SASS = """\
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/               @P0 BRA 0x70 ;                             /* 0x0000000400000947 */
        /*0020*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ; /* 0x0000000004187df0 */
        /*0030*/              @!P2 BRA 0x50 ;                             /* 0x000000000000a947 */
        /*0040*/                   FADD R2, R2, R3 ;                      /* 0x0000000302027221 */
        /*0050*/              @!P1 BRA 0x20 ;                             /* 0xfffffffc00f09947 */
        /*0060*/                   STS [R1], RZ ;                         /* 0x000000ff01007388 */
        /*0070*/               @P2 BRA 0x60 ;                             /* 0xfffffffc00f82947 */
        /*0080*/                   EXIT ;                                 /* 0x000000000000794d */
        /*0090*/                   BRA 0x90;                              /* 0xfffffffc00fc7947 */
"""


def test_tile_loops_counts_the_bodies_of_loops_with_a_matrix_product():
    assert tile_loops(SASS) == [
        4
    ]  # 0x20 .. 0x50; the loop at 0x60 zeroes, the last branch closes the listing
    assert tile_loops(SASS.replace("HGMMA.64x32x16.F32.BF16", "HMMA.16816.F32.BF16")) == [4]
    assert tile_loops(SASS.replace("STS [R1], RZ", "HMMA.16816.F32.BF16 R4, R8, R12, R4")) == [4, 2]
    assert tile_loops(SASS.replace("@!P1 BRA 0x20", "@!P1 BRA 0x60")) == []  # no backward branch over it


# a kernel without loops in cuobjdump's layout: a guarded branch to masked stores, an unconditional jump over
# them, vector stores, a guarded exit, the exit
PATH = """\
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/               @P4 BRA 0x60 ;                             /* 0x0000000000104947 */
        /*0020*/                   BRA 0x40 ;                             /* 0x0000000000047947 */
        /*0030*/                   STG.E.U16 desc[UR4][R2.64], R0 ;       /* 0x0000000002007986 */
        /*0040*/                   STG.E.128 desc[UR4][R2.64], R8 ;       /* 0x0000000802007986 */
        /*0050*/               @P3 EXIT ;                                 /* 0x000000000000394d */
        /*0058*/                   STG.E.128 desc[UR4][R4.64], R12 ;      /* 0x0000000c04007986 */
        /*005c*/                   EXIT ;                                 /* 0x000000000000794d */
        /*0060*/               @P1 STG.E.U16 desc[UR4][R2.64], R0 ;       /* 0x0000000002001986 */
        /*0070*/                   EXIT ;                                 /* 0x000000000000794d */
        /*0080*/                   BRA 0x80;                              /* 0xfffffffc00fc7947 */
"""


def test_straight_path_follows_jumps_and_passes_guarded_branches():
    # 0x00, 0x10 (not taken), 0x20 (taken), 0x40, 0x50 (guarded: passed), 0x58, 0x5c
    assert straight_path(PATH) == (7, 2)
    assert straight_path(PATH.replace("@P4 BRA 0x60", "BRA 0x60")) == (4, 1)  # jumps to the masked stores
    assert straight_path(PATH.replace("BRA 0x40 ", "BRA 0x00 ")) == (3, 0)  # a loop back: stops there


# the printer's layout (Triton 3.6 / 3.9): the forward at 64x64 with 8 warps, its scores' product over 8 warps
# along 64 rows (two warpgroups of 64 rows: each computes every score), P·V over 4 x 2 warps
PRODUCTS = """\
#mma = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [4, 2], instrShape = [16, 32, 16]}>
#mma1 = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [8, 1], instrShape = [16, 32, 16]}>
      %s_291 = ttng.warp_group_dot %q_94, %s_289, %cst_4 {inputPrecision = 0 : i32, isAsync = true} : !ttg.memdesc<64x64xbf16, #shared, #smem> * !ttg.memdesc<64x64xbf16, #shared2, #smem, mutable> -> tensor<64x64xf32, #mma1> loc(#loc438)
      %acc_1 = ttng.warp_group_dot %p, %v, %acc {inputPrecision = 0 : i32, isAsync = true} : tensor<64x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> * !ttg.memdesc<64x64xbf16, #shared, #smem, mutable> -> tensor<64x64xf32, #mma> loc(#loc422)
"""


def test_replication_is_the_most_repeated_products_factor():
    assert replication(PRODUCTS) == 2  # 8 warps x 16 rows over 64 rows
    assert replication(PRODUCTS.replace("-> tensor<64x64xf32, #mma1>", "-> tensor<128x64xf32, #mma1>")) == 1
    assert replication(PRODUCTS.replace("warpsPerCTA = [8, 1]", "warpsPerCTA = [4, 2]")) == 1
    # the older tensor cores (tt.dot): 8 warps x 8 columns over a 32 x 32 tile, along the columns this time
    older = (
        "#mma = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [1, 8], instrShape = [16, 8]}>\n"
        "    %s = tt.dot %k, %q, %z, inputPrecision = tf32 : tensor<32x64xbf16, #ttg.dot_op<{opIdx = 0, parent = "
        "#mma, kWidth = 8}>> * tensor<64x32xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> -> "
        "tensor<32x32xf32, #mma> loc(#loc1)\n"
    )
    assert replication(older) == 2
    assert replication(older.replace("[1, 8]", "[2, 4]")) == 1
    # both sides over-covered multiply
    assert replication(older.replace("[1, 8]", "[4, 8]")) == 4
    with pytest.raises(RuntimeError, match="no tensor-core product"):
        replication(LOOP)
