"""Where the CPU time goes: the numbers behind the notes of benchmarks/results/attention_cpu.md.

    python benchmarks/profile_cpu.py dropout                 # F.dropout against debertakit's 16-bit masks
    python benchmarks/profile_cpu.py model fwd-2x512 ours    # torch.profiler table of one pass (hf | ours)

``model`` builds the same random v3-base-shaped checkpoint as attention_cpu.py (in a temporary folder), runs
two warm-up passes of the case and profiles the third; 2 threads, fp32.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attention_cpu as bench  # noqa: E402


def _median_ms(fn, reps: int = 9) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[reps // 2]


def dropout() -> None:
    import torch
    import torch.nn.functional as F

    from debertakit.attention.dropout import dropout as fast_dropout
    from debertakit.attention.dropout import keep_mask

    x = torch.randn(4, 12, 512, 512)  # the attention probabilities of the training case train-4x512
    rows = {
        "F.dropout(p=0.1)": lambda: F.dropout(x, 0.1, True),
        "bernoulli_ mask alone": lambda: torch.empty_like(x).bernoulli_(0.9),
        "debertakit dropout(p=0.1)": lambda: fast_dropout(x, 0.1),
        "debertakit keep_mask alone": lambda: keep_mask(x.shape, 0.1, x.device),
    }
    print(f"shape {tuple(x.shape)}, median of 9, {torch.get_num_threads()} threads")
    for name, fn in rows.items():
        print(f"{name:28s} {_median_ms(fn):8.1f} ms")


def model(case: str, impl: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    batch, length, layers, mode, _, _ = bench.CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        m = bench._load(impl, str(bench.build_checkpoint(layers, Path(tmp))), mode)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(5, 128000, (batch, length), generator=g)
        mask = torch.ones(batch, length, dtype=torch.long)
        for _ in range(2):
            bench._step(m, ids, mask, mode)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            bench._step(m, ids, mask, mode)
    print(f"{case} {impl}: {layers} layers; divide by the layer count for per-layer times")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    import torch

    torch.set_num_threads(bench.THREADS)
    if len(sys.argv) >= 2 and sys.argv[1] == "dropout":
        return dropout()
    if (
        len(sys.argv) == 4
        and sys.argv[1] == "model"
        and sys.argv[2] in bench.CASES
        and sys.argv[3] in ("hf", "ours")
    ):
        return model(sys.argv[2], sys.argv[3])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
