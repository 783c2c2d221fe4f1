"""Compile the `triton` backend's kernels for NVIDIA targets without a GPU (see `triton_aot`). Catches what the
CPU interpreter cannot (globals that are not constexpr, type mismatches between branches, unsupported ops,
shared-memory overflow).

Run in a process where TRITON_INTERPRET is not set (the kernels must be JIT functions)::

    python tests/attention/compile_triton_kernels.py          # the configured GPU tiles, bf16, d 64 (every
                                                              # released model's) and the default road's
                                                              # variants at d 128, with and without
                                                              # dropout, sm_90, checked
                                                              # for register spills and (at distance
                                                              # i - j) for loads left inside branches and
                                                              # for one loop over tiles per run, and for
                                                              # products the warps compute twice;
                                                              # the distance tables' product and the fold
                                                              # kernels (bf16: every variant at d 64, the
                                                              # default ones at d 128)
                                                              # (and that Triton compiles no tensor-core
                                                              # product for sm_75:
                                                              # `triton_backend.TRITON_TENSOR_CORES`)
    python tests/attention/compile_triton_kernels.py --part forward  # the forward kernel alone (--part
                                                              # backward: dQ and dK/dV, --part dq /
                                                              # dkv: one of them; --part tables:
                                                              # the product and folds)
    python tests/attention/compile_triton_kernels.py --all    # the above at every variant and head dim
                                                              # (16, 32, 64, 128), and dtypes × head dims ×
                                                              # feature flags, sm_90 (+ sm_80),
                                                              # the products' and folds' fp16 too,
                                                              # and the configured tiles for sm_86 within its
                                                              # shared memory
    python tests/attention/compile_triton_kernels.py --product-sweep  # and the distance tables' product at
                                                              # every shape of the GPU suite's sweep
                                                              # (`gpu_suite.PRODUCT_SWEEP_TILES`)
    python tests/attention/compile_triton_kernels.py --fold-sweep  # and the fold kernels at every shape of
                                                              # the GPU suite's sweep, both kernels
                                                              # (`gpu_suite.FOLD_SWEEP_TILES`)
"""

from __future__ import annotations

import argparse
import itertools
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402

from debertakit.attention import triton_backend as B  # noqa: E402
from debertakit.attention import triton_kernels as K  # noqa: E402
from debertakit.attention.triton_aot import (  # noqa: E402
    FLAGS,
    MMA_OPS,
    Tiles,
    compile_fold_kernel,
    compile_kernel,
    compile_product_kernel,
)
from debertakit.attention.triton_backend import (  # noqa: E402
    BACKWARD,
    FOLD_SUMS_TILES,
    FOLD_TILES,
    FORWARD,
    GPU_TIMED,
    KERNEL_NAMES,
    PRODUCT_COLUMN_TILES,
    PRODUCT_NARROW_COLUMN_TILES,
    PRODUCT_ROW_TILES,
    PRODUCT_TILES,
    TRITON_TENSOR_CORES,
    skew_served,
    tiles_for,
)

# The most shared memory one block may use, in bytes (the CUDA programming guide's limits per compute capability,
# opt-in): sm_80 (A100) 163 KB; sm_86, sm_89 and sm_120 (RTX 30, 40 and 50 series, A10, L4) 99 KB; sm_90 227 KB.
# The tiles are the same on every GPU, so the smallest limit binds: --all compiles the configured tiles for sm_86.
SHARED_LIMITS = {80: 163 * 1024, 86: 99 * 1024, 90: 227 * 1024}


