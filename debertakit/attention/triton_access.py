"""How a compiled Triton kernel's warps read global memory, without a GPU: the requests and 32-byte sectors of each
load, from the layout the compiler gave it and the addresses the kernel computes.

A warp issues one memory request per load instruction, and the memory system serves it in 32-byte sectors: a
request whose 32 lanes read 4 bytes each from 32 different rows costs 32 sectors, where one over 128 consecutive
bytes costs 4. Which lane reads which element the compiler decides: the load's layout in the Triton GPU IR
(``#ttg.blocked``: elements per thread, threads per warp and warps along each dimension, and which dimension is
fastest; `load_sites`) and its width per lane in the PTX (``ld.global.v4.b32``: 16 bytes; ``cp.async ..., 0x10``;
`access_bytes`). The addresses come from running the same kernel in Triton's CPU interpreter with every load
recorded, and the arguments of each launch with it (`record_run`), so that the compiled
kernel is the one that ran (`launch_source`). Together they give, per load site (a source line), the requests and
sectors of a call against the fewest sectors its elements need (`traffic`): what one tile moves through the L1
cache, which the instruction counts of `triton_aot` do not see. Used by ``benchmarks/triton_memory.py``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import re
import sys
from dataclasses import dataclass

import numpy as np

SECTOR = 32  # bytes: the unit the L1 and L2 caches serve a request in


@dataclass(frozen=True)
class Blocked:
    """A ``#ttg.blocked`` layout: each thread holds ``size_per_thread`` consecutive elements per dimension, a warp's
    lanes and a program's warps tile the tensor in ``order`` (fastest dimension first); a tensor larger than the
    layout's tile repeats it (more registers per thread), a smaller one is covered by lanes holding copies."""

    size_per_thread: tuple[int, ...]
    threads_per_warp: tuple[int, ...]
    warps_per_cta: tuple[int, ...]
    order: tuple[int, ...]

    def __str__(self) -> str:
        spt, tpw, wpc = (list(x) for x in (self.size_per_thread, self.threads_per_warp, self.warps_per_cta))
        return f"thread {spt} warp {tpw} cta {wpc} order {list(self.order)}"


@dataclass(frozen=True)
class Site:
    """A load of the Triton GPU IR: ``tt.load`` (into registers) or ``ttg.async_copy_global_to_local`` (an
    asynchronous copy into shared memory), its layout, and the dimension a slice layout removes (None: none)."""

    op: str
    layout: Blocked
    sliced: int | None = None


_BLOCKED = re.compile(r"^(#blocked\d*) = #ttg\.blocked<\{(.*?)\}>", re.M)
_LOC = re.compile(r"^(#loc\d+) = (loc\(.*\))$", re.M)
# "%x = tt.load %p, ... : tensor<64x32x!tt.ptr<f32>, #blocked2> loc(#loc538)", slice layouts included
_LOAD = re.compile(
    r"(tt\.load|ttg\.async_copy_global_to_local) .*?: tensor<[\dx]+x!tt\.ptr<\w+>, "
    r"(#blocked\d*|#ttg\.slice<\{dim = (\d), parent = (#blocked\d*)\}>)>.* loc\((#loc\d+)\)"
)


def blocked_layouts(ttgir: str) -> dict[str, Blocked]:
    """The ``#blockedN`` layouts a Triton GPU IR listing defines."""

    def field(body: str, name: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.search(name + r" = \[([\d, ]+)\]", body).group(1).split(","))

    return {
        name: Blocked(*(field(body, f) for f in ("sizePerThread", "threadsPerWarp", "warpsPerCTA", "order")))
        for name, body in _BLOCKED.findall(ttgir)
    }


