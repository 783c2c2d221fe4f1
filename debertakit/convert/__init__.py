"""Hugging Face (and the official repository's v1 layout) <-> debertakit. Nothing outside this package knows
Hugging Face's names."""

from debertakit.convert.checkpoint import (
    CheckpointError,
    atomic_write,
    atomic_write_text,
    load_pretrained,
    read_state_dict,
    save_pretrained,
)
from debertakit.convert.hf_config import from_hf_config, to_hf_config

__all__ = [
    "CheckpointError",
    "atomic_write",
    "atomic_write_text",
    "from_hf_config",
    "load_pretrained",
    "read_state_dict",
    "save_pretrained",
    "to_hf_config",
]
