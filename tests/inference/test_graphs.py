"""`CudaGraphModel`: inputs padded to buckets give the unpadded model's outputs; capture-safe forwards.

On the CPU the wrapper runs its padded buckets without graphs (``replay=False``): the same padding, copying and
cutting as with graphs, checked against the model on the unpadded inputs. The graphs themselves are `gpu` tests.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

import debertakit.model.tasks as tasks
from debertakit.config import DebertaConfig
from debertakit.inference.graphs import CudaGraphModel, bucket
from debertakit.model import backbone, layers

HEADS = [
    tasks.DebertaBase,
    tasks.DebertaForMaskedLM,
    tasks.DebertaForSequenceClassification,
    tasks.DebertaForTokenClassification,
    tasks.DebertaForQuestionAnswering,
    tasks.DebertaForMultipleChoice,
]


def _config(backend: str = "eager", **kw) -> DebertaConfig:
    return DebertaConfig(
        vocab_size=300, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, type_vocab_size=2,
        max_relative_positions=16, position_buckets=8, attention_backend=backend, **kw,
    )  # fmt: skip


def _inputs(shape: tuple[int, ...], device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Token ids, a padding mask (the second row ends early), token types."""
    ids = torch.randint(5, 300, shape, device=device)
    mask = torch.ones(shape, dtype=torch.long, device=device)
    mask[1, ..., shape[-1] - 4 :] = 0
    types = torch.randint(0, 2, shape, device=device)
    return ids, mask, types


def _assert_same_outputs(got, want, atol: float) -> None:
    assert type(got) is type(want)
    assert got.keys() and got.keys() == [k for k in want.keys() if k != "hidden_states" and k != "context"]
    for key in got.keys():
        a, b = getattr(got, key), getattr(want, key)
        assert a.shape == b.shape, key
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=key)


def test_bucket_is_the_smallest_that_holds_the_size():
    assert [bucket(n, (16, 32, 64)) for n in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, None]


@pytest.mark.parametrize("head", HEADS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_padded_buckets_give_the_unpadded_outputs(head, backend):
    """Batch 3 of 13 tokens (with padding in row 1) runs in the 4 × 16 bucket; every output field, cut back,
    equals the model's on the unpadded inputs (float32). Multiple choice: (3, 2 choices, 13)."""
    model = head(_config(backend))
    shape = (3, 2, 13) if head is tasks.DebertaForMultipleChoice else (3, 13)
    ids, mask, types = _inputs(shape)
    graphs = CudaGraphModel(model, lengths=(8, 16, 32), batch_sizes=(1, 4), replay=False)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    got = graphs(ids, mask, types)
    assert list(graphs.buckets) == [((4, *shape[1:-1], 16), True, False)]
    _assert_same_outputs(got, want, atol=1e-5)


def test_the_triton_kernels_mask_the_bucket_padding():
    """The triton backend (interpreted) on a bucket with padded rows and tokens: rows past the batch are all
    padding, keys past the length hidden, and the real tokens' outputs are those of the unpadded inputs."""
    model = tasks.DebertaForTokenClassification(_config("triton"))
    ids, mask, _ = _inputs((3, 11))
    graphs = CudaGraphModel(model, lengths=(16,), batch_sizes=(4,), replay=False)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask)
    _assert_same_outputs(graphs(ids, mask), want, atol=1e-5)


def test_calls_reuse_their_bucket_and_get_their_own_outputs():
    """Two calls in one bucket: the second's outputs are its own (the buffers are loaded again, padding and
    all: a longer first input leaves no tokens behind), and the first call's returned tensors are copies, not
    changed by the second."""
    model = tasks.DebertaForSequenceClassification(_config())
    graphs = CudaGraphModel(model, lengths=(16,), batch_sizes=(4,), replay=False)
    long_ids, short_ids = torch.randint(5, 300, (4, 15)), torch.randint(5, 300, (2, 9))
    first = graphs(long_ids)
    kept = first.logits.clone()
    second = graphs(short_ids)
    assert len(graphs.buckets) == 1
    with torch.no_grad():
        torch.testing.assert_close(second.logits, model(input_ids=short_ids).logits, atol=1e-5, rtol=0)
    assert torch.equal(first.logits, kept)