def source_line(locs: dict[str, str], ref: str, source: str) -> int | None:
    """The line of ``source`` (a file name) a location of the IR points at: through names and call sites (an
    inlined helper's load is at the helper's line) to a ``"file":line:col`` location; None if it is elsewhere."""
    text = locs.get(ref, ref)
    found = re.match(r'loc\("[^"]*' + re.escape(source) + r'":(\d+):\d+\)', text)
    if found:
        return int(found.group(1))
    inner = re.match(r'loc\((?:callsite\(|"[^"]*"\()?(#loc\d+)', text)
    return source_line(locs, inner.group(1), source) if inner else None


def load_sites(ttgir: str, source: str) -> dict[int, Site]:
    """Line of ``source`` -> the load there. A line the software pipeliner copied (its prologue and its loop)
    appears more than once with the same layout; where they differ the most frequent wins, the last on a tie."""
    layouts = blocked_layouts(ttgir)
    locs = dict(_LOC.findall(ttgir))
    seen: dict[int, list[Site]] = collections.defaultdict(list)
    for op, name, dim, parent, loc in _LOAD.findall(ttgir):
        line = source_line(locs, loc, source)
        if line is not None:
            seen[line].append(Site(op, layouts[parent or name], int(dim) if dim else None))
    return {line: max(reversed(s), key=s.count) for line, s in seen.items()}


def access_bytes(ptx: str, source: str) -> dict[int, int]:
    """Line of ``source`` -> the bytes one lane reads per global load there (the widest at that line), from the
    PTX's ``.loc`` lines and its ``ld.global`` / ``cp.async`` instructions."""
    files = {
        n for n, path in re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]*)"', ptx, re.M) if path.endswith(source)
    }
    widths: dict[int, int] = {}
    line = None
    for text in ptx.splitlines():
        loc = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)\s+\d+", text)
        if loc:
            line = int(loc.group(2)) if loc.group(1) in files else None
            continue
        width = _global_load_width(text)
        if width and line is not None:
            widths[line] = max(widths.get(line, 0), width)
    return widths


def load_widths(ptx: str) -> dict[int, int]:
    """Bytes per lane -> how many global loads (``ld.global`` and ``cp.async``) of that width the PTX holds, a
    count of instructions, not of executions: 2-byte loads of 16-bit tiles mean the compiler could not prove
    their addresses aligned and contiguous (the launch's pointers and strides, `launch_source`)."""
    return _by_width(_global_load_width(text) for text in ptx.splitlines())


def store_widths(ptx: str) -> dict[int, int]:
    """Bytes per lane -> how many ``st.global`` stores of that width the PTX holds (as `load_widths`)."""
    stores = (re.search(r"\bst\.global\S*", text) for text in ptx.splitlines())
    return _by_width(_lane_bytes(store.group()) for store in stores if store)


def _by_width(widths) -> dict[int, int]:
    counts = collections.Counter(widths)
    return {width: counts[width] for width in sorted(counts) if width}


def _global_load_width(text: str) -> int:
    """Bytes one lane reads with the global load on a PTX line (0 if there is none)."""
    load = re.search(r"\bld\.global\S*", text)
    copy = re.search(r"\bcp\.async\.\w+\.shared\.global\b.*,\s*(0x[0-9a-f]+|\d+)", text)
    return _lane_bytes(load.group()) if load else int(copy.group(1), 0) if copy else 0


def _lane_bytes(opcode: str) -> int:
    """Bytes a lane reads (or writes) with one ``ld.global`` (``st.global``) opcode: ``ld.global.v4.b32`` 16,
    ``ld.global.nc.L1::evict_last.b16`` 2 (the vector count times the element's bits)."""
    count, bits = 1, 0
    for part in opcode.split("."):
        if re.fullmatch(r"v\d", part):
            count = int(part[1:])
        elif re.fullmatch(r"[bsuf]\d+", part):
            bits = int(part[1:])
    return count * bits // 8


