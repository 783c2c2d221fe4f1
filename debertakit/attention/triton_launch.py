"""A shorter launch path for the `triton` backend's kernels: the compiled kernel found once, then called directly.

``kernel[grid](*args, **kwargs)`` runs Triton's launch path on every call: it binds the arguments to the
signature, specialises each one (a pointer's dtype and 16-byte alignment, an integer's divisibility by 16 and
width), builds the cache key, looks the compiled kernel up, checks the globals it read, and only then calls the
driver. Our kernels take 24 to 60 arguments, so that path costs more than the driver's call: 10 to 24 µs a launch
on a 2-core CPU (``python benchmarks/triton_launch_cost.py``), and on the H200 machine a visible part of a short
input's call, which is the host's there (``benchmarks/results/attention_gpu_h200_996fc93_latency.json``, a
12-layer forward under cProfile: `jit.py` ``run`` 1.23 ms of its own, ``native_specialize_impl`` 0.53 ms).

`launcher` wraps a JIT function so that a launch first builds a key of what Triton's specialisation reads, in
Python and finer than Triton's own (every integer by value, every tensor by dtype and 16-byte alignment, every
keyword by type and value), and looks up the compiled kernel that Triton's own path returned for that key.
The first launch of a key goes through Triton's path (which compiles or finds the kernel) and keeps what it
returned; later ones call the compiled kernel's launcher with the same arguments, in the same order, that
Triton's path passes it. Arguments of other kinds (a tensor descriptor, say) take Triton's path every time, as do
kernels under the interpreter (not JIT functions) and every launch where `LAUNCH_PATH` is "triton".

The convention it follows (`JITFunction.run` calling ``kernel.run(grid_0, grid_1, grid_2, stream, function,
metadata, launch_metadata, enter_hook, exit_hook, *every_parameter)``) is Triton's own, not a documented interface:
the shorter path serves the releases the check of ``benchmarks/triton_launch_cost.py`` passed with
(`CHECKED_RELEASES`: 3.5.1, 3.6.0, the GPU image's, 3.7.1, 3.8.0 and 3.9.0), and any other release takes
Triton's path.

What the shorter path skips: Triton's check that the globals a kernel read at compilation have not changed since,
and the knobs read into its options (``debug``, ``instrumentation_mode``) at each launch; so a change to either
after a kernel's first launch is not seen. Neither happens in this package.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading

from torch import Tensor

LAUNCH_PATH_MODES = ("cached", "triton")
LAUNCH_PATH = "cached"
# entries kept per kernel (keys hold integer arguments by value: shapes): past this many the oldest half goes
MAX_ENTRIES = 1024

# (major, minor) releases of Triton, first and last, whose launch convention the check passed with (every one
# between them checked too); under 3.4 the check cannot run (its JIT function has no `_do_compile` for the
# stand-in compiler to replace), so 3.4 is not served
CHECKED_RELEASES = ((3, 5), (3, 9))

_LAUNCHERS: dict[int, Cached] = {}


class _Hook(threading.local):
    """The recorder of `triton_plan` while it records a call in this thread: it is handed every launch."""

    recorder = None


_HOOK = _Hook()


def recorder():
    """The recorder this thread's launches are handed to (`recording`), or None."""
    return _HOOK.recorder


@contextlib.contextmanager
def recording(recorder):
    """This thread's launches through `launcher` handed to ``recorder.launch(kernel, grid, args, kwargs)``, which
    makes them (through ``launcher(kernel, hooked=False)``): how `triton_plan` records a call."""
    if _HOOK.recorder is not None:
        raise RuntimeError("triton_launch.recording: this thread is recording a call already")
    _HOOK.recorder = recorder
    try:
        yield recorder
    finally:
        _HOOK.recorder = None


def minor_release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: '3.6.0' -> (3, 6), '3.6rc1' -> (3, 6)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"cannot read a version from {version!r}; expected MAJOR.MINOR...")
    return int(match[1]), int(match[2])


@functools.cache
def _checked_release() -> bool:
    import triton

    first, last = CHECKED_RELEASES
    return first <= minor_release(triton.__version__) <= last


def launcher(kernel, hooked: bool = True):
    """``kernel`` itself, or for a JIT function where `LAUNCH_PATH` is "cached" and the installed Triton is one of
    `CHECKED_RELEASES` its `Cached` launcher (one per kernel), launched alike:
    ``launcher(kernel)[grid](*args, **kwargs)``. While this thread records a call (`recording`, unless
    ``hooked`` is False) the launch goes to the recorder."""
    if hooked and _HOOK.recorder is not None:
        return _Recorded(kernel, _HOOK.recorder)
    if LAUNCH_PATH != "cached":
        if LAUNCH_PATH not in LAUNCH_PATH_MODES:
            raise ValueError(
                f"triton_launch.LAUNCH_PATH must be one of {LAUNCH_PATH_MODES}, got {LAUNCH_PATH!r}"
            )
        return kernel
    cached = _LAUNCHERS.get(id(kernel))
    if cached is not None and cached.fn is kernel:
        return cached
    if not isinstance(kernel, _jit_function()) or not _checked_release():  # interpreted, or a stand-in
        return kernel
    cached = _LAUNCHERS[id(kernel)] = Cached(kernel)
    return cached


