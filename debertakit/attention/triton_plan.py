"""Call plans: a `triton` forward's host work done once per call signature, then only its allocations and launches.

At N = 512 a forward's time on the H200 was the host's: 0.955 ms per call for 0.468 ms of GPU time (sixth lease,
docs/gpu-kernel.md). On this project's 2-core CPU the host side of such a forward without grad takes about
140 µs (``python benchmarks/triton_launch_cost.py``, row "call: forward, no grad", kernels not run), of which
its three allocations, the fill of the tables' zeros and its two launches are some 25; the rest decides: which
road, tiles and layout, which views and buffers, which arguments. For inputs of the same shapes, strides,
dtypes and settings it decides the same every time.

A `Plans` records one call per signature (its key, below) and replays it for later calls: the buffers it
allocated, allocated again at the same sizes and strides; its fills and copies into them; each kernel launch
with the same grid and arguments, where a tensor argument that was an input, or a view of an input or of a
buffer, is taken from this call's input or buffer at the same sizes, strides and storage offset, and any other
tensor argument (the lookup tables, the geometry's shared inputs, the stand-ins: built by the caches and kept
there, the same for every call of the signature) is passed as it was. Steps run in the order the call made
them. The replay launches through `triton_launch.launcher`, with the key the recorded launch had there.

How a call is recorded: under a `TorchDispatchMode` that sees every PyTorch operation of the call, and with
`triton_launch.launcher` handing each launch to the recorder. A call is planned only where its operations are
allocations, views, and fills of and copies into what it allocated, and its result one of its buffers or inputs:
a matmul, a random draw, a value read from the device, or a write into anything else, and the call is not
planned (it ran as it always does). A signature's first call is not recorded (it may build what the caches
keep), and one that cannot be planned is recorded `RECORDINGS` times at most.

The key (`triton_backend._plan_key`): each input's shape, strides, dtype, storage offset and 16-byte alignment,
the device, the scale, the position terms, the relative-position mapping (by value: what the cached tables are
built from) and causality; geometries with per-call tensors (masks, segments, positions) and dropout are not
planned. The backend's module settings are compared at every call (``settings`` of `Plans`: the module's
globals by value, so a setting or a function patched in is seen, a dict changed in place is not, but for the
tile overrides). Not planned either: calls under ``torch.compile``, while a CUDA graph is captured, under
autocast, or where a gradient is wanted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from debertakit.attention import triton_launch
from debertakit.attention.relative import capturing_cuda_graph

# Where calls are planned (`triton_backend.CALL_PLANS`): "cuda" (CUDA tensors: where a call's host time counts),
# "always" (under the interpreter too: the tests), "off".
MODES = ("cuda", "always", "off")
# signatures kept (the least recently used dropped), plans per signature (one per settings snapshot), and how
# many calls of a signature are recorded before it is left unplanned
PLANS_KEPT = 64
SNAPSHOTS_KEPT = 4
RECORDINGS = 3

_aten = torch.ops.aten
_ALLOCATIONS = {
    _aten.empty.memory_format,
    _aten.empty_like.default,
    _aten.empty_strided.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
}
_FILLS = {_aten.zero_.default, _aten.fill_.Scalar}
# allocations filled with a value: the buffer, then its fill (the value's argument, or 0)
_FILLED = {
    _aten.zeros.default: None,
    _aten.zeros_like.default: None,
    _aten.full.default: 1,
    _aten.full_like.default: 1,
}


def serves(device: torch.device, mode: str) -> bool:
    """Whether calls on ``device`` are planned in ``mode`` (one of `MODES`), in this context: not under
    ``torch.compile``, while a CUDA graph is captured, under autocast, nor inside a call being recorded."""
    if mode == "off" or (mode == "cuda" and device.type != "cuda"):
        return False
    if triton_launch.recorder() is not None or torch.compiler.is_compiling():
        return False
    autocast = torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)
    return not autocast and not capturing_cuda_graph()


def tensor_key(t: Tensor | None) -> Hashable:
    """What a plan's key holds of an input: None, or its shape, strides, dtype, storage offset and 16-byte
    alignment (views of it are replayed at the same storage offsets; Triton specialises on the alignment)."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.storage_offset(), t.data_ptr() % 16


