"""The compiled CPU kernel behind `chunked`'s inference path (``csrc/disentangled_cpu.cpp``).

Built on first use with `torch.utils.cpp_extension` (a C++ compiler and ninja; about a minute, once per
machine: the build is cached under ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), compiled
for the CPU it runs on. Where it cannot be built the reason is logged once and `chunked` keeps its pure PyTorch
path; ``DEBERTAKIT_CPU_KERNEL=0`` turns the kernel off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
from pathlib import Path

import torch

log = logging.getLogger("debertakit.attention")

SOURCE = Path(__file__).resolve().parent / "csrc" / "disentangled_cpu.cpp"
# -fno-trapping-math lets the compiler vectorise the float -> int conversion of the exp polynomial
CFLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-fopenmp"]
_STATE: dict[str, object] = {}


def enabled() -> bool:
    return os.environ.get("DEBERTAKIT_CPU_KERNEL", "1") != "0"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


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


def _built(name: str) -> bool:
    from torch.utils.cpp_extension import _get_build_directory

    try:
        return any(Path(_get_build_directory(name, verbose=False)).glob(f"{name}*.so"))
    except Exception:  # a private helper: when it changes, just announce the build
        return False


def load(verbose: bool = False):
    """The compiled module, or None (disabled, or the build failed: the reason is logged once)."""
    if "module" in _STATE:
        return _STATE["module"]
    module = None
    if enabled():
        try:
            from torch.utils.cpp_extension import load as load_extension

            if not _built(build_name()):
                log.warning("building debertakit's CPU attention kernel (once per machine, about 30 s)")
            module = load_extension(
                name=build_name(),
                sources=[str(SOURCE)],
                extra_cflags=CFLAGS,
                extra_ldflags=["-fopenmp"],
                verbose=verbose,
            )
        except Exception as err:  # no compiler, no ninja, a failed build: keep the pure PyTorch path
            log.warning("debertakit's CPU attention kernel is unavailable (%s); using pure PyTorch", err)
            _STATE["error"] = str(err)
    _STATE["module"] = module
    return module


def error() -> str | None:
    """Why the kernel could not be built (None when it was, or was not tried)."""
    return _STATE.get("error")  # type: ignore[return-value]
