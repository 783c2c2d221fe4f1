import pytest

from tests.pretrain_helpers import SHARED_TEXT, prepared_corpus


@pytest.fixture(scope="session")
def wikitext_shards(tmp_path_factory):
    if not SHARED_TEXT.exists():
        pytest.skip(f"shared text folder {SHARED_TEXT} is absent")
    return prepared_corpus(tmp_path_factory.mktemp("wikitext"))
