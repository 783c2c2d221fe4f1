"""Call plans: a `triton` call's host work done once per call signature, then only its operations and launches.

At N = 512 a forward's time on the H200 was the host's: 0.955 ms per call for 0.468 ms of GPU time (sixth lease,
docs/gpu-kernel.md). On this project's 2-core CPU the host side of such a forward without grad takes about
135 µs (``python benchmarks/triton_launch_cost.py``, row "call: forward, no grad", kernels not run), of which
its three allocations, the fill of the tables' zeros and its two launches are some 25; the rest decides: which
road, tiles and layout, which views and buffers, which arguments. For inputs of the same shapes, strides,
dtypes and settings it decides the same every time.

A `Plans` records one call per signature (its key) and replays it for later calls of the signature. The plan
holds the call's steps in the order it made them: its allocations (made again at the same sizes and strides),
fills and copies (made directly), any other PyTorch operation (called again, an ATen operation on this call's
tensors), and each kernel launch (the same grid and arguments, through `triton_launch.launcher` with the key the
launch had on its shorter path). A tensor the call's steps read is an input, an operation's output, or a view of
one, taken again from this call's at the same size, strides and storage offset (a launch on the shorter path is
given its address alone, `_launch`); any other tensor (the lookup tables, the geometry's shared inputs, the
stand-ins, kept by the caches and the same for every call of the signature) is passed as it was. The result is
rebuilt the same way.

How a call is recorded: under a `TorchDispatchMode` that sees every PyTorch operation of the call, and with
`triton_launch.launcher` handing each launch to the recorder. A call is not planned (it ran as it always does)
where an operation's result would not be repeated by a replay (a random draw, a value read from the device, a
shape that follows from values: `torch.Tag` says which), it writes into a tensor it did not make (an input, a
kept tensor), it views a tensor as another dtype, hands no launch to the recorder, or returns a tensor not of
its own. A signature's first call is not recorded (it may build what the caches keep), and one that cannot be
planned is recorded `RECORDINGS` times at most. Where host time is what a plan saves (CUDA), a plan is kept only
where its first replays took less of it than calls made (`TIMED_CALLS`).

The backend plans at two levels (`triton_backend`): whole calls without gradients or dropout
(`triton_attention`, `_planned_call`: the key holds each input's shape, strides, dtype, storage offset and 16-byte
alignment, the device, the scale, the position terms, the relative-position mapping by value and causality; a
geometry with masks, packed rows or explicit positions adds its tensors to the inputs and what the call decides
from it on the host to the key), and the bodies of the forward and the backward (`_planned_forward`,
`_planned_bwd`: every tensor they read is an input, the geometry's and the dropout seed among them, so dropout
calls and training steps are planned there). Its module settings are compared at every call (``settings`` of
`Plans`: the module's globals by value, so a setting or a function patched in is seen, a dict changed in place is
not, but for the tile overrides). Not planned: calls under ``torch.compile`` (the compiled graph's custom ops run
their bodies unplanned), while a CUDA graph is captured, under autocast, under a dispatch mode of the caller's, or
where a gradient would be recorded.
"""

from __future__ import annotations

import dataclasses
import time
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
# Where a call's host time is what a plan saves (`Plans.call`'s ``timed``: CUDA, whose kernels run
# asynchronously), a plan is kept only if it does: the host time of TIMED_CALLS calls made is compared with that
# of its first TIMED_CALLS replays (the least of each). A body already lean, or one of many operations, each
# replayed with its views taken again, can take longer replayed (`benchmarks/triton_dispatch.py`, medians of three
# runs on a 2-core CPU: forward+backward without position terms 216 -> 269 µs, on the tables road 1088 -> 1244,
# where the distance road's went 698 -> 645).
TIMED_CALLS = 2

_aten = torch.ops.aten
# operations a replay makes directly (`_Alloc`, `_Fill`, `_Copy`), not as the recorded ATen call with its
# arguments rebuilt (`_Op`): the allocations, those filled with a value (the value's argument, or 0), the fills
# and copies
_ALLOCATIONS = {
    _aten.empty.memory_format,
    _aten.empty_like.default,
    _aten.empty_strided.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
}
_FILLED = {
    _aten.zeros.default: None,
    _aten.zeros_like.default: None,
    _aten.new_zeros.default: None,
    _aten.full.default: 1,
    _aten.full_like.default: 1,
}
_FILLS = {_aten.zero_.default: None, _aten.fill_.Scalar: 1}
# what a replay could not repeat, by the operations' tags: a random draw (it would draw again), a value read
# from the device, an output whose shape follows from values; but for an index by integer tensors (a gather:
# its shape follows from the indices' shapes)
_REFUSED_TAGS = (
    torch.Tag.nondeterministic_seeded,
    torch.Tag.data_dependent_output,
    torch.Tag.dynamic_output_shape,
)
_STATIC_INDEX = _aten.index.Tensor


