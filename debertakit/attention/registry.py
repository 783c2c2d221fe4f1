"""The attention-backend registry: one signature (see `eager_attention`), several implementations.

``get_backend("auto", ...)`` returns the best backend that can run the request (chosen once per kind of
request, logged); an explicitly named backend that cannot run raises a ValueError saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from debertakit.attention.eager import eager_attention

log = logging.getLogger("debertakit.attention")


@dataclass(frozen=True)
class Request:
    """What a call needs; backends decide from it whether they can serve it."""

    device_type: str
    dtype: torch.dtype
    seq_len: int
    head_dim: int
    needs_probs: bool = False
    dropout: bool = False
    packed: bool = False
    dense_mask: bool = False
    causal: bool = False
    p2p: bool = False
    grad: bool = False  # autograd records the call: its result will be differentiated (training)
    # the NVIDIA GPU's compute capability (major, minor); None on other devices (CPU, ROCm): see `device_capability`
    capability: tuple[int, int] | None = None


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of an NVIDIA GPU, None for any other device (CPU, ROCm builds, where ``cuda`` names an
    AMD GPU). Read from the device's properties, which PyTorch caches: no synchronisation, and under
    ``torch.compile`` a constant (dynamo folds ``get_device_properties``, not ``get_device_capability``)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return None
    props = torch.cuda.get_device_properties(device)
    return props.major, props.minor


def capability_str(capability: tuple[int, int]) -> str:
    """(7, 5) -> '7.5'."""
    return ".".join(map(str, capability))


@dataclass(frozen=True)
class Backend:
    name: str
    fn: Callable
    # None when the backend can serve the request, else the reason it cannot
    unsupported: Callable[[Request], str | None]
    # higher first among those that can serve a request under "auto"; may depend on the request
    priority: Callable[[Request], float]


_REGISTRY: dict[str, Backend] = {}
_AUTO_CHOICES: dict[Request, str] = {}


def register(backend: Backend) -> None:
    _REGISTRY[backend.name] = backend
    _AUTO_CHOICES.clear()


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str, request: Request) -> Backend:
    if name == "auto":
        return _auto(request)
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown attention backend {name!r}; expected 'auto' or one of {available_backends()}"
        )
    backend = _REGISTRY[name]
    reason = backend.unsupported(request)
    if reason is not None:
        raise ValueError(f"attention backend {name!r} cannot run this call: {reason}")
    return backend


def _auto(request: Request) -> Backend:
    chosen = _AUTO_CHOICES.get(request)
    if chosen is None:
        usable = [b for b in _REGISTRY.values() if b.unsupported(request) is None]
        best = max(usable, key=lambda b: b.priority(request))
        chosen = best.name
        _AUTO_CHOICES[request] = chosen
        log.info(
            "attention backend 'auto' chose %r for %s%s %s, length %d%s%s",
            chosen,
            request.device_type,
            ""
            if request.capability is None
            else f" (compute capability {capability_str(request.capability)})",
            str(request.dtype).replace("torch.", ""),
            request.seq_len,
            ", training" if request.grad else "",
            " (probabilities requested)" if request.needs_probs else "",
        )
    return _REGISTRY[chosen]


register(Backend("eager", eager_attention, unsupported=lambda r: None, priority=lambda r: 0.0))
