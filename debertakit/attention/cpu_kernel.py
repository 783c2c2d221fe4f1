"""The compiled CPU kernel behind `chunked`'s inference path (``csrc/disentangled_cpu.cpp``).

Built on first use with `torch.utils.cpp_extension` (a C++ compiler and ninja; about 17 s on a 2-core
machine, once per machine: the build is cached under ``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``), compiled for the CPU it runs on. Where it cannot be built the reason is logged
once and `chunked` keeps its pure PyTorch path; ``DEBERTAKIT_CPU_KERNEL=0`` turns the kernel off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import time
from pathlib import Path

import torch

log = logging.getLogger("debertakit.attention")

SOURCE = Path(__file__).resolve().parent / "csrc" / "disentangled_cpu.cpp"
# -fno-trapping-math lets the compiler vectorise the float -> int conversion of the exp polynomial
CFLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-fopenmp"]
_STATE: dict[str, object] = {}


def enabled() -> bool:
    """False when ``DEBERTAKIT_CPU_KERNEL`` is 0, false, off or no (read at every call)."""
    return os.environ.get("DEBERTAKIT_CPU_KERNEL", "1").strip().lower() not in {"0", "false", "off", "no"}


def _cpu_flags() -> str:
    features = [platform.machine(), platform.processor()]
    try:  # x86 lists "flags", ARM "Features"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "CPU part", "model name")):
                features.append(line)
                if len(features) > 6:
                    break
    except OSError:
        pass
    return "\n".join(features)


def build_name() -> str:
    """The extension's name: changes with the source, torch, the flags and the CPU (``-march=native``)."""
    h = hashlib.sha1()
    for part in (
        SOURCE.read_bytes(),
        torch.__version__.encode(),
        " ".join(CFLAGS).encode(),
        _cpu_flags().encode(),
    ):
        h.update(part)
    return f"debertakit_cpu_{h.hexdigest()[:12]}"


def load(verbose: bool = False):
    """The compiled module, or None (disabled, or the build failed: the reason is logged once)."""
    if not enabled():
        return None
    if "module" not in _STATE:
        _STATE["module"] = _build(verbose)
    return _STATE["module"]


def _build(verbose: bool):
    try:
        from torch.utils.cpp_extension import _get_build_directory
        from torch.utils.cpp_extension import load as load_extension

        name = build_name()
        build_dir = Path(_get_build_directory(name, verbose=False))
        _clear_stale_lock(build_dir)
        if not any(build_dir.glob(f"{name}*.so")):
            log.warning("building debertakit's CPU attention kernel (once per machine, about 20 s)")
        return load_extension(
            name=name, sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], verbose=verbose
        )
    except Exception as err:  # no compiler, no ninja, a failed build: keep the pure PyTorch path
        log.warning("debertakit's CPU attention kernel is unavailable (%s); using pure PyTorch", err)
        _STATE["error"] = str(err)
        return None


def _clear_stale_lock(build_dir: Path, max_age_s: float = 600.0, poll_s: float = 1.0) -> None:
    """A build killed midway leaves torch's lock file behind, and torch waits on a lock forever. Wait while the
    lock may belong to a build still running (one takes well under ``max_age_s``), then remove it as stale:
    a lock found fresh is not trusted forever (a run started just after the killed one would hang)."""
    lock = build_dir / "lock"
    waiting = False
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return  # no build holds it (or the one that did has finished)
        if age > max_age_s:
            log.warning("removing a stale build lock %s (older than %.0f s)", lock, max_age_s)
            lock.unlink(missing_ok=True)
            return
        if not waiting:
            log.warning(
                "waiting for another build of the CPU kernel (lock %s; removed as stale at %.0f s old)",
                lock,
                max_age_s,
            )
            waiting = True
        time.sleep(poll_s)


def error() -> str | None:
    """Why the kernel could not be built (None when it was, or was not tried)."""
    return _STATE.get("error")  # type: ignore[return-value]
