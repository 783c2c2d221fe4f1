"""The CPU kernel's build lock: a lock left by a killed build must not hang later runs."""

from __future__ import annotations

import os
import threading
import time

from debertakit.attention.cpu_kernel import _clear_stale_lock


def test_old_lock_is_removed_at_once(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    start = time.monotonic()
    _clear_stale_lock(tmp_path, max_age_s=600.0, poll_s=30.0)
    assert not lock.exists() and time.monotonic() - start < 5.0


def test_lock_of_a_build_that_finishes_is_waited_for_and_left_to_it(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    removed = []

    def finish():  # the other build completes and releases its lock
        time.sleep(0.3)
        lock.unlink()
        removed.append(time.monotonic())

    other = threading.Thread(target=finish)
    other.start()
    _clear_stale_lock(tmp_path, max_age_s=60.0, poll_s=0.02)
    returned = time.monotonic()
    other.join()
    assert removed and returned >= removed[0]


def test_fresh_lock_that_never_goes_is_removed_once_stale(tmp_path):
    """A lock found fresh, left by a build killed just before this run started: removed when it ages past
    max_age_s (torch's own wait would never end)."""
    lock = tmp_path / "lock"
    lock.touch()
    start = time.monotonic()
    _clear_stale_lock(tmp_path, max_age_s=0.3, poll_s=0.02)
    assert not lock.exists() and time.monotonic() - start >= 0.25


def test_no_lock_returns_at_once(tmp_path):
    start = time.monotonic()
    _clear_stale_lock(tmp_path, max_age_s=600.0, poll_s=30.0)
    assert time.monotonic() - start < 5.0