def serves(device: torch.device, mode: str) -> bool:
    """Whether calls on ``device`` are planned in ``mode`` (one of `MODES`), in this context: not under
    ``torch.compile``, while a CUDA graph is captured, under autocast, nor under a dispatch mode: a caller's (a
    probe counting operations, `torch.library.opcheck`'s checks: they would see a replay's few operations, or the
    recording's mode beneath theirs), or the recorder's own (a call made inside a call being recorded); nor under
    a torch-function mode but ``torch.device``'s (a replay calls ATen operations, past a mode that would change
    what ``torch.bmm`` returns; a device context changes only where factories without a device allocate, and a
    call gives every allocation its device)."""
    if mode == "off" or (mode == "cuda" and device.type != "cuda"):
        return False
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    if torch._C._len_torch_function_stack() and not _device_contexts_alone():
        return False
    autocast = torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)
    return not autocast and not capturing_cuda_graph()


def _device_contexts_alone() -> bool:
    """Whether every torch-function mode in force is a ``torch.device`` context (`serves`)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    return all(type(mode) is DeviceContext for mode in _get_current_function_mode_stack())


def tensor_key(t: Tensor | None) -> Hashable:
    """What a plan's key holds of an input: None, or its shape, strides, dtype, storage offset and 16-byte
    alignment (views of it are replayed at the same storage offsets; Triton specialises on the alignment)."""
    if not isinstance(t, Tensor):
        return None if t is None else ("not a tensor", t)
    return t.shape, t.stride(), t.dtype, t.storage_offset(), t.data_ptr() % 16


def aliases(inputs: tuple) -> tuple[tuple[int, int], ...]:
    """The inputs that are an earlier input itself, as (position, the earlier's position): a call on ``(x, x, x)``
    reads one tensor where one on ``(q, k, v)`` reads three, and its plan, recorded through one root, would read
    the one for all three."""
    first: dict[int, int] = {}
    same = []
    for i, t in enumerate(inputs):
        if isinstance(t, Tensor) and first.setdefault(id(t), i) != i:
            same.append((i, first[id(t)]))
    return tuple(same)


class _View(NamedTuple):
    """A tensor of the call a plan's steps read or it returns: root number ``root`` (the inputs first, then each
    output of the call's operations in order), itself (``size`` None) or viewed at ``size``, ``stride`` and
    storage ``offset``; its first element ``shift`` bytes past the root's (a launch may take its address alone,
    `_launch`)."""

    root: int
    size: tuple[int, ...] | None = None
    stride: tuple[int, ...] | None = None
    offset: int = 0
    shift: int = 0


class _Slot(NamedTuple):
    """In a template (`_template`): the call's tensor of view number ``view``."""

    view: int


class _Node(NamedTuple):
    """In a template: a tuple, list, named tuple or dict (``make`` rebuilds it from its items) of templates."""

    make: Callable
    items: tuple


def _template(x: Any, slot: Callable[[Tensor], int | None]) -> Any:
    """``x`` with each tensor of the call (``slot`` gives its view number, None for a kept tensor) a `_Slot`, and
    its tuples, lists, named tuples, dicts and dataclass instances (a tensor descriptor of Triton's, which holds
    its base tensor) `_Node`s; anything else kept as it is."""
    if isinstance(x, Tensor):
        at = slot(x)
        return x if at is None else _Slot(at)
    names = _init_fields(x)
    if names is not None:
        # made again from its fields: a template holding the instance would keep the recorded call's tensors
        return _Node(_maker(type(x), names), tuple(_template(getattr(x, name), slot) for name in names))
    if isinstance(x, dict):
        keys = tuple(x)
        return _Node(
            lambda values, keys=keys: dict(zip(keys, values)), tuple(_template(x[k], slot) for k in keys)
        )
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return _Node(type(x)._make, tuple(_template(v, slot) for v in x))
    if isinstance(x, (tuple, list)):
        return _Node(type(x), tuple(_template(v, slot) for v in x))
    return x


