"""Ahead-of-time compilation of the `triton` backend's kernels for NVIDIA targets, without a GPU.

Python AST -> Triton IR -> LLVM -> PTX -> cubin with the ptxas that ships with Triton, then the cubin's resource
usage and instruction mix read with the ``cuobjdump`` Triton also ships. What it can tell without a GPU: whether
a kernel compiles at all for a target (what the CPU interpreter cannot check), its registers per thread, its
local-memory stack (register spills, ``STL`` / ``LDL`` instructions), its shared memory, and whether its matrix
products run on Hopper's warpgroup tensor-core instructions (``HGMMA``) or the older ``HMMA``, how many loads
sit inside a branch of the Triton GPU IR, where the software pipeliner does not prefetch them, and how many
instructions the body of each loop over tiles holds (`tile_loops`: the static cost of one tile), and whether
some warps repeat others' products (`replication`). It cannot tell speed. Used by
``tests/attention/compile_triton_kernels.py`` and ``benchmarks/triton_static.py``; run in a process where
``TRITON_INTERPRET`` is not set (the kernels must be JIT functions).
"""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

INT_POINTERS = {"LUT", "QPOS", "KPOS", "QSEG", "KSEG", "KMASK", "KV_LO", "KV_HI", "Q_LO", "Q_HI"}
# DV and the distance buffers hold the inputs' dtype
F32_POINTERS = {"ROW", "COL", "FAR", "LSE", "DELTA", "DQ", "DK"}
STRIDES = {"SQB", "SQH", "SQN", "SKB", "SKH", "SKN"}  # of the (B, H, N, d) activations, in elements
# the distance buffers' row stride, a multiple of 16 cells (`triton_backend.DIST_ALIGN`), except with
# GRAD_BANDS (1 modulo 16: `triton_backend.GRADIENT_STORES`)
ALIGNED_INTS = {*STRIDES, "DW"}
INTS = {"H", "B", "NQ", "NK", "R", "LOG2_BAND", "SAT", "TR", "DROP_T", *ALIGNED_INTS}
FLOATS = {"scale", "drop_scale"}
FLAGS = (
    "IJ",
    "HAS_ROW",
    "HAS_COL",
    "HAS_SEG",
    "HAS_KMASK",
    "CAUSAL",
    "DROPOUT",
    "SKEW",
    "DIST",
    "FAR_TILES",
    "GRAD_BANDS",
    "EDGES",  # the forward's only (its distance tables cut to the saturation: `triton_backend.FORWARD_REACH`)
)
# with DIST, ROW / COL are distance tables: the inputs' dtype, at a row step R that is a multiple of 16
# (`triton_backend._distance_tables`)
DISTANCE_TABLES = {"ROW", "COL"}
SASS_OPS = ("HGMMA", "HMMA", "LDG", "STG", "STG.128", "LDL", "STL", "MUFU.EX2")  # STG.128: 16-byte stores
MMA_OPS = ("HGMMA", "HMMA")
# "/*0a40*/   @!P0 LDG.E.64 R4, desc[UR6][R2.64] ;": the address and the opcode, after an optional predicate
_SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", re.M)
# "#mma1 = #ttg.nvidia_mma<{versionMajor = 3, versionMinor = 0, warpsPerCTA = [8, 1], instrShape = [16, 32, 16]}>":
# a tensor-core layout of the Triton GPU IR, its warps and the rows and columns one warp's instruction covers
_MMA_LAYOUT = re.compile(
    r"^(#mma\d*) = #ttg\.nvidia_mma<\{.*?warpsPerCTA = \[(\d+), (\d+)\].*?instrShape = \[(\d+), (\d+)", re.M
)
# "... = ttng.warp_group_dot %a, %b, %c ... -> tensor<64x64xf32, #mma1>" (Hopper), "tt.dot" (earlier GPUs)
_DOT_RESULT = re.compile(r"(?:ttng\.warp_group_dot|tt\.dot) .*-> tensor<(\d+)x(\d+)x\w+, (#mma\d*)>")


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    warps: int
    stages: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.warps} s{self.stages}"

    @classmethod
    def parse(cls, spec: str) -> Tiles:
        """'64x32w8s2' -> Tiles(64, 32, 8, 2)."""
        found = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", spec)
        if found is None:
            raise ValueError(
                f"bad tile spec {spec!r}; expected BLOCK_MxBLOCK_N w<warps> s<stages>, e.g. 64x32w8s2"
            )
        return cls(*(int(x) for x in found.groups()))

    @property
    def options(self) -> dict:
        """Triton's compile options for these tiles. FP fusion (FMA) is asked for explicitly: Triton 3.9 warns
        that its default turns to off in 3.10, which would split every multiply-add of the kernels in two."""
        return dict(num_warps=self.warps, num_stages=self.stages, enable_fp_fusion=True)

    @property
    def skew_width(self) -> int:
        """WT of the skewed kernels: a power of two holding a tile's BLOCK_M + BLOCK_N - 1 distances."""
        return 2 * max(self.block_m, self.block_n)


