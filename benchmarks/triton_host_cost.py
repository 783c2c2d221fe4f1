"""The work the `triton` backend does around its kernels, counted without a GPU.

Every call of the backend runs PyTorch operations besides the fused kernels: the N×R tables of the position
terms, the backward's fold of its distance-space gradients into the position tables and into dQ / dK. This work
is linear in N, but it can still cost as much as the kernels: a float32 matmul runs on a GPU's CUDA cores, an
order of magnitude slower than a 16-bit one on the tensor cores, and every N×R buffer (per head and batch row) is
written and read through memory.

This script counts that work exactly, at the GPU benchmark's shapes, by running the backend's forward and
backward on PyTorch's ``meta`` device (shapes without data, standing for the GPU: the code takes its GPU paths)
with the kernel launches replaced by no-ops and the GPU's tiles (`triton_backend.GPU_TILES`, which size the
distance tables), under a dispatch mode that records every operation:

- matmul FLOPs, split by operand dtype: ``fp32`` (CUDA cores) and ``16-bit`` (tensor cores);
- bytes moved: each operation's tensor inputs read and outputs written once (views and allocations move
  nothing; a fill, a copy's destination and an ``out=`` tensor are written only; a broadcast input counts its
  own elements; a gather reads what it gathers, not its whole source: FAR's two end columns of an N×R table
  are 2 of its R cells per row). An estimate of memory traffic, not a measurement of it;
- operations launched: every operation but views and allocations is a GPU kernel launch (a few microseconds
  of host time each, which sets the time of short inputs), besides the backend's own kernels.

The kernels' own work is the attention FLOPs, 4·N²·d per head forward and 2.5 times that backward (the
convention of ``attention_gpu.py``); the table prints the host-side FLOPs next to it. Their memory traffic is
not counted here: what they read and write, the outputs and gradients allocated for them, and at distance
i - j (the shapes here) the zeros of the distance buffers' cells that no visible pair lands in.

The distance road is counted with its tables built by the matmul (`triton_backend.DISTANCE_PRODUCT` =
"cublas"): the same products as `triton_products`' kernel, which the default runs for 16-bit inputs, plus the
copies the matmul reads (the padding rows, q / k in band order, the gathered table rows: up to three more
launches per direction, which the default no longer makes). Its folds are counted as cuBLAS's matmuls
(`FOLD_PRODUCT`, `FOLD_SUMS` "cublas", the default until 2026-11-27); the rows ", fold kernels" count the
default's folds, by kernels of ours (not counted); the rows ", default kernels" the default's tables and
folds, both by kernels of ours: what a call launches besides them (", sums by cell": with the fold sums summed
by cell in the kernel). The rows ", forward tables to the saturation" count the distance road (its tables by the
matmul) with the forward's tables cut to the saturation (`triton_backend.FORWARD_REACH`): the bytes the tables'
products write, against the plain "distance" rows. Every row counts the launches of our Triton kernels too.

    python benchmarks/triton_host_cost.py            # table + benchmarks/results/triton_host_cost.json
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import json
import math
import platform
import sys
from pathlib import Path
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from debertakit.attention import triton_backend  # noqa: E402
from debertakit.attention.eager import PositionTerms  # noqa: E402
from debertakit.attention.geometry import Geometry  # noqa: E402
from debertakit.attention.relative import RelativeIndex, scale_for  # noqa: E402
from debertakit.convert.checkpoint import atomic_write_text  # noqa: E402

V3_BASE = RelativeIndex(span=256, bucket_size=256, max_position=512)  # DeBERTa-v3 base's positions
MATMULS = {"mm", "bmm", "addmm", "baddbmm", "addbmm"}
VIEWS = {"detach", "lift_fresh", "_unsafe_view"}  # aliasing outputs that the schema does not mark as views
ALLOCATIONS = {"empty", "empty_like", "new_empty", "empty_strided"}  # memory from the allocator, no kernel
FILLS = {"fill_", "zero_", "zeros", "zeros_like", "full", "new_zeros", "new_full"}  # write only
GATHERS = {"index", "index_select", "gather"}  # (source, indices...): read as many elements as they write
COPIES = {"copy_"}  # (destination, source): the destination is written, not read


def gpu_tiles_for():
    """A stand-in for `triton_backend.tiles_for` that gives the GPU's tiles on any device (they size the distance
    tables), not the interpreter's: patch it in for a count or a timing on the CPU."""
    gpu_tiles = functools.partial(triton_backend.tiles_for, torch.device("cuda"))
    return lambda _, *args, **kwargs: gpu_tiles(*args, **kwargs)


