"""Call plans (`triton_plan`): a replayed call gives what the call itself gives, on new inputs of its signature.

The backend's calls run with plans here (`CALL_PLANS` "always", under the interpreter on CPU): a signature's first
call runs as it always does, its second is recorded, the later ones are replayed. Each replay runs on new input
values and is checked bit for bit against the call without plans on those values, over a named grid of roads.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
import torch

pytest.importorskip("triton")

from debertakit.attention import (  # noqa: E402
    Geometry,
    PositionTerms,
    RelativeIndex,
    packed_geometry,
    triton_backend,
    triton_launch,
    triton_plan,
)
from debertakit.attention.triton_backend import triton_attention  # noqa: E402
from tests.attention.test_triton import CLAMP, DEVICE, Case, deterministic_algorithms  # noqa: E402

PLAN_GRID = {
    "v3_buckets_bf16": (Case(n=40, batch=2, heads=2), torch.bfloat16),  # far tiles: FAR copied from COL
    "v1_clamp": (Case(n=40, rel=CLAMP), torch.float16),
    "no_far_tiles": (Case(n=16, batch=2), torch.bfloat16),
    "c2p_only": (Case(n=24, terms=PositionTerms(c2p=True, p2c=False)), torch.bfloat16),
    "p2c_only": (Case(n=24, terms=PositionTerms(c2p=False, p2c=True)), torch.float16),
    "causal": (Case(n=40, causal=True), torch.bfloat16),
    "no_position_terms": (Case(n=24, terms=PositionTerms(c2p=False, p2c=False)), torch.float16),
    "cross_nq_lt_nk": (Case(n=12, n_k=30), torch.bfloat16),
    "d32": (Case(n=24, dim=32), torch.bfloat16),
}


def _values(c: Case, dtype: torch.dtype, seed: int) -> tuple:
    """Inputs of case ``c``'s signature (q, k, v laid out as the projections give them), values drawn from
    ``seed``."""
    g = torch.Generator().manual_seed(seed)
    n_k = c.n_k or c.n

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)

    q, k, v = (rnd(c.batch, n, c.heads, c.dim).transpose(1, 2) for n in (c.n, n_k, n_k))
    pos_q = rnd(c.heads, c.rel.table_rows, c.dim) if (c.terms.p2c or c.terms.p2p) else None
    pos_k = rnd(c.heads, c.rel.table_rows, c.dim) if (c.terms.c2p or c.terms.p2p) else None
    return q, k, v, pos_q, pos_k


def _call(c: Case, inputs: tuple, **kw) -> torch.Tensor:
    with torch.no_grad():
        out, _ = triton_attention(*inputs, c.rel, Geometry(causal=c.causal), scale=0.3, terms=c.terms, **kw)
    return out


def _unplanned(monkeypatch, c: Case, inputs: tuple) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setattr(triton_backend, "CALL_PLANS", "off")
        return _call(c, inputs)


@pytest.fixture
def plans(monkeypatch):
    """Plans on, under the interpreter too, in a store of this test's own."""
    store = triton_plan.Plans(triton_backend._plan_settings)
    monkeypatch.setattr(triton_backend, "_PLANS", store)
    monkeypatch.setattr(triton_backend, "CALL_PLANS", "always")
    return store


def _whole(store: triton_plan.Plans) -> list:
    """The keys of whole calls' plans (a body's key starts with "forward" or "backward"; one on inputs that are
    one tensor is the pair of a key and `triton_plan.aliases`)."""
    return [
        key
        for key in store.entries
        if (key[0] if isinstance(key[0], tuple) else key)[0] not in ("forward", "backward")
    ]


def _only_entry(store: triton_plan.Plans) -> triton_plan._Entry:
    """The one plan entry of whole calls (a call's first run, not planned as a whole, also sees its forward body's
    signature, keyed "forward", once)."""
    (entries,) = [store.entries[key] for key in _whole(store)]
    (entry,) = entries
    return entry


@pytest.mark.parametrize("name", list(PLAN_GRID))
def test_replayed_calls_give_the_calls_output_on_new_inputs(monkeypatch, plans, name):
    c, dtype = PLAN_GRID[name]
    for seed in range(4):  # run, recorded, replayed, replayed
        inputs = _values(c, dtype, seed)
        want = _unplanned(monkeypatch, c, inputs)
        got = _call(c, inputs)
        assert torch.equal(got, want), f"call {seed}"
        assert got.dtype == dtype and got.shape == want.shape and got.stride() == want.stride()
    entry = _only_entry(plans)
    assert entry.refusal is None and entry.plan is not None
    assert (plans.recorded, plans.hits) == (1, 2)


V3_BASE = RelativeIndex(span=256, bucket_size=256, max_position=512)


