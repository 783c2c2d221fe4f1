"""Training checkpoints for exact resume.

A checkpoint holds everything the next step depends on: model, optimizer(s), scheduler(s), grad scaler, the
random states of every process (python, numpy, torch, CUDA), the data position (the step; batches are a pure
function of it, see `debertakit.data.packing`) and the logging accumulators. It is written to a temporary file
and renamed (`atomic_write`), so a run killed while saving leaves the previous checkpoint intact; the last
``keep`` checkpoints are kept.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from debertakit.convert.checkpoint import atomic_write

_NAME = re.compile(r"^step-(\d+)\.pt$")


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}.pt"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the finished checkpoints in ``directory``, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def save_checkpoint(directory: str | Path, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write ``state`` atomically as ``step-XXXXXXXX.pt`` and delete all but the last ``keep``."""
    if keep < 1:
        raise ValueError(f"keep={keep} must be >= 1")
    path = checkpoint_path(directory, step)
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    for _, old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    # our own files: they hold numpy random states and plain Python objects besides tensors
    return torch.load(str(path), map_location="cpu", weights_only=False)
