"""One GPU session's measurements in one command: the steps in the order of what they decide, inside one
time budget, every result and log in one bundle.

GPU time comes in short leases, and a machine's start costs minutes: what a lease should measure is prepared
here, run as one command, and stops starting work before the lease ends. The plan (``--list`` prints it, with
each step's cap and what it decides):

1. ``environment``: device, clocks, driver, versions (torch, Triton, transformers, flashdeberta), Nsight
   Compute, the commit and the kernels' code hash; ``dispatch``: `triton_dispatch.py` on the machine's CPU;
   ``launch-cost``: `triton_launch_cost.py` there, Triton's own launch path per kernel; ``forward-settings``:
   `attention_gpu.py`'s attention section from N = 1024 (where far tiles occur) for the default road and the
   forward's settings built without a GPU (``triton (forward tables to the saturation)``, ``triton (forward
   far tiles of 64 keys)``, ``... of 128 keys``, and 64 keys with the tables cut; and dQ's far tiles in blocks of
   64 keys with the forward's, ``triton (forward and dQ far tiles of 64 keys)``), beside sdpa: a few rows, first;
2. ``targets``: `attention_gpu.py`'s attention section at N = 512, 2048, 8192, 16384 for the default road, the
   same with cuBLAS's distance tables (``triton (cuBLAS tables)``: what the product kernel changes), with that
   kernel's rows' ends stored element by element (``triton (product edges masked)``), with the backward's
   gradients in one band (``triton (gradients in one band)``) and with its banded gradients stored by cell
   (``triton (gradient stores by cell)``), through the custom op, and with one
   geometry for all its calls (``triton (geometry shared)``: what building it costs a call), the tables and
   skewed-forward roads, our kernels without position terms, sdpa (the ceiling) and flashdeberta: the
   issue's targets and which road should be the default;
3. ``profile``: the ``triton`` rows' GPU time per kernel (the fused kernels against the products around
   them; about 20 s, so before the tests since an H100 lease of 2026-11-26);
4. ``gpu-tests``: ``pytest -m gpu tests/attention tests/inference`` (`TEST_WORKERS` processes where
   pytest-xdist imports: the grid at real sizes on every road; the served model's CUDA graphs);
5. ``ncu``: `attention_ncu.py`, where the time goes at N = 512 (every tile near) and 2048 (near and far tiles)
   (after the tests and the profile since an H200 lease of 2026-11-26 ran it first: what is new since then
   is the code's correctness on a GPU and where its time goes); ``ncu-product``: the distance tables' product
   kernel alone at both lengths (its DRAM writes and their rate, the memory's and L2's share of peak, the
   stores' sectors per request); ``ncu-backward``: dQ and dK/dV at 8192 (their L2 throughput's share of peak:
   whether the blocks each program streams from L2, not instructions, set their time);
6. ``folds``: the backward's fold products at the distance buffers' padded row stride and the unpadded one;
7. ``tiles``, ``tiles-distance``: tile sweeps on the tables and the distance roads (for `GPU_TILES`),
   ``tiles-forward``: of the distance road's forward kernel alone, by its pipeline's stages, ``tiles-dkv``:
   of the backward's dK/dV kernel alone (a third to half of a forward+backward's GPU time at 2048 to 8192), and
   ``tiles-product``, ``tiles-product-tma``, ``tiles-product-rows``, ``tiles-product-columns``: of the distance
   tables' product kernel with a block a program (`PRODUCT_PROGRAMS` "blocks", `PRODUCT_TILES`), with an
   address per element, with tensor-memory stores (`PRODUCT_STORES`), as a loop per row block
   (`PRODUCT_ROW_TILES`) and as a loop per column block (the default, `PRODUCT_COLUMN_TILES`), and
   ``tiles-fold-sums``, ``tiles-fold-product``: of the backward's fold kernels (`FOLD_SUMS_TILES`,
   `FOLD_TILES`);
8. ``dropout``, ``model``, ``latency``, ``long``: the other sections of `attention_gpu.py`.

Each step runs as a child process in its own process group, its output in ``logs/<step>.log``. When its cap
or the budget runs out, or the suite itself is interrupted, the group is stopped: SIGTERM, a grace period,
then SIGKILL to whatever of it is left (ncu's children too). A step is not started with less than its
``min_s`` left. The caps and minimums are estimates; each step's seconds are recorded, to correct them by (on
an H200, 2026-11-26: environment 17 s, targets 92, profile 25, latency 61, gpu-tests 217, tiles-product 29,
model 55 with ``--models`` ours/triton and Hugging Face, tiles-distance 73; docs/gpu-kernel.md, "third
lease"; on an H200, 2026-11-27: environment 19 s, targets 110 with 12 rows, profile 29, gpu-tests 279 (121 tests),
tiles-product-columns 32; "fourth lease"; on an H200, 2026-11-27 again: environment 6–16 s, targets 137 with 13
rows timed per call and queued, profile 31, gpu-tests 289 (123 tests, so its cap went from 300 s to 360);
"fifth lease"; and a third time: environment 16–18 s, tiles-product-columns 40 with 6 shapes timed by kernel,
tiles-fold-sums 20, targets 150 with 15 rows, profile 40, gpu-tests 68 for 30 tests; "sixth lease"). The
benchmark scripts are given ``--budget-s`` a margin short of the time they have, so that they stop between
units and keep everything measured (their results files are rewritten after each unit); a unit stopped all
the same (an ncu profile may take longer than the margin) loses only itself. ``--smoke`` runs each step's
smoke form on the CPU (tiny shapes, Triton's interpreter; the GPU tests collected, not run; the ncu profile
has none), to check the plan before a lease. After each step, ``--out`` receives three files (written
atomically):

* ``gpu_suite.md`` / ``gpu_suite.json``: per step its command, exit status, seconds, whether it was stopped or
  not started, and the end of its log when it failed; then the target checks (``verdicts``) of each results
  file of `attention_gpu.py`, and the outcome of each test of pytest's JUnit XML (``tests``: the counts, and in
  the Markdown the tests that failed with their messages);
* ``gpu_suite.tar.gz``: the working folder (``--work``: empty or new, not holding ``--out``; by default a new
  temp folder): every step's results file (JSON / Markdown, ncu's CSV pages, pytest's JUnit XML) and log;
  packed again only after a step that ran (a step not started changes nothing in it).

Unpack the bundle and copy a results file into ``benchmarks/results/`` (``attention_gpu.py --combine`` joins
its files; ``plot_attention_gpu.py`` draws them).

Usage::

    python benchmarks/gpu_suite.py --list
    python benchmarks/gpu_suite.py --smoke --out /tmp/suite            # the plan on the CPU, before a lease
    python benchmarks/gpu_suite.py --budget-s 540 --out /tmp/gpu       # the whole plan, in order
    python benchmarks/gpu_suite.py --budget-s 300 --steps ncu tiles --out /tmp/gpu

The budget bounds the steps; stopping the last one (up to 10 s) and writing the bundle come on top. Exit
status: 0 when every step ran and succeeded, 1 when one failed or was stopped, 3 when steps were not started
for want of time or a benchmark script left units of its own (``--steps`` runs them in a later lease).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = "benchmarks"
sys.path[:0] = [str(ROOT), str(ROOT / BENCH)]  # the package and the scripts beside this one, from a checkout

from debertakit.convert.checkpoint import atomic_write  # noqa: E402

TARGET_LENGTHS = ["512", "2048", "8192", "16384"]
# the default road (`triton`, the distance road since 2026-11-26) and the same with one setting changed:
# - its distance tables from cuBLAS's matmul (`attention_gpu.CUBLAS_TABLES_ROW`: what `triton_products`' kernel
#   changes), that kernel's rows' ends stored element by element (`attention_gpu.PRODUCT_MASKED_EDGES_ROW`: what
#   storing them whole saves), the two tables in two launches (`attention_gpu.PRODUCT_TWO_LAUNCHES_ROW`: what one
#   launch for both saves a call), the backward's folds a launch a side (`attention_gpu.FOLD_TWO_LAUNCHES_ROW`:
#   what one launch of each fold kernel for both sides saves), the fold sums by cell
#   (`attention_gpu.FOLD_SUMS_BY_CELL_ROW`: whether summing each cell in the kernel beats the per-class sums);
# - the backward's gradients in one band (`attention_gpu.ONE_BAND_GRADIENTS_ROW`: what their bands save at
#   N = 512), stored by cell (`attention_gpu.CELL_STORES_ROW`: what their 16-byte stores save, at N = 512 in
#   bands and from 2048 in one band), the forward's tables kept for the backward
#   (`attention_gpu.KEPT_TABLES_ROW`: what building them again costs, and in memory what keeping them does),
#   the folds' products and sums by cuBLAS (`attention_gpu.FOLD_MATMULS_ROW`: what the fold kernels save), and
#   the sums alone (`attention_gpu.FOLD_SUMS_MATMULS_ROW`);
# - one geometry for all its calls (`attention_gpu.SHARED_GEOMETRY_ROW`: what building it costs a call), the same
#   replayed as a CUDA graph (`attention_gpu.GRAPHED_ROW`: what the host's work costs a call),
#   through the custom op (`attention_gpu.CUSTOM_OP_ROW`: what the op's dispatch costs a call), with Triton's own
#   launch path (`attention_gpu.TRITON_LAUNCH_ROW`: what the shorter one saves a call), without call plans
#   (`attention_gpu.NO_PLANS_ROW`: what replaying a forward from its plan saves a call), under PyTorch's
#   deterministic algorithms (`attention_gpu.DETERMINISTIC_ROW`: what reproducible gradients cost a call), with
#   the forward's tables cut to the saturation (`attention_gpu.FORWARD_REACH_ROW`: fewer cells written against a
#   select per pair in the near tiles; the forward's far tiles in wider blocks, `attention_gpu.FAR_KEYS_ROWS` and
#   `FAR_KEYS_REACH_ROW`, and dQ's, `WIDE_FAR_ROW`, are the forward-settings step's, which times them at more
#   lengths);
# and the other roads. The product kernel's other variants are left to the profile step.
ROADS = [
    "triton",
    "triton (cuBLAS tables)",
    "triton (product edges masked)",
    "triton (tables in two launches)",
    "triton (folds in two launches)",
    "triton (fold sums by cell)",
    "triton (gradients in one band)",
    "triton (gradient stores by cell)",
    "triton (tables kept)",
    "triton (fold matmuls)",
    "triton (fold sums by matmul)",
    "triton (through the custom op)",
    "triton (Triton's launch path)",
    "triton (no call plans)",
    "triton (deterministic algorithms)",
    "triton (forward tables to the saturation)",
    "triton (geometry shared)",
    "triton (CUDA graph)",
    "triton tables",
    "triton skew-forward",
]
CEILINGS = ["triton (no position terms)", "sdpa (no position terms)", "flashdeberta"]
# tile shapes given to all three kernels: the GPU tiles of now and shapes the static report
# (benchmarks/results/triton_static.md) has spill-free, or nearly, for each kernel of the v3 set
SWEEP_TILES = ["64x32w4s2", "128x32w8s2", "32x64w4s2"]
DISTANCE_SWEEP_TILES = [*SWEEP_TILES, "128x64w8s2"]  # and the static choice of the distance forward and dQ
# the distance tables' product kernel (`triton_backend.PRODUCT_TILES`, 64x64 w4, the fastest of these on an H200:
# `benchmarks/results/attention_gpu_h200_7974afd_tiles_product.json`):
# shapes that compile for sm_90 under Triton 3.6 and 3.9 without spills, with 16-byte stores
# (`python tests/attention/compile_triton_kernels.py --product-sweep`, every head dim, bf16 and fp16)
PRODUCT_SWEEP_TILES = ["64x64w4s1", "64x128w8s1", "128x64w8s1", "128x128w8s1", "64x256w8s1"]
# and of its row loop (`triton_backend.PRODUCT_PROGRAMS` "rows", `PRODUCT_ROW_TILES` 64x64 w4 s3): two and three
# stages, larger shapes; spill-free for sm_90 at every head dim (the same script)
PRODUCT_ROW_SWEEP_TILES = ["64x64w4s3", "64x64w4s2", "64x128w8s3", "128x64w8s3", "128x128w8s3"]
# and of its column loop (`PRODUCT_PROGRAMS` "columns", the default, `PRODUCT_COLUMN_TILES` 64x64 w4 s3): the
# same kind of shapes, spill-free for sm_90 at every head dim (the same script). Timed per call on an H200
# (`benchmarks/results/attention_gpu_h200_16dabb5_tiles_product_columns.json`), forward at N = 2048 83.7
# TFLOP/s against 87.4, 84.4 and 87.4, forward+backward 59.3 against 56.6, 63.2 and 72.8 (64x128 w8 s3). The
# product kernel is 0.84 of the 4.87 ms forward+backward there (GPU time), so a 13 TFLOP/s spread is mostly
# not its own: the product sweeps are timed by kernel (`--tile-timer profile`) since. Wider blocks store more
# bytes a loop step: a program's steps wait on their products' and stores' latency (`triton_products`), and at
# 2048 the kernel wrote its two 0.48 GB tables at about 2.3 TB/s (0.41 ms of the forward's 1.17; f3c1fc3's
# profile)
# In the sixth lease 64x64 w4 s2 and 128x128 w8 s3 were slower than the new defaults at both lengths
# (`attention_gpu_h200_6ac7b47_tiles_product_columns.json`) and left the sweep; in came 16 warps on the wide
# block (under Triton 3.6, the GPU image's, 60 registers a thread against 123 at 8 warps, at head dim 64) and two
# stages on it: spill-free at every head dim under Triton 3.6 and 3.9, every store 16 bytes
# (`triton_aot.compile_product_kernel`, both tables in one launch as by default; `python
# tests/attention/compile_triton_kernels.py --product-sweep` under 3.9). Four stages on the narrow block spill at
# head dim 128 under 3.9 (56 bytes) and stay out
PRODUCT_COLUMN_SWEEP_TILES = [
    "64x64w4s3",
    "64x128w8s3",
    "64x128w4s3",
    "64x256w8s3",
    "64x256w8s2",
    "64x256w16s3",
]
# the backward's fold kernels (`triton_backend.FOLD_TILES`, `FOLD_SUMS_TILES`, both 64x64 w4 s3, chosen
# untimed): on an H200 the sums kernel took 0.371 ms at N = 2048 where its matmuls took 0.344, and the product
# kernel 0.325 against 0.362 (`benchmarks/results/attention_gpu_h200_f3c1fc3_profile.json`). A wider column
# block reads the sums' content rows fewer times; more stages hide more of the buffers' latency. Shapes that
# compile for sm_90 without spills at every head dim, for both kernels, with 16-byte reads in their loops
# (`python tests/attention/compile_triton_kernels.py --fold-sweep`)
FOLD_SWEEP_TILES = ["64x64w4s3", "64x64w4s4", "64x128w8s3", "128x64w8s3", "128x128w8s3", "32x128w4s3"]
# the distance road's forward kernel alone, by the stages of its pipeline (`triton_backend.GPU_TILES`: 64x32 w4
# s2). At N = 2048 on an H200 its top stall was waiting on global memory (long_scoreboard, 1.9 cycles per issued
# instruction; 18% occupancy; `benchmarks/results/attention_ncu_h200_6ac7b47.md`) while a near tile's two table
# tiles are fetched one tile ahead. Compiled for sm_90 under Triton 3.6 (the GPU image's), 64x32 w4 with 3
# stages takes 128 registers a thread against 148 with 2 (four programs an SM by registers, not three) and 49
# KiB of shared memory against 33; with 4 stages 150 registers and 66 KiB; 128x32 w8 s3 152 and 74 KiB; all
# spill-free under Triton 3.6 and 3.9 (`triton_aot.compile_kernel`, the v3 set with distance tables). Three
# stages were slower on an H100 on the tables road (2026-11-24, `benchmarks/results/attention_gpu.json`), before
# the distance tables; not yet timed on them
FORWARD_SWEEP_TILES = ["64x32w4s2", "64x32w4s3", "64x32w4s4", "128x32w8s3"]
# the backward's dK/dV kernel alone (`triton_backend.GPU_TILES`: 64x32 w4 s2, queries a step x keys a program,
# timed on an H100 with the other two kernels at the same shape and never swept alone). On an H200 it took 5.36
# ms of a forward+backward's 11.25 at N = 8192 and 1.52 of 4.71 at 2048, against dQ's 2.23 and 0.87 and the
# forward kernel's 2.07 and 0.73 (GPU time, `benchmarks/results/attention_gpu_h200_3896d8b_profile.json`): 2.4
# times dQ, where its instructions a far score are 1.5 times dQ's (a fourth product). A program of 32 keys
# loads a block of q and dO a step, 8 bytes a score at head dim 64; 128 keys take 2. Compiled for sm_90 (the
# v3 set on the distance road, Triton 3.6 / 3.9; `benchmarks/results/triton_static.md`, the three-stage shape by
# `triton_aot.compile_kernel`): registers a thread, spilled bytes, instructions a score in the far / near loop
#   64x32 w4 s2    255 / 255, 16 / 48, 21.6 / 22.6, 32.2 / 31.3 (two 4-warp programs an SM)
#   32x128 w8 s2   232 / 235, none, 21.3 / 22.4, 28.8 / 28.4 (one 8-warp program; the static report's choice)
#   32x128 w8 s3   218 / 225, none, 23.4 / 23.4, 32.0 / 30.6 (90 KiB of shared memory)
#   32x64 w4 s2    226 / 244, none, 22.2 / 22.8, 29.3 / 28.3
#   128x32 w8 s2   192 / 186, none, 23.9 / 24.4, 35.4 / 33.4
# Not swept: 32x128 and 64x64 with 4 warps spill 240-480 and 88-272 bytes, 16x128 w4 104-152; a program's keys
# must divide FAR_PAD (128). The backward's distance tables serve its two kernels' tiles: at 32x128 and 128x32
# they reach further (1345 cells a row against 1217 at N >= 2048); the forward's serve its own
# (`triton_backend._table_layouts`)
DKV_SWEEP_TILES = ["64x32w4s2", "32x128w8s2", "32x128w8s3", "32x64w4s2", "128x32w8s2"]
# a benchmark script is told to start no unit this long before its step's time is up, so that its last unit
# (a length's rows, or one ncu profile, compiles included) can end inside the step and the script write its
# results and exit; a unit stopped all the same loses only itself (results are rewritten after each unit)
UNIT_MARGIN_S = 60.0
LOG_TAIL_LINES = 25  # lines of a failed step's log in the summary
KILL_GRACE_S = 10.0  # between SIGTERM and SIGKILL of a stopped step's group


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of the plan. ``argv`` is built per run: it is given the working folder, the seconds the
    step may take (for a script's own ``--budget-s``) and whether the run is a smoke run (CPU, tiny shapes),
    and returns the command, or None where it has no smoke form."""

    name: str
    why: str
    argv: Callable[[Path, float, bool], list[str] | None]
    cap_s: float  # the longest it may run
    min_s: float  # not started with less than this left
    # a benchmark script given --budget-s, whose exit status 3 means units left for want of time (pytest's 3
    # is an internal error)
    budgeted: bool = False


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def _script_budget(seconds: float) -> str:
    """A benchmark script's own ``--budget-s`` for a step of ``seconds``: short of them by the unit margin, or
    by half where that is less (a step started with little time left still runs a unit or more)."""
    return f"{max(seconds - min(UNIT_MARGIN_S, seconds / 2), 1.0):.0f}"


