"""Lower bounds on the `triton` backend's attention time on a GPU, from what it must move and compute.

Which near-band road (`triton_backend.NEAR_BAND_MODES`) can reach the issue's targets at all? Each call is a
sequence of launches: the work around the kernels (the N×R tables, the backward's folds), counted exactly on
PyTorch's ``meta`` device by ``triton_host_cost.measure``, then the fused kernels. No launch can take less than
its bytes over the GPU's memory bandwidth, nor less than its matrix-product FLOPs over the tensor cores' peak, so

    time >= max(host bytes / bandwidth, host FLOPs / peak) + Σ over kernels max(bytes / bandwidth, FLOPs / peak)

with each launch's bytes less what L2 may hold (below). The attention FLOPs of the benchmark's convention
(4·N²·d per head forward, 3.5× that forward+backward) over that time cap the TFLOP/s any implementation of
that road's data flow can show. The kernels' bytes counted here are the least they must move between memory
and the chip, at the GPU benchmark's shapes (v3-base positions, 12 heads, d 64, batch·N = 16384, bfloat16,
distance i - j):

- q, k, v read and the output and its log-sum-exp written; backward, the dQ kernel reads q, k, v, o, dO and
  writes dQ and DELTA, the dK/dV kernel reads q, k, v, dO, DELTA and writes dK, dV, and each writes its
  distance buffer whole (every cell, the zeros included: `triton_kernels`, "Backward");
- the position-table cells the near pairs (``|i - j| < sat``) use, in whole 32-byte sectors: on the ``tables``
  road each query row's distinct ``ROW[i, idx(i - j)]`` (float32) and each key column's ``COL[j, idx]``, on the
  ``distance`` road one bfloat16 cell per near pair and side (its tables are laid out by distance); each
  kernel reads them (the backward's two recompute the scores); the skewed roads read none (they multiply the
  position tables in the kernel) but their two extra products per near tile count as FLOPs (the forward's on
  both skewed roads, the backward kernels' on ``skew``), at `triton_backend.SKEW_TILES`;
- FLOPs: the attention's products, 2·N²·d each, two forward and seven backward (the dQ kernel recomputes S and
  dP, the dK/dV kernel both again: 3.5× the forward, where one fused backward would do 2.5×);
- every launch, the host's and the kernels', may find up to the L2's size of what it reads already in L2 and
  leave as much of what it writes there (`_memory_bytes`): that much less of its bytes is counted.

Far tiles, dropout, the tiles' rounding of the band and every latency are left out: each only adds time. A cap
below a target rules the road out on that GPU; above it, ``target / cap`` is the share of the GPU's peak
bandwidth and tensor-core rate the road would have to sustain over the whole call to reach the target. The
peaks are NVIDIA's datasheet figures (dense bfloat16 tensor-core FLOP/s, HBM bandwidth, L2 size; ``--gpus``
picks among them).

    python benchmarks/triton_bounds.py     # table + benchmarks/results/triton_bounds.{json,md}
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import attention_gpu  # noqa: E402
import triton_host_cost  # noqa: E402

from debertakit.attention import triton_backend  # noqa: E402
from debertakit.attention.relative import RelativeIndex  # noqa: E402
from debertakit.convert.checkpoint import atomic_write_text  # noqa: E402

SECTOR = 32  # bytes: the unit a GPU's memory moves


class Gpu(NamedTuple):
    name: str
    bandwidth: float  # bytes / s
    peak: float  # dense bfloat16 tensor-core FLOP/s
    l2: int  # bytes


# NVIDIA's datasheet figures (SXM parts)
GPUS = {
    "h100": Gpu("H100 SXM (3.35 TB/s, 989 TFLOP/s, 50 MB L2)", 3.35e12, 989e12, 50 * 2**20),
    "h200": Gpu("H200 SXM (4.8 TB/s, 989 TFLOP/s, 50 MB L2)", 4.8e12, 989e12, 50 * 2**20),
}


def _sectors(cells: np.ndarray, cell_bytes: int) -> int:
    """Distinct 32-byte sectors holding ``cells`` (indices into one row that starts on a sector)."""
    return len(np.unique(cells * cell_bytes // SECTOR))


def table_cells_bytes(road: str, n: int, rel: RelativeIndex) -> int:
    """Bytes of position-table cells one (b, h)'s near pairs read, both sides (ROW by query row, COL by key
    column, in whole sectors), for one kernel; 0 on the skewed roads. At distance i - j the two sides read the
    same pattern (a key column's distances are a query row's, negated), so one side is counted twice."""
    if road not in ("tables", "distance"):
        return 0
    sat = max(1, min(rel.saturation, n))
    lut = rel.lut.numpy()
    first = lut[rel.saturation - sat : rel.saturation + sat + 1].min()  # the tables' first row (`_lut`)
    total = 0
    for i in range(n):
        lo, hi = max(-(sat - 1), i - (n - 1)), min(sat - 1, i)  # the near distances i - j of row i
        if road == "tables":
            total += _sectors(lut[np.arange(lo, hi + 1) + rel.saturation] - first, 4)
        else:  # one bfloat16 cell per distance, contiguous
            total += math.ceil((hi - lo + 1) * 2 / SECTOR)
    return 2 * total * SECTOR


def _near_tiles(n: int, sat: int, block_m: int, block_n: int) -> int:
    """Tiles of one (b, h) with a pair less than ``sat`` apart (the kernels' `_far` test, negated)."""
    starts_m = np.arange(0, n, block_m)[:, None]
    starts_n = np.arange(0, n, block_n)[None, :]
    far = (starts_m - (starts_n + block_n - 1) >= sat) | ((starts_m + block_m - 1) - starts_n <= -sat)
    return int((~far).sum())


def kernel_work(road: str, n: int, batch: int, heads: int, dim: int, rel: RelativeIndex) -> dict:
    """The least bytes each phase's kernels move and the FLOPs they compute (see the module docstring)."""
    bh, tokens = batch * heads, batch * n
    act = tokens * heads * dim * 2  # one (B, N, H, d) bfloat16 tensor
    sat = max(1, min(rel.saturation, n))
    tables = bh * table_cells_bytes(road, n, rel)
    products = 2 * bh * n * n * dim  # one N×N×d product, all heads

    def skewed(kernel: str) -> int:
        """FLOPs of a skewed kernel's two products per near tile, (BLOCK_M, WT) and (WT, BLOCK_N), depth d."""
        t = triton_backend.SKEW_TILES[64][kernel]
        wt = 2 * max(t.block_m, t.block_n)
        return bh * _near_tiles(n, sat, t.block_m, t.block_n) * 2 * dim * wt * (t.block_m + t.block_n)

    fwd_extra = skewed("_fwd_kernel") if road in ("skew-forward", "skew") else 0
    dq_extra, dkv_extra = (skewed("_dq_kernel"), skewed("_dkv_kernel")) if road == "skew" else (0, 0)
    lse = tokens * heads * 4  # one float32 per query row and head (LSE, DELTA)
    buffer = bh * n * triton_backend._distance_stride(sat) * 2  # a distance buffer, written whole, bfloat16
    # per kernel launch, (bytes, FLOPs). Forward: q k v read, o and LSE written. dQ: q k v o dO and LSE read,
    # dQ, DELTA and its buffer written. dK/dV: q k v dO, LSE and DELTA read, dK, dV and its buffer written
    forward = [(4 * act + lse + tables, 2 * products + fwd_extra)]
    dq = (5 * act + 2 * lse + buffer + tables, 3 * products + dq_extra)
    dkv = (6 * act + 2 * lse + buffer + tables, 4 * products + dkv_extra)
    return {"forward": forward, "backward": [dq, dkv]}


def _memory_bytes(moved: int, gpu: Gpu) -> int:
    """The least of the ``moved`` bytes of one launch that go through memory: it may find up to the L2's size of
    what it reads already there and leave up to that much of what it writes there."""
    return max(moved - 2 * gpu.l2, 0)


def bound(road: str, n: int, gpu: Gpu, tokens: int, heads: int, dim: int) -> dict:
    """The time bound of each phase and the TFLOP/s it caps (forward; forward+backward)."""
    host = triton_host_cost.measure(n, tokens, heads, dim, road)
    batch = host["batch"]
    kern = kernel_work(road, n, batch, heads, dim, triton_host_cost.V3_BASE)
    seconds = {}
    for phase in ("forward", "backward"):
        h, k = host[phase], kern[phase]
        host_bytes = sum(_memory_bytes(b, gpu) for b in h["launch_bytes"])
        host_s = max(host_bytes / gpu.bandwidth, (h["fp32_flops"] + h["half_flops"]) / gpu.peak)
        kernel_s = sum(max(_memory_bytes(b, gpu) / gpu.bandwidth, f / gpu.peak) for b, f in k)
        seconds[phase] = host_s + kernel_s
        seconds[f"{phase}_host"] = host_s
    flops = host["attention_fwd_flops"]  # the benchmark's convention, 4·N²·d per head and batch row
    forward_target, fwd_bwd_target = attention_gpu.targets(n)
    fwd_cap = flops / seconds["forward"] / 1e12
    fb_cap = 3.5 * flops / (seconds["forward"] + seconds["backward"]) / 1e12
    return dict(
        road=road,
        n=n,
        batch=batch,
        gpu=gpu.name,
        forward_ms=round(seconds["forward"] * 1e3, 4),
        forward_host_ms=round(seconds["forward_host"] * 1e3, 4),
        backward_ms=round(seconds["backward"] * 1e3, 4),
        backward_host_ms=round(seconds["backward_host"] * 1e3, 4),
        forward_tflops_cap=round(fwd_cap, 1),
        fwd_bwd_tflops_cap=round(fb_cap, 1),
        forward_target=forward_target,
        fwd_bwd_target=fwd_bwd_target,
        kernel_forward_gb=round(sum(b for b, _ in kern["forward"]) / 1e9, 3),
        kernel_backward_gb=round(sum(b for b, _ in kern["backward"]) / 1e9, 3),
    )


def verdict(cap: float, target: int | None) -> str:
    """A cap against a target: the share of the cap the target needs, or that the road cannot reach it."""
    if target is None:
        return f"{cap}"
    return f"{cap} ({'ruled out' if cap < target else f'target: {target / cap:.0%} of it'})"


def table(rows: list[dict]) -> str:
    lines = [
        "| GPU | N | road | forward bound, ms (host part) | forward cap, TFLOP/s | fwd+bwd bound, ms | fwd+bwd cap |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        both = round(r["forward_ms"] + r["backward_ms"], 4)
        lines.append(
            f"| {r['gpu'].split(' (')[0]} | {r['n']} | {r['road']} | {r['forward_ms']} ({r['forward_host_ms']}) "
            f"| {verdict(r['forward_tflops_cap'], r['forward_target'])} "
            f"| {both} | {verdict(r['fwd_bwd_tflops_cap'], r['fwd_bwd_target'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    triton_host_cost.add_shape_arguments(p, [512, 2048, 8192])
    p.add_argument("--gpus", nargs="+", default=list(GPUS), choices=list(GPUS))
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "triton_bounds.json")
    args = p.parse_args(argv)
    for n in args.lengths:
        if n < 1 or args.tokens % n:
            raise SystemExit(f"--lengths {n}: expected a positive divisor of --tokens {args.tokens}")
    rows = [
        bound(road, n, GPUS[g], args.tokens, args.heads, args.dim)
        for g in args.gpus
        for n in args.lengths
        for road in triton_backend.NEAR_BAND_MODES
    ]
    text = table(rows)
    print(text)
    command = "python benchmarks/triton_bounds.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = dict(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        python=platform.python_version(),
        command=command.strip(),
        gpus={g: GPUS[g]._asdict() for g in args.gpus},
        rows=rows,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    head = f"# Lower bounds on the triton backend's time\n\n`{result['command']}`, {result['date']}\n\n"
    atomic_write_text(args.out.with_suffix(".md"), head + text + "\n")
    print(f"\nwrote {args.out} and {args.out.with_suffix('.md').name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