@pytest.mark.gpu
@pytest.mark.parametrize("n, batch", [(128, 1), (512, 8), (2048, 2)])
def test_replayed_calls_give_the_calls_output_at_real_sizes(monkeypatch, n, batch):
    """On CUDA with the default `CALL_PLANS` ("cuda"), v3-base positions, bfloat16, 12 heads, d 64 (from N = 1024
    on the plan copies FAR from COL): the signature's first calls made (`TIMED_CALLS` of them timed), one
    recorded, the next replayed (and kept only where they save host time); every output bit for bit the call's
    on the same inputs."""
    store = triton_plan.Plans(triton_backend._plan_settings)
    monkeypatch.setattr(triton_backend, "_PLANS", store)
    c = Case(n=n, batch=batch, heads=12, dim=64, rel=V3_BASE)
    for seed in range(8):
        inputs = _values(c, torch.bfloat16, seed)
        assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs)), f"call {seed}"
    assert store.recorded == 1 and store.hits >= triton_plan.TIMED_CALLS, _only_entry(store).refusal


@pytest.mark.gpu
def test_forward_backward_replays_at_real_sizes(monkeypatch):
    """A training step's attention on CUDA (the forward's and the backward's bodies planned): output and every
    gradient bit for bit those of the calls made, over eight steps."""
    store = triton_plan.Plans(triton_backend._plan_settings)
    monkeypatch.setattr(triton_backend, "_PLANS", store)
    c = Case(n=512, batch=4, heads=12, dim=64, rel=V3_BASE)
    for seed in range(8):
        inputs = _values(c, torch.bfloat16, seed)
        with deterministic_algorithms(
            monkeypatch, warn_only=True
        ):  # the tables' rows summed in a fixed order
            with monkeypatch.context() as m:
                m.setattr(triton_backend, "CALL_PLANS", "off")
                want = _forward_backward(c, inputs)
            got = _forward_backward(c, inputs)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), f"step {seed}"
    assert store.recorded == 2 and store.hits >= 2 * triton_plan.TIMED_CALLS


def test_replays_write_new_buffers(plans):
    c, dtype = PLAN_GRID["v3_buckets_bf16"]
    outs = [_call(c, _values(c, dtype, seed)) for seed in range(4)]
    kept = outs[2].clone()
    assert plans.hits == 2
    assert outs[3].untyped_storage().data_ptr() != outs[2].untyped_storage().data_ptr()
    assert torch.equal(outs[2], kept)  # the later replay wrote elsewhere


def test_inputs_that_are_one_tensor_get_a_plan_of_their_own(monkeypatch, plans):
    """A call on ``(x, x, x)`` reads one tensor for queries, keys and values: its plan is not replayed for calls
    of the same layouts on three tensors, which get a plan of their own; every output the call's."""
    c, dtype = PLAN_GRID["no_far_tiles"]
    for seed in range(6):
        q, k, v, pos_q, pos_k = _values(c, dtype, seed)
        inputs = (
            (q, q, q, pos_q, pos_k) if seed < 3 else (q, k, v, pos_q, pos_k)
        )  # (made, recorded, replayed)
        assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs)), f"call {seed}"
    whole = _whole(plans)
    assert len(whole) == 2 and plans.hits == 2
    x = torch.zeros(2)
    assert triton_plan.aliases((x, None, x, x.clone(), None, x)) == ((2, 0), (5, 0))


def test_a_plan_allocates_fills_and_launches_what_the_call_did(plans):
    """The default road at this signature: the distance tables' buffer (the zeros around the tables filled,
    then each table NaN-poisoned, as in every test), the tables' product kernel, the output and the logsumexp,
    then the forward kernel; no other operation."""
    c, dtype = PLAN_GRID["no_far_tiles"]
    for seed in range(2):
        _call(c, _values(c, dtype, seed))
    plan = _only_entry(plans).plan
    kinds = [type(step).__name__ for step in plan.steps]
    assert kinds == ["_Alloc", "_Fill", "_Fill", "_Fill", "_Launch", "_Alloc", "_Alloc", "_Launch"]
    assert [str(plan.steps[i].value) for i in (1, 2, 3)] == ["0", "nan", "nan"]
    assert [plan.steps[i].kernel.__name__ for i in (4, 7)] == ["_distance_product_kernel", "_fwd_kernel"]
    inputs = 5  # q, k, v and the two tables: the roots after them are the allocations, in order
    assert {plan.views[plan.steps[i].view].root for i in (1, 2, 3)} == {inputs}
    out = plan.result.items[0]
    assert plan.views[out.view].root == inputs + 1 and plan.result.items[1] is None


def _leaves(inputs: tuple) -> list:
    return [None if t is None else t.detach().requires_grad_() for t in inputs]


def _forward_backward(c: Case, inputs: tuple, geom: Geometry | None = None, **kw) -> list:
    """Output and the gradients of every input, after a forward and a backward with a fixed output gradient."""
    leaves = _leaves(inputs)
    geom = Geometry(causal=c.causal) if geom is None else geom
    out, _ = triton_attention(*leaves, c.rel, geom, scale=0.3, terms=c.terms, **kw)
    out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape).to(out))
    return [out.detach(), *(t.grad for t in leaves if t is not None)]


TRAINING_GRID = {
    "v1_clamp": (Case(n=24, rel=CLAMP), torch.bfloat16),  # (saturates at 8)
    "p2c_only": PLAN_GRID["p2c_only"],
    "d32": PLAN_GRID["d32"],
}