def _attention_gpu(*args: str, out: str) -> Callable[[Path, float, bool], list[str]]:
    def argv(work: Path, seconds: float, smoke: bool) -> list[str]:
        budget = ["--budget-s", _script_budget(seconds), "--out", str(work / out)]
        return _python(f"{BENCH}/attention_gpu.py", *args, *budget, *(["--smoke"] if smoke else []))

    return argv


def _bench(name: str, why: str, cap_s: float, min_s: float, *args: str, out: str) -> Step:
    """A step running `attention_gpu.py` with ``args``, its results in ``out`` in the working folder."""
    return Step(name, why, _attention_gpu(*args, out=out), cap_s, min_s, budgeted=True)


def _attention_ncu(*args: str, timeout_s: int, name: str) -> Callable[[Path, float, bool], list[str] | None]:
    """A step running `attention_ncu.py` with ``args``, its pages and results named by ``name`` in the working
    folder. No smoke form: a profile needs a GPU's counters (the script's tests run it against a stand-in)."""

    def argv(work: Path, seconds: float, smoke: bool) -> list[str] | None:
        if smoke:
            return None
        return _python(
            f"{BENCH}/attention_ncu.py",
            *args,
            "--timeout-s", str(timeout_s),
            "--budget-s", _script_budget(seconds),
            "--raw-dir", str(work / f"{name}_pages"),
            "--out", str(work / f"attention_{name}.json"),
        )  # fmt: skip

    return argv


