"""Static report of the `triton` backend's kernels for sm_90 (H100 / H200), compiled here without a GPU.

For each kernel (forward, dQ, dK/dV), head dim and candidate tile shape it compiles the kernel with Triton's
own ptxas and reads the cubin (`debertakit.attention.triton_aot`): registers per thread, local-memory stack
(register spills), shared memory, the number of warpgroup tensor-core instructions (HGMMA) against the older
HMMA, global loads (LDG: the near band's gathers are one per element), instructions in the binary, the loads
left inside a branch of the Triton GPU IR (not prefetched by the software pipeliner; see
`triton_aot.branch_loads`), and the instructions in the body of each loop over tiles (`triton_aot.tile_loops`:
at distance i - j the far, near and far runs; what one tile of each costs a thread), and how many times over
the most replicated matrix product is computed (`triton_aot.replication`: 2 where two warpgroups both compute
every score of a 64-row tile, say). Each configuration is compiled for three feature sets: ``v3`` (distance
i - j, c2p + p2c, key padding: a padded v3 batch), ``packed`` (the same with segments and causal) and ``worst``
(explicit positions, segments, key mask, causal), each without and with dropout on the probabilities
(``+dropout``: the kernels draw the mask with Philox, which needs registers). Every kernel is also compiled
with its near band read from distance tables (``v3+dist``, ``packed+dist``, and both ``+dropout``:
`triton_backend.NEAR_BAND` = "distance", which runs at the tiles of `GPU_TILES`, with dropout at those of
`DROPOUT_TILES`; their gradients in the tables' one band, stored 16 bytes at a time: ``GRAD_BANDS``,
`triton_backend.GRADIENT_STORES` "aligned") and computed from the position tables (``v3+skew``, ``packed+skew``, and both ``+dropout``:
`triton_backend.NEAR_BAND` = "skew"); the forward also with no position terms (``plain``): plain attention in
the same kernel, the control. The sets above are of inputs longer than the saturation (``FAR_TILES``: far tiles
occur, three runs per program); ``short``, ``short+dist`` and both ``+dropout`` are the ``v3`` ones no longer
than it (v3 at N <= 512): one near run per program, whose backward sums no saturated pair, and with distance
tables its gradients in the tables' bands, stored 16 bytes at a time (``GRAD_BANDS``:
`triton_backend.GRADIENT_STORES`). They are shown, not used to choose: their code is the long sets' less the far
runs and the sums. The forward is also compiled with its distance tables cut to the saturation (``v3+dist+edges``,
``packed+dist+edges`` and both with dropout: `triton_backend.FORWARD_REACH` = "saturation", ``EDGES``: the near
tiles select the saturated values for their pairs beyond the tables' reach), shown, not used to choose, and with
its far runs in blocks of 64 keys (``v3+dist+far64``, ``packed+dist+far64``, ``v3+dist+edges+far64`` and
``v3+dist+dropout+far64``: `triton_backend.FORWARD_FAR_KEYS` = 64, ``FAR_N``; at tiles of 64 keys or more, the
tile's own), shown too; and dQ with its far runs in wide blocks (``v3+dist+far64`` and ``v3+dist+dropout+far32``:
`triton_backend.DQ_FAR_KEYS`), shown too (`SET_KERNELS`: which kernels compile which set).

A configuration qualifies for a use (``inference``: the three sets without dropout; ``dist``: the two
distance-table sets; ``dropout``: the three with dropout; ``dist+dropout``: the two distance-table sets with
it; ``skew``: the two skewed sets; ``skew+dropout``: those with dropout) when none of its sets spills; among
those, one that repeats no product in any set is preferred (replicated warps do the same work twice: the
scores, their position terms and exponentials), then one whose matrix products use HGMMA in every set, then
the largest tile, then the squarer one, then the longer side along the kernel's loop (keys for the forward and
dQ, queries for dK/dV), then fewer warps; marked per kernel, head dim and use: what `triton_backend.GPU_TILES`
(and, where dropout needs other tiles, `triton_backend.DROPOUT_TILES`; for the skewed kernels
`triton_backend.SKEW_TILES` and `SKEW_DROPOUT_TILES`) holds. This says nothing about speed (no GPU here):
`benchmarks/attention_gpu.py --tiles` times candidates.

Register allocation differs between Triton releases (a tile spill-free under one can spill under another), and
each PyTorch release pins its own Triton. The report therefore keeps the rows of every Triton version it was run
with, as long as they were compiled from the current code of their kernel (`kernel_sources`: per kernel, a hash of
the code it is compiled from, blind to comments and docstrings; rows of a kernel whose code changed are dropped,
the other kernels' kept, so that ``--kernels`` reruns only the kernels an edit touched), and a tile qualifies
only when it is spill-free under all of them.

Usage::

    python benchmarks/triton_static.py                # table + benchmarks/results/triton_static.{json,md}
    python benchmarks/triton_static.py --no-compile   # choose again from the report's rows (no compiling)
    python benchmarks/triton_static.py --kernels _dq_kernel _dkv_kernel   # after an edit to those kernels' code
    python benchmarks/triton_static.py --head-dims 64 --kernels _fwd_kernel --no-write

To add a Triton version, run it again in an environment with that version: its rows join the others'.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks" / "results" / "triton_static"
# the near band gathered from the tables (the tables road); inputs longer than the saturation, where far tiles
# occur (three runs per program)
_ROADS = dict(SKEW=False, DIST=False, FAR_TILES=True, GRAD_BANDS=False)
_SETS = {
    "v3": dict(IJ=True, HAS_ROW=True, HAS_COL=True, HAS_SEG=False, HAS_KMASK=True, CAUSAL=False, **_ROADS),
    "packed": dict(IJ=True, HAS_ROW=True, HAS_COL=True, HAS_SEG=True, HAS_KMASK=True, CAUSAL=True, **_ROADS),
    "worst": dict(IJ=False, HAS_ROW=True, HAS_COL=True, HAS_SEG=True, HAS_KMASK=True, CAUSAL=True, **_ROADS),
}
# the near band read from distance tables (`triton_backend.NEAR_BAND` = "distance"): at GPU_TILES' tiles, and
# with dropout at DROPOUT_TILES'
# with its gradients in the tables' one band, stored 16 bytes at a time (``GRAD_BANDS``:
# `triton_backend.GRADIENT_STORES` "aligned")
_DIST_SETS = {
    f"{name}+dist": dict(_SETS[name], DROPOUT=False, DIST=True, GRAD_BANDS=True) for name in ("v3", "packed")
}
_DIST_DROPOUT_SETS = {f"{name}+dropout": dict(f, DROPOUT=True) for name, f in _DIST_SETS.items()}
# a padded v3 batch no longer than the saturation (N <= 512 for v3): no far tile, one near run per program whose
# backward sums no saturated pair (``FAR_TILES`` false), on the distance road with its gradients in the tables'
# bands at an odd row stride (``GRAD_BANDS``: `triton_backend.GRADIENT_STORES`); shown, not configured: no
# larger than the v3 sets' code
_SHORT_SETS = {
    f"short{road}{drop}": dict(
        _SETS["v3"],
        FAR_TILES=False,
        DIST=road == "+dist",
        GRAD_BANDS=road == "+dist",
        DROPOUT=drop == "+dropout",
    )
    for road in ("", "+dist")
    for drop in ("", "+dropout")
}
# the forward on the distance road with its tables cut to the saturation (``EDGES``: `triton_backend.FORWARD_REACH`
# = "saturation"): its near tiles' pairs beyond the tables' reach take the saturated values; shown, not
# configured (the forward runs at the distance road's tiles)
_EDGE_SETS = {
    f"{name}+edges": dict(f, EDGES=True) for name, f in {**_DIST_SETS, **_DIST_DROPOUT_SETS}.items()
}
# the forward's far runs in blocks of 64 keys (``FAR_N``: `triton_backend.FORWARD_FAR_KEYS`; ``v3+dist+far64``
# dQ's too, `_DQ_FAR_SETS`), on the distance
# road, with its tables cut to the saturation, and with dropout; shown, not configured
_FAR_SETS = {
    f"{name}+far64": dict(f, FAR_N=64)
    for name, f in {
        **_DIST_SETS,
        "v3+dist+edges": _EDGE_SETS["v3+dist+edges"],
        "v3+dist+dropout": _DIST_DROPOUT_SETS["v3+dist+dropout"],
    }.items()
}
# dQ's far runs in wide blocks (``FAR_N``: `triton_backend.DQ_FAR_KEYS`), as the backend takes them without packed
# rows: 64 keys, and 32 with dropout; shown, not configured
_DQ_FAR_SETS = {
    "v3+dist+far64": _FAR_SETS["v3+dist+far64"],
    "v3+dist+dropout+far32": dict(_DIST_DROPOUT_SETS["v3+dist+dropout"], FAR_N=32),
}
FEATURES = {
    **{name: dict(f, DROPOUT=False) for name, f in _SETS.items()},
    **_DIST_SETS,
    **{f"{name}+dropout": dict(f, DROPOUT=True) for name, f in _SETS.items()},
    **_DIST_DROPOUT_SETS,
    **{f"{name}+skew": dict(_SETS[name], DROPOUT=False, SKEW=True) for name in ("v3", "packed")},
    **{f"{name}+skew+dropout": dict(_SETS[name], DROPOUT=True, SKEW=True) for name in ("v3", "packed")},
    **_SHORT_SETS,
    **_EDGE_SETS,
    **_FAR_SETS,
    **_DQ_FAR_SETS,
    "plain": dict(
        IJ=True,
        HAS_ROW=False,
        HAS_COL=False,
        HAS_SEG=False,
        HAS_KMASK=False,
        CAUSAL=False,
        DROPOUT=False,
        **_ROADS,
    ),
}
USES = {
    "inference": tuple(_SETS),
    "dist": tuple(_DIST_SETS),  # shown, not configured: the distance road runs at the inference tiles
    "dropout": tuple(f"{name}+dropout" for name in _SETS),
    "dist+dropout": tuple(_DIST_DROPOUT_SETS),  # shown, not configured: at the dropout tiles
    "skew": ("v3+skew", "packed+skew"),  # the near band from the position tables
    "skew+dropout": ("v3+skew+dropout", "packed+skew+dropout"),
}
# the sets compiled for some kernels alone (every other set: all three): the forward's own (``plain``,
# ``+edges``), and the wide far blocks' for the kernels that take them (`_FAR_SETS`: the forward's,
# `_DQ_FAR_SETS`: dQ's; ``v3+dist+far64`` both)
SET_KERNELS = {
    "plain": ("_fwd_kernel",),
    **dict.fromkeys(_EDGE_SETS, ("_fwd_kernel",)),
    **{
        name: ("_fwd_kernel",) * (name in _FAR_SETS) + ("_dq_kernel",) * (name in _DQ_FAR_SETS)
        for name in {**_FAR_SETS, **_DQ_FAR_SETS}
    },
}


def compiled_for(feature: str, kernel: str) -> bool:
    """Whether the report compiles ``kernel`` in set ``feature`` (`SET_KERNELS`)."""
    return kernel in SET_KERNELS.get(feature, (kernel,))


# 8 warps for every shape; 4 only for the small ones (larger 4-warp tiles spill: an earlier sweep); 16 keys per
# tile for the warpgroup row counts, for the register-hungry variants (dropout at head dim 128); 32x16 and 16x32
# for the skewed backward, whose two extra products per near tile need the registers of a larger tile (16x32
# with 8 warps: the skewed dK/dV at head dim 128)
CANDIDATES = [(m, n, 8) for m in (32, 64, 128) for n in (32, 64, 128)] + [
    (64, 16, 8),
    (128, 16, 8),
    (32, 32, 4),
    (64, 32, 4),
    (32, 64, 4),
    (32, 16, 4),
    (16, 32, 4),
    (16, 32, 8),
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--kernels", nargs="+", default=["_fwd_kernel", "_dq_kernel", "_dkv_kernel"])
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--no-compile", action="store_true", help="choose again from the report's rows (no compiling)"
    )
    return p.parse_args(argv)


def code_hash(source: str) -> str:
    """A hash of the code in `source`, blind to what compiles to nothing: comments, docstrings, layout and line
    endings (the module parsed, its docstrings dropped, unparsed again). Rows take minutes each to compile,
    and a comment made more exact should not make them stale."""
    tree = ast.parse(source)
    # the nodes ast.get_docstring reads
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        if isinstance(node, documented) and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.unparse(tree).encode()).hexdigest()[:16]


KERNELS_FILE = ROOT / "debertakit" / "attention" / "triton_kernels.py"
KERNELS = ("_fwd_kernel", "_dq_kernel", "_dkv_kernel")


def kernel_source_hash() -> str:
    """A hash of the whole kernels module's code (what a GPU run records of the kernels it timed)."""
    return code_hash(KERNELS_FILE.read_text())