@pytest.mark.parametrize("name", list(TRAINING_GRID))
def test_forwards_with_grad_and_backwards_are_replayed_from_their_bodies_plans(monkeypatch, plans, name):
    """A forward with grad runs the autograd node (not planned as a call); its forward body and its backward are
    planned each (keys "forward" and "backward"), and give the output and every gradient bit for bit."""
    c, dtype = TRAINING_GRID[name]
    for seed in range(4):
        inputs = _values(c, dtype, seed)
        with monkeypatch.context() as m:
            m.setattr(triton_backend, "CALL_PLANS", "off")
            want = _forward_backward(c, inputs)
        got = _forward_backward(c, inputs)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), f"call {seed}"
    bodies = {key[0]: entries[0] for key, entries in plans.entries.items()}
    assert set(bodies) == {"forward", "backward"}
    assert all(entry.plan is not None for entry in bodies.values())
    # (each of the three saturates: FAR copied from COL's saturated cells, replayed)
    assert sum(type(step).__name__ == "_Copy" for step in bodies["forward"].plan.steps) == 1
    assert (plans.recorded, plans.hits) == (2, 4)


def test_plans_follow_the_deterministic_algorithms_setting(monkeypatch, plans):
    """Plans recorded without PyTorch's deterministic algorithms are not replayed under them (the backward sums the
    tables' rows by other ops there, `_into_rows`): the setting is in every plan's key. Under them a training
    step's bodies are recorded again and replayed bit for bit."""
    c, dtype = TRAINING_GRID["v1_clamp"]
    for seed in range(3):  # made, recorded, replayed
        _forward_backward(c, _values(c, dtype, seed))
    assert (plans.recorded, plans.hits) == (2, 2)
    with deterministic_algorithms(monkeypatch):
        for seed in range(3, 7):
            inputs = _values(c, dtype, seed)
            with monkeypatch.context() as m:
                m.setattr(triton_backend, "CALL_PLANS", "off")
                want = _forward_backward(c, inputs)
            for a, b in zip(_forward_backward(c, inputs), want, strict=True):
                assert torch.equal(a, b), f"call {seed}"
    assert (plans.recorded, plans.hits) == (4, 6)


def _masked_geometry(name: str, c: Case, seed: int) -> Geometry:
    """A new geometry of `MASKED_GRID`'s kind ``name`` for call ``seed``: other masks, sequence boundaries or
    positions each call, what the plan's key holds of them the same (the packed rows' longest sequence, 16)."""
    g = torch.Generator().manual_seed(seed)
    if name.startswith("key_mask"):
        mask = torch.rand(c.batch, c.n, generator=g) > 0.3
        return Geometry(key_mask=mask.to(DEVICE), causal=c.causal)
    if name == "packed":
        a = 8 + seed  # sequences of 16, a and 24 - a tokens
        geom, _ = packed_geometry(torch.tensor([0, 16, 16 + a, 40], device=DEVICE), c.n, causal=c.causal)
        return geom
    offset = int(torch.randint(0, 30, (), generator=g))  # queries at offset + i, keys at j
    n_k = c.n_k or c.n
    return Geometry(
        q_positions=(offset + torch.arange(c.n))[None].to(DEVICE),
        k_positions=torch.arange(n_k)[None].to(DEVICE),
    )


MASKED_GRID = {
    "key_mask": (Case(n=24, batch=2, terms=PositionTerms(c2p=True, p2c=False)), torch.bfloat16),
    "key_mask_causal_v1": (Case(n=24, batch=2, rel=CLAMP, causal=True), torch.float16),
    "packed": (Case(n=40, causal=True), torch.bfloat16),
    "explicit_positions": (Case(n=12, n_k=30), torch.bfloat16),
}


@pytest.mark.parametrize("name", list(MASKED_GRID))
def test_calls_on_geometries_with_tensors_are_planned_as_a_whole(monkeypatch, plans, name):
    """A key mask, packed segments or explicit positions: tensors per geometry (a model's forward), which the
    whole call's plan takes among its inputs. Each call on a new geometry (its tensors built before the plan,
    never recorded) and new inputs gives bit for bit the call without plans; the plan replays none of the
    operations that build the geometry's block ranges (`_key_ranges`)."""
    c, dtype = MASKED_GRID[name]
    for seed in range(4):
        inputs = _values(c, dtype, seed)
        geom = _masked_geometry(name, c, seed)
        with monkeypatch.context() as m, torch.no_grad():
            m.setattr(triton_backend, "CALL_PLANS", "off")
            want, _ = triton_attention(*inputs, c.rel, dataclasses.replace(geom), scale=0.3, terms=c.terms)
        with torch.no_grad():
            got, _ = triton_attention(*inputs, c.rel, geom, scale=0.3, terms=c.terms)
        assert torch.equal(got, want), f"call {seed}"
    entry = _only_entry(plans)
    assert entry.refusal is None and (plans.recorded, plans.hits) == (1, 2)
    replayed = {step.func for step in entry.plan.steps if isinstance(step, triton_plan._Op)}
    assert not replayed & _RANGE_OPS, replayed


_aten = torch.ops.aten
_RANGE_OPS = {_aten.minimum.default, _aten.maximum.default, _aten.where.self, _aten.min.dim, _aten.max.dim}


def _packed(cu_seqlens: list[int], n: int) -> Geometry:
    return packed_geometry(torch.tensor(cu_seqlens, device=DEVICE), n)[0]