# The head dim of every released DeBERTa model (v1, v2, v3, mDeBERTa: hidden size / heads = 64). The default
# run builds the variants of every kernel the backend may run there, and at the other head dims only what it
# runs by default (`_default_road`, `_default_product`, `_default_fold`); --all builds every variant at every
# head dim. Compiles are the default test run's longest step: all 208 took 400 s of a fresh clone's test run
# (2026-11-27); these 80, alone on a quiet machine with an empty Triton cache, 157 s (--part forward 38 s,
# backward 78 s, tables 40 s).
RELEASED_HEAD_DIM = 64
# ``--part``: the attention kernels' forward (with the sm_75 / sm_80 premise) or backward (`triton_kernels`;
# "dq" and "dkv" its two kernels), or the distance tables' product and the backward's fold kernels
# (`triton_products`); the default test run builds forward, dq, dkv and tables in four tests, which two workers
# share (backward alone, the longest, had taken 77-91 s of the default run)
PARTS = {"forward": FORWARD, "backward": BACKWARD, "dq": BACKWARD[:1], "dkv": BACKWARD[1:], "tables": ()}


def _default_road(flags: dict) -> bool:
    """Whether ``flags`` (a `configured` set) is the default road's (`triton_backend.NEAR_BAND`): on the
    distance road, its gradients as `GRADIENT_STORES` stores them, in the tables' one band (inputs longer than
    the saturation) or in their bands (shorter ones)."""
    if B.NEAR_BAND != "distance":
        return flags["IJ"] and flags["SKEW"] == B.NEAR_BAND.startswith("skew") and not flags["DIST"]
    aligned = B.GRADIENT_STORES == "aligned"
    cut = B.FORWARD_REACH == "saturation"  # the forward's tables cut to the saturation (``EDGES``)
    default = flags["IJ"] and flags["DIST"] and flags["GRAD_BANDS"] == aligned and not flags["SKEW"]
    # and, where a kernel takes wide far blocks (`FORWARD_FAR_KEYS`, `DQ_FAR_KEYS`), the variants with them: which
    # one each kernel runs is decided per kernel (`_runs_by_default`)
    wide = B.FORWARD_FAR_KEYS is not None or B.DQ_FAR_KEYS is not None
    return default and flags["EDGES"] == cut and ("FAR_N" not in flags or wide)


def configured(capability: int, everything: bool = True):
    """The configured tiles' configurations: bf16, both head dims, with and without dropout, every road (without
    ``everything``: the default road's (`_default_road`), and at RELEASED_HEAD_DIM every road but the skewed
    one, which `triton_backend.NEAR_BAND` takes only when set to it, with dropout the distance road's)."""
    every = dict(dict.fromkeys(FLAGS, True), GRAD_BANDS=False, EDGES=False)
    for head_dim in (64, 128):
        for dropout in (False, True):
            flags = dict(every, DROPOUT=dropout, SKEW=False, DIST=False)
            for variant in _variants(flags):
                # at RELEASED_HEAD_DIM every road but the skewed one (asked for by name), with dropout the
                # distance road's (the others' dropout is the same code, built by --all)
                released = (
                    head_dim == RELEASED_HEAD_DIM and not variant["SKEW"] and (variant["DIST"] or not dropout)
                )
                if everything or released or _default_road(variant):
                    yield "bf16", head_dim, variant, capability, True


def _variants(flags: dict):
    """The roads and layouts `configured` builds each kernel in, from ``flags``."""
    yield flags
    yield dict(flags, IJ=False)
    yield dict(flags, SKEW=True)  # skewed where served (`_buildable`)
    yield dict(flags, DIST=True)
    # with its gradients in the tables' one band, stored 16 bytes at a time (`GRADIENT_STORES`)
    yield dict(flags, DIST=True, GRAD_BANDS=True)
    # and the forward's tables cut to the saturation, its near tiles selecting the saturated values beyond them
    # (`FORWARD_REACH`; the backward kernels take no such flag: `_buildable`, and `main` builds each
    # configuration once)
    yield dict(flags, DIST=True, GRAD_BANDS=True, EDGES=True)
    # the forward's and dQ's far tiles in blocks of 64 keys, and of 128 without packed rows, where the backend
    # takes them (`FORWARD_FAR_KEYS`, `DQ_FAR_KEYS`, ``FAR_N``, as `_far_keys` gives it per kernel), the forward's
    # tables whole and cut
    for edges in (False, True):
        yield dict(flags, DIST=True, GRAD_BANDS=True, EDGES=edges, FAR_N=64)
        yield dict(flags, DIST=True, GRAD_BANDS=True, EDGES=edges, FAR_N=128, HAS_SEG=False)
    # inputs no longer than the saturation (v3 at N <= 512): one near run per program
    yield dict(flags, FAR_TILES=False)
    yield dict(flags, DIST=True, FAR_TILES=False)
    # and their gradients in the tables' bands at an odd row stride
    yield dict(flags, DIST=True, FAR_TILES=False, GRAD_BANDS=True)


