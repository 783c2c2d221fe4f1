"""`Geometry` facts the fast backends rely on."""

from __future__ import annotations

import torch

from debertakit.attention import Geometry, packed_geometry


def test_distance_is_i_minus_j_for_default_and_packed_positions():
    assert Geometry().distance_is_i_minus_j()
    assert Geometry(key_mask=torch.ones(2, 5, dtype=torch.bool), causal=True).distance_is_i_minus_j()
    geom, _ = packed_geometry(torch.tensor([0, 3, 7]), 9)
    assert geom.distance_is_i_minus_j()
    # the packed positions restart per sequence, yet for every visible pair pos_i - pos_j == i - j
    qp, kp = geom.positions(9, 9, "cpu")
    same = geom.allowed(9, 9, "cpu")[0, 0]
    i = torch.arange(9)
    assert torch.equal((qp[0][:, None] - kp[0][None, :])[same], (i[:, None] - i[None, :])[same])


def test_distance_is_not_i_minus_j_for_explicit_or_unshared_positions():
    pos = torch.arange(6)[None]
    assert not Geometry(q_positions=pos + 2, k_positions=pos).distance_is_i_minus_j()
    assert not Geometry(q_positions=pos, k_positions=pos).distance_is_i_minus_j()  # no packing: any values
    geom, _ = packed_geometry(torch.tensor([0, 3, 6]), 6)
    geom.k_positions = geom.k_positions.clone()  # no longer provably the same positions
    assert not geom.distance_is_i_minus_j()


def test_cached_inputs_are_built_once_and_dropped_when_a_field_changes():
    geom = Geometry(key_mask=torch.ones(2, 5, dtype=torch.bool))
    builds = []

    def build():
        builds.append(1)
        return geom.key_mask.int()

    first = geom.cached(("rows", 5), build)
    assert geom.cached(("rows", 5), build) is first and len(builds) == 1
    geom.cached(("rows", 6), build)  # another key: built anew
    assert len(builds) == 2
    geom.key_mask = torch.zeros(2, 5, dtype=torch.bool)  # derived inputs of the old mask are stale
    assert not geom.cached(("rows", 5), build).any() and len(builds) == 3
