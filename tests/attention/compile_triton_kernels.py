"""Compile the `triton` backend's kernels for NVIDIA targets without a GPU: Python AST -> Triton IR -> LLVM -> PTX ->
cubin with the ptxas that ships with Triton. Catches what the CPU interpreter cannot (globals that are not
constexpr, type mismatches between branches, unsupported ops, shared-memory overflow).

Run in a process where TRITON_INTERPRET is not set (the kernels must be JIT functions)::

    python tests/attention/compile_triton_kernels.py          # the default configuration, bf16, d 64, sm_90
    python tests/attention/compile_triton_kernels.py --all    # dtypes × head dims × feature flags, sm_90 (+ sm_80)
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from debertakit.attention import triton_kernels as K  # noqa: E402
from debertakit.attention.triton_backend import _blocks  # noqa: E402

INT_POINTERS = {"LUT", "QPOS", "KPOS", "QSEG", "KSEG", "KMASK", "KV_LO", "KV_HI", "Q_LO", "Q_HI"}
F32_POINTERS = {"ROW", "COL", "LSE", "DELTA", "DQ", "DK", "DV", "DQ_DIST", "DK_DIST"}
INTS = {"H", "NQ", "NK", "R", "SAT"}
KERNELS = (K._fwd_kernel, K._dq_kernel, K._dkv_kernel)


def signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in INT_POINTERS:
            sig[name] = "*i32"
        elif name in F32_POINTERS:
            sig[name] = "*fp32"
        elif name in INTS:
            sig[name] = "i32"
        elif name == "scale":
            sig[name] = "fp32"
        else:  # Q K V DO OUT: the input dtype
            sig[name] = "*" + dtype
    return sig


def compile_one(fn, dtype: str, head_dim: int, flags: dict, capability: int) -> None:
    bm, bn, warps, stages = _blocks(torch.device("cuda"), head_dim)
    prec = 1 if dtype == "fp32" else 0
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, PREC=prec, **flags)
    src = ASTSource(fn, signature(fn, dtype, constexprs), constexprs=constexprs)
    compiled = triton.compile(
        src, target=GPUTarget("cuda", capability, 32), options=dict(num_warps=warps, num_stages=stages)
    )
    assert compiled.asm.get("cubin"), f"{fn.__name__}: no cubin"


def configurations(everything: bool):
    names = ("HAS_ROW", "HAS_COL", "HAS_SEG", "HAS_KMASK", "CAUSAL")
    if not everything:
        yield "bf16", 64, dict.fromkeys(names, True), 90
        return
    flag_sets = [dict(zip(names, bits)) for bits in itertools.product((False, True), repeat=5)]
    flag_sets = flag_sets[::8] + flag_sets[-1:]  # a spread of feature combinations, plus all of them on
    for dtype, head_dim in (("bf16", 64), ("fp16", 128), ("fp32", 32), ("bf16", 16)):
        for flags in flag_sets:
            yield dtype, head_dim, flags, 90
        yield dtype, head_dim, flag_sets[-1], 80


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compile the triton kernels for NVIDIA targets")
    parser.add_argument("--all", action="store_true")
    args = parser.parse_args(argv)
    if triton.knobs.runtime.interpret:
        raise SystemExit("unset TRITON_INTERPRET: the kernels must be JIT functions to be compiled")
    n = 0
    for dtype, head_dim, flags, capability in configurations(args.all):
        for fn in KERNELS:
            compile_one(fn, dtype, head_dim, flags, capability)
            n += 1
    print(f"compiled {n} kernels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