def configurations(everything: bool):
    """(dtype, head dim, flags, capability, configured): what to build, and whether it is a configured tiles'
    build (`configured`), whose cubin is read and checked: for sm_90 the code an H100 runs, for sm_86 its shared
    memory."""
    yield from configured(90, everything)
    if not everything:
        return
    yield from configured(86)
    flag_sets = [dict(zip(FLAGS, bits)) for bits in itertools.product((False, True), repeat=len(FLAGS))]
    # a spread of feature combinations (a stride prime to 2 varies every flag), plus all of them on
    flag_sets = flag_sets[::89] + flag_sets[-1:]
    for dtype, head_dim in (("bf16", 64), ("fp16", 128), ("fp32", 32), ("bf16", 16)):
        for flags in flag_sets:
            yield dtype, head_dim, flags, 90, False
        yield dtype, head_dim, flag_sets[-1], 80, False


def _buildable(flags: dict, head_dim: int, kernel: str) -> dict:
    """The flags as the backend would build them for ``kernel``: skewed only at distance i - j, where
    `SKEW_TILES` / `SKEW_DROPOUT_TILES` serve the kernel's direction at the head dim (`triton_backend._uses_skew`);
    distance tables only at distance i - j, with position terms and not skewed (`triton_backend._uses_distance`)."""
    served = skew_served(head_dim, FORWARD if kernel == "_fwd_kernel" else BACKWARD, flags["DROPOUT"])
    if flags["SKEW"] and (not served or not flags["IJ"]):
        flags = dict(flags, SKEW=False)
    terms = flags["HAS_ROW"] or flags["HAS_COL"]
    if flags["DIST"] and (flags["SKEW"] or not flags["IJ"] or not terms):
        flags = dict(flags, DIST=False)
    if flags["GRAD_BANDS"] and not flags["DIST"]:  # gradients in the distance tables' layout
        flags = dict(flags, GRAD_BANDS=False)
    if not flags["IJ"]:  # tiles classified as they come: a far tile may always occur (`_far_tiles`)
        flags = dict(flags, FAR_TILES=True)
    if flags["EDGES"] and (kernel != "_fwd_kernel" or not flags["DIST"] or not flags["FAR_TILES"]):
        flags = dict(flags, EDGES=False)  # the forward's distance tables alone are cut, where far tiles occur
    return flags


def _backend_far_n(wide: int | None, flags: dict, head_dim: int, kernel: str, block_n: int) -> int:
    """The FAR_N the backend gives ``kernel`` (the forward or dQ) with ``flags`` when its setting is ``wide``
    (`triton_backend._far_keys`; the distance road: `_buildable` clears DIST elsewhere)."""
    split = flags["DIST"] and flags["FAR_TILES"]
    return B._far_keys(wide, block_n, split, head_dim, flags["HAS_SEG"], flags["DROPOUT"], kernel)


def _far_keys(flags: dict, head_dim: int, kernel: str, block_n: int) -> dict:
    """``flags`` (`_buildable`'s) with the forward's or dQ's FAR_N as the backend takes it, or without it for
    dK/dV and where the backend takes none wider than the tiles' ``block_n``."""
    wide = block_n
    if "FAR_N" in flags and kernel in B.FAR_KEY_SETTINGS:
        wide = _backend_far_n(flags["FAR_N"], flags, head_dim, kernel, block_n)
    narrow = {flag: value for flag, value in flags.items() if flag != "FAR_N"}
    return narrow if wide == block_n else dict(narrow, FAR_N=wide)