_ncu = _attention_ncu(
    "--impls", "triton", "triton tables", "sdpa (no position terms)",
    # 2048, where the targets fail, since the H100 lease: 8192 met them, and dQ took 3.25 ms at 2048 against
    # dK/dV's 1.72 (`benchmarks/results/attention_gpu_h100.json`, profile)
    "--lengths", "512", "2048",
    timeout_s=150, name="ncu",
)  # fmt: skip
_ncu_product = _attention_ncu(
    "--impls", "triton",
    # the distance tables' product alone (a launch a forward and one a backward, each building both tables since
    # `PRODUCT_LAUNCHES` "one": ncu's time per launch is the pair's; four launches of one table before), at its
    # two tile shapes: what holds it at 2.6 TB/s of the H200's 4.8 where a tenth fewer instructions changed
    # nothing (sixth lease)
    "--kernels", "_distance_product_kernel",
    "--lengths", "512", "2048",
    timeout_s=120, name="ncu_product",
)  # fmt: skip
_ncu_backward = _attention_ncu(
    "--impls", "triton",
    # the backward's two attention kernels at 8192, where dK/dV took 5.36 ms against dQ's 2.23 on an H200 (sixth
    # lease's profile) for 1.5 times its instructions a far score: each program streams the other side's blocks
    # from L2 (dK/dV's q and dO, 8 bytes a score at its 64x32 tiles; dQ's K and V, 4), so their L2 throughput
    # against its peak, beside the stalls, says whether bytes, not instructions, set their time
    "--kernels", "_dq_kernel|_dkv_kernel",
    "--lengths", "8192",
    timeout_s=150, name="ncu_backward",
)  # fmt: skip