def _init_fields(x: Any) -> tuple[str, ...] | None:
    """The names of a dataclass instance's fields that make it again (``init``), or None for anything else."""
    if not dataclasses.is_dataclass(x) or isinstance(x, type):
        return None
    return tuple(f.name for f in dataclasses.fields(x) if f.init)


def _maker(kind: type, names: tuple[str, ...]) -> Callable[[list], Any]:
    """A dataclass's instance made from its fields' values, in ``names``' order."""
    return lambda values: kind(**dict(zip(names, values)))


def _build(node: Any, view: Callable[[int], Tensor]) -> Any:
    """A `_template` filled in with this replay's views."""
    kind = type(node)
    if kind is _Slot:
        return view(node.view)
    if kind is _Node:
        return node.make([_build(item, view) for item in node.items])
    return node


class _Op(NamedTuple):
    """A recorded operation: ``func`` on ``call``, the `_template` of its ``(args, kwargs)``; its outputs at
    ``outputs`` (positions among them, a tensor alone being position 0) are new roots."""

    func: Any
    call: Any
    outputs: tuple[int, ...]


class _Launch(NamedTuple):
    """A recorded launch: ``kernel[grid](*args, **kwargs)`` with the tensors of the call at ``arg_slots``
    (position, view number) and ``kwarg_slots`` (name, view number) filled in at replay, and the arguments that
    hold such tensors (a tensor descriptor) rebuilt from their `_template`s at ``arg_nodes`` (position,
    template); ``key``, the launch's key on the shorter path (`triton_launch.Cached.key`; None off it)."""

    kernel: Any
    grid: Any
    args: tuple
    kwargs: dict
    arg_slots: tuple[tuple[int, int], ...]
    kwarg_slots: tuple[tuple[str, int], ...]
    arg_nodes: tuple[tuple[int, _Node], ...]
    key: tuple | None


class _Alloc(NamedTuple):
    """A recorded allocation, a new root: its size, strides, dtype and device."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


class _Fill(NamedTuple):
    """A recorded fill of view ``view`` with ``value``."""

    view: int
    value: float


class _Copy(NamedTuple):
    """A recorded copy into view ``target``, converting and broadcasting as ``copy_`` does: from view ``source``,
    or from a kept tensor itself."""

    target: int
    source: int | Tensor


class Plan(NamedTuple):
    """A recorded call (see the module docstring): the views its steps read and its result holds, its steps in
    the order it made them, the `_template` of its result, and whether each root from an operation started on
    16 bytes when recorded."""

    views: tuple[_View, ...]
    steps: tuple[_Alloc | _Fill | _Copy | _Op | _Launch, ...]
    result: Any
    aligned: tuple[bool, ...]

    def run(self, inputs: tuple) -> Any:
        """The call on new ``inputs`` of the plan's signature: its operations and launches alone."""
        roots = list(inputs)
        first = len(roots)  # the roots from operations start here
        views: list[Tensor | None] = [None] * len(self.views)

        def view(i: int) -> Tensor:
            t = views[i]
            if t is None:
                v = self.views[i]
                t = roots[v.root] if v.size is None else roots[v.root].as_strided(v.size, v.stride, v.offset)
                views[i] = t
            return t

        def address(i: int) -> int:
            v = self.views[i]
            return roots[v.root].data_ptr() + v.shift

        for step in self.steps:
            kind = type(step)
            if kind is _Alloc:
                roots.append(
                    torch.empty_strided(step.size, step.stride, dtype=step.dtype, device=step.device)
                )
                continue
            if kind is _Fill:
                view(step.view).fill_(step.value)
                continue
            if kind is _Copy:
                source = step.source
                view(step.target).copy_(source if isinstance(source, Tensor) else view(source))
                continue
            if kind is _Op:
                args, kwargs = _build(step.call, view)
                out = step.func(*args, **kwargs)
                outs = (out,) if isinstance(out, Tensor) else out
                roots += [outs[at] for at in step.outputs]
                continue
            made = roots[first:]  # (see `_launch`)
            keyed = tuple(r.data_ptr() % 16 == 0 for r in made) == self.aligned[: len(made)]
            _launch(step, view, address, keyed)
        return _build(self.result, view)