class _View(NamedTuple):
    """A tensor a plan hands a kernel or returns: an input (``kind`` "input") or a buffer ("buffer") number
    ``index``, itself (``size`` None) or viewed at ``size``, ``stride`` and storage ``offset``."""

    kind: str
    index: int
    size: tuple[int, ...] | None = None
    stride: tuple[int, ...] | None = None
    offset: int = 0


class _Launch(NamedTuple):
    """A recorded launch: ``kernel[grid](*args, **kwargs)`` with the tensors at ``slots`` (positions of args,
    names of kwargs) replaced by the plan's views of that number; ``key``, the shorter launch path's key of the
    recorded arguments (`triton_launch.Cached.key`; None off that path)."""

    kernel: Any
    grid: Any
    args: tuple
    kwargs: dict
    arg_slots: tuple[tuple[int, int], ...]
    kwarg_slots: tuple[tuple[str, int], ...]
    key: tuple | None


class _Fill(NamedTuple):
    """A recorded fill: the plan's view ``view`` (of a buffer) set to ``value``."""

    view: int
    value: float


class _Copy(NamedTuple):
    """A recorded copy into view ``target`` (of a buffer), converting and broadcasting as ``copy_`` does: from
    view ``source`` or, where the source is no tensor of the call, from that tensor itself."""

    target: int
    source: int | Tensor


class Plan(NamedTuple):
    """A recorded call (see the module docstring): its buffers (size, stride, dtype, device), the views its
    steps and result read, its steps (fills, copies and launches) in the order it made them, and the view it
    returns."""

    buffers: tuple[tuple, ...]
    aligned: tuple[bool, ...]  # whether each buffer started on 16 bytes when recorded
    views: tuple[_View, ...]
    steps: tuple[_Fill | _Copy | _Launch, ...]
    result: int

    def run(self, inputs: tuple[Tensor | None, ...]) -> Tensor:
        """The call on new ``inputs`` of the plan's signature: its allocations, fills, copies and launches."""
        buffers = [
            torch.empty_strided(size, stride, dtype=dtype, device=dev)
            for size, stride, dtype, dev in self.buffers
        ]
        # the launches' keys hold each tensor's 16-byte alignment: the inputs' are the plan key's, the buffers'
        # the allocator's (both of PyTorch's align far more), checked
        keyed = tuple(b.data_ptr() % 16 == 0 for b in buffers) == self.aligned
        roots = {"input": inputs, "buffer": buffers}
        views = [
            roots[v.kind][v.index]
            if v.size is None
            else roots[v.kind][v.index].as_strided(v.size, v.stride, v.offset)
            for v in self.views
        ]
        for step in self.steps:
            if isinstance(step, _Fill):
                views[step.view].fill_(step.value)
            elif isinstance(step, _Copy):
                source = step.source
                views[step.target].copy_(source if isinstance(source, Tensor) else views[source])
            else:
                _launch(step, views, keyed)
        return views[self.result]


def _launch(launch: _Launch, views: list[Tensor], keyed: bool) -> None:
    """A replayed launch on this replay's ``views``, with its recorded key where ``keyed`` and it has one."""
    args, kwargs = list(launch.args), dict(launch.kwargs)
    for at, view in launch.arg_slots:
        args[at] = views[view]
    for name, view in launch.kwarg_slots:
        kwargs[name] = views[view]
    path = triton_launch.launcher(launch.kernel)
    if keyed and launch.key is not None and isinstance(path, triton_launch.Cached):
        path.launch_keyed(launch.key, launch.grid, args, kwargs)
    else:
        path[launch.grid](*args, **kwargs)


class NotPlanned(Exception):
    """Why a recorded call cannot be planned (`record`)."""


