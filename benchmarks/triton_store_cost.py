"""What the backward's distance-space stores cost the dQ and dK/dV kernels' near loops, compiled for sm_90 here.

Each near tile of the two backward kernels stores its score gradients dS into a distance buffer, one cell per
(own row, partner) (`triton_kernels._table_grad`). A query row's cells are SAT + j - i at the buffer's row
stride DW, a multiple of 16 (the folds' matmuls need aligned rows), so consecutive rows start on every element
in turn: Triton stores the tile element by element, each with its own address and a mask per element (pairs
beyond the saturation are summed, not stored). This script compiles the two kernels at their GPU tiles
(`triton_backend.GPU_TILES`, bf16, head dim 64) for the distance road's feature sets, in three versions of the
store, and reports the instructions per tile of each loop run (`triton_aot.tile_loops`), the registers and the
global stores:

- ``now``: the kernels as they are;
- ``no dS store``: the store removed (with its addresses and mask): the most any other store could save;
- ``aligned rows, mask per row``: the store at ``own·DW + partner`` with the row mask only. This is what a
  buffer whose rows start 16-byte aligned at the tile's first partner would compile to, with no per-pair mask:
  for instance, rows shifted within their padding by their index modulo 8, and wide enough for every pair of a
  near tile. It is not a correct kernel; it shows what such a layout would leave of the store.
- ``odd stride (GRAD_BANDS)``: the kernels as they are, for gradients in the distance tables' layout at its
  odd row stride (`triton_backend.GRADIENT_STORES` "aligned", the default): the layout the previous variant
  stood for, built for the inputs without far tiles (the ``short`` set, in the tables' bands; since
  2026-11-27) and for those with far tiles (``v3+dist``, in their one band, wide enough for every pair of a
  near tile; since 2026-11-27, later), whose rows need no per-pair mask and whose near tiles sum no saturated pair.

The first three compile the sets with ``GRAD_BANDS`` off (the buffers at a row stride of 16 cells). The variants
are made by replacing the store's lines in a copy of `triton_kernels`' source; the script stops if those lines
are not found. Static only, no timing.

    python benchmarks/triton_store_cost.py   # table + benchmarks/results/triton_store_cost.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from triton_static import FEATURES  # noqa: E402

from debertakit.attention import triton_backend  # noqa: E402
from debertakit.attention.triton_aot import compile_kernel  # noqa: E402
from debertakit.convert.checkpoint import atomic_write_text  # noqa: E402

KERNELS = ("_dq_kernel", "_dkv_kernel")
SETS = ("v3+dist", "short+dist")
STORE = "        tl.store(DIST + cells, ds.to(DIST.dtype.element_ty), mask=near)\n"
CELLS = """        if AXIS == 1:
            # a row term plus the keys' positions: Triton sees the cells run along the row (at distance i - j)
            cells = (own * DW + OFF - qpos)[:, None] + kpos[None, :]
            owned = own_in[:, None]
        else:
            cells = own[None, :] * DW + delta + OFF
            owned = own_in[None, :]
"""
ALIGNED_CELLS = """        if AXIS == 1:
            cells = (own * DW)[:, None] + kpos[None, :]
            owned = own_in[:, None]
        else:
            cells = (own * DW)[None, :] + qpos[:, None]
            owned = own_in[None, :]
"""
VARIANTS = {
    "now": [],
    "no dS store": [(STORE, "        pass\n")],
    "aligned rows, mask per row": [
        (CELLS, ALIGNED_CELLS),
        (STORE, STORE.replace("mask=near", "mask=owned")),
    ],
    "odd stride (GRAD_BANDS)": [],
}
BANDED = "odd stride (GRAD_BANDS)"  # compiled with GRAD_BANDS


def kernels_module(edits: list[tuple[str, str]], folder: Path):
    """`triton_kernels` with ``edits`` (old, new) applied to its source, imported from ``folder``."""
    source = (ROOT / "debertakit" / "attention" / "triton_kernels.py").read_text()
    for old, new in edits:
        if source.count(old) != 1:
            raise SystemExit(f"triton_kernels.py no longer holds this once:\n{old}")
        source = source.replace(old, new)
    name = f"triton_kernels_variant_{abs(hash(tuple(edits)))}"
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (Triton resolves a kernel's globals through its module)
    spec.loader.exec_module(module)
    return module


def measure() -> list[dict]:
    import triton

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for variant, edits in VARIANTS.items():
            module = kernels_module(edits, Path(folder))
            for kernel in KERNELS:
                tiles = triton_backend.GPU_TILES[64][kernel]
                for features in SETS:
                    flags = dict(FEATURES[features], GRAD_BANDS=variant == BANDED)
                    c = compile_kernel(getattr(module, kernel), "bf16", 64, tiles, flags)
                    row = dict(
                        triton=triton.__version__,
                        kernel=kernel,
                        tiles=str(tiles),
                        features=features,
                        variant=variant,
                        registers=c.registers,
                        stack_bytes=c.stack_bytes,
                        tile_loops=c.tile_loops,
                        stores=c.ops["STG"],
                        stores_16_bytes=c.ops["STG.128"],
                    )
                    rows.append(row)
                    print(_line(row), flush=True)
    return rows


def _line(r: dict) -> str:
    loops = " · ".join(map(str, r["tile_loops"]))
    return (
        f"| {r['kernel']} | {r['tiles']} | {r['features']} | {r['triton']} | {r['variant']} | {loops} | "
        f"{r['registers']} | {r['stack_bytes']} | {r['stores']} ({r['stores_16_bytes']}) |"
    )


HEADER = (
    "| kernel | tiles | set | triton | store | instructions per tile (far · near · far) | registers | "
    "spill stack B | stores (16-byte) |\n|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "triton_store_cost.json")
    args = p.parse_args(argv)
    print(HEADER)
    rows = measure()
    # the rows of other Triton versions stay: a run per version
    old = json.loads(args.out.read_text())["rows"] if args.out.exists() else []
    versions = {r["triton"] for r in rows}
    rows = [r for r in old if r["triton"] not in versions] + rows
    rows.sort(key=lambda r: (r["kernel"], r["features"], r["triton"], list(VARIANTS).index(r["variant"])))
    table = "\n".join([HEADER, *map(_line, rows)])
    result = dict(
        date=datetime.date.today().isoformat(),
        command="python benchmarks/triton_store_cost.py",
        target="sm_90, compiled without a GPU",
        rows=rows,
        table=table,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
