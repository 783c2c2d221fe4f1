"""Text generation with a causally trained DeBERTa (causal LM or DeBERTa-MT): greedy, top-k and top-p sampling.

Each step reruns the model over the whole context with the triangular mask and reads the next-token
distribution at the last position (no key/value cache: the models this targets are small, and relative
positions make every step's scores depend only on distances). Contexts longer than the model can place
(``max_position_embeddings`` for models that add absolute positions, at the input or in the EMD) keep their
last tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from debertakit.objectives.causal import causal_lm_logits

Strategy = Literal["greedy", "top_k", "top_p"]


def filter_logits(logits: Tensor, *, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top ``k`` and/or outside the smallest set whose probability reaches
    ``top_p`` (nucleus); the most likely token always stays. logits: (B, V)."""
    out = logits.clone()
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k={top_k} must be >= 1")
        k = min(top_k, out.shape[-1])
        kth = out.topk(k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p={top_p} must be in (0, 1]")
        sorted_logits, order = out.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # probability mass strictly before each token
        drop_sorted = before >= top_p  # keeps the first token, and each token until the mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def next_token(
    logits: Tensor,
    strategy: Strategy,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """(B, V) logits -> (B,) next token ids."""
    if strategy == "greedy":
        return logits.argmax(-1)
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 for sampling (use strategy='greedy')")
    if strategy == "top_k":
        filtered = filter_logits(logits, top_k=top_k or 50, top_p=top_p)
    elif strategy == "top_p":
        filtered = filter_logits(logits, top_k=top_k, top_p=top_p if top_p is not None else 0.9)
    else:
        raise ValueError(f"unknown strategy {strategy!r}; expected 'greedy', 'top_k' or 'top_p'")
    probs = (filtered.float() / temperature).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def context_limit(model: torch.nn.Module) -> int | None:
    """The longest context the model can place, or None when relative positions alone are used."""
    cfg = model.cfg
    return cfg.max_position_embeddings if (cfg.position_biased_input or cfg.emd_enabled) else None


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids: Tensor,
    *,
    max_new_tokens: int = 32,
    strategy: Strategy = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    banned_token_ids: list[int] | None = None,
    seed: int | None = None,
) -> Tensor:
    """Extend each row of ``input_ids`` (B, N; no padding) by at most ``max_new_tokens`` tokens.

    Args:
        model: a `DebertaForMaskedLM` trained with a causal objective.
        input_ids: (B, N) prompts of equal length (usually [CLS] + the prompt's tokens).
        max_new_tokens: length limit on the generated part.
        strategy: "greedy", "top_k" (default k 50) or "top_p" (default p 0.9).
        temperature: divides the logits before sampling.
        top_k, top_p: the filters (both may be combined).
        eos_token_id: a row stops after producing it (the others go on; finished rows are padded with it).
        banned_token_ids: never generated (e.g. [PAD], [CLS], [MASK]).
        seed: seeds the sampler (same seed, same text).

    Returns:
        (B, N + T) the prompts followed by the T <= max_new_tokens generated tokens.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be (batch, length >= 1); got shape {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    was_training = model.training
    model.eval()
    limit = context_limit(model)
    ids = input_ids
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    try:
        for _ in range(max_new_tokens):
            ctx = ids if limit is None else ids[:, -limit:]
            select = torch.zeros_like(ctx, dtype=torch.bool)
            select[:, -1] = True
            logits = causal_lm_logits(model, ctx, select=select).float()  # (B, V)
            if banned_token_ids:
                logits[:, banned_token_ids] = float("-inf")
            tok = next_token(
                logits, strategy, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )
            if eos_token_id is not None:
                tok = torch.where(done, torch.full_like(tok, eos_token_id), tok)
                done = done | (tok == eos_token_id)
            ids = torch.cat([ids, tok[:, None]], dim=1)
            if eos_token_id is not None and bool(done.all()):
                break
    finally:
        model.train(was_training)
    return ids
