"""Host time of one `triton` backend call around its kernels, on the CPU: what a short input pays per layer.

On a GPU a call's kernels run asynchronously; the host's work per call (Python, PyTorch's dispatch, the kernels'
launches) sets the time where the GPU's work is shorter. On an H200 (2026-11-26) our kernels without position
terms took 0.126 ms of GPU time per forward at N = 512 and 0.551 ms per call, 0.571 against 1.822 ms
forward+backward (`benchmarks/results/attention_gpu_h200*.json`). This script times the host side alone: the
backend's forward (without and with grad; without, also with a new `Geometry` per call, as a model's first layer
builds its inputs) and forward+backward at a tiny shape on the CPU, with the kernel launches replaced by no-ops
(as `triton_host_cost.py` does), so what remains is the Python and the PyTorch operations around them, and the
custom op's own dispatch. The roads' rows pass whole contiguous position tables, as a direct caller may; the row
"distance, the model's tables" passes them as the model does (the rows of the input's window, projections viewed
per head), the backward through the view into the projection. It also times, per custom op, the step of
`torch.library.custom_op`'s autograd wrapper that rebuilds the schema's arguments (``fill_defaults``: each
``schema.arguments`` access builds every argument anew, once per argument, a cost quadratic in their number),
which a call with grad pays once in its forward.

These are host times on this machine's CPU, not a GPU's; the GPU's launches (a few µs each) and Triton's
launcher are not in them. Medians of ``--reps`` calls after a warm-up.

    python benchmarks/triton_dispatch.py      # table + benchmarks/results/triton_dispatch.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402
from triton_host_cost import V3_BASE, Recorder, _NoLaunch, gpu_tiles_for  # noqa: E402

from debertakit.attention import triton_backend, triton_plan  # noqa: E402
from debertakit.attention.eager import PositionTerms  # noqa: E402
from debertakit.attention.geometry import Geometry  # noqa: E402
from debertakit.convert.checkpoint import atomic_write_text  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "triton_dispatch.json"
ROADS = {"no position terms": ("tables", False), "tables": ("tables", True), "distance": ("distance", True)}
# the distance road with the position tables as the model passes them (`RelativeIndex.window`'s rows, (R, H, d)
# projections viewed per head by `split_heads`); the other rows pass whole contiguous tables, as a direct caller
MODEL_TABLES = "distance, the model's tables"
# the distance road with a key mask (a padded batch, as the model's geometry holds one where an attention mask is
# given): the call without grad planned as a whole, the geometry's tensors among the plan's inputs
KEY_MASK = "distance, a key mask"


def planned() -> contextlib.ExitStack:
    """Call plans on for the CPU's calls too (`triton_backend.CALL_PLANS` "always"), in a store of their own."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(triton_backend, "CALL_PLANS", "always"))
    store = triton_plan.Plans(triton_backend._plan_settings)
    stack.enter_context(mock.patch.object(triton_backend, "_PLANS", store))
    return stack


@contextlib.contextmanager
def one_thread():
    """PyTorch on one CPU thread for the block: host overhead is timed, not the CPU's arithmetic on tiny tensors
    (on two threads a timing spawned beside other work ran several times longer)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def median_us(fn, reps: int) -> float:
    for _ in range(max(3, reps // 10)):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def fill_defaults_us(reps: int) -> list[dict]:
    """Per custom op of the backend: its schema's arguments and what ``fill_defaults`` costs on them."""
    from torch._library.utils import fill_defaults

    rows = []
    for name in ("disentangled_attention_fwd", "disentangled_attention_bwd"):
        schema = getattr(torch.ops.debertakit, name).default._schema
        args = (None,) * len(schema.arguments)
        us = median_us(lambda schema=schema, args=args: fill_defaults(schema, args, {}), reps)
        rows.append(dict(op=name, arguments=len(schema.arguments), fill_defaults_us=round(us, 1)))
    return rows


