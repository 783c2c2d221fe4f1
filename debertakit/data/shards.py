"""Corpus -> token shards: ``debertakit prepare --input FILES/DIRS --tokenizer DIR --out DIR``.

Layout of the output directory::

    manifest.json            counts, tokenizer hash and special ids, shard list, bad-input counts
    word_start.npy           (V,) bool: token begins a word (whole-word masking)
    train-00000.tokens.npy   (T,) uint16/uint32 token ids of the chunk's training documents, back to back
    train-00000.docs.npy     (D + 1,) int64 document offsets into the tokens
    valid-00000.tokens.npy   the held-out documents of the chunk (chosen by a hash of their text)
    chunk-00000.json         written last: the chunk is finished (its key and counts)

Inputs: plain text (a document is a blank-line-separated block, or a whole file with ``documents="file"``)
and JSON lines (``.jsonl`` / ``.json``: one object per line with a text field). Inputs are read in order and
cut into chunks of about ``chunk_mb`` of text; chunks are tokenized in parallel worker processes. A chunk whose
``chunk-*.json`` exists with the same key (a hash of its text, the tokenizer and the options) is skipped, so an
interrupted run resumes where it stopped. Every file is written under a temporary name and renamed.

Bad input is counted, never dropped silently: undecodable lines (not UTF-8), invalid JSON lines, JSON objects
without the text field, and empty documents (nothing left after tokenization) appear in the manifest and in
the printed report.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing as mp
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from debertakit.convert.checkpoint import atomic_write, atomic_write_text
from debertakit.data.tokenizer import TokenizerHandle, open_tokenizer

FORMAT = "debertakit-shards/1"
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


# ---------------------------------------------------------------------------------------------------- reading
@dataclass
class Chunk:
    index: int
    documents: list[str]
    key: str = ""


def input_files(inputs: list[str]) -> list[Path]:
    """Files named, and the files under directories named (recursively, sorted; hidden files skipped)."""
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not found:
                raise ValueError(f"input directory {item!r} holds no files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"input {item!r} is neither a file nor a directory")
    return files


def _lines(path: Path, bad: Counter) -> Iterator[str]:
    with open(path, "rb") as f:
        for raw in f:
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                bad["undecodable_lines"] += 1


def read_documents(path: Path, documents: str, text_field: str, bad: Counter) -> Iterator[str]:
    """The documents of one file; bad lines are counted in ``bad``."""
    if path.suffix.lower() in JSON_SUFFIXES:
        for line in _lines(path, bad):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                bad["invalid_json_lines"] += 1
                continue
            text = obj.get(text_field) if isinstance(obj, dict) else None
            if not isinstance(text, str):
                bad["missing_text_field"] += 1
            elif not text.strip():
                bad["empty_documents"] += 1
            else:
                yield text.strip()
        return
    if documents == "file":
        text = "".join(_lines(path, bad)).strip()
        if text:
            yield text
        else:
            bad["empty_documents"] += 1
        return
    block: list[str] = []
    for line in _lines(path, bad):
        if line.strip():
            block.append(line.strip())
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def chunks(
    files: list[Path], documents: str, text_field: str, chunk_mb: float, bad: Counter
) -> Iterator[Chunk]:
    """Documents of all files, in order, grouped into chunks of about ``chunk_mb`` MB of text."""
    limit = int(chunk_mb * 2**20)
    current, size, index = [], 0, 0
    for path in files:
        for doc in read_documents(path, documents, text_field, bad):
            current.append(doc)
            size += len(doc)
            if size >= limit:
                yield Chunk(index, current)
                current, size, index = [], 0, index + 1
    if current:
        yield Chunk(index, current)


def is_valid_document(text: str, valid_fraction: float) -> bool:
    """Held-out membership from a hash of the text: stable across runs and chunkings."""
    if valid_fraction <= 0:
        return False
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return h / 2**64 < valid_fraction


# ---------------------------------------------------------------------------------------------------- writing
def _save_npy(path: Path, array: np.ndarray) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.save(f, array)

    atomic_write(path, write)


_WORKER: dict = {}


def _init_worker(tokenizer_dir: str) -> None:
    _WORKER["tok"] = open_tokenizer(tokenizer_dir)


def _tokenize_chunk(args: tuple[Chunk, str, float, str, int]) -> dict:
    chunk, out, valid_fraction, dtype, batch = args
    tok: TokenizerHandle = _WORKER["tok"]
    splits: dict[str, tuple[list[np.ndarray], list[int]]] = {"train": ([], [0]), "valid": ([], [0])}
    empty = 0
    for start in range(0, len(chunk.documents), batch):
        texts = chunk.documents[start : start + batch]
        for text, ids in zip(texts, tok.encode_batch(texts)):
            if not ids:
                empty += 1
                continue
            arrays, offsets = splits["valid" if is_valid_document(text, valid_fraction) else "train"]
            arrays.append(np.asarray(ids, dtype=dtype))
            offsets.append(offsets[-1] + len(ids))
    info = {"chunk": chunk.index, "key": chunk.key, "empty_documents": empty, "shards": []}
    for split, (arrays, offsets) in splits.items():
        if len(offsets) == 1:
            continue
        name = f"{split}-{chunk.index:05d}"
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)
        _save_npy(Path(out) / f"{name}.tokens.npy", tokens)
        _save_npy(Path(out) / f"{name}.docs.npy", np.asarray(offsets, dtype=np.int64))
        info["shards"].append(
            {"name": name, "split": split, "tokens": int(tokens.size), "documents": len(offsets) - 1}
        )
    atomic_write_text(Path(out) / f"chunk-{chunk.index:05d}.json", json.dumps(info) + "\n")
    return info


def _chunk_key(chunk: Chunk, settings: str) -> str:
    h = hashlib.sha256(settings.encode())
    for doc in chunk.documents:
        h.update(doc.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


@dataclass
class PrepareReport:
    out: Path
    train_tokens: int = 0
    train_documents: int = 0
    valid_tokens: int = 0
    valid_documents: int = 0
    chunks_done: int = 0
    chunks_skipped: int = 0
    bad: dict[str, int] = field(default_factory=dict)


def prepare_corpus(
    inputs: list[str] | str,
    tokenizer: str,
    out: str,
    *,
    documents: Literal["blank_line", "file"] = "blank_line",
    text_field: str = "text",
    valid_fraction: float = 0.01,
    chunk_mb: float = 32.0,
    workers: int = 2,
    progress: bool = True,
) -> PrepareReport:
    """Tokenize a corpus into memory-mapped shards (see the module docstring). Returns the counts."""
    from tqdm.auto import tqdm

    if documents not in ("blank_line", "file"):
        raise ValueError(f"documents={documents!r}; expected 'blank_line' or 'file'")
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid_fraction={valid_fraction} must be in [0, 1)")
    if chunk_mb <= 0:
        raise ValueError(f"chunk_mb={chunk_mb} must be > 0")
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    files = input_files(inputs)
    tok = open_tokenizer(tokenizer)
    dtype = "uint16" if tok.vocab_size <= 2**16 else "uint32"
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = json.dumps([tok.hash, documents, text_field, valid_fraction, dtype])
    bad: Counter = Counter()
    report = PrepareReport(out_dir)
    infos: list[dict] = []

    def todo() -> Iterator[tuple]:
        for chunk in chunks(files, documents, text_field, chunk_mb, bad):
            chunk.key = _chunk_key(chunk, settings)
            done = out_dir / f"chunk-{chunk.index:05d}.json"
            if done.exists():
                info = json.loads(done.read_text())
                if info.get("key") == chunk.key and all(
                    (out_dir / f"{s['name']}.tokens.npy").exists() for s in info["shards"]
                ):
                    infos.append(info)
                    report.chunks_skipped += 1
                    continue
            yield (chunk, str(out_dir), valid_fraction, dtype, 256)

    bar = tqdm(desc="prepare", unit=" chunks", disable=not progress)
    jobs = todo()
    first = next(jobs, None)  # start workers only when a chunk is left to do
    jobs = itertools.chain([first], jobs) if first is not None else iter(())
    pool = None
    if workers == 1 or first is None:
        _init_worker(tokenizer)
        results = map(_tokenize_chunk, jobs)
    else:
        pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(tokenizer,))
        results = pool.imap(_tokenize_chunk, jobs)
    try:
        for info in results:
            infos.append(info)
            report.chunks_done += 1
            bar.update(1)
            bar.set_postfix(tokens=sum(s["tokens"] for i in infos for s in i["shards"]))
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()
    infos.sort(key=lambda i: i["chunk"])
    # chunk files from a previous run with more chunks than this one are stale: leave them out
    bad["empty_documents"] += sum(i["empty_documents"] for i in infos)
    shards = [s for i in infos for s in i["shards"]]
    for s in shards:
        if s["split"] == "train":
            report.train_tokens += s["tokens"]
            report.train_documents += s["documents"]
        else:
            report.valid_tokens += s["tokens"]
            report.valid_documents += s["documents"]
    report.bad = {k: int(v) for k, v in sorted(bad.items()) if v}
    if report.train_documents == 0:
        raise ValueError(f"no documents with tokens in {inputs}; bad input counts: {report.bad}")
    _save_npy(out_dir / "word_start.npy", tok.word_start_table())
    manifest = {
        "format": FORMAT,
        "inputs": [str(f) for f in files],
        "documents": documents,
        "text_field": text_field,
        "valid_fraction": valid_fraction,
        "dtype": dtype,
        "tokenizer": tok.describe(),
        "shards": shards,
        "totals": {
            "train_tokens": report.train_tokens,
            "train_documents": report.train_documents,
            "valid_tokens": report.valid_tokens,
            "valid_documents": report.valid_documents,
            "chunks": len(infos),
        },
        "bad": report.bad,
    }
    atomic_write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return report


def prepare(
    *,
    input: list[str] | str,
    tokenizer: str,
    out: str,
    documents: Literal["blank_line", "file"] = "blank_line",
    text_field: str = "text",
    valid_fraction: float = 0.01,
    chunk_mb: float = 32.0,
    workers: int = 2,
) -> None:
    """Tokenize text files into memory-mapped token shards for pretraining.

    Args:
        input: a text / JSON-lines file or directory (read recursively); several as ``--input [a, b]`` or
            ``--input a --input+ b``.
        tokenizer: tokenizer directory (``debertakit tokenizer train`` output or a Hugging Face one).
        out: output directory; an interrupted run resumes (finished chunks are skipped).
        documents: plain text: a document per blank-line-separated block, or per file.
        text_field: the field holding the text in JSON lines.
        valid_fraction: fraction of documents held out for evaluation (chosen by a hash of the text).
        chunk_mb: MB of text per chunk (the unit of parallel work and of resuming).
        workers: tokenizer processes.
    """
    r = prepare_corpus(
        [input] if isinstance(input, str) else list(input),
        tokenizer,
        out,
        documents=documents,
        text_field=text_field,
        valid_fraction=valid_fraction,
        chunk_mb=chunk_mb,
        workers=workers,
    )
    print(
        f"{r.out}: train {r.train_tokens:,} tokens in {r.train_documents:,} documents, "
        f"held out {r.valid_tokens:,} tokens in {r.valid_documents:,} documents "
        f"({r.chunks_done} chunks tokenized, {r.chunks_skipped} already done)"
    )
    if r.bad:
        print("bad input (counted and left out): " + ", ".join(f"{k} {v:,}" for k, v in r.bad.items()))
    else:
        print("bad input: none")


# ---------------------------------------------------------------------------------------------------- reading shards
@dataclass
class Shard:
    name: str
    tokens: np.ndarray  # memmap (T,)
    offsets: np.ndarray  # (D + 1,)

    @property
    def num_documents(self) -> int:
        return self.offsets.size - 1

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


class ShardSet:
    """The shards of one split of a prepared directory, memory-mapped."""

    def __init__(self, directory: str | Path, split: Literal["train", "valid"] = "train"):
        self.directory = Path(directory)
        path = self.directory / "manifest.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{self.directory} has no manifest.json; prepare it with `debertakit prepare`"
            )
        self.manifest = json.loads(path.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{path}: format {self.manifest.get('format')!r}; expected {FORMAT!r}")
        self.split = split
        self.shards = [
            Shard(
                s["name"],
                np.load(self.directory / f"{s['name']}.tokens.npy", mmap_mode="r"),
                np.load(self.directory / f"{s['name']}.docs.npy"),
            )
            for s in self.manifest["shards"]
            if s["split"] == split
        ]

    @property
    def tokenizer(self) -> dict:
        return self.manifest["tokenizer"]

    @property
    def num_tokens(self) -> int:
        return sum(int(s.tokens.size) for s in self.shards)

    @property
    def num_documents(self) -> int:
        return sum(s.num_documents for s in self.shards)

    def word_start(self) -> np.ndarray | None:
        p = self.directory / "word_start.npy"
        return np.load(p) if p.exists() else None

    def documents(self) -> Iterator[tuple[int, int, int]]:
        """(shard index, start, end) of every document, in order."""
        for si, shard in enumerate(self.shards):
            for d in range(shard.num_documents):
                yield si, int(shard.offsets[d]), int(shard.offsets[d + 1])
