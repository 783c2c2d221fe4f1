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

Each launch is timed twice: through ``kernel[grid]`` (Triton's path) and through `triton_launch.launcher`, the
backend's shorter path (the compiled kernel kept per key of the arguments, then called directly). So is a whole
call (rows "call: ..."): the backend's Python and PyTorch ops and its launches through the stand-ins, a forward
without grad and a forward+backward, each with a new geometry, under either path. Before timing,
the script checks that shorter path against Triton's own: every recorded launch, replayed both ways, must reach
the same compiled kernel with the same arguments in the same order, and a pointer's specialisation must depend on
its dtype and 16-byte alignment alone (what the shorter path's key holds of a tensor). A failed check exits with
status 1 before anything is timed.

    python benchmarks/triton_launch_cost.py     # table + benchmarks/results/triton_launch_cost.json
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable
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
from triton_dispatch import host_arguments, host_environment, median_us, one_thread, planned  # noqa: E402
from triton_host_cost import V3_BASE, _NoLaunch, gpu_tiles_for  # noqa: E402  (kernels that launch nothing)

from debertakit.attention import triton_backend, triton_launch, triton_plan  # noqa: E402
from debertakit.attention.eager import PositionTerms  # noqa: E402
from debertakit.attention.geometry import Geometry  # noqa: E402
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
    """Stands for a compiled kernel: its launch does nothing; with ``calls``, it records what each launch passed
    (the grid, stream, function, metadata, hooks and every argument)."""

    function = packed_metadata = None

    def __init__(self, key=None, calls: list | None = None):
        self.key, self.calls = key, calls

    def launch_metadata(self, *args):
        return None

    def run(self, *args):
        if self.calls is not None:
            self.calls.append((self, args))


def _stand_in_compile(self, key, signature, device, constexprs, options, attrs, warmup, calls=None):
    """`JITFunction._do_compile` without compiling: the stand-in kernel, cached under the launch's key as the
    real one would be, so that later launches of the same specialisation find it."""
    kernel = _Compiled(key, calls)
    self.device_caches[device][0][key] = kernel
    return kernel


def _stand_ins(calls: list | None = None):
    """The stand-in driver and compiler, as a context: `_Driver` active, `_stand_in_compile` for every JIT
    function (recording into ``calls``), and every kernel's compiled stand-ins and shorter-path entries dropped
    on the way in, so that nothing found comes from an earlier context."""
    compile_ = functools.partialmethod(_stand_in_compile, calls=calls)
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(JITFunction, "_do_compile", compile_))
    # the driver restored as it was afterwards: without a GPU there is no default driver to reset to
    stack.enter_context(mock.patch.object(driver, "_active", _Driver()))
    stack.enter_context(mock.patch.dict(triton_launch._LAUNCHERS, clear=True))
    # the shorter path checked and timed whatever the release (a new one is checked before it is served)
    stack.enter_context(mock.patch.object(triton_launch, "_checked_release", lambda: True))
    for kernel in _jit_functions():
        kernel.device_caches.clear()
    return stack


def _jit_functions() -> list[JITFunction]:
    modules = (triton_backend._kernels(), triton_backend._products(), sys.modules[__name__])
    return [k for m in modules for k in vars(m).values() if isinstance(k, JITFunction)]


class LaunchPathMismatch(Exception):
    """The shorter launch path and Triton's disagree (`check_cached_path`)."""


def _expect(holds: bool, message: str) -> None:
    if not holds:  # (not an assert: ``python -O`` would drop it)
        raise LaunchPathMismatch(message)


def _same(a, b) -> bool:
    """Launch arguments alike: the same object, or equal values of the same type (not tensors: ``is``)."""
    return a is b or (type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b)


def check_cached_path() -> dict:
    """`triton_launch`'s shorter path against Triton's own (see the module docstring): ``{"launches": n,
    "pointer_variants": m, "served": whether the backend takes the shorter path with the installed Triton}`` when
    every check holds; raises `LaunchPathMismatch` naming the first that does not."""
    calls: list = []
    with _stand_ins(calls):
        launches = [launch for phase in record_launches().values() for launch in phase]
        for kernel, grid, args, kwargs in launches:
            del calls[:]
            kernel[grid](*args, **kwargs)  # Triton's path
            for _ in range(2):  # the first through Triton's path, the second direct
                triton_launch.launcher(kernel)[grid](*args, **kwargs)
            (k0, a0), (k1, a1), (k2, a2) = calls
            name = kernel.__name__
            _expect(k0 is k1 is k2, f"{name}: the shorter path reached another compiled kernel")
            for path, got in (("first", a1), ("kept", a2)):
                _expect(
                    len(got) == len(a0) and all(map(_same, got, a0)),
                    f"{name}: the shorter path's {path} launch passed other arguments than Triton's path",
                )
            _expect(bool(triton_launch.launcher(kernel).entries), f"{name}: the shorter path kept nothing")
        variants = _pointer_variants()
        keys = [triton_launch._key((x, 16), {}) for x in variants]  # the shorter path's key
        found = [_noop[(1,)](x, 16).key for x in variants]  # the compiled stand-in: Triton's key
        for i in range(len(variants)):
            for j in range(len(variants)):
                _expect(
                    (keys[i] == keys[j]) == (found[i] == found[j]),
                    f"pointers {i} and {j} ({variants[i].dtype} at offset {variants[i].storage_offset()}, "
                    f"{variants[j].dtype} at {variants[j].storage_offset()}): Triton's key and the shorter "
                    "path's disagree on whether they launch the same compiled kernel",
                )
    # whether the backend takes the shorter path with this Triton (`triton_launch.CHECKED_RELEASES`)
    return dict(
        launches=len(launches), pointer_variants=len(variants), served=triton_launch._checked_release()
    )


def _alike(a, b) -> bool:
    """Arguments of a replayed launch and the call's own alike: non-tensors equal (`_same`); tensors of the same
    shape, strides, dtype, storage offset and 16-byte alignment; or for a tensor an address (an int: the shorter
    path's replays, `triton_launch.Cached.takes_addresses`) of the same alignment. Where they are, `_placed`
    checks the addresses themselves."""
    if isinstance(a, torch.Tensor) and type(b) is int:
        return a.data_ptr() % 16 == b % 16
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return _same(a, b)
    return triton_plan.tensor_key(a) == triton_plan.tensor_key(b)


def _placed(made: list, replayed: list, inputs: set[int]) -> tuple[bool, int]:
    """Whether a replayed call's launches (``replayed``) pass their tensors where its call's (``made``) did: the
    inputs at their addresses, and the tensors of each storage of the call (a buffer, its views) all at one
    distance from theirs in the replay, in every launch (a buffer a launch writes is the one a later launch
    reads, each view at its place in it); and how many were passed as addresses."""
    shifts: dict[int, set[int]] = {}
    addressed = 0
    for (_, a0), (_, a1) in zip(made, replayed):
        for x, y in zip(a0, a1):
            if not isinstance(x, torch.Tensor):
                continue
            addressed += type(y) is int
            at = y if type(y) is int else y.data_ptr()
            if x.data_ptr() in inputs and at != x.data_ptr():
                return False, addressed
            shifts.setdefault(x.untyped_storage().data_ptr(), set()).add(at - x.data_ptr())
    return all(len(s) == 1 for s in shifts.values()), addressed


def check_planned_calls() -> dict:
    """A forward without grad, and a forward+backward, replayed from their plans (`triton_plan`: the forward
    call's, or the forward's and the backward's bodies') against the same calls made: the same compiled kernels,
    launched through the shorter path with the plans' recorded keys, with alike arguments (`_alike`), the
    inputs' at their addresses, every buffer at one place (`_placed`). ``{"planned_launches": n,
    "addressed_arguments": m}`` (of both: tensors passed by address), or `LaunchPathMismatch`."""
    calls: list = []
    call = _call()
    inputs = {t.data_ptr() for t in call.inputs}
    count = addressed = 0
    with _stand_ins(calls), _gpu_tiles():
        for phase, backward in (("forward", False), ("forward+backward", True)):
            with planned():
                made = []
                for _ in range(4):  # made, recorded, replayed twice
                    del calls[:]
                    call(backward)
                    made.append(list(calls))
                store = triton_backend._PLANS
                refused = [e.refusal for entries in store.entries.values() for e in entries if e.refusal]
                _expect(not refused, f"{phase}: not planned: {refused}")
                _expect(store.hits == 2 * (1 + backward), f"{phase}: {store.hits} replays")
            for replayed in made[2:]:
                _expect(
                    len(replayed) == len(made[0]), f"{phase}: a replay launched another number of kernels"
                )
                for i, ((k0, a0), (k1, a1)) in enumerate(zip(made[0], replayed)):
                    name = f"{phase}: launch {i}"
                    _expect(k0 is k1, f"{name}: a replay reached another compiled kernel")
                    alike = len(a0) == len(a1) and all(map(_alike, a0, a1))
                    _expect(alike, f"{name}: a replay passed other arguments")
                placed, n = _placed(made[0], replayed, inputs)
                _expect(placed, f"{phase}: a replay passed a tensor elsewhere than its call")
                addressed += n
            count += len(made[0])
    return dict(planned_launches=count, addressed_arguments=addressed)


def _pointer_variants() -> list[torch.Tensor]:
    """Tensors that differ in dtype, in 16-byte alignment (bfloat16 at offsets of 0, 2, 4, 6, 8, 16 and 512
    bytes, float32 at 0, 4, 8 and 16) and, at one alignment, in shape, strides and contiguity."""
    half, single = torch.empty(1024, dtype=torch.bfloat16), torch.empty(1024, dtype=torch.float32)
    return [
        half, half[8:], half[256:], half.view(32, 32).t(), half.view(4, 256)[:, :8], half[1:], half[2:], half[4:],
        half[3:], single, single[4:], single[1:], single[2:], torch.empty(8, dtype=torch.int32),
    ]  # fmt: skip


def _call(n: int = 64, batch: int = 2, heads: int = 2, dim: int = 64) -> Callable[[bool], None]:
    """A call of the backend on the distance road (the default) at a tiny shape with DeBERTa-v3 base's positions:
    ``call(backward)`` runs its forward without grad, or its forward and backward; each with a new geometry, as
    the GPU benchmark's rows do. Run it with the GPU's tiles (`_gpu_tiles`)."""
    rel, terms = V3_BASE, PositionTerms(c2p=True, p2c=True)

    def leaf(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16).requires_grad_()

    q, k, v = (leaf(batch, n, heads, dim).transpose(1, 2) for _ in range(3))
    tables = [leaf(heads, rel.table_rows, dim) for _ in range(2)]

    def call(backward: bool) -> None:
        with torch.set_grad_enabled(backward):
            out, _ = triton_backend.triton_attention(
                q, k, v, *tables, rel, Geometry(), scale=0.1, terms=terms
            )
            if backward:
                out.backward(torch.ones_like(out))

    call.inputs = (q, k, v, *tables)
    return call


def _gpu_tiles():
    """`triton_backend.tiles_for` giving the GPU's tiles on any device, as a patch (they size the tables)."""
    return mock.patch.object(triton_backend, "tiles_for", gpu_tiles_for())


def record_launches() -> dict[str, list]:
    """The launches of one forward without grad and of one forward+backward (`_call`), as ``(kernel, grid, args,
    kwargs)``, recorded instead of run."""
    kernels, products = triton_backend._kernels(), triton_backend._products()
    call = _call()
    phases: dict[str, list] = {}
    for phase in ("forward", "forward+backward"):
        launches: list = []

        def recorder(module, launches=launches):  # each launch recorded with its JIT function, none run
            return _NoLaunch(lambda name, *launch: launches.append((getattr(module, name), *launch)))

        patches = dict(_kernels=lambda: recorder(kernels), _products=lambda: recorder(products))
        with mock.patch.multiple(triton_backend, **patches), _gpu_tiles():
            call(phase != "forward")
        phases[phase] = launches
    return phases


def whole_calls_us(reps: int) -> list[dict]:
    """Host time of a whole call (`_call`: the backend's Python and PyTorch ops, and every launch through the
    stand-ins, the kernels not run), forward without grad and forward+backward, through Triton's launch path
    (`triton_launch.LAUNCH_PATH` "triton") and the shorter one, and replayed from their plans (`triton_plan`,
    through the shorter path)."""
    call, rows = _call(), []
    with _gpu_tiles():
        for phase, backward in (("call: forward, no grad", False), ("call: forward+backward", True)):
            timed = functools.partial(median_us, functools.partial(call, backward), reps)
            us = {}
            for path in triton_launch.LAUNCH_PATH_MODES:
                with mock.patch.object(triton_launch, "LAUNCH_PATH", path):
                    us[path] = round(timed(), 1)
            row = dict(
                phase=phase, kernel="triton_attention", arguments="", us=us["triton"], cached_us=us["cached"]
            )
            with planned():
                row["planned_us"] = round(timed(), 1)
            rows.append(row)
    return rows


def launch_us(kernel: JITFunction, grid, args: tuple, kwargs: dict, reps: int) -> tuple[float, float]:
    """Median host times of ``kernel[grid](*args, **kwargs)`` through Triton's launch path and through
    `triton_launch.launcher` (stand-ins above)."""
    short = triton_launch.launcher(kernel)
    return (
        median_us(lambda: kernel[grid](*args, **kwargs), reps),
        median_us(lambda: short[grid](*args, **kwargs), reps),
    )


def measure(reps: int) -> list[dict]:
    rows = []
    with _stand_ins():
        x = torch.empty(16)
        floor, short = launch_us(_noop, (1,), (x, 16), {}, reps)
        rows.append(
            dict(phase="floor", kernel="_noop", arguments=2, us=round(floor, 1), cached_us=round(short, 1))
        )
        for phase, launches in record_launches().items():
            for kernel, grid, args, kwargs in launches:
                row = dict(phase=phase, kernel=kernel.__name__, arguments=len(args) + len(kwargs))
                us, short = launch_us(kernel, grid, args, kwargs, reps)
                rows.append(dict(row, us=round(us, 1), cached_us=round(short, 1)))
        rows += whole_calls_us(max(1, reps // 10))
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| call | kernel | arguments (with constexprs) | Triton's path, µs | shorter path, µs | planned, µs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['phase']} | {r['kernel']} | {r['arguments']} | {r['us']} | {r['cached_us']} | "
        f"{r.get('planned_us', '')} |"
        for r in rows
    ]
    per_phase = collections.defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        if r["phase"] != "floor" and not r["phase"].startswith("call"):
            per_phase[r["phase"]][0] += r["us"]
            per_phase[r["phase"]][1] += r["cached_us"]
    lines += [f"| {phase} | all its launches | | {a:.1f} | {b:.1f} |" for phase, (a, b) in per_phase.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = host_arguments(argv, __doc__.split("\n\n")[0], 2000, OUT)
    try:
        checked = check_cached_path()
        checked.update(check_planned_calls())
    except LaunchPathMismatch as e:
        print(
            f"the shorter launch path or a planned call differs from Triton's path or the call: {e}",
            file=sys.stderr,
        )
        return 1
    print(
        f"checked: {checked['launches']} launches alike through both paths; pointers specialised by dtype and "
        f"16-byte alignment alone ({checked['pointer_variants']} variants); the backend takes the shorter path with "
        f"Triton {triton.__version__}: {'yes' if checked['served'] else 'no (not in CHECKED_RELEASES)'}; a planned "
        f"forward's and forward+backward's {checked['planned_launches']} launches alike their calls', "
        f"{checked['addressed_arguments']} tensors passed by address"
    )
    with one_thread():
        rows = measure(args.reps)
    print(table(rows))
    environment = host_environment("triton_launch_cost.py", argv, triton=triton.__version__)
    result = dict(environment=environment, checked=checked, launches=rows)
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