# Processes for the GPU tests where pytest-xdist imports (the GPU image has it): a test's time is mostly Triton
# compiling its kernels on one core (26 of the 108 tests in 225 s on an H200, 34 in 300 s on an H100, one process),
# and the machines have 16 cores. Four, not more: under `-n 8` six tests once ran out of GPU memory beside each
# other (docs/gpu-kernel.md, "Measured on an H100"); the tests' conftest now empties each process's CUDA cache
# after a test.
TEST_WORKERS = 4


def _workers() -> list[str]:
    """pytest's arguments to run the GPU tests in `TEST_WORKERS` processes, none without pytest-xdist."""
    return ["-n", str(TEST_WORKERS)] if importlib.util.find_spec("xdist") else []


def _pytest(*args: str, xml: str) -> Callable[[Path, float, bool], list[str]]:
    def argv(work: Path, seconds: float, smoke: bool) -> list[str]:
        # without CUDA the GPU tests would only be skipped: a smoke run collects them, in one process
        run = ["--collect-only"] if smoke else _workers()
        return _python("-m", "pytest", *args, "-v", *run, "--junitxml", str(work / xml))

    return argv


def _environment(work: Path, seconds: float, smoke: bool) -> list[str]:
    return _python(f"{BENCH}/gpu_suite.py", "--environment", str(work / "environment.json"))


