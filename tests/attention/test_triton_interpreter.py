"""`triton_interpreter`: the check of Triton and NumPy releases, and the interpreter's three patches, each
against the interpreter as Triton ships it. Runs in a process with ``TRITON_INTERPRET=1`` (set below before any
kernel is defined), skipped where CUDA runs the kernels compiled."""

from __future__ import annotations

import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip(
        "the interpreter's checks and patches: the kernels run compiled here", allow_module_level=True
    )
os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("TRITON_INTERPRET is set and not 1", allow_module_level=True)

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from debertakit.attention import triton_interpreter  # noqa: E402


def test_interpreter_versions_that_cannot_run_the_kernels_are_named():
    with pytest.raises(RuntimeError, match="needs Triton >= 3.7 or NumPy < 2.4: Triton 3.6.0.*NumPy 2.4.0"):
        triton_interpreter.check_interpreter("3.6.0", "2.4.0")
    for triton_version, numpy_version in (("3.6.0", "2.3.5"), ("3.7.1", "2.5.5"), ("3.10.0+git1", "2.4.6")):
        triton_interpreter.check_interpreter(triton_version, numpy_version)
    with pytest.raises(RuntimeError, match="Triton 3.6rc1"):  # not read as minor 61
        triton_interpreter.check_interpreter("3.6rc1", "2.4.0")


@triton.jit
def _store_as_bfloat16(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    tl.store(Y + offs, x)  # the store converts
    tl.store(Y + BLOCK + offs, (x * 1.0).to(tl.bfloat16))  # an explicit conversion
    tl.store(Y + 2 * BLOCK, tl.sum(x, 0).to(tl.bfloat16))  # a scalar


def test_interpreter_rounds_float32_to_bfloat16_to_nearest_like_the_gpu():
    """`round_bfloat16_to_nearest_in_interpreter` (installed with the kernels): float32 -> bfloat16 in the
    interpreter rounds to nearest even, as the GPU and PyTorch do, not toward zero as the interpreter on its
    own does; NaN and infinity stay what they are."""
    triton_interpreter.prepare()
    x = torch.randn(256, generator=torch.Generator().manual_seed(0))
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.0e38])
    y = torch.empty(2 * 256 + 1, dtype=torch.bfloat16)
    _store_as_bfloat16[(1,)](x, y, BLOCK=256)
    want = x.to(torch.bfloat16)
    for got in (y[:256], y[256:512]):
        assert torch.equal(got[4:], want[4:]) and got[0].isnan() and torch.equal(got[1:4], want[1:4])
    assert y[512].isnan()  # the sum holds the NaN
    truncated = (x[4:].view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert not torch.equal(want[4:], truncated)  # the two roundings differ on these values


@triton.jit
def _plus(x, step: tl.constexpr):
    return x + 1 // step  # a zero step: a Python error inside the launch, under the interpreter


@triton.jit
def _add_in_a_loop(X, TIMES: tl.constexpr, STEP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    for _ in range(TIMES):
        x = _plus(x, STEP)  # a helper's call, which Triton's interpreter patches the language for again
        # and Triton's own helpers (module `tl.standard`: it holds `tl.core` as well as `tl`)
        x = tl.maximum(x, tl.zeros_like(x))
    tl.store(X + offs, x)


def test_interpreter_patches_the_language_once_per_launch(monkeypatch):
    """`patch_the_language_once_per_launch_in_interpreter` (installed with the kernels): a launch patches
    ``triton.language`` and ``tl.core`` once, not again at each of its helper calls (ours, or the standard
    library's, whose module holds ``tl.core`` as well as ``tl``); its end restores Triton's own builtins, after a failed launch
    too, and the next launch patches afresh and runs."""
    from triton.runtime import interpreter

    triton_interpreter.prepare()
    patches = []
    patch_builtin = interpreter._patch_builtin

    def counted(pkg, *args):
        patches.append(pkg)
        return patch_builtin(pkg, *args)

    monkeypatch.setattr(interpreter, "_patch_builtin", counted)
    x = torch.zeros(16)
    _add_in_a_loop[(2,)](x, TIMES=5, STEP=1, BLOCK=16)
    assert torch.equal(x, torch.full((16,), 10.0))  # two programs, five helper calls each
    # Triton's interpreter alone: 30 and 20; with only what a launch's kernel sees (`tl`) counted in place, 21
    # and 20 (each call of `zeros_like` and of the `zeros` it calls patched both)
    assert [pkg is tl for pkg in patches].count(True) == 1
    assert [pkg is tl.core for pkg in patches].count(True) == 1
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)  # restored
    assert tl.core.is_builtin(tl.core.load) and tl.core.is_builtin(tl.core.full)
    with pytest.raises(Exception, match="division"):
        _add_in_a_loop[(1,)](x, TIMES=2, STEP=0, BLOCK=16)
    assert tl.core.is_builtin(tl.load)
    _add_in_a_loop[(1,)](x, TIMES=1, STEP=1, BLOCK=16)  # patched again: Triton's builtins run only compiled
    assert torch.equal(x, torch.full((16,), 11.0))
    assert [pkg is tl for pkg in patches].count(True) == 3
    assert [pkg is tl.core for pkg in patches].count(True) == 3


def test_interpreter_patches_nothing_for_a_helper_inside_a_launch_and_again_at_the_next_launch():
    """Inside a launch a helper's call patches nothing, whichever language modules its globals hold (``tl.core``
    beside ``tl``, as the standard library's ``tl.cdiv``, or ``tl.core`` alone); after the launch's end the next launch patches again. (A
    count of patches in place that a helper's call raised and nothing lowered once had every later launch skip
    its patching and fail on its first builtin, "Did you forget to add @triton.jit ?".)"""
    from triton.runtime import interpreter

    triton_interpreter.prepare()

    def launch():  # a kernel of this module: its globals hold ``tl``
        pass

    standard = type(launch)(launch.__code__, {"tl": tl, "core": tl.core}, "standard")  # as `tl.cdiv`'s module
    helper = type(launch)(launch.__code__, {"core": tl.core}, "helper")
    scope = interpreter._patch_lang(launch)
    try:
        assert scope._changes and not tl.core.is_builtin(tl.core.load)  # the launch patches `tl.core` too
        assert not any(interpreter._patch_lang(fn)._changes for fn in (standard, helper, launch))
    finally:
        scope.restore()
    assert tl.core.is_builtin(tl.core.load) and tl.core.is_builtin(tl.load)
    for fn in (standard, helper, launch):  # a call with nothing in place is a launch, and patches
        again = interpreter._patch_lang(fn)
        try:
            assert again._changes
        finally:
            again.restore()
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)