def _launch(
    launch: _Launch, view: Callable[[int], Tensor], address: Callable[[int], int], keyed: bool
) -> None:
    """A replayed launch, with its recorded key where ``keyed``: the inputs' 16-byte alignment is in the plan's
    key, and ``keyed`` says that the operations' outputs (the allocations) start on 16 bytes as they did when
    recorded (PyTorch's allocators align far more). Launched with its key on the shorter path, a kernel is
    given its tensors' addresses where that path takes them (`triton_launch.Cached.takes_addresses`): no view
    is made for it (10 in a forward's two launches)."""
    path = triton_launch.launcher(launch.kernel)
    keyed = keyed and launch.key is not None and isinstance(path, triton_launch.Cached)
    tensor = address if keyed and path.takes_addresses(launch.key) else view
    args, kwargs = list(launch.args), dict(launch.kwargs)
    for at, i in launch.arg_slots:
        args[at] = tensor(i)
    for name, i in launch.kwarg_slots:
        kwargs[name] = tensor(i)
    for at, node in launch.arg_nodes:
        args[at] = _build(node, view)
    if keyed:
        path.launch_keyed(launch.key, launch.grid, args, kwargs)
    else:
        path[launch.grid](*args, **kwargs)


class NotPlanned(Exception):
    """Why a recorded call cannot be planned (`record`)."""


