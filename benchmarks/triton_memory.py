"""Memory requests and sectors of the `triton` backend's kernels for sm_90, without a GPU, against flashdeberta's.

Each implementation runs forward and backward once in Triton's CPU interpreter on one head of a v3 input (bf16,
c2p + p2c, 256 buckets, N = 512 by default: every tile a near tile), with every load's addresses recorded, and
each kernel is then compiled for sm_90 as it was launched (`debertakit.attention.triton_access`): the layout of
each load in the Triton GPU IR says which lane reads which element, and its PTX how many bytes a lane reads.
Per load site (a source line) and call (a tile, for the loads in the loops over tiles) the report gives the warp
requests, the 32-byte sectors they touch and the fewest sectors the elements read need; per kernel the totals per
1000 (query, key) pairs. What a tile moves through the L1 cache, not how fast it runs: no GPU here.

Rows: ``triton tables`` (`triton_backend.NEAR_BAND` = "tables": the near band gathered through the lookup table
from float32 N×R products), ``triton distance`` (read as strided tiles from the products laid out by distance),
both at `GPU_TILES` unless ``--tiles`` says otherwise, and ``flashdeberta`` (PyPI's 0.0.8, its own tiles) where
it imports. Each Triton version run adds its rows (``benchmarks/results/triton_memory.{json,md}``).

Usage::

    python benchmarks/triton_memory.py                     # N = 512, tiles of GPU_TILES, table + results
    python benchmarks/triton_memory.py --n 1024 --tiles 128x32w8s2 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
ROADS = {"triton tables": "tables", "triton distance": "distance"}
FLASHDEBERTA = "flashdeberta"
SOURCES = {"triton": ("triton_kernels.py", "debertakit.attention.triton_kernels"),
           FLASHDEBERTA: ("flash_attention.py", "flashdeberta.ops.flash_attention")}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=512, help="sequence length (one batch row, one head)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument(
        "--tiles", default=None, help="tiles of all three triton kernels, e.g. 64x32w4s2 (default: GPU_TILES)"
    )
    p.add_argument("--impls", nargs="+", default=[*ROADS, FLASHDEBERTA], help="rows to measure")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--record", default=None, help=argparse.SUPPRESS)  # internal: run one row interpreted
    p.add_argument("--pickle", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _inputs(n: int, d: int):
    import torch

    from debertakit.attention import RelativeIndex

    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 1, d, generator=g, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    pos_q, pos_k = (torch.randn(1, rel.table_rows, d, generator=g, dtype=torch.bfloat16) for _ in range(2))
    return rel, [t.requires_grad_() for t in (q, k, v, pos_q, pos_k)]


def _run_triton(args, road: str) -> dict:
    from debertakit.attention import Geometry, PositionTerms, scale_for, triton_backend
    from debertakit.attention.triton_aot import Tiles
    from debertakit.attention.triton_backend import KERNEL_NAMES

    rel, (q, k, v, pos_q, pos_k) = _inputs(args.n, args.head_dim)
    configured = triton_backend.GPU_TILES[triton_backend._tile_width(args.head_dim)]
    tiles = {name: Tiles.parse(args.tiles) if args.tiles else configured[name] for name in KERNEL_NAMES}
    triton_backend.NEAR_BAND = road
    triton_backend.TILE_OVERRIDES.update(tiles)  # on the CPU the backend would take 16x16 tiles
    terms = PositionTerms(c2p=True, p2c=True)
    out, _ = triton_backend.triton_attention(
        q, k, v, pos_q, pos_k, rel, Geometry(), scale=scale_for(args.head_dim, 3), terms=terms
    )
    out.float().sum().backward()
    return {name: str(t) for name, t in tiles.items()}


def _run_flashdeberta(args) -> dict:
    import contextlib

    import torch
    from flashdeberta.ops.flash_attention import flash_attention_with_disentangled

    # its launches enter torch.cuda.device(q.device.index), which has no meaning for CPU tensors (this process
    # only runs this row)
    torch.cuda.device = lambda index: contextlib.nullcontext()

    rel, (q, k, v, pos_q, pos_k) = _inputs(args.n, args.head_dim)
    scale = args.head_dim**-0.5 / 3**0.5
    out = flash_attention_with_disentangled(q, k, v, None, pos_k[None], pos_q[None], False, scale, 256, 512)
    out.float().sum().backward()
    return {}


def record(args) -> None:
    """In a process with TRITON_INTERPRET=1: run one row, pickle its loads and launches."""
    from debertakit.attention.triton_access import record_run

    family = FLASHDEBERTA if args.record == FLASHDEBERTA else "triton"
    with record_run(SOURCES[family][0]) as (loads, launches):
        tiles = _run_flashdeberta(args) if family == FLASHDEBERTA else _run_triton(args, ROADS[args.record])
    with open(args.pickle, "wb") as f:
        pickle.dump(dict(family=family, loads=dict(loads), launches=launches, tiles=tiles), f)


def _interpreted(args, impl: str) -> dict | None:
    """One row's recorded run (`record`, in a subprocess with the interpreter on); None where flashdeberta is
    not installed."""
    if impl == FLASHDEBERTA and importlib.util.find_spec("flashdeberta") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.pkl"
        cmd = [sys.executable, __file__, "--record", impl, "--pickle", str(out), "--n", str(args.n),
               "--head-dim", str(args.head_dim)] + (["--tiles", args.tiles] if args.tiles else [])  # fmt: skip
        done = subprocess.run(cmd, env=os.environ | {"TRITON_INTERPRET": "1"}, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{impl}: the interpreted run failed:\n{done.stderr[-3000:]}")
        with open(out, "rb") as f:
            return pickle.load(f)


def _compiled(fn, launch) -> tuple[str, str]:
    from debertakit.attention.triton_access import launch_source
    from debertakit.attention.triton_aot import compile_source

    args, kwargs = launch
    # the interpreter ran the products widened to float32 (``PREC`` 2); a GPU runs them on the tensor cores
    overrides = {"PREC": 0} if "PREC" in kwargs else {}
    src, options = launch_source(fn, args, kwargs, overrides)
    compiled = compile_source(src, options)
    return compiled.asm["ttgir"], compiled.asm["ptx"]


def measure(args, impl: str) -> list[dict] | None:
    """Rows (one per kernel) of one implementation: its load sites' traffic per call, and totals per 1000 pairs."""
    from debertakit.attention.triton_access import (
        access_bytes,
        load_sites,
        load_widths,
        store_widths,
        traffic,
    )

    run = _interpreted(args, impl)
    if run is None:
        return None
    source, module = SOURCES[run["family"]]
    kernels = importlib.import_module(module)
    pairs = args.n * args.n
    rows = []
    for kernel, launch in run["launches"].items():
        if kernel.startswith("_keep_mask") or not hasattr(kernels, kernel):
            continue  # the dropout mask's kernel; the distance tables' product (`triton_products`), no tile loads
        ttgir, ptx = _compiled(getattr(kernels, kernel), launch)
        loads = {key: calls for key, calls in run["loads"].items() if key[0] == kernel}
        sites, skipped = traffic(loads, load_sites(ttgir, source), access_bytes(ptx, source))
        tiles = run["tiles"].get(kernel) or _launch_tiles(launch[1])
        rows.append(dict(
            impl=impl, kernel=kernel, tiles=tiles,
            requests_per_1k_pairs=round(sum(s.requests * s.calls for s in sites) * 1000 / pairs, 2),
            sectors_per_1k_pairs=round(sum(s.sectors * s.calls for s in sites) * 1000 / pairs, 2),
            needed_per_1k_pairs=round(sum(s.needed * s.calls for s in sites) * 1000 / pairs, 2),
            sites=[dict(s.__dict__, requests=round(s.requests, 1), sectors=round(s.sectors, 1),
                        needed=round(s.needed, 1), excess=round(s.excess, 2)) for s in sites],
            skipped=skipped,
            ptx_loads=load_widths(ptx),
            ptx_stores=store_widths(ptx),
        ))  # fmt: skip
    return rows