@triton.jit
def _square_plus_in_int32(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    tl.store(Y + offs, x * x + x)  # 32-bit integer arithmetic that overflows for |x| > 46340


def test_interpreter_skips_only_overflow_checks_it_would_not_read(monkeypatch):
    """`skip_the_discarded_overflow_checks_in_interpreter` (installed with the kernels) turns the interpreter's
    ``sanitize_overflow`` off where ``debug`` is off: there the check's result was thrown away (an overflow ran
    through, wrapped), and results are the same without it; where ``debug`` is on the check is read (an
    overflow raises) and the patch leaves it on."""
    import dataclasses

    from triton.runtime import interpreter

    triton_interpreter.prepare()
    builder = interpreter.interpreter_builder
    assert not builder.options.sanitize_overflow and not builder.options.debug
    x = torch.tensor([0, 3, -7, 46340, 46341, 70000, -(2**31) + 5, 2**31 - 1], dtype=torch.int32)
    want = x * x + x  # torch's int32 arithmetic wraps, as the GPU's does
    y = torch.empty_like(x)
    _square_plus_in_int32[(1,)](x, y, BLOCK=8)
    assert torch.equal(y, want)
    checked = dataclasses.replace(builder.options, sanitize_overflow=True)
    monkeypatch.setattr(builder, "options", checked)  # Triton's own options: checked, the check unread
    y.zero_()
    _square_plus_in_int32[(1,)](x, y, BLOCK=8)
    assert torch.equal(y, want)
    monkeypatch.setattr(builder, "options", dataclasses.replace(checked, debug=True))
    with pytest.raises(Exception, match="overflow"):
        _square_plus_in_int32[(1,)](x, y, BLOCK=8)
    triton_interpreter.skip_the_discarded_overflow_checks_in_interpreter()
    assert builder.options.sanitize_overflow  # read under debug: left on
    monkeypatch.setattr(builder, "options", checked)
    triton_interpreter.skip_the_discarded_overflow_checks_in_interpreter()
    assert not builder.options.sanitize_overflow


def test_the_backend_prepares_the_interpreter_before_its_kernels(monkeypatch):
    """`triton_backend` loads its kernels (and the product kernels) after `prepare`: the check and the
    patches are in place before a kernel first runs."""
    from debertakit.attention import triton_backend

    calls = []
    monkeypatch.setattr(triton_interpreter, "prepare", lambda: calls.append("prepare"))
    triton_backend._kernels.cache_clear()
    triton_backend._products.cache_clear()
    try:
        triton_backend._products()
        assert calls == ["prepare"]  # once, through `_kernels`
    finally:
        triton_backend._kernels.cache_clear()
        triton_backend._products.cache_clear()