def _dispatch(work: Path, seconds: float, smoke: bool) -> list[str]:
    """`triton_dispatch.py` on the GPU machine's CPU: the host side of a call with the kernels not launched, to
    set beside the same script's figures on other machines and beside the rows' host time (``fwd_host_ms``),
    which adds the launches. A few seconds; the same in smoke form."""
    return _python(f"{BENCH}/triton_dispatch.py", "--out", str(work / "triton_dispatch.json"))


def _launch_cost(work: Path, seconds: float, smoke: bool) -> list[str]:
    """`triton_launch_cost.py` on the GPU machine's CPU and its Triton: the host time of Triton's own launch path
    per kernel a call launches (binding, specialisation, cache key) and of the backend's shorter one
    (`triton_launch`), the driver's call left out, after checking that both reach the same compiled kernel with
    the same arguments. A few seconds; the same in smoke form."""
    return _python(f"{BENCH}/triton_launch_cost.py", "--out", str(work / "triton_launch_cost.json"))


LENGTHS = ["--lengths", "512", "2048", "8192"]
TARGETS = ["--sections", "attention", "--lengths", *TARGET_LENGTHS, "--impls", *ROADS, *CEILINGS]
# the forward's settings built without a GPU (the distance tables cut to the saturation, the far tiles in wider
# blocks, both; and dQ's far tiles in wider blocks with the forward's, whose forward+backward against the 64-key
# forward row's is dQ's change) beside the default and the ceiling, where far tiles occur (N >= 1024 at v3): a few
# rows, so that a short lease times them first (the targets step keeps the tables' cut among its roads, not the
# far tiles' rows)
FORWARD_SETTINGS = [
    "--sections",
    "attention",
    "--lengths",
    "1024",
    "2048",
    "8192",
    "16384",
    "--impls",
    "triton",
    "triton (forward tables to the saturation)",
    "triton (forward far tiles of 64 keys)",
    "triton (forward far tiles of 128 keys)",
    "triton (forward far tiles of 64 keys, tables to the saturation)",
    "triton (forward and dQ far tiles of 64 keys)",
    "sdpa (no position terms)",
]
TILES = ["--sections", "tiles", *LENGTHS, "--tiles", *SWEEP_TILES]
DISTANCE_TILES = [
    "--sections",
    "tiles",
    "--near-band",
    "distance",
    *LENGTHS,
    "--tiles",
    *DISTANCE_SWEEP_TILES,
]


def _distance_kernel_sweep(kernel: str, lengths: tuple[str, ...] = ("512", "2048")) -> list[str]:
    """The start of a tile sweep of one kernel on the distance road (the tables' product, a fold kernel, the
    forward, dK/dV) at ``lengths``, by default 512 (bands) and 2048 (one band), timed by kernel: each is a share of
    a call (a fold kernel 0.3-0.4 ms of a 4.8 ms call at 2048), often less than rows' per-call times differ. The
    shapes follow."""
    sweep = [
        "--sections",
        "tiles",
        "--tile-timer",
        "profile",
        "--near-band",
        "distance",
        "--tile-kernels",
        kernel,
    ]
    return [*sweep, "--lengths", *lengths, "--tiles"]


PRODUCT_SWEEP = _distance_kernel_sweep("_distance_product_kernel")


def _fold_sweep(kernel: str) -> list[str]:
    """The tile sweep of one fold kernel, the other keeping its tiles."""
    return [*_distance_kernel_sweep(kernel), *FOLD_SWEEP_TILES]


