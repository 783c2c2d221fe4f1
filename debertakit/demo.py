"""`debertakit demo`: the README's main job.

For now: build a small DeBERTa-v3-shaped masked-LM, save it in Hugging Face form, load it back, and check that
the reloaded model gives the same output.
"""

from __future__ import annotations

from pathlib import Path


def demo(*, out: str = "demo_out", preset: str = "tiny-v3") -> None:
    """Build a small model, save it, reload it and run a forward pass.

    Args:
        out: output directory.
        preset: model size (a name from DebertaConfig presets).
    """
    import torch

    import debertakit

    torch.manual_seed(0)
    cfg = debertakit.DebertaConfig.preset(preset)
    model = debertakit.build_model(cfg, "masked_lm").eval()
    path = debertakit.save_pretrained(model, Path(out) / "model")
    reloaded = debertakit.load_pretrained(path)
    ids = torch.randint(4, cfg.vocab_size, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).logits
        b = reloaded(input_ids=ids, attention_mask=mask).logits
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {preset} ({n_params / 1e6:.2f}M parameters), saved to {path}")
    print(
        f"logits {tuple(a.shape)}; saved and reloaded outputs differ by at most {(a - b).abs().max().item():.2e}"
    )
    print(f"top tokens at position 0: {a[0, 0].topk(5).indices.tolist()}")