def _runs_by_default(flags: dict, head_dim: int, kernel: str, block_n: int) -> bool:
    """Whether ``kernel`` built with ``flags`` (`_far_keys`'s) takes the far blocks the backend gives it under its
    own setting (`triton_backend.FAR_KEY_SETTINGS`): the forward and dQ share the wide variants, each resolving
    them its own way, so a default-road variant may hold far blocks one kernel runs and the other does not."""
    if kernel not in B.FAR_KEY_SETTINGS:
        return True
    setting = getattr(B, B.FAR_KEY_SETTINGS[kernel])
    return flags.get("FAR_N", block_n) == _backend_far_n(setting, flags, head_dim, kernel, block_n)


def builds(kernels: tuple[str, ...], everything: bool):
    """(dtype, head dim, kernel, tiles, flags, capability, configured) of every distinct build: each
    `configurations` entry for each kernel, its flags as the backend takes them (`_buildable`, `_far_keys`);
    beyond RELEASED_HEAD_DIM in the default run, only the wide far blocks each kernel runs (`_runs_by_default`)."""
    built = set()
    for dtype, head_dim, every, capability, check in configurations(everything):
        for name in kernels:
            flags = _buildable(every, head_dim, name)
            tiles = tiles_for(torch.device("cuda"), head_dim, name, flags["DROPOUT"], flags["SKEW"])
            flags = _far_keys(flags, head_dim, name, tiles.block_n)
            if not everything and head_dim != RELEASED_HEAD_DIM:
                if not _runs_by_default(flags, head_dim, name, tiles.block_n):
                    continue
            key = (dtype, head_dim, name, tiles, tuple(sorted(flags.items())), capability, check)
            if key in built:  # (a variant that differs only in a flag this kernel does not take)
                continue
            built.add(key)
            yield dtype, head_dim, name, tiles, flags, capability, check