def test_what_a_call_decides_from_its_geometry_is_in_the_key(monkeypatch, plans):
    """Geometries whose tensors' shapes agree but whose calls differ on the host: explicit positions (the tables
    road) beside default ones, packed rows whose longest sequences differ (the tables cut elsewhere). Each gets a
    plan of its own, and every call (three each, interleaved: made, recorded, replayed) gives the call's output
    without plans."""
    c, dtype = MASKED_GRID["packed"]
    mask = (torch.arange(c.n) < 30)[None].to(DEVICE)
    arange = torch.arange(c.n)[None].to(DEVICE)
    geometries = {
        "key mask": lambda: Geometry(key_mask=mask),
        "key mask, explicit positions": lambda: Geometry(
            key_mask=mask, q_positions=5 + arange, k_positions=arange
        ),
        # (the tables cut at distance 12 and 8, these positions saturating at 16: a plan cut at 8 would be
        # wrong for the first)
        "packed, 12 the longest": lambda: _packed([0, 12, 24, 36, 40], c.n),
        "packed, 8 the longest": lambda: _packed([0, 8, 16, 24, 32, 40], c.n),
    }
    for seed in range(3):
        for name, geometry in geometries.items():
            inputs = _values(c, dtype, seed)
            with monkeypatch.context() as m, torch.no_grad():
                m.setattr(triton_backend, "CALL_PLANS", "off")
                want, _ = triton_attention(*inputs, c.rel, geometry(), scale=0.3, terms=c.terms)
            with torch.no_grad():
                got, _ = triton_attention(*inputs, c.rel, geometry(), scale=0.3, terms=c.terms)
            assert torch.equal(got, want), f"{name}, call {seed}"
    whole = _whole(plans)
    assert len(whole) == len(geometries) and plans.hits == len(geometries)


def test_calls_with_dropout_plan_the_forward_body(monkeypatch, plans):
    """Dropout (a seed drawn per call) leaves the call unplanned, but its forward body takes the seed as an
    input: planned, each replay on a new seed the call's output."""
    c, dtype = PLAN_GRID["c2p_only"]
    for seed in range(4):
        inputs = _values(c, dtype, seed)
        outs = []
        for mode in ("off", "always"):
            monkeypatch.setattr(triton_backend, "CALL_PLANS", mode)
            torch.manual_seed(seed)  # the same dropout seed drawn both times
            with torch.no_grad():
                outs.append(
                    triton_attention(*inputs, c.rel, Geometry(), scale=0.3, terms=c.terms, dropout_p=0.2)[0]
                )
        assert torch.equal(*outs), f"call {seed}"
    (key,) = plans.entries
    assert key[0] == "forward" and plans.hits == 2


def test_calls_under_autocast_or_a_dispatch_mode_are_not_planned(plans):
    """Autocast: the body turns it off around its operations; a dispatch mode of the caller's (a probe counting
    operations, `torch.library.opcheck`'s checks) would see a replay's few operations."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    c, dtype = PLAN_GRID["p2c_only"]
    inputs = _values(c, dtype, 0)
    for context in (lambda: torch.autocast(DEVICE, dtype=torch.bfloat16), Probe):
        for _ in range(3):
            with context(), torch.no_grad():
                triton_attention(*inputs, c.rel, Geometry(), scale=0.3, terms=c.terms)
    assert not plans.entries


@pytest.mark.parametrize(
    "dtype, near_band, operation",
    [
        (torch.float32, "distance", "aten.bmm.default"),
        (torch.bfloat16, "tables", "aten.bmm.default"),
        (torch.bfloat16, "skew", "aten.bmm.default"),
    ],
)
def test_roads_with_other_operations_replay_them(monkeypatch, plans, dtype, near_band, operation):
    """Float32 tables are products of matmuls, the tables road's too: the plan replays them as operations; the
    skewed kernels read the position tables themselves, but for the products of the two saturated ends. Every
    replay on new inputs is the call's output."""
    monkeypatch.setattr(triton_backend, "NEAR_BAND", near_band)
    c = PLAN_GRID["v1_clamp"][0]
    for seed in range(4):
        inputs = _values(c, dtype, seed)
        assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs)), f"call {seed}"
    plan = _only_entry(plans).plan
    ops = {str(step.func) for step in plan.steps if type(step).__name__ == "_Op"}
    assert operation in ops, ops
    assert plans.hits == 2


def test_padded_head_dims_replay_the_padding(monkeypatch, plans):
    """Head dim 24 runs at 32 with zero columns (`F.pad`) and is cut back: the plan of the outer call holds the
    padding and the call it makes at 32 (not planned on its own while the outer one is recorded)."""
    c = dataclasses.replace(PLAN_GRID["c2p_only"][0], dim=24)
    for seed in range(4):
        inputs = _values(c, torch.bfloat16, seed)
        want = _unplanned(monkeypatch, c, inputs)
        got = _call(c, inputs)
        assert got.shape[-1] == 24 and torch.equal(got, want)
    (plan,) = [e.plan for entries in plans.entries.values() for e in entries if e.plan is not None]
    assert "aten.constant_pad_nd.default" in {str(s.func) for s in plan.steps if type(s).__name__ == "_Op"}


