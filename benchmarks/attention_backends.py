"""One attention call per backend on CPU (fp32, 2 threads): where `auto`'s choice comes from.

    python benchmarks/attention_backends.py                  # prints a table, writes benchmarks/results/attention_backends.json
    python benchmarks/attention_backends.py --lengths 16 128 --no-write

v3-base head shape (12 heads of 64, 256 buckets, max distance 512, c2p + p2c), batch 1, forward under no_grad and
forward + backward; median of a few calls after one warm-up, the contenders alternated. `chunked` is what `auto`
runs on CPU (the compiled kernel where it applies and could be built, the far-field path from 8192 tokens);
`chunked-pure` is the same backend kept to PyTorch operations (``fused=False``: what runs where no compiler is
available, or under torch.compile); beyond 2048 tokens `chunked-kernel` (``fused=True``) against `chunked-pure`
shows where `auto` switches. `flex`
runs uncompiled on CPU (PyTorch's reference path; its CPU backward is the dense evaluation of the same
score_mod), so it is measured only forward.
"""

from __future__ import annotations

import argparse
import functools
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


CONTENDERS = ("eager", "chunked", "chunked-pure", "chunked-kernel", "flex")
LONG = 2048  # beyond: forward only, compiled kernel against pure PyTorch (where `auto` switches between them)


def contender(name: str, n: int):
    if name.startswith("chunked-"):
        fn = get_backend("chunked", Request("cpu", torch.float32, n, 64)).fn
        return functools.partial(fn, fused=name == "chunked-kernel")
    return get_backend(name, Request("cpu", torch.float32, n, 64)).fn


def timed(names: list[str], n: int, train: bool, reps: int) -> dict[str, float]:
    """Median seconds per call of each contender, calls alternated."""
    kw = dict(scale=1 / (64 * 3) ** 0.5, terms=PositionTerms(True, True, False))
    calls = {}
    for name in names:
        fn, args = contender(name, n), inputs(n, train)

        def once(fn=fn, args=args):
            if train:
                out, _ = fn(*args, **kw)
                out.sum().backward()
            else:
                with torch.no_grad():
                    fn(*args, **kw)

        once()
        calls[name] = once
    times = {name: [] for name in names}
    for _ in range(reps):
        for name, once in calls.items():
            t0 = time.perf_counter()
            once()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="*", default=[16, 64, 128, 512, 1024, 2048, 4096, 8192])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    print(f"{'N':>6} {'mode':>8} " + " ".join(f"{b:>12}" for b in CONTENDERS) + "   (ms)")
    for n in args.lengths:
        for train in (False, True) if n <= LONG else (False,):
            if n > LONG:
                names = ["chunked-kernel", "chunked-pure"]
            else:
                names = [b for b in CONTENDERS if b != "chunked-kernel" and not (train and b == "flex")]
            row = {"n": n, "mode": "fwd+bwd" if train else "forward"}
            row.update({name: t * 1e3 for name, t in timed(names, n, train, args.reps).items()})
            rows.append(row)
            cells = " ".join(f"{row[b]:12.2f}" if b in row else f"{'—':>12}" for b in CONTENDERS)
            print(f"{n:>6} {row['mode']:>8} {cells}", flush=True)
    if not args.no_write:
        out = ROOT / "benchmarks" / "results"
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "command": "python benchmarks/attention_backends.py",
            "torch": torch.__version__,
            "threads": 2,
            "shape": "batch 1, 12 heads, head dim 64, v3 buckets",
            "reps": args.reps,
        }
        (out / "attention_backends.json").write_text(
            json.dumps({"meta": meta, "rows_ms": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