class _Recorder(TorchDispatchMode):
    """Sees a call's PyTorch operations and launches (see the module docstring) and builds its `Plan`."""

    def __init__(self, inputs: tuple):
        super().__init__()
        # id -> root number of each tensor of the call (an input, an operation's output, or a view of one); every
        # such tensor kept alive while recording, so that no other tensor takes its id
        self.roots: list[Tensor] = list(inputs)
        self.origin: dict[int, int] = {id(t): i for i, t in enumerate(inputs) if isinstance(t, Tensor)}
        self.inputs = len(inputs)
        self.kept: list[Tensor] = []
        # ("alloc", tensor), ("fill", tensor, value), ("copy", target, source), ("op", func, args, kwargs, new
        # outputs) or ("launch", kernel, grid, args, kwargs), in order
        self.steps: list[tuple] = []
        self.refusal: str | None = None
        self.launching = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # (a launch's own operations, the interpreter's copies, are not the call's)
        if not self.launching and self.refusal is None:
            self.refusal = self._note(func, args, kwargs, out)
        return out

    def _note(self, func, args: tuple, kwargs: dict, out: Any) -> str | None:
        """Notes an operation of the call; why the call cannot be planned, or None."""
        outs = (out,) if isinstance(out, Tensor) else tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if any(not isinstance(t, Tensor) for t in outs):
            return f"the call reads a value from {func}"
        if func.is_view and all(_shares_storage(t, args[0]) for t in outs):
            parent = args[0]
            root = self.origin.get(id(parent))
            for t in outs:
                if root is not None:
                    if t.dtype != parent.dtype:
                        return f"{func} views a tensor as another dtype"
                    self._derive(t, root)
            return None
        if any(tag in func.tags for tag in _REFUSED_TAGS) and not _static_index(func, args):
            return f"the call runs {func}, whose result a replay would not repeat"
        if torch.Tag.inplace_view in func.tags:
            # (a view's size and strides are recorded as the call left them, for the steps before too)
            return f"{func} changes a tensor's size or strides in place"
        written = _written(func, args, kwargs)
        if any(self.origin.get(id(t), -1) < self.inputs for t in written):
            return f"{func} writes into a tensor the call did not make"
        if func in _ALLOCATIONS or func in _FILLED:
            self._derive(out, len(self.roots))
            self.roots.append(out)
            self.steps.append(("alloc", out))
            if func in _FILLED:
                at = _FILLED[func]
                self.steps.append(("fill", out, 0 if at is None else args[at]))
            return None
        if func in _FILLS:
            at = _FILLS[func]
            self.steps.append(("fill", args[0], 0 if at is None else args[at]))
            return None
        if func is _aten.copy_.default:
            self.steps.append(("copy", args[0], args[1]))
            return None
        new = []
        given = _tensors((args, kwargs))
        for at, t in enumerate(outs):
            # (an output that is an argument itself, written or returned as it is, `type_as` to its own dtype
            # under inference mode: no new root)
            if not any(t is g for g in given):
                new.append(at)
                self._derive(t, len(self.roots))
                self.roots.append(t)
        self.steps.append(("op", func, args, kwargs, tuple(new)))
        return None

    def _derive(self, t: Tensor, root: int) -> None:
        self.origin[id(t)] = root
        self.kept.append(t)

    def launch(self, kernel, grid, args: tuple, kwargs: dict) -> None:
        """`triton_launch.launcher`'s hook while recording: the launch noted, then made."""
        self.steps.append(("launch", kernel, grid, args, dict(kwargs)))
        self.launching = True
        try:
            triton_launch.launcher(kernel, hooked=False)[grid](*args, **kwargs)
        finally:
            self.launching = False

    def plan(self, result: Any) -> Plan:
        """The recorded call as a `Plan` returning ``result``; `NotPlanned` where it cannot be one."""
        if self.refusal is not None:
            raise NotPlanned(self.refusal)
        if not any(step[0] == "launch" for step in self.steps):
            # (a launch that did not go through `triton_launch.launcher` would not be replayed)
            raise NotPlanned("the call handed no launch to the recorder")
        views: list[_View] = []
        steps = tuple(self._step(step, views) for step in self.steps)
        kept = []
        template = _template(result, lambda t: self._view(t, views) if self._of_call(t) else kept.append(t))
        if kept:
            raise NotPlanned("the call returns a tensor that is not one of its own")
        aligned = tuple(r.data_ptr() % 16 == 0 for r in self.roots[self.inputs :])
        return Plan(tuple(views), steps, template, aligned)

    def _step(self, step: tuple, views: list[_View]) -> _Alloc | _Fill | _Copy | _Op | _Launch:
        def slot(t: Tensor) -> int | None:
            return self._view(t, views) if self._of_call(t) else None

        if step[0] == "alloc":
            t = step[1]
            return _Alloc(tuple(t.shape), t.stride(), t.dtype, t.device)
        if step[0] == "fill":
            return _Fill(slot(step[1]), step[2])
        if step[0] == "copy":
            source = step[2]
            return _Copy(slot(step[1]), slot(source) if self._of_call(source) else source)
        if step[0] == "op":
            _, func, args, kwargs, new = step
            return _Op(func, _template((args, kwargs), slot), new)
        _, kernel, grid, args, kwargs = step
        path = triton_launch.launcher(kernel, hooked=False)
        key = path.key(grid, args, kwargs) if isinstance(path, triton_launch.Cached) else None
        arg_slots = tuple((at, slot(a)) for at, a in enumerate(args) if self._of_call(a))
        kwarg_slots = tuple((name, slot(a)) for name, a in kwargs.items() if self._of_call(a))
        if any(self._holds_call_tensors(a) for a in kwargs.values()):
            raise NotPlanned("a launch's keyword argument holds a tensor of the call")
        arg_nodes = tuple(
            (at, _template(a, slot)) for at, a in enumerate(args) if self._holds_call_tensors(a)
        )
        nodes = {at for at, _ in arg_nodes}
        args = tuple(None if self._of_call(a) or at in nodes else a for at, a in enumerate(args))
        kwargs = {name: (None if self._of_call(a) else a) for name, a in kwargs.items()}
        return _Launch(kernel, grid, args, kwargs, arg_slots, kwarg_slots, arg_nodes, key)

    def _holds_call_tensors(self, x: Any) -> bool:
        """Whether ``x`` is a container `_template` takes apart (a tuple, list, dict or dataclass instance) holding
        a tensor of the call."""
        return not isinstance(x, Tensor) and any(self._of_call(t) for t in _tensors(x))

    def _of_call(self, t: Any) -> bool:
        """Whether ``t`` is a tensor of the call: an input, an operation's output, or a view of one."""
        return isinstance(t, Tensor) and id(t) in self.origin

    def _view(self, t: Tensor, views: list[_View]) -> int:
        """The number of ``t``'s view among ``views`` (added where new)."""
        root = self.origin[id(t)]
        base = self.roots[root]
        shift = (t.storage_offset() - base.storage_offset()) * t.element_size()
        view = (
            _View(root) if t is base else _View(root, tuple(t.shape), t.stride(), t.storage_offset(), shift)
        )
        if view not in views:
            views.append(view)
        return views.index(view)