def _matmul_flops(name: str, args) -> int:
    a, b = (args[1], args[2]) if name.startswith(("addmm", "baddbmm", "addbmm")) else (args[0], args[1])
    batch = math.prod(a.shape[:-2])
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _nbytes(t: torch.Tensor) -> int:
    """The bytes a tensor's elements occupy: an expanded (stride 0) dimension counts once (a broadcast input,
    such as the ignored input of a ``baddbmm`` with beta 0, is not read once per element it stands for)."""
    return math.prod(n for n, stride in zip(t.shape, t.stride()) if stride != 0) * t.element_size()


def _adds_into_out(func, args, kwargs) -> torch.Tensor | None:
    """The result of ``baddbmm(..., out_dtype=, out=)`` on the meta device (the backward's folds into dQ / dK,
    `triton_backend._add_matmul_f32`) without running it: PyTorch's meta function for it takes the dtype for
    ``beta`` and fails (pytorch/pytorch#163880). Its result is its ``out`` tensor, shape and strides unchanged.
    None for every other operation."""
    if func is torch.ops.aten.baddbmm.dtype_out and kwargs["out"].device.type == "meta":
        return kwargs["out"]
    return None


class Recorder(TorchDispatchMode):
    """FLOPs by operand dtype, bytes read and written, and the operations that launch a GPU kernel (every one
    but views and allocations), of every operation."""

    def __init__(self):
        super().__init__()
        self.flops = {"fp32": 0, "16-bit": 0}
        self.bytes = 0
        self.launch_bytes: list[int] = []  # per launch, in order
        self.launches: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _adds_into_out(func, args, kwargs)
        out = func(*args, **kwargs) if out is None else out
        name = func.overloadpacket.__name__
        if func.is_view or name in VIEWS or name in ALLOCATIONS:  # nothing moved, nothing launched
            return out
        read = (args, {k: v for k, v in kwargs.items() if k != "out"})  # an ``out=`` tensor is written only
        ins = [t for t in torch.utils._pytree.tree_leaves(read) if isinstance(t, torch.Tensor)]
        outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.launches[name] += 1
        if name in MATMULS:
            operand = "fp32" if ins[-1].dtype == torch.float32 else "16-bit"
            self.flops[operand] += _matmul_flops(name, args)
        written = sum(_nbytes(t) for t in outs)
        if name in FILLS:
            reads = 0
        elif name in GATHERS:  # the gathered elements (at most the source) and the indices
            reads = min(_nbytes(ins[0]), written) + sum(_nbytes(t) for t in ins[1:])
        elif name in COPIES:
            reads = sum(_nbytes(t) for t in ins[1:])
        elif name in MATMULS and kwargs.get("beta", 1) == 0:  # (self, a, b): beta 0 reads not its self
            reads = sum(_nbytes(t) for t in ins[1:])
        else:
            reads = sum(_nbytes(t) for t in ins)
        self.launch_bytes.append(reads + written)
        self.bytes += self.launch_bytes[-1]
        return out