class _Recorder(TorchDispatchMode):
    """Sees a call's PyTorch operations and launches (see the module docstring) and builds its `Plan`."""

    def __init__(self, inputs: tuple[Tensor | None, ...]):
        super().__init__()
        self.inputs = inputs
        # id -> (kind, index) of the input or buffer a tensor is (a view of); every such tensor kept alive while
        # recording, so that no other tensor takes its id
        self.origin: dict[int, tuple[str, int]] = {
            id(t): ("input", i) for i, t in enumerate(inputs) if t is not None
        }
        self.kept: list[Tensor] = []
        self.buffers: list[Tensor] = []
        # ("fill", tensor, value), ("copy", target, source), ("launch", kernel, grid, args, kwargs), in order
        self.steps: list[tuple] = []
        self.refusal: str | None = None
        self.launching = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # (a launch's own operations, the interpreter's copies, are not the call's)
        if not self.launching and self.refusal is None:
            self._note(func, args, out)
        return out

    def _note(self, func, args: tuple, out: Any) -> None:
        if func in _ALLOCATIONS or func in _FILLED:
            self._derive(out, ("buffer", len(self.buffers)))
            self.buffers.append(out)
            if func in _FILLED:
                at = _FILLED[func]
                self.steps.append(("fill", out, 0 if at is None else args[at]))
        elif func in _FILLS or func is _aten.copy_.default:
            target = args[0]
            if self._where(target) != "buffer":
                self.refusal = f"{func} writes into a tensor the call did not allocate"
            elif func is _aten.copy_.default:
                self.steps.append(("copy", target, args[1]))
            else:
                self.steps.append(("fill", target, 0 if func is _aten.zero_.default else args[1]))
        elif func.is_view:
            parent = args[0]
            where = self.origin.get(id(parent)) if isinstance(parent, Tensor) else None
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if where is not None and isinstance(t, Tensor):
                    if t.dtype != parent.dtype:
                        self.refusal = f"{func} views a tensor as another dtype"
                    self._derive(t, where)
        else:
            self.refusal = f"the call runs {func}"

    def _where(self, t: Any) -> str | None:
        """The kind of a tensor of the call, "input" or "buffer"; None for a constant, or not a tensor."""
        return self.origin[id(t)][0] if isinstance(t, Tensor) and id(t) in self.origin else None

    def _derive(self, t: Tensor, where: tuple[str, int]) -> None:
        self.origin[id(t)] = where
        self.kept.append(t)

    def launch(self, kernel, grid, args: tuple, kwargs: dict) -> None:
        """`triton_launch.launcher`'s hook while recording: the launch noted, then made."""
        self.steps.append(("launch", kernel, grid, args, dict(kwargs)))
        self.launching = True
        try:
            triton_launch.launcher(kernel, hooked=False)[grid](*args, **kwargs)
        finally:
            self.launching = False

    def plan(self, result: tuple) -> Plan:
        """The recorded call as a `Plan` returning ``result[0]``; `NotPlanned` where it cannot be one."""
        if self.refusal is not None:
            raise NotPlanned(self.refusal)
        if self._where(result[0]) is None:
            raise NotPlanned("the call's result is not one of its inputs or buffers")
        if any(isinstance(r, Tensor) for r in result[1:]):
            raise NotPlanned("the call returns more than one tensor")
        if not any(step[0] == "launch" for step in self.steps):
            # (a launch that did not go through `triton_launch.launcher` would not be replayed)
            raise NotPlanned("the call handed no launch to the recorder")
        views: list[_View] = []
        steps = [self._step(step, views) for step in self.steps]
        result_view = self._view(result[0], views)
        buffers = tuple((tuple(b.shape), b.stride(), b.dtype, b.device) for b in self.buffers)
        aligned = tuple(b.data_ptr() % 16 == 0 for b in self.buffers)
        return Plan(buffers, aligned, tuple(views), tuple(steps), result_view)

    def _step(self, step: tuple, views: list[_View]) -> _Fill | _Copy | _Launch:
        if step[0] == "fill":
            return _Fill(self._view(step[1], views), step[2])
        if step[0] == "copy":
            source = step[2]
            return _Copy(
                self._view(step[1], views), self._view(source, views) if self._where(source) else source
            )
        _, kernel, grid, args, kwargs = step
        path = triton_launch.launcher(kernel, hooked=False)
        key = path.key(grid, args, kwargs) if isinstance(path, triton_launch.Cached) else None
        arg_slots = tuple((at, self._view(a, views)) for at, a in enumerate(args) if self._where(a))
        kwarg_slots = tuple((name, self._view(a, views)) for name, a in kwargs.items() if self._where(a))
        args = tuple(None if self._where(a) else a for a in args)
        kwargs = {name: (None if self._where(a) else a) for name, a in kwargs.items()}
        return _Launch(kernel, grid, args, kwargs, arg_slots, kwarg_slots, key)

    def _view(self, t: Tensor, views: list[_View]) -> int:
        """The number of ``t``'s view among ``views`` (added where new)."""
        kind, index = self.origin[id(t)]
        root = self.inputs[index] if kind == "input" else self.buffers[index]
        view = (
            _View(kind, index)
            if t is root
            else _View(kind, index, tuple(t.shape), t.stride(), t.storage_offset())
        )
        if view not in views:
            views.append(view)
        return views.index(view)


