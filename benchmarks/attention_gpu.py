"""GPU benchmark of disentangled attention: the `triton` backend against the alternatives, in one run.

Sections (all bfloat16 on one CUDA device):

1. ``attention``: the attention core (q, k, v and the projected relative tables given; q, k, v in the layout the
   model's projections produce, (B, N, H, d) memory viewed as (B, H, N, d)), 12 heads, head dim 64,
   v3 position setup (log buckets 256, max distance 512, c2p + p2c), N = 128 … 16384 at batch·N = 16384.
   Forward and forward+backward time, TFLOP/s and peak memory. FLOPs are counted as FlashAttention counts them:
   4·N²·d per head and batch row for the forward (QKᵀ and PV), 2.5× that for the backward, so forward+backward
   is 3.5×; the position terms are not counted (they are the overhead being measured). Rows: every registered
   attention backend that can run the shape (``triton``, ``eager``, and ``chunked`` / ``flex`` where present),
   PyTorch's ``scaled_dot_product_attention`` on the same shapes without position terms (the ceiling),
   ``triton (no position terms)``, our kernels on the same shapes without position terms (the ceiling of their
   own loops and tiles: a far tile costs that plus one value per row and column; its distance to sdpa is the
   kernels' loop, its distance to ``triton`` the position terms; without dropout, so not in ``dropout``),
   ``flashdeberta`` where it imports, and Hugging Face's eager ``DisentangledSelfAttention`` module (which also
   runs the q/k/v and position projections: its time includes them). ``triton`` runs the default near-band
   road (`triton_backend.NEAR_BAND`, recorded in the environment as ``near_band``); the road rows run one each:
   ``triton tables`` ("tables": the near band gathered cell by cell from float32 N×R products),
   ``triton distance`` ("distance": read from the same products laid out by distance, two strided tile loads
   per near tile; forward and backward, with dropout too), ``triton skew-forward`` ("skew-forward": the
   forward's near band computed from the position tables inside the kernel, the backward as on the tables road)
   and ``triton skew`` ("skew": so in the backward kernels too, where `SKEW_TILES` serves them); they decide the
   default (`road_rows`: the one that is the default is left out of the runs that time every road).
   ``triton (cuBLAS tables)`` is ``triton`` with the distance tables built by one batched matmul
   (`triton_backend.DISTANCE_PRODUCT` "cublas", one-element aligned at their odd row stride) instead of
   `triton_products`' kernel; ``triton (product TMA stores)`` is ``triton`` with that kernel's inner blocks
   stored through a tensor descriptor (`triton_backend.PRODUCT_STORES` "tma"), ``triton (product row loop)``
   with one program per row block running over its column blocks (`triton_backend.PRODUCT_PROGRAMS` "rows"),
   ``triton (product block programs)`` with one program per block of rows and cells ("blocks", the default
   before 2026-11-27; the default is "columns", a program per column block running over row blocks),
   ``triton (product edges masked)`` with each row's first and last block stored element by element
   (`triton_backend.PRODUCT_EDGES` "masked"), ``triton (tables kept)`` with the forward's distance tables kept
   for the backward (`triton_backend.KEEP_TABLES`; its peak memory is the price), ``triton (fold matmuls)`` with
   the backward's fold products and sums by cuBLAS's matmuls (`triton_backend.FOLD_PRODUCT` and `FOLD_SUMS`
   "cublas", the default before 2026-11-27) instead of `triton_products`' fold kernels, ``triton (fold sums by
   matmul)`` with the sums alone by the matmuls (`FOLD_SUMS` "cublas"), ``triton (tables in two launches)`` and
   ``triton (folds in two launches)`` with the distance tables' products, and the backward's two fold kernels,
   launched once per table (`triton_backend.PRODUCT_LAUNCHES`, `FOLD_LAUNCHES` "two") instead of once for both;
   ``triton (fold sums by cell)`` with the fold sums kernel summing each cell whole (`FOLD_SUMS_REDUCTION`
   "cells") instead of writing per-class sums that a reduction adds after.
   ``triton (geometry shared)`` is ``triton`` with one `Geometry` for all its calls
   (every other row gives each call a new one, whose inputs the call builds; a model's layers share one), and
   ``triton (CUDA graph)`` the same with each timed call a replay of a CUDA graph of it: what is left per call
   without the host's work (on CPU, in smoke form, the calls themselves).
   ``triton (through the custom op)`` is ``triton`` with its eager calls dispatched through the custom ops, as
   compiled graphs run them (eager calls skip the ops' dispatch: `triton_backend._attention`).
   ``triton (no call plans)`` is ``triton`` with every call made, none replayed from its signature's plan
   (`triton_backend.CALL_PLANS` "off"; `triton_plan`), and ``triton (Triton's launch path)`` with its launches
   through Triton's own path instead of the shorter one (`triton_launch.LAUNCH_PATH` "triton").
   ``triton (deterministic algorithms)`` is ``triton`` under `torch.use_deterministic_algorithms`: the tables'
   gradients summed into their rows in a fixed order (`triton_backend._into_rows`), new buffers filled.
   ``triton (forward tables to the saturation)`` is ``triton`` with the forward's distance tables cut to the
   saturation where far tiles occur (`triton_backend.FORWARD_REACH` "saturation": 1025 cells a row at v3's
   N >= 1024 instead of 1217, its near tiles selecting the saturated values beyond them).
   ``triton (forward far tiles of 64 keys)`` and ``... of 128 keys`` are ``triton`` with the forward's far tiles
   in blocks of that many keys (`triton_backend.FORWARD_FAR_KEYS`; its near tiles keep their 32), and
   ``triton (forward far tiles of 64 keys, tables to the saturation)`` with the forward's tables cut too;
   ``triton (forward and dQ far tiles of 64 keys)`` with dQ's far tiles in blocks of 64 keys as well
   (`triton_backend.DQ_FAR_KEYS`): its forward+backward against the 64-key forward row's is dQ's change.
   ``triton (three runs)`` is ``triton`` with `triton_backend.ONE_NEAR_RUN` off:
   where no far tile occurs (N <= 512 here) each program's loop runs as the three runs of longer inputs, two of
   them empty, as before the one near run; from N = 1024 on it runs the same kernels as ``triton``.
   Each row that computes the same function (not sdpa, not the HF layer) records ``max_diff_vs_triton``, its
   output's largest difference from ``triton``'s (default tiles) on the same inputs, relative to the largest
   value; above 2e-2 (the tests' bfloat16 tolerance) a verdict says its timing is of other work. The
   ``triton (no position terms)`` row records ``max_diff_vs_sdpa`` so, against sdpa's output.
2. ``model``: whole-model tokens/s for the deberta-v3-base shape (12 layers, hidden 768), forward (inference) and
   training step (forward, backward, AdamW step), batch·N = 16384 tokens at N = 512; our model with each backend
   against Hugging Face's ``DebertaV2Model``; peak memory. Dropout 0, and a second training step
   (``train_step dropout``) with the released models' hidden and attention dropout (``--dropout``). Then
   ``forward batch 1``: one sequence of ``--latency-length`` (128) tokens, the latency of serving one request
   (reranking, NER), where the host's work per layer, not the GPU's, sets the time; for our model also
   ``forward batch 1, CUDA graph``: the same forward replayed as a CUDA graph (`debertakit.inference.graphs`,
   its capture in the warm-up call), which takes the host out of the time.
   ``long``: batch 1 at N = 16384, 32768, 65536 (the ``triton`` rows, the plain one, and the sdpa ceiling): it
   must run, and its peak memory per token is reported relative to the shortest length (about 1 when memory is
   linear in N).
   ``dropout``: the ``attention`` rows in training with dropout ``--dropout`` (0.1, the released models'
   value) on the probabilities, for the backends that have it (``triton`` draws the mask inside its kernels)
   and ``scaled_dot_product_attention`` with the same dropout.
   ``tiles`` (not run by default): the ``triton`` row of ``attention`` again for each tile shape of ``--tiles``
   (``BLOCK_MxBLOCK_N`` ``w`` warps ``s`` stages), with its ``triton (no position terms)`` row at the same
   tiles, to tune `triton_backend.GPU_TILES` by timing; candidates come from ``benchmarks/triton_static.py``
   (those that compile without spills). The shape is given to the kernels of ``--tile-kernels`` (all three
   by default; one kernel alone, the others keep their tiles, times
   that kernel's choice: the forward's in the forward column, a backward kernel's in forward+backward) on the
   near-band road of ``--near-band`` ("skew": the skewed kernels' tiles, `triton_backend.SKEW_TILES`); on the
   distance road it may name the tables' product kernel and the backward's fold kernels instead. With
   ``--tile-timer profile`` each shape's rows are timed by kernel (GPU time, as the ``profile`` section).
   ``profile`` (not run by default): the ``triton`` rows of ``attention`` (the plain one too) with their GPU
   time split by kernel (`torch.profiler`, ms per call): how much is the fused kernels and how much the work
   around them (the N×R tables, the backward's folds, copies). ``--impls`` restricts ``attention`` to the rows
   named.
   ``folds`` (not run by default): the backward's four fold products alone, at the distance buffers' padded
   row stride and at the unpadded one (2·sat + 1): the time and the cuBLAS kernels of each.
   ``latency`` (not run by default): the ``model`` section's batch-1 forward under `torch.profiler`, for our
   model with each backend and Hugging Face's: host time per operator, GPU kernels launched and their time;
   then under `cProfile`: host time per Python function (what lies between the operators); and the GPU
   synchronisations of one call (PyTorch's sync debug mode). The same for the attention layer's `triton` row at
   N = 512 (``triton (attention layer)``), its forward and its forward+backward: where the host's time of a
   training step's attention goes.
3. ``packed``: variable-length batches (lengths uniform in [32, 512], 16384 real tokens): our model packed
   (``cu_seqlens``, no padding) against the same sequences padded to the longest, ours and Hugging Face's;
   tokens/s counts real tokens only.

Usage::

    python benchmarks/attention_gpu.py                 # everything; table + benchmarks/results/attention_gpu.json
    python benchmarks/attention_gpu.py --sections attention --lengths 512 2048 8192
    python benchmarks/attention_gpu.py --sections tiles --lengths 512 2048 8192 --out /tmp/tiles.json
    python benchmarks/attention_gpu.py --sections profile --lengths 512 4096 16384 --out /tmp/profile.json
    python benchmarks/attention_gpu.py --sections folds --lengths 512 4096 16384 --out /tmp/folds.json
    python benchmarks/attention_gpu.py --sections latency --out /tmp/latency.json
    python benchmarks/attention_gpu.py --sections attention --impls triton "sdpa (no position terms)"
    python benchmarks/attention_gpu.py --smoke --out /tmp/smoke.json
                                                       # CPU, TRITON_INTERPRET=1, tiny shapes: checks the script
                                                       # runs end to end; its timings mean nothing

A whole run may take longer than one session on a shared GPU: run the sections (or lengths) separately
(``--sections attention --out a.json``, ...) and join them with ``--combine a.json b.json ... --out
benchmarks/results/attention_gpu.json`` (same device and versions required, no measurement twice; verdicts
recomputed over all rows).

Work is measured in units (one length of a section, one model of ``model`` / ``packed``, one tile shape at one
length of ``tiles``), and the results file is rewritten (atomically) after every unit, marked ``"complete":
false`` with the units still ``"pending"`` until the last one: a run that is stopped or killed keeps what it
measured. ``--budget-s S`` starts no unit after S seconds (the rest are left pending; exit status 3), and
``--resume FILE`` continues such a run: the units FILE holds are not measured again, its rows are kept (same
device and versions required)::

    python benchmarks/attention_gpu.py --sections attention --budget-s 480 --out a.json    # exit 3: units left
    python benchmarks/attention_gpu.py --sections attention --resume a.json --out a.json   # the rest

Without CUDA (and without ``--smoke``) it exits with a message and writes nothing. Dropout is 0 except in the
``dropout`` section and the model's ``train_step dropout`` rows.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "attention_gpu.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", nargs="+", default=["attention", "dropout", "long", "model", "packed"])
    p.add_argument("--dropout", type=float, default=0.1, help="probability of the dropout rows")
    p.add_argument(
        "--impls",
        nargs="+",
        help="the rows `attention` and `dropout` measure (default: all), e.g. triton 'sdpa (no position terms)' "
        "flashdeberta",
    )
    p.add_argument(
        "--models",
        nargs="+",
        help="the models `model` and `packed` measure (default: all), of 'ours/<backend>' and 'hf eager'",
    )
    p.add_argument(
        "--long-lengths", nargs="+", type=int, default=[16384, 32768, 65536], help="batch-1 lengths of `long`"
    )
    p.add_argument("--lengths", nargs="+", type=int, default=[128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--tokens", type=int, default=16384, help="batch·N of every shape")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--model-length", type=int, default=512)
    p.add_argument("--latency-length", type=int, default=128, help="length of the model's batch-1 forward")
    p.add_argument(
        "--tiles",
        nargs="+",
        default=["64x32w8s2", "64x32w8s3", "128x32w8s2", "64x64w8s2", "32x64w8s2", "32x32w8s2", "64x32w4s2"],
        help="tile shapes of the `tiles` section, BLOCK_MxBLOCK_N w<warps> s<stages>",
    )
    p.add_argument(
        "--tile-kernels",
        nargs="+",
        help="the kernels the `tiles` section gives each shape, of triton_backend.KERNEL_NAMES (default: all; "
        "the others keep their tiles), _distance_product_kernel (the distance road's tables) and "
        "_fold_product_kernel, _fold_sums_kernel (the distance road's backward folds, 16-bit inputs)",
    )
    p.add_argument(
        "--tile-timer",
        choices=("call", "profile"),
        default="call",
        help="the `tiles` section's timing: per call (do_bench, host included) or the GPU time of each kernel "
        "(torch.profiler, as the `profile` section)",
    )
    p.add_argument(
        "--near-band",
        default="tables",
        help="the `tiles` section's near-band road (triton_backend.NEAR_BAND): tables, distance, skew-forward or skew",
    )
    p.add_argument(
        "--product-stores",
        choices=("pointers", "tma"),
        help="how every row's distance tables store their inner blocks (triton_backend.PRODUCT_STORES; "
        "default: the backend's)",
    )
    p.add_argument(
        "--product-programs",
        choices=("blocks", "rows", "columns"),
        help="the product kernel's programs in every row (triton_backend.PRODUCT_PROGRAMS; default: the "
        "backend's); with rows or columns, the tile sweep of _distance_product_kernel sets PRODUCT_ROW_TILES or "
        "PRODUCT_COLUMN_TILES and PRODUCT_NARROW_COLUMN_TILES",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument(
        "--smoke", action="store_true", help="CPU + Triton interpreter, tiny shapes, plumbing only"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no unit of work after this many seconds; what is left stays pending in --out (exit 3)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RESULTS",
        help="a results file of an unfinished run on this machine: its units are kept, not measured again",
    )
    p.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="RESULTS",
        help="measure nothing: join result files of other sections, taken on the same machine and versions, "
        "into --out (verdicts recomputed)",
    )
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------------- timing
def cannot_run() -> tuple[type[Exception], ...]:
    """What a row that cannot run the shape raises, recorded as its error instead of ending the run: besides
    PyTorch's errors, Triton's (a competitor's kernel that does not compile with this Triton or for this GPU,
    a swept tile that needs more shared memory than the GPU has)."""
    errors: tuple[type[Exception], ...] = (RuntimeError, ValueError, TypeError, ImportError)
    try:
        from triton.errors import TritonError
    except ImportError:
        return errors
    return (*errors, TritonError)


def _or_error(measure: Callable[[], dict]) -> dict:
    """``measure()``, or ``{"error": ...}`` for a row that cannot run the shape: 'OOM' when it does not fit,
    else the exception's first line."""
    import torch

    try:
        return measure()
    except torch.OutOfMemoryError:
        return {"error": "OOM"}
    except cannot_run() as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}