def tensor_cores_from_sm80() -> list[str]:
    """The premise of `triton_backend.TRITON_TENSOR_CORES`: Triton compiles the forward kernel's products to
    tensor-core instructions for sm_80 and to none for sm_75 (float32 FMAs: the backend declines such GPUs).
    Returns what contradicts it (a Triton release that changes either side means revisiting the gate)."""
    flags = _buildable(dict.fromkeys(FLAGS, True), 64, "_fwd_kernel")
    flags = dict(flags, DROPOUT=False, SKEW=False, DIST=False)
    tiles = tiles_for(torch.device("cuda"), 64, "_fwd_kernel")
    wrong = []
    for capability in (75, 80):
        for dtype in ("fp16", "bf16"):
            c = compile_kernel(K._fwd_kernel, dtype, 64, tiles, flags, capability)
            products = sum(c.ops[op] for op in MMA_OPS)
            if (products > 0) != (capability >= 10 * TRITON_TENSOR_CORES[0] + TRITON_TENSOR_CORES[1]):
                wrong.append(f"_fwd_kernel {dtype} for sm_{capability}: {products} tensor-core instructions")
    return wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compile the triton kernels for NVIDIA targets")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--product-sweep", action="store_true")
    parser.add_argument("--fold-sweep", action="store_true")
    parser.add_argument(
        "--part",
        choices=list(PARTS),
        help="only the attention kernels' forward or backward (dq, dkv: one of its two kernels), or only the "
        "distance tables' product and the fold kernels (default: all)",
    )
    args = parser.parse_args(argv)
    kernels = KERNEL_NAMES if args.part is None else PARTS[args.part]
    tables = args.part in (None, "tables")
    if triton.knobs.runtime.interpret:
        raise SystemExit("unset TRITON_INTERPRET: the kernels must be JIT functions to be compiled")
    # every compile states its FP fusion (`Tiles.options`): Triton 3.9 warns where one falls back on the default,
    # which turns to off in 3.10
    warnings.filterwarnings("error", message=".*TRITON_DEFAULT_FP_FUSION")
    n, spills, unfetched, uncut, replicated, timed_spills, oversized = 0, [], [], [], [], [], []
    for dtype, head_dim, name, tiles, flags, capability, check in builds(kernels, args.all):
        c = compile_kernel(getattr(K, name), dtype, head_dim, tiles, flags, capability, inspect=check)
        n += 1
        if c is not None and c.shared_bytes > SHARED_LIMITS[capability]:
            oversized.append(
                f"{name} d{head_dim} {tiles} {flags} on sm_{capability}: {c.shared_bytes} bytes of shared "
                f"memory, over the {SHARED_LIMITS[capability]} a block may use"
            )
        if capability != 90 or not check:
            continue  # the checks below are of the configured tiles' code an H100 runs
        if c is not None and c.stack_bytes:
            # tiles a GPU timed (`GPU_TIMED`, inference) were chosen for their time, spills and all
            # (not the wide far blocks, untimed: `triton_backend.FORWARD_FAR_KEYS`, `DQ_FAR_KEYS`)
            timed = not flags["DROPOUT"] and not flags["SKEW"] and name in GPU_TIMED.get(head_dim, ())
            timed = timed and "FAR_N" not in flags
            (timed_spills if timed else spills).append(f"{name} d{head_dim} {tiles} {flags}: {c}")
        # warps that repeat others' products do the tile's work twice (`triton_aot.replication`): the static
        # report prefers tiles without, and found them for every kernel, head dim and use
        if c is not None and c.replication > 1:
            replicated.append(f"{name} d{head_dim} {tiles} {flags}: computed {c.replication} times over")
        # at distance i - j every loop visits one kind of tile (`triton_kernels._runs`): no load of the
        # loops may sit in a branch, where the pipeliner would not prefetch it
        if c is not None and flags["IJ"] and c.branch_loads:
            unfetched.append(f"{name} d{head_dim} {tiles} {flags}: {c.branch_loads} loads inside branches")
        # ... and the loop is cut into its three runs (far, near, far), each compiled as a loop of its own,
        # or is one near run where no far tile may occur
        # (five in a forward or dQ whose far runs take wide blocks: each far run's wide and narrow blocks)
        runs = (5 if "FAR_N" in flags else 3) if flags["FAR_TILES"] else 1
        if c is not None and flags["IJ"] and len(c.tile_loops) != runs:
            uncut.append(f"{name} d{head_dim} {tiles} {flags}: loops over tiles {c.tile_loops}, not {runs}")
    # the distance tables' product (`triton_products`) at its tiles, every head dim and dtype it serves (16-bit:
    # `triton_backend._product_kernel_serves`)
    # both ways of storing the inner blocks (`triton_backend.PRODUCT_STORES`)
    # and the three kinds of programs (`PRODUCT_PROGRAMS`: a block each, or a row block or a column block each
    # with a loop), the rows' ends stored both ways (`PRODUCT_EDGES`: "wrap" has no element store left)
    products, scalar_stores, element_stores, no_tma, no_loop = [], [], [], [], []
    shapes = [(PRODUCT_TILES, "blocks"), (PRODUCT_ROW_TILES, "rows")]
    shapes += [(PRODUCT_COLUMN_TILES, "columns"), (PRODUCT_NARROW_COLUMN_TILES, "columns")]
    # (float16 with --all, as the fold kernels below: the same code in the other 16-bit type; bfloat16 is what
    # the released models run and the GPU timed, and the default run's compile test is among its longest)
    if args.product_sweep:
        shapes += _product_sweep()
    # (the column loop with pointer stores also building both tables in one launch: `PRODUCT_LAUNCHES` "one")
    # (without --all, the variants other than the default, `_default_product`, at RELEASED_HEAD_DIM only)
    variants = [
        (shape, dtype, head_dim, tma, wrap, pair)
        for shape, dtype, head_dim, tma, wrap in itertools.product(
            shapes,
            ("bf16", "fp16") if args.all else ("bf16",),
            (16, 32, 64, 128),
            (False, True),
            (True, False),
        )
        for pair in ((False, True) if shape[1] == "columns" and wrap and not tma else (False,))
        if tables
        and (
            args.all
            or head_dim == RELEASED_HEAD_DIM
            or (_default_product(shape[1], tma, wrap) and head_dim > 32)
        )
    ]
    for (tiles, programs), dtype, head_dim, tma, wrap, pair in variants:
        loops = dict(row_loop=programs == "rows", col_loop=programs == "columns")
        c = compile_product_kernel(dtype, head_dim, tiles, tma=tma, wrap=wrap, pair=pair, **loops)
        n += 1
        name = (
            f"_distance_product_kernel {dtype} d{head_dim} {tiles}{' tma' if tma else ''}"
            f"{'' if programs == 'blocks' else f' {programs[:-1]} loop'}{'' if wrap else ' masked edges'}"
            f"{' both tables' if pair else ''}"
        )
        print(f"{name}: {c}")
        if programs != "blocks" and len(c.tile_loops) != 1:  # the program's loop, one
            no_loop.append(f"{name}: loops {c.tile_loops}")
        if c.stack_bytes:
            spills.append(f"{name}: {c}")
        if not any(c.ops[op] for op in MMA_OPS):
            products.append(name)
        if not tma and not c.ops["STG.128"]:  # the inner tiles' 16-byte stores (`triton_products`)
            scalar_stores.append(f"{name}: {c.ops}")
        if wrap and c.ops["STG"] != c.ops["STG.128"]:  # every store 16 bytes, the rows' ends too
            element_stores.append(f"{name}: {c.ops}")
        if tma and not c.ops["TMA"]:  # the inner tiles' tensor-memory stores
            no_tma.append(f"{name}: {c.ops}")
    # the backward's fold kernels (`triton_backend.FOLD_PRODUCT`, `FOLD_SUMS` "triton": 16-bit buffers)
    # (with --fold-sweep at the GPU suite's shapes too, both kernels)
    folds_unfit = []
    sweep = _fold_sweep() if args.fold_sweep else []
    # each side alone and both in one launch (`FOLD_LAUNCHES`); the sums' content in the buffer's row order
    # and, in bands, where q / k lie (`_fold_content`); the sums by class and by cell (`FOLD_SUMS_REDUCTION`)
    variants = [(False, pair, False, False) for pair in (False, True)]
    variants += [(True, *flags) for flags in itertools.product((False, True), repeat=3)]
    for dtype, head_dim, (sums, pair, banded, cells), swept in itertools.product(
        ("bf16", "fp16") if args.all else ("bf16",), (16, 32, 64, 128), variants, [None, *sweep]
    ):
        # (without --all, the variants other than the default at RELEASED_HEAD_DIM only: `_default_fold`)
        if not tables or not (
            args.all or head_dim == RELEASED_HEAD_DIM or (_default_fold(sums, pair, cells) and head_dim > 32)
        ):
            continue
        tiles = swept or (FOLD_SUMS_TILES if sums else FOLD_TILES)
        c = compile_fold_kernel(dtype, head_dim, tiles, sums=sums, pair=pair, banded=banded, cells=cells)
        n += 1
        kernel = (
            "_fold_cell_sums_kernel" if cells else "_fold_sums_kernel" if sums else "_fold_product_kernel"
        )
        name = f"{kernel} {dtype} d{head_dim} {tiles}"
        name += (" both sides" if pair else "") + (" in bands" if banded else "")
        print(f"{name}: {c}")
        # no spills, tensor-core products, the whole blocks read 16 bytes at a time, and their loops: over the
        # cells (the product), or over the rows in each of the sums' two branches (whole and masked columns;
        # by cell, each inside a loop over the classes)
        loops = 4 if cells else 2 if sums else 1
        fit = not c.stack_bytes and any(c.ops[op] for op in MMA_OPS) and len(c.tile_loops) == loops
        if not (fit and c.ops["LDG.V4"]):
            folds_unfit.append(f"{name}: {c}")
    premise = [] if args.all or "_fwd_kernel" not in kernels else tensor_cores_from_sm80()
    print(f"compiled {n} kernels")
    if timed_spills:
        print("register spills at tiles chosen by GPU timing (allowed):\n" + "\n".join(timed_spills))
    checks = (
        ("register spills", spills),
        ("loads the pipeliner cannot prefetch", unfetched),
        ("loops not cut into their runs", uncut),
        ("matrix products replicated across warps", replicated),
        ("shared memory beyond the GPU's", oversized),
        ("tensor cores not where triton_backend.TRITON_TENSOR_CORES says", premise),
        ("distance-table products without tensor-core instructions", products),
        ("distance-table products without 16-byte stores", scalar_stores),
        ("distance-table products storing elements where the rows' ends wrap", element_stores),
        ("distance-table products with TMA stores asked for and none compiled", no_tma),
        ("distance-table products of a row or column loop without one loop", no_loop),
        ("fold kernels spilling, without tensor cores, their loops or 16-byte reads", folds_unfit),
    )
    for title, problems in checks:
        if problems:
            print(f"{title}:\n" + "\n".join(problems), file=sys.stderr)
    return 1 if any(problems for _, problems in checks) else 0