def record(
    call: Callable[[], tuple], inputs: tuple[Tensor | None, ...]
) -> tuple[tuple, Plan | None, str | None]:
    """Run ``call`` (which returns ``(tensor, ...)``) recording it: its result, its `Plan` (None where it cannot
    be planned) and why not."""
    recorder = _Recorder(inputs)
    with triton_launch.recording(recorder), recorder:
        result = call()
    try:
        return result, recorder.plan(result), None
    except NotPlanned as refusal:
        return result, None, str(refusal)


class _Entry:
    """A signature's plan for one settings snapshot, or how often its calls were recorded without one."""

    def __init__(self, settings: tuple):
        self.settings = settings
        self.calls = 0
        self.recordings = 0
        self.plan: Plan | None = None
        self.tail: tuple = ()  # what the call returns after its tensor (constants: `_Recorder.plan`)
        self.refusal: str | None = None


class Plans:
    """Plans by signature (`PLANS_KEPT`), each for up to `SNAPSHOTS_KEPT` snapshots of ``settings()`` (compared by
    value at every call); ``hits`` counts the calls replayed, ``recorded`` the recordings."""

    def __init__(self, settings: Callable[[], tuple]):
        self.settings = settings
        self.entries: OrderedDict[Hashable, list[_Entry]] = OrderedDict()
        self.hits = self.recorded = 0

    def call(self, key: Hashable, inputs: tuple[Tensor | None, ...], call: Callable[[], tuple]) -> tuple:
        """``call()`` (returning ``(tensor, ...)``, the tensor a function of ``inputs`` and the key alone), or its
        plan's replay: the same tuple with the replayed tensor first."""
        entry = self._entry(key, self.settings())
        if entry.plan is not None:
            self.hits += 1
            result = entry.plan.run(inputs)
            return (result, *entry.tail)
        entry.calls += 1
        if entry.calls == 1 or entry.recordings >= RECORDINGS:
            return call()
        entry.recordings += 1
        self.recorded += 1
        result, entry.plan, entry.refusal = record(call, inputs)
        entry.tail = result[1:]
        return result

    def _entry(self, key: Hashable, settings: tuple) -> _Entry:
        entries = self.entries.get(key)
        if entries is None:
            entries = self.entries[key] = []
            while len(self.entries) > PLANS_KEPT:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(key)
        for entry in entries:
            if _same(entry.settings, settings):
                return entry
        entries.append(_Entry(settings))
        del entries[:-SNAPSHOTS_KEPT]
        return entries[-1]

    def clear(self) -> None:
        self.entries.clear()


def _same(a: tuple, b: tuple) -> bool:
    """Two settings snapshots equal (identical values compare at once; a value whose comparison fails, a tensor
    say, differs)."""
    try:
        return a == b
    except Exception:
        return False