class _NoLaunch:
    """Stands for the kernels module: ``kernel[grid](*args, **kwargs)`` runs nothing; with ``record``, it calls
    ``record(name, grid, args, kwargs)`` (the kernel's name)."""

    def __init__(self, record=None, name: str = ""):
        self.record, self.name = record, name

    def __getattr__(self, name):
        return _NoLaunch(self.record, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: (
            None if self.record is None else self.record(self.name, grid, args, kwargs)
        )


def measure(
    n: int,
    tokens: int,
    heads: int,
    dim: int,
    near_band: str,
    dtype=torch.bfloat16,
    keep: bool = False,
    fold: bool = False,
    product: bool = False,
    cells: bool = False,
    reach: str = "tiles",
) -> dict:
    """Host-side work of one forward and one backward of the attention layer at (tokens // n, n), with
    `triton_backend.NEAR_BAND` = ``near_band``; with ``keep`` the backward reads the forward's tables
    (`triton_backend.KEEP_TABLES`), and ``kept_bytes`` is what they hold from the forward to the backward; with
    ``fold`` the fold kernels compute the folds' products and sums where they serve
    (`triton_backend.FOLD_PRODUCT`, `FOLD_SUMS` "triton": kernels of ours, not counted, as the attention
    kernels are not); with ``product`` too the distance tables come from `triton_products`' kernel
    (`DISTANCE_PRODUCT` "triton"): the default's kernels; with ``cells`` the fold sums summed by cell in the
    kernel (`FOLD_SUMS_REDUCTION` "cells"); with ``reach`` "saturation" the forward's distance tables cut to the
    saturation (`triton_backend.FORWARD_REACH`). Each phase's ``kernels`` counts its launches of our Triton kernels by
    name."""
    batch = tokens // n
    rel = V3_BASE
    terms = PositionTerms(c2p=True, p2c=True)
    dev = "meta"
    # q, k, v as the projections produce them: (B, N, H, d) viewed as (B, H, N, d)
    q, k, v = (torch.empty(batch, n, heads, dim, device=dev, dtype=dtype).transpose(1, 2) for _ in range(3))
    pos_q, pos_k = (torch.empty(heads, rel.table_rows, dim, device=dev, dtype=dtype) for _ in range(2))
    calls, kept_bytes = {}, [0]
    kernels = {"forward": collections.Counter(), "backward": collections.Counter()}
    launched = [kernels["forward"]]  # the phase whose Triton launches are counted

    def count(name, *launch):
        launched[0].update([name])

    fwd_body, bwd_body = triton_backend._forward, triton_backend._bwd  # the ops' bodies

    def fwd(*inputs):  # the op's body, recorded, and its backward's body on the saved inputs, recorded
        with Recorder() as rec:
            out, lse, position = fwd_body(*inputs)
        calls["forward"] = rec
        launched[0] = kernels["backward"]
        kept = [position.row, position.col, position.far] if keep and position.dist else []
        # whole buffers: ROW / COL are views from their row 0's cell of distance 0
        kept_bytes[0] = sum(t.untyped_storage().nbytes() for t in kept if t is not None)
        q_, k_, v_, pq, pk, aux, scale, config = inputs
        dout = torch.empty_like(out)
        with Recorder() as rec:  # the kept tables ride after aux's tensors, as the eager backward passes them
            bwd_body(dout, q_, k_, v_, out, lse, pq, pk, [*aux, *kept], scale, config)
        calls["backward"] = rec
        return out, lse

    # the distance tables as the matmul builds them: `triton_products`' kernel computes the same products (its
    # FLOPs are these; it writes the same tables, without the copies of q / k and of the table rows the matmul
    # reads), but a kernel of ours is not counted as work around the kernels
    patches = dict(
        _attention=fwd,
        _kernels=lambda: _NoLaunch(count),
        _products=lambda: _NoLaunch(count),  # (the fold kernels', and with ``product`` the tables')
        FOLD_PRODUCT="triton" if fold else "cublas",
        FOLD_SUMS="triton" if fold else "cublas",
        NEAR_BAND=near_band,
        DISTANCE_PRODUCT="triton" if product else "cublas",
        FOLD_SUMS_REDUCTION="cells" if cells else "classes",
        FORWARD_REACH=reach,
        tiles_for=gpu_tiles_for(),
    )
    with mock.patch.multiple(triton_backend, **patches):
        triton_backend.triton_attention(
            q, k, v, pos_q, pos_k, rel, Geometry(), scale=scale_for(dim, 3), terms=terms
        )
    attention = 4 * n * n * dim * heads * batch
    row = dict(
        n=n,
        batch=batch,
        near_band=near_band
        + (", tables kept" if keep else "")
        + (", default kernels" if product else ", fold kernels" if fold else "")
        + (", sums by cell" if cells else "")
        + (", forward tables to the saturation" if reach == "saturation" else ""),
    )
    row.update(attention_fwd_flops=attention, kept_bytes=kept_bytes[0])
    for phase, rec in calls.items():
        row[phase] = dict(
            fp32_flops=rec.flops["fp32"],
            half_flops=rec.flops["16-bit"],
            bytes=rec.bytes,
            launch_bytes=rec.launch_bytes,
            launches=dict(rec.launches),
            kernels=dict(kernels[phase]),
        )
    return row


def _table(rows: list[dict]) -> str:
    head = (
        "| N | batch | near band | phase | fp32 GFLOP | 16-bit GFLOP | fp32 / attention | 16-bit / attention "
        "| GB moved | ops launched | Triton launches | GB kept for the backward |\n"
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        kept = f"{r['kept_bytes'] / 1e9:.2f}" if r["kept_bytes"] else ""
        for phase, mult in (("forward", 1.0), ("backward", 2.5)):
            c = r[phase]
            attention = mult * r["attention_fwd_flops"]  # the kernels' FLOPs in this phase
            lines.append(
                f"| {r['n']} | {r['batch']} | {r['near_band']} | {phase} | {c['fp32_flops'] / 1e9:.1f} "
                f"| {c['half_flops'] / 1e9:.1f} | {c['fp32_flops'] / attention:.1%} | {c['half_flops'] / attention:.1%} "
                f"| {c['bytes'] / 1e9:.2f} | {sum(c['launches'].values())} | {sum(c['kernels'].values())} "
                f"| {kept if phase == 'forward' else ''} |"
            )
    return "\n".join(lines)


def add_shape_arguments(p: argparse.ArgumentParser, lengths: list[int]) -> None:
    """The attention shapes counted: the GPU benchmark's by default (batch · N tokens, heads, head dim)."""
    p.add_argument("--lengths", type=int, nargs="+", default=lengths)
    p.add_argument("--tokens", type=int, default=16384, help="batch · N (the GPU benchmark's shape)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=64)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_arguments(p, [128, 512, 2048, 8192])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "triton_host_cost.json")
    args = p.parse_args(argv)
    modes = triton_backend.NEAR_BAND_MODES
    rows = [measure(n, args.tokens, args.heads, args.dim, mode) for n in args.lengths for mode in modes]
    # the distance road with the forward's tables kept for the backward (`triton_backend.KEEP_TABLES`)
    rows += [measure(n, args.tokens, args.heads, args.dim, "distance", keep=True) for n in args.lengths]
    # and with the backward's fold products and sums by the fold kernels (`triton_backend.FOLD_PRODUCT`,
    # `FOLD_SUMS`)
    rows += [measure(n, args.tokens, args.heads, args.dim, "distance", fold=True) for n in args.lengths]
    # and with the tables' products by `triton_products`' kernel too: the default's kernels
    rows += [
        measure(n, args.tokens, args.heads, args.dim, "distance", fold=True, product=True)
        for n in args.lengths
    ]
    # and with the fold sums summed by cell in the kernel (`triton_backend.FOLD_SUMS_REDUCTION` "cells")
    rows += [
        measure(n, args.tokens, args.heads, args.dim, "distance", fold=True, product=True, cells=True)
        for n in args.lengths
    ]
    # the distance road with the forward's tables cut to the saturation (`triton_backend.FORWARD_REACH`), built by
    # the matmul, so that the bytes of the tables it writes are counted (against the plain "distance" rows)
    rows += [
        measure(n, args.tokens, args.heads, args.dim, "distance", reach="saturation") for n in args.lengths
    ]
    table = _table(rows)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = dict(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        python=platform.python_version(),
        command="python benchmarks/triton_host_cost.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        shape=dict(tokens=args.tokens, heads=args.heads, dim=args.dim, dtype="bfloat16", relative="v3-base"),
        rows=rows,
        table=table,
    )
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