# `do_bench`'s warm-up before the timed calls, in ms of calls. At 10 ms, the first row a process timed at N = 512
# ran its forward far slower than rows of the same kernels after it, in three runs on an H200 (2026-11-26,
# `benchmarks/results/attention_gpu_h200_996fc93_targets.json`, `..._7974afd_tiles_*.json`): `triton` 0.949 ms
# per call against 0.585 through the custom op and 0.568 of GPU time (profile); the tile sweeps' first rows, at
# the default tiles, 35.4 and 21.3 TFLOP/s against 45.4 of GPU time; so did the rows of the two product-kernel
# variants, each timed right after its kernel compiled (seconds of host work, the GPU idle). Their
# forward+backward, timed next, was not slow. The cause is not established (clocks back up from idle, or the
# host's first calls); a longer warm-up takes either out of the median (not yet timed on a GPU).
WARMUP_MS = 200
# A row's ``queued`` time (`queued_ms`): up to QUEUED_CALLS calls back to back (fewer where that would take more
# than QUEUED_BATCH_MS), the median of QUEUED_REPEATS such batches; not for calls over QUEUED_UP_TO_MS, where
# the host's few microseconds a launch are lost in the GPU's time anyway
QUEUED_CALLS = 20
QUEUED_BATCH_MS = 50.0
QUEUED_REPEATS = 3
QUEUED_UP_TO_MS = 50.0


