"""Fill-mask: the most likely tokens for each [MASK] of a text, from a masked-LM model.

The model is ours (`load_pretrained(..., head="masked_lm")`): the released MLM head layout and the Enhanced Mask
Decoder, decoding only the masked positions (REFERENCE.md §2, §4.1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def fill_mask(
    model: Any,
    tokenizer: Any,
    text: str | list[str],
    top_k: int = 5,
) -> list[list[dict[str, Any]]] | list[list[list[dict[str, Any]]]]:
    """Top-k tokens with probabilities for every [MASK] in `text`.

    Args:
        model: a masked-LM `TaskModel` (e.g. `debertakit.load_pretrained(dir, head="masked_lm")`).
        tokenizer: the model's tokenizer (`debertakit.load_tokenizer(dir)`).
        text: a text with one or more [MASK], or a list of such texts.
        top_k: how many candidates per [MASK].

    Returns:
        For one text: one list per [MASK] (in order) of `top_k` dicts {"token_id", "token", "text", "score"},
        best first; "score" is the probability (softmax over the tokenizer's vocabulary: embedding rows beyond it,
        e.g. 128001..128099 of v3, belong to no token). For a list of texts: one such list per text.
    """
    single = isinstance(text, str)
    texts = [text] if single else list(text)
    if not isinstance(top_k, int) or not 1 <= top_k <= tokenizer.vocab_size:
        raise ValueError(f"top_k must be an int in [1, {tokenizer.vocab_size}], got {top_k!r}")
    model_vocab = model.cfg.vocab_size
    if model_vocab < tokenizer.vocab_size:
        raise ValueError(
            f"the model's vocab_size {model_vocab} is smaller than the tokenizer's {tokenizer.vocab_size}: "
            "they do not belong together"
        )
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    input_ids = enc["input_ids"]
    is_mask = input_ids == tokenizer.mask_token_id  # (B, N)
    for i, row in enumerate(is_mask):
        if not row.any():
            raise ValueError(f"no {tokenizer.mask_token} in text {i}: {texts[i][:80]!r}")
    device = next(model.parameters()).device
    labels = torch.where(is_mask, input_ids, torch.full_like(input_ids, -100))
    with torch.no_grad():
        out = model(
            input_ids=input_ids.to(device),
            attention_mask=enc["attention_mask"].to(device),
            labels=labels.to(device),  # only the masked positions are decoded: logits (M, V)
        )
    logits = out.logits.float()[:, : tokenizer.vocab_size]
    probs = torch.softmax(logits, dim=-1)
    scores, ids = probs.topk(top_k, dim=-1)  # (M, k)
    results: list[list[list[dict[str, Any]]]] = [[] for _ in texts]
    rows = is_mask.nonzero().tolist()  # (M, 2) in row-major order, the order of the decoded positions
    for (b, _), row_scores, row_ids in zip(rows, scores.tolist(), ids.tolist()):
        results[b].append(
            [
                {
                    "token_id": i,
                    "token": tokenizer.convert_ids_to_tokens(i),
                    "text": tokenizer.decode([i]).strip(),
                    "score": s,
                }
                for i, s in zip(row_ids, row_scores)
            ]
        )
    return results[0] if single else results


def fill_mask_command(text: str, *, model: Path, top_k: int = 5, device: str = "cpu") -> None:
    """Prints the most likely tokens for each [MASK] of a text.

    Args:
        text: the text, with one or more [MASK].
        model: a masked-LM model directory with its tokenizer files (spm.model, or vocab.json + merges.txt).
        top_k: candidates per [MASK].
        device: where to run the model (cpu, cuda, ...).
    """
    from debertakit.convert import load_pretrained
    from debertakit.tokenization import load_tokenizer

    tokenizer = load_tokenizer(model)
    lm = load_pretrained(model, head="masked_lm", device=device)
    for n, candidates in enumerate(fill_mask(lm, tokenizer, text, top_k=top_k)):
        print(f"[MASK] {n}:")
        for c in candidates:
            print(f"  {c['score']:.4f}  {c['text']!r}  (id {c['token_id']}, {c['token']})")
