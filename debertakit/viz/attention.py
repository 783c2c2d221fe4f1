"""Attention maps (as the paper's Figure 3): a layer's attention probabilities and, separately, its c2c, c2p and
p2c score components, for one model or side by side for two.

Scores are the scaled terms the model adds before the softmax (`debertakit.viz.layer_scores`); a term a model
does not have (a RoBERTa-style model has only c2c) is drawn as an empty panel. With no head given, each panel
is the mean over heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from debertakit.viz.components import LayerScores, layer_scores

PANELS = ("probs", "c2c", "c2p", "p2c")


@dataclass
class MapInput:
    """One model's row of the figure."""

    label: str
    model: torch.nn.Module
    input_ids: torch.Tensor  # (1, N)
    tokens: list[str]


def pattern_stats(probs: torch.Tensor) -> dict[str, float]:
    """Where the attention mass goes, averaged over query tokens: the token itself (the diagonal), the first
    token ([CLS]), the previous and the next token. probs: (N, N)."""
    n = probs.shape[-1]
    idx = torch.arange(n)
    out = {"self": float(probs[idx, idx].mean()), "first_token": float(probs[:, 0].mean())}
    out["previous"] = float(probs[idx[1:], idx[1:] - 1].mean()) if n > 1 else float("nan")
    out["next"] = float(probs[idx[:-1], idx[:-1] + 1].mean()) if n > 1 else float("nan")
    return out


def _panel(scores: LayerScores, name: str, head: int | None) -> torch.Tensor | None:
    t = scores.probs if name == "probs" else scores.components.get(name)
    if t is None:
        return None
    t = t[0]  # (H, N, N)
    return t.mean(0) if head is None else t[head]


def draw_attention_maps(
    rows: list[MapInput], out: str | Path, *, layer: int = -1, head: int | None = None, causal: bool = False
) -> tuple[Path, list[dict[str, float]]]:
    """Draw one row of panels per model (probabilities, c2c, c2p, p2c) into a PNG.

    Returns:
        The PNG path and, per model, `pattern_stats` of the drawn probabilities.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(rows), len(PANELS), figsize=(4.2 * len(PANELS), 4.0 * len(rows)), squeeze=False
    )
    stats = []
    for r, row in enumerate(rows):
        n_heads = row.model.cfg.num_heads
        if head is not None and not 0 <= head < n_heads:
            raise ValueError(f"head {head} out of range for {row.label} with {n_heads} heads")
        scores = layer_scores(row.model, row.input_ids, layer=layer, causal=causal)
        for c, name in enumerate(PANELS):
            ax = axes[r, c]
            panel = _panel(scores, name, head)
            if panel is None:
                ax.text(0.5, 0.5, f"no {name} term", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                if name == "probs":
                    im = ax.imshow(panel.numpy(), cmap="viridis", vmin=0)
                    stats.append(pattern_stats(panel))
                else:
                    lim = float(panel.abs().max()) or 1.0
                    im = ax.imshow(panel.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
                fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
                n = len(row.tokens)
                if n <= 40:
                    ax.set_xticks(range(n), row.tokens, rotation=90, fontsize=6)
                    ax.set_yticks(range(n), row.tokens, fontsize=6)
            which = "attention probabilities" if name == "probs" else f"{name} scores"
            ax.set_title(f"{row.label}\n{which}" if c == 0 else which, fontsize=9)
        if head is None:
            axes[r, 0].set_ylabel(f"layer {scores.layer}, mean of {n_heads} heads", fontsize=8)
        else:
            axes[r, 0].set_ylabel(f"layer {scores.layer}, head {head}", fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out, stats


def _label(path: Path) -> str:
    """A short name for a model directory: ``RUN/seed-0`` for ``.../RUN/seed-0/final/model``."""
    parts = path.parts
    if "final" in parts:
        i = len(parts) - 1 - parts[::-1].index("final")
        return "/".join(parts[max(i - 2, 0) : i])
    return path.name


def attention_map(
    *,
    model: Path,
    text: str,
    out: Path,
    layer: int = -1,
    head: int | None = None,
    compare: Path | None = None,
    causal: bool = False,
    tokenizer: Path | None = None,
) -> None:
    """Draw a layer's attention probabilities and its c2c, c2p and p2c score components (the paper's Figure 3).

    Args:
        model: model directory (config.json + weights; any head).
        text: the sentence to look at.
        out: PNG path.
        layer: encoder layer (negative counts from the end).
        head: one head (default: the mean over heads).
        compare: a second model directory drawn below the first.
        causal: run with the triangular mask (causal LM models).
        tokenizer: tokenizer directory (default: each model's own directory).
    """
    import debertakit

    rows = []
    for path in [model] + ([compare] if compare is not None else []):
        net = debertakit.load_pretrained(path)
        tok = debertakit.load_tokenizer(tokenizer or path)
        ids = tok(text, return_tensors="pt")["input_ids"]
        if ids.shape[1] > net.cfg.max_position_embeddings and (
            net.cfg.position_biased_input or net.cfg.emd_enabled
        ):
            raise ValueError(
                f"the text has {ids.shape[1]} tokens; {path} places at most {net.cfg.max_position_embeddings}"
            )
        rows.append(MapInput(_label(Path(path)), net, ids, tok.convert_ids_to_tokens(ids[0].tolist())))
    png, stats = draw_attention_maps(rows, out, layer=layer, head=head, causal=causal)
    for row, s in zip(rows, stats):
        print(f"{row.label}: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items()))
    print(png)