def queued_ms(
    fn: Callable[[], object], per_call_ms: float, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, float] | None:
    """Time per call of ``fn``'s calls issued back to back, nothing between them, one pair of events around a
    batch (sizes above, from ``per_call_ms``): the rate of a stream of calls, as a model's layers make them.
    ``do_bench``'s per-call time (``per_call_ms``) empties the L2 cache before every call (a 256 MB fill) and
    times each call between its own events, so each starts with its inputs in HBM only. Where the host keeps
    ahead of the GPU both are the GPU's time, this one with a warm cache; where a call's host work outlasts its
    GPU work, both show the host's. Returns it with the host's time to issue one call (``clock`` around the
    batch's calls, before the GPU is waited for: Python, PyTorch's dispatch and the kernels' launches; a batch
    of 20 calls of a few launches each stays within the GPU's launch queue, so the host does not wait there),
    the medians of the batches; None over `QUEUED_UP_TO_MS`."""
    import torch

    if per_call_ms > QUEUED_UP_TO_MS:
        return None
    calls = min(QUEUED_CALLS, max(2, int(QUEUED_BATCH_MS / per_call_ms)))
    times, host = [], []
    for _ in range(QUEUED_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        issued = clock()
        for _ in range(calls):
            fn()
        host.append((clock() - issued) * 1e3 / calls)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2], sorted(host)[len(host) // 2]


def bench(fn: Callable[[], object], device: str, queued: bool = False) -> dict:
    """Median time (ms) per call and peak memory above the baseline (GiB) of ``fn``, with ``queued`` the time per
    call back to back too (`queued_ms`, ``queued_ms``; None in ``--smoke``); 'OOM' when it does not fit."""
    import torch

    def measure() -> dict:
        # `--smoke`: one call, its time meaningless (the interpreter), so no warm-up either
        if device != "cuda":
            t = time.perf_counter()
            fn()
            return {
                "ms": (time.perf_counter() - t) * 1e3,
                "queued_ms": None,
                "host_ms": None,
                "peak_gib": None,
            }
        fn()  # warm-up: compilation, autotuning, allocator
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        from triton.testing import do_bench

        ms = do_bench(fn, warmup=WARMUP_MS, rep=100, return_mode="median")
        queued_at, host = (queued_ms(fn, ms) if queued else None) or (None, None)
        return {"ms": ms, "queued_ms": queued_at, "host_ms": host, "peak_gib": peak}

    try:
        return _or_error(measure)
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()


def attention_flops(batch: int, heads: int, n: int, d: int) -> float:
    return 4.0 * batch * heads * n * n * d


# ------------------------------------------------------------------------------------------- 1. attention
Unit = tuple[str, Callable[[], list[dict]]]  # (what it measures, e.g. "attention N=512"; its measurement)


def attention_section(args, device: str, dtype) -> Iterator[Unit]:
    only = None if args.impls is None else tuple(args.impls)
    for n in args.lengths:
        yield f"attention N={n}", functools.partial(_attention_rows, args, n, device, dtype, only)


def _attention_rows(
    args,
    n: int,
    device: str,
    dtype,
    only: tuple[str, ...] | None = None,
    dropout_p: float = 0.0,
    timer: Callable[[Callable[[], object], str], dict] | None = None,
) -> list[dict]:
    """The ``attention`` rows at ``n`` (``only``: those named), each timed by ``timer`` (default: `bench`, with
    its queued time too)."""
    import torch
    import torch.nn.functional as F

    from debertakit.attention import (
        Geometry,
        PositionTerms,
        RelativeIndex,
        Request,
        available_backends,
        get_backend,
        scale_for,
    )

    # compiled `flex` compiles each shape anew (static shapes); past dynamo's recompile limit it runs unfused
    # (`debertakit.attention.flex._flex_fn`), and the lengths before this one would have used the limit up
    torch._dynamo.reset()
    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    terms = PositionTerms(c2p=True, p2c=True)
    H, D = args.heads, args.head_dim
    scale = scale_for(D, 3)
    batch = max(1, args.tokens // n)
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype).requires_grad_()

    def projected():  # (B, N, H, d) memory viewed as (B, H, N, d): what the model's projections give
        x = torch.randn(batch, n, H, D, generator=g, device=device, dtype=dtype)
        return x.transpose(1, 2).requires_grad_()

    q, k, v = projected(), projected(), projected()
    pos_q, pos_k = rnd(H, rel.table_rows, D), rnd(H, rel.table_rows, D)
    grad = torch.randn(batch, H, n, D, device=device, dtype=dtype)
    leaves = [q, k, v, pos_q, pos_k]
    flops = attention_flops(batch, H, n, D)
    request = Request(device_type=device, dtype=dtype, seq_len=n, head_dim=D, dropout=dropout_p > 0)

    # name -> (forward closure, tensors to differentiate, gradient of the output)
    candidates: dict[str, tuple[Callable, list, object]] = {}
    # rows that change module settings of `triton_backend`: they hold for the whole timed call, the backward
    # included (it reads GRADIENT_STORES, GRADIENT_BANDS, DISTANCE_PRODUCT, ... when autograd runs it, after
    # the forward has returned)
    settings_of: dict[str, dict] = {}
    for name in available_backends():
        try:
            backend = get_backend(name, request)
        except ValueError:
            continue

        # a new geometry per call unless one is shared
        def run(fn=backend.fn, shared: Geometry | None = None):
            geom = Geometry() if shared is None else shared
            out, _ = fn(q, k, v, pos_q, pos_k, rel, geom, scale=scale, terms=terms, dropout_p=dropout_p)
            return out

        candidates[name] = (run, leaves, grad)
    if "triton" in candidates:
        from debertakit.attention import triton_backend

        # the default road with one setting of `triton_backend` changed for the call
        changed = {
            **{row: dict(NEAR_BAND=mode) for row, mode in NEAR_BAND_ROWS.items()},
            THREE_RUNS_ROW: dict(ONE_NEAR_RUN=False),
            CUBLAS_TABLES_ROW: dict(DISTANCE_PRODUCT="cublas"),
            PRODUCT_TMA_ROW: dict(PRODUCT_STORES="tma"),
            PRODUCT_ROWS_ROW: dict(PRODUCT_PROGRAMS="rows"),
            PRODUCT_BLOCKS_ROW: dict(PRODUCT_PROGRAMS="blocks"),
            PRODUCT_MASKED_EDGES_ROW: dict(PRODUCT_EDGES="masked"),
            PRODUCT_TWO_LAUNCHES_ROW: dict(PRODUCT_LAUNCHES="two"),
            FOLD_TWO_LAUNCHES_ROW: dict(FOLD_LAUNCHES="two"),
            FOLD_SUMS_BY_CELL_ROW: dict(FOLD_SUMS_REDUCTION="cells"),
            ONE_BAND_GRADIENTS_ROW: dict(GRADIENT_BANDS=False),
            CELL_STORES_ROW: dict(GRADIENT_STORES="cells"),
            KEPT_TABLES_ROW: dict(KEEP_TABLES=True),
            FOLD_MATMULS_ROW: dict(FOLD_PRODUCT="cublas", FOLD_SUMS="cublas"),
            FOLD_SUMS_MATMULS_ROW: dict(FOLD_SUMS="cublas"),
            CUSTOM_OP_ROW: dict(_attention=triton_backend._fwd_op),
            TRITON_LAUNCH_ROW: dict(LAUNCH_PATH="triton"),
            NO_PLANS_ROW: dict(CALL_PLANS="off"),
            DETERMINISTIC_ROW: dict(deterministic_algorithms=True),
            FORWARD_REACH_ROW: dict(FORWARD_REACH="saturation"),
            **{FAR_KEYS_ROWS[keys]: dict(FORWARD_FAR_KEYS=keys) for keys in FAR_KEYS_ROWS},
            FAR_KEYS_REACH_ROW: dict(FORWARD_FAR_KEYS=64, FORWARD_REACH="saturation"),
            WIDE_FAR_ROW: dict(FORWARD_FAR_KEYS=64, DQ_FAR_KEYS=64),
        }
        for row, settings in changed.items():
            candidates[row], settings_of[row] = (candidates["triton"][0], leaves, grad), settings
        # one geometry for every call, as a model's layers share theirs; and so, replayed as a CUDA graph
        for row in (SHARED_GEOMETRY_ROW, GRAPHED_ROW):
            candidates[row] = (functools.partial(candidates["triton"][0], shared=Geometry()), leaves, grad)
    if "triton" in candidates and dropout_p == 0:  # the plain row: the targets' setting, checked against sdpa
        triton_fn, no_terms = get_backend("triton", request).fn, PositionTerms(c2p=False, p2c=False)

        def plain():  # the same kernels with no position terms: their loop's own ceiling at these tiles
            # at sdpa's scale (1 / sqrt(d): no position terms to share it with), so both compute one function
            out, _ = triton_fn(q, k, v, None, None, rel, Geometry(), scale=D**-0.5, terms=no_terms)
            return out

        candidates[PLAIN_ROW] = (plain, leaves[:3], grad)
    sdpa = (lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), leaves[:3], grad)
    candidates[SDPA_ROW] = sdpa
    fd = _flashdeberta(q, k, v, pos_q, pos_k, scale) if dropout_p == 0 else None
    if fd is not None:
        candidates["flashdeberta"] = (fd, leaves, grad)
    hf = _hf_attention_layer(batch, n, H, D, device, dtype) if dropout_p == 0 else None
    if hf is not None:
        hf_grad = grad.transpose(1, 2).reshape(batch, n, H * D)  # the layer returns (B, N, H·D)
        candidates[HF_ROW] = (*hf, hf_grad)

    if only is not None:
        candidates = {name: c for name, c in candidates.items() if name in only}
    # every row that computes the same function is checked against `triton` with its default tiles (itself
    # tested against eager): a competitor timed on inputs it reads differently would be compared on other work
    reference = plain_reference = None
    if "triton" in candidates and dropout_p == 0:
        reference = _forward(_with_backend_settings(candidates["triton"][0], TILE_OVERRIDES={}))
    if PLAIN_ROW in candidates:  # it computes sdpa's function: checked against it
        plain_reference = _forward(sdpa[0])
    timer = timer or functools.partial(bench, queued=True)
    rows = []
    for name, (fwd, ins, out_grad) in candidates.items():

        def fwd_only(fwd=fwd):
            with torch.no_grad():
                return fwd()

        def fwd_bwd(fwd=fwd, ins=ins, out_grad=out_grad):
            torch.autograd.grad(fwd(), ins, out_grad)

        if name in settings_of:
            fwd, fwd_only, fwd_bwd = (
                _with_backend_settings(f, **settings_of[name]) for f in (fwd, fwd_only, fwd_bwd)
            )
        if name == GRAPHED_ROW:
            fwd_only, fwd_bwd = _Replayed(fwd_only, device), _Replayed(fwd_bwd, device)
        row = {"section": "attention", "impl": name, "n": n, "batch": batch, "heads": H, "head_dim": D}
        if reference is not None and name not in OTHER_FUNCTIONS:
            row["max_diff_vs_triton"] = _max_diff(fwd, reference)
        if plain_reference is not None and name == PLAIN_ROW:
            row["max_diff_vs_sdpa"] = _max_diff(fwd, plain_reference)
        row.update(_rate("fwd", timer(fwd_only, device), flops))
        row.update(_rate("fwd_bwd", timer(fwd_bwd, device), 3.5 * flops))
        rows.append(row)
        print(_fmt(row), flush=True)
    return rows


# the `triton` kernels without position terms: plain attention through the same loops and tiles, the ceiling
# their far tiles (which add one value per row and per column) can reach, next to sdpa's
PLAIN_ROW = "triton (no position terms)"
# `triton` with the loops cut into three runs where no far tile occurs (`triton_backend.ONE_NEAR_RUN` off): at
# N <= 512 (v3) what the one near run changes; from 1024 on the same kernels as `triton`, a control of the noise
THREE_RUNS_ROW = "triton (three runs)"
# `triton` with the distance tables built by one batched matmul (`triton_backend.DISTANCE_PRODUCT` "cublas"), which
# cuBLAS runs on a one-element-aligned kernel at their odd row stride, instead of by `triton_products`' kernel
CUBLAS_TABLES_ROW = "triton (cuBLAS tables)"
# `triton` with the product kernel's inner blocks stored by the tensor-memory unit through a descriptor
# (`triton_backend.PRODUCT_STORES` "tma"; Hopper and later, elsewhere the same as `triton`), against an address
# per element: which should be the default
PRODUCT_TMA_ROW = "triton (product TMA stores)"
# `triton` with one product-kernel program per row block, its column blocks in a pipelined loop
# (`triton_backend.PRODUCT_PROGRAMS` "rows", at `PRODUCT_ROW_TILES`), against one program per block
PRODUCT_ROWS_ROW = "triton (product row loop)"
# `triton` with one product-kernel program per block of rows and cells (`triton_backend.PRODUCT_PROGRAMS`
# "blocks", at `PRODUCT_TILES`), against the default's program per column block and residue, its table rows
# gathered once and its row blocks in a pipelined loop ("columns", at `PRODUCT_COLUMN_TILES`)
PRODUCT_BLOCKS_ROW = "triton (product block programs)"
# `triton` with the product kernel's row ends stored element by element (`triton_backend.PRODUCT_EDGES`
# "masked", the default before 2026-11-27), against the default's 16-byte stores throughout ("wrap")
PRODUCT_MASKED_EDGES_ROW = "triton (product edges masked)"
# `triton` with its two distance tables built by two launches of the product kernel, one buffer each
# (`triton_backend.PRODUCT_LAUNCHES` "two", the default before 2026-11-27), against one launch and one buffer for
# both: a launch, an allocation and a fill fewer per forward (and per backward), on the host and on the GPU
PRODUCT_TWO_LAUNCHES_ROW = "triton (tables in two launches)"
# `triton` with the backward's two sides folded by a launch of each fold kernel a side (`triton_backend.FOLD_LAUNCHES`
# "two", the default before 2026-11-27), against one launch of each for both sides: two launches, a reduction
# of the classes' sums and an allocation fewer per backward
FOLD_TWO_LAUNCHES_ROW = "triton (folds in two launches)"
# `triton` with the fold sums kernel summing each cell whole (`triton_backend.FOLD_SUMS_REDUCTION` "cells"),
# against the default's per-class sums reduced after: no per-class sums written and read back, a launch fewer
FOLD_SUMS_BY_CELL_ROW = "triton (fold sums by cell)"
# `triton` with the backward's distance-space gradients in one band's rows (`triton_backend.GRADIENT_BANDS` off),
# where the default takes the tables' bands (v3 at N <= 512: 592 cells a row against 1040): what the bands save
ONE_BAND_GRADIENTS_ROW = "triton (gradients in one band)"
# `triton` with the distance road's gradients at a row stride of 16 cells, stored element by element
# (`triton_backend.GRADIENT_STORES` "cells", the default before 2026-11-27), against the default's tables' rows
# at their odd stride, 16-byte stores read back by residue classes ("aligned"): what the aligned stores save,
# in bands (v3 at N <= 512) and in one band (N > 512, where the near tiles also sum no saturated pair)
CELL_STORES_ROW = "triton (gradient stores by cell)"
# `triton` with the forward's distance tables kept for the backward (`triton_backend.KEEP_TABLES`), which
# otherwise builds them again: its peak memory beside its time
KEPT_TABLES_ROW = "triton (tables kept)"
# `triton` with the backward's fold products and per-cell sums by eight cuBLAS matmuls a side each (and the
# products' conversion to the inputs' dtype: `triton_backend.FOLD_PRODUCT` and `FOLD_SUMS` "cublas", the default
# before 2026-11-27), against `triton_products`' two fold kernels
FOLD_MATMULS_ROW = "triton (fold matmuls)"
# and with the sums alone by the matmuls (`FOLD_SUMS` "cublas"), the products by the fold kernel
FOLD_SUMS_MATMULS_ROW = "triton (fold sums by matmul)"
# `triton` with its eager calls dispatched through the custom ops, as before 2026-11-26 and as compiled graphs
# run them (`triton_backend._attention`): the same kernels, what the ops' dispatch costs a call on the host
CUSTOM_OP_ROW = "triton (through the custom op)"
# `triton` with its kernels launched through Triton's own launch path (`triton_launch.LAUNCH_PATH` "triton", as
# before 2026-11-28), against the shorter one: what the shorter path saves a call on the host
TRITON_LAUNCH_ROW = "triton (Triton's launch path)"
# `triton` with every call made, none replayed from its signature's plan (`triton_backend.CALL_PLANS` "off", the
# default before 2026-11-28; `triton_plan`), against the default's replays: what the plans save a forward call
# on the host. Plans serve forwards without grad alone, so the forward+backward is the same as `triton`'s
NO_PLANS_ROW = "triton (no call plans)"
# `triton` under PyTorch's deterministic algorithms (`torch.use_deterministic_algorithms`): the backward sums the
# tables' gradients into their rows in a fixed order (`triton_backend._into_rows`) and new buffers are filled
# before use, as PyTorch does there. What reproducible training costs a call
DETERMINISTIC_ROW = "triton (deterministic algorithms)"
# `triton` with the forward's distance tables cut to the saturation where far tiles occur
# (`triton_backend.FORWARD_REACH` "saturation"): 16% fewer cells for the product kernel to write at v3's N >= 1024,
# for a select per pair in the forward's near tiles. Against `triton`: which costs the forward more
FORWARD_REACH_ROW = "triton (forward tables to the saturation)"
# `triton` with the forward's far tiles in blocks of 64 or 128 keys (`triton_backend.FORWARD_FAR_KEYS`; its near
# tiles keep 32): fewer instructions a far score (sm_90, Triton 3.6: 12.7 at 64 keys against 15.9) for more
# registers (164 against 148 at 64 keys, three programs an SM; 228 at 128, two). Against `triton`, from N = 1024
# on (no far tile below), most at long inputs, where far tiles are most of the work; and with the forward's
# tables cut to the saturation as well, the two forward-only changes together
FAR_KEYS_ROWS = {keys: f"triton (forward far tiles of {keys} keys)" for keys in (64, 128)}
FAR_KEYS_REACH_ROW = "triton (forward far tiles of 64 keys, tables to the saturation)"
# `triton` with the forward's and dQ's far tiles in blocks of 64 keys (`triton_backend.DQ_FAR_KEYS`; dQ takes 32
# at head dim 128 or with dropout): its forward `FAR_KEYS_ROWS[64]`'s, its backward's difference from that row's
# dQ's (Triton 3.6, sm_90, head dim 64: 12.6
# instructions a far score against 14.8, at 224 registers against 139, three programs an SM to two)
WIDE_FAR_ROW = "triton (forward and dQ far tiles of 64 keys)"
# `triton` with one `Geometry` for all its calls: the other rows give each call a new one, whose inputs (position
# rows, block ranges, lookup table, the distance tables' cells) the call builds; a model's layers share one, so
# the geometry's work is paid once per forward, not per layer. The difference is that work (host and GPU)
SHARED_GEOMETRY_ROW = "triton (geometry shared)"
# `triton` with one geometry, each timed call a replay of a CUDA graph of it (`_Replayed`): the host's work per
# call is one replay, as for a model served through `debertakit.inference.graphs`. Beside `triton`, what the
# host's work costs a call where it outlasts the GPU's (N = 512: 0.955 ms per forward for 0.468 of GPU time on
# an H200, sixth lease). Not the issue's per-call figure, which is `triton`'s
GRAPHED_ROW = "triton (CUDA graph)"


