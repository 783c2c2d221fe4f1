"""`debertakit convert`: any supported checkpoint -> a Hugging Face-format directory."""

from __future__ import annotations

from pathlib import Path


def convert(
    src: str,
    dst: str,
    *,
    head: str | None = None,
    preset: str | None = None,
    pickle: bool = False,
) -> None:
    """Convert a DeBERTa checkpoint into a directory that both debertakit and transformers load.

    Args:
        src: a Hugging Face-format directory, or (with --preset) a weights file / directory without
            config.json, such as the official repository's v1 checkpoints.
        dst: output directory (created).
        head: head to keep (default: the checkpoint's own).
        preset: configuration for checkpoints without config.json, e.g. deberta-base.
        pickle: write pytorch_model.bin instead of model.safetensors.
    """
    from debertakit.config import DebertaConfig
    from debertakit.convert.checkpoint import load_pretrained, save_pretrained

    config = DebertaConfig.preset(preset) if preset else None
    model = load_pretrained(src, head, config=config)
    out = save_pretrained(model, dst, safe_serialization=not pickle)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({type(model).__name__}, {n / 1e6:.1f}M parameters, head {model.head_kind})")
    for f in sorted(Path(out).iterdir()):
        print(f"  {f.name}")
