"""`debertakit generate` and `debertakit perplexity`: a causally trained model directory and its tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal


def _load(model: Path, tokenizer: Path | None):
    import debertakit

    net = debertakit.load_pretrained(model, "masked_lm")
    tok = debertakit.load_tokenizer(tokenizer or model)
    if tok.vocab_size > net.cfg.vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer or model} has {tok.vocab_size} ids but the model's vocab_size is "
            f"{net.cfg.vocab_size}"
        )
    return net, tok


def text_token_ids(tok, path: Path, max_tokens: int | None = None) -> list[int]:
    """Token ids of a text file, line by line (empty lines skipped), without special tokens."""
    ids: list[int] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                ids.extend(tok(line.strip(), add_special_tokens=False)["input_ids"])
            if max_tokens is not None and len(ids) >= max_tokens:
                return ids[:max_tokens]
    return ids


def generate_command(
    *,
    model: Path,
    prompt: str,
    max_new_tokens: int = 40,
    strategy: Literal["greedy", "top_k", "top_p"] = "greedy",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    tokenizer: Path | None = None,
) -> str:
    """Continue a prompt with a causally trained model (causal LM or DeBERTa-MT).

    Args:
        model: model directory (config.json + weights, masked-LM head).
        prompt: the text to continue.
        max_new_tokens: at most this many tokens are generated (stops early at [SEP]).
        strategy: greedy, top_k or top_p.
        temperature: sampling temperature.
        top_k: keep the k most likely tokens (top_k strategy; default 50).
        top_p: keep the smallest set of tokens with this probability (top_p strategy; default 0.9).
        seed: sampling seed.
        tokenizer: tokenizer directory (default: the model directory).
    """
    import torch

    from debertakit.generate import generate

    net, tok = _load(model, tokenizer)
    ids = [tok.cls_token_id, *tok(prompt, add_special_tokens=False)["input_ids"]]
    banned = [
        i for i in (tok.pad_token_id, tok.cls_token_id, tok.mask_token_id, tok.unk_token_id) if i is not None
    ]
    out = generate(
        net,
        torch.tensor([ids]),
        max_new_tokens=max_new_tokens,
        strategy=strategy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=tok.sep_token_id,
        banned_token_ids=banned,
        seed=seed,
    )
    text = tok.decode(out[0, 1:], skip_special_tokens=True)
    print(text)
    return text


def perplexity_command(
    *,
    model: Path,
    text: Path,
    window: int = 128,
    stride: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 8,
    tokenizer: Path | None = None,
    out: Path | None = None,
) -> dict:
    """Perplexity of a causally trained model on a text file (sliding windows; every token scored once).

    Args:
        model: model directory (config.json + weights, masked-LM head).
        text: UTF-8 text file.
        window: text tokens per window (each window starts with [CLS]).
        stride: how far each window moves (default window // 2): later tokens keep >= window - stride of context.
        max_tokens: score only the first this many tokens of the file.
        batch_size: windows per forward pass.
        tokenizer: tokenizer directory (default: the model directory).
        out: also write the result as JSON here.
    """
    from debertakit.objectives.causal import perplexity

    net, tok = _load(model, tokenizer)
    ids = text_token_ids(tok, text, max_tokens)
    res = perplexity(
        net, ids, cls_token_id=tok.cls_token_id, window=window, stride=stride, batch_size=batch_size
    )
    result = {
        "model": str(model),
        "text": str(text),
        "window": window,
        "stride": stride or max(window // 2, 1),
        **res.to_dict(),
    }
    print(json.dumps(result, indent=2))
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result