def test_plans_follow_the_module_settings(monkeypatch, plans):
    """A setting changed (here the tables built in two launches instead of one) is another snapshot: a plan of
    its own, recorded anew, and the old one kept for when the setting returns."""
    c, dtype = PLAN_GRID["v3_buckets_bf16"]
    for seed in range(3):
        _call(c, _values(c, dtype, seed))
    with monkeypatch.context() as m:
        m.setattr(triton_backend, "PRODUCT_LAUNCHES", "two")
        for seed in range(3):
            inputs = _values(c, dtype, 10 + seed)
            assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs))
    (entries,) = [e for key, e in plans.entries.items() if key[0] != "forward"]
    launches = [sum(type(s).__name__ == "_Launch" for s in e.plan.steps) for e in entries]
    assert launches == [2, 3]
    hits = plans.hits
    _call(c, _values(c, dtype, 20))
    assert plans.hits == hits + 1 and plans.recorded == 2


def test_tile_overrides_changed_in_place_are_seen(monkeypatch, plans):
    c, dtype = PLAN_GRID["causal"]
    for seed in range(3):
        _call(c, _values(c, dtype, seed))
    monkeypatch.setitem(triton_backend.TILE_OVERRIDES, "_fwd_kernel", triton_backend.Tiles(32, 16, 1, 1))
    inputs = _values(c, dtype, 5)
    assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs))
    assert len([e for key, e in plans.entries.items() if key[0] != "forward"][0]) == 2


def test_a_launcher_patched_in_turns_plans_off(monkeypatch, plans):
    """Launches that do not go through `triton_launch.launcher` would not reach the recorder."""
    monkeypatch.setattr(triton_backend, "launcher", lambda kernel: kernel)
    c, dtype = PLAN_GRID["c2p_only"]
    for seed in range(3):
        _call(c, _values(c, dtype, seed))
    assert not plans.entries


def test_keys_tell_apart_what_the_replay_depends_on():
    x = torch.randn(4, 64)
    base = triton_plan.tensor_key(x)
    assert triton_plan.tensor_key(x.clone()) == base
    assert triton_plan.tensor_key(torch.randn(2, 64)[:, 4:60]) != triton_plan.tensor_key(torch.randn(2, 56))
    views = torch.randn(300)
    offsets = {triton_plan.tensor_key(views[i : i + 256]) for i in range(3)}
    assert len(offsets) == 3  # storage offset (and with it the 16-byte alignment)
    assert triton_plan.tensor_key(x.t()) != base and triton_plan.tensor_key(x.half()) != base


class _Kernel:
    """A stand-in kernel: ``kernel[grid](*args)`` runs ``fn(*args)`` (its PyTorch operations are the launch's
    own, which the recorder does not judge)."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


_CONSTANT = torch.zeros(3)


def _launch(kernel, *args):
    triton_launch.launcher(kernel)[(1,)](*args)


def _record(fn, *inputs):
    return triton_plan.record(lambda: (fn(*inputs), None), inputs)


def test_operations_and_launches_replay_in_their_order():
    """A buffer filled between two launches (the first writes it whole, a fill zeros half of it, the second reads
    it), an operation's output read by a launch and written by another operation, a view of it returned:
    replayed on new inputs, each step in its order, the result the call's."""
    double = _Kernel(lambda x, out: out.copy_(2 * x))
    plus = _Kernel(lambda x, buf, gram, out: out.copy_(x + buf + gram[:, :1]))

    def call(x):
        buf, out = torch.empty_like(x), torch.empty(x.shape)
        _launch(double, x, buf)
        buf[:, :2].zero_()
        gram = x @ x.t()
        gram.add_(1)
        _launch(plus, x.t().t(), buf, gram, out)
        return out[1:], gram

    _, plan, refusal = _record(call, torch.randn(3, 4))
    assert refusal is None
    x = torch.randn(3, 4)
    (got, got_gram), (want, want_gram) = plan.run((x,))[0], call(x)
    assert torch.equal(got, want) and torch.equal(got_gram, want_gram)
    assert got._base is not None  # a view, as the call's


@dataclasses.dataclass
class _Descriptor:
    """A stand-in for Triton's host-side tensor descriptor (a dataclass holding its base tensor and its layout)."""

    base: torch.Tensor
    shape: list


def test_launch_arguments_holding_tensors_of_the_call_are_rebuilt():
    """A launch given a tensor descriptor of a buffer the call made (the product kernel's TMA stores,
    `PRODUCT_STORES` "tma") gets, replayed, a descriptor of the replay's buffer, not of the recorded call's."""
    store = _Kernel(lambda x, desc: desc.base.copy_(2 * x))

    def call(x):
        out = torch.empty(x.shape)
        _launch(store, x, _Descriptor(out, list(out.shape)))
        return out

    _, plan, refusal = _record(call, torch.randn(3, 4))
    assert refusal is None
    (launch,) = [step for step in plan.steps if isinstance(step, triton_plan._Launch)]
    assert launch.args[1] is None  # the recorded call's descriptor not kept
    x = torch.randn(3, 4)
    assert torch.equal(plan.run((x,))[0], 2 * x)


