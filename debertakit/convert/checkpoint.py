"""Loading and writing model directories in Hugging Face form (config.json + model.safetensors).

* `load_pretrained` reads any DeBERTa / DeBERTa-v2 directory written by transformers or by us (safetensors,
  sharded safetensors, or pickled ``pytorch_model.bin`` read with ``weights_only=True``), and the official
  repository's v1 layout, and returns our model with the matching head.
* `save_pretrained` writes a directory that ``transformers.AutoModel…from_pretrained`` loads with the same
  outputs. Every file is written to a temporary name and renamed, so an interrupted save never leaves a
  half-written checkpoint under the real name.

Missing backbone weights, unknown names and shape mismatches are errors that list the names. A head the
checkpoint lacks is initialised randomly with a warning that names it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from debertakit.config import DebertaConfig
from debertakit.convert.hf_config import from_hf_config, head_from_architectures, to_hf_config
from debertakit.convert.keys import hf_to_ours, ours_to_hf
from debertakit.model.tasks import TASK_MODELS, TaskModel, build_model

log = logging.getLogger("debertakit.checkpoint")

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: the message lists the names."""


# ---------------------------------------------------------------------------------------------------- reading
def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """All tensors of a directory (any of `WEIGHT_FILES`) or of one weights file."""
    path = Path(path)
    if path.is_dir():
        for name in WEIGHT_FILES:
            if (path / name).exists():
                return read_state_dict(path / name)
        raise FileNotFoundError(f"no weights in {path}: expected one of {list(WEIGHT_FILES)}")
    if path.name.endswith(".index.json"):
        shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(read_state_dict(path.parent / shard))
        return state
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    return state


def infer_head(state: dict[str, Tensor]) -> str:
    """The head a checkpoint carries when its config does not say."""
    keys = list(state)
    if any(k.startswith(("lm_predictions.", "cls.predictions.")) for k in keys):
        return "masked_lm"
    if any(k.startswith("mask_predictions.") for k in keys):
        return "replaced_token_detection"
    if any(k.startswith("qa_outputs.") for k in keys):
        return "question_answering"
    return "base"


def load_pretrained(
    path: str | Path,
    head: str | None = None,
    *,
    config: DebertaConfig | None = None,
    ignore_mismatched_head: bool = False,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    **config_overrides: Any,
) -> TaskModel:
    """Load a Hugging Face-format DeBERTa directory as our model.

    Args:
        path: directory with config.json and weights (model.safetensors, sharded, or pytorch_model.bin).
        head: which head to build ("base", "masked_lm", "replaced_token_detection", "sequence_classification",
            "token_classification", "question_answering", "multiple_choice"); default: the checkpoint's own.
        config: the model's configuration, for checkpoints without a config.json (the official repository's
            ``pytorch.model.bin`` files, say: pass ``DebertaConfig.preset("deberta-base")``); ``path`` may
            then be the weights file itself.
        ignore_mismatched_head: re-initialise head weights whose shape differs (e.g. another num_labels),
            with a warning, instead of raising.
        dtype, device: where to put the model.
        **config_overrides: `DebertaConfig` fields to change, e.g. ``attention_backend="chunked"``,
            ``num_labels=3``, ``hidden_dropout=0.0``.
    """
    path = Path(path)
    if config is not None:
        raw_cfg, cfg = {}, config
    elif (path / "config.json").exists():
        raw_cfg = json.loads((path / "config.json").read_text())
        cfg = from_hf_config(raw_cfg)
    else:
        raise FileNotFoundError(
            f"{path} has no config.json; expected a Hugging Face-format model directory (or pass config=)"
        )
    if config_overrides:
        cfg = cfg.replace(**config_overrides)
    state = read_state_dict(path)
    head = head or head_from_architectures(raw_cfg) or infer_head(state)
    if head not in TASK_MODELS:
        raise ValueError(f"unknown head {head!r}; expected one of {sorted(TASK_MODELS)}")
    ours, unknown, other_heads = hf_to_ours(state, cfg, head)
    if head == "masked_lm" and cfg.emd_enabled and "emd.position_embeddings.weight" not in ours:
        # transformers drops the absolute table of MLM checkpoints; without it the EMD would decode with
        # random positions. Such checkpoints were trained without EMD: decode without it.
        log.warning(
            "%s has no absolute position table (deberta.embeddings.position_embeddings.weight), which the "
            "Enhanced Mask Decoder needs; loading with use_emd=False",
            path,
        )
        cfg = cfg.replace(use_emd=False)
    model = build_model(cfg, head)
    _load_into(model, ours, unknown, other_heads, ignore_mismatched_head, path)
    if dtype is not None or device is not None:
        model = model.to(device=device, dtype=dtype)
    return model.eval()


