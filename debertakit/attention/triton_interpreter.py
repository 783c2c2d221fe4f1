"""Triton's interpreter (``TRITON_INTERPRET=1``), as the `triton` backend's CPU tests run its kernels: a check
that the installed Triton and NumPy can run them, and three patches of the interpreter, installed before the
kernels are first imported (`prepare`, from `triton_backend`): bfloat16 rounded to nearest as on the GPU, the
language patched once per launch, and no overflow checks whose result is discarded. Each patch is the
process's and idempotent; none changes what a compiled kernel does.
"""

from __future__ import annotations

import os

import torch

from debertakit.attention.triton_launch import minor_release


def prepare() -> None:
    """Check and patch the interpreter where it is on (``TRITON_INTERPRET=1``); nothing otherwise."""
    if not interpreter_enabled():
        return
    import numpy
    import triton

    check_interpreter(triton.__version__, numpy.__version__)
    round_bfloat16_to_nearest_in_interpreter()
    patch_the_language_once_per_launch_in_interpreter()
    skip_the_discarded_overflow_checks_in_interpreter()


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_interpreter(triton_version: str, numpy_version: str) -> None:
    """Triton's interpreter before 3.7 returns a reduction as a one-element array, and NumPy 2.4 and later refuse
    to turn that into a loop bound: every call would fail deep inside the interpreter (Triton 3.6.0 fails with
    NumPy 2.4.0 and runs with 2.3.5; Triton 3.7.1 runs with either). Compiled kernels are not affected."""
    if minor_release(triton_version) < (3, 7) and minor_release(numpy_version) >= (2, 4):
        raise RuntimeError(
            f"the triton backend under TRITON_INTERPRET=1 needs Triton >= 3.7 or NumPy < 2.4: Triton "
            f"{triton_version}'s interpreter cannot run its loops with NumPy {numpy_version}"
        )


def round_bfloat16_to_nearest_in_interpreter() -> None:
    """Make Triton's interpreter round float32 to bfloat16 to nearest even, as the GPU does (``cvt.rn``, the
    default of ``tensor.to`` and of a store). The interpreter truncates instead, toward zero: its ``cast_impl``
    converts that pair of types with no rounding mode (Triton 3.6 and 3.9, the releases checked), so every 16-bit
    rounding the kernels do (probabilities before P·V, score gradients, the outputs) erred by up to one bfloat16
    step under the interpreter, twice the GPU's half step, and the interpreted results were further from `eager`
    than the GPU's. Other conversions are left to the interpreter (float16 rounds to nearest there already). The
    patch is the process's: every kernel it interprets rounds so. Idempotent."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "rounds_to_nearest", False):
        return
    truncating = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.array(src.data, dtype=np.float32)).to(torch.bfloat16)
            # the interpreter holds bfloat16 as its bits, uint16
            return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return truncating(self, src, dst_type)

    cast_impl.rounds_to_nearest = True
    builder.cast_impl = cast_impl


def patch_the_language_once_per_launch_in_interpreter() -> None:
    """Make Triton's interpreter patch ``triton.language`` once per kernel launch, not again at every call of a
    ``@triton.jit`` helper inside the kernel.

    The interpreter runs a kernel's Python with ``tl``'s builtins swapped for NumPy ones (``_patch_lang``: an
    ``inspect.getmembers`` over ``tl``, ``tl.tensor``, ``tl.math`` and more, about 0.2 ms on this project's
    2-core test machine; 0.4 ms over ``tl`` and ``tl.core``). A launch patches the language modules its
    kernel's globals hold and, at its end, restores them. A helper's call patches those its own globals hold
    again, and drops its record of what it replaced (nothing restores it). Our kernels call helpers inside
    their loops, thousands of times a launch: our own (a forward+backward of 16 tokens took 2.0-2.6 s in the
    interpreter, 1.2-1.4 s with this patch; a fresh clone's default test run, 731 s before, took 494 s with it
    and the CPU kernel's lighter build, docs/test-times.md) and Triton's standard library (``tl.cdiv``,
    ``tl.zeros``, ``tl.max``, ``tl.sum``, ...), whose module holds ``tl.core`` as well as ``tl``, so that a
    launch's patch of ``tl`` alone did not cover them: 1500 of a bfloat16 forward+backward's 1507 patches were theirs, until the
    launch's patch covered ``tl.core`` too (the bfloat16 grid and the fold kernels' tests, 39, then took 64 s
    instead of 84).

    The patched ``_patch_lang`` patches, at a launch, both language modules, ``tl`` and ``tl.core`` (what
    ``_patch_lang`` does for a function whose globals hold both), and lets every call made while that launch
    runs (a helper's) go without patching; the launch's end restores as before, after a failed launch too
    (the interpreter restores in a ``finally``). Launches do not nest. Triton 3.6 to 3.9 (the releases
    checked) have ``_LangPatchScope``; earlier ones patch for good and are left as they are. The patch is the
    process's. Idempotent."""
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang = interpreter._patch_lang
    if getattr(patch_lang, "once_per_launch", False) or not hasattr(interpreter, "_LangPatchScope"):
        return

    class _SeesBothLanguageModules:  # what `_patch_lang` reads of a function: the modules its globals hold
        __globals__ = {"tl": tl, "core": tl.core}

    launch_in_place = False

    def once_per_launch(fn):
        nonlocal launch_in_place
        if launch_in_place:  # a helper's call inside a launch: everything is patched already
            return interpreter._LangPatchScope()  # nothing to do, nothing to restore
        scope = patch_lang(_SeesBothLanguageModules)
        launch_in_place = True
        restore = scope.restore

        def restore_at_the_launch_s_end():
            nonlocal launch_in_place
            launch_in_place = False
            restore()

        scope.restore = restore_at_the_launch_s_end
        return scope

    once_per_launch.once_per_launch = True
    interpreter._patch_lang = once_per_launch


def skip_the_discarded_overflow_checks_in_interpreter() -> None:
    """Stop Triton's interpreter computing integer-overflow checks whose result it throws away.

    The interpreter's options (``InterpreterOptions``, Triton 3.6 and 3.9) have ``sanitize_overflow`` on and
    ``debug`` off, and nothing sets either. With the first, every 32-bit integer ``+``, ``-`` and ``*`` of a kernel
    (its index and pointer arithmetic) is done again in 64 bits, compared with the type's bounds, and handed to
    ``device_assert``, which returns at once without ``debug``, the comparison unread (as compiled code does: the
    check is emitted only in debug builds). Kernels compute the same values without it: the arithmetic itself
    is the same NumPy operation either way. Without it the bfloat16 grid and the fold kernels' tests (39) took 39 s
    instead of 64. Left on where ``debug`` is on, where the check would be read. The patch is the
    process's. Idempotent."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if builder.options.sanitize_overflow and not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
