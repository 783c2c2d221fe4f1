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
    triton_backend,
    triton_launch,
    triton_plan,
)
from debertakit.attention.triton_backend import triton_attention  # noqa: E402
from tests.attention.test_triton import CLAMP, DEVICE, Case  # noqa: E402

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


def _only_entry(store: triton_plan.Plans) -> triton_plan._Entry:
    (entries,) = store.entries.values()
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


@pytest.mark.gpu
@pytest.mark.parametrize("n, batch", [(128, 1), (512, 8), (2048, 2)])
def test_replayed_calls_give_the_calls_output_at_real_sizes(monkeypatch, n, batch):
    """On CUDA with the default `CALL_PLANS` ("cuda"), v3-base positions, bfloat16, 12 heads, d 64: from N = 1024
    on the plan copies FAR from COL. Each replay on new inputs, bit for bit the call's output."""
    store = triton_plan.Plans(triton_backend._plan_settings)
    monkeypatch.setattr(triton_backend, "_PLANS", store)
    c = Case(
        n=n, batch=batch, heads=12, dim=64, rel=RelativeIndex(span=256, bucket_size=256, max_position=512)
    )
    for seed in range(4):
        inputs = _values(c, torch.bfloat16, seed)
        assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs)), f"call {seed}"
    assert _only_entry(store).plan is not None and store.hits == 2


def test_replays_write_new_buffers(plans):
    c, dtype = PLAN_GRID["v3_buckets_bf16"]
    outs = [_call(c, _values(c, dtype, seed)) for seed in range(4)]
    kept = outs[2].clone()
    assert plans.hits == 2
    assert outs[3].untyped_storage().data_ptr() != outs[2].untyped_storage().data_ptr()
    assert torch.equal(outs[2], kept)  # the later replay wrote elsewhere


def test_a_plan_allocates_fills_and_launches_what_the_call_did(plans):
    """The default road at this signature: the distance tables' buffer (the zeros around the tables filled,
    then each table NaN-poisoned, as in every test), the output and the logsumexp; the tables' product kernel,
    then the forward kernel."""
    c, dtype = PLAN_GRID["no_far_tiles"]
    for seed in range(2):
        _call(c, _values(c, dtype, seed))
    plan = _only_entry(plans).plan
    assert len(plan.buffers) == 3
    fills, launches = plan.steps[:3], plan.steps[3:]
    assert [str(f.value) for f in fills] == ["0", "nan", "nan"]
    assert [step.kernel.__name__ for step in launches] == ["_distance_product_kernel", "_fwd_kernel"]
    assert {plan.views[f.view].index for f in fills} == {0}  # the tables' buffer, allocated first
    assert plan.views[plan.result].kind == "buffer"


@pytest.mark.parametrize(
    "kwargs, geometry",
    [
        (dict(dropout_p=0.1), {}),
        ({}, dict(key_mask=torch.ones(1, 24, dtype=torch.bool, device=DEVICE))),
    ],
    ids=["dropout", "key_mask"],
)
def test_calls_with_per_call_inputs_are_not_planned(plans, kwargs, geometry):
    c, dtype = PLAN_GRID["c2p_only"]
    inputs = _values(c, dtype, 0)
    for _ in range(3):
        with torch.no_grad():
            triton_attention(*inputs, c.rel, Geometry(**geometry), scale=0.3, terms=c.terms, **kwargs)
    assert not plans.entries and plans.recorded == 0


def test_calls_that_want_gradients_or_run_under_autocast_are_not_planned(plans):
    c, dtype = PLAN_GRID["p2c_only"]
    leaves = [t.requires_grad_() if t is not None else None for t in _values(c, dtype, 0)]
    for _ in range(3):
        out, _ = triton_attention(*leaves, c.rel, Geometry(), scale=0.3, terms=c.terms)
        out.sum().backward()
    with torch.autocast(DEVICE, dtype=torch.bfloat16), torch.no_grad():
        for _ in range(3):
            triton_attention(*leaves, c.rel, Geometry(), scale=0.3, terms=c.terms)
    assert not plans.entries


@pytest.mark.parametrize("near_band", ["distance", "tables"])
def test_calls_that_run_other_operations_run_as_before(monkeypatch, plans, near_band):
    """Float32 tables, and the tables road's (`NEAR_BAND` "tables"), are products of matmuls: the recordings
    are refused, naming the operation, `RECORDINGS` times, after which the signature is not recorded again;
    every call's output is the call's own."""
    monkeypatch.setattr(triton_backend, "NEAR_BAND", near_band)
    c, dtype = PLAN_GRID["v1_clamp"][0], torch.float32
    for seed in range(triton_plan.RECORDINGS + 3):
        inputs = _values(c, dtype, seed)
        assert torch.equal(_call(c, inputs), _unplanned(monkeypatch, c, inputs))
    entry = _only_entry(plans)
    assert entry.plan is None and plans.hits == 0
    assert plans.recorded == triton_plan.RECORDINGS
    assert entry.refusal.startswith("the call runs aten."), entry.refusal


def test_padded_head_dims_plan_the_padded_call_inside(plans):
    """Head dim 24 runs at 32 with zero columns (`F.pad`, a copy): the outer call is refused, the call it makes at
    32 is planned."""
    c = dataclasses.replace(PLAN_GRID["c2p_only"][0], dim=24)
    outs = [_call(c, _values(c, torch.bfloat16, seed)) for seed in range(8)]
    assert all(o.shape[-1] == 24 for o in outs)
    refusals = {e.refusal is not None for entries in plans.entries.values() for e in entries}
    assert refusals == {True, False}
    # the outer call: seen, then recorded three times (the inner call not planned meanwhile); the inner one:
    # seen, recorded, then replayed
    assert (plans.recorded, plans.hits) == (4, 3)


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
    (entries,) = plans.entries.values()
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
    assert len(next(iter(plans.entries.values()))) == 2


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


def test_fills_and_launches_replay_in_their_order():
    """A buffer filled between two launches: the first launch writes it whole, a fill zeros half of it, the second
    reads it. Replayed on new inputs, the steps keep that order."""
    double = _Kernel(lambda x, out: out.copy_(2 * x))
    plus = _Kernel(lambda x, buf, out: out.copy_(x + buf))

    def call(x):
        buf, out = torch.empty_like(x), torch.empty(x.shape)
        _launch(double, x, buf)
        buf[:, :2].zero_()
        _launch(plus, x.t().t(), buf, out)
        return out

    _, plan, refusal = _record(call, torch.randn(3, 4))
    assert refusal is None
    x = torch.randn(3, 4)
    assert torch.equal(plan.run((x,)), call(x))


@pytest.mark.parametrize(
    "body, launches, reason",
    [
        (lambda x: (x.zero_(), torch.empty(3))[1], True, "writes into a tensor the call did not allocate"),
        (lambda x: x @ x.t(), True, "the call runs aten.mm"),
        (lambda x: torch.rand(3), True, "the call runs aten"),
        (lambda x: torch.empty(3, 4).view(torch.int32), True, "views a tensor as another dtype"),
        (lambda x: torch.empty(3, 4), False, "handed no launch"),
        (lambda x: _CONSTANT, True, "result is not one of its inputs or buffers"),
    ],
    ids=["writes_an_input", "matmul", "random_draw", "dtype_view", "no_launch", "result_a_constant"],
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