def test_inputs_beyond_the_buckets_run_the_model_itself():
    model = tasks.DebertaForTokenClassification(_config())
    graphs = CudaGraphModel(model, lengths=(8,), batch_sizes=(2,), replay=False)
    for shape in ((2, 9), (3, 8)):
        ids = torch.randint(5, 300, shape)
        with torch.no_grad():
            want = model(input_ids=ids)
        assert torch.equal(graphs(ids).logits, want.logits)
    assert not graphs.buckets


def test_bad_inputs_are_refused_before_they_are_copied():
    model = tasks.DebertaForTokenClassification(_config())
    graphs = CudaGraphModel(model, lengths=(16,), batch_sizes=(4,), replay=False)
    ids = torch.randint(5, 300, (2, 10))
    ids[1, 3] = 300
    with pytest.raises(ValueError, match="token id 300 >= vocab_size 300 at batch 1, position 3"):
        graphs(ids)
    with pytest.raises(ValueError, match="attention_mask has shape \\(2, 9\\)"):
        graphs(ids.clamp(max=299), torch.ones(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids must be \\(batch, length\\)"):
        graphs(torch.randint(5, 300, (10,)))
    assert not graphs.buckets


def test_serves_evaluation_only():
    model = tasks.DebertaForTokenClassification(_config())
    graphs = CudaGraphModel(model, lengths=(16,), batch_sizes=(4,), replay=False)
    assert not model.training and not graphs.training
    graphs.eval()  # fine
    with pytest.raises(ValueError, match="evaluation only"):
        graphs.train()
    model.train()
    with pytest.raises(ValueError, match="call model.eval\\(\\)"):
        graphs(torch.randint(5, 300, (2, 10)))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lengths=()), "lengths must be increasing positive ints"),
        (dict(lengths=(32, 16)), "lengths must be increasing"),
        (dict(batch_sizes=(0, 1)), "batch_sizes must be increasing positive ints"),
        (dict(replay=True), "CUDA graphs need the model on a CUDA device; it is on cpu"),
    ],
)
def test_settings_are_checked(kw, match):
    kw = dict(dict(replay=False), **kw)
    with pytest.raises(ValueError, match=match):
        CudaGraphModel(tasks.DebertaBase(_config()), **kw)


def test_while_capturing_the_forward_reads_nothing_from_the_device_and_fills_no_cache():
    """Inside a CUDA graph's capture the model's range checks (which read values on the host) are skipped, and
    the caches that outlive a forward (the relative table and its projections) are neither read nor filled: a
    tensor made there would belong to the graph's pool. Checked here by saying "capturing" on the CPU."""
    model = tasks.DebertaBase(_config()).eval()
    ids = torch.randint(5, 300, (2, 10))
    with mock.patch.object(backbone, "_check_range") as check, torch.no_grad():
        model(input_ids=ids)
        assert check.call_count == 1
        assert model.deberta.encoder._table_cache is not None  # cached outside a capture
        model.deberta.encoder._table_cache = None
        for layer in model.deberta.encoder.layers:
            layer.attention._pos_cache = None
        with (
            mock.patch("torch.cuda.is_available", return_value=True),
            mock.patch("torch.cuda.is_current_stream_capturing", return_value=True),
        ):
            assert not layers.inference_cache_ok(model)
            model(input_ids=ids)
        assert check.call_count == 1
    assert model.deberta.encoder._table_cache is None
    assert all(layer.attention._pos_cache is None for layer in model.deberta.encoder.layers)


def test_models_with_absolute_positions_have_no_bucket_past_them():
    """The masked LM's Enhanced Mask Decoder (and absolute positions at the input) embeds every position of the
    padded bucket: its lengths stop at ``max_position_embeddings``, which becomes the last bucket."""
    mlm = tasks.DebertaForMaskedLM(_config(max_position_embeddings=24))
    graphs = CudaGraphModel(mlm, lengths=(16, 32, 64), batch_sizes=(4,), replay=False)
    assert graphs.lengths == (16, 24)
    ids, mask, _ = _inputs((2, 20))
    with torch.no_grad():
        want = mlm(input_ids=ids, attention_mask=mask)
    _assert_same_outputs(graphs(ids, mask), want, atol=1e-5)
    relative_only = tasks.DebertaForTokenClassification(_config(max_position_embeddings=24))
    assert CudaGraphModel(relative_only, lengths=(16, 32), replay=False).lengths == (16, 32)