@dataclass
class Compiled:
    registers: int
    stack_bytes: int  # local memory per thread: spilled registers
    shared_bytes: int
    instructions: int
    ops: dict[str, int]  # counts of SASS_OPS in the disassembly
    branch_loads: int  # loads inside an scf.if of the TTGIR: issued when reached, not prefetched a tile ahead
    tile_loops: list[int]  # instructions in the body of each loop over tiles, in address order (`tile_loops`)
    replication: int  # how many warps compute each result of the most replicated product (`replication`)
    # instructions and global stores on the path that takes no conditional branch (`straight_path`)
    path_instructions: int = 0
    path_stores: int = 0


def mma_loops(lines: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """The (first, last) addresses of each loop over tiles of a SASS listing given as (address, opcode,
    operands) in address order. A backward branch (``BRA`` to an address before its own) closes a loop whose
    body runs from the target to the branch; a loop over tiles is one whose body holds a tensor-core product
    (the backward kernels' other loops zero buffer cells). At distance i - j a kernel has three, its far, near
    and far runs (`triton_kernels._runs`); the forward without position terms has one."""
    loops = []
    for addr, op, rest in lines:
        target = _branch_target(op, rest, addr)
        if target >= addr:  # not a branch, a forward one, or the listing's closing self-branch
            continue
        if any(o.split(".")[0] in MMA_OPS for a, o, _ in lines if target <= a <= addr):
            loops.append((target, addr))
    return loops


def _branch_target(op: str, operands: str, addr: int) -> int:
    """The address a ``BRA`` at ``addr`` jumps to; ``addr`` itself for any other instruction."""
    found = re.match(r"\s*(?:`\()?0x([0-9a-f]+)", operands) if op.split(".")[0] == "BRA" else None
    return int(found.group(1), 16) if found else addr


def tile_loops(sass: str) -> list[int]:
    """Instructions in the body of each loop over tiles (`mma_loops`) of a ``cuobjdump -sass`` listing, in
    address order. Each thread issues about that many instructions per iteration, so with the tile's size and
    warps it is the static cost of one tile of that loop."""
    lines = [(int(addr, 16), op, rest) for addr, op, rest in _SASS_LINE.findall(sass)]
    return [sum(1 for a, _, _ in lines if first <= a <= last) for first, last in mma_loops(lines)]


def straight_path(sass: str) -> tuple[int, int]:
    """(instructions, global stores) from a ``cuobjdump -sass`` listing's entry to its first unconditional
    ``EXIT``, following unconditional branches and not the predicated ones: for a kernel without loops, what a
    thread issues where every guarded branch falls through (the product kernel's inner blocks: its masked
    blocks branch off). Stops where the path comes back to an address it passed."""
    lines = [(int(addr, 16), op, rest) for addr, op, rest in _SASS_LINE.findall(sass)]
    guarded = {int(a, 16) for a in re.findall(r"^\s+/\*([0-9a-f]{4,})\*/\s+@", sass, re.M)}
    index = {addr: i for i, (addr, _, _) in enumerate(lines)}
    seen, count, stores, i = set(), 0, 0, 0
    while i < len(lines) and lines[i][0] not in seen:
        addr, op, rest = lines[i]
        seen.add(addr)
        count += 1
        stores += op.startswith("STG")
        if op == "EXIT" and addr not in guarded:
            break
        target = _branch_target(op, rest, addr) if addr not in guarded else addr
        i = index.get(target, len(lines)) if target != addr else i + 1
    return count, stores


def branch_loads(ttgir: str) -> int:
    """``tt.load`` ops nested in an ``scf.if`` region of a Triton GPU IR listing. Triton's software pipeliner
    turns the loads at the top level of a loop body into asynchronous copies issued iterations ahead; a load in a
    branch stays a plain load, its latency paid where the branch runs. Regions open on lines ending in ``{`` and
    close on lines starting with ``}`` (the printer's layout; braces inside types never end a line)."""
    regions: list[bool] = []  # per open region: whether it (or one around it) is an scf.if branch
    found = 0
    for line in ttgir.splitlines():
        text = line.strip()
        if text.startswith("}") and regions:
            inside_if = regions.pop()
            if text.startswith("} else {"):
                regions.append(inside_if)
                continue
        if "tt.load" in text and any(regions):
            found += 1
        if text.endswith("{"):
            regions.append(" scf.if " in f" {text} ")
    return found


def replication(ttgir: str) -> int:
    """How many times over the kernel computes its most replicated matrix product, from the Triton GPU IR: a
    tensor-core layout spreads its warps over the result's rows and columns (``warpsPerCTA``), each warp's
    instruction covering ``instrShape`` of them; where the warps along a side cover more than the result has,
    the surplus warps repeat the others' work (broadcast copies of the same values). A 64-row tile with 8 warps,
    for one: Triton may lay the scores' product over 8 warps along the rows, two warpgroups of 64 rows each, and
    both then compute every score, exponentiate it and add its position terms (1: no product is replicated)."""
    layouts = {name: [int(x) for x in rest] for name, *rest in _MMA_LAYOUT.findall(ttgir)}
    factors = []
    for rows, cols, name in _DOT_RESULT.findall(ttgir):
        warps_m, warps_n, instr_m, instr_n = layouts[name]
        factors.append(max(1, warps_m * instr_m // int(rows)) * max(1, warps_n * instr_n // int(cols)))
    if not factors:
        raise RuntimeError("no tensor-core product found in the Triton GPU IR")
    return max(factors)


def signature(fn, dtype: str, constexprs: dict) -> dict:
    """Triton signature of one kernel: pointer / integer / float types by argument name."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in INT_POINTERS:
            sig[name] = "*i32"
        elif name in DISTANCE_TABLES and constexprs.get("DIST"):
            sig[name] = "*" + dtype
        elif name in F32_POINTERS:
            sig[name] = "*fp32"
        elif name in INTS:
            sig[name] = "i32"
        elif name in FLOATS:
            sig[name] = "fp32"
        elif name == "SEED":  # the dropout seed, one int64 (see `triton_backend._draw_seed`)
            sig[name] = "*i64"
        elif name == "OUT" and constexprs.get("DROPOUT"):  # float32 with dropout (`_out_dtype`)
            sig[name] = "*fp32"
        else:  # Q K V DO OUT: the input dtype
            sig[name] = "*" + dtype
    return sig


def attributes(fn, sig: dict, constexprs: dict) -> dict:
    """What a launch tells the compiler about the arguments (Triton's ``D`` specialisation, "divisible by 16"):
    PyTorch's allocator aligns pointers to 16 bytes and the activations' strides are multiples of 16 elements for
    the head dims served (the distance buffers' row stride and the distance tables' row step R by construction;
    not the row stride of gradients in the tables' layout, odd with ``GRAD_BANDS``), so the code compiled here
    can use vector loads, as the code compiled at run time does."""
    ints = aligned_ints(constexprs)
    aligned = [i for i, name in enumerate(fn.arg_names) if sig[name].startswith("*") or name in ints]
    return {(i,): [["tt.divisibility", 16]] for i in aligned}


def aligned_ints(flags: dict) -> set[str]:
    """The attention kernels' integer arguments a launch with these constexpr ``flags`` passes as multiples of
    16: the activations' strides, the distance tables' row step R (``DIST``) and the distance buffers' row
    stride DW, except for gradients in the tables' layout, in bands or one band (``GRAD_BANDS``: DW ≡ 1 modulo
    16)."""
    ints = ALIGNED_INTS | ({"R"} if flags.get("DIST") else set())
    return ints - {"DW"} if flags.get("GRAD_BANDS") else ints


def _bin(tool: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: this Triton build ships no {tool}")
    return str(path)


def compile_source(src, options: dict, capability: int = 90):
    """Triton's compiled kernel of ``src`` (an ``ASTSource``) for ``sm_<capability>``, without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)


def compile_kernel(
    fn, dtype: str, head_dim: int, tiles: Tiles, flags: dict, capability: int = 90, inspect: bool = True
) -> Compiled | None:
    """Compile ``fn`` for ``sm_<capability>`` (raises if it does not compile); with ``inspect``, read the
    cubin's resources and instruction mix."""
    from triton.compiler import ASTSource

    prec = 1 if dtype == "fp32" else 0
    # a flag not given is off (a kernel's flags added later: callers name the ones they set); ``flags`` may also
    # give FAR_N (the forward's and dQ's far runs' key blocks, BLOCK_N where not given)
    flags = dict.fromkeys(FLAGS, False) | flags
    sizes = dict(
        HEAD_DIM=head_dim, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, FAR_N=tiles.block_n, PREC=prec
    )
    constexprs = sizes | flags
    constexprs["WT"] = tiles.skew_width  # the skewed kernels' table block (see kernels)
    constexprs = {name: value for name, value in constexprs.items() if name in fn.arg_names}
    sig = signature(fn, dtype, constexprs)
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attributes(fn, sig, constexprs))
    compiled = compile_source(src, tiles.options, capability)
    return inspect_compiled(fn.__name__, compiled) if inspect else _checked_cubin(fn.__name__, compiled)


# The product kernel's arguments a launch passes as multiples of 16 (pointers: 16-byte aligned), as
# `compile_product_kernel` tells the compiler (tests/attention/test_triton.py holds the launches to it)
PRODUCT_ALIGNED = {
    "X",
    "T",
    "CELLS",
    "OUT",
    "stride_xh",
    "stride_xr",
    "stride_th",
    "stride_tr",
    "LB",
    "R",
    "M",
    "X2",
    "T2",
    "OFF2",
}


def compile_product_kernel(
    dtype: str,
    head_dim: int,
    tiles: Tiles,
    capability: int = 90,
    tma: bool = False,
    row_loop: bool = False,
    wrap: bool = True,
    col_loop: bool = False,
    pair: bool = False,
) -> Compiled:
    """`triton_products._distance_product_kernel` compiled for ``sm_<capability>`` and read as `compile_kernel`
    reads the attention kernels. The launch tells the compiler what it tells it at run time: every pointer (the
    output too: `triton_backend._product_buffer` aligns a banded table's start), the operands' strides, the rows
    per band, the rows M and R (the row stride less one) are multiples of 16. The row stride itself is odd: the
    stores are vectorised only where the kernel's arithmetic shows each row's start a multiple of 16 bytes
    (``ops["STG.128"]``). With ``tma`` the inner blocks are stored through a tensor descriptor instead
    (`triton_backend.PRODUCT_STORES`): ``ops["TMA"]`` counts the PTX's tensor-memory stores
    (``cp.async.bulk.tensor``). With ``row_loop`` a program runs over its row block's column blocks
    (`triton_backend.PRODUCT_PROGRAMS` "rows"), with ``col_loop`` over its column block's row blocks ("columns",
    `PRODUCT_COLUMN_GROUPS` of them): ``tile_loops`` then holds that loop. With ``pair`` one launch builds both
    tables (`triton_backend.PRODUCT_LAUNCHES` "one"): the program picks its operands and output by its half of
    the grid."""
    from debertakit.attention import triton_products
    from debertakit.attention.triton_backend import PRODUCT_COLUMN_GROUPS

    fn = triton_products._distance_product_kernel
    # elements in 16 bytes, as `triton_backend._kernel_band_product` sets it
    vec = 4 if dtype == "fp32" else 8
    constexprs = dict(
        D=head_dim,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        VEC=vec,
        PREC=1 if dtype == "fp32" else 0,
        TMA=tma,
        ROW_LOOP=row_loop,
        WRAP=wrap,
        COL_LOOP=col_loop,
        GROUPS=PRODUCT_COLUMN_GROUPS,
        PAIR=pair,
    )
    if not tma:
        constexprs["OUT_DESC"] = None  # what the launch passes without descriptor
    box = (
        f"tensordesc<{dtype}[1, 1, {tiles.block_m}, {tiles.block_n}]>"  # `triton_backend._residue_descriptor`
    )
    pointers = dict(X="*" + dtype, T="*" + dtype, CELLS="*i64", OUT="*" + dtype, OUT_DESC=box)
    pointers.update(X2="*" + dtype, T2="*" + dtype)
    result, ptx = _compile_products_kernel(fn, constexprs, pointers, PRODUCT_ALIGNED, tiles, capability)
    result.ops["TMA"] = ptx.count("cp.async.bulk.tensor")
    return result


def _compile_products_kernel(
    fn, constexprs: dict, pointers: dict, aligned: set[str], tiles: Tiles, capability: int
) -> tuple[Compiled, str]:
    """A `triton_products` kernel compiled for ``sm_<capability>``: ``pointers`` the types of its pointer
    arguments, ``alpha`` a float, every other argument an int32, those of ``aligned`` told multiples of 16.
    Returns it read as `inspect_compiled` reads a kernel, and its PTX."""
    from triton.compiler import ASTSource

    sig = {
        name: "constexpr" if name in constexprs else pointers.get(name, "fp32" if name == "alpha" else "i32")
        for name in fn.arg_names
    }
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name in aligned}
    compiled = compile_source(
        ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), tiles.options, capability
    )
    return inspect_compiled(fn.__name__, compiled), compiled.asm["ptx"]


# what the fold kernels' launches (`triton_backend._kernel_fold_product`, `_kernel_fold_sums`) pass as
# multiples of 16 where the GPU benchmark's shapes give them: the pointers (the second side's too), DW - 1, a
# group's cells M·DW, the rows per band and batch row LB and per group M, the tokens N, the gradients' and the
# content's strides. DW itself is odd: the loads are 16 bytes wide only where the kernel's arithmetic shows each
# read's start a multiple of 16 bytes
FOLD_ALIGNED = {
    "DIST",
    "T",
    "GRAD",
    "OUT",
    "CONTENT",
    "PER_CLASS",
    "SUMS",
    "DIST2",
    "T2",
    "GRAD2",
    "OUT2",
    "CONTENT2",
    "DW1",
    "GROUP",
    "stride_gb",
    "stride_gh",
    "stride_gn",
    "stride_cg",
    "stride_cm",
    "stride_cb",
    "N",
    "LB",
    "M",
}


def compile_fold_kernel(
    dtype: str,
    head_dim: int,
    tiles: Tiles,
    capability: int = 90,
    sums: bool = False,
    pair: bool = False,
    banded: bool = False,
    cells: bool = False,
) -> Compiled:
    """`triton_products._fold_product_kernel` (with ``sums``: `_fold_sums_kernel`) compiled for
    ``sm_<capability>`` as `compile_product_kernel` compiles the product kernel, the launch's multiples of 16
    told (`FOLD_ALIGNED`); with ``pair`` both sides in one launch (`triton_backend.FOLD_LAUNCHES` "one"), with
    ``banded`` (the sums kernel) the content read where q / k lie, in bands; with ``cells`` the sums kernel that
    sums each cell whole (`triton_products._fold_cell_sums_kernel`, `triton_backend.FOLD_SUMS_REDUCTION`).
    ``ops["LDG.V4"]`` counts the PTX's 16-byte reads (``ld.global.v4`` and, in the pipelined loop,
    ``cp.async`` of 16 bytes) and ``ops["LDG.ELEM"]`` its loads of one 16-bit element (``ld.global.b16``): the
    buffer's whole blocks are read 16 bytes at a time, the last block of each row (masked by column too)
    element by element."""
    from debertakit.attention import triton_products

    fn = triton_products._fold_sums_kernel if sums else triton_products._fold_product_kernel
    fn = triton_products._fold_cell_sums_kernel if sums and cells else fn
    constexprs = dict(
        D=head_dim, PREC=1 if dtype == "fp32" else 0, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, PAIR=pair
    )
    if sums:
        constexprs["BANDED"] = banded
    pointers = dict(
        DIST="*" + dtype,
        T="*" + dtype,
        GRAD="*fp32",
        OUT="*" + dtype,
        CONTENT="*" + dtype,
        PER_CLASS="*fp32",
        SUMS="*fp32",
    )
    pointers.update({name + "2": pointers[name] for name in ("DIST", "T", "GRAD", "OUT", "CONTENT")})
    result, ptx = _compile_products_kernel(fn, constexprs, pointers, FOLD_ALIGNED, tiles, capability)
    async16 = re.findall(r"cp\.async\.\w+\.shared\.global .*, 0x10", ptx)
    result.ops["LDG.V4"] = ptx.count("ld.global.v4") + len(async16)
    result.ops["LDG.ELEM"] = ptx.count("ld.global.b16")
    return result


def _checked_cubin(name: str, compiled) -> None:
    if not compiled.asm.get("cubin"):
        raise RuntimeError(f"{name}: no cubin")


def inspect_compiled(name: str, compiled) -> Compiled:
    """The resources and instruction mix of kernel ``name`` as `compile_source` compiled it (its cubin read
    with cuobjdump)."""
    _checked_cubin(name, compiled)
    cubin = compiled.asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_bin("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True)
        sass = subprocess.run([_bin("cuobjdump"), "-sass", f.name], capture_output=True, text=True)
    regs = re.search(r"REG:(\d+)", usage.stdout)
    stack = re.search(r"STACK:(\d+)", usage.stdout)
    if regs is None or stack is None:
        raise RuntimeError(f"unexpected cuobjdump output: {usage.stdout[:400]!r} {usage.stderr[:400]!r}")
    words = [op for _, op, _ in _SASS_LINE.findall(sass.stdout)]
    counts = collections.Counter(w if w.startswith("MUFU.EX2") else w.split(".")[0] for w in words)
    counts["STG.128"] = sum(w.startswith("STG.") and w.endswith(".128") for w in words)
    return Compiled(
        registers=int(regs.group(1)),
        stack_bytes=int(stack.group(1)),
        shared_bytes=int(compiled.metadata.shared),
        instructions=len(words),
        ops={op: counts.get(op, 0) for op in SASS_OPS},
        branch_loads=branch_loads(compiled.asm["ttgir"]),
        tile_loops=tile_loops(sass.stdout),
        # no tensor-core product at all (Triton's float32 FMAs for targets before sm_80): nothing replicated
        replication=replication(compiled.asm["ttgir"]) if any(counts[op] for op in MMA_OPS) else 1,
        **dict(zip(("path_instructions", "path_stores"), straight_path(sass.stdout))),
    )
