"""How far the `triton` kernels' 16-bit results lie from float32 `eager`, over the random cases of
`test_triton.py` (`_random_case`): per output / gradient and near-band road, the largest error relative to the
tensor's largest value (at least 1e-3), and the case that gave it. A measurement, not a test: the kernels round
probabilities and score gradients to 16 bits (as FlashAttention does), and where a gradient is a difference of
nearly equal terms that rounding is large against the result (see docs/gpu-kernel.md, "Testing": random cases).

    python tests/attention/half_precision_sweep.py                          # bfloat16, seeds 0 … 299
    python tests/attention/half_precision_sweep.py --dtype float16 --seeds 100
    python tests/attention/half_precision_sweep.py --lengths 64 256 1024   # one realistic case per length
    python tests/attention/half_precision_sweep.py --lengths 64 --float32-o  # O kept in float32 for DELTA
    python tests/attention/half_precision_sweep.py --grid                     # the named grid (`GRID`)
    python tests/attention/half_precision_sweep.py --grid --road tables      # … on the tables road
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import test_triton as T  # noqa: E402

from debertakit.attention import eager_attention, triton_backend  # noqa: E402

NAMES = ("out", "dq", "dk", "dv", "dpos_q", "dpos_k")


def case_errors(c: T.Case, road: str, tiles: dict, dtype: torch.dtype) -> dict[str, float]:
    """The relative error of each result of case ``c`` in ``dtype`` on ``road`` with ``tiles``; for the position
    tables also of their two saturated rows (``dpos_k[left]`` …), each against that row's largest value."""
    saved = triton_backend.NEAR_BAND, dict(triton_backend.TILE_OVERRIDES)
    triton_backend.NEAR_BAND, triton_backend.TILE_OVERRIDES = road, tiles
    try:
        geom = T._geometry(c, T.DEVICE)
        inputs = T._inputs(c, dtype, T.DEVICE)
        got = T._run(T.triton_attention, c, inputs, geom)
        want = T._run(eager_attention, c, T._float32_copies(inputs), geom, T._grad_out(got[0]))
    finally:
        triton_backend.NEAR_BAND, triton_backend.TILE_OVERRIDES = saved
    names = [*NAMES[:4], *(n for n, t in zip(NAMES[4:], inputs[3:]) if t is not None)]
    out = {}
    for name, a, b in zip(names, (got[0], *got[1]), (want[0], *want[1]), strict=True):
        out[name] = _relative(a, b)
        if name.startswith("dpos"):  # (H, R, d): rows 0 and R - 1 take the saturated pairs
            for side, row in (("left", 0), ("right", -1)):
                out[f"{name}[{side}]"] = _relative(a[:, row], b[:, row])
    return out


def _keep_worst(worst: dict, key, err: float, where) -> None:
    """``worst[key]`` = (largest error so far, where it was)."""
    if err > worst.get(key, (-1.0,))[0]:
        worst[key] = (err, where)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-3)


def lengths(ns: list[int], dtype: torch.dtype, float32_o: bool, road: str) -> None:
    """One case per length: batch 1, one head of dim 64, a log-bucketed table saturating at 16, c2p + p2c, on
    ``road`` and the interpreter's (or the GPU's) tiles."""
    real = triton_backend._out_dtype
    if float32_o:  # the forward's O in float32, as with dropout: DELTA = dO·O from the exact O
        triton_backend._out_dtype = lambda q, drop_t: torch.float32
    try:
        for n in ns:
            c = T.Case(n=n, dim=64, terms=T.PositionTerms(c2p=True, p2c=True))
            errs = case_errors(c, road, {}, dtype)
            print(f"N = {n}: " + ", ".join(f"{k} {v:.4f}" for k, v in errs.items()), flush=True)
    finally:
        triton_backend._out_dtype = real


def grid(dtype: torch.dtype, road: str) -> None:
    """The largest error of each result over `test_triton.GRID` (what its 16-bit tolerances bound) on ``road``
    (where it applies; the tables road elsewhere) at the default tiles, and the case that gave it."""
    worst: dict[str, tuple[float, str]] = {}
    for name, c in T.GRID.items():
        for result, err in case_errors(c, road, {}, dtype).items():
            if "[" not in result:
                _keep_worst(worst, result, err, name)
    for result, (err, name) in worst.items():
        print(f"{result}: {err:.4f} ({name})")
    print(f"largest: {max(worst.values())[0]:.4f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--seeds", type=int, default=300, help="random cases 0 … seeds - 1")
    p.add_argument("--lengths", nargs="+", type=int, help="instead: one realistic case per length")
    p.add_argument("--float32-o", action="store_true", help="with --lengths: the forward's O kept in float32")
    p.add_argument("--grid", action="store_true", help="instead: the largest error over the named grid")
    p.add_argument(
        "--road",
        default=triton_backend.NEAR_BAND,
        choices=triton_backend.NEAR_BAND_MODES,
        help="with --grid or --lengths: the near-band road (default: the backend's)",
    )
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.grid:
        grid(dtype, args.road)
        return 0
    if args.lengths:
        lengths(args.lengths, dtype, args.float32_o, args.road)
        return 0
    worst: dict[tuple[str, str], tuple[float, int]] = {}
    saturated: dict[str, tuple[float, int]] = {}  # cases where every pair saturates (see below)
    for seed in range(args.seeds):
        c, road, tiles = T._random_case(seed)
        every_pair_saturated = _every_pair_saturates(c)
        for name, err in case_errors(c, road, tiles, dtype).items():
            if every_pair_saturated:
                _keep_worst(saturated, name, err, seed)
            else:
                _keep_worst(worst, (name, road), err, seed)
    roads = triton_backend.NEAR_BAND_MODES
    print(f"{args.dtype}, {args.seeds} random cases: largest error / largest |value| (seed)")
    print("| result | " + " | ".join(roads) + " |")
    print("|---|" + "---|" * len(roads))
    for name in sorted({name for name, _ in worst}, key=lambda n: (NAMES.index(n.split("[")[0]), n)):
        cells = [worst.get((name, road)) for road in roads]
        print(f"| {name} | " + " | ".join("—" if w is None else f"{w[0]:.4f} ({w[1]})" for w in cells) + " |")
    # there the saturated table row's exact gradient is zero (it sums dS over whole rows): its error is shown as
    # it is, over the 1e-3 floor of the relative errors, i.e. in thousandths
    print("cases where every pair saturates: largest error / max(largest |value|, 1e-3) (seed)")
    for name, (err, seed) in sorted(saturated.items()):
        print(f"  {name}: {err:.4f} ({seed})")
    return 0


def _every_pair_saturates(c: T.Case) -> bool:
    """Explicit positions with every query at least the saturation distance past every key."""
    return c.q_offset is not None and c.q_offset - ((c.n_k or c.n) - 1) >= c.rel.saturation


if __name__ == "__main__":
    raise SystemExit(main())