def test_buckets_whose_outputs_are_too_large_to_keep_run_the_model_itself():
    """A masked LM's (B, N, vocabulary) logits above ``max_output_bytes``: no buffers kept for that bucket, the
    model's own forward instead (same outputs); a small bucket of the same wrapper is kept."""
    mlm = tasks.DebertaForMaskedLM(_config())
    graphs = CudaGraphModel(
        mlm, lengths=(16,), batch_sizes=(1, 4), max_output_bytes=2 * 16 * 300 * 4, replay=False
    )
    big, small = torch.randint(5, 300, (3, 16)), torch.randint(5, 300, (1, 16))
    with torch.no_grad():
        want_big, want_small = mlm(input_ids=big), mlm(input_ids=small)
    assert torch.equal(graphs(big).logits, want_big.logits)
    torch.testing.assert_close(graphs(small).logits, want_small.logits, atol=1e-5, rtol=0)
    assert graphs.buckets[((4, 16), False, False)] is None
    assert graphs.buckets[((1, 16), False, False)] is not None


def test_a_first_call_under_inference_mode_leaves_buffers_later_calls_can_write():
    model = tasks.DebertaForSequenceClassification(_config())
    graphs = CudaGraphModel(model, lengths=(16,), batch_sizes=(4,), replay=False)
    ids = torch.randint(5, 300, (2, 12))
    with torch.inference_mode():
        first = graphs(ids)
    second = graphs(ids)
    torch.testing.assert_close(first.logits, second.logits, atol=0, rtol=0)


def test_replaced_parameters_are_refused_and_updated_ones_served():
    """Weights loaded in place (what the graphs read) are served; parameters replaced by new tensors (which the
    graphs do not read) are refused."""
    model = tasks.DebertaForSequenceClassification(_config())
    graphs = CudaGraphModel(model, lengths=(16,), batch_sizes=(4,), replay=False)
    ids = torch.randint(5, 300, (2, 12))
    before = graphs(ids).logits
    other = tasks.DebertaForSequenceClassification(_config())
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(graphs(ids).logits, other.eval()(input_ids=ids).logits, atol=1e-5, rtol=0)
    assert not torch.allclose(before, graphs(ids).logits)
    model.double()
    with pytest.raises(ValueError, match="parameters were replaced"):
        graphs(ids)


def test_the_relative_index_a_graph_reads_lives_as_long_as_the_model():
    """A captured graph reads the lookup table of the relative index of its input's table window (on the GPU,
    `RelativeIndex.lut_on`) at every replay, and nothing of the capture's forward keeps the index: the model
    does (the process-wide cache the indices come from evicts its oldest ones)."""
    import gc
    import weakref

    from debertakit.attention import relative

    encoder = tasks.DebertaBase(_config()).deberta.encoder
    with torch.enable_grad():  # no inference cache, as in a capture
        _, index = encoder.relative_table(2)
    assert index.offset > 0  # a window that does not start at row 0: an instance of its own
    kept = weakref.ref(index)
    del index
    relative._relative_index.cache_clear()
    gc.collect()
    assert kept() is not None
    assert encoder.relative_table(2)[1] is kept()


# ---------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "eager", "chunked"])
def test_replayed_graphs_match_the_model_gpu(monkeypatch, backend):
    """Captured graphs under bfloat16 autocast against the model's own forward on the unpadded inputs: one call
    without mask or types (a bucket of its own), two in one bucket with other inputs (the graph reads the
    reloaded buffers); one capture per bucket. `chunked` too (`auto` picks it where the triton kernels decline:
    GPUs before sm_80, head dims above 128), at tiles small enough for its saturated pieces
    (`_Context.far_row`) to run."""
    from debertakit.attention import chunked

    monkeypatch.setattr(chunked, "INFER_TILE_ELEMENTS", 2 * 16 * 64)
    model = tasks.DebertaForTokenClassification(_config(backend)).cuda()
    graphs = CudaGraphModel(model, lengths=(16, 64), batch_sizes=(1, 4))
    calls = [(torch.randint(5, 300, (1, 12), device="cuda"), None, None), _inputs((3, 50), "cuda")]
    calls.append(_inputs((4, 61), "cuda"))
    for ids, mask, types in calls:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got = graphs(ids, mask, types)
            with torch.no_grad():
                want = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        torch.testing.assert_close(got.logits.float(), want.logits.float(), atol=2e-2, rtol=0)
    assert [key[:2] for key in graphs.buckets] == [((1, 16), False), ((4, 64), True)]
    assert all(entry.graph is not None for entry in graphs.buckets.values())
