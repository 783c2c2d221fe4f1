"""Host time of Triton's own launch path for each kernel a `triton` backend call launches, on the CPU.

At N = 512 a call's time on the H200 was the host's: 0.955 ms per forward for 0.468 ms of GPU time, and our
kernels without position terms 0.581 ms per call for about 0.13 ms (sixth lease, code of 3896d8b), where this
machine's CPU runs the backend's Python and PyTorch operations around the kernels in 0.07–0.2 ms
(`triton_dispatch.py`, launches as no-ops). What that leaves out is Triton's launch path: ``kernel[grid](...)``
binds the arguments, specialises each one (a pointer's 16-byte alignment, an integer's divisibility by 16),
builds the cache key, finds the compiled kernel and only then calls the driver. Our kernels take 30 to 60
arguments each.

This script times that path without a GPU. It records the launches of one forward and one forward+backward
(the backend at a tiny shape on the CPU, the GPU's tiles, each launch recorded instead of run), then replays
each through the real ``JITFunction`` with a stand-in driver (CUDA target sm_90, device 0, stream 0) and a
stand-in compiled kernel whose launch does nothing: so it times Triton's Python and its native specialisation
per launch, and not the driver's own call (a few µs on a GPU host) nor any compilation. A kernel of two
arguments (`_noop`) is the floor. Medians of ``--reps`` launches after a warm-up, µs on this CPU, with the
installed Triton.

    python benchmarks/triton_launch_cost.py     # table + benchmarks/results/triton_launch_cost.json
"""

from __future__ import annotations

import collections
import functools
import json
import os
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
# the kernels as JIT functions, whose launch path is what is timed (under the interpreter they are not): no
# kernel runs here, so the interpreter has nothing to do
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402
from triton_dispatch import host_arguments, host_environment, median_us  # noqa: E402
from triton_host_cost import _NoLaunch  # noqa: E402  (kernels that launch nothing)

from debertakit.attention import triton_backend  # noqa: E402
from debertakit.attention.eager import PositionTerms  # noqa: E402
from debertakit.attention.geometry import Geometry  # noqa: E402
from debertakit.attention.relative import RelativeIndex  # noqa: E402
from debertakit.convert.checkpoint import atomic_write_text  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "triton_launch_cost.json"


@triton.jit
def _noop(X, N):
    """The floor: a kernel of two arguments."""
    pass


class _Driver:
    """Stands for the CUDA driver as `JITFunction.run` asks it: one device, its stream, an sm_90 target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


class _Compiled:
    """Stands for a compiled kernel: its launch does nothing."""

    function = packed_metadata = None

    def launch_metadata(self, *args):
        return None

    def run(self, *args):
        return None


def _stand_in_compile(self, key, signature, device, constexprs, options, attrs, warmup):
    """`JITFunction._do_compile` without compiling: the stand-in kernel, cached under the launch's key as the
    real one would be, so that later launches of the same specialisation find it."""
    kernel = _Compiled()
    self.device_caches[device][0][key] = kernel
    return kernel


def record_launches(n: int = 64, batch: int = 2, heads: int = 2, dim: int = 64) -> dict[str, list]:
    """The launches of one forward without grad and of one forward+backward on the distance road (the default),
    as ``(kernel, grid, args, kwargs)``, at a tiny shape with DeBERTa-v3 base's positions and the GPU's tiles."""
    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    terms = PositionTerms(c2p=True, p2c=True)
    kernels, products = triton_backend._kernels(), triton_backend._products()

    def leaf(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16).requires_grad_()

    q, k, v = (leaf(batch, n, heads, dim).transpose(1, 2) for _ in range(3))
    tables = [leaf(heads, rel.table_rows, dim) for _ in range(2)]
    gpu_tiles = functools.partial(triton_backend.tiles_for, torch.device("cuda"))
    phases: dict[str, list] = {}
    for phase in ("forward", "forward+backward"):
        launches: list = []

        def recorder(module, launches=launches):  # each launch recorded with its JIT function, none run
            return _NoLaunch(lambda name, *launch: launches.append((getattr(module, name), *launch)))

        patches = dict(
            _kernels=lambda: recorder(kernels),
            _products=lambda: recorder(products),
            tiles_for=lambda _, *a, **kw: gpu_tiles(*a, **kw),
        )
        with mock.patch.multiple(triton_backend, **patches):
            with torch.set_grad_enabled(phase != "forward"):
                out, _ = triton_backend.triton_attention(
                    q, k, v, *tables, rel, Geometry(), scale=0.1, terms=terms
                )
                if phase != "forward":
                    out.backward(torch.ones_like(out))
        phases[phase] = launches
    return phases


def launch_us(kernel: JITFunction, grid, args: tuple, kwargs: dict, reps: int) -> float:
    """Median host time of ``kernel[grid](*args, **kwargs)`` through Triton's launch path (stand-ins above)."""
    return median_us(lambda: kernel[grid](*args, **kwargs), reps)


def measure(reps: int) -> list[dict]:
    rows = []
    with mock.patch.object(JITFunction, "_do_compile", _stand_in_compile):
        previous = (
            driver._active
        )  # (restored as it was: without a GPU there is no default driver to reset to)
        driver.set_active(_Driver())
        try:
            x = torch.empty(16)
            floor = launch_us(_noop, (1,), (x, 16), {}, reps)
            rows.append(dict(phase="floor", kernel="_noop", arguments=2, us=round(floor, 1)))
            for phase, launches in record_launches().items():
                for kernel, grid, args, kwargs in launches:
                    row = dict(phase=phase, kernel=kernel.__name__, arguments=len(args) + len(kwargs))
                    row["us"] = round(launch_us(kernel, grid, args, kwargs, reps), 1)
                    rows.append(row)
        finally:
            driver._active = previous
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| call | kernel | arguments (with constexprs) | µs per launch |", "|---|---|---:|---:|"]
    lines += [f"| {r['phase']} | {r['kernel']} | {r['arguments']} | {r['us']} |" for r in rows]
    per_phase = collections.defaultdict(float)
    for r in rows:
        if r["phase"] != "floor":
            per_phase[r["phase"]] += r["us"]
    lines += [f"| {phase} | all its launches | | {us:.1f} |" for phase, us in per_phase.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = host_arguments(argv, __doc__.split("\n\n")[0], 2000, OUT)
    rows = measure(args.reps)
    print(table(rows))
    environment = host_environment("triton_launch_cost.py", argv, triton=triton.__version__)
    result = dict(environment=environment, launches=rows)
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
