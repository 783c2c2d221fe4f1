"""One attention call per backend on CPU (fp32, 2 threads): where `auto`'s choice comes from.

    python benchmarks/attention_backends.py                  # prints a table, writes benchmarks/results/attention_backends.json
    python benchmarks/attention_backends.py --lengths 16 128 --no-write

v3-base head shape (12 heads of 64, 256 buckets, max distance 512, c2p + p2c), batch 1, forward under no_grad and
forward + backward; median of a few calls after one warm-up. `flex` runs uncompiled on CPU (PyTorch's reference
path; its CPU backward is the dense evaluation of the same score_mod), so it is measured only forward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from debertakit.attention import Geometry, PositionTerms, RelativeIndex, Request, get_backend

ROOT = Path(__file__).resolve().parents[1]


def inputs(n: int, grad: bool):
    g = torch.Generator().manual_seed(0)
    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    lo, hi = rel.window(n - 1)
    q, k, v = (torch.randn(1, 12, n, 64, generator=g, requires_grad=grad) for _ in range(3))
    pos_q, pos_k = (torch.randn(12, hi - lo, 64, generator=g, requires_grad=grad) for _ in range(2))
    return q, k, v, pos_q, pos_k, rel.shifted(lo), Geometry()


def timed(name: str, n: int, train: bool, reps: int) -> float:
    fn = get_backend(name, Request("cpu", torch.float32, n, 64)).fn
    args = inputs(n, train)
    kw = dict(scale=1 / (64 * 3) ** 0.5, terms=PositionTerms(True, True, False))

    def once():
        if train:
            out, _ = fn(*args, **kw)
            out.sum().backward()
        else:
            with torch.no_grad():
                fn(*args, **kw)

    once()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="*", default=[16, 64, 128, 512, 1024, 2048])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    print(f"{'N':>6} {'mode':>8} " + " ".join(f"{b:>10}" for b in ("eager", "chunked", "flex")) + "   (ms)")
    for n in args.lengths:
        for train in (False, True):
            row = {"n": n, "mode": "fwd+bwd" if train else "forward"}
            for name in ("eager", "chunked", "flex"):
                if name == "flex" and train:
                    continue
                row[name] = timed(name, n, train, args.reps) * 1e3
            rows.append(row)
            cells = " ".join(
                f"{row[b]:10.2f}" if b in row else f"{'—':>10}" for b in ("eager", "chunked", "flex")
            )
            print(f"{n:>6} {row['mode']:>8} {cells}", flush=True)
    if not args.no_write:
        out = ROOT / "benchmarks" / "results"
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "torch": torch.__version__,
            "threads": 2,
            "shape": "batch 1, 12 heads, head dim 64, v3 buckets",
        }
        (out / "attention_backends.json").write_text(
            json.dumps({"meta": meta, "rows_ms": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