class _Replayed:
    """``fn`` captured into a CUDA graph at its first call (after warm-up calls on a side stream, as
    `torch.cuda.graph` asks), then replayed at that and every later call: the same inputs and outputs each
    time. Off CUDA (the smoke run) ``fn`` itself."""

    def __init__(self, fn: Callable[[], object], device: str):
        self.fn, self.device, self.graph = fn, device, None

    def __call__(self) -> None:
        import torch

        if self.device != "cuda":
            self.fn()
            return
        if self.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # compilation, autotuning, the allocator's first blocks
                    self.fn()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.fn()
        self.graph.replay()


SDPA_ROW = "sdpa (no position terms)"  # the ceiling: plain attention, PyTorch's fused kernels
HF_ROW = "hf eager layer (incl. projections)"
OTHER_FUNCTIONS = (SDPA_ROW, PLAIN_ROW, HF_ROW)  # other math


def attention_row_names() -> list[str]:
    """Every row the attention section can build, where its backend or package is present."""
    from debertakit.attention import available_backends

    return [
        *available_backends(),
        *NEAR_BAND_ROWS,
        THREE_RUNS_ROW,
        CUBLAS_TABLES_ROW,
        PRODUCT_TMA_ROW,
        PRODUCT_ROWS_ROW,
        PRODUCT_BLOCKS_ROW,
        PRODUCT_MASKED_EDGES_ROW,
        PRODUCT_TWO_LAUNCHES_ROW,
        FOLD_TWO_LAUNCHES_ROW,
        FOLD_SUMS_BY_CELL_ROW,
        ONE_BAND_GRADIENTS_ROW,
        CELL_STORES_ROW,
        KEPT_TABLES_ROW,
        FOLD_MATMULS_ROW,
        FOLD_SUMS_MATMULS_ROW,
        CUSTOM_OP_ROW,
        TRITON_LAUNCH_ROW,
        NO_PLANS_ROW,
        DETERMINISTIC_ROW,
        FORWARD_REACH_ROW,
        *FAR_KEYS_ROWS.values(),
        FAR_KEYS_REACH_ROW,
        WIDE_FAR_ROW,
        SHARED_GEOMETRY_ROW,
        GRAPHED_ROW,
        PLAIN_ROW,
        SDPA_ROW,
        "flashdeberta",
        HF_ROW,
    ]


def check_impls(impls: list[str] | None, models: list[str] | None = None) -> None:
    """``--impls`` names rows the attention section builds, ``--models`` models the model sections build: a
    misspelt name would be dropped silently."""
    for flag, names, known in (("--impls", impls, attention_row_names), ("--models", models, model_names)):
        unknown = [name for name in names or [] if name not in known()]
        if unknown:
            raise SystemExit(f"{flag}: unknown row(s) {unknown}; expected some of {known()}")


DIFF_TOLERANCE = 2e-2  # bfloat16, relative to the largest |value|: the tests' tolerance (tests/attention)


def _forward(fwd: Callable):
    """``fwd()``'s output without autograd, or None when it does not fit or cannot run the shape."""
    import torch

    try:
        with torch.no_grad():
            return fwd()
    except (torch.OutOfMemoryError, *cannot_run()):
        return None


def _max_diff(fwd: Callable, reference) -> float | str | None:
    """Largest |fwd() - reference| relative to the reference's largest |value|; a string when the outputs
    cannot be compared; None when fwd cannot run the shape (its timing row then says why)."""
    import torch

    out = _forward(fwd)
    if out is None:
        return None
    if out.shape != reference.shape:
        return f"shape {tuple(out.shape)}, expected {tuple(reference.shape)}"
    try:
        diff = float((out.float() - reference.float()).abs().max() / reference.float().abs().max())
    except torch.OutOfMemoryError:
        return None
    return diff if diff == diff and diff != float("inf") else "not finite"


def _with_backend_settings(run: Callable, deterministic_algorithms: bool = False, **settings) -> Callable:
    """``run`` with module settings of `triton_backend` changed for the call and restored after it:
    ``NEAR_BAND="skew"`` (the skewed kernels), ``TILE_OVERRIDES={}`` (the backend's own tiles); of
    `triton_launch`: ``LAUNCH_PATH="triton"``; and with ``deterministic_algorithms`` under PyTorch's."""
    from debertakit.attention import triton_backend, triton_launch

    launch = {name: value for name, value in settings.items() if name == "LAUNCH_PATH"}
    backend = {name: value for name, value in settings.items() if name != "LAUNCH_PATH"}
    if launch:
        run = mock.patch.multiple(triton_launch, **launch)(run)
    if deterministic_algorithms:
        run = _deterministic(run)
    return mock.patch.multiple(triton_backend, **backend)(run) if backend else run


def _deterministic(run: Callable) -> Callable:
    """``run`` under `torch.use_deterministic_algorithms` (cuBLAS's workspace set as they require on CUDA), the
    previous setting restored after."""
    import torch

    @functools.wraps(run)
    def wrapped(*args, **kwargs):
        before = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        with mock.patch.dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8"):
            torch.use_deterministic_algorithms(True)
            try:
                return run(*args, **kwargs)
            finally:
                torch.use_deterministic_algorithms(before[0], warn_only=before[1])

    return wrapped


# ----------------------------------------------------------------------------------------------- 1b. dropout
def dropout_section(args, device: str, dtype) -> Iterator[Unit]:
    """The attention rows with dropout on the probabilities (training): backends that have it, and sdpa (of
    those, the ones ``--impls`` names)."""
    only = None if args.impls is None else tuple(args.impls)

    def measure(n: int) -> list[dict]:
        rows = _attention_rows(args, n, device, dtype, only=only, dropout_p=args.dropout)
        return [{**r, "section": "dropout", "impl": f"{r['impl']} +dropout {args.dropout}"} for r in rows]

    for n in args.lengths:
        yield f"dropout {args.dropout} N={n}", functools.partial(measure, n)


# ------------------------------------------------------------------------------------------ 1c. long inputs
def long_section(args, device: str, dtype) -> Iterator[Unit]:
    """Batch 1 at growing N (16384 … 65536): the `triton` backend must run, with peak memory linear in N
    (`long_memory` relates the lengths once their rows are in)."""

    def measure(n: int) -> list[dict]:
        saved = args.tokens
        args.tokens = n  # batch 1
        try:
            only = (*road_rows(), PLAIN_ROW, SDPA_ROW)
            return [{**r, "section": "long"} for r in _attention_rows(args, n, device, dtype, only=only)]
        finally:
            args.tokens = saved

    for n in args.long_lengths:
        yield f"long N={n}", functools.partial(measure, n)


def long_memory(rows: list[dict]) -> None:
    """Sets each `long` row's peak memory per token relative to that of the same row at the shortest length
    measured (about 1 when memory is linear in N), over all rows: those of a resumed run or of combined files
    too."""
    for impl in TRITON_ROWS:
        base = sorted(
            (r for r in rows if r["section"] == "long" and r["impl"] == impl and r.get("fwd_bwd_peak_gib")),
            key=lambda r: r["n"],
        )
        for r in base[1:]:
            r["peak_per_token_vs_shortest"] = round(
                (r["fwd_bwd_peak_gib"] / r["n"]) / (base[0]["fwd_bwd_peak_gib"] / base[0]["n"]), 3
            )


# ------------------------------------------------------------------------------------------- 1d. tile sweep
def parse_tiles(spec: str):
    """'64x32w8s2' -> Tiles(64, 32, 8, 2); a bad spec ends the run with its message."""
    from debertakit.attention.triton_aot import Tiles

    try:
        return Tiles.parse(spec)
    except ValueError as e:
        raise SystemExit(str(e)) from None