def _load_into(
    model: TaskModel,
    state: dict[str, Tensor],
    unknown: list[str],
    other_heads: list[str],
    ignore_mismatched_head: bool,
    path: Path,
) -> None:
    expected = model.state_dict()
    problems = []
    if unknown:
        problems.append(f"unexpected keys (no parameter of this model): {sorted(unknown)}")
    mismatched = [
        (k, tuple(v.shape), tuple(expected[k].shape))
        for k, v in state.items()
        if k in expected and v.shape != expected[k].shape
    ]
    head_mismatch = [m for m in mismatched if not m[0].startswith("deberta.")]
    if ignore_mismatched_head:
        for k, _, _ in head_mismatch:
            del state[k]
        mismatched = [m for m in mismatched if m[0].startswith("deberta.")]
    if mismatched:
        problems.append(
            "shape mismatches (name, checkpoint, model): "
            + ", ".join(f"{k} {a} vs {b}" for k, a, b in mismatched)
        )
    missing = [k for k in expected if k not in state]
    missing_backbone = [k for k in missing if k.startswith("deberta.")]
    if missing_backbone:
        problems.append(f"missing backbone weights: {missing_backbone}")
    if problems:
        raise CheckpointError(f"cannot load {path} into {type(model).__name__}:\n  " + "\n  ".join(problems))
    missing_head = [k for k in missing if not k.startswith("deberta.")]
    if missing_head:
        log.warning(
            "%s has no weights for the %r head; these are randomly initialised and must be trained: %s",
            path,
            model.head_kind,
            missing_head,
        )
    if ignore_mismatched_head and head_mismatch:
        log.warning(
            "re-initialised head weights of another shape: %s", [(k, a, b) for k, a, b in head_mismatch]
        )
    if other_heads:
        log.info("left out weights of other heads: %s", sorted(other_heads))
    model.load_state_dict(state, strict=False)


# ---------------------------------------------------------------------------------------------------- writing
def _file_mode(path: Path) -> int:
    """The permissions ``path`` keeps when replaced, or a new file's under the process umask (a temporary file
    is created 0600, which would leave saved models unreadable to the rest of a group)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where Linux reports it (setting it to read it would briefly
    give files other threads create no protection)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o077)  # elsewhere: set and restore, the brief value the safe one
    os.umask(umask)
    return umask


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename to ``path``: readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def save_pretrained(
    model: TaskModel, path: str | Path, *, safe_serialization: bool = True, tokenizer: Any | None = None
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (or ``pytorch_model.bin``) in Hugging Face form, and the
    tokenizer's files when ``tokenizer`` is given (then the directory is complete: `load_tokenizer` and
    Hugging Face's AutoTokenizer read it)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    head = model.head_kind
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    hf_state = ours_to_hf(state, model.cfg, head)
    if safe_serialization:
        from safetensors.torch import save_file

        atomic_write(
            path / "model.safetensors", lambda tmp: save_file(hf_state, tmp, metadata={"format": "pt"})
        )
        stale = path / "pytorch_model.bin"
    else:
        atomic_write(path / "pytorch_model.bin", lambda tmp: torch.save(hf_state, tmp))
        stale = path / "model.safetensors"
    if stale.exists():
        stale.unlink()  # one weights file per directory, so that readers cannot pick an old one
    atomic_write_text(path / "config.json", json.dumps(to_hf_config(model.cfg, head), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def config_of(path: str | Path) -> DebertaConfig:
    return from_hf_config(json.loads((Path(path) / "config.json").read_text()))
