"""Every fast backend against `eager` (the spec) over a named grid: outputs and the gradients of q, k, v and the
two position projections.

fp32: atol 1e-5 on outputs; on gradients 1e-5 times max(1, max|reference gradient|), and for the position
projections also times sqrt(max(1, pairs per table row / 10^4)): their gradients sum one contribution per pair
that uses a row (over 10^5 at N = 1500 with a 16-row table), and summation order differs between backends, so
the rounding grows with the number of terms. bf16: the backends compute scores and softmax in float32 from the same bf16 inputs and round
the output to bf16 once, so they agree with `eager` run on the same bf16 inputs to within two bf16 ulps:
|got - ref| <= 2**-7 * |ref| + 1e-3 (outputs) and 2**-6 * max|ref grad| (gradients, which are rounded to bf16
at several steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from debertakit.attention import Geometry, PositionTerms, RelativeIndex, eager_attention, packed_geometry
from debertakit.attention import chunked as chunked_mod
from debertakit.attention.chunked import chunked_attention
from debertakit.attention.flex import flex_disentangled_attention
from debertakit.model.heads import _query_subset

BACKENDS = {"chunked": chunked_attention, "flex": flex_disentangled_attention}
try:  # the Triton kernels, interpreted on these CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1 without
    # CUDA; with CUDA, tests/attention/test_triton.py runs its grids compiled on the GPU)
    import triton  # noqa: F401

    from debertakit.attention.triton_backend import interpreter_enabled, triton_attention

    if interpreter_enabled():
        BACKENDS["triton"] = triton_attention
except ImportError:
    pass
# cases too slow for Triton's interpreter in the default run (thousands of interpreted tiles): marked slow there
INTERPRETED_SLOW = {"n600-v3-base", "n600-v1-base-padding", "n1500-v3-base-saturating", "n1500-v3-tiny-causal",
                    "n1500-v1-packed"}  # fmt: skip


def _grid_params(names):
    """(backend, case) pairs; Triton's slow interpreted cases carry the `slow` marker."""
    params = []
    for backend in sorted(BACKENDS):
        for name in names:
            slow = backend == "triton" and name in INTERPRETED_SLOW
            marks = [pytest.mark.slow] if slow else []
            params.append(pytest.param(backend, name, marks=marks, id=f"{backend}-{name}"))
    return params


TERMS = {
    "c2p+p2c": PositionTerms(True, True, False),
    "c2p": PositionTerms(True, False, False),
    "p2c": PositionTerms(False, True, False),
    "c2p+p2c+p2p": PositionTerms(True, True, True),
    "p2p": PositionTerms(False, False, True),
    "none": PositionTerms(False, False, False),
}
# layout -> RelativeIndex arguments. v1: clamped distances, no buckets; v2/v3: log buckets. "tiny" tables
# saturate at a few tokens, "base" tables are the released sizes (saturating near 512).
LAYOUTS = {
    "v1-tiny": dict(span=8),
    "v1-base": dict(span=512),
    "v3-tiny": dict(span=16, bucket_size=8, max_position=32),
    "v3-base": dict(span=256, bucket_size=256, max_position=512),
}


@dataclass(frozen=True)
class Case:
    n: int
    layout: str
    terms: str = "c2p+p2c"
    geometry: str = "plain"  # plain | padding | packed | causal | packed-causal | subset | dense
    batch: int = 2
    heads: int = 2
    dim: int = 8
    block: int | None = None  # chunked query block (None: automatic)


