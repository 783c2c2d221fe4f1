import json

import numpy as np
import pytest

from debertakit.data.shards import ShardSet, prepare_corpus
from debertakit.data.tokenizer import open_tokenizer
from tests.pretrain_helpers import SHARED_TEXT, train_spm, train_test_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    if not SHARED_TEXT.exists():
        pytest.skip(f"shared text folder {SHARED_TEXT} is absent")
    return train_spm(SHARED_TEXT / "tiny-shakespeare.txt", tmp_path_factory.mktemp("tok"), 600)


def write_corpus(d):
    d.mkdir()
    (d / "a.txt").write_text("First document, line one.\nline two.\n\n\n  \nSecond document.\n\nThird one\n")
    (d / "b.txt").write_bytes(b"good line\nbad \xff\xfe bytes\nstill the same document\n\nlast document\n")
    records = [
        {"text": "json document one"},
        {"text": ""},
        {"body": "no text field"},
        {"text": "json document two"},
    ]
    lines = [json.dumps(r) for r in records] + ["{not json"]
    (d / "c.jsonl").write_text("\n".join(lines) + "\n")
    return [
        "First document, line one.\nline two.",
        "Second document.",
        "Third one",
        "good line\nstill the same document",
        "last document",
        "json document one",
        "json document two",
    ]


def documents_of(shards: ShardSet):
    return [shards.shards[s].tokens[a:b].tolist() for s, a, b in shards.documents()]


def test_round_trip_bad_input_counts_and_resume(tmp_path, tokenizer):
    expected = write_corpus(tmp_path / "corpus")
    out = tmp_path / "shards"
    report = prepare_corpus(
        [str(tmp_path / "corpus")],
        str(tokenizer),
        str(out),
        valid_fraction=0.0,
        chunk_mb=30e-6,
        workers=2,
        progress=False,
    )
    assert report.chunks_done > 1  # several chunks, tokenized by two worker processes
    assert report.bad == {
        "empty_documents": 1,
        "invalid_json_lines": 1,
        "missing_text_field": 1,
        "undecodable_lines": 1,
    }
    shards = ShardSet(out, "train")
    tok = open_tokenizer(tokenizer)
    assert documents_of(shards) == tok.encode_batch(expected)
    assert shards.shards[0].tokens.dtype == np.uint16
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["hash"] == tok.hash
    assert manifest["totals"]["train_documents"] == len(expected)
    assert manifest["totals"]["train_tokens"] == sum(len(x) for x in tok.encode_batch(expected))
    assert manifest["bad"] == report.bad

    # resume: finished chunks are skipped; a lost chunk is redone; the result is the same
    again = prepare_corpus(
        [str(tmp_path / "corpus")],
        str(tokenizer),
        str(out),
        valid_fraction=0.0,
        chunk_mb=30e-6,
        workers=1,
        progress=False,
    )
    assert again.chunks_done == 0 and again.chunks_skipped == report.chunks_done
    (out / "chunk-00001.json").unlink()
    third = prepare_corpus(
        [str(tmp_path / "corpus")],
        str(tokenizer),
        str(out),
        valid_fraction=0.0,
        chunk_mb=30e-6,
        workers=1,
        progress=False,
    )
    assert third.chunks_done == 1
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


def test_file_documents_and_held_out_split(tmp_path, tokenizer):
    write_corpus(tmp_path / "corpus")
    out = tmp_path / "shards"
    prepare_corpus(
        [str(tmp_path / "corpus" / "a.txt")],
        str(tokenizer),
        str(out),
        documents="file",
        valid_fraction=0.0,
        workers=1,
        progress=False,
    )
    assert ShardSet(out).num_documents == 1
    out2 = tmp_path / "split"
    r = prepare_corpus(
        [str(SHARED_TEXT / "wikitext-2-valid.txt")],
        str(tokenizer),
        str(out2),
        valid_fraction=0.1,
        workers=1,
        progress=False,
    )
    total = r.train_documents + r.valid_documents
    assert 0.06 < r.valid_documents / total < 0.14
    assert ShardSet(out2, "valid").num_documents == r.valid_documents


def test_bad_arguments_name_the_value(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        prepare_corpus([str(tmp_path / "nowhere.txt")], str(tokenizer), str(tmp_path / "o"), progress=False)
    with pytest.raises(ValueError, match="valid_fraction=1.5"):
        prepare_corpus([str(tmp_path)], str(tokenizer), str(tmp_path / "o"), valid_fraction=1.5)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no documents"):
        prepare_corpus([str(tmp_path / "empty.txt")], str(tokenizer), str(tmp_path / "o"), progress=False)
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        ShardSet(tmp_path)


def test_a_bare_tokenizers_json_directory_works_too(tmp_path):
    if not SHARED_TEXT.exists():
        pytest.skip(f"shared text folder {SHARED_TEXT} is absent")
    tok = train_test_tokenizer(SHARED_TEXT / "tiny-shakespeare.txt", tmp_path / "tok", 500)
    expected = write_corpus(tmp_path / "corpus")
    prepare_corpus(
        [str(tmp_path / "corpus")],
        str(tok),
        str(tmp_path / "out"),
        valid_fraction=0.0,
        workers=1,
        progress=False,
    )
    shards = ShardSet(tmp_path / "out")
    assert documents_of(shards) == open_tokenizer(tok).encode_batch(expected)
    assert shards.tokenizer["mask_id"] == 4 and shards.word_start().shape == (500,)