def kernel_sources(source: str | None = None) -> dict[str, str]:
    """Per kernel, a hash of the code it is compiled from: the module's imports and, in the module's order, the
    top-level functions and constants the kernel names, and those they name, and so on (`code_hash`: blind to
    docstrings and comments). A row stays valid while its kernel's hash does: an edit to the dQ kernel's own
    code leaves the forward's rows current, and a rerun with ``--kernels _dq_kernel`` refreshes the rest."""
    tree = ast.parse(KERNELS_FILE.read_text() if source is None else source)
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                defined.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    out = {}
    for kernel in KERNELS:
        used, todo = set(), [kernel]
        while todo:
            name = todo.pop()
            if name in defined and name not in used:
                used.add(name)
                todo += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name)]
        nodes = {id(defined[name]) for name in used}
        body = imports + [n for n in tree.body if id(n) in nodes]
        out[kernel] = code_hash(ast.unparse(ast.Module(body=body, type_ignores=[])))
    return out


def load_report() -> dict:
    path = OUT.with_suffix(".json")
    return json.loads(path.read_text()) if path.exists() else dict(versions={}, rows=[])


# what `choose` and `table` read of a compiled row beyond the first reports' fields
ROW_FIELDS = ("replication",)


def current_rows(report: dict, sources: dict[str, str]) -> tuple[dict, list[dict]]:
    """The report's versions and rows of the kernels whose code is ``sources`` (`kernel_sources`) and read with
    every field of `ROW_FIELDS`; rows of a kernel whose code changed since, or read before a field was added, are
    dropped, loudly. A version entry records the sources its kernels were compiled from (``sources``)."""
    rows = report.get("rows", [])
    versions = {}
    for v, e in sorted(report.get("versions", {}).items()):
        recorded = e.get("sources", {})
        mine = [r for r in rows if r.get("triton") == v and "error" not in r]
        kept = {k: h for k, h in recorded.items() if sources.get(k) == h}
        stale = sorted({r["kernel"] for r in rows if r.get("triton") == v} - set(kept))
        if stale:
            print(
                f"dropping the rows of {', '.join(stale)} under Triton {v}: compiled from other kernel code "
                f"(run the report with it again, --kernels {' '.join(stale)})"
            )
        if not all(f in r for r in mine if r["kernel"] in kept for f in ROW_FIELDS):
            print(
                f"dropping the rows of Triton {v}: read without one of {ROW_FIELDS} (run the report with it again)"
            )
        elif kept:
            versions[v] = dict(torch=e["torch"], date=e["date"], sources=kept)
    valid = [
        r for r in rows if r.get("triton") in versions and r["kernel"] in versions[r["triton"]]["sources"]
    ]
    return versions, valid