def call_us(road: str, reps: int, n: int = 64, batch: int = 2, heads: int = 2, dim: int = 64) -> dict:
    """The backend's host time per call on ``road`` (``ROADS``, `MODEL_TABLES` or `KEY_MASK`), kernels not
    launched: forward without grad, with grad, and forward+backward; the geometry shared across calls, as the
    model's layers share it."""
    from debertakit.model.layers import split_heads

    model_tables = road == MODEL_TABLES
    near_band, terms_on = ROADS["distance" if road in (MODEL_TABLES, KEY_MASK) else road]
    rel = V3_BASE
    lo, hi = rel.window(n) if model_tables else (0, rel.table_rows)
    rel = rel.shifted(lo)
    terms = PositionTerms(c2p=terms_on, p2c=terms_on)

    def leaf(*shape, grad):
        return torch.randn(*shape, dtype=torch.bfloat16).requires_grad_(grad)

    def table(grad):
        if model_tables:  # the window's projections, (R, H·d), viewed per head
            return split_heads(leaf(hi - lo, heads * dim, grad=grad), heads)
        return leaf(heads, hi - lo, dim, grad=grad)

    def inputs(grad):
        q, k, v = (leaf(batch, n, heads, dim, grad=grad).transpose(1, 2) for _ in range(3))
        tables = [table(grad) for _ in range(2)] if terms_on else [None, None]
        return q, k, v, *tables

    geom = Geometry()
    if road == KEY_MASK:  # the second row's last quarter padding
        geom.key_mask = torch.arange(n)[None].expand(batch, n) < torch.tensor([n, n - n // 4])[:, None]
    patches = dict(_kernels=_NoLaunch, _products=_NoLaunch, NEAR_BAND=near_band, tiles_for=gpu_tiles_for())

    def call(args, geometry=geom):
        out, _ = triton_backend.triton_attention(*args, rel, geometry, scale=0.1, terms=terms)
        return out

    with mock.patch.multiple(triton_backend, **patches):
        plain, grads = inputs(False), inputs(True)

        def forward_no_grad():
            with torch.no_grad():
                call(plain)

        def forward_backward():
            out = call(grads)
            out.backward(torch.ones_like(out))

        row = dict(road=road, n=n, batch=batch, heads=heads, head_dim=dim)

        def forward_new_geometry():  # what a model's forward pays once, in its first layer
            with torch.no_grad():
                call(plain, dataclasses.replace(geom))  # (the same masks, nothing derived yet)

        forward_no_grad()  # the mapping's lookup tables exist from here on, as after a model's first forward
        # through the custom op, which the recorder sees as one op (eager calls run its body without it)
        with mock.patch.object(triton_backend, "_attention", triton_backend._fwd_op):
            with Recorder() as new_geometry:
                forward_new_geometry()
            with Recorder() as same_geometry:
                forward_no_grad()
        # torch ops per call besides the forward's own (on a GPU each one a launch)
        row["ops_new_geometry"] = sum(new_geometry.launches.values()) - 1
        row["ops_same_geometry"] = sum(same_geometry.launches.values()) - 1
        row["forward_no_grad_us"] = round(median_us(forward_no_grad, reps), 1)
        with planned():  # the same calls replayed from their plans (`triton_plan`)
            row["forward_planned_us"] = round(median_us(forward_no_grad, reps), 1)
            row["forward_backward_planned_us"] = round(median_us(forward_backward, reps), 1)
        row["forward_new_geometry_us"] = round(median_us(forward_new_geometry, reps), 1)
        row["forward_with_grad_us"] = round(median_us(lambda: call(grads), reps), 1)
        row["forward_backward_us"] = round(median_us(forward_backward, reps), 1)
    return row


def table(ops: list[dict], calls: list[dict]) -> str:
    lines = ["| custom op | schema arguments | fill_defaults, µs |", "|---|---:|---:|"]
    lines += [f"| {r['op']} | {r['arguments']} | {r['fill_defaults_us']} |" for r in ops]
    lines += [
        "",
        "| road | ops, new geometry | ops, same geometry | forward, no grad, µs | same, planned, µs "
        "| same, new geometry, µs | forward with grad, µs | forward+backward, µs | same, planned, µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['road']} | {r['ops_new_geometry']} | {r['ops_same_geometry']} | {r['forward_no_grad_us']} "
        f"| {r['forward_planned_us']} | {r['forward_new_geometry_us']} | {r['forward_with_grad_us']} "
        f"| {r['forward_backward_us']} | {r['forward_backward_planned_us']} |"
        for r in calls
    ]
    return "\n".join(lines)


def host_arguments(argv: list[str] | None, description: str, reps: int, out: Path) -> argparse.Namespace:
    """The host-time scripts' arguments: ``--reps`` (timed calls per median, at least one) and ``--out``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--reps", type=int, default=reps, help="timed calls per measurement (median)")
    p.add_argument("--out", type=Path, default=out)
    args = p.parse_args(argv)
    if args.reps < 1:
        raise SystemExit(f"--reps {args.reps}: expected a positive count")
    return args


def host_environment(script: str, argv: list[str] | None, **more: str) -> dict:
    """What a host-time figure holds for: date, Python, torch, the CPU (``more`` beside), and the command."""
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        python=platform.python_version(),
        torch=torch.__version__,
        **more,
        cpu=platform.processor() or platform.machine(),
        command=" ".join(["python", f"benchmarks/{script}", *(argv or sys.argv[1:])]),
    )


def main(argv: list[str] | None = None) -> int:
    args = host_arguments(argv, __doc__.split("\n\n")[0], 300, OUT)
    with one_thread():
        ops = fill_defaults_us(args.reps)
        calls = [call_us(road, args.reps) for road in (*ROADS, MODEL_TABLES, KEY_MASK)]
    print(table(ops, calls))
    result = dict(
        environment=host_environment("triton_dispatch.py", argv),
        custom_ops=ops,
        calls=calls,
    )
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