GRID = {
    "n1": Case(1, "v3-tiny"),
    "n7-v1": Case(7, "v1-tiny"),
    "n7-v3-padding": Case(7, "v3-tiny", geometry="padding"),
    "n64-v1-base": Case(64, "v1-base", block=16),
    "n64-v3-c2p": Case(64, "v3-tiny", terms="c2p", geometry="padding"),
    "n64-v3-p2c": Case(64, "v3-tiny", terms="p2c", geometry="causal"),
    "n64-v3-p2p": Case(64, "v3-tiny", terms="c2p+p2c+p2p", block=24),
    "n64-p2p-only": Case(64, "v1-tiny", terms="p2p"),
    "n64-no-position-terms": Case(64, "v3-tiny", terms="none", geometry="padding"),
    "n64-dense-mask": Case(64, "v3-tiny", geometry="dense"),
    "n129-v1-padding": Case(129, "v1-tiny", geometry="padding", block=32),
    "n129-v3-packed": Case(129, "v3-tiny", geometry="packed", batch=1, block=32),
    "n129-v3-packed-causal": Case(129, "v3-tiny", geometry="packed-causal", batch=1, block=48),
    "n129-v3-causal-p2p": Case(129, "v3-tiny", terms="c2p+p2c+p2p", geometry="causal"),
    "n129-subset-queries": Case(129, "v3-tiny", geometry="subset"),
    "n129-packed-subset": Case(129, "v1-tiny", geometry="packed-subset", batch=1),
    "n600-v3-base": Case(600, "v3-base", batch=1, heads=1, dim=4),
    "n600-v1-base-padding": Case(600, "v1-base", geometry="padding", batch=1, heads=1, dim=4),
    "n1500-v3-base-saturating": Case(1500, "v3-base", batch=1, heads=1, dim=4),
    "n1500-v3-tiny-causal": Case(1500, "v3-tiny", geometry="causal", batch=1, heads=1, dim=4, block=256),
    "n1500-v1-packed": Case(1500, "v1-tiny", terms="c2p+p2c+p2p", geometry="packed", batch=1, heads=1, dim=4),
}


def make(case: Case, dtype=torch.float32, grad: bool = True, seed: int = 0):
    """Inputs of one case: (q, k, v, pos_q, pos_k, rel, geom)."""
    g = torch.Generator().manual_seed(seed)
    B, H, N, D = case.batch, case.heads, case.n, case.dim
    geom, nq = _geometry(case, g)
    base = RelativeIndex(**LAYOUTS[case.layout])
    lo, hi = base.window(geom.max_distance(N, N))
    rel = base.shifted(lo)
    R = hi - lo

    def t(*shape):
        x = torch.randn(*shape, generator=g).to(dtype)
        return x.requires_grad_(grad)

    q, k, v = t(B, H, nq, D), t(B, H, N, D), t(B, H, N, D)
    pos_q, pos_k = t(H, R, D), t(H, R, D)
    return q, k, v, pos_q, pos_k, rel, geom


