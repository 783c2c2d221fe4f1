"""Training compute of one pretraining step, to compare objectives at equal compute (e.g. RTD against MLM).

Two counts of the floating-point operations of one optimizer step (forward + backward, one batch):

* `measured_step_flops`: builds the run's objective exactly as `debertakit.train.pretrain` does and counts the
  FLOPs of its matrix products during a forward and backward pass (``torch.utils.flop_counter``, which counts
  matmuls, convolutions and attention kernels; element-wise work, softmax, norms and the optimizer are left
  out, as in the usual 6·N·D accounting).
* `analytic_forward_flops`: the same forward count from the sizes alone (formula below), to check the
  measured one and to document it. The backward pass costs about twice the forward one.

Forward FLOPs of one batch of B rows × N tokens, M = B·N·mask_prob masked tokens, hidden H, FFN width F,
vocabulary V, R = 2·rel_span relative positions, h heads of size d = H/h, with one multiply-add = 2 FLOPs:

    layer(T queries, K keys)  = T·(2·H·H [Q] + 2·H·H [out] + 4·H·F [FFN]) + K·4·H·H [K, V]
                              + T·K·4·H [QKᵀ, AV] + T·R·2·H [c2p] + K·R·2·H [p2c]
                              + R·2·H·H per relative term (projection of the relative embeddings)
    encoder(L layers)         = L · layer(B·N, N)  (T and K per row; B rows)
    EMD                       = 2 passes of layer(M, N)  (only the masked positions are decoded)
    MLM head                  = M·(2·H·H + 2·H·V)
    MLM step (forward)        = encoder(L) + EMD + MLM head
    RTD step (forward)        = generator [encoder(L_g) + EMD + MLM head] + discriminator [encoder(L)]
                                + RTD head B·N·(2·H·H + 2·H)
"""

from __future__ import annotations

from typing import Any

import torch


def _configs(options: dict[str, Any], objective: str, variant: str | None, vocab_size: int):
    from debertakit.objectives.rtd import generator_config
    from debertakit.train.pretrain import PretrainConfig, model_config

    cfg = PretrainConfig(data="-", objective=objective, variant=variant, progress=False, **options)
    mcfg = model_config(cfg, {"vocab_size": vocab_size, "pad_id": 0})
    gcfg = (
        generator_config(mcfg, cfg.generator_layers, **cfg.generator_overrides)
        if objective == "rtd"
        else None
    )
    return cfg, mcfg, gcfg


def _batch(cfg, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """B × N random tokens with exactly round(mask_prob · N) targets per row (no padding)."""
    g = torch.Generator().manual_seed(seed)
    b, n = cfg.batch_size, cfg.seq_len
    original = torch.randint(5, vocab_size, (b, n), generator=g)
    m = round(cfg.mask_prob * n)
    select = torch.zeros(b, n, dtype=torch.bool)
    for i in range(b):
        select[i, torch.randperm(n, generator=g)[:m]] = True
    labels = original.masked_fill(~select, -100)
    ids = original.masked_fill(select, 4)
    return {
        "input_ids": ids,
        "labels": labels,
        "original_ids": original,
        "attention_mask": torch.ones(b, n, dtype=torch.long),
    }


def measured_step_flops(
    options: dict[str, Any],
    objective: str = "mlm",
    variant: str | None = "full",
    vocab_size: int = 2001,
    seed: int = 0,
) -> dict[str, int]:
    """FLOPs of one training step of a run with these `PretrainConfig` options: ``{"forward", "total"}``
    (total = forward + backward), counted on a batch of ``batch_size × seq_len`` tokens."""
    from torch.utils.flop_counter import FlopCounterMode

    from debertakit.train.pretrain import build_objective

    torch.manual_seed(seed)
    cfg, mcfg, _ = _configs(options, objective, variant, vocab_size)
    obj = build_objective(cfg, mcfg).train()
    batch = _batch(cfg, vocab_size, seed)
    with FlopCounterMode(display=False) as fwd:
        out = obj(batch)
    with FlopCounterMode(display=False) as bwd:
        out["loss"].backward()
    f, b = fwd.get_total_flops(), bwd.get_total_flops()
    return {"forward": int(f), "backward": int(b), "total": int(f + b)}


def _layer_flops(cfg, queries: int, keys: int, rows: int) -> int:
    """Forward FLOPs of one encoder layer: ``queries`` and ``keys`` per row, ``rows`` rows."""
    h, f = cfg.hidden_size, cfg.intermediate_size
    terms = set(cfg.position_terms) if cfg.relative_attention else set()
    n_terms = len(terms & {"c2p", "p2c"})
    r = 2 * cfg.rel_span if n_terms else 0
    per_row = (
        queries * (4 * h * h + 4 * h * f)  # Q, output projection, FFN
        + keys * 4 * h * h  # K, V
        + queries * keys * 4 * h  # QKᵀ and AV
        + ("c2p" in terms) * queries * r * 2 * h  # c2p: every query against the relative keys
        + ("p2c" in terms) * keys * r * 2 * h  # p2c: every key against the relative queries
    )
    return rows * per_row + n_terms * r * 2 * h * h  # relative embeddings projected once per layer


def _mlm_forward(cfg, rows: int, n: int, masked: int) -> int:
    h, v = cfg.hidden_size, cfg.vocab_size
    flops = cfg.num_layers * _layer_flops(cfg, n, n, rows)
    if cfg.emd_enabled:
        flops += 2 * _layer_flops(cfg, masked // rows, n, rows)
    return flops + masked * (2 * h * h + 2 * h * v)


def analytic_forward_flops(
    options: dict[str, Any], objective: str = "mlm", variant: str | None = "full", vocab_size: int = 2001
) -> int:
    """Forward FLOPs of one step from the model sizes (the formula of the module docstring)."""
    cfg, mcfg, gcfg = _configs(options, objective, variant, vocab_size)
    b, n = cfg.batch_size, cfg.seq_len
    masked = b * round(cfg.mask_prob * n)
    if objective == "mlm":
        return _mlm_forward(mcfg, b, n, masked)
    if objective != "rtd":
        raise ValueError(f"objective={objective!r}: only 'mlm' and 'rtd' are counted")
    h = mcfg.hidden_size
    disc = mcfg.num_layers * _layer_flops(mcfg, n, n, b) + b * n * (2 * h * h + 2 * h)
    return _mlm_forward(gcfg, b, n, masked) + disc