PLAN = [
    Step("environment", "device, clocks, driver and versions the numbers hold for", _environment, 90, 5),
    Step("dispatch", "the host side of a call on this machine's CPU, kernels not launched", _dispatch, 30, 10),
    Step("launch-cost", "Triton's launch path per kernel on this machine's CPU, the driver left out", _launch_cost, 30, 10),
    _bench(
        "forward-settings",
        "the settings untimed so far (the forward's tables cut to the saturation, the forward's and dQ's far "
        "tiles in wider blocks) against the default, from N = 1024",
        140, 50, *FORWARD_SETTINGS, out="attention_gpu_forward_settings.json",
    ),
    _bench(
        "targets",
        "the issue's targets per near-band road against sdpa and flashdeberta; which road is the default",
        240, 90, *TARGETS, out="attention_gpu_targets.json",
    ),
    _bench(
        "profile",
        "GPU time per kernel of the triton rows: the fused kernels against the products around them",
        150, 60, "--sections", "profile", *LENGTHS, out="attention_gpu_profile.json",
    ),
    Step(
        "gpu-tests",
        "the grid at real sizes on every road, dropout, CUDA graphs (the kernels', the served model's), no host "
        "syncs, N = 65536",
        _pytest("-m", "gpu", "tests/attention", "tests/inference", xml="gpu_tests.xml"),
        360,
        120,
    ),
    Step("ncu", "what the kernels wait on at N = 512 (near tiles) and 2048 (both)", _ncu, 240, 100, budgeted=True),
    Step(
        "ncu-product", "what the tables' product kernel is held by (memory, L2, stores, issue) at 512 and 2048",
        _ncu_product, 150, 70, budgeted=True,
    ),
    Step(
        "ncu-backward", "what the backward's dQ and dK/dV kernels are held by at 8192 (L2's share of peak, stalls)",
        _ncu_backward, 180, 90, budgeted=True,
    ),
    _bench(
        "folds",
        "the backward's four fold products at the padded row stride and the unpadded one: whether it pays",
        90, 30, "--sections", "folds", "--lengths", "512", "4096", out="attention_gpu_folds.json",
    ),
    _bench(
        "tiles", "tile shapes on the tables road (GPU_TILES)", 180, 90, *TILES, out="attention_gpu_tiles.json"
    ),
    _bench(
        "tiles-distance", "tile shapes on the distance road", 180, 90, *DISTANCE_TILES,
        out="attention_gpu_tiles_distance.json",
    ),
    _bench(
        "tiles-forward", "the distance road's forward kernel by the stages of its pipeline (GPU_TILES)",
        120, 60, *_distance_kernel_sweep("_fwd_kernel"), *FORWARD_SWEEP_TILES, out="attention_gpu_tiles_forward.json",
    ),
    _bench(
        "tiles-dkv", "the backward's dK/dV kernel alone by its tile shape (GPU_TILES), at 2048 and 8192, where it took "
        "a third and half of a forward+backward's GPU time", 180, 60,
        *_distance_kernel_sweep("_dkv_kernel", ("2048", "8192")), *DKV_SWEEP_TILES,
        out="attention_gpu_tiles_dkv.json",
    ),
    _bench(
        "tiles-product", "tile shapes of the distance tables' product kernel, a block a program (PRODUCT_TILES)",
        120, 60, *PRODUCT_SWEEP, *PRODUCT_SWEEP_TILES, "--product-programs", "blocks",
        out="attention_gpu_tiles_product.json",
    ),
    _bench(
        "tiles-product-tma", "the same shapes with the product kernel's tensor-memory stores (PRODUCT_STORES)",
        120, 60, *PRODUCT_SWEEP, *PRODUCT_SWEEP_TILES, "--product-programs", "blocks", "--product-stores", "tma",
        out="attention_gpu_tiles_product_tma.json",
    ),
    _bench(
        "tiles-product-rows", "shapes of the product kernel's row loop (PRODUCT_PROGRAMS rows, PRODUCT_ROW_TILES)",
        120, 60, *PRODUCT_SWEEP, *PRODUCT_ROW_SWEEP_TILES, "--product-programs", "rows",
        out="attention_gpu_tiles_product_rows.json",
    ),
    _bench(
        "tiles-product-columns",
        "shapes of the product kernel's column loop (PRODUCT_PROGRAMS columns, PRODUCT_COLUMN_TILES)", 120, 60,
        *PRODUCT_SWEEP, *PRODUCT_COLUMN_SWEEP_TILES, "--product-programs", "columns",
        out="attention_gpu_tiles_product_columns.json",
    ),
    _bench(
        "tiles-fold-sums", "tile shapes of the backward's fold sums kernel (FOLD_SUMS_TILES)", 120, 60,
        *_fold_sweep("_fold_sums_kernel"), out="attention_gpu_tiles_fold_sums.json",
    ),
    _bench(
        "tiles-fold-product", "tile shapes of the backward's fold product kernel (FOLD_TILES)", 120, 60,
        *_fold_sweep("_fold_product_kernel"), out="attention_gpu_tiles_fold_product.json",
    ),
    _bench(
        "dropout", "the roads in training with dropout 0.1", 150, 60, "--sections", "dropout", *LENGTHS,
        out="attention_gpu_dropout.json",
    ),
    _bench(
        "model", "whole-model tokens/s (v3-base shape) and packed batches: the GPU's default road against Hugging "
        "Face", 240, 90, "--sections", "model", "packed", "--models", "ours/triton", "hf eager",
        out="attention_gpu_model.json",
    ),
    _bench(
        "latency", "one request's latency and the attention layer's training call at N = 512: host time per "
        "operator and function, GPU syncs", 120, 45,
        "--sections", "latency", out="attention_gpu_latency.json",
    ),
    _bench(
        "long", "batch 1 at N = 16384 ... 65536: runs, memory linear in N", 150, 60, "--sections", "long",
        out="attention_gpu_long.json",
    ),
]  # fmt: skip
STEPS = {step.name: step for step in PLAN}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--budget-s",
        type=float,
        default=540.0,
        help="seconds for the whole plan: a step running when they are spent is stopped, and none starts "
        "with less than its least time left",
    )
    p.add_argument(
        "--steps", nargs="+", default=None, help=f"run these, in this order (default: all of {list(STEPS)})"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="where the summary and the bundle go (required to run)"
    )
    p.add_argument("--work", type=Path, default=None, help="the working folder (default: a new temp folder)")
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="each step's smoke form on the CPU (tiny shapes, Triton's interpreter; the GPU tests collected, "
        "not run): checks the plan before a lease, its timings mean nothing",
    )
    p.add_argument("--environment", type=Path, default=None, help=argparse.SUPPRESS)  # the first step's child
    args = p.parse_args(argv)
    unknown = [name for name in args.steps or [] if name not in STEPS]
    if unknown:
        p.error(f"unknown step(s) {unknown}; expected some of {list(STEPS)}")
    if args.budget_s <= 0:
        p.error(f"--budget-s must be positive, got {args.budget_s}")
    if args.out is None and not (args.list or args.environment):
        p.error(
            "--out is required: the folder that receives gpu_suite.md, gpu_suite.json and gpu_suite.tar.gz"
        )
    return args