# the distance tables' product kernel (`triton_products`): ``--tile-kernels`` may name it beside the attention
# kernels; its tiles are `triton_backend.PRODUCT_TILES` (stages unused: the kernel has no loop), or with
# `--product-programs rows` `PRODUCT_ROW_TILES` (whose stages pipeline the row's loop), with `columns`
# `PRODUCT_COLUMN_TILES` and `PRODUCT_NARROW_COLUMN_TILES` (the swept shape at every table width)
PRODUCT_KERNEL = "_distance_product_kernel"
# and the backward's fold kernels (`triton_products`, 16-bit inputs), by the setting of `triton_backend` that
# holds each one's tiles
FOLD_KERNEL_TILES = {"_fold_product_kernel": "FOLD_TILES", "_fold_sums_kernel": "FOLD_SUMS_TILES"}


def tiles_section(args, device: str, dtype) -> Iterator[Unit]:
    """The `triton` attention rows once per tile shape, given to the kernels of ``--tile-kernels`` on the road
    of ``--near-band`` (by default the three attention kernels; `PRODUCT_KERNEL` and the fold kernels,
    `FOLD_KERNEL_TILES`, on the distance road)."""
    from debertakit.attention import triton_backend

    every = triton_backend.KERNEL_NAMES
    distance_kernels = (PRODUCT_KERNEL, *FOLD_KERNEL_TILES)
    unknown = sorted(set(args.tile_kernels or ()) - {*every, *distance_kernels})
    if unknown or args.near_band not in triton_backend.NEAR_BAND_MODES:
        raise SystemExit(
            f"--tile-kernels {unknown or ''} / --near-band {args.near_band!r}: expected kernels of "
            f"{(*every, *distance_kernels)} and a road of {triton_backend.NEAR_BAND_MODES}"
        )
    others = [k for k in distance_kernels if k in (args.tile_kernels or ())]
    if others and args.near_band != "distance":
        raise SystemExit(f"--tile-kernels {others}: kernels of the distance road, not of {args.near_band!r}")
    kernels = tuple(k for k in every if args.tile_kernels is None or k in args.tile_kernels)
    suffix = f" {args.near_band}"  # the road, named: `triton` alone is the default road elsewhere
    if kernels != every:
        suffix += f" ({', '.join([*kernels, *others])})"

    def measure(tiles, n: int) -> list[dict]:
        settings = dict(NEAR_BAND=args.near_band, TILE_OVERRIDES=dict.fromkeys(kernels, tiles))
        # the product kernel's tiles: those of its programs as this run has them (--product-programs)
        if PRODUCT_KERNEL in others:
            programs = triton_backend.PRODUCT_PROGRAMS
            names = dict(
                rows=["PRODUCT_ROW_TILES"], columns=["PRODUCT_COLUMN_TILES", "PRODUCT_NARROW_COLUMN_TILES"]
            )
            settings.update(dict.fromkeys(names.get(programs, ["PRODUCT_TILES"]), tiles))  # at every width
        settings.update({FOLD_KERNEL_TILES[k]: tiles for k in others if k in FOLD_KERNEL_TILES})
        # with position terms, and where the attention kernels take the tiles the same tiles' plain-attention
        # ceiling (the plain row builds no distance table)
        only = ("triton", PLAIN_ROW) if kernels else ("triton",)
        # per call, or (``--tile-timer profile``) GPU time by kernel: the swept kernel's own time, where it is a
        # small share of a call whose per-call time varies more than that share between rows
        timer = profile_kernels if args.tile_timer == "profile" else None
        rows = _with_backend_settings(_attention_rows, **settings)(
            args, n, device, dtype, only=only, timer=timer
        )
        return [{**r, "section": "tiles", "impl": f"{r['impl']} {tiles}{suffix}"} for r in rows]

    for spec in args.tiles:
        tiles = parse_tiles(spec)
        for n in args.lengths:
            yield f"tiles {spec}{suffix} N={n}", functools.partial(measure, tiles, n)


# -------------------------------------------------------------------------------------- 1e. kernel profile
PROFILE_CALLS = 5  # calls profiled per measurement, after one warm-up call


def _profiled(fn: Callable[[], object], gpu: bool, activities: list) -> dict:
    """``{"prof": ...}``: `torch.profiler`'s record of ``activities`` over `PROFILE_CALLS` calls of ``fn``, after one
    warm-up call on a GPU (compilation, allocator, caches; the CPU's smoke runs, in the interpreter, compile
    nothing and time nothing that matters); or the row's error (`_or_error`)."""
    import torch
    from torch.profiler import profile

    def measure() -> dict:
        if gpu:
            fn()
        with profile(activities=activities) as prof:
            for _ in range(PROFILE_CALLS):
                fn()
            if gpu:
                torch.cuda.synchronize()
        return {"prof": prof}

    return _or_error(measure)


def profile_kernels(fn: Callable[[], object], device: str) -> dict:
    """Where ``fn``'s time goes: time per call of each kernel it launches (ms, by kernel name, largest first,
    from `torch.profiler`), their sum as ``ms``. Kernels only, so launch gaps and host work are not in it;
    compare ``ms`` with the `attention` row's wall time to see them. On CPU (``--smoke``) the operators'
    CPU time stands in."""
    import torch
    from torch.profiler import ProfilerActivity

    gpu = device == "cuda"
    result = _profiled(fn, gpu, [ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU])
    if "error" in result:
        return result
    times: dict[str, float] = {}
    for e in result["prof"].key_averages():
        us = e.self_device_time_total if gpu else e.self_cpu_time_total
        if us > 0 and (not gpu or e.device_type == torch.autograd.DeviceType.CUDA):
            times[e.key[:120]] = times.get(e.key[:120], 0.0) + us / 1e3 / PROFILE_CALLS
    kernels = {k: round(v, 4) for k, v in sorted(times.items(), key=lambda kv: -kv[1])}
    return {"ms": sum(kernels.values()), "peak_gib": None, "kernels": kernels}


def profile_section(args, device: str, dtype) -> Iterator[Unit]:
    """The `triton` rows of ``attention`` (each near-band road, the product kernel's variants, its rows' ends
    masked, the gradients in one band, and the kernels without position terms) with
    their GPU time split by kernel: how much is the fused kernels and how much the work around them (the N×R
    tables, FAR, copies)."""

    def measure(n: int) -> list[dict]:
        # the plain row: the kernels' loop alone, without the work around it
        # and the product kernel's variants: its GPU time in each, beside the default's
        only = (
            *road_rows(),
            CUBLAS_TABLES_ROW,
            PRODUCT_TMA_ROW,
            PRODUCT_ROWS_ROW,
            PRODUCT_BLOCKS_ROW,
            PRODUCT_MASKED_EDGES_ROW,
            PRODUCT_TWO_LAUNCHES_ROW,
            FOLD_TWO_LAUNCHES_ROW,
            FOLD_SUMS_BY_CELL_ROW,
            ONE_BAND_GRADIENTS_ROW,
            CELL_STORES_ROW,
            KEPT_TABLES_ROW,
            FOLD_MATMULS_ROW,
            FOLD_SUMS_MATMULS_ROW,
            PLAIN_ROW,
        )
        rows = _attention_rows(args, n, device, dtype, only=only, timer=profile_kernels)
        return [{**r, "section": "profile"} for r in rows]

    for n in args.lengths:
        yield f"profile N={n}", functools.partial(measure, n)


def _top_kernels(kernels: dict[str, float], count: int, width: int) -> str:
    """The first ``count`` kernels of a breakdown (largest first), names cut to ``width``, with their ms."""
    return "; ".join(f"{name[:width]} {ms:.3f}" for name, ms in list(kernels.items())[:count])


def print_profile(rows: list[dict]) -> None:
    """Per `profile` row: the kernels' summed time and the largest kernels' share, forward and backward."""
    for r in rows:
        for prefix in ("fwd", "fwd_bwd"):
            kernels = r.get(f"{prefix}_kernels_ms")
            if not kernels:
                continue
            total = r[f"{prefix}_ms"]
            top = _top_kernels(kernels, 6, 48)
            print(
                f"{r['impl']:20s} N={r['n']:<6d} {prefix:7s} {total:8.3f} ms in {len(kernels):2d} kernels: {top}"
            )