def _geometry(case: Case, g: torch.Generator) -> tuple[Geometry, int]:
    B, N = case.batch, case.n
    kind = case.geometry
    if kind == "plain":
        return Geometry(), N
    if kind == "causal":
        return Geometry(causal=True), N
    if kind == "padding":
        mask = torch.ones(B, N, dtype=torch.bool)
        mask[-1, max(1, N * 2 // 3) :] = False
        return Geometry(key_mask=mask), N
    if kind == "dense":
        return Geometry(dense=torch.rand(B, 1, N, N, generator=g) > 0.3), N
    if kind.startswith("packed"):
        cuts = sorted({0, N // 5, N // 5 + 1, N // 2, N - N // 7})
        cu = torch.tensor(cuts, dtype=torch.int32)  # the last N // 7 tokens are row padding
        geom, _ = packed_geometry(cu, N, causal=kind == "packed-causal")
        if kind == "packed-subset":
            rows = torch.tensor([[0, N // 5, N // 2 + 3, N - 1]])
            return _query_subset(geom, rows, N), rows.shape[1]
        return geom, N
    if kind == "subset":  # the Enhanced Mask Decoder's layout: a few query rows against all keys
        mask = torch.ones(B, N, dtype=torch.bool)
        mask[-1, N - 20 :] = False
        rows = torch.stack([torch.randperm(N, generator=g)[:11].sort().values for _ in range(B)])
        return _query_subset(Geometry(key_mask=mask), rows, N), rows.shape[1]
    raise ValueError(kind)


def run(fn, inputs, terms: str, **kw):
    q, k, v, pos_q, pos_k, rel, geom = inputs
    scale = 1.0 / (q.shape[-1] * 3) ** 0.5
    out, _ = fn(q, k, v, pos_q, pos_k, rel, geom, scale=scale, terms=TERMS[terms], **kw)
    return out


def grads(out, inputs, weight):
    tensors = inputs[:5]
    gs = torch.autograd.grad(out, tensors, weight, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, gs)]


NAMES = ["q", "k", "v", "pos_q", "pos_k"]


@pytest.mark.parametrize(("backend", "name"), _grid_params(sorted(GRID)))
def test_matches_eager_fp32(backend, name):
    case = GRID[name]
    inputs = make(case)
    if backend == "triton" and case.geometry == "dense":  # declined, with a clear error
        with pytest.raises(ValueError, match="dense"):
            run(BACKENDS[backend], inputs, case.terms)
        return
    kw = {"block_size": case.block} if backend == "chunked" else {}
    ref = run(eager_attention, inputs, case.terms)
    got = run(BACKENDS[backend], inputs, case.terms, **kw)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    err = (got - ref).abs().max().item()
    assert err <= 1e-5, f"{backend} {name}: output differs by {err:.3g}"
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    for what, a, b in zip(NAMES, grads(got, inputs, w), grads(ref, inputs, w)):
        err, tol = (a - b).abs().max().item(), grad_tol(b, inputs if what.startswith("pos") else None)
        assert err <= tol, f"{backend} {name}: gradient of {what} differs by {err:.3g} > {tol:.3g}"


def grad_tol(ref: torch.Tensor, inputs=None) -> float:
    tol = 1e-5 * max(1.0, ref.abs().max().item())
    if inputs is not None:  # a position-projection gradient: a sum over the pairs that use each table row
        q, k, pos_q = inputs[0], inputs[1], inputs[3]
        pairs_per_row = q.shape[0] * q.shape[2] * k.shape[2] / pos_q.shape[1]
        tol *= max(1.0, pairs_per_row / 1e4) ** 0.5
    return tol


# the compiled CPU kernel serves inference with distance i - j (no query subsets, no dense masks)
FUSED_DECLINES = {"subset": "distance i - j", "packed-subset": "distance i - j", "dense": "dense"}


@pytest.mark.parametrize("name", sorted(GRID))
def test_chunked_inference_paths(name):
    """Without gradients `chunked` runs the compiled CPU kernel where it applies, else may take the far-field
    path (fused attention + augmented q/k) or the blocks: every path on every case against eager."""
    case = GRID[name]
    inputs = make(case, grad=False)
    with torch.no_grad():
        ref = run(eager_attention, inputs, case.terms)
        paths = {
            "automatic": {},
            "pure PyTorch": dict(fused=False),
            "far field": dict(fused=False, far_field=True),
            "compiled kernel": dict(fused=True),
        }
        for path, kw in paths.items():
            if path == "compiled kernel" and case.geometry in FUSED_DECLINES:
                with pytest.raises(ValueError, match=FUSED_DECLINES[case.geometry]):
                    run(chunked_attention, inputs, case.terms, **kw)
                continue
            got = run(chunked_attention, inputs, case.terms, block_size=case.block, **kw)
            err = (got - ref).abs().max().item()
            assert err <= 1e-5, f"{name} {path}: output differs by {err:.3g}"


def test_compiled_cpu_kernel_is_built_and_used(monkeypatch):
    """The test environment has a compiler and ninja: the kernel must build, and inference must use it."""
    from debertakit.attention import cpu_kernel

    assert cpu_kernel.load() is not None, f"the CPU kernel did not build: {cpu_kernel.error()}"
    calls = []
    for entry in ("_fused", "_train_fused"):
        real = getattr(chunked_mod, entry)
        monkeypatch.setattr(chunked_mod, entry, lambda *a, e=entry, f=real: calls.append(e) or f(*a))
    case = GRID["n129-v3-packed-causal"]
    inputs = make(case, grad=False)
    with torch.no_grad():
        got = run(chunked_attention, inputs, case.terms)
        ref = run(eager_attention, inputs, case.terms)
    assert calls == ["_fused"]
    assert (got - ref).abs().max().item() <= 1e-5
    run(chunked_attention, make(case, grad=True), case.terms)  # gradients or dropout: the training entry
    run(chunked_attention, inputs, case.terms, dropout_p=0.1)
    assert calls == ["_fused", "_train_fused", "_train_fused"]


def test_compiled_cpu_kernel_can_be_turned_off(monkeypatch):
    from debertakit.attention import cpu_kernel

    monkeypatch.setenv("DEBERTAKIT_CPU_KERNEL", "0")
    monkeypatch.setattr(cpu_kernel, "_STATE", {})
    case = GRID["n7-v3-padding"]
    inputs = make(case, grad=False)
    with torch.no_grad(), pytest.raises(ValueError, match="DEBERTAKIT_CPU_KERNEL"):
        run(chunked_attention, inputs, case.terms, fused=True)
    with torch.no_grad():
        got = run(chunked_attention, inputs, case.terms)  # falls back to pure PyTorch
        assert (got - run(eager_attention, inputs, case.terms)).abs().max().item() <= 1e-5


def test_far_field_path_is_taken_and_exact(monkeypatch):
    """The far-field path on a long, saturating, padded input (v3 table): it must run and agree with eager."""
    case = Case(1500, "v3-base", geometry="padding", batch=2, heads=1, dim=4)
    inputs = make(case, grad=False)
    calls = []
    real = chunked_mod._far_field
    monkeypatch.setattr(chunked_mod, "_far_field", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        got = run(chunked_attention, inputs, case.terms, far_field=True)
        ref = run(eager_attention, inputs, case.terms)
    assert calls, "the far-field path was not used"
    assert (got - ref).abs().max().item() <= 1e-5


def test_chunked_recomputes_blocks_in_backward(monkeypatch):
    monkeypatch.setattr(chunked_mod, "CHECKPOINT_ELEMENTS", 0)
    monkeypatch.setattr(chunked_mod, "CHECKPOINT_KEYS", 0)
    case = Case(129, "v3-tiny", geometry="padding", block=32)
    inputs = make(case)
    w = torch.randn(2, 2, 129, 8)
    for a, b in zip(
        grads(run(chunked_attention, inputs, case.terms, block_size=32), inputs, w),
        grads(run(eager_attention, inputs, case.terms), inputs, w),
    ):
        assert (a - b).abs().max().item() <= grad_tol(b)


TRAIN_CASES = [
    "n64-v1-base",
    "n64-v3-p2c",
    "n64-v3-p2p",
    "n64-p2p-only",
    "n129-v1-padding",
    "n129-v3-packed",
    "n129-v3-packed-causal",
    "n1500-v3-base-saturating",
    "n1500-v3-tiny-causal",
]


@pytest.mark.parametrize(
    "path",
    ["compiled kernel", "tiles, kept probabilities", "tiles, recomputed"],
)
@pytest.mark.parametrize("name", TRAIN_CASES)
def test_chunked_training_paths_match_eager(monkeypatch, name, path):
    """Training with distance i - j runs the compiled CPU kernel (probabilities kept) or, in pure PyTorch, one
    function over tiles (here `block` query rows of one batch element, with saturated far-field pieces on long
    inputs), its probabilities kept or recomputed in the backward pass: outputs and all gradients equal
    eager. Every case is forced onto its path (the long ones keep their probabilities here)."""
    monkeypatch.setattr(chunked_mod, "STORE_KEYS", 0 if path == "tiles, recomputed" else 1 << 30)
    case = GRID[name]
    inputs = make(case)
    ref = run(eager_attention, inputs, case.terms)
    fused = path == "compiled kernel"
    got = run(chunked_attention, inputs, case.terms, block_size=case.block or 40, fused=fused)
    assert (got - ref).abs().max().item() <= 1e-5
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    for what, a, b in zip(NAMES, grads(got, inputs, w), grads(ref, inputs, w)):
        err, tol = (a - b).abs().max().item(), grad_tol(b, inputs if what.startswith("pos") else None)
        assert err <= tol, f"{name}: gradient of {what} differs by {err:.3g} > {tol:.3g}"


def _reference_with_masks(inputs, terms: str, keep: torch.Tensor, drop_scale: float) -> torch.Tensor:
    """eager's probabilities times a given dropout mask, then · v."""
    q, k, v, pos_q, pos_k, rel, geom = inputs
    scale = 1.0 / (q.shape[-1] * 3) ** 0.5
    _, probs = eager_attention(
        q, k, v, pos_q, pos_k, rel, geom, scale=scale, terms=TERMS[terms], return_probs=True
    )
    return (probs * keep * drop_scale) @ v


@pytest.mark.parametrize("train_path", ["compiled kernel", "i-j tiles", "explicit positions"])
def test_chunked_dropout_equals_eager_with_the_drawn_masks(monkeypatch, train_path):
    """With dropout, output and gradients equal eager's probabilities times the masks the backend drew."""
    drawn = []
    real = chunked_mod.keep_mask

    def record(*a, **kw):
        drawn.append(real(*a, **kw))
        return drawn[-1]

    monkeypatch.setattr(chunked_mod, "keep_mask", record)
    geometry = "subset" if train_path == "explicit positions" else "padding"
    case = Case(64, "v3-tiny", geometry=geometry)
    inputs = make(case)
    fused = None if train_path == "explicit positions" else train_path == "compiled kernel"
    got = run(chunked_attention, inputs, case.terms, dropout_p=0.3, fused=fused)
    assert len(drawn) == 1  # one tile / block: one mask of the whole (B, H, Nq, Nk)
    keep, drop_scale = drawn[0]
    assert 0.6 < keep.float().mean().item() < 0.8
    ref = _reference_with_masks(inputs, case.terms, keep, drop_scale)
    assert (got - ref).abs().max().item() <= 1e-5
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    for what, a, b in zip(NAMES, grads(got, inputs, w), grads(ref, inputs, w)):
        assert (a - b).abs().max().item() <= grad_tol(b), f"gradient of {what}"


def test_chunked_dropout_recomputed_tiles_draw_the_same_masks(monkeypatch):
    """Recomputing tiles in the backward pass redraws each tile's mask from the call's seed: outputs and
    gradients are bit-identical to keeping the probabilities, and repeat under the same torch seed."""
    case = Case(129, "v3-tiny", geometry="padding")
    results = []
    for store_keys in (1 << 30, 0, 0):
        monkeypatch.setattr(chunked_mod, "STORE_KEYS", store_keys)
        inputs = make(case)
        torch.manual_seed(11)
        out = run(chunked_attention, inputs, case.terms, dropout_p=0.2, block_size=32, fused=False)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append([out, *grads(out, inputs, w)])
    for a, b, c in zip(*results):
        assert torch.equal(a, b) and torch.equal(b, c)


def test_compiled_kernel_drops_what_the_pure_path_drops(monkeypatch):
    """Training under torch.compile keeps to the pure PyTorch path; both paths draw the dropout mask tile by
    tile from the same seed, so they compute the same function (up to rounding)."""
    monkeypatch.setattr(chunked_mod, "TRAIN_TILE_ELEMENTS", 2 * 129 * 40)  # several tiles
    case = Case(129, "v3-tiny", geometry="packed-causal", batch=1)
    outs = []
    for fused in (True, False):
        inputs = make(case)
        torch.manual_seed(5)
        out = run(chunked_attention, inputs, case.terms, dropout_p=0.2, fused=fused)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        outs.append([out, *grads(out, inputs, w)])
    assert (outs[0][0] != 0).any()
    for a, b in zip(*outs):
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())


def test_chunked_training_off_the_cpu_launches_few_tiles():
    """Off the CPU every operation of a training tile is a kernel launch: the tiles there hold
    `TRAIN_TILE_ELEMENTS_OFF_CPU` scores, not the CPU's cache-sized `TRAIN_TILE_ELEMENTS`. Counted on the meta
    device (standing for a GPU) at a v3-base layer's shape, 32 × 512 tokens: forward and backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Launches(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            views = isinstance(out, torch.Tensor) and out._base is not None
            self.count += not (views or func.__name__.startswith(("empty", "detach", "lift_fresh")))
            return out

    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)

    def launches() -> int:
        q, k, v = (torch.randn(32, 12, 512, 64, device="meta", requires_grad=True) for _ in range(3))
        pq, pk = (torch.randn(12, rel.table_rows, 64, device="meta", requires_grad=True) for _ in range(2))
        with Launches() as counted:
            out, _ = chunked_attention(
                q, k, v, pq, pk, rel, Geometry(), scale=0.07, terms=PositionTerms(True, True, False)
            )
            out.sum().backward()
        return counted.count

    off_cpu = launches()
    with pytest.MonkeyPatch.context() as m:  # the CPU's tiles on the same device
        m.setattr(chunked_mod, "TRAIN_TILE_ELEMENTS_OFF_CPU", chunked_mod.TRAIN_TILE_ELEMENTS)
        cpu_tiles = launches()
    assert off_cpu * 10 < cpu_tiles, (off_cpu, cpu_tiles)


def test_chunked_dropout_runs_and_scales():
    """Dropout (training) goes through the fused kernel; with p=0.5 outputs differ from p=0 but stay finite."""
    inputs = make(Case(64, "v3-tiny"))
    a = run(chunked_attention, inputs, "c2p+p2c", dropout_p=0.5)
    b = run(chunked_attention, inputs, "c2p+p2c")
    assert torch.isfinite(a).all() and not torch.allclose(a, b)
    a.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in inputs[:5])


BF16_CASES = ["n7-v3-padding", "n129-v3-packed", "n600-v3-base", "n129-subset-queries"]


# triton rounds probabilities to bf16 before the PV matmul (as FlashAttention does): its bf16 tolerance is its
# own (tests/attention/test_triton.py)
@pytest.mark.parametrize("backend", [b for b in sorted(BACKENDS) if b != "triton"])
@pytest.mark.parametrize("name", BF16_CASES)
def test_matches_eager_bf16(backend, name):
    case = GRID[name]
    inputs = make(case, dtype=torch.bfloat16)
    ref = run(eager_attention, inputs, case.terms)
    got = run(BACKENDS[backend], inputs, case.terms)
    assert got.dtype == torch.bfloat16
    err = (got.float() - ref.float()).abs()
    bound = 2**-7 * ref.float().abs() + 1e-3
    assert bool((err <= bound).all()), (
        f"{backend} {name}: bf16 output off by {(err - bound).max().item():.3g}"
    )
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for what, a, b in zip(NAMES, grads(got, inputs, w), grads(ref, inputs, w)):
        err = (a.float() - b.float()).abs().max().item()
        bound = 2**-6 * b.float().abs().max().item() + 1e-3
        assert err <= bound, f"{backend} {name}: bf16 gradient of {what} off by {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("backend", ["eager", *sorted(BACKENDS)])
def test_packed_equals_each_sequence_alone(backend):
    """Padding-free batches: one packed row gives, per sequence, the output and gradients of running that
    sequence alone."""
    fn = BACKENDS.get(backend, eager_attention)
    lengths = [5, 40, 1, 23]
    T = sum(lengths) + 3  # 3 tokens of row padding
    H, D = 2, 8
    g = torch.Generator().manual_seed(0)
    base = RelativeIndex(span=16, bucket_size=8, max_position=32)
    lo, hi = base.window(max(lengths) - 1)
    rel = base.shifted(lo)
    q, k, v = (torch.randn(1, H, T, D, generator=g, requires_grad=True) for _ in range(3))
    pos_q, pos_k = (torch.randn(H, hi - lo, D, generator=g, requires_grad=True) for _ in range(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    geom, _ = packed_geometry(cu, T)
    kw = dict(scale=0.2, terms=PositionTerms(True, True, False))
    packed, _ = fn(q, k, v, pos_q, pos_k, rel, geom, **kw)
    w = torch.randn(packed.shape, generator=g)
    g_packed = torch.autograd.grad(packed, (q, k, v, pos_q, pos_k), w)
    assert packed[:, :, int(cu[-1]) :].abs().max().item() == 0.0, "row padding must output zeros"
    g_alone = [torch.zeros_like(t) for t in (q, k, v)] + [torch.zeros_like(pos_q), torch.zeros_like(pos_k)]
    for s, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        sq, sk, sv = (t[:, :, a:b] for t in (q, k, v))
        lo_s, hi_s = base.window(b - a - 1)
        alone, _ = fn(sq, sk, sv, pos_q[:, lo_s - lo : hi_s - lo], pos_k[:, lo_s - lo : hi_s - lo],
                      base.shifted(lo_s), Geometry(), **kw)  # fmt: skip
        err = (alone - packed[:, :, a:b]).abs().max().item()
        assert err <= 1e-5, f"{backend}: sequence {s} differs by {err:.3g} packed vs alone"
        gs = torch.autograd.grad(alone, (sq, sk, sv, pos_q, pos_k), w[:, :, a:b])
        for i in range(3):
            g_alone[i][:, :, a:b] += gs[i]
        g_alone[3] += gs[3]
        g_alone[4] += gs[4]
    for what, a, b in zip(NAMES, g_packed, g_alone):
        err = (a - b).abs().max().item()
        assert err <= grad_tol(b), f"{backend}: gradient of {what} differs by {err:.3g} packed vs alone"


@pytest.mark.filterwarnings(
    "ignore:There is a performance drop"
)  # vmap's fallback for the fused attention op
def test_compiled_kernel_edge_inputs():
    """Offsets past the row, torch.func.vmap, forward-mode AD, double backward, contradictory options."""
    from torch.autograd import forward_ad

    from debertakit.attention import cpu_kernel

    # cu_seqlens running past the row (not validated at this level): the windows stop at the row's end
    geom, _ = packed_geometry(torch.tensor([0, 5, 12]), 10)
    q, k, v, pos_q, pos_k, rel, _ = make(Case(10, "v3-tiny", batch=1), grad=False)
    inputs = (q, k, v, pos_q, pos_k, rel, geom)
    with torch.no_grad():
        got = run(chunked_attention, inputs, "c2p+p2c", fused=True)
        assert (got - run(eager_attention, inputs, "c2p+p2c")).abs().max().item() <= 1e-5
    # the kernel itself refuses windows outside the row instead of reading past it
    mod, none = cpu_kernel.load(), torch.empty(0)
    start, end = torch.zeros(10, dtype=torch.int), torch.full((10,), 12, dtype=torch.int)
    with pytest.raises(RuntimeError, match="key window"):
        mod.forward(q, k, v, none, none, none, none.int(), none.bool(), start, end, 1, 0.1)

    # torch.func.vmap and forward-mode tangents keep to PyTorch operations
    case = GRID["n7-v3-padding"]
    q, k, v, pos_q, pos_k, rel, geom = make(case, grad=False)
    terms = TERMS[case.terms]

    def attend(qq, **kw):
        return chunked_attention(qq, k, v, pos_q, pos_k, rel, geom, scale=0.2, terms=terms, **kw)[0]

    with torch.no_grad():
        mapped = torch.func.vmap(attend)(q[None].expand(3, -1, -1, -1, -1))
        assert (mapped[1] - attend(q, fused=False)).abs().max().item() <= 1e-6
    with forward_ad.dual_level(), pytest.raises(NotImplementedError):  # no jvp: an error, not a lost tangent
        attend(forward_ad.make_dual(q, torch.ones_like(q)))

    # a second derivative is refused rather than silently missing the attention's part
    inputs = make(case)
    out = run(chunked_attention, inputs, case.terms)
    (g,) = torch.autograd.grad(out.square().sum(), inputs[0], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        g.sum().backward()
    with pytest.raises(ValueError, match="two different paths"):
        run(chunked_attention, make(case, grad=False), case.terms, fused=True, far_field=True)


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_compiled_kernel_switch_values(monkeypatch, value):
    from debertakit.attention import cpu_kernel

    monkeypatch.setenv("DEBERTAKIT_CPU_KERNEL", value)
    assert not cpu_kernel.enabled() and cpu_kernel.load() is None
    monkeypatch.setenv("DEBERTAKIT_CPU_KERNEL", "1")
    assert cpu_kernel.enabled() and cpu_kernel.load() is not None


@pytest.mark.parametrize("threads", [1, 4], ids=["task-per-head", "task-per-block"])
def test_compiled_kernel_splits_heads_into_blocks_when_threads_outnumber_them(threads):
    """With fewer heads than threads the inference kernel computes every head's p2c rows first, then runs a
    task per block of query rows; both schedules against eager."""
    case = Case(300, "v3-tiny", terms="c2p+p2c+p2p", geometry="padding", batch=1, heads=1)
    inputs = make(case, grad=False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            got = run(chunked_attention, inputs, case.terms, fused=True)
    finally:
        torch.set_num_threads(before)
    with torch.no_grad():
        assert (got - run(eager_attention, inputs, case.terms)).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    ("fn", "kw"),
    [
        (chunked_attention, dict(fused=True)),
        (chunked_attention, dict(fused=False)),
        (flex_disentangled_attention, {}),
    ],
    ids=["chunked compiled kernel", "chunked pure PyTorch", "flex"],
)
def test_backends_keep_float32_under_autocast(fn, kw):
    """Under CPU autocast (bf16) a backend computes as without it: its scores and N×R products stay float32
    (autocast would otherwise run its matmuls in bf16); outputs and gradients."""
    case = GRID["n129-v3-causal-p2p"]
    results = []
    for autocast in (False, True):
        inputs = make(case)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = run(fn, inputs, case.terms, **kw)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append([out, *grads(out, inputs, w)])
    # float32 both times: within the grid's fp32 tolerances (summation order of gradient scatters may differ
    # between calls); bf16 matmuls would be off by about 1e-2
    inputs = make(case)
    for what, a, b in zip(["output", *NAMES], *results):
        assert a.dtype == b.dtype == torch.float32
        tol = 1e-5 if what == "output" else grad_tol(b, inputs if what.startswith("pos") else None)
        assert (a - b).abs().max().item() <= tol, what