class _Recorded:
    """A launch handed to a recorder (`recording`)."""

    def __init__(self, kernel, recorder):
        self.kernel, self.recorder = kernel, recorder

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.recorder.launch(self.kernel, grid, args, kwargs)


@functools.cache
def _jit_function() -> type:
    from triton.runtime.jit import JITFunction  # (imported on first use, as the kernels are)

    return JITFunction


def _key(args: tuple, kwargs: dict) -> tuple | None:
    """What Triton's specialisation of ``args`` and ``kwargs`` reads, or finer; None for an argument of a kind not
    keyed here. Types are part of it where values alone would meet (``True == 1 == 1.0``); a float is keyed by
    its type alone, as Triton passes every float as a 32-bit scalar; a tensor, positional or by keyword, by its
    dtype and whether its address is a multiple of 16 bytes (Triton's pointer specialisation), not by itself."""
    parts: list = [tuple(kwargs)]
    for a in (*args, *kwargs.values()):
        kind = type(a)
        if kind is int or a is None:
            parts.append(a)
        elif kind is bool:
            parts.append((bool, a))
        elif kind is float:
            parts.append(float)
        elif isinstance(a, Tensor):  # (a subclass too: a parameter, say)
            parts.append((a.dtype, a.data_ptr() % 16 == 0))
        else:
            return None
    return tuple(parts)


def _hooked(*hooks) -> bool:
    """Whether a launch hook is set: a hook added to a chain (``HookChain``, always present in the checked
    releases), or one set in its place (a function, or None for none)."""
    for hook in hooks:
        calls = getattr(hook, "calls", None)
        if hook is not None and not (isinstance(calls, list) and not calls):
            return True
    return False


class Cached:
    """A JIT function's launches: Triton's path the first time per key, the compiled kernel directly after."""

    def __init__(self, fn):
        from triton import knobs
        from triton.runtime.driver import driver

        self.fn = fn
        self.entries: dict[tuple, tuple] = {}
        self._driver, self._knobs = driver, knobs

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict) -> None:
        self.launch_keyed(self.key(grid, args, kwargs), grid, args, kwargs)

    def takes_addresses(self, key: tuple) -> bool:
        """Whether the launch of ``key`` (`launch_keyed`) may be given a tensor's address (an int) in its place: it
        calls a compiled kernel found for ``key`` (Triton's own path, which a first launch takes, would take an int
        for an integer), whose launcher reads an int pointer argument as the address itself (every checked
        release), skipping the tensor's ``data_ptr`` and the driver's check of the pointer
        (``cuPointerGetAttribute``); and no launch hook is set (a profiler's: its metadata would see ints)."""
        device = self._driver.active.get_current_device()
        runtime = self._knobs.runtime
        return (device, key) in self.entries and not _hooked(
            runtime.launch_enter_hook, runtime.launch_exit_hook
        )

    def key(self, grid, args: tuple, kwargs: dict) -> tuple | None:
        """The key of a launch (`_key`), or None where it takes Triton's path: a callable grid, pre-run hooks."""
        return _key(args, kwargs) if not callable(grid) and not self.fn.pre_run_hooks else None

    def launch_keyed(self, key: tuple | None, grid, args: tuple, kwargs: dict) -> None:
        """The launch of ``key`` (`key`: a caller that knows its arguments' key, `triton_plan`'s replays, need
        not build it again)."""
        if key is None:
            self.fn[grid](*args, **kwargs)
            return
        device = self._driver.active.get_current_device()
        entry = self.entries.get((device, key))
        if entry is None:
            self._first(device, key, grid, args, kwargs)
            return
        kernel, tail = entry
        values = (*args, *[kwargs[name] for name in tail])  # every parameter, in the signature's order
        stream = self._driver.active.get_current_stream(device)
        grid_0, grid_1, grid_2 = (*grid, 1, 1)[:3]
        # as Triton's `JITFunction.run` launches a kernel it found
        launch_metadata = kernel.launch_metadata(grid, stream, *values)
        hooks = self._knobs.runtime
        kernel.run(
            grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,
            hooks.launch_enter_hook, hooks.launch_exit_hook, *values,
        )  # fmt: skip

    def _first(self, device, key: tuple, grid, args: tuple, kwargs: dict) -> None:
        """Triton's own launch, keeping the compiled kernel it returns where every parameter after the positional
        ones was given by keyword (no default to fill in)."""
        kernel = self.fn[grid](*args, **kwargs)
        tail = self.fn.arg_names[len(args) :]
        if kernel is None or not all(name in kwargs for name in tail):
            return
        if len(self.entries) >= MAX_ENTRIES:
            for old in list(self.entries)[: MAX_ENTRIES // 2]:
                self.entries.pop(old, None)  # (another thread may have dropped it)
        self.entries[device, key] = (kernel, tail)