def test_the_product_kernel_s_descriptor_is_rebuilt_per_replay(monkeypatch, plans):
    """With TMA stores (`PRODUCT_STORES` "tma": a descriptor of the distance tables' buffer among the product
    kernel's arguments) the replays give the calls' outputs, each launch's descriptor rebuilt on the replay's
    buffer."""
    monkeypatch.setattr(triton_backend, "PRODUCT_STORES", "tma")
    c, dtype = PLAN_GRID["c2p_only"]
    for seed in range(3):
        inputs = _values(c, dtype, seed)
        assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs)), f"call {seed}"
    launches = [step for step in _only_entry(plans).plan.steps if isinstance(step, triton_plan._Launch)]
    product = next(step for step in launches if step.kernel.__name__ == "_distance_product_kernel")
    (at, node), *_ = product.arg_nodes
    assert product.args[at] is None and isinstance(node, triton_plan._Node)


class _Addressed(triton_launch.Cached):
    """A shorter path that takes addresses: records each keyed launch's arguments."""

    def __init__(self, fn):
        self.fn, self.given = fn, []

    def key(self, grid, args, kwargs):
        return ("a key",)

    def takes_addresses(self, key):
        return True

    def launch_keyed(self, key, grid, args, kwargs):
        self.given.append(args)


def test_replayed_launches_on_the_shorter_path_are_given_addresses(monkeypatch):
    """Where the shorter path takes addresses, a replayed launch is given ints, not views: an input's (at a
    storage offset, viewed further in) at its view's address, a buffer's and its view's as far apart as when
    recorded."""
    kernel = _Kernel(lambda *args: None)
    path = _Addressed(kernel)
    monkeypatch.setitem(triton_launch._LAUNCHERS, id(kernel), path)

    def call(x):
        buf = torch.empty(12)
        _launch(kernel, x[5:], x, buf, buf[4:])
        return buf

    _, plan, refusal = _record(call, torch.randn(40)[3:])
    assert refusal is None, refusal
    assert all(isinstance(a, torch.Tensor) for a in path.given[-1])  # the recorded launch: tensors
    x = torch.randn(40)[3:]
    out, _ = plan.run((x,))
    given = tuple(path.given[-1])
    assert all(type(a) is int for a in given)
    assert given[:2] == (x[5:].data_ptr(), x.data_ptr())
    assert given[2] == out.data_ptr() and given[3] - given[2] == 4 * out.element_size()


def test_a_descriptor_keyword_argument_is_refused():
    store = _Kernel(lambda x, desc=None: desc.base.copy_(x))

    def call(x):
        out = torch.empty(x.shape)
        triton_launch.launcher(store)[(1,)](x, desc=_Descriptor(out, [3, 4]))
        return out

    _, plan, refusal = _record(call, torch.randn(3, 4))
    assert plan is None and "keyword argument holds a tensor of the call" in refusal


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_a_view_operation_that_copies_is_replayed_as_an_operation(mode):
    """``reshape`` of a transposed tensor copies; under ``torch.inference_mode`` it reaches the recorder as
    itself, an operation marked as a view, not as the ``clone`` it is made of: replayed as an operation, not as a
    view of its input's storage."""
    copy = _Kernel(lambda x, out: out.copy_(x))

    def call(x):
        flat = x.t().reshape(-1)
        out = torch.empty(flat.shape)
        _launch(copy, flat, out)
        return out

    with mode():
        _, plan, refusal = _record(call, torch.randn(3, 4))
        assert refusal is None
        x = torch.randn(3, 4)
        assert torch.equal(plan.run((x,))[0], x.t().reshape(-1))


@pytest.mark.parametrize(
    "body, launches, reason",
    [
        (lambda x: (x.zero_(), torch.empty(3))[1], True, "writes into a tensor the call did not make"),
        (
            lambda x: (_CONSTANT.add_(0), torch.empty(3))[1],
            True,
            "writes into a tensor the call did not make",
        ),
        (lambda x: torch.rand(3), True, "a replay would not repeat"),
        (lambda x: x[x > 0], True, "a replay would not repeat"),
        (lambda x: torch.empty(int(x.sum() > 0) + 1), True, "reads a value from aten._local_scalar_dense"),
        (lambda x: torch.empty(3, 4).view(torch.int32), True, "views a tensor as another dtype"),
        (lambda x: torch.empty(3, 4), False, "handed no launch"),
        (lambda x: _CONSTANT, True, "returns a tensor that is not one of its own"),
        pytest.param(
            lambda x: x[0][(x[0] > 0).to(torch.uint8)],
            True,
            "a replay would not repeat",
            marks=pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8"),
        ),
        (lambda x: torch.empty(3, 4).t_(), True, "changes a tensor's size or strides in place"),
        (lambda x: (_CONSTANT.type_as(x).add_(0), torch.empty(3))[1], True, "writes into a tensor"),
    ],
    ids=[
        "writes_an_input",
        "writes_a_kept_tensor",
        "random_draw",
        "shape_from_values",
        "value_read",
        "dtype_view",
        "no_launch",
        "result_a_kept_tensor",
        "uint8_mask_index",
        "in_place_view",
        "writes_a_kept_tensor_returned_as_itself",
    ],
)
def test_recordings_refuse_what_a_replay_would_not_repeat(body, launches, reason):
    noop = _Kernel(lambda *args: None)

    def call(x):
        out = body(x)
        if launches:
            _launch(noop, x)
        return out

    _, plan, refusal = _record(call, torch.randn(3, 4))
    assert plan is None and reason in refusal