# ---------------------------------------------------------------------------------------------- environment
def _command_output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"error: {err}"
    return (done.stdout or done.stderr).strip()


def environment() -> dict:
    """What the numbers of this run hold for: the GPU benchmark's record of the machine and versions
    (`attention_gpu.environment`), the GPU as nvidia-smi reports it (driver, clocks, power limit), Nsight
    Compute, and the kernels' code (the static report's hash of it, which holds where the checkout travelled
    without its git history)."""
    import attention_gpu
    import attention_ncu
    import torch
    import triton_static

    env = attention_gpu.environment("cuda" if torch.cuda.is_available() else "cpu")
    env.update(
        cpus=os.cpu_count(),
        kernel_source_hash=triton_static.kernel_source_hash(),
        kernel_sources=triton_static.kernel_sources(),  # per kernel, as the static report keys its rows
        git_commit=_command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        nvidia_smi=_command_output(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit",
                "--format=csv",
            ]
        ),
    )
    ncu = attention_ncu.find_ncu(None)
    env["ncu"] = ncu and {"path": ncu, "version": _command_output([ncu, "--version"])}
    return env


# -------------------------------------------------------------------------------------------------- running
def shown(argv: list[str]) -> str:
    """The command as a reader would type it: ``python`` for this interpreter's path."""
    return shlex.join(["python" if argv[0] == sys.executable else argv[0], *argv[1:]])


def run_step(argv: list[str], log: Path, timeout_s: float) -> tuple[int | None, float, bool]:
    """Runs ``argv`` from the repository's root in a process group of its own, its output into ``log``; past
    ``timeout_s`` the whole group is stopped (`_stop_group`). Returns (exit status, seconds, stopped)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with log.open("w") as sink:
        sink.write(f"$ {shown(argv)}\n")
        sink.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout_s)
            stopped = False
        except subprocess.TimeoutExpired:
            stopped = True
            rc = _stop_group(proc)
            sink.write(f"\n[gpu_suite] stopped after {timeout_s:.0f} s\n")
        except BaseException:  # the suite itself interrupted: its step must not run on unseen
            _stop_group(proc)
            raise
    return rc, time.monotonic() - began, stopped


def _stop_group(proc: subprocess.Popen) -> int | None:
    """SIGTERM to the step's process group, a grace period for its leader to write what it measured, then
    SIGKILL to whatever of the group is left (children that ignore SIGTERM, or outlive their parent)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=KILL_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group is gone
        pass
    return proc.wait()


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


def run_plan(
    steps: list[Step],
    work: Path,
    budget_s: float,
    report: Callable[[list[dict], bool], None] = lambda records, ran: None,
    smoke: bool = False,
) -> list[dict]:
    """Runs ``steps`` in order inside ``budget_s`` seconds (their smoke forms with ``smoke``); one record per
    step (skipped ones too), ``report`` called with the records so far after each step and whether that step
    ran (whether the work folder may have changed)."""
    began = time.monotonic()
    records: list[dict] = []
    for number, step in enumerate(steps, 1):
        left = budget_s - (time.monotonic() - began)
        timeout = min(step.cap_s, left)
        argv = step.argv(work, timeout, smoke) if left >= step.min_s else None
        record: dict = {"step": step.name, "why": step.why}
        if left < step.min_s:
            record.update(status="not started", reason=f"{left:.0f} s left, needs {step.min_s:.0f}")
        elif argv is None:
            record.update(status="no smoke form", reason="needs a GPU")
        else:
            print(f"[{number}/{len(steps)}] {step.name} (up to {timeout:.0f} s): {shown(argv)}", flush=True)
            record.update(_execute(step, argv, work / "logs" / f"{step.name}.log", timeout))
        outcome = record.get("reason") or f"rc {record['rc']}, {record['seconds']:.0f} s"
        left = budget_s - (time.monotonic() - began)
        print(
            f"[{number}/{len(steps)}] {step.name}: {record['status']} ({outcome}; {left:.0f} s left)",
            flush=True,
        )
        records.append(record)
        report(records, "rc" in record)
    return records


def _execute(step: Step, argv: list[str], log: Path, timeout: float) -> dict:
    """Runs one step's command (`run_step`): its record's command, exit status, seconds, status and log (with
    the log's end where it failed)."""
    rc, seconds, stopped = run_step(argv, log, timeout)
    left_units = step.budgeted and rc == 3
    status = "stopped" if stopped else "ok" if rc == 0 else "left units" if left_units else "failed"
    record = dict(
        command=shown(argv), rc=rc, seconds=round(seconds, 1), status=status, log=f"logs/{log.name}"
    )
    if status not in ("ok", "left units"):
        record["log_tail"] = _tail(log)
    return record


# ------------------------------------------------------------------------------------------------- outputs
def verdicts(work: Path) -> dict[str, list[str]]:
    """The target checks each `attention_gpu.py` results file in ``work`` holds (its ``verdicts``), by file:
    what a lease found, readable in the summary without unpacking the bundle."""
    found = {}
    for path in sorted(work.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):  # being written by a step stopped mid-way: the bundle has it
            continue
        if isinstance(data, dict) and data.get("verdicts"):
            found[path.name] = list(data["verdicts"])
    return found


TEST_OUTCOMES = ("passed", "failure", "error", "skipped")