def _launch_tiles(kwargs: dict) -> str:
    """A launch's tiles as `Tiles` prints them, from what it names (flashdeberta's preprocessing names no BLOCK_N)."""
    sides = "x".join(str(kwargs[k]) for k in ("BLOCK_M", "BLOCK_N") if k in kwargs)
    rest = " ".join(f"{p}{kwargs[k]}" for p, k in (("w", "num_warps"), ("s", "num_stages")) if k in kwargs)
    return f"{sides} {rest}".strip()


def summary(rows: list[dict]) -> str:
    lines = [
        "| implementation | kernel | tiles | requests / 1k pairs | sectors / 1k pairs | needed / 1k pairs | excess "
        "| global loads in the PTX, by bytes / lane | global stores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        excess = r["sectors_per_1k_pairs"] / max(r["needed_per_1k_pairs"], 1e-9)
        loads, stores = (
            " · ".join(f"{n} of {w} B" for w, n in r.get(key, {}).items()) or "—"
            for key in ("ptx_loads", "ptx_stores")
        )
        lines.append(
            f"| {r['impl']} | {r['kernel']} | {r['tiles']} | {r['requests_per_1k_pairs']} | "
            f"{r['sectors_per_1k_pairs']} | {r['needed_per_1k_pairs']} | {excess:.2f} | {loads} | {stores} |"
        )
    return "\n".join(lines)


def sites_table(rows: list[dict]) -> str:
    lines = [
        "| implementation | kernel | site | op | layout | bytes / lane | calls | requests / call | sectors / call "
        "| needed / call | excess |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for s in r["sites"]:
            lines.append(
                f"| {r['impl']} | {r['kernel']} | {s['function']}:{s['line']} | {s['op']} | {s['layout']} | "
                f"{s['width']} | {s['calls']} | {s['requests']} | {s['sectors']} | {s['needed']} | {s['excess']:.2f} |"
            )
    return "\n".join(lines)


def write(args, rows: list[dict]) -> None:
    import torch
    import triton

    path = RESULTS / "triton_memory.json"
    old = json.loads(path.read_text()) if path.exists() else {"versions": {}, "rows": []}
    env = dict(
        torch=torch.__version__, date=datetime.date.today().isoformat(), n=args.n, head_dim=args.head_dim
    )
    old["versions"][triton.__version__] = env
    keep = [r for r in old["rows"] if r["triton"] != triton.__version__]
    old["rows"] = keep + [dict(r, triton=triton.__version__) for r in rows]
    old["command"] = "python benchmarks/triton_memory.py (once per Triton version)"
    path.write_text(json.dumps(old, indent=1) + "\n")
    parts = [f"# Memory requests of the kernels (sm_90, compiled without a GPU)\n\n`{old['command']}`\n"]
    for version, env in sorted(old["versions"].items()):
        these = [r for r in old["rows"] if r["triton"] == version]
        parts.append(f"## Triton {version} (torch {env['torch']}, {env['date']}, N = {env['n']}, head dim "
                     f"{env['head_dim']}, bf16, v3 c2p + p2c)\n\n{summary(these)}\n\n{sites_table(these)}\n\n"
                     f"Not counted (loads in layouts not modelled: slices of the tensor-core layout, scalars):\n\n"
                     + "\n".join(f"- {r['impl']} {r['kernel']}: {x}" for r in these for x in r["skipped"]) + "\n")  # fmt: skip
    (RESULTS / "triton_memory.md").write_text("\n".join(parts))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.record:
        record(args)
        return 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the kernels must be JIT functions to be compiled")
    unknown = [i for i in args.impls if i not in [*ROADS, FLASHDEBERTA]]
    if unknown:
        raise SystemExit(f"unknown --impls {unknown}: expected some of {[*ROADS, FLASHDEBERTA]}")
    rows = []
    for impl in args.impls:
        got = measure(args, impl)
        if got is None:
            print(f"{impl}: not installed, skipped")
            continue
        rows += got
    text = summary(rows) + "\n\n" + sites_table(rows)
    print(text)
    for r in rows:
        for reason in r["skipped"]:
            print(f"{r['impl']} {r['kernel']}: left out {reason}")
    if not args.no_write:
        write(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