def _shares_storage(t: Tensor, parent: Any) -> bool:
    """Whether an output of a view operation is a view of ``parent`` indeed: ``reshape`` and its kind are marked
    as views but copy where the strides do not allow one (they reach the recorder undecomposed under
    ``torch.inference_mode``); such a copy is recorded as an operation, a new root."""
    return (
        isinstance(parent, Tensor) and t.untyped_storage().data_ptr() == parent.untyped_storage().data_ptr()
    )


def _tensors(x: Any) -> list[Tensor]:
    """The tensors in ``x``'s tuples, lists, dicts and dataclass instances (`_template`'s containers)."""
    if isinstance(x, Tensor):
        return [x]
    names = _init_fields(x)
    if names is not None:
        x = tuple(getattr(x, name) for name in names)
    elif isinstance(x, dict):
        x = tuple(x.values())
    return [t for item in x for t in _tensors(item)] if isinstance(x, (tuple, list)) else []


def _written(func, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors ``func`` writes into: its arguments marked as written in its schema (``self`` of an in-place
    operation, ``out=``)."""
    written = []
    for at, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = kwargs[arg.name] if arg.name in kwargs else args[at] if at < len(args) else None
        written += [value] if isinstance(value, Tensor) else [t for t in value or () if isinstance(t, Tensor)]
    return written


def _static_index(func, args: tuple) -> bool:
    """An index by int64 or int32 tensors alone (``t[:, rows]``): its shape follows from theirs (a bool or uint8
    index is a mask, whose result's shape follows from its values)."""
    if func is not _STATIC_INDEX:
        return False
    return all(
        i is None or (isinstance(i, Tensor) and i.dtype in (torch.int64, torch.int32)) for i in args[1]
    )


def record(call: Callable[[], Any], inputs: tuple) -> tuple[Any, Plan | None, str | None]:
    """Run ``call`` recording it: its result, its `Plan` (None where it cannot be planned) and why not."""
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
        self.refusal: str | None = None
        self.made: list[float] = []  # host seconds of timed calls made, and of timed replays (`TIMED_CALLS`)
        self.replayed: list[float] = []


class Plans:
    """Plans by signature (`PLANS_KEPT`), each for up to `SNAPSHOTS_KEPT` snapshots of ``settings()`` (compared by
    value at every call); ``hits`` counts the calls replayed, ``recorded`` the recordings."""

    def __init__(self, settings: Callable[[], tuple]):
        self.settings = settings
        self.entries: OrderedDict[Hashable, list[_Entry]] = OrderedDict()
        self.hits = self.recorded = 0

    def call(self, key: Hashable, inputs: tuple, call: Callable[[], Any], timed: bool = False) -> Any:
        """``call()``, whose result is a function of ``inputs`` (tensors among them) and ``key`` alone, or its
        plan's replay on ``inputs``. With ``timed``, a plan is kept only where it saves host time
        (`TIMED_CALLS`). Inputs that are one tensor (`aliases`) add that to the key."""
        same = aliases(inputs)
        entry = self._entry((key, same) if same else key, self.settings())
        if entry.plan is not None:
            self.hits += 1
            if not timed or len(entry.replayed) >= TIMED_CALLS:
                return entry.plan.run(inputs)
            return self._trial(entry, inputs)
        entry.calls += 1
        if entry.calls == 1 or entry.recordings >= RECORDINGS:
            return call()
        if timed and len(entry.made) < TIMED_CALLS:
            start = time.perf_counter()
            result = call()
            entry.made.append(time.perf_counter() - start)
            return result
        entry.recordings += 1
        self.recorded += 1
        result, entry.plan, entry.refusal = record(call, inputs)
        return result

    @staticmethod
    def _trial(entry: _Entry, inputs: tuple) -> Any:
        """A timed replay (`TIMED_CALLS`); after the last, the plan dropped where its replays took no less host
        time than the calls made."""
        start = time.perf_counter()
        result = entry.plan.run(inputs)
        entry.replayed.append(time.perf_counter() - start)
        if len(entry.replayed) == TIMED_CALLS and min(entry.replayed) >= min(entry.made):
            replayed, made = min(entry.replayed) * 1e6, min(entry.made) * 1e6
            entry.plan, entry.recordings = None, RECORDINGS
            entry.refusal = f"replayed in {replayed:.0f} µs of host time, made in {made:.0f}"
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