def test_results(work: Path) -> dict[str, dict]:
    """What each pytest JUnit XML file in ``work`` holds, by file: the count of each outcome
    (`TEST_OUTCOMES`) and every test's ``test`` (module::name), ``status`` and ``seconds``, with the message of
    a test that did not pass (cut to 400 characters) - the form of the committed
    ``benchmarks/results/gpu_tests_*.json``. A file a stopped step left torn is left out (the bundle has it)."""
    found = {}
    for path in sorted(work.glob("*.xml")):
        try:
            root = ElementTree.parse(path).getroot()
        except (OSError, ElementTree.ParseError):
            continue
        summary, tests = dict.fromkeys(TEST_OUTCOMES, 0), []
        for case in root.iter("testcase"):
            test = {"test": f"{case.get('classname')}::{case.get('name')}", "status": "passed"}
            test["seconds"] = float(case.get("time") or 0.0)
            for child in case:
                if child.tag in TEST_OUTCOMES:
                    test.update(status=child.tag, message=(child.get("message") or "")[:400])
            summary[test["status"]] += 1
            tests.append(test)
        found[path.name] = {"summary": summary, "tests": tests}
    return found


def _tests_md(name: str, result: dict) -> list[str]:
    """A JUnit file's counts and the tests that failed or errored, with their messages."""
    counts = ", ".join(f"{n} {outcome}" for outcome, n in result["summary"].items())
    bad = [t for t in result["tests"] if t["status"] in ("failure", "error")]
    return ["", f"## Tests of `{name}`: {counts}", *([""] if bad else [])] + [
        f"- {t['status']}: `{t['test']}`: {t['message']}" for t in bad
    ]


def summary_md(
    records: list[dict],
    budget_s: float,
    pending: list[str],
    checks: dict[str, list[str]] | None = None,
    tests: dict[str, dict] | None = None,
) -> str:
    lines = [
        f"# GPU suite, {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        f"Budget {budget_s:.0f} s. Results and logs: `gpu_suite.tar.gz`.",
        "",
        "| step | status | rc | seconds | decides |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['step']} | {r['status']}{' (' + r['reason'] + ')' if 'reason' in r else ''} | "
            f"{r.get('rc', '')} | {r.get('seconds', '')} | {r['why']} |"
        )
    lines += [f"| {name} | not reached | | | {STEPS[name].why} |" for name in pending]
    for r in records:
        if "command" in r:
            lines += ["", f"`{r['step']}`: `{r['command']}`"]
        if r.get("log_tail"):
            lines += ["", "```", r["log_tail"], "```"]
    for name, lines_of_file in (checks or {}).items():
        lines += ["", f"## Verdicts of `{name}`", "", *(f"- {line}" for line in lines_of_file)]
    for name, result in (tests or {}).items():
        lines += _tests_md(name, result)
    return "\n".join(lines) + "\n"


def write_outputs(
    out: Path, work: Path, records: list[dict], budget_s: float, pending: list[str], bundle: bool = True
) -> None:
    """The summary (JSON and Markdown) and, with ``bundle``, the bundle of ``work``, each written atomically
    into ``out``. A step not started changes nothing in ``work``: its record needs the summary alone. (On an
    H200 lease of 2026-11-26 each rewrite of a bundle holding six ncu reports took about 9 s, and five steps
    not started after the budget ran out rewrote it five times, past the lease's end.)"""
    out.mkdir(parents=True, exist_ok=True)
    checks, tests = verdicts(work), test_results(work)
    data = {
        "budget_s": budget_s,
        "steps": records,
        "not_reached": pending,
        "verdicts": checks,
        "tests": tests,
    }
    atomic_write(out / "gpu_suite.json", lambda p: Path(p).write_text(json.dumps(data, indent=1) + "\n"))
    md = summary_md(records, budget_s, pending, checks, tests)
    atomic_write(out / "gpu_suite.md", lambda p: Path(p).write_text(md))

    def pack(path: str) -> None:
        # the fastest gzip level: ncu's reports are compressed already, and the bundle is written after each step
        with tarfile.open(path, "w:gz", compresslevel=1) as tar:
            tar.add(work, arcname="gpu_suite")

    if bundle:
        atomic_write(out / "gpu_suite.tar.gz", pack)


def _work_folder(work: Path | None, out: Path) -> Path:
    """The steps' folder, absolute (the steps run from the repository's root): a new temp folder, or ``work``,
    which must be empty (a results file of another run would be bundled and its verdicts summarised as this
    run's) and must not hold ``out`` (each bundle would hold the one before)."""
    if work is None:
        return Path(tempfile.mkdtemp(prefix="gpu-suite-"))
    work = work.resolve()
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"--work {work}: not empty; give an empty or new folder")
    if out.resolve().is_relative_to(work):
        raise SystemExit(f"--out {out} lies inside --work {work}: the bundle would take in its own outputs")
    work.mkdir(parents=True, exist_ok=True)
    return work


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.environment is not None:
        args.environment.write_text(json.dumps(environment(), indent=1) + "\n")
        return 0
    steps = [STEPS[name] for name in args.steps] if args.steps else PLAN
    if args.list:
        for step in steps:
            print(f"{step.name:15} cap {step.cap_s:4.0f} s, min {step.min_s:4.0f} s: {step.why}")
            argv = step.argv(Path("WORK"), step.cap_s, args.smoke)
            print(f"{'':15} {'(no smoke form)' if argv is None else shown(argv)}")
        return 0
    work = _work_folder(args.work, args.out)
    names = [step.name for step in steps]

    def report(records: list[dict], ran: bool = True) -> None:
        write_outputs(args.out, work, records, args.budget_s, names[len(records) :], bundle=ran)

    report([])  # --out writable before any step; then after each step (`run_plan`)
    records = run_plan(steps, work, args.budget_s, report, smoke=args.smoke)
    print(f"\nwrote {args.out}/gpu_suite.md, gpu_suite.json and gpu_suite.tar.gz (the folder {work})")
    statuses = {r["status"] for r in records}
    if statuses & {"failed", "stopped"}:
        return 1
    return 3 if statuses & {"not started", "left units"} else 0


if __name__ == "__main__":
    sys.exit(main())
