"""tests/conftest.py's ordering of the collection for pytest-xdist's worksteal scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.conftest import first_shares, spread_long_tests


@dataclass
class _Item:
    name: str
    keywords: set = field(default_factory=set)


def test_long_tests_head_each_workers_first_share_round_robin():
    items = [_Item(f"t{i}", {"long"} if i in (3, 11, 17, 18, 19) else set()) for i in range(20)]
    for workers in (2, 3, 8):
        ordered = spread_long_tests(items, workers)
        assert sorted(i.name for i in ordered) == sorted(i.name for i in items)  # each test once
        assert [i.name for i in ordered if "long" not in i.keywords] == [
            i.name for i in items if "long" not in i.keywords
        ]  # the others keep their order
        start, heads = 0, []
        for size in first_shares(len(items), workers):
            share = ordered[start : start + size]
            heads.append([i.name for i in share if "long" in i.keywords])
            long_first = [("long" in i.keywords) for i in share]
            assert long_first == sorted(long_first, reverse=True)  # the long ones at the share's head
            start += size
        assert heads == [["t3", "t11", "t17", "t18", "t19"][k::workers] for k in range(workers)]


def test_one_worker_or_no_long_test_keeps_the_order():
    items = [_Item(f"t{i}", {"long"} if i == 5 else set()) for i in range(8)]
    assert spread_long_tests(items, 1) == items
    plain = [_Item(f"t{i}") for i in range(8)]
    assert spread_long_tests(plain, 4) == plain


def test_more_long_tests_than_a_share_holds_keeps_every_test():
    items = [_Item(f"t{i}", {"long"} if i < 5 else set()) for i in range(6)]
    ordered = spread_long_tests(items, 2)
    assert sorted(i.name for i in ordered) == sorted(i.name for i in items)
    assert [i.name for i in ordered[:3]] == ["t0", "t2", "t4"]  # worker 0's share of 3: its long ones