def test_an_operation_that_returns_its_argument_adds_no_root():
    """Under inference mode ``type_as`` to a tensor's own dtype reaches the recorder and returns its argument
    itself: the steps that read it read the input still, replayed on a new one."""
    double = _Kernel(lambda x, out: out.copy_(2 * x))

    def call(x, like):
        same = x.type_as(like)
        out = torch.empty_like(same)
        _launch(double, same, out)
        return out

    with torch.inference_mode():
        x, like = torch.randn(3, 4), torch.randn(3, 4)
        _, plan, refusal = _record(call, x, like)
        assert refusal is None
        x = torch.randn(3, 4)
        assert torch.equal(plan.run((x, like))[0], 2 * x)


def test_a_plan_does_not_keep_the_recorded_call_s_tensors():
    """A launch argument rebuilt per replay (a descriptor) is made from its fields' templates: the plan holds no
    reference to the recorded call's buffer, which is freed with the call's result."""
    import gc
    import weakref

    store = _Kernel(lambda x, desc: desc.base[: x.numel()].copy_(x.flatten()))
    made = []

    def call(x):
        out = torch.empty(1 << 16)
        made.append(weakref.ref(out))
        _launch(store, x, _Descriptor(out, [out.numel()]))
        return out

    x = torch.randn(3, 4)
    result, plan, refusal = triton_plan.record(lambda: (call(x), None), (x,))
    assert refusal is None
    del result
    gc.collect()
    assert made[0]() is None
    assert plan.run((torch.randn(3, 4),))[0].shape == (1 << 16,)