# ------------------------------------------------------------------------------------- 1f. the backward's folds
def folds_section(args, device: str, dtype) -> Iterator[Unit]:
    """The four matmuls that fold the backward's distance buffers into dQ, dK and the position tables'
    gradients (`triton_backend._fold_into_content`, `_fold_into_table`, for ROW's buffer and COL's), alone, on
    buffers of the attention section's shape: at the row stride 2·sat + 1 (the layout before the padding, 1025
    at v3's saturation) and at `triton_backend._distance_stride`, each timed and profiled (which cuBLAS kernel
    runs them: an ``align1`` kernel name at the odd stride was what the profile showed)."""

    def measure(n: int) -> list[dict]:
        import torch

        from debertakit.attention import RelativeIndex
        from debertakit.attention import triton_backend as tb

        rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
        H, D, batch = args.heads, args.head_dim, max(1, args.tokens // n)
        sat = max(1, min(rel.saturation, n))  # the backend's cut at distance i - j (`triton_attention`)
        lo, hi, lut = tb._lut(rel, sat, rel.table_rows, device)
        g = torch.Generator(device=device).manual_seed(0)
        table = torch.randn(H, hi - lo, D, generator=g, device=device, dtype=dtype)
        content = tb._per_head(
            torch.randn(batch, n, H, D, generator=g, device=device, dtype=dtype).transpose(1, 2)
        )
        grad = torch.zeros(batch, n, H, D, device=device).transpose(1, 2)  # dQ / dK: the projections' layout
        rows = []
        for stride in (2 * sat + 1, tb._distance_stride(sat)):
            dist = torch.randn(H, batch * n, stride, generator=g, device=device, dtype=dtype)
            dist[..., 2 * sat + 1 :] = 0

            def folds(dist=dist, lut=lut[:stride]):  # the LUT's padding entries serve the padding's cells
                for _ in ("ROW", "COL"):  # the two buffers have the same shape
                    tb._fold_into_content(dist, table, lut, grad, 1.0)
                    tb._fold_into_table(dist, content, lut, hi - lo, 1.0)

            timed, profiled = bench(folds, device), profile_kernels(folds, device)
            row = {"section": "folds", "impl": f"folds, row stride {stride}", "n": n, "batch": batch}
            row.update({"heads": H, "head_dim": D, "mode": "4 products", "row_stride": stride})
            row.update(
                {k: round(v, 4) for k, v in timed.items() if k in ("ms", "peak_gib") and v is not None}
            )
            row.update({k: v for k, v in timed.items() if k == "error"})
            row["kernels_ms"] = profiled.get("kernels", profiled.get("error"))
            rows.append(row)
            print(_fmt(row), flush=True)
        return rows

    for n in args.lengths:
        yield f"folds N={n}", functools.partial(measure, n)


def print_folds(rows: list[dict]) -> None:
    for r in rows:
        kernels = r.get("kernels_ms")
        top = _top_kernels(kernels, 3, 60) if isinstance(kernels, dict) else kernels
        print(f"{r['impl']:26s} N={r['n']:<6d} {r.get('ms', r.get('error'))!s:>9s} ms  {top}")


# ------------------------------------------------------------------------------------------------ targets
TARGETS = (
    "issue targets (H100/H200, bf16): triton forward >= 100 TFLOP/s at N >= 2048 and >= 60 at N = 512; "
    "forward+backward >= 75 TFLOP/s at N >= 2048; >= 40% of sdpa's throughput at N >= 2048; peak memory "
    "linear in N; N = 65536 at batch 1 runs"
)
SDPA_SHARE, SDPA_SHARE_FROM = 0.4, 2048  # triton's throughput >= 40% of sdpa's, from N = 2048


def targets(n: int) -> tuple[int | None, int | None]:
    """The issue's targets at N, TFLOP/s (forward, forward+backward): forward 60 at 512 and 100 from 2048,
    forward+backward 75 from 2048; None where it sets none."""
    forward = 60 if n == 512 else 100 if n >= 2048 else None
    return forward, 75 if n >= 2048 else None


# row -> triton_backend.NEAR_BAND (one of them is the plain `triton` row's road, whichever is the default)
NEAR_BAND_ROWS = {
    "triton tables": "tables",
    "triton distance": "distance",
    "triton skew-forward": "skew-forward",
    "triton skew": "skew",
}
TRITON_ROWS = ("triton", *NEAR_BAND_ROWS)


def road_rows() -> tuple[str, ...]:
    """`triton` and the rows of the other roads: the road rows of a run, without the default's twin."""
    from debertakit.attention import triton_backend

    return ("triton", *(row for row, mode in NEAR_BAND_ROWS.items() if mode != triton_backend.NEAR_BAND))


def verdicts(rows: list[dict]) -> list[str]:
    """One line per target check on the `attention` and `long` rows."""
    out = []
    att = {(r["impl"], r["n"]): r for r in rows if r["section"] == "attention"}
    for (impl, n), r in sorted(att.items(), key=lambda x: x[0][1]):
        if impl not in TRITON_ROWS:
            continue
        fwd, fb = r.get("fwd_tflops"), r.get("fwd_bwd_tflops")
        sdpa = att.get((SDPA_ROW, n), {})
        want_fwd, want_fb = targets(n)
        # the targets hold per call; the queued rate (calls back to back) beside it, not judged
        if want_fwd is not None:
            out.append(
                f"{impl} N={n}: forward {fwd} TFLOP/s{_queued(r, 'fwd')} (target >= {want_fwd}): "
                f"{_ok(fwd, want_fwd)}"
            )
        if want_fb is not None:
            out.append(
                f"{impl} N={n}: forward+backward {fb} TFLOP/s{_queued(r, 'fwd_bwd')} (target >= {want_fb}): "
                f"{_ok(fb, want_fb)}"
            )
        if n >= SDPA_SHARE_FROM:
            for key, label in (("fwd_tflops", "forward"), ("fwd_bwd_tflops", "forward+backward")):
                if r.get(key) and sdpa.get(key):
                    ratio = r[key] / sdpa[key]
                    out.append(
                        f"{impl} N={n}: {label} {ratio:.0%} of sdpa (target >= {SDPA_SHARE:.0%}): "
                        f"{_ok(ratio, SDPA_SHARE)}"
                    )
    for r in rows:
        for key, whose in (("max_diff_vs_triton", "triton's"), ("max_diff_vs_sdpa", "sdpa's")):
            diff = r.get(key)
            if isinstance(diff, str) or (diff is not None and diff > DIFF_TOLERANCE):
                out.append(
                    f"{r['impl']} {r['section']} N={r['n']}: output differs from {whose} ({diff} of its largest "
                    f"value; tolerance {DIFF_TOLERANCE}): its timing is of other work"
                )
    for r in rows:
        if r["section"] == "long" and r["impl"] in TRITON_ROWS:
            ran = "fwd_bwd_ms" in r
            lin = r.get("peak_per_token_vs_shortest")
            out.append(
                f"{r['impl']} long N={r['n']} batch 1: "
                + ("runs" if ran else "FAILED: " + str(r.get("fwd_bwd_error")))
                + ("" if lin is None else f"; peak memory per token {lin}x that of the shortest length")
            )
    return out


def _queued(r: dict, prefix: str) -> str:
    rate = r.get(f"{prefix}_queued_tflops")
    return "" if rate is None else f" per call, {rate} queued"


def _ok(got, want) -> str:
    return "met" if got is not None and got >= want else "MISSED"


def _rate(prefix: str, r: dict, flops: float) -> dict:
    if "error" in r:
        return {f"{prefix}_error": r["error"]}
    rate = {
        f"{prefix}_ms": round(r["ms"], 4),
        f"{prefix}_tflops": round(flops / (r["ms"] * 1e-3) / 1e12, 2),
        f"{prefix}_peak_gib": None if r["peak_gib"] is None else round(r["peak_gib"], 3),
    }
    if r.get("queued_ms"):  # `bench`'s calls back to back, and the host's time to issue one
        rate[f"{prefix}_queued_ms"] = round(r["queued_ms"], 4)
        rate[f"{prefix}_queued_tflops"] = round(flops / (r["queued_ms"] * 1e-3) / 1e12, 2)
        rate[f"{prefix}_host_ms"] = round(r["host_ms"], 4)
    if "kernels" in r:  # the `profile` section's breakdown
        rate[f"{prefix}_kernels_ms"] = r["kernels"]
    return rate


def _flashdeberta(q, k, v, pos_q, pos_k, scale):
    """flashdeberta's kernel on the same inputs, if the package imports and has the (q, k, v, seq_lengths,
    pos_key_layer, pos_query_layer, causal, sm_scale, position_buckets, max_relative_distance) entry point
    (0.0.8, PyPI's release); None otherwise. Its output is checked against `triton` in the same run."""
    try:
        import inspect

        from flashdeberta.ops.flash_attention import flash_attention_with_disentangled as fd
    except Exception:
        return None
    params = list(inspect.signature(fd).parameters)
    if "seq_lengths" not in params:
        return None

    def run():
        # pos_key_layer (1, H, 2·span, D) for c2p, pos_query_layer for p2c; buckets 256, max distance 512
        return fd(q, k, v, None, pos_k[None], pos_q[None], False, scale, 256, 512)

    return run


def _hf_attention_layer(batch, n, heads, d, device, dtype):
    """Hugging Face's eager DisentangledSelfAttention (v3-base settings), with its hidden-state input."""
    try:
        import torch
        from transformers import DebertaV2Config
        from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention
    except Exception:
        return None
    cfg = DebertaV2Config(
        hidden_size=heads * d,
        num_attention_heads=heads,
        relative_attention=True,
        position_buckets=256,
        max_relative_positions=512,
        pos_att_type=["p2c", "c2p"],
        share_att_key=True,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    layer = DisentangledSelfAttention(cfg).to(device=device, dtype=dtype)
    x = torch.randn(batch, n, heads * d, device=device, dtype=dtype, requires_grad=True)
    rel_emb = torch.randn(512, heads * d, device=device, dtype=dtype)
    mask = torch.ones(batch, 1, n, n, device=device, dtype=torch.bool)

    def run():
        return layer(x, mask, rel_embeddings=rel_emb)[0]

    return run, [x]  # the gradient of the layer input: the whole attention backward runs


# ----------------------------------------------------------------------------------------- 2./3. the model
def _v3_config(args, backend: str, dropout: float = 0.0):
    from debertakit.config import DebertaConfig

    if args.smoke:
        return DebertaConfig.preset("tiny-v3", hidden_size=32, num_heads=2, attention_backend=backend,
                                    hidden_dropout=dropout, attention_dropout=dropout)  # fmt: skip
    return DebertaConfig.preset(
        "deberta-v3-base", attention_backend=backend, hidden_dropout=dropout, attention_dropout=dropout
    )


def _models(args, device: str, dropout: float = 0.0) -> list[tuple[str, Callable, bool]]:
    """(name, model factory, is_hf) for our model with each usable backend, and Hugging Face's: a unit builds
    its model when it runs (one model on the device at a time)."""
    import torch

    from debertakit.attention import Request, available_backends, get_backend
    from debertakit.model.backbone import DebertaModel

    def ours(name: str):
        torch.manual_seed(0)
        return DebertaModel(_v3_config(args, name, dropout)).to(device)

    out = []
    probe = Request(
        device_type=device, dtype=torch.bfloat16, seq_len=args.model_length, head_dim=64, dropout=dropout > 0
    )
    for name in available_backends():
        try:
            get_backend(name, probe)
        except ValueError:
            continue
        out.append((f"ours/{name}", functools.partial(ours, name), False))
    try:
        from transformers import DebertaV2Config, DebertaV2Model

        from debertakit.convert.hf_config import to_hf_config

        hf_cfg = DebertaV2Config(**to_hf_config(_v3_config(args, "eager", dropout)))
        out.append((HF_MODEL, lambda: DebertaV2Model(hf_cfg).to(device), True))
    except Exception as e:  # transformers absent or incompatible: ours only
        print(f"(no Hugging Face model: {type(e).__name__}: {e})")
    return [m for m in out if args.models is None or m[0] in args.models]


def model_names() -> list[str]:
    """Every model the model and packed sections can build, where its backend or package is present."""
    from debertakit.attention import available_backends

    return [*(f"ours/{name}" for name in available_backends()), HF_MODEL]


HF_MODEL = "hf eager"


def _step_fns(model, device, dtype, kwargs):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def forward():
        model.eval()
        with torch.no_grad(), torch.autocast(device, dtype=dtype):
            model(**kwargs)

    def train_step():
        model.train()
        with torch.autocast(device, dtype=dtype):
            out = model(**kwargs).last_hidden_state
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return forward, train_step


# the model section's batch-1 forward replayed as a CUDA graph (`debertakit.inference.graphs`)
GRAPHS_MODE = "forward batch 1, CUDA graph"


def _graphed_forward(model, device: str, dtype, length: int, smoke: bool) -> Callable[[], None]:
    """One sequence of ``length`` tokens through `CudaGraphModel` (its bucket of ``length`` tokens captured at the
    first call, the benchmark's warm-up); with ``smoke`` (the CPU) its padded bucket without a graph."""
    import torch

    from debertakit.inference.graphs import CudaGraphModel

    graphs = CudaGraphModel(model, lengths=(length,), batch_sizes=(1,), replay=not smoke)
    ids = torch.randint(5, 100 if smoke else 1000, (1, length), device=device)

    def forward():
        model.eval()  # the training step before it left the model training
        with torch.autocast(device, dtype=dtype):
            graphs(ids)

    return forward


def model_section(args, device: str, dtype) -> Iterator[Unit]:
    import torch

    n = args.model_length
    batch = max(1, args.tokens // n)

    def steps(model, b: int, length: int):
        ids = torch.randint(5, 1000 if not args.smoke else 100, (b, length), device=device)
        return _step_fns(model, device, dtype, dict(input_ids=ids, attention_mask=torch.ones_like(ids)))

    def measure(name: str, build: Callable, dropout: float) -> list[dict]:
        model = build()
        forward, train_step = steps(model, batch, n)
        if dropout == 0:
            modes = [("forward", forward, batch, n), ("train_step", train_step, batch, n)]
            modes.append(("forward batch 1", steps(model, 1, args.latency_length)[0], 1, args.latency_length))
            if name.startswith("ours/"):
                graphed = _graphed_forward(model, device, dtype, args.latency_length, args.smoke)
                modes.append((GRAPHS_MODE, graphed, 1, args.latency_length))
        else:  # released models train with dropout 0.1 on hidden states and probabilities
            modes = [("train_step dropout", train_step, batch, n)]
        rows = []
        for mode, fn, b, length in modes:
            r = bench(fn, device)
            row = {
                "section": "model",
                "impl": name,
                "mode": mode,
                "n": length,
                "batch": b,
                "dropout": dropout,
            }
            row.update(_tokens(r, b * length))
            rows.append(row)
            print(_fmt(row), flush=True)
        return rows

    for dropout in (0.0, args.dropout):
        for name, build, _ in _models(args, device, dropout):
            yield f"model {name} dropout {dropout}", functools.partial(measure, name, build, dropout)


def host_profile(fn: Callable[[], object], device: str) -> dict:
    """Where a call's time goes when the host, not the GPU, sets it (a batch-1 forward): per call, the host time
    of every operator (``host_ms``, self CPU time summed, and ``host_ops``, the operators by self CPU time, largest
    first), the GPU kernels launched (``launches``) and their summed time (``gpu_ms``), from `torch.profiler`. The
    call's wall time, without the profiler's overhead, is the ``model`` section's ``forward batch 1`` row."""
    import torch
    from torch.profiler import ProfilerActivity

    gpu = device == "cuda"
    result = _profiled(fn, gpu, [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else []))
    if "error" in result:
        return result
    host: dict[str, float] = {}
    gpu_us, launches = 0.0, 0
    for e in result["prof"].key_averages():
        if e.self_cpu_time_total > 0:
            host[e.key[:120]] = host.get(e.key[:120], 0.0) + e.self_cpu_time_total / 1e3 / PROFILE_CALLS
        if gpu and e.device_type == torch.autograd.DeviceType.CUDA:
            gpu_us += e.self_device_time_total
            launches += e.count
    ops = {k: round(v, 4) for k, v in sorted(host.items(), key=lambda kv: -kv[1])}
    return {
        "host_ms": round(sum(ops.values()), 4),
        "host_ops": dict(list(ops.items())[:20]),
        "launches": launches / PROFILE_CALLS if gpu else None,
        "gpu_ms": round(gpu_us / 1e3 / PROFILE_CALLS, 4) if gpu else None,
    }


def python_profile(fn: Callable[[], object], count: int = 15) -> dict:
    """The host's time per call by Python function (`cProfile`, over `PROFILE_CALLS` calls after a warm-up
    call): ``python_ms``, the calls' wall time under the profiler, and ``python_funcs``, the ``count``
    functions of most time spent in them alone (ms per call, largest first; ``file:line(name)``, builtins such
    as ``torch.bmm`` by name, their time the host's share of the operator). `torch.profiler` sees operators
    only; the time in between (the custom op's wrappers, the Triton launcher, the backend's own Python) shows
    here."""
    import cProfile
    import pstats

    def measure() -> dict:
        fn()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(PROFILE_CALLS):
            fn()
        profiler.disable()
        wall = (time.perf_counter() - start) / PROFILE_CALLS
        stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, tottime, ...)
        own = sorted(((t[2], where) for where, t in stats.items()), reverse=True)[:count]
        return {
            "python_ms": round(wall * 1e3, 4),
            "python_funcs": {_function_name(*where): round(t * 1e3 / PROFILE_CALLS, 4) for t, where in own},
        }

    return _or_error(measure)


def count_syncs(fn: Callable[[], object], device: str) -> int | None:
    """How many times one call of ``fn`` waits for the GPU (``.item()``, a tensor's truth value, a copy to the
    host...): PyTorch's sync debug mode warns at each. A forward that syncs in every layer pays the GPU's queue
    each time, where the host could run ahead. None off CUDA (the mode needs it)."""
    import warnings

    import torch

    if device != "cuda":
        return None
    fn()  # a warm-up call: compilation and caches may sync once
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message) for w in caught)