def _default_product(programs: str, tma: bool, wrap: bool) -> bool:
    """Whether a product kernel's build is of the backend's defaults: the column loop (both tile shapes,
    `PRODUCT_PROGRAMS`), stores through pointers (`PRODUCT_STORES`) and the rows' ends wrapped
    (`PRODUCT_EDGES`), one table or both (`PRODUCT_LAUNCHES`)."""
    return (
        programs == B.PRODUCT_PROGRAMS
        and tma == (B.PRODUCT_STORES == "tma")
        and wrap == (B.PRODUCT_EDGES == "wrap")
    )


def _default_fold(sums: bool, pair: bool, cells: bool) -> bool:
    """Whether a fold kernel's build is of the backend's defaults: both sides in one launch or one each
    (`FOLD_LAUNCHES`), the sums by class or by cell (`FOLD_SUMS_REDUCTION`), in the buffer's order or in
    bands."""
    by_cell = sums and B.FOLD_SUMS_REDUCTION == "cells"
    return pair == (B.FOLD_LAUNCHES == "one") and cells == by_cell


def _gpu_suite():
    """`benchmarks/gpu_suite.py`, whose tile sweeps the options compile."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gpu_suite

    return gpu_suite


def _fold_sweep() -> list:
    """The fold kernels' shapes that the GPU suite times, other than theirs."""
    shapes = map(Tiles.parse, _gpu_suite().FOLD_SWEEP_TILES)
    return [t for t in shapes if t not in (FOLD_TILES, FOLD_SUMS_TILES)]


def _product_sweep() -> list:
    """The product kernel's shapes that the GPU suite times, other than its own, as (tiles, programs)."""
    suite = _gpu_suite()
    sweeps = (
        (suite.PRODUCT_SWEEP_TILES, "blocks", (PRODUCT_TILES,)),
        (suite.PRODUCT_ROW_SWEEP_TILES, "rows", (PRODUCT_ROW_TILES,)),
        (suite.PRODUCT_COLUMN_SWEEP_TILES, "columns", (PRODUCT_COLUMN_TILES, PRODUCT_NARROW_COLUMN_TILES)),
    )
    return [(t, programs) for specs, programs, own in sweeps for t in map(Tiles.parse, specs) if t not in own]


if __name__ == "__main__":
    raise SystemExit(main())
