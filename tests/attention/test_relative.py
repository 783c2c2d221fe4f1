"""`RelativeIndex`: its table on devices."""

from __future__ import annotations

import pytest
import torch

from debertakit.attention import RelativeIndex


def test_the_table_is_copied_to_a_device_once_and_kept():
    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    first = rel.lut_on("meta")  # stands for an accelerator: a copy from the host
    assert first.device.type == "meta" and first.shape == rel.lut.shape and first.dtype == rel.lut.dtype
    assert rel.lut_on(torch.device("meta")) is first
    assert rel.lut_on("cpu") is rel.lut


def test_a_window_of_the_table_is_one_object_across_forwards():
    """The backbone asks for the window's index at every forward: the same object comes back, with the copies
    of its table that earlier forwards made."""
    rel = RelativeIndex(span=256, bucket_size=256, max_position=512)
    a, b = rel.shifted(100), rel.shifted(100)
    assert a is b and a.offset == 100
    assert rel.shifted(101) is not a and rel.shifted(0) is rel
    idx = a.index(torch.arange(-600, 601))
    assert torch.equal(idx, rel.index(torch.arange(-600, 601)) - 100)


def test_derived_inputs_are_built_once_per_key_and_the_oldest_dropped(monkeypatch):
    from debertakit.attention import relative

    monkeypatch.setattr(relative, "DERIVED_KEPT", 2)
    rel = RelativeIndex(span=8, bucket_size=4, max_position=16)
    builds = []

    def build(n):
        builds.append(n)
        return torch.arange(n)

    first = rel.cached(("rows", 3), lambda: build(3))
    assert rel.cached(("rows", 3), lambda: build(3)) is first and builds == [3]
    rel.cached(("rows", 4), lambda: build(4))
    rel.cached(("rows", 3), lambda: build(3))  # used last: kept when a third key comes
    rel.cached(("rows", 5), lambda: build(5))
    assert builds == [3, 4, 5]
    assert rel.cached(("rows", 3), lambda: build(3)) is first  # kept
    rel.cached(("rows", 4), lambda: build(4))  # the oldest, dropped: built anew
    assert builds == [3, 4, 5, 4]


def test_derived_inputs_made_while_a_cuda_graph_is_captured_are_not_kept(monkeypatch):
    """A tensor made during a capture lives in the graph's memory pool: built, never kept."""
    rel = RelativeIndex(span=8, bucket_size=4, max_position=16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    builds = []
    for _ in range(2):
        rel.cached("rows", lambda: builds.append(1) or torch.zeros(2))
    assert len(builds) == 2
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    for _ in range(2):
        rel.cached("rows", lambda: builds.append(1) or torch.zeros(2))
    assert len(builds) == 3


def test_derived_inputs_kept_before_a_capture_serve_it_and_outlive_their_dropping(monkeypatch):
    """An entry kept before a CUDA graph's capture (by the warm-up forwards) serves the capture itself, not one
    built again (kernels the graph would run at every replay), and is pinned: the graph reads it at every replay,
    so dropping it from the cache later must not free it."""
    import gc
    import weakref

    from debertakit.attention import relative

    monkeypatch.setattr(relative, "DERIVED_KEPT", 1)
    monkeypatch.setattr(relative, "_CAPTURED", {})
    rel = RelativeIndex(span=8, bucket_size=4, max_position=16)
    builds = []
    first = rel.cached("rows", lambda: builds.append(1) or torch.zeros(2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert rel.cached("rows", lambda: builds.append(1) or torch.zeros(2)) is first and len(builds) == 1
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    alive = weakref.ref(first)
    del first
    rel.cached("other rows", lambda: builds.append(1) or torch.ones(2))  # drops "rows" (one entry kept)
    gc.collect()
    assert alive() is not None and list(relative._CAPTURED.values()) == [alive()]
    assert rel.cached("rows", lambda: builds.append(1) or torch.zeros(2)) is not alive() and len(builds) == 3


@pytest.mark.parametrize("args", [(256, 256, 512, 0), (256, 256, 512, 37), (512, 0, 0, 0), (8, 4, 8, 3)])
def test_the_host_row_of_a_distance_is_its_index(args):
    """`RelativeIndex.row` (Python ints, no tensor: what a backend looks up without a copy to the device) gives
    `index`'s row for every distance, saturated ones and those past the saturation too."""
    rel = RelativeIndex(*args)
    deltas = range(-rel.saturation - 3, rel.saturation + 4)
    assert [rel.row(d) for d in deltas] == rel.index(torch.tensor(list(deltas))).tolist()