def _function_name(file: str, line: int, name: str) -> str:
    """``name.py:line(function)``, or the builtin's name (cProfile files builtins under ``~``)."""
    return name if file == "~" else f"{Path(file).name}:{line}({name})"


def latency_section(args, device: str, dtype) -> Iterator[Unit]:
    """``latency`` (not run by default): the ``model`` section's batch-1 forward of ``--latency-length`` tokens
    under `torch.profiler`, for our model with each backend and Hugging Face's: host time per operator, GPU
    kernels and their time. On the H100 `triton` took 22.7 ms there against our `eager`'s 14.5 (host-bound: the
    GPU work of 128 tokens is small); this says where the difference goes."""
    import torch

    def measure(name: str, build: Callable) -> list[dict]:
        model = build()
        ids = torch.randint(5, 1000 if not args.smoke else 100, (1, args.latency_length), device=device)
        forward, _ = _step_fns(model, device, dtype, dict(input_ids=ids, attention_mask=torch.ones_like(ids)))
        row = {
            "section": "latency",
            "impl": name,
            "mode": "forward batch 1",
            "n": args.latency_length,
            "batch": 1,
        }
        row.update(host_profile(forward, device))
        row.update(python_profile(forward))
        row["syncs"] = count_syncs(forward, device)
        return [row]

    for name, build, _ in _models(args, device):
        yield f"latency {name}", functools.partial(measure, name, build)
    n = min(args.lengths) if args.smoke else LATENCY_LAYER_N  # (the smoke run's short length)
    yield f"latency {LATENCY_LAYER} N={n}", functools.partial(_layer_latency, args, n, device, dtype)


# The attention layer's `triton` row (the `attention` section's shape: batch·N = --tokens) at the length where a
# forward+backward's host time reached the call's time on an H200 (2.10 against 2.09 ms, seventh lease): the
# latency section splits its forward and its forward+backward by operator and Python function too
LATENCY_LAYER, LATENCY_LAYER_N = "triton (attention layer)", 512


def _layer_latency(args, n: int, device: str, dtype) -> list[dict]:
    """`latency`'s rows of the attention layer's `triton` row at ``n``: its forward without grad, then its
    forward+backward, each profiled as the section profiles a model's forward."""
    rows: list[dict] = []

    def profiled(fn: Callable[[], object], device: str) -> dict:
        mode = "forward+backward" if rows else "forward"
        row = {
            "section": "latency",
            "impl": LATENCY_LAYER,
            "mode": mode,
            "n": n,
            "batch": max(1, args.tokens // n),
        }
        row.update(host_profile(fn, device))
        if "error" not in row:
            row.update(python_profile(fn))
            row["syncs"] = count_syncs(fn, device)
        rows.append(row)
        return {"error": row["error"]} if "error" in row else {"ms": row["host_ms"], "peak_gib": None}

    _attention_rows(args, n, device, dtype, only=("triton",), timer=profiled)
    return rows


def print_latency(rows: list[dict]) -> None:
    """Per `latency` row: host and GPU time per call, launches, and the operators of most host time."""
    for r in rows:
        if "error" in r:
            print(f"{r['impl']:20s} {r['error']}")
            continue
        gpu = "" if r["gpu_ms"] is None else f", GPU {r['gpu_ms']:.3f} ms in {r['launches']:.0f} kernels"
        name = r["impl"] if r["mode"] == "forward batch 1" else f"{r['impl']} {r['mode']}"
        print(f"{name:20s} host {r['host_ms']:.3f} ms{gpu}: {_top_kernels(r['host_ops'], 6, 40)}")
        if "python_funcs" in r:
            print(f"{'':20s} Python {r['python_ms']:.3f} ms: {_top_kernels(r['python_funcs'], 6, 50)}")
        if r.get("syncs") is not None:
            print(f"{'':20s} {r['syncs']} GPU synchronisations per call")


def _tokens(r: dict, tokens: int) -> dict:
    if "error" in r:
        return {"error": r["error"]}
    return {
        "ms": round(r["ms"], 3),
        "tokens_per_s": round(tokens / (r["ms"] * 1e-3)),
        "peak_gib": None if r["peak_gib"] is None else round(r["peak_gib"], 3),
    }


def packed_section(args, device: str, dtype) -> Iterator[Unit]:
    import torch

    g = torch.Generator().manual_seed(0)
    lo, hi = (32, args.model_length) if not args.smoke else (3, 20)
    lengths = []
    while sum(lengths) < args.tokens:
        lengths.append(int(torch.randint(lo, hi + 1, (1,), generator=g)))
    lengths[-1] -= sum(lengths) - args.tokens
    lengths = [x for x in lengths if x > 0]
    total = sum(lengths)
    longest = max(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device, dtype=torch.int32)
    packed_ids = torch.randint(5, 1000 if not args.smoke else 100, (1, total), device=device)
    padded_ids = torch.zeros(len(lengths), longest, dtype=torch.long, device=device)
    padded_mask = torch.zeros_like(padded_ids)
    for i, (s, n) in enumerate(zip(cu[:-1].tolist(), lengths)):
        padded_ids[i, :n] = packed_ids[0, s : s + n]
        padded_mask[i, :n] = 1

    def measure(name: str, build: Callable, is_hf: bool) -> list[dict]:
        model = build()
        layouts = [("padded", dict(input_ids=padded_ids, attention_mask=padded_mask))]
        if not is_hf:
            layouts.insert(0, ("packed", dict(input_ids=packed_ids, cu_seqlens=cu)))
        rows = []
        for layout, kwargs in layouts:
            forward, train_step = _step_fns(model, device, dtype, kwargs)
            for mode, fn in (("forward", forward), ("train_step", train_step)):
                r = bench(fn, device)
                row = {"section": "packed", "impl": name, "layout": layout, "mode": mode}
                row.update({"sequences": len(lengths), "real_tokens": total, "longest": longest})
                row.update(_tokens(r, total))
                rows.append(row)
                print(_fmt(row), flush=True)
        return rows

    for name, build, is_hf in _models(args, device):
        yield f"packed {name}", functools.partial(measure, name, build, is_hf)


# ------------------------------------------------------------------------------------------------- report
def _fmt(row: dict) -> str:
    keys = [k for k in row if k not in ("section",)]
    return "  ".join(f"{k}={row[k]}" for k in keys)


def _version(module: str) -> str | None:
    """A package's version; None when it does not import. flashdeberta has no ``__version__``: its
    distribution's then."""
    import importlib
    import importlib.metadata

    try:
        imported = importlib.import_module(module)
    except Exception:
        return None
    try:
        return getattr(imported, "__version__", None) or importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def gpu_tiles() -> dict[str, str]:
    """`triton_backend.GPU_TILES` as the results files record it: "d64 _fwd_kernel" -> "64x32 w4 s2"."""
    from debertakit.attention import triton_backend

    return {
        f"d{hd} {name}": str(t)
        for hd, kernels in triton_backend.GPU_TILES.items()
        for name, t in kernels.items()
    }


def environment(device: str) -> dict:
    import torch

    from debertakit.attention import triton_backend

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "gpu_tiles": gpu_tiles(),  # the `triton` rows' tiles (the tables change as timings come in)
        # the plain `triton` row's road and how its distance tables are built (files without these fields ran
        # the "tables" road: the default until 2026-11-26)
        "near_band": triton_backend.NEAR_BAND,
        "distance_product": triton_backend.DISTANCE_PRODUCT,
        "product_stores": triton_backend.PRODUCT_STORES,  # the product kernel's inner blocks (--product-stores)
        "product_programs": triton_backend.PRODUCT_PROGRAMS,  # and its programs (--product-programs)
        "product_edges": triton_backend.PRODUCT_EDGES,  # and its rows' ends
    }
    for mod in ("triton", "transformers", "flashdeberta"):
        env[mod] = _version(mod)
    if device == "cuda":
        env["cuda"] = torch.version.cuda
    return env