def test_torch_function_modes_turn_plans_off_but_device_contexts():
    """A replay calls ATen operations directly, past a torch-function mode that would change a call's results
    (one that rounds ``torch.bmm``'s, say); ``torch.device``'s context changes only where factories without a
    device allocate."""
    from torch.overrides import TorchFunctionMode

    class Probe(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    device = torch.device(DEVICE)
    assert triton_plan.serves(device, "always")
    with Probe():
        assert not triton_plan.serves(device, "always")
    with torch.device(DEVICE):
        assert triton_plan.serves(device, "always")


def test_a_geometry_s_max_seqlen_is_in_the_key_without_masks(monkeypatch, plans):
    """A geometry without masks that says how long its sequences are (``max_seqlen``) cuts the tables there: a
    plan recorded on a geometry without it is not replayed for it."""
    c, dtype = Case(n=16, rel=CLAMP), torch.float16
    for seed in range(3):
        inputs = _values(c, dtype, seed)
        geom = Geometry() if seed < 2 else Geometry(max_seqlen=4)
        with torch.no_grad():
            got, _ = triton_attention(*inputs, c.rel, geom, scale=0.3, terms=c.terms)
        with monkeypatch.context() as m, torch.no_grad():
            m.setattr(triton_backend, "CALL_PLANS", "off")
            want, _ = triton_attention(*inputs, c.rel, dataclasses.replace(geom), scale=0.3, terms=c.terms)
        assert torch.equal(got, want), f"call {seed}"
    assert plans.hits == 0 and len(_whole(plans)) == 2


def test_the_backend_reads_no_value_on_the_host_that_the_recorder_cannot_see():
    """``.tolist()`` and ``.numpy()`` read a tensor's values without an ATen operation the recorder would refuse
    (``.item()`` and ``bool()`` are seen): the backend's call path has none (the interpreter's rounding patch,
    inside a launch, is not a call's)."""
    for module in (triton_backend, triton_backend._products()):
        source = inspect.getsource(module)
        reads = [m.start() for m in re.finditer(r"\.(tolist|numpy)\(", source)]
        lines = [source[source.rfind("\n", 0, at) + 1 : source.find("\n", at)].strip() for at in reads]
        assert all("interpreter.TensorHandle(rounded" in line for line in lines), lines


def test_recording_is_per_thread_and_not_nested():
    with triton_launch.recording(object()):
        assert triton_launch.recorder() is not None
        with pytest.raises(RuntimeError, match="recording a call already"):
            with triton_launch.recording(object()):
                pass
    assert triton_launch.recorder() is None


def test_every_launch_of_the_backend_goes_through_the_launcher():
    """A launch that bypassed `triton_launch.launcher` would be made when a call is recorded and missed by its
    replays: every ``[grid](`` of the backend is ``launcher(...)[grid](``, but the dropout mask's materialisation
    (`dropout_keep_mask`, for tests, never inside a call)."""
    source = inspect.getsource(triton_backend)
    sites = [m.start() for m in re.finditer(r"\[grid\]\(", source)]
    bypass = [source[source.rfind("\n", 0, at) + 1 : at] for at in sites]
    bypass = [line.strip() for line in bypass if "launcher(" not in line]
    assert bypass == ["_kernels()._keep_mask_kernel"]
    assert len(sites) >= 5


@pytest.mark.parametrize("replay_us, kept", [(5, True), (20, False)])
def test_timed_plans_are_kept_only_where_replays_save_host_time(monkeypatch, replay_us, kept):
    """Where host time is what a plan saves (CUDA: ``timed``), `TIMED_CALLS` calls made and as many replays are
    timed (a clock standing in here: each made call 10 µs, each replay ``replay_us``); a plan that saves nothing
    is dropped and its signature runs as made from then on, not recorded again."""
    noop = _Kernel(lambda *args: None)
    ticks = []

    class Clock:
        def perf_counter(self):
            return ticks.pop(0)

    monkeypatch.setattr(triton_plan, "time", Clock())
    store = triton_plan.Plans(lambda: ())
    made = triton_plan.TIMED_CALLS

    def call(x):
        out = torch.empty_like(x)
        _launch(noop, x, out)
        return out, None

    x = torch.randn(3)
    store.call("key", (x,), lambda: call(x), timed=True)  # the first call: not timed
    for _ in range(made):
        ticks[:] = [0.0, 10e-6]
        store.call("key", (x,), lambda: call(x), timed=True)
    store.call("key", (x,), lambda: call(x), timed=True)  # recorded
    for _ in range(made):
        ticks[:] = [0.0, replay_us * 1e-6]
        store.call("key", (x,), lambda: call(x), timed=True)
    entry = store.entries["key"][0]
    assert (entry.plan is not None) == kept and store.recorded == 1
    if not kept:
        assert entry.refusal == f"replayed in {replay_us} µs of host time, made in 10"
    for _ in range(3):  # from here on untimed: the clock would run out
        store.call("key", (x,), lambda: call(x), timed=True)
    assert store.hits == made + (3 if kept else 0) and store.recorded == 1


def _tiny_model(preset: str):
    import debertakit

    cfg = debertakit.DebertaConfig.preset(
        preset, hidden_dropout=0.0, attention_dropout=0.0, attention_backend="triton"
    )
    torch.manual_seed(0)
    return debertakit.build_model(cfg, "base").to(DEVICE).eval()


@pytest.mark.parametrize(
    "inputs, mode", [("padded", "no_grad"), ("packed", "no_grad"), ("padded", "inference")]
)
def test_the_model_s_forwards_are_replayed_bit_for_bit(monkeypatch, plans, inputs, mode):
    """The model's own calls (tiny v3: head dim 8, padded to the kernels' 16): three forwards, each on new token
    ids and a new padding mask (or packed row), the same layers' calls in each, against the model without plans:
    every hidden state bit for bit, and the later forwards' calls replayed; under ``torch.no_grad`` or
    ``torch.inference_mode`` (whose tensors the replays allocate, and whose composite operations reach the
    recorder undecomposed: `test_a_view_operation_that_copies_is_replayed_as_an_operation`)."""
    no_grad = torch.inference_mode if mode == "inference" else torch.no_grad
    model = _tiny_model("tiny-v3")
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        ids = torch.randint(4, 128, (2, 16), generator=g).to(DEVICE)
        if inputs == "padded":
            mask = (torch.arange(16)[None] < torch.tensor([[16], [7 + 3 * step]])).to(DEVICE, torch.long)
            kw = dict(input_ids=ids, attention_mask=mask)
        else:  # one row, sequences of 12, 8 + step and 12 - step tokens (the longest, 12, in the plan's key)
            cu = torch.tensor([0, 12, 20 + step, 32], device=DEVICE)
            kw = dict(input_ids=ids.reshape(1, 32), cu_seqlens=cu)
        with no_grad():
            with monkeypatch.context() as m:
                m.setattr(triton_backend, "CALL_PLANS", "off")
                want = model(**kw).last_hidden_state
            got = model(**kw).last_hidden_state
        assert torch.equal(got, want), f"forward {step}"
    assert (plans.recorded, plans.hits) == (1, 4)  # of the six calls, the first made, the second recorded


@pytest.mark.parametrize(
    "preset",
    [
        pytest.param("tiny-v1", marks=pytest.mark.slow),
        pytest.param("tiny-v2", marks=pytest.mark.slow),
        "tiny-v3",
    ],
)
def test_the_model_s_training_steps_are_replayed_bit_for_bit(monkeypatch, plans, preset):
    """Forward and backward of the model (dropout off) on a padded batch, two steps on new ids and masks (the
    second's two layers replayed): the loss and every parameter's gradient bit for bit those without plans."""
    model = _tiny_model(preset).train()
    g = torch.Generator().manual_seed(2)

    def step(ids, mask) -> list[torch.Tensor]:
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        loss = (out * torch.linspace(-1, 1, out.shape[-1]).to(out)).sum()
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    for i in range(2):
        ids = torch.randint(4, 128, (2, 16), generator=g).to(DEVICE)
        mask = (torch.arange(16)[None] < torch.tensor([[16], [7 + 3 * i]])).to(DEVICE, torch.long)
        with monkeypatch.context() as m:
            m.setattr(triton_backend, "CALL_PLANS", "off")
            want = step(ids, mask)
        got = step(ids, mask)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), f"step {i}"
    assert plans.hits == 4  # the forward's and the backward's bodies, in both layers of the second step