def _one(job: tuple) -> dict:
    from debertakit.attention import triton_kernels as K
    from debertakit.attention.triton_aot import Tiles, compile_kernel

    kernel, head_dim, (m, n, w), stages, feature, dtype = job
    row = dict(kernel=kernel, head_dim=head_dim, tiles=str(Tiles(m, n, w, stages)), features=feature)
    flags = FEATURES[feature]
    if flags.get("FAR_N", n) < n:  # far blocks no wider than the tile's own (as the backend's `_far_keys`)
        flags = dict(flags, FAR_N=n)
    try:
        c = compile_kernel(getattr(K, kernel), dtype, head_dim, Tiles(m, n, w, stages), flags)
    except Exception as e:  # out of shared memory, unsupported shape: a result too
        return {**row, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    return {**row, **vars(c)}


def choose(rows: list[dict]) -> dict[tuple[str, int, str], str]:
    """Per (kernel, head dim, use): no spills in any feature set of the use under any Triton version of the rows
    (each version must have compiled it); then no replicated product in any of them, HGMMA in all of them, the
    largest tile, the squarer tile, the longer side along the kernel's loop, fewer warps."""
    versions = {r["triton"] for r in rows}
    by_cfg: dict[tuple, list[dict]] = {}
    for r in rows:
        for use, sets in USES.items():
            if r["features"] in sets:
                by_cfg.setdefault((r["kernel"], r["head_dim"], use, r["tiles"]), []).append(r)
    best: dict[tuple[str, int, str], tuple] = {}
    for (kernel, hd, use, tiles), rs in by_cfg.items():
        if {r["triton"] for r in rs} != versions or not all(
            "error" not in r and r["stack_bytes"] == 0 for r in rs
        ):
            continue
        distinct = all(r["replication"] == 1 for r in rs)
        hgmma = all(r["ops"]["HGMMA"] > 0 for r in rs)
        m, n = (int(x) for x in tiles.split()[0].split("x"))
        warps = int(tiles.split()[1][1:])
        # among equal areas the squarer tile: a program re-reads the streamed side once per block it owns (1/owned)
        # and pays per-tile overheads such as the online-softmax rescale once per streamed block (1/streamed),
        # so m + n is what to minimise; then the longer side along the kernel's loop
        inner = m if kernel == "_dkv_kernel" else n
        key = (distinct, hgmma, m * n, -(m + n), inner, -warps)
        if (kernel, hd, use) not in best or key > best[(kernel, hd, use)][0]:
            best[(kernel, hd, use)] = (key, tiles)
    return {k: v[1] for k, v in best.items()}


def _loops(loops: list[int]) -> str:
    return " · ".join(str(n) for n in loops)


def _loop_widths(loops: list[int], block_n: int, feature: str) -> list[int]:
    """The key blocks of a forward's or dQ's loops over tiles, in address order: BLOCK_N, but in a ``+far64`` /
    ``+far32`` set with wider far blocks (five loops: each far run's wide blocks, then its narrow ones, around
    the near loop)."""
    wide = max(FEATURES[feature].get("FAR_N", block_n), block_n)
    if len(loops) == 5 and wide > block_n:
        return [wide, block_n, block_n, wide, block_n]
    return [block_n] * len(loops)


def tile_costs(rows: list[dict], chosen: dict) -> str:
    """What one tile of each loop costs at the tiles chosen for inference, against the forward's loop without
    position terms at the same tile (``plain``, plain attention): instructions per thread in the loop's body, and
    per score (times the tile's threads, over its BLOCK_M × BLOCK_N scores)."""
    by_key = {(r["kernel"], r["head_dim"], r["tiles"], r["features"], r["triton"]): r for r in rows}
    lines = [
        "| kernel | d | tiles | triton | set | loops (far · near · far) | per score | far / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (kernel, hd, use), tiles in sorted(chosen.items()):
        if use != "inference":
            continue
        m, n = (int(x) for x in tiles.split()[0].split("x"))
        threads = 32 * int(tiles.split()[1][1:])
        for version in sorted({r["triton"] for r in rows}):
            plain = by_key.get(("_fwd_kernel", hd, tiles, "plain", version), {}).get("tile_loops", [])
            sets = (*_SETS, *_DIST_SETS, *(name for name, f in _SHORT_SETS.items() if not f["DROPOUT"]))
            edges = (name for name, f in _EDGE_SETS.items() if not f["DROPOUT"])
            far = (name for name, f in {**_FAR_SETS, **_DQ_FAR_SETS}.items() if not f["DROPOUT"])
            for feature in ("plain", *sets, *edges, *far):
                if not compiled_for(feature, kernel):
                    continue
                loops = by_key.get((kernel, hd, tiles, feature, version), {}).get("tile_loops", [])
                if not loops:
                    continue
                per_score = " · ".join(
                    f"{b * threads / (m * w):.1f}" for b, w in zip(loops, _loop_widths(loops, n, feature))
                )
                ratio = ""
                if len(plain) == 1 and len(loops) == 3 and kernel == "_fwd_kernel":
                    ratio = f"{max(loops[0], loops[2]) / plain[0]:.2f}"
                lines.append(
                    f"| {kernel} | {hd} | {tiles} | {version} | {feature} | {_loops(loops)} | "
                    f"{per_score} | {ratio} |"
                )
    return "\n".join(lines)


def table(rows: list[dict], chosen: dict) -> str:
    head = (
        "| kernel | d | tiles | features | triton | regs | spill stack B | shared KiB | HGMMA | HMMA | replicated |"
        " LDG | instr | loads in branches | tile loops |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        use = next((u for u, sets in USES.items() if r["features"] in sets), None)
        mark = " **←**" if chosen.get((r["kernel"], r["head_dim"], use)) == r["tiles"] else ""
        if "error" in r:
            lines.append(
                f"| {r['kernel']} | {r['head_dim']} | {r['tiles']}{mark} | {r['features']} | {r['triton']} | "
                f"{r['error']} |  |  |  |  |  |  |  |  |  |"
            )
            continue
        o = r["ops"]
        lines.append(
            f"| {r['kernel']} | {r['head_dim']} | {r['tiles']}{mark} | {r['features']} | {r['triton']} | "
            f"{r['registers']} | "
            f"{r['stack_bytes']} | {r['shared_bytes'] / 1024:.0f} | {o['HGMMA']} | {o['HMMA']} | "
            f"{r['replication']}× | {o['LDG']} | "
            f"{r['instructions']} | {r['branch_loads']} | {_loops(r.get('tile_loops', []))} |"
        )
    return "\n".join(lines)


def compile_rows(args: argparse.Namespace) -> list[dict]:
    """Every (kernel, head dim, candidate tile, feature set) compiled with the installed Triton."""
    import triton

    jobs = [
        (kernel, hd, cand, args.stages, feature, args.dtype)
        for kernel in args.kernels
        for hd in args.head_dims
        for cand in CANDIDATES
        for feature in FEATURES
        if compiled_for(feature, kernel)
    ]
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety

        def tqdm(x, **_):
            return x

    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(tqdm(pool.map(_one, jobs), total=len(jobs), desc="compiling", unit="kernel"))
    return [{**r, "triton": triton.__version__} for r in rows]


def write_report(
    args: argparse.Namespace, versions: dict, rows: list[dict], chosen: dict, text: str, costs: str
) -> None:
    from debertakit.convert.checkpoint import atomic_write_text

    env = dict(
        target="sm_90 (compiled without a GPU; Triton's ptxas and cuobjdump)",
        dtype=args.dtype,
        stages=args.stages,
        command="python benchmarks/triton_static.py (once per Triton version)",
    )
    chosen_out = {f"{k} d{hd} {use}": t for (k, hd, use), t in sorted(chosen.items())}
    report = dict(env=env, versions=versions, chosen=chosen_out, rows=rows)
    atomic_write_text(OUT.with_suffix(".json"), json.dumps(report, indent=1) + "\n")
    md = [
        "# Static report of the triton kernels (sm_90, no GPU)",
        "",
        *(f"- {k}: {v}" for k, v in env.items()),
        *(
            f"- Triton {v}: torch {e['torch']}, compiled {e['date']}, kernel sources "
            + ", ".join(f"{k} {h}" for k, h in sorted(e["sources"].items()))
            for v, e in sorted(versions.items())
        ),
        "",
        "Registers per thread, local-memory stack (register spills), shared memory and the instruction mix of the",
        "cubins, and the loads left inside a branch of the Triton GPU IR (issued when reached, not prefetched by",
        "the software pipeliner). Static only: no timing. **←** marks the tiles chosen per kernel, head dim and",
        "use (inference: the sets without dropout; dist: the `+dist` sets, the near band read from distance tables,",
        "shown only: that road runs at the inference tiles; dropout: the `+dropout` sets of the other roads;",
        "dist+dropout: the `+dist+dropout` sets, shown only: that road runs at the dropout tiles; skew: the `+skew` sets,",
        "the near band computed from the position tables; skew+dropout: the `+skew+dropout` sets): no spills in",
        "any set of the use under any of the Triton versions; then no replicated product in any (the",
        "`replicated` column: how many times over the kernel computes its most replicated matrix product, 2 where",
        "two warpgroups both compute every score of the tile), HGMMA in all, the largest tile, the squarer tile,",
        "the longer side along the kernel's loop, fewer warps.",
        "",
        "Chosen:",
        "",
        *(f"- {k}: {v}" for k, v in chosen_out.items()),
        "",
        "## What one tile costs",
        "",
        "The loops over tiles at the tiles chosen for inference: instructions per thread in each loop's body (at",
        "distance i - j the far run before the program's block, the near band, the far run after it; the worst",
        "set, explicit positions, runs one loop with a branch per tile, which the binary can close with more than",
        "one backward branch; the `short` sets, no far tile, one near loop), the same per score (times the tile's",
        "threads, over its scores), and for the forward",
        "the costlier far loop over the single loop of the same kernel without position terms (plain attention).",
        "The forward's `+edges` sets cut its distance tables to the saturation (`triton_backend.FORWARD_REACH`):",
        "their near loop selects the saturated values for the pairs beyond the tables' reach. Its `+far64` sets take",
        "the far runs in blocks of 64 keys (`triton_backend.FORWARD_FAR_KEYS`): five loops, each far run's wide",
        "blocks (per score over their 64 keys), then its narrow ones, around the near loop; dQ's `+far64` and",
        "`+far32` sets the same for dQ (`triton_backend.DQ_FAR_KEYS`).",
        "Static: a loop's instructions, not its time (latencies, memory and the tensor cores' throughput differ).",
        "",
        costs,
        "",
        "## Every configuration",
        "",
        text,
        "",
    ]
    atomic_write_text(OUT.with_suffix(".md"), "\n".join(md))
    print(
        f"wrote {OUT.with_suffix('.json').relative_to(ROOT)} and {OUT.with_suffix('.md').relative_to(ROOT)}"
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    defaults = parse_args([])
    partial = any(getattr(args, f) != getattr(defaults, f) for f in ("head_dims", "stages", "dtype"))
    if partial and not args.no_write and not args.no_compile:
        raise SystemExit("a partial run (other head dims, stages or dtype) is not written: add --no-write")
    unknown = [k for k in args.kernels if k not in KERNELS]
    if unknown:
        raise SystemExit(f"--kernels {' '.join(unknown)}: expected some of {' '.join(KERNELS)}")
    if os.environ.get("TRITON_INTERPRET") == "1" and not args.no_compile:
        raise SystemExit("unset TRITON_INTERPRET: the kernels must be JIT functions to be compiled")
    sources = kernel_sources()
    versions, rows = current_rows(load_report(), sources)
    if not args.no_compile:
        import torch
        import triton

        # the kernels compiled now replace their rows of this Triton version; the others' rows stay
        new, v = compile_rows(args), triton.__version__
        rows = [r for r in rows if not (r["triton"] == v and r["kernel"] in args.kernels)] + new
        kept = versions.get(v, {}).get("sources", {})
        versions[v] = dict(
            torch=torch.__version__,
            date=datetime.date.today().isoformat(),
            sources={**kept, **{k: sources[k] for k in args.kernels}},
        )
    if not rows:
        raise SystemExit("no rows of the current kernel source to choose from: run without --no-compile")
    chosen = choose(rows)
    text = table(rows, chosen)
    costs = tile_costs(rows, chosen)
    print(text)
    print()
    print(costs)
    print()
    for (kernel, hd, use), tiles in sorted(chosen.items()):
        print(f"chosen: {kernel} d{hd} {use}: {tiles}")
    if not args.no_write:
        write_report(args, versions, rows, chosen, text, costs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