ATTENTION_TABLE = ("attention", "dropout", "long", "tiles")  # the sections printed in the attention table


def print_table(rows: list[dict]) -> None:
    att = [r for r in rows if r["section"] in ATTENTION_TABLE]
    if att:
        print("\nattention core, bf16, TFLOP/s (4·N²·d per head forward; ×3.5 forward+backward)")
        print(
            f"{'impl':38s} {'N':>6s} {'batch':>5s} {'fwd':>8s} {'fwd+bwd':>8s} {'queued':>17s} "
            f"{'host ms':>15s} {'peak GiB':>9s} {'|Δ| vs ref':>13s}"
        )
        print(
            "(per call: do_bench, the L2 cache emptied before each; queued: calls back to back, fwd / fwd+bwd;"
        )
        print(" host ms: the host's time to issue one call of those, fwd / fwd+bwd;")
        print(" |Δ| vs ref: against triton's output, the no-position-terms row against sdpa's)")
        for r in att:
            fwd = r.get("fwd_tflops", r.get("fwd_error", "")[:8])
            fb = r.get("fwd_bwd_tflops", r.get("fwd_bwd_error", "")[:8])
            queued = f"{r.get('fwd_queued_tflops', '')} / {r.get('fwd_bwd_queued_tflops', '')}"
            host = f"{r.get('fwd_host_ms', '')} / {r.get('fwd_bwd_host_ms', '')}"
            diff = r.get("max_diff_vs_triton", r.get("max_diff_vs_sdpa"))
            print(f"{r['impl']:38s} {r['n']:6d} {r['batch']:5d} {fwd!s:>8s} {fb!s:>8s} {queued:>17s} {host:>15s} "
                  f"{r.get('fwd_bwd_peak_gib', '')!s:>9s} {'' if diff is None else f'{diff:.2e}':>13s}")  # fmt: skip
    # the profile's rows, and a tile sweep's timed by kernel (--tile-timer profile)
    profiled = [r for r in rows if r["section"] in ("profile", "tiles") and "fwd_bwd_kernels_ms" in r]
    if profiled:
        print("\nkernel time per call (ms, torch.profiler), the largest kernels first")
        print_profile(profiled)
    folds = [r for r in rows if r["section"] == "folds"]
    if folds:
        print("\nthe backward's four fold products alone (ms per call; the largest kernels, torch.profiler)")
        print_folds(folds)
    latency = [r for r in rows if r["section"] == "latency"]
    if latency:
        print("\nbatch-1 forward under torch.profiler (per call): host time by operator, GPU kernels")
        print_latency(latency)
    other = [r for r in rows if r["section"] not in (*ATTENTION_TABLE, "profile", "folds", "latency")]
    if other:
        print("\nwhole model (deberta-v3-base shape), tokens/s and ms per call")
        for r in other:
            layout = r.get("layout", f"N={r.get('n')}")
            val = r.get("tokens_per_s", r.get("error"))
            print(f"{r['section']:8s} {r['impl']:20s} {layout:10s} {r['mode']:27s} {val!s:>12s} "
                  f"{r.get('ms', '')!s:>10s} ms  peak {r.get('peak_gib', '')} GiB")  # fmt: skip


ROW_KEY = ("section", "impl", "n", "mode", "layout")  # what one measurement is; no two parts may both have it
SAME_MACHINE = ("device", "torch", "triton", "cuda", "python", "transformers", "flashdeberta")


def _check_same_machine(first: dict, first_name: str, part: dict, name: str) -> None:
    """Results measured on another device, with other versions or in the other mode (smoke) do not join."""
    env0, env = first["environment"], part["environment"]
    differs = {k: (env0.get(k), env.get(k)) for k in SAME_MACHINE if env0.get(k) != env.get(k)}
    if differs or part["smoke"] != first["smoke"]:
        raise SystemExit(f"{name} was measured elsewhere than {first_name}: {differs or 'smoke flag'}")


def result_of(env: dict, smoke: bool, rows: list[dict], units: list[str], pending: list[str]) -> dict:
    """The results file: rows, the units measured and those still pending, verdicts over all rows."""
    long_memory(rows)
    return {
        "environment": env,
        "smoke": smoke,
        "complete": not pending,
        "units": units,
        "pending": pending,
        "flop_convention": FLOPS_NOTE,
        "targets": TARGETS,
        "verdicts": verdicts(rows),
        "rows": rows,
    }


def combine(paths: list[Path]) -> dict:
    """One result from several runs (a whole run may not fit one session; a section may be split by length):
    the same device, versions and smoke flag, no measurement twice; rows in the order given, verdicts over all
    of them; still pending: what a part left pending and no part measured."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    for path, part in zip(paths[1:], parts[1:]):
        _check_same_machine(parts[0], str(paths[0]), part, str(path))
    seen: dict[tuple, Path] = {}
    for path, part in zip(paths, parts):
        for key in dict.fromkeys(tuple(r.get(k) for k in ROW_KEY) for r in part["rows"]):
            if key in seen:
                raise SystemExit(f"measurement {dict(zip(ROW_KEY, key))} is in both {seen[key]} and {path}")
            seen[key] = path
    rows = [r for part in parts for r in part["rows"]]
    units = [u for part in parts for u in part.get("units", [])]
    pending = [u for part in parts for u in part.get("pending", []) if u not in units]
    env = {**parts[0]["environment"], "combined_from": [p["environment"]["date"] for p in parts]}
    return result_of(env, parts[0]["smoke"], rows, units, list(dict.fromkeys(pending)))


def save(result: dict, out: Path) -> None:
    """Written under a temporary name and renamed: a run killed while writing leaves the previous file."""
    from debertakit.convert.checkpoint import atomic_write_text

    atomic_write_text(out, json.dumps(result, indent=1, default=str, allow_nan=False) + "\n")


def report(result: dict, out: Path) -> None:
    print_table(result["rows"])
    print("\n" + TARGETS + ("\n  " + "\n  ".join(result["verdicts"]) if result["verdicts"] else ""))
    if result["pending"]:
        print(f"\nINCOMPLETE: {len(result['pending'])} unit(s) not measured: " + "; ".join(result["pending"]))
    print(f"\nwrote {out}")


SECTIONS = {
    "attention": attention_section,
    "dropout": dropout_section,
    "long": long_section,
    "tiles": tiles_section,
    "profile": profile_section,
    "folds": folds_section,
    "model": model_section,
    "packed": packed_section,
    "latency": latency_section,
}


def _prior(args, env: dict) -> dict:
    """What the run continues (``--resume``): its rows and units; nothing without it."""
    if args.resume is None:
        return {"rows": [], "units": []}
    if not args.resume.is_file():
        raise SystemExit(f"--resume {args.resume}: no such results file")
    prior = json.loads(args.resume.read_text())
    if "units" not in prior:
        raise SystemExit(
            f"--resume {args.resume}: the file records no units of work (written before runs recorded them)"
        )
    _check_same_machine({"environment": env, "smoke": args.smoke}, "this run", prior, str(args.resume))
    return prior


def run_units(args, device: str, dtype) -> int:
    """Measures the sections' units in order, except those ``--resume`` holds; rewrites ``--out`` after each
    (pending: the rest), stops starting units after ``--budget-s``. 0 when complete, 3 when units are left."""
    for name in args.sections:
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; expected some of {sorted(SECTIONS)}")
    env = environment(device)
    prior = _prior(args, env)
    if args.resume is not None:
        env["resumed_from"] = prior["environment"]["date"]
    rows, done = list(prior["rows"]), list(prior["units"])
    plan = [unit for name in args.sections for unit in SECTIONS[name](args, device, dtype)]
    todo = [(key, measure) for key, measure in plan if key not in done]
    if len(todo) < len(plan):
        print(f"{len(plan) - len(todo)} unit(s) already in {args.resume}: kept, not measured again")
    # what the resumed run left pending outside this run's sections stays pending
    planned = {key for key, _ in plan}
    elsewhere = [key for key in prior.get("pending", []) if key not in planned and key not in done]

    def pending(start: int) -> list[str]:
        return [key for key, _ in todo[start:]] + elsewhere

    began = time.monotonic()
    save(result_of(env, args.smoke, rows, done, pending(0)), args.out)  # --out writable before any work
    measured = 0  # units of `todo` measured so far
    for key, measure in todo:
        if args.budget_s is not None and time.monotonic() - began >= args.budget_s:
            print(f"time budget of {args.budget_s} s reached: starting no more units", file=sys.stderr)
            break
        print(f"== {key} ({measured + 1}/{len(todo)})", flush=True)
        rows += measure()
        done.append(key)
        measured += 1
        save(result_of(env, args.smoke, rows, done, pending(measured)), args.out)
    result = result_of(env, args.smoke, rows, done, pending(measured))
    report(result, args.out)
    if result["pending"]:
        print(f"{len(result['pending'])} unit(s) pending: continue with --resume {args.out}", file=sys.stderr)
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.combine:
        result = combine(args.combine)
        save(result, args.out)
        report(result, args.out)
        return 0
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    check_impls(args.impls, args.models)
    import torch

    from debertakit.attention import triton_backend

    if args.product_stores is not None:
        triton_backend.PRODUCT_STORES = args.product_stores
    if args.product_programs is not None:
        triton_backend.PRODUCT_PROGRAMS = args.product_programs

    if args.smoke:
        device = "cpu"
        # one short length and two batch rows: the interpreter runs every program one after the other, and a
        # smoke run checks the plumbing of every row (the test run's time is mostly these)
        args.lengths = [n for n in args.lengths if n <= 64] or [16]
        args.tokens, args.heads, args.head_dim, args.model_length, args.latency_length = 32, 2, 16, 32, 12
        args.long_lengths = [n for n in args.long_lengths if n <= 64] or [32, 64]
    elif not torch.cuda.is_available():
        print(
            "attention_gpu.py needs a CUDA device; none is available here, nothing was measured or written. "
            "(`--smoke` checks the script on CPU with Triton's interpreter, without meaningful timings.)",
            file=sys.stderr,
        )
        return 2
    else:
        device = "cuda"
    return run_units(args, device, torch.bfloat16)


FLOPS_NOTE = (
    "forward 4·N²·d per head and batch row (QKᵀ, PV); forward+backward 3.5× that; position terms not counted"
)


if __name__ == "__main__":
    raise SystemExit(main())