def warp_requests(
    layout: Blocked, shape: tuple[int, ...], vec: int = 1, sliced: int | None = None
) -> np.ndarray:
    """(requests, 32): the flat index into a ``shape`` tensor of the first element each lane reads in each warp
    request of a load with ``layout``, each lane reading ``vec`` consecutive elements along the fastest dimension.
    With ``sliced``, ``shape`` lacks that dimension of the layout (a slice layout: the lanes along it hold
    copies). Elements past the shape wrap around (the lanes holding copies of a tensor smaller than the layout)."""
    spt, tpw, wpc, order = layout.size_per_thread, layout.threads_per_warp, layout.warps_per_cta, layout.order
    dims = len(spt)
    full = (
        list(shape)
        if sliced is None
        else [1 if d == sliced else shape[d - (d > sliced)] for d in range(dims)]
    )
    if len(full) != dims:
        raise ValueError(f"a {dims}-d layout for a tensor of shape {tuple(shape)}")
    if spt[order[0]] % vec:
        raise ValueError(f"{vec} elements per access do not divide {spt[order[0]]} per thread")

    def coords(index: int, sizes) -> list[int]:  # of a lane in a warp, or a warp in a program
        out = [0] * dims
        for d in order:
            index, out[d] = divmod(index, sizes[d])
        return out

    tile = [spt[d] * tpw[d] * wpc[d] for d in range(dims)]
    reps = [-(-full[d] // tile[d]) for d in range(dims)]
    # a thread's accesses: per dimension (repetition of the layout's tile, element within the thread's run)
    slots = [
        [(r, e) for r in range(reps[d]) for e in range(0, spt[d], vec if d == order[0] else 1)]
        for d in range(dims)
    ]
    lanes = [coords(lane, tpw) for lane in range(32)]
    requests = []
    for warp in range(int(np.prod(wpc))):
        w = coords(warp, wpc)
        for slot in itertools.product(*slots):
            row = []
            for lane in lanes:
                at = [
                    (slot[d][0] * tile[d] + (w[d] * tpw[d] + lane[d]) * spt[d] + slot[d][1]) % full[d]
                    for d in range(dims)
                ]
                row.append(np.ravel_multi_index([a for d, a in enumerate(at) if d != sliced], shape))
            requests.append(row)
    return np.array(requests, dtype=np.int64)


def sectors(addresses: np.ndarray, live: np.ndarray, width: int) -> tuple[int, int]:
    """(requests, sectors) of warp requests, ``addresses`` (requests, 32) in bytes, each live lane reading
    ``width`` bytes from its address: a request with no live lane is not issued; lanes reading the same sector
    share it."""
    issued = total = 0
    for row, alive in zip(addresses, live):
        if not alive.any():
            continue
        issued += 1
        touched: set[int] = set()
        for start in row[alive].tolist():
            touched.update(range(start // SECTOR, (start + width - 1) // SECTOR + 1))
        total += len(touched)
    return issued, total


@dataclass
class Traffic:
    """What the loads of one source line moved, per call (one call per tile for a load in a loop over tiles)."""

    function: str
    line: int
    op: str
    layout: str
    calls: int
    itemsize: int  # bytes per element
    width: int  # bytes per lane per request
    requests: float
    sectors: float
    needed: float  # distinct sectors of the elements read: the fewest a perfectly coalesced load would take

    @property
    def excess(self) -> float:
        return self.sectors / self.needed if self.needed else 1.0


def traffic(records: dict, sites: dict[int, Site], widths: dict[int, int]) -> tuple[list[Traffic], list[str]]:
    """Per recorded load site of one kernel (`record_run`'s loads of that kernel) with a modelled layout in ``sites`` (`load_sites`) and a width in
    ``widths`` (`access_bytes`): its `Traffic`; and the sites left out, with the reason."""
    rows, skipped = [], []
    for (_, function, line), calls in sorted(records.items(), key=lambda kv: kv[0][2]):
        site = sites.get(line)
        shape, itemsize = calls[0][0].shape, calls[0][2]
        if site is None or line not in widths:
            skipped.append(
                f"{function}:{line} (no tensor load of a blocked layout there in the compiled kernel)"
            )
            continue
        width = widths[line]
        lanes = warp_requests(site.layout, shape, max(1, width // itemsize), site.sliced)
        issued = total = needed = 0
        for addresses, mask, _ in calls:
            flat, alive = addresses.reshape(-1).astype(np.int64), mask.reshape(-1)
            r, s = sectors(flat[lanes], alive[lanes], width)
            issued, total = issued + r, total + s
            needed += len(np.unique(flat[alive] // SECTOR))
        n = len(calls)
        layout = str(site.layout) + (f" slice {site.sliced}" if site.sliced is not None else "")
        op = "async copy" if site.op.startswith("ttg.") else "load"
        rows.append(
            Traffic(function, line, op, layout, n, itemsize, width, issued / n, total / n, needed / n)
        )
    return rows, skipped


@contextlib.contextmanager
def record_run(source: str):
    """Within the block, what the kernels Triton's interpreter runs read: yields (loads, launches).

    ``loads``: {(kernel, function, line): [(addresses, mask, itemsize), ...]}, one entry per call of a tensor load
    made from a file ending in ``source``, ``function`` and ``line`` those of the innermost frame in that file (the
    helper holding the load, inlined into ``kernel`` when compiled). ``launches``: {kernel: (arguments, keyword
    arguments)} of each kernel's first launch, the tensors among the arguments replaced by their Triton type and
    whether their address is 16-byte aligned (what the compiler is told of them: `launch_source`). Run with
    ``TRITON_INTERPRET=1`` set before the kernels are defined."""
    import torch
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.runtime import interpreter

    loads: dict[tuple[str, str, int], list] = collections.defaultdict(list)
    launches: dict[str, tuple] = {}
    running: list[str] = []
    builder, function = interpreter.InterpreterBuilder, interpreter.InterpretedFunction
    original_load, original_run = builder.create_masked_load, function.run

    def create_masked_load(self, ptrs, mask, other, *rest):
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_filename.endswith(source):
            frame = frame.f_back
        if frame is not None and running and ptrs.data.ndim >= 1:
            itemsize = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
            live = np.broadcast_to(mask.data, ptrs.data.shape).copy()
            loads[(running[-1], frame.f_code.co_name, frame.f_lineno)].append(
                (ptrs.data.copy(), live, itemsize)
            )
        return original_load(self, ptrs, mask, other, *rest)

    def run(self, *args, grid, warmup, **kwargs):
        name = self.fn.__name__
        if name not in launches:
            described = [
                ("tensor", *native_specialize_impl(BaseBackend, a, False, True, True))
                if torch.is_tensor(a)
                else a
                for a in args
            ]
            launches[name] = (described, dict(kwargs))
        running.append(name)
        try:
            return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            running.pop()

    builder.create_masked_load, function.run = create_masked_load, run
    try:
        yield loads, launches
    finally:
        builder.create_masked_load, function.run = original_load, original_run


OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


def launch_source(fn, args: list, kwargs: dict, overrides: dict | None = None):
    """(source, options) to compile the JIT function ``fn`` as one of its launches ran (`record_run`):
    tensors by their recorded type and alignment, integers and floats specialised as a launch does (1 becomes a
    constant, multiples of 16 are marked divisible, not for ``do_not_specialize`` parameters), keyword constants
    as given, with ``overrides`` of them (the interpreter's ``PREC``, say)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.compiler import ASTSource

    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    constants = {k: v for k, v in kwargs.items() if k not in OPTIONS} | (overrides or {})
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        name = param.name
        if name in constants or param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = constants.get(name, param.default)
            continue
        value = args[i] if i < len(args) else param.default
        if isinstance(value, tuple) and value[0] == "tensor":
            kind, key = value[1], value[2]
        else:
            kind, key = native_specialize_impl(BaseBackend, value, False, not param.do_not_specialize, True)
        if kind == "constexpr":
            constexprs[name] = key
        elif key == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
        signature[name] = kind
    return ASTSource(fn, signature, constexprs=constexprs, attrs=attrs), options
